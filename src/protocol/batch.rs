//! Tensor surgery for the micro-batch tier: requests from many callers that share a
//! [`Signature`] are concatenated along dimension 0 into one backend request
//! ([`concat()`]), and the backend's answer is cut back into one response per caller by
//! each caller's row count ([`split()`]). It sits between the micro-batch queue (which
//! keys its queues by [`signature()`]) and the backend client. Like the rest of
//! `protocol`, it never panics: caller tensors and backend answers are checked against
//! their shapes before any slicing, with checked arithmetic throughout.

use bytes::{Bytes, BytesMut};
use serde_json::{Map, Value};

use super::tensor::{fmt_shape, BytesElements};
use super::{Datatype, InferRequest, InferResponse, RequestedOutput, Tensor};

#[cfg(test)]
mod tests;

/// Request parameters that belong to one caller and so neither split batches nor reach
/// the backend: the caller's own deadline and how it wants its answer encoded.
pub const PER_CALLER_PARAMETERS: [&str; 2] = ["timeout", "binary_data_output"];

/// What must agree for requests to share one batch: input names (in order), datatypes,
/// every dimension but the first and each input's own parameters; the requested outputs (names in order, and their
/// parameters other than the per-caller `binary_data`, since e.g. Triton's
/// `classification` changes what the backend computes); and the request parameters
/// other than [`PER_CALLER_PARAMETERS`], compared as canonical JSON (keys sorted).
/// `Hash + Eq` so the batcher can keep one queue per signature.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Signature {
    /// Per input: name, datatype, dimensions after the first, canonical JSON of its own
    /// parameters.
    inputs: Vec<(String, Datatype, Vec<u64>, String)>,
    /// Per requested output: name and canonical JSON of its parameters.
    outputs: Vec<(String, String)>,
    /// Canonical JSON of the shared request parameters.
    parameters: String,
}

/// Why requests could not be batched, or why a batch's answer could not be split.
/// Request-side variants mean "serve this request alone"; [`BatchError::BadOutput`]
/// means the backend broke the protocol (see [`BatchError::is_backend_fault`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BatchError {
    /// [`concat()`] was given no requests.
    #[error("no requests to batch")]
    Empty,
    /// A request without inputs has no rows to batch.
    #[error("the request has no inputs, so it has no rows to batch")]
    NoInputs,
    /// An input of rank 0 has no batch dimension.
    #[error("input \"{input}\" is a scalar (rank 0); only inputs with a batch dimension can be batched")]
    Scalar {
        /// The input's name.
        input: String,
    },
    /// Two inputs of one request disagree on dimension 0.
    #[error("inputs disagree on dimension 0: \"{first}\" has {first_rows} rows but \"{input}\" has {rows}")]
    RowMismatch {
        /// The first input's name.
        first: String,
        /// Its dimension 0.
        first_rows: u64,
        /// The input that disagrees.
        input: String,
        /// Its dimension 0.
        rows: u64,
    },
    /// A request in a batch whose signature differs from the first request's.
    #[error("request {index} of the batch differs from request 0 in inputs, outputs or parameters")]
    SignatureMismatch {
        /// Position of the request in the batch.
        index: usize,
    },
    /// A request of a Triton sequence (a stateful model's): its rows are one step of one
    /// correlation id's state, so they never share a backend call with others.
    #[error("it belongs to sequence {sequence_id} (a stateful model's requests are never combined)")]
    Sequence {
        /// The request's `sequence_id`, as [`super::Sequence::id`] writes it.
        sequence_id: String,
    },
    /// The batch's row count does not fit in 64 bits.
    #[error("the batch holds more than 2^64 rows")]
    TooManyRows,
    /// A caller's input whose data does not match its datatype and shape.
    #[error("request {index} input \"{input}\" {problem}")]
    BadInput {
        /// Position of the request in the batch.
        index: usize,
        /// The input's name.
        input: String,
        /// What is wrong, e.g. `FP32 shape [2,3] needs 24 bytes but data has 20`.
        problem: String,
    },
    /// A backend output that cannot be split by the batch's rows.
    #[error("backend broke the protocol: output \"{output}\" {problem}")]
    BadOutput {
        /// The output's name.
        output: String,
        /// What is wrong, e.g. `has 3 rows but the batch has 4`.
        problem: String,
    },
}

impl BatchError {
    /// Whether the backend caused this error (a malformed answer) rather than a caller's
    /// request or the batcher; retrying the same batch on the same backend will not help.
    pub fn is_backend_fault(&self) -> bool {
        matches!(self, BatchError::BadOutput { .. })
    }
}

/// The signature and the row count (dimension 0, equal across inputs) of a request.
/// Errors when the request has no inputs, an input has rank 0, the inputs disagree on
/// dimension 0, or it is a step of a Triton sequence (a request that cannot be batched;
/// the tier then serves it alone).
pub fn signature(req: &InferRequest) -> Result<(Signature, u64), BatchError> {
    // A malformed sequence id was refused at the door; here only a real one matters.
    if let Ok(Some(sequence)) = super::sequence(&req.parameters) {
        return Err(BatchError::Sequence {
            sequence_id: sequence.id,
        });
    }
    let first = req.inputs.first().ok_or(BatchError::NoInputs)?;
    let first_rows = *first.shape.first().ok_or_else(|| scalar(first))?;
    let mut inputs = Vec::with_capacity(req.inputs.len());
    for t in &req.inputs {
        let (&rows, trailing) = t.shape.split_first().ok_or_else(|| scalar(t))?;
        if rows != first_rows {
            return Err(BatchError::RowMismatch {
                first: first.name.clone(),
                first_rows,
                input: t.name.clone(),
                rows,
            });
        }
        let own = req.input_parameters.get(&t.name).map(|p| canonical(p, &[]));
        inputs.push((t.name.clone(), t.datatype, trailing.to_vec(), own.unwrap_or_default()));
    }
    let outputs = req
        .outputs
        .iter()
        .map(|o| (o.name.clone(), canonical(&o.parameters, &[])));
    let signature = Signature {
        inputs,
        outputs: outputs.collect(),
        parameters: canonical(&req.parameters, &PER_CALLER_PARAMETERS),
    };
    Ok((signature, first_rows))
}

/// One request carrying the rows of all of `reqs`, in order: each input concatenated
/// along dimension 0 (raw bytes appended; BYTES length-prefixed elements append too),
/// requested outputs and shared parameters from the first request (per-caller
/// parameters and each output's `binary_data` dropped), no id. Checks its precondition:
/// every request has the first one's signature and data that matches its shapes, so no
/// caller's rows can bleed into another's.
pub fn concat(reqs: &[&InferRequest]) -> Result<InferRequest, BatchError> {
    let (first, _) = reqs.split_first().ok_or(BatchError::Empty)?;
    let (expected, _) = signature(first)?;
    let mut total: u64 = 0;
    for (index, req) in reqs.iter().enumerate() {
        let (sig, rows) = signature(req)?;
        if sig != expected {
            return Err(BatchError::SignatureMismatch { index });
        }
        for t in &req.inputs {
            row_cuts(t, &[rows]).map_err(|problem| BatchError::BadInput {
                index,
                input: t.name.clone(),
                problem,
            })?;
        }
        total = total.checked_add(rows).ok_or(BatchError::TooManyRows)?;
    }
    let inputs = first.inputs.iter().enumerate().map(|(j, t)| {
        let mut shape = t.shape.clone();
        if let Some(dim0) = shape.first_mut() {
            *dim0 = total;
        }
        let parts = reqs.iter().filter_map(|r| r.inputs.get(j)).map(|t| &t.data);
        Tensor {
            name: t.name.clone(),
            datatype: t.datatype,
            shape,
            data: append(parts),
        }
    });
    let mut parameters = first.parameters.clone();
    for key in PER_CALLER_PARAMETERS {
        parameters.remove(key);
    }
    let outputs = first.outputs.iter().map(|o| RequestedOutput {
        binary_data: None,
        ..o.clone()
    });
    Ok(InferRequest {
        id: None,
        parameters,
        inputs: inputs.collect(),
        input_parameters: first.input_parameters.clone(),
        outputs: outputs.collect(),
    })
}

/// Splits a batch's answer back: for each caller, in order, an [`InferResponse`] whose
/// every output holds exactly that caller's `rows[i]` rows (dimension 0 sliced, other
/// dimensions kept; zero-copy `Bytes::slice` for every datatype, BYTES cut at element
/// boundaries found by walking the length prefixes). `model_name`, `model_version`,
/// `parameters`, each output's parameters and the batch's `id` are copied to each (the
/// tier gives a caller that sent an id its own). Errors with [`BatchError::BadOutput`] when an output has rank 0, its dimension 0
/// is not the sum of `rows`, or its data does not match its datatype and shape.
pub fn split(resp: &InferResponse, rows: &[u64]) -> Result<Vec<InferResponse>, BatchError> {
    let mut answers: Vec<InferResponse> = rows
        .iter()
        .map(|_| InferResponse {
            model_name: resp.model_name.clone(),
            model_version: resp.model_version.clone(),
            id: resp.id.clone(),
            parameters: resp.parameters.clone(),
            outputs: Vec::with_capacity(resp.outputs.len()),
            output_parameters: resp.output_parameters.clone(),
        })
        .collect();
    for t in &resp.outputs {
        let cuts = row_cuts(t, rows).map_err(|problem| BatchError::BadOutput {
            output: t.name.clone(),
            problem,
        })?;
        let trailing = t.shape.get(1..).unwrap_or_default();
        for ((answer, &n), window) in answers.iter_mut().zip(rows).zip(cuts.windows(2)) {
            let &[start, end] = window else { continue };
            let mut shape = Vec::with_capacity(t.shape.len());
            shape.push(n);
            shape.extend_from_slice(trailing);
            answer.outputs.push(Tensor {
                name: t.name.clone(),
                datatype: t.datatype,
                shape,
                // row_cuts returns non-decreasing offsets within the data.
                data: t.data.slice(start..end),
            });
        }
    }
    Ok(answers)
}

fn scalar(t: &Tensor) -> BatchError {
    BatchError::Scalar { input: t.name.clone() }
}

/// Appends raw data buffers; a single buffer is shared, not copied.
pub(super) fn append<'a>(parts: impl Iterator<Item = &'a Bytes> + Clone) -> Bytes {
    let mut it = parts.clone();
    if let (Some(only), None) = (it.next(), it.next()) {
        return only.clone();
    }
    let len = parts.clone().fold(0usize, |n, b| n.saturating_add(b.len()));
    let mut out = BytesMut::with_capacity(len);
    for part in parts {
        out.extend_from_slice(part);
    }
    out.freeze()
}

/// Checks that `t`'s data matches its datatype and shape and that `rows` sums to its
/// dimension 0, then returns `rows.len() + 1` non-decreasing byte offsets into the data:
/// group `i` of rows spans `cuts[i]..cuts[i + 1]`. Never allocates by a declared size:
/// only by `rows.len()`, which the caller owns.
pub(super) fn row_cuts(t: &Tensor, rows: &[u64]) -> Result<Vec<usize>, String> {
    let Some((&dim0, trailing)) = t.shape.split_first() else {
        return Err("is a scalar (rank 0), so it has no rows to split".into());
    };
    let sum = rows.iter().try_fold(0u64, |n, r| n.checked_add(*r));
    if sum != Some(dim0) {
        let sum = sum.map_or("more than 2^64".into(), |s| s.to_string());
        return Err(format!("has {dim0} rows but the batch has {sum}"));
    }
    let shape = fmt_shape(&t.shape);
    let per_row = trailing.iter().try_fold(1u64, |n, d| n.checked_mul(*d));
    let Some((per_row, elements)) = per_row.and_then(|p| Some((p, p.checked_mul(dim0)?))) else {
        return Err(format!("shape {shape} holds more than 2^64 elements"));
    };
    let len = t.data.len();
    let mut cuts = Vec::with_capacity(rows.len().saturating_add(1));
    cuts.push(0);
    match t.datatype.element_size() {
        Some(size) => {
            let needed = u128::from(elements) * size as u128;
            if needed != len as u128 {
                return Err(format!(
                    "{} shape {shape} needs {needed} bytes but data has {len}",
                    t.datatype
                ));
            }
            // The data holds exactly dim0 rows of row_bytes, and rows sums to dim0, so
            // every offset is at most len; checked anyway, it costs nothing.
            let row_bytes = u128::from(per_row) * size as u128;
            let mut end = 0u128;
            for &n in rows {
                end = end.saturating_add(u128::from(n).saturating_mul(row_bytes));
                cuts.push(
                    usize::try_from(end)
                        .ok()
                        .filter(|e| *e <= len)
                        .ok_or("row offsets overflow")?,
                );
            }
        }
        None => {
            // Each element takes at least its 4-byte prefix, so this walk stops within
            // len / 4 steps however large the shape claims to be.
            let mut walk = BytesElements(&t.data);
            let mut seen = 0u64;
            for &n in rows {
                for _ in 0..n.saturating_mul(per_row) {
                    walk.next().ok_or_else(|| {
                        format!("BYTES data ends at element {seen} but shape {shape} holds {elements}")
                    })?;
                    seen += 1;
                }
                cuts.push(len - walk.0.len());
            }
            if !walk.0.is_empty() {
                let extra = walk.0.len();
                return Err(format!(
                    "BYTES data has {extra} bytes after the {elements} elements of shape {shape}"
                ));
            }
        }
    }
    Ok(cuts)
}

/// Canonical JSON of a parameter map without the `skip` keys: keys sorted at every
/// level, so equal parameters give equal strings whatever order they were sent in.
/// `map` as canonical JSON (keys sorted at every level), leaving out the keys in `skip`:
/// equal JSON objects give equal strings, whatever order their keys came in.
pub fn canonical(map: &Map<String, Value>, skip: &[&str]) -> String {
    let mut out = String::new();
    write_object(map.iter().filter(|(k, _)| !skip.contains(&k.as_str())), &mut out);
    out
}

fn write_object<'a>(entries: impl Iterator<Item = (&'a String, &'a Value)>, out: &mut String) {
    let mut entries: Vec<_> = entries.collect();
    entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
    out.push('{');
    for (i, (key, value)) in entries.into_iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(&Value::from(key.as_str()).to_string());
        out.push(':');
        write_value(value, out);
    }
    out.push('}');
}

// Recursion is bounded: parameters come from serde_json, which limits nesting to 128.
fn write_value(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => write_object(map.iter(), out),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_value(item, out);
            }
            out.push(']');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}
