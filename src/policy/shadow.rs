//! `[routes.NAME.shadow]`: the candidate model's pool and how its answers are compared.

use std::sync::Arc;
use std::time::Duration;

use super::file::{ShadowFile, ShadowTierFile};
use super::model::{Abort, Gate, PoolSpec, ShadowSpec, Tolerance};
use super::problems::Check;

/// How long a shadow call may take unless the policy says.
const BUDGET: Duration = Duration::from_secs(5);
/// Shadow calls in flight before more are dropped, unless the policy says.
pub(super) const MAX_CONCURRENCY: u32 = 16;

/// The validated shadow table at `at`, around its `candidate` pool (validated as every
/// pool is); `None`, reported, when the table has no candidate.
pub(super) fn spec(
    check: &mut Check<'_>,
    at: &str,
    file: &ShadowFile,
    candidate: Option<PoolSpec>,
) -> Option<ShadowSpec> {
    if candidate.is_none() {
        check.fail(
            format!("{at}.candidate"),
            "is missing: add a candidate table with endpoints = [...] (the model to compare)",
        );
    }
    let mut percent = |key: &str, value: Option<i64>, default: u8| match value {
        None => default,
        Some(p) => u8::try_from(p).ok().filter(|p| *p <= 100).unwrap_or_else(|| {
            check.fail(format!("{at}.{key}"), format!("must be 0 to 100, got {p}"));
            default
        }),
    };
    let (percent, canary_percent) = (
        percent("percent", file.percent, 100),
        percent("canary_percent", file.canary_percent, 0),
    );
    let tiers = file
        .tiers
        .clone()
        .unwrap_or_else(|| vec![ShadowTierFile::Realtime, ShadowTierFile::MicroBatch]);
    if tiers.is_empty() {
        check.fail(
            format!("{at}.tiers"),
            "is empty: name \"realtime\", \"micro_batch\" or both",
        );
    }
    let budget = file.budget.unwrap_or(BUDGET);
    if budget.is_zero() || budget > Duration::from_secs(60) {
        check.fail(format!("{at}.budget"), "must be more than 0ms and at most 60s");
    }
    let mut tolerance = |key: &str, value: Option<f64>, default: f64| match value {
        Some(v) if !(v.is_finite() && v >= 0.0) => {
            check.fail(format!("{at}.{key}"), format!("must be 0 or more, got {v}"));
            default
        }
        Some(v) => v,
        None => default,
    };
    let tolerance = Tolerance {
        atol: tolerance("atol", file.atol, 1e-5),
        rtol: tolerance("rtol", file.rtol, 1e-3),
    };
    let top_k = check.nonzero(format!("{at}.top_k"), file.top_k, 5).get();
    let gate = file.gate.as_ref();
    let min_compared = gate.and_then(|g| g.min_compared).unwrap_or(1000);
    let min_compared = u64::try_from(min_compared).unwrap_or_else(|_| {
        check.fail(
            format!("{at}.gate.min_compared"),
            format!("must be 0 or more, got {min_compared}"),
        );
        0
    });
    let min_agreement = gate.and_then(|g| g.min_agreement).unwrap_or(0.99);
    if !(0.0..=1.0).contains(&min_agreement) {
        check.fail(
            format!("{at}.gate.min_agreement"),
            format!("must be 0 to 1, got {min_agreement}"),
        );
    }
    let abort = file.abort.as_ref().map(|a| abort(check, &format!("{at}.abort"), a));
    Some(ShadowSpec {
        candidate: Arc::new(candidate?),
        percent,
        realtime: tiers.contains(&ShadowTierFile::Realtime),
        micro_batch: tiers.contains(&ShadowTierFile::MicroBatch),
        budget,
        tolerance,
        top_k,
        noise_floor: file.noise_floor.unwrap_or(false),
        gate: Gate {
            min_compared,
            min_agreement,
        },
        canary_percent,
        abort,
    })
}

/// The validated abort table at `at`.
fn abort(check: &mut Check<'_>, at: &str, file: &super::file::AbortFile) -> Abort {
    let min_requests = file.min_requests.unwrap_or(100);
    let min_requests = u64::try_from(min_requests).ok().filter(|n| *n > 0).unwrap_or_else(|| {
        check.fail(
            format!("{at}.min_requests"),
            format!("must be 1 or more, got {min_requests}"),
        );
        100
    });
    let margin = file.max_error_rate_margin.unwrap_or(0.05);
    if !(0.0..=1.0).contains(&margin) {
        check.fail(
            format!("{at}.max_error_rate_margin"),
            format!("must be 0 to 1, got {margin}"),
        );
    }
    let ratio = file.max_latency_ratio.unwrap_or(2.0);
    if !(ratio.is_finite() && ratio >= 1.0) {
        check.fail(
            format!("{at}.max_latency_ratio"),
            format!("must be 1 or more, got {ratio}"),
        );
    }
    Abort {
        min_requests,
        max_error_rate_margin: margin,
        max_latency_ratio: ratio,
    }
}
