//! The HTTP client the command-line tools (`jobs`, `flags`, `policy`, `explain`) share.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

/// One exchange with `base` (`http://host:port`): its status, headers and body. The
/// caller says what it could not reach.
pub async fn request(
    base: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Bytes,
) -> anyhow::Result<(u16, http::HeaderMap, Bytes)> {
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let mut builder = http::Request::builder()
        .method(method)
        .uri(format!("{}{path}", base.trim_end_matches('/')));
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    let response = client.request(builder.body(Full::new(body))?).await?;
    let (head, body) = response.into_parts();
    let bytes = body.collect().await?.to_bytes();
    Ok((head.status.as_u16(), head.headers, bytes))
}
