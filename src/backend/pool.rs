//! A pool: the backend endpoints serving one tier of one route, and the calls to them.
//!
//! Last stop on the request path. A [`Pool`] owns its own keep-alive connection pool
//! (HTTP/1.1 or HTTP/2), its own concurrency limit and its endpoints' load counters,
//! so no other tier or route shares any of them. [`Pool::forward`] admits a call
//! (shedding at once at the limit, never queueing), picks the less loaded of two
//! random endpoints among those not ejected (see [`super::health`]), and sends the
//! request under the caller's deadline: when the deadline passes the backend call is
//! dropped, which closes its connection. Every outcome feeds the endpoint's circuit,
//! a failure its input may have caused only once it is known whose it is (`blame`).

use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Request, Response};
use tokio::sync::{Semaphore, SemaphorePermit};
use tokio::time::Instant;
use tracing::Instrument;

mod again;
mod blame;

use super::checks::Probe;
use super::endpoint::{Endpoint, Failure, InFlight, Verdict};
use super::health::{Admit, Health};
use super::retry::{retry_counter, Budget, Reason, HEDGED, REFUSED, RETRIED};
use super::Role;
use crate::error::{Error, Kind};
use crate::metrics::Instruments;
use crate::policy::{HedgeSpec, PoolSpec, RetrySpec};
use crate::protocol;

/// A request fitted to a pool's backends: its parts and body, and for an HTTP/1.1 pool
/// the `traceparent` and `x-request-id` its calls write (other transports carry them in
/// the header map). Cloned for a hedge.
#[derive(Clone)]
struct Fitted {
    parts: http::request::Parts,
    body: Bytes,
    trace: Option<(crate::trace::TraceParent, http::HeaderValue)>,
    /// When it was last sent (for the answer's `Server-Timing`).
    sent_at: Option<Instant>,
    /// Failures its input may have caused, not charged yet (see `blame`).
    held: Vec<blame::Held>,
    /// Whether its caller asked for a stream (a stream's head is handed up at once).
    stream: bool,
}

/// Marks an answer (a server error) the call met alike on two endpoints: its input's
/// failure, not an endpoint's (see `blame`). A batch with it is split to find whose.
#[derive(Debug, Clone, Copy)]
pub struct InputFailed;

/// One endpoint of a pool as the admin API shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct EndpointView {
    /// `host:port`.
    pub endpoint: String,
    /// Its circuit.
    pub circuit: super::health::CircuitView,
    /// Calls to it in flight.
    pub in_flight: u64,
    /// What its answered calls take lately (a moving average); `None` before any.
    pub latency: Option<std::time::Duration>,
    /// What its streams take to their first token lately; `None` before any.
    pub first_token: Option<std::time::Duration>,
    /// What its streams take per token after the first, lately; `None` before any.
    pub per_token: Option<std::time::Duration>,
}

/// The endpoints of one tier of one route, with their connections and limit.
#[derive(Debug)]
pub struct Pool {
    route: String,
    role: Role,
    endpoints: Arc<Vec<Endpoint>>,
    limit: Arc<Semaphore>,
    max_concurrency: u32,
    binary_tensors: bool,
    transport: Transport,
    max_response_bytes: usize,
    instruments: Instruments,
    /// Triton sequences in flight: each kept to its endpoint, one step at a time.
    sequences: super::sequences::Sequences<usize>,
    /// What the pool's answered calls took (see [`super::latency`]).
    latency: super::latency::Latency,
    /// What its streams took to their first token, and per token after it (see
    /// [`super::stream`]).
    streams: Arc<super::stream::Learned>,
    /// Which failed calls go again to another endpoint.
    retry: RetrySpec,
    /// When a slow call is sent again to a second endpoint.
    hedge: Option<HedgeSpec>,
    /// How many retries and hedges may go, for the calls made (see [`super::retry`]).
    budget: Budget,
    /// The pool's clock for its endpoints' costs (see [`Pool::clock`]).
    born: Instant,
    /// Inputs found failing on two endpoints (see `blame`).
    blamed: blame::Blamed,
}

/// How the pool talks to its endpoints.
#[derive(Debug)]
enum Transport {
    /// KServe v2 over HTTP/1.1, idle connections per endpoint (same order), each call
    /// driving its own connection.
    Http1(Arc<Vec<super::h1::Conns>>),
    /// KServe v2 over HTTP/2, one client multiplexing calls over a connection per endpoint.
    Http2(Box<super::h2::Client>),
    /// KServe v2 over gRPC, one multiplexed channel per endpoint (same order).
    Grpc(Vec<super::grpc::Client>),
}

impl Pool {
    /// A pool of `route` in `role`, as `spec` describes, built with `settings`; connects
    /// lazily.
    pub fn new(route: &str, role: Role, spec: &PoolSpec, settings: &super::Settings) -> Self {
        let max_response_bytes = settings.max_response_bytes;
        let trust = &settings.trust;
        // The label of the pool's series; the control pool has none.
        let tier = match role {
            Role::Control => None,
            Role::Tier(_) | Role::Shadow | Role::Fallback => Some(role.as_str()),
        };
        let endpoints: Vec<Endpoint> = spec
            .endpoints
            .iter()
            .filter_map(|uri| uri.authority().cloned())
            .map(|authority| Endpoint {
                health: match tier {
                    Some(tier) => Health::new(spec.health.clone(), route, tier, authority.as_str()),
                    None => Health::unexported(spec.health.clone(), route, authority.as_str()),
                },
                authority,
                in_flight: AtomicUsize::new(0),
                cost: Default::default(),
                streams: Default::default(),
            })
            .collect();
        let endpoints = Arc::new(endpoints);
        let (transport, probe) = match spec.is_grpc() {
            true => {
                let clients: Vec<_> = endpoints
                    .iter()
                    .map(|e| {
                        let tls = spec.is_tls().then_some(trust);
                        super::grpc::client(&e.authority, tls, spec.connect_timeout, max_response_bytes)
                    })
                    .collect();
                (Transport::Grpc(clients.clone()), Probe::Grpc(clients))
            }
            false if spec.http2 => {
                let client = super::h2::client(spec, trust);
                let path = spec.health.check_path.clone().unwrap_or_default();
                (
                    Transport::Http2(Box::new(client.clone())),
                    Probe::Http2(Box::new(client), path),
                )
            }
            false => {
                let tls = spec.is_tls().then(|| trust.tls(&[b"http/1.1"]));
                let conns: Vec<_> = endpoints
                    .iter()
                    .map(|e| {
                        let max_idle = spec.max_concurrency.get() as usize;
                        let idle = super::h1::IDLE_TIMEOUT;
                        let tls = tls.as_ref().map(|tls| {
                            super::tls::Handshake::to(tls, &e.authority)
                                .expect("a validated policy's TLS endpoints have valid server names")
                        });
                        super::h1::Conns::new(e.authority.clone(), spec.connect_timeout, idle, max_idle, tls)
                    })
                    .collect();
                let conns = Arc::new(conns);
                super::h1::start_sweep(Arc::downgrade(&conns));
                let path = spec.health.check_path.clone().unwrap_or_default();
                (Transport::Http1(conns.clone()), Probe::Http1(conns, path))
            }
        };
        // Checks run when the route has a check path (gRPC pools use ServerReady instead),
        // for a tier's pool only: the control pool's endpoints are the tier pools' own.
        if spec.health.check_path.is_some() && tier.is_some() {
            super::checks::start(Arc::downgrade(&endpoints), probe, spec.health.check_interval);
        }
        if let Some(tier) = tier {
            // Every series of retries at 0 from the start, so a rate over them has a base.
            for reason in [Reason::Unreachable, Reason::Reset, Reason::Unavailable, Reason::Error] {
                retry_counter(route, tier, RETRIED, reason.as_str()).absolute(0);
            }
            for why in ["budget", "deadline", "input"] {
                retry_counter(route, tier, REFUSED, why).absolute(0);
            }
            for outcome in ["sent", "won", "cancelled", "over_budget"] {
                retry_counter(route, tier, HEDGED, outcome).absolute(0);
            }
        }
        Pool {
            route: route.to_owned(),
            role,
            endpoints,
            limit: Arc::new(Semaphore::new(spec.max_concurrency.get() as usize)),
            max_concurrency: spec.max_concurrency.get(),
            binary_tensors: spec.binary_tensors,
            transport,
            max_response_bytes,
            instruments: tier.map_or_else(Instruments::unexported, |tier| Instruments::new(route, tier)),
            sequences: super::sequences::Sequences::default(),
            latency: super::latency::Latency::default(),
            streams: Arc::default(),
            retry: spec.retry,
            hedge: spec.hedge,
            budget: Budget::new(&spec.retry, spec.hedge.map_or(0, |h| h.budget_per_mille)),
            born: Instant::now(),
            blamed: blame::Blamed::default(),
        }
    }

    /// Its streams' first tokens so far: how many, and their times summed in
    /// microseconds.
    pub fn first_tokens(&self) -> (u64, u64) {
        let (count, micros) = &self.streams.first_tokens;
        (
            count.load(std::sync::atomic::Ordering::Relaxed),
            micros.load(std::sync::atomic::Ordering::Relaxed),
        )
    }

    /// `GET path` on every endpoint in turn over the pool's own connections, each
    /// answer's body when it is 200 within `timeout` and at most `max_bytes` (a gRPC
    /// pool's endpoints answer none): how a pool reads its engines' metrics.
    pub async fn get_each(&self, path: &str, max_bytes: usize, timeout: Duration) -> Vec<Option<Bytes>> {
        let one = |at: usize| async move {
            let exchange = async {
                let response = match &self.transport {
                    Transport::Http1(conns) => {
                        let request = Request::get(path).body(Bytes::new()).ok()?;
                        conns.get(at)?.send(request, max_bytes).await.ok()?
                    }
                    Transport::Http2(client) => {
                        let uri = client
                            .uri(&self.endpoints.get(at)?.authority, path.parse().ok()?)
                            .ok()?;
                        let request = Request::get(uri).body(http_body_util::Full::new(Bytes::new())).ok()?;
                        client.request(request, (max_bytes, false)).await.ok()?
                    }
                    Transport::Grpc(_) => return None,
                };
                (response.status() == http::StatusCode::OK).then(|| response.into_body())
            };
            tokio::time::timeout(timeout, exchange).await.ok().flatten()
        };
        let mut answers = Vec::with_capacity(self.endpoints.len());
        for at in 0..self.endpoints.len() {
            answers.push(one(at).await);
        }
        answers
    }

    /// The largest answer it reads, in bytes (`limits.max_response_bytes`): what a
    /// stream's event cut apart by the gateway is held to.
    pub fn max_response_bytes(&self) -> usize {
        self.max_response_bytes
    }

    /// Its endpoints not ejected now.
    pub fn healthy(&self) -> usize {
        self.endpoints.iter().filter(|e| !e.health.is_ejected()).count()
    }

    /// Each endpoint now, in the policy's order: its circuit, calls in flight and what
    /// its calls take lately (for the admin API).
    pub fn endpoints_now(&self) -> Vec<EndpointView> {
        let now = Instant::now();
        let at = self.clock(now);
        self.endpoints
            .iter()
            .map(|e| {
                let (in_flight, micros) = e.load(at);
                let known = |micros: u64| (micros > 0).then(|| std::time::Duration::from_micros(micros));
                EndpointView {
                    endpoint: e.authority.to_string(),
                    circuit: e.health.view(now),
                    in_flight,
                    latency: known(micros),
                    first_token: known(e.streams[0].at(at)),
                    per_token: known(e.streams[1].at(at)),
                }
            })
            .collect()
    }

    /// Whether every endpoint of the pool is ejected, so every call would be refused.
    pub fn all_ejected(&self) -> bool {
        self.endpoints.iter().all(|e| e.health.is_ejected())
    }

    /// The refusal a call would get now because no endpoint would take it (each
    /// ejected, its time not up, or being probed), if so: for a caller that can serve
    /// the call elsewhere instead (a fallback pool, a canary's primary).
    pub fn ejected(&self) -> Option<Error> {
        let now = Instant::now();
        let none = !self.endpoints.iter().any(|e| e.health.would_admit(now));
        none.then(|| self.all_ejected_error(None, now))
    }

    /// Why a call sent now with `deadline` would be refused before it left (every
    /// endpoint ejected, the budget left too short, every call slot taken), if it would;
    /// for a caller that can serve it elsewhere instead (a canary's primary).
    pub fn would_refuse(&self, deadline: Instant) -> Option<Error> {
        if let Some(ejected) = self.ejected() {
            return Some(ejected);
        }
        if let Err(refused) = self.in_time(deadline) {
            return Some(refused);
        }
        (self.limit.available_permits() == 0).then(|| self.full())
    }

    /// Calls now in flight across the pool.
    pub fn in_flight(&self) -> usize {
        self.max_concurrency as usize - self.limit.available_permits()
    }

    /// Sends `request` (its path and query on a chosen endpoint) and returns the
    /// backend's answer, or an error that says who failed.
    ///
    /// Sheds with [`Kind::Shed`] at the concurrency limit, with [`Kind::Deadline`] when
    /// `deadline` has already passed, and with [`Kind::DeadlineUnmeetable`] when the
    /// time left is below what the pool's calls take (its learned floor, see
    /// `backend::latency`); a failed call goes again to another endpoint as the pool's
    /// retry policy says (its `retry` table).
    ///
    /// A request that asks for a stream ([`super::stream::Wanted`]) is answered, when
    /// its answer is one, with its head and the stream in its extensions; its deadline
    /// is its first token's, and the floor it is held to the pool's learned time to
    /// first token.
    pub async fn forward(&self, request: Request<Bytes>, deadline: Instant) -> Result<Response<Bytes>, Error> {
        let stream = super::stream::wanted(&request);
        self.forward_marked(request, deadline, stream).await
    }

    /// [`Pool::forward`] of a request whose caller has read already whether it asks for
    /// a stream (`stream`), so it is not read again.
    pub async fn forward_marked(
        &self,
        request: Request<Bytes>,
        deadline: Instant,
        stream: bool,
    ) -> Result<Response<Bytes>, Error> {
        let now = self.in_time_for(deadline, stream)?;
        if let Some(sequence) = request.extensions().get::<protocol::Sequence>() {
            let sequence = sequence.clone();
            return Box::pin(self.forward_step(request, deadline, sequence)).await;
        }
        let slot = self.slot()?;
        self.send_in(slot, request, (deadline, now), stream).await
    }

    /// What [`Pool::forward`] checks first: that `deadline` has not passed and that the
    /// time left covers what the pool's calls take; the time it was checked at.
    pub fn in_time(&self, deadline: Instant) -> Result<Instant, Error> {
        self.in_time_for(deadline, false)
    }

    /// [`Pool::in_time`] for a call that asks for a `stream` or not: a stream's budget
    /// runs to its first token, so it is held to what the pool's streams take to it.
    pub fn in_time_for(&self, deadline: Instant, stream: bool) -> Result<Instant, Error> {
        let now = Instant::now();
        if now >= deadline {
            return Err(Error::new(
                Kind::Deadline,
                "the budget was spent before the request reached a backend",
            ));
        }
        let learned = if stream {
            &self.streams.first_token
        } else {
            &self.latency
        };
        self.meetable_by(deadline - now, learned).map(|()| now)
    }

    /// A call slot, or the pool's refusal ([`Kind::Shed`]) when every one is taken: a
    /// caller that may send the request elsewhere asks for the slot before it gives the
    /// request away.
    pub fn slot(&self) -> Result<SemaphorePermit<'_>, Error> {
        self.limit.try_acquire().map_err(|_| self.full())
    }

    #[cold]
    fn full(&self) -> Error {
        Error::new(
            Kind::Shed,
            format!(
                "max_concurrency {} reached on route {}'s {} pool ({} calls in flight)",
                self.max_concurrency,
                self.route,
                self.role.as_str(),
                self.in_flight()
            ),
        )
        .knob("max_concurrency")
    }

    /// Sends `request` in `slot` (taken with [`Pool::slot`] after [`Pool::in_time`]), as
    /// [`Pool::forward`] does.
    pub async fn send_in(
        &self,
        slot: SemaphorePermit<'_>,
        request: Request<Bytes>,
        (deadline, now): (Instant, Instant),
        stream: bool,
    ) -> Result<Response<Bytes>, Error> {
        let (fitted, span) = self.fit(request, stream)?;
        let answer = self.call(fitted, deadline, now).instrument(span).await;
        drop(slot);
        answer
    }

    /// As [`Pool::forward`], but at the concurrency limit it waits for a call slot until
    /// `deadline` instead of shedding: for work nobody waits on (a shadow batch's lines).
    /// Never for a step of a sequence.
    pub async fn forward_waiting(&self, request: Request<Bytes>, deadline: Instant) -> Result<Response<Bytes>, Error> {
        let waited = tokio::time::timeout_at(deadline, self.limit.acquire()).await;
        let Ok(Ok(permit)) = waited else {
            return Err(Error::new(
                Kind::Deadline,
                format!(
                    "the budget ran out waiting for a call slot of route {} {} pool",
                    self.route,
                    self.role.as_str()
                ),
            ));
        };
        let stream = super::stream::wanted(&request);
        self.send_in(permit, request, (deadline, Instant::now()), stream).await
    }

    /// Fits `request` to the pool's backends and opens its span. An HTTP/1.1 call
    /// writes its trace headers itself; the others carry them in the header map.
    #[inline(always)]
    fn fit(&self, request: Request<Bytes>, stream: bool) -> Result<(Fitted, tracing::Span), Error> {
        let (mut parts, body) = request.into_parts();
        let body = self.adapt(&mut parts, body)?;
        let span = tracing::info_span!("backend", route = %self.route, tier = self.role.as_str(), endpoint = tracing::field::Empty);
        let trace = match parts.extensions.get::<crate::trace::Ids>() {
            Some(ids) if matches!(self.transport, Transport::Http1(_)) => {
                Some((ids.outgoing(&span), ids.request_id.clone()))
            }
            Some(ids) => {
                ids.to_backend(&span, &mut parts.headers);
                None
            }
            None => None,
        };
        Ok((
            Fitted {
                parts,
                body,
                trace,
                sent_at: None,
                held: Vec::new(),
                stream,
            },
            span,
        ))
    }

    /// Sends a step of a Triton sequence to the endpoint holding the sequence's state,
    /// after every earlier step of it (see [`super::sequences`]); never to another
    /// endpoint, which would not know the sequence.
    async fn forward_step(
        &self,
        request: Request<Bytes>,
        deadline: Instant,
        sequence: protocol::Sequence,
    ) -> Result<Response<Bytes>, Error> {
        let pinned = self
            .sequences
            .pin(&sequence.id, || self.pick(Instant::now()).map(|(at, _)| at))?
            .ok_or_else(|| {
                Error::new(
                    Kind::Shed,
                    format!(
                        "live sequences {} reached on route {}'s {} pool (each held until its sequence_end step or \
                         60 s idle); end sequences with sequence_end",
                        super::sequences::MAX_LIVE,
                        self.route,
                        self.role.as_str(),
                    ),
                )
                .knob("sequences")
            })?;
        let waiting = &self.instruments.sequence_steps_waiting;
        waiting.increment(1.0);
        let turn = tokio::time::timeout_at(deadline, pinned.turn.lock()).await;
        waiting.decrement(1.0);
        let Ok(_turn) = turn else {
            return Err(Error::new(
                Kind::Deadline,
                format!(
                    "the budget ran out while sequence {}'s earlier steps were served",
                    sequence.id
                ),
            ));
        };
        self.meetable(deadline.saturating_duration_since(Instant::now()))?;
        let _slot = self.slot()?;
        let (mut fitted, span) = self.fit(request, false)?;
        let at = pinned.to;
        let result = self
            .send((at, false), &mut fitted, deadline, Instant::now())
            .instrument(span)
            .await;
        self.settle_alone(&mut fitted);
        let result = result.map_err(|f| self.error(at, f));
        if sequence.end {
            self.sequences.release(&sequence.id, &pinned);
        }
        result
    }

    /// Sends to one endpoint, and when that fails in a way the pool retries, again to
    /// others ([`Pool::again`]); a call the pool hedges goes through [`Pool::hedged`].
    /// `now` is the caller's last reading of the clock (checking the deadline, a moment
    /// before): one reading for the deadline, the choice, the call's start and its
    /// connection's idle check.
    async fn call(&self, mut fitted: Fitted, deadline: Instant, now: Instant) -> Result<Response<Bytes>, Error> {
        let first = self.pick(now)?;
        if let Some(after) = self.hedge_after(&fitted.parts) {
            // Boxed, as a retry: a hedged pool is rare, its state large.
            return Box::pin(self.hedged(fitted, deadline, (first, now), after)).await;
        }
        let result = self.send(first, &mut fitted, deadline, now).await;
        match self.retryable(&result, &fitted.parts) {
            None => {
                if !fitted.held.is_empty() {
                    self.settle_alone(&mut fitted);
                }
                result.map_err(|f| self.error(first.0, f))
            }
            // Boxed: a retry is rare, and its state would make every call's future larger.
            Some(reason) => Box::pin(self.again(fitted, deadline, vec![first.0], first.0, result, reason)).await,
        }
    }

    /// `Ok` unless `left` is below the time nine calls of the pool in ten take: such a
    /// call is refused before it is sent, so a budget too short for the backend neither
    /// loads it nor, cut short, counts against it.
    #[inline(always)]
    fn meetable(&self, left: Duration) -> Result<(), Error> {
        self.meetable_by(left, &self.latency)
    }

    /// [`Pool::meetable`] against what `learned` says the pool's calls take.
    #[inline(always)]
    fn meetable_by(&self, left: Duration, learned: &super::latency::Latency) -> Result<(), Error> {
        match learned.floor() {
            Some(floor) if left < floor => Err(self.unmeetable(left, floor)),
            _ => Ok(()),
        }
    }

    #[cold]
    fn unmeetable(&self, left: Duration, floor: Duration) -> Error {
        Error::new(
            Kind::DeadlineUnmeetable,
            format!(
                "deadline unmeetable: learned cost {:.1} ms (nine calls in ten of route {}'s {} pool take longer) > \
                 {:.1} ms left of the budget; send a longer budget",
                floor.as_secs_f64() * 1e3,
                self.route,
                self.role.as_str(),
                left.as_secs_f64() * 1e3
            ),
        )
        .knob("deadline")
    }

    /// Fits an infer request to what the pool's HTTP backends read: JSON bodies get the
    /// content type some servers insist on; binary-extension bodies are re-encoded as
    /// JSON tensors when the pool says its backends do not read binary tensors.
    fn adapt(&self, parts: &mut http::request::Parts, body: Bytes) -> Result<Bytes, Error> {
        if matches!(self.transport, Transport::Grpc(_)) || !parts.uri.path().ends_with("/infer") {
            return Ok(body);
        }
        let header_len =
            protocol::header_len(&parts.headers).map_err(|e| Error::new(Kind::BadRequest, e.to_string()))?;
        let json = HeaderValue::from_static("application/json");
        match header_len {
            None => {
                parts.headers.entry(http::header::CONTENT_TYPE).or_insert(json);
                Ok(body)
            }
            Some(_) if self.binary_tensors => Ok(body),
            Some(_) => {
                let encoded = protocol::as_json_tensors(&body, header_len)
                    .map_err(|e| Error::new(Kind::BadRequest, e.to_string()))?
                    .ok_or_else(|| {
                        Error::new(
                            Kind::BadRequest,
                            format!(
                                "route {}'s backends read JSON tensors only (binary_tensors = false), and a tensor in \
                                 this request cannot be carried as JSON (FP16, NaN or infinity, or BYTES that are not UTF-8)",
                                self.route
                            ),
                        )
                    })?;
                parts.headers.remove(protocol::HEADER_LEN);
                parts.headers.insert(http::header::CONTENT_TYPE, json);
                Ok(encoded)
            }
        }
    }

    /// Power of two choices among the endpoints whose circuit admits a call, on each
    /// one's calls in flight weighed by what its calls take
    /// ([`Cost`](super::endpoint::Cost), as Finagle's peak EWMA balancer: the cost times
    /// one more than the calls in flight). When the two weigh within a quarter of each
    /// other, or either cost is not known yet, the one with fewer calls in flight (ties
    /// to a random one), so like endpoints share the work evenly. `Unavailable` when
    /// every endpoint is ejected. Returns the endpoint and whether the call is its probe.
    fn pick(&self, now: Instant) -> Result<(usize, bool), Error> {
        let n = self.endpoints.len();
        // Two random endpoints first, the less loaded one first (the common case: both
        // circuits closed); then the rest, should both be ejected.
        let a = rand::random_range(0..n.max(1));
        let b = match n {
            0 | 1 => a,
            _ => {
                let b = rand::random_range(0..n - 1);
                b + usize::from(b >= a)
            }
        };
        let b_first = n > 1 && {
            // The clock read only here: a pool of one endpoint has nothing to weigh.
            let clock = self.clock(now);
            let load = |i: usize| self.endpoints[i].load(clock);
            let ((calls_a, cost_a), (calls_b, cost_b)) = (load(a), load(b));
            let (weight_a, weight_b) = ((calls_a + 1) * cost_a, (calls_b + 1) * cost_b);
            match cost_a == 0 || cost_b == 0 {
                true => calls_b < calls_a,
                // One clearly dearer (by a quarter): the other.
                false if weight_b * 5 < weight_a * 4 => true,
                false if weight_a * 5 < weight_b * 4 => false,
                false => calls_b < calls_a,
            }
        };
        let (first, second) = match b_first {
            true => (b, a),
            false => (a, b),
        };
        let rest = (0..n).filter(|i| *i != first && *i != second);
        let mut reopens = None::<Instant>;
        for i in [first, second].into_iter().take(if n > 1 { 2 } else { 1 }).chain(rest) {
            match self.endpoints[i].health.admit(now) {
                Admit::Yes => return Ok((i, false)),
                Admit::Probe => return Ok((i, true)),
                Admit::No(until) => reopens = Some(reopens.map_or(until, |r| r.min(until))),
            }
        }
        Err(self.all_ejected_error(reopens, now))
    }

    /// The least loaded endpoint not in `tried` whose circuit admits a call (ties to
    /// the first), for a retry; with whether the call is its probe.
    fn pick_untried(&self, tried: &[usize], now: Instant) -> Option<(usize, bool)> {
        let mut order: Vec<usize> = (0..self.endpoints.len()).filter(|i| !tried.contains(i)).collect();
        let clock = self.clock(now);
        order.sort_by_key(|i| {
            let (calls, cost) = self.endpoints[*i].load(clock);
            (calls + 1) * cost.max(1)
        });
        order
            .into_iter()
            .find_map(|i| match self.endpoints[i].health.admit(now) {
                Admit::Yes => Some((i, false)),
                Admit::Probe => Some((i, true)),
                Admit::No(_) => None,
            })
    }

    /// Milliseconds since the pool was made, wrapping: the clock of its endpoints' costs.
    #[inline]
    fn clock(&self, now: Instant) -> u32 {
        super::endpoint::clock(self.born, now)
    }

    #[cold]
    fn all_ejected_error(&self, reopens: Option<Instant>, now: Instant) -> Error {
        let wait = reopens.map_or(Duration::from_secs(1), |r| r.saturating_duration_since(now));
        Error::new(
            Kind::Unavailable,
            format!(
                "every endpoint of route {}'s {} pool is ejected after failing; the first may be tried again in {} ms",
                self.route,
                self.role.as_str(),
                wait.as_millis()
            ),
        )
    }

    /// One call to endpoint `at` (`probe`: the call is its circuit's probe), sent at
    /// `started`, under `deadline`; its outcome feeds the endpoint's circuit and cost.
    async fn send(
        &self,
        (at, probe): (usize, bool),
        fitted: &mut Fitted,
        deadline: Instant,
        started: Instant,
    ) -> Result<Response<Bytes>, Failure> {
        let Fitted {
            parts,
            body,
            trace,
            sent_at,
            held,
            stream,
        } = fitted;
        let stream = *stream;
        let sent: &Bytes = body;
        let body = body.clone();
        // Read before the call, which may move the headers out of `parts`.
        let post = parts.method == http::Method::POST;
        let kserve = parts.uri.path().starts_with("/v2/");
        let endpoint = &self.endpoints[at];
        crate::telemetry::current_span().record("endpoint", tracing::field::display(&endpoint.authority));
        let _in_flight = InFlight::enter(&endpoint.in_flight);
        let mut verdict = Verdict {
            health: &endpoint.health,
            probe,
            given: false,
        };
        *sent_at = Some(started);
        self.budget.deposit(started);
        // The gRPC and HTTP/2 calls are boxed: the gRPC one's future is the largest, and
        // unboxed it would set the size of every call's future (moved on each request).
        let call = async {
            match &self.transport {
                Transport::Http1(conns) => {
                    conns[at]
                        .send_call(
                            parts,
                            body,
                            (trace.as_ref(), started),
                            (self.max_response_bytes, stream),
                        )
                        .await
                }
                Transport::Http2(client) => {
                    Box::pin(super::h2::send(
                        client,
                        &endpoint.authority,
                        &*parts,
                        body,
                        (self.max_response_bytes, stream),
                    ))
                    .await
                }
                Transport::Grpc(clients) => {
                    Box::pin(super::grpc::call(clients[at].clone(), &*parts, body, deadline)).await
                }
            }
        };
        let call = tokio::time::timeout_at(deadline, call);
        tokio::pin!(call);
        let slow = endpoint
            .health
            .spec()
            .slow_call
            .map(|d| started + d)
            .filter(|s| *s < deadline);
        let result = match slow {
            Some(slow) => tokio::select! {
                done = &mut call => done,
                _ = tokio::time::sleep_until(slow) => {
                    // Stalled: set the endpoint aside now (once per input: a call may be
                    // slow for its input), still wait for this answer.
                    verdict.fail_on("slow", blame::fingerprint(sent));
                    call.await
                }
            },
            None => call.await,
        };
        let mut result = result.unwrap_or(Err(Failure::Deadline));
        let streamed = stream
            && result
                .as_mut()
                .is_ok_and(|answer| self.streamed(answer, (at, sent), (deadline, started)));
        if let (Ok(answer), false) = (&result, streamed) {
            // A pass-through answer is read by the client only: look at it here, so an
            // endpoint answering 200 with something else is caught and set aside.
            let http = !matches!(self.transport, Transport::Grpc(_));
            if http && answer.status().is_success() && post {
                if let Err(why) = protocol::answer_envelope(answer.headers(), answer.body(), kserve) {
                    result = Err(Failure::Garbled(why));
                }
            }
        }
        let took = started.elapsed();
        self.instruments.backend_seconds.record(took.as_secs_f64());
        // A failure after the request was sent may be its input's: held until the call
        // has been tried elsewhere (or settled alone), never charged here.
        let mut hold = |why| {
            if !verdict.given {
                held.push((at, why));
            }
        };
        match &result {
            Ok(r) if r.status().is_server_error() => hold("status_5xx"),
            Ok(_) => {
                verdict.pass();
                if !streamed {
                    // A stream's head says nothing of what its answer takes.
                    self.latency.answered(took);
                }
                endpoint.cost.answered(took, self.clock(started));
            }
            Err(Failure::Connect(_)) => verdict.fail("unreachable"),
            // Cut by the caller's deadline: the endpoint's fault only when it took longer
            // than the pool's own limit (`slow_call`, else its learned p99); a budget the
            // caller made too short says nothing about the endpoint.
            Err(Failure::Deadline) => {
                endpoint.cost.at_least(took, self.clock(started));
                let limit = endpoint.health.spec().slow_call.or_else(|| self.latency.p99());
                if limit.is_some_and(|limit| took > limit) {
                    hold("timeout");
                }
            }
            Err(Failure::Unanswered(_) | Failure::Other(_) | Failure::Body(_) | Failure::Garbled(_)) => {
                hold("broken_answer")
            }
        }
        result
    }

    /// Wraps the stream a transport handed up with `answer` (from endpoint `at`, for a
    /// request of body `sent`, due by `deadline` and sent at `started`) for the tiers
    /// and doors above; whether it was one.
    #[cold]
    fn streamed(
        &self,
        answer: &mut Response<Bytes>,
        (at, sent): (usize, &Bytes),
        (deadline, started): (Instant, Instant),
    ) -> bool {
        let Some(body) = answer
            .extensions_mut()
            .remove::<super::stream::Raw>()
            .and_then(|raw| raw.take())
        else {
            return false;
        };
        let outcome = super::stream::Outcome::new(
            (self.endpoints.clone(), at),
            blame::fingerprint(sent),
            (self.born, self.streams.clone()),
        );
        let stream = super::stream::Stream {
            body,
            deadline,
            sent: started,
            outcome,
        };
        answer.extensions_mut().insert(super::stream::Streamed::new(stream));
        true
    }

    fn error(&self, at: usize, failure: Failure) -> Error {
        let backend = &self.endpoints[at].authority;
        match failure {
            Failure::Connect(why) => Error::new(Kind::Backend, format!("backend {backend} is unreachable: {why}")),
            Failure::Unanswered(why) | Failure::Other(why) => {
                Error::new(Kind::Backend, format!("backend {backend} failed: {why}"))
            }
            Failure::Body(why) => Error::new(
                Kind::Backend,
                format!(
                    "backend {backend} response could not be read (limit {} bytes): {why}",
                    self.max_response_bytes
                ),
            ),
            Failure::Garbled(why) => Error::new(
                Kind::Backend,
                format!("backend {backend} answered with success but not with an answer: {why}"),
            ),
            Failure::Deadline => Error::new(
                Kind::Deadline,
                format!("the budget ran out while backend {backend} was working; the call was dropped"),
            ),
        }
    }
}
