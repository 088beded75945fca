//! One HTTP/1.1 exchange on an open connection, written and read here: the request head
//! and body out, the answer's head and whole body in.
//!
//! hyper's client connection did this before, at about 16,000 instructions a call of the
//! overhead scenario, a fifth of the real-time path (docs/performance-history.md): its
//! dispatcher, its channel between the request and the connection, its streaming body
//! types. A call of the pool needs none of it: it writes one request with a body already
//! whole, and reads one answer whole, on a connection nobody else uses meanwhile.
//!
//! - Out: the request line, `host`, the end-to-end headers, `content-length`, then the
//!   body; one write when head and body are small together, else the body from its own
//!   buffer (never copied).
//! - In (RFC 9112): the head parsed by httparse (at most [`MAX_HEAD`] bytes and
//!   [`MAX_HEADERS`] fields); informational answers (`100 Continue`, `103`) skipped;
//!   the body framed by `transfer-encoding: chunked`, else `content-length` (every value
//!   the same number, or the answer is refused), else by the connection's close; none
//!   for `HEAD`, 1xx, 204 and 304. A body over the caller's limit is refused when its
//!   length says so, before it is read.
//! - The connection carries another call only after an answer read whole, framed by
//!   its length or chunks, HTTP/1.1 without `connection: close` (HTTP/1.0 with
//!   `keep-alive`), with nothing read past it.

use std::future::poll_fn;
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::task::Poll;

use bytes::{Bytes, BytesMut};
use http::header::{CONNECTION, CONTENT_LENGTH, TRANSFER_ENCODING};
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Response, StatusCode, Version};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

use crate::backend::endpoint::Failure;
use crate::backend::message::{is_hop_by_hop, keep_end_to_end};
use crate::trace::{TraceParent, REQUEST_ID, TRACEPARENT};

mod stream;

/// What an HTTP/1.1 call writes for its trace: its `traceparent` and `x-request-id`,
/// in place of any the client sent.
pub(crate) type Trace = (TraceParent, HeaderValue);

/// The longest answer head read: as hyper's default read buffer limit allows.
pub(super) const MAX_HEAD: usize = 64 * 1024;

/// The most header fields an answer may have.
pub(super) const MAX_HEADERS: usize = 100;

/// Head and body go out in one write up to this size together.
const ONE_WRITE: usize = 16 * 1024;

/// How much is read at a time while the head is incomplete.
const READ_CHUNK: usize = 8 * 1024;

/// The longest line of a chunked body's framing (a chunk's size and extensions, or a
/// trailer field).
const MAX_CHUNK_LINE: usize = 4 * 1024;

/// A connection's socket: plain TCP, or TLS over it.
pub(super) enum Io {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

/// An open connection and its buffers.
pub(super) struct Wire {
    io: Io,
    /// Bytes read and not yet taken (the start of the next answer, normally empty).
    read: BytesMut,
    /// The request head being written.
    write: Vec<u8>,
    /// Whether the connection may carry another call.
    pub(super) reusable: bool,
    /// Set by [`Wire::answer`] when the answer read is a stream's head: how its body,
    /// still on the connection, is delimited.
    streaming: Option<Framing>,
}

/// How one exchange ended.
pub(super) enum Sent {
    /// The answer, or why there is none; or, when [`Wire::streaming`] says so, a
    /// stream's head, its body to be read as it comes on this connection.
    Done(Result<Response<Bytes>, Failure>),
    /// Nothing was written: the connection had closed (or failed) before.
    Unsent(String),
}

/// How an answer's body is delimited.
#[derive(Clone, Copy)]
pub(super) enum Framing {
    None,
    Length(usize),
    Chunked,
    Close,
}

impl Wire {
    /// A connection just opened.
    pub(super) fn new(io: Io) -> Wire {
        Wire {
            io,
            read: BytesMut::new(),
            write: Vec::with_capacity(512),
            reusable: true,
            streaming: None,
        }
    }

    /// Sends `request` (its URI in origin form) with `host`, and reads the whole answer,
    /// refusing a body over `max_body` bytes; or, when `stream` and the answer is a
    /// successful stream of server-sent events, its head alone ([`Wire::streaming`]).
    /// `reused`: the connection carried an answer before and may have been closed by
    /// the backend since; if so the request is not sent. The request stays the
    /// caller's, to send again elsewhere should it fail.
    pub(super) async fn exchange(
        &mut self,
        request: &mut Request<Bytes>,
        host: &HeaderValue,
        trace: Option<&Trace>,
        (max_body, stream): (usize, bool),
        reused: bool,
    ) -> Sent {
        self.reusable = false;
        if reused {
            if let Err(why) = self.still_open().await {
                return Sent::Unsent(why);
            }
        }
        self.head(request, host, trace);
        let body = request.body();
        let together = self.write.len() + body.len() <= ONE_WRITE;
        if together {
            self.write.extend_from_slice(body);
        }
        // The first write decides whether anything left: if it fails, nothing did.
        let first = match write_some(&mut self.io, &self.write).await {
            Ok(n) => n,
            Err(e) if reused => return Sent::Unsent(format!("the idle connection had failed: {e}")),
            Err(e) => return Sent::Done(Err(Failure::Connect(format!("could not send the request: {e}")))),
        };
        if let Err(e) = self.write_rest(first, (!together).then_some(body)).await {
            return Sent::Done(Err(Failure::Unanswered(format!(
                "could not send the whole request: {e}"
            ))));
        }
        let head_only = request.method() == Method::HEAD;
        Sent::Done(self.answer(head_only, max_body, stream).await)
    }

    /// How the body of the stream whose head [`Wire::exchange`] just returned is
    /// delimited, if it did return one (its body still on the connection, which is
    /// never [`Wire::reusable`] then).
    pub(super) fn streaming(&mut self) -> Option<Framing> {
        self.streaming.take()
    }

    /// The head from byte `from` on, then `body` when it was not written with the head.
    async fn write_rest(&mut self, from: usize, body: Option<&Bytes>) -> std::io::Result<()> {
        self.io.write_all(&self.write[from..]).await?;
        if let Some(body) = body {
            self.io.write_all(body).await?;
        }
        self.io.flush().await
    }

    /// `Ok` when the connection is open with nothing waiting on it (a closed one reads
    /// as end of file at once; an answer nobody asked for means it is out of step).
    async fn still_open(&mut self) -> Result<(), String> {
        if !self.read.is_empty() {
            return Err("the backend sent bytes nobody asked for".into());
        }
        let mut probe = [0u8; 1];
        let io = &mut self.io;
        poll_fn(|cx| {
            let mut buf = ReadBuf::new(&mut probe);
            Poll::Ready(match Pin::new(&mut *io).poll_read(cx, &mut buf) {
                Poll::Pending => Ok(()),
                Poll::Ready(Ok(())) if buf.filled().is_empty() => Err("the backend closed the idle connection".into()),
                Poll::Ready(Ok(())) => Err("the backend sent bytes nobody asked for".into()),
                Poll::Ready(Err(e)) => Err(format!("the idle connection failed: {e}")),
            })
        })
        .await
    }

    /// Writes the request head into the write buffer: the request line, `host`, the
    /// trace's headers, the request's end-to-end headers, `content-length`.
    fn head(&mut self, request: &mut Request<Bytes>, host: &HeaderValue, trace: Option<&Trace>) {
        let w = &mut self.write;
        w.clear();
        w.extend_from_slice(request.method().as_str().as_bytes());
        w.push(b' ');
        let target = request.uri().path_and_query().map_or("/", |p| p.as_str());
        w.extend_from_slice(target.as_bytes());
        w.extend_from_slice(b" HTTP/1.1\r\nhost: ");
        w.extend_from_slice(host.as_bytes());
        w.extend_from_slice(b"\r\n");
        if let Some((traceparent, request_id)) = trace {
            w.extend_from_slice(b"traceparent: ");
            w.extend_from_slice(&traceparent.bytes());
            w.extend_from_slice(b"\r\nx-request-id: ");
            w.extend_from_slice(request_id.as_bytes());
            w.extend_from_slice(b"\r\n");
        }
        let mut connection = false;
        for (name, value) in request.headers() {
            if is_hop_by_hop(name) {
                connection |= name == CONNECTION;
                continue;
            }
            if trace.is_some() && (name == TRACEPARENT || name == REQUEST_ID) {
                continue;
            }
            w.extend_from_slice(name.as_str().as_bytes());
            w.extend_from_slice(b": ");
            w.extend_from_slice(value.as_bytes());
            w.extend_from_slice(b"\r\n");
        }
        if connection {
            // `connection` may name more headers to leave out: the map is made end to
            // end (then it has no `connection`), and the head written again.
            keep_end_to_end(request.headers_mut());
            return self.head(request, host, trace);
        }
        let body = request.body().len();
        let method = request.method();
        if body > 0 || *method == Method::POST || *method == Method::PUT || *method == Method::PATCH {
            w.extend_from_slice(b"content-length: ");
            w.extend_from_slice(crate::protocol::decimal(body, &mut [0u8; 20]));
            w.extend_from_slice(b"\r\n");
        }
        w.extend_from_slice(b"\r\n");
    }

    /// Reads the answer: its head (informational ones skipped), then its whole body
    /// (a successful stream's, when `stream`, not: it is read as it comes).
    async fn answer(&mut self, head_only: bool, max_body: usize, stream: bool) -> Result<Response<Bytes>, Failure> {
        // Whether any byte of an answer came (an informational one counts).
        let mut heard = false;
        let ((parts, framing, keep_alive), rest) = loop {
            if let Some((head, rest)) = parse_head(&mut self.read)? {
                if !head.0.status.is_informational() {
                    break (head, rest);
                }
                if head.0.status == StatusCode::SWITCHING_PROTOCOLS {
                    return Err(Failure::Other("the backend switched protocols".into()));
                }
                self.read = BytesMut::from(&rest[..]);
                heard = true;
                continue;
            }
            if self.read.len() >= MAX_HEAD {
                return Err(Failure::Other(format!("the answer's head is over {MAX_HEAD} bytes")));
            }
            self.read.reserve(READ_CHUNK);
            let silent = !heard && self.read.is_empty();
            match self.fill().await {
                Ok(0) if silent => {
                    return Err(Failure::Unanswered(
                        "the backend closed the connection before answering".into(),
                    ))
                }
                Ok(0) => {
                    return Err(Failure::Other(
                        "the backend closed the connection in the middle of the answer's head".into(),
                    ))
                }
                Ok(_) => {}
                Err(Failure::Other(why)) if silent => return Err(Failure::Unanswered(why)),
                Err(failure) => return Err(failure),
            }
        };
        let framing = match (head_only, framing) {
            (true, _) => Framing::None,
            (false, framing) => framing,
        };
        if stream && parts.status.is_success() && is_event_stream(&parts.headers) {
            if !rest.is_empty() {
                self.read = BytesMut::from(&rest[..]);
            }
            let _ = keep_alive; // a stream's connection closes with it
            self.streaming = Some(framing);
            return Ok(Response::from_parts(parts, Bytes::new()));
        }
        let body = match framing {
            // Read whole with its head (the common answer): a slice of what was read.
            Framing::Length(n) if n <= rest.len() && n <= max_body => {
                if rest.len() > n {
                    self.read = BytesMut::from(&rest[n..]);
                }
                rest.slice(..n)
            }
            framing => {
                if !rest.is_empty() {
                    self.read = BytesMut::from(&rest[..]);
                }
                match framing {
                    Framing::None => Bytes::new(),
                    Framing::Length(n) => self.exact(n, max_body).await?,
                    Framing::Chunked => self.chunked(max_body).await?,
                    Framing::Close => self.until_close(max_body).await?,
                }
            }
        };
        let whole = matches!(framing, Framing::None | Framing::Length(_) | Framing::Chunked);
        self.reusable = keep_alive && whole && self.read.is_empty();
        Ok(Response::from_parts(parts, body))
    }

    /// Reads more into the read buffer; how many bytes (0 at the end of the stream).
    async fn fill(&mut self) -> Result<usize, Failure> {
        self.io
            .read_buf(&mut self.read)
            .await
            .map_err(|e| Failure::Other(format!("could not read the answer: {e}")))
    }

    /// A body of exactly `n` bytes.
    async fn exact(&mut self, n: usize, max_body: usize) -> Result<Bytes, Failure> {
        if n > max_body {
            return Err(too_large(max_body));
        }
        if self.read.len() < n {
            self.read.reserve(n - self.read.len());
        }
        while self.read.len() < n {
            if self.fill().await? == 0 {
                return Err(Failure::Body(format!(
                    "the backend closed the connection after {} of the body's {n} bytes",
                    self.read.len()
                )));
            }
        }
        Ok(self.read.split_to(n).freeze())
    }

    /// A chunked body, its chunks joined; trailers are read and left out.
    async fn chunked(&mut self, max_body: usize) -> Result<Bytes, Failure> {
        let mut body = BytesMut::new();
        loop {
            let line = self.line().await?;
            let size = chunk_size(&line).ok_or_else(|| {
                Failure::Body(format!(
                    "a chunk's size line is not hexadecimal: {:?}",
                    String::from_utf8_lossy(&line)
                ))
            })?;
            if size == 0 {
                break;
            }
            if body.len().saturating_add(size) > max_body {
                return Err(too_large(max_body));
            }
            let data = self.exact(size, usize::MAX).await?;
            body.extend_from_slice(&data);
            if !self.line().await?.is_empty() {
                return Err(Failure::Body("a chunk is longer than its size says".into()));
            }
        }
        // Trailer fields, up to the empty line that ends the message.
        while !self.line().await?.is_empty() {}
        Ok(body.freeze())
    }

    /// One line of chunked framing, without its CRLF (a bare LF is accepted, as hyper did).
    async fn line(&mut self) -> Result<Bytes, Failure> {
        loop {
            if let Some(end) = memchr::memchr(b'\n', &self.read) {
                let mut line = self.read.split_to(end + 1);
                line.truncate(end);
                if line.last() == Some(&b'\r') {
                    line.truncate(end - 1);
                }
                return Ok(line.freeze());
            }
            if self.read.len() > MAX_CHUNK_LINE {
                return Err(Failure::Body(format!(
                    "a line of the chunked body is over {MAX_CHUNK_LINE} bytes"
                )));
            }
            self.read.reserve(READ_CHUNK);
            if self.fill().await? == 0 {
                return Err(Failure::Body(
                    "the backend closed the connection in the middle of a chunked body".into(),
                ));
            }
        }
    }

    /// A body that ends where the connection does.
    async fn until_close(&mut self, max_body: usize) -> Result<Bytes, Failure> {
        loop {
            if self.read.len() > max_body {
                return Err(too_large(max_body));
            }
            self.read.reserve(READ_CHUNK);
            if self.fill().await? == 0 {
                return Ok(self.read.split().freeze());
            }
        }
    }
}

/// Whether `headers` say the body is a stream of server-sent events.
pub(in crate::backend) fn is_event_stream(headers: &HeaderMap) -> bool {
    headers
        .get(http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"))
}

fn too_large(max_body: usize) -> Failure {
    Failure::Body(format!(
        "length limit exceeded: the answer's body is over {max_body} bytes"
    ))
}

/// One write of as much of `bytes` as the socket takes.
async fn write_some(io: &mut Io, bytes: &[u8]) -> std::io::Result<usize> {
    match io.write(bytes).await {
        Ok(0) if !bytes.is_empty() => Err(std::io::ErrorKind::WriteZero.into()),
        other => other,
    }
}

/// An answer's head: its parts, how its body is framed, and whether its connection
/// may be kept (as its version and `connection` header say).
type Head = (http::response::Parts, Framing, bool);

/// The answer head at the start of `read` when it is whole, and the bytes read after
/// it (`read` is left empty); `None` while it is incomplete (`read` left as it was).
/// Header values are slices of what was read, not copies.
fn parse_head(read: &mut BytesMut) -> Result<Option<(Head, Bytes)>, Failure> {
    let frozen = std::mem::take(read).freeze();
    let mut fields = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS];
    let mut parsed = httparse::Response::new(&mut []);
    let len =
        match httparse::ParserConfig::default().parse_response_with_uninit_headers(&mut parsed, &frozen, &mut fields) {
            Ok(httparse::Status::Complete(len)) => len,
            Ok(httparse::Status::Partial) => {
                *read = frozen
                    .try_into_mut()
                    .unwrap_or_else(|shared| BytesMut::from(&shared[..]));
                return Ok(None);
            }
            Err(e) => return Err(Failure::Other(format!("the answer's head is not HTTP/1.1: {e}"))),
        };
    let status = parsed
        .code
        .and_then(|c| StatusCode::from_u16(c).ok())
        .ok_or_else(|| Failure::Other("the answer's status code is not one".into()))?;
    let version = match parsed.version {
        Some(0) => Version::HTTP_10,
        _ => Version::HTTP_11,
    };
    let count = parsed.headers.len();
    // Room for the gateway's own headers on the answer (tier, reason, policy version,
    // request id, trace), so adding them does not grow the map.
    let mut headers = HeaderMap::with_capacity(count + 8);
    let mut framing = None::<Framing>;
    let mut length = None::<usize>;
    let (mut close, mut keep, mut hop) = (false, false, false);
    for field in parsed.headers.iter() {
        let name = HeaderName::from_bytes(field.name.as_bytes())
            .map_err(|_| Failure::Other("the answer has a header name that is not one".into()))?;
        let value = HeaderValue::from_maybe_shared(frozen.slice_ref(field.value))
            .map_err(|_| Failure::Other(format!("the answer's {name} header is not a header value")))?;
        if name == CONTENT_LENGTH {
            // Read here and left out: the gateway frames the body it passes on itself.
            let n = std::str::from_utf8(value.as_bytes())
                .ok()
                .and_then(|v| v.trim().parse::<usize>().ok())
                .filter(|n| length.is_none_or(|l| l == *n))
                .ok_or_else(|| Failure::Other("the answer's content-length is not one number".into()))?;
            length = Some(n);
            continue;
        }
        if is_hop_by_hop(&name) {
            hop = true;
            if name == TRANSFER_ENCODING {
                let last = value.as_bytes().rsplit(|b| *b == b',').next().unwrap_or_default();
                framing = Some(match last.trim_ascii().eq_ignore_ascii_case(b"chunked") {
                    true => Framing::Chunked,
                    false => Framing::Close,
                });
            } else if name == CONNECTION {
                for token in value.as_bytes().split(|b| *b == b',') {
                    close |= token.trim_ascii().eq_ignore_ascii_case(b"close");
                    keep |= token.trim_ascii().eq_ignore_ascii_case(b"keep-alive");
                }
            }
        }
        headers.append(name, value);
    }
    if hop {
        // Only end-to-end headers are passed on (and none a `connection` header names).
        keep_end_to_end(&mut headers);
    }
    let framing = match () {
        _ if status.is_informational() || status == StatusCode::NO_CONTENT || status == StatusCode::NOT_MODIFIED => {
            Framing::None
        }
        _ => framing.or(length.map(Framing::Length)).unwrap_or(Framing::Close),
    };
    let keep_alive = !close && (version == Version::HTTP_11 || keep);
    let mut parts = Response::new(()).into_parts().0;
    parts.status = status;
    parts.version = version;
    parts.headers = headers;
    Ok(Some(((parts, framing, keep_alive), frozen.slice(len..))))
}

/// A chunk's size from its line (hexadecimal, then optional `;extensions`).
fn chunk_size(line: &[u8]) -> Option<usize> {
    let digits = line.split(|b| *b == b';').next()?.trim_ascii();
    if digits.is_empty() || digits.len() > 15 {
        return None;
    }
    let text = std::str::from_utf8(digits).ok()?;
    usize::from_str_radix(text, 16).ok()
}

impl AsyncRead for Io {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Io::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Io {
    fn poll_write(self: Pin<&mut Self>, cx: &mut std::task::Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Io::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Io::Plain(s) => Pin::new(s).poll_flush(cx),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Io::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunk_sizes_are_hexadecimal_with_extensions_left_out() {
        assert_eq!(chunk_size(b"1a"), Some(26));
        assert_eq!(chunk_size(b"0"), Some(0));
        assert_eq!(chunk_size(b"FF;name=value"), Some(255));
        assert_eq!(chunk_size(b" 10 "), Some(16));
        assert_eq!(chunk_size(b""), None);
        assert_eq!(chunk_size(b"-1"), None);
        assert_eq!(chunk_size(b"1000000000000000"), None, "past 15 digits");
    }

    fn head(text: &str) -> Result<Option<Head>, Failure> {
        parse_head(&mut BytesMut::from(text)).map(|parsed| parsed.map(|(head, _)| head))
    }

    #[test]
    fn heads_say_how_their_body_is_framed_and_whether_the_connection_stays() {
        let framed = |text: &str| match head(text) {
            Ok(Some((_, framing, keep))) => (
                match framing {
                    Framing::None => "none".to_owned(),
                    Framing::Length(n) => format!("length {n}"),
                    Framing::Chunked => "chunked".into(),
                    Framing::Close => "close".into(),
                },
                keep,
            ),
            Ok(None) => ("partial".into(), false),
            Err(_) => ("refused".into(), false),
        };
        let is = |framing: &str, keep: bool| (framing.to_owned(), keep);
        assert_eq!(
            framed("HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n"),
            is("length 5", true)
        );
        assert_eq!(
            framed("HTTP/1.1 200 OK\r\nContent-Length: 5\r\ncontent-length: 5\r\n\r\n"),
            is("length 5", true)
        );
        assert_eq!(
            framed("HTTP/1.1 200 OK\r\ncontent-length: 5\r\ncontent-length: 6\r\n\r\n"),
            is("refused", false)
        );
        assert_eq!(
            framed("HTTP/1.1 200 OK\r\ncontent-length: -5\r\n\r\n"),
            is("refused", false)
        );
        assert_eq!(
            framed("HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked\r\ncontent-length: 9\r\n\r\n"),
            is("chunked", true)
        );
        assert_eq!(
            framed("HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\n\r\n"),
            is("close", true)
        );
        assert_eq!(framed("HTTP/1.1 200 OK\r\n\r\n"), is("close", true));
        assert_eq!(
            framed("HTTP/1.1 204 No Content\r\ncontent-length: 9\r\n\r\n"),
            is("none", true)
        );
        assert_eq!(
            framed("HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 0\r\n\r\n"),
            is("length 0", false)
        );
        assert_eq!(
            framed("HTTP/1.0 200 OK\r\ncontent-length: 0\r\n\r\n"),
            is("length 0", false)
        );
        assert_eq!(
            framed("HTTP/1.0 200 OK\r\nConnection: Keep-Alive\r\ncontent-length: 0\r\n\r\n"),
            is("length 0", true)
        );
        assert_eq!(framed("HTTP/1.1 200 OK\r\ncontent-len"), is("partial", false));
        assert_eq!(framed("SSH-2.0-OpenSSH\r\n\r\n"), is("refused", false));
    }

    #[test]
    fn a_parsed_head_leaves_the_body_in_the_buffer_and_shares_its_values() {
        let mut read = BytesMut::from("HTTP/1.1 201 Created\r\nx-a: one\r\ncontent-length: 3\r\n\r\nabc");
        let ((parts, _, _), rest) = parse_head(&mut read).expect("valid").expect("whole");
        assert_eq!(parts.status, 201);
        assert_eq!(parts.headers["x-a"], "one");
        assert_eq!(&rest[..], b"abc");
        assert!(read.is_empty());
        let mut partial = BytesMut::from("HTTP/1.1 200 OK\r\nx-a: o");
        assert!(parse_head(&mut partial).expect("valid so far").is_none());
        assert_eq!(&partial[..], b"HTTP/1.1 200 OK\r\nx-a: o", "left as it was");
    }
}
