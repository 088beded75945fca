//! The batcher: the micro-batch tier's queue and its flush policy.
//!
//! Between the tier's door-facing service and the batch pool. Callers [`Queue::submit`]
//! a payload with its row count and deadline; one [`Worker`] per queue forms batches and
//! hands each to the `send` function with the callers' reply channels, which answers
//! every caller. The policy is work-conserving: a batch goes out as soon as a backend
//! slot is free, or when it is full (`max_batch` rows); while every slot is busy it keeps
//! filling, unless one more caller would make the batch's earliest deadline miss under
//! the pool's learned cost (see [`super::cost`]). `max_wait` is a ceiling on waiting for
//! a slot to fill a batch, never a floor, so a lone request at low load is sent at once.
//! The queues in front of one pool share its slots, its cost and one capacity in rows
//! ([`Shared`]; a full queue refuses at once); a caller whose deadline passed or who went
//! away is answered or dropped before its batch is sent, never sent to the backend.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::cost::Cost;
use crate::error::{Error, Kind};

/// How much longer (as a fraction of the callers' own learned cost) a batch may take
/// once topped up with filler: the price callers pay for offline work riding along.
pub const FILL_SLACK: f64 = 0.05;

/// How long callers must have been quiet before filler has a batch of its own: a batch
/// the backend is busy with delays the next caller by its whole cost, so offline work
/// gets whole batches only while the micro-batch tier is not in use.
pub const IDLE_FOR_FILLER: Duration = Duration::from_millis(50);

/// How a queue forms batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    /// Most rows in one batch.
    pub max_batch: u64,
    /// Longest a batch waits to fill once it could otherwise be sent.
    pub max_wait: Duration,
    /// Batches in flight at once (backend slots).
    pub slots: usize,
    /// Rows that may wait in the queue; beyond, submissions are refused.
    pub capacity: u64,
}

/// What every queue in front of one batch pool shares: the pool's backend slots, the
/// rows waiting (one capacity for the pool), its learned cost and the depth gauge.
#[derive(Debug, Clone)]
pub struct Shared {
    /// Backend slots: a batch holds one from sending until it is answered.
    pub slots: Arc<Semaphore>,
    /// Rows waiting across the queues.
    pub queued: Arc<AtomicU64>,
    /// The pool's learned cost `t(n)`.
    pub cost: Arc<Cost>,
    /// Queue depth in rows, as a metric.
    pub depth: metrics::Gauge,
    /// When a caller last queued (ns since `epoch`): filler has batches of its own only
    /// once callers have been quiet for [`IDLE_FOR_FILLER`].
    pub last_caller: Arc<AtomicU64>,
    /// The zero of `last_caller`.
    pub epoch: Instant,
    /// The pool's progressive batch size: most rows a batch carries now.
    pub limit: Arc<Limit>,
}

/// A batch pool's progressive batch size: after a batch fails, times out or takes far
/// more than its learned cost, the most rows a batch may carry halve (down to 1); each
/// batch that goes well adds back a sixteenth of `max_batch` (at least one row), up to
/// `max_batch`. A struggling backend is sent less at once, and recovers in 16 good
/// batches from the smallest size.
#[derive(Debug)]
pub struct Limit(AtomicU64);

impl Limit {
    /// A limit starting at `max_batch` (no limit below the configured one).
    pub fn new(max_batch: u64) -> Self {
        Limit(AtomicU64::new(max_batch.max(1)))
    }

    /// Most rows a batch may carry now, under a configured `max_batch`.
    pub fn now(&self, max_batch: u64) -> u64 {
        self.0.load(Ordering::Acquire).clamp(1, max_batch.max(1))
    }

    /// A batch went wrong: halves the limit; returns the new one.
    pub fn shrink(&self, max_batch: u64) -> u64 {
        let next = (self.now(max_batch) / 2).max(1);
        self.0.store(next, Ordering::Release);
        next
    }

    /// A batch went well: grows the limit by a sixteenth of `max_batch`; returns the new one.
    pub fn grow(&self, max_batch: u64) -> u64 {
        let max_batch = max_batch.max(1);
        let next = self
            .now(max_batch)
            .saturating_add(max_batch.div_ceil(16))
            .min(max_batch);
        self.0.store(next, Ordering::Release);
        next
    }
}

impl Shared {
    /// Fresh slots, counter and cost for `settings`; the depth is not exported.
    pub fn new(settings: &Settings) -> Self {
        Shared {
            slots: Arc::new(Semaphore::new(settings.slots.max(1))),
            queued: Arc::default(),
            cost: Arc::default(),
            depth: metrics::Gauge::noop(),
            last_caller: Arc::default(),
            epoch: Instant::now(),
            limit: Arc::new(Limit::new(settings.max_batch)),
        }
    }

    /// Most rows a batch may carry now (the progressive limit, at most `max_batch`).
    fn max_batch(&self, max_batch: u64) -> u64 {
        self.limit.now(max_batch)
    }

    fn since_epoch(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// Whether no caller has queued for [`IDLE_FOR_FILLER`].
    fn callers_quiet(&self) -> bool {
        let last = self.last_caller.load(Ordering::Acquire);
        last == 0 || self.since_epoch().saturating_sub(last) >= IDLE_FOR_FILLER.as_nanos() as u64
    }

    fn release(&self, rows: u64) {
        self.queued.fetch_sub(rows, Ordering::AcqRel);
        self.depth.decrement(rows as f64);
    }

    /// Releases `entry`'s rows from the queue count unless it is filler (never counted).
    fn release_entry<T, R>(&self, entry: &Entry<T, R>) {
        if !entry.filler {
            self.release(entry.rows);
        }
    }
}

/// Why a batch stopped growing and went out (the `reason` label of the flush metric).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flush {
    /// It reached `max_batch` rows, or the next caller would not fit.
    Full,
    /// A backend slot was free: nothing is gained by waiting.
    IdleBackend,
    /// One more caller would make the batch's earliest deadline miss under the learned cost.
    Deadline,
    /// It waited `max_wait` for a slot.
    MaxWait,
}

impl Flush {
    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Flush::Full => "full",
            Flush::IdleBackend => "idle_backend",
            Flush::Deadline => "deadline",
            Flush::MaxWait => "max_wait",
        }
    }
}

/// One caller's place in a batch: its payload, rows, deadline and reply channel.
#[derive(Debug)]
pub struct Entry<T, R> {
    /// What the caller sent.
    pub payload: T,
    /// Its rows (dimension 0).
    pub rows: u64,
    /// When its budget runs out.
    pub deadline: Instant,
    /// When it was queued.
    pub queued_at: Instant,
    /// Offline work riding on spare room: never counted in the queue, never delays a
    /// caller (see [`Queue::submit_filler`]).
    pub filler: bool,
    /// Where its answer goes; answered exactly once.
    pub reply: oneshot::Sender<Result<R, Error>>,
}

impl<T, R> Entry<T, R> {
    /// An entry queued now, and where its answer will come.
    fn new(payload: T, rows: u64, deadline: Instant, filler: bool) -> (Self, oneshot::Receiver<Result<R, Error>>) {
        let (reply, answer) = oneshot::channel();
        let entry = Entry {
            payload,
            rows,
            deadline,
            queued_at: Instant::now(),
            filler,
            reply,
        };
        (entry, answer)
    }
}

/// The submitting side of a queue; cheap to clone.
#[derive(Debug)]
pub struct Queue<T, R> {
    tx: mpsc::UnboundedSender<Entry<T, R>>,
    filler_tx: mpsc::UnboundedSender<Entry<T, R>>,
    shared: Shared,
    capacity: u64,
}

/// The batching side of a queue: run it with [`Worker::run`].
#[derive(Debug)]
pub struct Worker<T, R> {
    rx: mpsc::UnboundedReceiver<Entry<T, R>>,
    filler_rx: mpsc::UnboundedReceiver<Entry<T, R>>,
    /// A filler entry that did not fit the last batch; it goes first in a later one.
    filler_carry: Option<Entry<T, R>>,
    settings: Settings,
    shared: Shared,
}

/// A batch: the callers, in arrival order.
pub type Batch<T, R> = Vec<Entry<T, R>>;

/// A queue and its worker, with slots, counter and cost of their own.
pub fn pair<T, R>(settings: Settings) -> (Queue<T, R>, Worker<T, R>) {
    let shared = Shared::new(&settings);
    pair_sharing(settings, shared)
}

/// A queue and its worker over `shared` slots, queued rows and cost (one batch pool).
pub fn pair_sharing<T, R>(settings: Settings, shared: Shared) -> (Queue<T, R>, Worker<T, R>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let (filler_tx, filler_rx) = mpsc::unbounded_channel();
    let queue = Queue {
        tx,
        filler_tx,
        shared: shared.clone(),
        capacity: settings.capacity,
    };
    let worker = Worker {
        rx,
        filler_rx,
        filler_carry: None,
        settings,
        shared,
    };
    (queue, worker)
}

impl<T, R> Clone for Queue<T, R> {
    fn clone(&self) -> Self {
        Queue {
            tx: self.tx.clone(),
            filler_tx: self.filler_tx.clone(),
            shared: self.shared.clone(),
            capacity: self.capacity,
        }
    }
}

impl<T, R> Queue<T, R> {
    /// Queues `payload` (`rows` rows, answered by `deadline`) and returns where its
    /// answer will come; refuses at once with [`Kind::QueueFull`] when the rows would not fit.
    pub fn submit(
        &self,
        payload: T,
        rows: u64,
        deadline: Instant,
    ) -> Result<oneshot::Receiver<Result<R, Error>>, Error> {
        let after = self
            .shared
            .queued
            .fetch_add(rows, Ordering::AcqRel)
            .saturating_add(rows);
        if after > self.capacity {
            self.shared.queued.fetch_sub(rows, Ordering::AcqRel);
            return Err(Error::new(
                Kind::QueueFull,
                format!(
                    "the micro-batch queue is full ({} rows waiting, capacity {})",
                    after.saturating_sub(rows),
                    self.capacity
                ),
            ));
        }
        self.shared.depth.increment(rows as f64);
        self.shared
            .last_caller
            .store(self.shared.since_epoch().max(1), Ordering::Release);
        let (entry, answer) = Entry::new(payload, rows, deadline, false);
        if self.tx.send(entry).is_err() {
            self.shared.release(rows);
            return Err(Error::new(Kind::Unavailable, "the micro-batch worker has stopped"));
        }
        Ok(answer)
    }

    /// Queues offline work as filler: it rides in callers' batches only while that keeps
    /// the batch's learned cost within [`FILL_SLACK`] of what the callers alone cost (and
    /// within `max_batch`), and has batches of its own only when a slot is free and no
    /// caller waits. It is not counted against the capacity. The submitter bounds how
    /// much filler it queues.
    pub fn submit_filler(
        &self,
        payload: T,
        rows: u64,
        deadline: Instant,
    ) -> Result<oneshot::Receiver<Result<R, Error>>, Error> {
        let (entry, answer) = Entry::new(payload, rows, deadline, true);
        self.filler_tx
            .send(entry)
            .map_err(|_| Error::new(Kind::Unavailable, "the micro-batch worker has stopped"))?;
        Ok(answer)
    }

    /// Rows waiting now, across every queue sharing this one's pool.
    pub fn queued_rows(&self) -> u64 {
        self.shared.queued.load(Ordering::Acquire)
    }

    /// Whether the worker has stopped (shutdown), so nothing submitted would be served.
    pub fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }
}

/// A batch being filled.
struct Filling<T, R> {
    entries: Batch<T, R>,
    rows: u64,
    earliest: Instant,
}

impl<T: Send + 'static, R: Send + 'static> Worker<T, R> {
    /// Forms batches until `shutdown` fires (then answers what is still queued with
    /// [`Kind::Unavailable`]) or every [`Queue`] is dropped (then it drains the queue
    /// first), and hands each batch to `send` with why it went, which must answer every
    /// entry. The batch holds its backend slot until `send` completes.
    pub async fn run<F, Fut>(mut self, send: F, shutdown: CancellationToken)
    where
        F: Fn(Batch<T, R>, Flush) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let send = Arc::new(send);
        let mut carry: Option<Entry<T, R>> = None;
        loop {
            if shutdown.is_cancelled() {
                break; // once shutdown fires, nothing new is batched
            }
            // Callers first; filler starts a batch only when no caller is waiting.
            let first = match carry.take().or_else(|| self.rx.try_recv().ok()) {
                Some(entry) => entry,
                None => match self.filler_carry.take() {
                    Some(entry) => entry,
                    None => tokio::select! {
                        biased;
                        _ = shutdown.cancelled() => break,
                        entry = self.rx.recv() => match entry { Some(e) => e, None => return },
                        entry = self.filler_rx.recv() => match entry { Some(e) => e, None => return },
                    },
                },
            };
            let idle =
                self.shared.slots.available_permits() > 0 && !self.queued_elsewhere() && self.shared.callers_quiet();
            if first.filler && !idle {
                // Filler alone never waits in line for a slot: it waits for a caller to
                // ride with, or for the pool to be idle (checked every millisecond).
                self.filler_carry = Some(first);
                tokio::select! {
                    biased;
                    _ = shutdown.cancelled() => break,
                    entry = self.rx.recv() => match entry { Some(e) => carry = Some(e), None => return },
                    _ = tokio::time::sleep(Duration::from_millis(1)) => {}
                }
                continue;
            }
            let (batch, next) = self.fill(first, &shutdown).await;
            carry = next;
            if let Some((batch, slot, flush)) = batch {
                let send = send.clone();
                tokio::spawn(async move {
                    send(batch, flush).await;
                    drop(slot); // the backend slot frees only once the batch is answered
                });
            }
        }
        self.rx.close();
        while let Ok(entry) = self.rx.try_recv() {
            self.shared.release(entry.rows);
            answer(entry, Kind::Unavailable, "the gateway is shutting down");
        }
        self.filler_rx.close();
        let fillers = std::iter::from_fn(|| self.filler_rx.try_recv().ok());
        for entry in self.filler_carry.take().into_iter().chain(fillers.collect::<Vec<_>>()) {
            answer(entry, Kind::Unavailable, "the gateway is shutting down");
        }
    }

    /// Whether callers wait in another queue of the same pool.
    fn queued_elsewhere(&self) -> bool {
        self.shared.queued.load(Ordering::Acquire) > 0
    }

    /// Tops a batch that has a slot up with filler: to `max_batch` when it holds no
    /// caller, else while the learned cost stays within [`FILL_SLACK`] of the callers'.
    fn top_up(&mut self, batch: &mut Filling<T, R>) {
        let callers: u64 = batch.entries.iter().filter(|e| !e.filler).map(|e| e.rows).sum();
        let ceiling = match callers {
            0 => None,
            n => match self.shared.cost.predict(n) {
                Some(t) => Some(t.mul_f64(1.0 + FILL_SLACK)),
                None => return, // nothing known of the cost: callers' batches stay theirs
            },
        };
        loop {
            let entry = match self.filler_carry.take() {
                Some(e) => e,
                None => match self.filler_rx.try_recv() {
                    Ok(e) => e,
                    Err(_) => return,
                },
            };
            let rows = batch.rows.saturating_add(entry.rows);
            let within = rows <= self.shared.max_batch(self.settings.max_batch)
                && ceiling.is_none_or(|c| self.shared.cost.predict(rows).is_some_and(|t| t <= c));
            if !within {
                self.filler_carry = Some(entry);
                return;
            }
            batch.rows = rows;
            batch.entries.push(entry);
        }
    }

    /// Grows a batch from `first` until a slot frees (or it is sealed: full, at the
    /// deadline limit, or past `max_wait`; then it waits for a slot); returns the batch
    /// (none when every caller dropped out) and an entry that did not fit, which starts
    /// the next batch. When `shutdown` fires while it waits for a slot, every entry it
    /// holds is answered [`Kind::Unavailable`] and it returns neither.
    async fn fill(
        &mut self,
        first: Entry<T, R>,
        shutdown: &CancellationToken,
    ) -> (Option<(Batch<T, R>, OwnedSemaphorePermit, Flush)>, Option<Entry<T, R>>) {
        let opened = Instant::now();
        let mut batch = Filling {
            rows: first.rows,
            earliest: first.deadline,
            entries: vec![first],
        };
        let mut sealed = (batch.rows >= self.shared.max_batch(self.settings.max_batch)).then_some(Flush::Full);
        let mut carry = None;
        let mut open = true; // the channel still has senders
        let (slot, flush) = loop {
            while sealed.is_none() {
                match self.rx.try_recv() {
                    Ok(e) => sealed = self.offer(&mut batch, e, &mut carry),
                    Err(_) => break,
                }
            }
            let ready = || sealed.unwrap_or(Flush::IdleBackend);
            if let Ok(slot) = self.shared.slots.clone().try_acquire_owned() {
                break (slot, ready());
            }
            if let Some(flush) = sealed {
                tokio::select! {
                    slot = self.slot() => break (slot, flush),
                    () = shutdown.cancelled() => {
                        self.stopped(batch.entries.into_iter().chain(carry));
                        return (None, None);
                    }
                }
            }
            tokio::select! {
                () = shutdown.cancelled() => {
                    self.stopped(batch.entries.into_iter().chain(carry));
                    return (None, None);
                }
                slot = self.shared.slots.clone().acquire_owned() => {
                    break (slot.expect("the semaphore is never closed"), ready());
                }
                entry = self.rx.recv(), if open => match entry {
                    Some(e) => sealed = self.offer(&mut batch, e, &mut carry),
                    None => open = false,
                },
                _ = tokio::time::sleep_until(opened + self.settings.max_wait) => sealed = Some(Flush::MaxWait),
            }
        };
        self.top_up(&mut batch);
        let entries = self.prune(batch.entries);
        let batch = (!entries.is_empty()).then_some((entries, slot, flush));
        (batch, carry)
    }

    /// Adds `e` to the batch unless it would overflow `max_batch` or, under the learned
    /// cost, make the batch's earliest deadline miss; then `e` is carried to the next
    /// batch. Returns why the batch is sealed, if it now is.
    fn offer(&self, batch: &mut Filling<T, R>, e: Entry<T, R>, carry: &mut Option<Entry<T, R>>) -> Option<Flush> {
        let rows = batch.rows.saturating_add(e.rows);
        let max_batch = self.shared.max_batch(self.settings.max_batch);
        if rows > max_batch {
            *carry = Some(e);
            return Some(Flush::Full);
        }
        let cost = &self.shared.cost;
        if let (Some(now), Some(then)) = (cost.predict(batch.rows), cost.predict(rows)) {
            // Seal only if the batch can still make its earliest deadline without `e`.
            let start = Instant::now();
            if start + now <= batch.earliest && start + then > batch.earliest {
                *carry = Some(e);
                return Some(Flush::Deadline);
            }
        }
        batch.rows = rows;
        batch.earliest = batch.earliest.min(e.deadline);
        batch.entries.push(e);
        (rows >= max_batch).then_some(Flush::Full)
    }

    async fn slot(&self) -> OwnedSemaphorePermit {
        self.shared
            .slots
            .clone()
            .acquire_owned()
            .await
            .expect("the semaphore is never closed")
    }

    /// Answers `entries` (held while the gateway shut down) with [`Kind::Unavailable`].
    fn stopped(&self, entries: impl Iterator<Item = Entry<T, R>>) {
        for entry in entries {
            self.shared.release_entry(&entry);
            answer(entry, Kind::Unavailable, "the gateway is shutting down");
        }
    }

    /// Leaves out callers who went away and answers those whose deadline has passed.
    fn prune(&self, entries: Vec<Entry<T, R>>) -> Vec<Entry<T, R>> {
        let now = Instant::now();
        let mut kept = Vec::with_capacity(entries.len());
        for entry in entries {
            self.shared.release_entry(&entry);
            if entry.reply.is_closed() {
                continue; // the caller went away: nothing to answer, nothing to send
            }
            if entry.deadline <= now {
                answer(
                    entry,
                    Kind::Deadline,
                    "the budget ran out while the request waited for its batch",
                );
                continue;
            }
            kept.push(entry);
        }
        kept
    }
}

fn answer<T, R>(entry: Entry<T, R>, kind: Kind, message: &str) {
    let _ = entry.reply.send(Err(Error::new(kind, message)));
}

#[cfg(test)]
mod proptests;
#[cfg(test)]
mod tests;
