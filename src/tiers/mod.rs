//! Tiers: where a classified request is served.
//!
//! After the doors and the classifier. Every tier takes the same [`Call`] and gives the
//! same answer ([`Reply`] or [`Error`]); [`Tiers`] holds the three and calls the one the
//! decision names directly (no boxed service cloned per call: nothing sits between the
//! dispatch and a tier). Each tier owns its own backpressure (real-time: limit + shed +
//! deadline, never a queue; micro-batch: a bounded queue per route, deadline-aware
//! admission; offline: a durable queue that answers at once), so no tier's load reaches
//! another's callers.

pub mod batcher;
pub mod cost;
pub mod micro_batch;
pub mod offline;
pub mod realtime;

use std::sync::Arc;

use bytes::Bytes;
use tokio::time::Instant;

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
    /// Whether its caller asked for a stream (its request carries
    /// [`crate::backend::stream::Wanted`]), read once by the dispatch.
    pub stream: bool,
}

/// Whether `request` is a step of a Triton sequence: it stays with the pool and endpoint
/// holding the sequence's state (never a canary's, never mirrored).
pub(crate) fn step(request: &http::Request<Bytes>) -> bool {
    request.extensions().get::<crate::protocol::Sequence>().is_some()
}

/// The three tiers, each called directly.
#[derive(Clone)]
pub struct Tiers {
    realtime: Realtime,
    micro_batch: MicroBatch,
    offline: Offline,
}

impl Tiers {
    /// The three tiers.
    pub fn new(realtime: Realtime, micro_batch: MicroBatch, offline: Offline) -> Self {
        Tiers {
            realtime,
            micro_batch,
            offline,
        }
    }

    /// Serves `call` on its tier. The real-time tier's future is held in place; the
    /// other two are boxed, so a real-time request's future (boxed whole by the door,
    /// which copies it) is not as large as the largest tier's.
    pub async fn serve(&self, call: Call) -> Result<Reply, Error> {
        match call.tier {
            Tier::Realtime => self.realtime.serve(call).await,
            Tier::MicroBatch => Box::pin(self.micro_batch.serve(call)).await,
            Tier::Offline => Box::pin(self.offline.serve(call)).await,
        }
    }

    /// Serves a real-time `call` that may go elsewhere when the real-time pool is full:
    /// shed for want of a slot, it comes back untouched ([`Realtime::serve_or_back`]).
    pub async fn realtime_or_back(&self, call: Call) -> Result<Reply, (Error, Option<Call>)> {
        self.realtime.serve_or_back(call).await
    }
}

impl std::fmt::Debug for Tiers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Tiers")
    }
}
