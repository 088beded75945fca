//! Who a request is: its request id and W3C trace context, and the spans it runs in.
//!
//! Beside the request path. Each door reads the ids with [`Ids::read`] before anything
//! else and runs the request inside [`Ids::span`] (exported, not logged: see
//! [`crate::telemetry::logged`]); the request's `served` line (debug level) carries its
//! `request_id` and `trace_id`. The ids travel to the tiers in the request's
//! extensions; a backend call sends `traceparent` (the client's trace, with the
//! gateway's backend span as parent) and `x-request-id`. The client gets `x-request-id`
//! and `traceresponse` (W3C Trace Context level 2) back.
//!
//! Without a `traceparent` from the client, the gateway starts a trace. When OTLP
//! export is on ([`crate::telemetry`]), the spans are exported and their ids are the
//! exporter's; when it is off, the ids are drawn here and no span leaves the process.

use std::fmt;

use http::{HeaderMap, HeaderValue};
use tracing::Span;

/// The W3C trace context header.
pub const TRACEPARENT: http::HeaderName = http::HeaderName::from_static("traceparent");
/// The W3C trace context response header (level 2): the trace and the gateway's span.
pub const TRACERESPONSE: http::HeaderName = http::HeaderName::from_static("traceresponse");
/// The request id header, taken from the client or made here.
pub const REQUEST_ID: http::HeaderName = http::HeaderName::from_static("x-request-id");

/// Longest request id taken from a client; a longer (or non-printable) one is replaced.
const MAX_REQUEST_ID: usize = 128;

/// A W3C `traceparent`: version 00, trace id, parent span id and the sampled flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceParent {
    /// The trace, never zero.
    pub trace_id: u128,
    /// The span the next hop's span is a child of, never zero.
    pub span_id: u64,
    /// Whether the caller records this trace.
    pub sampled: bool,
}

impl TraceParent {
    /// Parses a `traceparent` value; `None` for anything the W3C spec says to ignore
    /// (wrong lengths, non-lowercase-hex, version ff, all-zero ids). Later versions are
    /// read by their first four fields, as the spec asks.
    pub fn parse(value: &str) -> Option<TraceParent> {
        let mut fields = value.trim().splitn(5, '-');
        let (version, trace, span, flags) = (fields.next()?, fields.next()?, fields.next()?, fields.next()?);
        let rest = fields.next();
        let hex =
            |s: &str, len: usize| s.len() == len && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        if !hex(version, 2) || version == "ff" || (version == "00" && rest.is_some()) {
            return None;
        }
        if !hex(trace, 32) || !hex(span, 16) || !hex(flags, 2) {
            return None;
        }
        let trace_id = u128::from_str_radix(trace, 16).ok().filter(|t| *t != 0)?;
        let span_id = u64::from_str_radix(span, 16).ok().filter(|s| *s != 0)?;
        let flags = u8::from_str_radix(flags, 16).ok()?;
        Some(TraceParent {
            trace_id,
            span_id,
            sampled: flags & 1 == 1,
        })
    }

    /// The header value.
    pub fn header(&self) -> HeaderValue {
        HeaderValue::from_bytes(&self.bytes()).expect("hex digits and dashes are a valid header value")
    }

    /// The header's value as bytes, written on the stack.
    pub fn bytes(&self) -> [u8; 55] {
        let mut value = [b'-'; 55];
        value[..2].copy_from_slice(b"00");
        value[3..35].copy_from_slice(&hex::<32>(self.trace_id));
        value[36..52].copy_from_slice(&hex::<16>(u128::from(self.span_id)));
        value[53..].copy_from_slice(&hex::<2>(u128::from(self.sampled)));
        value
    }
}

impl fmt::Display for TraceParent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "00-{:032x}-{:016x}-{:02x}",
            self.trace_id,
            self.span_id,
            u8::from(self.sampled)
        )
    }
}

/// A request's identity, made by its door and carried in its extensions.
#[derive(Debug, Clone)]
pub struct Ids {
    /// The client's `x-request-id` when it sent a usable one, else one made here.
    pub request_id: HeaderValue,
    /// The trace the request belongs to.
    pub trace_id: u128,
    /// The client's span, when it sent a `traceparent`.
    pub parent: Option<u64>,
    /// The gateway's span for the request.
    pub span_id: u64,
    /// Whether the trace is recorded (the client's flag, or sampled when the gateway starts it).
    pub sampled: bool,
}

impl Ids {
    /// Reads the ids from a request's headers, making up what is missing.
    pub fn read(headers: &HeaderMap) -> Ids {
        Ids::of(headers.get(TRACEPARENT), headers.get(REQUEST_ID))
    }

    /// [`Ids::read`] from the values of `traceparent` and `x-request-id`, when sent.
    pub fn of(traceparent: Option<&HeaderValue>, request_id: Option<&HeaderValue>) -> Ids {
        let parent = traceparent.and_then(|v| v.to_str().ok()).and_then(TraceParent::parse);
        Ids {
            request_id: request_id_of(request_id),
            trace_id: parent.map_or_else(new_trace_id, |p| p.trace_id),
            parent: parent.map(|p| p.span_id),
            span_id: new_span_id(),
            sampled: parent.is_none_or(|p| p.sampled),
        }
    }

    /// The request's span (`door` → ... → `backend` spans nest inside it), its
    /// `route`, `tier` and `reason` recorded as they are known. With OTLP export on,
    /// the span's parent is the client's span and the ids are taken from the exporter.
    pub fn span(&mut self, door: crate::decision::Door) -> Span {
        let span = tracing::info_span!(
            "request",
            door = door.as_str(),
            request_id = self.request_id.to_str().unwrap_or_default(),
            trace_id = tracing::field::Empty,
            route = tracing::field::Empty,
            tier = tracing::field::Empty,
            reason = tracing::field::Empty,
        );
        if let Some((trace_id, span_id)) = crate::telemetry::adopt(&span, self.trace_id, self.parent, self.sampled) {
            self.trace_id = trace_id;
            self.span_id = span_id;
        }
        if !span.is_disabled() {
            let trace_id = hex::<32>(self.trace_id);
            span.record("trace_id", std::str::from_utf8(&trace_id).unwrap_or_default());
        }
        span
    }

    /// The `traceparent` for a call made inside `span` (a backend call): this trace,
    /// with the span's id as the parent when exported, else a new id for the call.
    pub fn outgoing(&self, span: &Span) -> TraceParent {
        TraceParent {
            trace_id: self.trace_id,
            span_id: crate::telemetry::span_id(span).unwrap_or_else(new_span_id),
            sampled: self.sampled,
        }
    }

    /// Sets `traceparent` (for a call made inside `span`) and `x-request-id` on a
    /// backend request's headers.
    pub fn to_backend(&self, span: &Span, headers: &mut HeaderMap) {
        headers.insert(TRACEPARENT, self.outgoing(span).header());
        headers.insert(REQUEST_ID, self.request_id.clone());
    }

    /// The trace and the gateway's span, as told to the client in `traceresponse`.
    pub fn answer(&self) -> TraceParent {
        TraceParent {
            trace_id: self.trace_id,
            span_id: self.span_id,
            sampled: self.sampled,
        }
    }

    /// The `traceresponse` for a client that sent a `traceparent` (one that did not is
    /// not following a trace: it has the request id, and the rendering is spared).
    pub fn traceresponse(&self) -> Option<TraceParent> {
        self.parent.map(|_| self.answer())
    }

    /// Sets `x-request-id` and, for a client that sent a `traceparent`, `traceresponse`
    /// on the answer to the client.
    pub fn to_client(&self, headers: &mut HeaderMap) {
        headers.insert(REQUEST_ID, self.request_id.clone());
        if let Some(answer) = self.traceresponse() {
            headers.insert(TRACERESPONSE, answer.header());
        }
    }
}

/// A request's id: the client's `x-request-id` when it sent a usable one (1 to 128
/// visible ASCII characters), else a new random one.
pub fn request_id(headers: &HeaderMap) -> HeaderValue {
    request_id_of(headers.get(REQUEST_ID))
}

/// [`request_id`] from the value of `x-request-id`, when sent.
pub fn request_id_of(sent: Option<&HeaderValue>) -> HeaderValue {
    sent.filter(|v| !v.is_empty() && v.len() <= MAX_REQUEST_ID && v.as_bytes().iter().all(u8::is_ascii_graphic))
        .cloned()
        .unwrap_or_else(|| {
            HeaderValue::from_bytes(&hex::<32>(rand::random::<u128>())).expect("hex is a valid header value")
        })
}

/// The low `N / 2` bytes of `value` as `N` lowercase hex digits (ids are written on
/// every request; this is several times quicker than `format!`).
pub fn hex<const N: usize>(value: u128) -> [u8; N] {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    const { assert!(N % 2 == 0 && N <= 32, "whole bytes of a u128") };
    let bytes = value.to_be_bytes();
    let mut out = [0; N];
    for (pair, byte) in out.chunks_exact_mut(2).zip(&bytes[16 - N / 2..]) {
        pair[0] = DIGITS[usize::from(byte >> 4)];
        pair[1] = DIGITS[usize::from(byte & 0xf)];
    }
    out
}

fn new_trace_id() -> u128 {
    rand::random::<u128>().max(1)
}

fn new_span_id() -> u64 {
    rand::random::<u64>().max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traceparent_round_trips() {
        let v = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let p = TraceParent::parse(v).expect("the spec's example parses");
        assert_eq!(p.trace_id, 0x4bf92f3577b34da6a3ce929d0e0e4736);
        assert_eq!(p.span_id, 0x00f067aa0ba902b7);
        assert!(p.sampled);
        assert_eq!(p.to_string(), v);
    }

    #[test]
    fn header_values_are_the_display_form() {
        for (trace_id, span_id, sampled) in [(1, 1, false), (u128::MAX, u64::MAX, true), (0x4bf9 << 64, 0xf067, true)] {
            let p = TraceParent {
                trace_id,
                span_id,
                sampled,
            };
            assert_eq!(p.header().to_str().expect("ascii"), p.to_string());
        }
        assert_eq!(&hex::<32>(0xab), b"000000000000000000000000000000ab");
    }

    #[test]
    fn invalid_traceparents_are_ignored() {
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0x",
        ] {
            assert_eq!(TraceParent::parse(bad), None, "{bad:?}");
        }
        // A later version is read by its first four fields.
        assert!(TraceParent::parse("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00-more").is_some());
    }

    #[test]
    fn ids_keep_the_clients_trace_and_request_id() {
        let mut headers = HeaderMap::new();
        headers.insert(
            TRACEPARENT,
            HeaderValue::from_static("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"),
        );
        headers.insert(REQUEST_ID, HeaderValue::from_static("req-1"));
        let ids = Ids::read(&headers);
        assert_eq!(ids.trace_id, 0x4bf92f3577b34da6a3ce929d0e0e4736);
        assert_eq!(ids.parent, Some(0x00f067aa0ba902b7));
        assert!(!ids.sampled, "the client's sampled flag is kept");
        assert_eq!(ids.request_id, "req-1");
        let out = ids.outgoing(&Span::none());
        assert_eq!(out.trace_id, ids.trace_id);
        assert_ne!(
            out.span_id, 0x00f067aa0ba902b7,
            "the backend's parent is the gateway, not the client"
        );
    }

    #[test]
    fn missing_or_unusable_ids_are_made() {
        let mut headers = HeaderMap::new();
        headers.insert(REQUEST_ID, HeaderValue::from_str(&"x".repeat(200)).expect("ascii"));
        let a = Ids::read(&headers);
        let b = Ids::read(&HeaderMap::new());
        assert_eq!(a.request_id.len(), 32, "an overlong request id is replaced");
        assert_ne!(a.request_id, b.request_id);
        assert_ne!(a.trace_id, b.trace_id);
        assert!(a.parent.is_none() && a.sampled);
    }
}
