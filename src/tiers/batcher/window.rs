//! An admission window: the batcher's queue and order in front of calls that are never
//! merged (LLM generations), each released alone onto the pool while the window has
//! room for it.
//!
//! The window holds two counts, sequences and tokens in flight, under limits that move
//! ([`Gate`]). One worker per window ([`Worker::run_window`]) takes the caller served
//! next in the pool's order (band, tenant share, earliest deadline: the batcher's `order`)
//! once a sequence is free, and releases it once its tokens fit too; the caller holds
//! both ([`Held`]) until its answer is complete, which for a stream is its last event.
//! The caller chosen waits for tokens at the head of the line, so a larger call is
//! never passed over for ever by smaller ones behind it; one larger than the whole
//! budget goes when nothing else is in flight. Filler (offline work) is released only
//! when no caller waits, onto a free sequence: a continuous-batching engine takes one
//! more sequence at the cost of a step, so there is no quiet period to wait for.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::order::Rule;
use super::{Entry, Worker};
use crate::error::{Error, Kind};

/// A window's limits now and what is in flight under them.
#[derive(Debug)]
pub struct Gate {
    sequences: AtomicU64,
    tokens: AtomicU64,
    /// The limits now (adapted between the floor and the ceilings).
    sequences_now: AtomicU64,
    tokens_now: AtomicU64,
    /// The ceilings: the policy's.
    max_sequences: u64,
    max_tokens: u64,
    /// Rung when a call's hold ends or a limit widens.
    freed: Notify,
}

/// A released call's hold on its window: given back when dropped.
#[derive(Debug)]
pub struct Held {
    gate: Arc<Gate>,
    tokens: u64,
}

impl Drop for Held {
    fn drop(&mut self) {
        self.gate.sequences.fetch_sub(1, Ordering::AcqRel);
        self.gate.tokens.fetch_sub(self.tokens, Ordering::AcqRel);
        self.gate.freed.notify_one();
    }
}

impl Gate {
    /// A window of at most `max_sequences` sequences and `max_tokens` tokens in flight
    /// (`None`: no token limit): open to its ceilings, or when it `adapts`, to a
    /// sixteenth of them (it widens from there as its engines show room).
    pub fn new(max_sequences: u64, max_tokens: Option<u64>, adapts: bool) -> Arc<Gate> {
        let max_sequences = max_sequences.max(1);
        let max_tokens = max_tokens.unwrap_or(u64::MAX).max(1);
        let start = |ceiling: u64| match adapts {
            true => (ceiling / 16).max(1),
            false => ceiling,
        };
        Arc::new(Gate {
            sequences: AtomicU64::new(0),
            tokens: AtomicU64::new(0),
            sequences_now: AtomicU64::new(start(max_sequences)),
            tokens_now: AtomicU64::new(start(max_tokens)),
            max_sequences,
            max_tokens,
            freed: Notify::new(),
        })
    }

    /// Sequences and tokens in flight now.
    pub fn in_flight(&self) -> (u64, u64) {
        (
            self.sequences.load(Ordering::Acquire),
            self.tokens.load(Ordering::Acquire),
        )
    }

    /// The limits now: sequences and tokens (`u64::MAX`: none).
    pub fn limits(&self) -> (u64, u64) {
        (
            self.sequences_now.load(Ordering::Acquire),
            self.tokens_now.load(Ordering::Acquire),
        )
    }

    /// The ceilings: sequences and tokens (`u64::MAX`: none).
    pub fn ceilings(&self) -> (u64, u64) {
        (self.max_sequences, self.max_tokens)
    }

    /// The engines are under pressure: halves both limits (multiplicative decrease),
    /// to `floor` sequences (0 holds everything back; one sequence never halves to 0)
    /// and a sixteenth of the token ceiling at least. Calls in flight keep running; none
    /// is released until they are back under.
    pub fn narrow(&self, floor: u64) {
        let _ = self
            .sequences_now
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                Some(if n <= 1 { floor.min(n) } else { (n / 2).max(floor) })
            });
        let floor = (self.max_tokens / 16).max(1);
        let _ = self
            .tokens_now
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| Some((n / 2).max(floor)));
    }

    /// The engines have room: widens both limits by `1/parts` of their ceilings (at
    /// least one sequence; additive increase), up to the ceilings.
    pub fn widen(&self, parts: u64) {
        let grow = |now: &AtomicU64, ceiling: u64| {
            let step = (ceiling / parts.max(1)).max(1);
            let _ = now.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                Some(n.saturating_add(step).min(ceiling))
            });
        };
        grow(&self.sequences_now, self.max_sequences);
        grow(&self.tokens_now, self.max_tokens);
        self.freed.notify_one();
    }

    /// Whether a sequence is free.
    fn sequence_free(&self) -> bool {
        let (sequences, _) = self.in_flight();
        sequences < self.sequences_now.load(Ordering::Acquire)
    }

    /// Whether a call holding `tokens` fits now (one alone always does).
    fn tokens_fit(&self, tokens: u64) -> bool {
        let (sequences, held) = self.in_flight();
        sequences == 0 || held.saturating_add(tokens) <= self.tokens_now.load(Ordering::Acquire)
    }

    fn take(self: &Arc<Self>, tokens: u64) -> Held {
        self.sequences.fetch_add(1, Ordering::AcqRel);
        self.tokens.fetch_add(tokens, Ordering::AcqRel);
        Held {
            gate: self.clone(),
            tokens,
        }
    }

    /// Waits until `ready` holds, re-checked whenever a hold ends or a limit widens.
    async fn until(&self, ready: impl Fn(&Gate) -> bool) {
        loop {
            let freed = self.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            if ready(self) {
                return;
            }
            freed.await;
        }
    }
}

impl<L: Send + Sync + 'static, T: Send + 'static, R: Send + 'static> Worker<L, T, R> {
    /// Releases this queue's callers one at a time through `gate` until `shutdown`
    /// fires (then answers what is still queued with [`Kind::Unavailable`]) or every
    /// queue is dropped (then it drains first): each, with the tokens `tokens` says it
    /// holds, goes to `send` with its lane and its hold on the window, which must
    /// answer it and keep the hold until the call is complete.
    pub async fn run_window<F, Fut>(self, gate: Arc<Gate>, tokens: fn(&T) -> u64, send: F, shutdown: CancellationToken)
    where
        F: Fn(Arc<L>, Entry<T, R>, Held) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        loop {
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => break,
                () = gate.until(Gate::sequence_free) => {}
            }
            let next = tokio::select! {
                biased;
                _ = shutdown.cancelled() => break,
                next = self.next_alone() => next,
            };
            let Some((lane, mut entry)) = next else {
                self.line.stopped.store(true, Ordering::Release);
                return;
            };
            let need = tokens(&entry.payload);
            let fits = tokio::select! {
                biased;
                _ = shutdown.cancelled() => {
                    entry.refuse(Error::new(Kind::Unavailable, "the gateway is shutting down"));
                    break;
                }
                () = gate.until(|g| g.tokens_fit(need)) => true,
                () = tokio::time::sleep_until(entry.deadline) => false,
                () = entry.reply.closed() => continue, // its caller went away
            };
            if !fits {
                entry.refuse(Error::new(
                    Kind::Deadline,
                    format!("the budget ran out waiting for {need} tokens of room in the batch pool's window"),
                ));
                continue;
            }
            let held = gate.take(need);
            tokio::spawn(send(lane, entry, held));
        }
        self.line.stopped.store(true, Ordering::Release);
        let (all, rows) = self.line.lock().drain();
        self.shared.release(rows);
        for entry in all {
            entry.refuse(Error::new(Kind::Unavailable, "the gateway is shutting down"));
        }
    }

    /// The caller served next, alone, in the pool's order; filler only when no caller
    /// waits. Waits for one; `None` once every queue is gone and nothing waits.
    async fn next_alone(&self) -> Option<(Arc<L>, Entry<T, R>)> {
        loop {
            let woken = self.line.wake.notified();
            {
                let mut waiting = self.line.lock();
                if waiting.is_empty() && Arc::strong_count(&self.line) == 1 {
                    return None;
                }
                let rule = Rule {
                    now: Instant::now(),
                    limit: 1,
                    max_bytes: u64::MAX,
                    cost: None,
                };
                while let Some(lane) = waiting.next_lane(&rule) {
                    let (formed, released) = waiting.form(lane, &rule);
                    self.shared.release(released);
                    if let Some(mut formed) = formed {
                        if let Some(entry) = formed.entries.pop() {
                            return Some((formed.lane, entry));
                        }
                    }
                }
                if let Some(lane) = waiting.filler_lane() {
                    let formed = waiting.form_filler(lane, (1, u64::MAX));
                    if let Some(entry) = formed.and_then(|mut f| f.entries.pop().map(|e| (f.lane, e))) {
                        return Some(entry);
                    }
                }
            }
            woken.await;
        }
    }
}
