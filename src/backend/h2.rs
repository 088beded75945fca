//! HTTP/2 (prior knowledge, h2c) to a pool's endpoints: one hyper-util client that
//! multiplexes the pool's calls over one connection per endpoint. Under the pool, for
//! HTTP pools with `http2 = true` (HTTP/1.1 pools use `h1`).

use bytes::Bytes;
use http::uri::{Authority, Scheme};
use http::{Response, Uri};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client as Hyper;
use hyper_util::rt::{TokioExecutor, TokioTimer};

use super::endpoint::{chain, Failure};
use super::message::{end_to_end, outgoing, path_and_query};
use crate::policy::PoolSpec;

/// A pool's HTTP/2 client (cheap to clone: a handle).
pub(super) type Client = Hyper<HttpConnector, Full<Bytes>>;

/// The HTTP/2 client for a pool as `spec` says: its connect timeout, idle connections
/// closed after [`super::h1::IDLE_TIMEOUT`] like every pool's.
pub(super) fn client(spec: &PoolSpec) -> Client {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    connector.set_connect_timeout(Some(spec.connect_timeout));
    connector.enforce_http(true);
    Hyper::builder(TokioExecutor::new())
        .pool_timer(TokioTimer::new())
        .timer(TokioTimer::new())
        .pool_idle_timeout(super::h1::IDLE_TIMEOUT)
        .http2_only(true)
        .build(connector)
}

/// Sends the request of `parts` and `body` to `authority` and reads the whole answer,
/// refusing a body over `max_body` bytes.
pub(super) async fn send(
    client: &Client,
    authority: &Authority,
    parts: &http::request::Parts,
    body: Bytes,
    max_body: usize,
) -> Result<Response<Bytes>, Failure> {
    let mut uri = http::uri::Parts::default();
    uri.scheme = Some(Scheme::HTTP);
    uri.authority = Some(authority.clone());
    uri.path_and_query = Some(path_and_query(parts));
    let uri = Uri::from_parts(uri).map_err(|e| Failure::Other(e.to_string()))?;
    let response = client.request(outgoing(parts, uri, body)).await.map_err(|e| {
        let detail = chain(&e);
        if e.is_connect() {
            Failure::Connect(detail)
        } else {
            Failure::Other(detail)
        }
    })?;
    let (head, body) = response.into_parts();
    let body = Limited::new(body, max_body)
        .collect()
        .await
        .map_err(|e| Failure::Body(e.to_string()))?
        .to_bytes();
    Ok(end_to_end(Response::from_parts(head, body)))
}
