//! A bare hyper reverse proxy: the floor for any hyper-based gateway.
//!
//! `bare_proxy LISTEN BACKEND [legacy|inline]` forwards every request to `BACKEND`
//! (host:port) and nothing else: no parsing, classification, limits or metrics. The
//! overhead scenario runs it beside tiergate, so the difference between the two is what
//! tiergate's own work costs, apart from the HTTP stack and the machine.
//!
//! Its backend client is hyper-util's pooled client (`legacy`, the default), or
//! `inline`: a stack of idle HTTP/1 connections made with hyper's `client::conn`, each
//! driven inside the request's own task while a request uses it, so no task is spawned
//! or woken per request. `inline` is the same design as tiergate's own HTTP/1.1 client
//! (`backend::h1`), kept here as the floor that design sets: it is a weaker copy (no idle
//! timeout or bound, no reconnect on a stale connection), a baseline, not a candidate.

use std::convert::Infallible;
use std::future::Future as _;
use std::sync::{Arc, Mutex};

use anyhow::Context as _;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::client::conn::http1;
use hyper::service::service_fn;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;

/// An idle HTTP/1 connection: the handle to send on and the connection itself.
type Idle = (
    http1::SendRequest<Full<Bytes>>,
    http1::Connection<TokioIo<tokio::net::TcpStream>, Full<Bytes>>,
);

/// The backend client.
#[derive(Clone)]
enum Proxy {
    Legacy(Box<Client<HttpConnector, Full<Bytes>>>),
    Inline(Arc<Mutex<Vec<Idle>>>),
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let (Some(listen), Some(backend)) = (args.next(), args.next()) else {
        anyhow::bail!("usage: bare_proxy LISTEN_ADDR BACKEND_HOST:PORT [legacy|inline]");
    };
    let client = match args.next().as_deref() {
        None | Some("legacy") => {
            let mut connector = HttpConnector::new();
            connector.set_nodelay(true);
            Proxy::Legacy(Box::new(Client::builder(TokioExecutor::new()).build(connector)))
        }
        Some("inline") => Proxy::Inline(Arc::default()),
        Some(other) => anyhow::bail!("client is legacy or inline, not {other}"),
    };
    let listener = tokio::net::TcpListener::bind(&listen)
        .await
        .with_context(|| format!("bind {listen}"))?;
    loop {
        let (stream, _) = listener.accept().await?;
        stream.set_nodelay(true)?;
        let (client, backend) = (client.clone(), backend.clone());
        tokio::spawn(async move {
            let service = service_fn(move |req| forward(client.clone(), backend.clone(), req));
            let _ = auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

async fn forward(
    client: Proxy,
    backend: String,
    req: http::Request<Incoming>,
) -> Result<http::Response<Full<Bytes>>, Infallible> {
    let (parts, body) = req.into_parts();
    let answer = async {
        let body = body.collect().await?.to_bytes();
        let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
        let mut out = http::Request::new(Full::new(body));
        *out.method_mut() = parts.method;
        if let Some(ct) = parts.headers.get(http::header::CONTENT_TYPE) {
            out.headers_mut().insert(http::header::CONTENT_TYPE, ct.clone());
        }
        match &client {
            Proxy::Legacy(client) => {
                *out.uri_mut() = format!("http://{backend}{path}").parse()?;
                let (head, body) = client.request(out).await?.into_parts();
                let body = body.collect().await?.to_bytes();
                anyhow::Ok(http::Response::from_parts(head, Full::new(body)))
            }
            Proxy::Inline(idle) => {
                *out.uri_mut() = path.parse()?;
                out.headers_mut().insert(http::header::HOST, backend.parse()?);
                inline(idle, &backend, out).await
            }
        }
    };
    Ok(answer.await.unwrap_or_else(|e| {
        let mut bad = http::Response::new(Full::new(Bytes::from(e.to_string())));
        *bad.status_mut() = http::StatusCode::BAD_GATEWAY;
        bad
    }))
}

/// Sends `out` on an idle connection (or a new one), driving the connection in this
/// task until the answer is read; the connection goes back on the stack if it is open.
async fn inline(
    idle: &Mutex<Vec<Idle>>,
    backend: &str,
    out: http::Request<Full<Bytes>>,
) -> anyhow::Result<http::Response<Full<Bytes>>> {
    let found = idle.lock().expect("not poisoned").pop();
    let (mut sender, mut connection) = match found {
        Some(pair) => pair,
        None => {
            let stream = tokio::net::TcpStream::connect(backend).await?;
            stream.set_nodelay(true)?;
            http1::handshake(TokioIo::new(stream)).await?
        }
    };
    let mut closed = false;
    let answer = {
        let mut call = std::pin::pin!(async {
            let (head, body) = sender.send_request(out).await?.into_parts();
            let body = body.collect().await?.to_bytes();
            anyhow::Ok(http::Response::from_parts(head, Full::new(body)))
        });
        std::future::poll_fn(|cx| {
            if !closed && connection.poll_without_shutdown(cx).is_ready() {
                closed = true;
            }
            call.as_mut().poll(cx)
        })
        .await?
    };
    if !closed {
        idle.lock().expect("not poisoned").push((sender, connection));
    }
    Ok(answer)
}
