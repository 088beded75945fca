//! The micro-batch tier: near-real-time requests from many callers coalesced into one
//! backend call on the route's batch pool, and the answer scattered back.
//!
//! After the classifier; before the batch pool. Each request is decoded into its rows
//! (KServe v2 tensors, or a JSON route's array through the route's adapter) and queued in
//! the *lane* for its route, path and signature, so only requests that can be
//! concatenated meet; every lane of a route shares the pool's backend slots, one queue
//! capacity in rows and the pool's learned cost (see [`super::batcher`]). A request the
//! learned cost says cannot make its deadline is refused at once (503), a full queue
//! answers 429, and a request that cannot be batched (no batch dimension, no adapter,
//! more rows than `max_batch`) is sent alone on a batch slot. A caller that leaves (HTTP
//! disconnect, gRPC cancel) drops its answer channel and is left out of its batch.
//! When a route's batch settings change, its lanes are replaced and the old ones drain:
//! nothing queued is lost.
//!
//! # Layout
//!
//! `kserve` (tensors: decode, concat, split) · `combined` (members of a combined model
//! sharing its calls, each answered with its own outputs) · `json` (TF-Serving and
//! OpenAI adapters) ·
//! `rows` (each row looked up in the route's cache, identical rows sent once) · `send`
//! (one batch: build, call, scatter, isolate) · `canary` (a canary's share of
//! calls, batched on the candidate's pool) · `window` (LLM calls released onto the
//! pool through its admission window).

mod canary;
mod combined;
mod json;
mod kserve;
mod rows;
mod send;
mod window;

pub use window::WindowState;

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use std::time::Duration;

use dashmap::DashMap;
use http::HeaderValue;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::batcher::{self, Class, Flush, Queue, Settings, Shared};
use super::cost::Cost;
use super::Call;
use crate::backend::{Pool, Pools, Role};
use crate::cache::Cache;
use crate::decision::Tier;
use crate::error::{Error, Kind};
use crate::headers;
use crate::metrics;
use crate::policy::{BatchSpec, JsonAdapter, Priority};
use crate::protocol::batch::Signature;
use crate::protocol::Reply;
use crate::shadow::Shadow;

/// Most lanes (distinct paths and signatures) one route keeps; idle ones are let go
/// first, so a client cycling through shapes cannot grow the gateway without bound.
const MAX_LANES: usize = 256;

/// The micro-batch tier service.
#[derive(Debug, Clone)]
pub struct MicroBatch {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    pools: Pools,
    routes: DashMap<String, Arc<RouteLanes>>,
    shutdown: CancellationToken,
    /// The batch threads: decoding, queueing, batch assembly, backend calls and
    /// splitting run there, never on the threads serving real-time requests.
    threads: Option<tokio::runtime::Handle>,
    /// Routes' shadow candidates, which score a share of the batches.
    shadow: Option<Shadow>,
    /// Lanes on routes' candidate pools, for the share of calls a canary sends there.
    canaries: DashMap<String, Arc<RouteLanes>>,
    /// The routes' prediction caches, which answer rows they hold.
    cache: Cache,
    /// The usage ledger its batches are charged to.
    usage: Arc<crate::usage::Ledger>,
    /// The real-time tier, whose interactive streams a window on a pool it shares
    /// holds batch work back for.
    interactive: Option<super::realtime::Realtime>,
}

/// One route's lanes under one batch spec, and what they share.
#[derive(Debug)]
struct RouteLanes {
    route: String,
    spec: Arc<BatchSpec>,
    pool: Arc<Pool>,
    settings: Settings,
    shared: Shared,
    metrics: Arc<BatchMetrics>,
    /// The pool's queue, in front of one worker forming every lane's batches.
    queue: Queue<Lane, Part, Reply>,
    lanes: Mutex<HashMap<LaneKey, Arc<Lane>>>,
    shadow: Option<Shadow>,
    /// The caches its callers' rows are looked up in (none on a canary's lanes: the
    /// candidate's answers are never kept).
    cache: Option<Cache>,
    /// The route's usage counters.
    usage: Arc<crate::usage::RouteUsage>,
    /// The pool's admission window for LLM calls, when the spec names one.
    window: Option<window::Window>,
}

/// What must agree for requests to share a batch.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum LaneKey {
    Kserve {
        path: String,
        signature: Signature,
    },
    /// Callers of a combined model's members, on the combined model's path: their
    /// signature leaves out the outputs they asked for.
    Combined {
        path: String,
        signature: Signature,
    },
    Json {
        path: String,
        signature: String,
    },
}

/// How a lane's requests are merged and split.
#[derive(Debug, Clone, Copy)]
enum Form {
    Kserve,
    Json(JsonAdapter),
}

/// A caller's rows, and where its trace continues.
#[derive(Debug)]
struct Part {
    rows: Rows,
    /// The caller's span (its tier span): a batch's span is a child of its first
    /// caller's and, when exported, links the others.
    span: tracing::Span,
    /// The caller's ids: a batch's backend call carries its first caller's trace.
    ids: Option<crate::trace::Ids>,
    /// On a route with its cache on: how the caller's rows meet it.
    cache: Option<Box<rows::Rowed>>,
    /// The caller's tenant ("" for the anonymous one), charged its rows' share.
    tenant: String,
    /// A caller of a combined model's member: what it asked of the combined answer.
    asked: Option<Arc<combined::Asked>>,
}

/// A caller's rows, in its lane's form.
#[derive(Debug)]
enum Rows {
    Kserve(Box<crate::protocol::InferRequest>),
    Json(json::Part),
}

/// Why a request is served alone rather than batched.
#[derive(Debug)]
struct Unbatched(String);

/// What a lane's batches need to be sent.
#[derive(Debug)]
struct Lane {
    route: String,
    shadow: Option<Shadow>,
    /// The batch pool's settings (the shadow's noise floor asks the same endpoints).
    pool_spec: Arc<crate::policy::PoolSpec>,
    path: String,
    form: Form,
    pool: Arc<Pool>,
    binary: bool,
    cost: Arc<Cost>,
    max_batch: u64,
    /// The pool's progressive batch size.
    limit: Arc<batcher::Limit>,
    /// The pool's largest batch in bytes.
    max_bytes: Arc<batcher::MaxBytes>,
    metrics: Arc<BatchMetrics>,
    /// The route's usage counters.
    usage: Arc<crate::usage::RouteUsage>,
    /// The pool's time as its calls share it.
    shares: Arc<crate::usage::Shares>,
}

/// One route's micro-batch instruments, registered once per route spec.
struct BatchMetrics {
    flushes: [::metrics::Counter; 3],
    rows: ::metrics::Histogram,
    fill: ::metrics::Histogram,
    /// By [`Priority::index`].
    queue_seconds: [::metrics::Histogram; 3],
    /// Queued and shed, by [`Priority::index`].
    bands: [[::metrics::Counter; 2]; 3],
    isolations: ::metrics::Counter,
    cost_fixed: ::metrics::Gauge,
    cost_per_row: ::metrics::Gauge,
    /// The pool's progressive batch size.
    limit: ::metrics::Gauge,
    route: String,
}

impl std::fmt::Debug for BatchMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BatchMetrics")
    }
}

impl BatchMetrics {
    fn new(route: &str) -> Self {
        let flush = |reason: Flush| ::metrics::counter!(metrics::BATCH_FLUSHES, "route" => route.to_owned(), "reason" => reason.as_str());
        let label = || [("route", route.to_owned())];
        // Known rejection reasons start at zero (`absolute` never lowers a counter).
        for reason in ["queue_full", "deadline_unmeetable", "too_many_signatures"] {
            ::metrics::counter!(metrics::BATCH_REJECTIONS, "route" => route.to_owned(), "reason" => reason).absolute(0);
        }
        BatchMetrics {
            flushes: [Flush::Full, Flush::IdleBackend, Flush::Deadline].map(flush),
            rows: ::metrics::histogram!(metrics::BATCH_ROWS, &label()),
            fill: ::metrics::histogram!(metrics::BATCH_FILL_RATIO, &label()),
            queue_seconds: Priority::BY_INDEX.map(|p| {
                ::metrics::histogram!(metrics::BATCH_QUEUE_SECONDS, "route" => route.to_owned(), "priority" => p.as_str())
            }),
            bands: Priority::BY_INDEX.map(|p| {
                ["queued", "shed"].map(|outcome| {
                    let labels = [("route", route.to_owned()), ("priority", p.as_str().to_owned()), ("outcome", outcome.to_owned())];
                    let counter = ::metrics::counter!(metrics::BATCH_PRIORITY, &labels);
                    counter.absolute(0); // exported from the start (never lowers a count)
                    counter
                })
            }),
            isolations: ::metrics::counter!(metrics::BATCH_ISOLATIONS, &label()),
            cost_fixed: ::metrics::gauge!(metrics::BATCH_COST_FIXED, &label()),
            cost_per_row: ::metrics::gauge!(metrics::BATCH_COST_PER_ROW, &label()),
            limit: ::metrics::gauge!(metrics::BATCH_SIZE_LIMIT, &label()),
            route: route.to_owned(),
        }
    }

    fn flushed(&self, flush: Flush, rows: u64, max_batch: u64) {
        let i = match flush {
            Flush::Full => 0,
            Flush::IdleBackend => 1,
            Flush::Deadline => 2,
        };
        self.flushes[i].increment(1);
        self.rows.record(rows as f64);
        self.fill.record(rows as f64 / max_batch.max(1) as f64);
    }

    fn learned(&self, cost: &Cost) {
        if let Some(e) = cost.estimate() {
            self.cost_fixed.set(e.fixed.as_secs_f64());
            self.cost_per_row.set(e.per_row.as_secs_f64());
        }
    }

    /// The same instruments without the learned cost's and batch size's gauges (a
    /// canary's lanes learn the candidate's, which are not the route's).
    fn without_cost(mut self) -> Self {
        self.cost_fixed = ::metrics::Gauge::noop();
        self.cost_per_row = ::metrics::Gauge::noop();
        self.limit = ::metrics::Gauge::noop();
        self
    }

    /// Counts a request of `priority` queued, or shed (refused under pressure or evicted).
    fn band(&self, priority: Priority, shed: bool) {
        self.bands[priority.index()][usize::from(shed)].increment(1);
    }

    fn rejected(&self, reason: &'static str) {
        ::metrics::counter!(metrics::BATCH_REJECTIONS, "route" => self.route.clone(), "reason" => reason).increment(1);
    }
}

/// A call on its way: queued in a lane, or to be sent alone on a batch slot.
enum Pending {
    Queued {
        answer: tokio::sync::oneshot::Receiver<Result<Reply, Error>>,
        lanes: Arc<RouteLanes>,
        deadline: Instant,
        priority: Priority,
    },
    /// Sent alone: the lanes, the call, why, and whether it is offline filler (which
    /// waits for spare capacity rather than any slot).
    Alone(Arc<RouteLanes>, Box<Call>, String, bool),
}

impl Pending {
    /// Waits for the answer, at most until the call's deadline.
    async fn answer(self) -> Result<Reply, Error> {
        match self {
            // Boxed: a backend call's future is large, and most calls are queued.
            Pending::Alone(lanes, call, why, false) => Box::pin(lanes.alone(*call, &why)).await,
            Pending::Alone(lanes, call, why, true) => {
                let _spare = lanes.spare_slot().await;
                let forward = lanes.forward_alone(*call, &why, crate::usage::Source::Offline);
                Box::pin(forward).await.0
            }
            Pending::Queued {
                answer,
                lanes,
                deadline,
                priority,
            } => match tokio::time::timeout_at(deadline, answer).await {
                Ok(Ok(answer)) => {
                    if answer.as_ref().is_err_and(|e| e.kind == Kind::QueueFull) {
                        lanes.metrics.band(priority, true); // evicted for a higher band
                    }
                    answer
                }
                Ok(Err(_)) => Err(Error::new(Kind::Unavailable, "the micro-batch worker stopped")),
                Err(_) => Err(Error::new(
                    Kind::Deadline,
                    format!(
                        "the budget ran out in the micro-batch tier (route {}; {} rows queued)",
                        lanes.route,
                        lanes.queue.queued_rows()
                    ),
                )),
            },
        }
    }
}

/// What a route's batch pool looks like right now (for the admin API's explain).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PoolState {
    /// Rows waiting in the route's lanes.
    pub queued_rows: u64,
    /// Free backend slots.
    pub free_slots: usize,
    /// The learned cost, once enough batches were seen.
    pub cost: Option<super::cost::Estimate>,
    /// The progressive batch size: most rows a batch carries now (below `max_batch`
    /// after failed, timed-out or over-cost batches).
    pub batch_limit: u64,
    /// What one row alone costs the pool as the usage ledger prices it (`t(1)` from
    /// the batches' service times), once it can tell.
    pub one_row: Option<Duration>,
    /// Most bytes of request body a batch carries now (`max_batch_bytes`, lowered to
    /// half of a batch the backend refused as too large).
    pub max_batch_bytes: u64,
    /// The pool's admission window for LLM calls, when it has one.
    pub window: Option<WindowState>,
}

impl MicroBatch {
    /// The state of `route`'s batch pool, if it has served anything since start.
    pub fn pool_state(&self, route: &str) -> Option<PoolState> {
        let lanes = self.inner.routes.get(route)?;
        Some(PoolState {
            queued_rows: lanes.shared.queued.load(std::sync::atomic::Ordering::Relaxed),
            free_slots: lanes.shared.slots.available_permits(),
            cost: lanes.shared.cost.estimate(),
            batch_limit: lanes.shared.limit.now(lanes.settings.max_batch),
            one_row: lanes.shared.shares.one(),
            max_batch_bytes: lanes.shared.max_bytes.now(),
            window: lanes.window.as_ref().map(window::Window::state),
        })
    }

    /// `route`'s batch pool's endpoints not ejected now (`spec` is its pool).
    pub fn healthy(&self, route: &str, spec: &crate::policy::PoolSpec) -> usize {
        self.inner.pools.healthy(route, spec)
    }

    /// Rows waiting in `route`'s queue by band and tenant: `(band, tenant, weight,
    /// rows)`, highest band first. Only a hash of each tenant is kept in the queue: it
    /// is named when it is among `names`, else shown as `#` and its hash.
    pub fn queued_by_tenant<'a>(
        &self,
        route: &str,
        names: impl IntoIterator<Item = &'a str>,
    ) -> Vec<(crate::policy::Priority, String, f64, u64)> {
        let Some(lanes) = self.inner.routes.get(route).map(|l| l.clone()) else {
            return Vec::new();
        };
        let named: HashMap<u64, &str> = names.into_iter().map(|n| (flow_of(n), n)).collect();
        lanes
            .queue
            .by_flow()
            .into_iter()
            .map(|(band, flow, weight, rows)| {
                let tenant = match named.get(&flow) {
                    Some(name) => (*name).to_owned(),
                    None => format!("#{flow:016x}"),
                };
                (band, tenant, weight, rows)
            })
            .collect()
    }

    /// `route`'s batch pool's endpoints now (`spec` is its pool); `None` before its
    /// first call.
    pub fn endpoints_now(
        &self,
        route: &str,
        spec: &crate::policy::PoolSpec,
    ) -> Option<Vec<crate::backend::EndpointView>> {
        self.inner.pools.endpoints_now(route, spec)
    }

    /// The routes of `policy` whose batch pool has every endpoint ejected.
    pub fn ejected(&self, policy: &crate::policy::Policy) -> Vec<String> {
        policy
            .routes()
            .iter()
            .filter(|r| {
                r.micro_batch
                    .as_ref()
                    .is_some_and(|spec| self.inner.pools.all_ejected(&r.name, &spec.pool))
            })
            .map(|r| r.name.clone())
            .collect()
    }

    /// Serves offline `calls` on their routes' batch pools as filler: riding in
    /// callers' batches within a small cost slack, or in batches of their own when the
    /// pool is idle, so micro-batch callers always go first. One answer per call, in order.
    pub async fn serve_filler(&self, calls: Vec<Call>) -> Vec<Result<Reply, Error>> {
        let inner = self.inner.clone();
        let n = calls.len();
        on_batch_threads(&self.inner.threads, async move { Ok(inner.serve_filler(calls).await) })
            .await
            .unwrap_or_else(|e| (0..n).map(|_| Err(e.clone())).collect())
    }

    /// A micro-batch tier whose pools are built with `settings` and whose batchers stop
    /// (answering what is queued) when `shutdown` fires. Its work runs on `threads` when
    /// given (the gateway's batch runtime), else on the caller's; a share of its batches
    /// go to routes' shadow candidates too when `shadow` is given. Routes with their
    /// cache on look their rows up in `cache`. Batches are charged to `usage`.
    pub fn new(
        settings: crate::backend::Settings,
        shutdown: CancellationToken,
        threads: Option<tokio::runtime::Handle>,
        (shadow, cache): (Option<Shadow>, Cache),
        usage: Arc<crate::usage::Ledger>,
    ) -> Self {
        MicroBatch {
            inner: Arc::new(Inner {
                pools: Pools::new(Role::Tier(Tier::MicroBatch), settings),
                routes: DashMap::new(),
                shutdown,
                threads,
                shadow,
                canaries: DashMap::new(),
                cache,
                usage,
                interactive: None,
            }),
        }
    }

    /// The same tier, its windows on a pool shared with a route's real-time pool
    /// holding batch work back while `realtime`'s interactive streams wait too long
    /// for their first token. Called before the tier is first cloned.
    pub fn with_interactive(mut self, realtime: super::realtime::Realtime) -> Self {
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.interactive = Some(realtime);
        }
        self
    }
}

impl MicroBatch {
    /// Serves `call` in a batch of its lane, on the batch threads (when there are any):
    /// admission (queue capacity, deadlines) happens per call, in its pool's queue.
    pub fn serve(&self, call: Call) -> Pin<Box<dyn Future<Output = Result<Reply, Error>> + Send>> {
        let inner = self.inner.clone();
        on_batch_threads(&self.inner.threads, async move { inner.serve(call).await })
    }
}

/// Runs `work` on the batch threads (when there are any); the returned future waits
/// for it, and if the caller drops that future, the work is cancelled with it (its
/// queue entry is let go). `work` moves into its task at once, so what the caller
/// holds while a request is queued is the task's handle, not a second copy of `work`.
fn on_batch_threads<T: Send + 'static>(
    threads: &Option<tokio::runtime::Handle>,
    work: impl Future<Output = Result<T, Error>> + Send + 'static,
) -> Pin<Box<dyn Future<Output = Result<T, Error>> + Send>> {
    match threads {
        None => Box::pin(work),
        // The caller's span goes along, so its logs and the batch's span stay in its trace.
        Some(handle) => {
            let task =
                tokio_util::task::AbortOnDropHandle::new(handle.spawn(tracing::Instrument::in_current_span(work)));
            Box::pin(async move {
                task.await
                    .unwrap_or_else(|_| Err(Error::new(Kind::Unavailable, "the micro-batch threads stopped")))
            })
        }
    }
}

impl Inner {
    async fn serve(&self, call: Call) -> Result<Reply, Error> {
        // A route running a canary (a sequence's steps stay where their state is).
        if let Some(shadow) = self.shadow.as_ref().filter(|_| !super::step(&call.request)) {
            if let Some((spec, variant)) = Shadow::variant(&call.route, Tier::MicroBatch, &call.request) {
                return self.serve_canary(shadow, &spec, variant, call).await;
            }
        }
        self.enqueue(call, false)?.answer().await
    }

    /// Decodes `call` and queues it in its lane, as filler when `filler` (or readies it
    /// to go alone); the answer comes from [`Pending::answer`].
    fn enqueue(&self, call: Call, filler: bool) -> Result<Pending, Error> {
        let spec = batch_spec(&call)?.clone();
        enqueue_in(self.lanes(&call.route.name, &spec), &spec, call, filler)
    }

    /// Queues offline `calls` as filler (see [`Queue::submit_filler`]) and waits for
    /// every answer, in order.
    async fn serve_filler(&self, calls: Vec<Call>) -> Vec<Result<Reply, Error>> {
        let pending: Vec<_> = calls.into_iter().map(|call| self.enqueue(call, true)).collect();
        let mut answers = Vec::with_capacity(pending.len());
        for p in pending {
            answers.push(match p {
                Ok(p) => p.answer().await,
                Err(e) => Err(e),
            });
        }
        answers
    }

    /// The lanes serving `route` under `spec`; replaced (the old ones drain) when the
    /// spec changes. Slots and learned cost carry over while the pool is unchanged.
    fn lanes(&self, route: &str, spec: &Arc<BatchSpec>) -> Arc<RouteLanes> {
        if let Some(lanes) = self.routes.get(route) {
            if Arc::ptr_eq(&lanes.spec, spec) || *lanes.spec == **spec {
                return lanes.clone();
            }
        }
        let mut entry = self
            .routes
            .entry(route.to_owned())
            .or_insert_with(|| Arc::new(self.build(route, spec, None)));
        if *entry.spec != **spec {
            let previous = entry.clone();
            *entry = Arc::new(self.build(route, spec, Some(&previous)));
        }
        entry.clone()
    }

    fn build(&self, route: &str, spec: &Arc<BatchSpec>, previous: Option<&RouteLanes>) -> RouteLanes {
        self.lanes_on(route, spec, previous, self.pools.get(route, &spec.pool))
    }

    /// Lanes of `route` under `spec` sending to `pool`.
    fn lanes_on(
        &self,
        route: &str,
        spec: &Arc<BatchSpec>,
        previous: Option<&RouteLanes>,
        pool: Arc<Pool>,
    ) -> RouteLanes {
        let settings = Settings {
            max_batch: u64::from(spec.max_batch.get()),
            max_bytes: spec.max_batch_bytes,
            slots: spec.pool.max_concurrency.get() as usize,
            capacity: u64::from(spec.queue_capacity.get()),
            shed_at: u64::from(spec.scheduling.shed_at),
        };
        let shared = match previous.filter(|p| p.spec.pool == spec.pool) {
            Some(p) if p.spec.max_batch_bytes == spec.max_batch_bytes => p.shared.clone(),
            Some(p) => Shared {
                max_bytes: Arc::new(batcher::MaxBytes::new(spec.max_batch_bytes)),
                ..p.shared.clone()
            },
            None => Shared {
                depth: ::metrics::gauge!(metrics::BATCH_QUEUE_ROWS, "route" => route.to_owned()),
                cost: Arc::new(Cost::new()),
                ..Shared::new(&settings)
            },
        };
        let metrics = BatchMetrics::new(route);
        metrics.limit.set(shared.limit.now(settings.max_batch) as f64);
        let (queue, worker) = batcher::pair_sharing(settings, shared.clone());
        tokio::spawn(worker.run(send::send, self.shutdown.clone()));
        let usage = self.usage.route(route);
        let window = window::Window::start(
            route,
            spec,
            (pool.clone(), usage.clone(), shared.shares.clone()),
            (self.interactive.as_ref(), &self.shutdown),
        );
        RouteLanes {
            route: route.to_owned(),
            spec: spec.clone(),
            pool,
            settings,
            shared,
            metrics: Arc::new(metrics),
            queue,
            lanes: Mutex::new(HashMap::new()),
            shadow: self.shadow.clone(),
            cache: Some(self.cache.clone()),
            usage,
            window,
        }
    }
}

/// The route's batch spec.
fn batch_spec(call: &Call) -> Result<&Arc<BatchSpec>, Error> {
    call.route.micro_batch.as_ref().ok_or_else(|| {
        Error::new(
            Kind::NoTier,
            format!("route {} has no micro_batch pool", call.route.name),
        )
    })
}

/// Decodes `call` and queues it in its lane of `lanes` (which serve `spec`), as filler
/// when `filler` (or readies it to go alone); the answer comes from [`Pending::answer`].
fn enqueue_in(lanes: Arc<RouteLanes>, spec: &Arc<BatchSpec>, call: Call, filler: bool) -> Result<Pending, Error> {
    let capacity = &call.route.usage.micro_batch.capacity;
    lanes.shared.shares.calls_per_endpoint(capacity.calls_per_endpoint);
    let path = call.request.uri().path().to_owned();
    let kserve = path.starts_with("/v2/models/") && path.ends_with("/infer");
    let parsed = match (kserve, spec.json_adapter) {
        (true, _) => {
            let member = combined::member(spec, &path);
            let asking = member.as_ref().map(|(model, member, _)| (*model, *member));
            kserve::parse(&call.request, asking)?.map(|(signature, req, rows, asked)| {
                let key = match member {
                    Some((_, _, path)) => LaneKey::Combined { path, signature },
                    None => LaneKey::Kserve { path, signature },
                };
                (key, Rows::Kserve(Box::new(req)), rows, asked.map(Arc::new))
            })
        }
        (false, Some(adapter)) => json::parse(adapter, call.request.body())?
            .map(|(signature, part, rows)| (LaneKey::Json { path, signature }, Rows::Json(part), rows, None)),
        (false, None) => Err(Unbatched("the route has no json_adapter".into())),
    };
    let bytes = call.request.body().len() as u64;
    let (key, part, rows, asked) = match parsed {
        Ok(batchable) if batchable.2 > lanes.settings.max_batch => {
            return alone(lanes, spec, call, "it has more rows than max_batch".into(), filler);
        }
        Ok(_) if bytes > lanes.shared.max_bytes.now() => {
            let why = "its body is larger than a batch may be (max_batch_bytes)".into();
            return alone(lanes, spec, call, why, filler);
        }
        Ok(batchable) => batchable,
        Err(Unbatched(why)) => return alone(lanes, spec, call, why, filler),
    };
    let (class, tenant) = class(spec, &call)?;
    // A stream is due by its first token, which the learned cost (of whole answers)
    // does not tell; nor is a stream's answer kept in the cache.
    let streamed = matches!(&part, Rows::Json(p) if p.streamed());
    if !filler {
        lanes.admit(&class, (rows, streamed), call.deadline)?;
    }
    let lane = lanes.lane(key, spec)?;
    let part = Part {
        cache: (lanes.cache.as_ref().filter(|_| !streamed)).and_then(|cache| rowed(cache, &call)),
        rows: part,
        span: tracing::Span::current(),
        ids: call.request.extensions().get::<crate::trace::Ids>().cloned(),
        asked,
        tenant,
    };
    let submitted = match filler {
        true => lanes.queue.submit_filler(&lane, part, (rows, bytes), call.deadline),
        false => lanes
            .queue
            .submit_sized(&lane, part, (rows, bytes, call.deadline), class),
    };
    queued(lanes, submitted, (class.priority, call.deadline), filler)
}

/// The call on its way once `submitted` to a queue of `lanes` in band `priority`, due
/// by `deadline` (filler when `filler`), counted in its band or as refused.
fn queued(
    lanes: Arc<RouteLanes>,
    submitted: Result<tokio::sync::oneshot::Receiver<Result<Reply, Error>>, Error>,
    (priority, deadline): (Priority, Instant),
    filler: bool,
) -> Result<Pending, Error> {
    let answer = submitted.inspect_err(|e| {
        if e.kind == Kind::QueueFull {
            match priority {
                Priority::Sheddable => lanes.metrics.band(priority, true),
                _ => lanes.metrics.rejected("queue_full"),
            }
        }
    })?;
    if !filler {
        lanes.metrics.band(priority, false);
    }
    Ok(Pending::Queued {
        answer,
        lanes,
        deadline,
        priority,
    })
}

/// Readies `call`, which cannot share a batch (`why`), to go alone: an LLM generation
/// on a pool with an admission window is queued there, anything else waits for a slot.
fn alone(lanes: Arc<RouteLanes>, spec: &BatchSpec, call: Call, why: String, filler: bool) -> Result<Pending, Error> {
    let Some(window) = lanes.window.as_ref() else {
        return Ok(Pending::Alone(lanes, Box::new(call), why, filler));
    };
    if !crate::llm::openai::generates(call.request.uri().path()) {
        return Ok(Pending::Alone(lanes, Box::new(call), why, filler));
    }
    let (class, _) = class(spec, &call)?;
    let deadline = call.deadline;
    let submitted = window.submit(call, class, filler);
    queued(lanes, submitted, (class.priority, deadline), filler)
}

/// `call`'s band (its `x-tiergate-priority`, at most its tenant's ceiling, else the
/// route's `priority`) and tenant (its credential's, else the route's tenant header's
/// value) with the tenant's weight; and the tenant's name.
fn class(spec: &BatchSpec, call: &Call) -> Result<(Class, String), Error> {
    let scheduling = &spec.scheduling;
    // The door refused a header that names no band (`front::meta`), so one that does
    // not parse here came by no door, and the route's band serves.
    let asked = call
        .request
        .headers()
        .get(headers::PRIORITY)
        .and_then(|v| v.to_str().ok());
    let priority = scheduling.band(asked, &crate::tenant::Tenant::of(&call.request));
    let tenant = crate::tenant::Tenant::name_of(&call.request, &call.route.tenant_header);
    let weight = scheduling.tenant_weights.get(&tenant).map_or(1, |w| w.get());
    let class = Class {
        priority,
        flow: flow_of(&tenant),
        weight,
    };
    Ok((class, tenant))
}

/// A tenant's flow: a hash of its name, stable for the process (0 for the anonymous one).
fn flow_of(tenant: &str) -> u64 {
    use std::hash::BuildHasher;
    static KEYS: std::sync::OnceLock<std::collections::hash_map::RandomState> = std::sync::OnceLock::new();
    match tenant {
        "" => 0,
        name => KEYS.get_or_init(Default::default).hash_one(name),
    }
}

/// How `call`'s rows meet its route's cache: `None` unless the route's cache is on and
/// looks at rows, or when the request keeps away from it (`no-store`).
fn rowed(cache: &Cache, call: &Call) -> Option<Box<rows::Rowed>> {
    let route = &call.route;
    let spec = route.cache.as_ref().filter(|c| route.flags.cache && c.rows)?;
    let headers = call.request.headers();
    if crate::cache::entry::forbids_storing(headers) {
        return None;
    }
    let tenant = crate::cache::key::tenant(route, &call.request);
    Some(Box::new(rows::Rowed {
        store: cache.route(&route.name, spec),
        scope: crate::cache::Scope::new(route, spec, &tenant, call.request.uri().path()),
        fresh: crate::cache::entry::wants_fresh(headers),
    }))
}

impl RouteLanes {
    /// Refuses a request of `rows` rows at once when the learned cost says it cannot be
    /// answered by `deadline`: the rows that would be served before it in the pool's
    /// order (its own included; see [`Queue::ahead`]) go out in full batches over the
    /// pool's slots, after the batches now in flight. A stream (`streamed`) is refused
    /// only once its budget is spent.
    fn admit(&self, class: &Class, (rows, streamed): (u64, bool), deadline: Instant) -> Result<(), Error> {
        if deadline <= Instant::now() {
            return Err(Error::new(
                Kind::Deadline,
                format!(
                    "route {}: the budget was spent before the request could be queued",
                    self.route
                ),
            ));
        }
        let Some(cost) = self.shared.cost.estimate().filter(|_| !streamed) else {
            return Ok(()); // still learning (nobody is refused on a guess), or a stream
        };
        let queued = self.queue.ahead(class, rows, deadline);
        let max_batch = self.shared.limit.now(self.settings.max_batch);
        let waves = queued.div_ceil(max_batch).div_ceil(self.settings.slots.max(1) as u64);
        let batch = cost.predict(queued.min(max_batch));
        let mut expected = batch.saturating_mul(u32::try_from(waves).unwrap_or(u32::MAX));
        if self.shared.slots.available_permits() == 0 {
            expected += batch / 2; // the batches in flight are, on average, half done
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if expected <= left {
            return Ok(());
        }
        self.metrics.rejected("deadline_unmeetable");
        Err(Error::new(
            Kind::DeadlineUnmeetable,
            format!(
                "deadline unmeetable: learned cost {} ms > {} ms left of the budget (route {}'s micro-batch tier: \
                 {queued} rows queued, a batch costs {:.2} ms + {:.4} ms per row); send a larger budget or retry later",
                expected.as_millis(),
                left.as_millis(),
                self.route,
                ms(cost.fixed),
                ms(cost.per_row),
            ),
        )
        .knob("deadline"))
    }

    /// A slot of the pool taken when it is free and no micro-batch request is waiting:
    /// spare capacity. Re-checked every few milliseconds while the tier is busy.
    async fn spare_slot(&self) -> tokio::sync::OwnedSemaphorePermit {
        loop {
            if let Ok(slot) = self.shared.slots.clone().acquire_owned().await {
                if self.shared.queued.load(std::sync::atomic::Ordering::Acquire) == 0 {
                    return slot;
                }
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    /// The lane for `key`, made on first use.
    fn lane(&self, key: LaneKey, spec: &BatchSpec) -> Result<Arc<Lane>, Error> {
        let mut lanes = self.lanes.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(lane) = lanes.get(&key) {
            return Ok(lane.clone());
        }
        if lanes.len() >= MAX_LANES {
            // Let idle lanes go: those nobody waits in and no batch is using.
            lanes.retain(|_, lane| Arc::strong_count(lane) > 1);
            if lanes.len() >= MAX_LANES {
                self.metrics.rejected("too_many_signatures");
                return Err(Error::new(
                    Kind::Shed,
                    format!(
                        "signatures {MAX_LANES} reached: route {} has {MAX_LANES} distinct request shapes waiting to \
                         be batched; retry later",
                        self.route
                    ),
                )
                .knob("signatures"));
            }
        }
        let (path, form) = match &key {
            LaneKey::Kserve { path, .. } | LaneKey::Combined { path, .. } => (path.clone(), Form::Kserve),
            LaneKey::Json { path, .. } => (
                path.clone(),
                Form::Json(spec.json_adapter.unwrap_or(JsonAdapter::TfServing)),
            ),
        };
        let lane = Arc::new(Lane {
            route: self.route.clone(),
            shadow: self.shadow.clone(),
            pool_spec: spec.pool.clone(),
            path,
            form,
            pool: self.pool.clone(),
            binary: spec.pool.binary_tensors,
            cost: self.shared.cost.clone(),
            max_batch: self.settings.max_batch,
            limit: self.shared.limit.clone(),
            max_bytes: self.shared.max_bytes.clone(),
            metrics: self.metrics.clone(),
            usage: self.usage.clone(),
            shares: self.shared.shares.clone(),
        });
        lanes.insert(key, lane.clone());
        Ok(lane)
    }

    /// Sends a request that cannot share a batch on its own, on a batch slot (a stream
    /// holds it to its last event).
    async fn alone(&self, call: Call, why: &str) -> Result<Reply, Error> {
        let queued_at = Instant::now();
        let slot = tokio::time::timeout_at(call.deadline, self.shared.slots.clone().acquire_owned()).await;
        let Ok(Ok(slot)) = slot else {
            return Err(Error::new(
                Kind::Deadline,
                format!(
                    "the budget ran out waiting for a slot on route {}'s batch pool",
                    self.route
                ),
            ));
        };
        let waited = queued_at.elapsed();
        let (answer, took) = self.forward_alone(call, why, crate::usage::Source::MicroBatch).await;
        let mut answer = answer?;
        // A stream holds its slot to its last event, as a batch's does.
        let _ = crate::backend::stream::hold_until_done(&mut answer, slot);
        Ok(waited_for_slot(answer, waited, took))
    }

    /// Sends a request that cannot share a batch, on a slot the caller holds, and
    /// charges it to `source`; the answer and how long the call took.
    async fn forward_alone(
        &self,
        call: Call,
        why: &str,
        source: crate::usage::Source,
    ) -> (Result<Reply, Error>, Duration) {
        tracing::debug!(route = %self.route, why, "served alone on the batch pool");
        forward_charged((&self.pool, &self.shared.shares, &self.usage), call, source).await
    }
}

/// Sends `call` alone on `pool` and charges it to its tenant under `source`: its share
/// of the pool's time (`shares`), and a row when answered; the answer and how long the
/// call took.
async fn forward_charged(
    (pool, shares, usage): (&Pool, &crate::usage::Shares, &crate::usage::RouteUsage),
    call: Call,
    source: crate::usage::Source,
) -> (Result<Reply, Error>, Duration) {
    use crate::usage::{ns, Field, Figures};
    let whose = crate::usage::Whose::of(&call.request, &call.route.tenant_header);
    let in_flight = shares.begin(pool.healthy());
    let answer = pool.forward(call.request, call.deadline).await;
    let (took, share) = in_flight.end(pool.healthy(), None);
    let used = ns(share);
    let mut figures = Figures::default()
        .with(Field::CallsMicro, 1_000_000)
        .with(Field::UsedNs, used)
        .with(Field::AloneNs, used);
    if answer.is_ok() {
        figures = figures.with(Field::Rows, 1);
    }
    usage.add(source, whose.name(), &figures);
    (answer, took)
}

/// `reply` with the time it waited for its slot (`x-tiergate-queue-ms`, and the queue's
/// and backend's parts of its `Server-Timing`).
fn waited_for_slot(mut reply: Reply, waited: Duration, took: Duration) -> Reply {
    if let Ok(ms) = HeaderValue::from_str(&format!("{:.3}", waited.as_secs_f64() * 1e3)) {
        reply.headers_mut().insert(headers::QUEUE_MS, ms);
    }
    // The slot's wait is the queue (a retry's part, if any, is inside the backend's).
    crate::timing::set(
        reply.extensions_mut(),
        &[
            (crate::timing::Spent::Queue, waited),
            (crate::timing::Spent::Backend, took),
        ],
    );
    reply
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}
