//! A route with `backend_priority = true` sends each LLM call's priority band as vLLM's
//! `priority` (critical -1, standard 0, sheddable 1; offline work sheddable), as a
//! recording backend sees it; a route without it sends the body as it came.

use crate::common;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use serde_json::{json, Value};

/// An OpenAI-compatible endpoint on loopback that keeps every request body it gets
/// and answers each with a one-token chat completion.
async fn recording() -> (SocketAddr, Arc<Mutex<Vec<Value>>>) {
    use tokio::io::AsyncWriteExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let bodies = Arc::new(Mutex::new(Vec::new()));
    let kept = bodies.clone();
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            let kept = kept.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                while let Some(len) = read_request(&mut conn, &mut buf).await {
                    let request: Vec<u8> = buf.drain(..len).collect();
                    let head = request.windows(4).position(|w| w == b"\r\n\r\n").expect("head") + 4;
                    if let Ok(body) = serde_json::from_slice::<Value>(&request[head..]) {
                        kept.lock().expect("lock").push(body);
                    }
                    let answer = json!({"id": "c", "object": "chat.completion", "model": "m",
                        "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
                        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})
                    .to_string();
                    let head = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
                        answer.len()
                    );
                    if conn.write_all((head + &answer).as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (addr, bodies)
}

fn route(name: &str, url: &str, extra: &str) -> String {
    format!(
        "[routes.{name}]\nmodels = [\"{name}\"]\npaths = [\"/v1/chat/completions\"]\ndefault_budget = \"5s\"\n\
         realtime_below = \"10s\"\n{extra}\n[routes.{name}.flags]\nrealtime = true\noffline = true\n\
         [routes.{name}.realtime]\nendpoints = [\"{url}\"]\n[routes.{name}.micro_batch]\nendpoints = [\"{url}\"]\n\
         max_priority = \"critical\"\n"
    )
}

#[tokio::test]
async fn the_band_is_sent_as_vllms_priority_where_the_route_says() {
    let (addr, bodies) = recording().await;
    let url = format!("http://{addr}");
    let policy = route("ranked", &url, "backend_priority = true") + &route("plain", &url, "");
    let gw = gateway(&policy).await;
    let chat = |model: &str| json!({"model": model, "messages": [{"role": "user", "content": "hi"}]}).to_string();
    for (model, band) in [
        ("ranked", Some("critical")),
        ("ranked", None),
        ("ranked", Some("sheddable")),
        ("plain", Some("critical")),
    ] {
        let mut headers = vec![("content-type", "application/json")];
        if let Some(band) = band {
            headers.push(("x-tiergate-priority", band));
        }
        let answer = send("POST", gw.http_addr(), "/v1/chat/completions", &headers, chat(model)).await;
        assert_eq!(answer.status, 200, "{}", answer.text());
    }
    // Offline work goes as the lowest band.
    let later = [("content-type", "application/json"), ("prefer", "respond-async")];
    let job = send("POST", gw.http_addr(), "/v1/chat/completions", &later, chat("ranked")).await;
    assert_eq!(job.status, 202, "{}", job.text());
    let seen = eventually(Duration::from_secs(30), "the offline job sent", || async {
        let seen = bodies.lock().expect("lock").clone();
        (seen.len() == 5).then_some(seen)
    })
    .await;
    let priorities: Vec<Option<i64>> = seen.iter().map(|b| b["priority"].as_i64()).collect();
    assert_eq!(priorities, [Some(-1), Some(0), Some(1), None, Some(1)], "{seen:#?}");
    assert!(
        seen.iter().all(|b| b["messages"][0]["content"] == "hi"),
        "the rest as it came"
    );
}
