//! The body of an answer the HTTP door writes: whole, as nearly every answer is, or
//! streamed in chunks from the offline store (a Batch API file's content), so a large
//! file is never held whole in memory while its client reads it slowly. Its length is
//! known either way, so the answer carries `Content-Length`.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};
use tokio::sync::mpsc;

/// An answer's body (see the module's docs).
#[derive(Debug)]
pub enum Answered {
    /// All of it, written at once (`None` once written).
    Whole(Option<Bytes>),
    /// Chunks as they are read, `left` bytes of them still to come.
    Streamed {
        /// The chunks, in order; an error ends the answer (and its connection).
        chunks: mpsc::Receiver<std::io::Result<Bytes>>,
        /// Bytes still to come.
        left: u64,
    },
}

impl Answered {
    /// A body of `len` bytes that `chunks` will bring.
    pub fn streamed(chunks: mpsc::Receiver<std::io::Result<Bytes>>, len: u64) -> Self {
        Answered::Streamed { chunks, left: len }
    }
}

impl From<Bytes> for Answered {
    fn from(bytes: Bytes) -> Self {
        Answered::Whole(Some(bytes))
    }
}

impl Default for Answered {
    fn default() -> Self {
        Answered::Whole(None)
    }
}

impl Body for Answered {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<std::io::Result<Frame<Bytes>>>> {
        match &mut *self {
            Answered::Whole(bytes) => Poll::Ready(bytes.take().filter(|b| !b.is_empty()).map(|b| Ok(Frame::data(b)))),
            Answered::Streamed { chunks, left } => match chunks.poll_recv(cx) {
                Poll::Pending => Poll::Pending,
                Poll::Ready(Some(Ok(chunk))) => {
                    let Some(rest) = left.checked_sub(chunk.len() as u64) else {
                        let more = std::io::Error::other("the stored content is longer than it said");
                        return Poll::Ready(Some(Err(more)));
                    };
                    *left = rest;
                    Poll::Ready(Some(Ok(Frame::data(chunk))))
                }
                Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e))),
                Poll::Ready(None) if *left == 0 => Poll::Ready(None),
                Poll::Ready(None) => Poll::Ready(Some(Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof)))),
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Answered::Whole(bytes) => bytes.as_ref().is_none_or(Bytes::is_empty),
            Answered::Streamed { left, .. } => *left == 0,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Answered::Whole(bytes) => SizeHint::with_exact(bytes.as_ref().map_or(0, |b| b.len() as u64)),
            Answered::Streamed { left, .. } => SizeHint::with_exact(*left),
        }
    }
}

#[cfg(test)]
mod tests {
    use http_body_util::BodyExt;

    use super::*;

    #[tokio::test]
    async fn whole_and_streamed_bodies_give_their_bytes_and_a_short_stream_is_an_error() {
        let whole = Answered::from(Bytes::from_static(b"abc"));
        assert_eq!(whole.size_hint().exact(), Some(3));
        assert_eq!(whole.collect().await.expect("whole").to_bytes(), "abc");
        let (tx, rx) = mpsc::channel(4);
        for chunk in ["ab", "cd"] {
            tx.send(Ok(Bytes::from(chunk))).await.expect("sent");
        }
        drop(tx);
        let streamed = Answered::streamed(rx, 4);
        assert_eq!(streamed.size_hint().exact(), Some(4));
        assert_eq!(streamed.collect().await.expect("streamed").to_bytes(), "abcd");
        let (tx, rx) = mpsc::channel(4);
        tx.send(Ok(Bytes::from("ab"))).await.expect("sent");
        drop(tx);
        assert!(Answered::streamed(rx, 4).collect().await.is_err(), "two bytes short");
    }
}
