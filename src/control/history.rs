//! Policy history and audit: every version's files kept for rollback, and an
//! append-only log of who changed what.
//!
//! Under `data_dir/policy/`: `versions/NNNNNNNNNN.json` holds the files of each
//! version the gateway ran (the newest [`KEEP`]), so versions keep counting up across
//! restarts and a rollback can restore any of them; `audit.jsonl` (or
//! `admin.audit_log`) gets one JSON line per accepted change, written and synced
//! before the change is acknowledged.

use std::fs::File;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

/// Versions kept for rollback; older ones are deleted.
pub const KEEP: usize = 200;

/// Where the history lives.
#[derive(Debug)]
pub struct History {
    versions: PathBuf,
    audit: PathBuf,
}

/// The files of one policy version and how it came to be.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Snapshot {
    /// The policy version.
    pub version: u64,
    /// When it started serving (RFC 3339).
    pub time: String,
    /// Who made it: a token name, `policy files` for a reload, `startup`.
    pub who: String,
    /// What made it: `start`, `reload`, `put_route`, `patch_route`, `put_files`, `rollback`.
    pub action: String,
    /// Its policy files, in load order.
    pub files: Vec<SourceFile>,
}

/// One policy file's text.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceFile {
    /// The file.
    pub path: PathBuf,
    /// Its text.
    pub text: String,
}

/// One line of the audit log.
#[derive(Debug, Serialize)]
pub struct AuditEntry<'a> {
    /// When (RFC 3339).
    pub time: String,
    /// Who.
    pub who: &'a str,
    /// What kind of change.
    pub action: &'a str,
    /// The route edited, for route edits.
    pub route: Option<&'a str>,
    /// The version it replaced.
    pub version_before: u64,
    /// The version it became.
    pub version_after: u64,
    /// The files written.
    pub files: Vec<String>,
    /// A unified diff of those files.
    pub diff: &'a str,
}

impl History {
    /// Opens (creating) the history under `data_dir`, auditing to `audit` when given.
    pub fn open(data_dir: &Path, audit: Option<&Path>) -> std::io::Result<History> {
        let root = data_dir.join("policy");
        let versions = root.join("versions");
        crate::files::private_dir(&versions)?;
        let audit = audit.map_or_else(|| root.join("audit.jsonl"), Path::to_owned);
        if let Some(parent) = audit.parent().filter(|p| !p.as_os_str().is_empty()) {
            crate::files::private_dir(parent)?;
        }
        Ok(History { versions, audit })
    }

    /// The newest version recorded (0 when none).
    pub fn latest(&self) -> std::io::Result<u64> {
        Ok(self.numbers()?.last().copied().unwrap_or(0))
    }

    /// Records `snapshot` and forgets versions beyond [`KEEP`].
    pub fn record(&self, snapshot: &Snapshot) -> std::io::Result<()> {
        let bytes = serde_json::to_vec(snapshot).map_err(std::io::Error::other)?;
        write_atomic(&self.path(snapshot.version), &bytes)?;
        let numbers = self.numbers()?;
        for old in numbers.iter().take(numbers.len().saturating_sub(KEEP)) {
            let _ = std::fs::remove_file(self.path(*old));
        }
        Ok(())
    }

    /// The snapshot of `version`, if kept.
    pub fn get(&self, version: u64) -> std::io::Result<Option<Snapshot>> {
        match std::fs::read(self.path(version)) {
            Ok(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(std::io::Error::other),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Every kept snapshot, oldest first.
    pub fn list(&self) -> std::io::Result<Vec<Snapshot>> {
        let mut all = Vec::new();
        for n in self.numbers()? {
            if let Some(s) = self.get(n)? {
                all.push(s);
            }
        }
        Ok(all)
    }

    /// Appends `entry` to the audit log and syncs it.
    pub fn audit(&self, entry: &AuditEntry<'_>) -> std::io::Result<()> {
        let mut line = serde_json::to_vec(entry).map_err(std::io::Error::other)?;
        line.push(b'\n');
        let mut file = crate::files::private_append(&self.audit)?;
        file.write_all(&line)?;
        file.sync_data()
    }

    /// The audit log's path.
    pub fn audit_path(&self) -> &Path {
        &self.audit
    }

    fn path(&self, version: u64) -> PathBuf {
        self.versions.join(format!("{version:010}.json"))
    }

    fn numbers(&self) -> std::io::Result<Vec<u64>> {
        let mut numbers: Vec<u64> = std::fs::read_dir(&self.versions)?
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                let name = e.file_name();
                name.to_str()?.strip_suffix(".json")?.parse().ok()
            })
            .collect();
        numbers.sort_unstable();
        Ok(numbers)
    }
}

/// Now, as RFC 3339 with milliseconds.
pub fn now() -> String {
    humantime::format_rfc3339_millis(SystemTime::now()).to_string()
}

/// Writes `bytes` to `path` so a reader sees the old file or the new one, never half:
/// a synced temporary file in the same directory, renamed over it, and the directory
/// synced so the rename survives a crash.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("file");
    let tmp = dir.join(format!(".{name}.tmp-{}", std::process::id()));
    let result = (|| {
        let mut file = crate::files::private_create(&tmp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)?;
        File::open(dir)?.sync_all()
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snapshot(version: u64) -> Snapshot {
        Snapshot {
            version,
            time: now(),
            who: "test".into(),
            action: "start".into(),
            files: vec![SourceFile {
                path: "a.toml".into(),
                text: format!("# v{version}\n"),
            }],
        }
    }

    #[test]
    fn versions_survive_reopening_and_old_ones_are_pruned() {
        let dir = tempfile::tempdir().expect("tempdir");
        let history = History::open(dir.path(), None).expect("opens");
        assert_eq!(history.latest().expect("latest"), 0);
        for v in 1..=(KEEP as u64 + 3) {
            history.record(&snapshot(v)).expect("records");
        }
        let again = History::open(dir.path(), None).expect("reopens");
        assert_eq!(again.latest().expect("latest"), KEEP as u64 + 3);
        assert!(again.get(3).expect("reads").is_none(), "pruned");
        let kept = again.get(4).expect("reads").expect("kept");
        assert_eq!(kept.files[0].text, "# v4\n");
        assert_eq!(again.list().expect("lists").len(), KEEP);
    }
}
