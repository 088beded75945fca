//! Request metadata for the classifier: budget, `Prefer: respond-async`, rollout key.
//!
//! Read by every door from headers (and from the KServe `timeout` parameter the door
//! found in the body). The budget comes from, first match wins: `x-tiergate-budget-ms`,
//! `grpc-timeout`, the KServe `timeout` parameter (µs), the route's default. A zero
//! budget header or `grpc-timeout` is a deadline already passed (504 /
//! DEADLINE_EXCEEDED, never a retry hint); a KServe `timeout` of 0 is no timeout.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use http::HeaderMap;

use crate::decision::key_hash;
use crate::decision::{BudgetSource, Meta};
use crate::error::{Error, Kind};
use crate::headers::{self, Head};
use crate::policy::Route;

/// The header asking for an asynchronous answer (RFC 7240 `respond-async`).
/// The gRPC deadline header, also honoured on HTTP.
pub const GRPC_TIMEOUT: http::HeaderName = http::HeaderName::from_static("grpc-timeout");

/// Longest budget honoured; larger ones are clamped (a week covers any completion window).
pub const MAX_BUDGET: Duration = Duration::from_secs(7 * 24 * 3600);

/// Spreads requests that carry no rollout key evenly over the rollout.
static UNKEYED: AtomicU64 = AtomicU64::new(0);

/// Reads the classifier's input from `headers`, the KServe `timeout` parameter (µs)
/// and request `id` found in the body, for `route`.
pub fn read(
    headers: &HeaderMap,
    kserve_timeout_us: Option<u64>,
    id: Option<&str>,
    route: &Route,
) -> Result<Meta, Error> {
    read_head(
        &Head::scan(headers, (&route.rollout_key_header, &route.tenant_header)),
        kserve_timeout_us,
        id,
    )
}

/// [`read`] from a head already scanned (with the route's rollout key header).
pub fn read_head(head: &Head, kserve_timeout_us: Option<u64>, id: Option<&str>) -> Result<Meta, Error> {
    let budget = if let Some(v) = &head.budget {
        let ms = v
            .to_str()
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .ok_or_else(|| {
                Error::new(
                    Kind::BadRequest,
                    format!(
                        "{} must be a whole number of milliseconds, got {:?}",
                        headers::BUDGET,
                        String::from_utf8_lossy(v.as_bytes())
                    ),
                )
            })?;
        if ms == 0 {
            return Err(Error::new(
                Kind::Deadline,
                format!(
                    "{} is 0: no time is left for the request; send at least 1 (ms), or none for the route's default",
                    headers::BUDGET
                ),
            ));
        }
        Some((Duration::from_millis(ms), BudgetSource::Header))
    } else if let Some(v) = &head.grpc_timeout {
        let d = v.to_str().ok().and_then(grpc_timeout).ok_or_else(|| {
            Error::new(
                Kind::BadRequest,
                format!(
                    "{GRPC_TIMEOUT} must be 1 to 8 digits and a unit (H, M, S, m, u, n), got {:?}",
                    String::from_utf8_lossy(v.as_bytes())
                ),
            )
        })?;
        if d.is_zero() {
            // As gRPC servers answer a deadline that has passed.
            return Err(Error::new(
                Kind::Deadline,
                format!("{GRPC_TIMEOUT} is 0: the deadline has already passed"),
            ));
        }
        Some((d, BudgetSource::GrpcTimeout))
    } else {
        // A KServe `timeout` of 0 means none, as Triton reads it.
        kserve_timeout_us
            .filter(|&us| us > 0)
            .map(|us| (Duration::from_micros(us), BudgetSource::KserveTimeout))
    };
    // One rule for every tier: a band only the micro-batch tier uses is still checked.
    if let Some(v) = &head.priority {
        if v.to_str().ok().and_then(crate::policy::Priority::parse).is_none() {
            return Err(Error::new(
                Kind::BadRequest,
                format!(
                    "{} must be \"critical\", \"standard\" or \"sheddable\", got {:?}",
                    headers::PRIORITY,
                    String::from_utf8_lossy(v.as_bytes())
                ),
            ));
        }
    }
    let key = match head
        .rollout_key
        .as_ref()
        .map(|v| v.as_bytes())
        .or(id.map(str::as_bytes))
    {
        Some(bytes) => key_hash(bytes),
        None => UNKEYED.fetch_add(1, Ordering::Relaxed),
    };
    Ok(Meta {
        budget: budget.map(|(d, source)| (d.min(MAX_BUDGET), source)),
        prefer_async: head.prefer_async,
        key,
    })
}

pub use crate::headers::prefers_async;

/// Parses a gRPC `grpc-timeout` value: 1–8 ASCII digits and a unit.
pub fn grpc_timeout(value: &str) -> Option<Duration> {
    let (digits, unit) = value.split_at_checked(value.len().checked_sub(1)?)?;
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n * 3600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{Flags, WhenUnmet};

    fn route() -> Route {
        let flags = Flags {
            realtime: true,
            micro_batch: false,
            offline: false,
            micro_batch_percent: 100,
            shadow: false,
            cache: false,
        };
        Route::test(flags, WhenUnmet::Reject)
    }

    fn headers<K: http::header::IntoHeaderName + Clone>(pairs: &[(K, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(k.clone(), v.parse().expect("value"));
        }
        h
    }

    #[test]
    fn budget_sources_first_match_wins() {
        let r = route();
        let ms = Duration::from_millis;
        // (headers, KServe timeout in µs, budget read)
        type Case = (
            Vec<(http::HeaderName, &'static str)>,
            Option<u64>,
            Option<(Duration, BudgetSource)>,
        );
        let cases: &[Case] = &[
            (
                vec![(headers::BUDGET, "120")],
                Some(5),
                Some((ms(120), BudgetSource::Header)),
            ),
            (
                vec![(headers::BUDGET, "120"), (GRPC_TIMEOUT, "1S")],
                None,
                Some((ms(120), BudgetSource::Header)),
            ),
            (
                vec![(GRPC_TIMEOUT, "250m")],
                Some(5),
                Some((ms(250), BudgetSource::GrpcTimeout)),
            ),
            (vec![], Some(1_500_000), Some((ms(1500), BudgetSource::KserveTimeout))),
            (vec![], None, None),
            (
                vec![(headers::BUDGET, "99999999999999")],
                None,
                Some((MAX_BUDGET, BudgetSource::Header)),
            ),
        ];
        for (h, kserve, want) in cases {
            let meta = read(&headers(h), *kserve, None, &r).expect("valid");
            assert_eq!(meta.budget, *want, "{h:?} {kserve:?}");
        }
    }

    #[test]
    fn bad_budgets_say_what_to_fix() {
        let r = route();
        for (h, needle) in [
            ((headers::BUDGET, "1.5"), "whole number of milliseconds, got \"1.5\""),
            ((headers::BUDGET, "-3"), "whole number"),
            ((GRPC_TIMEOUT, "10x"), "1 to 8 digits and a unit"),
            ((GRPC_TIMEOUT, "123456789S"), "1 to 8 digits"),
        ] {
            let err = read(&headers(&[h]), None, None, &r).expect_err("invalid");
            assert_eq!(err.kind, Kind::BadRequest);
            assert!(err.message.contains(needle), "{err}");
        }
    }

    #[test]
    fn grpc_timeout_units() {
        assert_eq!(grpc_timeout("2H"), Some(Duration::from_secs(7200)));
        assert_eq!(grpc_timeout("3M"), Some(Duration::from_secs(180)));
        assert_eq!(grpc_timeout("7u"), Some(Duration::from_micros(7)));
        assert_eq!(grpc_timeout("9n"), Some(Duration::from_nanos(9)));
        for bad in ["", "S", "5", "5s", "-5S", "５S"] {
            assert_eq!(grpc_timeout(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn prefer_respond_async() {
        assert!(prefers_async(&headers(&[("prefer", "respond-async")])));
        assert!(prefers_async(&headers(&[(
            "prefer",
            "return=minimal, Respond-Async; wait=5"
        )])));
        assert!(prefers_async(&headers(&[
            ("prefer", "return=minimal"),
            ("prefer", "respond-async")
        ])));
        assert!(!prefers_async(&headers(&[("prefer", "return=minimal")])));
        assert!(!prefers_async(&headers::<&str>(&[])));
    }

    #[test]
    fn rollout_key_from_header_then_id() {
        let r = route();
        let by_header = read(&headers(&[("x-request-id", "abc")]), None, Some("zzz"), &r).expect("valid");
        let by_id = read(&headers::<&str>(&[]), None, Some("abc"), &r).expect("valid");
        assert_eq!(by_header.key, key_hash(b"abc"));
        assert_eq!(by_id.key, key_hash(b"abc"));
    }
}
