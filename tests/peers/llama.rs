//! Conformance: llama.cpp's `llama-server` (an OpenAI-compatible LLM server with
//! continuous batching, built from the sources in llama-cpp-python's sdist by
//! scripts/llama-server.sh) behind tiergate, serving a tiny random-weight model the test
//! writes (tests/conformance/gguf_model.py): its streams relayed as they come, their
//! usage counted exactly, and a caller who leaves freeing the server's slot.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::*;
use http_body_util::{BodyExt, Full};
use serde_json::{json, Value};

/// The server's binary: `LLAMA_SERVER` (scripts/test builds it beside its other steps),
/// else built now by scripts/llama-server.sh (once; cached outside the clone).
fn llama_server() -> PathBuf {
    if let Ok(path) = std::env::var("LLAMA_SERVER") {
        return PathBuf::from(path);
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = std::process::Command::new(root.join("scripts/llama-server.sh"))
        .output()
        .expect("scripts/llama-server.sh runs");
    assert!(
        out.status.success(),
        "cannot build llama-server:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

/// A chat call for `max_tokens` tokens, every one generated (`ignore_eos`), greedy.
fn chat(stream: bool, max_tokens: u64) -> Value {
    json!({"model": "tiny", "stream": stream, "max_tokens": max_tokens, "ignore_eos": true, "temperature": 0,
        "messages": [{"role": "user", "content": "tell me about the gateway"}]})
}

/// Sends `body` to `addr`'s chat path; the answer's head and body.
async fn post(addr: &str, body: &Value) -> http::Response<hyper::body::Incoming> {
    let request = http::Request::post(format!("http://{addr}/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .expect("request");
    tokio::time::timeout(Duration::from_secs(30), client().request(request))
        .await
        .expect("a head in time")
        .expect("an answer")
}

/// Every event's data of a stream, with when it came.
async fn events(answer: http::Response<hyper::body::Incoming>) -> Vec<(Value, Instant)> {
    let mut body = answer.into_body();
    let (mut held, mut out) = (Vec::new(), Vec::new());
    while let Some(frame) = tokio::time::timeout(Duration::from_secs(30), body.frame())
        .await
        .expect("in time")
    {
        if let Ok(data) = frame.expect("a frame").into_data() {
            held.extend_from_slice(&data);
        }
        while let Some(end) = held.windows(2).position(|w| w == b"\n\n") {
            let event: Vec<u8> = held.drain(..end + 2).collect();
            let text = String::from_utf8_lossy(&event).into_owned();
            if let Some(data) = text.trim().strip_prefix("data: ") {
                if data != "[DONE]" {
                    out.push((serde_json::from_str(data).expect("JSON"), Instant::now()));
                }
            }
        }
    }
    out
}

fn content(event: &Value) -> Option<&str> {
    event["choices"][0]["delta"]["content"]
        .as_str()
        .filter(|c| !c.is_empty())
}

/// Whether any of the server's slots is working on a request.
async fn busy(addr: &str) -> bool {
    let answer = get(addr.parse().expect("addr"), "/slots").await;
    let slots: Value = serde_json::from_slice(&answer.body).expect("slots");
    slots
        .as_array()
        .expect("a list")
        .iter()
        .any(|s| s["is_processing"] == true)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn llama_server_streams_are_relayed_counted_and_cancelled_through_tiergate() {
    let server = llama_server();
    let work = tempfile::tempdir().expect("tempdir");
    let model = work.path().join("tiny.gguf");
    let python = python("llama");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/conformance/gguf_model.py");
    let wrote = std::process::Command::new(python)
        .arg(script)
        .arg(&model)
        .output()
        .expect("python runs");
    assert!(wrote.status.success(), "{}", String::from_utf8_lossy(&wrote.stderr));
    let [port] = common::ports::peer_ports::<1>();
    let log = std::fs::File::create(work.path().join("llama.log")).expect("log");
    let llama = tokio::process::Command::new(server)
        .args([
            "-m",
            &model.display().to_string(),
            "--host",
            "127.0.0.1",
            "--port",
            &port.to_string(),
        ])
        .args(["-np", "4", "-c", "4096", "-t", "2", "--metrics", "--alias", "tiny"])
        .stdout(Stdio::from(log.try_clone().expect("log")))
        .stderr(Stdio::from(log))
        .kill_on_drop(true)
        .spawn()
        .expect("llama-server starts");
    wait_ready(port, "/health", Duration::from_secs(120)).await;
    let pid = llama.id().expect("running");
    let direct = format!("127.0.0.1:{port}");
    assert!(
        common::ports::listens(pid, &direct),
        "port {port} is not the server this test started"
    );
    let policy = format!(
        "[routes.llama]\nmodels = [\"tiny\"]\npaths = [\"/v1/chat/completions\", \"/v1/completions\"]\n\
         default_budget = \"5s\"\nrealtime_below = \"10s\"\n[routes.llama.realtime]\nendpoints = [\"http://{direct}\"]\n"
    );
    let gw = gateway(&policy).await;
    let via = gw.http_addr().to_string();

    // The usage the server counts itself, asked of it directly.
    let mut asked = chat(true, 64);
    asked["stream_options"] = json!({"include_usage": true});
    let own = events(post(&direct, &asked).await).await;
    let usage = own.last().expect("events").0["usage"].clone();
    assert_eq!(usage["completion_tokens"], 64, "{usage}");
    let prompt = usage["prompt_tokens"].as_u64().expect("prompt tokens");

    // Through tiergate, not asking for usage: 64 tokens as they come, no usage chunk, and
    // the server's own counts in tiergate's.
    let sent = Instant::now();
    let answer = post(&via, &chat(true, 64)).await;
    assert_eq!(answer.headers()["content-type"], "text/event-stream");
    let relayed = events(answer).await;
    let tokens: Vec<Instant> = relayed
        .iter()
        .filter(|(e, _)| content(e).is_some())
        .map(|(_, at)| *at)
        .collect();
    assert_eq!(tokens.len(), 64, "one event a token");
    assert!(
        relayed.iter().all(|(e, _)| e.get("usage").is_none_or(Value::is_null)),
        "no usage chunk unasked"
    );
    let (first, last) = (tokens[0] - sent, tokens[63] - sent);
    assert!(
        first * 4 < last,
        "the first token came at {first:?}, the last at {last:?}: relayed as they come"
    );
    let counted = |kind: &str| format!("tiergate_tokens_total{{route=\"llama\",tier=\"realtime\",kind=\"{kind}\"}}");
    assert_eq!(metric(&gw, &counted("completion")).await, 64.0);
    assert_eq!(metric(&gw, &counted("prompt")).await, prompt as f64);
    // A whole answer's usage as the server counts it.
    let whole = post(&via, &chat(false, 16)).await;
    let whole: Value =
        serde_json::from_slice(&whole.into_body().collect().await.expect("body").to_bytes()).expect("JSON");
    assert_eq!(whole["usage"]["completion_tokens"], 16);
    assert_eq!(whole["usage"]["prompt_tokens"], prompt);

    // A caller that leaves a long stream: the server's slot is freed at once, long
    // before its 3,000 tokens (about 30 s) would have ended.
    let answer = post(&via, &chat(true, 3000)).await;
    let mut body = answer.into_body();
    let mut read = 0;
    while read < 2000 {
        let frame = body.frame().await.expect("more").expect("a frame");
        read += frame.into_data().map(|d| d.len()).unwrap_or(0);
    }
    assert!(busy(&direct).await, "the server is generating");
    let left = Instant::now();
    drop(body);
    eventually(Duration::from_secs(10), "the server's slot is freed", || async {
        (!busy(&direct).await).then_some(())
    })
    .await;
    assert!(left.elapsed() < Duration::from_secs(10));
    let ended = "tiergate_streams_ended_total{route=\"llama\",tier=\"realtime\",reason=\"client_gone\"}";
    assert_eq!(metric(&gw, ended).await, 1.0);
    gw.stop().await.expect("stops");
}
