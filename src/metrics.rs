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

/// Requests that reached a route, by `route`, `tier` and `outcome`.
pub const REQUESTS: &str = "tiergate_requests_total";
/// End-to-end latency seen by the gateway, by `route` and `tier` (histogram, seconds).
pub const REQUEST_SECONDS: &str = "tiergate_request_duration_seconds";
/// Classifier decisions, by `route`, `tier` and `reason`.
pub const DECISIONS: &str = "tiergate_decisions_total";
/// Latency of backend calls, by `route` and `tier` (histogram, seconds).
pub const BACKEND_SECONDS: &str = "tiergate_backend_duration_seconds";
/// Steps of Triton sequences waiting for an earlier step of their sequence to be
/// answered, by `route` and `tier` (gauge).
pub const SEQUENCE_STEPS_WAITING: &str = "tiergate_sequence_steps_waiting";
/// Circuit state of each backend endpoint, by `route`, `tier` and `endpoint`:
/// 0 closed (taking traffic), 1 open (ejected), 2 half-open (being probed).
pub const BACKEND_CIRCUIT: &str = "tiergate_backend_circuit_state";
/// Endpoint ejections, by `route`, `tier`, `endpoint` and `reason` (unreachable,
/// status_5xx, timeout, slow, broken_answer, check).
pub const BACKEND_EJECTIONS: &str = "tiergate_backend_ejections_total";
/// Requests refused at admission, by `reason` (route, tenant: rate limits; requests,
/// body_bytes, rss: global limits; connections, connections_per_client: closed at
/// accept).
pub const ADMISSION_REFUSALS: &str = "tiergate_admission_refusals_total";
/// Connections the gateway closed for sending nothing useful, by `reason`
/// (first_request: no complete first request head in time; idle: no request for
/// `limits.idle_timeout`).
pub const CONNECTIONS_CLOSED: &str = "tiergate_connections_closed_total";
/// Resident memory of the process, when `limits.max_rss_bytes` is set (bytes).
pub const PROCESS_RSS: &str = "tiergate_process_resident_bytes";
/// Work one tier lent to another under a route's borrowing rules, by `route`, `from`
/// (the tier whose capacity served it) and `to` (the tier it was classified to).
pub const BORROWED: &str = "tiergate_borrowed_total";
/// Requests being served now, by `route` and `tier`.
pub const IN_FLIGHT: &str = "tiergate_in_flight_requests";
/// Requests no route matched (unknown model or path), by `door`.
pub const UNMATCHED: &str = "tiergate_unmatched_requests_total";
/// Rows waiting in a route's micro-batch queues, by `route`.
pub const BATCH_QUEUE_ROWS: &str = "tiergate_batch_queue_rows";
/// Time a request waited in the micro-batch queue before its batch went out, by `route`
/// and `priority` (histogram, seconds).
pub const BATCH_QUEUE_SECONDS: &str = "tiergate_batch_queue_duration_seconds";
/// Rows per batch sent, by `route` (histogram).
pub const BATCH_ROWS: &str = "tiergate_batch_rows";
/// Rows per batch sent as a fraction of `max_batch`, by `route` (histogram).
pub const BATCH_FILL_RATIO: &str = "tiergate_batch_fill_ratio";
/// Batches sent, by `route` and `reason` (full, idle_backend, deadline, max_wait).
pub const BATCH_FLUSHES: &str = "tiergate_batch_flushes_total";
/// Requests the micro-batch tier refused before queueing, by `route` and `reason`
/// (queue_full, deadline_unmeetable, too_many_signatures).
pub const BATCH_REJECTIONS: &str = "tiergate_batch_rejections_total";
/// Micro-batch requests by `route`, `priority` (critical, standard, sheddable) and
/// `outcome`: queued, or shed (a sheddable request refused under pressure, or a queued
/// request evicted from a full queue: sheddable for a higher band, or of a tenant
/// holding more than its share).
pub const BATCH_PRIORITY: &str = "tiergate_batch_priority_requests_total";
/// Failed batches split in two to isolate a request the backend refused, by `route`.
pub const BATCH_ISOLATIONS: &str = "tiergate_batch_isolations_total";
/// Learned fixed cost `a` of a batch on the route's batch pool, by `route` (seconds).
pub const BATCH_COST_FIXED: &str = "tiergate_batch_cost_fixed_seconds";
/// Learned cost per row `b` on the route's batch pool, by `route` (seconds).
pub const BATCH_COST_PER_ROW: &str = "tiergate_batch_cost_per_row_seconds";
/// Offline jobs in the store, by `state` (queued, running, succeeded, failed, cancelled, expired).
pub const OFFLINE_JOBS: &str = "tiergate_offline_jobs";
/// How long the oldest queued offline job has waited since it was submitted (seconds; 0
/// when none is queued).
pub const OFFLINE_OLDEST_QUEUED: &str = "tiergate_offline_oldest_queued_seconds";
/// Offline job attempts that ended, by `route` and `result` (succeeded: the backend
/// answered 2xx; answered: it answered otherwise, kept as the job's answer; retry; failed).
pub const OFFLINE_ATTEMPTS: &str = "tiergate_offline_attempts_total";
/// Requests with a budget, by `route`, `tier` and `result`: met (answered without a
/// 5xx or gateway error, within the budget) or missed. Offline jobs count once they
/// end: met when they succeed. The share met is the tier's SLO attainment.
pub const SLO_REQUESTS: &str = "tiergate_slo_requests_total";
/// Kafka source messages answered to the output topic, by `source` (input topic) and
/// `result` (answered, error).
pub const KAFKA_MESSAGES: &str = "tiergate_kafka_source_messages_total";
/// Kafka source requests retried while the micro-batch tier shed them, by `source`.
pub const KAFKA_RETRIES: &str = "tiergate_kafka_source_retries_total";
/// 1 while a Kafka source's partitions are paused for back-pressure, by `source`.
pub const KAFKA_PAUSED: &str = "tiergate_kafka_source_paused";
/// Consumer lag of a Kafka source, by `source` and `partition` (messages).
pub const KAFKA_LAG: &str = "tiergate_kafka_source_lag";
/// Jobs this replica has read from the Kafka queue's jobs topic and not yet finished.
pub const KAFKA_QUEUE_HELD: &str = "tiergate_kafka_queue_held";
/// The running policy's version (one more than the last one kept in the data directory
/// at start, one more per change: reload, admin edit, rollback).
pub const POLICY_VERSION: &str = "tiergate_policy_version";
/// Policy reloads by `result` (ok, rejected).
pub const POLICY_RELOADS: &str = "tiergate_policy_reloads_total";
/// 1 when the last reload took (or none was tried), 0 when it was rejected.
pub const POLICY_LAST_RELOAD_OK: &str = "tiergate_policy_last_reload_ok";
/// Changes made through the admin API, by `action` (put_route, patch_route, put_files, rollback).
pub const POLICY_CHANGES: &str = "tiergate_policy_changes_total";
/// Admin API requests refused before any work, by `reason` (unauthenticated, ...).
pub const ADMIN_REFUSALS: &str = "tiergate_admin_refusals_total";
/// Routes in the running policy.
pub const POLICY_ROUTES: &str = "tiergate_policy_routes";
/// Always 1, labelled with the running `version`.
pub const BUILD_INFO: &str = "tiergate_build_info";
/// 1 while the gateway is ready for new work (`/v2/health/ready` answers 200), else 0.
pub const READY: &str = "tiergate_ready";
/// 1 while `reason` keeps the gateway from being ready, else 0, by `reason`
/// (`draining`, `offline_store`, `pool_ejected`).
pub const NOT_READY: &str = "tiergate_not_ready";

/// Calls a route's shadow candidate answered and that were compared with the primary,
/// by `route` and `tier`.
pub const SHADOW_COMPARED: &str = "tiergate_shadow_compared_total";
/// Shadow calls dropped before a comparison, by `route` and `reason` (`full`,
/// `timeout`, `down`, `unreadable`, `error`).
pub const SHADOW_DROPPED: &str = "tiergate_shadow_dropped_total";
/// Rows compared, by `route` and `verdict` (`within` tolerance, `outside` it).
pub const SHADOW_ROWS: &str = "tiergate_shadow_rows_total";
/// Compared answers whose status or whose outputs' shapes differ, by `route` and `kind`
/// (`status`, `shape`).
pub const SHADOW_MISMATCHES: &str = "tiergate_shadow_mismatches_total";
/// The candidate's latency divided by the primary's, per compared call, by `route`.
pub const SHADOW_LATENCY_RATIO: &str = "tiergate_shadow_latency_ratio";

/// Calls of a route with a canary, by `route`, `tier`, `variant` (`primary`,
/// `candidate`) and `result` (`ok`, `error`: a 5xx or a gateway error).
pub const CANARY_REQUESTS: &str = "tiergate_canary_requests_total";
/// Their latency, by `route`, `tier` and `variant`.
pub const CANARY_SECONDS: &str = "tiergate_canary_request_duration_seconds";
/// Canaries set back to 0% on their own, by `route`.
pub const CANARY_ABORTS: &str = "tiergate_canary_aborts_total";

/// Requests of a route with a cache, by `route` and `result` (`hit`, `miss`, `bypass`,
/// `coalesced`: answered by a call in flight for the same key).
pub const CACHE_LOOKUPS: &str = "tiergate_cache_lookups_total";
/// Rows of micro-batches on a route with a cache, by `route` and `result` (`hit`:
/// answered from the cache; `deduped`: the same as another row of its batch, sent once
/// for both; `sent`: to the backend).
pub const CACHE_ROWS: &str = "tiergate_cache_rows_total";
/// Answers written into a route's cache ahead of the requests that will ask for them,
/// by a Batch API batch or a Kafka source marked to precompute, by `route`.
pub const CACHE_PRECOMPUTED: &str = "tiergate_cache_precomputed_total";
/// Hits (of whole requests and of micro-batch rows) answered by a precomputed entry, by
/// `route`; also counted as hits in `tiergate_cache_lookups_total` and `_rows_total`.
pub const CACHE_PRECOMPUTED_HITS: &str = "tiergate_cache_precomputed_hits_total";
/// Lookups in the shared second level (Redis) of requests the gateway's memory did not
/// hold, by `route` and `result` (`hit`, `miss`, `unavailable`: Redis left alone after
/// a failure, or too slow).
pub const CACHE_REDIS_LOOKUPS: &str = "tiergate_cache_redis_lookups_total";
/// Redis failures (errors, timeouts, writes past `cache.max_redis_writes`), by `op`
/// (`get`, `set`, `invalidate`) and `redis` (its `host:port`); callers never see them.
pub const CACHE_REDIS_ERRORS: &str = "tiergate_cache_redis_errors_total";
/// 1 while the cache uses its Redis, 0 while it serves from memory alone after a
/// failure, by `redis` (its `host:port`).
pub const CACHE_REDIS_UP: &str = "tiergate_cache_redis_up";
/// Entries a route's cache let go to stay within its `max_bytes`, by `route`.
pub const CACHE_EVICTIONS: &str = "tiergate_cache_evictions_total";
/// Entries a route's cache keeps, by `route`.
pub const CACHE_ENTRIES: &str = "tiergate_cache_entries";
/// What they weigh, in bytes, by `route`.
pub const CACHE_BYTES: &str = "tiergate_cache_bytes";

/// A route's batch pool's progressive batch size: most rows a batch carries now, by
/// `route` (`max_batch` until a batch fails, times out or runs far over its learned cost).
pub const BATCH_SIZE_LIMIT: &str = "tiergate_batch_size_limit";

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
/// one per route name (see `front::dispatch`), across policy snapshots.
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
            metrics::gauge!(BUILD_INFO, "version" => env!("CARGO_PKG_VERSION")).set(1.0);
            register_known_labels();
            handle
        })
        .clone()
}

/// Registers, at zero, the series whose labels are known up front, so that a rate or
/// an alert over them sees 0 rather than no data before the first event.
fn register_known_labels() {
    for result in ["ok", "rejected"] {
        metrics::counter!(POLICY_RELOADS, "result" => result).absolute(0);
    }
    for action in ["put_route", "patch_route", "put_files", "rollback"] {
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
