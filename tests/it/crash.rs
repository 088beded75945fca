//! Crash safety: a `tiergate serve` child process is killed with SIGKILL again and again
//! while a Batch API file and single async jobs run (and while more jobs and files are
//! submitted), and restarted on the same data directory (each life on a port of its own,
//! as a replacement pod gets a new address). At the end every acknowledged
//! job has completed, every acknowledged file is there whole, and every batch request
//! has exactly one result.

use crate::common;

use std::collections::HashSet;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::ports::serving;
use common::*;
use serde_json::{json, Value};
use tiergate::sim::{ModelSpec, Profile};
use tokio::time::Instant;

/// Starts the gateway child on port 0 and waits until it is ready (30 s at most); returns
/// it and its HTTP door's address, read from the "serving" line it appends to its log.
/// A child that exits before it is ready is started again, a few times; every failure
/// shows the gateway's log.
async fn start(dir: &Path) -> (Child, std::net::SocketAddr) {
    let log_path = dir.join("gateway.log");
    for _attempt in 0..5 {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .expect("log file");
        let logged_before = log.metadata().expect("log size").len() as usize;
        let mut command = Command::new(env!("CARGO_BIN_EXE_tiergate"));
        // Only the flags below configure it: a TIERGATE_* variable in the caller's
        // environment would be read as a startup setting.
        for (key, _) in std::env::vars().filter(|(k, _)| k.starts_with("TIERGATE_")) {
            command.env_remove(key);
        }
        let mut child = command
            .args(["serve", "--policy-dir"])
            .arg(dir.join("policy"))
            .arg("--data-dir")
            .arg(dir.join("data"))
            .args([
                "--http",
                "127.0.0.1:0",
                "--grpc",
                "127.0.0.1:0",
                "--metrics",
                "127.0.0.1:0",
            ])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("tiergate starts");
        let limit = Instant::now() + Duration::from_secs(30);
        loop {
            if child.try_wait().expect("child status").is_some() {
                break; // exited early: start it again
            }
            let written = std::fs::read(&log_path).unwrap_or_default();
            let this_life = String::from_utf8_lossy(&written[logged_before.min(written.len())..]).into_owned();
            if let Some(at) = serving(&this_life) {
                if ready(at.http).await {
                    return (child, at.http);
                }
            }
            if Instant::now() > limit {
                kill(child);
                panic!("the gateway was not ready within 30 s; its log:\n{this_life}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await; // polling a child process's log
        }
    }
    let log = std::fs::read_to_string(&log_path).unwrap_or_default();
    panic!("the gateway exited before it was ready, 5 times; its log:\n{log}");
}

/// Whether the gateway at `addr` answers its readiness check.
async fn ready(addr: std::net::SocketAddr) -> bool {
    let request = http::Request::get(format!("http://{addr}/v2/health/ready"))
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .expect("request");
    matches!(
        tokio::time::timeout(Duration::from_secs(1), client().request(request)).await,
        Ok(Ok(r)) if r.status() == 200
    )
}

fn kill(mut child: Child) {
    child.kill().expect("SIGKILL"); // std's kill is SIGKILL on Unix
    child.wait().expect("reaped");
}

fn line(i: usize) -> String {
    json!({"custom_id": format!("c{i}"), "method": "POST", "url": "/v2/models/m/infer",
           "body": {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 1], "data": [i]}]}})
    .to_string()
}

/// Submits one async job; its Location when acknowledged (202), else None.
async fn submit(addr: std::net::SocketAddr, i: usize) -> Option<String> {
    let body = format!(r#"{{"inputs":[{{"name":"INPUT0","datatype":"FP32","shape":[1,1],"data":[{i}]}}]}}"#);
    let request = http::Request::post(format!("http://{addr}/v2/models/m/infer"))
        .header("content-type", "application/json")
        .header("prefer", "respond-async")
        .body(http_body_util::Full::new(bytes::Bytes::from(body)))
        .expect("request");
    let response = tokio::time::timeout(Duration::from_secs(5), client().request(request))
        .await
        .ok()?
        .ok()?;
    (response.status() == 202).then(|| response.headers().get("location")?.to_str().ok().map(str::to_owned))?
}

/// Uploads `content` as a Batch API file; its id when acknowledged, else None.
async fn upload_file(addr: std::net::SocketAddr, content: &str) -> Option<String> {
    let boundary = "crash-upload";
    let body = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n--{boundary}\r\n\
         Content-Disposition: form-data; name=\"file\"; filename=\"f.jsonl\"\r\n\r\n{content}\r\n--{boundary}--\r\n"
    );
    let request = http::Request::post(format!("http://{addr}/v1/files"))
        .header("content-type", format!("multipart/form-data; boundary={boundary}"))
        .body(http_body_util::Full::new(bytes::Bytes::from(body)))
        .expect("request");
    let response = tokio::time::timeout(Duration::from_secs(5), client().request(request))
        .await
        .ok()?
        .ok()?;
    if response.status() != 200 {
        return None;
    }
    let body = http_body_util::BodyExt::collect(response.into_body())
        .await
        .ok()?
        .to_bytes();
    let file: Value = serde_json::from_slice(&body).ok()?;
    file["id"].as_str().map(str::to_owned)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_at_any_moment_loses_no_acknowledged_job_and_duplicates_no_result() {
    let profile = Profile {
        a: Duration::from_millis(15),
        b: Duration::from_micros(100),
        ..Profile::default()
    };
    let batch = backend_with(vec![ModelSpec::new("m", profile)]).await;
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir_all(dir.path().join("policy")).expect("policy dir");
    std::fs::write(
        dir.path().join("policy/crash.toml"),
        format!(
            "[routes.crash]\nmodels = [\"m\"]\n[routes.crash.flags]\nrealtime = false\noffline = true\n\
             [routes.crash.micro_batch]\nendpoints = [\"{}\"]\nmax_batch = 64\nmax_in_flight = 1\n",
            batch.url()
        ),
    )
    .expect("policy");
    let (mut child, mut addr) = start(dir.path()).await;

    // A batch of 2,000 requests.
    let n = 2000;
    let content: Vec<String> = (0..n).map(line).collect();
    let file = upload_file(addr, &content.join("\n")).await.expect("uploaded");
    let batch_id = create_batch(addr, &serde_json::Value::from(file), "m", &[]).await;

    // Kill it five times while the batch runs and async jobs keep arriving.
    let mut acknowledged = Vec::new();
    let mut uploaded = Vec::new();
    let mut next = 0;
    for round in 0..5 {
        // Uploads keep arriving too: a file is accepted whole or not at all.
        let uploading = tokio::spawn(async move {
            let mut acked = Vec::new();
            for u in 0..50 {
                let content: Vec<String> = (0..2000)
                    .map(|i| line(round as usize * 100_000 + u * 2000 + i))
                    .collect();
                let content = content.join("\n");
                match upload_file(addr, &content).await {
                    Some(id) => acked.push((id, content)),
                    None => break,
                }
            }
            acked
        });
        let submitting = tokio::spawn(async move {
            let mut acked = Vec::new();
            for i in next..next + 400 {
                match submit(addr, i).await {
                    Some(location) => acked.push((i, location)),
                    None => break, // the gateway died under us: that one was never acknowledged
                }
            }
            acked
        });
        // Chaos timing, not synchronisation: the kill lands wherever the run happens to be.
        tokio::time::sleep(Duration::from_millis(150 + 70 * round)).await;
        kill(child);
        acknowledged.extend(submitting.await.expect("task"));
        uploaded.extend(uploading.await.expect("task"));
        next += 400;
        (child, addr) = start(dir.path()).await; // each life on a port of its own
    }

    // Let the last life finish everything.
    let limit = Instant::now() + Duration::from_secs(60);
    let done = loop {
        let b = get(addr, &format!("/v1/batches/{batch_id}")).await.json();
        if b["status"] == "completed" {
            break b;
        }
        assert!(Instant::now() < limit, "the batch never completed: {b}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(done["request_counts"], json!({"total": n, "completed": n, "failed": 0}));
    let output = get(
        addr,
        &format!("/v1/files/{}/content", done["output_file_id"].as_str().expect("file")),
    )
    .await;
    let mut seen = HashSet::new();
    for l in output.text().lines() {
        let v: Value = serde_json::from_str(l).expect("JSONL");
        let custom = v["custom_id"].as_str().expect("custom_id").to_owned();
        let i: usize = custom[1..].parse().expect("index");
        assert_eq!(
            v["response"]["body"]["outputs"][0]["data"],
            json!([i as f64]),
            "{custom}"
        );
        assert!(seen.insert(custom.clone()), "{custom} has two results");
    }
    assert_eq!(seen.len(), n, "every batch request has exactly one result");

    assert!(!acknowledged.is_empty());
    for (i, location) in &acknowledged {
        let limit = Instant::now() + Duration::from_secs(60);
        let answer = loop {
            let a = get(addr, location).await;
            if a.status != 202 {
                break a;
            }
            assert!(Instant::now() < limit, "job {location} never finished");
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        assert_eq!(answer.status, 200, "acknowledged job {location}: {}", answer.text());
        assert_eq!(answer.json()["outputs"][0]["data"], json!([*i as f64]));
    }
    for (id, content) in &uploaded {
        let stored = get(addr, &format!("/v1/files/{id}/content")).await;
        assert_eq!(stored.status, 200, "acknowledged file {id} is there");
        assert!(stored.text() == *content, "acknowledged file {id} is whole");
    }
    eprintln!(
        "{} async jobs and {} file uploads acknowledged across 5 SIGKILLs, all there; {n} batch requests, one result each",
        acknowledged.len(),
        uploaded.len()
    );
    kill(child);
}
