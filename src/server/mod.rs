//! The HTTP server every listener here runs on: the doors, the bulk doors, the admin API
//! and the metrics endpoint. Below the doors: it knows connections, not requests.
//!
//! [`listen`] is the one connection loop: HTTP/1.1 and h2c on one port (HTTP/2 alone
//! with TLS's ALPN), deadlines against slow and silent clients, limits on open
//! connections, a graceful drain on shutdown. [`keep_timers_due`] keeps the runtime's
//! timer wheel cheap at low load.
//!
//! # Layout
//!
//! `accept` (the connection table: limits, eviction, deadlines by fullness) ·
//! `clients` (per-client counts, IPv6 by /64) · `counted` (one connection's socket and
//! deadlines, [`Activity`]) · `receive` (a request body held to its deadline and rate,
//! [`Incoming`]) · `conn` (plain or TLS, and an answer's body tracked until written) ·
//! [`tls`] (certificates, reloaded live).

mod accept;
mod clients;
mod conn;
mod counted;
mod lean;
mod receive;
pub mod tls;

pub use accept::Connections;
pub use conn::{Conn, TrackedBody};
pub use counted::{Activity, Counted, InFlight};
pub use lean::{reads_as_httparse, Whole};
pub use receive::{Incoming, TooSlow};

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Largest request head (HTTP/1.1 buffer, HTTP/2 header list) a client may send.
const MAX_HEADER_BYTES: usize = 64 << 10;
/// Concurrent HTTP/2 streams per connection.
const MAX_STREAMS: u32 = 1024;

/// How long, once a stop begins, a connection that has had no request yet may take to
/// send its first (at most the header read timeout).
const FIRST_REQUEST: Duration = Duration::from_secs(1);

/// How long connections still open when a stop ends may take to write the answers the
/// end gave them, before they are closed.
pub const FLUSH: Duration = Duration::from_millis(500);

/// An answer's body, as hyper and the lean server write it.
pub trait AnswerBody:
    hyper::body::Body<Data = Bytes, Error: Into<Box<dyn std::error::Error + Send + Sync>>> + Send + Unpin + 'static
{
}

impl<B> AnswerBody for B where
    B: hyper::body::Body<Data = Bytes, Error: Into<Box<dyn std::error::Error + Send + Sync>>> + Send + Unpin + 'static
{
}

/// What answers a listener's requests whose bodies are `R`: a function cloned into
/// every connection.
pub trait Answers<R, B>: Fn(::http::Request<R>) -> Self::Answer + Clone + Send + Sync + 'static {
    /// The answer's future.
    type Answer: Future<Output = ::http::Response<B>> + Send + 'static;
}

impl<R, B, F, Fut> Answers<R, B> for F
where
    F: Fn(::http::Request<R>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = ::http::Response<B>> + Send + 'static,
{
    type Answer = Fut;
}

/// Accepts connections on `listener` within `allow`'s limits and deadlines, and answers
/// each request with `answer`, until
/// `closing` fires; then stops accepting and lets open exchanges finish (idle
/// keep-alive connections are closed, HTTP/2 ones are sent GOAWAY) until `ending`
/// fires; what is still open then gets [`FLUSH`] to write its last answer, and is closed.
pub async fn listen<B: AnswerBody>(
    listener: TcpListener,
    allow: Connections,
    (closing, ending): (CancellationToken, CancellationToken),
    answer: impl Answers<Incoming, B>,
) -> std::io::Result<()> {
    let lean = None::<(
        fn(::http::Request<Whole>) -> std::future::Pending<::http::Response<B>>,
        Stamping<B>,
    )>;
    run(listener, allow, (closing, ending), answer, lean).await
}

/// How a listener's answers carry fields of their own in their bodies rather than in
/// their header maps (the HTTP door's `front::body::Stamp`): the project's own server
/// writes them with the head, straight from the body; for hyper they are moved into
/// the header map first.
pub struct Stamping<B> {
    /// Writes the body's fields, `name: value\r\n` each, into its answer's head;
    /// `false` when it has none.
    pub write: fn(&B, &mut Vec<u8>) -> bool,
    /// Moves the body's fields into its answer's header map.
    pub store: fn(&mut B, &mut ::http::HeaderMap),
    /// The names of those fields: a stamped answer's header map entries of the same
    /// names (a backend's own) are not written.
    pub names: &'static [::http::HeaderName],
    /// Told why the project's own server could not write the body on (its client gone
    /// or too slow a reader) before it drops it: a relayed stream ends for that reason.
    pub cut: fn(&mut B, &std::io::Error),
}

impl<B> Clone for Stamping<B> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<B> Copy for Stamping<B> {}

/// [`listen`], with the common HTTP/1.1 request served by the project's own server
/// (`lean`; see `server::lean`) and every other by hyper (`answer`), their answers'
/// own fields carried as `stamping` says.
pub async fn listen_lean<B: AnswerBody>(
    listener: TcpListener,
    allow: Connections,
    stops: (CancellationToken, CancellationToken),
    (answer, lean): (impl Answers<Incoming, B>, impl Answers<Whole, B>),
    stamping: Stamping<B>,
) -> std::io::Result<()> {
    run(listener, allow, stops, answer, Some((lean, stamping))).await
}

/// The connection loop of [`listen`] and [`listen_lean`].
async fn run<B: AnswerBody, F: Answers<Incoming, B>, L: Answers<Whole, B>>(
    listener: TcpListener,
    allow: Connections,
    (closing, ending): (CancellationToken, CancellationToken),
    answer: F,
    lean: Option<(L, Stamping<B>)>,
) -> std::io::Result<()> {
    let stamping = lean.as_ref().map(|(_, stamping)| *stamping);
    let mut builder = auto::Builder::new(TokioExecutor::new());
    // No header read timeout of hyper's: it also times the wait for a kept-alive
    // connection's next request, so it would close idle connections long before
    // `idle_timeout`. The first request's head is held to `first_request` on the socket
    // (counted), and a later one that never completes to `idle_timeout`.
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(None)
        .max_buf_size(MAX_HEADER_BYTES)
        .keep_alive(true);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(MAX_STREAMS)
        .max_header_list_size(MAX_HEADER_BYTES as u32)
        .keep_alive_interval(Some(Duration::from_secs(30)))
        .keep_alive_timeout(Duration::from_secs(10));
    let builder = Arc::new(builder);
    let connections = TaskTracker::new();
    let first_request = allow.first_request.min(FIRST_REQUEST);
    let bodies = accept::Bodies::of(&allow);
    let (mut accepted, fill) = accept::accept(listener, allow, closing.clone());
    while let Some(mut stream) = accepted.recv().await {
        let answer = answer.clone();
        let lean = lean.clone();
        let builder = builder.clone();
        // Told of every request: its deadlines, and a stop, need to know.
        let activity = stream.activity();
        let told = activity.clone();
        let fill = fill.clone();
        let service = service_fn(move |req: ::http::Request<hyper::body::Incoming>| {
            let in_flight = told.begin();
            let answer = answer.clone();
            let h1 = req.version() <= ::http::Version::HTTP_11;
            let (parts, body) = req.into_parts();
            let body = Incoming::new(body, &parts.headers, &told, || bodies.rules(&fill));
            let req = ::http::Request::from_parts(parts, body);
            let told = told.clone();
            async move {
                let (mut head, mut body) = answer(req).await.into_parts();
                if let Some(stamping) = stamping {
                    (stamping.store)(&mut body, &mut head.headers);
                }
                // A body the answer left unread closes an HTTP/1.1 connection (the rest
                // of it is not read to find the next request): said, so the client does
                // not send its next request on it.
                if told.take_unread() && h1 {
                    head.headers
                        .insert(::http::header::CONNECTION, ::http::HeaderValue::from_static("close"));
                }
                // In flight until the answer's body is written (a gRPC stream, a file).
                let answer = ::http::Response::from_parts(head, body);
                Ok::<_, Infallible>(answer.map(|body| TrackedBody::new(body, in_flight)))
            }
        });
        let peer = stream.peer();
        let closing = closing.clone();
        connections.spawn(async move {
            // The two stops are looked at only when one of them wakes the task, not on
            // every wake of the connection's own (its reads and writes).
            let mut stop = Rarely::new(async {
                tokio::select! {
                    () = closing.cancelled() => Stop::Gateway,
                    () = activity.closing() => Stop::Connection,
                }
            });
            let (read, stopped) = match lean {
                Some((lean, stamping)) => {
                    match lean::serve(&mut stream, (&lean, stamping), &activity, &mut stop, first_request).await {
                        lean::Ended::Closed => return,
                        lean::Ended::Handed(read, stopped) => (read, stopped),
                    }
                }
                None => (BytesMut::new(), None),
            };
            let connection = builder
                .serve_connection(TokioIo::new(lean::Replay::new(read, stream)), service)
                .into_owned();
            tokio::pin!(connection);
            let stopped = match stopped {
                Some(stop) => stop,
                None => tokio::select! {
                    biased;
                    ended = connection.as_mut() => return log_end(peer, ended),
                    stop = &mut stop => stop,
                },
            };
            let ended = match stopped {
                // Idle, or closed to make room: an HTTP/1.1 connection between
                // requests closes at once, an HTTP/2 one is sent GOAWAY and closes
                // once its streams end (its socket closes on its own if it lingers).
                Stop::Connection => {
                    connection.as_mut().graceful_shutdown();
                    connection.as_mut().await
                }
                Stop::Gateway => {
                    // A connection that has not had its first request yet (just accepted,
                    // from the backlog) gets until it comes: its client may have sent it.
                    tokio::select! {
                        ended = connection.as_mut() => return log_end(peer, ended),
                        () = activity.asked() => {}
                        () = tokio::time::sleep(first_request) => {}
                    }
                    // The request in progress is answered, then the connection closes
                    // (HTTP/2: GOAWAY); an idle one closes now.
                    connection.as_mut().graceful_shutdown();
                    connection.await
                }
            };
            log_end(peer, ended);
        });
    }
    connections.close();
    if ending.is_cancelled() {
        return Ok(()); // stopped outright (a listener with nothing to drain)
    }
    tokio::select! {
        biased;
        () = connections.wait() => return Ok(()),
        () = ending.cancelled() => {}
    }
    // What ended now is answered (micro-batch callers get 503): let it be written.
    if tokio::time::timeout(FLUSH, connections.wait()).await.is_err() {
        tracing::warn!("connections still open at the end of the drain are closed");
    }
    Ok(())
}

fn log_end<E: std::fmt::Display>(peer: std::net::SocketAddr, ended: Result<(), E>) {
    if let Err(e) = ended {
        tracing::debug!(%peer, error = %e, "connection ended with an error");
    }
}

/// How often [`keep_timers_due`] wakes.
const TICK: Duration = Duration::from_millis(50);

/// Keeps a timer due within 50 ms on the calling runtime until `shutdown` fires.
///
/// tokio wakes its I/O driver (a write to an eventfd, then one more `epoll_wait`)
/// whenever a new timer is due before every armed one. At low load, with nothing else
/// armed, every request's budget deadline is such a timer, so each request paid two
/// extra system calls on the real-time thread. With a timer always due within 50 ms,
/// a deadline further out is filed quietly; the price is 20 wake-ups a second.
pub async fn keep_timers_due(shutdown: CancellationToken) -> std::io::Result<()> {
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = shutdown.cancelled() => return Ok(()),
        }
    }
}

/// Why a connection is asked to stop: the gateway stops, or the connection is closed
/// (idle, or to make room).
enum Stop {
    Gateway,
    Connection,
}

/// A future polled only when it woke its task itself: `inner` waits on rare events (a
/// stop) beside a busy future in the same task (a connection), and would otherwise be
/// polled again on every wake of that one, about 175 instructions each time, for
/// nothing. Its first poll registers `inner`'s wakers; after that a poll is a flag's
/// swap, until `inner`'s own waker sets it.
struct Rarely<F> {
    inner: Pin<Box<F>>,
    flag: Arc<Flag>,
}

/// Whether `inner`'s waker fired since it was last polled, and the task to wake.
struct Flag {
    fired: AtomicBool,
    task: Mutex<Option<Waker>>,
}

impl<F: Future> Rarely<F> {
    fn new(inner: F) -> Self {
        Rarely {
            inner: Box::pin(inner),
            flag: Arc::new(Flag {
                fired: AtomicBool::new(true),
                task: Mutex::new(None),
            }),
        }
    }
}

impl<F: Future> Future for Rarely<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.get_mut();
        {
            let mut task = this.flag.task.lock().unwrap_or_else(|e| e.into_inner());
            if !task.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                *task = Some(cx.waker().clone());
            }
        }
        if !this.flag.fired.swap(false, Ordering::AcqRel) {
            return Poll::Pending;
        }
        let waker = Waker::from(this.flag.clone());
        this.inner.as_mut().poll(&mut Context::from_waker(&waker))
    }
}

impl Wake for Flag {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.fired.store(true, Ordering::Release);
        if let Some(task) = self.task.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
            task.wake_by_ref();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_timer_tick_runs_until_shutdown() {
        let stop = CancellationToken::new();
        let tick = tokio::spawn(keep_timers_due(stop.clone()));
        tokio::time::sleep(TICK * 10).await;
        assert!(!tick.is_finished(), "it keeps a timer due while serving");
        stop.cancel();
        tick.await.expect("no panic").expect("ends cleanly");
    }

    #[tokio::test]
    async fn a_rare_future_is_polled_when_it_wakes_and_not_when_its_neighbour_does() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let polls = std::sync::Arc::new(AtomicUsize::new(0));
        let notify = std::sync::Arc::new(tokio::sync::Notify::new());
        let counted = polls.clone();
        let waited = notify.clone();
        let rare = Rarely::new(async move {
            let mut notified = std::pin::pin!(waited.notified());
            std::future::poll_fn(|cx| {
                counted.fetch_add(1, Ordering::Relaxed);
                notified.as_mut().poll(cx)
            })
            .await;
            "stopped"
        });
        tokio::pin!(rare);
        // A busy neighbour in the same task: it wakes the task 100 times.
        let mut ticks = 0;
        let busy = std::future::poll_fn(|cx| {
            ticks += 1;
            if ticks > 100 {
                return std::task::Poll::Ready(());
            }
            cx.waker().wake_by_ref();
            std::task::Poll::Pending
        });
        tokio::pin!(busy);
        tokio::select! {
            biased;
            () = &mut busy => {}
            _ = &mut rare => panic!("nothing woke it"),
        }
        assert_eq!(
            polls.load(Ordering::Relaxed),
            1,
            "polled once, to register, not on each of the neighbour's wakes"
        );
        notify.notify_one();
        assert_eq!(rare.await, "stopped");
        assert_eq!(polls.load(Ordering::Relaxed), 2);
    }
}
