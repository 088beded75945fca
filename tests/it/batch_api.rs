//! The Batch API against the simulator: a few thousand lines answered exactly once and
//! correctly, bad lines reported by line number, cancel with partial results, expiry,
//! idempotent creation, pagination, and uploads refused for what they are.

use crate::common;

use std::collections::HashMap;
use std::time::Duration;

use common::*;
use serde_json::{json, Value};
use tiergate::app::Gateway;

fn policy(name: &str, rt: &str, batch: &str) -> String {
    format!(
        r#"
[routes.{name}]
models = ["m"]
[routes.{name}.flags]
realtime = true
offline = true
[routes.{name}.realtime]
endpoints = ["{rt}"]
[routes.{name}.micro_batch]
endpoints = ["{batch}"]
max_batch = 64
max_in_flight = 1
[routes.nobatch]
models = ["other"]
[routes.nobatch.realtime]
endpoints = ["{rt}"]
"#
    )
}

/// One Batch API line: a KServe v2 JSON request for model `m` whose rows encode `i`.
fn line(i: usize) -> String {
    json!({
        "custom_id": format!("req-{i}"),
        "method": "POST",
        "url": "/v2/models/m/infer",
        "body": {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 2], "data": [i, i + 1]}]},
    })
    .to_string()
}

async fn upload(gw: &Gateway, content: &str) -> Answer {
    upload_file(gw.http_addr(), content, &[]).await
}

async fn create(gw: &Gateway, file: &str, window: &str, headers: &[(&str, &str)]) -> Value {
    let body = json!({"input_file_id": file, "endpoint": "/v2/models/m/infer", "completion_window": window,
                      "metadata": {"team": "search"}});
    let mut all = vec![("content-type", "application/json")];
    all.extend_from_slice(headers);
    let answer = send("POST", gw.http_addr(), "/v1/batches", &all, body.to_string()).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    answer.json()
}

/// Polls the batch as a client would until it reaches `status` (20 s at most).
async fn until(gw: &Gateway, id: &str, status: &str) -> Value {
    let what = format!("batch {id} reaches {status}");
    eventually(Duration::from_secs(20), &what, || async {
        let batch = get(gw.http_addr(), &format!("/v1/batches/{id}")).await.json();
        (batch["status"] == status).then_some(batch)
    })
    .await
}

/// The lines of a file, by custom_id (asserting each appears once).
async fn results(gw: &Gateway, file: &Value) -> HashMap<String, Value> {
    let Some(id) = file.as_str() else { return HashMap::new() };
    let content = get(gw.http_addr(), &format!("/v1/files/{id}/content")).await;
    assert_eq!(content.status, 200);
    let mut out = HashMap::new();
    for l in content.text().lines() {
        let v: Value = serde_json::from_str(l).expect("JSONL");
        let custom = v["custom_id"].as_str().expect("custom_id").to_owned();
        assert!(out.insert(custom.clone(), v).is_none(), "{custom} answered twice");
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_of_thousands_of_requests_is_answered_exactly_once_each() {
    let (rt, batch) = (backend(&["m"]).await, backend(&["m"]).await);
    let gw = gateway(&policy("bulk", &rt.url(), &batch.url())).await;
    let n = 3000;
    let content: Vec<String> = (0..n).map(line).collect();
    let file = upload(&gw, &content.join("\n")).await;
    assert_eq!(file.status, 200, "{}", file.text());
    let file = file.json();
    assert_eq!(
        (file["object"].as_str(), file["purpose"].as_str()),
        (Some("file"), Some("batch"))
    );
    let created = create(&gw, file["id"].as_str().expect("id"), "24h", &[]).await;
    assert_eq!(created["status"], "in_progress");
    assert_eq!(created["metadata"]["team"], "search");
    let done = until(&gw, created["id"].as_str().expect("id"), "completed").await;
    assert_eq!(done["request_counts"], json!({"total": n, "completed": n, "failed": 0}));
    assert!(done["error_file_id"].is_null());
    let out = results(&gw, &done["output_file_id"]).await;
    assert_eq!(out.len(), n);
    let mut batch_ids = std::collections::HashSet::new();
    for i in 0..n {
        let r = &out[&format!("req-{i}")];
        assert_eq!(r["response"]["status_code"], 200);
        let id = r["response"]["batch_id"]
            .as_str()
            .expect("the micro-batch that answered it");
        assert!(id.starts_with("mb_"), "{id}");
        batch_ids.insert(id.to_owned());
        assert_eq!(
            r["response"]["body"]["outputs"][0]["data"],
            json!([i as f64, (i + 1) as f64]),
            "req-{i}"
        );
    }
    let stats = batch.sim.stats("m").expect("stats");
    assert_eq!(stats.rows, n as u64, "every request ran exactly once");
    assert_eq!(batch_ids.len() as u64, stats.batches, "one id per backend batch");
    assert!(
        stats.batches <= (n as u64).div_ceil(64) + 5,
        "in large batches: {} calls",
        stats.batches
    );
    gw.stop().await.expect("stops");
}

#[tokio::test]
async fn bad_lines_are_reported_by_line_number_and_nothing_runs() {
    let (rt, batch) = (backend(&["m"]).await, backend(&["m"]).await);
    let gw = gateway(&policy("lines", &rt.url(), &batch.url())).await;
    let other = line(5).replace("/v2/models/m/infer", "/v2/models/other/infer");
    let lines = [
        line(0),
        "{not json".into(),
        line(2),
        line(2),
        line(4).replace("/v2/models/m/infer", "/v2/models/nope/infer"),
        line(6).replace("\"POST\"", "\"GET\""),
        other,
        r#"{"method":"POST","url":"/v2/models/m/infer","body":{}}"#.into(),
    ];
    let file = upload(&gw, &lines.join("\n")).await.json();
    let created = create(&gw, file["id"].as_str().expect("id"), "24h", &[]).await;
    assert_eq!(created["status"], "failed");
    let errors: Vec<(u64, String)> = created["errors"]["data"]
        .as_array()
        .expect("errors")
        .iter()
        .map(|e| {
            (
                e["line"].as_u64().expect("line"),
                e["code"].as_str().expect("code").to_owned(),
            )
        })
        .collect();
    let expected = [
        (2, "invalid_json_line"),
        (4, "duplicate_custom_id"),
        (5, "invalid_url"),
        (6, "invalid_method"),
        (7, "invalid_url"),
        (8, "missing_required_parameter"),
    ];
    assert_eq!(errors, expected.map(|(l, c)| (l, c.to_owned())).to_vec(), "{created}");
    assert_eq!(batch.sim.stats("m").expect("stats").requests, 0, "nothing ran");
    gw.stop().await.expect("stops");
}

#[tokio::test]
async fn cancel_keeps_the_partial_results() {
    let (rt, batch) = (backend(&["m"]).await, backend(&["m"]).await);
    let gw = gateway(&policy("cancel", &rt.url(), &batch.url())).await;
    batch.sim.hold();
    let content: Vec<String> = (0..200).map(line).collect();
    let file = upload(&gw, &content.join("\n")).await.json();
    let created = create(&gw, file["id"].as_str().expect("id"), "24h", &[]).await;
    let id = created["id"].as_str().expect("id");
    wait_for(&batch, |s| s.requests == 1).await; // the first 64 are at the backend
    let cancelling = send("POST", gw.http_addr(), &format!("/v1/batches/{id}/cancel"), &[], "").await;
    assert_eq!(cancelling.status, 200);
    assert_eq!(cancelling.json()["status"], "cancelling");
    batch.sim.release();
    let done = until(&gw, id, "cancelled").await;
    assert_eq!(
        done["request_counts"],
        json!({"total": 200, "completed": 64, "failed": 136})
    );
    let (out, errors) = (
        results(&gw, &done["output_file_id"]).await,
        results(&gw, &done["error_file_id"]).await,
    );
    assert_eq!((out.len(), errors.len()), (64, 136));
    assert!(errors.values().all(|e| e["error"]["code"] == "batch_cancelled"));
    assert_eq!(
        batch.sim.stats("m").expect("stats").rows,
        64,
        "nothing ran after the cancel"
    );
    gw.stop().await.expect("stops");
}

#[tokio::test]
async fn unfinished_requests_expire_with_their_window() {
    let (rt, batch) = (backend(&["m"]).await, backend(&["m"]).await);
    let gw = gateway(&policy("expire", &rt.url(), &batch.url())).await;
    batch.sim.hold();
    let content: Vec<String> = (0..100).map(line).collect();
    let file = upload(&gw, &content.join("\n")).await.json();
    let created = create(&gw, file["id"].as_str().expect("id"), "1s", &[]).await;
    let id = created["id"].as_str().expect("id").to_owned();
    wait_for(&batch, |s| s.requests == 1).await;
    // Release only once the window has passed (the batch is still in progress).
    let expires = created["expires_at"].as_i64().expect("expires_at");
    while std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs() as i64
        <= expires
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    batch.sim.release();
    let done = until(&gw, &id, "expired").await;
    assert_eq!(
        done["request_counts"],
        json!({"total": 100, "completed": 64, "failed": 36})
    );
    let errors = results(&gw, &done["error_file_id"]).await;
    assert!(errors.values().all(|e| e["error"]["code"] == "batch_expired"));
    gw.stop().await.expect("stops");
}

#[tokio::test]
async fn creation_is_idempotent_and_batches_are_listed_newest_first() {
    let (rt, batch) = (backend(&["m"]).await, backend(&["m"]).await);
    let gw = gateway(&policy("list", &rt.url(), &batch.url())).await;
    let file = upload(&gw, &line(1)).await.json();
    let file = file["id"].as_str().expect("id");
    let a = create(&gw, file, "24h", &[("idempotency-key", "nightly-1")]).await;
    let again = create(&gw, file, "24h", &[("idempotency-key", "nightly-1")]).await;
    assert_eq!(a["id"], again["id"]);
    let b = create(&gw, file, "24h", &[]).await;
    let c = create(&gw, file, "24h", &[]).await;
    let page = get(gw.http_addr(), "/v1/batches?limit=2").await.json();
    let ids: Vec<&Value> = page["data"]
        .as_array()
        .expect("data")
        .iter()
        .map(|b| &b["id"])
        .collect();
    assert_eq!(ids, vec![&c["id"], &b["id"]]);
    assert_eq!(page["has_more"], true);
    let after = page["last_id"].as_str().expect("last_id");
    let rest = get(gw.http_addr(), &format!("/v1/batches?limit=2&after={after}"))
        .await
        .json();
    assert_eq!(rest["data"][0]["id"], a["id"]);
    assert_eq!(rest["has_more"], false);
    gw.stop().await.expect("stops");
}

#[tokio::test]
async fn uploads_are_refused_for_what_they_are() {
    let (rt, batch) = (backend(&["m"]).await, backend(&["m"]).await);
    let mut config = config();
    config.offline.max_file_bytes = 1000;
    let gw = gateway_with(config, &policy("uploads", &rt.url(), &batch.url())).await;
    let plain = send(
        "POST",
        gw.http_addr(),
        "/v1/files",
        &[("content-type", "application/json")],
        "{}",
    )
    .await;
    assert_eq!(plain.status, 400);
    assert!(plain.text().contains("multipart/form-data"), "{}", plain.text());
    let big: Vec<String> = (0..40).map(line).collect();
    let too_big = upload(&gw, &big.join("\n")).await;
    assert_eq!(too_big.status, 413, "{}", too_big.text());
    let missing = get(gw.http_addr(), "/v1/files/file_nope").await;
    assert_eq!(missing.status, 404);
    let no_file = send(
        "POST",
        gw.http_addr(),
        "/v1/batches",
        &[("content-type", "application/json")],
        json!({"input_file_id": "file_nope", "endpoint": "/v2/models/m/infer", "completion_window": "24h"}).to_string(),
    )
    .await;
    assert_eq!(no_file.status, 404);
    gw.stop().await.expect("stops");
}

/// `POST /v1/batches` for `file` with `precompute` as given.
async fn precomputing(gw: &Gateway, file: &str, precompute: Value) -> Answer {
    let body = json!({"input_file_id": file, "endpoint": "/v2/models/m/infer", "completion_window": "24h",
                      "precompute": precompute});
    send(
        "POST",
        gw.http_addr(),
        "/v1/batches",
        &[("content-type", "application/json")],
        body.to_string(),
    )
    .await
}

#[tokio::test]
async fn a_precomputing_batch_makes_later_real_time_calls_hits() {
    let (rt, batch) = (backend(&["m"]).await, backend(&["m"]).await);
    let text = policy("pre", &rt.url(), &batch.url());
    let gw = gateway(&text).await;
    let n = 50;
    let content: Vec<String> = (0..n).map(line).collect();
    let file = upload(&gw, &content.join("\n")).await.json();
    let file_id = file["id"].as_str().expect("id");
    // Without a cache on the route there is nowhere to keep the answers.
    let refused = precomputing(&gw, file_id, json!({"ttl": "1h"})).await;
    assert_eq!(refused.status, 400, "{}", refused.text());
    assert!(refused.text().contains("has no cache"), "{}", refused.text());
    gw.stop().await.expect("stops");

    let cached = text.replace("offline = true", "offline = true\ncache = true") + "[routes.pre.cache]\n";
    let gw = gateway(&cached).await;
    let file = upload(&gw, &content.join("\n")).await.json();
    let file_id = file["id"].as_str().expect("id");
    let bad = precomputing(&gw, file_id, json!({"ttl": "30d"})).await;
    assert_eq!(bad.status, 400, "{}", bad.text());
    assert!(bad.text().contains("from 1s to 7d"), "{}", bad.text());
    let created = precomputing(&gw, file_id, json!({"ttl": "1h"})).await;
    assert_eq!(created.status, 200, "{}", created.text());
    let created = created.json();
    assert_eq!(created["precompute"], json!({"ttl": "1h"}));
    let done = until(&gw, created["id"].as_str().expect("id"), "completed").await;
    assert_eq!(done["request_counts"]["completed"], n);
    assert_eq!(
        metric(&gw, "tiergate_cache_precomputed_total{route=\"pre\"}").await,
        n as f64
    );

    // The same questions asked of the real-time tier: answered from the cache.
    for i in 0..n {
        let body = json!({"id": format!("rt-{i}"), "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 2], "data": [i, i + 1]}]});
        let answer = infer(
            gw.http_addr(),
            "m",
            &[("x-tiergate-budget-ms", "100")],
            &body.to_string(),
        )
        .await;
        assert_eq!(answer.status, 200, "{}", answer.text());
        assert_eq!(answer.header("x-tiergate-cache"), Some("hit"), "request {i}");
        assert_eq!(answer.json()["id"], format!("rt-{i}"));
        assert_eq!(answer.json()["outputs"][0]["data"], json!([i as f64, (i + 1) as f64]));
    }
    assert_eq!(
        rt.sim.stats("m").map_or(0, |s| s.requests),
        0,
        "the real-time pool was never called"
    );
    assert_eq!(
        batch.sim.stats("m").expect("stats").rows,
        n as u64,
        "each question computed once"
    );
    assert_eq!(
        metric(&gw, "tiergate_cache_precomputed_hits_total{route=\"pre\"}").await,
        n as f64
    );
    gw.stop().await.expect("stops");
}

/// A multipart upload's body around `content`, and its content type.
fn form(content: &[u8]) -> (Vec<u8>, String) {
    let boundary = "tiergate-test-boundary";
    let mut body = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n\
         --{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"in.jsonl\"\r\n\r\n"
    )
    .into_bytes();
    body.extend_from_slice(content);
    body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    (body, format!("multipart/form-data; boundary={boundary}"))
}

#[tokio::test]
async fn uploads_are_held_to_the_doors_memory_budget() {
    use tokio::io::AsyncWriteExt;
    let be = backend(&["m"]).await;
    let mut cfg = config();
    cfg.limits.max_in_flight_body_bytes = 8 << 20;
    let gw = gateway_with(cfg, &policy("budget", &be.url(), &be.url())).await;
    // One 3 MiB upload on its way (held twice over: its body and its file) takes 6 of
    // the 8 MiB; a second one is refused at once, as any door's body past the budget is.
    let (body, content_type) = form(&vec![b'x'; 3 << 20]);
    let mut first = tokio::net::TcpStream::connect(gw.http_addr()).await.expect("connect");
    let head = format!(
        "POST /v1/files HTTP/1.1\r\nhost: x\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    first.write_all(head.as_bytes()).await.expect("head");
    first.write_all(&body[..1024]).await.expect("a first part");
    let (addr, headers) = (gw.http_addr(), [("content-type", content_type.as_str())]);
    let second = eventually(Duration::from_secs(10), "the first upload holds the budget", || {
        let body = body.clone();
        async move {
            let answer = send("POST", addr, "/v1/files", &headers, body).await;
            (answer.status == 503).then_some(answer)
        }
    })
    .await;
    assert!(second.header("retry-after").is_some());
    assert!(second.text().contains("max_in_flight_body_bytes"), "{}", second.text());
    first.write_all(&body[1024..]).await.expect("the rest");
    drop(first);
    let small = upload(&gw, &line(1)).await;
    assert_eq!(small.status, 200, "{}", small.text());
}

#[tokio::test]
async fn a_files_content_is_streamed_and_a_reader_that_stops_reading_is_cut_off() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let be = backend(&["m"]).await;
    let mut cfg = config();
    cfg.limits.min_send_rate = 1 << 20;
    let gw = gateway_with(cfg, &policy("stream", &be.url(), &be.url())).await;
    let content: Vec<u8> = (0..(6u32 << 20)).map(|i| b"abcdefghij\n"[(i % 11) as usize]).collect();
    let (body, content_type) = form(&content);
    let uploaded = send(
        "POST",
        gw.http_addr(),
        "/v1/files",
        &[("content-type", &content_type)],
        body,
    )
    .await;
    assert_eq!(uploaded.status, 200, "{}", uploaded.text());
    let id = uploaded.json()["id"].as_str().expect("an id").to_owned();
    let path = format!("/v1/files/{id}/content");
    let whole = get(gw.http_addr(), &path).await;
    assert_eq!(whole.status, 200);
    assert_eq!(whole.header("content-length"), Some(content.len().to_string().as_str()));
    assert!(whole.body == content, "the same bytes, in order");
    // A client that asks and then reads nothing: cut off once it is below 1 MiB/s
    // over a window (10 s), instead of holding the answer and the connection.
    let mut stalled = tokio::net::TcpStream::connect(gw.http_addr()).await.expect("connect");
    let ask = format!("GET {path} HTTP/1.1\r\nhost: x\r\n\r\n");
    stalled.write_all(ask.as_bytes()).await.expect("ask");
    eventually(Duration::from_secs(30), "the stalled reader is cut off", || async {
        let cut = metric(&gw, "tiergate_connections_closed_total{reason=\"slow_reader\"}").await;
        (cut >= 1.0).then_some(())
    })
    .await;
    let mut rest = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), stalled.read_to_end(&mut rest)).await;
    assert!(read.is_ok(), "the connection is closed");
    assert!(rest.len() < content.len(), "the client never got the whole file");
}
