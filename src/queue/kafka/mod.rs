//! The offline queue on Kafka (`offline.queue = "kafka"`, the `kafka` feature), for
//! several gateway replicas behind one load balancer.
//!
//! Two topics ([`crate::config::KafkaQueue`]):
//! - **jobs**, partitioned: a submission is produced there (idempotent producer,
//!   `acks=all`) and acknowledged to the client only once the brokers have it. The
//!   replicas consume it as one consumer group, so each job is run by the replica that
//!   owns its partition, and by another one when that replica dies ([`runner`]).
//! - **states**, compacted and keyed by id: every change of a job's state (queued,
//!   running, retried, its result), every uploaded file and every batch. Every replica
//!   reads all of it into a local view ([`view`]) and answers status, results and the
//!   Batch API from there, so any replica answers for any job.
//!
//! A job's offset is committed only after its terminal state is durable on the brokers.
//! A replica that takes over partitions first catches its view up with the state topic,
//! so a job whose result was written before the crash is not run again; one that was
//! running when its replica died runs again, and if both attempts ever write a result,
//! every view keeps the first (records of one job share a partition, so all replicas
//! see them in the same order). A replay never shows two results.
//!
//! # Layout
//!
//! `records` (what goes on the topics) · `produce` (writing them, read-your-writes) ·
//! `reader` (the jobs topic, heartbeats, taking and giving up partitions) · `runner`
//! (the jobs held, offsets to commit, the partition split) · `view` (the state topic,
//! materialized) · `batch_api` (files and batches); here: start, submission, leases,
//! results, cancellation.

mod batch_api;
pub mod client;
mod produce;
mod reader;
pub mod records;
pub mod runner;
pub mod usage;
pub mod view;

use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::producer::FutureProducer;
use sha2::{Digest, Sha256};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use self::produce::Out;
use self::records::{JobMeta, JobState, Record};
use self::runner::Pending;
use self::view::View;
use super::batches::{Batch, FileInfo, FileQuery, NewBatch};
use super::embedded::Limits;
use super::{Embedded, Finish, Job, JobId, JobStore, NewJob, State, StoreError, Submitted};
use crate::config;

/// How long start waits for the view to read the whole state topic.
const START_PATIENCE: Duration = Duration::from_secs(300);
/// How often a replica writes its heartbeat and looks at who is alive.
const HEARTBEAT: Duration = Duration::from_secs(1);

/// The Kafka queue; cheap to clone.
#[derive(Clone)]
pub struct KafkaQueue {
    inner: Arc<Inner>,
}

struct Inner {
    /// Idempotent, `acks=all`: jobs, states, files, batches, heartbeats.
    producer: FutureProducer,
    /// This replica's partitions of the jobs topic (assigned by the reader).
    jobs: Arc<StreamConsumer>,
    job_partitions: i32,
    /// The jobs read and not finished.
    pending: Arc<Mutex<Pending>>,
    /// The state topic, materialized.
    view: Arc<View>,
    settings: config::KafkaQueue,
    state_partitions: i32,
    max_unfinished: u64,
    /// This replica's name, a number drawn at start, and when it started (ms).
    replica: String,
    instance: u64,
    started: i64,
    /// The offline workers' signal that jobs arrived.
    wake: Arc<Notify>,
    /// Told when finished jobs leave room to read more.
    room: Notify,
}

impl std::fmt::Debug for KafkaQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaQueue")
            .field("jobs", &self.inner.settings.jobs)
            .field("states", &self.inner.settings.states)
            .field("replica", &self.inner.replica)
            .finish()
    }
}

impl KafkaQueue {
    /// Checks the brokers and both topics, rebuilds the view from the state topic under
    /// `data_dir/kafka`, and starts the reader, which takes this replica's share of the
    /// jobs topic within two heartbeats. `wake` is told whenever jobs arrive;
    /// `max_message` is the largest body it must carry.
    pub async fn start(
        kafka: &config::Kafka,
        data_dir: &Path,
        limits: Limits,
        max_message: usize,
        wake: Arc<Notify>,
        shutdown: CancellationToken,
    ) -> Result<KafkaQueue, String> {
        let settings = kafka.queue.clone();
        if settings.max_in_flight == 0 {
            return Err("kafka.queue.max_in_flight must be at least 1".into());
        }
        let checked = kafka.clone();
        let topics = [settings.jobs.clone(), settings.states.clone()];
        let partitions = tokio::task::spawn_blocking(move || client::partitions(&checked, &topics, "kafka.queue"))
            .await
            .map_err(|e| e.to_string())??;
        let max_unfinished = limits.max_unfinished;
        let store = Embedded::open_view(&data_dir.join("kafka"), limits).map_err(|e| {
            format!(
                "kafka queue: cannot open the local view under {}: {e}",
                data_dir.display()
            )
        })?;
        let receive = (max_message + (1 << 20))
            .max(100 << 20)
            .min(i32::MAX as usize)
            .to_string();
        let reader: StreamConsumer = client::client(
            kafka,
            &[
                ("group.id", "tiergate-view"),
                ("enable.auto.commit", "false"),
                // A submission waits for its own state to come back: do not let a fetch
                // linger at brokers that answer only when the wait runs out.
                ("fetch.wait.max.ms", "10"),
                ("receive.message.max.bytes", &receive),
            ],
        )
        .create()
        .map_err(|e| format!("kafka queue: cannot create a client: {e}"))?;
        store
            .call(usage::schema)
            .await
            .map_err(|e| format!("kafka queue: cannot make the local view's usage table: {e}"))?;
        let (topic, count) = (settings.states.clone(), partitions[1]);
        let view = tokio::task::spawn_blocking(move || View::new(store, reader, &topic, count))
            .await
            .map_err(|e| e.to_string())??;
        let view = Arc::new(view);
        tokio::spawn(view.clone().run(shutdown.clone()));
        view.catch_up_within(START_PATIENCE)
            .await
            .map_err(|e| format!("kafka queue: reading {}: {e}", settings.states))?;
        let max = (max_message + (64 << 10)).to_string();
        let producer: FutureProducer = client::client(
            kafka,
            &[
                ("enable.idempotence", "true"),
                ("acks", "all"),
                ("linger.ms", "2"),
                ("message.max.bytes", &max),
            ],
        )
        .create()
        .map_err(|e| format!("kafka queue: cannot create a producer: {e}"))?;
        let pending = Arc::new(Mutex::new(Pending::default()));
        // Partitions are assigned by the replicas themselves (see `rebalance`); offsets
        // are committed under the group, so the usual lag tools see it.
        let jobs: StreamConsumer = client::client(
            kafka,
            &[
                ("group.id", &settings.group),
                ("enable.auto.commit", "false"),
                ("auto.offset.reset", "earliest"),
                ("fetch.wait.max.ms", "50"),
                ("queued.max.messages.kbytes", "16384"),
                ("receive.message.max.bytes", &receive),
            ],
        )
        .create()
        .map_err(|e| format!("kafka queue: cannot create a consumer: {e}"))?;
        let replica = settings.replica_name();
        tracing::info!(jobs = %settings.jobs, states = %settings.states, group = %settings.group, %replica,
            "offline queue on kafka");
        let queue = KafkaQueue {
            inner: Arc::new(Inner {
                producer,
                jobs: Arc::new(jobs),
                job_partitions: partitions[0],
                pending,
                view,
                settings,
                state_partitions: count,
                max_unfinished,
                replica,
                instance: rand::random(),
                started: super::now_ms(),
                wake,
                room: Notify::new(),
            }),
        };
        tokio::spawn(queue.clone().read(shutdown));
        Ok(queue)
    }

    fn pending(&self) -> std::sync::MutexGuard<'_, Pending> {
        self.inner.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Commits what finished, and tells the reader there may be room again.
    fn settle(&self) {
        let inner = &self.inner;
        let (commits, count) = {
            let mut pending = self.pending();
            (pending.commits(), pending.held())
        };
        ::metrics::gauge!(crate::metrics::KAFKA_QUEUE_HELD).set(count as f64);
        if !commits.is_empty() {
            if let Err(e) = inner
                .jobs
                .commit(&runner::offsets(&inner.settings.jobs, &commits), CommitMode::Async)
            {
                tracing::warn!(error = %e, "kafka queue: offsets not committed; those jobs are checked again");
            }
        }
        if count < inner.settings.max_in_flight {
            inner.room.notify_one();
        }
    }

    /// A state record of `meta`, from this replica.
    fn state(&self, meta: JobMeta, state: State, attempts: u32) -> JobState {
        JobState::of(meta, state, attempts, &self.inner.replica)
    }

    fn check_room(&self, adding: usize) -> Result<(), StoreError> {
        let held = self.inner.view.store.unfinished().load(Ordering::Acquire).max(0) as u64;
        match held.saturating_add(adding as u64) > self.inner.max_unfinished {
            true => Err(StoreError::Full(held)),
            false => Ok(()),
        }
    }

    /// The local view (status, results, the Batch API's reads, metrics).
    pub fn view(&self) -> &Embedded {
        &self.inner.view.store
    }

    /// Reads from the view, catching it up with the brokers once when `read` finds
    /// nothing (the id may have been written by another replica a moment ago).
    async fn fresh<T, F, Fut>(&self, read: F) -> Result<Option<T>, StoreError>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<Option<T>, StoreError>>,
    {
        if let Some(found) = read().await? {
            return Ok(Some(found));
        }
        self.inner.view.catch_up().await?;
        read().await
    }
}

/// Submission, leases and results here; the Batch API's files and batches in
/// `batch_api`; reads from the view.
impl JobStore for KafkaQueue {
    /// Accepts `jobs`: each on the jobs topic and queued on the state topic, answered
    /// once the brokers have both.
    async fn submit(&self, jobs: Vec<NewJob>) -> Result<Vec<Submitted>, StoreError> {
        self.check_room(jobs.len())?;
        let now = super::now_ms();
        let mut out = Vec::with_capacity(jobs.len());
        let mut records = Vec::with_capacity(jobs.len() * 2);
        for job in jobs {
            let id = match &job.idempotency_key {
                Some(key) => keyed_id("job", super::idempotency_scope(key)),
                None => super::new_id("job"),
            };
            if let Some(key) = &job.idempotency_key {
                if let Some(earlier) = self.get(&id).await? {
                    let stored = earlier.request.idempotency_key.as_deref();
                    out.push(Submitted::earlier(id, stored, key));
                    continue;
                }
            }
            let meta = JobMeta::new(id.clone(), &job, now, None);
            records.push(Out::state(
                &Record::Job(self.state(meta.clone(), State::Queued, 0)),
                &id,
                Bytes::new(),
            ));
            records.push(Out::job(&meta, job.body));
            out.push(Submitted::new(id));
        }
        self.write(records).await?;
        Ok(out)
    }

    /// Leases up to `max` jobs read here, route by route.
    async fn lease(&self, max: usize) -> Result<Vec<Job>, StoreError> {
        let mut jobs = Vec::new();
        let routes = self.pending().routes(super::now_ms());
        for route in routes {
            if jobs.len() >= max {
                break;
            }
            jobs.extend(self.lease_route(&route, max - jobs.len()).await?);
        }
        Ok(jobs)
    }

    /// Leases up to `max` of `route`'s jobs read here: jobs the view shows ended are let
    /// go, expired ones are recorded so; the rest are recorded running.
    async fn lease_route(&self, route: &str, max: usize) -> Result<Vec<Job>, StoreError> {
        loop {
            let now = super::now_ms();
            let taken = self.pending().take(route, max, now);
            if taken.is_empty() {
                return Ok(Vec::new());
            }
            let known = self
                .inner
                .view
                .jobs(taken.iter().map(|h| h.meta.id.clone()).collect())
                .await?;
            let mut run = Vec::new();
            let mut expired = Vec::new();
            let mut expired_ids = Vec::new();
            for held in taken {
                let (state, attempts) = known
                    .get(&held.meta.id)
                    .map_or((State::Queued, 0), |(_, s, a)| (*s, *a));
                if state.is_terminal() {
                    self.pending().done(&held.meta.id);
                } else if held.meta.expires_at <= now {
                    let mut record = self.state(held.meta.clone(), State::Expired, attempts);
                    record.finished_at = Some(now);
                    record.error = Some("the completion window passed before the job ran".into());
                    expired.push(Out::state(&Record::Job(record), &held.meta.id, Bytes::new()));
                    expired_ids.push(held.meta.id);
                } else {
                    let attempts = attempts.max(held.attempts) + 1;
                    let record = self.state(held.meta.clone(), State::Running, attempts);
                    // Advisory (status shows "running"): not waited for.
                    let _ = self.send(&Out::state(&Record::Job(record), &held.meta.id, Bytes::new()));
                    let mut job = held.meta.job(held.body.clone());
                    job.attempts = attempts;
                    job.state = State::Running;
                    run.push(job);
                }
            }
            if !expired.is_empty() {
                let delivered = self.deliver(expired).await;
                let mut pending = self.pending();
                for id in &expired_ids {
                    match delivered {
                        Ok(_) => pending.done(id),
                        Err(_) => pending.requeue(id, 0, now.saturating_add(1000)),
                    }
                }
            }
            self.settle();
            if !run.is_empty() {
                return Ok(run);
            }
        }
    }

    /// Routes with jobs ready here.
    async fn runnable_routes(&self) -> Result<Vec<String>, StoreError> {
        Ok(self.pending().routes(super::now_ms()))
    }

    /// Records how attempts ended: results and failures on the state topic (then their
    /// offsets may be committed), retries back in line here.
    async fn finish_all(&self, ends: Vec<(JobId, u32, Finish)>) -> Result<Vec<bool>, StoreError> {
        let now = super::now_ms();
        let mut outs = Vec::new();
        let mut flags = Vec::with_capacity(ends.len());
        let mut terminal = Vec::new();
        let mut retries = Vec::new();
        for (id, attempt, finish) in ends {
            let Some(held) = self.pending().leased(&id).cloned() else {
                flags.push(false);
                continue;
            };
            flags.push(true);
            let (record, value) = match finish {
                Finish::Answered(answer) => {
                    let state = match answer.status {
                        200..=299 => State::Succeeded,
                        _ => State::Failed,
                    };
                    let mut record = self.state(held.meta, state, attempt).with_answer(&answer);
                    record.finished_at = Some(now);
                    terminal.push(id.clone());
                    (record, answer.body)
                }
                Finish::Failed { error } => {
                    let mut record = self.state(held.meta, State::Failed, attempt);
                    record.finished_at = Some(now);
                    record.error = Some(error);
                    terminal.push(id.clone());
                    (record, Bytes::new())
                }
                Finish::Wait { reason, not_before } => {
                    // Not run: the lease's attempt is given back.
                    let attempt = attempt.saturating_sub(1);
                    let mut record = self.state(held.meta, State::Queued, attempt);
                    record.not_before = not_before;
                    record.error = Some(reason);
                    retries.push((id.clone(), attempt, not_before));
                    (record, Bytes::new())
                }
                Finish::Retry { error, not_before } => {
                    let mut record = self.state(held.meta, State::Queued, attempt);
                    record.not_before = not_before;
                    record.error = Some(error);
                    retries.push((id.clone(), attempt, not_before));
                    (record, Bytes::new())
                }
            };
            outs.push(Out::state(&Record::Job(record), &id, value));
        }
        let delivered = self.deliver(outs).await;
        {
            let mut pending = self.pending();
            match &delivered {
                Ok(_) => terminal.iter().for_each(|id| pending.done(id)),
                // Not durable: run them again in a second (the first result to land wins).
                Err(_) => terminal
                    .iter()
                    .for_each(|id| pending.requeue(id, 0, now.saturating_add(1000))),
            }
            for (id, attempt, not_before) in retries {
                pending.requeue(&id, attempt, not_before);
            }
        }
        self.settle();
        delivered.map(|_| flags)
    }

    /// The job `id`, from the view.
    async fn get(&self, id: &str) -> Result<Option<Job>, StoreError> {
        self.fresh(|| self.inner.view.store.get(id)).await
    }

    /// Cancels job `id` unless it ended: a cancelled state on the state topic, which
    /// wins unless a result landed first. Returns the state that won.
    async fn cancel(&self, id: &str) -> Result<Option<State>, StoreError> {
        let Some(job) = self.get(id).await? else {
            return Ok(None);
        };
        if job.state.is_terminal() {
            return Ok(Some(job.state));
        }
        let known = self.inner.view.jobs(vec![id.to_owned()]).await?;
        let Some((meta, _, attempts)) = known.get(id).cloned() else {
            return Ok(Some(job.state));
        };
        let mut record = self.state(meta, State::Cancelled, attempts);
        record.finished_at = Some(super::now_ms());
        self.write(vec![Out::state(&Record::Job(record), id, Bytes::new())])
            .await?;
        Ok(self.get(id).await?.map(|j| j.state))
    }

    async fn add_file(
        &self,
        tenant: &str,
        purpose: String,
        filename: String,
        content: Bytes,
    ) -> Result<FileInfo, StoreError> {
        batch_api::add_file(self, tenant, purpose, filename, content).await
    }

    async fn file(&self, id: &str, tenant: &str) -> Result<Option<FileInfo>, StoreError> {
        self.fresh(|| self.inner.view.store.file(id, tenant)).await
    }

    async fn content(&self, id: &str, tenant: &str) -> Result<Option<Vec<u8>>, StoreError> {
        self.fresh(|| self.inner.view.store.content(id, tenant)).await
    }

    async fn content_range(
        &self,
        id: &str,
        tenant: &str,
        offset: u64,
        len: u64,
    ) -> Result<Option<Vec<u8>>, StoreError> {
        self.fresh(|| self.inner.view.store.content_range(id, tenant, offset, len))
            .await
    }

    async fn files(&self, tenant: &str, query: FileQuery) -> Result<(Vec<FileInfo>, bool), StoreError> {
        self.view().files(tenant, query).await
    }

    async fn delete_file(&self, id: &str, tenant: &str) -> Result<bool, StoreError> {
        batch_api::delete_file(self, id, tenant).await
    }

    async fn create_batch(&self, batch: NewBatch) -> Result<Submitted, StoreError> {
        batch_api::create_batch(self, batch).await
    }

    async fn batch(&self, id: &str, tenant: &str) -> Result<Option<Batch>, StoreError> {
        self.fresh(|| self.inner.view.store.batch(id, tenant)).await
    }

    async fn batches(
        &self,
        tenant: &str,
        after: Option<String>,
        limit: usize,
    ) -> Result<(Vec<Batch>, bool), StoreError> {
        self.view().batches(tenant, after, limit).await
    }

    async fn all_batches(&self, after: Option<String>, limit: usize) -> Result<(Vec<Batch>, bool), StoreError> {
        self.view().all_batches(after, limit).await
    }

    async fn batch_owner(&self, id: &str) -> Result<Option<String>, StoreError> {
        self.fresh(|| self.view().batch_owner(id)).await
    }

    async fn cancel_batch(&self, id: &str, tenant: &str) -> Result<Option<Batch>, StoreError> {
        batch_api::cancel_batch(self, id, tenant).await
    }

    async fn counts(&self) -> Result<Vec<(State, u64)>, StoreError> {
        self.view().counts().await
    }

    async fn oldest_queued(&self) -> Result<Option<i64>, StoreError> {
        self.view().oldest_queued().await
    }

    /// The view's sweep, without expiry: a job's expiry is recorded on the state topic
    /// when its turn comes.
    async fn sweep(&self, retention_ms: i64) -> Result<(u64, u64), StoreError> {
        self.view().sweep_with(retention_ms, false).await
    }

    async fn finalize(&self) -> Result<usize, StoreError> {
        self.view().finalize().await
    }

    fn failing(&self) -> Option<String> {
        self.view().failing()
    }
}

/// The id a client's idempotency key names: the same on every replica, and not
/// guessable without the key.
fn keyed_id(prefix: &str, key: &str) -> String {
    let digest = Sha256::digest(format!("tiergate {prefix}\0{key}").as_bytes());
    let hex: String = digest.iter().take(18).map(|b| format!("{b:02x}")).collect();
    format!("{prefix}_{hex}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_names_the_same_job_everywhere_and_no_other() {
        assert_eq!(keyed_id("job", "k1"), keyed_id("job", "k1"));
        assert_ne!(keyed_id("job", "k1"), keyed_id("job", "k2"));
        assert_ne!(keyed_id("job", "k1")[4..], keyed_id("batch", "k1")[6..]);
        assert_eq!(keyed_id("job", "k1").len(), 4 + 36, "as long as a generated id");
    }
}
