//! Streamed answers as a pool hands them up. A caller that asks for a stream marks its
//! request ([`Wanted`]); an HTTP pool then reads a successful answer of
//! `content-type: text/event-stream` to its head only and hands it up at once, its body
//! to be read as it comes ([`Stream`], carried in the answer's extensions as
//! [`Streamed`], so every tier passes it on as any answer). The body holds the backend's
//! connection (HTTP/1.1) or stream (HTTP/2): dropping it, as a door does when its
//! client goes away, closes or resets it. What the stream does later is told back to
//! the pool through its [`Outcome`]: its first token (the pool learns its time to first
//! token) and a failure (counted against its endpoint, once per input).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::BodyExt as _;
use tokio::time::Instant;

use super::endpoint::Endpoint;
use super::latency::Latency;

/// A stream's body as it comes from the backend.
pub type Body = UnsyncBoxBody<Bytes, Box<dyn std::error::Error + Send + Sync>>;

/// Marks a request whose caller asked for a stream (a request extension): whether the
/// door asked the backend for the stream's usage itself (the caller did not), so the
/// relay takes that event out.
#[derive(Debug, Clone, Copy, Default)]
pub struct Wanted {
    /// The usage chunk is the gateway's, not the caller's.
    pub strip_usage: bool,
}

/// Whether `request` asks for a stream. A KServe v2 inference call never does, and is
/// told so from its path, before any extension is looked up.
#[inline]
pub fn wanted<B>(request: &http::Request<B>) -> bool {
    asked(request.uri(), request.extensions())
}

/// [`wanted`] of a request's parts.
#[inline]
pub(super) fn asked(uri: &http::Uri, extensions: &http::Extensions) -> bool {
    let path = uri.path();
    !(path.starts_with("/v2/") && path.ends_with("/infer")) && extensions.get::<Wanted>().is_some()
}

/// A streamed answer's body, taken once out of the answer's extensions.
#[derive(Clone)]
pub struct Streamed(Arc<Mutex<Option<Stream>>>);

/// A stream handed up by a pool: its body, the call's deadline (a stream's budget runs
/// to its first token), when the call was sent, and where its outcome goes.
pub struct Stream {
    /// The events' bytes as they come.
    pub body: Body,
    /// When the call's budget runs out: the first token is due by then.
    pub deadline: Instant,
    /// When the call was sent.
    pub sent: Instant,
    /// Where what the stream does is told.
    pub outcome: Outcome,
}

/// Tells a stream's pool what its stream did. A stream cut into several (a batch's,
/// one per caller) gives each a copy: a failure is counted once per input, however
/// many copies tell it.
#[derive(Clone)]
pub struct Outcome {
    endpoints: Arc<Vec<Endpoint>>,
    at: usize,
    input: u64,
    /// The pool's clock's start, and what it has learned of its streams.
    born: Instant,
    learned: Arc<Learned>,
}

/// What a pool has learned of its streams: their time to first token (a budget below
/// its floor is refused unsent) and their time per token after it.
#[derive(Debug, Default)]
pub struct Learned {
    /// From the call sent to the first content event.
    pub first_token: Latency,
    /// From the first content event to the last, over the events between.
    pub per_token: Latency,
    /// First tokens counted (and first tokens that never came in the call's budget,
    /// at the budget), and their times summed in microseconds: a reader takes the mean
    /// over any interval from two readings.
    pub first_tokens: (AtomicU64, AtomicU64),
}

/// A transport's stream before the pool wraps it (between `h1`/`h2` and the pool).
#[derive(Clone)]
pub(super) struct Raw(pub(super) Arc<Mutex<Option<Body>>>);

impl Raw {
    /// `body`, to carry in an answer's extensions.
    pub(super) fn new(body: Body) -> Self {
        Raw(Arc::new(Mutex::new(Some(body))))
    }

    /// The body, once.
    pub(super) fn take(&self) -> Option<Body> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).take()
    }
}

impl Streamed {
    /// Carries `stream` (in an answer's extensions).
    pub fn new(stream: Stream) -> Self {
        Streamed(Arc::new(Mutex::new(Some(stream))))
    }

    /// The stream, once (a second take finds none).
    pub fn take(&self) -> Option<Stream> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).take()
    }

    /// The stream an answer carries, taken out of its extensions.
    pub fn of(answer: &mut http::Response<Bytes>) -> Option<Stream> {
        answer.extensions_mut().remove::<Streamed>()?.take()
    }
}

/// Has `guard` dropped when the stream `answer` carries ends (its last frame read, or
/// its body dropped: the client went away); gives `guard` back when `answer` carries
/// none.
pub fn hold_until_done<G: Send + Unpin + 'static>(answer: &mut http::Response<Bytes>, guard: G) -> Result<(), G> {
    let Some(streamed) = answer.extensions().get::<Streamed>() else {
        return Err(guard);
    };
    let mut slot = streamed.0.lock().unwrap_or_else(|e| e.into_inner());
    let Some(stream) = slot.as_mut() else {
        return Err(guard);
    };
    let empty = http_body_util::Empty::new().map_err(|never: std::convert::Infallible| match never {});
    let body = std::mem::replace(&mut stream.body, Body::new(empty));
    stream.body = Body::new(Holding {
        body,
        guard: Some(guard),
    });
    Ok(())
}

/// A stream's body holding a guard until its end.
struct Holding<G> {
    body: Body,
    guard: Option<G>,
}

impl<G: Send + Unpin + 'static> hyper::body::Body for Holding<G> {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        let polled = std::pin::Pin::new(&mut this.body).poll_frame(cx);
        if matches!(polled, std::task::Poll::Ready(None | Some(Err(_)))) {
            this.guard = None;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}

impl std::fmt::Debug for Streamed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Streamed").finish_non_exhaustive()
    }
}

impl Outcome {
    pub(super) fn new(
        (endpoints, at): (Arc<Vec<Endpoint>>, usize),
        input: u64,
        (born, learned): (Instant, Arc<Learned>),
    ) -> Self {
        Outcome {
            endpoints,
            at,
            input,
            born,
            learned,
        }
    }

    /// The first token came `took` after the call was sent: the pool learns its time to
    /// first token from it, and its endpoint's.
    pub fn first_token(&self, took: Duration) {
        self.learned.first_token.answered(took);
        let micros = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        self.learned.first_tokens.0.fetch_add(1, Ordering::Relaxed);
        self.learned.first_tokens.1.fetch_add(micros, Ordering::Relaxed);
        let at = super::endpoint::clock(self.born, Instant::now());
        self.endpoints[self.at].streams[0].answered(took, at);
    }

    /// The call's budget ran out `waited` after it was sent with no first token: what
    /// its streams' first tokens are read to take lately counts it at that (a window
    /// holding batch work back for them sees it), not what the pool learns.
    pub fn first_token_missed(&self, waited: Duration) {
        let micros = u64::try_from(waited.as_micros()).unwrap_or(u64::MAX);
        self.learned.first_tokens.0.fetch_add(1, Ordering::Relaxed);
        self.learned.first_tokens.1.fetch_add(micros, Ordering::Relaxed);
    }

    /// The tokens after the first came `each` apart on average: the pool learns its time
    /// per output token from it, and its endpoint's.
    pub fn per_token(&self, each: Duration) {
        self.learned.per_token.answered(each);
        let at = super::endpoint::clock(self.born, Instant::now());
        self.endpoints[self.at].streams[1].answered(each, at);
    }

    /// The stream failed on its endpoint for `why` (`stall`, `malformed`, `broken`): its
    /// endpoint's failure, counted once per input in its run (a stream is never
    /// compared on another endpoint: it is not replayed).
    pub fn failed(&self, why: &'static str) {
        self.endpoints[self.at]
            .health
            .failed_on(why, self.input, Instant::now());
    }
}
