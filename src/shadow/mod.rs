//! Shadow scoring: a candidate model answers a share of a route's calls beside the
//! primary, and its answers are compared with the primary's, never returned.
//!
//! Beside the tiers, after the primary has answered: the real-time tier hands over a
//! copy of the request and the primary's answer; the micro-batch tier the batch's own
//! backend request, so the candidate scores the same batch; the offline workers each
//! line of a shadow batch of the Batch API. Each shadow call runs
//! detached from every caller, on the batch threads, on the candidate's own pool (its
//! connections, concurrency limit and circuits), with a deadline of its own: a candidate
//! that is full, slow or down has its calls dropped and counted, and nothing queues. What
//! the comparisons found is kept per route ([`report`]) and counted in metrics.
//!
//! # Layout
//!
//! `compare` (two answers, output by output and row by row) · `report` (a route's
//! findings since it was reset) · `canary` (a share of calls served by the candidate
//! itself, counted per variant, aborted on its own) · `lines` (a shadow batch's lines,
//! scored one by one for its comparison file).

pub mod canary;
pub mod compare;
mod lines;
pub mod report;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use dashmap::DashMap;
use tokio::time::Instant;

use crate::backend::{Pools, Role};
use crate::control::Control;
use crate::decision::Tier;
use crate::error::Kind;
use crate::metrics;
use crate::policy::{PoolSpec, Route, ShadowSpec, Store};
use crate::protocol::Reply;
use canary::Canaries;
pub use canary::Variant;
use report::{Drop, Report};

/// The primary's side of a mirrored call: its answer, how long it took, and the pool
/// that gave it (the noise floor asks the same endpoints again).
#[derive(Debug, Clone, Copy)]
pub struct Primary<'a> {
    /// The primary's answer.
    pub answer: &'a Reply,
    /// How long it took.
    pub took: Duration,
    /// The pool it came from.
    pub pool: &'a Arc<PoolSpec>,
}

/// The shadow candidates of every route.
#[derive(Debug, Clone)]
pub struct Shadow {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    pools: Pools,
    /// Pools to the primaries' endpoints for the noise floor's second asking: the
    /// shadow's own connections and limit, never a tier's.
    copies: Pools,
    /// The running policy: a batch asks it whether its route's shadow is on now.
    policy: Arc<Store>,
    reports: DashMap<String, Arc<Mutex<Report>>>,
    /// Where shadow calls and comparisons run (the batch threads), if not the caller's.
    threads: Option<tokio::runtime::Handle>,
    /// Batches seen, numbering them for the share mirrored.
    batches: AtomicU64,
    canaries: Canaries,
}

impl Shadow {
    /// Shadow candidates with pools built from `settings`, for the routes of `policy`,
    /// their calls run on `threads` when given, canary aborts made through `control`.
    pub fn new(
        settings: crate::backend::Settings,
        policy: Arc<Store>,
        threads: Option<tokio::runtime::Handle>,
        control: Option<Arc<Control>>,
    ) -> Self {
        Shadow {
            inner: Arc::new(Inner {
                pools: Pools::new(Role::Shadow, settings.clone()),
                copies: Pools::new(Role::Shadow, settings),
                policy,
                reports: DashMap::new(),
                threads,
                batches: AtomicU64::new(0),
                canaries: Canaries::new(control),
            }),
        }
    }

    /// `route`'s shadow when a `tier` call of `request` is mirrored: the shadow flag is
    /// on, the shadow mirrors `tier`, and the request's rollout key (its route's
    /// rollout key header, else its request id) falls in the shadow's percent.
    pub fn wants<'r>(route: &'r Route, tier: Tier, request: &http::Request<Bytes>) -> Option<&'r Arc<ShadowSpec>> {
        let spec = Self::on(route, tier)?;
        (key(route, request) % 100 < u64::from(spec.percent)).then_some(spec)
    }

    /// The variant serving a `tier` call of `request` on `route`, when the route runs a
    /// canary on that tier (its shadow on and taking the tier, `canary_percent` above 0):
    /// the candidate for that share of rollout keys, else the primary.
    pub fn variant(route: &Route, tier: Tier, request: &http::Request<Bytes>) -> Option<(Arc<ShadowSpec>, Variant)> {
        let spec = Self::on(route, tier).filter(|s| s.canary_percent > 0)?;
        let variant = match key(route, request) % 100 < u64::from(spec.canary_percent) {
            true => Variant::Candidate,
            false => Variant::Primary,
        };
        Some((spec.clone(), variant))
    }

    /// Serves a canary call on `route`'s candidate (its pool, its limit), marked
    /// `x-tiergate-variant: candidate`.
    pub async fn serve(
        &self,
        route: &str,
        spec: &ShadowSpec,
        request: http::Request<Bytes>,
        deadline: Instant,
    ) -> Result<Reply, crate::error::Error> {
        let answer = self.candidate(route, spec).forward(request, deadline).await?;
        Ok(marked(answer))
    }

    /// `route`'s candidate pool (its connections, concurrency limit and circuits), which
    /// a canary's micro-batches are sent to.
    pub fn candidate(&self, route: &str, spec: &ShadowSpec) -> Arc<crate::backend::Pool> {
        self.inner.pools.get(route, &spec.candidate)
    }

    /// `route`'s candidate pool's endpoints now (`spec` its shadow); `None` before its
    /// first call.
    pub fn endpoints_now(&self, route: &str, spec: &ShadowSpec) -> Option<Vec<crate::backend::EndpointView>> {
        self.inner.pools.endpoints_now(route, &spec.candidate)
    }

    /// Counts a canary route's `tier` call served by `variant` (an error is a gateway
    /// error or a 5xx), which may abort the canary.
    pub fn counted(
        &self,
        route: &str,
        spec: &ShadowSpec,
        (tier, variant): (Tier, Variant),
        answer: &Result<Reply, crate::error::Error>,
        took: Duration,
    ) {
        let ok = answer.as_ref().is_ok_and(|a| !a.status().is_server_error());
        self.inner.canaries.count(route, spec, (tier, variant), ok, took);
    }

    /// `route`'s shadow when it is on and takes `tier`'s calls.
    pub fn on(route: &Route, tier: Tier) -> Option<&Arc<ShadowSpec>> {
        let spec = route.shadow.as_ref().filter(|_| route.flags.shadow)?;
        let on = match tier {
            Tier::Realtime => spec.realtime,
            Tier::MicroBatch => spec.micro_batch,
            Tier::Offline => false,
        };
        on.then_some(spec)
    }

    /// The shadow of route `name` for its next micro-batch, from the running policy
    /// (batches are numbered, so `percent` of every hundred are mirrored).
    pub fn wants_batch(&self, name: &str) -> Option<Arc<ShadowSpec>> {
        let policy = self.inner.policy.load();
        let spec = Self::on(policy.route(name)?, Tier::MicroBatch)?;
        let n = self.inner.batches.fetch_add(1, Ordering::Relaxed);
        (n % 100 < u64::from(spec.percent)).then(|| spec.clone())
    }

    /// Sends `request` to `route`'s candidate, detached from its caller, and compares the
    /// answer with the primary's (with the noise floor: also asks the primary's endpoints
    /// again, on a pool of the shadow's own, and discounts the rows it changes its mind on).
    pub fn mirror(
        &self,
        route: &str,
        spec: Arc<ShadowSpec>,
        tier: Tier,
        request: http::Request<Bytes>,
        primary: Primary<'_>,
    ) {
        let (took, pool, answer) = (primary.took, primary.pool.clone(), copy(primary.answer));
        let (inner, route) = (self.inner.clone(), route.to_owned());
        let work = async move {
            let caller = request_id(&request);
            let primary = Primary {
                answer: &answer,
                took,
                pool: &pool,
            };
            let asked = Asked {
                route: &route,
                spec: &spec,
                tier,
                caller: caller.as_deref(),
            };
            // What it found is in the report and the metrics.
            let _ = inner.score(asked, request, primary, Slot::Shed).await;
        };
        match &self.inner.threads {
            Some(threads) => drop(threads.spawn(work)),
            None => drop(tokio::spawn(work)),
        }
    }

    /// What `route`'s shadow found since its report was last reset (or, given `since`,
    /// since that minute of the last day), if it has a report.
    pub fn report(&self, route: &str, since: Option<std::time::SystemTime>) -> Option<serde_json::Value> {
        let report = self.inner.reports.get(route)?.clone();
        let json = lock(&report).to_json(since);
        Some(json)
    }

    /// What `route`'s report holds for its promotion gate (all zero before any call).
    pub fn standing(&self, route: &str) -> report::Standing {
        self.inner
            .reports
            .get(route)
            .map(|r| lock(&r).standing())
            .unwrap_or_default()
    }

    /// Starts `route`'s report afresh (metrics keep counting).
    pub fn reset(&self, route: &str) {
        self.inner.reports.insert(route.to_owned(), Arc::default());
    }
}

/// What a shadow call is about: its route and shadow, the tier it mirrors, and the
/// caller it names a disagreement by.
#[derive(Debug, Clone, Copy)]
struct Asked<'a> {
    route: &'a str,
    spec: &'a ShadowSpec,
    tier: Tier,
    caller: Option<&'a str>,
}

/// What a shadow call does at its candidate's concurrency limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    /// Dropped at once (live traffic: nothing queues).
    Shed,
    /// Waits for a slot within the shadow budget (a shadow batch's lines).
    Wait,
}

impl Inner {
    /// Asks the candidate (and, with the noise floor, the primary's endpoints again) for
    /// `request` within the shadow budget, compares its answer with the primary's, and
    /// records what it found in the route's report and metrics.
    async fn score(
        &self,
        asked: Asked<'_>,
        request: http::Request<Bytes>,
        primary: Primary<'_>,
        slot: Slot,
    ) -> Result<(compare::Comparison, Duration), Drop> {
        let Asked {
            route,
            spec,
            tier,
            caller,
        } = asked;
        let again = spec.noise_floor.then(|| {
            let pool = PoolSpec {
                max_concurrency: spec.candidate.max_concurrency,
                ..(**primary.pool).clone()
            };
            (Arc::new(pool), crate::backend::copy(&request))
        });
        let report = self.report(route);
        let pool = self.pools.get(route, &spec.candidate);
        let started = Instant::now();
        let deadline = started + spec.budget;
        let asked = async {
            let answer = match slot {
                Slot::Shed => pool.forward(request, deadline).await,
                Slot::Wait => pool.forward_waiting(request, deadline).await,
            };
            (answer, started.elapsed())
        };
        let ((answer, took), noise) = match again {
            None => (asked.await, None),
            Some((spec, request)) => {
                let copies = self.copies.get(route, &spec);
                let (asked, again) = tokio::join!(asked, copies.forward(request, deadline));
                (asked, again.ok())
            }
        };
        let counted = Counted::new(route);
        let dropped = |why: Drop| {
            counted.dropped(why);
            lock(&report).dropped(why);
            Err(why)
        };
        let candidate = match answer {
            Ok(candidate) => candidate,
            Err(e) => {
                return dropped(match e.kind {
                    Kind::Shed => Drop::Full,
                    Kind::Deadline => Drop::Timeout,
                    Kind::Backend | Kind::Unavailable => Drop::Down,
                    _ => Drop::Error,
                })
            }
        };
        match compare::compare(primary.answer, &candidate, spec) {
            Ok(mut cmp) => {
                // Without the primary's second answer the rows are judged as they are.
                if let Some(Ok(noise)) = noise.map(|again| compare::compare(primary.answer, &again, spec)) {
                    compare::discount(&mut cmp, &noise);
                }
                counted.compared(tier, &cmp, primary.took, took);
                lock(&report).add(tier, &cmp, (primary.took, took), caller);
                Ok((cmp, took))
            }
            Err(unreadable) => {
                tracing::debug!(route, problem = unreadable.0, "shadow answer not compared");
                dropped(Drop::Unreadable)
            }
        }
    }

    fn report(&self, route: &str) -> Arc<Mutex<Report>> {
        if let Some(report) = self.reports.get(route) {
            return report.clone();
        }
        Counted::register(route);
        self.reports.entry(route.to_owned()).or_default().clone()
    }
}

/// A request's rollout key: its route's rollout key header, else its request id, hashed.
fn key(route: &Route, request: &http::Request<Bytes>) -> u64 {
    let key = match request.headers().get(&route.rollout_key_header) {
        Some(value) => value.as_bytes(),
        None => request
            .extensions()
            .get::<crate::trace::Ids>()
            .map_or(&b""[..], |ids| ids.request_id.as_bytes()),
    };
    crate::decision::key_hash(key)
}

/// `answer`, marked `x-tiergate-variant: candidate` (the candidate served it).
pub fn marked(mut answer: Reply) -> Reply {
    let variant = http::HeaderValue::from_static(Variant::Candidate.as_str());
    answer.headers_mut().insert(crate::headers::VARIANT, variant);
    answer
}

/// A copy of an answer (its body is shared, not copied).
fn copy(reply: &Reply) -> Reply {
    let mut copy = http::Response::new(reply.body().clone());
    *copy.status_mut() = reply.status();
    *copy.headers_mut() = reply.headers().clone();
    copy
}

fn lock(report: &Mutex<Report>) -> std::sync::MutexGuard<'_, Report> {
    report.lock().unwrap_or_else(|e| e.into_inner())
}

/// The caller's request id (the `x-request-id` it sent or was given), to name a
/// disagreement by.
fn request_id(request: &http::Request<Bytes>) -> Option<String> {
    let id = match request.extensions().get::<crate::trace::Ids>() {
        Some(ids) => &ids.request_id,
        None => request.headers().get(crate::trace::REQUEST_ID)?,
    };
    id.to_str().ok().map(str::to_owned)
}

/// A route's shadow metrics.
struct Counted<'a> {
    route: &'a str,
}

impl<'a> Counted<'a> {
    fn new(route: &'a str) -> Self {
        Counted { route }
    }

    /// Every series of `route` at zero, so a dashboard sees 0 before the first call.
    fn register(route: &str) {
        for why in Drop::ALL {
            ::metrics::counter!(metrics::SHADOW_DROPPED, "route" => route.to_owned(), "reason" => why.as_str())
                .absolute(0);
        }
        for verdict in ["within", "outside", "noise"] {
            ::metrics::counter!(metrics::SHADOW_ROWS, "route" => route.to_owned(), "verdict" => verdict).absolute(0);
        }
        for kind in ["status", "shape"] {
            ::metrics::counter!(metrics::SHADOW_MISMATCHES, "route" => route.to_owned(), "kind" => kind).absolute(0);
        }
    }

    fn dropped(&self, why: Drop) {
        ::metrics::counter!(metrics::SHADOW_DROPPED, "route" => self.route.to_owned(), "reason" => why.as_str())
            .increment(1);
    }

    fn compared(&self, tier: Tier, cmp: &compare::Comparison, primary: Duration, candidate: Duration) {
        let route = || self.route.to_owned();
        ::metrics::counter!(metrics::SHADOW_COMPARED, "route" => route(), "tier" => tier.as_str()).increment(1);
        let (rows, within, noisy) = cmp.outputs.iter().fold((0, 0, 0), |(r, w, n), o| {
            (r + o.rows, w + o.rows_within, n + o.rows_noisy)
        });
        ::metrics::counter!(metrics::SHADOW_ROWS, "route" => route(), "verdict" => "within").increment(within);
        ::metrics::counter!(metrics::SHADOW_ROWS, "route" => route(), "verdict" => "noise").increment(noisy);
        ::metrics::counter!(metrics::SHADOW_ROWS, "route" => route(), "verdict" => "outside")
            .increment(rows - within - noisy);
        if cmp.status_mismatch.is_some() {
            ::metrics::counter!(metrics::SHADOW_MISMATCHES, "route" => route(), "kind" => "status").increment(1);
        }
        let shapes = cmp.shape_mismatches.len() as u64;
        if shapes > 0 {
            ::metrics::counter!(metrics::SHADOW_MISMATCHES, "route" => route(), "kind" => "shape").increment(shapes);
        }
        if !primary.is_zero() {
            ::metrics::histogram!(metrics::SHADOW_LATENCY_RATIO, "route" => route())
                .record(candidate.as_secs_f64() / primary.as_secs_f64());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(percent: u8, tiers: &str) -> Arc<Route> {
        let text = format!(
            "[routes.r]\nmodels = [\"m\"]\n[routes.r.flags]\nshadow = true\n\
             [routes.r.realtime]\nendpoints = [\"http://h:1\"]\n\
             [routes.r.shadow]\npercent = {percent}\ntiers = [{tiers}]\n\
             [routes.r.shadow.candidate]\nendpoints = [\"http://c:1\"]\n"
        );
        let policy = crate::policy::Policy::from_texts(vec![("p.toml".into(), text)]).expect("valid");
        policy.route("r").expect("route").clone()
    }

    fn request(id: &str) -> http::Request<Bytes> {
        let mut request = http::Request::new(Bytes::new());
        request
            .headers_mut()
            .insert("x-request-id", id.parse().expect("a header value"));
        request
    }

    #[test]
    fn the_share_mirrored_is_chosen_by_the_rollout_key() {
        let half = route(50, "\"realtime\"");
        let ids: Vec<String> = (0..400).map(|i| format!("req-{i}")).collect();
        let taken = |route: &Route| {
            ids.iter()
                .filter(|id| Shadow::wants(route, Tier::Realtime, &request(id)).is_some())
                .count()
        };
        let n = taken(&half);
        assert!((150..250).contains(&n), "about half of 400 keys: {n}");
        assert_eq!(taken(&half), n, "the same keys every time");
        assert_eq!(taken(&route(100, "\"realtime\"")), 400);
        assert_eq!(taken(&route(0, "\"realtime\"")), 0);
        assert_eq!(
            taken(&route(100, "\"micro_batch\"")),
            0,
            "real-time calls are not mirrored"
        );
        assert!(Shadow::wants(&half, Tier::Offline, &request("x")).is_none());
    }
}
