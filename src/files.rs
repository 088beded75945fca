//! The files the gateway keeps (the offline store, the policy history, the audit log):
//! created private to the gateway's user, directories `0700` and files `0600`, whatever
//! the process umask, because they hold callers' requests and results. And the files an
//! operator gives it: watched for changes, certificates read from PEM. A leaf.

use std::fs::{DirBuilder, File, OpenOptions};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// Creates `dir` and any missing parents as `0700`; one that exists is left as it is,
/// with a warning when other users may read it.
pub fn private_dir(dir: &Path) -> std::io::Result<()> {
    if let Ok(meta) = std::fs::metadata(dir) {
        if meta.is_dir() && meta.permissions().mode() & 0o077 != 0 {
            tracing::warn!(
                dir = %dir.display(),
                mode = format!("{:o}", meta.permissions().mode() & 0o777),
                "other users may read this directory of the gateway's; chmod 700 it"
            );
        }
        return Ok(());
    }
    DirBuilder::new().recursive(true).mode(0o700).create(dir)
}

/// Opens `path` for appending, creating it `0600`.
pub fn private_append(path: &Path) -> std::io::Result<File> {
    OpenOptions::new().create(true).append(true).mode(0o600).open(path)
}

/// Creates (or truncates) `path` for writing, `0600` when new.
pub fn private_create(path: &Path) -> std::io::Result<File> {
    OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
}

/// Makes sure `path` exists, created empty and `0600` when it does not (SQLite then
/// opens it, and gives its WAL and shared-memory files the same mode).
pub fn private_touch(path: &Path) -> std::io::Result<()> {
    private_append(path).map(drop)
}

/// Calls `changed` each time one of `files` changes (its modification time or size),
/// looking once a second, until `shutdown`: for files an operator replaces in place
/// (API keys, certificates), where a second's delay is fine and no watcher is needed.
pub async fn on_change(
    files: &[std::path::PathBuf],
    shutdown: tokio_util::sync::CancellationToken,
    mut changed: impl FnMut(),
) {
    let stamp = || -> Vec<Option<(Option<std::time::SystemTime>, u64)>> {
        files
            .iter()
            .map(|f| std::fs::metadata(f).ok().map(|m| (m.modified().ok(), m.len())))
            .collect()
    };
    let mut seen = stamp();
    loop {
        tokio::select! {
            () = tokio::time::sleep(std::time::Duration::from_secs(1)) => {}
            () = shutdown.cancelled() => return,
        }
        let now = stamp();
        if now != seen {
            seen = now;
            changed();
        }
    }
}

/// The PEM certificates in `file`, in order; an error that names the file when it does
/// not read or holds none.
pub fn certificates(file: &Path) -> Result<Vec<rustls_pki_types::CertificateDer<'static>>, String> {
    use rustls_pki_types::pem::PemObject;
    let certs = rustls_pki_types::CertificateDer::pem_file_iter(file)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("{}: cannot read PEM certificates: {e}", file.display()))?;
    if certs.is_empty() {
        return Err(format!("{}: holds no PEM certificate", file.display()));
    }
    Ok(certs)
}
