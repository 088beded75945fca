//! The batcher: the micro-batch tier's queue and its flush policy.
//!
//! Between the tier's door-facing service and the batch pool. Callers [`Queue::submit`]
//! a payload with its row count and deadline; one [`Worker`] per queue forms batches and
//! hands each to the `send` function with the callers' reply channels, which answers
//! every caller. The policy is work-conserving: a batch goes out as soon as a backend
//! slot is free, or when it is full (`max_batch` rows); while every slot is busy it keeps
//! filling. `max_wait` is a ceiling on waiting for a slot to fill a batch, never a floor,
//! so a lone request at low load is sent at once. The queue is bounded in rows (a full
//! queue refuses at once); a caller whose deadline passed or who went away is answered
//! or dropped before its batch is sent, never sent to the backend.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::error::{Error, Kind};

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

/// One caller's place in a batch: its payload, rows, deadline and reply channel.
#[derive(Debug)]
pub struct Entry<T, R> {
    /// What the caller sent.
    pub payload: T,
    /// Its rows (dimension 0).
    pub rows: u64,
    /// When its budget runs out.
    pub deadline: Instant,
    /// Where its answer goes; answered exactly once.
    pub reply: oneshot::Sender<Result<R, Error>>,
}

/// The submitting side of a queue; cheap to clone.
#[derive(Debug)]
pub struct Queue<T, R> {
    tx: mpsc::UnboundedSender<Entry<T, R>>,
    queued: Arc<AtomicU64>,
    capacity: u64,
}

/// The batching side of a queue: run it with [`Worker::run`].
#[derive(Debug)]
pub struct Worker<T, R> {
    rx: mpsc::UnboundedReceiver<Entry<T, R>>,
    queued: Arc<AtomicU64>,
    settings: Settings,
    slots: Arc<Semaphore>,
}

/// A batch: the callers, in arrival order.
pub type Batch<T, R> = Vec<Entry<T, R>>;

/// A queue and its worker.
pub fn pair<T, R>(settings: Settings) -> (Queue<T, R>, Worker<T, R>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let queued = Arc::new(AtomicU64::new(0));
    let queue = Queue {
        tx,
        queued: queued.clone(),
        capacity: settings.capacity,
    };
    let worker = Worker {
        rx,
        queued,
        settings,
        slots: Arc::new(Semaphore::new(settings.slots.max(1))),
    };
    (queue, worker)
}

impl<T, R> Clone for Queue<T, R> {
    fn clone(&self) -> Self {
        Queue {
            tx: self.tx.clone(),
            queued: self.queued.clone(),
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
        let after = self.queued.fetch_add(rows, Ordering::AcqRel) + rows;
        if after > self.capacity {
            self.queued.fetch_sub(rows, Ordering::AcqRel);
            return Err(Error::new(
                Kind::QueueFull,
                format!(
                    "the micro-batch queue is full ({} rows waiting, capacity {})",
                    after - rows,
                    self.capacity
                ),
            ));
        }
        let (reply, answer) = oneshot::channel();
        if self
            .tx
            .send(Entry {
                payload,
                rows,
                deadline,
                reply,
            })
            .is_err()
        {
            self.queued.fetch_sub(rows, Ordering::AcqRel);
            return Err(Error::new(Kind::Unavailable, "the micro-batch worker has stopped"));
        }
        Ok(answer)
    }

    /// Rows waiting now.
    pub fn queued_rows(&self) -> u64 {
        self.queued.load(Ordering::Acquire)
    }
}

impl<T: Send + 'static, R: Send + 'static> Worker<T, R> {
    /// Forms batches until `shutdown` fires (then answers what is still queued with
    /// [`Kind::Unavailable`]) and hands each to `send`, which must answer every entry.
    /// The batch holds its backend slot until `send` completes.
    pub async fn run<F, Fut>(mut self, send: F, shutdown: CancellationToken)
    where
        F: Fn(Batch<T, R>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let send = Arc::new(send);
        let mut carry: Option<Entry<T, R>> = None;
        loop {
            let first = match carry.take() {
                Some(entry) => entry,
                // Shutdown first: once it fires, nothing new is batched.
                None => tokio::select! {
                    biased;
                    _ = shutdown.cancelled() => break,
                    entry = self.rx.recv() => match entry { Some(e) => e, None => return },
                },
            };
            let (batch, next) = self.fill(first).await;
            carry = next;
            if let Some((batch, slot)) = batch {
                let send = send.clone();
                tokio::spawn(async move {
                    send(batch).await;
                    drop(slot); // the backend slot frees only once the batch is answered
                });
            }
        }
        self.rx.close();
        while let Ok(entry) = self.rx.try_recv() {
            self.answer(entry, Kind::Unavailable, "the gateway is shutting down");
        }
    }

    /// Grows a batch from `first` until a slot frees (or it is full, then it waits for
    /// one); returns the batch (none when every caller dropped out) and an entry that did
    /// not fit, which starts the next batch.
    async fn fill(&mut self, first: Entry<T, R>) -> (Option<(Batch<T, R>, OwnedSemaphorePermit)>, Option<Entry<T, R>>) {
        let opened = Instant::now();
        let mut entries = vec![first];
        let mut rows = entries[0].rows;
        let mut carry = None;
        let slot = loop {
            while carry.is_none() && rows < self.settings.max_batch {
                match self.rx.try_recv() {
                    Ok(e) if rows + e.rows <= self.settings.max_batch => {
                        rows += e.rows;
                        entries.push(e);
                    }
                    Ok(e) => carry = Some(e),
                    Err(_) => break,
                }
            }
            let full = carry.is_some() || rows >= self.settings.max_batch;
            if let Ok(slot) = self.slots.clone().try_acquire_owned() {
                break slot;
            }
            if full {
                break self
                    .slots
                    .clone()
                    .acquire_owned()
                    .await
                    .expect("the semaphore is never closed");
            }
            tokio::select! {
                slot = self.slots.clone().acquire_owned() => break slot.expect("the semaphore is never closed"),
                entry = self.rx.recv(), if carry.is_none() => match entry {
                    Some(e) if rows + e.rows <= self.settings.max_batch => { rows += e.rows; entries.push(e); }
                    Some(e) => carry = Some(e),
                    None => {}
                },
                _ = tokio::time::sleep_until(opened + self.settings.max_wait) => {
                    break self.slots.clone().acquire_owned().await.expect("the semaphore is never closed");
                }
            }
        };
        let entries = self.prune(entries);
        let batch = (!entries.is_empty()).then_some((entries, slot));
        (batch, carry)
    }

    /// Leaves out callers who went away and answers those whose deadline has passed.
    fn prune(&self, entries: Vec<Entry<T, R>>) -> Vec<Entry<T, R>> {
        let now = Instant::now();
        let mut kept = Vec::with_capacity(entries.len());
        for entry in entries {
            self.queued.fetch_sub(entry.rows, Ordering::AcqRel);
            if entry.reply.is_closed() {
                continue; // the caller went away: nothing to answer, nothing to send
            }
            if entry.deadline <= now {
                self.answer(
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

    fn answer(&self, entry: Entry<T, R>, kind: Kind, message: &str) {
        let _ = entry.reply.send(Err(Error::new(kind, message)));
    }
}

#[cfg(test)]
mod tests;
