//! HTTP/1.1 to one endpoint: a stack of idle keep-alive connections, each used by one
//! call at a time, in that call's task.
//!
//! Under the pool, for HTTP/1.1 pools (HTTP/2 pools keep hyper-util's client, whose one
//! connection carries many calls). A call takes the most recently used idle connection
//! (or opens one), writes its request and reads the whole answer itself ([`wire`]: no
//! task, channel or streaming body between them), and puts the connection back on the
//! stack.
//!
//! - A connection is reused only by the runtime that opened it: its socket is
//!   registered with that runtime's I/O driver, so a connection opened by offline work
//!   on the batch threads never carries a real-time call, nor the reverse.
//! - A call dropped mid-exchange (its deadline passed) drops its connection, which
//!   closes it; a connection is put back only after a whole answer, open and in step.
//! - A request that never left (the idle connection turned out closed by the backend)
//!   goes again on another connection; one that may have left is never sent twice.
//! - Idle connections are closed after the idle timeout ([`IDLE_TIMEOUT`] in pools), by
//!   the next call or by the sweep; at most `max_idle` are kept.

use std::sync::{Mutex, Weak};
use std::time::Duration;

use bytes::Bytes;
use http::uri::Authority;
use http::{HeaderValue, Request, Response};
use tokio::net::TcpStream;
use tokio::runtime::Handle;
use tokio::time::Instant;

use super::endpoint::{chain, Failure};
use super::message::{outgoing, path_and_query, restore};
use super::tls::Handshake;
pub(super) use wire::{is_event_stream, Trace};
use wire::{Io, Sent, Wire};

mod wire;

/// How long a pool's connection may sit idle before it is closed.
pub(super) const IDLE_TIMEOUT: Duration = Duration::from_secs(90);

/// The idle connections to one endpoint.
#[derive(Debug)]
pub(super) struct Conns {
    authority: Authority,
    host: HeaderValue,
    connect_timeout: Duration,
    idle_timeout: Duration,
    max_idle: usize,
    /// For `https://` endpoints: how their TLS sessions are opened.
    tls: Option<Handshake>,
    /// Oldest at the bottom; calls take from the top.
    idle: Mutex<Stack>,
}

/// Idle connections, each boxed so that taking and returning one moves a pointer, and a
/// call's future holds 8 bytes for it rather than the whole connection state.
#[allow(clippy::vec_box)] // the point is the move, not the heap
type Stack = Vec<Box<Idle>>;

/// An open connection nobody is using.
struct Idle {
    runtime: tokio::runtime::Id,
    since: Instant,
    /// Whether it has carried a call (and so may have been closed by the backend since).
    used: bool,
    wire: Wire,
}

impl std::fmt::Debug for Idle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Idle")
            .field("since", &self.since)
            .finish_non_exhaustive()
    }
}

impl Conns {
    /// Connections to `authority` (an endpoint's host and port), opened within
    /// `connect_timeout`, at most `max_idle` kept idle, each for less than `idle_timeout`;
    /// over TLS with `tls` (an `https://` endpoint).
    pub(super) fn new(
        authority: Authority,
        connect_timeout: Duration,
        idle_timeout: Duration,
        max_idle: usize,
        tls: Option<Handshake>,
    ) -> Self {
        let host = HeaderValue::from_str(authority.as_str()).expect("an authority is a valid header value");
        Conns {
            authority,
            host,
            connect_timeout,
            idle_timeout,
            max_idle,
            tls,
            idle: Mutex::new(Vec::new()),
        }
    }

    /// Sends the call of `parts` and `body` (in origin form, the path shared, not parsed
    /// again) with only its end-to-end headers, and reads the whole answer (at most
    /// `max_body` bytes), keeping only its end-to-end headers. The headers are moved into
    /// the backend request and back into `parts` after, so the pool can send the call
    /// again elsewhere.
    pub(super) async fn send_call(
        &self,
        parts: &mut http::request::Parts,
        body: Bytes,
        (trace, started): (Option<&Trace>, Instant),
        (max_body, stream): (usize, bool),
    ) -> Result<Response<Bytes>, Failure> {
        let mut uri = http::uri::Parts::default();
        uri.path_and_query = Some(path_and_query(parts));
        let uri = http::Uri::from_parts(uri).map_err(|e| Failure::Other(e.to_string()))?;
        let mut request = outgoing(parts, uri, body);
        let answer = self.exchange(&mut request, (trace, started), (max_body, stream)).await;
        restore(parts, request);
        answer
    }

    /// Sends `request` (its URI in origin form, `/path?query`) and reads the whole
    /// answer, refusing a body over `max_body` bytes.
    pub(super) async fn send(&self, mut request: Request<Bytes>, max_body: usize) -> Result<Response<Bytes>, Failure> {
        self.exchange(&mut request, (None, Instant::now()), (max_body, false))
            .await
    }

    /// [`Conns::send`] of a request the caller keeps, sent at `started` (the idle
    /// connections' timeout is checked against it).
    async fn exchange(
        &self,
        request: &mut Request<Bytes>,
        (trace, started): (Option<&Trace>, Instant),
        framed: (usize, bool),
    ) -> Result<Response<Bytes>, Failure> {
        let runtime = match Handle::try_current() {
            Ok(handle) => handle.id(),
            Err(e) => return Err(Failure::Other(e.to_string())),
        };
        loop {
            let mut conn = match self.take(runtime, started) {
                Some(idle) => idle,
                None => self.connect(runtime).await?,
            };
            match conn.wire.exchange(request, &self.host, trace, framed, conn.used).await {
                Sent::Done(mut answer) => {
                    // Only after a whole answer is the connection in step for another.
                    if answer.is_ok() && conn.wire.reusable {
                        conn.used = true;
                        self.put(conn);
                    } else if let (Some(framing), Ok(head)) = (conn.wire.streaming(), &mut answer) {
                        streamed(head, conn.wire, framing);
                    }
                    return answer;
                }
                // A stale idle connection: try the next one, or a new one.
                Sent::Unsent(why) => {
                    tracing::debug!(endpoint = %self.authority, "{why}: the request goes on another connection");
                }
            }
        }
    }

    /// Closes the connections idle for the idle timeout or longer.
    pub(super) fn sweep(&self) {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        let expired = self.drain_expired(&mut idle, Instant::now());
        drop(idle);
        drop(expired); // closes them, outside the lock
    }

    /// The most recently used idle connection opened on `runtime`, if any; the ones
    /// expired by `now` are closed on the way.
    fn take(&self, runtime: tokio::runtime::Id, now: Instant) -> Option<Box<Idle>> {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        let expired = self.drain_expired(&mut idle, now);
        let found = idle
            .iter()
            .rposition(|c| c.runtime == runtime)
            .map(|at| idle.remove(at));
        drop(idle);
        drop(expired); // closes them, outside the lock
        found
    }

    /// Puts an open connection back on top, unless `max_idle` are already idle.
    fn put(&self, mut conn: Box<Idle>) {
        conn.since = Instant::now();
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        if idle.len() < self.max_idle {
            idle.push(conn);
        }
    }

    /// Takes the connections idle for the idle timeout or longer off the stack (the
    /// caller drops them).
    fn drain_expired(&self, idle: &mut Stack, now: Instant) -> Stack {
        let stale = idle
            .iter()
            .take_while(|c| now.duration_since(c.since) >= self.idle_timeout)
            .count();
        idle.drain(..stale).collect()
    }

    /// Opens a connection (and its TLS session, for an `https://` endpoint) within the
    /// connect timeout.
    async fn connect(&self, runtime: tokio::runtime::Id) -> Result<Box<Idle>, Failure> {
        let host = self.authority.host().trim_start_matches('[').trim_end_matches(']');
        let port = self.authority.port_u16().unwrap_or(80);
        let timed_out = |what: &str| {
            Failure::Connect(format!(
                "{what} timed out after {} ms",
                self.connect_timeout.as_millis()
            ))
        };
        let opened = Instant::now() + self.connect_timeout;
        let stream = tokio::time::timeout_at(opened, TcpStream::connect((host, port)))
            .await
            .map_err(|_| timed_out("tcp connect"))?
            .map_err(|e| Failure::Connect(format!("tcp connect error: {e}")))?;
        stream
            .set_nodelay(true)
            .map_err(|e| Failure::Connect(format!("tcp connect error: {e}")))?;
        let io = match &self.tls {
            None => Io::Plain(stream),
            Some(tls) => {
                let session = tokio::time::timeout_at(opened, tls.open(stream))
                    .await
                    .map_err(|_| timed_out("tls handshake"))?
                    .map_err(|e| Failure::Connect(format!("tls handshake error: {}", chain(&e))))?;
                Io::Tls(Box::new(session))
            }
        };
        Ok(Box::new(Idle {
            runtime,
            since: Instant::now(),
            used: false,
            wire: Wire::new(io),
        }))
    }
}

/// Gives a stream's `head` its body, read as it comes on `wire` (which it keeps),
/// `framing` delimiting it.
#[cold]
fn streamed(head: &mut Response<Bytes>, wire: Wire, framing: wire::Framing) {
    let body = wire.into_stream(framing);
    let body = http_body_util::BodyExt::boxed_unsync(body);
    head.extensions_mut().insert(super::stream::Raw::new(body));
}

/// Starts closing `conns`' expired idle connections every half [`IDLE_TIMEOUT`], if a
/// runtime is running; the task ends when the pool is dropped.
pub(super) fn start_sweep(conns: Weak<Vec<Conns>>) {
    let Ok(runtime) = Handle::try_current() else {
        return;
    };
    runtime.spawn(async move {
        let mut tick = tokio::time::interval(IDLE_TIMEOUT / 2);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let Some(conns) = conns.upgrade() else {
                return;
            };
            conns.iter().for_each(Conns::sweep);
        }
    });
}

#[cfg(test)]
impl Conns {
    /// How many connections are idle now.
    fn idle_count(&self) -> usize {
        self.idle.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

#[cfg(test)]
mod tests;
