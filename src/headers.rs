//! Every header name of tiergate's own, one type for all (`http::HeaderName`): what the
//! doors read from clients and what they write on answers. A leaf. (The W3C trace
//! headers are in [`crate::trace`], KServe's binary-extension header in
//! [`crate::protocol`].)

use http::{HeaderMap, HeaderName, HeaderValue};

/// Request: the client's budget in milliseconds (first in the budget's order).
pub const BUDGET: HeaderName = HeaderName::from_static("x-tiergate-budget-ms");
/// Request (micro-batch): the caller's priority band, `critical`, `standard` or
/// `sheddable` (the route's `priority` when absent).
pub const PRIORITY: HeaderName = HeaderName::from_static("x-tiergate-priority");
/// Request: makes an offline submission idempotent (for its tenant and body).
pub const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");
/// Request: RFC 7240 preferences; `respond-async` asks for the offline tier.
pub const PREFER: HeaderName = HeaderName::from_static("prefer");
/// Request to the admin API: who makes a change, for the audit log.
pub const ACTOR: HeaderName = HeaderName::from_static("x-tiergate-actor");

/// Answer: the tier that served the request.
pub const TIER: HeaderName = HeaderName::from_static("x-tiergate-tier");
/// Answer: why it went to that tier (or why none served it).
pub const REASON: HeaderName = HeaderName::from_static("x-tiergate-reason");
/// Answer: the version of the policy snapshot that served it.
pub const POLICY_VERSION: HeaderName = HeaderName::from_static("x-tiergate-policy-version");
/// Answer (micro-batch): rows in the backend call that carried the request.
pub const BATCH_SIZE: HeaderName = HeaderName::from_static("x-tiergate-batch-size");
/// Answer (micro-batch), and the backend call that carried it: the id of that batch,
/// also in the batch's log line (`tiergate::lineage`) and offline results.
pub const BATCH_ID: HeaderName = HeaderName::from_static("x-tiergate-batch-id");
/// Answer (micro-batch): how long the request waited for its batch, in milliseconds.
pub const QUEUE_MS: HeaderName = HeaderName::from_static("x-tiergate-queue-ms");
/// Answer (real-time, a route with a canary): `primary` or `candidate`, which served it.
pub const VARIANT: HeaderName = HeaderName::from_static("x-tiergate-variant");
/// Answer: on a route with a cache, how the cache took part (`hit`, `miss`, `bypass`,
/// `coalesced`).
pub const CACHE: HeaderName = HeaderName::from_static("x-tiergate-cache");
/// Answer (micro-batch, a route with a cache): how many of the request's rows the
/// cache answered (the rest were sent, once for identical rows).
pub const CACHED_ROWS: HeaderName = HeaderName::from_static("x-tiergate-cached-rows");
/// Answer (`/v1/jobs/{id}`): the job an answer belongs to.
pub const JOB_ID: HeaderName = HeaderName::from_static("x-tiergate-job-id");
/// Answer (`/v1/jobs/{id}`): the job's state.
pub const JOB_STATUS: HeaderName = HeaderName::from_static("x-tiergate-job-status");
/// Answer (model statistics, both doors): what the figures count, [`STATISTICS_SCOPE`].
pub const STATISTICS: HeaderName = HeaderName::from_static("x-tiergate-statistics");
/// The value of [`STATISTICS`]: the figures are what one endpoint of the route's
/// real-time pool (its micro-batch pool when it has none) counts, as that server reports
/// them, not the route's whole traffic (which is in tiergate's metrics).
pub const STATISTICS_SCOPE: &str = "one-endpoint";

/// What the request path reads of a request's head, found in one pass over its
/// headers: a map lookup hashes the name and probes, and the path asks for nine names
/// of a request that usually carries five to ten headers. Values are kept (a shared
/// clone each), so the head can be read after the map has changed hands.
#[derive(Debug, Clone, Default)]
pub struct Head {
    /// [`BUDGET`].
    pub budget: Option<HeaderValue>,
    /// `grpc-timeout`.
    pub grpc_timeout: Option<HeaderValue>,
    /// [`PRIORITY`].
    pub priority: Option<HeaderValue>,
    /// Whether a [`PREFER`] header asks for `respond-async`.
    pub prefer_async: bool,
    /// `traceparent` (W3C).
    pub traceparent: Option<HeaderValue>,
    /// `x-request-id`.
    pub request_id: Option<HeaderValue>,
    /// `inference-header-content-length` (Triton's binary extension).
    pub header_len: Option<HeaderValue>,
    /// Whether `content-encoding` or `accept-encoding` is there.
    pub coded: bool,
    /// The route's rollout key header.
    pub rollout_key: Option<HeaderValue>,
    /// The route's tenant header (the tenant a caller claims when the data plane does
    /// not authenticate).
    pub tenant: Option<HeaderValue>,
}

impl Head {
    /// Reads `headers` once; `route_names` are the route's rollout key header and
    /// tenant header. The first value of a name counts, as `HeaderMap::get` gives it.
    pub fn scan(headers: &HeaderMap, (rollout_key, tenant): (&HeaderName, &HeaderName)) -> Head {
        let mut head = Head::default();
        for (name, value) in headers {
            if name == rollout_key && head.rollout_key.is_none() {
                head.rollout_key = Some(value.clone());
            }
            if name == tenant && head.tenant.is_none() {
                head.tenant = Some(value.clone());
            }
            let slot = match name.as_str() {
                "x-tiergate-budget-ms" => &mut head.budget,
                "grpc-timeout" => &mut head.grpc_timeout,
                "x-tiergate-priority" => &mut head.priority,
                "traceparent" => &mut head.traceparent,
                "x-request-id" => &mut head.request_id,
                "inference-header-content-length" => &mut head.header_len,
                "prefer" => {
                    head.prefer_async |= asks_async(value);
                    continue;
                }
                "content-encoding" | "accept-encoding" => {
                    head.coded = true;
                    continue;
                }
                _ => continue,
            };
            if slot.is_none() {
                *slot = Some(value.clone());
            }
        }
        head
    }
}

/// Whether one `Prefer` value asks for `respond-async` (RFC 7240).
fn asks_async(value: &HeaderValue) -> bool {
    value.to_str().ok().is_some_and(|v| {
        v.split(',').any(|p| {
            let token = p.split(';').next().unwrap_or("").trim();
            token.eq_ignore_ascii_case("respond-async")
        })
    })
}

/// True when a `Prefer` header asks for `respond-async` (RFC 7240).
pub fn prefers_async(headers: &http::HeaderMap) -> bool {
    headers.get_all(PREFER).iter().any(asks_async)
}
