//! Composition: binds the listeners and wires doors, classifier, tiers and backends.
//!
//! The only place that knows every part. [`Gateway::start`] binds what the startup
//! settings name (tests pass port 0), builds the tiers and the door over a policy
//! store, spawns each listener's loop with one shutdown signal, and hands back the
//! bound addresses; [`Gateway::stop`] drains and joins them.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::Notify;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::admin::{self, Admin, Tokens};
use crate::config::{Config, QueueKind};
use crate::control::history::History;
use crate::control::Control;
use crate::front::admission::Admission;
use crate::front::batch_api::OfflineApi;
use crate::front::dispatch::Dispatch;
use crate::front::grpc::GrpcDoor;
use crate::front::http::Door;
use crate::policy::{Allowlist, Policy, Problems, Store};
use crate::queue::{embedded, Embedded, Queue, StoreError};
use crate::tiers::{offline, MicroBatch, Offline, Realtime, TierService, Tiers};

/// A running gateway.
#[derive(Debug)]
pub struct Gateway {
    http: SocketAddr,
    grpc: SocketAddr,
    metrics: SocketAddr,
    admin: Option<SocketAddr>,
    bulk: BulkAddrs,
    control: Arc<Control>,
    shutdown: CancellationToken,
    tasks: JoinSet<std::io::Result<()>>,
    batch_threads: BatchThreads,
}

/// The micro-batch tier's own runtime, so batch work never runs on the threads that
/// serve real-time requests. Shut down without blocking when the gateway goes.
#[derive(Debug)]
struct BatchThreads(Option<tokio::runtime::Runtime>);

impl BatchThreads {
    fn start(threads: &crate::config::Threads) -> Result<BatchThreads, StartError> {
        let nice = threads.batch_nice;
        if !(0..=19).contains(&nice) {
            return Err(StartError::Settings(format!(
                "threads.batch_nice is {nice}: give a nice value from 0 (the real-time threads' priority) to 19 (the lowest)"
            )));
        }
        threads
            .batch_cpus
            .check("threads.batch_cpus")
            .map_err(StartError::Settings)?;
        let cpus = threads.batch_cpus.clone();
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads.batch_workers.max(1))
            .thread_name("tiergate-batch")
            .on_thread_start(move || {
                cpus.pin_this_thread();
                crate::cpu::lower_this_thread(nice);
            })
            .enable_all()
            .build()
            .map(|rt| BatchThreads(Some(rt)))
            .map_err(|e| StartError::Settings(format!("cannot start the micro-batch threads: {e}")))
    }

    fn handle(&self) -> tokio::runtime::Handle {
        self.0
            .as_ref()
            .map(|rt| rt.handle().clone())
            .expect("running until dropped")
    }

    /// Runs the listener loop `serve` on the batch threads, `listener` moved to their
    /// reactor first so that its connections are accepted, read and answered there.
    fn serve<F, Fut>(&self, listener: TcpListener, serve: F) -> impl Future<Output = std::io::Result<()>>
    where
        F: FnOnce(TcpListener) -> Fut + Send + 'static,
        Fut: Future<Output = std::io::Result<()>> + Send + 'static,
    {
        let moved = listener.into_std();
        let task = self
            .handle()
            .spawn(async move { serve(TcpListener::from_std(moved?)?).await });
        async move { task.await.map_err(std::io::Error::other)? }
    }
}

impl Drop for BatchThreads {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

/// Why sources are refused in a build without the `kafka` feature.
#[cfg(not(feature = "kafka"))]
const NO_KAFKA: &str = "kafka.sources are set, but this build has no Kafka support (build with --features kafka)";

/// Checks the Kafka sources (brokers reachable, topics there, routes with a batch
/// pool) before anything is bound; refuses sources in a build without Kafka support.
async fn check_sources(config: &Config, policy: Policy) -> Result<Policy, StartError> {
    if config.kafka.sources.is_empty() {
        return Ok(policy);
    }
    #[cfg(feature = "kafka")]
    {
        let settings = config.kafka.clone();
        tokio::task::spawn_blocking(move || crate::kafka::check(&settings, &policy).map(|()| policy))
            .await
            .map_err(|e| StartError::Settings(e.to_string()))?
            .map_err(StartError::Settings)
    }
    #[cfg(not(feature = "kafka"))]
    {
        let _ = policy;
        Err(StartError::Settings(NO_KAFKA.into()))
    }
}

/// Starts the Kafka sources on the batch threads.
#[cfg(feature = "kafka")]
fn start_sources(
    config: &Config,
    policy: &Arc<Store>,
    micro: &MicroBatch,
    threads: &BatchThreads,
    shutdown: &CancellationToken,
) -> Result<(), StartError> {
    for source in &config.kafka.sources {
        threads.handle().spawn(crate::kafka::source::run(
            config.kafka.clone(),
            source.clone(),
            policy.clone(),
            micro.clone(),
            shutdown.clone(),
        ));
    }
    Ok(())
}

/// Without the `kafka` feature there are no sources to start.
#[cfg(not(feature = "kafka"))]
fn start_sources(
    config: &Config,
    _: &Arc<Store>,
    _: &MicroBatch,
    _: &BatchThreads,
    _: &CancellationToken,
) -> Result<(), StartError> {
    match config.kafka.sources.is_empty() {
        true => Ok(()),
        false => Err(StartError::Settings(NO_KAFKA.into())),
    }
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
    /// The admin API, when it is on.
    pub admin: Option<TcpListener>,
    /// The bulk HTTP door, when it is on.
    pub bulk_http: Option<TcpListener>,
    /// The bulk gRPC door, when it is on.
    pub bulk_grpc: Option<TcpListener>,
}

/// The bound addresses of the bulk doors that are on.
#[derive(Debug, Clone, Copy, Default)]
struct BulkAddrs {
    http: Option<SocketAddr>,
    grpc: Option<SocketAddr>,
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
    /// The startup settings are inconsistent.
    #[error("{0}")]
    Settings(String),
    /// The policy points a pool outside the backend allowlist.
    #[error("the policy is refused:\n{0}")]
    Policy(Problems),
    /// The policy history could not be opened.
    #[error("cannot keep the policy history under {dir}: {source}")]
    History {
        /// The data directory.
        dir: std::path::PathBuf,
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
        let policy = check_sources(config, policy).await?;
        let backlog = config.limits.listen_backlog.max(1);
        let admin = match admin_tokens(config)? {
            Some(_) => Some(bind("admin API", config.listen.admin, backlog).await?),
            None => None,
        };
        let listeners = Listeners {
            http: bind("HTTP door", config.listen.http, backlog).await?,
            grpc: bind("gRPC door", config.listen.grpc, backlog).await?,
            metrics: bind("metrics endpoint", config.listen.metrics, backlog).await?,
            admin,
            bulk_http: bind_some("bulk HTTP door", config.listen.bulk_http, backlog).await?,
            bulk_grpc: bind_some("bulk gRPC door", config.listen.bulk_grpc, backlog).await?,
        };
        let (wake, shutdown) = (Arc::new(Notify::new()), CancellationToken::new());
        let queue = match config.offline.queue {
            QueueKind::Embedded => Queue::Embedded(open_embedded(config)?),
            QueueKind::Kafka => open_kafka(config, &wake, &shutdown).await?,
        };
        let started = Self::start_with(listeners, config, policy, queue, wake, shutdown.clone());
        if started.is_err() {
            shutdown.cancel(); // stops the Kafka queue's tasks
        }
        started
    }

    /// Starts serving `policy` on already bound listeners, with the embedded offline
    /// store and the policy history under `config.data_dir` (the Kafka queue needs
    /// [`Gateway::start`]).
    pub fn start_on(listeners: Listeners, config: &Config, policy: Policy) -> Result<Gateway, StartError> {
        if config.offline.queue == QueueKind::Kafka {
            return Err(StartError::Settings(
                "offline.queue = \"kafka\" is started by Gateway::start, which connects to the brokers first".into(),
            ));
        }
        let queue = Queue::Embedded(open_embedded(config)?);
        let (wake, shutdown) = (Arc::new(Notify::new()), CancellationToken::new());
        Self::start_with(listeners, config, policy, queue, wake, shutdown)
    }

    fn start_with(
        listeners: Listeners,
        config: &Config,
        policy: Policy,
        store: Queue,
        wake: Arc<Notify>,
        shutdown: CancellationToken,
    ) -> Result<Gateway, StartError> {
        let allow = Allowlist::parse(&config.backends.allow).map_err(StartError::Settings)?;
        allow.check(&policy).map_err(StartError::Policy)?;
        let tokens = admin_tokens(config)?;
        let history_error = |source| StartError::History {
            dir: config.data_dir.clone(),
            source,
        };
        let history = History::open(&config.data_dir, config.admin.audit_log.as_deref()).map_err(history_error)?;
        let version = history.latest().map_err(history_error)? + 1;
        let Listeners {
            http,
            grpc,
            metrics,
            admin,
            bulk_http,
            bulk_grpc,
        } = listeners;
        let prometheus = crate::metrics::install();
        let policy = Arc::new(Store::at(policy, version));
        let dir = config.policy_dir.clone();
        let control = Arc::new(Control::new(policy.clone(), dir, allow, history).map_err(history_error)?);
        let realtime_tier = Realtime::new(config.limits.max_response_bytes);
        let realtime = TierService::new(realtime_tier.clone());
        let batch_threads = BatchThreads::start(&config.threads)?;
        let micro_batch = MicroBatch::new(
            config.limits.max_response_bytes,
            shutdown.clone(),
            Some(batch_threads.handle()),
        );
        let micro_batch_handle = micro_batch.clone();
        let offline_tier = Offline::new(store.clone(), config.offline.clone(), wake.clone());
        let tiers = Tiers::new(realtime)
            .with_micro_batch(TierService::new(micro_batch.clone()))
            .with_offline(TierService::new(offline_tier));
        let max_response = config.limits.max_response_bytes;
        // Its memory watch runs on the batch threads, off the real-time ones.
        let admission = {
            let batch = batch_threads.handle();
            let _on_batch = batch.enter();
            Admission::new(&config.limits, shutdown.clone())
        };
        let reserve = config.limits.budget_reserve;
        if !(0.0..=0.5).contains(&reserve) {
            return Err(StartError::Settings(format!(
                "limits.budget_reserve is {reserve}: give the share of each budget to keep back, from 0 to 0.5"
            )));
        }
        let dispatch = Arc::new(
            Dispatch::new(policy.clone(), admission, tiers, max_response, shutdown.clone())
                .with_budget_reserve(reserve),
        );
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
            realtime_tier,
            config.offline.clone(),
            wake,
            shutdown.clone(),
        );
        start_sources(config, &policy, &micro_batch_handle, &batch_threads, &shutdown)?;
        // Offline workers run on the batch threads too (their store I/O has its own thread).
        let workers = batch_threads.handle().spawn(workers);
        tasks.spawn(async move { workers.await.map_err(std::io::Error::other) });
        let answer = move |req| door.clone().answer(req);
        let (limits, stop) = (config.limits.clone(), shutdown.clone());
        let serve_http = move |listener| {
            crate::front::serve(
                listener,
                limits.header_read_timeout,
                limits.max_connections,
                stop,
                answer,
            )
        };
        let (max_connections, stop) = (config.limits.max_connections, shutdown.clone());
        let serve_grpc = move |listener| async move {
            tonic::transport::Server::builder()
                .http2_keepalive_interval(Some(std::time::Duration::from_secs(30)))
                .max_concurrent_streams(1024)
                .add_service(grpc_door)
                .serve_with_incoming_shutdown(
                    crate::front::limited_incoming(listener, max_connections),
                    stop.cancelled(),
                )
                .await
                .map_err(std::io::Error::other)
        };
        let bulk = BulkAddrs {
            http: bulk_http.as_ref().map(local),
            grpc: bulk_grpc.as_ref().map(local),
        };
        if let Some(listener) = bulk_http {
            tasks.spawn(batch_threads.serve(listener, serve_http.clone()));
        }
        if let Some(listener) = bulk_grpc {
            tasks.spawn(batch_threads.serve(listener, serve_grpc.clone()));
        }
        tasks.spawn(serve_http(http));
        // On the real-time threads: their request deadlines are then filed without a wake-up.
        tasks.spawn(crate::front::keep_timers_due(shutdown.clone()));
        tasks.spawn(serve_grpc(grpc));
        tasks.spawn(crate::metrics::serve(metrics, prometheus, shutdown.clone()));
        let admin_addr = match (admin, tokens) {
            (Some(listener), Some(tokens)) => {
                let addr = local(&listener);
                let api = Admin {
                    control: control.clone(),
                    tokens,
                    micro_batch: micro_batch_handle,
                };
                tasks.spawn(admin::serve(listener, api, shutdown.clone()));
                Some(addr)
            }
            (Some(_), None) => return Err(StartError::Settings(NO_TOKEN.into())),
            (None, _) => None,
        };
        match admin_addr {
            Some(admin) => {
                tracing::info!(http = %addrs.0, grpc = %addrs.1, metrics = %addrs.2, %admin, bulk_http = ?bulk.http, bulk_grpc = ?bulk.grpc, "tiergate is serving")
            }
            None => {
                tracing::info!(http = %addrs.0, grpc = %addrs.1, metrics = %addrs.2, bulk_http = ?bulk.http, bulk_grpc = ?bulk.grpc, "tiergate is serving");
                tracing::warn!("the admin API is off: {NO_TOKEN}");
            }
        }
        Ok(Gateway {
            http: addrs.0,
            grpc: addrs.1,
            metrics: addrs.2,
            admin: admin_addr,
            bulk,
            control,
            shutdown,
            tasks,
            batch_threads,
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

    /// The bound address of the admin API, when it is on.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin
    }

    /// The bound address of the bulk HTTP door (served by the batch threads), when it is on.
    pub fn bulk_http_addr(&self) -> Option<SocketAddr> {
        self.bulk.http
    }

    /// The bound address of the bulk gRPC door (served by the batch threads), when it is on.
    pub fn bulk_grpc_addr(&self) -> Option<SocketAddr> {
        self.bulk.grpc
    }

    /// The running policy.
    pub fn policy(&self) -> &Arc<Store> {
        self.control.store()
    }

    /// Watches `dir` and reloads the policy from it on every change, until [`Gateway::stop`].
    pub fn watch_policy(&mut self, dir: &std::path::Path) -> Result<(), crate::reload::WatchError> {
        let watching = crate::reload::watch(dir, self.control.clone(), self.shutdown.clone())?;
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
        drop(self.batch_threads);
        Ok(())
    }
}

/// The offline store's limits from `config`.
fn store_limits(config: &Config) -> embedded::Limits {
    embedded::Limits {
        max_unfinished: config.offline.max_queued_jobs,
        writer_nice: config.threads.batch_nice,
        writer_cpus: config.threads.batch_cpus.clone(),
    }
}

/// Opens the embedded offline store under `config.data_dir`.
fn open_embedded(config: &Config) -> Result<Embedded, StartError> {
    Embedded::open(&config.data_dir, store_limits(config)).map_err(|source| StartError::Store {
        dir: config.data_dir.clone(),
        source,
    })
}

/// Starts the Kafka queue (`offline.queue = "kafka"`): brokers and topics checked, the
/// state topic read, the consumer group joined.
#[cfg(feature = "kafka")]
async fn open_kafka(config: &Config, wake: &Arc<Notify>, shutdown: &CancellationToken) -> Result<Queue, StartError> {
    let max_message = config.limits.max_body_bytes.max(config.limits.max_response_bytes);
    crate::queue::kafka::KafkaQueue::start(
        &config.kafka,
        &config.data_dir,
        store_limits(config),
        max_message,
        wake.clone(),
        shutdown.clone(),
    )
    .await
    .map(Queue::Kafka)
    .map_err(StartError::Settings)
}

/// Without the `kafka` feature there is no Kafka queue.
#[cfg(not(feature = "kafka"))]
async fn open_kafka(_: &Config, _: &Arc<Notify>, _: &CancellationToken) -> Result<Queue, StartError> {
    Err(StartError::Settings(
        "offline.queue = \"kafka\", but this build has no Kafka support (build with --features kafka)".into(),
    ))
}

/// Why the admin API is off when no token is configured.
const NO_TOKEN: &str = "no admin token is configured (admin.token_file, or TIERGATE_ADMIN__TOKEN); \
                        set one, or admin.insecure_no_auth = true on a loopback address for a local test";

/// The admin API's tokens, checking that it does not share a port with a data listener.
fn admin_tokens(config: &Config) -> Result<Option<Tokens>, StartError> {
    let tokens =
        Tokens::from_settings(&config.admin, config.listen.admin).map_err(|e| StartError::Settings(e.to_string()))?;
    let l = &config.listen;
    let shared = [Some(l.http), Some(l.grpc), Some(l.metrics), l.bulk_http, l.bulk_grpc]
        .into_iter()
        .flatten()
        .any(|data| data.port() != 0 && data.port() == l.admin.port());
    if tokens.is_some() && shared {
        return Err(StartError::Settings(format!(
            "listen.admin ({}) shares a port with a data or metrics listener; the admin API needs its own",
            l.admin
        )));
    }
    Ok(tokens)
}

/// Binds `addr` with a queue of `backlog` connections the kernel has accepted and the
/// gateway not yet taken (tokio's own `bind` keeps 1,024: a spike of new connections
/// overflows it, and an overflowed client waits a second or more to retry).
async fn bind(what: &'static str, addr: SocketAddr, backlog: u32) -> Result<TcpListener, StartError> {
    let socket = match addr {
        SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4(),
        SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6(),
    };
    socket
        .and_then(|s| {
            s.set_reuseaddr(true)?;
            s.bind(addr)?;
            s.listen(backlog)
        })
        .map_err(|source| StartError::Bind { what, addr, source })
}

/// Binds `addr` when it is set, as [`bind`] does.
async fn bind_some(
    what: &'static str,
    addr: Option<SocketAddr>,
    backlog: u32,
) -> Result<Option<TcpListener>, StartError> {
    match addr {
        Some(addr) => bind(what, addr, backlog).await.map(Some),
        None => Ok(None),
    }
}

fn local(listener: &TcpListener) -> SocketAddr {
    listener.local_addr().expect("a bound TCP listener has a local address")
}
