//! Metrics: every metric name in one place, the Prometheus recorder and its endpoint.
//!
//! Beside the request path. Names are the constants below and nowhere else; labels use
//! the vocabulary (`route`, `tier`, `outcome`, `reason`). Hot-path code records
//! through pre-registered handles ([`Instruments`]) so a request costs no registry
//! look-up. The recorder is process-wide and installed once, by [`install`]; `app`
//! serves its text format on the metrics port (Triton's 8002). A leaf of the request
//! path: it names the decision types and nothing else of the gateway's.

use std::sync::OnceLock;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use crate::decision::{Reason, Tier};

/// Declares each metric family once: its name as a constant, documented, and its row in
/// [`FAMILIES`] (its kind, and its doc as its Prometheus `# HELP`).
macro_rules! families {
    ($( $(#[doc = $doc:literal])* $name:ident = $value:literal, $kind:ident; )*) => {
        $( $(#[doc = $doc])* pub const $name: &str = $value; )*

        /// Every family the gateway exports: name, kind, help text.
        pub const FAMILIES: &[Family] = &[
            $( Family { name: $value, kind: FamilyKind::$kind, help: concat!($($doc),*) }, )*
        ];
    };
}

/// One metric family, as [`FAMILIES`] lists it.
#[derive(Debug, Clone, Copy)]
pub struct Family {
    /// Its name.
    pub name: &'static str,
    /// What kind of metric it is.
    pub kind: FamilyKind,
    /// Its `# HELP` text (the constant's doc).
    pub help: &'static str,
}

/// The kinds of metric families.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FamilyKind {
    /// A counter.
    Counter,
    /// A gauge.
    Gauge,
    /// A histogram.
    Histogram,
}

families! {
    /// Requests that reached a route, by `route`, `tier` and `outcome`.
    REQUESTS = "tiergate_requests_total", Counter;
    /// End-to-end latency seen by the gateway, by `route` and `tier` (histogram, seconds).
    REQUEST_SECONDS = "tiergate_request_duration_seconds", Histogram;
    /// Classifier decisions, by `route`, `tier` and `reason`.
    DECISIONS = "tiergate_decisions_total", Counter;
    /// Latency of backend calls, by `route` and `tier` (histogram, seconds).
    BACKEND_SECONDS = "tiergate_backend_duration_seconds", Histogram;
    /// Steps of Triton sequences waiting for an earlier step of their sequence to be
    /// answered, by `route` and `tier` (gauge).
    SEQUENCE_STEPS_WAITING = "tiergate_sequence_steps_waiting", Gauge;
    /// Circuit state of each backend endpoint, by `route`, `tier` and `endpoint`:
    /// 0 closed (taking traffic), 1 open (ejected), 2 half-open (being probed).
    BACKEND_CIRCUIT = "tiergate_backend_circuit_state", Gauge;
    /// Endpoint ejections, by `route`, `tier`, `endpoint` and `reason` (unreachable,
    /// status_5xx, timeout, slow, broken_answer, check).
    BACKEND_EJECTIONS = "tiergate_backend_ejections_total", Counter;
    /// Failed backend calls sent again to another endpoint of their pool, by `route`,
    /// `tier` and `reason` (unreachable, reset, unavailable).
    BACKEND_RETRIES = "tiergate_backend_retries_total", Counter;
    /// Retries not sent, by `route`, `tier` and `why`: `budget` (the pool's retry budget
    /// was spent) or `deadline` (the budget left would not cover another call).
    BACKEND_RETRIES_REFUSED = "tiergate_backend_retries_refused_total", Counter;
    /// Hedged calls of a pool, by `route`, `tier` and `outcome`: `sent` (a second copy
    /// of a slow call went to another endpoint), `won` (the copy's answer was taken),
    /// `cancelled` (a call dropped unfinished because the other answered first),
    /// `over_budget` (a copy not sent: the duplicate-work budget was spent).
    BACKEND_HEDGES = "tiergate_backend_hedges_total", Counter;
    /// Requests refused by a limit, by `route`, `tier` (`none` before classification)
    /// and `knob`: the setting whose limit it was (`max_concurrency`, `queue_capacity`,
    /// `shed_above`, `deadline` (the learned cost), `signatures`, `sequences`,
    /// `limits.rate`, `limits.tenant_rate`, `limits.max_in_flight_requests`,
    /// `limits.max_in_flight_body_bytes`, `limits.max_rss_bytes`,
    /// `offline.max_queued_jobs`).
    REFUSALS = "tiergate_refusals_total", Counter;
    /// Requests refused at admission, by `reason` (route, tenant: rate limits; requests,
    /// body_bytes, rss: global limits; connections, connections_per_client: closed at
    /// accept).
    ADMISSION_REFUSALS = "tiergate_admission_refusals_total", Counter;
    /// Connections the gateway closed for sending nothing useful, by `reason`
    /// (first_request: no complete first request head in time; idle: no request for
    /// `limits.idle_timeout`).
    CONNECTIONS_CLOSED = "tiergate_connections_closed_total", Counter;
    /// Resident memory of the process, when `limits.max_rss_bytes` is set (bytes).
    PROCESS_RSS = "tiergate_process_resident_bytes", Gauge;
    /// Work one tier lent to another under a route's borrowing rules, by `route`, `from`
    /// (the tier whose capacity served it) and `to` (the tier it was classified to).
    BORROWED = "tiergate_borrowed_total", Counter;
    /// Requests being served now, by `route` and `tier`.
    IN_FLIGHT = "tiergate_in_flight_requests", Gauge;
    /// Requests no route matched (unknown model or path), by `door`.
    UNMATCHED = "tiergate_unmatched_requests_total", Counter;
    /// Rows waiting in a route's micro-batch queues, by `route`.
    BATCH_QUEUE_ROWS = "tiergate_batch_queue_rows", Gauge;
    /// Time a request waited in the micro-batch queue before its batch went out, by `route`
    /// and `priority` (histogram, seconds).
    BATCH_QUEUE_SECONDS = "tiergate_batch_queue_duration_seconds", Histogram;
    /// Rows per batch sent, by `route` (histogram).
    BATCH_ROWS = "tiergate_batch_rows", Histogram;
    /// Rows per batch sent as a fraction of `max_batch`, by `route` (histogram).
    BATCH_FILL_RATIO = "tiergate_batch_fill_ratio", Histogram;
    /// Batches sent, by `route` and `reason` (full, idle_backend, deadline).
    BATCH_FLUSHES = "tiergate_batch_flushes_total", Counter;
    /// Requests the micro-batch tier refused before queueing, by `route` and `reason`
    /// (queue_full, deadline_unmeetable, too_many_signatures).
    BATCH_REJECTIONS = "tiergate_batch_rejections_total", Counter;
    /// Micro-batch requests by `route`, `priority` (critical, standard, sheddable) and
    /// `outcome`: queued, or shed (a sheddable request refused under pressure, or a queued
    /// request evicted from a full queue: sheddable for a higher band, or of a tenant
    /// holding more than its share).
    BATCH_PRIORITY = "tiergate_batch_priority_requests_total", Counter;
    /// Failed batches split in two to isolate a request the backend refused, by `route`.
    BATCH_ISOLATIONS = "tiergate_batch_isolations_total", Counter;
    /// Learned fixed cost `a` of a batch on the route's batch pool, by `route` (seconds).
    BATCH_COST_FIXED = "tiergate_batch_cost_fixed_seconds", Gauge;
    /// Learned cost per row `b` on the route's batch pool, by `route` (seconds).
    BATCH_COST_PER_ROW = "tiergate_batch_cost_per_row_seconds", Gauge;
    /// Offline jobs in the store, by `state` (queued, running, succeeded, failed, cancelled, expired).
    OFFLINE_JOBS = "tiergate_offline_jobs", Gauge;
    /// How long the oldest queued offline job has waited since it was submitted (seconds; 0
    /// when none is queued).
    OFFLINE_OLDEST_QUEUED = "tiergate_offline_oldest_queued_seconds", Gauge;
    /// Offline job attempts that ended, by `route` and `result` (succeeded: the backend
    /// answered 2xx; answered: it answered otherwise, kept as the job's answer; retry; failed).
    OFFLINE_ATTEMPTS = "tiergate_offline_attempts_total", Counter;
    /// Requests with a budget, by `route`, `tier` and `result`: met (answered without a
    /// 5xx or gateway error, within the budget) or missed. Offline jobs count once they
    /// end: met when they succeed. The share met is the tier's SLO attainment.
    SLO_REQUESTS = "tiergate_slo_requests_total", Counter;
    /// Kafka source messages answered to the output topic, by `source` (input topic) and
    /// `result` (answered, error).
    KAFKA_MESSAGES = "tiergate_kafka_source_messages_total", Counter;
    /// Kafka source requests retried while the micro-batch tier shed them, by `source`.
    KAFKA_RETRIES = "tiergate_kafka_source_retries_total", Counter;
    /// 1 while a Kafka source's partitions are paused for back-pressure, by `source`.
    KAFKA_PAUSED = "tiergate_kafka_source_paused", Gauge;
    /// Consumer lag of a Kafka source, by `source` and `partition` (messages).
    KAFKA_LAG = "tiergate_kafka_source_lag", Gauge;
    /// Jobs this replica has read from the Kafka queue's jobs topic and not yet finished.
    KAFKA_QUEUE_HELD = "tiergate_kafka_queue_held", Gauge;
    /// The running policy's version (one more than the last one kept in the data directory
    /// at start, one more per change: reload, admin edit, rollback).
    POLICY_VERSION = "tiergate_policy_version", Gauge;
    /// Policy reloads by `result` (ok, rejected).
    POLICY_RELOADS = "tiergate_policy_reloads_total", Counter;
    /// 1 when the last reload took (or none was tried), 0 when it was rejected.
    POLICY_LAST_RELOAD_OK = "tiergate_policy_last_reload_ok", Gauge;
    /// Changes made through the admin API, by `action` (put_route, patch_route, promote, canary_abort,
    /// put_files, rollback).
    POLICY_CHANGES = "tiergate_policy_changes_total", Counter;
    /// Admin API requests refused before any work, by `reason` (unauthenticated, ...).
    ADMIN_REFUSALS = "tiergate_admin_refusals_total", Counter;
    /// Routes in the running policy.
    POLICY_ROUTES = "tiergate_policy_routes", Gauge;
    /// Always 1, labelled with the running `version`.
    BUILD_INFO = "tiergate_build_info", Gauge;
    /// 1 while the gateway is ready for new work (`/v2/health/ready` answers 200), else 0.
    READY = "tiergate_ready", Gauge;
    /// 1 while `reason` keeps the gateway from being ready, else 0, by `reason`
    /// (`draining`, `offline_store`, `pool_ejected`).
    NOT_READY = "tiergate_not_ready", Gauge;

    /// Calls a route's shadow candidate answered and that were compared with the primary,
    /// by `route` and `tier`.
    SHADOW_COMPARED = "tiergate_shadow_compared_total", Counter;
    /// Shadow calls dropped before a comparison, by `route` and `reason` (`full`,
    /// `timeout`, `down`, `unreadable`, `error`).
    SHADOW_DROPPED = "tiergate_shadow_dropped_total", Counter;
    /// Rows compared, by `route` and `verdict` (`within` tolerance, `outside` it).
    SHADOW_ROWS = "tiergate_shadow_rows_total", Counter;
    /// Compared answers whose status or whose outputs' shapes differ, by `route` and `kind`
    /// (`status`, `shape`).
    SHADOW_MISMATCHES = "tiergate_shadow_mismatches_total", Counter;
    /// The candidate's latency divided by the primary's, per compared call, by `route`.
    SHADOW_LATENCY_RATIO = "tiergate_shadow_latency_ratio", Histogram;

    /// Calls of a route with a canary, by `route`, `tier`, `variant` (`primary`,
    /// `candidate`) and `result` (`ok`, `error`: a 5xx or a gateway error).
    CANARY_REQUESTS = "tiergate_canary_requests_total", Counter;
    /// Their latency, by `route`, `tier` and `variant`.
    CANARY_SECONDS = "tiergate_canary_request_duration_seconds", Histogram;
    /// Canaries set back to 0% on their own, by `route`.
    CANARY_ABORTS = "tiergate_canary_aborts_total", Counter;

    /// Requests of a route with a cache, by `route` and `result` (`hit`, `miss`, `bypass`,
    /// `coalesced`: answered by a call in flight for the same key).
    CACHE_LOOKUPS = "tiergate_cache_lookups_total", Counter;
    /// Rows of micro-batches on a route with a cache, by `route` and `result` (`hit`:
    /// answered from the cache; `deduped`: the same as another row of its batch, sent once
    /// for both; `sent`: to the backend).
    CACHE_ROWS = "tiergate_cache_rows_total", Counter;
    /// Answers written into a route's cache ahead of the requests that will ask for them,
    /// by a Batch API batch or a Kafka source marked to precompute, by `route`.
    CACHE_PRECOMPUTED = "tiergate_cache_precomputed_total", Counter;
    /// Hits (of whole requests and of micro-batch rows) answered by a precomputed entry, by
    /// `route`; also counted as hits in `tiergate_cache_lookups_total` and `_rows_total`.
    CACHE_PRECOMPUTED_HITS = "tiergate_cache_precomputed_hits_total", Counter;
    /// Lookups in the shared second level (Redis) of requests the gateway's memory did not
    /// hold, by `route` and `result` (`hit`, `miss`, `unavailable`: Redis left alone after
    /// a failure, or too slow).
    CACHE_REDIS_LOOKUPS = "tiergate_cache_redis_lookups_total", Counter;
    /// Redis failures (errors, timeouts, writes past `cache.max_redis_writes`), by `op`
    /// (`get`, `set`, `invalidate`) and `redis` (its `host:port`); callers never see them.
    CACHE_REDIS_ERRORS = "tiergate_cache_redis_errors_total", Counter;
    /// 1 while the cache uses its Redis, 0 while it serves from memory alone after a
    /// failure, by `redis` (its `host:port`).
    CACHE_REDIS_UP = "tiergate_cache_redis_up", Gauge;
    /// Entries a route's cache let go to stay within its `max_bytes`, by `route`.
    CACHE_EVICTIONS = "tiergate_cache_evictions_total", Counter;
    /// Entries a route's cache keeps, by `route`.
    CACHE_ENTRIES = "tiergate_cache_entries", Gauge;
    /// What they weigh, in bytes, by `route`.
    CACHE_BYTES = "tiergate_cache_bytes", Gauge;

    /// A route's batch pool's progressive batch size: most rows a batch carries now, by
    /// `route` (`max_batch` until a batch fails, times out or runs far over its learned cost).
    BATCH_SIZE_LIMIT = "tiergate_batch_size_limit", Gauge;

    /// A batch pool's admission window for LLM calls: what is in flight, by `route` and
    /// `kind` (`sequences`; `tokens`, each call at its prompt's estimate and `max_tokens`),
    /// sampled every `signal_interval`.
    WINDOW_IN_FLIGHT = "tiergate_window_in_flight", Gauge;

    /// A batch pool's admission window's limits now, by `route` and `kind` (`sequences`,
    /// `tokens`; +Inf: none): its ceilings, narrowed by its engines' signals.
    WINDOW_LIMIT = "tiergate_window_limit", Gauge;

    /// Times a batch pool's admission window moved, by `route` and `direction`
    /// (`narrowed`: halved on its engines' signals; `held_back`: halved, to nothing at
    /// last, for the interactive streams of a pool shared with the real-time tier;
    /// `widened`: a sixteenth of its ceilings back).
    WINDOW_ADAPTED = "tiergate_window_adapted_total", Counter;

    /// Requests the usage ledger counted (refused ones too), by `route` and `tier`
    /// (`cache`: answered by the route's cache, no tier).
    USAGE_REQUESTS = "tiergate_usage_requests_total", Counter;
    /// Rows the usage ledger counted answered, by `route` and `tier`.
    USAGE_ROWS = "tiergate_usage_rows_total", Counter;
    /// Backend time charged to requests since start, by `route` and `tier` (a
    /// micro-batch's time split over its rows), seconds; it only grows (`increase()`
    /// reads it as a counter).
    USAGE_BACKEND_SECONDS = "tiergate_usage_backend_seconds", Gauge;
    /// What the rows sent would have cost served one by one since start (`t(1)` per
    /// row of the pool's learned cost), by `route` and `tier`, seconds: less the
    /// backend seconds, what batching saved.
    USAGE_ALONE_SECONDS = "tiergate_usage_alone_seconds", Gauge;
    /// What rows answered without a call of their own would have cost since start, by
    /// `route`, `tier` and `cause` (`cache`, `precomputed`, `dedupe`), seconds.
    USAGE_SAVED_SECONDS = "tiergate_usage_saved_seconds", Gauge;
    /// Requests the usage ledger counted, by `route` and `tenant` (`other` past
    /// `metrics.max_tenant_series`); only with `metrics.tenant_labels = true`.
    USAGE_TENANT_REQUESTS = "tiergate_usage_tenant_requests_total", Counter;
    /// Backend seconds charged since start, by `route` and `tenant`; only with
    /// `metrics.tenant_labels = true`.
    USAGE_TENANT_BACKEND_SECONDS = "tiergate_usage_tenant_backend_seconds", Gauge;
    /// Endpoints a pool needs for the load it sees (arrivals × cost per request ÷
    /// target utilisation), by `route` and `tier`: the autoscaler's signal.
    ENDPOINTS_NEEDED = "tiergate_endpoints_needed", Gauge;
    /// A pool's endpoints not ejected now, by `route` and `tier`.
    ENDPOINTS_HEALTHY = "tiergate_endpoints_healthy", Gauge;

    /// Streams being relayed now, by `route` and `tier`.
    STREAMS_OPEN = "tiergate_streams_open", Gauge;
    /// Streams that ended, by `route`, `tier` and `reason` (`done`, `client_gone`,
    /// `first_token` (its budget ran out first), `idle`, `too_long`, `backend_error`,
    /// `event_too_big`, `malformed`, `slow_reader`).
    STREAMS_ENDED = "tiergate_streams_ended_total", Counter;
    /// Tokens backends reported (or streams' content events counted, where a backend
    /// reported none), by `route`, `tier` and `kind` (`prompt`, `completion`,
    /// `completion_estimated`).
    TOKENS = "tiergate_tokens_total", Counter;
    /// LLM calls a route's token limits refused, by `route`, `limit` (its key:
    /// `tokens_per_minute`, `requests_per_minute`, `daily_tokens`, `monthly_tokens`)
    /// and `why` (`spent`: too little left now; `too_large`: more than it ever allows).
    TOKEN_LIMITED = "tiergate_token_limited_total", Counter;
    /// Time from a streamed call's sending to its first token, by `route` and `tier`
    /// (histogram, seconds).
    TIME_TO_FIRST_TOKEN = "tiergate_time_to_first_token_seconds", Histogram;
    /// Time per output token after the first, by `route` and `tier` (histogram, seconds).
    TIME_PER_OUTPUT_TOKEN = "tiergate_time_per_output_token_seconds", Histogram;
}

/// Histogram buckets (seconds): 100 µs to 60 s, dense where real-time calls land.
const BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// Buckets for rows per batch: powers of two up to the largest `max_batch`.
const ROW_BUCKETS: &[f64] = &[
    1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0, 65536.0,
];
/// Buckets for the fill ratio.
const RATIO_BUCKETS: &[f64] = &[0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0];
/// Buckets for a candidate's latency against the primary's.
const LATENCY_RATIO_BUCKETS: &[f64] = &[0.25, 0.5, 0.75, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0];

/// Pre-registered handles for one route and tier.
#[derive(Clone)]
pub struct Instruments {
    /// End-to-end latency.
    pub request_seconds: metrics::Histogram,
    /// Backend call latency.
    pub backend_seconds: metrics::Histogram,
    /// Requests in flight.
    pub in_flight: metrics::Gauge,
    /// Sequence steps waiting for their turn.
    pub sequence_steps_waiting: metrics::Gauge,
}

impl std::fmt::Debug for Instruments {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Instruments")
    }
}

impl Instruments {
    /// Handles that record nothing (a control pool's calls are no tier's).
    pub fn unexported() -> Self {
        Instruments {
            request_seconds: metrics::Histogram::noop(),
            backend_seconds: metrics::Histogram::noop(),
            in_flight: metrics::Gauge::noop(),
            sequence_steps_waiting: metrics::Gauge::noop(),
        }
    }

    /// Handles for `route` and `tier` (a tier's name, or `shadow`).
    pub fn new(route: &str, tier: &str) -> Self {
        let labels = [("route", route.to_owned()), ("tier", tier.to_owned())];
        Instruments {
            request_seconds: metrics::histogram!(REQUEST_SECONDS, &labels),
            backend_seconds: metrics::histogram!(BACKEND_SECONDS, &labels),
            in_flight: metrics::gauge!(IN_FLIGHT, &labels),
            sequence_steps_waiting: metrics::gauge!(SEQUENCE_STEPS_WAITING, &labels),
        }
    }
}

/// One route's request instruments, each registered the first time it is used, so the
/// request path records without building a label set or looking it up. The doors keep
/// one per route name (see `front::pipeline::dispatch`), across policy snapshots.
#[derive(Default)]
pub struct RouteInstruments {
    /// By [`Tier::index`].
    tiers: [OnceLock<TierInstruments>; Tier::ALL.len()],
}

/// One route's handles on one tier; the labelled counters registered as first counted.
struct TierInstruments {
    handles: Instruments,
    ok: OnceLock<metrics::Counter>,
    /// SLO met, missed.
    slo: [OnceLock<metrics::Counter>; 2],
    /// By [`Reason::index`].
    decisions: [OnceLock<metrics::Counter>; Reason::ALL.len()],
}

impl RouteInstruments {
    /// Latency, backend latency and in-flight handles of `route` (this route's name) on `tier`.
    pub fn handles(&self, route: &str, tier: Tier) -> &Instruments {
        &self.tier(route, tier).handles
    }

    /// Counts one classifier decision ([`count_decision`]).
    pub fn decided(&self, route: &str, tier: Tier, reason: Reason) {
        self.tier(route, tier).decisions[reason.index()]
            .get_or_init(|| metrics::counter!(DECISIONS, "route" => route.to_owned(), "tier" => tier.as_str(), "reason" => reason.as_str()))
            .increment(1);
    }

    /// Counts a request served on `tier` against its SLO ([`count_slo`]).
    pub fn slo(&self, route: &str, tier: Tier, met: bool) {
        let cell = &self.tier(route, tier).slo[usize::from(!met)];
        cell.get_or_init(|| {
            let result = if met { "met" } else { "missed" };
            metrics::counter!(SLO_REQUESTS, "route" => route.to_owned(), "tier" => tier.as_str(), "result" => result)
        })
        .increment(1);
    }

    /// Counts one finished request ([`count_request`]); an `ok` on a tier from a handle.
    pub fn request(&self, route: &str, tier: Option<Tier>, outcome: &'static str) {
        match tier {
            Some(tier) if outcome == "ok" => self
                .tier(route, tier)
                .ok
                .get_or_init(|| metrics::counter!(REQUESTS, "route" => route.to_owned(), "tier" => tier.as_str(), "outcome" => outcome))
                .increment(1),
            _ => count_request(route, tier, outcome),
        }
    }

    fn tier(&self, route: &str, tier: Tier) -> &TierInstruments {
        self.tiers[tier.index()].get_or_init(|| TierInstruments {
            handles: Instruments::new(route, tier.as_str()),
            ok: OnceLock::new(),
            slo: Default::default(),
            decisions: Default::default(),
        })
    }
}

impl std::fmt::Debug for RouteInstruments {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RouteInstruments")
    }
}

/// Counts one finished request.
pub fn count_request(route: &str, tier: Option<Tier>, outcome: &'static str) {
    let tier = tier.map_or("none", Tier::as_str);
    metrics::counter!(REQUESTS, "route" => route.to_owned(), "tier" => tier, "outcome" => outcome).increment(1);
}

/// Counts a request served on `tier` against its SLO: met or missed.
pub fn count_slo(route: &str, tier: Tier, met: bool) {
    let result = if met { "met" } else { "missed" };
    metrics::counter!(SLO_REQUESTS, "route" => route.to_owned(), "tier" => tier.as_str(), "result" => result)
        .increment(1);
}

/// Counts one classifier decision.
pub fn count_decision(route: &str, tier: Tier, reason: &'static str) {
    metrics::counter!(DECISIONS, "route" => route.to_owned(), "tier" => tier.as_str(), "reason" => reason).increment(1);
}

/// One pool's usage totals (route and tier), registered once: requests and rows,
/// backend and one-by-one seconds, seconds saved by the cache, precomputed answers and
/// dedupe.
#[derive(Debug)]
pub struct UsageHandles {
    counts: [metrics::Counter; 2],
    spent: [metrics::Gauge; 2],
    saved: [metrics::Gauge; 3],
}

impl UsageHandles {
    /// The handles of `route` and `tier`.
    pub fn new(route: &str, tier: &'static str) -> Self {
        let labels = [("route", route.to_owned()), ("tier", tier.to_owned())];
        let saved = |cause: &'static str| {
            let labels = [labels[0].clone(), labels[1].clone(), ("cause", cause.to_owned())];
            metrics::gauge!(USAGE_SAVED_SECONDS, &labels)
        };
        UsageHandles {
            counts: [
                metrics::counter!(USAGE_REQUESTS, &labels),
                metrics::counter!(USAGE_ROWS, &labels),
            ],
            spent: [
                metrics::gauge!(USAGE_BACKEND_SECONDS, &labels),
                metrics::gauge!(USAGE_ALONE_SECONDS, &labels),
            ],
            saved: [saved("cache"), saved("precomputed"), saved("dedupe")],
        }
    }

    /// Adds a second of the ledger's figures: requests and rows; backend and
    /// one-by-one nanoseconds; nanoseconds saved by the cache, precomputed answers and
    /// dedupe.
    pub fn add(&self, (counts, spent, saved): ([u64; 2], [u64; 2], [u64; 3])) {
        for (counter, n) in self.counts.iter().zip(counts) {
            counter.increment(n);
        }
        for (gauge, ns) in self.spent.iter().zip(spent).chain(self.saved.iter().zip(saved)) {
            gauge.increment(ns as f64 / 1e9);
        }
    }
}

/// Adds a second of the usage ledger's requests and backend nanoseconds for `tenant`
/// on `route` (`metrics.tenant_labels`).
pub fn tenant_usage_added(route: &str, tenant: &str, (requests, ns): (u64, u64)) {
    let labels = [("route", route.to_owned()), ("tenant", tenant.to_owned())];
    metrics::counter!(USAGE_TENANT_REQUESTS, &labels).increment(requests);
    add_seconds(USAGE_TENANT_BACKEND_SECONDS, &labels, ns);
}

/// Adds `ns` nanoseconds, as seconds, to the total `name` with `labels`: a gauge that
/// only grows (the recorder's counters hold whole numbers; seconds need a fraction).
fn add_seconds(name: &'static str, labels: &[(&'static str, String)], ns: u64) {
    metrics::gauge!(name, labels).increment(ns as f64 / 1e9);
}

/// A pool's capacity signal (route and tier): endpoints needed, and healthy now.
pub fn endpoints(route: &str, tier: &'static str) -> [metrics::Gauge; 2] {
    let labels = [("route", route.to_owned()), ("tier", tier.to_owned())];
    [
        metrics::gauge!(ENDPOINTS_NEEDED, &labels),
        metrics::gauge!(ENDPOINTS_HEALTHY, &labels),
    ]
}

/// Installs the process-wide Prometheus recorder (once) and returns its handle.
pub fn install() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let recorder = PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), BUCKETS)
                .and_then(|b| b.set_buckets_for_metric(Matcher::Full(BATCH_ROWS.into()), ROW_BUCKETS))
                .and_then(|b| b.set_buckets_for_metric(Matcher::Full(BATCH_FILL_RATIO.into()), RATIO_BUCKETS))
                .and_then(|b| {
                    b.set_buckets_for_metric(Matcher::Full(SHADOW_LATENCY_RATIO.into()), LATENCY_RATIO_BUCKETS)
                })
                .expect("the bucket lists are non-empty constants")
                .build_recorder();
            let handle = recorder.handle();
            // Fails only when another recorder was installed first (a host program
            // embedding tiergate); metrics then go to that recorder instead.
            if metrics::set_global_recorder(recorder).is_err() {
                tracing::warn!("a metrics recorder was already installed; /metrics shows only tiergate's own handle");
            }
            describe();
            metrics::gauge!(BUILD_INFO, "version" => env!("CARGO_PKG_VERSION")).set(1.0);
            register_known_labels();
            handle
        })
        .clone()
}

/// Gives every family its `# HELP` text.
fn describe() {
    for family in FAMILIES {
        let help = family.help.trim();
        match family.kind {
            FamilyKind::Counter => metrics::describe_counter!(family.name, help),
            FamilyKind::Gauge => metrics::describe_gauge!(family.name, help),
            FamilyKind::Histogram => metrics::describe_histogram!(family.name, help),
        }
    }
}

/// Registers, at zero, the series whose labels are known up front, so that a rate or
/// an alert over them sees 0 rather than no data before the first event.
fn register_known_labels() {
    for result in ["ok", "rejected"] {
        metrics::counter!(POLICY_RELOADS, "result" => result).absolute(0);
    }
    for action in [
        "put_route",
        "patch_route",
        "promote",
        "canary_abort",
        "put_files",
        "rollback",
    ] {
        metrics::counter!(POLICY_CHANGES, "action" => action).absolute(0);
    }
    metrics::counter!(ADMIN_REFUSALS, "reason" => "unauthenticated").absolute(0);
    for reason in [
        "route",
        "tenant",
        "requests",
        "body_bytes",
        "rss",
        "connections",
        "connections_per_client",
    ] {
        metrics::counter!(ADMISSION_REFUSALS, "reason" => reason).absolute(0);
    }
    for reason in ["first_request", "idle"] {
        metrics::counter!(CONNECTIONS_CLOSED, "reason" => reason).absolute(0);
    }
    metrics::gauge!(POLICY_LAST_RELOAD_OK).set(1.0);
    metrics::gauge!(OFFLINE_OLDEST_QUEUED).set(0.0);
}
