//! The KServe v2 gRPC door: health, metadata, model config and statistics, infer with raw
//! and typed contents, streaming, deadlines, shedding and malformed messages.

use crate::common;

use std::collections::HashMap;

use bytes::Bytes;
use common::grpc::{client, fp32_request, sums, with_budget};
use common::*;
use tiergate::protocol::grpc::pb;
use tiergate::protocol::grpc::pb::model_infer_request::InferInputTensor;
use tonic::Code;
use tonic_types::StatusExt;

#[tokio::test]
async fn health_metadata_and_readiness() {
    let rt = backend(&["m"]).await;
    let gw = gateway(&route_r(&rt.url(), &rt.url()).flags(&["realtime"]).toml()).await;
    let mut c = client(gw.grpc_addr()).await;
    assert!(
        c.server_live(pb::ServerLiveRequest {})
            .await
            .expect("live")
            .into_inner()
            .live
    );
    assert!(
        c.server_ready(pb::ServerReadyRequest {})
            .await
            .expect("ready")
            .into_inner()
            .ready
    );
    assert_eq!(
        c.server_metadata(pb::ServerMetadataRequest {})
            .await
            .expect("meta")
            .into_inner()
            .name,
        "tiergate"
    );
    let meta = c
        .model_metadata(pb::ModelMetadataRequest {
            name: "m".into(),
            version: String::new(),
        })
        .await
        .expect("meta");
    let meta = meta.into_inner();
    assert_eq!(
        (meta.name.as_str(), meta.versions.as_slice()),
        ("m", &["1".to_owned()][..])
    );
    assert_eq!(meta.outputs[1].datatype, "FP64");
    let ready = c
        .model_ready(pb::ModelReadyRequest {
            name: "m".into(),
            version: "1".into(),
        })
        .await
        .expect("ready");
    assert!(ready.into_inner().ready);
    // As Triton: a model no route serves is not ready, and that is no error.
    let unknown = c
        .model_ready(pb::ModelReadyRequest {
            name: "nope".into(),
            version: String::new(),
        })
        .await
        .expect("an answer, not an error");
    assert!(!unknown.into_inner().ready);
    let err = c
        .model_metadata(pb::ModelMetadataRequest {
            name: "nope".into(),
            version: String::new(),
        })
        .await
        .expect_err("unknown");
    assert_eq!(err.code(), Code::NotFound);
    gw.stop().await.expect("stops");
}

#[tokio::test]
async fn model_config_and_statistics_of_an_http_backend_as_triton_messages() {
    let rt = backend(&["m"]).await;
    let gw = gateway(&route_r(&rt.url(), &rt.url()).flags(&["realtime"]).toml()).await;
    let mut c = client(gw.grpc_addr()).await;
    let config = c
        .model_config(pb::ModelConfigRequest {
            name: "m".into(),
            version: String::new(),
        })
        .await
        .expect("the backend's JSON converted")
        .into_inner()
        .config;
    // Field 1 is the name, field 4 max_batch_size (0: a default, so not encoded).
    assert!(config.starts_with(b"\x0a\x01m"), "{config:?}");
    let back = tiergate::protocol::grpc::config::config_to_json(&config).expect("decodes");
    let back: serde_json::Value = serde_json::from_slice(&back).expect("JSON");
    let direct = get(rt.addr, "/v2/models/m/config").await.json();
    assert!(json_includes(&back, &direct), "{back} holds {direct}");
    assert_eq!(back["input"][0]["format"], "FORMAT_NONE", "with Triton's defaults");
    let served = c.model_infer(with_budget(fp32_request("", &[[1.0, 2.0]]), "200")).await;
    served.expect("served");
    let stats = c
        .model_statistics(pb::ModelStatisticsRequest {
            name: "m".into(),
            version: String::new(),
        })
        .await
        .expect("the backend's JSON converted")
        .into_inner()
        .model_stats;
    let stats = tiergate::protocol::grpc::config::statistics_to_json(&stats).expect("decodes");
    let stats: serde_json::Value = serde_json::from_slice(&stats).expect("JSON");
    assert_eq!(stats["model_stats"][0]["name"], "m");
    assert_eq!(stats["model_stats"][0]["inference_count"], 1);
    let unknown = c
        .model_config(pb::ModelConfigRequest {
            name: "nope".into(),
            version: String::new(),
        })
        .await
        .expect_err("unknown");
    assert_eq!(unknown.code(), Code::NotFound);
    gw.stop().await.expect("stops");
}

#[tokio::test]
async fn infer_with_raw_and_typed_contents_and_the_decision_in_metadata() {
    let rt = backend(&["m"]).await;
    let gw = gateway(&route_r(&rt.url(), &rt.url()).flags(&["realtime", "micro_batch"]).toml()).await;
    let mut c = client(gw.grpc_addr()).await;
    let sent = fp32_request("g1", &[[1.0, 2.0], [3.5, -4.0]]);
    let response = c.model_infer(with_budget(sent.clone(), "100")).await.expect("served");
    let tier = |r: &tonic::metadata::MetadataMap, k: &str| r.get(k).and_then(|v| v.to_str().ok()).map(str::to_owned);
    assert_eq!(
        tier(response.metadata(), "x-tiergate-tier").as_deref(),
        Some("realtime")
    );
    assert_eq!(
        tier(response.metadata(), "x-tiergate-reason").as_deref(),
        Some("budget_realtime")
    );
    let out = response.into_inner();
    assert_eq!(out.id, "g1");
    assert_eq!(
        out.raw_output_contents[0], sent.raw_input_contents[0],
        "OUTPUT0 echoes the input bit for bit"
    );
    assert_eq!(sums(&out), vec![3.0, -0.5]);

    let typed = pb::ModelInferRequest {
        model_name: "m".into(),
        inputs: vec![InferInputTensor {
            name: "INPUT0".into(),
            datatype: "BYTES".into(),
            shape: vec![2, 1],
            parameters: HashMap::new(),
            contents: Some(pb::InferTensorContents {
                bytes_contents: vec![Bytes::from_static(b"abc"), Bytes::from_static(b"")],
                ..Default::default()
            }),
        }],
        ..Default::default()
    };
    let out = c
        .model_infer(with_budget(typed, "100"))
        .await
        .expect("served")
        .into_inner();
    assert_eq!(
        out.raw_output_contents[0].as_ref(),
        &[3, 0, 0, 0, b'a', b'b', b'c', 0, 0, 0, 0][..]
    );
    assert_eq!(sums(&out), vec![3.0, 0.0]);

    // the gRPC deadline is a budget source: 2 s calls for the micro-batch tier
    let mut req = tonic::Request::new(fp32_request("g2", &[[1.0, 1.0]]));
    req.set_timeout(std::time::Duration::from_secs(2));
    let batched = c.model_infer(req).await.expect("served by the micro-batch tier");
    assert_eq!(
        tier(batched.metadata(), "x-tiergate-tier").as_deref(),
        Some("micro_batch")
    );
    assert_eq!(tier(batched.metadata(), "x-tiergate-batch-size").as_deref(), Some("1"));
    let batch = tier(batched.metadata(), "x-tiergate-batch-id").expect("the batch's id as metadata");
    assert!(batch.starts_with("mb_"), "{batch}");
    assert!(tier(batched.metadata(), "x-tiergate-queue-ms").is_some());
    let out = batched.into_inner();
    assert_eq!(out.id, "g2");
    assert_eq!(sums(&out), vec![2.0]);
    gw.stop().await.expect("stops");
}

#[tokio::test]
async fn streaming_answers_every_request_in_order() {
    let rt = backend(&["m"]).await;
    let gw = gateway(&route_r(&rt.url(), &rt.url()).flags(&["realtime"]).toml()).await;
    let mut c = client(gw.grpc_addr()).await;
    let mut requests = vec![
        fp32_request("s1", &[[1.0, 1.0]]),
        fp32_request("s2", &[[2.0, 2.0]]),
        fp32_request("s3", &[[3.0, 3.0]]),
    ];
    requests[1].inputs[0].datatype = "FP33".into();
    let mut responses = c
        .model_stream_infer(tokio_stream::iter(requests))
        .await
        .expect("stream")
        .into_inner();
    let mut got = Vec::new();
    while let Some(item) = responses.message().await.expect("stream item") {
        let r = item.infer_response.expect("response");
        got.push((
            r.id.clone(),
            item.error_message.clone(),
            if item.error_message.is_empty() {
                sums(&r)
            } else {
                vec![]
            },
        ));
    }
    assert_eq!(got.len(), 3);
    assert_eq!((got[0].0.as_str(), got[0].2.as_slice()), ("s1", &[2.0][..]));
    assert_eq!(got[1].0, "s2");
    assert!(got[1].1.contains("FP33"), "{:?}", got[1]);
    assert_eq!((got[2].0.as_str(), got[2].2.as_slice()), ("s3", &[6.0][..]));
    gw.stop().await.expect("stops");
}

#[tokio::test]
async fn deadline_exceeded_drops_the_backend_call() {
    let rt = backend(&["m"]).await;
    let gw = gateway(&route_r(&rt.url(), &rt.url()).flags(&["realtime"]).toml()).await;
    let mut c = client(gw.grpc_addr()).await;
    rt.sim.hold();
    let err = c
        .model_infer(with_budget(fp32_request("d", &[[1.0, 1.0]]), "100"))
        .await
        .expect_err("deadline");
    assert_eq!(err.code(), Code::DeadlineExceeded, "{err}");
    wait_for(&rt, |s| s.cancelled == 1).await;
    rt.sim.release();
    gw.stop().await.expect("stops");
}

#[tokio::test]
async fn shedding_is_resource_exhausted_with_retry_info() {
    let rt = backend(&["m"]).await;
    let gw = gateway(&route_r(&rt.url(), &rt.url()).flags(&["realtime"]).toml()).await; // max_concurrency = 4
    rt.sim.hold();
    let addr = gw.grpc_addr();
    let held: Vec<_> = (0..4)
        .map(|i| {
            tokio::spawn(async move {
                client(addr)
                    .await
                    .model_infer(with_budget(fp32_request(&format!("h{i}"), &[[1.0, 1.0]]), "250"))
                    .await
            })
        })
        .collect();
    wait_for(&rt, |s| s.in_flight == 4).await;
    let err = client(addr)
        .await
        .model_infer(with_budget(fp32_request("x", &[[1.0, 1.0]]), "250"))
        .await
        .expect_err("shed");
    assert_eq!(err.code(), Code::ResourceExhausted, "{err}");
    let retry = err.get_details_retry_info().expect("retry info");
    assert_eq!(retry.retry_delay, Some(std::time::Duration::from_secs(1)));
    rt.sim.release();
    for h in held {
        h.await.expect("task").expect("served once released");
    }
    assert_eq!(rt.sim.stats("m").expect("stats").requests, 4);
    gw.stop().await.expect("stops");
}

#[tokio::test]
async fn malformed_and_oversized_messages_are_refused_without_harm() {
    let rt = backend(&["m"]).await;
    let mut config = config();
    config.limits.max_body_bytes = 4096;
    let gw = gateway_with(config, &route_r(&rt.url(), &rt.url()).flags(&["realtime"]).toml()).await;
    let mut c = client(gw.grpc_addr()).await;
    let mut short = fp32_request("bad", &[[1.0, 2.0]]);
    short.inputs[0].shape = vec![2, 2];
    let err = c.model_infer(short).await.expect_err("invalid");
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(
        err.message()
            .contains("raw contents are 8 bytes but 4 FP32 elements need 16"),
        "{}",
        err.message()
    );
    let mut unknown = fp32_request("u", &[[1.0, 2.0]]);
    unknown.model_name = "nope".into();
    assert_eq!(
        c.model_infer(unknown).await.expect_err("unknown").code(),
        Code::NotFound
    );
    let huge = fp32_request("big", &vec![[0.5f32, 0.5]; 1024]);
    let err = c.model_infer(huge).await.expect_err("too large");
    assert_eq!(err.code(), Code::ResourceExhausted, "as Triton: {err}");
    // The same on a stream: the stream ends with RESOURCE_EXHAUSTED.
    let huge = fp32_request("big", &vec![[0.5f32, 0.5]; 1024]);
    let mut answers = c
        .model_stream_infer(tokio_stream::iter([huge]))
        .await
        .expect("stream opens")
        .into_inner();
    let err = answers.message().await.expect_err("too large");
    assert_eq!(err.code(), Code::ResourceExhausted, "as Triton, streaming: {err}");
    // A malformed protobuf body: a length-delimited field whose length runs past the end.
    let raw = raw_grpc_call(gw.grpc_addr(), &[0x0a, 0xff, 0x01, b'x']).await;
    assert_eq!(raw, "3", "a malformed message is INVALID_ARGUMENT: the client sent it");
    // So is a message the framing cannot read (tonic says INTERNAL).
    let mut cut = frame(0, &[0x0a, 0x01, b'm']);
    cut.truncate(6);
    let unreadable = [
        ("compressed, no coding", frame(1, &[1, 2, 3]), None),
        ("gzip that does not inflate", frame(1, &[1, 2, 3]), Some("gzip")),
        ("a flag neither 0 nor 1", frame(7, &[0x0a, 0x01, b'm']), None),
        ("cut short", cut, None),
    ];
    for (what, bytes, encoding) in unreadable {
        assert_eq!(raw_grpc_frame(gw.grpc_addr(), &bytes, encoding).await, "3", "{what}");
    }
    assert_eq!(
        rt.sim.stats("m").expect("stats").requests,
        0,
        "nothing bad reached the backend"
    );
    // and everyone else is still served, on the same connection
    let ok = c
        .model_infer(with_budget(fp32_request("fine", &[[1.0, 2.0]]), "100"))
        .await
        .expect("served");
    assert_eq!(sums(&ok.into_inner()), vec![3.0]);
    gw.stop().await.expect("stops");
}

/// Sends `payload` as one gRPC message to ModelInfer over h2c and returns `grpc-status`.
async fn raw_grpc_call(addr: std::net::SocketAddr, payload: &[u8]) -> String {
    raw_grpc_frame(addr, &frame(0, payload), None).await
}

/// A gRPC message frame: its compressed flag, length and `payload`.
fn frame(flag: u8, payload: &[u8]) -> Vec<u8> {
    let mut frame = vec![flag];
    frame.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    frame.extend_from_slice(payload);
    frame
}

/// Sends `frame` (whatever its bytes) to ModelInfer over h2c, with `grpc-encoding`
/// when given, and returns `grpc-status`.
async fn raw_grpc_frame(addr: std::net::SocketAddr, frame: &[u8], encoding: Option<&str>) -> String {
    use http_body_util::{BodyExt, Full};
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .http2_only(true)
        .build_http::<Full<Bytes>>();
    let mut request = http::Request::post(format!("http://{addr}/inference.GRPCInferenceService/ModelInfer"))
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    if let Some(encoding) = encoding {
        request = request.header("grpc-encoding", encoding);
    }
    let request = request.body(Full::new(Bytes::copy_from_slice(frame))).expect("request");
    let response = client.request(request).await.expect("exchange");
    let headers = response.headers().clone();
    let collected = response.into_body().collect().await.expect("body");
    let trailers = collected.trailers().cloned().unwrap_or_default();
    let status = trailers.get("grpc-status").or_else(|| headers.get("grpc-status"));
    status.and_then(|v| v.to_str().ok()).unwrap_or("missing").to_owned()
}

#[tokio::test]
async fn answers_are_compressed_only_when_the_settings_and_the_client_both_say_so() {
    use tonic::codec::CompressionEncoding::Gzip;
    let rt = backend(&["m"]).await;
    let policy = route_r(&rt.url(), &rt.url()).flags(&["realtime"]).toml();
    let encoding = |answer: &tonic::Response<pb::ModelInferResponse>| {
        answer
            .metadata()
            .get("grpc-encoding")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    // By default, as Triton: uncompressed, even to a client that accepts gzip, whose own
    // gzip request is read.
    let gw = gateway(&policy).await;
    let mut c = client(gw.grpc_addr())
        .await
        .accept_compressed(Gzip)
        .send_compressed(Gzip);
    let answer = c.model_infer(fp32_request("a", &[[1.0, 2.0]])).await.expect("served");
    assert_eq!(encoding(&answer), None);
    gw.stop().await.expect("stops");

    let mut cfg = config();
    cfg.grpc.answer_compression = tiergate::config::Compression::Gzip;
    let gw = gateway_with(cfg, &policy).await;
    let mut accepts = client(gw.grpc_addr()).await.accept_compressed(Gzip);
    let answer = accepts
        .model_infer(fp32_request("b", &[[1.0, 2.0]]))
        .await
        .expect("served");
    assert_eq!(encoding(&answer).as_deref(), Some("gzip"));
    assert_eq!(answer.into_inner().id, "b");
    let mut plain = client(gw.grpc_addr()).await;
    let answer = plain
        .model_infer(fp32_request("c", &[[1.0, 2.0]]))
        .await
        .expect("served");
    assert_eq!(
        encoding(&answer),
        None,
        "a client that does not accept gzip gets it plain"
    );
    gw.stop().await.expect("stops");
}

#[tokio::test]
async fn every_grpc_answer_carries_a_request_id_and_every_models_statistics_skip_a_failing_route() {
    let rt = backend(&["m"]).await;
    let toml = format!(
        "[routes.r]\nmodels = [\"m\"]\n[routes.r.realtime]\nendpoints = [\"{}\"]\n\
         [routes.gone]\nmodels = [\"gone\"]\n[routes.gone.realtime]\nendpoints = [\"http://{}\"]\n",
        rt.url(),
        dead_addr().await
    );
    let gw = gateway(&toml).await;
    let mut c = client(gw.grpc_addr()).await;
    fn with_id<T>(msg: T) -> tonic::Request<T> {
        let mut request = tonic::Request::new(msg);
        request
            .metadata_mut()
            .insert("x-request-id", "grpc-7".parse().expect("ascii"));
        request
    }
    let id = |metadata: &tonic::metadata::MetadataMap| {
        metadata
            .get("x-request-id")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let live = c.server_live(with_id(pb::ServerLiveRequest {})).await.expect("live");
    assert_eq!(id(live.metadata()).as_deref(), Some("grpc-7"));
    let meta = c
        .model_metadata(with_id(pb::ModelMetadataRequest {
            name: "m".into(),
            version: String::new(),
        }))
        .await
        .expect("metadata");
    assert_eq!(id(meta.metadata()).as_deref(), Some("grpc-7"));
    let refused = c
        .model_metadata(with_id(pb::ModelMetadataRequest {
            name: "gone".into(),
            version: String::new(),
        }))
        .await
        .expect_err("its backend is down");
    assert_eq!(
        id(refused.metadata()).as_deref(),
        Some("grpc-7"),
        "refusals carry it too"
    );
    let index = c
        .repository_index(pb::RepositoryIndexRequest::default())
        .await
        .expect("index");
    assert!(
        id(index.metadata()).is_some_and(|id| id.len() == 32),
        "one is made when none is sent"
    );
    let stats = c
        .model_statistics(with_id(pb::ModelStatisticsRequest::default()))
        .await
        .expect("every model's statistics, though one route's backend is down");
    let scope = stats
        .metadata()
        .get("x-tiergate-statistics")
        .and_then(|v| v.to_str().ok());
    assert_eq!(scope, Some("one-endpoint"), "the answer says what its figures count");
    assert_eq!(
        stats.get_ref().model_stats.len(),
        1,
        "the one model whose backend answers"
    );
}
