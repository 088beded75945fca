//! KServe v2 over gRPC: the messages generated from `proto/grpc_service.proto` and their
//! exact conversion to and from [`Tensor`]s.
//!
//! Tensors travel in raw form on both sides: gRPC `raw_*_contents` use the same layout
//! as [`Tensor::data`] (little-endian elements; BYTES as u32 length + bytes), so raw
//! contents pass through without copying. Typed `contents` are accepted on input and
//! converted with range checks. Every check names the field that broke it.

use std::collections::HashMap;

use bytes::{BufMut, Bytes, BytesMut};
use serde_json::{Map, Value};

use super::binary::check_bytes_layout;
use super::wire::{check_shape, element_count, no_shared_memory};
use super::{Datatype, Error, InferRequest, InferResponse, RequestedOutput, Tensor};

pub mod bridge;
pub mod codec;
pub mod config;

/// The generated protobuf messages, client and server of `inference.GRPCInferenceService`.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod pb {
    tonic::include_proto!("inference");
}

use pb::infer_parameter::ParameterChoice;
use pb::model_infer_request::{InferInputTensor, InferRequestedOutputTensor};
use pb::model_infer_response::InferOutputTensor;
use pb::{InferParameter, InferTensorContents, ModelInferRequest, ModelInferResponse};

/// Reads a gRPC infer request into the protocol's request form.
pub fn request_from_grpc(msg: ModelInferRequest) -> Result<InferRequest, Error> {
    if msg.inputs.is_empty() {
        return Err(Error::NoInputs);
    }
    let raw = msg.raw_input_contents;
    if !raw.is_empty() && raw.len() != msg.inputs.len() {
        return Err(grpc(
            "raw_input_contents",
            format!(
                "has {} entries for {} inputs; send one per input, in input order",
                raw.len(),
                msg.inputs.len()
            ),
        ));
    }
    let mut raw = raw.into_iter();
    let mut inputs: Vec<Tensor> = Vec::with_capacity(msg.inputs.len());
    let mut input_parameters = std::collections::BTreeMap::new();
    for (i, input) in msg.inputs.into_iter().enumerate() {
        let path = format!("inputs[{i}]");
        if let Some(first) = inputs.iter().position(|t| t.name == input.name) {
            return Err(Error::DuplicateName {
                path,
                name: input.name,
                first: format!("inputs[{first}]"),
            });
        }
        no_shared_memory(&path, |name| input.parameters.contains_key(name))?;
        if !input.parameters.is_empty() {
            input_parameters.insert(input.name.clone(), params_to_json(input.parameters.clone()));
        }
        inputs.push(input_tensor(&path, input, raw.next())?);
    }
    for (i, out) in msg.outputs.iter().enumerate() {
        no_shared_memory(&format!("outputs[{i}]"), |name| out.parameters.contains_key(name))?;
    }
    let outputs = msg.outputs.into_iter().map(requested_output).collect();
    Ok(InferRequest {
        id: Some(msg.id).filter(|id| !id.is_empty()),
        parameters: params_to_json(msg.parameters),
        inputs,
        input_parameters,
        outputs,
    })
}

/// Writes a request as a gRPC infer request for `model` (and `version`), raw contents.
pub fn request_to_grpc(model: &str, version: Option<&str>, req: &InferRequest) -> ModelInferRequest {
    ModelInferRequest {
        model_name: model.to_owned(),
        model_version: version.unwrap_or_default().to_owned(),
        id: req.id.clone().unwrap_or_default(),
        parameters: params_to_grpc(&req.parameters),
        inputs: req
            .inputs
            .iter()
            .map(|t| InferInputTensor {
                name: t.name.clone(),
                datatype: t.datatype.as_str().to_owned(),
                shape: dims(&t.shape),
                parameters: req
                    .input_parameters
                    .get(&t.name)
                    .map_or_else(HashMap::new, params_to_grpc),
                contents: None,
            })
            .collect(),
        outputs: req
            .outputs
            .iter()
            .map(|o| {
                let mut parameters = params_to_grpc(&o.parameters);
                if let Some(binary) = o.binary_data {
                    parameters.insert("binary_data".into(), param(ParameterChoice::BoolParam(binary)));
                }
                InferRequestedOutputTensor {
                    name: o.name.clone(),
                    parameters,
                }
            })
            .collect(),
        raw_input_contents: req.inputs.iter().map(|t| t.data.clone()).collect(),
    }
}

/// Reads a gRPC infer response into the protocol's response form.
pub fn response_from_grpc(msg: ModelInferResponse) -> Result<InferResponse, Error> {
    let raw = msg.raw_output_contents;
    if !raw.is_empty() && raw.len() != msg.outputs.len() {
        return Err(grpc(
            "raw_output_contents",
            format!("has {} entries for {} outputs", raw.len(), msg.outputs.len()),
        ));
    }
    let mut raw = raw.into_iter();
    let mut outputs = Vec::with_capacity(msg.outputs.len());
    let mut output_parameters = std::collections::BTreeMap::new();
    for (i, out) in msg.outputs.into_iter().enumerate() {
        if !out.parameters.is_empty() {
            output_parameters.insert(out.name.clone(), params_to_json(out.parameters.clone()));
        }
        let input = InferInputTensor {
            name: out.name,
            datatype: out.datatype,
            shape: out.shape,
            parameters: out.parameters,
            contents: out.contents,
        };
        outputs.push(input_tensor(&format!("outputs[{i}]"), input, raw.next())?);
    }
    Ok(InferResponse {
        model_name: msg.model_name,
        model_version: Some(msg.model_version).filter(|v| !v.is_empty()),
        id: Some(msg.id).filter(|id| !id.is_empty()),
        parameters: params_to_json(msg.parameters),
        outputs,
        output_parameters,
    })
}

/// Writes a response as a gRPC infer response, raw contents (as Triton answers).
pub fn response_to_grpc(resp: &InferResponse) -> ModelInferResponse {
    ModelInferResponse {
        model_name: resp.model_name.clone(),
        model_version: resp.model_version.clone().unwrap_or_default(),
        id: resp.id.clone().unwrap_or_default(),
        parameters: params_to_grpc(&resp.parameters),
        outputs: resp
            .outputs
            .iter()
            .map(|t| InferOutputTensor {
                name: t.name.clone(),
                datatype: t.datatype.as_str().to_owned(),
                shape: dims(&t.shape),
                parameters: resp
                    .output_parameters
                    .get(&t.name)
                    .map_or_else(HashMap::new, params_to_grpc),
                contents: None,
            })
            .collect(),
        raw_output_contents: resp.outputs.iter().map(|t| t.data.clone()).collect(),
    }
}

/// Checks one tensor and takes its data from `raw` or from its typed contents.
fn input_tensor(path: &str, input: InferInputTensor, raw: Option<Bytes>) -> Result<Tensor, Error> {
    let datatype: Datatype = input.datatype.parse().map_err(|_| Error::UnknownDatatype {
        path: path.to_owned(),
        value: input.datatype.clone(),
    })?;
    let shape = check_shape(path, &input.shape)?;
    let count = element_count(&shape);
    let data = match (raw, input.contents) {
        (Some(_), Some(c)) if c != InferTensorContents::default() => {
            return Err(grpc(
                path,
                "has typed contents while raw contents are used; send one form".into(),
            ));
        }
        (Some(raw), _) => check_raw(path, datatype, count, raw)?,
        (None, Some(contents)) => typed_to_raw(path, datatype, count, contents)?,
        (None, None) if count == 0 => Bytes::new(),
        (None, None) => return Err(grpc(path, "has no contents and no raw contents".into())),
    };
    Ok(Tensor {
        name: input.name,
        datatype,
        shape,
        data,
    })
}

fn check_raw(path: &str, datatype: Datatype, count: u64, raw: Bytes) -> Result<Bytes, Error> {
    match datatype.element_size() {
        Some(size) if u128::from(count) * size as u128 != raw.len() as u128 => Err(grpc(
            path,
            format!(
                "raw contents are {} bytes but {count} {datatype} elements need {}",
                raw.len(),
                u128::from(count) * size as u128
            ),
        )),
        Some(_) => Ok(raw),
        None => check_bytes_layout(&raw, count)
            .map(|()| raw)
            .map_err(|problem| Error::BadBytes {
                path: path.to_owned(),
                problem,
            }),
    }
}

/// Converts typed contents to raw bytes, checking the element count and each range.
fn typed_to_raw(path: &str, datatype: Datatype, count: u64, c: InferTensorContents) -> Result<Bytes, Error> {
    let mut out = BytesMut::new();
    let n = match datatype {
        Datatype::Bool => put(&mut out, &c.bool_contents, |o, v| o.put_u8(u8::from(*v))),
        Datatype::Int8 => narrow(path, "int_contents", &mut out, &c.int_contents, |o, v: i8| o.put_i8(v))?,
        Datatype::Int16 => narrow(path, "int_contents", &mut out, &c.int_contents, |o, v: i16| {
            o.put_i16_le(v)
        })?,
        Datatype::Int32 => put(&mut out, &c.int_contents, |o, v| o.put_i32_le(*v)),
        Datatype::Int64 => put(&mut out, &c.int64_contents, |o, v| o.put_i64_le(*v)),
        Datatype::Uint8 => narrow(path, "uint_contents", &mut out, &c.uint_contents, |o, v: u8| {
            o.put_u8(v)
        })?,
        Datatype::Uint16 => narrow(path, "uint_contents", &mut out, &c.uint_contents, |o, v: u16| {
            o.put_u16_le(v)
        })?,
        Datatype::Uint32 => put(&mut out, &c.uint_contents, |o, v| o.put_u32_le(*v)),
        Datatype::Uint64 => put(&mut out, &c.uint64_contents, |o, v| o.put_u64_le(*v)),
        Datatype::Fp32 => put(&mut out, &c.fp32_contents, |o, v| o.put_f32_le(*v)),
        Datatype::Fp64 => put(&mut out, &c.fp64_contents, |o, v| o.put_f64_le(*v)),
        Datatype::Bytes => {
            for (j, v) in c.bytes_contents.iter().enumerate() {
                let len = u32::try_from(v.len())
                    .map_err(|_| grpc(path, format!("contents.bytes_contents[{j}] is longer than 4 GiB")))?;
                out.put_u32_le(len);
                out.put_slice(v);
            }
            c.bytes_contents.len()
        }
        Datatype::Fp16 | Datatype::Bf16 => {
            return Err(grpc(
                path,
                format!("{datatype} has no typed contents; send it in raw_input_contents"),
            ))
        }
    };
    if n as u64 != count {
        return Err(grpc(
            path,
            format!("contents hold {n} {datatype} elements but the shape needs {count}"),
        ));
    }
    Ok(out.freeze())
}

fn put<T>(out: &mut BytesMut, values: &[T], mut write: impl FnMut(&mut BytesMut, &T)) -> usize {
    for v in values {
        write(out, v);
    }
    values.len()
}

/// Writes wide protobuf integers into a narrower datatype, refusing values out of range.
fn narrow<W: Copy + std::fmt::Display, N: TryFrom<W>>(
    path: &str,
    field: &str,
    out: &mut BytesMut,
    values: &[W],
    mut write: impl FnMut(&mut BytesMut, N),
) -> Result<usize, Error> {
    for (j, v) in values.iter().enumerate() {
        let n = N::try_from(*v).map_err(|_| grpc(path, format!("contents.{field}[{j}] = {v} is out of range")))?;
        write(out, n);
    }
    Ok(values.len())
}

fn requested_output(out: InferRequestedOutputTensor) -> RequestedOutput {
    let mut parameters = params_to_json(out.parameters);
    let binary_data = match parameters.remove("binary_data") {
        Some(Value::Bool(b)) => Some(b),
        Some(other) => {
            parameters.insert("binary_data".into(), other);
            None
        }
        None => None,
    };
    RequestedOutput {
        name: out.name,
        binary_data,
        parameters,
    }
}

fn dims(shape: &[u64]) -> Vec<i64> {
    shape.iter().map(|&d| i64::try_from(d).unwrap_or(i64::MAX)).collect()
}

fn grpc(path: &str, problem: String) -> Error {
    Error::Grpc {
        path: path.to_owned(),
        problem,
    }
}

fn param(choice: ParameterChoice) -> InferParameter {
    InferParameter {
        parameter_choice: Some(choice),
    }
}

/// gRPC parameters as JSON values (an unset parameter becomes `null`).
pub fn params_to_json(params: HashMap<String, InferParameter>) -> Map<String, Value> {
    let mut sorted: Vec<_> = params.into_iter().collect();
    sorted.sort_by(|a, b| a.0.cmp(&b.0));
    sorted
        .into_iter()
        .map(|(k, p)| {
            let v = match p.parameter_choice {
                Some(ParameterChoice::BoolParam(b)) => Value::Bool(b),
                Some(ParameterChoice::Int64Param(i)) => Value::from(i),
                Some(ParameterChoice::Uint64Param(u)) => Value::from(u),
                Some(ParameterChoice::DoubleParam(d)) => Value::from(d),
                Some(ParameterChoice::StringParam(s)) => Value::String(s),
                None => Value::Null,
            };
            (k, v)
        })
        .collect()
}

/// JSON parameters as gRPC parameters. gRPC parameters hold scalars only, so an array or
/// object travels as a string holding its JSON text; `null` becomes an unset parameter.
pub fn params_to_grpc(params: &Map<String, Value>) -> HashMap<String, InferParameter> {
    params
        .iter()
        .map(|(k, v)| {
            let choice = match v {
                Value::Bool(b) => Some(ParameterChoice::BoolParam(*b)),
                Value::Number(n) => Some(match (n.as_i64(), n.as_u64()) {
                    (Some(i), _) => ParameterChoice::Int64Param(i),
                    (None, Some(u)) => ParameterChoice::Uint64Param(u),
                    _ => ParameterChoice::DoubleParam(n.as_f64().unwrap_or(f64::NAN)),
                }),
                Value::String(s) => Some(ParameterChoice::StringParam(s.clone())),
                Value::Null => None,
                other => Some(ParameterChoice::StringParam(other.to_string())),
            };
            (
                k.clone(),
                InferParameter {
                    parameter_choice: choice,
                },
            )
        })
        .collect()
}

#[cfg(test)]
mod tests;
