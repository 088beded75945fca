//! Tiers: where a classified request is served.
//!
//! After the doors and the classifier. Every tier is a `tower::Service<Call>` with the
//! same response and error types, boxed at this module's edge so generics stay inside.
//! [`Tiers`] is always ready and hands each call to its tier with `oneshot`; each tier
//! owns its own backpressure (real-time: limit + shed + deadline, never a queue;
//! micro-batch: a bounded queue per route, deadline-aware admission), so no tier's load
//! reaches another's callers. A tier this build does not serve answers
//! with an error that names it.

pub mod batcher;
pub mod cost;
pub mod micro_batch;
pub mod offline;
pub mod realtime;

use std::sync::Arc;

use bytes::Bytes;
use tokio::time::Instant;
use tower::util::BoxCloneSyncService;
use tower::ServiceExt;

use crate::decision::{Decision, Tier};
use crate::error::{Error, Kind};
use crate::policy::Route;

pub use micro_batch::MicroBatch;
pub use offline::Offline;
pub use realtime::Realtime;

/// One classified request on its way to a tier.
#[derive(Debug)]
pub struct Call {
    /// The route that matched, from the policy snapshot the request started with.
    pub route: Arc<Route>,
    /// The classifier's decision.
    pub decision: Decision,
    /// When the budget runs out; no work is done for this call after it.
    pub deadline: Instant,
    /// The request as the door received it (method, path, headers, whole body).
    pub request: http::Request<Bytes>,
}

/// What a tier answers: the backend's response, whole.
pub type Reply = http::Response<Bytes>;

/// A tier as the router sees it.
pub type TierService = BoxCloneSyncService<Call, Reply, Error>;

/// The tier router.
#[derive(Clone)]
pub struct Tiers {
    realtime: TierService,
    micro_batch: Option<TierService>,
    offline: Option<TierService>,
}

impl Tiers {
    /// A router with only the real-time tier; the others answer `tier_unavailable`.
    pub fn new(realtime: TierService) -> Self {
        Tiers {
            realtime,
            micro_batch: None,
            offline: None,
        }
    }

    /// The same router with `service` serving the micro-batch tier.
    pub fn with_micro_batch(mut self, service: TierService) -> Self {
        self.micro_batch = Some(service);
        self
    }

    /// The same router with `service` serving the offline tier.
    pub fn with_offline(mut self, service: TierService) -> Self {
        self.offline = Some(service);
        self
    }

    /// Serves `call` on the tier its decision names.
    pub async fn serve(&self, call: Call) -> Result<Reply, Error> {
        let tier = call.decision.tier;
        let service = match tier {
            Tier::Realtime => Some(&self.realtime),
            Tier::MicroBatch => self.micro_batch.as_ref(),
            Tier::Offline => self.offline.as_ref(),
        };
        match service {
            Some(service) => service.clone().oneshot(call).await,
            None => Err(Error::new(
                Kind::TierUnavailable,
                format!(
                    "route {} classified this request to the {} tier, which this build of tiergate does not serve yet; \
                     send a budget below {} ms for the realtime tier, or turn the {} flag off",
                    call.route.name,
                    tier.as_str(),
                    call.route.budgets.realtime_below.as_millis(),
                    tier.as_str()
                ),
            )),
        }
    }
}

impl std::fmt::Debug for Tiers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tiers")
            .field("micro_batch", &self.micro_batch.is_some())
            .field("offline", &self.offline.is_some())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tower::service_fn;

    use super::*;
    use crate::decision::{BudgetSource, Reason};
    use crate::policy::{Flags, WhenUnmet};

    fn call(tier: Tier) -> Call {
        let flags = Flags {
            realtime: true,
            micro_batch: true,
            offline: true,
            micro_batch_percent: 100,
        };
        let route = Route::test(flags, WhenUnmet::Reject);
        Call {
            route: Arc::new(route),
            decision: Decision {
                tier,
                reason: Reason::BudgetRealtime,
                budget: Duration::from_secs(1),
                source: BudgetSource::Header,
            },
            deadline: Instant::now() + Duration::from_secs(1),
            request: http::Request::new(Bytes::from_static(b"x")),
        }
    }

    #[tokio::test]
    async fn each_decision_reaches_its_tier_and_unbuilt_tiers_say_so() {
        let realtime =
            service_fn(|call: Call| async move { Ok::<_, Error>(http::Response::new(call.request.into_body())) });
        let tiers = Tiers::new(TierService::new(realtime));
        let reply = tiers.serve(call(Tier::Realtime)).await.expect("served");
        assert_eq!(reply.body().as_ref(), b"x");
        for tier in [Tier::MicroBatch, Tier::Offline] {
            let err = tiers.serve(call(tier)).await.expect_err("not built");
            assert_eq!(err.kind, Kind::TierUnavailable);
            assert!(err.message.contains(&format!("the {} tier", tier.as_str())), "{err}");
        }
    }
}
