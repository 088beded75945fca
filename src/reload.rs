//! Hot reload: the policy directory is watched, and a change is loaded whole or not at all.
//!
//! Beside the request path. File events (inotify on Linux) are debounced until the
//! directory has been quiet for [`QUIET`]; then [`Control::reload`] parses and
//! validates every `*.toml` file together. A valid policy is swapped in atomically as
//! the next version: requests already running finish on the snapshot they started
//! with, and micro-batch and offline work already queued is not lost (a route whose
//! batch settings changed drains its old lanes). An invalid one is refused: the running
//! policy stays, every problem is logged with its file and path, and the rejection is
//! counted. Files the admin API wrote back are already running and are not loaded again.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use notify::{RecursiveMode, Watcher};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::control::Control;

/// How long the directory must be quiet before a reload (editors write in several steps).
pub const QUIET: Duration = Duration::from_millis(250);

/// Why watching could not start.
#[derive(Debug, thiserror::Error)]
#[error("cannot watch the policy directory {dir}: {source}")]
pub struct WatchError {
    dir: PathBuf,
    source: notify::Error,
}

/// Watches `dir` and reloads through `control` on every settled change until `shutdown`.
pub fn watch(
    dir: &Path,
    control: Arc<Control>,
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
            let control = control.clone();
            let dir = dir.clone();
            let _ = tokio::task::spawn_blocking(move || control.reload(&dir)).await;
        }
    })
}
