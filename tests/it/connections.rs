//! Connection hygiene on every door: sockets that send nothing, half a request head or
//! half an HTTP/2 preface are closed by the first-request deadline, idle keep-alive
//! connections by the idle timeout, a client address past its connection limit is
//! refused at accept, and other clients are served throughout.

use crate::common;

use std::net::SocketAddr;
use std::time::Duration;

use common::{backend, backend_with, config, eventually, gateway_with, infer, metric, route_r, BODY};
use tiergate::sim::{ModelSpec, Profile};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

/// Longest a closed socket may take to show it: far past every deadline set here.
const BOUND: Duration = Duration::from_secs(10);

/// Reads until the gateway closes `stream`, returning what it sent first; fails the
/// test if it is still open after [`BOUND`].
async fn closed_by_gateway(mut stream: TcpStream, what: &str) -> Vec<u8> {
    let mut got = Vec::new();
    let read = tokio::time::timeout(BOUND, async {
        let mut buf = [0u8; 4096];
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    assert!(read.is_ok(), "{what}: still open after {BOUND:?}");
    got
}

/// A connection to `addr` from the loopback address `from` (127.0.0.x).
async fn connect_from(from: &str, addr: SocketAddr) -> TcpStream {
    let socket = TcpSocket::new_v4().expect("socket");
    socket.bind(format!("{from}:0").parse().expect("addr")).expect("bind");
    socket.connect(addr).await.expect("connect")
}

#[tokio::test]
async fn sockets_without_a_request_are_closed_and_the_door_stays_open() {
    let be = backend(&["m"]).await;
    let mut cfg = config();
    cfg.limits.header_read_timeout = Duration::from_millis(300);
    cfg.limits.max_connections = 6;
    cfg.limits.max_connections_per_client = 0;
    let gw = gateway_with(cfg, &route_r(&be.url(), &be.url()).flags(&["realtime"]).toml()).await;

    for addr in [gw.http_addr(), gw.grpc_addr()] {
        // Six sockets take every connection the door allows: silent, half a request
        // head, half the HTTP/2 preface, the whole preface without its first frame, a
        // head sent a byte every 100 ms, and one more silent.
        let silent = TcpStream::connect(addr).await.expect("connect");
        let mut half_head = TcpStream::connect(addr).await.expect("connect");
        half_head.write_all(b"GET /v2/health/ready HTT").await.expect("write");
        let mut half_preface = TcpStream::connect(addr).await.expect("connect");
        half_preface.write_all(b"PRI * HTTP/2.0\r\n").await.expect("write");
        let mut preface_only = TcpStream::connect(addr).await.expect("connect");
        preface_only
            .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
            .await
            .expect("write");
        let slow = TcpStream::connect(addr).await.expect("connect");
        let (mut slow_read, mut slow_write) = slow.into_split();
        let trickle = tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(100));
            for byte in b"GET /v2/health/ready HTTP/1.1\r\nhost: x\r\n\r\n" {
                tick.tick().await;
                if slow_write.write_all(&[*byte]).await.is_err() {
                    return;
                }
            }
        });
        let silent_too = TcpStream::connect(addr).await.expect("connect");

        // While they are held, the door is full: a new client is closed at once.
        let refused = TcpStream::connect(addr).await.expect("connect");
        closed_by_gateway(refused, "a connection past limits.max_connections").await;

        for (stream, what) in [
            (silent, "a silent socket"),
            (half_head, "half a request head"),
            (half_preface, "half the HTTP/2 preface"),
            (preface_only, "the HTTP/2 preface without its first frame"),
            (silent_too, "another silent socket"),
        ] {
            let got = closed_by_gateway(stream, what).await;
            assert!(!got.starts_with(b"HTTP/1.1 200"), "{what} was never answered");
        }
        let mut rest = Vec::new();
        let slow_closed = tokio::time::timeout(BOUND, slow_read.read_to_end(&mut rest)).await;
        assert!(slow_closed.is_ok(), "a head sent a byte every 100 ms is cut");
        assert!(!rest.starts_with(b"HTTP/1.1 200"), "the slow head was never answered");
        trickle.abort();
    }

    // The door is open again for everyone.
    let answer = infer(gw.http_addr(), "m", &[], BODY).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    let mut grpc = common::grpc::client(gw.grpc_addr()).await;
    let reply = grpc.model_infer(common::grpc::fp32_request("g", &[[1.0, 2.0]])).await;
    assert!(reply.is_ok(), "the gRPC door serves again: {reply:?}");
    let closed = metric(&gw, "tiergate_connections_closed_total{reason=\"first_request\"}").await;
    assert!(
        closed >= 8.0,
        "the sockets the servers did not close themselves are counted, got {closed}"
    );
}

#[tokio::test]
async fn idle_connections_are_closed_but_a_slow_request_is_not() {
    let slow = ModelSpec::new(
        "m",
        Profile {
            a: Duration::from_millis(800),
            ..Profile::default()
        },
    );
    let be = backend_with(vec![slow]).await;
    let mut cfg = config();
    cfg.limits.idle_timeout = Duration::from_millis(200);
    let gw = gateway_with(
        cfg,
        &route_r(&be.url(), &be.url()).flags(&["realtime", "micro_batch"]).toml(),
    )
    .await;

    // A request that takes four idle timeouts is answered on its connection.
    let mut stream = TcpStream::connect(gw.http_addr()).await.expect("connect");
    let head = format!(
        "POST /v2/models/m/infer HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
         x-tiergate-budget-ms: 3000\r\ncontent-length: {}\r\n\r\n{BODY}",
        BODY.len()
    );
    stream.write_all(head.as_bytes()).await.expect("write");
    // Then the connection, kept alive and idle, is closed by the idle timeout.
    let got = closed_by_gateway(stream, "an idle keep-alive connection").await;
    let text = String::from_utf8_lossy(&got);
    assert!(
        text.starts_with("HTTP/1.1 200"),
        "the slow request was answered first: {text}"
    );

    // The same on the gRPC door, for a call and for an HTTP/2 connection left idle.
    let mut grpc = common::grpc::client(gw.grpc_addr()).await;
    let reply = grpc
        .model_infer(common::grpc::with_budget(
            common::grpc::fp32_request("g", &[[1.0, 2.0]]),
            "3000",
        ))
        .await;
    assert!(reply.is_ok(), "a slow gRPC call is not cut: {reply:?}");
    eventually(BOUND, "the idle connections counted", || async {
        (metric(&gw, "tiergate_connections_closed_total{reason=\"idle\"}").await >= 2.0).then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_client_past_its_connection_limit_is_refused_and_others_are_served() {
    let be = backend(&["m"]).await;
    let mut cfg = config();
    cfg.limits.max_connections_per_client = 3;
    let gw = gateway_with(cfg, &route_r(&be.url(), &be.url()).flags(&["realtime"]).toml()).await;

    for addr in [gw.http_addr(), gw.grpc_addr()] {
        let mut held = Vec::new();
        for _ in 0..3 {
            held.push(connect_from("127.0.0.2", addr).await);
        }
        let fourth = connect_from("127.0.0.2", addr).await;
        closed_by_gateway(fourth, "a fourth connection from one address").await;
        // Another address is served meanwhile.
        let answer = infer(gw.http_addr(), "m", &[], BODY).await;
        assert_eq!(answer.status, 200, "{}", answer.text());
        drop(held);
        // Once the held ones close, the address may connect again.
        eventually(BOUND, "127.0.0.2 connects again", || async {
            let mut again = connect_from("127.0.0.2", gw.http_addr()).await;
            again
                .write_all(b"GET /v2/health/live HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
                .await
                .ok()?;
            let mut got = Vec::new();
            again.read_to_end(&mut got).await.ok()?;
            got.starts_with(b"HTTP/1.1 200").then_some(())
        })
        .await;
    }
    let refused = metric(
        &gw,
        "tiergate_admission_refusals_total{reason=\"connections_per_client\"}",
    )
    .await;
    assert!(refused >= 2.0, "refusals are counted, got {refused}");
}

/// Sends a health check on `stream` (kept alive) and reads its whole answer.
async fn live_on(stream: &mut TcpStream) -> Option<String> {
    stream
        .write_all(b"GET /v2/health/live HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .ok()?;
    let mut buf = [0u8; 1024];
    let n = tokio::time::timeout(BOUND, stream.read(&mut buf)).await.ok()?.ok()?;
    Some(String::from_utf8_lossy(&buf[..n]).into_owned())
}

#[tokio::test]
async fn a_full_table_makes_room_for_a_newcomer_however_many_silent_sockets_are_reopened() {
    let be = backend(&["m"]).await;
    let mut cfg = config();
    cfg.limits.max_connections = 32;
    cfg.limits.max_connections_per_client = 0;
    let gw = gateway_with(cfg, &route_r(&be.url(), &be.url()).flags(&["realtime"]).toml()).await;
    // Silent sockets from 16 addresses take every place, and are reopened as they close.
    let mut silent = Vec::new();
    for i in 0..32 {
        silent.push(connect_from(&format!("127.0.0.{}", 10 + i % 16), gw.http_addr()).await);
    }
    let mut served = 0;
    for round in 0..10 {
        for i in 0..8 {
            silent.push(connect_from(&format!("127.0.0.{}", 10 + (round + i) % 16), gw.http_addr()).await);
        }
        let mut newcomer = connect_from("127.0.0.100", gw.http_addr()).await;
        match live_on(&mut newcomer).await {
            Some(answer) if answer.starts_with("HTTP/1.1 200") => served += 1,
            other => panic!("round {round}: a newcomer was kept out: {other:?}"),
        }
    }
    assert_eq!(served, 10);
    let evicted = metric(&gw, "tiergate_connections_closed_total{reason=\"evicted\"}").await;
    assert!(evicted >= 10.0, "places were made by closing silent sockets: {evicted}");
}

#[tokio::test]
async fn a_kept_alive_connection_lives_to_its_idle_timeout_not_the_header_read_timeout() {
    let be = backend(&["m"]).await;
    let mut cfg = config();
    cfg.limits.header_read_timeout = Duration::from_millis(200);
    cfg.limits.idle_timeout = Duration::from_secs(30);
    let gw = gateway_with(cfg, &route_r(&be.url(), &be.url()).flags(&["realtime"]).toml()).await;
    let mut stream = TcpStream::connect(gw.http_addr()).await.expect("connect");
    let first = live_on(&mut stream).await.expect("answered");
    assert!(first.starts_with("HTTP/1.1 200"), "{first}");
    // Three header read timeouts between two requests: a load balancer's pool keeps
    // connections far longer, and the next request must find this one open.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let second = live_on(&mut stream).await.expect("still open");
    assert!(second.starts_with("HTTP/1.1 200"), "{second}");
}

#[tokio::test]
async fn an_idle_http2_connection_is_sent_goaway_before_it_closes() {
    let be = backend(&["m"]).await;
    let mut cfg = config();
    cfg.limits.idle_timeout = Duration::from_millis(200);
    let gw = gateway_with(cfg, &route_r(&be.url(), &be.url()).flags(&["realtime"]).toml()).await;
    for addr in [gw.http_addr(), gw.grpc_addr()] {
        let mut stream = TcpStream::connect(addr).await.expect("connect");
        // h2c with prior knowledge: the preface and an empty SETTINGS frame, then nothing.
        let mut opening = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        opening.extend_from_slice(&[0, 0, 0, 0x4, 0, 0, 0, 0, 0]);
        stream.write_all(&opening).await.expect("write");
        let got = closed_by_gateway(stream, "an idle HTTP/2 connection").await;
        let mut frames = Vec::new();
        let mut at = 0;
        while at + 9 <= got.len() {
            let len = usize::from(got[at]) << 16 | usize::from(got[at + 1]) << 8 | usize::from(got[at + 2]);
            frames.push(got[at + 3]);
            at += 9 + len;
        }
        assert!(
            frames.contains(&0x7),
            "{addr}: a GOAWAY frame (type 7) among {frames:?}"
        );
    }
}

#[tokio::test]
async fn a_body_that_stops_arriving_is_answered_408_at_the_body_read_timeout() {
    let be = backend(&["m"]).await;
    let mut cfg = config();
    cfg.limits.body_read_timeout = Duration::from_millis(300);
    let gw = gateway_with(cfg, &route_r(&be.url(), &be.url()).flags(&["realtime"]).toml()).await;
    // A body that came whole with its head is read without the timer, and served.
    assert_eq!(infer(gw.http_addr(), "m", &[], BODY).await.status, 200);
    let mut stalled = TcpStream::connect(gw.http_addr()).await.expect("connect");
    let head = format!(
        "POST /v2/models/m/infer HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        BODY.len()
    );
    stalled.write_all(head.as_bytes()).await.expect("write");
    stalled.write_all(&BODY.as_bytes()[..10]).await.expect("write");
    let started = std::time::Instant::now();
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    while !answer.windows(4).any(|w| w == b"\r\n\r\n") || !String::from_utf8_lossy(&answer).contains("}") {
        let n = tokio::time::timeout(BOUND, stalled.read(&mut buf))
            .await
            .expect("answered")
            .expect("read");
        assert!(n > 0, "closed without an answer: {}", String::from_utf8_lossy(&answer));
        answer.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&answer);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(text.contains("took longer than"), "{text}");
    assert!(
        started.elapsed() >= Duration::from_millis(250),
        "not before the timeout"
    );
    // The door is still open to everyone else.
    assert_eq!(infer(gw.http_addr(), "m", &[], BODY).await.status, 200);
}

/// Reads one answer with a JSON body from `stream` (lower-cased).
async fn answer_on(stream: &mut TcpStream) -> String {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&got).contains('}') {
        let n = tokio::time::timeout(BOUND, stream.read(&mut buf))
            .await
            .expect("answered")
            .expect("read");
        assert!(n > 0, "closed without an answer: {}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&buf[..n]);
    }
    String::from_utf8_lossy(&got).to_ascii_lowercase()
}

/// A POST head for model `m` declaring a `length`-byte body.
fn post_head(length: usize) -> String {
    format!("POST /v2/models/m/infer HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {length}\r\n\r\n")
}

#[tokio::test]
async fn a_full_table_makes_room_however_many_connections_trickle_half_sent_bodies() {
    let be = backend(&["m"]).await;
    let mut cfg = config();
    cfg.limits.max_connections = 32;
    cfg.limits.max_connections_per_client = 0;
    let gw = gateway_with(cfg, &route_r(&be.url(), &be.url()).flags(&["realtime"]).toml()).await;
    let addr = gw.http_addr();
    // 32 connections from 16 addresses, each a whole head declaring 1,000 bytes of body
    // and then a byte every 200 ms, reopened whenever the gateway closes it.
    let mut tricklers = Vec::new();
    for i in 0..32 {
        let from = format!("127.0.0.{}", 10 + i % 16);
        let (opened, mut ready) = tokio::sync::watch::channel(false);
        tricklers.push(tokio::spawn(async move {
            loop {
                let mut stream = connect_from(&from, addr).await;
                if stream.write_all(post_head(1000).as_bytes()).await.is_err() {
                    continue;
                }
                let _ = opened.send(true);
                let mut tick = tokio::time::interval(Duration::from_millis(200));
                while stream.write_all(b"{").await.is_ok() {
                    tick.tick().await;
                }
            }
        }));
        ready.wait_for(|opened| *opened).await.expect("opened");
    }
    for round in 0..10 {
        let mut newcomer = connect_from("127.0.0.100", addr).await;
        match live_on(&mut newcomer).await {
            Some(answer) if answer.starts_with("HTTP/1.1 200") => {}
            other => panic!("round {round}: a newcomer was kept out by half-sent bodies: {other:?}"),
        }
    }
    for trickler in tricklers {
        trickler.abort();
    }
    let evicted = metric(&gw, "tiergate_connections_closed_total{reason=\"evicted\"}").await;
    assert!(
        evicted >= 10.0,
        "places were made by closing the slowest bodies: {evicted}"
    );
}

#[tokio::test]
async fn a_body_slower_than_the_minimum_receive_rate_is_answered_408() {
    let be = backend(&["m"]).await;
    let mut cfg = config();
    cfg.limits.body_read_timeout = Duration::from_secs(60);
    cfg.limits.min_receive_rate = 1024;
    let gw = gateway_with(cfg, &route_r(&be.url(), &be.url()).flags(&["realtime"]).toml()).await;
    let mut stream = TcpStream::connect(gw.http_addr()).await.expect("connect");
    stream.write_all(post_head(100_000).as_bytes()).await.expect("write");
    let started = std::time::Instant::now();
    // 100 bytes every 200 ms: 500 bytes a second, half the floor.
    let (mut read, mut write) = stream.into_split();
    let trickle = tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_millis(200));
        while write.write_all(&[b' '; 100]).await.is_ok() {
            tick.tick().await;
        }
    });
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&answer).contains('}') {
        let n = tokio::time::timeout(Duration::from_secs(20), read.read(&mut buf))
            .await
            .expect("answered within 20 s")
            .expect("read");
        assert!(n > 0, "closed without an answer: {}", String::from_utf8_lossy(&answer));
        answer.extend_from_slice(&buf[..n]);
    }
    trickle.abort();
    let text = String::from_utf8_lossy(&answer).to_ascii_lowercase();
    assert!(text.starts_with("http/1.1 408"), "{text}");
    assert!(text.contains("min_receive_rate"), "{text}");
    assert!(
        text.contains("connection: close"),
        "the rest of the body is not read: {text}"
    );
    let took = started.elapsed();
    assert!(
        (Duration::from_secs(9)..Duration::from_secs(15)).contains(&took),
        "cut at the end of its first 10 s window, long before body_read_timeout: {took:?}"
    );
}

#[tokio::test]
async fn an_answer_given_before_its_body_was_read_says_the_connection_closes_and_one_after_keeps_it() {
    let be = backend(&["m"]).await;
    let mut cfg = config();
    cfg.limits.max_body_bytes = 1 << 20;
    let toml = route_r(&be.url(), &be.url())
        .flags(&["realtime"])
        .set("limits.rate", 0.1)
        .set("limits.burst", 2)
        .toml();
    let gw = gateway_with(cfg, &toml).await;
    // A body over max_body_bytes is refused from its head, unread.
    let mut stream = TcpStream::connect(gw.http_addr()).await.expect("connect");
    stream.write_all(post_head(2 << 20).as_bytes()).await.expect("write");
    let text = answer_on(&mut stream).await;
    assert!(text.starts_with("http/1.1 413"), "{text}");
    assert!(text.contains("connection: close"), "{text}");
    // The route's other request: served, the connection kept.
    let mut stream = TcpStream::connect(gw.http_addr()).await.expect("connect");
    let whole = format!("{}{BODY}", post_head(BODY.len()));
    stream.write_all(whole.as_bytes()).await.expect("write");
    let text = answer_on(&mut stream).await;
    assert!(
        text.starts_with("http/1.1 200") && !text.contains("connection: close"),
        "{text}"
    );
    // Past the route's rate, with a whole body: refused, and the connection kept.
    stream.write_all(whole.as_bytes()).await.expect("write");
    let text = answer_on(&mut stream).await;
    assert!(
        text.starts_with("http/1.1 429") && !text.contains("connection: close"),
        "{text}"
    );
    // Past it with half a body sent: refused from the head, unread, and said.
    stream.write_all(post_head(BODY.len()).as_bytes()).await.expect("write");
    stream.write_all(&BODY.as_bytes()[..10]).await.expect("write");
    let text = answer_on(&mut stream).await;
    assert!(text.starts_with("http/1.1 429"), "{text}");
    assert!(text.contains("connection: close"), "{text}");
}
