//! The HTTP door's HTTP/1.1 as clients write it on the wire: the common request (served
//! by the door's own server) and every other framing (handed to hyper with what was
//! read) answered alike, on one connection, in order.

use crate::common;

use std::time::Duration;

use common::{backend, config, gateway_with, route_r, BODY};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Longest an answer may take here: far past the simulator's.
const BOUND: Duration = Duration::from_secs(10);

/// One answer as it came: status line, headers (names lower-cased), body.
struct Raw {
    status: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Raw {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }
}

/// Reads one answer framed by `content-length` (or with none, which must be the last)
/// from `stream`, keeping what follows it in `rest`.
async fn answer(stream: &mut TcpStream, rest: &mut Vec<u8>) -> Raw {
    tokio::time::timeout(BOUND, async {
        let end = loop {
            if let Some(at) = rest.windows(4).position(|w| w == b"\r\n\r\n") {
                break at;
            }
            fill(stream, rest).await.expect("the head ends before the connection");
        };
        let head = String::from_utf8(rest.drain(..end + 4).collect()).expect("a text head");
        let mut lines = head.split("\r\n");
        let status = lines.next().expect("a status line").to_owned();
        let headers: Vec<(String, String)> = lines
            .filter(|l| !l.is_empty())
            .map(|l| {
                let (n, v) = l.split_once(':').expect("a field");
                (n.to_ascii_lowercase(), v.trim().to_owned())
            })
            .collect();
        let length = headers
            .iter()
            .find(|(n, _)| n == "content-length")
            .map_or(0, |(_, v)| v.parse::<usize>().expect("a length"));
        while rest.len() < length {
            fill(stream, rest).await.expect("the body ends before the connection");
        }
        let body = rest.drain(..length).collect();
        Raw { status, headers, body }
    })
    .await
    .expect("answered in time")
}

/// Reads more of `stream` into `into`; `None` once it is closed.
async fn fill(stream: &mut TcpStream, into: &mut Vec<u8>) -> Option<()> {
    let mut buf = [0u8; 8192];
    match stream.read(&mut buf).await {
        Ok(0) | Err(_) => None,
        Ok(n) => {
            into.extend_from_slice(&buf[..n]);
            Some(())
        }
    }
}

/// A KServe infer request for model `m` with `extra` header lines, framed by length.
fn infer(id: &str, extra: &str) -> String {
    let body = BODY.replace("req-1", id);
    format!(
        "POST /v2/models/m/infer HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\n{extra}content-length: {}\r\n\r\n{body}",
        body.len()
    )
}

/// The `id` an infer answer carries.
fn id_of(raw: &Raw) -> String {
    let body: serde_json::Value = serde_json::from_slice(&raw.body).expect("a JSON answer");
    body["id"].as_str().unwrap_or_default().to_owned()
}

#[tokio::test]
async fn pipelined_requests_are_answered_in_order_with_date_and_length() {
    let be = backend(&["m"]).await;
    let gw = gateway_with(config(), &route_r(&be.url(), &be.url()).flags(&["realtime"]).toml()).await;
    let mut stream = TcpStream::connect(gw.http_addr()).await.expect("connect");
    // Three requests in one write: the second's head and the third arrive with the first.
    let all = format!(
        "{}{}GET /v2/health/live HTTP/1.1\r\nhost: gw\r\n\r\n",
        infer("first", ""),
        infer("second", "")
    );
    stream.write_all(all.as_bytes()).await.expect("write");
    let mut rest = Vec::new();
    for id in ["first", "second"] {
        let raw = answer(&mut stream, &mut rest).await;
        assert!(raw.status.starts_with("HTTP/1.1 200"), "{}", raw.status);
        assert_eq!(id_of(&raw), id, "answered in the order asked");
        assert_eq!(raw.header("x-tiergate-tier"), Some("realtime"));
        assert!(
            raw.header("date").is_some_and(|d| d.ends_with(" GMT")),
            "every answer is dated"
        );
        assert!(raw.header("x-request-id").is_some());
    }
    let live = answer(&mut stream, &mut rest).await;
    assert!(live.status.starts_with("HTTP/1.1 200"), "{}", live.status);
    assert_eq!(live.header("content-length"), Some("0"));
    gw.stop().await.expect("stops");
}

#[tokio::test]
async fn every_framing_is_served_on_one_connection_in_turn() {
    let be = backend(&["m"]).await;
    let gw = gateway_with(config(), &route_r(&be.url(), &be.url()).flags(&["realtime"]).toml()).await;
    let mut stream = TcpStream::connect(gw.http_addr()).await.expect("connect");
    let mut rest = Vec::new();
    // The common request first, then one whose body comes in chunks (hyper's from here
    // on), then the common request again on the same connection.
    stream.write_all(infer("plain", "").as_bytes()).await.expect("write");
    let raw = answer(&mut stream, &mut rest).await;
    assert_eq!(id_of(&raw), "plain");
    let body = BODY.replace("req-1", "chunked");
    let (a, b) = body.split_at(body.len() / 2);
    let chunked = format!(
        "POST /v2/models/m/infer HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n{:x}\r\n{a}\r\n{:x}\r\n{b}\r\n0\r\n\r\n",
        a.len(),
        b.len()
    );
    stream.write_all(chunked.as_bytes()).await.expect("write");
    let raw = answer(&mut stream, &mut rest).await;
    assert!(raw.status.starts_with("HTTP/1.1 200"), "{}", raw.status);
    assert_eq!(id_of(&raw), "chunked");
    stream.write_all(infer("again", "").as_bytes()).await.expect("write");
    let raw = answer(&mut stream, &mut rest).await;
    assert_eq!(id_of(&raw), "again");
    // A body sent after its head, in a write of its own: read whole either way.
    let request = infer("split", "");
    let (head, body) = request.split_at(request.find("\r\n\r\n").expect("a head") + 4);
    stream.write_all(head.as_bytes()).await.expect("write");
    stream.flush().await.expect("flush");
    stream.write_all(body.as_bytes()).await.expect("write");
    let raw = answer(&mut stream, &mut rest).await;
    assert_eq!(id_of(&raw), "split");
    // `Expect: 100-continue`: told to go on, then answered.
    let request = infer("expect", "expect: 100-continue\r\n");
    let (head, body) = request.split_at(request.find("\r\n\r\n").expect("a head") + 4);
    stream.write_all(head.as_bytes()).await.expect("write");
    let go_on = answer(&mut stream, &mut rest).await;
    assert!(go_on.status.starts_with("HTTP/1.1 100"), "{}", go_on.status);
    stream.write_all(body.as_bytes()).await.expect("write");
    let raw = answer(&mut stream, &mut rest).await;
    assert_eq!(id_of(&raw), "expect");
    gw.stop().await.expect("stops");
}

#[tokio::test]
async fn a_client_that_asks_to_close_is_answered_then_closed_and_http_1_0_is_served() {
    let be = backend(&["m"]).await;
    let gw = gateway_with(config(), &route_r(&be.url(), &be.url()).flags(&["realtime"]).toml()).await;
    for (request, close) in [
        (infer("close", "connection: close\r\n"), Some("close")),
        (infer("old", "").replace("HTTP/1.1", "HTTP/1.0"), None),
    ] {
        let mut stream = TcpStream::connect(gw.http_addr()).await.expect("connect");
        stream.write_all(request.as_bytes()).await.expect("write");
        let mut rest = Vec::new();
        let raw = answer(&mut stream, &mut rest).await;
        assert!(
            raw.status.starts_with("HTTP/1.") && raw.status.contains(" 200"),
            "{}",
            raw.status
        );
        if close.is_some() {
            assert_eq!(raw.header("connection"), close);
        }
        let ended = tokio::time::timeout(BOUND, fill(&mut stream, &mut rest)).await;
        assert!(matches!(ended, Ok(None)), "the connection closes after its answer");
        assert!(rest.is_empty(), "nothing follows the answer");
    }
    gw.stop().await.expect("stops");
}

#[tokio::test]
async fn a_head_that_is_not_http_is_answered_400_and_an_unknown_path_404() {
    let be = backend(&["m"]).await;
    let gw = gateway_with(config(), &route_r(&be.url(), &be.url()).flags(&["realtime"]).toml()).await;
    let mut stream = TcpStream::connect(gw.http_addr()).await.expect("connect");
    stream
        .write_all(b"GET /nope HTTP/1.1\r\nhost: gw\r\n\r\n")
        .await
        .expect("write");
    let mut rest = Vec::new();
    let raw = answer(&mut stream, &mut rest).await;
    assert!(raw.status.starts_with("HTTP/1.1 404"), "{}", raw.status);
    stream
        .write_all(b"GET / HTTP/1.1\r\nbad header\r\n\r\n")
        .await
        .expect("write");
    let raw = answer(&mut stream, &mut rest).await;
    assert!(raw.status.starts_with("HTTP/1.1 400"), "{}", raw.status);
    gw.stop().await.expect("stops");
}
