//! A fake KServe v2 server for tests: listens on 127.0.0.1:0 (HTTP/1.1 and h2), answers
//! infer requests like tiergate's realtime tier would (or never answers), and counts
//! what it saw.

use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt as _, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use crate::payload::BUDGET_HEADER;
use crate::record::TIER_HEADER;

/// How the server answers infer requests.
#[derive(Clone, Copy, Debug)]
pub enum Behaviour {
    /// Infer: 200 with `x-tiergate-tier: realtime`; `/v2/health/ready`: 200; else 404.
    Realtime,
    /// Reads the request, then never answers.
    Hang,
}

/// A running fake server; stops accepting when dropped.
pub struct TestServer {
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    /// What it has seen so far.
    pub seen: Arc<Seen>,
    accept: JoinHandle<()>,
}

/// Counters of what the server received.
#[derive(Debug, Default)]
pub struct Seen {
    /// Requests received, any path.
    pub requests: AtomicU64,
    /// Of those, how many carried `x-tiergate-budget-ms: 200`.
    pub budget_200: AtomicU64,
    /// Of those, how many arrived over HTTP/2.
    pub http2: AtomicU64,
}

impl TestServer {
    /// Binds 127.0.0.1:0 and serves until dropped.
    pub async fn start(behaviour: Behaviour) -> anyhow::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}", listener.local_addr()?);
        let seen = Arc::new(Seen::default());
        let accept = tokio::spawn(accept_loop(listener, behaviour, seen.clone()));
        Ok(Self { url, seen, accept })
    }

    /// Requests received so far.
    pub fn requests(&self) -> u64 {
        self.seen.requests.load(Ordering::Acquire)
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

async fn accept_loop(listener: TcpListener, behaviour: Behaviour, seen: Arc<Seen>) {
    while let Ok((stream, _)) = listener.accept().await {
        let seen = seen.clone();
        let service = service_fn(move |req| answer(req, behaviour, seen.clone()));
        tokio::spawn(async move {
            let _ = auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

async fn answer(
    req: Request<Incoming>,
    behaviour: Behaviour,
    seen: Arc<Seen>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let count = |c: &AtomicU64| c.fetch_add(1, Ordering::AcqRel);
    if req.headers().get(BUDGET_HEADER).is_some_and(|v| v == "200") {
        count(&seen.budget_200);
    }
    if req.version() == http::Version::HTTP_2 {
        count(&seen.http2);
    }
    let path = req.uri().path().to_owned();
    let is_infer = path.starts_with("/v2/models/") && path.ends_with("/infer");
    let _ = req.into_body().collect().await;
    // Counted last: once the count is seen, the other counters are up to date.
    count(&seen.requests);
    let mut response = Response::new(Full::new(Bytes::from_static(b"{\"outputs\":[]}")));
    match behaviour {
        Behaviour::Hang => std::future::pending().await,
        Behaviour::Realtime if is_infer => {
            response
                .headers_mut()
                .insert(TIER_HEADER, http::HeaderValue::from_static("realtime"));
        }
        Behaviour::Realtime if path == "/v2/health/ready" => {}
        Behaviour::Realtime => *response.status_mut() = StatusCode::NOT_FOUND,
    }
    Ok(response)
}
