//! The door pipeline, written once. Every door (the HTTP door, the gRPC door, a Kafka
//! source) takes a request through the same steps, in this order, each for a reason:
//!
//! 0. Before it: the door authenticates the caller ([`super::auth`]) into its
//!    [`Tenant`], so nothing an unknown caller sends is read further.
//! 1. [`Dispatch::admit`]: the global limits (requests in flight, memory) and the route's
//!    rate limits, before any of the body is read or decoded: a refused request costs
//!    nothing, and a flood is shed before it is in memory.
//! 2. [`Admitted::hold`]: the request's bytes against the in-flight body budget as soon
//!    as they are known (a declared length before reading, the rest once read), so
//!    memory is bounded by the limit, not by what clients send.
//! 3. The door's own step: its protocol parsed and checked into the KServe v2 HTTP form
//!    (a 400 that names the mistake otherwise).
//! 4. [`Admitted::meta`]: what the classifier needs (budget, `Prefer: respond-async`,
//!    rollout key), from the client's headers and the parsed request's parameters.
//! 5. [`Admitted::serve`]: classified, served on its tier, counted. A door that has
//!    decided already (a Kafka source's requests are always micro-batch: bulk work never
//!    takes real-time capacity) calls [`Admitted::serve_decided`], and is counted alike.
//! 6. The door renders the answer, and only then drops the [`Admitted`]: what it holds
//!    of the global limits is released once the answer is built.

use std::future::Future;
use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderMap, Request};
use tokio::time::Instant;

use super::admission::Ticket;
use super::dispatch::{Ask, Dispatch, Served};
use super::meta;
use crate::decision::{Decision, Door, Meta};
use crate::error::Error;
use crate::policy::Route;
use crate::tenant::Tenant;
use crate::trace;

/// A request admitted on its route, holding its share of the global limits until dropped.
#[derive(Debug)]
pub struct Admitted<'a> {
    dispatch: &'a Dispatch,
    route: Arc<Route>,
    door: Door,
    ids: trace::Ids,
    /// When the door got the request: its budget starts here.
    received: Instant,
    tenant: Tenant,
    ticket: Ticket,
}

impl Dispatch {
    /// Step 1: admits `tenant`'s request on `route` that came in by `door` at
    /// `received`, with `headers` (without authentication, rate limits read the tenant
    /// from them) and `ids`; a refusal comes back already counted, for the door to
    /// render (boxed: refusals are the rare case).
    pub fn admit(
        &self,
        door: Door,
        route: Arc<Route>,
        (headers, tenant): (&HeaderMap, &Tenant),
        ids: &trace::Ids,
        received: Instant,
    ) -> Result<Admitted<'_>, Box<Served>> {
        match self.admission().admit(&route, headers, tenant) {
            Ok(ticket) => Ok(Admitted {
                dispatch: self,
                route,
                door,
                ids: ids.clone(),
                received,
                tenant: tenant.clone(),
                ticket,
            }),
            Err(e) => {
                let refused = self.failed(&route, door, e, Some(ids));
                refused.log_failure(&route.name, door, ids);
                Err(Box::new(refused))
            }
        }
    }
}

impl Admitted<'_> {
    /// The route it was admitted on.
    pub fn route(&self) -> &Arc<Route> {
        &self.route
    }

    /// Step 2: holds `bytes` of the request against the in-flight body budget, or sheds.
    pub fn hold(&mut self, bytes: usize) -> Result<(), Error> {
        self.ticket.hold(bytes)
    }

    /// Step 4: what the classifier needs, from the client's `headers` (the HTTP
    /// request's, or the gRPC call's metadata) and the KServe `timeout` parameter (µs)
    /// and request `id` the door parsed.
    pub fn meta(&self, headers: &HeaderMap, timeout_us: Option<u64>, id: Option<&str>) -> Result<Meta, Error> {
        meta::read(headers, timeout_us, id, &self.route)
    }

    /// Step 5: classifies `request` by `meta` and serves it. (The dispatch's future is
    /// returned as it is, not wrapped in one more.)
    pub fn serve(&self, mut request: Request<Bytes>, meta: Meta) -> impl Future<Output = Served> + Send + '_ {
        request.extensions_mut().insert(self.ids.clone());
        if self.tenant.is_authenticated() {
            request.extensions_mut().insert(self.tenant.clone());
        }
        self.dispatch
            .serve(&self.route, self.door, Ask::Classify(meta), request, self.received)
    }

    /// Step 5 for a door that has decided already: serves `request` as `decision` says.
    pub fn serve_decided(
        &self,
        decision: Decision,
        mut request: Request<Bytes>,
    ) -> impl Future<Output = Served> + Send + '_ {
        request.extensions_mut().insert(self.ids.clone());
        if self.tenant.is_authenticated() {
            request.extensions_mut().insert(self.tenant.clone());
        }
        self.dispatch
            .serve(&self.route, self.door, Ask::Decided(decision), request, self.received)
    }

    /// A request that failed in the door's own step (a bad body, a message too large),
    /// counted like every other.
    pub fn failed(&self, error: Error) -> Served {
        let failed = self.dispatch.failed(&self.route, self.door, error, Some(&self.ids));
        failed.log_failure(&self.route.name, self.door, &self.ids);
        failed
    }

    /// Logs `served`, this request's outcome, when it is a 5xx of the gateway's (the
    /// door calls it with what [`Admitted::serve`] gave it).
    pub fn log_failure(&self, served: &Served) {
        served.log_failure(&self.route.name, self.door, &self.ids);
    }
}
