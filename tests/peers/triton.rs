//! Conformance: a real NVIDIA Triton Inference Server (the `tritonserver` binary PyTriton
//! bundles, on CPU) behind tiergate over HTTP and gRPC. Triton's own client must get the
//! same answers through tiergate as from Triton directly, for every datatype the model
//! takes, and a decoupled model's stream of responses (gRPC's `ModelStreamInfer`, HTTP's
//! `generate_stream`) as Triton sends it. The Python environments come from
//! `tests/conformance/venv.sh`.

use crate::common;

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use common::*;

fn route(endpoint: &str) -> String {
    format!("[routes.echo]\nmodels = [\"echo\"]\n[routes.echo.realtime]\nendpoints = [\"{endpoint}\"]\nmax_concurrency = 16\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tritonclient_through_tiergate_matches_triton() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/conformance");
    let (server_py, client_py) = (python("pytriton"), python("tritonclient"));
    let [http, grpc, metrics] = common::ports::peer_ports::<3>();
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
    // Triton's start (model load, Python backend stub) takes tens of seconds on CPU.
    wait_ready(http, "/v2/models/echo/ready", Duration::from_secs(240)).await;
    let pid = _triton.id().expect("running");
    assert!(
        common::ports::listens(pid, &format!("127.0.0.1:{http}")),
        "port {http} answers, but not from the Triton this test started"
    );
    let over_http = gateway(&route(&format!("http://127.0.0.1:{http}"))).await;
    let over_grpc = gateway(&route(&format!("grpc://127.0.0.1:{grpc}"))).await;
    let args = addresses(http, grpc, &[&over_http, &over_grpc]);
    run_conformance(
        client_py.clone(),
        "triton_compare.py",
        args,
        &work.path().join("triton.log"),
    )
    .await;
    over_http.stop().await.expect("stops");
    over_grpc.stop().await.expect("stops");
    // The decoupled model: gRPC's stream through a gateway whose endpoint speaks gRPC,
    // HTTP's generate_stream through one whose endpoint speaks HTTP.
    let tokens = |endpoint: String| {
        format!("[routes.tokens]\nmodels = [\"tokens\"]\n[routes.tokens.realtime]\nendpoints = [\"{endpoint}\"]\n")
    };
    wait_ready(http, "/v2/models/tokens/ready", Duration::from_secs(120)).await;
    let grpc_gw = gateway(&tokens(format!("grpc://127.0.0.1:{grpc}"))).await;
    let http_gw = gateway(&tokens(format!("http://127.0.0.1:{http}"))).await;
    let args = vec![
        format!("127.0.0.1:{http}"),
        format!("127.0.0.1:{grpc}"),
        http_gw.http_addr().to_string(),
        grpc_gw.grpc_addr().to_string(),
    ];
    run_conformance(
        client_py,
        "triton_decoupled_test.py",
        args,
        &work.path().join("triton.log"),
    )
    .await;
    grpc_gw.stop().await.expect("stops");
    http_gw.stop().await.expect("stops");
}
