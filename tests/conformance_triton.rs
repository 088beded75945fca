//! Conformance: a real NVIDIA Triton Inference Server (the `tritonserver` binary PyTriton
//! bundles, on CPU) behind tiergate over HTTP and gRPC. Triton's own client must get the
//! same answers through tiergate as from Triton directly, for every datatype the model
//! takes. The Python environments come from `tests/conformance/venv.sh`.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;

fn route(endpoint: &str) -> String {
    format!("[routes.echo]\nmodels = [\"echo\"]\n[routes.echo.realtime]\nendpoints = [\"{endpoint}\"]\nmax_concurrency = 16\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tritonclient_through_tiergate_matches_triton() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/conformance");
    let (server_py, client_py) = (python("pytriton"), python("tritonclient"));
    let (http, grpc, metrics) = (free_port(), free_port(), free_port());
    let work = tempfile::tempdir().expect("tempdir");
    let log = std::fs::File::create(work.path().join("triton.log")).expect("log");
    let _triton = tokio::process::Command::new(server_py)
        .arg(root.join("pytriton_server.py"))
        .args([http, grpc, metrics].map(|p| p.to_string()))
        .env("HOME", work.path()) // PyTriton keeps its workspace under $HOME
        .stdout(Stdio::from(log.try_clone().expect("log")))
        .stderr(Stdio::from(log))
        .kill_on_drop(true)
        .spawn()
        .expect("pytriton starts");
    let log_text = || std::fs::read_to_string(work.path().join("triton.log")).unwrap_or_default();
    // Triton's start (model load, Python backend stub) takes tens of seconds on CPU.
    wait_ready(http, "/v2/models/echo/ready", Duration::from_secs(240)).await;
    let over_http = gateway(&route(&format!("http://127.0.0.1:{http}"))).await;
    let over_grpc = gateway(&route(&format!("grpc://127.0.0.1:{grpc}"))).await;
    let args = [
        format!("127.0.0.1:{http}"),
        format!("127.0.0.1:{grpc}"),
        over_http.http_addr().to_string(),
        over_http.grpc_addr().to_string(),
        over_grpc.http_addr().to_string(),
        over_grpc.grpc_addr().to_string(),
    ];
    let script = root.join("triton_compare.py");
    let out = tokio::task::spawn_blocking(move || Command::new(client_py).arg(script).args(args).output())
        .await
        .expect("joins")
        .expect("python runs");
    let report = String::from_utf8_lossy(&out.stderr);
    println!("{report}");
    assert!(
        out.status.success(),
        "Triton conformance failed:\n{report}\nTriton log:\n{}",
        log_text()
    );
    over_http.stop().await.expect("stops");
    over_grpc.stop().await.expect("stops");
}
