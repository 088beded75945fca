//! The embedded store: one SQLite file (`offline.db` under the data directory) owned by
//! one writer thread.
//!
//! Every operation is a closure sent to the writer. The writer takes whatever has
//! arrived (up to 1,024 operations), runs each inside its own savepoint within one
//! transaction, commits once, and only then answers them all: many concurrent
//! submissions share one fsync (group commit), and nobody is told "accepted" before
//! the commit is durable (WAL with `synchronous = FULL`). The file is opened in
//! exclusive locking mode, so two gateways can never share it. Temporary data
//! (statement journals of large updates, sorts) stays in memory: a container's root
//! file system is often read-only, and SQLite's temporary files would otherwise fail
//! there. A commit that fails marks the store as failing (readiness says so, the cause
//! is logged once) until one succeeds again.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use rusqlite::Connection;
use tokio::sync::{mpsc, oneshot};

use super::batches::{self, Batch, FileInfo, FileQuery, NewBatch};
use super::{jobs, Finish, Job, JobStore, NewJob, State, StoreError, Submitted};

/// Most operations in one commit.
const GROUP: usize = 1024;
/// Operations that may wait for the writer; beyond, callers wait to send.
const BACKLOG: usize = 65_536;

/// Limits the store enforces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Unfinished (queued or running) jobs before submissions are refused.
    pub max_unfinished: u64,
    /// The writer thread's nice value (see [`crate::cpu`]); 0 leaves it.
    pub writer_nice: i32,
    /// The CPUs the writer thread runs on; empty leaves it to the operating system.
    pub writer_cpus: crate::cpu::CpuList,
}

/// How an operation is answered once its commit's outcome is known.
type Acknowledge = Box<dyn FnOnce(Result<(), StoreError>) + Send>;
/// An operation: run against the connection inside the open transaction, or (`None`)
/// told that no transaction could begin; either way it returns how to answer once the
/// commit's outcome is known, and its own failure, if any.
type Op = Box<dyn FnOnce(Option<&Connection>) -> (Acknowledge, Option<StoreError>) + Send>;

/// The embedded store; cheap to clone.
#[derive(Clone)]
pub struct Embedded {
    ops: mpsc::Sender<Op>,
    limits: Limits,
    path: Arc<PathBuf>,
    /// Unfinished jobs, kept by the writer's operations and recounted on every sweep.
    unfinished: Arc<AtomicI64>,
    /// Why the last commit failed, until one succeeds.
    failing: Arc<Failing>,
    /// What the upkeep (sweeps, the gauges' counts) last saw, so an idle store costs
    /// nothing: no statement runs while nothing has changed and nothing falls due.
    upkeep: Arc<Upkeep>,
}

/// The upkeep's memory of the store (see [`Embedded::sweep_with`], `counts`).
#[derive(Debug, Default)]
struct Upkeep {
    /// Operations sent to the writer since the store opened, but the upkeep's own.
    changes: AtomicU64,
    /// At the last sweep: the count of changes, and when a sweep next has work even if
    /// nothing changes (the first queued job's expiry, the first finished job's end of
    /// retention; ms since the Unix epoch).
    swept: Mutex<Option<(u64, i64)>>,
    /// The last counts by state and the oldest queued job, at their count of changes.
    counted: AtChange<Vec<(State, u64)>>,
    oldest: AtChange<Option<i64>>,
    /// Statements the upkeep has run (its tests read it).
    statements: AtomicU64,
}

/// A value the upkeep read, with the count of changes it was read at.
type AtChange<T> = Mutex<Option<(u64, T)>>;

/// Held by the tests that make a store fail, so they do not run at once: one of them
/// counts the log lines a failing store writes, and `tracing` decides once per call
/// site, across threads, whether a line is wanted.
#[cfg(test)]
pub(crate) static ABORTING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Why the store's last commit failed, if it did; the cause is logged when the store
/// starts failing and again when it recovers, never once per operation.
#[derive(Debug)]
struct Failing {
    path: PathBuf,
    cause: Mutex<Option<String>>,
}

impl std::fmt::Debug for Embedded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Embedded").field("path", &self.path).finish()
    }
}

impl Embedded {
    /// Opens (creating if needed) `dir/offline.db`, queues again every job that was
    /// running when the last process stopped, and starts the writer thread.
    pub fn open(dir: &Path, limits: Limits) -> Result<Embedded, StoreError> {
        Self::open_file(dir, "offline.db", "FULL", limits)
    }

    /// Opens a fresh, empty store at `dir/view.db` (any earlier one is removed) for
    /// state that is rebuilt at every start: the Kafka queue's view of its state topic.
    /// Nothing in it needs to survive a crash, so commits are not synced.
    pub fn open_view(dir: &Path, limits: Limits) -> Result<Embedded, StoreError> {
        for file in ["view.db", "view.db-wal", "view.db-shm"] {
            match std::fs::remove_file(dir.join(file)) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(StoreError::Io(format!("cannot remove the old {file}: {e}")))
                }
                _ => {}
            }
        }
        Self::open_file(dir, "view.db", "OFF", limits)
    }

    fn open_file(dir: &Path, name: &str, synchronous: &str, limits: Limits) -> Result<Embedded, StoreError> {
        crate::files::private_dir(dir)
            .map_err(|e| StoreError::Io(format!("cannot create the data directory {}: {e}", dir.display())))?;
        let path = dir.join(name);
        crate::files::private_touch(&path).map_err(|e| StoreError::Io(format!("{}: {e}", path.display())))?;
        let conn = Connection::open(&path).map_err(|e| StoreError::Io(format!("{}: {e}", path.display())))?;
        // The exclusive lock is taken by the first statement that needs the file (here
        // setting WAL, then the first read): they fail busy when another process has it.
        let held = |e: rusqlite::Error| match &e {
            rusqlite::Error::SqliteFailure(code, _)
                if matches!(
                    code.code,
                    rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked
                ) =>
            {
                StoreError::Io(format!(
                    "{} is in use by another gateway (it holds the store's lock): give each gateway a data \
                     directory of its own (--data-dir, TIERGATE_DATA_DIR), or stop the other one",
                    path.display()
                ))
            }
            _ => StoreError::from(e),
        };
        conn.execute_batch(&format!(
            "PRAGMA locking_mode = EXCLUSIVE;
             PRAGMA journal_mode = WAL;
             PRAGMA synchronous = {synchronous};
             PRAGMA temp_store = MEMORY;
             PRAGMA foreign_keys = ON;"
        ))
        .map_err(held)?;
        conn.query_row("SELECT count(*) FROM sqlite_master", [], |r| r.get::<_, i64>(0))
            .map_err(held)?;
        jobs::schema(&conn)?;
        batches::schema(&conn)?;
        let requeued = jobs::requeue_running(&conn)?;
        let unfinished = Arc::new(AtomicI64::new(jobs::unfinished(&conn)?));
        if requeued > 0 {
            tracing::info!(
                requeued,
                "jobs that were running when the gateway stopped are queued again"
            );
        }
        let (ops, rx) = mpsc::channel(BACKLOG);
        let (cpus, nice) = (limits.writer_cpus.clone(), limits.writer_nice);
        let failing = Arc::new(Failing {
            path: path.clone(),
            cause: Mutex::new(None),
        });
        let writes = failing.clone();
        // The writer logs where the opener does (the global subscriber, or a test's).
        let logs = tracing::dispatcher::get_default(Clone::clone);
        std::thread::Builder::new()
            .name("tiergate-store".into())
            .spawn(move || {
                cpus.pin_this_thread();
                crate::cpu::lower_this_thread(nice);
                tracing::dispatcher::with_default(&logs, || writer(conn, rx, &writes))
            })
            .map_err(|e| StoreError::Io(format!("cannot start the store's writer thread: {e}")))?;
        Ok(Embedded {
            ops,
            limits,
            path: Arc::new(path),
            unfinished,
            failing,
            upkeep: Arc::default(),
        })
    }

    /// Runs an operation after which SQLite has rolled the transaction back, as an I/O
    /// error or a full disk makes it do; its error says `simulated`. For tests, which
    /// hold [`ABORTING`] meanwhile.
    #[cfg(test)]
    pub(crate) async fn abort_a_commit(&self) -> Result<(), StoreError> {
        self.call(|conn| -> Result<(), StoreError> {
            conn.execute_batch("ROLLBACK")?;
            Err(StoreError::Io("disk I/O error (simulated)".into()))
        })
        .await
    }

    /// Runs `f` in the writer's next commit and returns its result once durable.
    pub async fn call<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    {
        self.run(f, false).await
    }

    /// Sends `f` to the writer and waits for its result, once durable. The upkeep's own
    /// statements (`upkeep`) are counted as such, every other operation as a change.
    async fn run<T, F>(&self, f: F, upkeep: bool) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    {
        match upkeep {
            true => self.upkeep.statements.fetch_add(1, Ordering::Relaxed),
            false => self.upkeep.changes.fetch_add(1, Ordering::AcqRel),
        };
        let (tx, rx) = oneshot::channel();
        let op: Op = Box::new(move |conn| {
            let result = match conn {
                Some(conn) => savepoint(conn, f),
                None => Err(StoreError::Io("no transaction could begin".into())),
            };
            let failed = result.as_ref().err().cloned();
            let reply: Acknowledge = Box::new(move |committed: Result<(), StoreError>| {
                let _ = tx.send(committed.and(result));
            });
            (reply, failed)
        });
        self.ops.send(op).await.map_err(|_| StoreError::Closed)?;
        rx.await.map_err(|_| StoreError::Closed)?
    }

    /// The count of unfinished jobs the store keeps (for a view that applies records).
    #[cfg(feature = "kafka")]
    pub(super) fn unfinished(&self) -> &Arc<AtomicI64> {
        &self.unfinished
    }

    /// Marks queued jobs whose window passed as expired (when `expire`: the Kafka
    /// queue's view leaves expiry to the state topic), deletes finished jobs older than
    /// `retention_ms`, and finalizes batches whose jobs are all done; returns (expired,
    /// deleted).
    /// A store that has not changed since the last sweep and has nothing falling due is
    /// not swept at all.
    pub async fn sweep_with(&self, retention_ms: i64, expire: bool) -> Result<(u64, u64), StoreError> {
        let changes = self.upkeep.changes.load(Ordering::Acquire);
        let swept = *self.upkeep.swept.lock().unwrap_or_else(|e| e.into_inner());
        if swept.is_some_and(|(seen, due)| seen == changes && super::now_ms() < due) {
            return Ok((0, 0));
        }
        let unfinished = self.unfinished.clone();
        let (expired, deleted, due) = self
            .run(
                move |conn| {
                    let now = super::now_ms();
                    let (expired, deleted) = jobs::sweep(conn, now, retention_ms, expire, &unfinished)?;
                    batches::finalize(conn, now)?;
                    let due = jobs::next_due(conn, retention_ms, expire)?;
                    Ok((expired, deleted, due))
                },
                true,
            )
            .await?;
        if expired + deleted > 0 {
            self.upkeep.changes.fetch_add(1, Ordering::AcqRel);
        }
        let changes = self.upkeep.changes.load(Ordering::Acquire);
        *self.upkeep.swept.lock().unwrap_or_else(|e| e.into_inner()) = Some((changes, due));
        Ok((expired, deleted))
    }
}

impl JobStore for Embedded {
    async fn submit(&self, new: Vec<NewJob>) -> Result<Vec<Submitted>, StoreError> {
        let (max, unfinished) = (self.limits.max_unfinished, self.unfinished.clone());
        self.call(move |conn| jobs::insert(conn, new, max, &unfinished, super::now_ms()))
            .await
    }

    async fn lease(&self, max: usize) -> Result<Vec<Job>, StoreError> {
        self.call(move |conn| jobs::lease(conn, max, super::now_ms())).await
    }

    async fn lease_route(&self, route: &str, max: usize) -> Result<Vec<Job>, StoreError> {
        let route = route.to_owned();
        self.call(move |conn| jobs::lease_route(conn, &route, max, super::now_ms()))
            .await
    }

    async fn runnable_routes(&self) -> Result<Vec<String>, StoreError> {
        // With nothing unfinished nothing can run: no statement.
        if self.unfinished.load(Ordering::Acquire) <= 0 {
            return Ok(Vec::new());
        }
        self.run(|conn| jobs::runnable_routes(conn, super::now_ms()), true)
            .await
    }

    async fn finish_all(&self, ends: Vec<(super::JobId, u32, Finish)>) -> Result<Vec<bool>, StoreError> {
        let unfinished = self.unfinished.clone();
        self.call(move |conn| {
            let now = super::now_ms();
            ends.into_iter()
                .map(|(id, attempt, finish)| jobs::finish(conn, &id, attempt, finish, now, &unfinished))
                .collect()
        })
        .await
    }

    async fn get(&self, id: &str) -> Result<Option<Job>, StoreError> {
        let id = id.to_owned();
        self.call(move |conn| jobs::get(conn, &id)).await
    }

    async fn cancel(&self, id: &str) -> Result<Option<State>, StoreError> {
        let (id, unfinished) = (id.to_owned(), self.unfinished.clone());
        self.call(move |conn| jobs::cancel(conn, &id, super::now_ms(), &unfinished))
            .await
    }

    async fn counts(&self) -> Result<Vec<(State, u64)>, StoreError> {
        let changes = self.upkeep.changes.load(Ordering::Acquire);
        if let Some((seen, counts)) = &*self.upkeep.counted.lock().unwrap_or_else(|e| e.into_inner()) {
            if *seen == changes {
                return Ok(counts.clone());
            }
        }
        let counts = self.run(jobs::counts, true).await?;
        *self.upkeep.counted.lock().unwrap_or_else(|e| e.into_inner()) = Some((changes, counts.clone()));
        Ok(counts)
    }

    async fn oldest_queued(&self) -> Result<Option<i64>, StoreError> {
        let changes = self.upkeep.changes.load(Ordering::Acquire);
        if let Some((seen, oldest)) = *self.upkeep.oldest.lock().unwrap_or_else(|e| e.into_inner()) {
            if seen == changes {
                return Ok(oldest);
            }
        }
        let oldest = self.run(jobs::oldest_queued, true).await?;
        *self.upkeep.oldest.lock().unwrap_or_else(|e| e.into_inner()) = Some((changes, oldest));
        Ok(oldest)
    }

    async fn add_file(
        &self,
        tenant: &str,
        purpose: String,
        filename: String,
        content: bytes::Bytes,
    ) -> Result<FileInfo, StoreError> {
        let tenant = tenant.to_owned();
        self.call(move |conn| {
            let file = batches::NewFile {
                tenant: &tenant,
                purpose: &purpose,
                filename: &filename,
            };
            batches::add_file(conn, file, &content, super::now_ms())
        })
        .await
    }

    async fn file(&self, id: &str, tenant: &str) -> Result<Option<FileInfo>, StoreError> {
        let (id, tenant) = (id.to_owned(), tenant.to_owned());
        self.call(move |conn| batches::file(conn, &id, &tenant)).await
    }

    async fn content(&self, id: &str, tenant: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let (id, tenant) = (id.to_owned(), tenant.to_owned());
        self.call(move |conn| batches::content(conn, &id, &tenant)).await
    }

    async fn content_range(
        &self,
        id: &str,
        tenant: &str,
        offset: u64,
        len: u64,
    ) -> Result<Option<Vec<u8>>, StoreError> {
        let (id, tenant) = (id.to_owned(), tenant.to_owned());
        self.call(move |conn| batches::content_range(conn, (&id, &tenant), offset, len))
            .await
    }

    async fn files(&self, tenant: &str, query: FileQuery) -> Result<(Vec<FileInfo>, bool), StoreError> {
        let tenant = tenant.to_owned();
        self.call(move |conn| batches::files(conn, &tenant, &query)).await
    }

    async fn delete_file(&self, id: &str, tenant: &str) -> Result<bool, StoreError> {
        let (id, tenant) = (id.to_owned(), tenant.to_owned());
        self.call(move |conn| batches::delete_file(conn, &id, &tenant)).await
    }

    async fn create_batch(&self, batch: NewBatch) -> Result<Submitted, StoreError> {
        let (max, unfinished) = (self.limits.max_unfinished, self.unfinished.clone());
        self.call(move |conn| batches::create(conn, batch, max, &unfinished, super::now_ms()))
            .await
    }

    async fn batch(&self, id: &str, tenant: &str) -> Result<Option<Batch>, StoreError> {
        let (id, tenant) = (id.to_owned(), tenant.to_owned());
        self.call(move |conn| batches::get(conn, &id, &tenant)).await
    }

    async fn batches(
        &self,
        tenant: &str,
        after: Option<String>,
        limit: usize,
    ) -> Result<(Vec<Batch>, bool), StoreError> {
        let tenant = tenant.to_owned();
        self.call(move |conn| batches::list(conn, Some(&tenant), after.as_deref(), limit))
            .await
    }

    async fn all_batches(&self, after: Option<String>, limit: usize) -> Result<(Vec<Batch>, bool), StoreError> {
        self.call(move |conn| batches::list(conn, None, after.as_deref(), limit))
            .await
    }

    async fn batch_owner(&self, id: &str) -> Result<Option<String>, StoreError> {
        let id = id.to_owned();
        self.call(move |conn| batches::owner(conn, &id)).await
    }

    async fn cancel_batch(&self, id: &str, tenant: &str) -> Result<Option<Batch>, StoreError> {
        let (id, tenant, unfinished) = (id.to_owned(), tenant.to_owned(), self.unfinished.clone());
        self.call(move |conn| batches::cancel(conn, &id, &tenant, super::now_ms(), &unfinished))
            .await
    }

    async fn finalize(&self) -> Result<usize, StoreError> {
        self.call(|conn| batches::finalize(conn, super::now_ms())).await
    }

    async fn sweep(&self, retention_ms: i64) -> Result<(u64, u64), StoreError> {
        self.sweep_with(retention_ms, true).await
    }

    fn failing(&self) -> Option<String> {
        self.failing.cause()
    }
}

/// Runs `f` inside a savepoint: its writes stay if it succeeds and are undone if it
/// fails, without disturbing the other operations of the same commit. When SQLite has
/// rolled the whole transaction back (an I/O error, a full disk), `f`'s own error is
/// returned, not the savepoint's.
fn savepoint<T>(conn: &Connection, f: impl FnOnce(&Connection) -> Result<T, StoreError>) -> Result<T, StoreError> {
    conn.execute_batch("SAVEPOINT op")?;
    let result = f(conn);
    if conn.is_autocommit() {
        return Err(match result {
            Err(e) => e,
            Ok(_) => StoreError::Io("the transaction was rolled back".into()),
        });
    }
    let end = match &result {
        Ok(_) => "RELEASE op",
        Err(_) => "ROLLBACK TO op; RELEASE op",
    };
    conn.execute_batch(end)?;
    result
}

/// The writer thread: group commit until every sender is gone.
///
/// An operation whose failure makes SQLite roll back the whole transaction undoes
/// every operation of the group before it too: the group ends there and all of them
/// are told why, so none is reported done when it was not (nor failed when it was).
fn writer(conn: Connection, mut rx: mpsc::Receiver<Op>, failing: &Failing) {
    let mut replies: Vec<Acknowledge> = Vec::with_capacity(GROUP);
    while let Some(first) = rx.blocking_recv() {
        if let Err(e) = conn.execute_batch("BEGIN IMMEDIATE") {
            let e = StoreError::from(e);
            failing.set(&e);
            first(None).0(Err(e));
            continue;
        }
        let mut aborted = None;
        let mut next = Some(first);
        while let Some(op) = next.take() {
            let (reply, failed) = op(Some(&conn));
            replies.push(reply);
            if conn.is_autocommit() {
                let cause = failed.map_or_else(|| "the transaction was rolled back".to_owned(), |e| e.to_string());
                aborted = Some(StoreError::Io(format!(
                    "{cause} (the commit it shared with {} other operation(s) was rolled back)",
                    replies.len() - 1
                )));
                break;
            }
            if replies.len() < GROUP {
                next = rx.try_recv().ok();
            }
        }
        let committed = match aborted {
            Some(e) => Err(e),
            None => conn.execute_batch("COMMIT").map_err(StoreError::from),
        };
        match &committed {
            Ok(()) => failing.clear(),
            Err(e) => {
                failing.set(e);
                if !conn.is_autocommit() {
                    let _ = conn.execute_batch("ROLLBACK");
                }
            }
        }
        for reply in replies.drain(..) {
            reply(committed.clone());
        }
    }
}

impl Failing {
    fn cause(&self) -> Option<String> {
        self.cause.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn set(&self, e: &StoreError) {
        let mut cause = self.cause.lock().unwrap_or_else(|e| e.into_inner());
        if cause.is_none() {
            tracing::error!(store = %self.path.display(), error = %e,
                "the offline store cannot commit: readiness is 503 until a commit succeeds");
        }
        *cause = Some(e.to_string());
    }

    fn clear(&self) {
        if self.cause.lock().unwrap_or_else(|e| e.into_inner()).take().is_some() {
            tracing::info!(store = %self.path.display(), "the offline store commits again");
        }
    }
}

#[cfg(test)]
mod tests;
