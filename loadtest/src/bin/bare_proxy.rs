//! A bare hyper reverse proxy: the floor for any hyper-based gateway.
//!
//! `bare_proxy LISTEN BACKEND` forwards every request to `BACKEND` (host:port) with
//! hyper-util's pooled client and nothing else: no parsing, classification, limits or
//! metrics. The overhead scenario runs it beside tiergate, so the difference between the
//! two is what tiergate's own work costs, apart from the HTTP stack and the machine.

use std::convert::Infallible;

use anyhow::Context as _;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;

type Proxy = Client<HttpConnector, Full<Bytes>>;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let (Some(listen), Some(backend)) = (args.next(), args.next()) else {
        anyhow::bail!("usage: bare_proxy LISTEN_ADDR BACKEND_HOST:PORT");
    };
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let client: Proxy = Client::builder(TokioExecutor::new()).build(connector);
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
        *out.uri_mut() = format!("http://{backend}{path}").parse()?;
        if let Some(ct) = parts.headers.get(http::header::CONTENT_TYPE) {
            out.headers_mut().insert(http::header::CONTENT_TYPE, ct.clone());
        }
        let (head, body) = client.request(out).await?.into_parts();
        let body = body.collect().await?.to_bytes();
        anyhow::Ok(http::Response::from_parts(head, Full::new(body)))
    };
    Ok(answer.await.unwrap_or_else(|e| {
        let mut bad = http::Response::new(Full::new(Bytes::from(e.to_string())));
        *bad.status_mut() = http::StatusCode::BAD_GATEWAY;
        bad
    }))
}
