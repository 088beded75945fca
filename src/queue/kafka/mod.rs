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

pub mod records;
pub mod runner;
pub mod view;

use std::collections::{HashMap, VecDeque};
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::OwnedHeaders;
use rdkafka::producer::future_producer::OwnedDeliveryResult;
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord, Producer};
use rdkafka::Message;
use serde_json::Value;
use sha2::{Digest, Sha256};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use self::records::{FileChunk, JobMeta, JobState, Member, Record};
use self::runner::{Held, Pending};
use self::view::View;
use super::batches::{BatchRow, FileInfo, NewBatch};
use super::embedded::Limits;
use super::{Embedded, Finish, Job, JobId, NewJob, State, StoreError, Submitted};
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
    producer: FutureProducer,
    jobs: Arc<StreamConsumer>,
    job_partitions: i32,
    pending: Arc<Mutex<Pending>>,
    view: Arc<View>,
    settings: config::KafkaQueue,
    state_partitions: i32,
    max_unfinished: u64,
    replica: String,
    instance: u64,
    started: i64,
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

/// The partitions this replica reads, and the ones it will take at the next look.
#[derive(Debug, Default)]
struct Ownership {
    now: Vec<i32>,
    pending: Option<Vec<i32>>,
    /// Whether another process was seen using this replica's name.
    namesake: bool,
}

/// Where an outgoing record goes.
enum Topic {
    Jobs,
    States,
}

/// A record to produce.
struct Out {
    topic: Topic,
    key: String,
    partition: Option<i32>,
    headers: OwnedHeaders,
    value: Bytes,
}

impl Out {
    fn state(record: &Record, key: &str, value: Bytes) -> Out {
        Out {
            topic: Topic::States,
            key: key.to_owned(),
            partition: None,
            headers: records::headers(record),
            value,
        }
    }

    fn job(meta: &JobMeta, body: Bytes) -> Out {
        Out {
            topic: Topic::Jobs,
            key: meta.id.clone(),
            partition: None,
            headers: records::headers(meta),
            value: body,
        }
    }
}

impl KafkaQueue {
    /// Checks the brokers and both topics, rebuilds the view from the state topic under
    /// `data_dir/kafka`, joins the consumer group, and starts reading jobs. `wake` is
    /// told whenever jobs arrive; `max_message` is the largest body it must carry.
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
        let partitions =
            tokio::task::spawn_blocking(move || crate::kafka::partitions(&checked, &topics, "kafka.queue"))
                .await
                .map_err(|e| e.to_string())??;
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
        let reader: StreamConsumer = crate::kafka::client(
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
        let producer: FutureProducer = crate::kafka::client(
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
        let jobs: StreamConsumer = crate::kafka::client(
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
        let replica = settings.replica.clone().unwrap_or_else(replica_name);
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
                max_unfinished: limits.max_unfinished,
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

    /// Reads jobs from this replica's partitions until `shutdown`, and stops reading
    /// while `max_in_flight` jobs are held (librdkafka's read-ahead is bounded by
    /// `queued.max.messages.kbytes`); every second, writes a heartbeat and takes or gives
    /// up partitions as replicas come and go.
    async fn read(self, shutdown: CancellationToken) {
        let inner = &self.inner;
        let held = ::metrics::gauge!(crate::metrics::KAFKA_QUEUE_HELD);
        let mut owned = Ownership::default();
        let mut tick = tokio::time::interval(HEARTBEAT);
        let mut room = true;
        loop {
            let message = tokio::select! {
                m = inner.jobs.recv(), if room => m,
                _ = inner.room.notified(), if !room => {
                    room = self.pending().held() < inner.settings.max_in_flight;
                    continue;
                }
                _ = tick.tick() => {
                    self.beat(false);
                    self.rebalance(&mut owned).await;
                    room = self.pending().held() < inner.settings.max_in_flight;
                    continue;
                }
                _ = shutdown.cancelled() => {
                    self.beat(true);
                    let producer = inner.producer.clone();
                    let _ = tokio::task::spawn_blocking(move || producer.flush(Duration::from_secs(2))).await;
                    return;
                }
            };
            let message = match message {
                Ok(m) => m.detach(),
                Err(e) => {
                    tracing::warn!(error = %e, "kafka queue: cannot read jobs");
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_secs(1)) => continue,
                        _ = shutdown.cancelled() => return,
                    }
                }
            };
            let (partition, offset) = (message.partition(), message.offset());
            let body = Bytes::copy_from_slice(message.payload().unwrap_or_default());
            let count = {
                let mut pending = self.pending();
                match records::read::<JobMeta, _>(message.headers()) {
                    Some(meta) => pending.add(Held {
                        meta,
                        body,
                        attempts: 0,
                        not_before: 0,
                        partition,
                        offset,
                    }),
                    None => {
                        tracing::warn!(partition, offset, "kafka queue: a message that is not a job is skipped");
                        pending.read(partition, offset);
                        pending.release(partition, offset);
                    }
                }
                pending.held()
            };
            held.set(count as f64);
            inner.wake.notify_one();
            room = count < inner.settings.max_in_flight;
        }
    }

    /// Writes this replica's heartbeat (not waited for).
    fn beat(&self, leaving: bool) {
        let replica = self.inner.replica.clone();
        let key = format!("member:{replica}");
        let member = Member {
            replica,
            instance: self.inner.instance,
            leaving,
        };
        let _ = self.send(&Out::state(&Record::Member(member), &key, Bytes::new()));
    }

    /// Gives up the partitions that now belong to another replica (their finished
    /// prefix committed first), and takes the ones that belong here once that has held
    /// for two looks in a row (so the replica giving them up has let go), after catching
    /// the view up: a job whose result was written before is then seen as done.
    async fn rebalance(&self, owned: &mut Ownership) {
        let inner = &self.inner;
        let timeout = i64::try_from(inner.settings.member_timeout.as_millis()).unwrap_or(i64::MAX);
        let now = super::now_ms();
        let namesake = inner.view.namesake(&inner.replica, inner.instance, inner.started);
        if namesake && !owned.namesake {
            tracing::error!(replica = %inner.replica,
                "kafka queue: another running replica has this replica's name; give each a distinct kafka.queue.replica \
                 (until then both read the same partitions and may run jobs twice)");
        }
        owned.namesake = namesake;
        let live = inner.view.live(now, timeout);
        let want = runner::owned(&live, &inner.replica, inner.job_partitions);
        let topic = &inner.settings.jobs;
        let lost: Vec<i32> = owned.now.iter().copied().filter(|p| !want.contains(p)).collect();
        if !lost.is_empty() {
            let commits = self.pending().revoke(&lost);
            if !commits.is_empty() {
                if let Err(e) = inner.jobs.commit(&runner::offsets(topic, &commits), CommitMode::Sync) {
                    tracing::warn!(error = %e, "kafka queue: offsets not committed on hand-over; those jobs are checked again");
                }
            }
            let _ = inner.jobs.incremental_unassign(&runner::offsets(
                topic,
                &lost.iter().map(|p| (*p, 0)).collect::<Vec<_>>(),
            ));
            owned.now.retain(|p| want.contains(p));
            tracing::info!(partitions = ?lost, "kafka queue: partitions of the jobs topic moved away");
            tracing::info!(partitions = ?owned.now, "kafka queue: partitions of the jobs topic assigned");
        }
        let gained: Vec<i32> = want.iter().copied().filter(|p| !owned.now.contains(p)).collect();
        if gained.is_empty() || owned.pending.as_ref() != Some(&gained) {
            owned.pending = (!gained.is_empty()).then_some(gained);
            return;
        }
        owned.pending = None;
        if let Err(e) = inner.view.catch_up().await {
            tracing::warn!(error = %e, "kafka queue: the view did not catch up; jobs may run twice");
        }
        let mut list = rdkafka::TopicPartitionList::new();
        for p in &gained {
            let _ = list.add_partition_offset(topic, *p, rdkafka::Offset::Stored);
        }
        if let Err(e) = inner.jobs.incremental_assign(&list) {
            tracing::warn!(error = %e, "kafka queue: cannot read partitions of the jobs topic");
            return;
        }
        owned.now.extend(gained);
        owned.now.sort_unstable();
        tracing::info!(partitions = ?owned.now, "kafka queue: partitions of the jobs topic assigned");
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

    /// Produces `outs` and waits until the brokers have all of them; their (partition,
    /// offset) in order.
    async fn deliver(&self, outs: Vec<Out>) -> Result<Vec<(i32, i64)>, StoreError> {
        let mut flying: VecDeque<DeliveryFuture> = VecDeque::new();
        let mut done = Vec::with_capacity(outs.len());
        for out in &outs {
            loop {
                match self.send(out) {
                    Ok(future) => {
                        flying.push_back(future);
                        break;
                    }
                    Err(KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull)) => match flying.pop_front() {
                        Some(oldest) => done.push(delivered(oldest.await)?),
                        // The producer's queue is full of other callers' records.
                        None => tokio::time::sleep(Duration::from_millis(5)).await,
                    },
                    Err(e) => return Err(refused(e)),
                }
            }
        }
        for future in flying {
            done.push(delivered(future.await)?);
        }
        Ok(done)
    }

    fn send(&self, out: &Out) -> Result<DeliveryFuture, KafkaError> {
        let topic = match out.topic {
            Topic::Jobs => &self.inner.settings.jobs,
            Topic::States => &self.inner.settings.states,
        };
        let mut record = FutureRecord::to(topic)
            .key(&out.key)
            .payload(&out.value[..])
            .headers(out.headers.clone());
        if let Some(p) = out.partition {
            record = record.partition(p);
        }
        self.inner.producer.send_result(record).map_err(|(e, _)| e)
    }

    /// Produces `outs`, waits for the brokers, then for this replica's view to apply
    /// the state records among them (so this replica reads its own writes).
    async fn write(&self, outs: Vec<Out>) -> Result<(), StoreError> {
        let states: Vec<bool> = outs.iter().map(|o| matches!(o.topic, Topic::States)).collect();
        let at = self.deliver(outs).await?;
        let mut last: HashMap<i32, i64> = HashMap::new();
        for ((partition, offset), state) in at.into_iter().zip(states) {
            if state {
                let o = last.entry(partition).or_insert(offset);
                *o = (*o).max(offset);
            }
        }
        for (partition, offset) in last {
            self.inner.view.reached(partition, offset).await?;
        }
        Ok(())
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

/// Submission, leases and results: the calls the offline tier and its workers make.
impl KafkaQueue {
    /// Accepts `jobs`: each on the jobs topic and queued on the state topic, answered
    /// once the brokers have both.
    pub async fn submit(&self, jobs: Vec<NewJob>) -> Result<Vec<Submitted>, StoreError> {
        self.check_room(jobs.len())?;
        let now = super::now_ms();
        let mut out = Vec::with_capacity(jobs.len());
        let mut records = Vec::with_capacity(jobs.len() * 2);
        for job in jobs {
            let id = match &job.idempotency_key {
                Some(key) => keyed_id("job", key),
                None => super::new_id("job"),
            };
            if job.idempotency_key.is_some() && self.get(&id).await?.is_some() {
                out.push(Submitted { id, existing: true });
                continue;
            }
            let meta = JobMeta::new(id.clone(), &job, now, None);
            records.push(Out::state(
                &Record::Job(self.state(meta.clone(), State::Queued, 0)),
                &id,
                Bytes::new(),
            ));
            records.push(Out::job(&meta, job.body));
            out.push(Submitted { id, existing: false });
        }
        self.write(records).await?;
        Ok(out)
    }

    /// Leases up to `max` of `route`'s jobs read here: jobs the view shows ended are let
    /// go, expired ones are recorded so; the rest are recorded running.
    pub async fn lease_route(&self, route: &str, max: usize) -> Result<Vec<Job>, StoreError> {
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
    pub fn runnable_routes(&self) -> Vec<String> {
        self.pending().routes(super::now_ms())
    }

    /// Records how attempts ended: results and failures on the state topic (then their
    /// offsets may be committed), retries back in line here.
    pub async fn finish_all(&self, ends: Vec<(JobId, u32, Finish)>) -> Result<Vec<bool>, StoreError> {
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
    pub async fn get(&self, id: &str) -> Result<Option<Job>, StoreError> {
        use super::JobStore as _;
        self.fresh(|| self.inner.view.store.get(id)).await
    }

    /// Cancels job `id` unless it ended: a cancelled state on the state topic, which
    /// wins unless a result landed first. Returns the state that won.
    pub async fn cancel(&self, id: &str) -> Result<Option<State>, StoreError> {
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
}

/// The Batch API: files and batches on the state topic, read from the view.
impl KafkaQueue {
    /// Stores an uploaded file: its chunks on one partition of the state topic, in order.
    pub async fn add_file(&self, purpose: String, filename: String, content: Bytes) -> Result<FileInfo, StoreError> {
        let id = super::new_id("file");
        let now = super::now_ms();
        let partition = (rand::random::<u32>() % self.inner.state_partitions.max(1) as u32) as i32;
        let chunks: Vec<Bytes> = match content.is_empty() {
            true => vec![Bytes::new()],
            false => (0..content.len())
                .step_by(records::FILE_CHUNK)
                .map(|at| content.slice(at..(at + records::FILE_CHUNK).min(content.len())))
                .collect(),
        };
        let outs = chunks
            .into_iter()
            .enumerate()
            .map(|(i, value)| {
                let chunk = FileChunk {
                    id: id.clone(),
                    purpose: purpose.clone(),
                    filename: filename.clone(),
                    bytes: content.len() as u64,
                    created_at: now,
                    chunk: u32::try_from(i).unwrap_or(u32::MAX),
                };
                let mut out = Out::state(&Record::File(chunk), &format!("{id}#{i}"), value);
                out.partition = Some(partition);
                out
            })
            .collect();
        self.write(outs).await?;
        Ok(FileInfo {
            id,
            purpose,
            filename,
            bytes: content.len() as u64,
            created_at: now,
        })
    }

    /// A file's description.
    pub async fn file(&self, id: &str) -> Result<Option<FileInfo>, StoreError> {
        self.fresh(|| self.inner.view.store.file(id)).await
    }

    /// A file's content.
    pub async fn content(&self, id: &str) -> Result<Option<Vec<u8>>, StoreError> {
        self.fresh(|| self.inner.view.store.content(id)).await
    }

    /// Creates a batch: its row on the state topic, and each of its jobs like a submission.
    pub async fn create_batch(&self, batch: NewBatch) -> Result<(String, bool), StoreError> {
        let id = match &batch.idempotency_key {
            Some(key) => keyed_id("batch", key),
            None => super::new_id("batch"),
        };
        if batch.idempotency_key.is_some() && self.batch(&id).await?.is_some() {
            return Ok((id, true));
        }
        self.check_room(batch.jobs.len())?;
        let now = super::now_ms();
        let row = BatchRow::new(id.clone(), &batch, now);
        let mut outs = vec![Out::state(&Record::Batch(row), &id, Bytes::new())];
        if batch.errors.is_empty() {
            for (custom_id, line, job) in batch.jobs {
                let job_id = super::new_id("job");
                let meta = JobMeta::new(job_id.clone(), &job, now, Some((id.clone(), custom_id, line)));
                outs.push(Out::state(
                    &Record::Job(self.state(meta.clone(), State::Queued, 0)),
                    &job_id,
                    Bytes::new(),
                ));
                outs.push(Out::job(&meta, job.body));
            }
        }
        self.write(outs).await?;
        Ok((id, false))
    }

    /// The batch object.
    pub async fn batch(&self, id: &str) -> Result<Option<Value>, StoreError> {
        self.fresh(|| self.inner.view.store.batch(id)).await
    }

    /// Starts cancelling batch `id`: the batch marked cancelling, and each of its queued
    /// jobs cancelled, on the state topic.
    pub async fn cancel_batch(&self, id: &str) -> Result<Option<Value>, StoreError> {
        let Some(batch) = self.batch(id).await? else {
            return Ok(None);
        };
        let open = batch
            .get("status")
            .and_then(Value::as_str)
            .is_some_and(|s| matches!(s, "validating" | "in_progress"));
        let Some(mut row) = self.inner.view.batch_row(id.to_owned()).await?.filter(|_| open) else {
            return Ok(Some(batch));
        };
        let now = super::now_ms();
        row.cancelling_at = Some(now);
        let mut outs = vec![Out::state(&Record::Batch(row), id, Bytes::new())];
        for (meta, attempts) in self.inner.view.queued_in_batch(id.to_owned()).await? {
            let key = meta.id.clone();
            let mut record = self.state(meta, State::Cancelled, attempts);
            record.finished_at = Some(now);
            outs.push(Out::state(&Record::Job(record), &key, Bytes::new()));
        }
        self.write(outs).await?;
        self.inner.view.store.batch(id).await
    }
}

/// The delivery of one record, or why the brokers did not take it.
fn delivered<E>(result: Result<OwnedDeliveryResult, E>) -> Result<(i32, i64), StoreError> {
    match result {
        Ok(Ok(d)) => Ok((d.partition, d.offset)),
        Ok(Err((e, _))) => Err(refused(e)),
        Err(_) => Err(StoreError::Closed),
    }
}

fn refused(e: KafkaError) -> StoreError {
    StoreError::Io(format!("the Kafka brokers did not take the record: {e}"))
}

/// The id a client's idempotency key names: the same on every replica, and not
/// guessable without the key.
fn keyed_id(prefix: &str, key: &str) -> String {
    let digest = Sha256::digest(format!("tiergate {prefix}\0{key}").as_bytes());
    let hex: String = digest.iter().take(18).map(|b| format!("{b:02x}")).collect();
    format!("{prefix}_{hex}")
}

/// This replica's default name: host name and process id.
fn replica_name() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_else(|_| "tiergate".into());
    format!("{}-{}", host.trim(), std::process::id())
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
