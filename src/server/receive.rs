//! A request's body as every listener hands it to its door ([`Incoming`]): hyper's own,
//! held to the listener's rules while it is on its way, so a client sending a body a
//! byte at a time cannot hold its connection (and its place in the table) for long.
//!
//! While a body is in progress (from the request's head to its end; on gRPC, from the
//! call's head or a message's first byte to that message's last, so a stream may rest
//! between messages) it must arrive within the listener's body deadline, scaled down as
//! the connection table fills (see the listener's table), and at no less than
//! `min_receive_rate` bytes a second over each 10 s window it is waited for. Past
//! either, the body fails with a [`TooSlow`] the doors answer 408. Its connection's
//! [`Activity`] counts it meanwhile, so a full table can close the connection whose body
//! comes slowest, and a body the door left unread (an early refusal) makes the server
//! say `connection: close` on an HTTP/1.1 answer. A body that came whole with its head
//! (most do) costs nothing here: it is never watched.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};
use tokio::time::{Instant, Sleep};

use super::counted::Activity;

/// The window over which a body in progress is held to `min_receive_rate`.
pub(super) const RECEIVE_WINDOW: Duration = Duration::from_secs(10);

/// What a listener asks of a request body in progress.
#[derive(Debug, Clone, Copy)]
pub(super) struct Rules {
    /// How long a body (on gRPC, a message) may take, from its start.
    pub(super) deadline: Duration,
    /// Bytes a second it must arrive at, over each [`RECEIVE_WINDOW`] (0: any).
    pub(super) min_rate: u64,
}

/// Why a body in progress was given up: the doors answer it with 408.
#[derive(Debug, Clone, thiserror::Error)]
pub enum TooSlow {
    /// It took longer than the listener's body deadline.
    #[error(
        "the request body took longer than {0:?} to arrive (limits.body_read_timeout, less while the \
         gateway's connection table is more than half full)"
    )]
    Deadline(Duration),
    /// It came slower than `min_receive_rate` over a window.
    #[error(
        "the request body arrived at {got} bytes a second, slower than limits.min_receive_rate ({min} bytes a \
         second over 10 s)"
    )]
    Rate {
        /// What it came at over the window.
        got: u64,
        /// The floor.
        min: u64,
    },
    /// Its connection was closed to make room for another client.
    #[error("the connection was closed to make room for another client while its request body came slowly")]
    Evicted,
}

/// A request body as the server hands it to a door: hyper's, watched while in progress.
pub struct Incoming {
    body: hyper::body::Incoming,
    /// `None` for a body that came whole with its head.
    watch: Option<Box<Watch>>,
}

/// A body's watch: its connection, the rules, and the piece in progress.
struct Watch {
    activity: Arc<Activity>,
    rules: Rules,
    /// On gRPC, where the next message boundary is.
    grpc: Option<Framing>,
    /// While a body or message is in progress.
    progress: Option<Progress>,
    /// Whether the body has reached its end.
    ended: bool,
}

/// A body or message in progress.
struct Progress {
    deadline: Instant,
    /// The current window: when it began and what came in it.
    since: Instant,
    bytes: u64,
    /// Armed the first time the body is waited for.
    timer: Option<Pin<Box<Sleep>>>,
}

/// gRPC's length-prefixed messages: a flag byte and a 4-byte big-endian length.
#[derive(Debug, Default)]
struct Framing {
    /// Prefix bytes read of the next message (0 to 5).
    prefix: [u8; 5],
    seen: usize,
    /// Payload bytes still to come of the current message.
    left: u64,
}

impl Framing {
    /// Follows `data`; returns whether a message is still in progress after it.
    fn follow(&mut self, mut data: &[u8]) -> bool {
        while !data.is_empty() {
            if self.left > 0 {
                let take = data.len().min(usize::try_from(self.left).unwrap_or(usize::MAX));
                self.left -= take as u64;
                data = &data[take..];
                continue;
            }
            let take = data.len().min(5 - self.seen);
            self.prefix[self.seen..self.seen + take].copy_from_slice(&data[..take]);
            self.seen += take;
            data = &data[take..];
            if self.seen == 5 {
                let len = u32::from_be_bytes([self.prefix[1], self.prefix[2], self.prefix[3], self.prefix[4]]);
                (self.seen, self.left) = (0, u64::from(len));
            }
        }
        self.seen > 0 || self.left > 0
    }
}

impl Incoming {
    /// `body` of a request with `headers`, on a connection of `activity`, held to
    /// `rules` (asked only for a body still on its way).
    pub(super) fn new(
        body: hyper::body::Incoming,
        headers: &http::HeaderMap,
        activity: &Arc<Activity>,
        rules: impl FnOnce() -> Rules,
    ) -> Self {
        if body.is_end_stream() {
            return Incoming { body, watch: None };
        }
        let grpc = headers
            .get(http::header::CONTENT_TYPE)
            .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"))
            .then(Framing::default);
        let mut watch = Watch {
            activity: activity.clone(),
            rules: rules(),
            grpc,
            progress: None,
            ended: false,
        };
        watch.begin(Instant::now());
        Incoming {
            body,
            watch: Some(Box::new(watch)),
        }
    }
}

impl Watch {
    /// A body or message began at `now`.
    fn begin(&mut self, now: Instant) {
        if self.progress.is_none() {
            self.progress = Some(Progress {
                deadline: now + self.rules.deadline,
                since: now,
                bytes: 0,
                timer: None,
            });
            self.activity.receiving_began(now);
        }
    }

    /// The piece in progress ended (or the body did).
    fn rest(&mut self) {
        if self.progress.take().is_some() {
            self.activity.receiving_ended();
        }
    }

    /// `data` came.
    fn received(&mut self, data: &[u8]) {
        if data.is_empty() {
            return;
        }
        self.begin(Instant::now());
        if let Some(progress) = &mut self.progress {
            progress.bytes += data.len() as u64;
        }
        self.activity.received(data.len());
        if let Some(framing) = &mut self.grpc {
            if !framing.follow(data) {
                self.rest();
            }
        }
    }

    /// The body is waited for: `Err` once the piece in progress is past its deadline
    /// or came too slowly over a window; else its timer is armed with `cx`'s waker.
    fn waited(&mut self, cx: &mut Context<'_>) -> Result<(), TooSlow> {
        let rules = self.rules;
        let Some(progress) = &mut self.progress else {
            return Ok(());
        };
        let next = |deadline: Instant, since: Instant| match rules.min_rate {
            0 => deadline,
            _ => deadline.min(since + RECEIVE_WINDOW),
        };
        let at = next(progress.deadline, progress.since);
        let timer = progress
            .timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(at)));
        while timer.as_mut().poll(cx).is_ready() {
            let now = Instant::now();
            if now >= progress.deadline {
                return Err(TooSlow::Deadline(rules.deadline));
            }
            let owed = (now - progress.since).as_secs_f64() * rules.min_rate as f64;
            if (progress.bytes as f64) < owed {
                let got = progress.bytes as f64 / (now - progress.since).as_secs_f64().max(1e-3);
                return Err(TooSlow::Rate {
                    got: got as u64,
                    min: rules.min_rate,
                });
            }
            (progress.since, progress.bytes) = (now, 0);
            timer.as_mut().reset(next(progress.deadline, now));
        }
        Ok(())
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.rest();
        if !self.ended && self.grpc.is_none() {
            self.activity.left_unread();
        }
    }
}

impl Body for Incoming {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.body).poll_frame(cx);
        let Some(watch) = this.watch.as_deref_mut() else {
            return polled.map_err(Into::into);
        };
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    watch.received(data);
                }
            }
            Poll::Ready(Some(Err(_))) if watch.activity.is_closed() => {
                watch.rest();
                return Poll::Ready(Some(Err(Box::new(TooSlow::Evicted))));
            }
            Poll::Ready(Some(Err(_))) => watch.rest(),
            Poll::Ready(None) => {}
            Poll::Pending => {
                if let Err(slow) = watch.waited(cx) {
                    watch.rest();
                    return Poll::Ready(Some(Err(Box::new(slow))));
                }
            }
        }
        if matches!(polled, Poll::Ready(None)) || this.body.is_end_stream() {
            watch.ended = true;
            watch.rest();
        }
        polled.map_err(Into::into)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

impl std::fmt::Debug for Incoming {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Incoming")
            .field("watched", &self.watch.is_some())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // in tests a failed unwrap is a failed test
mod tests {
    use super::*;

    #[test]
    fn grpc_framing_knows_when_a_message_is_whole() {
        let mut framing = Framing::default();
        let mut message = vec![0u8, 0, 0, 0, 3];
        message.extend_from_slice(b"abc");
        assert!(framing.follow(&message[..2]), "half a prefix");
        assert!(framing.follow(&message[2..6]), "the prefix and a byte");
        assert!(!framing.follow(&message[6..]), "whole");
        let mut two = message.clone();
        two.extend_from_slice(&message[..4]);
        assert!(framing.follow(&two), "one whole, the next begun");
        assert!(!framing.follow(&message[4..]), "the second whole");
        assert!(
            !framing.follow(&[0, 0, 0, 0, 0]),
            "an empty message is whole with its prefix"
        );
    }
}
