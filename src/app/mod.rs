//! Composition: binds the listeners and wires doors, classifier, tiers and backends.
//!
//! The only place that knows every part. [`Gateway::start`] binds what the startup
//! settings name (tests pass port 0), builds the tiers and the door over a policy
//! store, spawns each listener's loop with one shutdown signal, and hands back the
//! bound addresses; [`Gateway::drain`] turns readiness off and [`Gateway::stop`] drains
//! and joins them, in two steps: *closing* (no new connections or leases; open work
//! finishes) and, at the stop's deadline, *ending* (what is still open is answered,
//! handed back or closed).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

mod kafka;
mod listeners;
mod scrape;
mod settings;
mod threads;
mod usage;

pub use settings::check;

use crate::admin::{self, Admin};
use crate::cache::{Cache, SecondLevel};
use crate::config::{Config, QueueKind};
use crate::control::history::History;
use crate::control::Control;
use crate::front::batch_api::OfflineApi;
use crate::front::grpc::GrpcDoor;
use crate::front::http::HttpDoor;
use crate::front::pipeline::admission::Admission;
use crate::front::pipeline::dispatch::Dispatch;
use crate::front::ready::Readiness;
use crate::policy::{Policy, Problems, Store};
use crate::protocol::grpc::pb::grpc_inference_service_server::GrpcInferenceServiceServer;
use crate::queue::{embedded, Embedded, Queue, StoreError};
use crate::shadow::Shadow;
use crate::tiers::{offline, MicroBatch, Offline, Realtime, Tiers};
use kafka::{check_sources, open_kafka, start_sources};
use listeners::{local, Listeners};
use settings::{Checked, NO_TOKEN};
use threads::BatchThreads;

/// A running gateway.
#[derive(Debug)]
pub struct Gateway {
    http: SocketAddr,
    grpc: SocketAddr,
    metrics: SocketAddr,
    admin: Option<SocketAddr>,
    bulk: BulkAddrs,
    door: Arc<HttpDoor>,
    admin_api: Option<Arc<Admin>>,
    control: Arc<Control>,
    readiness: Arc<Readiness>,
    /// Fires first on stop: listeners stop accepting, offline workers stop leasing.
    closing: CancellationToken,
    /// Fires at the stop's deadline (and cancels `closing`): everything ends.
    shutdown: CancellationToken,
    /// The doors and the offline workers: joined first, while open work finishes.
    draining: JoinSet<std::io::Result<()>>,
    /// Everything else (metrics, admin, policy watch, readiness gauges).
    tasks: JoinSet<std::io::Result<()>>,
    stop_timeout: Duration,
    batch_threads: BatchThreads,
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
    /// The startup settings are invalid: every problem, each with its key.
    #[error("the startup settings are invalid:\n{0}")]
    Invalid(crate::config::Problems),
    /// Something the settings name cannot be used (a Kafka broker, the batch threads).
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
    /// The usage ledger's file could not be opened.
    #[error("cannot keep the usage ledger: {0}")]
    Usage(String),
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
    /// Checks the settings whole and `policy` against them, binds the listeners in
    /// `config` and starts serving `policy`.
    pub async fn start(config: &Config, policy: Policy) -> Result<Gateway, StartError> {
        let checked = settings::checked(config, &policy)?;
        let policy = check_sources(config, policy).await?;
        let listeners = Listeners::bind(config, checked.tokens.is_some()).await?;
        let (wake, shutdown) = (Arc::new(Notify::new()), CancellationToken::new());
        let queue = match config.offline.queue {
            QueueKind::Embedded => Queue::Embedded(open_embedded(config)?),
            QueueKind::Kafka => open_kafka(config, &wake, &shutdown).await?,
        };
        let started = Self::assemble(listeners, config, policy, checked, queue, wake, shutdown.clone());
        if started.is_err() {
            shutdown.cancel(); // stops the Kafka queue's tasks
        }
        started
    }

    /// Builds the parts over `policy` and spawns every listener's loop and worker.
    fn assemble(
        listeners: Listeners,
        config: &Config,
        policy: Policy,
        checked: Checked,
        store: Queue,
        wake: Arc<Notify>,
        shutdown: CancellationToken,
    ) -> Result<Gateway, StartError> {
        let prometheus = crate::metrics::install();
        let batch_threads = BatchThreads::start(&config.threads)?;
        let callers = Arc::new(checked.callers);
        let parts = Parts::build(
            config,
            policy,
            (checked.allow, callers.clone(), checked.trust),
            store,
            wake,
            &shutdown,
            &batch_threads,
        )?;
        let (mut tasks, mut draining) = (JoinSet::new(), JoinSet::new());
        let closing = shutdown.child_token();
        start_sources(config, &parts.dispatch, &batch_threads, &closing, &shutdown)?;
        // The usage ledger's ticker too (its store writes on a blocking thread).
        let pools = Arc::new(usage::Pools {
            policy: parts.policy.clone(),
            realtime: parts.workers.realtime.clone(),
            micro_batch: parts.micro_batch.clone(),
        });
        let ledger = batch_threads
            .handle()
            .spawn(parts.dispatch.usage().clone().run(pools, shutdown.clone()));
        tasks.spawn(async move { ledger.await.map_err(std::io::Error::other) });
        // The admin API's view of the offline queue and the real-time pools.
        let (queue, realtime) = (parts.workers.store.clone(), parts.workers.realtime.clone());
        // Offline workers run on the batch threads too (their store I/O has its own thread).
        let workers = batch_threads
            .handle()
            .spawn(parts.workers.run(closing.clone(), shutdown.clone()));
        draining.spawn(async move { workers.await.map_err(std::io::Error::other) });

        let Listeners {
            http,
            grpc,
            metrics,
            admin,
            bulk_http,
            bulk_grpc,
        } = listeners;
        let addrs = (local(&http), local(&grpc), local(&metrics));
        let bulk = BulkAddrs {
            http: bulk_http.as_ref().map(local),
            grpc: bulk_grpc.as_ref().map(local),
        };
        let door = parts.door.clone();
        let tls = checked.tls;
        let allow = crate::server::Connections::from_limits(&config.limits);
        let (http_allow, grpc_allow) = match &tls {
            Some(tls) => {
                tasks.spawn(tls.certificate.clone().watch(shutdown.clone()));
                (
                    allow.clone().with_tls(Some(tls.http.clone())),
                    allow.with_tls(Some(tls.grpc.clone())),
                )
            }
            None => (allow.clone(), allow),
        };
        let serve_http = http_door(parts.door, http_allow, &closing, &shutdown);
        let serve_grpc = grpc_door(parts.grpc_door, grpc_allow, &closing, &shutdown);
        // The bulk doors on the batch threads, so reading bulk work never takes a real-time one.
        if let Some(listener) = bulk_http {
            draining.spawn(batch_threads.listen(listener, serve_http.clone()));
        }
        if let Some(listener) = bulk_grpc {
            draining.spawn(batch_threads.listen(listener, serve_grpc.clone()));
        }
        draining.spawn(serve_http(http));
        draining.spawn(serve_grpc(grpc));
        // On the real-time threads: their request deadlines are then filed without a wake-up.
        tasks.spawn(crate::server::keep_timers_due(shutdown.clone()));
        tasks.spawn(scrape::listen(metrics, prometheus.clone(), shutdown.clone()));
        tasks.spawn(parts.readiness.clone().run(parts.policy.clone(), shutdown.clone()));
        tasks.spawn(callers.watch(shutdown.clone()));

        let (admin_addr, admin_api) = match (admin, checked.tokens) {
            (Some(listener), Some(tokens)) => {
                let addr = local(&listener);
                // The console's history, sampled once a second from the recorder.
                let render = prometheus.clone();
                let replica = admin::stats::Replica {
                    name: config.kafka.queue.replica_name(),
                    address: addrs.0.to_string(),
                    started_ms: started_ms(),
                };
                let stats = admin::stats::Stats::shared(replica, move || render.render())
                    .map_err(|e| StartError::Settings(format!("cannot start the console's sampler thread: {e}")))?;
                let api = Arc::new(Admin {
                    control: parts.control.clone(),
                    tokens,
                    micro_batch: parts.micro_batch,
                    realtime,
                    shadow: parts.shadow,
                    dispatch: parts.dispatch.clone(),
                    stats: Arc::new(stats),
                    queue,
                });
                let tls = tls.as_ref().map(|tls| tls.admin.clone());
                tasks.spawn(admin::listen(listener, api.clone(), tls, shutdown.clone()));
                (Some(addr), Some(api))
            }
            _ => (None, None), // bound only when there are tokens
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
            door,
            admin_api,
            control: parts.control,
            readiness: parts.readiness,
            closing,
            shutdown,
            draining,
            tasks,
            stop_timeout: config.shutdown.timeout,
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

    /// The HTTP door, to drive without a socket (`HttpDoor::answer` takes any request body;
    /// its answers' own fields ride in their bodies, `Answered::stamp_headers` puts them
    /// in the header map).
    pub fn door(&self) -> &Arc<HttpDoor> {
        &self.door
    }

    /// The admin API, when it is on, to drive without a socket (`Admin::answer`).
    pub fn admin_api(&self) -> Option<&Arc<Admin>> {
        self.admin_api.as_ref()
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

    /// From now on readiness answers 503 (`draining`); everything else goes on, new
    /// connections and requests included, until [`Gateway::stop`].
    pub fn drain(&self) {
        self.readiness.drain();
    }

    /// Stops within `shutdown.timeout`, as [`Gateway::stop_within`] does.
    pub async fn stop(self) -> std::io::Result<()> {
        let timeout = self.stop_timeout;
        self.stop_within(timeout).await
    }

    /// Stops: readiness off; no new connections (idle ones closed, HTTP/2 ones sent
    /// GOAWAY) and no new offline leases; in-flight requests, queued micro-batch callers
    /// and leased offline jobs finish. What is still open after `timeout` is ended:
    /// micro-batch callers get 503, leased jobs are queued again, connections close.
    /// Returns once every task has ended.
    pub async fn stop_within(mut self, timeout: Duration) -> std::io::Result<()> {
        // The end comes early enough for the answers it makes to be written in time.
        let deadline = tokio::time::Instant::now() + timeout.saturating_sub(crate::server::FLUSH.min(timeout / 4));
        self.readiness.drain();
        self.closing.cancel();
        let mut outcome = Ok(());
        if tokio::time::timeout_at(deadline, join_all(&mut self.draining, &mut outcome))
            .await
            .is_err()
        {
            tracing::warn!(?timeout, "work still open at the end of the drain is ended now");
        }
        self.shutdown.cancel();
        join_all(&mut self.draining, &mut outcome).await;
        join_all(&mut self.tasks, &mut outcome).await;
        drop(self.batch_threads);
        outcome
    }
}

/// Joins every task of `set`, keeping the first failure in `outcome`; cancel-safe.
async fn join_all(set: &mut JoinSet<std::io::Result<()>>, outcome: &mut std::io::Result<()>) {
    while let Some(done) = set.join_next().await {
        let done = done.map_err(std::io::Error::other).and_then(|r| r);
        if let (Err(e), Ok(())) = (done, &outcome) {
            *outcome = Err(e);
        }
    }
}

/// What every listener serves, built once before any is spawned: the policy and its
/// control plane, the three tiers, admission, readiness, the dispatch, the doors, and
/// the offline workers.
struct Parts {
    policy: Arc<Store>,
    control: Arc<Control>,
    readiness: Arc<Readiness>,
    dispatch: Arc<Dispatch>,
    door: Arc<HttpDoor>,
    grpc_door: GrpcInferenceServiceServer<GrpcDoor>,
    micro_batch: MicroBatch,
    shadow: Shadow,
    workers: offline::worker::Workers,
}

impl Parts {
    fn build(
        config: &Config,
        policy: Policy,
        (allow, callers, trust): (
            crate::policy::Allowlist,
            Arc<crate::front::auth::Callers>,
            crate::backend::Trust,
        ),
        store: Queue,
        wake: Arc<Notify>,
        shutdown: &CancellationToken,
        batch_threads: &BatchThreads,
    ) -> Result<Parts, StartError> {
        let history_error = |source| StartError::History {
            dir: config.data_dir.clone(),
            source,
        };
        let history = History::open(&config.data_dir, config.admin.audit_log.as_deref()).map_err(history_error)?;
        let version = history.latest().map_err(history_error)? + 1;
        let policy = Arc::new(Store::at(policy, version));
        let dir = config.policy_dir.clone();
        let control = Arc::new(Control::new(policy.clone(), dir, allow, history).map_err(history_error)?);
        let backends = crate::backend::Settings::new(config.limits.max_response_bytes).trusting(trust);
        let shadow = Shadow::new(
            backends.clone(),
            policy.clone(),
            Some(batch_threads.handle()),
            Some(control.clone()),
        );
        let realtime = Realtime::new(backends.clone(), Some(shadow.clone()));
        let cache = Cache::new().with_second_level(SecondLevel::new(&config.cache).map_err(StartError::Settings)?);
        let usage = crate::usage::store::Store::open(&config.data_dir, config.usage.keep_days)
            .and_then(crate::usage::Ledger::kept_in)
            .map(|ledger| match config.metrics.tenant_labels {
                true => ledger.with_tenant_series(config.metrics.max_tenant_series),
                false => ledger,
            })
            .map(|ledger| shared(ledger, &store))
            .map_err(StartError::Usage)?;
        let usage = Arc::new(match &config.usage.redis {
            Some(url) => usage.with_limits(crate::usage::limits::Limits::shared(
                crate::usage::limits::shared::Shared::new(
                    &url.0,
                    &config.usage.redis_prefix,
                    config.usage.redis_timeout,
                )
                .map_err(StartError::Settings)?,
            )),
            None => usage,
        });
        let micro_batch = MicroBatch::new(
            backends.clone(),
            shutdown.clone(),
            Some(batch_threads.handle()),
            (Some(shadow.clone()), cache.clone()),
            usage.clone(),
        )
        .with_interactive(realtime.clone());
        let offline = Offline::new(store.clone(), config.offline.clone(), wake.clone());
        let tiers = Tiers::new(realtime.clone(), micro_batch.clone(), offline);
        // Its memory watch runs on the batch threads, off the real-time ones.
        let admission = {
            let batch = batch_threads.handle();
            let _on_batch = batch.enter();
            Admission::new(&config.limits, shutdown.clone())
        };
        let readiness = Readiness::new(store.clone(), realtime.clone(), micro_batch.clone());
        let dispatch = Arc::new(
            Dispatch::new(policy.clone(), admission, tiers, backends, readiness.clone())
                .with_budget_reserve(config.limits.budget_reserve)
                .with_max_stream_event(config.limits.max_stream_event_bytes)
                .with_callers(callers)
                .with_cache(cache.clone())
                .with_usage(usage.clone()),
        );
        let api = OfflineApi {
            store: store.clone(),
            policy: policy.clone(),
            settings: config.offline.clone(),
            wake: wake.clone(),
            max_body_bytes: config.limits.max_body_bytes,
        };
        let door = Arc::new(HttpDoor::new(dispatch.clone(), config.limits.clone()).with_offline(api));
        let grpc_door = GrpcDoor::new(dispatch.clone()).service(&config.limits, config.grpc.answer_compression);
        let workers = offline::worker::Workers {
            store,
            policy: policy.clone(),
            micro: micro_batch.clone(),
            realtime,
            settings: config.offline.clone(),
            wake,
            shadow: Some(shadow.clone()),
            cache,
            usage: usage.clone(),
        };
        Ok(Parts {
            policy,
            control,
            readiness,
            dispatch,
            door,
            grpc_door,
            micro_batch,
            shadow,
            workers,
        })
    }
}

/// `ledger`, shared with the other replicas on the Kafka queue's state topic when the
/// offline queue is there.
fn shared(ledger: crate::usage::Ledger, store: &Queue) -> crate::usage::Ledger {
    match store {
        #[cfg(feature = "kafka")]
        Queue::Kafka(queue) => ledger.with_fleet(Arc::new(queue.clone())),
        _ => ledger,
    }
}

/// The HTTP door's loop for a listener: it stops accepting at `closing` and closes what
/// is still open at `ending`.
fn http_door(
    door: Arc<HttpDoor>,
    allow: crate::server::Connections,
    closing: &CancellationToken,
    ending: &CancellationToken,
) -> impl FnOnce(tokio::net::TcpListener) -> BoxFuture + Clone + Send + 'static {
    let (closing, ending) = (closing.clone(), ending.clone());
    move |listener| {
        let hyper_door = door.clone();
        let answer = move |req| hyper_door.clone().answer(req);
        let lean = move |req| door.clone().answer(req);
        Box::pin(crate::server::listen_lean(
            listener,
            allow,
            (closing, ending),
            (answer, lean),
            crate::front::body::STAMPING,
        ))
    }
}

/// The gRPC door's loop for a listener: the same connection loop as the HTTP doors'
/// (limits, deadlines, GOAWAY when idle, the drain), each request answered by the tonic
/// service with tonic's own refusals given the gateway's codes.
fn grpc_door(
    service: GrpcInferenceServiceServer<GrpcDoor>,
    allow: crate::server::Connections,
    closing: &CancellationToken,
    ending: &CancellationToken,
) -> impl FnOnce(tokio::net::TcpListener) -> BoxFuture + Clone + Send + 'static {
    let (closing, ending) = (closing.clone(), ending.clone());
    move |listener| {
        let answer = move |req: http::Request<crate::server::Incoming>| {
            let service = service.clone();
            async move {
                match tower::ServiceExt::oneshot(service, req).await {
                    Ok(answer) => crate::front::grpc::trailing_timing(crate::front::grpc::client_codes(answer)),
                    Err(never) => match never {},
                }
            }
        };
        Box::pin(crate::server::listen(listener, allow, (closing, ending), answer))
    }
}

/// A listener's loop, boxed.
type BoxFuture = std::pin::Pin<Box<dyn std::future::Future<Output = std::io::Result<()>> + Send>>;

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

/// Now, unix milliseconds: when the gateway started, for the admin API's history.
fn started_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}
