//! The relay: a backend's stream of server-sent events passed to the client event by
//! event, as it comes, by every door that streams (the OpenAI paths, Triton's
//! `generate_stream`, any route whose answer is a stream).
//!
//! A [`Relay`] is the answer's body. It holds at most one event in progress (its
//! framer's buffer, refused past `limits.max_stream_event_bytes`) and hands each whole
//! event up the moment it is cut; the server writes it as a chunk at once. Its budget
//! runs to the first event with content (the first token): by the call's deadline, or
//! the stream ends with an error event. After it, the route's `stream_idle_timeout`
//! between events and `max_stream_duration` in all. A malformed event, a stall, a
//! backend that breaks the stream end it the same way, in the door's error shape
//! (OpenAI's `data: {"error": {...}}`, Triton's `data: {"error": "..."}`), and count
//! against the endpoint once per input (`backend::stream::Outcome`); nothing the caller
//! does counts. Dropping the relay (the client went away) drops the backend's body,
//! which closes its connection. It counts tokens as events pass (the backend's `usage`,
//! else one a content event, marked estimated), and takes out the usage chunk it asked
//! the backend for when the caller did not.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};
use tokio::time::{Instant, Sleep};

use crate::backend::stream::{Outcome, Stream};
use crate::llm::openai::{self, Carries, Usage};
use crate::llm::sse::{Framer, Malformed};
use crate::metrics;
use crate::usage::TokenMeter;

/// What a stream's events are, and what shape a relay's own error event takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// OpenAI's (chat, completions, Responses): JSON data; errors as
    /// `data: {"error": {"message", "type", "param", "code"}}`.
    Openai,
    /// Triton's generate, and a decoupled model's responses (the gRPC door's
    /// `ModelStreamInfer`): JSON data; errors as `data: {"error": "..."}`.
    Triton,
    /// Any other stream: its data is whatever the backend sends, every data event
    /// counts as content; errors as an `error` event.
    Plain,
}

impl Shape {
    /// The shape of a stream answering a request for `path`.
    pub fn of(path: &str) -> Shape {
        if openai::is_path(path) {
            Shape::Openai
        } else if path.starts_with("/v2/")
            && (path.ends_with("/generate_stream") || path.ends_with(crate::protocol::INFER_STREAM))
        {
            Shape::Triton
        } else {
            Shape::Plain
        }
    }
}

/// A relay carried in an answer's extensions, from the pipeline (which makes it) to
/// the door (which writes it).
#[derive(Clone)]
pub struct Relayed(std::sync::Arc<std::sync::Mutex<Option<Relay>>>);

impl Relayed {
    /// Carries `relay`.
    pub fn new(relay: Relay) -> Self {
        Relayed(std::sync::Arc::new(std::sync::Mutex::new(Some(relay))))
    }

    /// The relay an answer carries, taken out of its extensions.
    pub fn of<B>(answer: &mut http::Response<B>) -> Option<Relay> {
        let relayed = answer.extensions_mut().remove::<Relayed>()?;
        let taken = relayed.0.lock().unwrap_or_else(|e| e.into_inner()).take();
        taken
    }

    /// Whether `answer` carries one.
    pub fn carried<B>(answer: &http::Response<B>) -> bool {
        answer.extensions().get::<Relayed>().is_some()
    }
}

impl std::fmt::Debug for Relayed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Relayed").finish_non_exhaustive()
    }
}

/// What a relay is held to, and what it strips.
#[derive(Debug, Clone, Copy)]
pub struct Rules {
    /// After the first token: the longest between two events.
    pub idle: Duration,
    /// After the first token: the longest in all.
    pub max_duration: Duration,
    /// The largest event.
    pub max_event: usize,
    /// Whether the caller's error events are OpenAI's or Triton's.
    pub shape: Shape,
    /// Take out the usage-only chunk: the gateway asked for it, not the caller.
    pub strip_usage: bool,
}

/// Why a stream ended (the `reason` label of `tiergate_streams_ended_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// The backend ended it.
    Done,
    /// The client went away.
    ClientGone,
    /// No first token within the call's budget.
    FirstToken,
    /// No event for `stream_idle_timeout` after the first token.
    Idle,
    /// Longer than `max_stream_duration`.
    TooLong,
    /// The backend's stream broke.
    BackendError,
    /// An event over `limits.max_stream_event_bytes`.
    EventTooBig,
    /// An event that is not one.
    Malformed,
    /// Its client read slower than `limits.min_send_rate`.
    SlowReader,
}

impl End {
    /// The label.
    pub fn as_str(self) -> &'static str {
        match self {
            End::Done => "done",
            End::ClientGone => "client_gone",
            End::FirstToken => "first_token",
            End::Idle => "idle",
            End::TooLong => "too_long",
            End::BackendError => "backend_error",
            End::EventTooBig => "event_too_big",
            End::Malformed => "malformed",
            End::SlowReader => "slow_reader",
        }
    }
}

/// A stream relayed to a client (see the module's docs).
pub struct Relay {
    body: crate::backend::stream::Body,
    framer: Framer,
    outcome: Outcome,
    rules: Rules,
    meter: TokenMeter,
    sent: Instant,
    deadline: Instant,
    first: Option<Instant>,
    last: Instant,
    /// Set for the earliest the stream may end for want of an event: an event moves it
    /// only when it brings that time forward (the first token, its idle limit shorter
    /// than the call's budget); later it is pushed back when it fires early, so an event
    /// costs no timer change.
    timer: Pin<Box<Sleep>>,
    /// What the backend said it used, and the content events counted.
    usage: Option<Usage>,
    content: u64,
    /// Set once the stream has ended: its reason, and the last event still to write.
    ended: Option<End>,
    closing: Option<Bytes>,
}

impl Relay {
    /// Relays `stream` under `rules`, its tokens counted by `meter`.
    pub fn new(stream: Stream, meter: TokenMeter, rules: Rules) -> Self {
        ::metrics::gauge!(metrics::STREAMS_OPEN, meter.labels()).increment(1.0);
        Relay {
            body: stream.body,
            framer: Framer::new(rules.max_event),
            outcome: stream.outcome,
            rules,
            meter,
            sent: stream.sent,
            deadline: stream.deadline,
            first: None,
            last: Instant::now(),
            timer: Box::pin(tokio::time::sleep_until(stream.deadline)),
            usage: None,
            content: 0,
            ended: None,
            closing: None,
        }
    }

    /// When the stream must have its next event (its first token's deadline before it).
    fn due(&self) -> Instant {
        match self.first {
            None => self.deadline,
            Some(first) => (self.last + self.rules.idle).min(first + self.rules.max_duration),
        }
    }

    /// What one whole event does: the bytes to write (none for the usage chunk taken
    /// out), or why the stream ends.
    fn event(&mut self, event: crate::llm::sse::Event) -> Result<Option<Bytes>, End> {
        let now = Instant::now();
        self.last = now;
        let Some(data) = &event.data else {
            return Ok(Some(event.raw)); // a comment or a name alone: passed on
        };
        let carries = match self.rules.shape {
            Shape::Plain => Carries::Content,
            Shape::Openai | Shape::Triton => openai::carries(data).ok_or(End::Malformed)?,
        };
        if let Some(usage) = Usage::of(data) {
            self.usage = Some(usage);
        }
        match carries {
            Carries::Content => {
                self.content += 1;
                if self.first.is_none() {
                    self.first = Some(now);
                    let took = now.saturating_duration_since(self.sent);
                    self.outcome.first_token(took);
                    ::metrics::histogram!(metrics::TIME_TO_FIRST_TOKEN, self.meter.labels()).record(took.as_secs_f64());
                }
            }
            Carries::UsageOnly if self.rules.strip_usage => return Ok(None),
            Carries::UsageOnly | Carries::Other => {}
        }
        Ok(Some(event.raw))
    }

    /// Ends the stream for `end`: counted, the endpoint charged when the backend failed,
    /// and the caller told in the door's shape unless the backend ended it.
    fn end(&mut self, end: End, detail: &str) {
        if self.ended.is_some() {
            return;
        }
        self.ended = Some(end);
        let (message, code, charged) = match end {
            End::Done | End::ClientGone | End::SlowReader => return self.finish(),
            End::FirstToken => {
                self.outcome.first_token_missed(self.sent.elapsed());
                ("the budget ran out before the first token", "deadline", None)
            }
            End::Idle => (
                "the backend sent nothing for stream_idle_timeout",
                "stream_idle",
                Some("stall"),
            ),
            End::TooLong => (
                "the stream ran longer than max_stream_duration",
                "stream_too_long",
                None,
            ),
            End::BackendError => ("the backend's stream broke", "backend_error", Some("broken_answer")),
            End::EventTooBig => (
                "an event is over limits.max_stream_event_bytes",
                "event_too_big",
                Some("broken_answer"),
            ),
            End::Malformed => (
                "the backend sent an event that is not one",
                "malformed_event",
                Some("broken_answer"),
            ),
        };
        if let Some(why) = charged {
            self.outcome.failed(why);
        }
        let message = match detail.is_empty() {
            true => message.to_owned(),
            false => format!("{message}: {detail}"),
        };
        self.closing = Some(match self.rules.shape {
            Shape::Openai => openai::error_event(&message, code),
            Shape::Triton => openai::triton_error_event(&message),
            Shape::Plain => Bytes::from(format!("event: error\ndata: {message}\n\n")),
        });
        self.finish();
    }

    /// Ends the stream for a reason its writer saw (the client's): nothing more is sent.
    pub fn end_as(&mut self, end: End) {
        self.end(end, "");
    }

    /// Counts what the stream used and how it ended.
    fn finish(&mut self) {
        let end = self.ended.unwrap_or(End::ClientGone);
        let labels = self.meter.labels();
        let reason = [
            labels[0].clone(),
            labels[1].clone(),
            ("reason", end.as_str().to_owned()),
        ];
        ::metrics::counter!(metrics::STREAMS_ENDED, &reason).increment(1);
        ::metrics::gauge!(metrics::STREAMS_OPEN, labels).decrement(1.0);
        self.meter.count(self.usage());
        if let (Some(first), true) = (self.first, self.content > 1) {
            let per = self.last.saturating_duration_since(first) / (self.content - 1) as u32;
            ::metrics::histogram!(metrics::TIME_PER_OUTPUT_TOKEN, labels).record(per.as_secs_f64());
            self.outcome.per_token(per);
        }
    }

    /// The tokens counted so far (the backend's, else estimated from content events).
    pub fn usage(&self) -> Usage {
        self.usage.unwrap_or(Usage {
            prompt: 0,
            completion: self.content,
            estimated: true,
        })
    }
}

impl Body for Relay {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        loop {
            if this.ended.is_some() {
                return Poll::Ready(this.closing.take().map(|last| Ok(Frame::data(last))));
            }
            // An event already whole goes first.
            match this.framer.next_event() {
                Ok(Some(event)) => match this.event(event) {
                    Ok(Some(bytes)) => {
                        let due = this.due();
                        if due < this.timer.deadline() {
                            this.timer.as_mut().reset(due);
                        }
                        return Poll::Ready(Some(Ok(Frame::data(bytes))));
                    }
                    Ok(None) => continue,
                    Err(end) => {
                        this.end(end, "");
                        continue;
                    }
                },
                Ok(None) => {}
                Err(Malformed::TooBig(_)) => {
                    this.end(End::EventTooBig, "");
                    continue;
                }
                Err(Malformed::NotText) => {
                    this.end(End::Malformed, "not UTF-8");
                    continue;
                }
            }
            match Pin::new(&mut this.body).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => {
                    if let Ok(data) = frame.into_data() {
                        this.framer.push(data);
                    }
                    continue;
                }
                Poll::Ready(Some(Err(e))) => {
                    this.end(End::BackendError, &e.to_string());
                    continue;
                }
                Poll::Ready(None) if this.framer.held() > 0 => {
                    this.end(End::BackendError, "it ended in the middle of an event");
                    continue;
                }
                Poll::Ready(None) => {
                    this.end(End::Done, "");
                    continue;
                }
                Poll::Pending => {}
            }
            if this.timer.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            let now = Instant::now();
            let due = this.due();
            if now < due {
                // Events came since it was set: set for the next time it may end.
                this.timer.as_mut().reset(due);
                continue;
            }
            let end = match this.first {
                None => End::FirstToken,
                Some(first) if now >= first + this.rules.max_duration => End::TooLong,
                Some(_) => End::Idle,
            };
            this.end(end, "");
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ended.is_some() && self.closing.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        if self.ended.is_none() {
            self.ended = Some(End::ClientGone);
            self.finish();
        }
    }
}

impl std::fmt::Debug for Relay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Relay")
            .field("first", &self.first)
            .field("ended", &self.ended)
            .finish_non_exhaustive()
    }
}
