//! The HTTP client every request goes through: one hyper-util legacy `Client` per target
//! with a keep-alive pool (HTTP/1.1, or HTTP/2 with prior knowledge), plus naming of
//! transport errors and a readiness probe.

use std::error::Error as StdError;
use std::time::Duration;

use anyhow::bail;
use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt as _, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};

use crate::payload::join_url;

/// The client type: plain-TCP connector, bodies pre-built as `Full<Bytes>`.
pub type Client = hyper_util::client::legacy::Client<HttpConnector, Full<Bytes>>;

/// A client with a keep-alive pool and `TCP_NODELAY`; `http2` speaks h2 with prior
/// knowledge (all requests multiplexed on one connection) instead of HTTP/1.1.
pub fn new(http2: bool) -> Client {
    let mut connector = HttpConnector::new();
    // Small requests: Nagle would add up to 40 ms of delayed-ACK interplay.
    connector.set_nodelay(true);
    let mut builder = hyper_util::client::legacy::Client::builder(TokioExecutor::new());
    builder
        .timer(TokioTimer::new())
        .pool_timer(TokioTimer::new())
        .pool_idle_timeout(Duration::from_secs(90))
        .http2_only(http2);
    builder.build(connector)
}

/// A short snake_case name for a transport error, for counting by kind:
/// `connect.connection_refused`, `request.connection_reset`, `body.incomplete_message`...
/// `stage` is where it happened (`request` or `body`); connect errors say `connect`.
pub fn error_kind(stage: &str, err: &(dyn StdError + 'static)) -> String {
    let mut stage = stage;
    let mut kind = None;
    let mut cause = Some(err);
    while let Some(e) = cause {
        if let Some(client_err) = e.downcast_ref::<hyper_util::client::legacy::Error>() {
            stage = if client_err.is_connect() { "connect" } else { stage };
        } else if let Some(hyper_err) = e.downcast_ref::<hyper::Error>() {
            kind = Some(hyper_kind(hyper_err).to_owned());
        } else if let Some(io) = e.downcast_ref::<std::io::Error>() {
            kind = Some(snake_case(&format!("{:?}", io.kind())));
            break;
        }
        cause = e.source();
    }
    format!("{stage}.{}", kind.as_deref().unwrap_or("other"))
}

/// Polls `GET {base_url}/v2/health/ready` every `every` until it answers 200; fails
/// after `limit`, or as soon as `gone()` says the server's process has exited.
pub async fn wait_ready(
    client: &Client,
    base_url: &str,
    every: Duration,
    limit: Duration,
    mut gone: impl FnMut() -> Option<String>,
) -> anyhow::Result<()> {
    let uri = join_url(base_url, "/v2/health/ready")?;
    let deadline = tokio::time::Instant::now() + limit;
    let mut ticks = tokio::time::interval(every);
    loop {
        ticks.tick().await;
        if let Some(why) = gone() {
            bail!("{base_url} will never be ready: {why}");
        }
        let request = Request::get(uri.clone()).body(Full::new(Bytes::new()))?;
        let probe = tokio::time::timeout(every.max(Duration::from_millis(100)), client.request(request));
        if let Ok(Ok(response)) = probe.await {
            let status = response.status();
            // Drain the body so the connection goes back to the pool.
            let _ = response.into_body().collect().await;
            if status == StatusCode::OK {
                return Ok(());
            }
        }
        if tokio::time::Instant::now() >= deadline {
            bail!("{uri} did not answer 200 within {limit:?}");
        }
    }
}

fn hyper_kind(e: &hyper::Error) -> &'static str {
    match () {
        _ if e.is_incomplete_message() => "incomplete_message",
        _ if e.is_canceled() => "canceled",
        _ if e.is_closed() => "closed",
        _ if e.is_parse() || e.is_parse_status() || e.is_parse_too_large() => "parse",
        _ if e.is_timeout() => "timeout",
        _ if e.is_body_write_aborted() => "body_write_aborted",
        _ => "protocol",
    }
}

fn snake_case(camel: &str) -> String {
    let mut out = String::with_capacity(camel.len() + 4);
    for (i, c) in camel.chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            out.push('_');
        }
        out.push(c.to_ascii_lowercase());
    }
    out
}

#[cfg(test)]
mod tests {
    use anyhow::Context as _;

    use super::*;

    #[test]
    fn io_kinds_become_snake_case() {
        let err = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
        assert_eq!(error_kind("request", &err), "request.connection_reset");
        assert_eq!(snake_case("TimedOut"), "timed_out");
    }

    #[tokio::test]
    async fn refused_connection_is_a_connect_error() -> anyhow::Result<()> {
        // Bind then drop: nothing listens on that port any more.
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let request = Request::get(format!("http://127.0.0.1:{port}/")).body(Full::new(Bytes::new()))?;
        let err = new(false)
            .request(request)
            .await
            .err()
            .context("nothing listens there")?;
        assert_eq!(error_kind("request", &err), "connect.connection_refused");
        Ok(())
    }
}
