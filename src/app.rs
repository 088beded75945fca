//! Composition: binds the listeners and wires doors, classifier, tiers and backends.
//!
//! The only place that knows every part. [`Gateway::start`] binds what the startup
//! settings name (tests pass port 0), builds the tiers and the door over a policy
//! store, spawns each listener's loop with one shutdown signal, and hands back the
//! bound addresses; [`Gateway::stop`] drains and joins them.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio_stream::wrappers::TcpListenerStream;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::front::batch_api::OfflineApi;
use crate::front::dispatch::Dispatch;
use crate::front::grpc::GrpcDoor;
use crate::front::http::Door;
use crate::policy::{Policy, Store};
use crate::queue::{embedded, Embedded, StoreError};
use crate::tiers::{offline, MicroBatch, Offline, Realtime, TierService, Tiers};

/// A running gateway.
#[derive(Debug)]
pub struct Gateway {
    http: SocketAddr,
    grpc: SocketAddr,
    metrics: SocketAddr,
    policy: Arc<Store>,
    shutdown: CancellationToken,
    tasks: JoinSet<std::io::Result<()>>,
}

/// The bound listeners a gateway serves on.
#[derive(Debug)]
pub struct Listeners {
    /// The KServe v2 HTTP door.
    pub http: TcpListener,
    /// The KServe v2 gRPC door.
    pub grpc: TcpListener,
    /// The metrics endpoint.
    pub metrics: TcpListener,
}

/// Why a gateway could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// A listener could not be bound.
    #[error("cannot listen on {addr} for the {what}: {source}")]
    Bind {
        /// Which listener.
        what: &'static str,
        /// Its address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// The offline store could not be opened.
    #[error("cannot open the offline store under {dir}: {source}")]
    Store {
        /// The data directory.
        dir: std::path::PathBuf,
        /// Why.
        source: StoreError,
    },
}

impl Gateway {
    /// Binds the listeners in `config` and starts serving `policy`.
    pub async fn start(config: &Config, policy: Policy) -> Result<Gateway, StartError> {
        let listeners = Listeners {
            http: bind("HTTP door", config.listen.http).await?,
            grpc: bind("gRPC door", config.listen.grpc).await?,
            metrics: bind("metrics endpoint", config.listen.metrics).await?,
        };
        Self::start_on(listeners, config, policy)
    }

    /// Starts serving `policy` on already bound listeners, with the offline store under
    /// `config.data_dir`.
    pub fn start_on(listeners: Listeners, config: &Config, policy: Policy) -> Result<Gateway, StartError> {
        let limits = embedded::Limits {
            max_unfinished: config.offline.max_queued_jobs,
        };
        let store = Embedded::open(&config.data_dir, limits).map_err(|source| StartError::Store {
            dir: config.data_dir.clone(),
            source,
        })?;
        let Listeners { http, grpc, metrics } = listeners;
        let prometheus = crate::metrics::install();
        ::metrics::gauge!(crate::metrics::POLICY_ROUTES).set(policy.routes().len() as f64);
        ::metrics::gauge!(crate::metrics::POLICY_VERSION).set(1.0);
        let shutdown = CancellationToken::new();
        let policy = Arc::new(Store::new(policy));
        let realtime = TierService::new(Realtime::new(config.limits.max_response_bytes));
        let micro_batch = MicroBatch::new(config.limits.max_response_bytes, shutdown.clone());
        let wake = Arc::new(tokio::sync::Notify::new());
        let offline_tier = Offline::new(store.clone(), config.offline.clone(), wake.clone());
        let tiers = Tiers::new(realtime)
            .with_micro_batch(TierService::new(micro_batch.clone()))
            .with_offline(TierService::new(offline_tier));
        let max_response = config.limits.max_response_bytes;
        let dispatch = Arc::new(Dispatch::new(policy.clone(), tiers, max_response, shutdown.clone()));
        let api = OfflineApi {
            store: store.clone(),
            policy: policy.clone(),
            settings: config.offline.clone(),
            wake: wake.clone(),
        };
        let door = Arc::new(Door::new(dispatch.clone(), config.limits.clone()).with_offline(api));
        let grpc_door = GrpcDoor::new(dispatch.clone()).service(&config.limits);
        let addrs = (local(&http), local(&grpc), local(&metrics));

        let mut tasks = JoinSet::new();
        let workers = offline::worker::run(
            store,
            policy.clone(),
            micro_batch,
            config.offline.clone(),
            wake,
            shutdown.clone(),
        );
        tasks.spawn(async move {
            workers.await;
            Ok(())
        });
        let answer = move |req| door.clone().answer(req);
        tasks.spawn(crate::front::serve(
            http,
            config.limits.header_read_timeout,
            shutdown.clone(),
            answer,
        ));
        let stop = shutdown.clone();
        tasks.spawn(async move {
            tonic::transport::Server::builder()
                .add_service(grpc_door)
                .serve_with_incoming_shutdown(TcpListenerStream::new(grpc), stop.cancelled())
                .await
                .map_err(std::io::Error::other)
        });
        tasks.spawn(crate::metrics::serve(metrics, prometheus, shutdown.clone()));
        tracing::info!(http = %addrs.0, grpc = %addrs.1, metrics = %addrs.2, "tiergate is serving");
        Ok(Gateway {
            http: addrs.0,
            grpc: addrs.1,
            metrics: addrs.2,
            policy,
            shutdown,
            tasks,
        })
    }

    /// The bound address of the HTTP door.
    pub fn http_addr(&self) -> SocketAddr {
        self.http
    }

    /// The bound address of the gRPC door.
    pub fn grpc_addr(&self) -> SocketAddr {
        self.grpc
    }

    /// The bound address of the metrics endpoint.
    pub fn metrics_addr(&self) -> SocketAddr {
        self.metrics
    }

    /// The running policy.
    pub fn policy(&self) -> &Arc<Store> {
        &self.policy
    }

    /// Watches `dir` and reloads the policy from it on every change, until [`Gateway::stop`].
    pub fn watch_policy(&mut self, dir: &std::path::Path) -> Result<(), crate::reload::WatchError> {
        let watching = crate::reload::watch(dir, self.policy.clone(), self.shutdown.clone())?;
        self.tasks.spawn(async move {
            watching.await;
            Ok(())
        });
        Ok(())
    }

    /// Stops accepting, drains open exchanges, and waits for every listener to end.
    pub async fn stop(mut self) -> std::io::Result<()> {
        self.shutdown.cancel();
        while let Some(done) = self.tasks.join_next().await {
            done.map_err(std::io::Error::other)??;
        }
        Ok(())
    }
}

async fn bind(what: &'static str, addr: SocketAddr) -> Result<TcpListener, StartError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| StartError::Bind { what, addr, source })
}

fn local(listener: &TcpListener) -> SocketAddr {
    listener.local_addr().expect("a bound TCP listener has a local address")
}
