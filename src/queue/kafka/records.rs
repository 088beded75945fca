//! What the Kafka queue writes: a job on the jobs topic, and on the state topic a job's
//! state, a chunk of an uploaded file, or a batch. Each is one message whose value is
//! the raw bytes (a request body, an answer body, file content) and whose
//! `tiergate-record` header is the rest, as JSON; the key is the id it is about, so the
//! state topic can be compacted to the latest record per id.

use bytes::Bytes;
use rdkafka::message::{Header, Headers, OwnedHeaders};
use serde::{Deserialize, Serialize};

use crate::queue::batches::BatchRow;
use crate::queue::{Answer, Job, NewJob, State};

/// The header that carries a record's description.
pub const HEADER: &str = "tiergate-record";
/// Largest chunk of a file in one message (brokers take 1 MB by default).
pub const FILE_CHUNK: usize = 512 << 10;

/// A job as submitted, without its body: on the jobs topic and in every job state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobMeta {
    /// The job's id (also the message key).
    pub id: String,
    /// Its route.
    pub route: String,
    /// HTTP method.
    pub method: String,
    /// Path on the gateway.
    pub path: String,
    /// The headers that frame the body.
    pub headers: Vec<(String, String)>,
    /// Accepted at (ms since the Unix epoch).
    pub created_at: i64,
    /// Expires at (ms since the Unix epoch).
    pub expires_at: i64,
    /// The client's idempotency key.
    pub idempotency_key: Option<String>,
    /// The batch it belongs to: (batch id, custom_id, line).
    pub batch: Option<(String, String, u64)>,
    /// The tenant that submitted it (empty without data-plane authentication).
    #[serde(default)]
    pub tenant: String,
    /// Whether the route's shadow candidate scores it too (a line of a shadow batch).
    #[serde(default)]
    pub shadow: bool,
}

impl JobMeta {
    /// The meta of `job`, accepted `now` under `id`.
    pub fn new(id: String, job: &NewJob, now: i64, batch: Option<(String, String, u64)>) -> JobMeta {
        JobMeta {
            id,
            route: job.route.clone(),
            method: job.method.clone(),
            path: job.path.clone(),
            headers: job.headers.clone(),
            created_at: now,
            expires_at: job.expires_at,
            idempotency_key: job.idempotency_key.clone(),
            batch,
            tenant: job.tenant.clone(),
            shadow: job.shadow,
        }
    }

    /// The job this meta and `body` describe, queued with no attempts yet.
    pub fn job(&self, body: Bytes) -> Job {
        Job {
            id: self.id.clone(),
            request: NewJob {
                route: self.route.clone(),
                method: self.method.clone(),
                path: self.path.clone(),
                headers: self.headers.clone(),
                body,
                expires_at: self.expires_at,
                idempotency_key: self.idempotency_key.clone(),
                tenant: self.tenant.clone(),
                shadow: self.shadow,
            },
            state: State::Queued,
            attempts: 0,
            created_at: self.created_at,
            finished_at: None,
            answer: None,
            error: None,
        }
    }
}

/// A job's state as one replica saw it change (the answer body is the message value).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobState {
    /// The job.
    pub job: JobMeta,
    /// Its state (`State::as_str`).
    pub state: String,
    /// Attempts started.
    pub attempts: u32,
    /// Earliest next attempt (ms since the Unix epoch), for a queued job.
    pub not_before: i64,
    /// When it reached a terminal state.
    pub finished_at: Option<i64>,
    /// The backend's status, with the answer.
    pub status: Option<u16>,
    /// The answer's framing headers.
    pub answer_headers: Vec<(String, String)>,
    /// Why it failed or is retried.
    pub error: Option<String>,
    /// How a shadow candidate's answer compared, with the answer ([`Answer::comparison`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub comparison: Option<String>,
    /// The replica that wrote it.
    pub by: String,
}

impl JobState {
    /// A state of `job` with nothing else known.
    pub fn of(job: JobMeta, state: State, attempts: u32, by: &str) -> JobState {
        JobState {
            job,
            state: state.as_str().to_owned(),
            attempts,
            not_before: 0,
            finished_at: None,
            status: None,
            answer_headers: Vec::new(),
            error: None,
            comparison: None,
            by: by.to_owned(),
        }
    }

    /// The state, `Failed` when unreadable.
    pub fn state(&self) -> State {
        State::parse(&self.state).unwrap_or(State::Failed)
    }

    /// Adds `answer`'s status and headers (its body goes in the message value).
    pub fn with_answer(mut self, answer: &Answer) -> JobState {
        self.status = Some(answer.status);
        self.answer_headers = answer.headers.clone();
        self.comparison = answer.comparison.clone();
        self
    }
}

/// A chunk of an uploaded file (all of a file's chunks go to one partition, in order).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FileChunk {
    /// The file's id.
    pub id: String,
    /// Its purpose.
    pub purpose: String,
    /// The name it was uploaded with.
    pub filename: String,
    /// Its whole size.
    pub bytes: u64,
    /// Uploaded at (ms since the Unix epoch).
    pub created_at: i64,
    /// This chunk's index.
    pub chunk: u32,
    /// The tenant that uploaded it (empty without data-plane authentication).
    #[serde(default)]
    pub tenant: String,
}

/// A deleted file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FileDeleted {
    /// The file's id.
    pub id: String,
    /// Its tenant.
    pub tenant: String,
}

/// A replica's heartbeat: it is alive (or, when `leaving`, stopping now).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Member {
    /// The replica's name.
    pub replica: String,
    /// A number drawn at start: two processes with one name tell each other apart.
    #[serde(default)]
    pub instance: u64,
    /// Whether it is stopping (its partitions can go at once).
    pub leaving: bool,
}

/// A replica's minute or hour of usage: the record's description (its rows are the
/// value).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UsagePeriod {
    /// The replica that wrote it.
    pub replica: String,
    /// 60 or 3600 seconds.
    pub span: i64,
    /// Its start, unix seconds.
    pub period: i64,
}

impl UsagePeriod {
    /// Its key on the state topic.
    pub fn key(&self) -> String {
        format!("usage/{}/{}/{}", self.replica, self.span, self.period)
    }
}

/// One record of the state topic.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Record {
    /// A job's state.
    Job(JobState),
    /// A chunk of a file.
    File(FileChunk),
    /// A file deleted: written under each of its chunks' keys with no content, so
    /// compaction drops the content from the topic too.
    FileDeleted(FileDeleted),
    /// A batch.
    Batch(BatchRow),
    /// A replica's heartbeat.
    Member(Member),
    /// A replica's minute or hour of usage (its rows are the value).
    Usage(UsagePeriod),
    /// A replica's minute or hour of usage it no longer keeps.
    UsageGone(UsagePeriod),
}

/// The headers that carry `meta`.
pub fn headers<T: Serialize>(meta: &T) -> OwnedHeaders {
    let json = serde_json::to_vec(meta).unwrap_or_default();
    OwnedHeaders::new_with_capacity(1).insert(Header {
        key: HEADER,
        value: Some(&json),
    })
}

/// The description in a message's headers, if there is a readable one.
pub fn read<T: for<'de> Deserialize<'de>, H: Headers>(headers: Option<&H>) -> Option<T> {
    let header = headers?.iter().find(|h| h.key == HEADER)?;
    serde_json::from_slice(header.value?).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_survives_its_header() {
        let job = NewJob {
            route: "r".into(),
            method: "POST".into(),
            path: "/v2/models/m/infer".into(),
            headers: vec![("content-type".into(), "application/json".into())],
            body: Bytes::from_static(b"{}"),
            expires_at: 9,
            idempotency_key: Some("k".into()),
            tenant: "t".into(),
            shadow: true,
        };
        let meta = JobMeta::new("job_1".into(), &job, 5, Some(("batch_1".into(), "c".into(), 3)));
        let record = Record::Job(JobState::of(meta.clone(), State::Running, 2, "a"));
        let json = serde_json::to_vec(&record).expect("serializes");
        let back: Record = serde_json::from_slice(&json).expect("parses");
        assert_eq!(back, record);
        let as_job = meta.job(job.body.clone());
        assert_eq!((as_job.request, as_job.created_at), (job, 5));
    }
}
