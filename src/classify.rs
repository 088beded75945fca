//! Classification: (route policy, flags, request metadata) → decision.
//!
//! The step between the doors and the tiers. [`classify`] is a pure function: it reads
//! the route and what the door learned about the request ([`Meta`]), and returns the
//! [`Decision`] (tier + reason) or a [`Refusal`], types of the leaf [`crate::decision`]. The decision table it implements is
//! in the README; the table test below covers every row.

use crate::decision::{BudgetSource, Decision, Meta, Reason, Refusal, Tier};
use crate::policy::{Route, WhenUnmet};

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

#[cfg(test)]
mod tests;
