//! The KServe v2 form of the micro-batch tier: a caller's infer request decoded into
//! tensors, many callers' tensors concatenated into one backend request, and the
//! backend's answer split back into one KServe v2 answer per caller, each with its own
//! id and its own choice of JSON or binary outputs.

use bytes::Bytes;
use http::Request;

use std::sync::Arc;

use super::combined::{self, Asked};
use super::Unbatched;
use crate::error::{Error, Kind};
use crate::policy::Member;
use crate::protocol::batch::{self, BatchError, Signature};
use crate::protocol::grpc::bridge;
use crate::protocol::Reply;
use crate::protocol::{self, InferRequest, InferResponse, RequestedOutput};

/// A caller's request, decoded, with its signature and rows (and, for a caller of a
/// `member` model, what it asked of the combined model's answer, its requested outputs
/// taken out of the request); or why it cannot share a batch.
pub(super) fn parse(
    request: &Request<Bytes>,
    member: Option<(&str, &Arc<Member>)>,
) -> Result<Result<Parsed, Unbatched>, Error> {
    let bad = |e: protocol::Error| Error::new(Kind::BadRequest, e.to_string());
    let header_len = protocol::header_len(request.headers()).map_err(bad)?;
    let mut decoded = protocol::decode_request(request.body(), header_len).map_err(bad)?;
    let asked = match member {
        None => None,
        Some((model, member)) => match combined::ask(model, member, &mut decoded)? {
            Ok(asked) => Some(asked),
            Err(unbatched) => return Ok(Err(unbatched)),
        },
    };
    Ok(match batch::signature(&decoded) {
        Ok((signature, rows)) => Ok((signature, decoded, rows, asked)),
        Err(why) => Err(Unbatched(why.to_string())),
    })
}

/// A decoded request: its signature, itself, its rows, and what its caller asked of a
/// combined model's answer.
pub(super) type Parsed = (Signature, InferRequest, u64, Option<Asked>);

/// One backend request carrying every caller's rows, on `path`; outputs come back in
/// binary when the pool's backends read the binary extension, and its `timeout`
/// parameter (microseconds, as Triton reads it) is `left`, the time the batch's callers
/// have left, so a backend drops work that can no longer be useful. A batch for a
/// combined model asks for `outputs` (none: the first caller's choice). A caller whose
/// tensors do not match their shapes is named by its index so it alone can be refused.
pub(super) fn build(
    path: &str,
    reqs: &[&InferRequest],
    (binary, left): (bool, std::time::Duration),
    outputs: Vec<RequestedOutput>,
) -> Result<Request<Bytes>, (Option<usize>, Error)> {
    let mut merged = batch::concat(reqs).map_err(|e| match e {
        BatchError::BadInput { index, .. } => (Some(index), Error::new(Kind::BadRequest, e.to_string())),
        other => (None, Error::new(Kind::BadRequest, other.to_string())),
    })?;
    if !outputs.is_empty() {
        merged.outputs = outputs;
    }
    let micros = u64::try_from(left.as_micros()).unwrap_or(u64::MAX).max(1);
    merged
        .parameters
        .insert("timeout".into(), serde_json::Value::from(micros));
    if binary {
        bridge::ask_binary_outputs(&mut merged); // concat() left every output's choice unset
    }
    let (body, header_len) = protocol::encode_request(&merged, binary);
    let mut request = Request::new(body);
    *request.method_mut() = http::Method::POST;
    *request.uri_mut() = path.parse().map_err(|_| {
        (
            None,
            Error::new(Kind::BadRequest, format!("{path} is not a valid path")),
        )
    })?;
    protocol::set_framing(request.headers_mut(), header_len);
    Ok(request)
}

/// The backend's answer to a batch, decoded and cut by `rows` (decoded answers, each
/// with the batch's id).
pub(super) fn split(reply: &Reply, rows: &[u64]) -> Result<Vec<InferResponse>, Error> {
    let broke = |why: String| Error::new(Kind::Backend, format!("the batch's backend broke the protocol: {why}"));
    let header_len = protocol::header_len(reply.headers()).map_err(|e| broke(e.to_string()))?;
    let decoded = protocol::decode_response(reply.body(), header_len).map_err(|e| broke(e.to_string()))?;
    batch::split(&decoded, rows).map_err(|e| Error::new(Kind::Backend, e.to_string()))
}

/// The backend's answer to a batch, cut into one answer per caller by `rows`; a
/// caller of a combined model's member gets its model's outputs only (`asked`, one per
/// caller), or an error of its own when the combined model left one out.
pub(super) fn scatter(
    reply: &Reply,
    reqs: &[&InferRequest],
    asked: &[Option<&Asked>],
    rows: &[u64],
) -> Result<Vec<Result<Reply, Error>>, Error> {
    Ok(split(reply, rows)?
        .into_iter()
        .zip(reqs)
        .zip(asked)
        .map(|((mut answer, req), asked)| {
            // The caller's own id; one that sent none gets the id the backend gave the
            // batch, as a direct call would get one the backend made.
            if req.id.is_some() {
                answer.id.clone_from(&req.id);
            }
            Ok(match asked {
                Some(asked) => respond(asked.view(answer)?, req, Some(asked)),
                None => respond(answer, req, None),
            })
        })
        .collect())
}

/// A caller's answer in its own form: JSON or binary outputs as `req` asked (a
/// combined model's member's caller: of its member's outputs, those it named, in its
/// order, as `asked` says).
pub(super) fn respond(answer: InferResponse, req: &InferRequest, asked: Option<&Asked>) -> Reply {
    match asked {
        Some(asked) => bridge::infer_response_to_http(&asked.pick(answer), &|t| asked.wants_binary(&t.name)),
        None => bridge::infer_response_to_http(&answer, &|t| req.wants_binary(&t.name)),
    }
}
