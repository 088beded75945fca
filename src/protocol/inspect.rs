//! The real-time path's look at an infer request: every structural check of
//! [`decode_request`](super::decode_request), without building tensors.

use super::binary::split;
use super::data::Summary;
use super::request::{request_params, WireRequest};
use super::wire::{check_tensors, parse_json};
use super::Error;

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

/// Validates an infer request as [`decode_request`](super::decode_request) does (it
/// accepts exactly the same bodies) but keeps only a summary of each tensor's data:
/// JSON elements are counted and range-checked as they stream past, with no allocation
/// per element, and binary data is only measured (BYTES prefixes walked in place).
pub fn inspect_request(body: &[u8], header_len: Option<usize>) -> Result<RequestInfo, Error> {
    let (json, start) = split(body, header_len)?;
    let wire: WireRequest<Summary> = parse_json("request", json)?;
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
        let owner = format!("outputs[{i}]");
        super::wire::param_bool(out.parameters.as_ref(), &owner, "binary_data")?;
        if let Some(params) = &out.parameters {
            super::wire::no_shared_memory(&owner, |name| params.contains_key(name))?;
        }
    }
    Ok(RequestInfo {
        id: wire.id,
        timeout_us,
        rows: first.filter(|_| agree),
        sequence,
    })
}
