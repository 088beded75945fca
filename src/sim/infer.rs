//! The infer handler: read and decode the body, queue one batch for the model's
//! instances, and answer with `OUTPUT0` (a copy of the first input) and `OUTPUT1`
//! (per-row sums), JSON or binary as the client asked.

use bytes::Bytes;
use http::{Request, StatusCode};
use hyper::body::Incoming;
use tokio::sync::oneshot;

use super::answer::{error, read_body, reply, InFlight, Refusal, Reply, POISON};
use super::instance::{Job, Outcome};
use super::Model;
use crate::protocol::{self, Datatype, InferRequest, InferResponse, Tensor, HEADER_LEN};

/// Largest batch accepted, so `OUTPUT1` stays small whatever `shape[0]` claims.
const MAX_ROWS: u64 = 1 << 20;
const OUTPUTS: [&str; 2] = ["OUTPUT0", "OUTPUT1"];

/// A checked request whose batch is queued.
struct Queued {
    request: InferRequest,
    /// The outputs to send, each with whether it goes binary.
    outputs: Vec<(Output, bool)>,
    done: oneshot::Receiver<Outcome>,
}

/// Answers `POST /v2/models/{model}/infer` for the model `m`.
pub(crate) async fn infer(m: &Model, model: &str, req: Request<Incoming>) -> Reply {
    traced(
        m,
        req.headers()
            .get(crate::trace::TRACEPARENT)
            .and_then(|v| v.to_str().ok()),
    );
    let mut guard = InFlight::enter(&m.stats);
    let reply = match answer(m, model, req).await {
        Ok(reply) => reply,
        Err(Refusal(status, message)) => error(status, &message),
    };
    guard.answered = true;
    reply
}

/// Records the `traceparent` a request came with, and logs it.
pub(crate) fn traced(m: &Model, traceparent: Option<&str>) {
    if let Some(tp) = traceparent {
        tracing::debug!(traceparent = tp, "infer request");
        m.stats.send_modify(|s| s.last_traceparent = Some(tp.to_owned()));
    }
}

/// Answers an infer request already read: `body` in the KServe v2 HTTP form (binary
/// extension when `header_len` is set). The gRPC side of the simulator uses this.
pub(crate) async fn infer_bytes(m: &Model, model: &str, header_len: Option<usize>, body: Bytes) -> Reply {
    let mut guard = InFlight::enter(&m.stats);
    let reply = match run(m, model, header_len, body).await {
        Ok(reply) => reply,
        Err(Refusal(status, message)) => error(status, &message),
    };
    guard.answered = true;
    reply
}

async fn answer(m: &Model, model: &str, req: Request<Incoming>) -> Result<Reply, Refusal> {
    let header_len = protocol::header_len(req.headers()).map_err(Refusal::bad)?;
    let body = read_body(req).await?;
    run(m, model, header_len, body).await
}

async fn run(m: &Model, model: &str, header_len: Option<usize>, body: Bytes) -> Result<Reply, Refusal> {
    let queued = queue(m, model, &body, header_len);
    // Counted after queueing, so `requests == n` tells a test the batches are queued.
    let id = queued.as_ref().ok().and_then(|q| q.request.id.clone());
    m.stats.send_modify(|s| {
        s.requests += 1;
        s.last_request = body.clone();
        if let Some(id) = id {
            if s.ids.len() == super::IDS_KEPT {
                s.ids.remove(0);
            }
            s.ids.push(id);
        }
    });
    let queued = queued?;
    match queued.done.await {
        Ok(Outcome::Done) => Ok(respond(model, queued.request, &queued.outputs, m.off)),
        Ok(Outcome::Fault) => Err(Refusal(StatusCode::INTERNAL_SERVER_ERROR, "injected fault".into())),
        Err(_) => Err(Refusal::no_instance(model)),
    }
}

/// Checks the request and queues its batch.
fn queue(m: &Model, model: &str, body: &Bytes, header_len: Option<usize>) -> Result<Queued, Refusal> {
    let request = protocol::decode_request(body, header_len).map_err(Refusal::bad)?;
    let rows = batch_rows(&request).map_err(Refusal::bad)?;
    refuse_poison(&request).map_err(Refusal::bad)?;
    let outputs = select_outputs(model, &m.heads, &request).map_err(Refusal::bad)?;
    let (reply, done) = oneshot::channel();
    m.jobs
        .send(Job { rows, reply })
        .map_err(|_| Refusal::no_instance(model))?;
    Ok(Queued { request, outputs, done })
}

/// The batch size: `shape[0]`, the same for every input.
fn batch_rows(request: &InferRequest) -> Result<u64, String> {
    let Some(first) = request.inputs.first() else {
        return Err("inputs is empty".into()); // decode_request refuses this already
    };
    let Some(&rows) = first.shape.first() else {
        return Err("inputs[0] has rank 0; the simulator needs a batch dimension".into());
    };
    for (i, input) in request.inputs.iter().enumerate().skip(1) {
        if input.shape.first() != Some(&rows) {
            let dims = input.shape.first().map_or("missing".into(), u64::to_string);
            return Err(format!("inputs[{i}].shape[0] is {dims} but inputs[0].shape[0] is {rows}; all inputs must share the batch dimension"));
        }
    }
    if rows > MAX_ROWS {
        return Err(format!(
            "inputs[0].shape[0] is {rows}; the simulator takes at most {MAX_ROWS} rows per batch"
        ));
    }
    Ok(rows)
}

/// Refuses a request with a BYTES element equal to [`POISON`], naming its row.
fn refuse_poison(request: &InferRequest) -> Result<(), String> {
    for input in request.inputs.iter().filter(|t| t.datatype == Datatype::Bytes) {
        let per_row = input.shape.iter().skip(1).product::<u64>().max(1);
        if let Some(i) = input.bytes_elements().position(|e| e == POISON.as_bytes()) {
            return Err(format!(
                "row {} of input '{}' is \"{POISON}\": the model refuses it",
                i as u64 / per_row,
                input.name
            ));
        }
    }
    Ok(())
}

/// One output the model has: its name and what it holds.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Output {
    name: String,
    /// `None`: a copy of the first input; `Some(k)`: each row's sum plus `k`.
    sums: Option<f64>,
}

impl Output {
    /// Its name.
    pub(super) fn name(&self) -> &str {
        &self.name
    }

    /// Whether it is a copy of the first input (else FP64 row sums).
    pub(super) fn is_copy(&self) -> bool {
        self.sums.is_none()
    }
}

/// The outputs `heads` give a model: `OUTPUT0` and `OUTPUT1` for a plain one; per head
/// `h` at position `i`, `h_OUTPUT0` and `h_OUTPUT1` (sums plus `i + 1`).
pub(super) fn outputs_of(heads: &[String]) -> Vec<Output> {
    if heads.is_empty() {
        return OUTPUTS
            .iter()
            .zip([None, Some(0.0)])
            .map(|(name, sums)| Output {
                name: (*name).into(),
                sums,
            })
            .collect();
    }
    let per_head = heads.iter().zip(1u32..).flat_map(|(head, k)| {
        [
            (format!("{head}_OUTPUT0"), None),
            (format!("{head}_OUTPUT1"), Some(f64::from(k))),
        ]
        .map(|(name, sums)| Output { name, sums })
    });
    per_head.collect()
}

/// The outputs to send, each with whether it goes binary: per-output
/// `binary_data`, else the request's `binary_data_output`, else JSON.
fn select_outputs(model: &str, heads: &[String], request: &InferRequest) -> Result<Vec<(Output, bool)>, String> {
    let default = request
        .parameters
        .get("binary_data_output")
        .and_then(|v| v.as_bool())
        .unwrap_or(false);
    let known = outputs_of(heads);
    if request.outputs.is_empty() {
        return Ok(known.into_iter().map(|o| (o, default)).collect());
    }
    let mut selected: Vec<(Output, bool)> = Vec::new();
    for (i, out) in request.outputs.iter().enumerate() {
        let Some(output) = known.iter().find(|o| o.name == out.name) else {
            let names: Vec<&str> = known.iter().map(|o| o.name.as_str()).collect();
            return Err(format!(
                "outputs[{i}].name '{}' is not an output of model '{model}' ({})",
                out.name,
                names.join(", ")
            ));
        };
        if selected.iter().any(|(o, _)| o.name == output.name) {
            return Err(format!("outputs[{i}].name '{}' is requested twice", output.name));
        }
        selected.push((output.clone(), out.binary_data.unwrap_or(default)));
    }
    Ok(selected)
}

fn respond(model: &str, request: InferRequest, selected: &[(Output, bool)], off: (f64, f64)) -> Reply {
    let Some(first) = request.inputs.first() else {
        return error(StatusCode::INTERNAL_SERVER_ERROR, "no inputs"); // checked by batch_rows
    };
    // A backend that reads an input's own parameters (as MLServer reads content_type):
    // `scale` on the first input multiplies OUTPUT1.
    let scale = request
        .input_parameters
        .get(&first.name)
        .and_then(|p| p.get("scale"))
        .and_then(serde_json::Value::as_f64)
        .unwrap_or(1.0);
    let outputs = selected
        .iter()
        .map(|(output, _)| match output.sums {
            None => Tensor {
                name: output.name.clone(),
                ..first.clone()
            },
            Some(k) => Tensor {
                name: output.name.clone(),
                ..row_sums(first, off, k, scale)
            },
        })
        .collect();
    let response = InferResponse {
        model_name: model.to_owned(),
        model_version: Some("1".into()),
        id: request.id,
        parameters: Default::default(),
        outputs,
        output_parameters: Default::default(),
    };
    let is_binary = |t: &Tensor| selected.iter().any(|(o, b)| *b && o.name == t.name);
    let (body, header_len) = protocol::encode_response(&response, &is_binary);
    let Some(len) = header_len else {
        return reply(StatusCode::OK, "application/json", body);
    };
    let mut answer = reply(StatusCode::OK, "application/octet-stream", body);
    answer.headers_mut().insert(HEADER_LEN, len.into());
    answer
}

/// `OUTPUT1`: FP64 `[B]`, element `r` the sum of row `r` of `input` times `scale`, plus
/// `head` (a combined model's head's offset, else 0); when the sum is negative, plus
/// `drift` and a random amount below `noise` (`off` is the two).
fn row_sums(input: &Tensor, (drift, noise): (f64, f64), head: f64, scale: f64) -> Tensor {
    let rows = input.rows();
    let per_row = input.shape.iter().skip(1).product::<u64>();
    let mut sums = vec![0f64; usize::try_from(rows).unwrap_or(0)];
    for (i, value) in values(input).enumerate() {
        // per_row is 0 only when there are no elements at all.
        let row = (i as u64).checked_div(per_row).and_then(|r| usize::try_from(r).ok());
        if let Some(sum) = row.and_then(|r| sums.get_mut(r)) {
            *sum += value;
        }
    }
    for sum in sums.iter_mut().filter(|s| **s < 0.0) {
        *sum += drift
            + if noise > 0.0 {
                rand::random_range(0.0..noise)
            } else {
                0.0
            };
    }
    for sum in sums.iter_mut() {
        *sum = *sum * scale + head;
    }
    Tensor {
        name: "OUTPUT1".into(),
        datatype: Datatype::Fp64,
        shape: vec![rows],
        data: sums.iter().flat_map(|s| s.to_le_bytes()).collect::<Vec<u8>>().into(),
    }
}

fn le<const N: usize>(chunk: &[u8]) -> [u8; N] {
    chunk.try_into().unwrap_or([0; N])
}

macro_rules! le_values {
    ($data:expr, $t:ty) => {
        Box::new(
            $data
                .chunks_exact(std::mem::size_of::<$t>())
                .map(|c| <$t>::from_le_bytes(le(c)) as f64),
        )
    };
}

/// Every element of `t` as a number, row-major (BOOL: 0 or 1; BYTES: its length).
fn values(t: &Tensor) -> Box<dyn Iterator<Item = f64> + '_> {
    let data = &t.data[..];
    match t.datatype {
        Datatype::Bool => Box::new(data.iter().map(|b| f64::from(u8::from(*b != 0)))),
        Datatype::Uint8 => Box::new(data.iter().map(|b| f64::from(*b))),
        Datatype::Int8 => Box::new(data.iter().map(|b| f64::from(*b as i8))),
        Datatype::Uint16 => le_values!(data, u16),
        Datatype::Int16 => le_values!(data, i16),
        Datatype::Uint32 => le_values!(data, u32),
        Datatype::Int32 => le_values!(data, i32),
        Datatype::Uint64 => le_values!(data, u64),
        Datatype::Int64 => le_values!(data, i64),
        Datatype::Fp16 => Box::new(
            data.chunks_exact(2)
                .map(|c| f64::from(f16_to_f32(u16::from_le_bytes(le(c))))),
        ),
        Datatype::Bf16 => Box::new(
            data.chunks_exact(2)
                .map(|c| f64::from(f32::from_bits(u32::from(u16::from_le_bytes(le(c))) << 16))),
        ),
        Datatype::Fp32 => le_values!(data, f32),
        Datatype::Fp64 => le_values!(data, f64),
        Datatype::Bytes => Box::new(t.bytes_elements().map(|e| e.len() as f64)),
    }
}

/// Widens an IEEE half to f32 exactly.
fn f16_to_f32(bits: u16) -> f32 {
    let exp = u32::from((bits >> 10) & 0x1f);
    let frac = u32::from(bits & 0x3ff);
    let magnitude = match exp {
        0 => frac as f32 * 2f32.powi(-24),
        0x1f if frac == 0 => f32::INFINITY,
        0x1f => f32::NAN,
        _ => f32::from_bits(((exp + 112) << 23) | (frac << 13)),
    };
    if bits & 0x8000 != 0 {
        -magnitude
    } else {
        magnitude
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn halves_widen_exactly() {
        let table = [
            (0x3c00, 1.0),
            (0xc000, -2.0),
            (0x3555, 0.333_251_95),
            (0x0001, 5.960_464_5e-8),
            (0x7bff, 65504.0),
            (0x7c00, f32::INFINITY),
            (0x0000, 0.0),
        ];
        for (bits, want) in table {
            assert_eq!(f16_to_f32(bits), want, "{bits:#06x}");
        }
        assert!(f16_to_f32(0x7e00).is_nan());
    }

    #[test]
    fn sums_per_row() {
        let data: Vec<u8> = [1i32, 2, 3, -4, 5, 6].iter().flat_map(|v| v.to_le_bytes()).collect();
        let t = Tensor {
            name: "x".into(),
            datatype: Datatype::Int32,
            shape: vec![2, 3],
            data: data.into(),
        };
        let out = row_sums(&t, (0.0, 0.0), 0.0, 1.0);
        assert_eq!(out.shape, vec![2]);
        assert_eq!(&out.data[..], &[6f64.to_le_bytes(), 7f64.to_le_bytes()].concat()[..]);
        let empty = Tensor {
            shape: vec![3, 0],
            data: Bytes::new(),
            ..t
        };
        assert_eq!(&row_sums(&empty, (0.0, 0.0), 0.0, 1.0).data[..], &[0u8; 24][..]);
    }
}
