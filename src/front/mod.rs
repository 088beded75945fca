//! Doors: the listeners clients talk to, first on the request path.
//!
//! [`http`] is the KServe v2 HTTP door (plus JSON routes), [`grpc`] the KServe v2 gRPC door; [`meta`] reads what the
//! classifier needs from a request's headers; [`dispatch`] is what every door does
//! once a request is read: classify, serve on its tier, count. [`serve`] is the one connection loop
//! every HTTP listener here uses (the door, the bulk door, the metrics endpoint): HTTP/1.1 and h2c on
//! one port, a header read timeout against slow clients, graceful drain on shutdown.

pub mod admission;
pub mod batch_api;
pub mod dispatch;
pub mod grpc;
pub mod http;
pub mod jobs;
pub mod meta;

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_stream::{Stream, StreamExt as _};

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// Largest request head (HTTP/1.1 buffer, HTTP/2 header list) a client may send.
const MAX_HEADER_BYTES: usize = 64 << 10;
/// Concurrent HTTP/2 streams per connection.
const MAX_STREAMS: u32 = 1024;

/// How long in-flight exchanges may finish after shutdown begins.
const DRAIN: Duration = Duration::from_secs(10);

/// Accepts connections on `listener` and answers each request with `answer`, until
/// `shutdown` fires; then stops accepting and lets open exchanges finish (up to 10 s).
pub async fn serve<F, Fut>(
    listener: TcpListener,
    header_read_timeout: Duration,
    max_connections: usize,
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
        .max_buf_size(MAX_HEADER_BYTES)
        .keep_alive(true);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(MAX_STREAMS)
        .max_header_list_size(MAX_HEADER_BYTES as u32)
        .keep_alive_interval(Some(Duration::from_secs(30)))
        .keep_alive_timeout(Duration::from_secs(10));
    let connections = Arc::new(Semaphore::new(max_connections.clamp(1, Semaphore::MAX_PERMITS)));
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
        let Ok(permit) = connections.clone().try_acquire_owned() else {
            // At the connection limit: close at once rather than let the backlog grow.
            ::metrics::counter!(crate::metrics::ADMISSION_REFUSALS, "reason" => "connections").increment(1);
            drop(stream);
            continue;
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
            drop(permit);
        });
    }
    drop(listener);
    tokio::select! {
        _ = graceful.shutdown() => {}
        _ = tokio::time::sleep(DRAIN) => tracing::warn!("connections still open after the drain period"),
    }
    Ok(())
}

/// Accepted connections for a server that takes a stream of them (the gRPC door),
/// closed at once beyond `max` open ones.
pub fn limited_incoming(listener: TcpListener, max: usize) -> impl Stream<Item = std::io::Result<Counted>> {
    let open = Arc::new(Semaphore::new(max.clamp(1, Semaphore::MAX_PERMITS)));
    tokio_stream::wrappers::TcpListenerStream::new(listener).filter_map(move |accepted| match accepted {
        Ok(stream) => match open.clone().try_acquire_owned() {
            Ok(permit) => {
                let _ = stream.set_nodelay(true);
                Some(Ok(Counted {
                    stream,
                    _permit: permit,
                }))
            }
            Err(_) => {
                ::metrics::counter!(crate::metrics::ADMISSION_REFUSALS, "reason" => "connections").increment(1);
                None
            }
        },
        Err(e) => Some(Err(e)),
    })
}

/// A connection counted against its listener's limit until it closes.
#[derive(Debug)]
pub struct Counted {
    stream: TcpStream,
    _permit: OwnedSemaphorePermit,
}

impl AsyncRead for Counted {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Counted {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

impl tonic::transport::server::Connected for Counted {
    type ConnectInfo = tonic::transport::server::TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.stream.connect_info()
    }
}

/// How often [`keep_timers_due`] wakes.
const TICK: Duration = Duration::from_millis(50);

/// Keeps a timer due within 50 ms on the calling runtime until `shutdown` fires.
///
/// tokio wakes its I/O driver (a write to an eventfd, then one more `epoll_wait`)
/// whenever a new timer is due before every armed one. At low load, with nothing else
/// armed, every request's budget deadline is such a timer, so each request paid two
/// extra system calls on the real-time thread. With a timer always due within 50 ms,
/// a deadline further out is filed quietly; the price is 20 wake-ups a second.
pub async fn keep_timers_due(shutdown: CancellationToken) -> std::io::Result<()> {
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = shutdown.cancelled() => return Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_timer_tick_runs_until_shutdown() {
        let stop = CancellationToken::new();
        let tick = tokio::spawn(keep_timers_due(stop.clone()));
        tokio::time::sleep(TICK * 10).await;
        assert!(!tick.is_finished(), "it keeps a timer due while serving");
        stop.cancel();
        tick.await.expect("no panic").expect("ends cleanly");
    }
}
