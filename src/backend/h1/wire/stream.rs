//! An answer's body read as it comes, for a stream (server-sent events): the bytes
//! handed up as soon as they are read, unframed from chunks or a length, over the
//! connection the answer came on, which the body owns to its end and then closes (a
//! connection is reused only after an answer read whole). Dropping the body closes the
//! connection at once, which is how the backend learns that its caller went away.

use std::mem::MaybeUninit;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::{Body, Frame};
use tokio::io::{AsyncRead, ReadBuf};

use super::{chunk_size, Framing, Wire, MAX_CHUNK_LINE, READ_CHUNK};

/// Where a chunked body's reading is.
#[derive(Debug, Clone, Copy)]
enum Chunk {
    /// Before a chunk's size line.
    Size,
    /// In a chunk, this many bytes left of it.
    Data(usize),
    /// After a chunk's data, before its line ending.
    DataEnd,
    /// After the last chunk, in the trailer fields.
    Trailers,
}

/// A streamed answer's body on its connection.
pub(in crate::backend) struct Streaming {
    wire: Wire,
    framing: Framing,
    chunk: Chunk,
    done: bool,
}

impl Wire {
    /// The body of the answer whose head was just read, framed by `framing`, read as it
    /// comes; the connection goes with it.
    pub(in crate::backend) fn into_stream(self, framing: Framing) -> Streaming {
        Streaming {
            wire: self,
            framing,
            chunk: Chunk::Size,
            done: matches!(framing, Framing::None | Framing::Length(0)),
        }
    }
}

/// How a stream's body failed.
fn broken(why: &str) -> Box<dyn std::error::Error + Send + Sync> {
    Box::new(std::io::Error::other(why.to_owned()))
}

impl Streaming {
    /// The next bytes of the body from what was read, `Ok(None)` when more must be
    /// read first; the body's end is `done`.
    fn take(&mut self) -> Result<Option<Bytes>, &'static str> {
        let read = &mut self.wire.read;
        loop {
            match (self.framing, self.chunk) {
                (Framing::None, _) => {
                    self.done = true;
                    return Ok(None);
                }
                (Framing::Length(left), _) => {
                    if read.is_empty() {
                        return Ok(None);
                    }
                    let n = left.min(read.len());
                    self.framing = Framing::Length(left - n);
                    self.done = left == n;
                    return Ok(Some(read.split_to(n).freeze()));
                }
                (Framing::Close, _) => return Ok((!read.is_empty()).then(|| read.split().freeze())),
                (Framing::Chunked, Chunk::Data(left)) => {
                    if read.is_empty() {
                        return Ok(None);
                    }
                    let n = left.min(read.len());
                    self.chunk = if n == left {
                        Chunk::DataEnd
                    } else {
                        Chunk::Data(left - n)
                    };
                    return Ok(Some(read.split_to(n).freeze()));
                }
                (Framing::Chunked, state) => {
                    let Some(end) = memchr::memchr(b'\n', read) else {
                        if read.len() > MAX_CHUNK_LINE {
                            return Err("a line of the chunked body is too long");
                        }
                        return Ok(None);
                    };
                    let line = read.split_to(end + 1);
                    let line = line.strip_suffix(b"\n").unwrap_or(&line);
                    let line = line.strip_suffix(b"\r").unwrap_or(line);
                    match state {
                        Chunk::Size => {
                            let size = chunk_size(line).ok_or("a chunk's size line is not hexadecimal")?;
                            self.chunk = if size == 0 { Chunk::Trailers } else { Chunk::Data(size) };
                        }
                        Chunk::DataEnd if line.is_empty() => self.chunk = Chunk::Size,
                        Chunk::DataEnd => return Err("a chunk is longer than its size says"),
                        Chunk::Trailers if line.is_empty() => {
                            self.done = true;
                            return Ok(None);
                        }
                        Chunk::Trailers | Chunk::Data(_) => {}
                    }
                }
            }
        }
    }
}

impl Body for Streaming {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        loop {
            if this.done {
                return Poll::Ready(None);
            }
            match this.take() {
                Ok(Some(bytes)) => return Poll::Ready(Some(Ok(Frame::data(bytes)))),
                Ok(None) if this.done => return Poll::Ready(None),
                Ok(None) => {}
                Err(why) => return Poll::Ready(Some(Err(broken(why)))),
            }
            // Read onto the stack (left unzeroed), then only what came is kept: an
            // open stream's connection holds no more than it was sent.
            let wire = &mut this.wire;
            let mut chunk = [MaybeUninit::<u8>::uninit(); READ_CHUNK];
            let mut buf = ReadBuf::uninit(&mut chunk);
            match Pin::new(&mut wire.io).poll_read(cx, &mut buf) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(e)) => return Poll::Ready(Some(Err(Box::new(e)))),
                Poll::Ready(Ok(())) if buf.filled().is_empty() => {
                    if matches!(this.framing, Framing::Close) {
                        this.done = true;
                        return Poll::Ready(None);
                    }
                    let why = "the backend closed the connection in the middle of the stream";
                    return Poll::Ready(Some(Err(broken(why))));
                }
                Poll::Ready(Ok(())) => wire.read.extend_from_slice(buf.filled()),
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done
    }
}
