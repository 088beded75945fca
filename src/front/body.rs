//! The body of an answer the HTTP door writes: whole, as nearly every answer is;
//! streamed in chunks from the offline store (a Batch API file's content), so a large
//! file is never held whole in memory while its client reads it slowly (its length is
//! known either way, so the answer carries `Content-Length`); or a backend's events as
//! they come ([`super::relay`]: no length, so HTTP/1.1 chunks them). A whole answer of
//! the inference path, and a relayed one, carries its [`Stamp`]: tiergate's own fields,
//! written by the server with the head rather than put in the header map (four names
//! hashed and a value made, on every request, for fields the server can write as it
//! goes).

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue};
use hyper::body::{Body, Frame, SizeHint};
use tokio::sync::mpsc;

use crate::headers;
use crate::timing::Line;

/// A request body the door reads: hyper's (`Incoming`) on a connection, or any other
/// (`Full<Bytes>`), so tests drive the door without a socket.
pub trait RequestBody: hyper::body::Body<Data = Bytes, Error: Into<BoxError>> + Send + 'static {}

impl<B> RequestBody for B where B: hyper::body::Body<Data = Bytes, Error: Into<BoxError>> + Send + 'static {}

/// A boxed error, as bodies give them.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// An answer's body (see the module's docs).
#[derive(Debug)]
pub enum Answered {
    /// All of it, written at once (`None` once written), and its fields, if stamped.
    Whole(Option<Bytes>, Option<Stamp>),
    /// Chunks as they are read, `left` bytes of them still to come.
    Streamed {
        /// The chunks, in order; an error ends the answer (and its connection).
        chunks: mpsc::Receiver<std::io::Result<Bytes>>,
        /// Bytes still to come.
        left: u64,
    },
    /// A backend's events, relayed as they come, and the answer's fields.
    Events(Box<super::relay::Relay>, Option<Stamp>),
}

/// What tiergate says of an inference answer in fields of its own: `x-tiergate-tier`,
/// `x-tiergate-reason`, `x-tiergate-policy-version` and `server-timing`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    /// The tier that served it.
    pub tier: Option<&'static str>,
    /// Why (or why none did).
    pub reason: Option<&'static str>,
    /// The policy version that served it.
    pub policy_version: u64,
    /// Where its time went.
    pub timing: Line,
}

impl Stamp {
    /// Writes the fields, `name: value\r\n` each, into an answer's `head`.
    pub fn write(&self, head: &mut Vec<u8>) {
        for (name, value) in [(&headers::TIER, self.tier), (&headers::REASON, self.reason)] {
            if let Some(value) = value {
                head.extend_from_slice(name.as_str().as_bytes());
                head.extend_from_slice(b": ");
                head.extend_from_slice(value.as_bytes());
                head.extend_from_slice(b"\r\n");
            }
        }
        head.extend_from_slice(headers::POLICY_VERSION.as_str().as_bytes());
        head.extend_from_slice(b": ");
        let mut digits = [0u8; 20];
        let version = usize::try_from(self.policy_version).unwrap_or(usize::MAX);
        head.extend_from_slice(crate::protocol::decimal(version, &mut digits));
        head.extend_from_slice(b"\r\n");
        self.timing.write(head);
    }

    /// Puts the fields into `headers` (replacing any of the same names), for a server
    /// that writes the head from the header map.
    pub fn store(&self, headers: &mut HeaderMap) {
        for (name, value) in [(headers::TIER, self.tier), (headers::REASON, self.reason)] {
            if let Some(value) = value {
                headers.insert(name, HeaderValue::from_static(value));
            }
        }
        headers.insert(headers::POLICY_VERSION, HeaderValue::from(self.policy_version));
        self.timing.store(headers);
    }
}

/// The names of a [`Stamp`]'s fields.
pub static STAMPED: [http::HeaderName; 4] = [
    headers::TIER,
    headers::REASON,
    headers::POLICY_VERSION,
    crate::timing::SERVER_TIMING,
];

/// How the HTTP door's answers carry their stamps, for its listeners.
pub const STAMPING: crate::server::Stamping<Answered> = crate::server::Stamping {
    write: |body, head| body.write_stamp(head),
    store: Answered::stamp_headers,
    names: &STAMPED,
    cut: Answered::cut,
};

impl Answered {
    /// A body of `len` bytes that `chunks` will bring.
    pub fn streamed(chunks: mpsc::Receiver<std::io::Result<Bytes>>, len: u64) -> Self {
        Answered::Streamed { chunks, left: len }
    }

    /// The answer of `reply`: its whole body, or the events of the relay it carries.
    pub fn of(mut reply: crate::protocol::Reply) -> http::Response<Answered> {
        if !reply.body().is_empty() {
            return reply.map(Answered::from); // a relay's answer has no body of its own
        }
        match super::relay::Relayed::of(&mut reply) {
            Some(relay) => reply.map(|_| Answered::Events(Box::new(relay), None)),
            None => reply.map(Answered::from),
        }
    }

    /// The same body carrying `stamp` (a stored file's carries none).
    pub fn stamped(self, stamp: Stamp) -> Self {
        match self {
            Answered::Whole(bytes, _) => Answered::Whole(bytes, Some(stamp)),
            Answered::Events(relay, _) => Answered::Events(relay, Some(stamp)),
            streamed => streamed,
        }
    }

    /// Tells a relayed stream why its client could not be written to: one cut for
    /// reading too slowly (`limits.min_send_rate`) ends as `slow_reader`.
    pub fn cut(&mut self, error: &std::io::Error) {
        if let Answered::Events(relay, _) = self {
            if error.kind() == std::io::ErrorKind::TimedOut {
                relay.end_as(super::relay::End::SlowReader);
            }
        }
    }

    /// Writes the body's stamp, if it has one, into its answer's `head`: the HTTP/1.1
    /// server's hook ([`STAMPING`]); whether it had one.
    pub fn write_stamp(&self, head: &mut Vec<u8>) -> bool {
        match self {
            Answered::Whole(_, Some(stamp)) | Answered::Events(_, Some(stamp)) => {
                stamp.write(head);
                true
            }
            _ => false,
        }
    }

    /// Moves the body's stamp, if it has one, into its answer's `headers`: for hyper
    /// (HTTP/2, TLS) and for callers of the door without a server.
    pub fn stamp_headers(&mut self, headers: &mut HeaderMap) {
        if let Answered::Whole(_, stamp) | Answered::Events(_, stamp) = self {
            if let Some(stamp) = stamp.take() {
                stamp.store(headers);
            }
        }
    }
}

impl From<Bytes> for Answered {
    fn from(bytes: Bytes) -> Self {
        Answered::Whole(Some(bytes), None)
    }
}

impl Default for Answered {
    fn default() -> Self {
        Answered::Whole(None, None)
    }
}

impl Body for Answered {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<std::io::Result<Frame<Bytes>>>> {
        match &mut *self {
            Answered::Whole(bytes, _) => {
                Poll::Ready(bytes.take().filter(|b| !b.is_empty()).map(|b| Ok(Frame::data(b))))
            }
            Answered::Streamed { chunks, left } => match chunks.poll_recv(cx) {
                Poll::Pending => Poll::Pending,
                Poll::Ready(Some(Ok(chunk))) => {
                    let Some(rest) = left.checked_sub(chunk.len() as u64) else {
                        let more = std::io::Error::other("the stored content is longer than it said");
                        return Poll::Ready(Some(Err(more)));
                    };
                    *left = rest;
                    Poll::Ready(Some(Ok(Frame::data(chunk))))
                }
                Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e))),
                Poll::Ready(None) if *left == 0 => Poll::Ready(None),
                Poll::Ready(None) => Poll::Ready(Some(Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof)))),
            },
            Answered::Events(relay, _) => Pin::new(relay.as_mut()).poll_frame(cx).map_err(|never| match never {}),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Answered::Whole(bytes, _) => bytes.as_ref().is_none_or(Bytes::is_empty),
            Answered::Streamed { left, .. } => *left == 0,
            Answered::Events(relay, _) => relay.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Answered::Whole(bytes, _) => SizeHint::with_exact(bytes.as_ref().map_or(0, |b| b.len() as u64)),
            Answered::Streamed { left, .. } => SizeHint::with_exact(*left),
            Answered::Events(..) => SizeHint::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use http_body_util::BodyExt;

    use super::*;

    #[tokio::test]
    async fn whole_and_streamed_bodies_give_their_bytes_and_a_short_stream_is_an_error() {
        let whole = Answered::from(Bytes::from_static(b"abc"));
        assert_eq!(whole.size_hint().exact(), Some(3));
        assert_eq!(whole.collect().await.expect("whole").to_bytes(), "abc");
        let (tx, rx) = mpsc::channel(4);
        for chunk in ["ab", "cd"] {
            tx.send(Ok(Bytes::from(chunk))).await.expect("sent");
        }
        drop(tx);
        let streamed = Answered::streamed(rx, 4);
        assert_eq!(streamed.size_hint().exact(), Some(4));
        assert_eq!(streamed.collect().await.expect("streamed").to_bytes(), "abcd");
        let (tx, rx) = mpsc::channel(4);
        tx.send(Ok(Bytes::from("ab"))).await.expect("sent");
        drop(tx);
        assert!(Answered::streamed(rx, 4).collect().await.is_err(), "two bytes short");
    }
}
