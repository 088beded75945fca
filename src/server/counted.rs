//! One accepted connection's socket, counted against its listener's limits until it
//! closes ([`Counted`]), and what its server tells it of its requests ([`Activity`]).
//!
//! The deadlines are kept on the socket itself, so they hold for every door and
//! protocol without the servers' cooperation: a connection whose first request head
//! (HTTP/2: its preface and first frame) does not come within `first_request` has its
//! reads fail; one with no request in flight for `idle` is asked to close (its server
//! closes an idle HTTP/1.1 connection, and sends an HTTP/2 one GOAWAY) and has its reads
//! fail a second later if it is still open; one whose client reads its answer slower
//! than `min_send_rate` has its writes fail; and one its listener chooses to close for a
//! newcomer (see the listener's table) is closed the same ways.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use std::future::Future;
use std::net::SocketAddr;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::{Notify, OwnedSemaphorePermit};
use tokio::time::{Instant, Sleep};

use super::clients::Client;
use crate::metrics;

/// What a connection's server tells its socket (when a request starts and ends), and
/// what its socket and listener tell its server (to close).
#[derive(Debug)]
pub struct Activity {
    pub(super) accepted: Instant,
    pub(super) in_flight: AtomicUsize,
    /// Requests begun (the HTTP/2 preface and first frame count as one).
    started: AtomicU64,
    /// Whether the connection has had a request (or, on HTTP/2, its first frame).
    pub(super) opened: AtomicBool,
    /// Told on the first request, so a stop knows whether the connection has had one.
    asked: Notify,
    /// Looks in a row that found the connection quiet, as its socket last counted them.
    pub(super) quiet: AtomicU32,
    /// Set once the connection is asked to close (idle, or chosen for a newcomer): its
    /// server closes it gracefully, and it is not chosen again.
    closing: AtomicBool,
    /// The task serving the connection, woken when `closing` is set.
    server: Mutex<Option<Waker>>,
    /// Set once the connection must close now: its reads fail.
    closed: AtomicBool,
    /// The task reading the socket, woken when `closed` is set.
    reader: Mutex<Option<Waker>>,
    /// Request bodies (gRPC: messages) in progress (see `server::receive`).
    receiving: AtomicU32,
    /// Since when some body has been in progress, in microseconds from `accepted`, and
    /// the bytes received since: how fast the connection's bodies come.
    receiving_since: AtomicU64,
    received: AtomicU64,
    /// Set when a request's body was left unread by its answer (an early refusal).
    unread: AtomicBool,
}

/// How many quiet looks, `idle / IDLE_LOOKS` apart, close a connection as idle: it is
/// closed between `idle` and 1.25 × `idle` after its last request ended, and a request
/// costs its connection two atomic counts, no clock read and no timer change.
const IDLE_LOOKS: u32 = 4;
/// How long a connection asked to close may take to do so before its reads fail.
pub(super) const GRACE: Duration = Duration::from_secs(1);
/// The window over which a client's reading is held to `min_send_rate`.
const SEND_WINDOW: Duration = Duration::from_secs(10);

impl Activity {
    pub(super) fn new(accepted: Instant) -> Self {
        Activity {
            accepted,
            in_flight: AtomicUsize::new(0),
            started: AtomicU64::new(0),
            opened: AtomicBool::new(false),
            asked: Notify::new(),
            quiet: AtomicU32::new(0),
            closing: AtomicBool::new(false),
            server: Mutex::new(None),
            closed: AtomicBool::new(false),
            reader: Mutex::new(None),
            receiving: AtomicU32::new(0),
            receiving_since: AtomicU64::new(0),
            received: AtomicU64::new(0),
            unread: AtomicBool::new(false),
        }
    }

    /// A request body (gRPC: a message) began to arrive at `now`.
    pub(super) fn receiving_began(&self, now: Instant) {
        if self.receiving.fetch_add(1, Ordering::AcqRel) == 0 {
            let since = u64::try_from(now.saturating_duration_since(self.accepted).as_micros()).unwrap_or(u64::MAX);
            self.receiving_since.store(since, Ordering::Release);
            self.received.store(0, Ordering::Release);
        }
    }

    /// `bytes` of a body in progress came.
    pub(super) fn received(&self, bytes: usize) {
        self.received.fetch_add(bytes as u64, Ordering::AcqRel);
    }

    /// A body (or message) in progress ended, or was given up.
    pub(super) fn receiving_ended(&self) {
        self.receiving.fetch_sub(1, Ordering::AcqRel);
    }

    /// How fast its bodies in progress come, in bytes a second at `now` (over at least
    /// a second); `None` when none is in progress.
    pub(super) fn receive_rate(&self, now: Instant) -> Option<f64> {
        if self.receiving.load(Ordering::Acquire) == 0 {
            return None;
        }
        let since = self.accepted + Duration::from_micros(self.receiving_since.load(Ordering::Acquire));
        let secs = now.saturating_duration_since(since).as_secs_f64().max(1.0);
        Some(self.received.load(Ordering::Acquire) as f64 / secs)
    }

    /// A request's body was dropped before its end.
    pub(super) fn left_unread(&self) {
        self.unread.store(true, Ordering::Release);
    }

    /// Whether the last request's body was left unread (and forgets it).
    pub(super) fn take_unread(&self) -> bool {
        self.unread.swap(false, Ordering::AcqRel)
    }

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
    pub(crate) async fn asked(&self) {
        if !self.opened.load(Ordering::Acquire) {
            self.asked.notified().await;
        }
    }

    /// Ready once the connection is asked to close (idle, or chosen for a newcomer): its
    /// server then closes it gracefully. Polled each time the server's task wakes, so
    /// it costs one atomic load a poll (its waker is kept once).
    pub(crate) fn closing(&self) -> Closing<'_> {
        Closing {
            activity: self,
            registered: false,
        }
    }

    /// Asks the connection's server to close it.
    fn ask_close(&self) {
        self.closing.store(true, Ordering::Release);
        let server = self.server.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(server) = server {
            server.wake();
        }
    }

    /// Asks the connection's server to close it, and closes its socket [`GRACE`] later
    /// if it is still open.
    pub(super) fn close_soon(self: &Arc<Self>) {
        self.ask_close();
        let this = Arc::downgrade(self);
        tokio::spawn(async move {
            tokio::time::sleep(GRACE).await;
            if let Some(this) = this.upgrade() {
                this.close_now();
            }
        });
    }

    /// Closes the connection now: its reads fail from the next one on.
    pub(super) fn close_now(&self) {
        self.ask_close();
        self.closed.store(true, Ordering::Release);
        let reader = self.reader.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(reader) = reader {
            reader.wake();
        }
    }

    /// Whether it was closed (its reads fail).
    pub(super) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Whether it was asked to close, or closed.
    pub(super) fn is_closing(&self) -> bool {
        self.closing.load(Ordering::Acquire)
    }
}

/// The future of [`Activity::closing`].
#[derive(Debug)]
pub struct Closing<'a> {
    activity: &'a Activity,
    registered: bool,
}

impl Future for Closing<'_> {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.activity.is_closing() {
            return Poll::Ready(());
        }
        if !self.registered {
            self.registered = true;
            *self.activity.server.lock().unwrap_or_else(|e| e.into_inner()) = Some(cx.waker().clone());
            // Asked between the look above and the waker's keeping: seen now.
            if self.activity.is_closing() {
                return Poll::Ready(());
            }
        }
        Poll::Pending
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

/// A connection's deadlines, from its listener's `Connections`.
#[derive(Debug, Clone, Copy)]
pub(super) struct Deadlines {
    pub(super) first_request: Duration,
    pub(super) idle: Duration,
    /// Bytes a second a client must take of an answer waiting to be written (0: any).
    pub(super) min_send_rate: u64,
}

impl Deadlines {
    /// How often an opened connection is looked at for being idle.
    fn every(self) -> Duration {
        (self.idle / IDLE_LOOKS).max(Duration::from_millis(1))
    }
}

/// A connection counted against its listener's limits until it closes, whose reads
/// fail with `TimedOut` once it passes its deadline (see the module's docs).
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
    /// Whether it was asked to close as idle (its reads fail at the next look).
    idled: bool,
    /// The waker `deadline` was last polled with (it wakes that task when it fires).
    registered: Option<Waker>,
    /// The first bytes read, until the connection has opened (see [`Opening::note`]).
    opening: Option<Box<Opening>>,
    /// While an answer waits to be written: how fast its client takes it.
    sending: Option<Box<Sending>>,
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

/// A client's reading of what waits to be written, watched from the first write its
/// socket could not take at once: over each [`SEND_WINDOW`] it must take at least
/// `min_send_rate` bytes a second.
#[derive(Debug)]
struct Sending {
    since: Instant,
    written: u64,
    timer: Pin<Box<Sleep>>,
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
    /// `stream` from `peer`, held to `deadlines`, holding its places in the listener's
    /// limits until it closes.
    pub(super) fn new(
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
            activity: Arc::new(Activity::new(accepted)),
            seen: 0,
            quiet: 0,
            idled: false,
            registered: None,
            deadline: Box::pin(tokio::time::sleep_until(first_look)),
            opening: Some(Box::new(Opening {
                bytes: [0; OPENING],
                len: 0,
                payload_left: 0,
            })),
            sending: None,
            _held: held,
        }
    }

    /// The client's address.
    pub(super) fn peer(&self) -> SocketAddr {
        self.peer
    }

    /// What the connection's server tells it, and it tells its server.
    pub(super) fn activity(&self) -> &Arc<Activity> {
        &self.activity
    }

    /// `Err` once the connection has passed its deadline or was closed (counted);
    /// otherwise the deadline stays armed with `cx`'s waker. Cheap on the way of every
    /// read: the timer is polled (which registers the waker) only when it has fired, or
    /// when the task reading now has not polled it yet (the first read; a connection
    /// handed from its TLS handshake's task to its server's).
    fn check_deadline(&mut self, cx: &mut Context<'_>) -> std::io::Result<()> {
        if self.activity.is_closed() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "connection closed: its listener needed its place",
            ));
        }
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
        *self.activity.reader.lock().unwrap_or_else(|e| e.into_inner()) = Some(cx.waker().clone());
        Ok(())
    }

    /// The look its deadline asks for at `now`: when to look next, or `Err` with the
    /// deadline it has passed (no first request in time, or idle and not closed when
    /// asked).
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
        if self.idled {
            return Err("idle");
        }
        let started = activity.started.load(Ordering::Acquire);
        if activity.in_flight.load(Ordering::Acquire) > 0 || started != self.seen {
            (self.seen, self.quiet) = (started, 0);
        } else {
            self.quiet += 1;
        }
        activity.quiet.store(self.quiet, Ordering::Relaxed);
        if self.quiet < IDLE_LOOKS {
            return Ok(now + every);
        }
        // Idle: its server closes it (HTTP/2 with GOAWAY); if it has not within the
        // grace, the next look closes the socket.
        ::metrics::counter!(metrics::CONNECTIONS_CLOSED, "reason" => "idle").increment(1);
        self.idled = true;
        activity.ask_close();
        Ok(now + GRACE)
    }

    /// `Err` once a client has taken less than `min_send_rate` over a window while an
    /// answer waited to be written (counted); otherwise the window's timer is armed with
    /// `cx`'s waker, so a client that takes nothing at all is looked at too.
    fn check_sending(&mut self, cx: &mut Context<'_>) -> std::io::Result<()> {
        let rate = self.deadlines.min_send_rate;
        if rate == 0 {
            return Ok(());
        }
        let sending = self.sending.get_or_insert_with(|| {
            let since = Instant::now();
            Box::new(Sending {
                since,
                written: 0,
                timer: Box::pin(tokio::time::sleep_until(since + SEND_WINDOW)),
            })
        });
        while sending.timer.as_mut().poll(cx).is_ready() {
            let now = Instant::now();
            let owed = (now - sending.since).as_secs_f64() * rate as f64;
            if (sending.written as f64) < owed {
                ::metrics::counter!(metrics::CONNECTIONS_CLOSED, "reason" => "slow_reader").increment(1);
                return Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("connection closed: its client read slower than {rate} bytes a second"),
                ));
            }
            (sending.since, sending.written) = (now, 0);
            sending.timer.as_mut().reset(now + SEND_WINDOW);
        }
        Ok(())
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

impl Counted {
    /// Counts what a write wrote while an answer is waiting, and watches a write that
    /// must wait.
    fn wrote(&mut self, cx: &mut Context<'_>, wrote: Poll<std::io::Result<usize>>) -> Poll<std::io::Result<usize>> {
        match &wrote {
            // Counted only while an answer is waiting: a fast client never arms the watch.
            Poll::Ready(Ok(n)) => {
                if let Some(sending) = &mut self.sending {
                    sending.written += *n as u64;
                }
            }
            Poll::Pending => self.check_sending(cx)?,
            Poll::Ready(Err(_)) => {}
        }
        wrote
    }
}

impl AsyncWrite for Counted {
    /// Answers go out as the server queues them (head and body buffers in one
    /// `writev`), so a large body is written from its own buffer, never copied into the
    /// server's.
    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let wrote = Pin::new(&mut self.stream).poll_write_vectored(cx, bufs);
        self.wrote(cx, wrote)
    }

    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        let wrote = Pin::new(&mut self.stream).poll_write(cx, buf);
        self.wrote(cx, wrote)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let flushed = Pin::new(&mut self.stream).poll_flush(cx);
        if flushed.is_ready() {
            // What waited is written (servers flush once their buffer is empty): the
            // next wait is watched afresh.
            self.sending = None;
        }
        flushed
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}
