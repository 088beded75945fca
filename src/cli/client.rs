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
    let mut builder = http::Request::builder().method(method).uri(url(base, path));
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    let response = client.request(builder.body(Full::new(body))?).await?;
    let (head, body) = response.into_parts();
    let bytes = body.collect().await?.to_bytes();
    Ok((head.status.as_u16(), head.headers, bytes))
}

/// The URL of `path` at `base`: `base` may leave out its scheme (`host:port`, taken as
/// `http://`) and may already end in `path` (`http://host:8002/metrics` for `/metrics`).
pub fn url(base: &str, path: &str) -> String {
    let base = base.trim().trim_end_matches('/');
    let base = base
        .strip_suffix(path.trim_end_matches('/'))
        .filter(|_| !path.is_empty() && path != "/")
        .unwrap_or(base);
    let base = base.trim_end_matches('/');
    match base.contains("://") {
        true => format!("{base}{path}"),
        false => format!("http://{base}{path}"),
    }
}

#[cfg(test)]
mod tests {
    use super::url;

    #[test]
    fn addresses_with_or_without_scheme_and_path() {
        for base in [
            "http://h:8002",
            "h:8002",
            "http://h:8002/",
            "http://h:8002/metrics",
            "h:8002/metrics/",
        ] {
            assert_eq!(url(base, "/metrics"), "http://h:8002/metrics", "{base}");
        }
        assert_eq!(url("https://h:8003", "/admin/policy"), "https://h:8003/admin/policy");
        assert_eq!(url("h:8000", "/v1/jobs/x"), "http://h:8000/v1/jobs/x");
    }
}
