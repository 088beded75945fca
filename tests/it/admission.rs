//! Admission: rate limits per route and per tenant (429 with Retry-After and RateLimit
//! headers, tenants independent), and global limits that shed new work with 503 rather
//! than grow: requests in flight, body bytes held, resident memory, connections.

use crate::common;

use std::time::Duration;

use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::Instant;

/// Route `r` for model `m` on `rt`.
fn route(rt: &str) -> Route {
    Route::new("r").model("m").realtime(rt)
}

async fn call(gw: &tiergate::app::Gateway, tenant: Option<&str>) -> Answer {
    let mut headers = vec![("x-tiergate-budget-ms", "250")];
    if let Some(t) = tenant {
        headers.push(("x-api-key", t));
    }
    infer(gw.http_addr(), "m", &headers, BODY).await
}

#[tokio::test]
async fn tenants_have_their_own_buckets_and_hear_how_long_to_wait() {
    let rt = backend(&["m"]).await;
    // One request per 10 s per tenant, bursts of 3: nothing refills during the test.
    let gw = gateway(
        &route(&rt.url())
            .set("limits.tenant_rate", 0.1)
            .set("limits.tenant_burst", 3)
            .toml(),
    )
    .await;
    let mut a = Vec::new();
    for _ in 0..5 {
        a.push(call(&gw, Some("tenant-a")).await);
    }
    let statuses: Vec<u16> = a.iter().map(|r| r.status).collect();
    assert_eq!(statuses, [200, 200, 200, 429, 429]);
    let refused = &a[3];
    let retry: u64 = refused
        .header("retry-after")
        .expect("Retry-After")
        .parse()
        .expect("seconds");
    assert!((1..=10).contains(&retry), "retry after {retry} s");
    assert_eq!(refused.header("ratelimit-limit"), Some("3"));
    assert_eq!(refused.header("ratelimit-remaining"), Some("0"));
    assert_eq!(refused.header("ratelimit-policy"), Some("3;w=30"));
    assert!(refused.text().contains("tenant"), "{}", refused.text());
    // Tenant b, and callers without a key (one shared anonymous bucket), are untouched.
    for tenant in [Some("tenant-b"), None] {
        for _ in 0..3 {
            assert_eq!(call(&gw, tenant).await.status, 200, "{tenant:?}");
        }
        assert_eq!(call(&gw, tenant).await.status, 429, "{tenant:?} has its own limit");
    }
    assert_eq!(
        rt.sim.stats("m").expect("stats").requests,
        9,
        "refused requests never reach the backend"
    );
    let scrape = get(gw.metrics_addr(), "/metrics").await.text();
    assert!(
        scrape.contains("tiergate_admission_refusals_total{reason=\"tenant\"} 4"),
        "{scrape}"
    );
}

#[tokio::test]
async fn a_route_limit_caps_every_caller_together() {
    let rt = backend(&["m"]).await;
    let gw = gateway(&route(&rt.url()).set("limits.rate", 0.1).set("limits.burst", 2).toml()).await;
    let statuses = [
        call(&gw, Some("x")).await.status,
        call(&gw, Some("y")).await.status,
        call(&gw, Some("z")).await.status,
    ];
    assert_eq!(statuses, [200, 200, 429]);
}

#[tokio::test]
async fn requests_in_flight_past_the_limit_are_shed_at_once() {
    let rt = backend(&["m"]).await;
    rt.sim.hold();
    let mut config = config();
    config.limits.max_in_flight_requests = 4;
    let toml = route(&rt.url()).toml();
    let gw = gateway_with(config, &toml).await;
    let addr = gw.http_addr();
    let held: Vec<_> = (0..4)
        .map(|_| tokio::spawn(async move { infer(addr, "m", &[("x-tiergate-budget-ms", "250")], BODY).await }))
        .collect();
    wait_for(&rt, |s| s.requests == 4).await;
    let started = Instant::now();
    for _ in 0..6 {
        let r = infer(addr, "m", &[("x-tiergate-budget-ms", "250")], BODY).await;
        assert_eq!(r.status, 503, "{}", r.text());
        assert!(r.header("retry-after").is_some());
        assert!(r.text().contains("max_in_flight_requests"), "{}", r.text());
    }
    assert!(
        started.elapsed() < Duration::from_millis(200),
        "shed at once, not queued"
    );
    rt.sim.release();
    for h in held {
        let status = h.await.expect("task").status;
        assert!(status == 200 || status == 504, "admitted requests are served: {status}");
    }
    assert_eq!(infer(addr, "m", &[], BODY).await.status, 200, "the slots came back");
}

#[tokio::test]
async fn body_bytes_held_past_the_limit_are_shed() {
    let rt = backend(&["m"]).await;
    rt.sim.hold();
    let mut config = config();
    config.limits.max_in_flight_body_bytes = 8 << 10;
    let toml = route(&rt.url()).toml();
    let gw = gateway_with(config, &toml).await;
    let addr = gw.http_addr();
    // About 3 KiB each: two fit in 8 KiB, a third does not.
    let data: Vec<String> = (0..480).map(|i| format!("{i}.5")).collect();
    let body = format!(
        r#"{{"inputs":[{{"name":"INPUT0","datatype":"FP32","shape":[1,480],"data":[{}]}}]}}"#,
        data.join(",")
    );
    assert!((2100..3072).contains(&body.len()), "{}", body.len());
    let held: Vec<_> = (0..2)
        .map(|_| {
            let body = body.clone();
            tokio::spawn(async move { infer(addr, "m", &[("x-tiergate-budget-ms", "250")], &body).await })
        })
        .collect();
    wait_for(&rt, |s| s.requests == 2).await;
    let third = infer(addr, "m", &[("x-tiergate-budget-ms", "250")], &body).await;
    assert_eq!(third.status, 503, "{}", third.text());
    assert!(third.text().contains("max_in_flight_body_bytes"), "{}", third.text());
    rt.sim.release();
    for h in held {
        h.await.expect("task");
    }
    assert_eq!(infer(addr, "m", &[], &body).await.status, 200, "the bytes came back");
    // A body larger than the whole budget could never be held: 413, not a 503 to retry.
    let data: Vec<String> = (0..1800).map(|i| format!("{i}.5")).collect();
    let huge = format!(
        r#"{{"inputs":[{{"name":"INPUT0","datatype":"FP32","shape":[1,1800],"data":[{}]}}]}}"#,
        data.join(",")
    );
    assert!(huge.len() > 8 << 10, "{}", huge.len());
    let refused = infer(addr, "m", &[], &huge).await;
    assert_eq!(refused.status, 413, "{}", refused.text());
    assert!(
        refused.text().contains("max_in_flight_body_bytes"),
        "{}",
        refused.text()
    );
    assert!(refused.header("retry-after").is_none(), "nothing to retry");
}

#[tokio::test]
async fn above_the_memory_limit_new_work_is_shed() {
    let rt = backend(&["m"]).await;
    let mut config = config();
    config.limits.max_rss_bytes = 1; // any process is above this
    let toml = route(&rt.url()).toml();
    let gw = gateway_with(config, &toml).await;
    // The watcher reads memory every 100 ms; poll as a client would.
    let shed = eventually(Duration::from_secs(5), "shed above the memory limit", || async {
        Some(infer(gw.http_addr(), "m", &[], BODY).await).filter(|r| r.status == 503)
    })
    .await;
    assert!(shed.text().contains("memory"), "{}", shed.text());
}

#[tokio::test]
async fn past_the_connection_limit_an_idle_one_makes_room_and_else_the_newcomer_is_closed() {
    let rt = backend(&["m"]).await;
    let mut config = config();
    config.limits.max_connections = 2;
    let toml = route(&rt.url()).toml();
    let gw = gateway_with(config, &toml).await;
    let request = b"GET /v2/health/live HTTP/1.1\r\nhost: x\r\n\r\n";
    let mut open = Vec::new();
    for _ in 0..2 {
        let mut s = tokio::net::TcpStream::connect(gw.http_addr()).await.expect("connects");
        s.write_all(request).await.expect("writes");
        let mut buf = [0u8; 1024];
        let n = s.read(&mut buf).await.expect("reads");
        assert!(
            buf[..n].starts_with(b"HTTP/1.1 200"),
            "{:?}",
            String::from_utf8_lossy(&buf[..n])
        );
        open.push(s);
    }
    // Both are idle between requests: the longest idle closes for the newcomer.
    let mut third = tokio::net::TcpStream::connect(gw.http_addr()).await.expect("connects");
    third.write_all(request).await.expect("writes");
    let mut buf = [0u8; 64];
    let n = tokio::time::timeout(Duration::from_secs(5), third.read(&mut buf))
        .await
        .expect("answered, not hung")
        .expect("reads");
    assert!(
        buf[..n].starts_with(b"HTTP/1.1 200"),
        "{:?}",
        String::from_utf8_lossy(&buf[..n])
    );
    // The one closed gave its place back, so it was closed before the newcomer's answer.
    let mut closed = 0;
    for s in &mut open {
        let mut buf = [0u8; 64];
        if let Ok(Ok(0) | Err(_)) = tokio::time::timeout(Duration::from_millis(300), s.read(&mut buf)).await {
            closed += 1;
        }
    }
    assert_eq!(closed, 1, "one idle connection made room");
    drop((open, third));

    // Two connections with a request in flight each: none may close, so a third is.
    rt.sim.hold();
    let body = format!(
        "POST /v2/models/m/infer HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
         x-tiergate-budget-ms: 5000\r\ncontent-length: {}\r\n\r\n{BODY}",
        BODY.len()
    );
    let mut busy = Vec::new();
    for i in 1..=2u64 {
        let connected = eventually(Duration::from_secs(5), "a place for a busy connection", || async {
            let mut s = tokio::net::TcpStream::connect(gw.http_addr()).await.ok()?;
            s.write_all(body.as_bytes()).await.ok()?;
            Some(s)
        })
        .await;
        busy.push(connected);
        wait_for(&rt, |s| s.requests == i).await;
    }
    let mut fourth = tokio::net::TcpStream::connect(gw.http_addr())
        .await
        .expect("the kernel accepts");
    let _ = fourth.write_all(request).await;
    let mut buf = [0u8; 64];
    let read = tokio::time::timeout(Duration::from_secs(5), fourth.read(&mut buf))
        .await
        .expect("closed, not hung");
    assert!(matches!(read, Ok(0) | Err(_)), "the newcomer is closed: {read:?}");
    rt.sim.release();
    drop(busy);
}
