//! What every door does once it has read a request: classify it, hand it to its tier,
//! count it, and ask a route's backend for model metadata.
//!
//! Between the doors and the tiers. A door parses its protocol, builds the KServe v2
//! HTTP form of the request ([`crate::tiers::Call`] carries it to the tiers) and hands
//! it on through the pipeline ([`super`]), which calls `Dispatch::serve`; the
//! [`Served`] it gets back holds the decision (or refusal) and the tier's answer, which
//! the door renders in its own protocol. Metrics are counted here, once, so both doors
//! count alike.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::Request;
use tokio::time::Instant;
use tracing::Instrument;

use crate::backend::sequences::Sequences;
use crate::backend::{Pools, Role};
use crate::cache::Cache;
use crate::classify::classify;
use crate::decision::{Decision, Door, Meta, Reason, Refusal, Tier};
use crate::error::{Error, Kind};
use crate::front::auth::Callers;
use crate::front::relay::{Relay, Relayed, Rules, Shape};
use crate::metrics::{self, RouteInstruments};
use crate::usage::TokenMeter;

use super::meters::{MeterTable, Meters};
use crate::policy::{Policy, Route, Store};
use crate::protocol::Reply;
use crate::tiers::{Call, Tiers};
use crate::trace;

use super::admission::Admission;
use super::Admitted;
use crate::front::meta::MAX_BUDGET;
use crate::front::ready::{NotReady, Readiness};

/// How long a model metadata or readiness call to a backend may take.
const CONTROL_TIMEOUT: Duration = Duration::from_secs(2);

/// The door-independent part of serving: policy, tiers and control-plane pools.
#[derive(Debug)]
pub struct Dispatch {
    policy: Arc<Store>,
    admission: Arc<Admission>,
    tiers: Tiers,
    control: Pools,
    /// Routes' fallback pools (see [`Reason::Fallback`]).
    fallback: Pools,
    readiness: Arc<Readiness>,
    /// Each route's request instruments and usage counters.
    meters: MeterTable,
    /// The share of each budget the tiers leave for the way to and from the client.
    reserve: f64,
    /// Who may call, as which tenant (every door authenticates with it).
    callers: Arc<Callers>,
    /// The tier each live Triton sequence's first step was served by, by route and id.
    sequence_tiers: Sequences<Tier>,
    /// The routes' prediction caches.
    cache: Cache,
    /// The largest event a stream may relay (`limits.max_stream_event_bytes`).
    max_event: usize,
}

/// What the dispatch is asked to do about a request's tier.
#[derive(Debug)]
pub(super) enum Ask {
    /// Classify it by what its door read.
    Classify(Meta),
    /// Serve it as its door decided (a Kafka source: always micro-batch).
    Decided(Decision),
}

/// The outcome of one request on a route, for its door to render.
#[derive(Debug)]
pub struct Served {
    /// The classifier's decision, when there was one.
    pub decision: Option<Decision>,
    /// Why no tier serves it, when the classifier refused.
    pub refusal: Option<Refusal>,
    /// The tier's answer or the error that ended the request.
    pub result: Result<Reply, Error>,
    /// The version of the policy snapshot that served it.
    pub policy_version: u64,
    /// How long the tier that served it took, when one did and a backend answered (not
    /// an offline acceptance): the answer's `backend` in `Server-Timing` unless the tier
    /// said more (see [`crate::timing`]).
    pub tier_took: Option<std::time::Duration>,
    /// The time since the door received it, as the dispatch read the clock when the
    /// tier answered (its `total` in `Server-Timing`, one reading of the clock spared).
    pub elapsed: Option<std::time::Duration>,
}

impl Served {
    /// Logs it when it ended in a 5xx of the gateway's (see `front::failures`), with the
    /// request's ids: called by its door, which has them (the dispatch keeps them only
    /// for its debug line, to spare the success path a copy).
    pub fn log_failure(&self, route: &str, door: Door, ids: &trace::Ids) {
        if let Err(e) = &self.result {
            crate::front::failures::log(route, door, self.decision, e, Some(ids));
        }
    }
}

impl Dispatch {
    /// Step 1 of the pipeline ([`super`]): admits `tenant`'s request on `route` that
    /// came in by `door` at `received`, with `headers` (without authentication, rate
    /// limits read the tenant from them) and `ids`; a refusal comes back already
    /// counted, for the door to render (boxed: refusals are the rare case).
    pub fn admit(
        &self,
        door: Door,
        route: Arc<Route>,
        (headers, tenant): (&http::HeaderMap, &crate::tenant::Tenant),
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
                claimed: None,
                ticket,
            }),
            Err(e) => {
                let refused = self.failed(&route, door, e, Some(ids));
                refused.log_failure(&route.name, door, ids);
                Err(Box::new(refused))
            }
        }
    }

    /// Serves `policy` through `tiers`; model metadata calls go through pools built with
    /// `backends`; ready as `readiness` says.
    pub fn new(
        policy: Arc<Store>,
        admission: Arc<Admission>,
        tiers: Tiers,
        backends: crate::backend::Settings,
        readiness: Arc<Readiness>,
    ) -> Self {
        Dispatch {
            policy,
            admission,
            tiers,
            control: Pools::new(Role::Control, backends.clone()),
            fallback: Pools::new(Role::Fallback, backends),
            readiness,
            meters: MeterTable::new(Arc::new(crate::usage::Ledger::in_memory())),
            reserve: 0.0,
            callers: Arc::new(Callers::open()),
            sequence_tiers: Sequences::default(),
            cache: Cache::new(),
            max_event: 1 << 20,
        }
    }

    /// The same dispatch, relaying no stream event over `bytes` (the rest of such a
    /// stream is cut).
    pub fn with_max_stream_event(mut self, bytes: usize) -> Self {
        self.max_event = bytes;
        self
    }

    /// The same dispatch, answering from `cache` on routes with theirs on.
    pub fn with_cache(mut self, cache: Cache) -> Self {
        self.cache = cache;
        self
    }

    /// The routes' prediction caches.
    pub fn cache(&self) -> &Cache {
        &self.cache
    }

    /// The same dispatch, charging what the backends do to `ledger`.
    pub fn with_usage(mut self, ledger: Arc<crate::usage::Ledger>) -> Self {
        self.meters = MeterTable::new(ledger);
        self
    }

    /// `route`'s fallback pool's endpoints now (`spec` its pool); `None` before its
    /// first call.
    pub fn fallback_endpoints_now(
        &self,
        route: &str,
        spec: &crate::policy::PoolSpec,
    ) -> Option<Vec<crate::backend::EndpointView>> {
        self.fallback.endpoints_now(route, spec)
    }

    /// The usage ledger it charges.
    pub fn usage(&self) -> &Arc<crate::usage::Ledger> {
        self.meters.ledger()
    }

    /// The same dispatch, its doors authenticating callers with `callers`.
    pub fn with_callers(mut self, callers: Arc<Callers>) -> Self {
        self.callers = callers;
        self
    }

    /// Who may call (see [`crate::front::auth`]).
    pub fn callers(&self) -> &Callers {
        &self.callers
    }

    /// The same dispatch aiming each request's tiers at `budget × (1 − reserve)`,
    /// keeping the rest for the time outside the gateway (`limits.budget_reserve`, from
    /// 0 to 0.5: the startup checks refuse any other).
    pub fn with_budget_reserve(mut self, reserve: f64) -> Self {
        debug_assert!((0.0..=0.5).contains(&reserve), "checked by Config::validate");
        self.reserve = reserve;
        self
    }

    /// A Triton sequence's step goes to the tier that served the sequence's first step
    /// while that tier is on (its pool holds the endpoint with the sequence's state),
    /// whatever this step's budget says; a first step classified offline pins nothing
    /// (it is refused). The pin goes with the `sequence_end` step or after
    /// [`IDLE`](crate::backend::sequences::IDLE).
    fn sequence_tier(&self, route: &Route, sequence: &crate::protocol::Sequence, decision: Decision) -> Decision {
        let key = format!("{}\n{}", route.name, sequence.id);
        let pinned = match self.sequence_tiers.find(&key) {
            Some(pinned) => Some(pinned),
            None if decision.tier == Tier::Offline => None,
            None => self
                .sequence_tiers
                .pin(&key, || Ok::<_, std::convert::Infallible>(decision.tier))
                .unwrap_or_else(|never| match never {}),
        };
        let Some(pinned) = pinned else {
            return decision;
        };
        if sequence.end {
            self.sequence_tiers.release(&key, &pinned);
        }
        let on = match pinned.to {
            Tier::Realtime => route.flags.realtime,
            Tier::MicroBatch => route.flags.micro_batch,
            Tier::Offline => false,
        };
        match pinned.to != decision.tier && on {
            true => Decision {
                tier: pinned.to,
                reason: Reason::Sequence,
                ..decision
            },
            false => decision,
        }
    }

    /// The running policy snapshot.
    #[inline]
    pub fn policy(&self) -> Arc<Policy> {
        self.policy.load()
    }

    /// The admission control every door's requests pass first (see [`super`]).
    pub(crate) fn admission(&self) -> &Arc<Admission> {
        &self.admission
    }

    /// Why the gateway should not be sent new work (empty when it is ready).
    pub fn not_ready(&self) -> Vec<NotReady> {
        self.readiness.check(&self.policy.load())
    }

    /// Whether the gateway is draining (stopping): HTTP/1.1 answers then ask the client
    /// to close its connection, so it reconnects to another replica.
    pub fn draining(&self) -> bool {
        self.readiness.is_draining()
    }

    /// Serves `request` (KServe v2 HTTP form, body read and checked) on `route`: on the
    /// tier the classifier picks from `to`'s metadata, or the one `to` has decided;
    /// counts the decision, the request and its SLO. `received` is when `door` got it
    /// (the budget's start). A real-time request the full real-time pool sheds goes to
    /// the micro-batch tier when the route lets it (`borrow.realtime_overflow`). One
    /// async function for both, so a request's future nests one state machine here.
    pub(super) async fn serve(
        &self,
        route: &Arc<Route>,
        door: Door,
        (to, whose): (Ask, crate::usage::Whose),
        request: Request<Bytes>,
        received: Instant,
    ) -> Served {
        let request_span = crate::telemetry::current_span();
        request_span.record("route", route.name.as_str());
        let meters = self.meters(route);
        let instruments = &meters.instruments;
        let decision = match to {
            Ask::Decided(decision) => decision,
            Ask::Classify(meta) => match tracing::info_span!("classify").in_scope(|| classify(route, &meta)) {
                Ok(decision) => decision,
                Err(refusal) => {
                    let served = Served {
                        decision: None,
                        refusal: Some(refusal),
                        result: Err(refused(route, refusal)),
                        policy_version: route.policy_version(),
                        tier_took: None,
                        elapsed: None,
                    };
                    return count(route, door, instruments, served, debug_ids(&request));
                }
            },
        };
        let ids = debug_ids(&request).cloned();
        let streaming = streaming(&request);
        let sequence = request.extensions().get::<crate::protocol::Sequence>().cloned();
        let decision = match &sequence {
            Some(sequence) => self.sequence_tier(route, sequence, decision),
            None => decision,
        };
        // An OpenAI call's `service_tier`, within what the route's flags allow.
        let hint = streaming.and_then(|_| request.extensions().get::<crate::decision::ServiceTier>().copied());
        // Its hold on its route's token limits, settled when its tokens are counted.
        let held = streaming.and_then(|_| request.extensions().get::<crate::usage::limits::Reservation>().cloned());
        let decision = match hint {
            Some(hint) => hint.apply(decision, (route.flags.realtime, route.flags.micro_batch)),
            None => decision,
        };
        if let (Tier::Offline, Some(sequence)) = (decision.tier, &sequence) {
            // The offline tier runs jobs in any order, on any endpoint: a stateful model's
            // steps would be applied out of turn.
            let served = Served {
                decision: Some(decision),
                refusal: None,
                result: Err(Error::new(
                    Kind::BadRequest,
                    format!(
                        "sequence {} cannot be served offline (its steps would run out of order): send its \
                         requests with a budget under the route's offline_from and without Prefer: respond-async",
                        sequence.id
                    ),
                )),
                policy_version: route.policy_version(),
                tier_took: None,
                elapsed: None,
            };
            return count(route, door, instruments, served, ids.as_ref());
        }
        if let (Tier::Offline, Some(Some(_))) = (decision.tier, &streaming) {
            // An offline job answers later, whole: nobody would read its stream.
            let served = Served {
                decision: Some(decision),
                refusal: None,
                result: Err(Error::new(
                    Kind::BadRequest,
                    "a stream cannot be served offline: send it with a budget under the route's offline_from and \
                     without Prefer: respond-async, or without \"stream\": true",
                )),
                policy_version: route.policy_version(),
                tier_took: None,
                elapsed: None,
            };
            return count(route, door, instruments, served, ids.as_ref());
        }
        if let (Some(quotas), false) = (&route.quotas, decision.tier == Tier::Offline) {
            // An offline job is accepted whatever its tenant's quota: it waits in the queue.
            if let Some(spent) = super::meters::quota_spent(self.usage(), route, quotas, &whose) {
                let served = Served {
                    decision: Some(decision),
                    refusal: None,
                    result: Err(spent),
                    policy_version: route.policy_version(),
                    tier_took: None,
                    elapsed: None,
                };
                return count(route, door, instruments, served, ids.as_ref());
            }
        }
        instruments.decided(&route.name, decision.tier, decision.reason);
        request_span.record("tier", decision.tier.as_str());
        request_span.record("reason", decision.reason.as_str());
        let deadline = received
            .checked_add(decision.budget.mul_f64(1.0 - self.reserve))
            .unwrap_or_else(|| received + MAX_BUDGET);
        let handles = instruments.handles(&route.name, decision.tier);
        handles.in_flight.increment(1.0);
        // A route that may send real-time overflow elsewhere, or has a fallback pool
        // (never for a sequence's step: it must reach the endpoint that holds its state),
        // gets the call back untouched when the real-time pool is full (or, with a
        // fallback, when its every endpoint is ejected).
        let realtime = decision.tier == Tier::Realtime && sequence.is_none();
        let call = Call {
            route: route.clone(),
            tier: decision.tier,
            door,
            deadline,
            request,
            stream: matches!(streaming, Some(Some(_))),
        };
        let sent = Instant::now();
        let (decision, mut result) = match realtime && (route.borrow.realtime_overflow || route.fallback.is_some()) {
            false => (
                decision,
                self.tiers.serve(call).instrument(tier_span(decision.tier)).await,
            ),
            // Boxed: its futures would set the size of every request's future, copied
            // whole into the door's box (measured: docs/performance-history.md).
            true => Box::pin(self.realtime_or_elsewhere(call, decision, instruments)).await,
        };
        handles.in_flight.decrement(1.0);
        if let Some(how) = streaming {
            result = self.llm_answer(route, (decision.tier, how), (&meters.usage, &whose, held), result);
        }
        let now = Instant::now();
        let elapsed = now.saturating_duration_since(received);
        handles.request_seconds.record(elapsed.as_secs_f64());
        let tier_took = now.saturating_duration_since(sent);
        // What the answer's Server-Timing says a backend took: an offline acceptance
        // notes its own time (the queue's durable write), no backend having answered.
        let mut backend_took = None;
        if decision.tier != Tier::Offline {
            // An offline acceptance is not the job's end: jobs count when they finish.
            let met = elapsed <= decision.budget && result.as_ref().is_ok_and(|r| r.status().as_u16() < 500);
            instruments.slo(&route.name, decision.tier, met);
            backend_took = Some(tier_took);
        }
        super::meters::charge(&meters.usage, decision.tier, &whose, &result, tier_took);
        let served = Served {
            decision: Some(decision),
            refusal: None,
            result,
            policy_version: route.policy_version(),
            tier_took: backend_took,
            elapsed: Some(elapsed),
        };
        count(route, door, instruments, served, ids.as_ref())
    }

    /// A real-time `call` of a route that lets a refused one be served elsewhere: by
    /// the micro-batch tier when the real-time pool is full (`borrow.realtime_overflow`,
    /// if its learned cost says the budget can still be met, else it refuses at once),
    /// else by the route's fallback pool when the pool is full or its every endpoint is
    /// ejected; with the decision that served it.
    async fn realtime_or_elsewhere(
        &self,
        call: Call,
        decision: Decision,
        instruments: &RouteInstruments,
    ) -> (Decision, Result<Reply, Error>) {
        let route = call.route.clone();
        let request_span = crate::telemetry::current_span();
        let (error, call) = match self
            .tiers
            .realtime_or_back(call)
            .instrument(tier_span(decision.tier))
            .await
        {
            Err((e, Some(call))) => (e, call),
            answered => return (decision, answered.map_err(|(e, _)| e)),
        };
        let overflow = route.borrow.realtime_overflow && error.kind == Kind::Shed;
        let decision = match (overflow, &route.fallback) {
            (true, _) => Decision {
                tier: Tier::MicroBatch,
                reason: Reason::RealtimeOverflow,
                ..decision
            },
            (false, Some(_)) => Decision {
                reason: Reason::Fallback,
                ..decision
            },
            (false, None) => return (decision, Err(error)),
        };
        drop(error);
        instruments.decided(&route.name, decision.tier, decision.reason);
        request_span.record("tier", decision.tier.as_str());
        request_span.record("reason", decision.reason.as_str());
        let answer = match &route.fallback {
            Some(spec) if !overflow => {
                // Within the same deadline, on pools of their own; as the model the
                // pool serves, when it names one.
                let pool = self.fallback.get(&route.name, spec);
                let mut request = call.request;
                if let Some(model) = &spec.model {
                    served_as(&mut request, model);
                }
                pool.forward(request, call.deadline)
                    .instrument(tier_span(decision.tier))
                    .await
            }
            _ => {
                ::metrics::counter!(metrics::BORROWED, "route" => route.name.clone(), "from" => "micro_batch", "to" => "realtime").increment(1);
                let call = Call {
                    tier: decision.tier,
                    ..call
                };
                self.tiers.serve(call).instrument(tier_span(decision.tier)).await
            }
        };
        (decision, answer)
    }

    /// An LLM call's answer: its stream made a relay (`how` it is relayed, when the
    /// caller streams), or its whole answer's tokens counted; `whose` tokens they are,
    /// on `usage`, settling the reservation `held` of its route's token limits.
    #[cold]
    fn llm_answer(
        &self,
        route: &Route,
        (tier, how): (Tier, Option<(Shape, bool)>),
        (usage, whose, held): (
            &Arc<crate::usage::RouteUsage>,
            &crate::usage::Whose,
            Option<crate::usage::limits::Reservation>,
        ),
        result: Result<Reply, Error>,
    ) -> Result<Reply, Error> {
        let answer = result?;
        let meter = TokenMeter::new(&route.name, tier, usage.clone(), whose.name()).holding(held);
        Ok(match how {
            Some(how) => self.relayed(route, meter, how, answer),
            None => whole_llm(tier, answer, &meter),
        })
    }

    /// `answer` with its stream, if it is one, made a relay for the door to write
    /// (see [`crate::front::relay`]), under `route`'s stream settings.
    #[cold]
    fn relayed(
        &self,
        route: &Route,
        meter: TokenMeter,
        (shape, strip_usage): (Shape, bool),
        mut answer: Reply,
    ) -> Reply {
        if let Some(stream) = crate::backend::stream::Streamed::of(&mut answer) {
            let rules = Rules {
                idle: route.streams.idle,
                max_duration: route.streams.max_duration,
                max_event: self.max_event,
                shape,
                strip_usage,
            };
            let relay = Relay::new(stream, meter, rules);
            answer.extensions_mut().insert(Relayed::new(relay));
        }
        answer
    }

    /// A request on `route` answered without a tier (from the cache), counted.
    pub(super) fn counted(
        &self,
        route: &Route,
        door: Door,
        result: Result<Reply, Error>,
        ids: Option<&trace::Ids>,
    ) -> Served {
        let served = Served {
            decision: None,
            refusal: None,
            result,
            policy_version: route.policy_version(),
            tier_took: None,
            elapsed: None,
        };
        count(route, door, &self.meters(route).instruments, served, ids)
    }

    /// A request on `route` that failed before classification (refused at admission, a
    /// bad body, a bad budget), counted.
    pub(super) fn failed(&self, route: &Route, door: Door, error: Error, ids: Option<&trace::Ids>) -> Served {
        let served = Served {
            decision: None,
            refusal: None,
            result: Err(error),
            policy_version: route.policy_version(),
            tier_took: None,
            elapsed: None,
        };
        count(route, door, &self.meters(route).instruments, served, ids)
    }

    /// Charges the usage ledger for a request on `route` that `saved` a call.
    pub(super) fn charge_saved(&self, route: &Route, whose: &crate::usage::Whose, saved: crate::usage::Saved) {
        super::meters::saved(&self.meters(route).usage, whose, saved);
    }

    /// `route`'s meters (see [`MeterTable::get`]).
    fn meters(&self, route: &Route) -> Arc<Meters> {
        self.meters.get(route, &self.policy)
    }

    /// Every model the running policy names, in route order: what "all models" means
    /// for statistics (a route that serves paths only names none).
    pub fn models(&self) -> Vec<String> {
        let policy = self.policy.load();
        policy.routes().iter().flat_map(|r| r.models.iter().cloned()).collect()
    }

    /// Sends a model GET (metadata, readiness, config) to the route serving `model`,
    /// over the route's control pool, which shares nothing with the tiers' pools.
    pub async fn control(&self, model: &str, request: Request<Bytes>) -> Result<Reply, Error> {
        let policy = self.policy.load();
        let route = policy.route_for_model(model).ok_or_else(|| unknown_model(model))?;
        let spec = route
            .metadata_pool()
            .ok_or_else(|| Error::new(Kind::NoTier, format!("route {} has no pool to ask", route.name)))?;
        let pool = self.control.get(&route.name, spec);
        pool.forward(request, Instant::now() + CONTROL_TIMEOUT).await
    }
}

/// The request's ids, for the `served` line only, so only when it is written.
fn debug_ids(request: &Request<Bytes>) -> Option<&trace::Ids> {
    match tracing::enabled!(tracing::Level::DEBUG) {
        true => request.extensions().get::<trace::Ids>(),
        false => None,
    }
}

/// The span a tier serves a request in.
fn tier_span(tier: Tier) -> tracing::Span {
    tracing::info_span!("tier", tier = tier.as_str())
}

/// The error for a model no route serves, counted as unmatched for `door`.
pub fn unmatched_model(door: &'static str, model: &str) -> Error {
    ::metrics::counter!(metrics::UNMATCHED, "door" => door).increment(1);
    unknown_model(model)
}

fn unknown_model(model: &str) -> Error {
    Error::new(
        Kind::NotFound,
        format!("unknown model '{model}': no route in the policy serves it"),
    )
}

fn refused(route: &Route, refusal: Refusal) -> Error {
    let message = match refusal {
        Refusal::RouteDisabled => format!("route {} has every tier switched off", route.name),
        Refusal::NoTier { wanted, budget } => format!(
            "route {}: a budget of {} ms calls for the {} tier, which is off, and no enabled tier can meet it",
            route.name,
            budget.as_millis(),
            wanted.as_str()
        ),
    };
    Error::new(Kind::NoTier, message)
}

/// Counts the request by its outcome (the error's kind, or the backend's status class)
/// and writes its `served` debug line, which carries the request's ids, route and
/// decision as fields: the request's own span is for the exporter only. (A 5xx is
/// logged by the door, [`Served::log_failure`].)
/// Points a KServe v2 inference `request` (`/v2/models/NAME[/versions/V]/infer`) at
/// `model` instead, its query kept; any other request is left as it is.
fn served_as(request: &mut Request<Bytes>, model: &str) {
    let uri = request.uri();
    if !matches!(
        crate::front::paths::target(uri.path()),
        crate::front::paths::Target::Model { rest: "/infer", .. }
    ) {
        return;
    }
    let path = match uri.query() {
        Some(query) => format!("/v2/models/{model}/infer?{query}"),
        None => format!("/v2/models/{model}/infer"),
    };
    if let Ok(path) = path.parse() {
        *request.uri_mut() = path;
    }
}

/// Counts a request on `route` refused by `knob`'s limit.
#[cold]
fn refused_by(route: &str, tier: Option<Tier>, knob: &'static str) {
    let tier = tier.map_or("none", Tier::as_str);
    ::metrics::counter!(metrics::REFUSALS, "route" => route.to_owned(), "tier" => tier, "knob" => knob).increment(1);
}

fn count(
    route: &Route,
    door: Door,
    instruments: &RouteInstruments,
    served: Served,
    ids: Option<&trace::Ids>,
) -> Served {
    let outcome = match &served.result {
        Ok(reply) => match reply.status().as_u16() {
            0..=399 => "ok",
            400..=499 => "backend_rejected",
            _ => "backend_error",
        },
        Err(e) => {
            if let Some(knob) = e.knob {
                refused_by(&route.name, served.decision.map(|d| d.tier), knob);
            }
            e.kind.outcome()
        }
    };
    instruments.request(&route.name, served.decision.map(|d| d.tier), outcome);
    if tracing::enabled!(tracing::Level::DEBUG) {
        let trace_id = ids.map(|ids| trace::hex::<32>(ids.trace_id));
        tracing::debug!(
            door = door.as_str(),
            request_id = ids.and_then(|ids| ids.request_id.to_str().ok()),
            trace_id = trace_id.as_ref().and_then(|t| std::str::from_utf8(t).ok()),
            route = route.name.as_str(),
            tier = served.decision.map(|d| d.tier.as_str()),
            reason = served.decision.map(|d| d.reason.as_str()),
            outcome,
            "served"
        );
    }
    served
}

/// Whether `request` is an LLM call (an OpenAI path, Triton's generate, or any asking
/// for a stream), and how its stream is to be relayed when it asks for one: the events'
/// shape (by its path), and whether the usage chunk is the gateway's to take out.
#[inline]
fn streaming(request: &Request<Bytes>) -> Option<Option<(Shape, bool)>> {
    let path = request.uri().path();
    if path.starts_with("/v2/") && path.ends_with("/infer") {
        return None; // a KServe v2 inference call: no extension looked up
    }
    let shape = Shape::of(path);
    match request.extensions().get::<crate::backend::stream::Wanted>() {
        Some(wanted) => Some(Some((shape, wanted.strip_usage))),
        None if shape != Shape::Plain || path.ends_with("/generate") => Some(None),
        None => None,
    }
}

/// An LLM call's whole `answer`: the tokens it says it used counted, and an OpenAI
/// answer saying the tier that served it in its `service_tier`, as OpenAI's do.
#[cold]
fn whole_llm(tier: Tier, mut answer: Reply, meter: &TokenMeter) -> Reply {
    if !answer.status().is_success() {
        return answer;
    }
    if let Some(usage) = crate::llm::openai::Usage::of(answer.body()) {
        meter.count(usage);
        crate::timing::tokens(answer.extensions_mut(), usage.prompt, usage.completion);
    }
    if let Some(echoed) =
        crate::llm::openai::with_service_tier(answer.body(), crate::decision::ServiceTier::echoed(tier))
    {
        *answer.body_mut() = echoed;
    }
    answer
}
