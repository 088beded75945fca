//! A canary: a share of a route's real-time and micro-batch calls served by its shadow
//! candidate itself (by rollout key), each variant counted per tier, and an optional
//! automatic abort that sets the
//! share back to 0% through the control plane (validated, versioned and audited like any
//! change) when the candidate's error rate or latency is worse than the primary's by more
//! than the route allows.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use dashmap::DashMap;

use crate::control::{Control, Edit};
use crate::decision::Tier;
use crate::metrics;
use crate::policy::{Abort, ShadowSpec};

/// Which model served a canary route's call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variant {
    /// The route's own pool.
    Primary,
    /// The shadow candidate.
    Candidate,
}

impl Variant {
    /// Its name in metrics and `x-tiergate-variant`.
    pub fn as_str(self) -> &'static str {
        match self {
            Variant::Primary => "primary",
            Variant::Candidate => "candidate",
        }
    }
}

/// Every route's canary tallies (one per tier: a tier's variants are judged against each
/// other), and the control plane an abort goes through.
#[derive(Debug, Default)]
pub(super) struct Canaries {
    tallies: DashMap<(String, Tier), Arc<Mutex<Tally>>>,
    control: Option<Arc<Control>>,
}

/// One route's calls since its canary share was last set.
#[derive(Debug, Default)]
struct Tally {
    percent: u8,
    sides: [Side; 2],
    aborted: bool,
}

#[derive(Debug, Default, Clone, Copy)]
struct Side {
    requests: u64,
    errors: u64,
    seconds: f64,
}

impl Side {
    fn error_rate(&self) -> f64 {
        self.errors as f64 / self.requests.max(1) as f64
    }

    fn mean(&self) -> f64 {
        self.seconds / self.requests.max(1) as f64
    }
}

impl Canaries {
    /// Canaries whose aborts go through `control` (none without one).
    pub(super) fn new(control: Option<Arc<Control>>) -> Self {
        Canaries {
            tallies: DashMap::new(),
            control,
        }
    }

    /// Counts one `tier` call of `route` served by `variant`, and aborts the canary when
    /// its abort rule says so.
    pub(super) fn count(
        &self,
        route: &str,
        spec: &ShadowSpec,
        (tier, variant): (Tier, Variant),
        ok: bool,
        took: Duration,
    ) {
        let labels = |result: &'static str| {
            [
                ("route", route.to_owned()),
                ("tier", tier.as_str().to_owned()),
                ("variant", variant.as_str().to_owned()),
                ("result", result.to_owned()),
            ]
        };
        ::metrics::counter!(metrics::CANARY_REQUESTS, &labels(if ok { "ok" } else { "error" })).increment(1);
        ::metrics::histogram!(metrics::CANARY_SECONDS, "route" => route.to_owned(), "tier" => tier.as_str(), "variant" => variant.as_str())
            .record(took.as_secs_f64());
        let tally = self.tallies.entry((route.to_owned(), tier)).or_default().clone();
        let mut tally = tally.lock().unwrap_or_else(|e| e.into_inner());
        if tally.percent != spec.canary_percent {
            // A new share: judged afresh.
            *tally = Tally {
                percent: spec.canary_percent,
                ..Tally::default()
            };
        }
        let side = &mut tally.sides[variant as usize];
        side.requests += 1;
        side.errors += u64::from(!ok);
        side.seconds += took.as_secs_f64();
        let Some(rule) = spec.abort.filter(|_| !tally.aborted) else {
            return;
        };
        if let Some(why) = judged(rule, tally.sides[0], tally.sides[1]) {
            tally.aborted = true;
            self.abort(route, why);
        }
    }

    /// Sets `route`'s canary to 0% through the control plane, on a blocking thread.
    fn abort(&self, route: &str, why: String) {
        tracing::warn!(route, why, "canary aborted: the candidate's share is set to 0%");
        ::metrics::counter!(metrics::CANARY_ABORTS, "route" => route.to_owned()).increment(1);
        let Some(control) = self.control.clone() else {
            return;
        };
        let edit = Edit::CanaryAbort {
            name: route.to_owned(),
            patch: serde_json::json!({"shadow": {"canary_percent": 0}}),
        };
        let route = route.to_owned();
        tokio::task::spawn_blocking(move || {
            if let Err(refused) = control.change(&edit, None, "canary abort", false) {
                tracing::error!(route, ?refused, "the canary abort could not change the policy");
            }
        });
    }
}

/// Why the candidate fails `rule` against the primary, once it has served enough calls.
fn judged(rule: Abort, primary: Side, candidate: Side) -> Option<String> {
    if candidate.requests < rule.min_requests {
        return None;
    }
    let (p, c) = (primary.error_rate(), candidate.error_rate());
    if c - p > rule.max_error_rate_margin {
        return Some(format!(
            "error rate {c:.3} against the primary's {p:.3} over {} calls, more than {} above it",
            candidate.requests, rule.max_error_rate_margin
        ));
    }
    if primary.requests > 0 && candidate.mean() > rule.max_latency_ratio * primary.mean() {
        return Some(format!(
            "mean latency {:.1} ms against the primary's {:.1} ms, more than {} times it",
            candidate.mean() * 1e3,
            primary.mean() * 1e3,
            rule.max_latency_ratio
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_candidate_is_judged_once_it_served_enough_calls() {
        let rule = Abort {
            min_requests: 10,
            max_error_rate_margin: 0.05,
            max_latency_ratio: 2.0,
        };
        let side = |requests, errors, ms: f64| Side {
            requests,
            errors,
            seconds: requests as f64 * ms / 1e3,
        };
        assert_eq!(
            judged(rule, side(100, 0, 1.0), side(9, 9, 1.0)),
            None,
            "too few calls yet"
        );
        assert!(judged(rule, side(100, 1, 1.0), side(10, 2, 1.0)).is_some_and(|w| w.contains("error rate")));
        assert_eq!(
            judged(rule, side(100, 1, 1.0), side(20, 1, 1.9)),
            None,
            "within both margins"
        );
        assert!(judged(rule, side(100, 0, 1.0), side(20, 0, 2.5)).is_some_and(|w| w.contains("latency")));
    }
}
