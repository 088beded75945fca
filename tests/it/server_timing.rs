//! Every answer says where its time went in `Server-Timing` (the gRPC door in its
//! metadata): the backend call, the micro-batch queue, the cache, retries and hedges
//! (tests/it/retries.rs, tests/it/hedging.rs), and the gateway's own work, adding up to
//! the total; an error says its total only.

use crate::common;

use std::time::Duration;

use common::*;
use tiergate::sim::{ModelSpec, Profile};
use tokio::time::Instant;

/// A simulator serving `m` whose every call takes at least 20 ms.
async fn twenty_ms() -> Backend {
    let profile = Profile {
        a: Duration::from_millis(20),
        ..Profile::default()
    };
    backend_with(vec![ModelSpec::new("m", profile)]).await
}

/// `budget` ms for model `m` on `gw`: the answer, and the time the client saw, in ms.
async fn timed(addr: std::net::SocketAddr, budget: &str) -> (Answer, f64) {
    let started = Instant::now();
    let answer = infer(addr, "m", &[("x-tiergate-budget-ms", budget)], BODY).await;
    (answer, started.elapsed().as_secs_f64() * 1e3)
}

#[tokio::test]
async fn real_time_and_micro_batch_answers_say_where_their_time_went_and_the_parts_add_up() {
    let (rt, batch) = (twenty_ms().await, twenty_ms().await);
    // One batch at a time, so a second request waits for the first's batch.
    let toml = route_r(&rt.url(), &batch.url())
        .flags(&["realtime", "micro_batch"])
        .set("micro_batch.max_in_flight", 1)
        .toml();
    let gw = gateway(&toml).await;
    for _ in 0..3 {
        let (answer, seen) = timed(gw.http_addr(), "250").await;
        assert_eq!(
            (answer.status, answer.tier().0),
            (200, Some("realtime")),
            "{}",
            answer.text()
        );
        let parts = answer.timing();
        assert_eq!(part_names(&parts), ["backend", "gateway", "total"]);
        assert!(
            part(&parts, "backend") >= 20.0,
            "the backend's 20 ms are the backend's: {parts:?}"
        );
        assert!(part(&parts, "gateway") < 5.0, "{parts:?}");
        assert!(
            part(&parts, "total") <= seen,
            "no more than the client saw ({seen} ms): {parts:?}"
        );
    }
    for _ in 0..3 {
        let (answer, seen) = timed(gw.http_addr(), "2000").await;
        assert_eq!(
            (answer.status, answer.tier()),
            (200, (Some("micro_batch"), Some("budget_micro_batch"))),
            "{:?}",
            answer.headers
        );
        let parts = answer.timing();
        assert_eq!(part_names(&parts), ["queue", "backend", "gateway", "total"]);
        assert!(part(&parts, "backend") >= 20.0, "{parts:?}");
        assert!(part(&parts, "total") <= seen, "{parts:?}");
    }
    // A request that waits for its batch: the batch pool is held with another batch,
    // the request is queued behind it, and the hold lasts 50 ms more (a wait measured,
    // not a synchronisation): all of it the queue's.
    batch.sim.hold();
    let first = tokio::spawn(timed(gw.http_addr(), "2000"));
    wait_for(&batch, |s| s.in_flight == 1).await;
    let second = tokio::spawn(timed(gw.http_addr(), "2000"));
    queued(&gw, "r", 2).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    batch.sim.release();
    let (first, _) = first.await.expect("answered");
    let (second, _) = second.await.expect("answered");
    assert_eq!((first.status, second.status), (200, 200));
    let parts = second.timing();
    assert!(part(&parts, "queue") >= 50.0, "{parts:?}");
    assert!(
        part(&parts, "backend") >= 20.0 && part(&parts, "backend") < 50.0,
        "its own batch's call: {parts:?}"
    );
}

#[tokio::test]
async fn a_cached_answer_an_error_and_a_grpc_answer_say_where_their_time_went() {
    let rt = twenty_ms().await;
    let toml = Route::new("timing_cache")
        .model("m")
        .only(&["realtime", "cache"])
        .set("realtime.endpoints", vec![rt.url()])
        .table("cache")
        .toml();
    let gw = gateway(&toml).await;
    let (miss, _) = timed(gw.http_addr(), "250").await;
    assert_eq!((miss.status, miss.header("x-tiergate-cache")), (200, Some("miss")));
    assert_eq!(part_names(&miss.timing()), ["cache", "backend", "gateway", "total"]);
    let (hit, _) = timed(gw.http_addr(), "250").await;
    assert_eq!((hit.status, hit.header("x-tiergate-cache")), (200, Some("hit")));
    let parts = hit.timing();
    assert_eq!(part_names(&parts), ["cache", "gateway", "total"], "no backend call");
    assert!(part(&parts, "total") < 20.0, "{parts:?}");

    let dead = Route::new("timing_dead")
        .model("m")
        .only(&["realtime"])
        .set("realtime.endpoints", vec![format!("http://{}", dead_addr().await)])
        .toml();
    let gw = gateway(&dead).await;
    let (failed, _) = timed(gw.http_addr(), "250").await;
    assert_eq!(failed.status, 502, "{}", failed.text());
    assert_eq!(part_names(&failed.timing()), ["total"], "an error says its total only");

    let gw = gateway(&route_r(&rt.url(), &rt.url()).toml()).await;
    let mut c = common::grpc::client(gw.grpc_addr()).await;
    let answer = c
        .model_infer(common::grpc::with_budget(
            common::grpc::fp32_request("t", &[[1.0, 2.0]]),
            "250",
        ))
        .await
        .expect("served");
    let value = answer.metadata().get("server-timing").expect("in the metadata");
    let parts = timing_parts(value.to_str().expect("ascii"));
    assert_eq!(part_names(&parts), ["backend", "gateway", "total"]);
    assert!(part(&parts, "backend") >= 20.0, "{parts:?}");
    // The same field in the answer's trailers, read off the wire (tonic's client merges
    // trailers into the answer's metadata).
    let (headers, trailers) = raw_grpc_infer(gw.grpc_addr()).await;
    let leading = headers.get("server-timing").expect("in the headers");
    assert_eq!(trailers.get("server-timing"), Some(leading), "{trailers:?}");
    assert_eq!(trailers.get("grpc-status").map(|v| v.as_bytes()), Some(&b"0"[..]));
}

/// An HTTP/1.1 endpoint on loopback answering every request with a KServe v2 answer
/// that carries a `Server-Timing` and an `x-tiergate-tier` of its own.
async fn boastful() -> std::net::SocketAddr {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                loop {
                    let Ok(n) = stream.read(&mut chunk).await else { return };
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
                        continue;
                    };
                    let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
                    let len: usize = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:"))
                        .and_then(|v| v.trim().parse().ok())
                        .unwrap_or(0);
                    if buf.len() < end + 4 + len {
                        continue;
                    }
                    buf.drain(..end + 4 + len);
                    let body = r#"{"model_name":"m","outputs":[]}"#;
                    let answer = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nserver-timing: db;dur=99\r\n\
                         x-tiergate-tier: elsewhere\r\ncontent-length: {}\r\n\r\n{body}",
                        body.len()
                    );
                    if stream.write_all(answer.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

#[tokio::test]
async fn a_backends_own_fields_are_replaced_on_http1_and_http2_alike() {
    let backend = boastful().await;
    let toml = Route::new("timing_own")
        .model("m")
        .only(&["realtime"])
        .set("realtime.endpoints", vec![format!("http://{backend}")])
        .set("realtime.health.check_path", "")
        .toml();
    let gw = gateway(&toml).await;
    let (http1, _) = timed(gw.http_addr(), "250").await;
    let h2 = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .http2_only(true)
        .build_http::<http_body_util::Full<bytes::Bytes>>();
    let request = http::Request::post(format!("http://{}/v2/models/m/infer", gw.http_addr()))
        .header("x-tiergate-budget-ms", "250")
        .header("content-type", "application/json")
        .body(http_body_util::Full::new(bytes::Bytes::from_static(BODY.as_bytes())))
        .expect("request");
    let http2 = Answer::read(h2.request(request).await.expect("answered over HTTP/2")).await;
    for (answer, protocol) in [(http1, "HTTP/1.1"), (http2, "HTTP/2")] {
        assert_eq!(answer.status, 200, "{protocol}: {}", answer.text());
        let fields = |name: &str| answer.headers.get_all(name).iter().count();
        assert_eq!(
            (fields("server-timing"), fields("x-tiergate-tier")),
            (1, 1),
            "{protocol}: {:?}",
            answer.headers
        );
        assert_eq!(answer.tier(), (Some("realtime"), Some("budget_realtime")), "{protocol}");
        assert_eq!(
            part_names(&answer.timing()),
            ["backend", "gateway", "total"],
            "{protocol}"
        );
        assert_eq!(answer.header("x-tiergate-policy-version"), Some("1"), "{protocol}");
    }
}

/// One ModelInfer call over h2c, read off the wire: the answer's headers and trailers.
async fn raw_grpc_infer(addr: std::net::SocketAddr) -> (http::HeaderMap, http::HeaderMap) {
    use http_body_util::{BodyExt, Full};
    let message = prost::Message::encode_to_vec(&common::grpc::fp32_request("raw", &[[1.0, 2.0]]));
    let mut frame = vec![0u8];
    frame.extend_from_slice(&(message.len() as u32).to_be_bytes());
    frame.extend_from_slice(&message);
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .http2_only(true)
        .build_http::<Full<bytes::Bytes>>();
    let request = http::Request::post(format!("http://{addr}/inference.GRPCInferenceService/ModelInfer"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("x-tiergate-budget-ms", "250")
        .body(Full::new(bytes::Bytes::from(frame)))
        .expect("request");
    let response = client.request(request).await.expect("exchange");
    let headers = response.headers().clone();
    let collected = response.into_body().collect().await.expect("body");
    (headers, collected.trailers().cloned().unwrap_or_default())
}
