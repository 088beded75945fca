//! A simulated LLM served as Triton serves one as a decoupled model over gRPC
//! (`ModelStreamInfer`, as its TensorRT-LLM and vLLM backends do): input `text_input`
//! (BYTES, its words the prompt's tokens), `max_tokens` from the request's parameters
//! (16 unless asked); one response a token, output `text_output` (BYTES), each with
//! the `triton_final_response` parameter, `true` on the last, or on an empty response
//! after it when the request's `triton_enable_empty_final_response` asks (as Triton).
//! A client that goes away cancels the generation.

use bytes::{BufMut, Bytes, BytesMut};
use serde_json::{Map, Value};
use tokio::sync::mpsc;

use super::{Engine, Out, StreamFaults};
use crate::protocol::grpc::bridge::Answers;
use crate::protocol::grpc::{pb, request_from_grpc, response_to_grpc};
use crate::protocol::{Datatype, InferResponse, Tensor};

/// Tokens a request gets unless it asks.
const DEFAULT_TOKENS: u64 = 16;

/// The responses of `msg` on `engine`, as they come.
pub(crate) fn answers(engine: &Engine, faults: StreamFaults, msg: pb::ModelInferRequest) -> Answers {
    let (tx, rx) = mpsc::channel(4);
    let failed = |tx: mpsc::Sender<pb::ModelStreamInferResponse>, message: String| {
        let _ = tx.try_send(pb::ModelStreamInferResponse {
            error_message: message,
            infer_response: None,
        });
    };
    let model = msg.model_name.clone();
    let request = match request_from_grpc(msg) {
        Ok(request) => request,
        Err(e) => {
            failed(tx, e.to_string());
            return Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx));
        }
    };
    let Some(text) = request.inputs.iter().find(|t| t.name == "text_input") else {
        failed(tx, format!("model '{model}' expects an input 'text_input'"));
        return Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx));
    };
    let prompt = text
        .bytes_elements()
        .map(|e| String::from_utf8_lossy(e).split_whitespace().count() as u64)
        .sum::<u64>()
        .max(1);
    let max_tokens = request
        .parameters
        .get("max_tokens")
        .and_then(Value::as_u64)
        .unwrap_or(DEFAULT_TOKENS)
        .clamp(1, super::openai::MAX_TOKENS);
    let empty_final = request
        .parameters
        .get("triton_enable_empty_final_response")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let mut tokens = engine.generate((prompt, max_tokens, super::openai::seed(&model, prompt)), faults);
    let id = request.id.unwrap_or_default();
    let response = move |text: Option<&str>, last: bool| {
        let mut parameters = Map::new();
        parameters.insert("triton_final_response".into(), Value::Bool(last));
        let outputs = text.map(|t| {
            let mut data = BytesMut::with_capacity(4 + t.len());
            data.put_u32_le(t.len() as u32);
            data.put_slice(t.as_bytes());
            Tensor {
                name: "text_output".into(),
                datatype: Datatype::Bytes,
                shape: vec![1],
                data: Bytes::from(data),
            }
        });
        let answer = InferResponse {
            model_name: model.clone(),
            model_version: Some("1".into()),
            id: Some(id.clone()),
            parameters,
            outputs: outputs.into_iter().collect(),
            output_parameters: Default::default(),
        };
        pb::ModelStreamInferResponse {
            error_message: String::new(),
            infer_response: Some(response_to_grpc(&answer)),
        }
    };
    tokio::spawn(async move {
        // One token held back, so the last can say it is.
        let mut held: Option<&'static str> = None;
        while let Some(out) = tokens.recv().await {
            let next = match out {
                Out::Token(token) => held.replace(token).map(|t| response(Some(t), false)),
                Out::Done => break,
                Out::Malformed => Some(pb::ModelStreamInferResponse {
                    error_message: "the model failed in the middle of its answer".into(),
                    infer_response: None,
                }),
            };
            if let Some(next) = next {
                if tx.send(next).await.is_err() {
                    return; // the client went away: dropping `tokens` cancels the generation
                }
            }
        }
        let last = match (held, empty_final) {
            (Some(token), true) => {
                if tx.send(response(Some(token), false)).await.is_err() {
                    return;
                }
                response(None, true)
            }
            (token, _) => response(token, true),
        };
        let _ = tx.send(last).await;
    });
    Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))
}
