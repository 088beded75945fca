//! Hot reload: the policy directory is watched, and a change is loaded whole or not at all.
//!
//! Beside the request path. File events (inotify on Linux) are debounced until the
//! directory has been quiet for [`QUIET`]; then every `*.toml` file is parsed and
//! validated together. A valid policy is swapped in atomically as the next version:
//! requests already running finish on the snapshot they started with, and micro-batch
//! and offline work already queued is not lost (a route whose batch settings changed
//! drains its old lanes). An invalid one is refused: the running policy stays, every
//! problem is logged with its file and path, and the rejection is counted.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use notify::{RecursiveMode, Watcher};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::metrics;
use crate::policy::{Policy, Store};

/// How long the directory must be quiet before a reload (editors write in several steps).
pub const QUIET: Duration = Duration::from_millis(250);

/// Why watching could not start.
#[derive(Debug, thiserror::Error)]
#[error("cannot watch the policy directory {dir}: {source}")]
pub struct WatchError {
    dir: PathBuf,
    source: notify::Error,
}

/// Watches `dir` and reloads `store` on every settled change until `shutdown`.
pub fn watch(
    dir: &Path,
    store: Arc<Store>,
    shutdown: CancellationToken,
) -> Result<impl std::future::Future<Output = ()>, WatchError> {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        if event.is_ok_and(|e| !e.kind.is_access()) {
            let _ = tx.send(());
        }
    })
    .map_err(|source| WatchError {
        dir: dir.to_owned(),
        source,
    })?;
    watcher
        .watch(dir, RecursiveMode::NonRecursive)
        .map_err(|source| WatchError {
            dir: dir.to_owned(),
            source,
        })?;
    let dir = dir.to_owned();
    published(&store);
    Ok(async move {
        let _watcher = watcher; // dropping it stops the events
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                event = rx.recv() => if event.is_none() { return },
            }
            // Debounce: wait until no event has come for QUIET.
            loop {
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(QUIET) => break,
                    event = rx.recv() => if event.is_none() { return },
                }
            }
            reload(&dir, &store);
        }
    })
}

/// Loads `dir` and swaps it in when valid; returns whether it did.
pub fn reload(dir: &Path, store: &Store) -> bool {
    match Policy::load_dir(dir) {
        Ok(policy) => {
            let routes = policy.routes().len();
            store.swap(policy);
            published(store);
            ::metrics::counter!(metrics::POLICY_RELOADS, "result" => "ok").increment(1);
            tracing::info!(dir = %dir.display(), routes, version = store.load().version(), "policy reloaded");
            true
        }
        Err(problems) => {
            ::metrics::counter!(metrics::POLICY_RELOADS, "result" => "rejected").increment(1);
            ::metrics::gauge!(metrics::POLICY_LAST_RELOAD_OK).set(0.0);
            for problem in &problems.0 {
                tracing::warn!(%problem, "policy reload refused; the running policy stays");
            }
            false
        }
    }
}

/// Exports the running version and route count.
fn published(store: &Store) {
    let policy = store.load();
    ::metrics::gauge!(metrics::POLICY_VERSION).set(policy.version() as f64);
    ::metrics::gauge!(metrics::POLICY_ROUTES).set(policy.routes().len() as f64);
    ::metrics::gauge!(metrics::POLICY_LAST_RELOAD_OK).set(1.0);
}
