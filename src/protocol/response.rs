//! Infer responses: [`decode_response`] reads a backend's answer (to split a batch
//! back to its callers) and [`encode_response`] writes the answer a client receives.

use std::collections::BTreeMap;

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::binary::{assemble, split};
use super::data::{Leaves, Sink};
use super::wire::{check_tensors, into_tensor, out_tensors, parse_json, OutTensor, WireTensor};
use super::{Error, Tensor};

/// A decoded infer response.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct InferResponse {
    /// The model that answered.
    pub model_name: String,
    /// Its version, when the server says.
    pub model_version: Option<String>,
    /// The request id this answers.
    pub id: Option<String>,
    /// Response parameters as sent.
    pub parameters: Map<String, Value>,
    /// Output tensors, names unique.
    pub outputs: Vec<Tensor>,
    /// Each output's own parameters as sent, by output name (MLServer's `content_type`,
    /// which its codecs decode outputs by, for one); the binary extension's are not kept.
    pub output_parameters: BTreeMap<String, Map<String, Value>>,
}

#[derive(Deserialize)]
#[serde(bound(deserialize = "S: Sink"))]
struct WireResponse<S> {
    model_name: String,
    #[serde(default)]
    model_version: Option<String>,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    parameters: Option<Map<String, Value>>,
    #[serde(default)]
    outputs: Vec<WireTensor<S>>,
}

#[derive(Serialize)]
struct OutResponse<'a> {
    model_name: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    model_version: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    id: Option<&'a str>,
    #[serde(skip_serializing_if = "Map::is_empty")]
    parameters: &'a Map<String, Value>,
    outputs: Vec<OutTensor<'a>>,
}

/// Decodes an infer response body, with the same rules as requests (outputs may be
/// empty). Binary tensors share `body`'s buffer (no copy).
pub fn decode_response(body: &Bytes, header_len: Option<usize>) -> Result<InferResponse, Error> {
    let (json, start) = split(body, header_len)?;
    let wire: WireResponse<Leaves> = parse_json("response", json)?;
    let section = body.slice(start..);
    let output_parameters = super::wire::own_parameters(&wire.outputs, &["binary_data_size", "binary_data"]);
    let outputs = check_tensors("outputs", wire.outputs, &section)?;
    Ok(InferResponse {
        model_name: wire.model_name,
        model_version: wire.model_version,
        id: wire.id,
        parameters: wire.parameters.unwrap_or_default(),
        outputs: outputs.into_iter().map(|c| into_tensor(c, &section)).collect(),
        output_parameters,
    })
}

/// Encodes a response; outputs for which `binary` is true go to the binary section
/// with `parameters.binary_data_size`, and so do outputs JSON cannot carry exactly
/// (FP16, NaN or infinity, non-UTF-8 BYTES). Returns the body and, when any output is
/// binary, the JSON header length for `inference-header-content-length`.
pub fn encode_response(resp: &InferResponse, binary: &dyn Fn(&Tensor) -> bool) -> (Bytes, Option<usize>) {
    let (mut outputs, parts) = out_tensors(&resp.outputs, binary);
    super::wire::add_own_parameters(&mut outputs, &resp.output_parameters);
    let header = OutResponse {
        model_name: &resp.model_name,
        model_version: resp.model_version.as_deref(),
        id: resp.id.as_deref(),
        parameters: &resp.parameters,
        outputs,
    };
    let json = serde_json::to_vec(&header).expect("a response header always serializes: string keys only");
    assemble(json, &parts)
}
