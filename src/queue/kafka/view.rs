//! The state topic, materialized: every replica reads all of it, from the beginning, into
//! a local store rebuilt at each start ([`Embedded::open_view`]), and answers status,
//! results and the Batch API from there. Records apply in partition order; a job's
//! records share a partition (keyed by its id), so every replica sees the same first
//! terminal state, and that one wins: a later result (a replay after a crash) is ignored.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::{Message, Offset, TopicPartitionList};
use rusqlite::{params, params_from_iter, Connection, OptionalExtension};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::records::{self, FileChunk, JobMeta, JobState, Record};
use crate::queue::{batches, Embedded, State, StoreError};

/// Most records applied in one commit.
const GROUP: usize = 1024;
/// Longest wait for the view to reach a point before a call gives up.
const PATIENCE: Duration = Duration::from_secs(15);

/// A replica's view of the state topic.
pub struct View {
    /// The local store the records are applied to.
    pub store: Embedded,
    consumer: Arc<StreamConsumer>,
    topic: String,
    /// Per partition, the offset after the last record applied.
    applied: watch::Sender<Vec<i64>>,
    /// Per replica, when its last heartbeat was written (ms since the Unix epoch) and
    /// by which instance.
    members: std::sync::Mutex<HashMap<String, (i64, u64)>>,
}

impl View {
    /// A view of `topic` (its `partitions`) into `store`, read by `consumer` from the
    /// beginning; [`View::run`] applies it.
    pub fn new(store: Embedded, consumer: StreamConsumer, topic: &str, partitions: i32) -> Result<View, String> {
        let mut assignment = TopicPartitionList::new();
        let mut start = Vec::new();
        for p in 0..partitions {
            let (low, _) = consumer
                .fetch_watermarks(topic, p, PATIENCE)
                .map_err(|e| format!("kafka queue: cannot read the offsets of {topic}/{p}: {e}"))?;
            start.push(low);
            assignment
                .add_partition_offset(topic, p, Offset::Beginning)
                .map_err(|e| e.to_string())?;
        }
        consumer
            .assign(&assignment)
            .map_err(|e| format!("kafka queue: cannot read {topic}: {e}"))?;
        Ok(View {
            store,
            consumer: Arc::new(consumer),
            topic: topic.to_owned(),
            applied: watch::channel(start).0,
            members: Default::default(),
        })
    }

    /// Applies records until `shutdown`, many per commit.
    pub async fn run(self: Arc<View>, shutdown: CancellationToken) {
        loop {
            let Some(first) = super::client::next(&self.consumer, &self.topic, &shutdown).await else {
                return;
            };
            let mut batch = vec![first];
            // Whatever else has arrived joins this commit (a zero timeout polls once).
            while batch.len() < GROUP {
                match tokio::time::timeout(Duration::ZERO, self.consumer.recv()).await {
                    Ok(Ok(m)) => batch.push(m.detach()),
                    _ => break,
                }
            }
            let mut reached: HashMap<i32, i64> = HashMap::new();
            let mut items = Vec::with_capacity(batch.len());
            for m in &batch {
                let at = reached.entry(m.partition()).or_insert(0);
                *at = (*at).max(m.offset() + 1);
                match records::read::<Record, _>(m.headers()) {
                    Some(Record::Member(member)) => {
                        let at = m.timestamp().to_millis().unwrap_or(0);
                        let mut members = self.members.lock().unwrap_or_else(|e| e.into_inner());
                        match member.leaving {
                            true => members.remove(&member.replica),
                            false => members.insert(member.replica, (at, member.instance)),
                        };
                    }
                    Some(record) => items.push((record, Bytes::copy_from_slice(m.payload().unwrap_or_default()))),
                    None => tracing::warn!(
                        topic = %self.topic, partition = m.partition(), offset = m.offset(),
                        "kafka queue: a record without a readable description is skipped"
                    ),
                }
            }
            let unfinished = self.store.unfinished().clone();
            let applied = self
                .store
                .call(move |conn| {
                    for (record, value) in items {
                        if let Err(e) = apply(conn, &record, &value, &unfinished) {
                            tracing::warn!(error = %e, "kafka queue: a job state could not be applied");
                        }
                    }
                    Ok(())
                })
                .await;
            if let Err(e) = applied {
                // The local store failed: this replica's answers would be wrong from here on.
                tracing::error!(error = %e, "kafka queue: the local view of job states failed; stopping it");
                return;
            }
            self.applied.send_modify(|offsets| {
                for (p, next) in reached {
                    if let Some(at) = usize::try_from(p).ok().and_then(|p| offsets.get_mut(p)) {
                        *at = (*at).max(next);
                    }
                }
            });
        }
    }

    /// The replicas whose last heartbeat is younger than `timeout_ms` at `now`.
    pub fn live(&self, now: i64, timeout_ms: i64) -> Vec<String> {
        let members = self.members.lock().unwrap_or_else(|e| e.into_inner());
        members
            .iter()
            .filter(|(_, (at, _))| now.saturating_sub(*at) < timeout_ms)
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// Whether another process wrote a heartbeat under the name `me` after `since`.
    pub fn namesake(&self, me: &str, instance: u64, since: i64) -> bool {
        let members = self.members.lock().unwrap_or_else(|e| e.into_inner());
        members
            .get(me)
            .is_some_and(|(at, other)| *other != instance && *at > since)
    }

    /// Waits until the view has applied record `offset` of `partition`.
    pub async fn reached(&self, partition: i32, offset: i64) -> Result<(), StoreError> {
        let p = usize::try_from(partition).unwrap_or(usize::MAX);
        self.wait(PATIENCE, move |applied| applied.get(p).is_some_and(|at| *at > offset))
            .await
    }

    /// Waits until the view has applied everything the brokers had when called: after
    /// this, a record written (acknowledged) before the call is visible.
    pub async fn catch_up(&self) -> Result<(), StoreError> {
        self.catch_up_within(PATIENCE).await
    }

    /// [`View::catch_up`], waiting up to `patience` (start reads the whole topic).
    pub async fn catch_up_within(&self, patience: Duration) -> Result<(), StoreError> {
        let (consumer, topic) = (self.consumer.clone(), self.topic.clone());
        let partitions = i32::try_from(self.applied.borrow().len()).unwrap_or(i32::MAX);
        let highs = tokio::task::spawn_blocking(move || {
            (0..partitions)
                .map(|p| consumer.fetch_watermarks(&topic, p, PATIENCE).map(|(_, high)| high))
                .collect::<Result<Vec<i64>, _>>()
        })
        .await
        .map_err(|e| StoreError::Io(e.to_string()))?
        .map_err(|e| StoreError::Io(format!("cannot read the state topic's offsets: {e}")))?;
        self.wait(patience, move |applied| {
            highs.iter().zip(applied).all(|(high, at)| at >= high)
        })
        .await
    }

    async fn wait(&self, patience: Duration, done: impl Fn(&Vec<i64>) -> bool) -> Result<(), StoreError> {
        let mut rx = self.applied.subscribe();
        let waited = tokio::time::timeout(patience, async { rx.wait_for(|a| done(a)).await.map(|_| ()) }).await;
        match waited {
            Ok(Ok(())) => Ok(()),
            Ok(Err(_)) => Err(StoreError::Closed),
            Err(_) => Err(StoreError::Io(format!(
                "this replica's view of the job states is more than {patience:?} behind the brokers"
            ))),
        }
    }

    /// Per job of `ids` the view knows: its meta, state and attempts.
    pub async fn jobs(&self, ids: Vec<String>) -> Result<HashMap<String, (JobMeta, State, u32)>, StoreError> {
        self.store
            .call(move |conn| {
                let marks = vec!["?"; ids.len()].join(",");
                metas(conn, &format!("id IN ({marks})"), ids.iter())
            })
            .await
    }

    /// The queued jobs of batch `id`.
    pub async fn queued_in_batch(&self, id: String) -> Result<Vec<(JobMeta, u32)>, StoreError> {
        let found = self
            .store
            .call(move |conn| metas(conn, "batch_id = ? AND state = 'queued'", [id].iter()))
            .await?;
        Ok(found
            .into_values()
            .map(|(meta, _, attempts)| (meta, attempts))
            .collect())
    }

    /// Batch `id`'s row as created.
    pub async fn batch_row(&self, id: String) -> Result<Option<batches::BatchRow>, StoreError> {
        self.store.call(move |conn| batches::row(conn, &id)).await
    }
}

/// Applies one record of the state topic.
fn apply(conn: &Connection, record: &Record, value: &[u8], unfinished: &AtomicI64) -> Result<(), StoreError> {
    match record {
        Record::Job(state) => apply_job(conn, state, value, unfinished),
        Record::File(chunk) => apply_chunk(conn, chunk, value),
        Record::FileDeleted(file) => batches::delete_file(conn, &file.id, &file.tenant).map(drop),
        Record::Batch(row) => {
            batches::insert_row(conn, row)?;
            if let Some(at) = row.cancelling_at {
                batches::mark_cancelling(conn, &row.id, at)?;
            }
            Ok(())
        }
        Record::Member(_) => Ok(()), // kept in memory by the reader, never stored
        Record::Usage(period) => super::usage::apply(conn, period, Some(value)),
        Record::UsageGone(period) => super::usage::apply(conn, period, None),
    }
}

/// A job's state: inserted when the job is new here; otherwise it updates the job unless
/// the job already ended (the first terminal state wins) or it is from an earlier attempt.
fn apply_job(conn: &Connection, s: &JobState, body: &[u8], unfinished: &AtomicI64) -> Result<(), StoreError> {
    let before: Option<String> = conn
        .prepare_cached("SELECT state FROM jobs WHERE id = ?1")?
        .query_row([&s.job.id], |r| r.get(0))
        .optional()?;
    let was_open = before.map(|b| State::parse(&b).is_some_and(|b| !b.is_terminal()));
    if was_open == Some(false) {
        return Ok(());
    }
    let state = s.state();
    let (batch_id, custom_id, line) = match &s.job.batch {
        Some((b, c, l)) => (Some(b.as_str()), Some(c.as_str()), Some(*l as i64)),
        None => (None, None, None),
    };
    let json = |h: &[(String, String)]| serde_json::to_string(h).unwrap_or_else(|_| "[]".into());
    let (prompt, completion) = match s.status {
        Some(status) => crate::queue::jobs::tokens(status, body),
        None => (None, None),
    };
    conn.prepare_cached(
        "INSERT INTO jobs (id, route, method, path, headers, body, state, attempts, not_before, created_at, expires_at,
                           finished_at, status, answer_headers, answer_body, error, idempotency_key, batch_id,
                           custom_id, line, tenant, shadow, comparison, prompt_tokens, completion_tokens)
         VALUES (?1, ?2, ?3, ?4, ?5, x'', ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20, ?21,
                 ?22, ?23, ?24)
         ON CONFLICT(id) DO UPDATE SET state = excluded.state, attempts = excluded.attempts,
             not_before = excluded.not_before, finished_at = excluded.finished_at, status = excluded.status,
             answer_headers = excluded.answer_headers, answer_body = excluded.answer_body, error = excluded.error,
             comparison = excluded.comparison, prompt_tokens = excluded.prompt_tokens,
             completion_tokens = excluded.completion_tokens
         WHERE excluded.state NOT IN ('queued', 'running') OR excluded.attempts >= jobs.attempts",
    )?
    .execute(params![
        s.job.id,
        s.job.route,
        s.job.method,
        s.job.path,
        json(&s.job.headers),
        state.as_str(),
        s.attempts,
        s.not_before,
        s.job.created_at,
        s.job.expires_at,
        s.finished_at,
        s.status,
        s.status.map(|_| json(&s.answer_headers)),
        s.status.map(|_| body),
        s.error,
        s.job.idempotency_key,
        batch_id,
        custom_id,
        line,
        s.job.tenant,
        s.job.shadow,
        s.comparison,
        prompt,
        completion,
    ])?;
    match (was_open, state.is_terminal()) {
        (None, false) => {
            unfinished.fetch_add(1, Ordering::AcqRel);
        }
        (Some(true), true) => {
            unfinished.fetch_sub(1, Ordering::AcqRel);
        }
        _ => {}
    }
    Ok(())
}

/// A chunk of a file: kept aside until the file's chunks are all there, then joined
/// into its row (so a file is never seen in part; a chunk seen twice counts once).
fn apply_chunk(conn: &Connection, chunk: &FileChunk, content: &[u8]) -> Result<(), StoreError> {
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS file_chunks (id TEXT NOT NULL, chunk INTEGER NOT NULL, content BLOB NOT NULL,
                                                 PRIMARY KEY (id, chunk))",
    )?;
    conn.prepare_cached("INSERT OR IGNORE INTO file_chunks (id, chunk, content) VALUES (?1, ?2, ?3)")?
        .execute(params![chunk.id, chunk.chunk, content])?;
    let have: i64 = conn
        .prepare_cached("SELECT COALESCE(SUM(length(content)), 0) FROM file_chunks WHERE id = ?1")?
        .query_row([&chunk.id], |r| r.get(0))?;
    if u64::try_from(have).unwrap_or(0) < chunk.bytes {
        return Ok(());
    }
    let mut whole = Vec::with_capacity(usize::try_from(chunk.bytes).unwrap_or(0));
    {
        let mut parts = conn.prepare_cached("SELECT content FROM file_chunks WHERE id = ?1 ORDER BY chunk")?;
        let mut rows = parts.query([&chunk.id])?;
        while let Some(row) = rows.next()? {
            whole.extend_from_slice(&row.get::<_, Vec<u8>>(0)?);
        }
    }
    conn.prepare_cached(
        "INSERT OR IGNORE INTO files (id, purpose, filename, bytes, created_at, content, tenant)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
    )?
    .execute(params![
        chunk.id,
        chunk.purpose,
        chunk.filename,
        chunk.bytes as i64,
        chunk.created_at,
        whole,
        chunk.tenant
    ])?;
    conn.prepare_cached("DELETE FROM file_chunks WHERE id = ?1")?
        .execute([&chunk.id])?;
    Ok(())
}

/// The jobs matching `filter` (with `args`): meta, state, attempts.
fn metas<'a>(
    conn: &Connection,
    filter: &str,
    args: impl Iterator<Item = &'a String>,
) -> Result<HashMap<String, (JobMeta, State, u32)>, StoreError> {
    let mut stmt = conn.prepare(&format!(
        "SELECT id, route, method, path, headers, created_at, expires_at, idempotency_key, batch_id, custom_id, line,
                state, attempts, tenant, shadow FROM jobs WHERE {filter}"
    ))?;
    let rows = stmt.query_map(params_from_iter(args), |r| {
        let batch = match r.get::<_, Option<String>>(8)? {
            Some(b) => Some((
                b,
                r.get::<_, Option<String>>(9)?.unwrap_or_default(),
                r.get::<_, Option<i64>>(10)?.unwrap_or(0).max(0) as u64,
            )),
            None => None,
        };
        let meta = JobMeta {
            id: r.get(0)?,
            route: r.get(1)?,
            method: r.get(2)?,
            path: r.get(3)?,
            headers: serde_json::from_str(&r.get::<_, String>(4)?).unwrap_or_default(),
            created_at: r.get(5)?,
            expires_at: r.get(6)?,
            idempotency_key: r.get(7)?,
            batch,
            tenant: r.get(13)?,
            shadow: r.get(14)?,
        };
        let state = State::parse(&r.get::<_, String>(11)?).unwrap_or(State::Failed);
        Ok((meta, state, r.get::<_, u32>(12)?))
    })?;
    let mut out = HashMap::new();
    for row in rows {
        let (meta, state, attempts) = row?;
        out.insert(meta.id.clone(), (meta, state, attempts));
    }
    Ok(out)
}
