//! HTTP/2 to a pool's endpoints: one hyper-util client that multiplexes the pool's calls
//! over one connection per endpoint, in clear text with prior knowledge (h2c, `http://`)
//! or over TLS with ALPN `h2` (`https://`). Under the pool, for HTTP pools with
//! `http2 = true` (HTTP/1.1 pools use `h1`).

use bytes::Bytes;
use http::uri::{Authority, PathAndQuery, Scheme};
use http::{Response, Uri};
use http_body_util::{BodyExt, Full, Limited};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client as Hyper;
use hyper_util::rt::{TokioExecutor, TokioTimer};

use super::endpoint::{chain, Failure};
use super::message::{end_to_end, outgoing_copy, path_and_query};
use super::tls::Trust;
use crate::policy::PoolSpec;

/// A pool's HTTP/2 client (cheap to clone: a handle) and the scheme its endpoints speak.
#[derive(Clone, Debug)]
pub(super) struct Client {
    hyper: Hyper<HttpsConnector<HttpConnector>, Full<Bytes>>,
    scheme: Scheme,
}

/// The HTTP/2 client for a pool as `spec` says: its connect timeout, TLS verified
/// against `trust` for `https://` endpoints, idle connections closed after
/// [`super::h1::IDLE_TIMEOUT`] like every pool's.
pub(super) fn client(spec: &PoolSpec, trust: &Trust) -> Client {
    let hyper = Hyper::builder(TokioExecutor::new())
        .pool_timer(TokioTimer::new())
        .timer(TokioTimer::new())
        .pool_idle_timeout(super::h1::IDLE_TIMEOUT)
        .http2_only(true)
        .build(trust.connector(spec.connect_timeout));
    let scheme = match spec.is_tls() {
        true => Scheme::HTTPS,
        false => Scheme::HTTP,
    };
    Client { hyper, scheme }
}

impl Client {
    /// The URI of `path_and_query` on the endpoint at `authority`.
    pub(super) fn uri(&self, authority: &Authority, path_and_query: PathAndQuery) -> Result<Uri, Failure> {
        let mut uri = http::uri::Parts::default();
        uri.scheme = Some(self.scheme.clone());
        uri.authority = Some(authority.clone());
        uri.path_and_query = Some(path_and_query);
        Uri::from_parts(uri).map_err(|e| Failure::Other(e.to_string()))
    }

    /// Sends `request` and reads the whole answer, refusing a body over `max_body` bytes
    /// (a successful stream of server-sent events, when `stream`, is handed up to be
    /// read as it comes: see `backend::stream`).
    pub(super) async fn request(
        &self,
        request: http::Request<Full<Bytes>>,
        (max_body, stream): (usize, bool),
    ) -> Result<Response<Bytes>, Failure> {
        let response = self.hyper.request(request).await.map_err(|e| {
            let detail = chain(&e);
            if e.is_connect() {
                Failure::Connect(detail)
            } else {
                Failure::Other(detail)
            }
        })?;
        let (head, body) = response.into_parts();
        if stream && head.status.is_success() && super::h1::is_event_stream(&head.headers) {
            let mut answer = Response::from_parts(head, Bytes::new());
            let body = body.map_err(|e| Box::new(e) as Box<dyn std::error::Error + Send + Sync>);
            answer
                .extensions_mut()
                .insert(super::stream::Raw::new(body.boxed_unsync()));
            return Ok(answer);
        }
        let body = Limited::new(body, max_body)
            .collect()
            .await
            .map_err(|e| Failure::Body(e.to_string()))?
            .to_bytes();
        Ok(Response::from_parts(head, body))
    }
}

/// Sends the request of `parts` and `body` to `authority` and reads the whole answer,
/// refusing a body over `max_body` bytes (or a stream's head, when `stream`).
pub(super) async fn send(
    client: &Client,
    authority: &Authority,
    parts: &http::request::Parts,
    body: Bytes,
    framed: (usize, bool),
) -> Result<Response<Bytes>, Failure> {
    let uri = client.uri(authority, path_and_query(parts))?;
    // The client keeps the request whatever happens: the pool's `parts` keep their
    // headers for a try on another endpoint.
    let response = client.request(outgoing_copy(parts, uri, body), framed).await?;
    Ok(end_to_end(response))
}
