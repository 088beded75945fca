//! What a policy file says: serde types that mirror `policies/*.toml` one to one.
//!
//! Every field is optional here and every table refuses unknown keys, so a typo is an
//! error rather than a silently ignored setting. Nothing in this file is trusted:
//! [`super::model`] validates it into the runtime types.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;

/// One policy file: optional defaults and any number of routes.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyFile {
    /// Defaults for every route in every file (at most one file may set them).
    pub defaults: Option<DefaultsFile>,
    /// Routes by name.
    #[serde(default)]
    pub routes: BTreeMap<String, RouteFile>,
    /// Tenants' quotas across every route (at most one file may set them).
    pub quotas: Option<QuotasFile>,
    /// The usage ledger's token prices for every route (at most one file may set them).
    pub usage: Option<UsageFile>,
}

/// Tenants' daily and monthly quotas of backend time and requests.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QuotasFile {
    /// The quota of every tenant without one of its own.
    pub default: Option<AllowanceFile>,
    /// Each named tenant's quota.
    #[serde(default)]
    pub tenants: BTreeMap<String, AllowanceFile>,
}

/// What one tenant may use per UTC day and calendar month.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AllowanceFile {
    /// Backend seconds charged per UTC day.
    pub daily_backend_seconds: Option<f64>,
    /// Backend seconds charged per calendar month (UTC).
    pub monthly_backend_seconds: Option<f64>,
    /// Requests answered per UTC day.
    pub daily_requests: Option<i64>,
    /// Requests answered per calendar month (UTC).
    pub monthly_requests: Option<i64>,
}

/// Budget thresholds and fallbacks shared by routes that do not set their own.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DefaultsFile {
    /// Budget assumed when the request names none.
    #[serde(default, with = "humantime_serde")]
    pub default_budget: Option<Duration>,
    /// Budgets below this go to the real-time tier.
    #[serde(default, with = "humantime_serde")]
    pub realtime_below: Option<Duration>,
    /// Budgets from this up go to the offline tier.
    #[serde(default, with = "humantime_serde")]
    pub offline_from: Option<Duration>,
    /// What to do when no enabled tier can meet the budget.
    pub when_unmet: Option<WhenUnmetFile>,
    /// Header whose value keys the micro-batch rollout.
    pub rollout_key_header: Option<String>,
    /// How much of a real-time request's body is checked before it is passed through
    /// (`envelope` unless set).
    pub body_check: Option<crate::protocol::BodyCheck>,
}

/// One route: what it matches, its thresholds, flags and pools.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteFile {
    /// KServe v2 model names served by this route.
    #[serde(default)]
    pub models: Vec<String>,
    /// Exact request paths of JSON routes served by this route.
    #[serde(default)]
    pub paths: Vec<String>,
    /// Overrides `defaults.default_budget`.
    #[serde(default, with = "humantime_serde")]
    pub default_budget: Option<Duration>,
    /// Overrides `defaults.realtime_below`.
    #[serde(default, with = "humantime_serde")]
    pub realtime_below: Option<Duration>,
    /// Overrides `defaults.offline_from`.
    #[serde(default, with = "humantime_serde")]
    pub offline_from: Option<Duration>,
    /// Overrides `defaults.when_unmet`.
    pub when_unmet: Option<WhenUnmetFile>,
    /// Per-tier switches.
    #[serde(default)]
    pub flags: FlagsFile,
    /// The real-time pool.
    pub realtime: Option<PoolFile>,
    /// The batch pool and its batcher settings.
    pub micro_batch: Option<BatchFile>,
    /// Rate limits for the route and for each tenant calling it.
    pub limits: Option<LimitsFile>,
    /// When one tier may use another's capacity (all off by default).
    #[serde(default)]
    pub borrow: BorrowFile,
    /// A candidate model scored beside the route's own on a share of its traffic.
    pub shadow: Option<ShadowFile>,
    /// Answers kept and given again to the same question.
    pub cache: Option<CacheFile>,
    /// The pool serving real-time calls while the real-time pool cannot.
    pub fallback: Option<PoolFile>,
    /// The header naming the caller's tenant when the data plane does not authenticate
    /// (default `x-api-key`): one rule for the cache, rate limits and fair shares.
    pub tenant_header: Option<String>,
    /// Overrides `defaults.body_check`.
    pub body_check: Option<crate::protocol::BodyCheck>,
    /// Tenants' quotas on this route.
    pub quotas: Option<QuotasFile>,
    /// Its LLM calls' token ceilings and limits.
    pub tokens: Option<super::tokens::TokensFile>,
    /// Its tokens' prices (else `[usage.prices]`).
    pub prices: Option<PricesFile>,
    /// Its LLM calls carry their priority band to the backend as vLLM's `priority`
    /// (default false).
    #[serde(default)]
    pub backend_priority: bool,
    /// The longest a stream may run after its first token (default 10m).
    #[serde(default, with = "humantime_serde")]
    pub max_stream_duration: Option<Duration>,
    /// The longest a stream may go between two events after its first token (default 60s).
    #[serde(default, with = "humantime_serde")]
    pub stream_idle_timeout: Option<Duration>,
}

/// The route's prediction cache: how long an answer is kept and how many bytes of
/// answers the route keeps at most.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CacheFile {
    /// How long an answer is kept (default 5m, at most 7d).
    #[serde(default, with = "humantime_serde")]
    pub ttl: Option<Duration>,
    /// Most bytes of answers kept for the route (default 64 MiB).
    pub max_bytes: Option<i64>,
    /// Let tenants share entries (default off: each tenant has its own).
    pub shared_across_tenants: Option<bool>,
    /// Let identical requests in flight at once share one backend call (default on).
    pub coalesce: Option<bool>,
    /// Look up and keep each row of a micro-batch on its own, and send identical rows
    /// of one batch once (default on).
    pub rows: Option<bool>,
    /// Request headers whose values change the answer, kept in the key.
    #[serde(default)]
    pub vary: Vec<String>,
    /// Request headers that never change the answer, left out of the key.
    #[serde(default)]
    pub ignore_headers: Vec<String>,
}

/// A candidate model: its pool, what share of which tiers' calls it is sent, and how
/// its answers are compared with the primary's. Its answers never reach callers.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShadowFile {
    /// The candidate's pool (its own endpoints, connections, limit and health).
    pub candidate: Option<PoolFile>,
    /// Percent of calls mirrored, by the rollout key (default 100).
    pub percent: Option<i64>,
    /// The tiers whose calls are mirrored (default both).
    pub tiers: Option<Vec<ShadowTierFile>>,
    /// How long one shadow call may take before it is dropped (default 5s).
    #[serde(default, with = "humantime_serde")]
    pub budget: Option<Duration>,
    /// Absolute tolerance of a value (default 1e-5).
    pub atol: Option<f64>,
    /// Tolerance relative to the primary's value (default 1e-3).
    pub rtol: Option<f64>,
    /// The k of top-k agreement on classification outputs (default 5).
    pub top_k: Option<i64>,
    /// Also send each mirrored call to the primary's endpoints a second time, and do not
    /// count against the candidate a row on which the primary disagrees with itself
    /// (default off).
    pub noise_floor: Option<bool>,
    /// What `tiergate shadow promote` requires before it commits the candidate.
    pub gate: Option<GateFile>,
    /// Percent of real-time calls served by the candidate itself, by rollout key (a
    /// canary; default 0).
    pub canary_percent: Option<i64>,
    /// When the canary is set back to 0% on its own.
    pub abort: Option<AbortFile>,
}

/// A canary's automatic abort.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AbortFile {
    /// Canary calls before the canary is judged (default 100).
    pub min_requests: Option<i64>,
    /// How far the candidate's error rate may exceed the primary's (0 to 1, default 0.05).
    pub max_error_rate_margin: Option<f64>,
    /// How many times the primary's mean latency the candidate's may be (default 2).
    pub max_latency_ratio: Option<f64>,
}

/// `shadow.tiers` values.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ShadowTierFile {
    /// Real-time calls, each mirrored as its own call.
    Realtime,
    /// Micro-batch backend calls, each mirrored as the same batch.
    MicroBatch,
}

/// A shadow's promotion gate.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GateFile {
    /// Rows compared, at least (default 1000).
    pub min_compared: Option<i64>,
    /// Share of compared rows within tolerance, at least (0 to 1, default 0.99).
    pub min_agreement: Option<f64>,
}

/// Borrowing rules.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BorrowFile {
    /// Real-time requests the real-time pool sheds may be served by the micro-batch
    /// tier when their budget allows.
    pub realtime_overflow: Option<bool>,
    /// Offline work may use the real-time pool while it is idle.
    pub offline_on_realtime: Option<bool>,
}

/// A route's rate limits (token buckets: `rate` per second, up to `burst` at once).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsFile {
    /// Requests per second across all callers of the route.
    pub rate: Option<f64>,
    /// Requests the route may take at once (default: `rate`, at least 1).
    pub burst: Option<i64>,
    /// Requests per second for each tenant (each value of `tenant_header`).
    pub tenant_rate: Option<f64>,
    /// Requests one tenant may send at once (default: `tenant_rate`, at least 1).
    pub tenant_burst: Option<i64>,
    /// The route's `tenant_header`, said here (it must agree with the route's).
    pub tenant_header: Option<String>,
}

/// Per-route flags.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FlagsFile {
    /// Serve on the real-time tier (default on).
    pub realtime: Option<bool>,
    /// Serve on the micro-batch tier (default off).
    pub micro_batch: Option<bool>,
    /// Accept offline work (default off).
    pub offline: Option<bool>,
    /// Percent of micro-batch-eligible requests that really go to it (default 100).
    pub micro_batch_percent: Option<i64>,
    /// Mirror calls to the `[shadow]` candidate (default off).
    pub shadow: Option<bool>,
    /// Answer repeated requests from the `[cache]` (default off).
    pub cache: Option<bool>,
}

/// A pool of backend endpoints.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolFile {
    /// Backend base URLs, `http://host:port`.
    #[serde(default)]
    pub endpoints: Vec<String>,
    /// Calls in flight across the pool before new ones are shed.
    pub max_concurrency: Option<i64>,
    /// Speak HTTP/2 (prior knowledge) to the backends instead of HTTP/1.1.
    pub http2: Option<bool>,
    /// The HTTP backends read Triton's binary tensor extension (default true).
    pub binary_tensors: Option<bool>,
    /// How long a TCP connect may take before the endpoint counts as unreachable.
    #[serde(default, with = "humantime_serde")]
    pub connect_timeout: Option<Duration>,
    /// Outlier ejection, circuit breaking and active health checks per endpoint.
    pub health: Option<HealthFile>,
    /// Retries of failed calls on other endpoints.
    pub retry: Option<RetryFile>,
    /// Hedged calls: a slow call sent again to a second endpoint.
    pub hedge: Option<HedgeFile>,
    /// (`[fallback]` only) The model the pool serves the route's calls as: another
    /// route's, or another server's, model.
    pub model: Option<String>,
    /// What an hour of one endpoint's time costs, in `currency`: the usage ledger's
    /// money (`realtime` and `micro_batch` pools only).
    pub cost_per_hour: Option<f64>,
    /// The currency `cost_per_hour` is in (default `USD`; any name the operator uses).
    pub currency: Option<String>,
    /// How the pool's capacity signal (`tiergate_endpoints_needed`) is worked out.
    pub capacity: Option<CapacityFile>,
}

/// How a pool's capacity signal is worked out.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CapacityFile {
    /// The share of its time an endpoint should be busy (default 0.7).
    pub target_utilisation: Option<f64>,
    /// The window arrivals and costs are averaged over (default 30s, 5s to 10m).
    #[serde(default, with = "humantime_serde")]
    pub window: Option<Duration>,
    /// Calls one endpoint runs at once at full speed, its model instances (default 1).
    pub calls_per_endpoint: Option<i64>,
}

/// When a pool's slow calls are sent again to a second endpoint.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HedgeFile {
    /// How long a call runs before its hedge is sent (default: the pool's learned p95).
    #[serde(default, with = "humantime_serde")]
    pub after: Option<Duration>,
    /// Hedges per 100 calls of the pool over the last 10 s (default 2).
    pub budget_percent: Option<f64>,
}

/// When a pool's failed calls go again to another endpoint.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetryFile {
    /// The failures after the request may have left that are retried: `reset`,
    /// `unavailable` (default: both for KServe v2 inference, neither for other paths).
    pub on: Option<Vec<String>>,
    /// Most retries of one call (default 2).
    pub max_retries: Option<i64>,
    /// Retries per 100 calls of the pool over the last 10 s (default 10).
    pub budget_percent: Option<f64>,
    /// Retries per second allowed whatever the calls (default 3).
    pub min_per_second: Option<i64>,
}

/// How a pool finds and sets aside endpoints that fail or stall.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HealthFile {
    /// Consecutive failures (unreachable, 5xx, timeouts, slow calls) that eject an
    /// endpoint; 0 never ejects.
    pub eject_after: Option<i64>,
    /// How long the first ejection lasts; each further one in a row doubles it (up to 10x).
    #[serde(default, with = "humantime_serde")]
    pub eject_for: Option<Duration>,
    /// A call still running after this counts as a failure at once (a stalled backend).
    #[serde(default, with = "humantime_serde")]
    pub slow_call: Option<Duration>,
    /// Path polled with GET on every endpoint (200 is healthy); "" turns active checks off.
    pub check_path: Option<String>,
    /// How often each endpoint is polled.
    #[serde(default, with = "humantime_serde")]
    pub check_interval: Option<Duration>,
}

/// The batch pool plus the batcher's settings.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchFile {
    /// Backend base URLs, `http://host:port`.
    #[serde(default)]
    pub endpoints: Vec<String>,
    /// Speak HTTP/2 (prior knowledge) to the backends.
    pub http2: Option<bool>,
    /// The HTTP backends read Triton's binary tensor extension (default true).
    pub binary_tensors: Option<bool>,
    /// TCP connect timeout.
    #[serde(default, with = "humantime_serde")]
    pub connect_timeout: Option<Duration>,
    /// Outlier ejection, circuit breaking and active health checks per endpoint.
    pub health: Option<HealthFile>,
    /// Retries of failed calls on other endpoints.
    pub retry: Option<RetryFile>,
    /// What an hour of one endpoint's time costs, in `currency`: the usage ledger's
    /// money (`realtime` and `micro_batch` pools only).
    pub cost_per_hour: Option<f64>,
    /// The currency `cost_per_hour` is in (default `USD`; any name the operator uses).
    pub currency: Option<String>,
    /// How the pool's capacity signal (`tiergate_endpoints_needed`) is worked out.
    pub capacity: Option<CapacityFile>,
    /// Most rows in one batch.
    pub max_batch: Option<i64>,
    /// Accepted so files that set it still load; it bounds nothing (a batch is formed
    /// from everyone waiting when a slot frees).
    #[serde(default, with = "humantime_serde")]
    pub max_wait: Option<Duration>,
    /// Most bytes of request body in one batch call.
    pub max_batch_bytes: Option<i64>,
    /// Batches in flight per endpoint.
    pub max_in_flight: Option<i64>,
    /// Rows that may wait in the queue before new ones get 429.
    pub queue_capacity: Option<i64>,
    /// How requests on the route's JSON `paths` are merged and split.
    pub json_adapter: Option<JsonAdapterFile>,
    /// The band of requests that name none: `critical`, `standard` or `sheddable`.
    pub priority: Option<String>,
    /// The highest band a request may ask for with `x-tiergate-priority`.
    pub max_priority: Option<String>,
    /// The share of `queue_capacity` beyond which sheddable requests are refused.
    pub shed_above: Option<f64>,
    /// The route's `tenant_header`, said here (it must agree with the route's).
    pub tenant_header: Option<String>,
    /// Tenants' weights in the pool's fair share (default 1 each).
    #[serde(default)]
    pub tenant_weights: std::collections::BTreeMap<String, i64>,
    /// Authenticated tenants' own highest band, above or below `max_priority`.
    #[serde(default)]
    pub tenant_max_priority: std::collections::BTreeMap<String, String>,
    /// Models the pool's backends serve as one combined model (a Triton ensemble, a
    /// multi-head model): combined model → member model → { the member's output = the
    /// combined model's output }.
    #[serde(default)]
    pub combined: std::collections::BTreeMap<String, std::collections::BTreeMap<String, OutputsFile>>,
    /// The pool's admission window for LLM calls.
    pub window: Option<super::window::WindowFile>,
}

/// A member model's outputs: its own output name = the combined model's output name,
/// in the order the file writes them (the order its callers get them in).
#[derive(Debug, Default, PartialEq)]
pub struct OutputsFile(pub Vec<(String, String)>);

impl<'de> Deserialize<'de> for OutputsFile {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct InOrder;
        impl<'de> serde::de::Visitor<'de> for InOrder {
            type Value = OutputsFile;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a table of output names, such as { score = \"ctr_score\" }")
            }
            fn visit_map<M: serde::de::MapAccess<'de>>(self, mut map: M) -> Result<OutputsFile, M::Error> {
                let mut outputs: Vec<(String, String)> = Vec::new();
                while let Some((own, theirs)) = map.next_entry::<String, String>()? {
                    if outputs.iter().any(|(o, _)| *o == own) {
                        return Err(serde::de::Error::custom(format!("output {own:?} is named twice")));
                    }
                    outputs.push((own, theirs));
                }
                Ok(OutputsFile(outputs))
            }
        }
        deserializer.deserialize_map(InOrder)
    }
}

/// `json_adapter` values.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum JsonAdapterFile {
    /// TF-Serving `{"instances": [...]}` / `{"inputs": ...}` with `predictions` / `outputs`.
    TfServing,
    /// OpenAI-style embeddings `{"input": [...]}` with `data[].index`.
    OpenaiEmbeddings,
    /// OpenAI completions `{"prompt": [...]}` with `choices[].index`.
    OpenaiCompletions,
}

/// `when_unmet` values.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum WhenUnmetFile {
    /// Refuse with 503.
    Reject,
    /// Serve on the micro-batch tier anyway when it is enabled.
    BestEffort,
}

/// `[usage]` at a policy file's top level.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UsageFile {
    /// Token prices for every route that sets none of its own.
    pub prices: Option<PricesFile>,
}

/// Token prices as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PricesFile {
    /// The currency (default `USD`).
    pub currency: Option<String>,
    /// The real-time tier's.
    pub realtime: Option<PerMillionFile>,
    /// The micro-batch tier's.
    pub micro_batch: Option<PerMillionFile>,
    /// The offline tier's (Batch API lines, `Prefer: respond-async`).
    pub offline: Option<PerMillionFile>,
}

/// A price per million tokens as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PerMillionFile {
    /// Per million prompt (input) tokens.
    pub prompt: f64,
    /// Per million completion (output) tokens.
    pub completion: f64,
}
