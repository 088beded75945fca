//! The real-time tier: one request, one backend call, on the route's real-time pool.
//!
//! Its backpressure is a limit and a deadline, never a queue: the pool sheds at its
//! concurrency limit, refuses a call whose budget is already spent, and drops the
//! backend call when the deadline passes (see [`crate::backend::Pool::forward`]).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use crate::backend::{Pools, Role};
use crate::decision::Tier;
use crate::error::{Error, Kind};
use crate::shadow::{Primary, Shadow, Variant};

use super::Call;
use crate::protocol::Reply;

/// The real-time tier service (one pointer: the service is cloned for every call).
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

    /// Whether `route`'s real-time pool has no call in flight (offline work may borrow it).
    pub fn idle(&self, route: &crate::policy::Route) -> bool {
        route
            .realtime
            .as_ref()
            .is_some_and(|spec| self.inner.pools.get(&route.name, spec).in_flight() == 0)
    }
}

impl tower::Service<Call> for Realtime {
    type Response = Reply;
    type Error = Error;
    type Future = Pin<Box<dyn Future<Output = Result<Reply, Error>> + Send>>;

    /// Always ready: admission happens per call, in the pool, so a full pool sheds
    /// its own callers and never stalls the router.
    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, call: Call) -> Self::Future {
        let inner = self.inner.clone();
        // A call of a route whose shadow is off keeps the plain future.
        let Some(shadow) = inner
            .shadow
            .as_ref()
            .filter(|_| Shadow::on(&call.route, call.tier).is_some())
            .cloned()
        else {
            return plain(inner, call);
        };
        // A sequence's steps stay on the primary (it holds their state) and are never
        // mirrored (the candidate would see a sequence with steps missing).
        if super::step(&call.request) {
            return plain(inner, call);
        }
        // A route running a canary: the call is served by the variant its key falls to,
        // and counted.
        let canary = Shadow::variant(&call.route, Tier::Realtime, &call.request);
        if let Some((spec, Variant::Candidate)) = canary {
            return Box::pin(async move {
                let started = tokio::time::Instant::now();
                let answer = shadow.serve(&call.route.name, &spec, call.request, call.deadline).await;
                let took = started.elapsed();
                shadow.counted(
                    &call.route.name,
                    &spec,
                    (Tier::Realtime, Variant::Candidate),
                    &answer,
                    took,
                );
                answer
            });
        }
        // The primary serves it, with a copy for the shadow when its share takes the call.
        let mirror = Shadow::wants(&call.route, call.tier, &call.request).cloned();
        if canary.is_none() && mirror.is_none() {
            return plain(inner, call);
        }
        let mirror = mirror.map(|spec| (spec, crate::backend::copy(&call.request)));
        Box::pin(async move {
            let pool = pool(&inner.pools, &call)?;
            let started = tokio::time::Instant::now();
            let answer = pool.forward(call.request, call.deadline).await;
            let took = started.elapsed();
            if let Some((spec, _)) = canary {
                shadow.counted(
                    &call.route.name,
                    &spec,
                    (Tier::Realtime, Variant::Primary),
                    &answer,
                    took,
                );
            }
            if let (Some((spec, copy)), Ok(primary), Some(pool_spec)) = (mirror, &answer, call.route.realtime.as_ref())
            {
                let primary = Primary {
                    answer: primary,
                    took,
                    pool: pool_spec,
                };
                shadow.mirror(&call.route.name, spec, Tier::Realtime, copy, primary);
            }
            answer
        })
    }
}

/// A call served on the route's real-time pool and nowhere else (inlined: the plain
/// path's future is built where it was before there were shadows).
#[inline(always)]
fn plain(inner: Arc<Inner>, call: Call) -> <Realtime as tower::Service<Call>>::Future {
    Box::pin(async move { pool(&inner.pools, &call)?.forward(call.request, call.deadline).await })
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
