//! Accepting connections, for every door: a limit on open connections, and a close that
//! resets nobody (the backlog is taken before the listener goes).

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio_stream::{Stream, StreamExt as _};
use tokio_util::sync::CancellationToken;

/// Connections accepted on `listener`, each counted against `max` open ones (closed at
/// once beyond), until `closing` fires. Then those the kernel has already completed (its
/// backlog) are taken too, and only then is the listener closed: closing it with them
/// still queued would reset them, after their clients had sent a request. New clients
/// are refused at connect from then on.
pub(super) fn accept(listener: TcpListener, max: usize, closing: CancellationToken) -> mpsc::Receiver<Counted> {
    let open = Arc::new(Semaphore::new(max.clamp(1, Semaphore::MAX_PERMITS)));
    let (tx, rx) = mpsc::channel(64);
    tokio::spawn(async move {
        let count = |stream: TcpStream, peer| match open.clone().try_acquire_owned() {
            Ok(permit) => {
                let _ = stream.set_nodelay(true);
                Some(Counted {
                    stream,
                    peer,
                    _permit: permit,
                })
            }
            Err(_) => {
                // At the connection limit: close at once rather than let the backlog grow.
                ::metrics::counter!(crate::metrics::ADMISSION_REFUSALS, "reason" => "connections").increment(1);
                None
            }
        };
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
                () = closing.cancelled() => break,
            };
            if let Some(counted) = count(stream, peer) {
                if tx.send(counted).await.is_err() {
                    return;
                }
            }
        }
        let Ok(listener) = listener.into_std() else { return };
        while let Ok((stream, peer)) = listener.accept() {
            let Ok(stream) = stream.set_nonblocking(true).and_then(|()| TcpStream::from_std(stream)) else {
                continue;
            };
            if let Some(counted) = count(stream, peer) {
                if tx.send(counted).await.is_err() {
                    return;
                }
            }
        }
        // `listener` closes here, with nothing left in its backlog.
    });
    rx
}

/// Accepted connections for a server that takes a stream of them (the gRPC door), each
/// counted against `max` open ones, as the HTTP doors accept theirs: the stream ends
/// once `closing` has fired and the listener's backlog is taken, and the listener closes.
pub fn limited_incoming(
    listener: TcpListener,
    max: usize,
    closing: CancellationToken,
) -> impl Stream<Item = std::io::Result<Counted>> {
    tokio_stream::wrappers::ReceiverStream::new(accept(listener, max, closing)).map(Ok)
}

/// A connection counted against its listener's limit until it closes.
#[derive(Debug)]
pub struct Counted {
    stream: TcpStream,
    peer: SocketAddr,
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

impl Counted {
    /// The client's address.
    pub fn peer(&self) -> SocketAddr {
        self.peer
    }
}
