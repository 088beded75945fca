//! Test support: simulated backends and gateways on 127.0.0.1:0, and a small client.
#![allow(dead_code)]

pub mod grpc;
#[cfg(feature = "kafka")]
pub mod kafka;
pub mod ports;
pub mod redis;
pub mod route;
pub mod served;

#[allow(unused_imports)] // each test binary uses a part
pub use ports::{peer_port, sim_process};
#[allow(unused_imports)]
pub use route::Route;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tiergate::app::Gateway;
use tiergate::config::Config;
use tiergate::policy::Policy;
use tiergate::sim::{ModelSpec, Profile, Simulator};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// A simulated model server on a free port, stopped on drop.
pub struct Backend {
    pub sim: Simulator,
    /// Its KServe v2 HTTP address.
    pub addr: SocketAddr,
    /// Its KServe v2 gRPC address.
    pub grpc: SocketAddr,
    shutdown: CancellationToken,
}

impl Drop for Backend {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

impl Backend {
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
    pub fn grpc_url(&self) -> String {
        format!("grpc://{}", self.grpc)
    }
}

/// A backend serving `models` (each `name` with the zero-cost "instant" profile).
pub async fn backend(models: &[&str]) -> Backend {
    let specs = models
        .iter()
        .map(|m| ModelSpec::new(m, Profile::named("instant").expect("profile")))
        .collect();
    backend_with(specs).await
}

pub async fn backend_with(specs: Vec<ModelSpec>) -> Backend {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let grpc_listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let (addr, grpc) = (
        listener.local_addr().expect("addr"),
        grpc_listener.local_addr().expect("addr"),
    );
    let sim = Simulator::new(specs);
    let shutdown = CancellationToken::new();
    tokio::spawn(sim.clone().listen(listener, shutdown.clone()));
    tokio::spawn(sim.clone().listen_grpc(grpc_listener, shutdown.clone()));
    Backend {
        sim,
        addr,
        grpc,
        shutdown,
    }
}

/// An address nothing listens on, and nothing else in this test process can take: a
/// socket stays bound to it (never listening, so connecting is refused) until the
/// process ends. A port merely freed could be handed to another test's listener, which
/// would then answer for the "dead" backend.
pub async fn dead_addr() -> SocketAddr {
    static HELD: std::sync::Mutex<Vec<tokio::net::TcpSocket>> = std::sync::Mutex::new(Vec::new());
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket.bind("127.0.0.1:0".parse().expect("addr")).expect("bind");
    let addr = socket.local_addr().expect("addr");
    HELD.lock().expect("not poisoned").push(socket);
    addr
}

pub fn config() -> Config {
    static GATEWAYS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = GATEWAYS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    // Each gateway owns its offline store (the file is locked exclusively).
    let data_dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("gw-{}-{n}", std::process::id()));
    let mut config = Config {
        data_dir,
        ..Config::default()
    };
    let _ = std::fs::remove_dir_all(&config.data_dir);
    config.listen.http = "127.0.0.1:0".parse().expect("addr");
    config.listen.grpc = "127.0.0.1:0".parse().expect("addr");
    config.listen.metrics = "127.0.0.1:0".parse().expect("addr");
    config
}

pub fn policy(toml: &str) -> Policy {
    Policy::from_texts(vec![(PathBuf::from("test.toml"), toml.to_owned())])
        .unwrap_or_else(|p| panic!("test policy is invalid:\n{p}"))
}

pub async fn gateway(toml: &str) -> Gateway {
    gateway_with(config(), toml).await
}

pub async fn gateway_with(config: Config, toml: &str) -> Gateway {
    Gateway::start(&config, policy(toml)).await.expect("gateway starts")
}

/// One finished exchange.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub headers: http::HeaderMap,
    pub body: Bytes,
}

impl Answer {
    /// A whole response, its body read.
    pub async fn read<B: hyper::body::Body>(response: http::Response<B>) -> Answer
    where
        B::Error: std::fmt::Debug,
    {
        let (head, body) = response.into_parts();
        let body = body.collect().await.expect("body").to_bytes();
        Answer {
            status: head.status.as_u16(),
            headers: head.headers,
            body,
        }
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text()))
    }
    pub fn tier(&self) -> (Option<&str>, Option<&str>) {
        (self.header("x-tiergate-tier"), self.header("x-tiergate-reason"))
    }
    /// The parts of its `Server-Timing`, checked to add up (see [`timing_parts`]).
    pub fn timing(&self) -> Vec<(String, f64)> {
        timing_parts(self.header("server-timing").expect("every answer has Server-Timing"))
    }
}

/// The parts of a `Server-Timing` value (`name;dur=ms, ...`) in order, in milliseconds;
/// fails unless it ends with `total` and, when it has more parts, they add up to the
/// total within 1 ms.
pub fn timing_parts(value: &str) -> Vec<(String, f64)> {
    let parts: Vec<(String, f64)> = value
        .split(',')
        .map(|part| {
            let (name, dur) = part.trim().split_once(";dur=").unwrap_or_else(|| panic!("{value}"));
            (name.to_owned(), dur.parse().unwrap_or_else(|_| panic!("{value}")))
        })
        .collect();
    let (last, total) = parts.last().cloned().unwrap_or_else(|| panic!("{value}"));
    assert_eq!(last, "total", "{value}");
    if parts.len() > 1 {
        let sum: f64 = parts[..parts.len() - 1].iter().map(|(_, d)| d).sum();
        assert!((sum - total).abs() <= 1.0, "the parts add up to the total: {value}");
    }
    parts
}

/// `n` sequences of one step each (`sequence_start` and `sequence_end`, ids 1 to `n`)
/// to model `m`, one after another, each with `budget` ms: their statuses.
pub async fn one_step_sequences(gw: &tiergate::app::Gateway, n: u64, budget: &str) -> Vec<u16> {
    let mut statuses = Vec::new();
    for id in 1..=n {
        let body = serde_json::json!({"id": format!("s{id}"),
            "parameters": {"sequence_id": id, "sequence_start": true, "sequence_end": true},
            "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 1], "data": [id]}]});
        let r = infer(
            gw.http_addr(),
            "m",
            &[("x-tiergate-budget-ms", budget)],
            &body.to_string(),
        )
        .await;
        statuses.push(r.status);
    }
    statuses
}

/// The names of `parts`, in order.
pub fn part_names(parts: &[(String, f64)]) -> Vec<&str> {
    parts.iter().map(|(name, _)| name.as_str()).collect()
}

/// The duration of part `name` in `parts`, in milliseconds.
pub fn part(parts: &[(String, f64)], name: &str) -> f64 {
    parts
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, d)| *d)
        .unwrap_or_else(|| panic!("no {name} in {parts:?}"))
}

pub fn client() -> Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).build_http()
}

pub async fn send(
    method: &str,
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
    body: impl Into<Bytes>,
) -> Answer {
    let mut builder = http::Request::builder()
        .method(method)
        .uri(format!("http://{addr}{path}"));
    for (k, v) in headers {
        builder = builder.header(*k, *v);
    }
    let request = builder.body(Full::new(body.into())).expect("request");
    let response = tokio::time::timeout(Duration::from_secs(30), client().request(request))
        .await
        .expect("answered within 30 s")
        .expect("exchange");
    Answer::read(response).await
}

/// One exchange with a door or the admin API without a socket: `answer` is
/// `Door::answer` or `Admin::answer` (they take any request body), as axum's tests call
/// a router with `oneshot`.
pub async fn oneshot<F, Fut, R>(
    answer: F,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: impl Into<Bytes>,
) -> Answer
where
    F: FnOnce(http::Request<Full<Bytes>>) -> Fut,
    Fut: std::future::Future<Output = http::Response<R>>,
    R: hyper::body::Body,
    R::Error: std::fmt::Debug,
{
    let mut builder = http::Request::builder().method(method).uri(path);
    for (k, v) in headers {
        builder = builder.header(*k, *v);
    }
    let response = answer(builder.body(Full::new(body.into())).expect("request")).await;
    Answer::read(response).await
}

/// Polls `f` every 20 ms until it gives `Some`, failing the test with `what` after
/// `limit`: the one wait for a state only polling can see (a process the test started,
/// a metric, an answer that changes). Never a sleep standing in for an event.
pub async fn eventually<T, F, Fut>(limit: Duration, what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let end = tokio::time::Instant::now() + limit;
    loop {
        if let Some(value) = f().await {
            return value;
        }
        assert!(tokio::time::Instant::now() < end, "{what} within {limit:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Uploads `content` as a Batch API input file (`POST /v1/files`), with `headers`.
pub async fn upload_file(addr: SocketAddr, content: &str, headers: &[(&str, &str)]) -> Answer {
    let boundary = "tiergate-test-boundary";
    let body = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n\
         --{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"in.jsonl\"\r\n\
         Content-Type: application/jsonl\r\n\r\n{content}\r\n--{boundary}--\r\n"
    );
    let content_type = format!("multipart/form-data; boundary={boundary}");
    let mut all = vec![("content-type", content_type.as_str())];
    all.extend_from_slice(headers);
    send("POST", addr, "/v1/files", &all, body).await
}

/// `n` Batch API lines for `model`'s KServe v2 infer, line `i` one row `[i, i]`
/// (`custom_id` `c{i}`).
pub fn batch_lines(model: &str, n: usize) -> String {
    (0..n)
        .map(|i| {
            serde_json::json!({"custom_id": format!("c{i}"), "method": "POST", "url": format!("/v2/models/{model}/infer"),
                   "body": {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 2], "data": [i, i]}]}})
            .to_string()
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Makes a batch of the uploaded `file` for `model`'s infer (`POST /v1/batches`, a 24 h
/// window) with `headers`, asserting it was made; its id.
pub async fn create_batch(addr: SocketAddr, file: &serde_json::Value, model: &str, headers: &[(&str, &str)]) -> String {
    let create = serde_json::json!({"input_file_id": file, "endpoint": format!("/v2/models/{model}/infer"),
                                    "completion_window": "24h"});
    let mut all = vec![("content-type", "application/json")];
    all.extend_from_slice(headers);
    let made = send("POST", addr, "/v1/batches", &all, create.to_string()).await;
    assert_eq!(made.status, 200, "{}", made.text());
    made.json()["id"].as_str().expect("id").to_owned()
}

/// Runs `lines` as a batch of chat calls (`/v1/chat/completions`, a 24 h window) and
/// waits up to 30 s for it to complete; the batch object.
pub async fn chat_batch_completed(addr: SocketAddr, lines: &[String]) -> serde_json::Value {
    let file = upload_file(addr, &lines.join("\n"), &[]).await;
    assert_eq!(file.status, 200, "{}", file.text());
    let create = serde_json::json!({"input_file_id": file.json()["id"], "endpoint": "/v1/chat/completions",
                                    "completion_window": "24h"});
    let made = send(
        "POST",
        addr,
        "/v1/batches",
        &[("content-type", "application/json")],
        create.to_string(),
    )
    .await;
    assert_eq!(made.status, 200, "{}", made.text());
    let id = made.json()["id"].as_str().expect("id").to_owned();
    eventually(Duration::from_secs(30), "the batch completes", || async {
        let batch = get(addr, &format!("/v1/batches/{id}")).await.json();
        (batch["status"] == "completed").then_some(batch)
    })
    .await
}

pub async fn get(addr: SocketAddr, path: &str) -> Answer {
    send("GET", addr, path, &[], Bytes::new()).await
}

pub async fn infer(addr: SocketAddr, model: &str, headers: &[(&str, &str)], body: &str) -> Answer {
    let mut all = vec![("content-type", "application/json")];
    all.extend_from_slice(headers);
    send(
        "POST",
        addr,
        &format!("/v2/models/{model}/infer"),
        &all,
        body.to_owned(),
    )
    .await
}

/// Two rows of four FP32 values.
pub const BODY: &str =
    r#"{"id":"req-1","inputs":[{"name":"INPUT0","datatype":"FP32","shape":[2,4],"data":[1,2,3,4,5,6,7,8]}]}"#;

/// A one-route policy for model `m` with every tier's flag as given, the real-time
/// pool on `realtime` and the batch pool on `batch`.
pub fn route(realtime: &str, batch: &str, flags: &str, extra: &str) -> String {
    format!(
        r#"
[routes.r]
models = ["m"]
{extra}
[routes.r.flags]
{flags}
[routes.r.realtime]
endpoints = ["{realtime}"]
max_concurrency = 4
[routes.r.micro_batch]
endpoints = ["{batch}"]
"#
    )
}

/// Route `r` for model `m` with its real-time pool on `realtime` (at most 4 calls at
/// once) and its batch pool on `batch`: the usual start of a test's policy.
pub fn route_r(realtime: &str, batch: &str) -> Route {
    Route::new("r")
        .model("m")
        .realtime(realtime)
        .set("realtime.max_concurrency", 4)
        .batch(batch)
}

/// Waits for `pred` on model `m`'s stats, failing the test after 10 s instead of hanging.
pub async fn wait_for(backend: &Backend, pred: impl Fn(&tiergate::sim::Stats) -> bool) {
    tokio::time::timeout(Duration::from_secs(10), backend.sim.wait_for("m", pred))
        .await
        .expect("the backend reached the expected state within 10 s");
}

/// The Python interpreter of conformance environment `name` (see
/// tests/conformance/venv.sh), created from PyPI on first use.
pub fn python(name: &str) -> std::path::PathBuf {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = std::process::Command::new(root.join("tests/conformance/venv.sh"))
        .arg(name)
        .output()
        .expect("venv.sh runs");
    assert!(
        out.status.success(),
        "cannot prepare the Python environment {name}:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::path::PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()).join("bin/python")
}

/// Waits until `GET http://127.0.0.1:{port}{path}` answers 200, for a process the test
/// started; fails after `limit`. Polling is the only readiness signal such a process gives.
pub async fn wait_ready(port: u16, path: &str, limit: Duration) {
    let started = std::time::Instant::now();
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    loop {
        let request = http::Request::get(format!("http://{addr}{path}"))
            .body(Full::new(Bytes::new()))
            .expect("request");
        if let Ok(Ok(r)) = tokio::time::timeout(Duration::from_secs(1), client().request(request)).await {
            if r.status() == 200 {
                return;
            }
        }
        assert!(
            started.elapsed() < limit,
            "127.0.0.1:{port}{path} was not ready within {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Runs a conformance script (`tests/conformance/SCRIPT`) with `python` and `args`, and
/// fails the test with its report, and with the peer's `log` file, when it fails.
pub async fn run_conformance(python: std::path::PathBuf, script: &str, args: Vec<String>, log: &std::path::Path) {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/conformance")
        .join(script);
    let out = tokio::task::spawn_blocking(move || std::process::Command::new(python).arg(script).args(args).output())
        .await
        .expect("joins")
        .expect("python runs");
    let report = String::from_utf8_lossy(&out.stderr);
    println!("{report}");
    let peer_log = std::fs::read_to_string(log).unwrap_or_default();
    assert!(
        out.status.success(),
        "conformance failed:\n{report}\npeer log:\n{peer_log}"
    );
}

/// A gateway serving the policy in `dir`, with the admin API on (bearer `token`); its
/// settings beside it.
pub async fn admin_gateway(dir: &std::path::Path, token: &str) -> (Gateway, Config) {
    let mut config = config();
    config.policy_dir = dir.to_owned();
    config.listen.admin = "127.0.0.1:0".parse().expect("addr");
    config.admin.token = Some(tiergate::config::Secret(token.into()));
    let policy = Policy::load_dir(dir).expect("valid");
    let gw = Gateway::start(&config, policy).await.expect("starts");
    (gw, config)
}

/// One admin API call on `gw`, without a socket (`Admin::answer`), with `token` as the
/// bearer token and `headers` beside it.
pub async fn admin_call(
    gw: &Gateway,
    token: &str,
    (method, path): (&str, &str),
    headers: &[(&str, &str)],
    body: &str,
) -> Answer {
    let auth = format!("Bearer {token}");
    let mut all = vec![("authorization", auth.as_str())];
    all.extend_from_slice(headers);
    let api = gw.admin_api().expect("the admin API is on").clone();
    oneshot(
        |r| async move { api.answer(r).await },
        method,
        path,
        &all,
        body.to_owned(),
    )
    .await
}

/// Whether `whole` holds every value of `part` (objects may have more keys, as a
/// converted model config has the defaults Triton writes; arrays match element-wise).
pub fn json_includes(whole: &serde_json::Value, part: &serde_json::Value) -> bool {
    use serde_json::Value;
    match (whole, part) {
        (Value::Object(w), Value::Object(p)) => p.iter().all(|(k, v)| w.get(k).is_some_and(|x| json_includes(x, v))),
        (Value::Array(w), Value::Array(p)) => w.len() == p.len() && w.iter().zip(p).all(|(x, v)| json_includes(x, v)),
        _ => whole == part,
    }
}

/// The (HTTP, gRPC) addresses a conformance script compares: the peer's, then each gateway's.
pub fn addresses(peer_http: u16, peer_grpc: u16, gateways: &[&Gateway]) -> Vec<String> {
    let mut args = vec![format!("127.0.0.1:{peer_http}"), format!("127.0.0.1:{peer_grpc}")];
    for gw in gateways {
        args.push(gw.http_addr().to_string());
        args.push(gw.grpc_addr().to_string());
    }
    args
}

/// The value of the metric `series` (name and labels, as exported) at the gateway, 0
/// when it is absent.
pub async fn metric(gw: &Gateway, series: &str) -> f64 {
    let scrape = get(gw.metrics_addr(), "/metrics").await.text();
    scrape
        .lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0.0)
}

/// Sends 24 steps of sequence 77 to model `m` with `budget` ms, each once the one before
/// waits its turn, while both backends of the `tier` pool hold their calls; then checks
/// that one endpoint got every step, one at a time, in order.
pub async fn sequence_steps_in_order(gw: &Gateway, (one, two): (&Backend, &Backend), tier: &str, budget: &'static str) {
    let step = |i: usize, end: bool| {
        let addr = gw.http_addr();
        let body = serde_json::json!({"id": format!("s{i}"),
            "parameters": {"sequence_id": 77, "sequence_start": i == 0, "sequence_end": end},
            "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 1], "data": [i]}]});
        tokio::spawn(async move { infer(addr, "m", &[("x-tiergate-budget-ms", budget)], &body.to_string()).await })
    };
    one.sim.hold();
    two.sim.hold();
    let mut steps = vec![step(0, false)];
    eventually(Duration::from_secs(10), "the first step reaches a backend", || async {
        let seen = one.sim.stats("m")?.requests + two.sim.stats("m")?.requests;
        (seen == 1).then_some(())
    })
    .await;
    let waiting = format!("tiergate_sequence_steps_waiting{{route=\"r\",tier=\"{tier}\"}}");
    let n = 24;
    for i in 1..n {
        steps.push(step(i, i == n - 1));
        eventually(Duration::from_secs(10), "the step waits its turn", || async {
            (metric(gw, &waiting).await == i as f64).then_some(())
        })
        .await;
    }
    one.sim.release();
    two.sim.release();
    for s in steps {
        let answer = s.await.expect("task");
        assert_eq!(answer.status, 200, "{}", answer.text());
        assert_eq!(answer.header("x-tiergate-tier"), Some(tier));
    }
    let (a, b) = (one.sim.stats("m").expect("stats"), two.sim.stats("m").expect("stats"));
    let pinned = if a.requests > 0 { &a } else { &b };
    assert_eq!(
        (a.requests + b.requests, pinned.requests),
        (n as u64, n as u64),
        "one endpoint got every step"
    );
    assert_eq!(pinned.max_in_flight, 1, "one step at a time");
    let order: Vec<String> = (0..n).map(|i| format!("s{i}")).collect();
    assert_eq!(pinned.ids, order, "in the order they came");
}

/// Resolves once the gateway's metrics show `route` with `rows` rows queued.
pub async fn queued(gw: &Gateway, route: &str, rows: u64) {
    let line = format!("tiergate_batch_queue_rows{{route=\"{route}\"}} {rows}");
    let wait = async {
        loop {
            let scrape = get(gw.metrics_addr(), "/metrics").await.text();
            if scrape.lines().any(|l| l == line) {
                return;
            }
            tokio::task::yield_now().await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), wait)
        .await
        .unwrap_or_else(|_| panic!("{rows} rows were never queued on {route}"));
}

/// Reads one whole request into `buf`; its length, or `None` at the end of the stream.
pub async fn read_request(stream: &mut tokio::net::TcpStream, buf: &mut Vec<u8>) -> Option<usize> {
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            let body = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse::<usize>().ok())
                .unwrap_or(0);
            if buf.len() >= end + 4 + body {
                return Some(end + 4 + body);
            }
        }
        let mut chunk = [0u8; 4096];
        match tokio::io::AsyncReadExt::read(stream, &mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}
