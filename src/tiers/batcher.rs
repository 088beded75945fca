//! The batcher: the micro-batch tier's queue and its flush policy.
//!
//! Between the tier's door-facing service and the batch pool. Callers [`Queue::submit`]
//! a payload to a *lane* (the requests that can share a backend call) with its row
//! count, deadline and [`Class`] (band and tenant); one [`Worker`] per pool forms
//! batches and hands each, with its lane, to the `send` function, which answers every
//! caller. The policy is work-conserving: whenever a backend slot is free and anyone
//! waits, a batch goes out at once, formed then from what waits. Which lane and which
//! callers is `order`'s: the highest band first, then the tenant with the least
//! weighted service, then earliest deadline first across the lanes. A batch takes its
//! lane's callers in that order up to the batch size (passing over one too large for the
//! room left, so lower bands fill what higher ones leave), unless one more would make
//! the batch's earliest deadline miss under the pool's learned cost (see
//! [`super::cost`]); so a lone request at low load is sent at once, and nothing waits
//! for a batch to fill. The queues in front of one
//! pool share its slots, its cost and one capacity in rows ([`Shared`]; a full queue
//! refuses at once, after evicting sheddable callers for a higher band); a caller whose
//! deadline passed, whom the learned cost says cannot be answered in time, or who went
//! away is answered or dropped before its batch is sent, never sent to the backend.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{oneshot, Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::cost::Cost;
use crate::error::{Error, Kind};
use crate::policy::Priority;
pub use order::{Class, Entry, Flush};
use order::{Rule, Waiting};

mod order;
pub mod window;

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
    /// Most bytes of request body in one batch (a request larger goes alone).
    pub max_bytes: u64,
    /// Batches in flight at once (backend slots).
    pub slots: usize,
    /// Rows that may wait in the queue; beyond, submissions are refused.
    pub capacity: u64,
    /// Rows waiting beyond which sheddable callers are refused.
    pub shed_at: u64,
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
    /// Most bytes of request body a batch carries now (set, or learned from a 413).
    pub max_bytes: Arc<MaxBytes>,
    /// The pool's time as its calls share it, for the usage ledger.
    pub shares: Arc<crate::usage::Shares>,
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

/// A batch pool's largest batch in bytes of request body: the route's
/// `max_batch_bytes`, lowered to half of a batch its backend refused as too large (413).
#[derive(Debug)]
pub struct MaxBytes(AtomicU64);

impl MaxBytes {
    /// At most `max` bytes.
    pub fn new(max: u64) -> Self {
        MaxBytes(AtomicU64::new(max.max(1)))
    }

    /// Most bytes a batch may carry now.
    pub fn now(&self) -> u64 {
        self.0.load(Ordering::Acquire)
    }

    /// A batch of `bytes` bytes was refused as too large: batches carry at most half of
    /// it from now on (never less than 1 byte: a request alone still goes); the new limit.
    pub fn refused(&self, bytes: u64) -> u64 {
        let half = (bytes / 2).max(1);
        self.0.fetch_min(half, Ordering::AcqRel).min(half)
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
            max_bytes: Arc::new(MaxBytes::new(settings.max_bytes)),
            shares: Arc::default(),
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
}

/// The waiting line of one batch pool's lanes, shared by its [`Queue`]s and its [`Worker`].
struct Line<L, T, R> {
    waiting: Mutex<Waiting<L, T, R>>,
    /// Rung on every submission and every dropped [`Queue`].
    wake: Notify,
    /// Set once the worker has stopped: nothing submitted afterwards would be served.
    stopped: AtomicBool,
}

impl<L, T, R> Line<L, T, R> {
    fn lock(&self) -> std::sync::MutexGuard<'_, Waiting<L, T, R>> {
        self.waiting.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl<L, T, R> std::fmt::Debug for Line<L, T, R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Line").field("rows", &self.lock().rows()).finish()
    }
}

/// The submitting side of a pool's queue; cheap to clone.
#[derive(Debug)]
pub struct Queue<L, T, R> {
    line: Arc<Line<L, T, R>>,
    shared: Shared,
    settings: Settings,
}

/// The batching side of a pool's queue: run it with [`Worker::run`].
#[derive(Debug)]
pub struct Worker<L, T, R> {
    line: Arc<Line<L, T, R>>,
    settings: Settings,
    shared: Shared,
}

/// A batch: the callers, in the order they were chosen.
pub type Batch<T, R> = Vec<Entry<T, R>>;

/// A queue and its worker, with slots, counter and cost of their own.
pub fn pair<L, T, R>(settings: Settings) -> (Queue<L, T, R>, Worker<L, T, R>) {
    let shared = Shared::new(&settings);
    pair_sharing(settings, shared)
}

/// A queue and its worker over `shared` slots, queued rows and cost (one batch pool).
pub fn pair_sharing<L, T, R>(settings: Settings, shared: Shared) -> (Queue<L, T, R>, Worker<L, T, R>) {
    let line = Arc::new(Line {
        waiting: Mutex::new(Waiting::default()),
        wake: Notify::new(),
        stopped: AtomicBool::new(false),
    });
    let queue = Queue {
        line: line.clone(),
        shared: shared.clone(),
        settings,
    };
    (queue, Worker { line, settings, shared })
}

impl<L, T, R> Clone for Queue<L, T, R> {
    fn clone(&self) -> Self {
        Queue {
            line: self.line.clone(),
            shared: self.shared.clone(),
            settings: self.settings,
        }
    }
}

impl<L, T, R> Drop for Queue<L, T, R> {
    fn drop(&mut self) {
        self.line.wake.notify_one(); // the worker ends once the last queue is gone
    }
}

impl<L, T, R> Queue<L, T, R> {
    /// Queues `payload` (`rows` rows, answered by `deadline`) in `lane`, charged as
    /// `class`, and returns where its answer will come. Refuses at once with
    /// [`Kind::QueueFull`] when the rows would not fit, or when the caller is sheddable
    /// and more than `shed_at` rows wait. A caller that would not fit first makes room:
    /// a higher band's evicts sheddable callers, then any evicts from the tenant of its
    /// band holding the most beyond its share (longest queue drop); the evicted are
    /// answered [`Kind::QueueFull`].
    pub fn submit(
        &self,
        lane: &Arc<L>,
        payload: T,
        (rows, deadline): (u64, Instant),
        class: Class,
    ) -> Result<oneshot::Receiver<Result<R, Error>>, Error> {
        self.submit_sized(lane, payload, (rows, 0, deadline), class)
    }

    /// [`Queue::submit`] of a payload that adds `bytes` to its batch's request body,
    /// counted against the pool's [`MaxBytes`].
    pub fn submit_sized(
        &self,
        lane: &Arc<L>,
        payload: T,
        (rows, bytes, deadline): (u64, u64, Instant),
        class: Class,
    ) -> Result<oneshot::Receiver<Result<R, Error>>, Error> {
        if self.is_closed() {
            return Err(Error::new(Kind::Unavailable, "the micro-batch worker has stopped"));
        }
        let mut waiting = self.line.lock();
        let queued = &self.shared.queued;
        let after = queued.fetch_add(rows, Ordering::AcqRel).saturating_add(rows);
        if class.priority == Priority::Sheddable && after > self.settings.shed_at {
            queued.fetch_sub(rows, Ordering::AcqRel);
            return Err(Error::new(
                Kind::QueueFull,
                format!(
                    "shed_above {} reached ({} rows waiting): the micro-batch queue refuses sheddable requests past \
                     it; retry later or send a higher x-tiergate-priority",
                    self.settings.shed_at,
                    after.saturating_sub(rows),
                ),
            )
            .knob("shed_above"));
        }
        let mut over = after.saturating_sub(self.settings.capacity);
        if over > 0 && class.priority > Priority::Sheddable {
            let (shed, freed) = waiting.shed(over);
            self.refuse_evicted(shed, freed, "this sheddable request made room for a higher band");
            over = over.saturating_sub(freed);
        }
        if over > 0 {
            let (evicted, freed) = waiting.push_out(&class, rows, over);
            self.refuse_evicted(evicted, freed, "its tenant held more than its share of it");
            over = over.saturating_sub(freed);
        }
        if over > 0 {
            queued.fetch_sub(rows, Ordering::AcqRel);
            return Err(Error::new(
                Kind::QueueFull,
                format!(
                    "queue_capacity {} reached ({} rows waiting, this request's {rows} would not fit); retry later",
                    self.settings.capacity,
                    after.saturating_sub(rows),
                ),
            )
            .knob("queue_capacity"));
        }
        self.shared.depth.increment(rows as f64);
        self.shared
            .last_caller
            .store(self.shared.since_epoch().max(1), Ordering::Release);
        let (mut entry, answer) = Entry::new(payload, rows, deadline, (false, class.priority));
        entry.bytes = bytes;
        waiting.push(lane, class, entry);
        drop(waiting);
        self.line.wake.notify_one();
        Ok(answer)
    }

    /// Answers callers evicted from a full queue with [`Kind::QueueFull`] saying `why`.
    fn refuse_evicted(&self, evicted: Vec<Entry<T, R>>, rows: u64, why: &str) {
        self.shared.release(rows);
        let message = format!(
            "queue_capacity {} reached and {why}; retry later",
            self.settings.capacity
        );
        for entry in evicted {
            entry.refuse(Error::new(Kind::QueueFull, &message).knob("queue_capacity"));
        }
    }

    /// Queues offline work in `lane` as filler: it rides in callers' batches only while
    /// that keeps the batch's learned cost within [`FILL_SLACK`] of what the callers
    /// alone cost (and within the batch size), and has batches of its own only when a
    /// slot is free and no caller waits. It is not counted against the capacity. The
    /// submitter bounds how much filler it queues.
    pub fn submit_filler(
        &self,
        lane: &Arc<L>,
        payload: T,
        (rows, bytes): (u64, u64),
        deadline: Instant,
    ) -> Result<oneshot::Receiver<Result<R, Error>>, Error> {
        if self.is_closed() {
            return Err(Error::new(Kind::Unavailable, "the micro-batch worker has stopped"));
        }
        let (mut entry, answer) = Entry::new(payload, rows, deadline, (true, Priority::Sheddable));
        entry.bytes = bytes;
        self.line.lock().push(lane, Class::default(), entry);
        self.line.wake.notify_one();
        Ok(answer)
    }

    /// Rows that would be served before a new caller of `class` with `rows` rows due by
    /// `deadline` (its own included), in the pool's order.
    pub fn ahead(&self, class: &Class, rows: u64, deadline: Instant) -> u64 {
        self.line.lock().ahead(class, rows, deadline)
    }

    /// Callers' rows waiting now by band and tenant flow: `(band, flow, weight, rows)`,
    /// highest band first (read under the queue's lock, for the admin API).
    pub fn by_flow(&self) -> Vec<(Priority, u64, f64, u64)> {
        self.line.lock().by_flow()
    }

    /// Rows waiting now, across every queue sharing this one's pool.
    pub fn queued_rows(&self) -> u64 {
        self.shared.queued.load(Ordering::Acquire)
    }

    /// Whether the worker has stopped (shutdown), so nothing submitted would be served.
    pub fn is_closed(&self) -> bool {
        self.line.stopped.load(Ordering::Acquire)
    }
}

impl<L: Send + Sync + 'static, T: Send + 'static, R: Send + 'static> Worker<L, T, R> {
    /// Forms batches until `shutdown` fires (then answers what is still queued with
    /// [`Kind::Unavailable`]) or every [`Queue`] is dropped (then it drains the queue
    /// first), and hands each batch to `send` with its lane and why it went, which must
    /// answer every entry. The batch holds its backend slot until `send` completes.
    pub async fn run<F, Fut>(self, send: F, shutdown: CancellationToken)
    where
        F: Fn(Arc<L>, Batch<T, R>, Flush) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let send = Arc::new(send);
        loop {
            if shutdown.is_cancelled() {
                break; // once shutdown fires, nothing new is batched
            }
            let (callers, filler, gone) = {
                let waiting = self.line.lock();
                let gone = waiting.is_empty() && Arc::strong_count(&self.line) == 1;
                (waiting.rows() > 0, waiting.has_filler(), gone)
            };
            if gone {
                self.line.stopped.store(true, Ordering::Release);
                return;
            }
            if callers {
                let slot = match self.shared.slots.clone().try_acquire_owned() {
                    Ok(slot) => slot,
                    Err(_) => tokio::select! {
                        biased;
                        _ = shutdown.cancelled() => break,
                        slot = self.slot() => slot,
                    },
                };
                if let Some(formed) = self.form() {
                    spawn_send(&send, formed, slot);
                }
                continue;
            }
            if filler && self.shared.callers_quiet() && !self.queued_elsewhere() {
                // Filler alone has a batch only while the pool is idle.
                if let Ok(slot) = self.shared.slots.clone().try_acquire_owned() {
                    let limit = self.shared.max_batch(self.settings.max_batch);
                    let max_bytes = self.shared.max_bytes.now();
                    let formed = {
                        let mut waiting = self.line.lock();
                        waiting
                            .filler_lane()
                            .and_then(|lane| waiting.form_filler(lane, (limit, max_bytes)))
                    };
                    if let Some(formed) = formed {
                        spawn_send(&send, (formed.lane, formed.entries, Flush::IdleBackend), slot);
                    }
                    continue;
                }
            }
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => break,
                _ = self.line.wake.notified() => {}
                // Filler waits for a caller to ride with, or for the pool to be idle.
                _ = tokio::time::sleep(Duration::from_millis(1)), if filler => {}
            }
        }
        self.line.stopped.store(true, Ordering::Release);
        let (all, rows) = self.line.lock().drain();
        self.shared.release(rows);
        for entry in all {
            entry.refuse(Error::new(Kind::Unavailable, "the gateway is shutting down"));
        }
    }

    /// The next batch, for a slot that is free now: from the lane of the caller served
    /// next, topped up with that lane's filler within [`FILL_SLACK`] of the callers' cost.
    fn form(&self) -> Option<(Arc<L>, Batch<T, R>, Flush)> {
        let rule = Rule {
            now: Instant::now(),
            limit: self.shared.max_batch(self.settings.max_batch),
            max_bytes: self.shared.max_bytes.now(),
            cost: self.shared.cost.estimate(),
        };
        let mut waiting = self.line.lock();
        loop {
            let lane = waiting.next_lane(&rule)?;
            let (formed, released) = waiting.form(lane, &rule);
            self.shared.release(released);
            let Some(mut formed) = formed else {
                continue; // everyone in that lane was answered or gone: the next lane
            };
            if let Some(cost) = rule.cost {
                let callers: u64 = formed.entries.iter().map(|e| e.rows).sum();
                let ceiling = cost.predict(callers).mul_f64(1.0 + FILL_SLACK);
                waiting.top_up(lane, &mut formed.entries, |rows, bytes| {
                    rows <= rule.limit && bytes <= rule.max_bytes && cost.predict(rows) <= ceiling
                });
            }
            return Some((formed.lane, formed.entries, formed.sealed.unwrap_or(Flush::IdleBackend)));
        }
    }

    /// Whether callers wait in another queue of the same pool.
    fn queued_elsewhere(&self) -> bool {
        self.shared.queued.load(Ordering::Acquire) > 0
    }

    async fn slot(&self) -> OwnedSemaphorePermit {
        self.shared
            .slots
            .clone()
            .acquire_owned()
            .await
            .expect("the semaphore is never closed")
    }
}

/// Sends `batch` to its lane on its own task, holding `slot` until it is answered.
fn spawn_send<L, T, R, F, Fut>(
    send: &Arc<F>,
    (lane, batch, flush): (Arc<L>, Batch<T, R>, Flush),
    slot: OwnedSemaphorePermit,
) where
    L: Send + Sync + 'static,
    T: Send + 'static,
    R: Send + 'static,
    F: Fn(Arc<L>, Batch<T, R>, Flush) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let send = send.clone();
    tokio::spawn(async move {
        send(lane, batch, flush).await;
        drop(slot); // the backend slot frees only once the batch is answered
    });
}

#[cfg(test)]
mod fairness;
#[cfg(test)]
mod proptests;
#[cfg(test)]
mod tests;
