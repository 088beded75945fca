//! The real-time tier: one request, one backend call, on the route's real-time pool.
//!
//! Its backpressure is a limit and a deadline, never a queue: the pool sheds at its
//! concurrency limit, refuses a call whose budget is already spent, and drops the
//! backend call when the deadline passes (see [`crate::backend::Pool::forward`]).

use std::sync::Arc;
use std::time::Duration;

use crate::backend::{Pools, Role};
use crate::decision::Tier;
use crate::error::{Error, Kind};
use crate::shadow::{Primary, Shadow, Variant};

use super::Call;
use crate::protocol::Reply;

/// Whether a route's real-time pool shares a set of endpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sharing {
    /// Not known before the real-time pool's first call.
    Unknown,
    /// On other endpoints.
    Separate,
    /// On the same: its streams' first tokens so far (how many, summed microseconds).
    Shared((u64, u64)),
}

/// The real-time tier (one pointer, cheap to clone).
#[derive(Debug, Clone)]
pub struct Realtime {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    pools: Pools,
    shadow: Option<Shadow>,
}

impl Realtime {
    /// A real-time tier whose pools are built with `settings`, mirroring a share of its
    /// calls to routes' shadow candidates when `shadow` is given.
    pub fn new(settings: crate::backend::Settings, shadow: Option<Shadow>) -> Self {
        Realtime {
            inner: Arc::new(Inner {
                pools: Pools::new(Role::Tier(Tier::Realtime), settings),
                shadow,
            }),
        }
    }

    /// The routes of `policy` whose real-time pool has every endpoint ejected.
    pub fn ejected(&self, policy: &crate::policy::Policy) -> Vec<String> {
        policy
            .routes()
            .iter()
            .filter(|r| {
                r.realtime
                    .as_ref()
                    .is_some_and(|spec| self.inner.pools.all_ejected(&r.name, spec))
            })
            .map(|r| r.name.clone())
            .collect()
    }

    /// `route`'s real-time pool's endpoints not ejected now (`spec` is its pool).
    pub fn healthy(&self, route: &str, spec: &crate::policy::PoolSpec) -> usize {
        self.inner.pools.healthy(route, spec)
    }

    /// `route`'s real-time pool's endpoints now (`spec` is its pool); `None` before
    /// its first call.
    pub fn endpoints_now(
        &self,
        route: &str,
        spec: &crate::policy::PoolSpec,
    ) -> Option<Vec<crate::backend::EndpointView>> {
        self.inner.pools.endpoints_now(route, spec)
    }

    /// Whether `route`'s real-time pool is on exactly `endpoints` (in any order) and, if
    /// so, its streams' first tokens so far (how many, and their times summed in
    /// microseconds).
    pub fn first_tokens_on(&self, route: &str, endpoints: &[http::Uri]) -> Sharing {
        let Some((spec, pool)) = self.inner.pools.find(route) else {
            return Sharing::Unknown;
        };
        let same = spec.endpoints.len() == endpoints.len() && spec.endpoints.iter().all(|e| endpoints.contains(e));
        match same {
            true => Sharing::Shared(pool.first_tokens()),
            false => Sharing::Separate,
        }
    }

    /// Whether `route`'s real-time pool has no call in flight (offline work may borrow it).
    pub fn idle(&self, route: &crate::policy::Route) -> bool {
        route
            .realtime
            .as_ref()
            .is_some_and(|spec| self.inner.pools.get(&route.name, spec).in_flight() == 0)
    }
}

impl Realtime {
    /// Serves `call` on the route's real-time pool. A route with its shadow on may serve
    /// a canary's share from its candidate, or mirror the call to it after the primary
    /// answers; that path is boxed, so a call of a route without one keeps the plain
    /// future. Admission happens in the pool: a full pool sheds its own callers at once.
    pub async fn serve(&self, call: Call) -> Result<Reply, Error> {
        match self.shadow_of(&call) {
            // A sequence's steps stay on the primary (it holds their state) and are
            // never mirrored (the candidate would see a sequence with steps missing).
            Some(shadow) if !super::step(&call.request) => Box::pin(self.shadowed(shadow, call)).await,
            // Boxed: the door boxes a request's whole future, and a box is copied whole
            // when made, so the pool's future (the exchange with the backend) is kept
            // out of it (measured: docs/performance-history.md).
            _ => {
                let pool = pool(&self.inner.pools, &call)?;
                Box::pin(async move { pool.forward_marked(call.request, call.deadline, call.stream).await }).await
            }
        }
    }

    /// [`Realtime::serve`] for a call its caller may send elsewhere when the pool is
    /// full (or, on a route with a fallback pool, when its every endpoint is ejected):
    /// such a call comes back untouched beside the refusal, so no copy is made before. (A route with its shadow on keeps one: its
    /// call may be served by either pool.)
    pub async fn serve_or_back(&self, call: Call) -> Result<Reply, (Error, Option<Call>)> {
        let fallback = call.route.fallback.is_some();
        if self.shadow_of(&call).is_some() {
            let spare = Call {
                request: crate::backend::copy(&call.request),
                route: call.route.clone(),
                ..call
            };
            return match self.serve(call).await {
                Err(e) if e.kind == Kind::Shed || (fallback && e.kind == Kind::Unavailable) => Err((e, Some(spare))),
                answer => answer.map_err(|e| (e, None)),
            };
        }
        let pool = pool(&self.inner.pools, &call).map_err(|e| (e, None))?;
        if let Some(ejected) = pool.ejected().filter(|_| fallback) {
            return Err((ejected, Some(call)));
        }
        Box::pin(async move {
            let stream = call.stream;
            let now = pool.in_time_for(call.deadline, stream).map_err(|e| (e, None))?;
            let slot = match pool.slot() {
                Ok(slot) => slot,
                Err(e) => return Err((e, Some(call))),
            };
            pool.send_in(slot, call.request, (call.deadline, now), stream)
                .await
                .map_err(|e| (e, None))
        })
        .await
    }

    /// The shadow, when `call`'s route has its shadow on for the call's tier (a stream
    /// is neither mirrored nor served by a canary: it has no whole answer to compare).
    fn shadow_of(&self, call: &Call) -> Option<&Shadow> {
        self.inner
            .shadow
            .as_ref()
            .filter(|_| Shadow::on(&call.route, call.tier).is_some() && !call.stream)
    }

    /// A call of a route with its shadow on: the canary's variant when it runs one, and
    /// a copy for the shadow when its share takes the call.
    async fn shadowed(&self, shadow: &Shadow, call: Call) -> Result<Reply, Error> {
        // A route running a canary: the call is served by the variant its key falls to,
        // and counted. The candidate's failures (refused before sending: every endpoint
        // ejected, no slot, too slow for the budget left; or an error or 5xx answer) are
        // counted as its own and the call is served by the primary, so no caller sees them.
        let mut canary = Shadow::variant(&call.route, Tier::Realtime, &call.request);
        let mut call = call;
        if let Some((spec, Variant::Candidate)) = &canary {
            let route = &call.route.name;
            let key = (Tier::Realtime, Variant::Candidate);
            match shadow.candidate(route, spec).would_refuse(call.deadline) {
                Some(refused) => shadow.counted(route, spec, key, &Err(refused), Duration::ZERO),
                None => {
                    let spare = crate::backend::copy(&call.request);
                    let started = tokio::time::Instant::now();
                    let answer = shadow.serve(route, spec, call.request, call.deadline).await;
                    shadow.counted(route, spec, key, &answer, started.elapsed());
                    if answer.as_ref().is_ok_and(|a| !a.status().is_server_error()) {
                        return answer;
                    }
                    call.request = spare;
                }
            }
            canary = None;
        }
        // The primary serves it, with a copy for the shadow when its share takes the call.
        let mirror = Shadow::wants(&call.route, call.tier, &call.request).cloned();
        let mirror = mirror.map(|spec| (spec, crate::backend::copy(&call.request)));
        let pool = pool(&self.inner.pools, &call)?;
        // Timed only for a canary's counts or a shadow's comparison.
        let started = (canary.is_some() || mirror.is_some()).then(tokio::time::Instant::now);
        let answer = pool.forward(call.request, call.deadline).await;
        let took = started.map_or(Duration::ZERO, |s| s.elapsed());
        if let Some((spec, _)) = canary {
            shadow.counted(
                &call.route.name,
                &spec,
                (Tier::Realtime, Variant::Primary),
                &answer,
                took,
            );
        }
        if let (Some((spec, copy)), Ok(primary), Some(pool_spec)) = (mirror, &answer, call.route.realtime.as_ref()) {
            let primary = Primary {
                answer: primary,
                took,
                pool: pool_spec,
            };
            shadow.mirror(&call.route.name, spec, Tier::Realtime, copy, primary);
        }
        answer
    }
}

/// The route's real-time pool.
fn pool(pools: &Pools, call: &Call) -> Result<Arc<crate::backend::Pool>, Error> {
    match call.route.realtime.as_ref() {
        Some(spec) => Ok(pools.get(&call.route.name, spec)),
        None => Err(Error::new(
            Kind::NoTier,
            format!("route {} has no realtime pool", call.route.name),
        )),
    }
}
