//! The jobs table and every statement on it. Each function runs on the store's writer
//! thread inside the current transaction (see [`super::embedded`]).

use std::sync::atomic::{AtomicI64, Ordering};

use bytes::Bytes;
use rusqlite::{params, Connection, OptionalExtension, Row};

use super::{Answer, Finish, Job, NewJob, State, StoreError, Submitted};

/// Creates the tables and indexes when missing.
pub(super) fn schema(conn: &Connection) -> Result<(), StoreError> {
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS jobs (
            id TEXT PRIMARY KEY,
            route TEXT NOT NULL,
            method TEXT NOT NULL,
            path TEXT NOT NULL,
            headers TEXT NOT NULL,
            body BLOB NOT NULL,
            state TEXT NOT NULL,
            attempts INTEGER NOT NULL DEFAULT 0,
            not_before INTEGER NOT NULL DEFAULT 0,
            created_at INTEGER NOT NULL,
            expires_at INTEGER NOT NULL,
            finished_at INTEGER,
            status INTEGER,
            answer_headers TEXT,
            answer_body BLOB,
            error TEXT,
            idempotency_key TEXT UNIQUE,
            batch_id TEXT,
            custom_id TEXT,
            line INTEGER,
            tenant TEXT NOT NULL DEFAULT '',
            shadow INTEGER NOT NULL DEFAULT 0,
            comparison TEXT
        );
        CREATE INDEX IF NOT EXISTS jobs_runnable ON jobs (state, route, not_before);
        CREATE INDEX IF NOT EXISTS jobs_finished ON jobs (finished_at) WHERE finished_at IS NOT NULL;
        CREATE INDEX IF NOT EXISTS jobs_queued_age ON jobs (created_at) WHERE state = 'queued';",
    )?;
    // Stores made before tenants, and before shadow batches.
    add_column(conn, "jobs", "tenant", "TEXT NOT NULL DEFAULT ''")?;
    add_column(conn, "jobs", "shadow", "INTEGER NOT NULL DEFAULT 0")?;
    add_column(conn, "jobs", "comparison", "TEXT")?;
    // And before LLM answers' tokens were kept.
    add_column(conn, "jobs", "prompt_tokens", "INTEGER")?;
    add_column(conn, "jobs", "completion_tokens", "INTEGER")
}

/// The tokens an answer's `usage` counts (an LLM's), for its job's row.
pub(super) fn tokens(status: u16, body: &[u8]) -> (Option<i64>, Option<i64>) {
    let usage = (200..300)
        .contains(&status)
        .then(|| crate::llm::openai::Usage::of(body))
        .flatten();
    let n = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    (usage.map(|u| n(u.prompt)), usage.map(|u| n(u.completion)))
}

/// Adds `column` to `table` in stores made before it existed.
pub(super) fn add_column(conn: &Connection, table: &str, column: &str, declaration: &str) -> Result<(), StoreError> {
    let there: bool = conn.query_row(
        &format!("SELECT COUNT(*) > 0 FROM pragma_table_info('{table}') WHERE name = ?1"),
        [column],
        |r| r.get(0),
    )?;
    if !there {
        conn.execute_batch(&format!("ALTER TABLE {table} ADD COLUMN {column} {declaration}"))?;
    }
    Ok(())
}

/// The id and stored key of the row of `table` whose idempotency key has the scope of
/// `key` (see [`super::idempotency_key`]).
pub(super) fn keyed(conn: &Connection, table: &str, key: &str) -> Result<Option<(String, String)>, StoreError> {
    let scope = super::idempotency_scope(key);
    Ok(conn
        .prepare_cached(&format!(
            "SELECT id, idempotency_key FROM {table} WHERE idempotency_key >= ?1 AND idempotency_key < ?2"
        ))?
        .query_row(params![format!("{scope}:"), format!("{scope};")], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .optional()?)
}

/// Jobs not yet finished (queued or running).
pub(super) fn unfinished(conn: &Connection) -> Result<i64, StoreError> {
    Ok(conn.query_row(
        "SELECT COUNT(*) FROM jobs WHERE state IN ('queued', 'running')",
        [],
        |r| r.get(0),
    )?)
}

/// Queues again every job left running by a process that stopped.
pub(super) fn requeue_running(conn: &Connection) -> Result<usize, StoreError> {
    Ok(conn.execute("UPDATE jobs SET state = 'queued' WHERE state = 'running'", [])?)
}

/// Inserts `new` (an idempotency key seen before returns the earlier job instead);
/// refuses the whole submission when it would pass `max` unfinished jobs.
pub(super) fn insert(
    conn: &Connection,
    new: Vec<NewJob>,
    max: u64,
    unfinished: &AtomicI64,
    now: i64,
) -> Result<Vec<Submitted>, StoreError> {
    let held = unfinished.load(Ordering::Acquire).max(0) as u64;
    if held.saturating_add(new.len() as u64) > max {
        return Err(StoreError::Full(held));
    }
    let mut add = conn.prepare_cached(
        "INSERT INTO jobs (id, route, method, path, headers, body, state, created_at, expires_at, idempotency_key, tenant,
                           shadow)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, 'queued', ?7, ?8, ?9, ?10, ?11)",
    )?;
    let mut out = Vec::with_capacity(new.len());
    let mut added = 0;
    for job in new {
        if let Some(key) = &job.idempotency_key {
            if let Some((id, stored)) = keyed(conn, "jobs", key)? {
                out.push(Submitted::earlier(id, Some(&stored), key));
                continue;
            }
        }
        let id = super::new_id("job");
        add.execute(params![
            id,
            job.route,
            job.method,
            job.path,
            headers_json(&job.headers),
            &job.body[..],
            now,
            job.expires_at,
            job.idempotency_key,
            job.tenant,
            job.shadow,
        ])?;
        added += 1;
        out.push(Submitted::new(id));
    }
    unfinished.fetch_add(added, Ordering::AcqRel);
    Ok(out)
}

/// Hands up to `max` runnable jobs to a worker, oldest first, counting an attempt.
pub(super) fn lease(conn: &Connection, max: usize, now: i64) -> Result<Vec<Job>, StoreError> {
    let mut stmt = conn.prepare_cached(
        "UPDATE jobs SET state = 'running', attempts = attempts + 1
         WHERE id IN (SELECT id FROM jobs WHERE state = 'queued' AND not_before <= ?1 AND expires_at > ?1
                      ORDER BY id LIMIT ?2)
         RETURNING *",
    )?;
    let limit = i64::try_from(max).unwrap_or(i64::MAX);
    let mut jobs = stmt
        .query_map(params![now, limit], job)?
        .collect::<Result<Vec<_>, _>>()?;
    jobs.sort_by(|a, b| a.id.cmp(&b.id));
    Ok(jobs)
}

/// Like [`lease`], for `route`'s jobs only.
pub(super) fn lease_route(conn: &Connection, route: &str, max: usize, now: i64) -> Result<Vec<Job>, StoreError> {
    let mut stmt = conn.prepare_cached(
        "UPDATE jobs SET state = 'running', attempts = attempts + 1
         WHERE id IN (SELECT id FROM jobs WHERE state = 'queued' AND route = ?3 AND not_before <= ?1
                      AND expires_at > ?1 ORDER BY id LIMIT ?2)
         RETURNING *",
    )?;
    let limit = i64::try_from(max).unwrap_or(i64::MAX);
    let mut jobs = stmt
        .query_map(params![now, limit, route], job)?
        .collect::<Result<Vec<_>, _>>()?;
    jobs.sort_by(|a, b| a.id.cmp(&b.id));
    Ok(jobs)
}

/// Routes with jobs ready to run.
pub(super) fn runnable_routes(conn: &Connection, now: i64) -> Result<Vec<String>, StoreError> {
    let mut stmt = conn.prepare_cached(
        "SELECT DISTINCT route FROM jobs WHERE state = 'queued' AND not_before <= ?1 AND expires_at > ?1",
    )?;
    let routes = stmt
        .query_map([now], |r| r.get(0))?
        .collect::<Result<Vec<String>, _>>()?;
    Ok(routes)
}

/// Records how attempt `attempt` of `id` ended, if that attempt still holds the job.
pub(super) fn finish(
    conn: &Connection,
    id: &str,
    attempt: u32,
    finish: Finish,
    now: i64,
    unfinished: &AtomicI64,
) -> Result<bool, StoreError> {
    let held = "WHERE id = ?1 AND state = 'running' AND attempts = ?2";
    let changed = match finish {
        Finish::Answered(answer) => {
            let state = match answer.status {
                200..=299 => State::Succeeded,
                _ => State::Failed,
            };
            let (prompt, completion) = tokens(answer.status, &answer.body);
            conn.prepare_cached(&format!(
                "UPDATE jobs SET state = ?3, finished_at = ?4, status = ?5, answer_headers = ?6, answer_body = ?7,
                 comparison = ?8, prompt_tokens = ?9, completion_tokens = ?10, error = NULL {held}"
            ))?
            .execute(params![
                id,
                attempt,
                state.as_str(),
                now,
                answer.status,
                headers_json(&answer.headers),
                &answer.body[..],
                answer.comparison,
                prompt,
                completion,
            ])?
        }
        Finish::Retry { error, not_before } => conn
            .prepare_cached(&format!(
                "UPDATE jobs SET state = 'queued', not_before = ?3, error = ?4 {held}"
            ))?
            .execute(params![id, attempt, not_before, error])?,
        Finish::Wait { reason, not_before } => conn
            .prepare_cached(&format!(
                "UPDATE jobs SET state = 'queued', attempts = attempts - 1, not_before = ?3, error = ?4 {held}"
            ))?
            .execute(params![id, attempt, not_before, reason])?,
        Finish::Failed { error } => conn
            .prepare_cached(&format!(
                "UPDATE jobs SET state = 'failed', finished_at = ?3, error = ?4 {held}"
            ))?
            .execute(params![id, attempt, now, error])?,
    };
    let terminal = changed == 1
        && conn.query_row("SELECT state FROM jobs WHERE id = ?1", [id], |r| r.get::<_, String>(0))? != "queued";
    if terminal {
        unfinished.fetch_sub(1, Ordering::AcqRel);
    }
    Ok(changed == 1)
}

/// The job `id`.
pub(super) fn get(conn: &Connection, id: &str) -> Result<Option<Job>, StoreError> {
    Ok(conn
        .prepare_cached("SELECT * FROM jobs WHERE id = ?1")?
        .query_row([id], job)
        .optional()?)
}

/// Cancels `id` unless it has finished; returns its state afterwards.
pub(super) fn cancel(
    conn: &Connection,
    id: &str,
    now: i64,
    unfinished: &AtomicI64,
) -> Result<Option<State>, StoreError> {
    let changed = conn.execute(
        "UPDATE jobs SET state = 'cancelled', finished_at = ?2 WHERE id = ?1 AND state IN ('queued', 'running')",
        params![id, now],
    )?;
    if changed == 1 {
        unfinished.fetch_sub(1, Ordering::AcqRel);
    }
    Ok(get(conn, id)?.map(|j| j.state))
}

/// Expires queued jobs whose window passed (when `expire`), deletes finished ones at
/// least `retention_ms` old (so 0 deletes every finished job), and resynchronises the unfinished count; returns (expired, deleted).
pub(super) fn sweep(
    conn: &Connection,
    now: i64,
    retention_ms: i64,
    expire: bool,
    unfinished: &AtomicI64,
) -> Result<(u64, u64), StoreError> {
    let expired = if !expire {
        0
    } else {
        conn.execute(
        "UPDATE jobs SET state = 'expired', finished_at = ?1, error = 'the completion window passed before the job ran'
         WHERE state = 'queued' AND expires_at <= ?1",
        [now],
    )?
    };
    let deleted = conn.execute(
        "DELETE FROM jobs WHERE finished_at IS NOT NULL AND finished_at <= ?1",
        [now.saturating_sub(retention_ms)],
    )?;
    unfinished.store(self::unfinished(conn)?, Ordering::Release);
    Ok((expired as u64, deleted as u64))
}

/// When a sweep next has work though nothing else changes (ms since the Unix epoch;
/// `i64::MAX` for never): the first queued job's expiry (when the sweep expires jobs)
/// and the first finished job's end of retention, whichever is sooner.
pub(super) fn next_due(conn: &Connection, retention_ms: i64, expire: bool) -> Result<i64, StoreError> {
    let expiry: Option<i64> = match expire {
        true => conn
            .prepare_cached("SELECT MIN(expires_at) FROM jobs WHERE state = 'queued'")?
            .query_row([], |r| r.get(0))?,
        false => None,
    };
    let finished: Option<i64> = conn
        .prepare_cached("SELECT MIN(finished_at) FROM jobs WHERE finished_at IS NOT NULL")?
        .query_row([], |r| r.get(0))?;
    let retained = finished.map(|at| at.saturating_add(retention_ms));
    Ok(expiry.into_iter().chain(retained).min().unwrap_or(i64::MAX))
}

/// Jobs by state.
pub(super) fn counts(conn: &Connection) -> Result<Vec<(State, u64)>, StoreError> {
    let mut stmt = conn.prepare_cached("SELECT state, COUNT(*) FROM jobs GROUP BY state")?;
    let rows = stmt.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))?;
    let mut out = Vec::new();
    for row in rows {
        let (state, n) = row?;
        if let Some(state) = State::parse(&state) {
            out.push((state, n.max(0) as u64));
        }
    }
    Ok(out)
}

/// When the oldest queued job was submitted (ms since the Unix epoch), if any is queued.
pub(super) fn oldest_queued(conn: &Connection) -> Result<Option<i64>, StoreError> {
    let mut stmt = conn.prepare_cached("SELECT MIN(created_at) FROM jobs WHERE state = 'queued'")?;
    Ok(stmt.query_row([], |r| r.get::<_, Option<i64>>(0))?)
}

fn headers_json(headers: &[(String, String)]) -> String {
    serde_json::to_string(headers).unwrap_or_else(|_| "[]".into())
}

pub(super) fn headers_from(text: Option<String>) -> Vec<(String, String)> {
    text.and_then(|t| serde_json::from_str(&t).ok()).unwrap_or_default()
}

fn job(r: &Row<'_>) -> rusqlite::Result<Job> {
    let state: String = r.get("state")?;
    let status: Option<u16> = r.get("status")?;
    let answer = match status {
        Some(status) => Some(Answer {
            status,
            headers: headers_from(r.get("answer_headers")?),
            body: Bytes::from(r.get::<_, Option<Vec<u8>>>("answer_body")?.unwrap_or_default()),
            comparison: r.get("comparison")?,
        }),
        None => None,
    };
    Ok(Job {
        id: r.get("id")?,
        request: NewJob {
            route: r.get("route")?,
            method: r.get("method")?,
            path: r.get("path")?,
            headers: headers_from(r.get("headers")?),
            body: Bytes::from(r.get::<_, Vec<u8>>("body")?),
            expires_at: r.get("expires_at")?,
            idempotency_key: r.get("idempotency_key")?,
            tenant: r.get("tenant")?,
            shadow: r.get("shadow")?,
        },
        state: State::parse(&state).unwrap_or(State::Failed),
        attempts: r.get("attempts")?,
        created_at: r.get("created_at")?,
        finished_at: r.get("finished_at")?,
        answer,
        error: r.get("error")?,
    })
}
