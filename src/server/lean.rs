//! The data door's own HTTP/1.1 server for the common request: a head that parses
//! whole, a body of declared length that came with it (or none), nothing to negotiate.
//! Everything else (HTTP/1.0, HTTP/2's preface, chunked or still-arriving bodies,
//! `Expect`, `Upgrade`, `HEAD`, a head that does not parse) hands the connection, with
//! every byte read so far, to hyper for the rest of its life, so hyper answers every
//! case this path does not take (its 400s and 431s too).
//!
//! Why it exists: under the door, hyper's server machinery (its dispatcher, the body
//! channel, its buffers) costs more instructions per request than the gateway's own
//! path does in the door (docs/performance.md). This path reads the head into one
//! buffer, builds the request from slices of it, calls the door, and writes the answer
//! in one vectored write. What hyper did for each request it keeps: a client that hangs
//! up cancels its request; pipelined requests are answered in order; `Date` on every
//! answer; a stop closes an idle connection at once and a busy one after its answer
//! (with `connection: close`).

use std::future::Future;
use std::io::IoSlice;
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::header::{CONNECTION, CONTENT_LENGTH, DATE, TRANSFER_ENCODING};
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Response, StatusCode, Uri, Version};
use http_body_util::Full;
use hyper::body::Body;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};

use super::counted::Activity;
use super::{Conn, Stop};

/// The body of a request this server reads: all of it, read with its head.
pub type Whole = Full<Bytes>;

/// The longest head this path reads before handing the connection to hyper (which
/// reads up to its own limit and answers 431 past it).
const HEAD_MAX: usize = 16 << 10;
/// Fields in a head this path reads (more: hyper's).
const FIELDS: usize = 64;
/// What one read of the socket asks for at least.
const READ: usize = 8 << 10;
/// Bytes of later requests read while one is answered (pipelined, or a hang-up's end
/// of stream), before reading stops until the answer is written.
const AHEAD: usize = 64 << 10;

/// How a connection left this path.
pub(super) enum Ended {
    /// Closed (the client's end, an error, a stop, `connection: close`).
    Closed,
    /// For hyper to serve from here on: the bytes read and not yet served, and the stop
    /// that already came, if one did.
    Handed(BytesMut, Option<Stop>),
}

/// What a stop did to a connection waiting for its next head.
struct Stopping {
    /// The stop that came (told to hyper if the connection is handed on).
    stop: Stop,
    /// Until when a connection with no request yet may take to send its first.
    first_by: Option<tokio::time::Instant>,
}

/// Serves `io`'s requests with `answer` until the connection closes or is handed on.
/// `stop` is the connection's stop signal (gateway stopping, or connection asked to
/// close); `first_request` how long a connection with no request yet gets once the
/// gateway stops.
pub(super) async fn serve<L, Fut, B, S>(
    io: &mut Conn,
    (answer, stamping): (&L, super::Stamping<B>),
    activity: &Arc<Activity>,
    stop: &mut S,
    first_request: Duration,
) -> Ended
where
    L: Fn(Request<Whole>) -> Fut,
    Fut: Future<Output = Response<B>>,
    B: Body<Data = Bytes> + Unpin,
    S: Future<Output = Stop> + Unpin,
{
    let mut read = BytesMut::with_capacity(READ);
    let mut head = Vec::with_capacity(256);
    let mut stopping: Option<Stopping> = None;
    let mut asked = false;
    loop {
        // The next head: parsed from what was read, or read for.
        let (request, close) = loop {
            if !read.is_empty() {
                match parse(&mut read) {
                    Parsed::Request(request, close) => break (request, close),
                    Parsed::Partial if read.len() < HEAD_MAX => {}
                    Parsed::Partial | Parsed::Other => return Ended::Handed(read, stopping.map(|s| s.stop)),
                }
            }
            if read.capacity() - read.len() < READ / 2 {
                read.reserve(READ);
            }
            let first_by = stopping.as_ref().and_then(|s| s.first_by);
            tokio::select! {
                biased;
                got = io.read_buf(&mut read) => match got {
                    Ok(0) | Err(_) => return Ended::Closed,
                    Ok(_) => {}
                },
                () = until(first_by), if first_by.is_some() && read.is_empty() => return Ended::Closed,
                stop = &mut *stop, if stopping.is_none() => {
                    // Between requests a connection closes now; one with a head on its
                    // way is answered first. One that has had no request yet gets
                    // `first_request` for it when the gateway stops (its client may
                    // have sent it already).
                    let first = matches!(stop, Stop::Gateway) && !asked;
                    if read.is_empty() && !first {
                        return Ended::Closed;
                    }
                    let first_by = first.then(|| tokio::time::Instant::now() + first_request);
                    stopping = Some(Stopping { stop, first_by });
                }
            }
        };
        asked = true;
        let in_flight = activity.begin();
        // The answer, while the socket is watched for the client's hang-up (which
        // cancels it) and later requests are read ahead.
        let answering = answer(request);
        tokio::pin!(answering);
        let response = loop {
            tokio::select! {
                biased;
                response = &mut answering => break response,
                got = io.read_buf(&mut read), if read.len() < AHEAD => match got {
                    Ok(0) | Err(_) => return Ended::Closed,
                    Ok(_) => {}
                },
            }
            if read.capacity() == read.len() {
                read.reserve(READ);
            }
        };
        if stopping.is_none() {
            let polled = std::future::poll_fn(|cx| Poll::Ready(Pin::new(&mut *stop).poll(cx))).await;
            if let Poll::Ready(stop) = polled {
                stopping = Some(Stopping { stop, first_by: None });
            }
        }
        let close = close || stopping.is_some();
        let written = write((io, &mut read), &mut head, response, (close, stamping)).await;
        drop(in_flight);
        if !matches!(written, Ok(false)) {
            let _ = io.shutdown().await;
            return Ended::Closed;
        }
    }
}

/// Whether this path reads `bytes` as it should: what it takes (a request), it takes
/// whole and as httparse reads it (method, path, every field in order, the body of its
/// declared length, nothing more); what it leaves (half a head, anything for hyper), it
/// leaves byte for byte. For the unit tests and the `lean_head` fuzz target.
#[doc(hidden)]
pub fn reads_as_httparse(bytes: &[u8]) -> bool {
    let mut read = BytesMut::from(bytes);
    let Parsed::Request(request, _) = parse(&mut read) else {
        return read[..] == *bytes;
    };
    let mut fields = [httparse::EMPTY_HEADER; FIELDS];
    let mut parsed = httparse::Request::new(&mut fields);
    let Ok(httparse::Status::Complete(len)) = parsed.parse(bytes) else {
        return false;
    };
    let body = request.body().size_hint().exact().unwrap_or(u64::MAX);
    // Every field, each name's values in the order sent (a map keeps them by name).
    let same_fields = request.headers().len() == parsed.headers.len()
        && parsed.headers.iter().all(|field| {
            let sent = parsed
                .headers
                .iter()
                .filter(|f| f.name.eq_ignore_ascii_case(field.name));
            let kept = request.headers().get_all(field.name).iter();
            sent.map(|f| f.value).eq(kept.map(HeaderValue::as_bytes))
        });
    parsed.method == Some(request.method().as_str())
        && parsed.path.is_some_and(|p| request.uri() == p)
        && same_fields
        && usize::try_from(body).is_ok_and(|body| read[..] == bytes[len + body..])
}

/// Ready at `at` (never, without one).
async fn until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// What the bytes read so far hold.
#[allow(clippy::large_enum_variant)] // made once a request and taken apart at once: a box would cost an allocation
enum Parsed {
    /// A request this path serves, and whether its client asked to close after it.
    Request(Request<Whole>, bool),
    /// The start of a head.
    Partial,
    /// Something for hyper: see the module's docs.
    Other,
}

/// Reads a request from the front of `read`, taking it (head and body) out of `read`
/// only when this path serves it.
fn parse(read: &mut BytesMut) -> Parsed {
    let mut slots = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; FIELDS];
    let mut parsed = httparse::Request::new(&mut []);
    let len = match httparse::ParserConfig::default().parse_request_with_uninit_headers(&mut parsed, read, &mut slots) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return Parsed::Partial,
        Err(_) => return Parsed::Other,
    };
    if parsed.version != Some(1) {
        return Parsed::Other;
    }
    let method = match parsed.method.map(|m| Method::from_bytes(m.as_bytes())) {
        Some(Ok(m)) if m != Method::HEAD && m != Method::CONNECT => m,
        _ => return Parsed::Other,
    };
    let base = read.as_ptr() as usize;
    let at = |s: &[u8]| (s.as_ptr() as usize - base, s.len());
    let path = match parsed.path {
        Some(path) => at(path.as_bytes()),
        None => return Parsed::Other,
    };
    // Where each field is in the head (a head this long is hyper's), which name it has,
    // and what frames the body.
    if len > usize::from(u16::MAX) {
        return Parsed::Other;
    }
    let mut spans = [Span::default(); FIELDS];
    let count = parsed.headers.len();
    let mut length = None::<usize>;
    let mut close = false;
    for (field, span) in parsed.headers.iter().zip(spans.iter_mut()) {
        let name = field.name.as_bytes();
        let named = named(name);
        match named {
            Named::Length => match length_of(field.value) {
                Some(n) if length.is_none_or(|l| l == n) => length = Some(n),
                _ => return Parsed::Other,
            },
            Named::Connection => {
                for token in field.value.split(|b| *b == b',') {
                    let token = token.trim_ascii();
                    if token.eq_ignore_ascii_case(b"close") {
                        close = true;
                    } else if !token.eq_ignore_ascii_case(b"keep-alive") {
                        return Parsed::Other;
                    }
                }
            }
            Named::Hyper => return Parsed::Other,
            Named::Known(_) | Named::Other => {}
        }
        let (name_at, name_len) = at(name);
        let (value_at, value_len) = at(field.value);
        *span = Span {
            name: (name_at as u16, name_len as u16),
            value: (value_at as u16, value_len as u16),
            known: match named {
                Named::Known(i) => i,
                _ => u8::MAX,
            },
        };
    }
    let body_len = length.unwrap_or(0);
    if read.len() - len < body_len {
        return Parsed::Other; // a body still arriving: hyper reads it, within its timers
    }
    let frozen = read.split_to(len).freeze();
    let body = read.split_to(body_len).freeze();
    let built = Uri::from_maybe_shared(frozen.slice(path.0..path.0 + path.1))
        .ok()
        .and_then(|uri| Some((uri, fields(&frozen, &spans[..count])?)));
    let Some((uri, headers)) = built else {
        // Put back for hyper, which answers it 400.
        let mut back = BytesMut::with_capacity(len + body_len + read.len());
        back.extend_from_slice(&frozen);
        back.extend_from_slice(&body);
        back.extend_from_slice(read);
        *read = back;
        return Parsed::Other;
    };
    let mut request = Request::new(Full::new(body));
    *request.method_mut() = method;
    *request.uri_mut() = uri;
    *request.version_mut() = Version::HTTP_11;
    *request.headers_mut() = headers;
    Parsed::Request(request, close)
}

/// Where a field is in its head, and its name's place in [`KNOWN`] (`u8::MAX`: none).
#[derive(Debug, Clone, Copy, Default)]
struct Span {
    name: (u16, u16),
    value: (u16, u16),
    known: u8,
}

/// What a field's name is to this path.
enum Named {
    /// `content-length`: frames the body.
    Length,
    /// `connection`: `close` is honoured, `keep-alive` is the default, others are hyper's.
    Connection,
    /// `transfer-encoding`, `expect`, `upgrade`: hyper's.
    Hyper,
    /// One of [`KNOWN`], by its place.
    Known(u8),
    /// Any other.
    Other,
}

/// The names clients send most, taken as constants rather than parsed (a name of the
/// gateway's own would otherwise be copied into a new allocation each time).
static KNOWN: [HeaderName; 9] = [
    http::header::HOST,
    http::header::CONTENT_TYPE,
    http::header::ACCEPT,
    http::header::ACCEPT_ENCODING,
    http::header::USER_AGENT,
    crate::headers::BUDGET,
    crate::headers::PRIORITY,
    crate::trace::TRACEPARENT,
    crate::trace::REQUEST_ID,
];

/// What `name` is to this path: compared only with the names of its length (the
/// places in [`KNOWN`] are checked by a test).
fn named(name: &[u8]) -> Named {
    let is = |known: &[u8]| name.eq_ignore_ascii_case(known);
    match name.len() {
        4 if is(b"host") => Named::Known(0),
        6 if is(b"accept") => Named::Known(2),
        6 if is(b"expect") => Named::Hyper,
        7 if is(b"upgrade") => Named::Hyper,
        10 if is(b"connection") => Named::Connection,
        10 if is(b"user-agent") => Named::Known(4),
        11 if is(b"traceparent") => Named::Known(7),
        12 if is(b"content-type") => Named::Known(1),
        12 if is(b"x-request-id") => Named::Known(8),
        14 if is(b"content-length") => Named::Length,
        15 if is(b"accept-encoding") => Named::Known(3),
        17 if is(b"transfer-encoding") => Named::Hyper,
        19 if is(b"x-tiergate-priority") => Named::Known(6),
        20 if is(b"x-tiergate-budget-ms") => Named::Known(5),
        _ => Named::Other,
    }
}

/// The header map of a head's fields, from where they are in `head`; `None` if a name
/// is not one (httparse takes only tokens, so none should be).
fn fields(head: &Bytes, spans: &[Span]) -> Option<HeaderMap> {
    let mut headers = HeaderMap::with_capacity(spans.len());
    for span in spans {
        let ((name_at, name_len), (value_at, value_len)) = (span.name, span.value);
        let name = match KNOWN.get(usize::from(span.known)) {
            Some(known) => known.clone(),
            None => HeaderName::from_bytes(&head[usize::from(name_at)..usize::from(name_at + name_len)]).ok()?,
        };
        let value = head.slice(usize::from(value_at)..usize::from(value_at + value_len));
        headers.append(name, HeaderValue::from_maybe_shared(value).ok()?);
    }
    Some(headers)
}

/// A `content-length` value: digits only (as hyper reads it), at most 19 of them.
fn length_of(value: &[u8]) -> Option<usize> {
    if value.is_empty() || value.len() > 19 || !value.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(value.iter().fold(0usize, |n, d| n * 10 + usize::from(d - b'0')))
}

/// Whether a `connection` value says `close`.
fn says_close(value: &HeaderValue) -> bool {
    value
        .as_bytes()
        .split(|b| *b == b',')
        .any(|t| t.trim_ascii().eq_ignore_ascii_case(b"close"))
}

/// Writes `response` (its head rendered into `head`, reused): the body framed by its
/// length when known (by chunks when not; none for 1xx, 204 and 304), `Date` added when
/// the answer has none, `connection: close` when `close` (the connection closes after
/// it). Whether the connection closes now: `close`, or the answer's own `connection`
/// said so.
async fn write<B>(
    (io, read): (&mut Conn, &mut BytesMut),
    head: &mut Vec<u8>,
    response: Response<B>,
    (close, stamping): (bool, super::Stamping<B>),
) -> std::io::Result<bool>
where
    B: Body<Data = Bytes> + Unpin,
{
    let (parts, mut body) = response.into_parts();
    let status = parts.status;
    let bodiless = status.is_informational() || status == StatusCode::NO_CONTENT || status == StatusCode::NOT_MODIFIED;
    let length = body.size_hint().exact();
    head.clear();
    head.extend_from_slice(b"HTTP/1.1 ");
    head.extend_from_slice(status.as_str().as_bytes());
    head.push(b' ');
    head.extend_from_slice(status.canonical_reason().unwrap_or("").as_bytes());
    head.extend_from_slice(b"\r\n");
    // The answer's own fields first, from its body; the same names in its header map
    // (a backend's own) are left out.
    let stamped = (stamping.write)(&body, head);
    let (mut closes, mut dated) = (close, false);
    for (name, value) in &parts.headers {
        if name == CONTENT_LENGTH || name == TRANSFER_ENCODING {
            continue; // framed here
        }
        if stamped && stamping.names.contains(name) {
            continue;
        }
        if name == CONNECTION {
            if close {
                continue; // this path's own `close` follows
            }
            closes |= says_close(value);
        }
        dated |= name == DATE;
        head.extend_from_slice(name.as_str().as_bytes());
        head.extend_from_slice(b": ");
        head.extend_from_slice(value.as_bytes());
        head.extend_from_slice(b"\r\n");
    }
    if close {
        head.extend_from_slice(b"connection: close\r\n");
    }
    if !dated {
        head.extend_from_slice(b"date: ");
        date::render(head);
        head.extend_from_slice(b"\r\n");
    }
    let chunked = !bodiless && length.is_none();
    match (bodiless, length) {
        (true, _) => {}
        (false, Some(n)) => {
            head.extend_from_slice(b"content-length: ");
            head.extend_from_slice(crate::protocol::decimal(n as usize, &mut [0u8; 20]));
            head.extend_from_slice(b"\r\n");
        }
        (false, None) => head.extend_from_slice(b"transfer-encoding: chunked\r\n"),
    }
    head.extend_from_slice(b"\r\n");
    if bodiless {
        return write_all(io, &[head]).await.map(|()| closes);
    }
    if chunked {
        // A stream (or any body of unknown length): its own writer, boxed, so a whole
        // answer's future stays as small as it was.
        return Box::pin(write_chunked((io, read), head, body, stamping))
            .await
            .map(|()| closes);
    }
    // The first chunk goes with the head (a whole answer: all of it).
    let mut first = true;
    loop {
        let data = match std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await {
            Some(Ok(frame)) => match frame.into_data() {
                Ok(data) => data,
                Err(_) => continue, // trailers: not sent over HTTP/1.1
            },
            Some(Err(_)) => return Err(std::io::Error::other("the answer's body failed")),
            None => break,
        };
        let head_part: &[u8] = if first { head } else { &[] };
        first = false;
        write_all(io, &[head_part, &data]).await?;
    }
    if first {
        write_all(io, &[head]).await?;
    }
    Ok(closes)
}

/// Writes a body of unknown length, chunked: the head at once, each frame as a chunk the
/// moment it comes (a stream's event); while it waits for the next, a client that hangs
/// up ends it (the body dropped: a stream's backend call with it). A write that fails
/// is told to the body (`stamping.cut`: a relay ends as `slow_reader` or
/// `client_gone`).
async fn write_chunked<B>(
    (io, read): (&mut Conn, &mut BytesMut),
    head: &[u8],
    mut body: B,
    stamping: super::Stamping<B>,
) -> std::io::Result<()>
where
    B: Body<Data = Bytes> + Unpin,
{
    write_all(io, &[head]).await?;
    loop {
        let next = std::future::poll_fn(|cx| match Pin::new(&mut body).poll_frame(cx) {
            Poll::Ready(frame) => Poll::Ready(Ok(frame)),
            Poll::Pending => hung_up(io, read, cx),
        });
        let data = match next.await? {
            Some(Ok(frame)) => match frame.into_data() {
                Ok(data) => data,
                Err(_) => continue, // trailers: not sent over HTTP/1.1
            },
            Some(Err(_)) => return Err(std::io::Error::other("the answer's body failed")),
            None => break,
        };
        if data.is_empty() {
            continue; // an empty chunk would end the body
        }
        let mut line = [0u8; 18];
        if let Err(e) = write_all(io, &[chunk_line(data.len(), &mut line), &data, b"\r\n"]).await {
            (stamping.cut)(&mut body, &e);
            return Err(e);
        }
    }
    write_all(io, &[b"0\r\n\r\n"]).await
}

/// A chunk's size line (`{len:x}\r\n`), written into `buf`.
fn chunk_line(len: usize, buf: &mut [u8; 18]) -> &[u8] {
    let digits = (usize::BITS - len.leading_zeros()).div_ceil(4).max(1) as usize;
    for (i, at) in (0..digits).rev().enumerate() {
        buf[at] = b"0123456789abcdef"[(len >> (4 * i)) & 0xf];
    }
    buf[digits..digits + 2].copy_from_slice(b"\r\n");
    &buf[..digits + 2]
}

/// `Err` once the client has closed its end of `io` (or it failed); what it sends
/// meanwhile (a pipelined request) is kept in `read`, up to [`AHEAD`]; else pending.
fn hung_up<T>(io: &mut Conn, read: &mut BytesMut, cx: &mut Context<'_>) -> Poll<std::io::Result<T>> {
    if read.len() >= AHEAD {
        return Poll::Pending;
    }
    // Onto the stack, left unzeroed: a look costs no more than the read.
    let mut chunk = [MaybeUninit::<u8>::uninit(); 1024];
    let mut buf = ReadBuf::uninit(&mut chunk);
    match Pin::new(io).poll_read(cx, &mut buf) {
        Poll::Ready(Ok(())) if buf.filled().is_empty() => {
            Poll::Ready(Err(std::io::ErrorKind::ConnectionAborted.into()))
        }
        Poll::Ready(Ok(())) => {
            read.extend_from_slice(buf.filled());
            cx.waker().wake_by_ref(); // look again: the client may have closed since
            Poll::Pending
        }
        Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
        Poll::Pending => Poll::Pending,
    }
}

/// Writes all of `parts` (at most four), in as few system calls as the socket takes.
async fn write_all(io: &mut Conn, parts: &[&[u8]]) -> std::io::Result<()> {
    let mut slices = [IoSlice::new(&[]); 4];
    let mut count = 0;
    for part in parts.iter().filter(|p| !p.is_empty()) {
        slices[count] = IoSlice::new(part);
        count += 1;
    }
    let mut left = &mut slices[..count];
    while !left.is_empty() {
        let n = io.write_vectored(left).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        IoSlice::advance_slices(&mut left, n);
    }
    io.flush().await
}

/// `Date` as HTTP writes it, rendered once a second per thread.
mod date {
    use std::cell::RefCell;
    use std::time::{SystemTime, UNIX_EPOCH};

    thread_local! {
        static RENDERED: RefCell<(u64, [u8; 29])> = const { RefCell::new((u64::MAX, [0; 29])) };
    }

    /// Appends the current date to `to`.
    pub(super) fn render(to: &mut Vec<u8>) {
        let now = SystemTime::now();
        let second = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
        RENDERED.with(|rendered| {
            let mut rendered = rendered.borrow_mut();
            if rendered.0 != second {
                let text = httpdate::fmt_http_date(now);
                if text.len() == 29 {
                    rendered.1.copy_from_slice(text.as_bytes());
                    rendered.0 = second;
                }
            }
            to.extend_from_slice(&rendered.1);
        });
    }
}

/// A connection handed to hyper: the bytes read from it and not yet served, then the
/// connection itself.
pub(super) struct Replay {
    read: Bytes,
    io: Conn,
}

impl Replay {
    /// `io`, read from `read` first.
    pub(super) fn new(read: BytesMut, io: Conn) -> Replay {
        Replay {
            read: read.freeze(),
            io,
        }
    }
}

impl AsyncRead for Replay {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        if this.read.is_empty() {
            return Pin::new(&mut this.io).poll_read(cx, buf);
        }
        let n = this.read.len().min(buf.remaining());
        buf.put_slice(&this.read.split_to(n));
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Replay {
    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(bytes: &[u8]) -> (Parsed, BytesMut) {
        let mut read = BytesMut::from(bytes);
        (parse(&mut read), read)
    }

    #[test]
    fn a_chunk_s_size_line_is_its_length_in_hexadecimal() {
        for len in [0, 1, 15, 16, 255, 4096, 0xabcdef, usize::MAX] {
            assert_eq!(
                chunk_line(len, &mut [0; 18]),
                format!("{len:x}\r\n").as_bytes(),
                "{len}"
            );
        }
    }

    #[test]
    fn a_common_request_is_taken_whole_and_what_follows_it_stays() {
        let (got, rest) = parsed(
            b"POST /v2/models/m/infer?x=1 HTTP/1.1\r\nHost: gw\r\nx-a: 1\r\nX-A: 2\r\nX-Tiergate-Budget-Ms: 250\r\nContent-Length: 5\r\n\r\nhelloGET /",
        );
        let Parsed::Request(request, close) = got else {
            panic!("served here")
        };
        assert!(!close);
        assert_eq!(request.method(), Method::POST);
        assert_eq!(request.uri().path(), "/v2/models/m/infer");
        assert_eq!(request.uri().query(), Some("x=1"));
        assert_eq!(request.version(), Version::HTTP_11);
        let values: Vec<_> = request.headers().get_all("x-a").iter().collect();
        assert_eq!(values, ["1", "2"], "repeated fields kept in order");
        assert_eq!(request.headers()["host"], "gw");
        assert_eq!(
            request.headers()[crate::headers::BUDGET],
            "250",
            "a known name, in any case"
        );
        assert_eq!(request.headers().len(), 5, "every field, content-length too");
        assert_eq!(request.body().size_hint().exact(), Some(5));
        assert_eq!(&rest[..], b"GET /", "the next request's start is kept");
    }

    #[test]
    fn a_request_without_a_body_and_one_asking_to_close() {
        let (got, rest) = parsed(b"GET /v2/health/live HTTP/1.1\r\nconnection: keep-alive, close\r\n\r\n");
        let Parsed::Request(request, close) = got else {
            panic!("served here")
        };
        assert!(close);
        assert_eq!(request.body().size_hint().exact(), Some(0));
        assert!(rest.is_empty());
    }

    #[test]
    fn names_are_matched_by_length_then_bytes() {
        assert!(matches!(named(b"Content-Length"), Named::Length));
        assert!(matches!(named(b"CONNECTION"), Named::Connection));
        for hyper in [&b"Transfer-Encoding"[..], b"expect", b"Upgrade"] {
            assert!(matches!(named(hyper), Named::Hyper), "{hyper:?}");
        }
        for (i, known) in KNOWN.iter().enumerate() {
            let upper = known.as_str().to_ascii_uppercase();
            assert!(
                matches!(named(upper.as_bytes()), Named::Known(k) if usize::from(k) == i),
                "{known}"
            );
        }
        for other in [&b"x-a"[..], b"accepts", b"content-typo", b""] {
            assert!(matches!(named(other), Named::Other), "{other:?}");
        }
    }

    #[test]
    fn half_a_head_waits_for_more() {
        let half = b"POST /v2/models/m/infer HTTP/1.1\r\nhost: g";
        let (got, rest) = parsed(half);
        assert!(matches!(got, Parsed::Partial));
        assert_eq!(&rest[..], half, "nothing taken");
    }

    #[test]
    fn everything_else_is_left_whole_for_hyper() {
        for head in [
            "GET / HTTP/1.0\r\n\r\n",
            "HEAD / HTTP/1.1\r\n\r\n",
            "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
            "POST / HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n",
            "POST / HTTP/1.1\r\nexpect: 100-continue\r\ncontent-length: 2\r\n\r\n",
            "GET / HTTP/1.1\r\nupgrade: h2c\r\nconnection: upgrade\r\n\r\n",
            "GET / HTTP/1.1\r\nconnection: te\r\n\r\n",
            "POST / HTTP/1.1\r\ncontent-length: 2\r\ncontent-length: 3\r\n\r\nabc",
            "POST / HTTP/1.1\r\ncontent-length: +2\r\n\r\nab",
            "POST / HTTP/1.1\r\ncontent-length: 10\r\n\r\nonly half",
            "GET / HTTP/1.1\r\nbad header\r\n\r\n",
            "GET http://[::1 HTTP/1.1\r\n\r\n",
        ] {
            let (got, rest) = parsed(head.as_bytes());
            assert!(matches!(got, Parsed::Other), "{head:?} is hyper's");
            assert_eq!(&rest[..], head.as_bytes(), "{head:?}: every byte left for hyper");
        }
    }

    #[test]
    fn what_is_taken_is_taken_as_httparse_reads_it_and_the_rest_is_left() {
        for bytes in [
            &b"GET / HTTP/1.1\r\n\r\n"[..],
            b"POST /a?b HTTP/1.1\r\nA: 1\r\nContent-Length: 3\r\n\r\nabcGET / HTTP/1.1\r\n",
            b"POST /a HTTP/1.1\r\ncontent-length: 3\r\n\r\nab",
            b"GET / HTTP/1.1\r\nx: \xff\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: a\r\nx: 1\r\nhost: b\r\n\r\n",
            b"\r\nGET / HTTP/1.1\r\n\r\n",
        ] {
            assert!(reads_as_httparse(bytes), "{:?}", String::from_utf8_lossy(bytes));
        }
    }

    #[test]
    fn a_length_is_digits_only() {
        assert_eq!(length_of(b"0"), Some(0));
        assert_eq!(length_of(b"1234"), Some(1234));
        assert_eq!(length_of(b"9999999999999999999"), Some(9_999_999_999_999_999_999));
        for bad in [&b""[..], b"-1", b"1 2", b"0x10", b"99999999999999999999"] {
            assert_eq!(length_of(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn the_date_is_http_s() {
        let mut to = Vec::new();
        date::render(&mut to);
        let text = String::from_utf8(to).expect("text");
        assert!(httpdate::parse_http_date(&text).is_ok(), "{text}");
    }
}
