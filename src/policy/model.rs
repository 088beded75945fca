//! What the gateway runs on: validated policy types.
//!
//! These types can only be built through [`super::Policy::from_texts`] (and the `load_*` functions over it), which checks
//! every route and reports *every* problem, so an invalid policy cannot be represented:
//! durations are `Duration`, limits are `NonZeroU32`, endpoints are parsed URIs, and a
//! tier whose flag is on always has a pool.

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use http::Uri;

/// Routes by model name or path. Hashed with foldhash, not SipHash: every inference
/// request looks its route up here, the keys are the policy's (a client only looks
/// up, so it cannot flood a bucket), and foldhash's seeds are random per process.
pub(super) type Index = HashMap<String, Arc<Route>, foldhash::fast::RandomState>;

/// The whole running policy: every route and the indexes that find them.
#[derive(Debug, Default)]
pub struct Policy {
    /// The version the store gave this snapshot (1 for the policy the gateway started
    /// with, one more for each swap); 0 before it is stored.
    pub(super) version: u64,
    pub(super) routes: Vec<Arc<Route>>,
    pub(super) by_model: Index,
    pub(super) by_path: Index,
    /// Routes on OpenAI's paths, by path and the body's `model` (`"PATH\nMODEL"`).
    pub(super) by_openai: Index,
    /// The texts it was built from, each with its file, in load order.
    pub(super) sources: Vec<(PathBuf, String)>,
}

/// One route: the unit of policy.
#[derive(Debug, Clone, PartialEq)]
pub struct Route {
    /// The route's name (its key in the file).
    pub name: String,
    /// The file that defines it.
    pub file: PathBuf,
    /// KServe v2 model names it serves.
    pub models: Vec<String>,
    /// Exact paths of the JSON routes it serves.
    pub paths: Vec<String>,
    /// Budget thresholds.
    pub budgets: Budgets,
    /// What to do when no enabled tier can meet the budget.
    pub when_unmet: WhenUnmet,
    /// Header whose value keys the micro-batch rollout.
    pub rollout_key_header: http::HeaderName,
    /// How much of a real-time request's body the door checks before passing it
    /// through (`envelope`: its structure and sizes; `full`: every JSON value too).
    pub body_check: crate::protocol::BodyCheck,
    /// The header naming the caller's tenant when the data plane does not authenticate
    /// (any client can set it): the one rule the cache, rate limits and fair shares use,
    /// through [`Route::tenant`].
    pub tenant_header: http::HeaderName,
    /// Per-tier switches.
    pub flags: Flags,
    /// The real-time pool; present whenever the `realtime` flag is on.
    pub realtime: Option<Arc<PoolSpec>>,
    /// The batch pool and batcher; present whenever `micro_batch` or `offline` is on.
    pub micro_batch: Option<Arc<BatchSpec>>,
    /// Rate limits for the route and per tenant, if any.
    pub limits: Option<Arc<RateLimits>>,
    /// When one tier may use another's capacity.
    pub borrow: Borrow,
    /// The candidate model scored beside the route's own; present whenever the
    /// `shadow` flag is on.
    pub shadow: Option<Arc<ShadowSpec>>,
    /// The route's prediction cache; present whenever the `cache` flag is on.
    pub cache: Option<Arc<CacheSpec>>,
    /// The pool serving the route's real-time calls while its real-time pool cannot
    /// (every endpoint ejected, or full).
    pub fallback: Option<Arc<PoolSpec>>,
    /// Its pools' prices and capacity settings (the usage ledger's, the capacity signal's).
    pub usage: super::usage::UsageSpec,
    /// The tenants' quotas its requests are held to (its own and across every route);
    /// `None`: none.
    pub quotas: Option<Arc<super::usage::RouteQuotas>>,
    /// Its LLM calls' token ceilings and limits (`[tokens]`); `None`: none.
    pub tokens: Option<Arc<super::tokens::TokenRules>>,
    /// Its tokens' prices (its own, else `[usage.prices]`); `None`: tokens unpriced.
    pub prices: Option<Arc<super::prices::TokenPrices>>,
    /// The version of the snapshot this route belongs to, set once when it is stored.
    pub(super) version: std::sync::OnceLock<u64>,
    /// Its place in that snapshot's [`Policy::routes`], set with the version.
    pub(super) index: std::sync::OnceLock<usize>,
    /// How long its streams may run, and rest between events, after their first token.
    pub streams: Streams,
    /// Its LLM calls carry their priority band to the backend as vLLM's `priority`.
    pub backend_priority: bool,
}

/// Budget thresholds of a route. Invariant: `realtime_below < offline_from`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budgets {
    /// Budget assumed when the request names none.
    pub default: Duration,
    /// Budgets strictly below this go to the real-time tier.
    pub realtime_below: Duration,
    /// Budgets from this up go to the offline tier.
    pub offline_from: Duration,
}

/// What to do when the tier a budget calls for is off and no other can meet it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WhenUnmet {
    /// Answer 503 and name the reason.
    Reject,
    /// Serve on the micro-batch tier when enabled, accepting the budget may be missed.
    BestEffort,
}

/// Per-route runtime switches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Flags {
    /// The real-time tier is on.
    pub realtime: bool,
    /// The micro-batch tier is on.
    pub micro_batch: bool,
    /// The offline tier is on.
    pub offline: bool,
    /// Percent (0..=100) of micro-batch-eligible requests sent to it.
    pub micro_batch_percent: u8,
    /// Calls are mirrored to the shadow candidate.
    pub shadow: bool,
    /// Repeated requests are answered from the cache.
    pub cache: bool,
}

/// A route's prediction cache (see `crate::cache`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheSpec {
    /// How long an answer is kept.
    pub ttl: Duration,
    /// Most bytes of answers kept.
    pub max_bytes: u64,
    /// Tenants share entries.
    pub shared_across_tenants: bool,
    /// Identical requests in flight at once share one backend call.
    pub coalesce: bool,
    /// The micro-batch tier looks up and keeps each row on its own, and sends identical
    /// rows of one batch once.
    pub rows: bool,
    /// Request headers that change the backend's answer: their values are in the key.
    pub vary: Vec<http::HeaderName>,
    /// Request headers the operator says never change the answer: left out of the key.
    /// A request with any other header that is neither in `vary` nor known to be
    /// neutral (framing, credentials, tracing, tiergate's own) bypasses the cache.
    pub ignore_headers: Vec<http::HeaderName>,
}

/// A candidate model scored on a share of a route's traffic (see `crate::shadow`).
#[derive(Debug, Clone, PartialEq)]
pub struct ShadowSpec {
    /// The candidate's pool.
    pub candidate: Arc<PoolSpec>,
    /// Percent (0..=100) of calls mirrored, by the rollout key.
    pub percent: u8,
    /// Real-time calls are mirrored.
    pub realtime: bool,
    /// Micro-batch backend calls are mirrored, each as the same batch.
    pub micro_batch: bool,
    /// Longest one shadow call may take.
    pub budget: Duration,
    /// When two values agree.
    pub tolerance: Tolerance,
    /// The k of top-k agreement.
    pub top_k: u32,
    /// Each mirrored call goes to the primary's endpoints a second time, and a row the
    /// primary answers differently the second time is not counted against the candidate.
    pub noise_floor: bool,
    /// What promotion requires.
    pub gate: Gate,
    /// Percent (0..=100) of real-time calls the candidate serves itself (a canary).
    pub canary_percent: u8,
    /// When the canary goes back to 0% on its own, if ever.
    pub abort: Option<Abort>,
}

/// A canary's automatic abort: once `min_requests` canary calls were served, the
/// candidate's error rate above the primary's by more than `max_error_rate_margin`, or
/// its mean latency above `max_latency_ratio` times the primary's, sets the canary to 0%
/// (a policy change like any other).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Abort {
    /// Canary calls before the canary is judged.
    pub min_requests: u64,
    /// Error rate the candidate may have above the primary's.
    pub max_error_rate_margin: f64,
    /// Times the primary's mean latency the candidate's may be.
    pub max_latency_ratio: f64,
}

/// Two values agree when `|candidate - primary| <= atol + rtol * |primary|` (numpy's
/// `allclose`, the primary as reference).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tolerance {
    /// Absolute tolerance.
    pub atol: f64,
    /// Relative tolerance.
    pub rtol: f64,
}

/// A shadow's promotion gate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Gate {
    /// Rows compared, at least.
    pub min_compared: u64,
    /// Share of compared rows within tolerance, at least.
    pub min_agreement: f64,
}

/// A pool of backend endpoints and how to talk to them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolSpec {
    /// Base URIs (`http://host:port`, `grpc://host:port`, or over TLS `https://` and
    /// `grpcs://`; all of one scheme), at least one, no duplicates.
    pub endpoints: Vec<Uri>,
    /// Calls in flight across the pool before new ones are shed.
    pub max_concurrency: NonZeroU32,
    /// HTTP/2 with prior knowledge instead of HTTP/1.1 (gRPC endpoints always use it).
    pub http2: bool,
    /// HTTP endpoints read Triton's binary tensor extension; when false, binary requests
    /// are re-encoded as JSON tensors for them (MLServer, for one, reads only JSON).
    pub binary_tensors: bool,
    /// TCP connect timeout.
    pub connect_timeout: Duration,
    /// How failing and stalled endpoints are found and set aside.
    pub health: HealthSpec,
    /// When a failed call goes again to another endpoint, and how many may.
    pub retry: RetrySpec,
    /// When a slow call is sent again to a second endpoint, the first answer taken;
    /// `None`: never (the default, and always for a micro-batch pool).
    pub hedge: Option<HedgeSpec>,
    /// The model a route's `[fallback]` pool serves its KServe v2 inference calls as
    /// (`/v2/models/MODEL/infer`); `None`: the model the caller named (always for
    /// other pools).
    pub model: Option<String>,
}

/// Hedged calls: a call not answered in time is sent again to another endpoint and the
/// first answer is taken, the other call dropped. Only for calls the route's `retry.on`
/// says are safe to repeat (`reset`), never for a step of a sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HedgeSpec {
    /// How long a call runs before its hedge is sent; `None`: the pool's learned p95.
    pub after: Option<Duration>,
    /// Hedges allowed per 1,000 calls of the pool over the last 10 s: the
    /// duplicate-work budget.
    pub budget_per_mille: u32,
}

/// Retries of a pool's failed calls on its other endpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetrySpec {
    /// Which failures after the request may have left are retried; `None`: both kinds
    /// for KServe v2 inference calls (`POST .../infer`, idempotent), neither for any
    /// other path. A call that never left (its endpoint unreachable) is always retried.
    pub on: Option<RetryOn>,
    /// Most retries of one call, each on an endpoint the call has not tried.
    pub max_retries: u32,
    /// Retries allowed per 1,000 calls of the pool over the last 10 s ...
    pub budget_per_mille: u32,
    /// ... and at least this many per second whatever the calls.
    pub min_per_second: u32,
}

/// The failures after a request may have left that are retried.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RetryOn {
    /// The connection closed or was reset before any byte of the answer (`reset`).
    pub reset: bool,
    /// The backend answered 503 or gRPC `UNAVAILABLE` (`unavailable`).
    pub unavailable: bool,
    /// The backend answered 500, 502 or 504 (gRPC `INTERNAL`, `UNKNOWN`), or with
    /// something that is not an answer (`error`).
    pub error: bool,
}

/// What a route's streams may do once their first token came (their budget runs to it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Streams {
    /// The longest a stream runs after its first token (`max_stream_duration`).
    pub max_duration: Duration,
    /// The longest a stream goes between events after its first token
    /// (`stream_idle_timeout`).
    pub idle: Duration,
}

impl Default for Streams {
    /// Ten minutes in all, a minute between events.
    fn default() -> Self {
        Streams {
            max_duration: Duration::from_secs(600),
            idle: Duration::from_secs(60),
        }
    }
}

/// Borrowing rules: every one is off unless the route turns it on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Borrow {
    /// Real-time requests shed by a full real-time pool go to the micro-batch tier
    /// when its learned cost says their budget can be met.
    pub realtime_overflow: bool,
    /// Offline work may use the real-time pool while nothing else is using it.
    pub offline_on_realtime: bool,
}

/// A route's rate limits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateLimits {
    /// Across all callers.
    pub route: Option<Rate>,
    /// For each tenant (as [`Route::tenant`] names it; requests without one share one
    /// anonymous bucket).
    pub tenant: Option<Rate>,
}

/// A token bucket: one request every `period`, up to `burst` at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate {
    /// Time to earn one request.
    pub period: Duration,
    /// Requests that may go at once.
    pub burst: NonZeroU32,
}

/// Outlier ejection, circuit breaking and active health checks for a pool's endpoints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthSpec {
    /// Consecutive failures that eject an endpoint (open its circuit); 0 never ejects.
    pub eject_after: u32,
    /// The first ejection's length; doubled for each consecutive one, up to 10x.
    pub eject_for: Duration,
    /// A call running longer than this counts as a failure when it reaches it.
    pub slow_call: Option<Duration>,
    /// The path active health checks GET on every endpoint (HTTP pools), if any.
    pub check_path: Option<String>,
    /// How often active health checks run.
    pub check_interval: Duration,
}

/// The batch pool and the batcher's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchSpec {
    /// The batch pool (its `max_concurrency` is endpoints × `max_in_flight`).
    pub pool: Arc<PoolSpec>,
    /// Most rows in one batch.
    pub max_batch: NonZeroU32,
    /// Accepted from files for compatibility; it bounds nothing.
    pub max_wait: Duration,
    /// Most bytes of request body in one batch call (a request larger goes alone).
    pub max_batch_bytes: u64,
    /// Batches in flight per endpoint.
    pub max_in_flight: NonZeroU32,
    /// Rows that may wait in the queue.
    pub queue_capacity: NonZeroU32,
    /// How requests on the route's JSON paths are merged and split; without one they
    /// are served one per backend call on the batch pool.
    pub json_adapter: Option<JsonAdapter>,
    /// Who waits first when the pool is contended: bands, tenants' shares.
    pub scheduling: Scheduling,
    /// Models the pool's backends compute in one pass as part of a combined model, by
    /// the member's name: their callers share batches sent to the combined model.
    pub combined: std::collections::BTreeMap<String, Arc<Member>>,
    /// The admission window its LLM calls are released through (`None`: each waits
    /// for a slot of `max_in_flight`, first come first served).
    pub window: Option<super::window::Window>,
}

/// A model its callers ask for by its own name (`/v2/models/NAME/infer`) that the batch
/// pool's backends compute as part of a combined model (a Triton ensemble, a multi-head
/// model taking the same inputs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// The combined model the backends serve.
    pub combined: String,
    /// The member's outputs, in order, each as (its own name, the combined model's name
    /// for it).
    pub outputs: Vec<(String, String)>,
}

/// How a batch pool orders its waiting callers: priority bands first, then weighted
/// fair shares between tenants within a band, then earliest deadline first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scheduling {
    /// The band of a request that names none (`x-tiergate-priority`).
    pub priority: Priority,
    /// The highest band a request may name; higher asks are served in this band. An
    /// authenticated tenant named in `tenant_max_priority` has its own instead.
    pub max_priority: Priority,
    /// Rows waiting beyond which sheddable requests are refused (429).
    pub shed_at: u32,
    /// Tenants' weights in the fair share (1 for every tenant not named).
    pub tenant_weights: std::collections::BTreeMap<String, NonZeroU32>,
    /// Authenticated tenants' own highest band. A tenant named by a header only (no
    /// data-plane authentication) never has one: anyone can send the header.
    pub tenant_max_priority: std::collections::BTreeMap<String, Priority>,
}

impl Scheduling {
    /// The band of a request of `tenant` that asked for `asked` (its
    /// `x-tiergate-priority`): the route's band when it asked for none (or one that
    /// does not parse), else what it asked for, at most its ceiling.
    pub fn band(&self, asked: Option<&str>, tenant: &crate::tenant::Tenant) -> Priority {
        match asked.and_then(Priority::parse) {
            None => self.priority,
            Some(asked) => asked.min(self.ceiling(tenant)),
        }
    }

    /// The highest band `tenant` may ask for.
    pub fn ceiling(&self, tenant: &crate::tenant::Tenant) -> Priority {
        match tenant.is_authenticated() {
            true => self
                .tenant_max_priority
                .get(tenant.as_str())
                .copied()
                .unwrap_or(self.max_priority),
            false => self.max_priority,
        }
    }
}

/// A priority band of the micro-batch tier's queue: a higher band is always served
/// first; the lowest is sheddable (refused first, and evicted for higher bands).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum Priority {
    /// Refused once the queue is past `shed_above`, and evicted to make room.
    Sheddable,
    /// The default band.
    #[default]
    Standard,
    /// Served before every other band.
    Critical,
}

impl Priority {
    /// Every band, highest first (the serving order).
    pub const ALL: [Priority; 3] = [Priority::Critical, Priority::Standard, Priority::Sheddable];

    /// The name in policies, headers and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Priority::Sheddable => "sheddable",
            Priority::Standard => "standard",
            Priority::Critical => "critical",
        }
    }

    /// The band called `name` (case-insensitive).
    pub fn parse(name: &str) -> Option<Priority> {
        Priority::ALL
            .into_iter()
            .find(|p| p.as_str().eq_ignore_ascii_case(name.trim()))
    }

    /// Every band in [`Priority::index`] order, lowest first.
    pub const BY_INDEX: [Priority; 3] = [Priority::Sheddable, Priority::Standard, Priority::Critical];

    /// 0 for sheddable, 1 standard, 2 critical.
    pub fn index(self) -> usize {
        self as usize
    }

    /// The band as vLLM's `priority` (lower is served first; 0, the standard band, is
    /// what a server without priority scheduling takes).
    pub fn vllm(self) -> i64 {
        match self {
            Priority::Critical => -1,
            Priority::Standard => 0,
            Priority::Sheddable => 1,
        }
    }
}

/// A JSON batching protocol for routes whose backends do not speak KServe v2.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JsonAdapter {
    /// TF-Serving REST: `{"instances": [...]}` → `{"predictions": [...]}`, or columnar
    /// `{"inputs": ...}` → `{"outputs": ...}`.
    TfServing,
    /// OpenAI-style embeddings: `{"input": [...]}` → `{"data": [{"index": i, ...}]}`.
    OpenaiEmbeddings,
    /// OpenAI completions: `{"prompt": [...]}` → `{"choices": [{"index": i, ...}]}`, `n`
    /// choices a prompt.
    OpenaiCompletions,
}

impl Policy {
    /// The route serving KServe model `name`.
    pub fn route_for_model(&self, name: &str) -> Option<&Arc<Route>> {
        self.by_model.get(name)
    }

    /// The JSON route serving exactly `path`.
    pub fn route_for_path(&self, path: &str) -> Option<&Arc<Route>> {
        self.by_path.get(path)
    }

    /// The route serving OpenAI's `path` (see [`crate::llm::openai::PATHS`]) for the
    /// body's `model`: the route listing that model for the path, else a route with the
    /// path to itself (no `models` listed).
    pub fn route_for_openai(&self, path: &str, model: &str) -> Option<&Arc<Route>> {
        self.by_openai
            .get(&format!("{path}\n{model}"))
            .or_else(|| self.by_path.get(path))
    }

    /// The first route serving `path` (a route on OpenAI's paths may share it).
    pub fn routes_on(&self, path: &str) -> Option<Arc<Route>> {
        self.routes.iter().find(|r| r.paths.iter().any(|p| p == path)).cloned()
    }

    /// The `model` values routes serve on OpenAI's paths, each once, in the policy's
    /// order (what `/v1/models` lists).
    pub fn openai_models(&self) -> Vec<&str> {
        let mut models: Vec<&str> = Vec::new();
        for route in &self.routes {
            if route.paths.iter().any(|p| crate::llm::openai::is_path(p)) {
                for model in &route.models {
                    if !models.contains(&model.as_str()) {
                        models.push(model);
                    }
                }
            }
        }
        models
    }

    /// Every route, in file then name order.
    pub fn routes(&self) -> &[Arc<Route>] {
        &self.routes
    }

    /// The version the store gave this snapshot.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// The policy texts this snapshot was built from, each with its file.
    pub fn sources(&self) -> &[(PathBuf, String)] {
        &self.sources
    }

    /// The route called `name`.
    pub fn route(&self, name: &str) -> Option<&Arc<Route>> {
        self.routes.iter().find(|r| r.name == name)
    }
}

impl PoolSpec {
    /// Whether the endpoints speak KServe v2 over gRPC (`grpc://`, `grpcs://`) rather
    /// than HTTP.
    pub fn is_grpc(&self) -> bool {
        self.endpoints
            .first()
            .is_some_and(|e| matches!(e.scheme_str(), Some("grpc" | "grpcs")))
    }

    /// Whether the endpoints speak TLS (`https://`, `grpcs://`).
    pub fn is_tls(&self) -> bool {
        self.endpoints
            .first()
            .is_some_and(|e| matches!(e.scheme_str(), Some("https" | "grpcs")))
    }
}

impl Route {
    /// The version of the policy snapshot this route belongs to (0 before it is stored),
    /// so an answer can name the policy that served it even across a reload.
    pub fn policy_version(&self) -> u64 {
        self.version.get().copied().unwrap_or(0)
    }

    /// Its place in its snapshot's [`Policy::routes`] (0 before it is stored), so state
    /// kept per route beside a snapshot is found without a look-up by name.
    pub fn index(&self) -> usize {
        self.index.get().copied().unwrap_or(0)
    }

    /// The pool that answers metadata and readiness for this route's models.
    pub fn metadata_pool(&self) -> Option<&Arc<PoolSpec>> {
        self.realtime.as_ref().or(self.micro_batch.as_ref().map(|b| &b.pool))
    }

    /// Whose a request with `headers`, admitted as `tenant`, is on this route: the
    /// credential's tenant when the data plane authenticates, else the value of the
    /// route's `tenant_header` (which any client can set), else "" (anonymous). The one
    /// rule by which cache entries, rate-limit buckets and fair shares are kept apart.
    pub fn tenant<'a>(&self, tenant: &'a crate::tenant::Tenant, headers: &'a http::HeaderMap) -> &'a str {
        tenant.name_in(headers, &self.tenant_header)
    }
}

#[cfg(test)]
impl Route {
    /// A route for unit tests: model `m`, budgets 200 ms default / 300 ms / 60 s, no pools.
    pub(crate) fn test(flags: Flags, when_unmet: WhenUnmet) -> Route {
        Route {
            streams: Streams::default(),
            name: "r".into(),
            file: PathBuf::from("r.toml"),
            models: vec!["m".into()],
            paths: vec![],
            budgets: Budgets {
                default: Duration::from_millis(200),
                realtime_below: Duration::from_millis(300),
                offline_from: Duration::from_secs(60),
            },
            when_unmet,
            rollout_key_header: http::HeaderName::from_static("x-request-id"),
            body_check: crate::protocol::BodyCheck::Envelope,
            tenant_header: http::HeaderName::from_static("x-api-key"),
            flags,
            realtime: None,
            micro_batch: None,
            limits: None,
            borrow: Borrow::default(),
            shadow: None,
            cache: None,
            fallback: None,
            usage: Default::default(),
            quotas: None,
            tokens: None,
            prices: None,
            backend_priority: false,
            version: std::sync::OnceLock::new(),
            index: std::sync::OnceLock::new(),
        }
    }
}
