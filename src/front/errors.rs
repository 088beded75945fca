//! The HTTP door's own error answers: KServe v2's `{"error": "..."}`, or OpenAI's
//! error object under `/v1/`, with the status (and `Retry-After`, the rate-limit
//! fields) from the error table ([`crate::error`]).

use bytes::Bytes;
use http::{HeaderValue, Response};

use super::body::Answered;
use crate::error::{Error, Kind};
use crate::protocol;

/// How an error answer is written: KServe v2's `{"error": "..."}`, or, under `/v1/`
/// (the Batch API, OpenAI-style embeddings; not TF-Serving's `/v1/models/`), OpenAI's
/// `{"error": {"message", "type", "param", "code"}}`, which its SDKs read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// KServe v2 (and TF-Serving).
    Kserve,
    /// OpenAI.
    Openai,
}

impl Shape {
    /// The shape of errors on `path`.
    pub fn of(path: &str) -> Shape {
        match path.starts_with("/v1/") && !path.starts_with("/v1/models/") {
            true => Shape::Openai,
            false => Shape::Kserve,
        }
    }
}

/// OpenAI's error object for `e`: its message, a type as OpenAI's SDKs know them, and
/// the gateway's outcome as the code.
fn openai_error_body(e: &Error) -> Bytes {
    let status = e.kind.status();
    let kind = match status.as_u16() {
        401 => "authentication_error",
        429 => "rate_limit_error",
        s if s >= 500 => "server_error",
        _ => "invalid_request_error",
    };
    let body = serde_json::json!({"error": {
        "message": e.message,
        "type": kind,
        "param": null,
        "code": e.kind.outcome(),
    }});
    Bytes::from(body.to_string())
}

/// The protocol's error shape with the status (and `Retry-After`) from the error table.
pub fn failure(e: &Error) -> Response<Answered> {
    failure_as(e, Shape::Kserve)
}

/// [`failure`], its body in `shape`.
pub fn failure_as(e: &Error, shape: Shape) -> Response<Answered> {
    let body = match shape {
        Shape::Kserve => protocol::error_body(&e.message),
        Shape::Openai => openai_error_body(e),
    };
    let mut response = Response::new(Answered::from(body));
    *response.status_mut() = e.kind.status();
    let headers = response.headers_mut();
    headers.insert(http::header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    if e.kind == Kind::Unauthenticated {
        headers.insert(http::header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    }
    if let Some(after) = e.retry() {
        let secs = after.as_secs() + u64::from(after.subsec_nanos() > 0);
        headers.insert(http::header::RETRY_AFTER, HeaderValue::from(secs.max(1)));
        if let Some(q) = e.quota {
            // draft-ietf-httpapi-ratelimit-headers, in the widely implemented three-header form.
            headers.insert("ratelimit-limit", HeaderValue::from(q.limit));
            headers.insert("ratelimit-remaining", HeaderValue::from(0));
            headers.insert("ratelimit-reset", HeaderValue::from(secs.max(1)));
            if let Ok(policy) = HeaderValue::from_str(&format!("{};w={}", q.limit, q.window_secs)) {
                headers.insert("ratelimit-policy", policy);
            }
        }
    }
    response
}
