//! The offline tier's durable queue: jobs accepted now, run later, results kept until
//! fetched.
//!
//! Below the offline tier and the Batch API, beside the backends. A job is one HTTP
//! request to a route (method, path, the headers that frame its body, the body), with
//! its state, attempts and, once finished, the exact answer the backend gave. The
//! [`JobStore`] trait is what the tier and its workers need; [`Embedded`] implements it
//! on one SQLite file under the data directory (WAL, `synchronous = FULL`, one writer
//! thread with group commit, so many submissions share one fsync). A job is
//! acknowledged only once its transaction is durable. A job that was running when the
//! process died is queued again at start, and its result is written only by the attempt
//! that holds it, so a replay never produces two results.
//!
//! # Layout
//!
//! `in_use` ([`Queue`]: the queue the gateway was started with) · `embedded` (the SQLite store: writer
//! thread, group commit) · `jobs` (the jobs table) · `batches` (the Batch API's files and
//! batches, and their output files) · `scored` (a shadow batch's comparison of each line
//! and summary) · `kafka` (the Kafka queue for several replicas:
//! topics, a local view of the state topic, the consumer group).

pub mod batches;
pub mod embedded;
mod in_use;
mod jobs;
#[cfg(feature = "kafka")]
pub mod kafka;
pub mod scored;

use std::future::Future;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;

pub use batches::{Batch, FileInfo, FileQuery, NewBatch};
pub use embedded::Embedded;
pub use in_use::Queue;

/// A job's id: `job_` then time-ordered hex.
pub type JobId = String;

/// A request to accept as a job.
#[derive(Debug, Clone, PartialEq)]
pub struct NewJob {
    /// The route that serves it (by name, resolved again when it runs).
    pub route: String,
    /// HTTP method (POST for every infer request).
    pub method: String,
    /// Path on the gateway: a KServe v2 infer path or a JSON route's path.
    pub path: String,
    /// The headers that frame the body (content type, binary header length); never
    /// credentials.
    pub headers: Vec<(String, String)>,
    /// The request body, byte for byte.
    pub body: Bytes,
    /// When it expires unless finished (ms since the Unix epoch).
    pub expires_at: i64,
    /// The client's `Idempotency-Key` as stored ([`idempotency_key`]): a second
    /// submission with the same scope gets the first job.
    pub idempotency_key: Option<String>,
    /// The tenant that submitted it (empty when the data plane has no authentication):
    /// only it can read the job.
    pub tenant: String,
    /// Whether the route's shadow candidate scores it too (a line of a shadow batch):
    /// its comparison is kept with its answer ([`Answer::comparison`]).
    pub shadow: bool,
}

/// The name, among a job's [`NewJob::headers`], under which a line of a precomputing
/// batch keeps the TTL (milliseconds) its answer is kept in the route's cache for. Not
/// a valid header name, so it never reaches a request and no client can send it.
pub const PRECOMPUTE: &str = ":tiergate-precompute-ms";

impl NewJob {
    /// How long its answer is kept in the route's cache, when it is a line of a
    /// precomputing batch.
    pub fn precompute(&self) -> Option<std::time::Duration> {
        let (_, ms) = self.headers.iter().find(|(k, _)| k == PRECOMPUTE)?;
        ms.parse().ok().map(std::time::Duration::from_millis)
    }
}

/// Where a job is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum State {
    /// Waiting to run (again, after a retryable failure).
    Queued,
    /// Handed to a worker.
    Running,
    /// The backend answered 2xx; the answer is kept.
    Succeeded,
    /// The backend refused it (4xx, kept), or it failed on every attempt (last error kept).
    Failed,
    /// Cancelled before it ran.
    Cancelled,
    /// Its completion window passed before it finished.
    Expired,
}

impl State {
    /// Every state, in life order.
    pub const ALL: [State; 6] = [
        State::Queued,
        State::Running,
        State::Succeeded,
        State::Failed,
        State::Cancelled,
        State::Expired,
    ];

    /// The name used in the API, the store and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            State::Queued => "queued",
            State::Running => "running",
            State::Succeeded => "succeeded",
            State::Failed => "failed",
            State::Cancelled => "cancelled",
            State::Expired => "expired",
        }
    }

    /// The state called `name`.
    pub fn parse(name: &str) -> Option<State> {
        State::ALL.into_iter().find(|s| s.as_str() == name)
    }

    /// Whether nothing more will happen to the job.
    pub fn is_terminal(self) -> bool {
        !matches!(self, State::Queued | State::Running)
    }
}

/// A backend's answer, as kept for the client.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    /// HTTP status.
    pub status: u16,
    /// The headers that describe the body (content type, binary header length) and
    /// where it came from (the micro-batch's `x-tiergate-batch-id`).
    pub headers: Vec<(String, String)>,
    /// The body, byte for byte.
    pub body: Bytes,
    /// For a job scored by a shadow candidate: how the candidate's answer compared
    /// ([`scored::Scored`], as JSON), for its batch's comparison file.
    pub comparison: Option<String>,
}

/// A job as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct Job {
    /// Its id.
    pub id: JobId,
    /// What was submitted.
    pub request: NewJob,
    /// Where it is.
    pub state: State,
    /// Attempts started so far.
    pub attempts: u32,
    /// When it was accepted (ms since the Unix epoch).
    pub created_at: i64,
    /// When it reached a terminal state.
    pub finished_at: Option<i64>,
    /// The backend's answer, once there is one to keep.
    pub answer: Option<Answer>,
    /// Why it failed, when no answer explains it.
    pub error: Option<String>,
}

/// How an attempt ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Finish {
    /// The backend answered; 2xx succeeds, anything else fails for good. Kept as is.
    Answered(Answer),
    /// A failure worth retrying (backend unreachable, 5xx, shed) not before `not_before`.
    Retry {
        /// What went wrong.
        error: String,
        /// Earliest next attempt (ms since the Unix epoch).
        not_before: i64,
    },
    /// Not run: queued again until `not_before`, the attempt not counted (its tenant's
    /// quota is spent; `reason` says which, and when it resets).
    Wait {
        /// Why it waits.
        reason: String,
        /// Earliest next attempt (ms since the Unix epoch).
        not_before: i64,
    },
    /// A failure that retrying cannot fix, or the last attempt's failure.
    Failed {
        /// What went wrong.
        error: String,
    },
}

/// The result of a submission (of a job or a batch).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Submitted {
    /// The job's (or batch's) id.
    pub id: JobId,
    /// Whether an earlier submission with the same idempotency key made it.
    pub existing: bool,
    /// For an earlier one: whether it was the same request (its key's fingerprint
    /// matches). A key reused for another request is the client's mistake (422).
    pub same_request: bool,
}

impl Submitted {
    /// A new job or batch.
    pub fn new(id: JobId) -> Self {
        Submitted {
            id,
            existing: false,
            same_request: true,
        }
    }

    /// One made earlier with the same key's scope, whose stored key was `stored`.
    pub fn earlier(id: JobId, stored: Option<&str>, key: &str) -> Self {
        Submitted {
            id,
            existing: true,
            same_request: stored == Some(key),
        }
    }
}

/// A client's `Idempotency-Key` as stored: `{scope}:{fingerprint}`. The scope (the
/// tenant, the endpoint and the key) names the job: the same key from another tenant
/// or on another endpoint is another job. The fingerprint (of the method, path and
/// body) tells the same request from another one sent with the same key.
pub fn idempotency_key(tenant: &str, endpoint: &str, key: &str, request: &[&[u8]]) -> String {
    use sha2::{Digest, Sha256};
    let hex = |digest: &[u8]| digest.iter().take(16).map(|b| format!("{b:02x}")).collect::<String>();
    let scope = Sha256::new()
        .chain_update(tenant.len().to_le_bytes())
        .chain_update(tenant)
        .chain_update(endpoint.len().to_le_bytes())
        .chain_update(endpoint)
        .chain_update(key)
        .finalize();
    let mut fingerprint = Sha256::new();
    for part in request {
        fingerprint.update(part.len().to_le_bytes());
        fingerprint.update(part);
    }
    format!("{}:{}", hex(&scope), hex(&fingerprint.finalize()))
}

/// The scope part of a stored idempotency key (see [`idempotency_key`]).
pub fn idempotency_scope(stored: &str) -> &str {
    stored.split_once(':').map_or(stored, |(scope, _)| scope)
}

/// Why the store could not do what was asked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// The store holds its limit of unfinished jobs.
    #[error("offline.max_queued_jobs {0} reached (the offline queue holds that many unfinished jobs); retry later")]
    Full(u64),
    /// SQLite failed (disk full, I/O error...).
    #[error("the offline store failed: {0}")]
    Io(String),
    /// The store's writer has stopped.
    #[error("the offline store is closed")]
    Closed,
}

impl From<rusqlite::Error> for StoreError {
    /// SQLite's message with its extended result code, which tells I/O failures apart
    /// (<https://sqlite.org/rescode.html>: 6410 is a temporary directory it cannot use).
    fn from(e: rusqlite::Error) -> Self {
        match &e {
            rusqlite::Error::SqliteFailure(code, _) => {
                StoreError::Io(format!("{e} (SQLite result code {})", code.extended_code))
            }
            _ => StoreError::Io(e.to_string()),
        }
    }
}

/// What the offline tier, its workers, the jobs endpoint and the Batch API need from a
/// queue: jobs, and the Batch API's files and batches made of them. Implemented by
/// [`Embedded`], by the Kafka queue (the `kafka` feature), and by [`Queue`], which sends
/// each call to the queue the gateway was started with. Reads of files, batches and
/// counts are answered by a local store: the embedded store itself, or the Kafka
/// queue's view of its state topic.
pub trait JobStore: Send + Sync + 'static {
    /// Accepts `jobs` durably, in one commit; each is acknowledged only once durable.
    fn submit(&self, jobs: Vec<NewJob>) -> impl Future<Output = Result<Vec<Submitted>, StoreError>> + Send;
    /// Hands up to `max` runnable jobs to a worker, oldest first, counting an attempt each.
    fn lease(&self, max: usize) -> impl Future<Output = Result<Vec<Job>, StoreError>> + Send;
    /// Like [`JobStore::lease`], for the jobs of `route` only.
    fn lease_route(&self, route: &str, max: usize) -> impl Future<Output = Result<Vec<Job>, StoreError>> + Send;
    /// Routes that have jobs ready to run.
    fn runnable_routes(&self) -> impl Future<Output = Result<Vec<String>, StoreError>> + Send;
    /// Records how attempt `attempt` of job `id` ended; ignored (returns false) unless
    /// that attempt still holds the job, so a replayed attempt never writes a second result.
    fn finish(&self, id: &str, attempt: u32, finish: Finish) -> impl Future<Output = Result<bool, StoreError>> + Send {
        let ends = vec![(id.to_owned(), attempt, finish)];
        async move { Ok(self.finish_all(ends).await?.first().copied().unwrap_or(false)) }
    }
    /// Records several attempts' ends in one commit; one flag per entry, as [`JobStore::finish`].
    fn finish_all(&self, ends: Vec<(JobId, u32, Finish)>)
        -> impl Future<Output = Result<Vec<bool>, StoreError>> + Send;
    /// The job `id`.
    fn get(&self, id: &str) -> impl Future<Output = Result<Option<Job>, StoreError>> + Send;
    /// Cancels job `id` if it has not finished; returns its state afterwards.
    fn cancel(&self, id: &str) -> impl Future<Output = Result<Option<State>, StoreError>> + Send;

    /// Stores `tenant`'s uploaded file, durably and whole, or not at all.
    fn add_file(
        &self,
        tenant: &str,
        purpose: String,
        filename: String,
        content: Bytes,
    ) -> impl Future<Output = Result<FileInfo, StoreError>> + Send;
    /// A file's description, when it is `tenant`'s.
    fn file(&self, id: &str, tenant: &str) -> impl Future<Output = Result<Option<FileInfo>, StoreError>> + Send;
    /// A file's content, when it is `tenant`'s.
    fn content(&self, id: &str, tenant: &str) -> impl Future<Output = Result<Option<Vec<u8>>, StoreError>> + Send;
    /// `len` bytes of a file's content from `offset`, when it is `tenant`'s and that long.
    fn content_range(
        &self,
        id: &str,
        tenant: &str,
        offset: u64,
        len: u64,
    ) -> impl Future<Output = Result<Option<Vec<u8>>, StoreError>> + Send;
    /// `tenant`'s files as `query` asks, and whether more follow.
    fn files(
        &self,
        tenant: &str,
        query: FileQuery,
    ) -> impl Future<Output = Result<(Vec<FileInfo>, bool), StoreError>> + Send;
    /// Deletes `tenant`'s file `id`; whether there was one.
    fn delete_file(&self, id: &str, tenant: &str) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Creates a batch and all its jobs in one commit; its id, and whether an earlier
    /// request with the same idempotency key made it.
    fn create_batch(&self, batch: NewBatch) -> impl Future<Output = Result<Submitted, StoreError>> + Send;
    /// Batch `id` with its jobs counted, when it is `tenant`'s.
    fn batch(&self, id: &str, tenant: &str) -> impl Future<Output = Result<Option<Batch>, StoreError>> + Send;
    /// `tenant`'s batches, newest first, older than `after`, at most `limit`; and
    /// whether more exist.
    fn batches(
        &self,
        tenant: &str,
        after: Option<String>,
        limit: usize,
    ) -> impl Future<Output = Result<(Vec<Batch>, bool), StoreError>> + Send;
    /// Starts cancelling `tenant`'s batch `id`: queued jobs are cancelled, running ones
    /// finish. The batch afterwards, or `None` when it is not `tenant`'s.
    fn cancel_batch(&self, id: &str, tenant: &str) -> impl Future<Output = Result<Option<Batch>, StoreError>> + Send;
    /// Every tenant's batches, newest first, older than `after`, at most `limit`; and
    /// whether more exist. For the admin API only: callers see their own.
    fn all_batches(
        &self,
        after: Option<String>,
        limit: usize,
    ) -> impl Future<Output = Result<(Vec<Batch>, bool), StoreError>> + Send;
    /// Whose batch `id` is, if there is one. For the admin API only.
    fn batch_owner(&self, id: &str) -> impl Future<Output = Result<Option<String>, StoreError>> + Send;

    /// Jobs by state (for metrics). With Kafka, every replica counts every job.
    fn counts(&self) -> impl Future<Output = Result<Vec<(State, u64)>, StoreError>> + Send;
    /// When the oldest queued job was submitted (ms since the Unix epoch), if any is queued.
    fn oldest_queued(&self) -> impl Future<Output = Result<Option<i64>, StoreError>> + Send;
    /// Deletes finished jobs past `retention_ms` and finalizes finished batches; the
    /// embedded store also expires queued jobs whose window passed (the Kafka queue
    /// records expiry on its state topic when a job's turn comes). Returns (expired,
    /// deleted).
    fn sweep(&self, retention_ms: i64) -> impl Future<Output = Result<(u64, u64), StoreError>> + Send;
    /// Finalizes the batches whose jobs are all done now (also done by every sweep).
    fn finalize(&self) -> impl Future<Output = Result<usize, StoreError>> + Send;
    /// Why the queue cannot commit, while its last commit failed (`None` once one succeeds).
    fn failing(&self) -> Option<String>;
}

/// Now, in ms since the Unix epoch.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// `ms` later than now, in ms since the Unix epoch.
pub fn after(d: Duration) -> i64 {
    now_ms().saturating_add(i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// A new id with `prefix` (`job`, `batch`, `file`), ordered by creation: the time in ms,
/// a process-wide sequence number, then random bits so ids are not guessable.
pub fn new_id(prefix: &str) -> String {
    static SEQUENCE: AtomicU32 = AtomicU32::new(0);
    let seq = SEQUENCE.fetch_add(1, Ordering::Relaxed);
    format!("{prefix}_{:012x}{seq:08x}{:016x}", now_ms(), rand::random::<u64>())
}
