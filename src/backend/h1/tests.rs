use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Notify};

use super::*;

const LIMIT: usize = 1 << 20;

/// What the test backend saw, by connection (numbered from 0 in accept order).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    Request(usize),
    Closed(usize),
}

/// How the test backend answers.
#[derive(Clone)]
enum Mode {
    /// `200 ok`, keeping the connection open.
    KeepAlive,
    /// `200 ok` (no `Connection: close`), then closes the connection when told.
    CloseWhenTold(Arc<Notify>),
    /// A 200 with a body of this many bytes.
    Big(usize),
    /// Never answers.
    Silent,
}

/// A listener on a free loopback port, and its authority.
async fn listener() -> (TcpListener, Authority) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let authority = listener
        .local_addr()
        .expect("bound")
        .to_string()
        .parse()
        .expect("authority");
    (listener, authority)
}

/// A raw HTTP/1.1 backend reporting every request and every closed connection.
async fn backend(mode: Mode) -> (Authority, mpsc::UnboundedReceiver<Event>) {
    let (listener, authority) = listener().await;
    let (events, seen) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        for n in 0.. {
            let (stream, _) = listener.accept().await.expect("accept");
            tokio::spawn(serve(n, stream, mode.clone(), events.clone()));
        }
    });
    (authority, seen)
}

async fn serve(n: usize, mut stream: TcpStream, mode: Mode, events: mpsc::UnboundedSender<Event>) {
    let mut buf = Vec::new();
    loop {
        // One request head (these requests carry no body).
        while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
            let mut chunk = [0u8; 4096];
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => {
                    let _ = events.send(Event::Closed(n));
                    return;
                }
                Ok(read) => buf.extend_from_slice(&chunk[..read]),
            }
        }
        let end = buf.windows(4).position(|w| w == b"\r\n\r\n").expect("a whole head") + 4;
        buf.drain(..end);
        let _ = events.send(Event::Request(n));
        let body = match &mode {
            Mode::Silent => continue, // read on: the next read sees the caller leave
            Mode::Big(len) => "x".repeat(*len),
            Mode::KeepAlive | Mode::CloseWhenTold(_) => "ok".into(),
        };
        let answer = format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}", body.len());
        stream.write_all(answer.as_bytes()).await.expect("answer");
        if let Mode::CloseWhenTold(told) = &mode {
            told.notified().await;
            drop(stream);
            let _ = events.send(Event::Closed(n));
            return;
        }
    }
}

fn conns(authority: Authority, idle_timeout: Duration, max_idle: usize) -> Conns {
    Conns::new(authority, Duration::from_secs(1), idle_timeout, max_idle, None)
}

fn get() -> Request<Bytes> {
    Request::builder()
        .uri("/v2/health/ready")
        .body(Bytes::new())
        .expect("request")
}

async fn ok(conns: &Conns) {
    let answer = conns
        .send(get(), LIMIT)
        .await
        .unwrap_or_else(|_| panic!("the call failed"));
    assert_eq!(answer.status(), 200);
    assert_eq!(answer.body().as_ref(), b"ok");
}

#[tokio::test]
async fn sequential_calls_share_one_connection() {
    let (authority, mut seen) = backend(Mode::KeepAlive).await;
    let conns = conns(authority, IDLE_TIMEOUT, 8);
    for _ in 0..3 {
        ok(&conns).await;
        assert_eq!(seen.recv().await, Some(Event::Request(0)));
    }
    assert_eq!(conns.idle_count(), 1);
}

#[tokio::test]
async fn a_connection_the_backend_closed_is_replaced_before_the_request_leaves() {
    let close = Arc::new(Notify::new());
    let (authority, mut seen) = backend(Mode::CloseWhenTold(close.clone())).await;
    let conns = conns(authority, IDLE_TIMEOUT, 8);
    ok(&conns).await;
    assert_eq!(seen.recv().await, Some(Event::Request(0)));
    assert_eq!(
        conns.idle_count(),
        1,
        "the answer did not say the connection would close"
    );
    close.notify_one();
    assert_eq!(seen.recv().await, Some(Event::Closed(0)));
    // A connect waits for the I/O driver, which by then has also read the backend's FIN
    // on the idle connection (sent on loopback before this connect began).
    let elsewhere = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    TcpStream::connect(elsewhere.local_addr().expect("bound"))
        .await
        .expect("connect");
    ok(&conns).await;
    assert_eq!(
        seen.recv().await,
        Some(Event::Request(1)),
        "sent once, on a new connection"
    );
}

#[tokio::test]
async fn an_answer_over_the_limit_fails_and_its_connection_is_closed() {
    let (authority, mut seen) = backend(Mode::Big(1000)).await;
    let conns = conns(authority, IDLE_TIMEOUT, 8);
    let failed = conns.send(get(), 100).await;
    assert!(matches!(failed, Err(Failure::Body(_))));
    assert_eq!(seen.recv().await, Some(Event::Request(0)));
    assert_eq!(seen.recv().await, Some(Event::Closed(0)));
    assert_eq!(conns.idle_count(), 0);
}

#[tokio::test]
async fn a_dropped_call_closes_its_connection() {
    let (authority, mut seen) = backend(Mode::Silent).await;
    let conns = conns(authority, IDLE_TIMEOUT, 8);
    {
        let call = conns.send(get(), LIMIT);
        tokio::pin!(call);
        tokio::select! {
            _ = &mut call => panic!("the silent backend answered"),
            event = seen.recv() => assert_eq!(event, Some(Event::Request(0))),
        }
    } // the deadline passed: the call is dropped
    assert_eq!(seen.recv().await, Some(Event::Closed(0)));
    assert_eq!(conns.idle_count(), 0);
}

#[tokio::test]
async fn expired_connections_are_closed_not_reused() {
    let (authority, mut seen) = backend(Mode::KeepAlive).await;
    let conns = conns(authority, Duration::ZERO, 8);
    ok(&conns).await;
    ok(&conns).await;
    let mut events = vec![seen.recv().await, seen.recv().await, seen.recv().await];
    events.sort();
    let expected = [Event::Request(0), Event::Request(1), Event::Closed(0)].map(Some);
    assert_eq!(events, expected);
    conns.sweep();
    assert_eq!(seen.recv().await, Some(Event::Closed(1)));
    assert_eq!(conns.idle_count(), 0);
}

#[tokio::test]
async fn at_most_max_idle_connections_are_kept() {
    let (authority, mut seen) = backend(Mode::KeepAlive).await;
    let conns = conns(authority, IDLE_TIMEOUT, 1);
    tokio::join!(ok(&conns), ok(&conns));
    let mut events = vec![seen.recv().await, seen.recv().await, seen.recv().await];
    events.sort();
    assert_eq!(events[..2], [Some(Event::Request(0)), Some(Event::Request(1))]);
    assert!(matches!(events[2], Some(Event::Closed(_))), "{events:?}");
    assert_eq!(conns.idle_count(), 1);
}

#[test]
fn a_connection_carries_calls_only_for_the_runtime_that_opened_it() {
    let server = tokio::runtime::Runtime::new().expect("runtime");
    let (authority, mut seen) = server.block_on(backend(Mode::KeepAlive));
    let conns = Arc::new(conns(authority, IDLE_TIMEOUT, 8));
    let current = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
    };
    let (first, second) = (current(), current());
    first.block_on(ok(&conns));
    first.block_on(ok(&conns));
    second.block_on(ok(&conns));
    first.block_on(ok(&conns));
    let events: Vec<_> = (0..4).map(|_| seen.blocking_recv()).collect();
    let expected = [0, 0, 1, 0].map(|n| Some(Event::Request(n)));
    assert_eq!(events, expected);
    assert_eq!(conns.idle_count(), 2);
}

/// A raw backend that answers every request with `answer` (then closes the connection
/// when `close`), and reports each request as it arrived: its head and body, and on
/// which connection.
async fn scripted(answer: &'static [u8], close: bool) -> (Authority, mpsc::UnboundedReceiver<(usize, Vec<u8>)>) {
    let (listener, authority) = listener().await;
    let (events, seen) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        for n in 0.. {
            let (mut stream, _) = listener.accept().await.expect("accept");
            let events = events.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                loop {
                    let Some(request) = read_request(&mut stream, &mut buf).await else {
                        return;
                    };
                    let _ = events.send((n, request));
                    if stream.write_all(answer).await.is_err() || close {
                        return;
                    }
                }
            });
        }
    });
    (authority, seen)
}

/// One request off `stream` (its head, and as many body bytes as its content-length
/// says), `None` at the end of the stream.
async fn read_request(stream: &mut TcpStream, buf: &mut Vec<u8>) -> Option<Vec<u8>> {
    let mut chunk = [0u8; 65536];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_lowercase();
            let length = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length: "))
                .map_or(0, |n| n.trim().parse::<usize>().expect("a length"));
            if buf.len() >= end + 4 + length {
                return Some(buf.drain(..end + 4 + length).collect());
            }
        }
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

fn post(body: impl Into<Bytes>) -> Request<Bytes> {
    Request::post("/v2/models/m/infer?x=1")
        .header("content-type", "application/json")
        .header("x-custom", "v")
        .body(body.into())
        .expect("request")
}

#[tokio::test]
async fn the_request_goes_out_as_written_with_its_host_and_length() {
    let (authority, mut seen) = scripted(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok", false).await;
    let conns = conns(authority.clone(), IDLE_TIMEOUT, 8);
    let answer = conns.send(post("{\"inputs\":[]}"), LIMIT).await.expect("answered");
    assert_eq!(answer.body().as_ref(), b"ok");
    assert!(
        answer.headers().get("content-length").is_none(),
        "the gateway frames what it passes on"
    );
    let (_, request) = seen.recv().await.expect("a request");
    let expected = format!(
        "POST /v2/models/m/infer?x=1 HTTP/1.1\r\nhost: {authority}\r\ncontent-type: application/json\r\nx-custom: v\r\n\
         content-length: 13\r\n\r\n{{\"inputs\":[]}}"
    );
    assert_eq!(String::from_utf8_lossy(&request), expected);
    // A body larger than one write goes out whole, after its head.
    let big = vec![b'7'; 100_000];
    conns.send(post(big.clone()), LIMIT).await.expect("answered");
    let (connection, request) = seen.recv().await.expect("a request");
    assert_eq!(connection, 0, "the same connection");
    assert!(request.ends_with(&big) && request.len() > big.len());
}

#[tokio::test]
async fn chunked_answers_are_joined_and_informational_ones_skipped() {
    let answer = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\nx-kept: yes\r\n\r\n\
                   5;ext=1\r\nhello\r\n1\r\n \r\n5\r\nworld\r\n0\r\nx-trailer: t\r\n\r\n";
    let (authority, mut seen) = scripted(answer, false).await;
    let conns = conns(authority, IDLE_TIMEOUT, 8);
    for _ in 0..2 {
        let answer = conns.send(get(), LIMIT).await.expect("answered");
        assert_eq!(answer.status(), 200);
        assert_eq!(answer.body().as_ref(), b"hello world");
        assert_eq!(answer.headers()["x-kept"], "yes");
        assert_eq!(
            seen.recv().await.map(|(n, _)| n),
            Some(0),
            "kept alive after a chunked answer"
        );
    }
    let over = conns.send(get(), 10).await;
    assert!(matches!(over, Err(Failure::Body(_))), "{over:?}");
    assert_eq!(conns.idle_count(), 0, "a refused answer's connection is not kept");
}

#[tokio::test]
async fn an_answer_that_ends_with_its_connection_is_read_to_the_end_and_not_reused() {
    for answer in [
        &b"HTTP/1.1 200 OK\r\n\r\nto the end"[..],
        b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 10\r\n\r\nto the end",
        b"HTTP/1.0 200 OK\r\ncontent-length: 10\r\n\r\nto the end",
    ] {
        let (authority, mut seen) = scripted(answer, true).await;
        let conns = conns(authority, IDLE_TIMEOUT, 8);
        for n in 0..2 {
            let answer = conns.send(get(), LIMIT).await.expect("answered");
            assert_eq!(answer.body().as_ref(), b"to the end");
            assert_eq!(seen.recv().await.map(|(c, _)| c), Some(n), "a new connection each time");
        }
        assert_eq!(conns.idle_count(), 0);
    }
}

#[tokio::test]
async fn broken_answers_fail_and_are_never_reused() {
    for (answer, fault) in [
        (
            &b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\ncontent-length: 6\r\n\r\nhello!"[..],
            "other",
        ),
        (b"HTTP/1.1 200 OK\r\ncontent-length: 50\r\n\r\nshort", "body"),
        (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n", "body"),
        (b"not http at all\r\n\r\n", "other"),
        (
            b"HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\n\r\n",
            "other",
        ),
        (b"HTTP/1.1 100 Continue\r\n\r\n", "other"),
        // Closed without a byte of answer: the one failure a pool may send elsewhere.
        (b"", "unanswered"),
    ] {
        let (authority, _seen) = scripted(answer, true).await;
        let conns = conns(authority, IDLE_TIMEOUT, 8);
        let failed = conns.send(get(), LIMIT).await;
        match (failed, fault) {
            (Err(Failure::Body(_)), "body") | (Err(Failure::Other(_)), "other") => {}
            (Err(Failure::Unanswered(_)), "unanswered") => {}
            (other, _) => panic!("{}: {other:?}", String::from_utf8_lossy(answer)),
        }
        assert_eq!(conns.idle_count(), 0);
    }
    // Bytes past a whole answer: it is passed on, the connection is out of step.
    let (authority, mut seen) = scripted(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nokEXTRA", false).await;
    let conns = conns(authority, IDLE_TIMEOUT, 8);
    assert_eq!(conns.send(get(), LIMIT).await.expect("answered").body().as_ref(), b"ok");
    assert_eq!(conns.idle_count(), 0);
    conns.send(get(), LIMIT).await.expect("answered");
    assert_eq!(seen.recv().await.map(|(n, _)| n), Some(0));
    assert_eq!(
        seen.recv().await.map(|(n, _)| n),
        Some(1),
        "the next call on a new connection"
    );
}

#[tokio::test]
async fn only_end_to_end_headers_go_out_and_the_calls_trace_replaces_the_clients() {
    let (authority, mut seen) = scripted(
        b"HTTP/1.1 200 OK\r\nconnection: x-hidden\r\nx-hidden: 1\r\nkeep-alive: timeout=5\r\nx-kept: 2\r\ncontent-length: 0\r\n\r\n",
        false,
    )
    .await;
    let conns = conns(authority.clone(), IDLE_TIMEOUT, 8);
    let mut parts = post("{}").into_parts().0;
    for (name, value) in [
        ("connection", "x-private"),
        ("x-private", "secret"),
        ("host", "gateway.example"),
        ("content-length", "2"),
        ("cookie", "session=1"),
        ("traceparent", "00-0000000000000000000000000000000a-000000000000000b-01"),
        ("x-request-id", "client-id"),
    ] {
        parts.headers.append(name, HeaderValue::from_static(value));
    }
    let trace = crate::trace::TraceParent {
        trace_id: 0xa,
        span_id: 0xc,
        sampled: true,
    };
    let trace = (trace, HeaderValue::from_static("the-id"));
    let answer = conns
        .send_call(
            &mut parts,
            Bytes::from_static(b"{}"),
            (Some(&trace), tokio::time::Instant::now()),
            (LIMIT, false),
        )
        .await
        .expect("answered");
    let kept: Vec<&str> = answer.headers().keys().map(|k| k.as_str()).collect();
    assert_eq!(kept, ["x-kept"], "the answer's hop-by-hop headers stay behind");
    let (_, request) = seen.recv().await.expect("a request");
    let expected = format!(
        "POST /v2/models/m/infer?x=1 HTTP/1.1\r\nhost: {authority}\r\n\
         traceparent: 00-0000000000000000000000000000000a-000000000000000c-01\r\nx-request-id: the-id\r\n\
         content-type: application/json\r\nx-custom: v\r\ncontent-length: 2\r\n\r\n{{}}"
    );
    assert_eq!(String::from_utf8_lossy(&request), expected);
}
