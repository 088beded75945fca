//! Infer requests: [`decode_request`] turns a client's body into tensors (the
//! micro-batch path, which must concatenate inputs) and [`encode_request`] writes the
//! body of a backend call.

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::binary::{assemble, split};
use super::data::{Leaves, Sink};
use super::wire::{
    bad_param, check_tensors, into_tensor, out_tensors, param_bool, param_u64, parse_json, OutTensor, WireTensor,
};
use super::{Error, Tensor};

/// An output the client asks for, by name.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RequestedOutput {
    /// Output name.
    pub name: String,
    /// `parameters.binary_data`: whether the client wants this output in the binary
    /// section; `None` leaves it to the request's `binary_data_output`.
    pub binary_data: Option<bool>,
    /// The output's other parameters (`binary_data` is kept in the field above only).
    pub parameters: Map<String, Value>,
}

/// A decoded infer request.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct InferRequest {
    /// The client's request id, echoed in the response.
    pub id: Option<String>,
    /// Request parameters as sent (`timeout`, `binary_data_output`, custom ones).
    pub parameters: Map<String, Value>,
    /// Input tensors, at least one, names unique.
    pub inputs: Vec<Tensor>,
    /// Each input's own parameters, by input name, for the inputs that have any
    /// (MLServer reads `content_type` there); `binary_data_size`, which only frames the
    /// data, is not kept.
    pub input_parameters: std::collections::BTreeMap<String, Map<String, Value>>,
    /// Requested outputs; empty means all of the model's outputs.
    pub outputs: Vec<RequestedOutput>,
}

impl InferRequest {
    /// Whether the caller asked for output `name` in the binary section: its own
    /// `binary_data` parameter, else the request's `binary_data_output`, else JSON.
    pub fn wants_binary(&self, name: &str) -> bool {
        self.outputs
            .iter()
            .find(|o| o.name == name)
            .and_then(|o| o.binary_data)
            .or_else(|| self.parameters.get("binary_data_output").and_then(Value::as_bool))
            .unwrap_or(false)
    }
}

/// `body` (an infer request in Triton's binary extension, its JSON header
/// `header_len` bytes long) with every tensor as JSON and no output asked for in
/// binary, for a backend that reads JSON tensors only; `Ok(None)` when a tensor cannot
/// be carried as JSON (FP16, NaN or infinity, BYTES that are not UTF-8).
pub fn as_json_tensors(body: &Bytes, header_len: Option<usize>) -> Result<Option<Bytes>, Error> {
    let mut req = decode_request(body, header_len)?;
    req.parameters.remove("binary_data_output");
    req.outputs.iter_mut().for_each(|o| o.binary_data = None);
    match encode_request(&req, false) {
        (encoded, None) => Ok(Some(encoded)),
        (_, Some(_)) => Ok(None),
    }
}

#[derive(Deserialize)]
#[serde(bound(deserialize = "S: Sink"))]
pub(crate) struct WireRequest<S> {
    #[serde(default)]
    pub id: Option<String>,
    #[serde(default)]
    pub parameters: Option<Map<String, Value>>,
    pub inputs: Vec<WireTensor<S>>,
    #[serde(default)]
    pub outputs: Option<Vec<WireOutput>>,
}

#[derive(Deserialize)]
pub(crate) struct WireOutput {
    pub name: String,
    #[serde(default)]
    pub parameters: Option<Map<String, Value>>,
}

#[derive(Serialize)]
struct OutRequest<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    id: Option<&'a str>,
    #[serde(skip_serializing_if = "Map::is_empty")]
    parameters: &'a Map<String, Value>,
    inputs: Vec<OutTensor<'a>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    outputs: Vec<OutOutput<'a>>,
}

#[derive(Serialize)]
struct OutOutput<'a> {
    name: &'a str,
    #[serde(skip_serializing_if = "Map::is_empty")]
    parameters: Map<String, Value>,
}

/// Decodes an infer request body; `header_len` is the `inference-header-content-length`
/// header (see [`header_len`](super::header_len)), `None` for a JSON-only body.
/// Binary tensors share `body`'s buffer (no copy).
pub fn decode_request(body: &Bytes, header_len: Option<usize>) -> Result<InferRequest, Error> {
    let (json, start) = split(body, header_len)?;
    let wire: WireRequest<Leaves> = parse_json("request", json)?;
    let parameters = wire.parameters.unwrap_or_default();
    request_params(&parameters)?;
    if wire.inputs.is_empty() {
        return Err(Error::NoInputs);
    }
    let section = body.slice(start..);
    let input_parameters = super::wire::own_parameters(&wire.inputs, &["binary_data_size"]);
    let inputs = check_tensors("inputs", wire.inputs, &section)?;
    let outputs = wire.outputs.unwrap_or_default().into_iter().enumerate();
    Ok(InferRequest {
        id: wire.id,
        parameters,
        inputs: inputs.into_iter().map(|c| into_tensor(c, &section)).collect(),
        input_parameters,
        outputs: outputs.map(requested_output).collect::<Result<_, _>>()?,
    })
}

/// A step of a Triton sequence: the request parameters that tie it to a stateful model's
/// correlation id (`sequence_id`, with `sequence_start` and `sequence_end`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Sequence {
    /// The correlation id, as sent (a number or a string), in canonical text.
    pub id: String,
    /// `sequence_start`: the first step.
    pub start: bool,
    /// `sequence_end`: the last step, after which the id is free again.
    pub end: bool,
}

/// The sequence `params` make the request a step of, if any (a `sequence_id` of 0 or ""
/// is none, as Triton reads it).
pub fn sequence(params: &Map<String, Value>) -> Result<Option<Sequence>, Error> {
    let id = match params.get("sequence_id") {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Number(n)) => match n.as_u64() {
            Some(0) => return Ok(None),
            Some(n) => n.to_string(),
            None => {
                return Err(bad_param(
                    "",
                    "sequence_id",
                    "a non-negative integer or a string",
                    &Value::Number(n.clone()),
                ))
            }
        },
        Some(Value::String(s)) if s.is_empty() => return Ok(None),
        Some(Value::String(s)) => format!("{s:?}"),
        Some(other) => {
            return Err(bad_param(
                "",
                "sequence_id",
                "a non-negative integer or a string",
                other,
            ))
        }
    };
    Ok(Some(Sequence {
        id,
        start: param_bool(Some(params), "", "sequence_start")?.unwrap_or(false),
        end: param_bool(Some(params), "", "sequence_end")?.unwrap_or(false),
    }))
}

/// Checks the request parameters the protocol defines; returns `timeout` (µs).
pub(crate) fn request_params(params: &Map<String, Value>) -> Result<Option<u64>, Error> {
    param_bool(Some(params), "", "binary_data_output")?;
    param_u64(Some(params), "", "timeout", "a non-negative integer (microseconds)")
}

fn requested_output((i, wire): (usize, WireOutput)) -> Result<RequestedOutput, Error> {
    let mut parameters = wire.parameters.unwrap_or_default();
    let owner = format!("outputs[{i}]");
    super::wire::no_shared_memory(&owner, |name| parameters.contains_key(name))?;
    let binary_data = param_bool(Some(&parameters), &owner, "binary_data")?;
    parameters.remove("binary_data");
    Ok(RequestedOutput {
        name: wire.name,
        binary_data,
        parameters,
    })
}

/// Encodes an infer request for a backend: every input binary when `binary_inputs`,
/// else JSON except inputs JSON cannot carry exactly (FP16, NaN, non-UTF-8 BYTES).
/// Returns the body and, when it has a binary section, the JSON header length for
/// `inference-header-content-length`.
pub fn encode_request(req: &InferRequest, binary_inputs: bool) -> (Bytes, Option<usize>) {
    let (mut inputs, parts) = out_tensors(&req.inputs, &|_| binary_inputs);
    super::wire::add_own_parameters(&mut inputs, &req.input_parameters);
    let outputs = req.outputs.iter().map(|o| {
        let mut parameters = o.parameters.clone();
        if let Some(b) = o.binary_data {
            parameters.insert("binary_data".into(), b.into());
        }
        OutOutput {
            name: &o.name,
            parameters,
        }
    });
    let header = OutRequest {
        id: req.id.as_deref(),
        parameters: &req.parameters,
        inputs,
        outputs: outputs.collect(),
    };
    let json = serde_json::to_vec(&header).expect("a request header always serializes: string keys only");
    assemble(json, &parts)
}
