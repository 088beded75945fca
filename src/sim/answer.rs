//! What the simulator's handlers share: its response type and the answers it builds,
//! why a request is refused ([`Refusal`]), reading a body within the limit, and the
//! in-flight count of its handlers. A leaf under the server and its handlers.

use std::sync::Arc;

use bytes::Bytes;
use http::{header, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use hyper::body::Incoming;
use tokio::sync::watch;

use super::Stats;
use crate::protocol::error_body;

/// The simulator's response type.
pub(crate) type Reply = Response<SimBody>;

/// A simulated answer's body: whole, or a stream's events as they are made.
#[derive(Debug)]
pub(crate) enum SimBody {
    /// All of it.
    Whole(Full<Bytes>),
    /// Events as they come; the stream ends when the sender does.
    Stream(tokio::sync::mpsc::Receiver<Bytes>),
}

impl hyper::body::Body for SimBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, Self::Error>>> {
        match self.get_mut() {
            SimBody::Whole(full) => std::pin::Pin::new(full).poll_frame(cx),
            SimBody::Stream(rx) => rx
                .poll_recv(cx)
                .map(|event| event.map(|e| Ok(hyper::body::Frame::data(e)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            SimBody::Whole(full) => full.is_end_stream(),
            SimBody::Stream(_) => false,
        }
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        match self {
            SimBody::Whole(full) => full.size_hint(),
            SimBody::Stream(_) => hyper::body::SizeHint::default(),
        }
    }
}

/// Largest request body accepted.
pub(crate) const MAX_BODY: usize = 64 << 20;
/// The BYTES element (or JSON row) a simulated model refuses with 400: a poison request.
pub(crate) const POISON: &str = "poison";

/// Why an infer request gets no outputs: the status and the protocol error message.
pub(crate) struct Refusal(pub StatusCode, pub String);

/// Counts a handler in flight; a handler dropped before answering counts as cancelled.
pub(crate) struct InFlight {
    stats: Arc<watch::Sender<Stats>>,
    pub answered: bool,
}

impl InFlight {
    pub(crate) fn enter(stats: &Arc<watch::Sender<Stats>>) -> Self {
        stats.send_modify(|s| {
            s.in_flight += 1;
            s.max_in_flight = s.max_in_flight.max(s.in_flight);
        });
        InFlight {
            stats: Arc::clone(stats),
            answered: false,
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let cancelled = !self.answered;
        self.stats.send_modify(|s| {
            s.in_flight = s.in_flight.saturating_sub(1);
            s.cancelled += u64::from(cancelled);
        });
    }
}

impl Refusal {
    pub(crate) fn bad(message: impl ToString) -> Self {
        Refusal(StatusCode::BAD_REQUEST, message.to_string())
    }

    pub(crate) fn no_instance(model: &str) -> Self {
        let message = format!("model '{model}' has no running instance");
        Refusal(StatusCode::INTERNAL_SERVER_ERROR, message)
    }
}

pub(crate) async fn read_body(req: Request<Incoming>) -> Result<Bytes, Refusal> {
    let too_large = || {
        let message = format!("request body is larger than {} MiB", MAX_BODY >> 20);
        Refusal(StatusCode::PAYLOAD_TOO_LARGE, message)
    };
    let declared = req.headers().get(header::CONTENT_LENGTH);
    let declared = declared.and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|n| n > MAX_BODY as u64) {
        return Err(too_large());
    }
    match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.is::<LengthLimitError>() => Err(too_large()),
        Err(e) => Err(Refusal::bad(format!("cannot read the request body: {e}"))),
    }
}

/// A response with a body and a content type.
pub(crate) fn reply(status: StatusCode, content_type: &'static str, body: Bytes) -> Reply {
    let mut reply = Response::new(SimBody::Whole(Full::new(body)));
    *reply.status_mut() = status;
    let value = header::HeaderValue::from_static(content_type);
    reply.headers_mut().insert(header::CONTENT_TYPE, value);
    reply
}

/// The protocol's `{"error": message}` answer.
pub(crate) fn error(status: StatusCode, message: &str) -> Reply {
    reply(status, "application/json", error_body(message))
}
