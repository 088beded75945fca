//! The real-time path's look at an infer request: every structural check of
//! [`decode_request`](super::decode_request), without building tensors.

use super::binary::split;
use super::data::{Counted, Sink, Summary};
use super::request::{request_params, WireRequest};
use super::wire::{check_tensors, parse_json};
use super::Error;

/// How much of an infer request the real-time path checks before passing it through
/// (a route's `body_check`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BodyCheck {
    /// Everything [`decode_request`](super::decode_request) checks: the envelope, and
    /// every JSON `data` value against its datatype (a string in an FP32 tensor, an
    /// integer out of INT8's range).
    Full,
    /// The envelope: names, datatypes, shapes, parameters, sizes (each JSON `data`
    /// array's element count against its shape, each binary tensor's bytes), the JSON
    /// structure; the `data` values are left to the backend, which checks them anyway.
    #[default]
    Envelope,
}

impl BodyCheck {
    /// The name used in the policy (`full`, `envelope`).
    pub fn as_str(self) -> &'static str {
        match self {
            BodyCheck::Full => "full",
            BodyCheck::Envelope => "envelope",
        }
    }
}

/// What the gateway needs to know about a request it forwards unchanged.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RequestInfo {
    /// The client's request id.
    pub id: Option<String>,
    /// `parameters.timeout` in microseconds.
    pub timeout_us: Option<u64>,
    /// The first dimension of the inputs, when every input has one and they agree.
    pub rows: Option<u64>,
    /// The Triton sequence it is a step of, if any.
    pub sequence: Option<super::Sequence>,
}

/// Validates an infer request as [`decode_request`](super::decode_request) does, as far
/// as `check` says: with [`BodyCheck::Full`] it accepts exactly the same bodies, keeping only
/// a summary of each tensor's data (JSON elements counted and range-checked as they
/// stream past, with no allocation per element); with [`BodyCheck::Envelope`] JSON elements
/// are counted and never read. Binary data is only measured (BYTES prefixes walked in
/// place).
pub fn inspect_request(body: &[u8], header_len: Option<usize>, check: BodyCheck) -> Result<RequestInfo, Error> {
    match check {
        BodyCheck::Full => inspect::<Summary>(body, header_len, |_| None),
        BodyCheck::Envelope => inspect::<Counted>(body, header_len, super::plain::request),
    }
}

/// [`inspect_request`], each JSON `data` array read into an `S`; the JSON header read
/// by `plain` when it can, else by serde.
fn inspect<S: Sink>(
    body: &[u8],
    header_len: Option<usize>,
    plain: fn(&[u8]) -> Option<WireRequest<S>>,
) -> Result<RequestInfo, Error> {
    let (json, start) = split(body, header_len)?;
    let wire: WireRequest<S> = match plain(json) {
        Some(wire) => wire,
        None => parse_json("request", json)?,
    };
    let (timeout_us, sequence) = match &wire.parameters {
        None => (None, None),
        Some(params) => (request_params(params)?, super::sequence(params)?),
    };
    if wire.inputs.is_empty() {
        return Err(Error::NoInputs);
    }
    let section = body.get(start..).unwrap_or_default();
    let inputs = check_tensors("inputs", wire.inputs, section)?;
    let first = inputs.first().and_then(|c| c.shape.first().copied());
    let agree = inputs.iter().all(|c| c.shape.first().copied() == first);
    let outputs = wire.outputs.unwrap_or_default();
    for (i, out) in outputs.iter().enumerate() {
        let owner = super::wire::At::new("outputs", i);
        super::wire::param_bool(out.parameters.as_ref(), owner.as_str(), "binary_data")?;
        if let Some(params) = &out.parameters {
            super::wire::no_shared_memory(owner.as_str(), |name| params.contains_key(name))?;
        }
    }
    Ok(RequestInfo {
        id: wire.id,
        timeout_us,
        rows: first.filter(|_| agree),
        sequence,
    })
}

/// A cheap look at a backend's successful answer to a call the gateway passes through
/// (`kserve`: a KServe v2 infer answer; else a JSON route's), so an endpoint answering
/// 200 with something else (an HTML error page, a truncated body) is caught and counted
/// against it: a declared binary header within the body, a JSON content type when one
/// is named, and a body whose JSON part opens and closes as an object (a JSON route's
/// may be an array). Parsing is left to the client; this reads a few bytes.
pub fn answer_envelope(headers: &http::HeaderMap, body: &[u8], kserve: bool) -> Result<(), &'static str> {
    // The common answer, a JSON object, passes on its first and last bytes alone: no
    // header is looked at (a binary answer's body ends in its tensors, not '}').
    let whole = body.trim_ascii();
    if whole.first() == Some(&b'{') && whole.last() == Some(&b'}') {
        return Ok(());
    }
    let json = match super::header_len(headers) {
        Err(_) => return Err("its inference-header-content-length is not a number"),
        Ok(Some(n)) if kserve => body
            .get(..n)
            .ok_or("its inference-header-content-length is longer than the body")?,
        Ok(_) => {
            let typed = headers.get(http::header::CONTENT_TYPE).map(|v| v.as_bytes());
            if typed.is_some_and(|t| t.starts_with(b"text/event-stream")) && !kserve {
                return Ok(()); // a stream, read whole: an answer, not garbage
            }
            if typed.is_some_and(|t| !t.windows(4).any(|w| w.eq_ignore_ascii_case(b"json"))) {
                return Err("its content type is not JSON");
            }
            body
        }
    };
    let trimmed = json.trim_ascii();
    match (trimmed.first(), trimmed.last()) {
        (Some(b'{'), Some(b'}')) => Ok(()),
        (Some(b'['), Some(b']')) if !kserve => Ok(()),
        (None, _) => Err("its body is empty"),
        _ => Err("its body is not a JSON object"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> http::HeaderMap {
        pairs
            .iter()
            .map(|(k, v)| (http::HeaderName::from_static(k), http::HeaderValue::from_static(v)))
            .collect()
    }

    #[test]
    fn whole_answers_pass_and_others_say_what_is_wrong() {
        let json = headers(&[("content-type", "application/json")]);
        let binary = headers(&[
            ("content-type", "application/octet-stream"),
            ("inference-header-content-length", "4"),
        ]);
        assert_eq!(answer_envelope(&json, b" {\"outputs\":[]}\n", true), Ok(()));
        assert_eq!(answer_envelope(&binary, b"{  }\x01\x02", true), Ok(()));
        assert_eq!(
            answer_envelope(&headers(&[]), b"{}", true),
            Ok(()),
            "no content type is fine"
        );
        assert_eq!(
            answer_envelope(&json, b"[1]", false),
            Ok(()),
            "a JSON route may answer an array"
        );
        let events = headers(&[("content-type", "text/event-stream")]);
        assert_eq!(
            answer_envelope(&events, b"data: {}\n\n", false),
            Ok(()),
            "a JSON route's stream"
        );
        let html = headers(&[("content-type", "text/html")]);
        assert_eq!(
            answer_envelope(&html, b"<html>oops</html>", true),
            Err("its content type is not JSON")
        );
        assert_eq!(
            answer_envelope(&html, b"{\"outputs\":[]}", true),
            Ok(()),
            "an object is an answer"
        );
        assert_eq!(
            answer_envelope(&json, b"{\"outputs\":[", true),
            Err("its body is not a JSON object")
        );
        assert_eq!(answer_envelope(&json, b"", true), Err("its body is empty"));
        assert_eq!(
            answer_envelope(&json, b"[1]", true),
            Err("its body is not a JSON object")
        );
        // A binary answer (its body ends in tensor bytes) is held to its header length.
        let short = headers(&[("inference-header-content-length", "99")]);
        assert!(answer_envelope(&short, b"{}\x01\x02", true).is_err());
        let bad = headers(&[("inference-header-content-length", "x")]);
        assert!(answer_envelope(&bad, b"{}\x01", true).is_err());
    }
}
