//! Classification: (route policy, flags, request metadata) → decision.
//!
//! The step between the doors and the tiers. [`classify`] is a pure function: it reads
//! the route and what the door learned about the request ([`Meta`]), and returns the
//! [`Decision`] (tier + reason) or a [`Refusal`]. The decision table it implements is
//! in the README; the table test below covers every row.

use std::time::Duration;

use crate::policy::{Route, WhenUnmet};

/// The three tiers, in the words used everywhere (headers, metrics, config).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Tier {
    /// One request, one backend call, on the real-time pool.
    Realtime,
    /// Coalesced with other callers' requests into one batch on the batch pool.
    MicroBatch,
    /// Accepted into the durable queue and drained later.
    Offline,
}

/// Where the budget of a request came from, first match wins.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BudgetSource {
    /// The `x-tiergate-budget-ms` header.
    Header,
    /// The gRPC deadline (`grpc-timeout`).
    GrpcTimeout,
    /// The KServe `timeout` request parameter (µs).
    KserveTimeout,
    /// The route's `default_budget`.
    RouteDefault,
}

/// What the door learned about a request, the classifier's only input besides policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Meta {
    /// The budget the client gave, if any, and where it came from.
    pub budget: Option<(Duration, BudgetSource)>,
    /// The client sent `Prefer: respond-async`.
    pub prefer_async: bool,
    /// A stable hash of the request key, for the deterministic micro-batch rollout.
    pub key: u64,
}

/// Why a request went to its tier; the value of `x-tiergate-reason`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    /// The budget is below `realtime_below`.
    BudgetRealtime,
    /// The budget is between `realtime_below` and `offline_from`.
    BudgetMicroBatch,
    /// The budget is at or above `offline_from`.
    BudgetOffline,
    /// The client asked for `Prefer: respond-async`.
    PreferAsync,
    /// Offline was called for but is off; served by the next tier that can.
    OfflineOff,
    /// Micro-batch was called for but is off; served on the real-time tier.
    MicroBatchOff,
    /// Micro-batch was called for but this request is outside the rollout percent.
    MicroBatchRollout,
    /// Real-time was called for but is off; `when_unmet = "best_effort"` sent it to micro-batch.
    BestEffort,
    /// Real-time was called for, its pool was full, and the route lets the overflow be
    /// served by the micro-batch tier (`borrow.realtime_overflow`) within the budget.
    RealtimeOverflow,
}

/// The classifier's answer for one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    /// The tier that serves it.
    pub tier: Tier,
    /// Why.
    pub reason: Reason,
    /// The budget in force.
    pub budget: Duration,
    /// Where the budget came from.
    pub source: BudgetSource,
}

/// Why no tier serves a request (answered 503).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Every tier of the route is off.
    RouteDisabled,
    /// The tier the budget calls for is off and no enabled tier can meet the budget.
    NoTier {
        /// The tier the budget called for.
        wanted: Tier,
        /// The budget that could not be met.
        budget: Duration,
    },
}

impl Tier {
    /// The snake_case name used in headers, metrics and config.
    pub fn as_str(self) -> &'static str {
        match self {
            Tier::Realtime => "realtime",
            Tier::MicroBatch => "micro_batch",
            Tier::Offline => "offline",
        }
    }
}

impl Reason {
    /// The snake_case value of `x-tiergate-reason`.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::BudgetRealtime => "budget_realtime",
            Reason::BudgetMicroBatch => "budget_micro_batch",
            Reason::BudgetOffline => "budget_offline",
            Reason::PreferAsync => "prefer_async",
            Reason::OfflineOff => "offline_off",
            Reason::MicroBatchOff => "micro_batch_off",
            Reason::MicroBatchRollout => "micro_batch_rollout",
            Reason::BestEffort => "best_effort",
            Reason::RealtimeOverflow => "realtime_overflow",
        }
    }
}

impl Refusal {
    /// The snake_case value of `x-tiergate-reason` on the refusal.
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::RouteDisabled => "route_disabled",
            Refusal::NoTier { .. } => "no_tier",
        }
    }
}

/// Decides the tier for one request on `route`.
///
/// The budget band picks the tier the request calls for; a tier that is off hands the
/// request to the next one that can still meet the budget (offline → micro-batch →
/// real-time); real-time can meet every budget, micro-batch any from `realtime_below`
/// up. When the band's tier is real-time and it is off, `when_unmet` decides.
pub fn classify(route: &Route, meta: &Meta) -> Result<Decision, Refusal> {
    let flags = route.flags;
    if !(flags.realtime || flags.micro_batch || flags.offline) {
        return Err(Refusal::RouteDisabled);
    }
    let (budget, source) = meta
        .budget
        .unwrap_or((route.budgets.default, BudgetSource::RouteDefault));
    let decide = |tier, reason| {
        Ok(Decision {
            tier,
            reason,
            budget,
            source,
        })
    };
    let in_rollout = meta.key % 100 < u64::from(flags.micro_batch_percent);
    let wants_offline = meta.prefer_async || budget >= route.budgets.offline_from;
    let mut reason = None;
    if wants_offline {
        if flags.offline {
            let why = if meta.prefer_async {
                Reason::PreferAsync
            } else {
                Reason::BudgetOffline
            };
            return decide(Tier::Offline, why);
        }
        reason = Some(Reason::OfflineOff);
    }
    if budget >= route.budgets.realtime_below {
        // With real-time off, the rollout has nowhere else to send the request.
        if flags.micro_batch && (in_rollout || !flags.realtime) {
            return decide(Tier::MicroBatch, reason.unwrap_or(Reason::BudgetMicroBatch));
        }
        if flags.realtime {
            let why = if flags.micro_batch {
                Reason::MicroBatchRollout
            } else {
                Reason::MicroBatchOff
            };
            return decide(Tier::Realtime, reason.unwrap_or(why));
        }
        return Err(Refusal::NoTier {
            wanted: Tier::MicroBatch,
            budget,
        });
    }
    if flags.realtime {
        return decide(Tier::Realtime, reason.unwrap_or(Reason::BudgetRealtime));
    }
    if route.when_unmet == WhenUnmet::BestEffort && flags.micro_batch {
        return decide(Tier::MicroBatch, Reason::BestEffort);
    }
    Err(Refusal::NoTier {
        wanted: Tier::Realtime,
        budget,
    })
}

/// FNV-1a: a stable 64-bit hash for rollout keys (the same key lands on the same side
/// of the rollout in every process and release).
pub fn key_hash(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests;
