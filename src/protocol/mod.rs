//! KServe v2 / Open Inference Protocol wire formats over HTTP: JSON tensors and
//! Triton's binary tensor extension. Doors call [`inspect_request`] (real-time path,
//! body forwarded as is) or [`decode_request`] (micro-batch path, tensors concatenated);
//! backend clients call [`encode_request`] and [`decode_response`]; doors answer with
//! [`encode_response`] or [`error_body`]. A leaf module: it knows nothing of servers,
//! and treats every body as untrusted (no panics, no allocation sized by a declared
//! length before it is checked against the body, bounded nesting).
//!
//! # Layout
//!
//! `datatype` (element types) · `tensor` ([`Tensor`], raw ↔ JSON rendering) ·
//! `data` (JSON `data` arrays parsed in one pass) · `wire` (shared JSON shapes and
//! checks) · `binary` (the binary extension's framing) · `request` · `response` ·
//! `inspect` · `plain` (the common request read without serde) · `error` · [`grpc`] (the protobuf messages and their conversions) ·
//! [`batch`] (batch signatures, concatenation along dimension 0 and the split back) ·
//! [`rows`] (one request cut into its rows, rows' answers joined back) · [`scan`] (how
//! deep JSON text nests, and whether it holds integers beyond 64 bits).

pub mod batch;
mod binary;
mod data;
mod datatype;
mod error;
pub mod grpc;
mod inspect;
mod plain;
mod request;
mod response;
pub mod rows;
pub mod scan;
mod tensor;
mod wire;

#[cfg(test)]
mod proptests;
#[cfg(test)]
mod tests;

pub use binary::{header_len, header_len_of};
pub use datatype::{Datatype, ParseDatatypeError};
pub use error::Error;
pub use inspect::{answer_envelope, inspect_request, BodyCheck, RequestInfo};
#[doc(hidden)]
pub use plain::agrees_with_serde;
pub use request::{as_json_tensors, decode_request, encode_request, sequence, InferRequest, RequestedOutput, Sequence};
pub use response::{decode_response, encode_response, InferResponse};
pub use tensor::Tensor;

/// An answer as the doors, the cache and the tiers pass it: an HTTP response with its
/// whole body (a gRPC door renders it as a message).
pub type Reply = http::Response<bytes::Bytes>;
pub(crate) use tensor::{fmt_shape, le};
pub(crate) use wire::decimal;

/// The path suffix of a request to a decoupled model (0..N responses), in the HTTP
/// form the tiers pass: `/v2/models/{m}[/versions/{v}]/infer_stream`. The gRPC door
/// makes it of a `ModelStreamInfer` request on a route whose endpoints speak gRPC, and
/// a gRPC endpoint serves it with `ModelStreamInfer`, its responses a stream of events.
pub const INFER_STREAM: &str = "/infer_stream";

/// Header carrying the JSON header length of a binary-extension body.
pub const HEADER_LEN: http::HeaderName = http::HeaderName::from_static("inference-header-content-length");

/// Sets the headers that frame an encoded body: `application/octet-stream` plus
/// `inference-header-content-length` for the binary extension (`header_len` set), else
/// `application/json`.
pub fn set_framing(headers: &mut http::HeaderMap, header_len: Option<usize>) {
    use http::header::{HeaderValue, CONTENT_TYPE};
    match header_len {
        Some(len) => {
            headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/octet-stream"));
            headers.insert(HEADER_LEN, HeaderValue::from(len));
        }
        None => {
            headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        }
    }
}

/// The protocol's error body: `{"error": "..."}`.
pub fn error_body(message: &str) -> bytes::Bytes {
    serde_json::json!({ "error": message }).to_string().into()
}
