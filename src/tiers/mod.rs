//! Tiers: where a classified request is served.
//!
//! After the doors and the classifier. Every tier is a `tower::Service<Call>` with the
//! same response and error types, boxed at this module's edge so generics stay inside.
//! [`Tiers`] is always ready and hands each call to its tier with `oneshot`; each tier
//! owns its own backpressure (real-time: limit + shed + deadline, never a queue;
//! micro-batch: a bounded queue per route, deadline-aware admission; offline: a durable
//! queue that answers at once), so no tier's load reaches another's callers.

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

use crate::decision::{Door, Tier};
use crate::error::Error;
use crate::policy::Route;
use crate::protocol::Reply;

pub use micro_batch::MicroBatch;
pub use offline::Offline;
pub use realtime::Realtime;

/// One request on its way to a tier: what the tiers use, and nothing else.
#[derive(Debug)]
pub struct Call {
    /// The route that matched, from the policy snapshot the request started with.
    pub route: Arc<Route>,
    /// The tier that serves it.
    pub tier: Tier,
    /// The door it came in by (the offline tier answers later, so only over HTTP).
    pub door: Door,
    /// When the budget runs out; no work is done for this call after it.
    pub deadline: Instant,
    /// The request as the door received it (method, path, headers, whole body).
    pub request: http::Request<Bytes>,
}

/// Whether `request` is a step of a Triton sequence: it stays with the pool and endpoint
/// holding the sequence's state (never a canary's, never mirrored).
pub(crate) fn step(request: &http::Request<Bytes>) -> bool {
    request.extensions().get::<crate::protocol::Sequence>().is_some()
}

/// A tier as the router sees it.
pub type TierService = BoxCloneSyncService<Call, Reply, Error>;

/// The tier router: one service per tier.
#[derive(Clone)]
pub struct Tiers {
    realtime: TierService,
    micro_batch: TierService,
    offline: TierService,
}

impl Tiers {
    /// A router over the three tiers.
    pub fn new(realtime: TierService, micro_batch: TierService, offline: TierService) -> Self {
        Tiers {
            realtime,
            micro_batch,
            offline,
        }
    }

    /// Serves `call` on its tier.
    pub async fn serve(&self, call: Call) -> Result<Reply, Error> {
        let service = match call.tier {
            Tier::Realtime => &self.realtime,
            Tier::MicroBatch => &self.micro_batch,
            Tier::Offline => &self.offline,
        };
        service.clone().oneshot(call).await
    }
}

impl std::fmt::Debug for Tiers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Tiers")
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tower::service_fn;

    use super::*;
    use crate::policy::{Flags, WhenUnmet};

    fn call(tier: Tier) -> Call {
        let flags = Flags {
            realtime: true,
            micro_batch: true,
            offline: true,
            micro_batch_percent: 100,
            shadow: false,
            cache: false,
        };
        Call {
            route: Arc::new(Route::test(flags, WhenUnmet::Reject)),
            tier,
            door: Door::Http,
            deadline: Instant::now() + Duration::from_secs(1),
            request: http::Request::new(Bytes::from_static(b"x")),
        }
    }

    /// A tier service that answers with its own name.
    fn named(name: &'static str) -> TierService {
        TierService::new(service_fn(move |_: Call| async move {
            Ok::<_, Error>(http::Response::new(Bytes::from_static(name.as_bytes())))
        }))
    }

    #[tokio::test]
    async fn each_call_reaches_its_tier() {
        let tiers = Tiers::new(named("realtime"), named("micro_batch"), named("offline"));
        for tier in Tier::ALL {
            let reply = tiers.serve(call(tier)).await.expect("served");
            assert_eq!(reply.body().as_ref(), tier.as_str().as_bytes());
        }
    }
}
