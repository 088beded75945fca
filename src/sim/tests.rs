//! The simulator over real sockets: every test binds 127.0.0.1:0, talks HTTP with
//! hyper's client (or raw TCP where a test needs to misbehave), and synchronises on
//! [`Simulator::wait_for`], never on sleeps.
#![allow(clippy::unwrap_used)] // in tests a failed unwrap is a failed test

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::*;
use crate::protocol::{self, Datatype, InferRequest, InferResponse, RequestedOutput, Tensor, HEADER_LEN};

#[derive(Clone)]
pub(super) struct Caller {
    pub(super) client: Client<HttpConnector, Full<Bytes>>,
    pub(super) base: String,
}

pub(super) struct Harness {
    pub(super) sim: Simulator,
    pub(super) addr: SocketAddr,
    pub(super) caller: Caller,
    pub(super) shutdown: CancellationToken,
    pub(super) server: JoinHandle<std::io::Result<()>>,
}

pub(super) struct Answer {
    pub(super) status: StatusCode,
    pub(super) headers: HeaderMap,
    pub(super) body: Bytes,
}

pub(super) async fn start(models: Vec<ModelSpec>) -> Harness {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let sim = Simulator::new(models);
    let shutdown = CancellationToken::new();
    let server = tokio::spawn(sim.clone().listen(listener, shutdown.clone()));
    let client = Client::builder(TokioExecutor::new()).build_http();
    let caller = Caller {
        client,
        base: format!("http://{addr}"),
    };
    Harness {
        sim,
        addr,
        caller,
        shutdown,
        server,
    }
}

pub(super) fn instant(name: &str) -> ModelSpec {
    ModelSpec::new(name, Profile::named("instant").unwrap())
}

impl Harness {
    pub(super) async fn wait_for(&self, model: &str, pred: impl Fn(&Stats) -> bool) {
        let waited = tokio::time::timeout(Duration::from_secs(10), self.sim.wait_for(model, pred)).await;
        waited.expect("stats never reached the expected state");
    }

    pub(super) async fn stop(self) {
        self.shutdown.cancel();
        self.server.await.unwrap().unwrap();
    }
}

impl Caller {
    pub(super) async fn send(&self, method: Method, path: &str, body: Bytes, header_len: Option<usize>) -> Answer {
        let mut req = Request::builder().method(method).uri(format!("{}{path}", self.base));
        if let Some(len) = header_len {
            req = req.header(HEADER_LEN, len);
        }
        let resp = self.client.request(req.body(Full::new(body)).unwrap()).await.unwrap();
        let (parts, body) = resp.into_parts();
        let body = body.collect().await.unwrap().to_bytes();
        Answer {
            status: parts.status,
            headers: parts.headers,
            body,
        }
    }

    pub(super) async fn get(&self, path: &str) -> Answer {
        self.send(Method::GET, path, Bytes::new(), None).await
    }

    pub(super) async fn infer(&self, model: &str, req: &InferRequest, binary: bool) -> Answer {
        let (body, len) = protocol::encode_request(req, binary);
        self.send(Method::POST, &format!("/v2/models/{model}/infer"), body, len)
            .await
    }
}

impl Answer {
    pub(super) fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap()
    }

    pub(super) fn response(&self) -> InferResponse {
        assert_eq!(self.status, StatusCode::OK, "{:?}", self.body);
        protocol::decode_response(&self.body, protocol::header_len(&self.headers).unwrap()).unwrap()
    }

    pub(super) fn content_type(&self) -> &str {
        self.headers[http::header::CONTENT_TYPE].to_str().unwrap()
    }
}

pub(super) fn tensor(name: &str, datatype: Datatype, shape: &[u64], data: Vec<u8>) -> Tensor {
    Tensor {
        name: name.into(),
        datatype,
        shape: shape.to_vec(),
        data: data.into(),
    }
}

pub(super) fn fp32(name: &str, shape: &[u64], values: &[f32]) -> Tensor {
    tensor(
        name,
        Datatype::Fp32,
        shape,
        values.iter().flat_map(|v| v.to_le_bytes()).collect(),
    )
}

pub(super) fn fp64(values: &[f64]) -> Tensor {
    let data = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    tensor("OUTPUT1", Datatype::Fp64, &[values.len() as u64], data)
}

pub(super) fn request(id: &str, inputs: Vec<Tensor>) -> InferRequest {
    InferRequest {
        id: Some(id.into()),
        inputs,
        ..Default::default()
    }
}

pub(super) fn rows_request(id: &str, rows: u64) -> InferRequest {
    let values: Vec<f32> = (0..rows).map(|r| r as f32).collect();
    request(id, vec![fp32("INPUT0", &[rows, 1], &values)])
}

/// Sends an infer request over plain TCP, declaring `content_length` (which may lie).
pub(super) async fn raw_post(addr: SocketAddr, content_length: usize, body: &[u8]) -> TcpStream {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let head = format!("POST /v2/models/m/infer HTTP/1.1\r\nhost: sim\r\ncontent-length: {content_length}\r\n\r\n");
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(body).await.unwrap();
    stream
}

#[tokio::test]
async fn health_metadata_and_route_errors() {
    let h = start(vec![instant("m")]).await;
    let c = &h.caller;
    for path in [
        "/v2/health/live",
        "/v2/health/ready",
        "/v2/models/m/ready",
        "/v2/models/m/versions/1/ready",
    ] {
        assert_eq!(c.get(path).await.status, StatusCode::OK, "{path}");
    }
    let server = c.get("/v2").await.json();
    let version = env!("CARGO_PKG_VERSION");
    assert_eq!(
        server,
        json!({"name": "tiergate-sim", "version": version, "extensions": ["binary_tensor_data"]})
    );
    for path in ["/v2/models/m", "/v2/models/m/versions/1"] {
        let meta = c.get(path).await.json();
        assert_eq!(
            (&meta["name"], &meta["versions"], &meta["platform"]),
            (&json!("m"), &json!(["1"]), &json!("tiergate_sim"))
        );
        assert_eq!(
            meta["outputs"][1],
            json!({"name": "OUTPUT1", "datatype": "FP64", "shape": [-1]})
        );
    }
    let unknown = json!({"error": "Request for unknown model: 'nope' is not found"});
    for (method, path) in [
        (Method::GET, "/v2/models/nope"),
        (Method::GET, "/v2/models/nope/ready"),
        (Method::POST, "/v2/models/nope/infer"),
    ] {
        let answer = c.send(method, path, Bytes::new(), None).await;
        assert_eq!(
            (answer.status, answer.json()),
            (StatusCode::NOT_FOUND, unknown.clone()),
            "{path}"
        );
    }
    let table = [
        (Method::GET, "/v2/models/m/versions/2", StatusCode::NOT_FOUND),
        (Method::GET, "/v3", StatusCode::NOT_FOUND),
        (Method::GET, "/v2/models/m/infer", StatusCode::METHOD_NOT_ALLOWED),
        (Method::POST, "/v2/health/live", StatusCode::METHOD_NOT_ALLOWED),
    ];
    for (method, path, status) in table {
        let answer = c.send(method, path, Bytes::new(), None).await;
        assert_eq!(answer.status, status, "{path}");
        assert!(answer.json()["error"].is_string(), "{path}");
    }
    h.stop().await;
}

#[tokio::test]
async fn json_infer_copies_the_input_and_sums_rows() {
    let h = start(vec![instant("m")]).await;
    let input = fp32("x", &[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.5]);
    let req = request("r7", vec![input.clone(), tensor("y", Datatype::Int8, &[2], vec![1, 2])]);
    let answer = h.caller.infer("m", &req, false).await;
    assert_eq!(answer.content_type(), "application/json");
    assert!(answer.headers.get(HEADER_LEN).is_none());
    let resp = answer.response();
    assert_eq!((resp.model_name.as_str(), resp.id.as_deref()), ("m", Some("r7")));
    let copy = Tensor {
        name: "OUTPUT0".into(),
        ..input
    };
    assert_eq!(resp.outputs, vec![copy, fp64(&[6.0, 15.5])]);
    let stats = h.sim.stats("m").unwrap();
    assert_eq!(
        (
            stats.requests,
            stats.batches,
            stats.rows,
            stats.in_flight,
            stats.max_in_flight
        ),
        (1, 1, 2, 0, 1)
    );
    assert_eq!(stats.batch_sizes, BTreeMap::from([(2, 1)]));
    assert_eq!((stats.cancelled, stats.errors), (0, 0));
    assert_eq!(stats.last_request, protocol::encode_request(&req, false).0);
    assert!(h.sim.stats("nope").is_none());
    h.stop().await;
}

#[tokio::test]
async fn binary_infer_answers_binary_when_asked() {
    let h = start(vec![instant("m")]).await;
    let input = fp32("x", &[3], &[1.0, -2.0, 0.25]);
    let mut req = request("b", vec![input.clone()]);
    req.parameters.insert("binary_data_output".into(), true.into());
    let answer = h.caller.infer("m", &req, true).await;
    assert_eq!(answer.content_type(), "application/octet-stream");
    let len: usize = answer.headers[HEADER_LEN].to_str().unwrap().parse().unwrap();
    let header: Value = serde_json::from_slice(&answer.body[..len]).unwrap();
    assert_eq!(header["outputs"][1]["parameters"], json!({"binary_data_size": 24}));
    let resp = answer.response();
    assert_eq!(
        resp.outputs,
        vec![
            Tensor {
                name: "OUTPUT0".into(),
                ..input
            },
            fp64(&[1.0, -2.0, 0.25])
        ]
    );
    h.stop().await;
}

#[tokio::test]
async fn bytes_and_bool_rows_are_summed_by_length_and_truth() {
    let h = start(vec![instant("m")]).await;
    let strings: Vec<u8> = ["a", "bcd", "", "ef"]
        .iter()
        .flat_map(|s| [&(s.len() as u32).to_le_bytes()[..], s.as_bytes()].concat())
        .collect();
    let table = [
        (tensor("s", Datatype::Bytes, &[2, 2], strings), [4.0, 2.0]),
        (tensor("b", Datatype::Bool, &[2, 2], vec![1, 0, 1, 1]), [1.0, 2.0]),
        (
            tensor("h", Datatype::Fp16, &[2, 1], vec![0x00, 0x3c, 0x00, 0xc0]),
            [1.0, -2.0],
        ),
    ];
    for (input, sums) in table {
        let resp = h
            .caller
            .infer("m", &request("x", vec![input.clone()]), false)
            .await
            .response();
        assert_eq!(
            resp.outputs,
            vec![
                Tensor {
                    name: "OUTPUT0".into(),
                    ..input
                },
                fp64(&sums)
            ]
        );
    }
    h.stop().await;
}

#[tokio::test]
async fn requested_outputs_choose_outputs_and_their_encoding() {
    let h = start(vec![instant("m")]).await;
    let out = |name: &str, binary_data| RequestedOutput {
        name: name.into(),
        binary_data,
        parameters: Default::default(),
    };
    let mut req = rows_request("o", 2);
    req.outputs = vec![out("OUTPUT1", Some(true))];
    let answer = h.caller.infer("m", &req, false).await;
    assert!(answer.headers.contains_key(HEADER_LEN));
    assert_eq!(answer.response().outputs, vec![fp64(&[0.0, 1.0])]);

    req.outputs = vec![out("OUTPUT0", None)];
    req.parameters.insert("binary_data_output".into(), true.into());
    let answer = h.caller.infer("m", &req, false).await;
    assert!(answer.headers.contains_key(HEADER_LEN));
    assert_eq!(answer.response().outputs[0].name, "OUTPUT0");

    req.outputs = vec![out("OUTPUT0", Some(false))];
    let answer = h.caller.infer("m", &req, false).await;
    assert_eq!(answer.content_type(), "application/json");

    req.outputs = vec![out("OUTPUT9", None)];
    let answer = h.caller.infer("m", &req, false).await;
    assert_eq!(answer.status, StatusCode::BAD_REQUEST);
    let want = "outputs[0].name 'OUTPUT9' is not an output of model 'm' (OUTPUT0, OUTPUT1)";
    assert_eq!(answer.json(), json!({ "error": want }));
    h.stop().await;
}

#[tokio::test]
async fn bad_bodies_are_refused_with_the_protocol_message() {
    let h = start(vec![instant("m")]).await;
    let path = "/v2/models/m/infer";
    let disagree = request(
        "d",
        vec![fp32("a", &[2], &[1.0, 2.0]), fp32("b", &[3], &[1.0, 2.0, 3.0])],
    );
    let (disagree, _) = protocol::encode_request(&disagree, false);
    let (scalar, _) = protocol::encode_request(&request("s", vec![fp32("a", &[], &[1.0])]), false);
    let table = [
        (
            Bytes::from_static(b"[x"),
            None,
            "request body is not JSON: expected value at line 1 column 2",
        ),
        (
            Bytes::from_static(b"{}"),
            Some(9),
            "inference-header-content-length 9 is larger than the body (2 bytes)",
        ),
        (
            disagree,
            None,
            "inputs[1].shape[0] is 3 but inputs[0].shape[0] is 2; all inputs must share the batch dimension",
        ),
        (
            scalar,
            None,
            "inputs[0] has rank 0; the simulator needs a batch dimension",
        ),
    ];
    for (body, len, want) in table {
        let answer = h.caller.send(Method::POST, path, body, len).await;
        assert_eq!(
            (answer.status, answer.json()),
            (StatusCode::BAD_REQUEST, json!({ "error": want })),
            "{want}"
        );
    }
    let stats = h.sim.stats("m").unwrap();
    assert_eq!((stats.requests, stats.batches, stats.in_flight), (4, 0, 0));
    h.stop().await;
}

#[tokio::test]
async fn h2c_clients_are_served() {
    let h = start(vec![instant("m")]).await;
    let client = Client::builder(TokioExecutor::new()).http2_only(true).build_http();
    let caller = Caller {
        client,
        ..h.caller.clone()
    };
    assert_eq!(caller.get("/v2").await.json()["name"], "tiergate-sim");
    let resp = caller.infer("m", &rows_request("h2", 2), true).await.response();
    assert_eq!(resp.outputs[1], fp64(&[0.0, 1.0]));
    h.stop().await;
}

#[tokio::test]
async fn oversized_bodies_get_413_and_shutdown_stops_accepting() {
    let h = start(vec![instant("m")]).await;
    let mut stream = raw_post(h.addr, 100_000_000, b"").await;
    let mut head = [0u8; 12];
    stream.read_exact(&mut head).await.unwrap();
    assert_eq!(&head, b"HTTP/1.1 413");
    let addr = h.addr;
    h.stop().await;
    assert!(
        TcpStream::connect(addr).await.is_err(),
        "the listener is closed after serve returns"
    );
}

#[tokio::test]
async fn a_combined_model_answers_per_head_and_says_so() {
    let mut heads = instant("heads");
    heads.heads = vec!["ctr".into(), "cvr".into()];
    let h = start(vec![heads]).await;
    let c = &h.caller;
    let body = json!({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [2, 2], "data": [1, 2, 3, 4]}]});
    let all = c
        .send(
            Method::POST,
            "/v2/models/heads/infer",
            Bytes::from(body.to_string()),
            None,
        )
        .await
        .json();
    let names: Vec<&str> = all["outputs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["ctr_OUTPUT0", "ctr_OUTPUT1", "cvr_OUTPUT0", "cvr_OUTPUT1"]);
    assert_eq!(all["outputs"][1]["data"], json!([4.0, 8.0]), "each row's sum plus 1");
    assert_eq!(all["outputs"][3]["data"], json!([5.0, 9.0]), "each row's sum plus 2");
    assert_eq!(
        all["outputs"][2]["data"],
        json!([1.0, 2.0, 3.0, 4.0]),
        "the first input"
    );
    let mut one = body.clone();
    one["outputs"] = json!([{"name": "OUTPUT1"}]);
    let refused = c
        .send(
            Method::POST,
            "/v2/models/heads/infer",
            Bytes::from(one.to_string()),
            None,
        )
        .await;
    assert_eq!(
        refused.status,
        StatusCode::BAD_REQUEST,
        "a plain output name is not a head's"
    );
    let meta = c.get("/v2/models/heads").await.json();
    assert_eq!(
        meta["outputs"][3],
        json!({"name": "cvr_OUTPUT1", "datatype": "FP64", "shape": [-1]})
    );
    h.stop().await;
}

#[tokio::test]
async fn faults_set_from_outside_answer_503_and_slow_every_batch() {
    let five_ms = ModelSpec::new(
        "m",
        Profile {
            a: Duration::from_millis(5),
            ..Profile::default()
        },
    );
    let h = start(vec![five_ms]).await;
    let set = |body: &'static str| h.caller.send(Method::POST, "/sim/faults", Bytes::from(body), None);
    let on = set(r#"{"unavailable": true}"#).await;
    assert_eq!(
        (on.status, on.json()),
        (
            StatusCode::OK,
            json!({"unavailable": true, "slow": 1, "max_body_bytes": 0, "stall_after_tokens": 0, "malformed_after_tokens": 0})
        )
    );
    let refused = h.caller.infer("m", &rows_request("a", 1), false).await;
    assert_eq!(refused.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(h.sim.stats("m").unwrap().requests, 0, "refused before the queue");

    let slow = set(r#"{"unavailable": false, "slow": 10}"#).await;
    assert_eq!(
        slow.json(),
        json!({"unavailable": false, "slow": 10, "max_body_bytes": 0, "stall_after_tokens": 0, "malformed_after_tokens": 0})
    );
    let started = std::time::Instant::now();
    h.caller.infer("m", &rows_request("b", 1), false).await.response();
    assert!(started.elapsed() >= Duration::from_millis(50), "10 times its 5 ms");

    let limited =
        set(r#"{"slow": 1, "max_body_bytes": 64, "stall_after_tokens": 0, "malformed_after_tokens": 0}"#).await;
    assert_eq!(
        limited.json(),
        json!({"unavailable": false, "slow": 1, "max_body_bytes": 64, "stall_after_tokens": 0, "malformed_after_tokens": 0})
    );
    let refused = h.caller.infer("m", &rows_request("c", 4), false).await;
    assert_eq!(
        refused.status,
        StatusCode::PAYLOAD_TOO_LARGE,
        "a body over the input limit"
    );
    assert_eq!(set(r#"{"slow": "x"}"#).await.status, StatusCode::BAD_REQUEST);
    assert_eq!(set(r#"{"other": 1}"#).await.status, StatusCode::BAD_REQUEST);
    let get = h.caller.get("/sim/faults").await;
    assert_eq!(get.status, StatusCode::METHOD_NOT_ALLOWED);
    h.stop().await;
}
