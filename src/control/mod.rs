//! The policy control plane: every change to the running policy, from files or the
//! admin API, goes through [`Control`].
//!
//! Beside the request path. A change is made to the policy *texts* (so what runs is
//! always what the files say), then the whole policy is validated and checked against
//! the backend allowlist; only then are the changed files written back atomically, the
//! new snapshot swapped in as the next version, the version's files kept for rollback
//! and the change audited. One change at a time; a dry run stops before writing and
//! reports the diff and which requests would be served differently.
//!
//! # Layout
//!
//! `edit` (TOML edits that keep comments) · `decisions` (what a change alters) ·
//! `history` (versions for rollback, the audit log).

pub mod decisions;
pub mod edit;
pub mod history;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::Serialize;
use serde_json::Value;

use crate::decision::key_hash;
use crate::metrics;
use crate::policy::{Allowlist, Policy, Problem, Problems, Store};
use decisions::DecisionChange;
use history::{AuditEntry, History, Snapshot, SourceFile};

/// A change an operator asks for.
#[derive(Debug, Clone)]
pub enum Edit {
    /// Replace route `name` (or create it, in a new file `NAME.toml`) with `spec`.
    PutRoute {
        /// The route.
        name: String,
        /// Its whole table, as JSON.
        spec: Value,
    },
    /// Apply a JSON merge patch (RFC 7396) to route `name`.
    PatchRoute {
        /// The route.
        name: String,
        /// The keys to change; `null` removes one.
        patch: Value,
    },
    /// The patch that makes route `name`'s shadow candidate its pool (a promotion,
    /// recorded as its own action).
    Promote {
        /// The route.
        name: String,
        /// The keys to change, as for [`Edit::PatchRoute`].
        patch: Value,
    },
    /// The patch that sets route `name`'s canary to 0% when its candidate failed its
    /// margins (recorded as its own action).
    CanaryAbort {
        /// The route.
        name: String,
        /// The keys to change, as for [`Edit::PatchRoute`].
        patch: Value,
    },
    /// Replace or add whole policy files, by file name in the policy directory.
    PutFiles(Vec<(String, String)>),
    /// Restore the files of an earlier version (as a new version).
    Rollback(u64),
}

/// The result of an accepted (or dry-run) change.
#[derive(Debug, Clone, Serialize)]
pub struct Outcome {
    /// Nothing was applied: a dry run.
    pub dry_run: bool,
    /// Whether the policy texts change at all.
    pub changed: bool,
    /// The version running when the change was asked for.
    pub version_before: u64,
    /// The version running after it (the same on a dry run or when nothing changed).
    pub version_after: u64,
    /// The files written (or that would be).
    pub files: Vec<String>,
    /// A unified diff of those files.
    pub diff: String,
    /// Requests the change serves differently.
    pub decisions: Vec<DecisionChange>,
    /// The ETag of the edited route (route edits) or of the policy.
    pub etag: String,
}

/// Why a change was not made.
#[derive(Debug, thiserror::Error)]
pub enum Refused {
    /// The result would be invalid: every problem, with its file and path.
    #[error("the change would make the policy invalid:\n{0}")]
    Invalid(Problems),
    /// `If-Match` named a version that is no longer current.
    #[error("{0}")]
    Stale(String),
    /// No such route or version.
    #[error("{0}")]
    NotFound(String),
    /// The change could not be written; nothing was swapped in.
    #[error("could not write the policy: {0}")]
    Failed(String),
}

/// The control plane of one gateway.
#[derive(Debug)]
pub struct Control {
    store: Arc<Store>,
    dir: PathBuf,
    allow: Allowlist,
    history: History,
    one_at_a_time: Mutex<()>,
}

impl Control {
    /// Takes charge of `store`, whose files live in `dir`; records the running version.
    pub fn new(store: Arc<Store>, dir: PathBuf, allow: Allowlist, history: History) -> std::io::Result<Control> {
        let control = Control {
            store,
            dir,
            allow,
            history,
            one_at_a_time: Mutex::new(()),
        };
        let running = control.store.load();
        control.history.record(&snapshot(&running, "startup", "start"))?;
        published(&control.store);
        Ok(control)
    }

    /// The running policy.
    pub fn store(&self) -> &Arc<Store> {
        &self.store
    }

    /// The backend allowlist.
    pub fn allowlist(&self) -> &Allowlist {
        &self.allow
    }

    /// The kept versions, oldest first.
    pub fn history(&self) -> std::io::Result<Vec<Snapshot>> {
        self.history.list()
    }

    /// What version `version` changed: a unified diff of its files against the kept
    /// version before it (all of its files, for the first one kept), with that version's
    /// number; `None` when `version` is not kept.
    pub fn version_diff(&self, version: u64) -> std::io::Result<Option<(Option<u64>, String)>> {
        let all = self.history.list()?;
        let Some(at) = all.iter().position(|s| s.version == version) else {
            return Ok(None);
        };
        let texts = |s: &Snapshot| -> Vec<(PathBuf, String)> {
            s.files.iter().map(|f| (f.path.clone(), f.text.clone())).collect()
        };
        let before = at.checked_sub(1).map(|i| &all[i]);
        let old = before.map(texts).unwrap_or_default();
        let new = texts(&all[at]);
        Ok(Some((before.map(|s| s.version), delta(&old, &new).diff)))
    }

    /// Makes `edit` as `who`, if `expect` (an `If-Match` value) still matches; on a dry
    /// run only reports what it would do.
    pub fn change(&self, edit: &Edit, expect: Option<&str>, who: &str, dry_run: bool) -> Result<Outcome, Refused> {
        let _guard = self.one_at_a_time.lock().unwrap_or_else(|e| e.into_inner());
        let running = self.store.load();
        let (route, current_etag) = match edit {
            Edit::PutRoute { name, .. }
            | Edit::PatchRoute { name, .. }
            | Edit::Promote { name, .. }
            | Edit::CanaryAbort { name, .. } => (Some(name.as_str()), route_etag(&running, name)),
            Edit::PutFiles(_) | Edit::Rollback(_) => (None, Some(policy_etag(&running))),
        };
        if let Some(expect) = expect {
            if !matches(expect, current_etag.as_deref()) {
                let now = current_etag.unwrap_or_else(|| "none (it does not exist)".into());
                return Err(Refused::Stale(format!(
                    "If-Match {expect} is stale: the current ETag is {now}; read it again and redo the change"
                )));
            }
        }
        let texts = self.edited(&running, edit)?;
        let Delta {
            changed,
            removed,
            diff,
            files,
        } = delta(running.sources(), &texts);
        let policy = Policy::from_texts(texts.clone()).map_err(Refused::Invalid)?;
        self.allow.check(&policy).map_err(Refused::Invalid)?;
        let decisions = decisions::compare(&running, &policy);
        let etag_of = |p: &Policy| match route {
            Some(name) => route_etag(p, name).unwrap_or_default(),
            None => policy_etag(p),
        };
        let mut outcome = Outcome {
            dry_run,
            changed: !files.is_empty(),
            version_before: running.version(),
            version_after: running.version(),
            files,
            diff,
            decisions,
            etag: etag_of(&running),
        };
        if dry_run || !outcome.changed {
            if route.is_some() {
                outcome.etag = etag_of(&policy); // what the route's ETag would become
            }
            return Ok(outcome);
        }
        for (path, text) in &changed {
            history::write_atomic(path, text.as_bytes())
                .map_err(|e| Refused::Failed(format!("{}: {e}", path.display())))?;
        }
        for path in &removed {
            let aside = path.with_extension(format!("toml.removed-v{}", running.version() + 1));
            std::fs::rename(path, &aside).map_err(|e| Refused::Failed(format!("{}: {e}", path.display())))?;
        }
        let (version, action) = self.swap(policy, who, edit_action(edit), route, &outcome)?;
        outcome.version_after = version;
        outcome.etag = etag_of(&self.store.load());
        ::metrics::counter!(metrics::POLICY_CHANGES, "action" => action).increment(1);
        Ok(outcome)
    }

    /// Loads the policy files in `dir` and swaps them in when they differ from what runs
    /// and are valid (a write-back by [`Control::change`] is already running and so is
    /// not loaded twice); returns whether the files are now what runs.
    pub fn reload(&self, dir: &Path) -> bool {
        let _guard = self.one_at_a_time.lock().unwrap_or_else(|e| e.into_inner());
        let checked = Policy::load_dir(dir).and_then(|p| self.allow.check(&p).map(|()| p));
        match checked {
            Ok(policy) if policy.sources() == self.store.load().sources() => {
                published(&self.store);
                true
            }
            Ok(policy) => {
                let running = self.store.load();
                let Delta { diff, files, .. } = delta(running.sources(), policy.sources());
                let outcome = Outcome {
                    dry_run: false,
                    changed: true,
                    version_before: running.version(),
                    version_after: running.version(),
                    files,
                    diff,
                    decisions: Vec::new(),
                    etag: String::new(),
                };
                let routes = policy.routes().len();
                match self.swap(policy, "policy files", "reload", None, &outcome) {
                    Ok((version, _)) => {
                        ::metrics::counter!(metrics::POLICY_RELOADS, "result" => "ok").increment(1);
                        tracing::info!(dir = %dir.display(), routes, version, "policy reloaded");
                        true
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "policy reload could not be recorded");
                        false
                    }
                }
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

    /// The texts `edit` makes of the running ones.
    fn edited(&self, running: &Policy, edit: &Edit) -> Result<Vec<(PathBuf, String)>, Refused> {
        let mut texts = running.sources().to_vec();
        let invalid = |file: &Path, bad: edit::Bad| {
            Refused::Invalid(Problems(vec![Problem {
                file: file.to_owned(),
                path: bad.path,
                message: bad.message,
            }]))
        };
        match edit {
            Edit::PutRoute { name, spec } => match running.route(name) {
                Some(route) => {
                    let slot = texts
                        .iter_mut()
                        .find(|(p, _)| *p == route.file)
                        .ok_or_else(|| gone(name))?;
                    slot.1 = edit::put_route(&slot.1, name, spec).map_err(|b| invalid(&slot.0, b))?;
                }
                None => {
                    let path = self.dir.join(format!("{name}.toml"));
                    edit::route_name(name).map_err(|b| invalid(&path, b))?;
                    match texts.iter_mut().find(|(p, _)| *p == path) {
                        Some(slot) => slot.1 = edit::put_route(&slot.1, name, spec).map_err(|b| invalid(&path, b))?,
                        None => {
                            let text = edit::new_file(name, spec).map_err(|b| invalid(&path, b))?;
                            texts.push((path, text));
                        }
                    }
                }
            },
            Edit::PatchRoute { name, patch } | Edit::Promote { name, patch } | Edit::CanaryAbort { name, patch } => {
                let route = running.route(name).ok_or_else(|| gone(name))?;
                let slot = texts
                    .iter_mut()
                    .find(|(p, _)| *p == route.file)
                    .ok_or_else(|| gone(name))?;
                slot.1 = edit::patch_route(&slot.1, name, patch).map_err(|b| invalid(&slot.0, b))?;
            }
            Edit::PutFiles(files) => {
                for (name, text) in files {
                    let path = self.dir.join(name);
                    file_name(name).map_err(|b| invalid(&path, b))?;
                    match texts.iter_mut().find(|(p, _)| p.file_name() == path.file_name()) {
                        Some(slot) => slot.1 = text.clone(),
                        None => texts.push((path, text.clone())),
                    }
                }
            }
            Edit::Rollback(version) => {
                let snapshot = self
                    .history
                    .get(*version)
                    .map_err(|e| Refused::Failed(e.to_string()))?
                    .ok_or_else(|| {
                        Refused::NotFound(format!(
                            "version {version} is not kept (the newest {} are; see the policy history)",
                            history::KEEP
                        ))
                    })?;
                texts = snapshot.files.into_iter().map(|f| (f.path, f.text)).collect();
            }
        }
        Ok(texts)
    }

    /// Swaps `policy` in, records its version and audits the change; returns the version.
    fn swap(
        &self,
        policy: Policy,
        who: &str,
        action: &'static str,
        route: Option<&str>,
        outcome: &Outcome,
    ) -> Result<(u64, &'static str), Refused> {
        let before = self.store.load().version();
        self.store.swap(policy);
        let running = self.store.load();
        published(&self.store);
        let recorded = self.history.record(&snapshot(&running, who, action)).and_then(|()| {
            self.history.audit(&AuditEntry {
                time: history::now(),
                who,
                action,
                route,
                version_before: before,
                version_after: running.version(),
                files: outcome.files.clone(),
                diff: &outcome.diff,
            })
        });
        if let Err(e) = recorded {
            // The change is live and on disk; only its record failed. Say so loudly.
            tracing::error!(error = %e, version = running.version(), "the policy change is live but could not be recorded in the history or audit log");
            return Err(Refused::Failed(format!(
                "version {} is live, but recording it failed: {e}",
                running.version()
            )));
        }
        tracing::info!(who, action, route, version = running.version(), "policy changed");
        Ok((running.version(), action))
    }
}

/// The policy's ETag: its version.
pub fn policy_etag(policy: &Policy) -> String {
    format!("\"v{}\"", policy.version())
}

/// Route `name`'s ETag: a hash of its file and its table as written.
pub fn route_etag(policy: &Policy, name: &str) -> Option<String> {
    let route = policy.route(name)?;
    let text = policy.sources().iter().find(|(p, _)| *p == route.file)?;
    let spec = edit::route_spec(&text.1, name)?;
    let key = format!("{}\n{spec}", route.file.display());
    Some(format!("\"r{:016x}\"", key_hash(key.as_bytes())))
}

/// Whether an `If-Match` value accepts `current`.
fn matches(expect: &str, current: Option<&str>) -> bool {
    let Some(current) = current else {
        return false;
    };
    expect
        .split(',')
        .map(|t| t.trim().trim_start_matches("W/"))
        .any(|t| t == "*" || t == current)
}

fn edit_action(edit: &Edit) -> &'static str {
    match edit {
        Edit::PutRoute { .. } => "put_route",
        Edit::PatchRoute { .. } => "patch_route",
        Edit::Promote { .. } => "promote",
        Edit::CanaryAbort { .. } => "canary_abort",
        Edit::PutFiles(_) => "put_files",
        Edit::Rollback(_) => "rollback",
    }
}

fn gone(name: &str) -> Refused {
    Refused::NotFound(format!("no route named {name:?}"))
}

/// Checks a policy file name the admin API may write: `NAME.toml` in the policy directory.
fn file_name(name: &str) -> Result<(), edit::Bad> {
    let stem = name.strip_suffix(".toml").unwrap_or("");
    let ok = !stem.is_empty()
        && name.len() <= 128
        && !stem.starts_with('.')
        && stem.bytes().all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b));
    ok.then_some(()).ok_or_else(|| edit::Bad {
        path: String::new(),
        message: format!("file name {name:?} must be NAME.toml with letters, digits, '_', '-' or '.' (no directories)"),
    })
}

fn snapshot(policy: &Policy, who: &str, action: &str) -> Snapshot {
    Snapshot {
        version: policy.version(),
        time: history::now(),
        who: who.to_owned(),
        action: action.to_owned(),
        files: policy
            .sources()
            .iter()
            .map(|(path, text)| SourceFile {
                path: path.clone(),
                text: text.clone(),
            })
            .collect(),
    }
}

/// How policy texts differ from the running ones.
struct Delta<'a> {
    /// Files new or changed.
    changed: Vec<&'a (PathBuf, String)>,
    /// Files the running policy has and the texts do not.
    removed: Vec<PathBuf>,
    /// A unified diff of both.
    diff: String,
    /// Every file in the diff.
    files: Vec<String>,
}

fn delta<'a>(running: &[(PathBuf, String)], texts: &'a [(PathBuf, String)]) -> Delta<'a> {
    let changed: Vec<&(PathBuf, String)> = texts.iter().filter(|t| !running.contains(t)).collect();
    let removed: Vec<PathBuf> = running
        .iter()
        .filter(|(p, _)| !texts.iter().any(|(q, _)| q == p))
        .map(|(p, _)| p.clone())
        .collect();
    let diff = diff(running, &changed, &removed);
    let files = changed
        .iter()
        .map(|(p, _)| p.display().to_string())
        .chain(removed.iter().map(|p| p.display().to_string()))
        .collect();
    Delta {
        changed,
        removed,
        diff,
        files,
    }
}

/// A unified diff of the `changed` and `removed` files against `running`.
fn diff(running: &[(PathBuf, String)], changed: &[&(PathBuf, String)], removed: &[PathBuf]) -> String {
    let old = |path: &Path| running.iter().find(|(p, _)| p == path).map_or("", |(_, t)| t.as_str());
    let mut out = String::new();
    for (path, text) in changed {
        let name = path.display().to_string();
        let d = similar::TextDiff::from_lines(old(path), text.as_str());
        out.push_str(&d.unified_diff().context_radius(2).header(&name, &name).to_string());
    }
    for path in removed {
        let name = path.display().to_string();
        let d = similar::TextDiff::from_lines(old(path), "");
        out.push_str(&d.unified_diff().header(&name, "/dev/null").to_string());
    }
    out
}

/// Exports the running version and route count.
fn published(store: &Store) {
    let policy = store.load();
    ::metrics::gauge!(metrics::POLICY_VERSION).set(policy.version() as f64);
    ::metrics::gauge!(metrics::POLICY_ROUTES).set(policy.routes().len() as f64);
    ::metrics::gauge!(metrics::POLICY_LAST_RELOAD_OK).set(1.0);
}

#[cfg(test)]
mod proptests;
#[cfg(test)]
mod tests;
