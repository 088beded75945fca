//! The Batch API's tables: uploaded files, batches, and the jobs a batch made (rows of
//! the jobs table tagged with the batch, its `custom_id` and input line). Each function
//! runs on the store's writer thread inside the current transaction.

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use rusqlite::{params, Connection, OptionalExtension, Row};
use serde_json::{json, Map, Value};

use super::jobs::{add_column, keyed};
use super::scored::{Scored, Summary, NO_ANSWER};
use super::{NewJob, State, StoreError, Submitted};

/// Creates the tables when missing.
pub(super) fn schema(conn: &Connection) -> Result<(), StoreError> {
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS files (
            id TEXT PRIMARY KEY,
            purpose TEXT NOT NULL,
            filename TEXT NOT NULL,
            bytes INTEGER NOT NULL,
            created_at INTEGER NOT NULL,
            content BLOB NOT NULL,
            tenant TEXT NOT NULL DEFAULT ''
        );
        CREATE TABLE IF NOT EXISTS batches (
            id TEXT PRIMARY KEY,
            input_file_id TEXT NOT NULL,
            endpoint TEXT NOT NULL,
            completion_window TEXT NOT NULL,
            metadata TEXT,
            status TEXT NOT NULL,
            created_at INTEGER NOT NULL,
            expires_at INTEGER NOT NULL,
            in_progress_at INTEGER,
            finalizing_at INTEGER,
            completed_at INTEGER,
            failed_at INTEGER,
            expired_at INTEGER,
            cancelling_at INTEGER,
            cancelled_at INTEGER,
            output_file_id TEXT,
            error_file_id TEXT,
            errors TEXT,
            idempotency_key TEXT UNIQUE,
            requests INTEGER,
            tenant TEXT NOT NULL DEFAULT '',
            shadow INTEGER NOT NULL DEFAULT 0,
            comparison_file_id TEXT,
            shadow_summary TEXT,
            precompute_ms INTEGER
        );
        CREATE INDEX IF NOT EXISTS jobs_batch ON jobs (batch_id, line) WHERE batch_id IS NOT NULL;",
    )?;
    // Stores made before batches counted their jobs, before tenants, and before shadow
    // batches.
    add_column(conn, "batches", "requests", "INTEGER")?;
    add_column(conn, "batches", "tenant", "TEXT NOT NULL DEFAULT ''")?;
    add_column(conn, "files", "tenant", "TEXT NOT NULL DEFAULT ''")?;
    add_column(conn, "batches", "shadow", "INTEGER NOT NULL DEFAULT 0")?;
    add_column(conn, "batches", "comparison_file_id", "TEXT")?;
    add_column(conn, "batches", "shadow_summary", "TEXT")?;
    add_column(conn, "batches", "precompute_ms", "INTEGER")
}

/// A file as the API shows it (without its content).
#[derive(Debug, Clone, PartialEq)]
pub struct FileInfo {
    /// `file_...`.
    pub id: String,
    /// `batch`, `batch_output`.
    pub purpose: String,
    /// The name it was uploaded with.
    pub filename: String,
    /// Its size.
    pub bytes: u64,
    /// Upload time (ms since the Unix epoch).
    pub created_at: i64,
}

/// A batch's row as created: what the embedded store inserts, and what the Kafka
/// queue writes to its state topic (with `cancelling_at` once cancelling is asked).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct BatchRow {
    /// `batch_...`.
    pub id: String,
    /// The input file.
    pub input_file_id: String,
    /// The endpoint named at creation.
    pub endpoint: String,
    /// As given.
    pub completion_window: String,
    /// As given.
    pub metadata: Option<Map<String, Value>>,
    /// Created at (ms since the Unix epoch).
    pub created_at: i64,
    /// When unfinished jobs expire.
    pub expires_at: i64,
    /// The client's idempotency key, as stored ([`super::idempotency_key`]).
    pub idempotency_key: Option<String>,
    /// The tenant that created it (empty without data-plane authentication).
    #[serde(default)]
    pub tenant: String,
    /// Its jobs (one per valid input line).
    pub requests: u64,
    /// Validation errors (the batch failed at once, with no jobs).
    pub errors: Vec<Value>,
    /// When cancelling was asked.
    pub cancelling_at: Option<i64>,
    /// Whether its lines are scored by the route's shadow candidate too.
    #[serde(default)]
    pub shadow: bool,
    /// How long its answers are kept in the route's cache, when it precomputes (ms).
    #[serde(default)]
    pub precompute_ms: Option<u64>,
}

impl BatchRow {
    /// The row of `batch`, created `now` as `id`.
    pub fn new(id: String, batch: &NewBatch, now: i64) -> BatchRow {
        BatchRow {
            id,
            input_file_id: batch.input_file_id.clone(),
            endpoint: batch.endpoint.clone(),
            completion_window: batch.completion_window.clone(),
            metadata: batch.metadata.clone(),
            created_at: now,
            expires_at: batch.expires_at,
            idempotency_key: batch.idempotency_key.clone(),
            tenant: batch.tenant.clone(),
            requests: if batch.errors.is_empty() {
                batch.jobs.len() as u64
            } else {
                0
            },
            errors: batch.errors.clone(),
            cancelling_at: None,
            shadow: batch.shadow,
            precompute_ms: batch
                .precompute
                .map(|ttl| u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX)),
        }
    }
}

/// A batch as stored, with its jobs counted: what the Batch API shows (its room,
/// `front::batch_api`, writes OpenAI's batch object from it). Times are ms since the
/// Unix epoch.
#[derive(Debug, Clone, PartialEq)]
pub struct Batch {
    /// `batch_...`.
    pub id: String,
    /// Whose it is (the caller's tenant; empty without tenants).
    pub tenant: String,
    /// The endpoint named at creation.
    pub endpoint: String,
    /// Its validation errors, as OpenAI's list object, when it failed at creation.
    pub errors: Option<Value>,
    /// The input file.
    pub input_file_id: String,
    /// As given.
    pub completion_window: String,
    /// `in_progress`, `cancelling`, `completed`, `failed`, `expired` or `cancelled`.
    pub status: String,
    /// The output file, once finalized with any answer.
    pub output_file_id: Option<String>,
    /// The error file, once finalized with any failure.
    pub error_file_id: Option<String>,
    /// Created at.
    pub created_at: i64,
    /// When its jobs began running.
    pub in_progress_at: Option<i64>,
    /// When unfinished jobs expire.
    pub expires_at: i64,
    /// When it was finalized.
    pub finalizing_at: Option<i64>,
    /// When it completed.
    pub completed_at: Option<i64>,
    /// When it failed.
    pub failed_at: Option<i64>,
    /// When it expired.
    pub expired_at: Option<i64>,
    /// When cancelling was asked.
    pub cancelling_at: Option<i64>,
    /// When its cancellation ended.
    pub cancelled_at: Option<i64>,
    /// As given.
    pub metadata: Option<Value>,
    /// How long its answers are kept in the route's cache, when it precomputes.
    pub precompute: Option<Duration>,
    /// For a shadow batch: its comparison file once it ends, and the summary.
    pub shadow: Option<(Option<String>, Option<Value>)>,
    /// Its jobs: all, those that succeeded, those that failed (cancelled and expired
    /// ones among them).
    pub counts: Counts,
    /// Why some of its jobs wait (their tenant's quota is spent), when any do.
    pub waiting: Option<String>,
}

/// A batch's jobs by outcome, as OpenAI's `request_counts`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Counts {
    /// Every job of the batch.
    pub total: u64,
    /// Jobs that succeeded.
    pub completed: u64,
    /// Jobs that failed, were cancelled or expired.
    pub failed: u64,
    /// Jobs queued waiting for their tenant's quota (not OpenAI's: said apart).
    pub waiting: u64,
    /// The LLM tokens its answered jobs' `usage` counts: prompt (input) and completion
    /// (output), as OpenAI's batch `usage`.
    pub tokens: [u64; 2],
}

/// A new batch: its row, and its jobs with their `custom_id` and line.
#[derive(Debug, Clone)]
pub struct NewBatch {
    /// The uploaded JSONL file.
    pub input_file_id: String,
    /// The endpoint named at creation.
    pub endpoint: String,
    /// As given (`24h`).
    pub completion_window: String,
    /// When unfinished jobs expire (ms since the Unix epoch).
    pub expires_at: i64,
    /// Up to 16 string pairs, as given.
    pub metadata: Option<Map<String, Value>>,
    /// The client's `Idempotency-Key`, as stored ([`super::idempotency_key`]).
    pub idempotency_key: Option<String>,
    /// The tenant creating it; only it can read the batch and its files.
    pub tenant: String,
    /// One job per line: (custom_id, line, job).
    pub jobs: Vec<(String, u64, NewJob)>,
    /// Validation errors; when any, the batch is created `failed` with no jobs.
    pub errors: Vec<Value>,
    /// Whether the route's shadow candidate scores every line too (its jobs say so
    /// each, [`NewJob::shadow`]).
    pub shadow: bool,
    /// How long its answers are kept in the route's cache, when it precomputes (its jobs
    /// say so each, [`NewJob::precompute`]).
    pub precompute: Option<std::time::Duration>,
}

/// A file to store: whose it is, what for, under which name.
#[derive(Debug, Clone, Copy)]
pub(super) struct NewFile<'a> {
    pub tenant: &'a str,
    pub purpose: &'a str,
    pub filename: &'a str,
}

/// Stores an uploaded file.
pub(super) fn add_file(conn: &Connection, file: NewFile<'_>, content: &[u8], now: i64) -> Result<FileInfo, StoreError> {
    add_file_as(conn, super::new_id("file"), file, content, now)
}

/// Stores a file as `id`.
fn add_file_as(
    conn: &Connection,
    id: String,
    file: NewFile<'_>,
    content: &[u8],
    now: i64,
) -> Result<FileInfo, StoreError> {
    let NewFile {
        tenant,
        purpose,
        filename,
    } = file;
    conn.prepare_cached(
        "INSERT INTO files (id, purpose, filename, bytes, created_at, content, tenant)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
    )?
    .execute(params![
        id,
        purpose,
        filename,
        content.len() as i64,
        now,
        content,
        tenant
    ])?;
    Ok(FileInfo {
        id,
        purpose: purpose.to_owned(),
        filename: filename.to_owned(),
        bytes: content.len() as u64,
        created_at: now,
    })
}

/// A file's description (once all of it is there: the Kafka queue's replicas gather a
/// file chunk by chunk).
pub(super) fn file(conn: &Connection, id: &str, tenant: &str) -> Result<Option<FileInfo>, StoreError> {
    Ok(conn
        .prepare_cached(
            "SELECT id, purpose, filename, bytes, created_at FROM files
             WHERE id = ?1 AND tenant = ?2 AND length(content) = bytes",
        )?
        .query_row([id, tenant], file_info)
        .optional()?)
}

/// A file's description from a row of `id, purpose, filename, bytes, created_at`.
fn file_info(r: &rusqlite::Row<'_>) -> rusqlite::Result<FileInfo> {
    Ok(FileInfo {
        id: r.get(0)?,
        purpose: r.get(1)?,
        filename: r.get(2)?,
        bytes: r.get::<_, i64>(3)?.max(0) as u64,
        created_at: r.get(4)?,
    })
}

/// Which of a tenant's files to list, as OpenAI's `GET /v1/files` asks.
#[derive(Debug, Clone, Default)]
pub struct FileQuery {
    /// Only files of this purpose.
    pub purpose: Option<String>,
    /// Only files after this one in the order asked (a cursor).
    pub after: Option<String>,
    /// At most this many.
    pub limit: usize,
    /// Oldest first (`order=asc`); newest first otherwise.
    pub ascending: bool,
}

/// `tenant`'s whole files as `query` asks, and whether more follow.
pub(super) fn files(conn: &Connection, tenant: &str, query: &FileQuery) -> Result<(Vec<FileInfo>, bool), StoreError> {
    // Ids begin with their creation time, so their order is the upload order.
    let sql = match query.ascending {
        true => {
            "SELECT id, purpose, filename, bytes, created_at FROM files
             WHERE tenant = ?1 AND length(content) = bytes AND (?2 IS NULL OR purpose = ?2)
               AND (?3 IS NULL OR id > ?3) ORDER BY id ASC LIMIT ?4"
        }
        false => {
            "SELECT id, purpose, filename, bytes, created_at FROM files
             WHERE tenant = ?1 AND length(content) = bytes AND (?2 IS NULL OR purpose = ?2)
               AND (?3 IS NULL OR id < ?3) ORDER BY id DESC LIMIT ?4"
        }
    };
    let mut found = conn
        .prepare_cached(sql)?
        .query_map(
            params![tenant, query.purpose, query.after, (query.limit + 1) as i64],
            file_info,
        )?
        .collect::<Result<Vec<_>, _>>()?;
    let more = found.len() > query.limit;
    found.truncate(query.limit);
    Ok((found, more))
}

/// Deletes `tenant`'s file `id` (and any chunks of it); whether there was one.
pub(super) fn delete_file(conn: &Connection, id: &str, tenant: &str) -> Result<bool, StoreError> {
    let deleted = conn
        .prepare_cached("DELETE FROM files WHERE id = ?1 AND tenant = ?2")?
        .execute([id, tenant])?;
    let chunks = conn
        .prepare_cached("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'file_chunks'")?
        .exists([])?;
    if chunks {
        conn.prepare_cached("DELETE FROM file_chunks WHERE id = ?1")?
            .execute([id])?;
    }
    Ok(deleted > 0)
}

/// A file's content, when it is `tenant`'s.
pub(super) fn content(conn: &Connection, id: &str, tenant: &str) -> Result<Option<Vec<u8>>, StoreError> {
    Ok(conn
        .prepare_cached("SELECT content FROM files WHERE id = ?1 AND tenant = ?2 AND length(content) = bytes")?
        .query_row([id, tenant], |r| r.get(0))
        .optional()?)
}

/// `len` bytes of a file's content from `offset`, when it is `tenant`'s and whole; read
/// in place (SQLite's incremental blob I/O), so only those bytes are loaded.
pub(super) fn content_range(
    conn: &Connection,
    (id, tenant): (&str, &str),
    offset: u64,
    len: u64,
) -> Result<Option<Vec<u8>>, StoreError> {
    let row: Option<(i64, i64)> = conn
        .prepare_cached("SELECT rowid, bytes FROM files WHERE id = ?1 AND tenant = ?2 AND length(content) = bytes")?
        .query_row([id, tenant], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?;
    let Some((rowid, bytes)) = row else {
        return Ok(None);
    };
    let end = offset.saturating_add(len);
    if end > u64::try_from(bytes).unwrap_or(0) {
        return Ok(None);
    }
    let blob = conn.blob_open(rusqlite::MAIN_DB, "files", "content", rowid, true)?;
    let (Ok(at), Ok(len)) = (usize::try_from(offset), usize::try_from(len)) else {
        return Ok(None);
    };
    let mut chunk = vec![0; len];
    blob.read_at_exact(&mut chunk, at)?;
    Ok(Some(chunk))
}

/// Creates a batch and its jobs in the current commit (an idempotency key seen before
/// returns the earlier batch); refuses when its jobs would pass `max` unfinished.
pub(super) fn create(
    conn: &Connection,
    batch: NewBatch,
    max: u64,
    unfinished: &AtomicI64,
    now: i64,
) -> Result<Submitted, StoreError> {
    if let Some(key) = &batch.idempotency_key {
        if let Some((id, stored)) = keyed(conn, "batches", key)? {
            return Ok(Submitted::earlier(id, Some(&stored), key));
        }
    }
    let held = unfinished.load(Ordering::Acquire).max(0) as u64;
    if held.saturating_add(batch.jobs.len() as u64) > max {
        return Err(StoreError::Full(held));
    }
    let id = super::new_id("batch");
    insert_row(conn, &BatchRow::new(id.clone(), &batch, now))?;
    if !batch.errors.is_empty() {
        return Ok(Submitted::new(id));
    }
    let mut add = conn.prepare_cached(
        "INSERT INTO jobs (id, route, method, path, headers, body, state, created_at, expires_at, batch_id, custom_id,
                           line, tenant, shadow)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, 'queued', ?7, ?8, ?9, ?10, ?11, ?12, ?13)",
    )?;
    let count = batch.jobs.len();
    for (custom_id, line, job) in batch.jobs {
        add.execute(params![
            super::new_id("job"),
            job.route,
            job.method,
            job.path,
            serde_json::to_string(&job.headers).unwrap_or_else(|_| "[]".into()),
            &job.body[..],
            now,
            batch.expires_at,
            id,
            custom_id,
            line as i64,
            batch.tenant,
            job.shadow,
        ])?;
    }
    unfinished.fetch_add(count as i64, Ordering::AcqRel);
    Ok(Submitted::new(id))
}

/// Inserts a batch's row unless it is there; `failed` at once when it has errors.
pub(super) fn insert_row(conn: &Connection, row: &BatchRow) -> Result<(), StoreError> {
    let failed = !row.errors.is_empty();
    let errors = failed.then(|| json!({"object": "list", "data": row.errors}).to_string());
    conn.prepare_cached(
        "INSERT OR IGNORE INTO batches (id, input_file_id, endpoint, completion_window, metadata, status, created_at,
                                        expires_at, in_progress_at, failed_at, errors, idempotency_key, requests, tenant,
                                        shadow, precompute_ms)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16)",
    )?
    .execute(params![
        row.id,
        row.input_file_id,
        row.endpoint,
        row.completion_window,
        row.metadata.clone().map(|m| Value::Object(m).to_string()),
        if failed { "failed" } else { "in_progress" },
        row.created_at,
        row.expires_at,
        (!failed).then_some(row.created_at),
        failed.then_some(row.created_at),
        errors,
        row.idempotency_key,
        row.requests as i64,
        row.tenant,
        row.shadow,
        row.precompute_ms.map(|ms| i64::try_from(ms).unwrap_or(i64::MAX)),
    ])?;
    Ok(())
}

/// Batch `id`'s row as created (with `cancelling_at` once asked).
#[cfg(feature = "kafka")]
pub(super) fn row(conn: &Connection, id: &str) -> Result<Option<BatchRow>, StoreError> {
    let found = conn
        .prepare_cached(
            "SELECT id, input_file_id, endpoint, completion_window, metadata, created_at, expires_at, idempotency_key,
                    requests, errors, cancelling_at, tenant, shadow, precompute_ms FROM batches WHERE id = ?1",
        )?
        .query_row([id], |r| {
            let metadata = r
                .get::<_, Option<String>>(4)?
                .and_then(|m| serde_json::from_str::<Map<String, Value>>(&m).ok());
            let errors = r
                .get::<_, Option<String>>(9)?
                .and_then(|e| serde_json::from_str::<Value>(&e).ok())
                .and_then(|e| e.get("data").and_then(Value::as_array).cloned())
                .unwrap_or_default();
            Ok(BatchRow {
                id: r.get(0)?,
                input_file_id: r.get(1)?,
                endpoint: r.get(2)?,
                completion_window: r.get(3)?,
                metadata,
                created_at: r.get(5)?,
                expires_at: r.get(6)?,
                idempotency_key: r.get(7)?,
                tenant: r.get(11)?,
                requests: r.get::<_, Option<i64>>(8)?.unwrap_or(0).max(0) as u64,
                errors,
                cancelling_at: r.get(10)?,
                shadow: r.get(12)?,
                precompute_ms: r.get::<_, Option<i64>>(13)?.map(i64::unsigned_abs),
            })
        })
        .optional()?;
    Ok(found)
}

/// Marks a batch cancelling (and nothing else: its jobs' cancellations are their own).
pub(super) fn mark_cancelling(conn: &Connection, id: &str, at: i64) -> Result<bool, StoreError> {
    Ok(conn.execute(
        "UPDATE batches SET status = 'cancelling', cancelling_at = ?2 WHERE id = ?1 AND status IN ('validating', 'in_progress')",
        params![id, at],
    )? == 1)
}

/// Batch `id` with its jobs counted, when it is `tenant`'s.
pub(super) fn get(conn: &Connection, id: &str, tenant: &str) -> Result<Option<Batch>, StoreError> {
    let row = conn
        .prepare_cached("SELECT * FROM batches WHERE id = ?1 AND tenant = ?2")?
        .query_row([id, tenant], batch)
        .optional()?;
    let Some(mut batch) = row else { return Ok(None) };
    batch.counts = counts(conn, id)?;
    if batch.counts.waiting > 0 {
        batch.waiting = conn
            .prepare_cached(
                "SELECT error FROM jobs WHERE batch_id = ?1 AND state = 'queued' AND error LIKE 'waiting: %' LIMIT 1",
            )?
            .query_row([id], |r| r.get::<_, Option<String>>(0))
            .optional()?
            .flatten();
    }
    Ok(Some(batch))
}

/// `tenant`'s batches (every tenant's when `None`), newest first, after (older than)
/// `after`, at most `limit`; and whether more exist.
pub(super) fn list(
    conn: &Connection,
    tenant: Option<&str>,
    after: Option<&str>,
    limit: usize,
) -> Result<(Vec<Batch>, bool), StoreError> {
    let mut stmt = conn.prepare_cached(
        "SELECT id, tenant FROM batches WHERE (?1 IS NULL OR tenant = ?1) AND (?2 IS NULL OR id < ?2)
         ORDER BY id DESC LIMIT ?3",
    )?;
    let ids = stmt
        .query_map(params![tenant, after, (limit + 1) as i64], |r| {
            Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?))
        })?
        .collect::<Result<Vec<_>, _>>()?;
    let more = ids.len() > limit;
    let mut out = Vec::with_capacity(limit);
    for (id, owner) in ids.iter().take(limit) {
        if let Some(b) = get(conn, id, owner)? {
            out.push(b);
        }
    }
    Ok((out, more))
}

/// Whose batch `id` is, if there is one.
pub(super) fn owner(conn: &Connection, id: &str) -> Result<Option<String>, StoreError> {
    Ok(conn
        .prepare_cached("SELECT tenant FROM batches WHERE id = ?1")?
        .query_row([id], |r| r.get(0))
        .optional()?)
}

/// Starts cancelling `tenant`'s batch `id`: its queued jobs are cancelled now; running
/// ones finish. Returns the batch, or `None` when unknown (or another tenant's).
pub(super) fn cancel(
    conn: &Connection,
    id: &str,
    tenant: &str,
    now: i64,
    unfinished: &AtomicI64,
) -> Result<Option<Batch>, StoreError> {
    if get(conn, id, tenant)?.is_none() {
        return Ok(None);
    }
    if mark_cancelling(conn, id, now)? {
        let jobs = conn.execute(
            "UPDATE jobs SET state = 'cancelled', finished_at = ?2 WHERE batch_id = ?1 AND state = 'queued'",
            params![id, now],
        )?;
        unfinished.fetch_sub(jobs as i64, Ordering::AcqRel);
    }
    get(conn, id, tenant)
}

/// Finishes every batch whose jobs are all there and done: writes its output and error
/// files and moves it to `completed`, `cancelled` or `expired`. Returns how many it
/// finished. The files' ids follow from the batch's, so every replica of a Kafka queue,
/// finalizing on its own, names them alike.
pub(super) fn finalize(conn: &Connection, now: i64) -> Result<usize, StoreError> {
    let ready: Vec<(String, String, i64, String, bool)> = conn
        .prepare_cached(
            "SELECT b.id, b.status, b.expires_at, b.tenant, b.shadow FROM batches b
             WHERE b.status IN ('in_progress', 'cancelling')
               AND (b.requests IS NULL OR b.requests = (SELECT COUNT(*) FROM jobs j WHERE j.batch_id = b.id))
               AND NOT EXISTS (SELECT 1 FROM jobs j WHERE j.batch_id = b.id AND j.state IN ('queued', 'running'))",
        )?
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?)))?
        .collect::<Result<_, _>>()?;
    for (id, status, expires_at, tenant, shadow) in &ready {
        let Results {
            output,
            errors,
            comparison,
            summary,
        } = results(conn, id, *shadow)?;
        // A result file `what` of the batch, when it has content: its id.
        let keep = |what: &str, content: &[u8]| -> Result<Option<String>, StoreError> {
            if content.is_empty() {
                return Ok(None);
            }
            let filename = format!("{id}_{what}.jsonl");
            let file = NewFile {
                tenant,
                purpose: "batch_output",
                filename: &filename,
            };
            let id = format!("file_{}_{what}", id.trim_start_matches("batch_"));
            Ok(Some(add_file_as(conn, id, file, content, now)?.id))
        };
        let (output_id, error_id) = (keep("output", &output)?, keep("error", &errors)?);
        if *shadow {
            conn.execute(
                "UPDATE batches SET comparison_file_id = ?2, shadow_summary = ?3 WHERE id = ?1",
                params![id, keep("comparison", &comparison)?, summary.to_json().to_string()],
            )?;
        }
        let (end, column) = match (status.as_str(), *expires_at <= now) {
            ("cancelling", _) => ("cancelled", "cancelled_at"),
            (_, true) => ("expired", "expired_at"),
            _ => ("completed", "completed_at"),
        };
        conn.execute(
            &format!(
                "UPDATE batches SET status = ?2, finalizing_at = ?3, {column} = ?3, output_file_id = ?4, error_file_id = ?5
                 WHERE id = ?1"
            ),
            params![id, end, now, output_id, error_id],
        )?;
    }
    Ok(ready.len())
}

/// A batch's result files' content, and for a shadow batch its summary.
#[derive(Default)]
struct Results {
    output: Vec<u8>,
    errors: Vec<u8>,
    comparison: Vec<u8>,
    summary: Summary,
}

/// The output and error JSONL of a batch, in input line order; for a `shadow` batch,
/// its comparison JSONL (every line, compared or with why not) and summary too.
fn results(conn: &Connection, batch: &str, shadow: bool) -> Result<Results, StoreError> {
    let mut stmt = conn.prepare_cached(
        "SELECT id, custom_id, state, status, answer_body, error, comparison, answer_headers FROM jobs
         WHERE batch_id = ?1 ORDER BY line",
    )?;
    let mut rows = stmt.query([batch])?;
    let mut out = Results::default();
    while let Some(r) = rows.next()? {
        let id: String = r.get(0)?;
        let custom_id: String = r.get(1)?;
        let state = State::parse(&r.get::<_, String>(2)?).unwrap_or(State::Failed);
        let status: Option<u16> = r.get(3)?;
        let body: Option<Vec<u8>> = r.get(4)?;
        let error: Option<String> = r.get(5)?;
        let response = status.map(|status| {
            let body = body.unwrap_or_default();
            let body = serde_json::from_slice::<Value>(&body)
                .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&body).into_owned()));
            let mut response = json!({"status_code": status, "request_id": id, "body": body});
            // Which micro-batch (and backend call) produced the answer, when one did.
            let headers = super::jobs::headers_from(r.get(7).ok().flatten());
            if let Some((_, batch)) = headers.iter().find(|(k, _)| k == crate::headers::BATCH_ID.as_str()) {
                response["batch_id"] = Value::from(batch.as_str());
            }
            response
        });
        let failure = match (state, &response) {
            (State::Succeeded, _) => None,
            (State::Failed, Some(_)) => None,
            (State::Cancelled, _) => Some((
                "batch_cancelled",
                "the batch was cancelled before this request ran".into(),
            )),
            (State::Expired, _) => Some(("batch_expired", "the batch expired before this request ran".into())),
            _ => Some(("request_failed", error.unwrap_or_else(|| "the request failed".into()))),
        };
        let line = json!({
            "id": format!("batch_req_{}", id.trim_start_matches("job_")),
            "custom_id": &custom_id,
            "response": response,
            "error": failure.map(|(code, message)| json!({"code": code, "message": message})),
        });
        let target = match (state, status) {
            (State::Succeeded, _) => &mut out.output,
            _ => &mut out.errors,
        };
        target.extend_from_slice(line.to_string().as_bytes());
        target.push(b'\n');
        if shadow {
            let comparison: Option<String> = r.get(6)?;
            let scored = comparison.map_or_else(|| Scored::not_compared(NO_ANSWER), |c| Scored::from_text(&c));
            out.summary.add(&scored);
            let mut line = serde_json::to_value(&scored).unwrap_or_else(|_| json!({}));
            line["id"] = json!(format!("batch_req_{}", id.trim_start_matches("job_")));
            line["custom_id"] = json!(custom_id);
            line["primary_status"] = json!(status);
            out.comparison.extend_from_slice(line.to_string().as_bytes());
            out.comparison.push(b'\n');
        }
    }
    Ok(out)
}

/// Batch `batch`'s jobs by outcome.
fn counts(conn: &Connection, batch: &str) -> Result<Counts, StoreError> {
    let mut stmt = conn.prepare_cached(
        "SELECT state, state = 'queued' AND IFNULL(error, '') LIKE 'waiting: %', COUNT(*), \
         IFNULL(SUM(prompt_tokens), 0), IFNULL(SUM(completion_tokens), 0) FROM jobs WHERE batch_id = ?1 GROUP BY 1, 2",
    )?;
    let rows = stmt.query_map([batch], |r| {
        let n = |i: usize| r.get::<_, i64>(i).map(|v| v.max(0) as u64);
        Ok((r.get::<_, String>(0)?, r.get::<_, bool>(1)?, n(2)?, [n(3)?, n(4)?]))
    })?;
    let mut counts = Counts::default();
    for row in rows {
        let (state, waiting, n, tokens) = row?;
        counts.total += n;
        counts.tokens[0] += tokens[0];
        counts.tokens[1] += tokens[1];
        match State::parse(&state) {
            Some(State::Succeeded) => counts.completed += n,
            Some(State::Failed | State::Expired | State::Cancelled) => counts.failed += n,
            Some(State::Queued) if waiting => counts.waiting += n,
            _ => {}
        }
    }
    Ok(counts)
}

/// A batch from its row (`SELECT *`), its counts not yet read.
fn batch(r: &Row<'_>) -> rusqlite::Result<Batch> {
    let parse = |text: Option<String>| text.and_then(|t| serde_json::from_str::<Value>(&t).ok());
    let shadow = match r.get::<_, bool>("shadow")? {
        true => Some((r.get("comparison_file_id")?, parse(r.get("shadow_summary")?))),
        false => None,
    };
    Ok(Batch {
        id: r.get("id")?,
        tenant: r.get("tenant")?,
        endpoint: r.get("endpoint")?,
        errors: parse(r.get("errors")?),
        input_file_id: r.get("input_file_id")?,
        completion_window: r.get("completion_window")?,
        status: r.get("status")?,
        output_file_id: r.get("output_file_id")?,
        error_file_id: r.get("error_file_id")?,
        created_at: r.get("created_at")?,
        in_progress_at: r.get("in_progress_at")?,
        expires_at: r.get("expires_at")?,
        finalizing_at: r.get("finalizing_at")?,
        completed_at: r.get("completed_at")?,
        failed_at: r.get("failed_at")?,
        expired_at: r.get("expired_at")?,
        cancelling_at: r.get("cancelling_at")?,
        cancelled_at: r.get("cancelled_at")?,
        metadata: parse(r.get("metadata")?),
        precompute: r
            .get::<_, Option<i64>>("precompute_ms")?
            .map(|ms| Duration::from_millis(ms.unsigned_abs())),
        shadow,
        counts: Counts::default(),
        waiting: None,
    })
}
