//! Conformance: MLServer, a real KServe v2 server, behind tiergate over HTTP and gRPC.
//! Triton's own client must get the same answers through tiergate as from MLServer
//! directly. The test trains the scikit-learn model itself and starts MLServer from the
//! Python environment `tests/conformance/venv.sh mlserver` creates.

use crate::common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;

/// A route to MLServer, real-time and micro-batch (budgets of a second and more); its
/// HTTP side reads JSON tensors only, so `binary_tensors = false`.
fn route(model: &str, endpoint: &str) -> String {
    let binary = !endpoint.starts_with("http://");
    format!(
        "[routes.{model}]\nmodels = [\"{model}\"]\n[routes.{model}.flags]\nrealtime = true\nmicro_batch = true\n\
         [routes.{model}.realtime]\nendpoints = [\"{endpoint}\"]\nmax_concurrency = 16\nbinary_tensors = {binary}\n\
         [routes.{model}.micro_batch]\nendpoints = [\"{endpoint}\"]\nbinary_tensors = {binary}\nmax_batch = 16\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tritonclient_through_tiergate_matches_mlserver() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/conformance");
    let (server_py, client_py) = (python("mlserver"), python("tritonclient"));
    let repo = tempfile::tempdir().expect("tempdir");
    let [http, grpc, metrics] = common::ports::peer_ports::<3>();
    let ports = [http, grpc, metrics].map(|p| p.to_string());
    let trained = Command::new(&server_py)
        .arg(root.join("mlserver_model.py"))
        .arg(repo.path())
        .args(&ports)
        .output()
        .expect("python runs");
    assert!(trained.status.success(), "{}", String::from_utf8_lossy(&trained.stderr));

    let mlserver = server_py.with_file_name("mlserver");
    let log = std::fs::File::create(repo.path().join("mlserver.log")).expect("log");
    let _server = tokio::process::Command::new(mlserver)
        .arg("start")
        .arg(repo.path())
        .stdout(Stdio::from(log.try_clone().expect("log")))
        .stderr(Stdio::from(log))
        .kill_on_drop(true)
        .spawn()
        .expect("mlserver starts");
    wait_ready(http, "/v2/models/iris/ready", Duration::from_secs(120)).await;
    let pid = _server.id().expect("running");
    assert!(
        common::ports::listens(pid, &format!("127.0.0.1:{http}")),
        "port {http} answers, but not from the MLServer this test started"
    );

    let over_http = gateway(&route("iris", &format!("http://127.0.0.1:{http}"))).await;
    let over_grpc = gateway(&route("iris", &format!("grpc://127.0.0.1:{grpc}"))).await;
    let args = addresses(http, grpc, &[&over_http, &over_grpc]);
    run_conformance(
        client_py,
        "mlserver_compare.py",
        args,
        &repo.path().join("mlserver.log"),
    )
    .await;
    over_http.stop().await.expect("stops");
    over_grpc.stop().await.expect("stops");
}
