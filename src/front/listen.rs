//! Accepting connections, for every door: limits on open connections (in all and per
//! client address), deadlines that close connections which send nothing useful, and a
//! close that resets nobody (the backlog is taken before the listener goes).
//!
//! A connection must send its first complete request head (HTTP/2: the preface and
//! its first frame) within `first_request` of being accepted, and is closed once it has
//! had no request in flight for `idle`. Both are enforced on the socket itself
//! ([`Counted`]'s reads fail with `TimedOut`), so they hold for every door and protocol
//! without the servers' cooperation: a client holding sockets open, idle or half-sent,
//! cannot keep them, and so cannot take the connection limit away from others.

use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;
use tokio_stream::{Stream, StreamExt as _};
use tokio_util::sync::CancellationToken;

use crate::metrics;

/// What a listener allows its connections, and how it secures them.
#[derive(Clone)]
pub struct Connections {
    /// Open connections; past it new ones are closed at once.
    pub max: usize,
    /// Open connections from one client address (0: no limit of its own).
    pub per_client: usize,
    /// From accept to the first complete request head (HTTP/2: preface and first frame).
    pub first_request: Duration,
    /// How long a connection may have no request in flight before it is closed.
    pub idle: Duration,
    /// TLS, when the listener speaks it (see [`super::tls`]).
    pub tls: Option<TlsAcceptor>,
}

impl std::fmt::Debug for Connections {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connections")
            .field("max", &self.max)
            .field("per_client", &self.per_client)
            .field("first_request", &self.first_request)
            .field("idle", &self.idle)
            .field("tls", &self.tls.is_some())
            .finish()
    }
}

impl Connections {
    /// The data doors' allowance, from the startup limits.
    pub fn from_limits(limits: &crate::config::Limits) -> Self {
        Connections {
            max: limits.max_connections,
            per_client: limits.max_connections_per_client,
            first_request: limits.header_read_timeout,
            idle: limits.idle_timeout,
            tls: None,
        }
    }

    /// The same allowance, each connection secured by `tls` first.
    pub fn with_tls(mut self, tls: Option<TlsAcceptor>) -> Self {
        self.tls = tls;
        self
    }

    /// A small listener's (the admin API, the metrics endpoint): `max` connections,
    /// 10 s to the first request, 2 minutes idle.
    pub fn small(max: usize) -> Self {
        Connections {
            max,
            per_client: 0,
            first_request: Duration::from_secs(10),
            idle: Duration::from_secs(120),
            tls: None,
        }
    }
}

/// Connections accepted on `listener` within `allow`'s limits (closed at once beyond),
/// until `closing` fires. Then those the kernel has already completed (its backlog) are
/// taken too, and only then is the listener closed: closing it with them still queued
/// would reset them, after their clients had sent a request. New clients are refused at
/// connect from then on.
/// With TLS, each connection's handshake runs on a task of its own (a slow one holds up
/// nobody) and the connection comes out once it is done.
pub(super) fn accept(listener: TcpListener, allow: Connections, closing: CancellationToken) -> mpsc::Receiver<Conn> {
    let open = Arc::new(Semaphore::new(allow.max.clamp(1, Semaphore::MAX_PERMITS)));
    let clients = Arc::new(Clients::default());
    let deadlines = Deadlines {
        first_request: allow.first_request,
        idle: allow.idle,
    };
    let (tx, rx) = mpsc::channel(64);
    tokio::spawn(async move {
        let count = |stream: TcpStream, peer: SocketAddr| {
            let refused = |reason| {
                // Closed at once rather than let the backlog grow.
                ::metrics::counter!(metrics::ADMISSION_REFUSALS, "reason" => reason).increment(1);
                None
            };
            let Ok(permit) = open.clone().try_acquire_owned() else {
                return refused("connections");
            };
            let Some(client) = Clients::enter(&clients, peer.ip(), allow.per_client) else {
                return refused("connections_per_client");
            };
            let _ = stream.set_nodelay(true);
            Some(Counted::new(stream, peer, deadlines, (permit, client)))
        };
        // Hands a counted connection on: at once, or once its TLS handshake is done.
        let hand_on = |counted: Counted, tx: &mpsc::Sender<Conn>| {
            let tx = tx.clone();
            let tls = allow.tls.clone();
            async move {
                match tls {
                    None => tx.send(Conn::Plain(counted)).await.is_ok(),
                    Some(tls) => {
                        tokio::spawn(async move {
                            let peer = counted.peer;
                            match tls.accept(counted).await {
                                Ok(secured) => {
                                    let _ = tx.send(Conn::Tls(Box::new(secured))).await;
                                }
                                Err(e) => tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                            }
                        });
                        true
                    }
                }
            }
        };
        loop {
            let (stream, peer) = tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok(pair) => pair,
                    Err(e) => {
                        // Out of file descriptors and the like: back off instead of spinning.
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
                () = closing.cancelled() => break,
            };
            if let Some(counted) = count(stream, peer) {
                if !hand_on(counted, &tx).await {
                    return;
                }
            }
        }
        let Ok(listener) = listener.into_std() else { return };
        while let Ok((stream, peer)) = listener.accept() {
            let Ok(stream) = stream.set_nonblocking(true).and_then(|()| TcpStream::from_std(stream)) else {
                continue;
            };
            if let Some(counted) = count(stream, peer) {
                if !hand_on(counted, &tx).await {
                    return;
                }
            }
        }
        // `listener` closes here, with nothing left in its backlog.
    });
    rx
}

/// Accepted connections for a server that takes a stream of them (the gRPC door),
/// within `allow`'s limits, as the HTTP doors accept theirs: the stream ends once
/// `closing` has fired and the listener's backlog is taken, and the listener closes.
pub fn limited_incoming(
    listener: TcpListener,
    allow: Connections,
    closing: CancellationToken,
) -> impl Stream<Item = std::io::Result<Conn>> {
    tokio_stream::wrappers::ReceiverStream::new(accept(listener, allow, closing)).map(Ok)
}

/// Open connections by client address.
#[derive(Debug, Default)]
struct Clients(Mutex<HashMap<IpAddr, usize>>);

/// One open connection of a client address, given back on drop.
#[derive(Debug)]
struct Client {
    clients: Arc<Clients>,
    ip: IpAddr,
}

impl Clients {
    /// A place for one more connection from `ip`, or `None` when it has `max` (0: no
    /// limit, and no count kept).
    fn enter(this: &Arc<Self>, ip: IpAddr, max: usize) -> Option<Option<Client>> {
        if max == 0 {
            return Some(None);
        }
        let mut open = this.0.lock().unwrap_or_else(|e| e.into_inner());
        let n = open.entry(ip).or_insert(0);
        if *n >= max {
            return None;
        }
        *n += 1;
        Some(Some(Client {
            clients: this.clone(),
            ip,
        }))
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        let mut open = self.clients.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = open.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.ip);
            }
        }
    }
}

/// What a connection's server tells its socket: when a request starts and ends.
#[derive(Debug)]
pub struct Activity {
    accepted: Instant,
    in_flight: AtomicUsize,
    /// Requests begun (the HTTP/2 preface and first frame count as one).
    started: AtomicU64,
    /// Whether the connection has had a request (or, on HTTP/2, its first frame).
    opened: AtomicBool,
    /// Told on the first request, so a stop knows whether the connection has had one.
    asked: Notify,
}

/// How many quiet looks, `idle / IDLE_LOOKS` apart, close a connection as idle: it is
/// closed between `idle` and 1.25 × `idle` after its last request ended, and a request
/// costs its connection two atomic counts, no clock read and no timer change.
const IDLE_LOOKS: u32 = 4;

impl Activity {
    /// A request has started on the connection; it is in flight until the guard drops.
    pub fn begin(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        self.started.fetch_add(1, Ordering::Relaxed);
        if !self.opened.swap(true, Ordering::AcqRel) {
            self.asked.notify_one();
        }
        InFlight(self.clone())
    }

    /// Waits until the connection has had its first request (returns at once if so).
    pub(super) async fn asked(&self) {
        if !self.opened.load(Ordering::Acquire) {
            self.asked.notified().await;
        }
    }
}

/// A request in flight on a connection.
#[derive(Debug)]
pub struct InFlight(Arc<Activity>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The HTTP/2 connection preface.
const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// The preface and the first frame's header.
const OPENING: usize = PREFACE.len() + 9;

/// A connection's deadlines, from its listener's [`Connections`].
#[derive(Debug, Clone, Copy)]
struct Deadlines {
    first_request: Duration,
    idle: Duration,
}

impl Deadlines {
    /// How often an opened connection is looked at for being idle.
    fn every(self) -> Duration {
        (self.idle / IDLE_LOOKS).max(Duration::from_millis(1))
    }
}

/// A connection counted against its listener's limits until it closes, whose reads
/// fail with `TimedOut` once it passes its deadline.
pub struct Counted {
    stream: TcpStream,
    peer: SocketAddr,
    deadlines: Deadlines,
    activity: Arc<Activity>,
    deadline: Pin<Box<Sleep>>,
    /// `activity.started` at the last look, and how many looks in a row found the
    /// connection with no request in flight and none begun since.
    seen: u64,
    quiet: u32,
    /// The waker `deadline` was last polled with (it wakes that task when it fires).
    registered: Option<std::task::Waker>,
    /// The first bytes read, until the connection has opened (see [`Opening::note`]).
    opening: Option<Box<Opening>>,
    _held: (OwnedSemaphorePermit, Option<Client>),
}

/// The first bytes of a connection, read until it is known to be HTTP/1 (which opens
/// with its first request) or HTTP/2 (which opens with its preface and first frame).
#[derive(Debug)]
struct Opening {
    bytes: [u8; OPENING],
    len: usize,
    /// HTTP/2 only: bytes of the first frame's payload still to come.
    payload_left: usize,
}

impl Opening {
    /// Follows the connection's first bytes: `true` once an HTTP/2 connection's preface
    /// and first frame are in (it may then stay idle up to `idle` before a request),
    /// `None` once it is known not to be HTTP/2 (it opens with its first request, which
    /// its server reports through [`Activity::begin`]), `false` while undecided.
    fn note(&mut self, mut read: &[u8]) -> Option<bool> {
        if self.len < OPENING {
            let take = read.len().min(OPENING - self.len);
            self.bytes[self.len..self.len + take].copy_from_slice(&read[..take]);
            self.len += take;
            read = &read[take..];
            let seen = self.len.min(PREFACE.len());
            if self.bytes[..seen] != PREFACE[..seen] {
                return None;
            }
            if self.len < OPENING {
                return Some(false);
            }
            let header = &self.bytes[PREFACE.len()..];
            self.payload_left = usize::from(header[0]) << 16 | usize::from(header[1]) << 8 | usize::from(header[2]);
        }
        self.payload_left = self.payload_left.saturating_sub(read.len());
        Some(self.payload_left == 0)
    }
}

impl std::fmt::Debug for Counted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Counted")
            .field("peer", &self.peer)
            .finish_non_exhaustive()
    }
}

impl Counted {
    fn new(
        stream: TcpStream,
        peer: SocketAddr,
        deadlines: Deadlines,
        held: (OwnedSemaphorePermit, Option<Client>),
    ) -> Self {
        let accepted = Instant::now();
        let first_look = accepted + deadlines.first_request.min(deadlines.every());
        Counted {
            stream,
            peer,
            deadlines,
            activity: Arc::new(Activity {
                accepted,
                in_flight: AtomicUsize::new(0),
                opened: AtomicBool::new(false),
                started: AtomicU64::new(0),
                asked: Notify::new(),
            }),
            seen: 0,
            quiet: 0,
            registered: None,
            deadline: Box::pin(tokio::time::sleep_until(first_look)),
            opening: Some(Box::new(Opening {
                bytes: [0; OPENING],
                len: 0,
                payload_left: 0,
            })),
            _held: held,
        }
    }

    /// `Err` once the connection has passed its deadline (counted); otherwise the
    /// deadline stays armed with `cx`'s waker. Cheap on the way of every read: the timer
    /// is polled (which registers the waker) only when it has fired, or when the task
    /// reading now has not polled it yet (the first read; a connection handed from its
    /// TLS handshake's task to its server's).
    fn check_deadline(&mut self, cx: &mut Context<'_>) -> std::io::Result<()> {
        if let Some(waker) = &self.registered {
            if waker.will_wake(cx.waker()) && !self.deadline.is_elapsed() {
                return Ok(());
            }
        }
        while self.deadline.as_mut().poll(cx).is_ready() {
            match self.look(Instant::now()) {
                Ok(next) => self.deadline.as_mut().reset(next),
                Err(reason) => {
                    ::metrics::counter!(metrics::CONNECTIONS_CLOSED, "reason" => reason).increment(1);
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        format!("connection closed: past its {reason} deadline"),
                    ));
                }
            }
        }
        self.registered = Some(cx.waker().clone());
        Ok(())
    }

    /// The look its deadline asks for at `now`: when to look next, or `Err` with the
    /// deadline it has passed (no first request in time, or idle).
    fn look(&mut self, now: Instant) -> Result<Instant, &'static str> {
        let activity = &self.activity;
        let every = self.deadlines.every();
        if !activity.opened.load(Ordering::Acquire) {
            let until = activity.accepted + self.deadlines.first_request;
            return match now >= until {
                true => Err("first_request"),
                false => Ok(until.min(now + every)),
            };
        }
        let started = activity.started.load(Ordering::Acquire);
        if activity.in_flight.load(Ordering::Acquire) > 0 || started != self.seen {
            (self.seen, self.quiet) = (started, 0);
        } else {
            self.quiet += 1;
        }
        match self.quiet >= IDLE_LOOKS {
            true => Err("idle"),
            false => Ok(now + every),
        }
    }
}

impl AsyncRead for Counted {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let this = &mut *self;
        this.check_deadline(cx)?;
        let before = buf.filled().len();
        let read = Pin::new(&mut this.stream).poll_read(cx, buf);
        if let (Some(opening), Poll::Ready(Ok(()))) = (this.opening.as_mut(), &read) {
            match opening.note(&buf.filled()[before..]) {
                Some(false) => {}
                Some(true) => {
                    this.opening = None;
                    this.activity.started.fetch_add(1, Ordering::Relaxed);
                    this.activity.opened.store(true, Ordering::Release);
                }
                None => this.opening = None,
            }
        }
        read
    }
}

impl AsyncWrite for Counted {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

/// What the gRPC door's requests see of their connection (in their extensions).
#[derive(Debug, Clone)]
pub struct ConnectInfo {
    /// The connection's activity, which each call reports to.
    pub activity: Arc<Activity>,
    /// The socket's addresses.
    pub tcp: tonic::transport::server::TcpConnectInfo,
}

/// An accepted connection, as its server reads it: plain, or TLS over the counted socket.
#[derive(Debug)]
#[allow(clippy::large_enum_variant)] // the plain one, the common case, reads without a hop
pub enum Conn {
    /// Plain TCP.
    Plain(Counted),
    /// TLS, its handshake done.
    Tls(Box<TlsStream<Counted>>),
}

impl Conn {
    fn counted(&self) -> &Counted {
        match self {
            Conn::Plain(c) => c,
            Conn::Tls(t) => t.get_ref().0,
        }
    }

    /// The client's address.
    pub fn peer(&self) -> SocketAddr {
        self.counted().peer
    }

    /// What the connection's server tells it of its requests.
    pub fn activity(&self) -> Arc<Activity> {
        self.counted().activity.clone()
    }
}

impl AsyncRead for Conn {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(c) => Pin::new(c).poll_read(cx, buf),
            Conn::Tls(t) => Pin::new(t.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Conn::Plain(c) => Pin::new(c).poll_write(cx, buf),
            Conn::Tls(t) => Pin::new(t.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(c) => Pin::new(c).poll_flush(cx),
            Conn::Tls(t) => Pin::new(t.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(c) => Pin::new(c).poll_shutdown(cx),
            Conn::Tls(t) => Pin::new(t.as_mut()).poll_shutdown(cx),
        }
    }
}

impl tonic::transport::server::Connected for Conn {
    type ConnectInfo = ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        let counted = self.counted();
        ConnectInfo {
            activity: counted.activity.clone(),
            tcp: counted.stream.connect_info(),
        }
    }
}

/// A layer for the gRPC door's server: each call reports to its connection's
/// [`Activity`], in flight until its answer's body (a whole stream, for streaming
/// calls) has ended or been dropped.
#[derive(Debug, Clone, Copy, Default)]
pub struct TrackCalls;

impl<S> tower::Layer<S> for TrackCalls {
    type Service = Tracked<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Tracked(inner)
    }
}

/// A service whose calls are reported to their connection (see [`TrackCalls`]).
#[derive(Debug, Clone)]
pub struct Tracked<S>(S);

impl<S, B, R> tower::Service<http::Request<B>> for Tracked<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
{
    type Response = http::Response<TrackedBody<R>>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let in_flight = req.extensions().get::<ConnectInfo>().map(|info| info.activity.begin());
        let answer = self.0.call(req);
        Box::pin(async move {
            let answer = answer.await?;
            Ok(answer.map(|body| TrackedBody {
                body,
                _in_flight: in_flight,
            }))
        })
    }
}

/// An answer's body that keeps its call in flight until it is done.
#[derive(Debug)]
pub struct TrackedBody<B> {
    body: B,
    _in_flight: Option<InFlight>,
}

impl<B: hyper::body::Body + Unpin> hyper::body::Body for TrackedBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}
