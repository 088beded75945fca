//! Decoupled models over gRPC `ModelStreamInfer` (0..N responses a request, as
//! Triton's LLM backends answer) through the gRPC door to a gRPC backend: every
//! response relayed as it comes with its final flag, the budget on the first response,
//! a stall cut with an error message and counted against the endpoint, and a caller
//! that cancels its call cancelling the backend's generation.

use crate::common;

use std::time::Duration;

use common::*;
use tiergate::protocol::grpc::pb;
use tiergate::protocol::grpc::pb::grpc_inference_service_client::GrpcInferenceServiceClient;
use tiergate::sim::{LlmProfile, ModelSpec, StreamFaults};
use tokio_stream::StreamExt;

async fn llm(profile: &str) -> Backend {
    let profile = LlmProfile::named(profile).expect("profile");
    backend_with(vec![
        ModelSpec::llm("llama", profile),
        ModelSpec::new("m", Default::default()),
    ])
    .await
}

/// A route `name` for the LLM `llama` (and the tensor model `m`) on `endpoint`.
fn route(name: &str, endpoint: &str, extra: &str) -> String {
    format!(
        "[routes.{name}]\nmodels = [\"llama\", \"m\"]\n{extra}[routes.{name}.realtime]\nendpoints = [\"{endpoint}\"]\n"
    )
}

/// A request for `max_tokens` tokens, asking for an empty final response.
fn ask(id: &str, max_tokens: i64) -> pb::ModelInferRequest {
    let text = b"tell me about the gateway";
    let mut raw = (text.len() as u32).to_le_bytes().to_vec();
    raw.extend_from_slice(text);
    let int = |n: i64| pb::InferParameter {
        parameter_choice: Some(pb::infer_parameter::ParameterChoice::Int64Param(n)),
    };
    let yes = pb::InferParameter {
        parameter_choice: Some(pb::infer_parameter::ParameterChoice::BoolParam(true)),
    };
    pb::ModelInferRequest {
        model_name: "llama".into(),
        id: id.into(),
        parameters: [
            ("max_tokens".to_owned(), int(max_tokens)),
            ("triton_enable_empty_final_response".to_owned(), yes),
        ]
        .into_iter()
        .collect(),
        inputs: vec![pb::model_infer_request::InferInputTensor {
            name: "text_input".into(),
            datatype: "BYTES".into(),
            shape: vec![1],
            ..Default::default()
        }],
        raw_input_contents: vec![raw.into()],
        ..Default::default()
    }
}

/// A response's text and whether it says it is the last.
fn read(response: &pb::ModelStreamInferResponse) -> (String, bool) {
    let answer = response.infer_response.as_ref().expect("a response");
    let last = matches!(
        answer
            .parameters
            .get("triton_final_response")
            .and_then(|p| p.parameter_choice.clone()),
        Some(pb::infer_parameter::ParameterChoice::BoolParam(true))
    );
    let text = answer
        .raw_output_contents
        .first()
        .map(|raw| String::from_utf8_lossy(raw.get(4..).unwrap_or_default()).into_owned())
        .unwrap_or_default();
    (text, last)
}

async fn client(addr: std::net::SocketAddr) -> GrpcInferenceServiceClient<tonic::transport::Channel> {
    GrpcInferenceServiceClient::connect(format!("http://{addr}"))
        .await
        .expect("connect")
}

/// Every response of one request on a stream of its own.
async fn all(addr: std::net::SocketAddr, request: pb::ModelInferRequest) -> Vec<pb::ModelStreamInferResponse> {
    let mut c = client(addr).await;
    let mut responses = c
        .model_stream_infer(tokio_stream::once(request))
        .await
        .expect("a stream")
        .into_inner();
    let mut out = Vec::new();
    while let Some(item) = tokio::time::timeout(Duration::from_secs(10), responses.next())
        .await
        .expect("a response in time")
    {
        out.push(item.expect("a response"));
    }
    out
}

#[tokio::test]
async fn a_decoupled_models_responses_are_relayed_as_they_come_with_the_final_flag() {
    let be = llm("llm-tiny").await;
    let gw = gateway(&route("decoupled", &be.grpc_url(), "")).await;
    let direct = all(be.grpc, ask("a", 5)).await;
    let relayed = all(gw.grpc_addr(), ask("a", 5)).await;
    assert_eq!(relayed.len(), 6, "five tokens and an empty final response: {relayed:?}");
    let texts: Vec<(String, bool)> = relayed.iter().map(read).collect();
    assert_eq!(
        texts,
        direct.iter().map(read).collect::<Vec<_>>(),
        "as the backend sent them"
    );
    assert!(texts[..5].iter().all(|(t, last)| !t.is_empty() && !last), "{texts:?}");
    assert_eq!(texts[5], (String::new(), true));
    assert!(relayed
        .iter()
        .all(|r| r.infer_response.as_ref().is_some_and(|a| a.id == "a")));
    let streams = "tiergate_streams_ended_total{route=\"decoupled\",tier=\"realtime\",reason=\"done\"}";
    assert_eq!(metric(&gw, streams).await, 1.0);
    let tokens = "tiergate_tokens_total{route=\"decoupled\",tier=\"realtime\",kind=\"completion_estimated\"}";
    assert_eq!(metric(&gw, tokens).await, 5.0, "a response with outputs is a token");
    // A model that is not decoupled, on the same stream API: one response, as before.
    let mut c = client(gw.grpc_addr()).await;
    let tensor = pb::ModelInferRequest {
        model_name: "m".into(),
        id: "t".into(),
        inputs: vec![pb::model_infer_request::InferInputTensor {
            name: "INPUT0".into(),
            datatype: "FP32".into(),
            shape: vec![1, 2],
            contents: Some(pb::InferTensorContents {
                fp32_contents: vec![1.0, 2.0],
                ..Default::default()
            }),
            ..Default::default()
        }],
        ..Default::default()
    };
    let mut once = c
        .model_stream_infer(tokio_stream::once(tensor))
        .await
        .expect("a stream")
        .into_inner();
    let first = once.next().await.expect("one").expect("a response");
    assert!(first.error_message.is_empty(), "{first:?}");
    assert!(once.next().await.is_none(), "and no more");
}

#[tokio::test]
async fn a_caller_cancelling_its_call_cancels_the_generation_and_a_stall_is_the_backends() {
    let be = llm("llm-tiny").await;
    let extra = "stream_idle_timeout = \"1s\"\n";
    let gw = gateway(&route("cancel", &be.grpc_url(), extra)).await;
    let mut c = client(gw.grpc_addr()).await;
    let mut responses = c
        .model_stream_infer(tokio_stream::once(ask("long", 4000)))
        .await
        .expect("a stream")
        .into_inner();
    for _ in 0..3 {
        let item = responses.next().await.expect("a response").expect("ok");
        assert!(!read(&item).0.is_empty());
    }
    drop(responses);
    drop(c);
    eventually(
        Duration::from_secs(10),
        "the backend's generation is cancelled",
        || async { (be.sim.llm_stats("llama").expect("stats").cancelled >= 1).then_some(()) },
    )
    .await;
    assert!(be.sim.llm_stats("llama").expect("stats").tokens < 4000);
    // A stall after two tokens: the idle limit ends it with an error message.
    be.sim.faulty_streams(StreamFaults {
        stall_after: 2,
        malformed_after: 0,
    });
    let responses = all(gw.grpc_addr(), ask("stalled", 50)).await;
    let last = responses.last().expect("responses");
    assert!(last.error_message.contains("stream_idle_timeout"), "{responses:?}");
    // The backend holds each token until the next (so its last can say it is): one
    // of the two before the stall is sent, then the error.
    assert_eq!(responses.len(), 2, "a token, then the error: {responses:?}");
    assert!(!read(&responses[0]).0.is_empty());
    let ended = "tiergate_streams_ended_total{route=\"cancel\",tier=\"realtime\",reason=\"idle\"}";
    assert_eq!(metric(&gw, ended).await, 1.0);
}
