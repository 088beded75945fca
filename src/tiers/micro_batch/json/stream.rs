//! Streamed completions split: one backend stream answering a batch of callers'
//! `/v1/completions` calls (`stream: true`; their prompts merged as for a whole answer)
//! cut into one stream per caller as its events come.
//!
//! - A chunk's choices go to the caller whose prompt they answer, each `index`
//!   rewritten to the caller's own (`index` = prompt × n + choice). A caller is sent
//!   only chunks that hold a choice of its own, and never another caller's choice.
//! - `[DONE]`, error events and any other event without choices go to every caller.
//!   llama.cpp's `data: null`, sent first on a stream of several prompts, goes to none.
//! - A choice whose `index` is no caller's, or an event that is not JSON, breaks the
//!   batch's stream: every caller's stream ends with the backend's error.
//! - Usage: a chunk whose choices are one caller's may carry its prompt's usage
//!   (llama.cpp does, on each prompt's last chunk); the caller is sent its prompts'
//!   usage so far, summed. The batch's usage chunk (vLLM's `choices: []` with
//!   `stream_options.include_usage`) is split between the callers, prompt tokens in
//!   proportion to their prompts' text and completion tokens to the choices with text
//!   streamed to them (an engine streams a token a chunk), and marked
//!   `tiergate_estimated`. Usage on a chunk whose choices are several callers' is
//!   taken out (whose it is cannot be told).
//!
//! Each caller's events wait in a queue of at most [`QUEUE`] events for its relay. A
//! caller that falls that far behind is sent an error event (`slow_reader`) and let go,
//! so one slow reader never holds its batch-mates back. A caller that goes away is let
//! go; once every caller has, the backend's stream is dropped, closing its connection.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body_util::BodyExt as _;
use hyper::body::Frame;
use serde_json::{Map, Value};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::completions::{choices, counted, prompt_text, proportion};
use super::Part;
use crate::backend::stream::{Body, Stream, Streamed};
use crate::llm::sse::{data_event, Event, Framer};
use crate::protocol::Reply;

/// Most events a caller's queue holds before its caller is let go as a slow reader.
pub(super) const QUEUE: usize = 256;

/// What one of the batch's events becomes.
#[derive(Debug, PartialEq)]
pub(super) enum Out {
    /// The same bytes for every caller.
    All(Bytes),
    /// Events for some callers (by their place in the batch).
    To(Vec<(usize, Bytes)>),
    /// The batch's stream is broken: why.
    Broke(String),
}

/// Cuts the batch's events by caller (see the module's docs).
#[derive(Debug)]
pub(super) struct Splitter {
    /// Each caller's first index in the batch and how many it has (prompts × n).
    spans: Vec<(usize, usize)>,
    /// Each caller's prompts' text, in bytes.
    prompt_text: Vec<u64>,
    /// The choices with text streamed to each caller so far.
    streamed: Vec<u64>,
    /// The usage each caller's own chunks carried, summed.
    own: Vec<Option<Value>>,
}

impl Splitter {
    /// A splitter for the batch of `parts`, in the order their prompts were sent.
    pub(super) fn new(parts: &[&Part]) -> Self {
        let n = parts.first().map_or(1, |p| choices(&p.rest));
        let mut start = 0;
        let spans = parts
            .iter()
            .map(|p| {
                let span = (start, p.rows() * n);
                start += span.1;
                span
            })
            .collect();
        Splitter {
            spans,
            prompt_text: parts.iter().map(|p| prompt_text(p)).collect(),
            streamed: vec![0; parts.len()],
            own: vec![None; parts.len()],
        }
    }

    /// The caller an index of the batch is, and its index among the caller's choices.
    fn whose(&self, index: usize) -> Option<(usize, usize)> {
        let caller = self
            .spans
            .partition_point(|(start, _)| *start <= index)
            .checked_sub(1)?;
        let (start, len) = self.spans[caller];
        (index < start + len).then_some((caller, index - start))
    }

    /// What one whole event of the batch's stream becomes.
    pub(super) fn event(&mut self, event: &Event) -> Out {
        let Some(data) = &event.data else {
            return Out::All(event.raw.clone()); // a comment, or a name alone
        };
        if data.as_ref() == b"[DONE]" {
            return Out::All(event.raw.clone());
        }
        let mut chunk = match serde_json::from_slice::<Value>(data) {
            Ok(Value::Object(chunk)) => chunk,
            Ok(Value::Null) => return Out::To(Vec::new()),
            Ok(_) | Err(_) => return Out::Broke("it sent an event that is not a JSON object".into()),
        };
        match chunk.remove("choices") {
            Some(Value::Array(list)) if !list.is_empty() => self.choices(chunk, list),
            Some(Value::Array(_)) | None if chunk.contains_key("usage") && !chunk.contains_key("error") => {
                self.usage(chunk)
            }
            Some(Value::Array(_)) | None => Out::All(event.raw.clone()),
            Some(_) => Out::Broke("a chunk's \"choices\" is not an array".into()),
        }
    }

    /// A chunk's choices, each sent to its caller in a copy of the chunk.
    fn choices(&mut self, mut chunk: Map<String, Value>, list: Vec<Value>) -> Out {
        let usage = chunk.remove("usage");
        let mut per: Vec<(usize, Vec<Value>)> = Vec::new();
        for mut choice in list {
            let index = choice
                .get("index")
                .and_then(Value::as_u64)
                .and_then(|i| usize::try_from(i).ok());
            let Some((caller, local)) = index.and_then(|i| self.whose(i)) else {
                return Out::Broke(format!(
                    "a choice's index is not one of the batch's 0..{}",
                    self.indexes()
                ));
            };
            if choice
                .get("text")
                .and_then(Value::as_str)
                .is_some_and(|t| !t.is_empty())
            {
                self.streamed[caller] += 1;
            }
            if let Some(obj) = choice.as_object_mut() {
                obj.insert("index".into(), Value::from(local));
            }
            match per.iter_mut().find(|(c, _)| *c == caller) {
                Some((_, mine)) => mine.push(choice),
                None => per.push((caller, vec![choice])),
            }
        }
        // A prompt's own usage, on a chunk of one caller's: the caller's so far.
        let told = match (usage, per.as_slice()) {
            (Some(usage), [(caller, _)]) => {
                let own = &mut self.own[*caller];
                *own = super::summed(own.take(), Some(usage.clone())).or(Some(usage));
                Some(*caller)
            }
            _ => None,
        };
        Out::To(
            per.into_iter()
                .map(|(caller, mine)| {
                    let mut copy = chunk.clone();
                    copy.insert("choices".into(), Value::Array(mine));
                    if let Some(own) = self.own[caller].as_ref().filter(|_| told == Some(caller)) {
                        copy.insert("usage".into(), own.clone());
                    }
                    (caller, written(copy))
                })
                .collect(),
        )
    }

    /// The batch's usage chunk, split between the callers.
    fn usage(&mut self, mut chunk: Map<String, Value>) -> Out {
        let Some(usage) = chunk.remove("usage") else {
            return Out::To(Vec::new());
        };
        let count = |key: &str| usage.get(key).and_then(Value::as_u64).unwrap_or(0);
        let streamed: Vec<u64> = self.streamed.iter().map(|t| (*t).max(1)).collect();
        let prompts = proportion(count("prompt_tokens"), &self.prompt_text);
        let completions = proportion(count("completion_tokens"), &streamed);
        Out::To(
            prompts
                .into_iter()
                .zip(completions)
                .enumerate()
                .map(|(caller, (prompt, completion))| {
                    let mut copy = chunk.clone();
                    copy.insert("choices".into(), Value::Array(Vec::new()));
                    copy.insert("usage".into(), counted(prompt, completion, true));
                    (caller, written(copy))
                })
                .collect(),
        )
    }

    /// The batch's choices: prompts × n.
    fn indexes(&self) -> usize {
        self.spans.iter().map(|(_, len)| len).sum()
    }
}

/// A chunk written as an event.
fn written(chunk: Map<String, Value>) -> Bytes {
    data_event(Value::Object(chunk).to_string().as_bytes())
}

/// One caller's stream: its events as the pump queues them, or the error that broke it.
struct Queued(mpsc::Receiver<Result<Bytes, String>>);

impl hyper::body::Body for Queued {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        self.get_mut()
            .0
            .poll_recv(cx)
            .map(|next| next.map(|piece| piece.map(Frame::data).map_err(Into::into)))
    }
}

/// The answer to a streamed batch cut into one streamed answer per caller of `parts`
/// (each due by its `deadlines`), and the pump that feeds them from the batch's stream,
/// its events at most `max_event` bytes, until it ends or every caller has gone.
/// `None` when `reply` carries no stream.
pub(in crate::tiers::micro_batch) fn split(
    reply: &mut Reply,
    parts: &[&Part],
    deadlines: &[Instant],
    max_event: usize,
) -> Option<(Vec<Reply>, Pump)> {
    let stream = Streamed::of(reply)?;
    let mut senders = Vec::with_capacity(parts.len());
    let mut replies = Vec::with_capacity(parts.len());
    for deadline in deadlines {
        let (tx, rx) = mpsc::channel(QUEUE);
        senders.push(Some(tx));
        let mut answer = http::Response::new(Bytes::new());
        *answer.status_mut() = reply.status();
        *answer.headers_mut() = reply.headers().clone();
        let own = Stream {
            body: Body::new(Queued(rx)),
            deadline: *deadline,
            sent: stream.sent,
            outcome: stream.outcome.clone(),
        };
        answer.extensions_mut().insert(Streamed::new(own));
        replies.push(answer);
    }
    let pump = pump(stream.body, (Splitter::new(parts), Framer::new(max_event)), senders);
    Some((replies, Box::pin(pump)))
}

type Sender = mpsc::Sender<Result<Bytes, String>>;

/// What feeds a streamed batch's callers until its stream ends.
pub(in crate::tiers::micro_batch) type Pump = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Reads the batch's stream and queues each event for its callers, until it ends, it
/// breaks or every caller has gone.
async fn pump(mut body: Body, (mut splitter, mut framer): (Splitter, Framer), mut callers: Vec<Option<Sender>>) {
    loop {
        let frame = tokio::select! {
            frame = body.frame() => frame,
            () = all_gone(&callers) => return,
        };
        match frame {
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    framer.push(data);
                }
            }
            Some(Err(e)) => return broke(&mut callers, &e.to_string()),
            None if framer.held() > 0 => return broke(&mut callers, "it ended in the middle of an event"),
            None => return,
        }
        loop {
            let event = match framer.next_event() {
                Ok(Some(event)) => event,
                Ok(None) => break,
                Err(e) => return broke(&mut callers, &e.to_string()),
            };
            match splitter.event(&event) {
                Out::All(bytes) => callers.iter_mut().for_each(|c| deliver(c, bytes.clone())),
                Out::To(events) => {
                    for (caller, bytes) in events {
                        if let Some(slot) = callers.get_mut(caller) {
                            deliver(slot, bytes);
                        }
                    }
                }
                Out::Broke(why) => return broke(&mut callers, &why),
            }
        }
    }
}

/// Done once every caller still served has gone (at once when none is).
async fn all_gone(callers: &[Option<Sender>]) {
    for tx in callers.iter().flatten() {
        tx.closed().await;
    }
}

/// Queues `bytes` for a caller; a caller [`QUEUE`] events behind is told so in its
/// queue's last place and let go, as is one that has gone.
fn deliver(slot: &mut Option<Sender>, bytes: Bytes) {
    let Some(tx) = slot.as_ref() else {
        return;
    };
    if tx.is_closed() {
        *slot = None;
        return;
    }
    if tx.capacity() > 1 {
        let _ = tx.try_send(Ok(bytes));
        return;
    }
    let message =
        format!("this stream was read more slowly than its batch's backend wrote it, and fell {QUEUE} events behind");
    let _ = tx.try_send(Ok(crate::llm::openai::error_event(&message, "slow_reader")));
    *slot = None;
}

/// Ends every caller's stream with the backend's error: its stream broke for `why`.
fn broke(callers: &mut [Option<Sender>], why: &str) {
    for tx in callers.iter_mut().filter_map(Option::take) {
        let _ = tx.try_send(Err(format!("the batch's backend stream broke: {why}")));
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // in tests a failed unwrap is a failed test
mod tests {
    use super::*;

    #[test]
    fn a_caller_queue_events_behind_is_told_and_let_go_and_a_break_reaches_the_rest() {
        let (slow, mut slow_rx) = mpsc::channel(QUEUE);
        let (gone, gone_rx) = mpsc::channel(QUEUE);
        let (reading, mut reading_rx) = mpsc::channel(QUEUE);
        let mut callers = vec![Some(slow), Some(gone), Some(reading)];
        drop(gone_rx);
        for i in 0..QUEUE + 10 {
            for caller in callers.iter_mut() {
                deliver(caller, Bytes::from(format!("data: {i}\n\n")));
            }
            assert_eq!(reading_rx.try_recv().unwrap().unwrap(), format!("data: {i}\n\n"));
        }
        assert!(
            callers[0].is_none() && callers[1].is_none(),
            "the slow and the gone are let go"
        );
        let mut queued = Vec::new();
        while let Ok(event) = slow_rx.try_recv() {
            queued.push(event.unwrap());
        }
        assert_eq!(queued.len(), QUEUE, "every place of its queue, and no more");
        assert!(String::from_utf8_lossy(&queued[QUEUE - 1]).contains("slow_reader"));
        broke(&mut callers, "reset");
        assert_eq!(
            reading_rx.try_recv().unwrap().unwrap_err(),
            "the batch's backend stream broke: reset"
        );
        assert!(callers.iter().all(Option::is_none));
    }
}
