//! What the classifier decides, and from what: the tiers, the reasons, where a budget
//! came from, what a door learned about a request, and which door that was.
//!
//! A leaf: these types name things for every module on the request path (doors,
//! classifier, tiers, metrics, admin views) and depend on nothing of the gateway's.

use std::time::Duration;

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
    /// A Kafka source's `budget` setting.
    KafkaSource,
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

/// The `x-tiergate-reason` of an answer the cache gave (no tier served it, so it has no
/// `x-tiergate-tier`); `x-tiergate-cache` says how (a hit, or a call it joined).
pub const CACHE_REASON: &str = "cache";

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
    /// A Kafka source's request: bulk work, always on the micro-batch tier.
    KafkaSource,
    /// A later step of a Triton sequence: served by the tier that served its first step
    /// (whose pool holds the endpoint with the sequence's state), whatever its budget.
    Sequence,
    /// Real-time was called for, every endpoint of its pool was ejected or the pool was
    /// full, and the route's `[fallback]` pool served it.
    Fallback,
    /// An OpenAI call's `service_tier` asked for this tier (`priority`: real time;
    /// `flex`: micro-batch), and the route's flags allow it.
    ServiceTier,
}

/// An OpenAI call's `service_tier` hint (a request extension the OpenAI door sets).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServiceTier {
    /// `priority`: real time, where the route allows it.
    Priority,
    /// `flex`: micro-batch (or offline, as the budget says), where the route allows it.
    Flex,
}

impl ServiceTier {
    /// The hint a `service_tier` value gives (`auto` and `default` give none); `Err`
    /// for a value OpenAI does not have.
    pub fn parse(value: &str) -> Result<Option<ServiceTier>, String> {
        match value {
            "auto" | "default" => Ok(None),
            "priority" => Ok(Some(ServiceTier::Priority)),
            "flex" => Ok(Some(ServiceTier::Flex)),
            other => Err(format!(
                "service_tier {other:?} is not one of auto, default, flex and priority"
            )),
        }
    }

    /// What `decision` becomes under this hint on a route with real time and micro-batch
    /// on or off (`on`): `priority` moves a micro-batch decision to real time, `flex` a
    /// real-time one to micro-batch, each only where the route has that tier on;
    /// anything else stays.
    pub fn apply(self, decision: Decision, (realtime, micro_batch): (bool, bool)) -> Decision {
        let tier = match (self, decision.tier) {
            (ServiceTier::Priority, Tier::MicroBatch) if realtime => Tier::Realtime,
            (ServiceTier::Flex, Tier::Realtime) if micro_batch => Tier::MicroBatch,
            _ => return decision,
        };
        Decision {
            tier,
            reason: Reason::ServiceTier,
            ..decision
        }
    }

    /// The `service_tier` an answer served on `tier` echoes.
    pub fn echoed(tier: Tier) -> &'static str {
        match tier {
            Tier::Realtime => "default",
            Tier::MicroBatch | Tier::Offline => "flex",
        }
    }
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
    /// Every tier, in the order of [`Tier::index`].
    pub const ALL: [Tier; 3] = [Tier::Realtime, Tier::MicroBatch, Tier::Offline];

    /// Its position in [`Tier::ALL`], for tables indexed by tier.
    pub fn index(self) -> usize {
        match self {
            Tier::Realtime => 0,
            Tier::MicroBatch => 1,
            Tier::Offline => 2,
        }
    }

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
    /// Every reason, in the order of [`Reason::index`].
    pub const ALL: [Reason; 13] = [
        Reason::BudgetRealtime,
        Reason::BudgetMicroBatch,
        Reason::BudgetOffline,
        Reason::PreferAsync,
        Reason::OfflineOff,
        Reason::MicroBatchOff,
        Reason::MicroBatchRollout,
        Reason::BestEffort,
        Reason::RealtimeOverflow,
        Reason::KafkaSource,
        Reason::Sequence,
        Reason::Fallback,
        Reason::ServiceTier,
    ];

    /// Its position in [`Reason::ALL`], for tables indexed by reason.
    pub fn index(self) -> usize {
        match self {
            Reason::BudgetRealtime => 0,
            Reason::BudgetMicroBatch => 1,
            Reason::BudgetOffline => 2,
            Reason::PreferAsync => 3,
            Reason::OfflineOff => 4,
            Reason::MicroBatchOff => 5,
            Reason::MicroBatchRollout => 6,
            Reason::BestEffort => 7,
            Reason::RealtimeOverflow => 8,
            Reason::KafkaSource => 9,
            Reason::Sequence => 10,
            Reason::Fallback => 11,
            Reason::ServiceTier => 12,
        }
    }

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
            Reason::KafkaSource => "kafka_source",
            Reason::Sequence => "sequence",
            Reason::Fallback => "fallback",
            Reason::ServiceTier => "service_tier",
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

/// The door a request came in by: what it may be answered with depends on it (an
/// offline acceptance answers later, so only over HTTP).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Door {
    /// KServe v2 over HTTP and the JSON routes (the HTTP door and the bulk HTTP door);
    /// also the door of an offline job, which came in over HTTP.
    Http,
    /// KServe v2 over gRPC (the gRPC door and the bulk gRPC door).
    Grpc,
    /// A Kafka source's topic of requests.
    Kafka,
}

impl Door {
    /// The snake_case name used in logs and metrics (`http`, `grpc`, `kafka`).
    pub fn as_str(self) -> &'static str {
        match self {
            Door::Http => "http",
            Door::Grpc => "grpc",
            Door::Kafka => "kafka",
        }
    }
}

/// FNV-1a: a stable 64-bit hash for rollout keys (the same key lands on the same side
/// of the rollout in every process and release).
pub fn key_hash(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn indexes_follow_the_lists() {
        for (i, reason) in Reason::ALL.into_iter().enumerate() {
            assert_eq!(reason.index(), i, "{reason:?}");
        }
        for (i, tier) in Tier::ALL.into_iter().enumerate() {
            assert_eq!(tier.index(), i, "{tier:?}");
        }
    }
}
