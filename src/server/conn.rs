//! An accepted connection as its server reads it ([`Conn`]: plain or TLS over the
//! counted socket), and an answer's body that keeps its request in flight on it until
//! the body is written ([`TrackedBody`]).

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_rustls::server::TlsStream;

use super::counted::{Activity, Counted, InFlight};

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
        self.counted().peer()
    }

    /// What the connection's server tells it of its requests.
    pub fn activity(&self) -> Arc<Activity> {
        self.counted().activity().clone()
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
    fn is_write_vectored(&self) -> bool {
        match self {
            Conn::Plain(c) => c.is_write_vectored(),
            Conn::Tls(t) => t.is_write_vectored(),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Conn::Plain(c) => Pin::new(c).poll_write_vectored(cx, bufs),
            Conn::Tls(t) => Pin::new(t.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

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

/// An answer's body that keeps its request in flight until it is written or dropped,
/// so a connection writing a long answer (a gRPC stream, a Batch API file) is never
/// taken for idle.
#[derive(Debug)]
pub struct TrackedBody<B> {
    body: B,
    _in_flight: InFlight,
}

impl<B> TrackedBody<B> {
    /// `body`, its request in flight until it ends.
    pub fn new(body: B, in_flight: InFlight) -> Self {
        TrackedBody {
            body,
            _in_flight: in_flight,
        }
    }
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
