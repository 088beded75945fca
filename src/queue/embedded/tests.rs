#![allow(clippy::unwrap_used)] // in tests a failed unwrap is a failed test

use std::time::Duration;

use super::*;
use crate::queue::{after, Answer};

fn job(key: Option<&str>) -> NewJob {
    job_of("", key, b"{\"inputs\":[]}")
}

/// `tenant`'s job with `body`, its idempotency key (if any) stored as the doors store it.
fn job_of(tenant: &str, key: Option<&str>, body: &'static [u8]) -> NewJob {
    let path = "/v2/models/m/infer";
    NewJob {
        route: "r".into(),
        method: "POST".into(),
        path: path.into(),
        headers: vec![("content-type".into(), "application/json".into())],
        body: bytes::Bytes::from_static(body),
        expires_at: after(Duration::from_secs(3600)),
        idempotency_key: key.map(|k| crate::queue::idempotency_key(tenant, path, k, &[b"POST", body])),
        tenant: tenant.into(),
        shadow: false,
    }
}

fn open(dir: &Path, max: u64) -> Embedded {
    Embedded::open(
        dir,
        Limits {
            max_unfinished: max,
            writer_nice: 0,
            writer_cpus: Default::default(),
        },
    )
    .unwrap()
}

fn answer(status: u16) -> Finish {
    Finish::Answered(Answer {
        status,
        headers: vec![("content-type".into(), "application/json".into())],
        body: bytes::Bytes::from_static(b"{\"outputs\":[]}"),
        comparison: None,
    })
}

#[tokio::test]
async fn a_job_runs_once_and_keeps_its_answer() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), 100);
    let ids = store.submit(vec![job(None), job(None)]).await.unwrap();
    assert_eq!(ids.len(), 2);
    assert!(ids[0].id < ids[1].id, "ids are time-ordered");
    let leased = store.lease(10).await.unwrap();
    assert_eq!(
        leased.iter().map(|j| &j.id).collect::<Vec<_>>(),
        vec![&ids[0].id, &ids[1].id]
    );
    assert!(leased.iter().all(|j| j.state == State::Running && j.attempts == 1));
    assert!(
        store.lease(10).await.unwrap().is_empty(),
        "a running job is not leased twice"
    );
    assert!(store.finish(&ids[0].id, 1, answer(200)).await.unwrap());
    assert!(
        !store.finish(&ids[0].id, 1, answer(200)).await.unwrap(),
        "a second result is refused"
    );
    let done = store.get(&ids[0].id).await.unwrap().unwrap();
    assert_eq!(done.state, State::Succeeded);
    assert_eq!(done.answer.unwrap().body.as_ref(), b"{\"outputs\":[]}");
    assert!(store.finish(&ids[1].id, 1, answer(400)).await.unwrap());
    assert_eq!(store.get(&ids[1].id).await.unwrap().unwrap().state, State::Failed);
}

#[tokio::test]
async fn retries_wait_their_backoff_and_a_stale_attempt_cannot_write() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), 100);
    let id = store.submit(vec![job(None)]).await.unwrap().remove(0).id;
    store.lease(1).await.unwrap();
    let later = after(Duration::from_secs(60));
    let retry = Finish::Retry {
        error: "backend 503".into(),
        not_before: later,
    };
    assert!(store.finish(&id, 1, retry).await.unwrap());
    assert!(store.lease(1).await.unwrap().is_empty(), "not before its backoff");
    let job = store.get(&id).await.unwrap().unwrap();
    assert_eq!((job.state, job.error.as_deref()), (State::Queued, Some("backend 503")));
    assert!(
        !store.finish(&id, 1, answer(200)).await.unwrap(),
        "attempt 1 no longer holds it"
    );
}

#[tokio::test]
async fn idempotency_keys_return_the_first_job() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), 100);
    let first = store.submit(vec![job(Some("k1"))]).await.unwrap().remove(0);
    let again = store.submit(vec![job(Some("k1")), job(Some("k2"))]).await.unwrap();
    assert_eq!(
        again[0],
        Submitted {
            id: first.id.clone(),
            existing: true,
            same_request: true,
        }
    );
    assert!(!again[1].existing);
    // The same key with another body names the first job, as another request: the
    // door answers 422. Another tenant's same key is another job.
    let other_body = store
        .submit(vec![job_of("", Some("k1"), b"{}")])
        .await
        .unwrap()
        .remove(0);
    assert_eq!(
        (other_body.id.as_str(), other_body.existing, other_body.same_request),
        (first.id.as_str(), true, false)
    );
    let other_tenant = store
        .submit(vec![job_of("b", Some("k1"), b"{\"inputs\":[]}")])
        .await
        .unwrap()
        .remove(0);
    assert!(!other_tenant.existing && other_tenant.id != first.id);
    let job = store.get(&other_tenant.id).await.unwrap().unwrap();
    assert_eq!(job.request.tenant, "b", "a job keeps its tenant");
}

#[tokio::test]
async fn a_full_store_refuses_and_keeps_what_it_has() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), 3);
    store.submit(vec![job(None), job(None)]).await.unwrap();
    let refused = store.submit(vec![job(None), job(None)]).await.unwrap_err();
    assert_eq!(refused, StoreError::Full(2));
    store.submit(vec![job(None)]).await.unwrap();
    let counts = store.counts().await.unwrap();
    assert_eq!(counts, vec![(State::Queued, 3)]);
}

#[tokio::test]
async fn cancel_and_expiry_end_unfinished_jobs_only() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), 100);
    let mut short = job(None);
    short.expires_at = crate::queue::now_ms() - 1;
    let ids = store.submit(vec![job(None), short, job(None)]).await.unwrap();
    assert_eq!(store.cancel(&ids[0].id).await.unwrap(), Some(State::Cancelled));
    assert_eq!(store.sweep_with(i64::MAX, true).await.unwrap(), (1, 0));
    assert_eq!(store.get(&ids[1].id).await.unwrap().unwrap().state, State::Expired);
    let leased = store.lease(10).await.unwrap();
    assert_eq!(leased.len(), 1);
    assert!(store.finish(&ids[2].id, 1, answer(200)).await.unwrap());
    assert_eq!(
        store.cancel(&ids[2].id).await.unwrap(),
        Some(State::Succeeded),
        "finished stays finished"
    );
    assert_eq!(store.cancel("job_nope").await.unwrap(), None);
    assert_eq!(
        store.sweep_with(0, true).await.unwrap().1,
        3,
        "retention deletes finished jobs"
    );
}

#[tokio::test]
async fn an_idle_store_runs_no_upkeep_statement_yet_what_falls_due_is_swept() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), 100);
    let mut soon = job(None);
    soon.expires_at = crate::queue::now_ms() + 300;
    let expires_at = soon.expires_at;
    let id = store.submit(vec![soon]).await.unwrap().remove(0).id;
    let statements = || store.upkeep.statements.load(Ordering::Relaxed);

    assert_eq!(store.sweep_with(i64::MAX, true).await.unwrap(), (0, 0));
    let counts = store.counts().await.unwrap();
    let before = statements();
    for _ in 0..3 {
        assert_eq!(store.sweep_with(i64::MAX, true).await.unwrap(), (0, 0));
        assert_eq!(store.counts().await.unwrap(), counts);
        assert_eq!(
            store.oldest_queued().await.unwrap(),
            store.oldest_queued().await.unwrap()
        );
    }
    assert_eq!(statements(), before + 1, "one read of the oldest job, then nothing");

    // Nothing changes (no operation at all), but the job's expiry comes: the next sweep
    // runs and expires it.
    while crate::queue::now_ms() <= expires_at {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(store.sweep_with(i64::MAX, true).await.unwrap(), (1, 0));
    assert_eq!(store.get(&id).await.unwrap().unwrap().state, State::Expired);
    assert!(
        store.counts().await.unwrap().contains(&(State::Expired, 1)),
        "counts read again after the sweep changed the store"
    );
}

#[tokio::test]
async fn a_restart_queues_running_jobs_again_and_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let ids = {
        let store = open(dir.path(), 100);
        let ids = store.submit((0..50).map(|_| job(None)).collect()).await.unwrap();
        store.lease(10).await.unwrap();
        ids
    };
    // The writer thread ends once every handle is gone; wait until the file is free.
    let store = loop {
        match Embedded::open(
            dir.path(),
            Limits {
                max_unfinished: 100,
                writer_nice: 0,
                writer_cpus: Default::default(),
            },
        ) {
            Ok(store) => break store,
            Err(_) => tokio::task::yield_now().await,
        }
    };
    assert_eq!(store.counts().await.unwrap(), vec![(State::Queued, 50)]);
    let leased = store.lease(100).await.unwrap();
    assert_eq!(leased.len(), 50);
    assert_eq!(
        leased.iter().filter(|j| j.attempts == 2).count(),
        10,
        "the interrupted attempts count"
    );
    assert_eq!(
        leased.iter().map(|j| j.id.clone()).collect::<Vec<_>>(),
        ids.into_iter().map(|s| s.id).collect::<Vec<_>>()
    );
}

#[tokio::test]
async fn many_concurrent_submissions_share_commits() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), 100_000);
    let tasks: Vec<_> = (0..2000)
        .map(|_| {
            let store = store.clone();
            tokio::spawn(async move { store.submit(vec![job(None)]).await })
        })
        .collect();
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    assert_eq!(store.counts().await.unwrap(), vec![(State::Queued, 2000)]);
}

/// An operation after which SQLite has rolled the transaction back (here by hand, as an
/// I/O error or a full disk does) ends its commit: the operations before it in the same
/// commit are told they failed, the store says it is failing, and the operations after
/// it run in a commit of their own. Before, those later operations ran outside any
/// transaction (applied) and were then told "cannot commit - no transaction is active".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operation_that_aborts_the_transaction_ends_its_commit_and_only_its_commit() {
    let _one_at_a_time = ABORTING.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), 100);
    // Hold the writer inside a first operation until the others are queued behind it.
    let (started_tx, started_rx) = std::sync::mpsc::channel();
    let (gate_tx, gate_rx) = std::sync::mpsc::channel::<()>();
    let held = {
        let store = store.clone();
        tokio::spawn(async move {
            store
                .call(move |conn| {
                    started_tx.send(()).unwrap();
                    gate_rx.recv().unwrap();
                    jobs::insert(conn, vec![job(Some("held"))], 100, &AtomicI64::new(0), 0)
                })
                .await
        })
    };
    tokio::task::spawn_blocking(move || started_rx.recv().unwrap())
        .await
        .unwrap();
    let abort = {
        let store = store.clone();
        tokio::spawn(async move { store.abort_a_commit().await })
    };
    while store.ops.capacity() > BACKLOG - 1 {
        tokio::task::yield_now().await;
    }
    let after = {
        let store = store.clone();
        tokio::spawn(async move { store.submit(vec![job(Some("after"))]).await })
    };
    while store.ops.capacity() > BACKLOG - 2 {
        tokio::task::yield_now().await;
    }
    gate_tx.send(()).unwrap();

    let held = held.await.unwrap().expect_err("rolled back with the commit it shared");
    assert!(held.to_string().contains("simulated"), "told the real cause: {held}");
    let abort = abort.await.unwrap().expect_err("the aborting operation fails");
    assert!(abort.to_string().contains("simulated"), "{abort}");
    let after = after
        .await
        .unwrap()
        .expect("the next operation gets a commit of its own");
    let job = store.get(&after[0].id).await.unwrap().expect("and its job is there");
    assert_eq!(
        job.request.idempotency_key,
        job_of("", Some("after"), b"{\"inputs\":[]}").idempotency_key
    );
    let queued = store.counts().await.unwrap();
    assert_eq!(queued, vec![(State::Queued, 1)], "the rolled-back job is not there");
    assert_eq!(store.failing(), None, "a commit that succeeds clears the failure");
}

/// The store keeps its temporary data in memory: a large update inside a commit needs a
/// statement journal, and a read-only root file system (no writable temporary
/// directory) must not break it.
#[tokio::test]
async fn temporary_data_stays_in_memory() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), 100);
    let mode: i64 = store
        .call(|conn| Ok(conn.query_row("PRAGMA temp_store", [], |r| r.get(0))?))
        .await
        .unwrap();
    assert_eq!(mode, 2, "PRAGMA temp_store = MEMORY");
}

/// A store that keeps failing logs its cause once, not once per operation (a worker
/// retrying its lease every few milliseconds logged ~48 warnings a second, none with
/// the cause), and logs again once it commits.
#[tokio::test]
async fn a_failing_store_logs_its_cause_once_and_its_recovery_once() {
    let _one_at_a_time = ABORTING.lock().await;
    use tracing_subscriber::layer::SubscriberExt as _;

    #[derive(Clone, Default)]
    struct Lines(Arc<Mutex<Vec<(tracing::Level, String)>>>);
    impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Lines {
        fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
            struct Text(String);
            impl tracing::field::Visit for Text {
                fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                    self.0.push_str(&format!("{}={value:?} ", field.name()));
                }
            }
            let mut text = Text(String::new());
            event.record(&mut text);
            self.0.lock().unwrap().push((*event.metadata().level(), text.0));
        }
    }
    let lines = Lines::default();
    let subscriber = tracing_subscriber::registry().with(lines.clone());
    let _logs = tracing::subscriber::set_default(subscriber);

    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), 100);
    for _ in 0..5 {
        let failed = store.abort_a_commit().await;
        assert!(failed.is_err());
    }
    store.counts().await.unwrap();
    store.counts().await.unwrap();
    let seen = lines.0.lock().unwrap().clone();
    let errors: Vec<_> = seen
        .iter()
        .filter(|(level, _)| *level == tracing::Level::ERROR)
        .collect();
    assert_eq!(errors.len(), 1, "{seen:?}");
    assert!(errors[0].1.contains("simulated"), "the cause is in the line: {seen:?}");
    let recovered = seen.iter().filter(|(_, text)| text.contains("commits again")).count();
    assert_eq!(recovered, 1, "{seen:?}");
}

#[tokio::test]
async fn a_store_made_before_tenants_opens_with_its_jobs_the_anonymous_tenants() {
    let dir = tempfile::tempdir().unwrap();
    {
        // The tables as they were before tenants, with one job and one batch in them.
        let conn = rusqlite::Connection::open(dir.path().join("offline.db")).unwrap();
        conn.execute_batch(
            "CREATE TABLE jobs (id TEXT PRIMARY KEY, route TEXT NOT NULL, method TEXT NOT NULL, path TEXT NOT NULL,
                headers TEXT NOT NULL, body BLOB NOT NULL, state TEXT NOT NULL, attempts INTEGER NOT NULL DEFAULT 0,
                not_before INTEGER NOT NULL DEFAULT 0, created_at INTEGER NOT NULL, expires_at INTEGER NOT NULL,
                finished_at INTEGER, status INTEGER, answer_headers TEXT, answer_body BLOB, error TEXT,
                idempotency_key TEXT UNIQUE, batch_id TEXT, custom_id TEXT, line INTEGER);
             CREATE TABLE files (id TEXT PRIMARY KEY, purpose TEXT NOT NULL, filename TEXT NOT NULL,
                bytes INTEGER NOT NULL, created_at INTEGER NOT NULL, content BLOB NOT NULL);
             INSERT INTO jobs (id, route, method, path, headers, body, state, created_at, expires_at)
                VALUES ('job_old', 'r', 'POST', '/v2/models/m/infer', '[]', x'', 'queued', 1, 9999999999999);
             INSERT INTO files (id, purpose, filename, bytes, created_at, content)
                VALUES ('file_old', 'batch', 'in.jsonl', 0, 1, x'');",
        )
        .unwrap();
    }
    let store = open(dir.path(), 100);
    let job = store.get("job_old").await.unwrap().expect("kept");
    assert_eq!(job.request.tenant, "");
    assert!(
        store.file("file_old", "").await.unwrap().is_some(),
        "the anonymous tenant's"
    );
    assert!(
        store.file("file_old", "team-a").await.unwrap().is_none(),
        "and no one else's"
    );
}
