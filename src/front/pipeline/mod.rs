//! The door pipeline, written once. Every door (the HTTP door, the gRPC door, a Kafka
//! source) takes a request through the same steps, in this order, each for a reason:
//!
//! 0. Before it: the door authenticates the caller ([`crate::front::auth`]) into its
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

pub mod admission;
mod cached;
pub mod dispatch;
mod meters;

use admission::Ticket;
use dispatch::{Ask, Dispatch, Served};

use crate::decision::{Decision, Door, Meta};
use crate::error::Error;
use crate::front::meta;
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
    /// The tenant header's value, once the door's step 4 has read the head (`None`
    /// before).
    claimed: Option<Option<http::HeaderValue>>,
    ticket: Ticket,
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
    pub fn meta(&mut self, headers: &HeaderMap, timeout_us: Option<u64>, id: Option<&str>) -> Result<Meta, Error> {
        let route = &self.route;
        self.meta_of(
            &crate::headers::Head::scan(headers, (&route.rollout_key_header, &route.tenant_header)),
            timeout_us,
            id,
        )
    }

    /// Step 4 from a head the door has scanned already (with the route's rollout key
    /// and tenant headers); the claimed tenant is kept for the usage ledger.
    pub fn meta_of(
        &mut self,
        head: &crate::headers::Head,
        timeout_us: Option<u64>,
        id: Option<&str>,
    ) -> Result<Meta, Error> {
        self.claimed = Some(head.tenant.clone());
        meta::read_head(head, timeout_us, id)
    }

    /// Step 5: classifies `request` by `meta` and serves it.
    pub fn serve(&self, request: Request<Bytes>, meta: Meta) -> impl Future<Output = Served> + Send + '_ {
        self.serve_as(Ask::Classify(meta), request)
    }

    /// Step 5 for a door that has decided already: serves `request` as `decision` says.
    pub fn serve_decided(
        &self,
        decision: Decision,
        request: Request<Bytes>,
    ) -> impl Future<Output = Served> + Send + '_ {
        self.serve_as(Ask::Decided(decision), request)
    }

    /// Serves `request` as `to` asks: through the route's cache when it has one on (a
    /// hit needs no tier), else on the tier the dispatch chooses.
    async fn serve_as(&self, to: Ask, mut request: Request<Bytes>) -> Served {
        request.extensions_mut().insert(self.ids.clone());
        let (route, door, received) = (&self.route, self.door, self.received);
        // Whose the usage is: its credential's tenant, else the tenant header the door
        // read with the head (looked up here for a door that read none).
        let whose = match &self.claimed {
            Some(claim) => crate::usage::Whose::new(self.tenant.clone(), claim.as_ref()),
            None => crate::usage::Whose::new(self.tenant.clone(), request.headers().get(&route.tenant_header)),
        };
        if self.tenant.is_authenticated() {
            request.extensions_mut().insert(self.tenant.clone());
        }
        // A stream is never kept nor shared: each caller reads its own as it comes.
        let cached = route.flags.cache && !crate::backend::stream::wanted(&request);
        match route.cache.as_ref().filter(|_| cached) {
            Some(spec) => {
                cached::serve(
                    self.dispatch,
                    route,
                    door,
                    (to, whose),
                    request,
                    (received, spec.clone()),
                )
                .await
            }
            None => self.dispatch.serve(route, door, (to, whose), request, received).await,
        }
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
