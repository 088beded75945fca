//! Doors: the listeners clients talk to, first on the request path.
//!
//! [`http`] is the KServe v2 HTTP door (plus JSON routes), [`grpc`] the KServe v2 gRPC door; [`meta`] reads what the
//! classifier needs from a request's headers; [`dispatch`] is what every door does
//! once a request is read: classify, serve on its tier, count. [`serve`] is the one connection loop
//! every HTTP listener here uses (the door, the metrics endpoint): HTTP/1.1 and h2c on
//! one port, a header read timeout against slow clients, graceful drain on shutdown.

pub mod batch_api;
pub mod dispatch;
pub mod grpc;
pub mod http;
pub mod jobs;
pub mod meta;

use std::convert::Infallible;
use std::future::Future;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// How long in-flight exchanges may finish after shutdown begins.
const DRAIN: Duration = Duration::from_secs(10);

/// Accepts connections on `listener` and answers each request with `answer`, until
/// `shutdown` fires; then stops accepting and lets open exchanges finish (up to 10 s).
pub async fn serve<F, Fut>(
    listener: TcpListener,
    header_read_timeout: Duration,
    shutdown: CancellationToken,
    answer: F,
) -> std::io::Result<()>
where
    F: Fn(::http::Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = ::http::Response<Full<Bytes>>> + Send + 'static,
{
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(header_read_timeout)
        .keep_alive(true);
    builder.http2().timer(TokioTimer::new()).max_concurrent_streams(1024);
    let graceful = GracefulShutdown::new();
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(pair) => pair,
                Err(e) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = shutdown.cancelled() => break,
        };
        let _ = stream.set_nodelay(true);
        let answer = answer.clone();
        let service = service_fn(move |req| {
            let answer = answer.clone();
            async move { Ok::<_, Infallible>(answer(req).await) }
        });
        let connection = builder.serve_connection(TokioIo::new(stream), service).into_owned();
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
        });
    }
    drop(listener);
    tokio::select! {
        _ = graceful.shutdown() => {}
        _ = tokio::time::sleep(DRAIN) => tracing::warn!("connections still open after the drain period"),
    }
    Ok(())
}
