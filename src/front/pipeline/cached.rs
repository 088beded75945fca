//! The pipeline's step 5 on a route with its cache on: the request's key, a kept
//! answer when there is one (no tier chosen), else a call already in flight for the same
//! key to join, else the tiers as usual, whose success is kept and shared. Every answer
//! says how the cache took part in `x-tiergate-cache`.
//!
//! A request's `Cache-Control: no-store` keeps it away from the cache (`bypass`);
//! `no-cache` (or `max-age=0`) has it answered afresh, and the fresh answer kept.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderValue, Request};
use tokio::time::Instant;

use super::dispatch::{Ask, Dispatch, Served};
use crate::cache::{self, entry, key, Entry, Joined};
use crate::decision::Door;
use crate::error::{Error, Kind};
use crate::headers;
use crate::policy::{CacheSpec, Route};
use crate::timing::Spent;
use crate::usage::Saved;

/// Serves `request` on `route` through the route's cache (see the module's docs).
pub(super) fn serve<'a>(
    dispatch: &'a Dispatch,
    route: &'a Arc<Route>,
    door: Door,
    (to, whose): (Ask, crate::usage::Whose),
    request: Request<Bytes>,
    (received, spec): (Instant, Arc<CacheSpec>),
) -> Pin<Box<dyn Future<Output = Served> + Send + 'a>> {
    Box::pin(async move {
        let looked = Instant::now();
        let store = dispatch.cache().route(&route.name, &spec);
        let Some((key, question)) = cache::asked(route, &spec, &request) else {
            store.counted("bypass");
            let served = dispatch.serve(route, door, (to, whose), request, received).await;
            return marked(served, "bypass", std::time::Duration::ZERO);
        };
        if !entry::wants_fresh(request.headers()) {
            if let Some((entry, precomputed)) = store.get(&key) {
                store.counted("hit");
                dispatch.charge_saved(route, &whose, kept(precomputed));
                return answered(dispatch, route, door, &request, &entry, (&question, looked), "hit");
            }
        }
        let deadline = received + budget(route, &to);
        match store.join(key) {
            Joined::Follow(follower) => {
                store.counted("coalesced");
                match tokio::time::timeout_at(deadline, follower.answer()).await {
                    Ok(Some(entry)) => {
                        dispatch.charge_saved(route, &whose, Saved::Dedupe);
                        answered(
                            dispatch,
                            route,
                            door,
                            &request,
                            &entry,
                            (&question, looked),
                            "coalesced",
                        )
                    }
                    // The call it waited for brought nothing to share: it asks for itself.
                    Ok(None) => {
                        let waited = looked.elapsed();
                        let served = dispatch.serve(route, door, (to, whose), request, received).await;
                        marked(served, "miss", waited)
                    }
                    Err(_) => {
                        let error = Error::new(
                            Kind::Deadline,
                            format!(
                                "route {}: the budget ran out waiting for the answer to an identical request \
                                     in flight",
                                route.name
                            ),
                        );
                        dispatch.failed(route, door, error, request.extensions().get())
                    }
                }
            }
            Joined::Lead(flight) => {
                // The replicas' shared second level, within a quarter of the budget.
                if !entry::wants_fresh(request.headers()) {
                    let shared = tokio::time::timeout(budget(route, &to) / 4, store.get_shared(&key));
                    if let Ok(Some((entry, precomputed))) = shared.await {
                        flight.share(Some(entry.clone()));
                        store.counted("hit");
                        dispatch.charge_saved(route, &whose, kept(precomputed));
                        return answered(dispatch, route, door, &request, &entry, (&question, looked), "hit");
                    }
                }
                store.counted("miss");
                let lookup = looked.elapsed();
                let served = dispatch.serve(route, door, (to, whose), request, received).await;
                let kept = served.result.as_ref().ok().and_then(|r| Entry::of(&question, r));
                flight.land(kept.map(Arc::new));
                marked(served, "miss", lookup)
            }
        }
    })
}

/// What a kept answer saved: a precomputed one's, or the cache's.
fn kept(precomputed: bool) -> Saved {
    match precomputed {
        true => Saved::Precomputed,
        false => Saved::Cache,
    }
}

/// A request answered by `entry`, as `question` asks, counted; the cache's part of its
/// time is all since it was `looked` up.
fn answered(
    dispatch: &Dispatch,
    route: &Route,
    door: Door,
    request: &Request<Bytes>,
    entry: &Entry,
    (question, looked): (&key::Question, Instant),
    how: &'static str,
) -> Served {
    let mut reply = entry.answer(question);
    crate::timing::set(reply.extensions_mut(), &[(Spent::Cache, looked.elapsed())]);
    let headers = reply.headers_mut();
    headers.insert(headers::CACHE, HeaderValue::from_static(how));
    // No tier served it: its reason says where the answer came from.
    headers.insert(headers::REASON, HeaderValue::from_static(crate::decision::CACHE_REASON));
    dispatch.counted(route, door, Ok(reply), request.extensions().get())
}

/// `served`'s answer marked with how the cache took part, and the time it took
/// (`cache` in `Server-Timing`, when any).
fn marked(mut served: Served, how: &'static str, took: std::time::Duration) -> Served {
    if let Ok(reply) = &mut served.result {
        let headers = reply.headers_mut();
        headers.insert(headers::CACHE, HeaderValue::from_static(how));
        if !took.is_zero() {
            crate::timing::add(reply.extensions_mut(), &[(Spent::Cache, took)]);
        }
    }
    served
}

/// How long the request may take: its budget as its door read it, else the route's.
fn budget(route: &Route, to: &Ask) -> std::time::Duration {
    match to {
        Ask::Classify(meta) => meta.budget.map_or(route.budgets.default, |(b, _)| b),
        Ask::Decided(decision) => decision.budget,
    }
}
