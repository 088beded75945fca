//! Backends that speak gRPC (`grpc://` endpoints): every client sees the same answers,
//! byte for byte, whichever protocol the backend speaks.

use crate::common;

use bytes::Bytes;
use common::*;
use tiergate::protocol::grpc::pb;
use tiergate::protocol::grpc::pb::grpc_inference_service_client::GrpcInferenceServiceClient;
use tonic::Code;

fn policy(endpoint: &str) -> String {
    format!("[routes.r]\nmodels = [\"m\"]\n[routes.r.realtime]\nendpoints = [\"{endpoint}\"]\nmax_concurrency = 8\n")
}

/// One KServe v2 HTTP request per datatype, JSON where JSON can carry it, and binary.
fn requests() -> Vec<(String, Bytes, Option<usize>)> {
    let json = [
        ("BOOL", "[true,false,true,true]"),
        ("UINT8", "[0,255,1,2]"),
        ("UINT16", "[0,65535,1,2]"),
        ("UINT32", "[0,4294967295,1,2]"),
        ("UINT64", "[0,18446744073709551615,1,2]"),
        ("INT8", "[-128,127,1,2]"),
        ("INT16", "[-32768,32767,1,2]"),
        ("INT32", "[-2147483648,2147483647,1,2]"),
        ("INT64", "[-9223372036854775808,9223372036854775807,1,2]"),
        ("FP32", "[1.5,-0.0,3.4028235e38,1e-45]"),
        ("FP64", "[0.1,-2.5,1.7976931348623157e308,5e-324]"),
        ("BYTES", r#"["a","","héllo","\u0000x"]"#),
    ];
    let mut out = Vec::new();
    for (datatype, data) in json {
        for binary in ["false", "true"] {
            let body = format!(
                r#"{{"id":"{datatype}","inputs":[{{"name":"INPUT0","datatype":"{datatype}","shape":[2,2],"data":{data}}}],"parameters":{{"binary_data_output":{binary}}}}}"#
            );
            out.push((
                format!("{datatype} json, binary output {binary}"),
                Bytes::from(body),
                None,
            ));
        }
    }
    // FP16 only travels binary: a header and 8 raw bytes.
    let header = r#"{"id":"h","inputs":[{"name":"INPUT0","datatype":"FP16","shape":[2,2],"parameters":{"binary_data_size":8}}],"outputs":[{"name":"OUTPUT0","parameters":{"binary_data":true}},{"name":"OUTPUT1"}]}"#;
    let mut body = header.as_bytes().to_vec();
    body.extend_from_slice(&[0x00, 0x3c, 0x00, 0xc0, 0x00, 0x7c, 0x01, 0x00]);
    out.push(("FP16 binary".into(), Bytes::from(body), Some(header.len())));
    out
}

async fn post(addr: std::net::SocketAddr, body: &Bytes, header_len: Option<usize>) -> Answer {
    let len = header_len.map(|n| n.to_string());
    let mut headers = vec![
        ("content-type", "application/octet-stream"),
        ("x-tiergate-budget-ms", "250"),
    ];
    if let Some(len) = &len {
        headers.push(("inference-header-content-length", len.as_str()));
    }
    send("POST", addr, "/v2/models/m/infer", &headers, body.clone()).await
}

#[tokio::test]
async fn http_clients_get_the_same_bytes_from_grpc_and_http_backends_for_every_datatype() {
    let rt = backend(&["m"]).await;
    let via_http = gateway(&policy(&rt.url())).await;
    let via_grpc = gateway(&policy(&rt.grpc_url())).await;
    for (what, body, header_len) in requests() {
        let a = post(via_http.http_addr(), &body, header_len).await;
        let b = post(via_grpc.http_addr(), &body, header_len).await;
        assert_eq!(a.status, 200, "{what}: {}", a.text());
        assert_eq!((b.status, &b.body), (a.status, &a.body), "{what}: {}", b.text());
        assert_eq!(
            b.header("inference-header-content-length"),
            a.header("inference-header-content-length"),
            "{what}"
        );
    }
    via_http.stop().await.expect("stops");
    via_grpc.stop().await.expect("stops");
}

#[tokio::test]
async fn grpc_clients_and_metadata_through_a_grpc_backend() {
    let rt = backend(&["m"]).await;
    let gw = gateway(&policy(&rt.grpc_url())).await;
    let mut c = GrpcInferenceServiceClient::connect(format!("http://{}", gw.grpc_addr()))
        .await
        .expect("connects");
    let msg = pb::ModelInferRequest {
        model_name: "m".into(),
        id: "x".into(),
        inputs: vec![common::grpc::input(
            "INT64",
            vec![2, 1],
            Some(pb::InferTensorContents {
                int64_contents: vec![i64::MIN, 5],
                ..Default::default()
            }),
        )],
        ..Default::default()
    };
    let out = c.model_infer(msg).await.expect("served").into_inner();
    let echoed: Vec<i64> = out.raw_output_contents[0]
        .chunks_exact(8)
        .map(|b| i64::from_le_bytes(b.try_into().expect("8")))
        .collect();
    assert_eq!(echoed, vec![i64::MIN, 5]);
    // model metadata and readiness come from the gRPC backend, for both doors
    let meta = c
        .model_metadata(pb::ModelMetadataRequest {
            name: "m".into(),
            version: String::new(),
        })
        .await
        .expect("meta");
    assert_eq!(meta.into_inner().platform, "tiergate_sim");
    assert_eq!(
        get(gw.http_addr(), "/v2/models/m").await.json()["platform"],
        "tiergate_sim"
    );
    assert_eq!(get(gw.http_addr(), "/v2/models/m/ready").await.status, 200);
    // model config and statistics pass through to the gRPC door, byte for byte
    let config = c
        .model_config(pb::ModelConfigRequest {
            name: "m".into(),
            version: String::new(),
        })
        .await
        .expect("config");
    let mut direct = common::grpc::client(rt.grpc).await;
    let expected = direct
        .model_config(pb::ModelConfigRequest {
            name: "m".into(),
            version: String::new(),
        })
        .await
        .expect("config");
    assert_eq!(config.into_inner().config, expected.into_inner().config);
    let stats = c
        .model_statistics(pb::ModelStatisticsRequest {
            name: "m".into(),
            version: String::new(),
        })
        .await
        .expect("stats");
    assert_eq!(stats.into_inner().model_stats.len(), 1);
    // No name: every model's, as Triton (here the one model the policy names).
    let all = c
        .model_statistics(pb::ModelStatisticsRequest::default())
        .await
        .expect("all models' statistics");
    assert_eq!(all.into_inner().model_stats.len(), 1);
    // The HTTP door converts them to Triton's JSON: as the backend's own HTTP side answers.
    let config = get(gw.http_addr(), "/v2/models/m/config").await;
    assert_eq!(config.status, 200, "{}", config.text());
    let direct = get(rt.addr, "/v2/models/m/config").await.json();
    let converted = config.json();
    assert!(json_includes(&converted, &direct), "{converted} holds {direct}");
    assert_eq!(
        converted["output"][0]["is_shape_tensor"], false,
        "with Triton's defaults"
    );
    let stats = get(gw.http_addr(), "/v2/models/m/stats").await;
    assert_eq!(stats.status, 200, "{}", stats.text());
    let stats = stats.json();
    assert_eq!(stats["model_stats"][0]["name"], "m");
    assert!(stats["model_stats"][0]["inference_count"].as_u64().expect("a number") >= 1);
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
async fn backend_errors_and_deadlines_cross_the_protocols() {
    let rt = backend(&["m"]).await;
    let gw = gateway(&policy(&rt.grpc_url())).await;
    // the gRPC backend's own INVALID_ARGUMENT reaches an HTTP client as a 400 with its message
    let bad = r#"{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[2,1],"data":[1,2]},{"name":"B","datatype":"FP32","shape":[3,1],"data":[1,2,3]}]}"#;
    let a = infer(gw.http_addr(), "m", &[("x-tiergate-budget-ms", "250")], bad).await;
    assert_eq!(a.status, 400, "{}", a.text());
    // a deadline that passes drops the gRPC call, and the backend sees it cancelled
    rt.sim.hold();
    let a = infer(gw.http_addr(), "m", &[("x-tiergate-budget-ms", "100")], BODY).await;
    assert_eq!(a.status, 504, "{}", a.text());
    wait_for(&rt, |s| s.cancelled == 1).await;
    rt.sim.release();
    gw.stop().await.expect("stops");

    let dead = format!("grpc://{}", dead_addr().await);
    let gw = gateway(&policy(&dead)).await;
    let a = infer(gw.http_addr(), "m", &[("x-tiergate-budget-ms", "250")], BODY).await;
    assert_eq!(a.status, 502, "{}", a.text());
    assert!(a.text().contains("is unreachable"), "{}", a.text());
    gw.stop().await.expect("stops");
}

#[tokio::test]
async fn the_simulator_streams_over_grpc() {
    let rt = backend(&["m"]).await;
    let mut c = common::grpc::client(rt.grpc).await;
    let request = |id: &str, datatype: &str| pb::ModelInferRequest {
        model_name: "m".into(),
        id: id.into(),
        inputs: vec![common::grpc::input(
            datatype,
            vec![1, 1],
            Some(pb::InferTensorContents {
                fp32_contents: vec![2.5],
                ..Default::default()
            }),
        )],
        ..Default::default()
    };
    let requests = vec![request("a", "FP32"), request("b", "INT8"), request("c", "FP32")];
    let mut stream = c
        .model_stream_infer(tokio_stream::iter(requests))
        .await
        .expect("stream")
        .into_inner();
    let mut got = Vec::new();
    while let Some(item) = stream.message().await.expect("item") {
        got.push((item.infer_response.expect("response").id, item.error_message.is_empty()));
    }
    assert_eq!(
        got,
        [("a".to_owned(), true), ("b".to_owned(), false), ("c".to_owned(), true)]
    );
    assert_eq!(
        rt.sim.stats("m").expect("stats").batches,
        2,
        "the two valid requests ran"
    );
}
