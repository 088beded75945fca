//! Policy: the routes, their thresholds, flags and pools (file → model → store).
//!
//! A leaf module that knows nothing of servers. [`mod@file`] mirrors what operators write
//! in `policies/*.toml`; [`Policy::load_dir`] parses every file and validates the lot
//! into [`model`] types, reporting every problem with its file and path; [`Store`]
//! holds the running policy as an immutable snapshot that readers load without locks
//! and a reload swaps atomically.

pub mod allow;
mod combined;
pub mod file;
pub mod model;
pub mod prices;
mod problems;
mod shadow;
pub mod tokens;
pub mod usage;
mod validate;
pub mod window;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arc_swap::ArcSwap;

pub use allow::Allowlist;
pub use file::PolicyFile;
pub use model::{
    Abort, BatchSpec, Borrow, Budgets, CacheSpec, Flags, Gate, HealthSpec, HedgeSpec, JsonAdapter, Member, Policy,
    PoolSpec, Priority, Rate, RateLimits, RetryOn, RetrySpec, Route, Scheduling, ShadowSpec, Tolerance, WhenUnmet,
};
pub(crate) use problems::one_a_line;
pub use problems::{Problem, Problems};

/// Largest policy file read; anything bigger is refused, not parsed.
const MAX_FILE_BYTES: u64 = 4 << 20;

impl Policy {
    /// Reads every `*.toml` file directly in `dir` (sorted by name) into one policy.
    pub fn load_dir(dir: &Path) -> Result<Policy, Problems> {
        let entries =
            std::fs::read_dir(dir).map_err(|e| single(dir, format!("cannot read the policy directory: {e}")))?;
        let mut files: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "toml") && p.is_file())
            .collect();
        files.sort();
        if files.is_empty() {
            return Err(single(dir, "holds no *.toml policy files"));
        }
        Self::load_files(&files)
    }

    /// Reads and validates `files` as one policy.
    pub fn load_files(files: &[PathBuf]) -> Result<Policy, Problems> {
        let mut texts = Vec::with_capacity(files.len());
        let mut problems = Vec::new();
        for path in files {
            match read_bounded(path) {
                Ok(text) => texts.push((path.clone(), text)),
                Err(message) => problems.push(Problem {
                    file: path.clone(),
                    path: String::new(),
                    message,
                }),
            }
        }
        let parsed = Self::from_texts(texts);
        match (parsed, problems.is_empty()) {
            (Ok(policy), true) => Ok(policy),
            (Ok(_), false) => Err(Problems(problems)),
            (Err(Problems(more)), _) => {
                problems.extend(more);
                Err(Problems(problems))
            }
        }
    }

    /// Parses and validates policy texts, each named by the file it came from.
    pub fn from_texts(texts: Vec<(PathBuf, String)>) -> Result<Policy, Problems> {
        let mut problems = Vec::new();
        let mut files = Vec::with_capacity(texts.len());
        let sources = texts.clone();
        for (path, text) in texts {
            match toml::from_str::<PolicyFile>(&text) {
                Ok(parsed) => files.push((path, parsed)),
                Err(e) => match startup_key(&text) {
                    Some(key) => problems.push(Problem {
                        file: path,
                        path: key.to_owned(),
                        message: "is a startup setting (tiergate.toml or TIERGATE_* variables), not policy; \
                                  changing it needs a restart, so it cannot be loaded or reloaded from a policy file"
                            .into(),
                    }),
                    None => problems.push(parse_problem(path, &text, &e)),
                },
            }
        }
        let validated = validate::policy(files);
        match validated {
            Ok(mut policy) if problems.is_empty() => {
                policy.sources = sources;
                Ok(policy)
            }
            Ok(_) => Err(Problems(problems)),
            Err(Problems(more)) => {
                problems.extend(more);
                Err(Problems(problems))
            }
        }
    }
}

/// The running policy, swapped atomically on reload; each snapshot carries its version.
#[derive(Debug)]
pub struct Store {
    current: ArcSwap<Policy>,
    swaps: std::sync::Mutex<()>,
}

impl Store {
    /// A store running `policy` as version 1.
    pub fn new(policy: Policy) -> Self {
        Store::at(policy, 1)
    }

    /// A store running `policy` as `version` (a gateway that keeps its policy history
    /// continues the numbering across restarts).
    pub fn at(mut policy: Policy, version: u64) -> Self {
        policy.stamp(version.max(1));
        Store {
            current: ArcSwap::from_pointee(policy),
            swaps: std::sync::Mutex::new(()),
        }
    }

    /// The current snapshot; a request keeps the one it started with.
    pub fn load(&self) -> Arc<Policy> {
        self.current.load_full()
    }

    /// Replaces the running policy for every request that starts from now on, as the
    /// next version; returns the one it replaced.
    pub fn swap(&self, mut policy: Policy) -> Arc<Policy> {
        let _one_at_a_time = self.swaps.lock().unwrap_or_else(|e| e.into_inner());
        policy.stamp(self.current.load().version + 1);
        self.current.swap(Arc::new(policy))
    }
}

impl Policy {
    /// Gives this snapshot, and each of its routes, `version`.
    fn stamp(&mut self, version: u64) {
        self.version = version;
        for (i, route) in self.routes.iter().enumerate() {
            let _ = route.version.set(version); // fresh routes: set exactly once
            let _ = route.index.set(i);
        }
    }
}

/// Top-level keys of the startup settings, which a policy file must not hold.
const STARTUP_KEYS: [&str; 9] = [
    "listen",
    "data_dir",
    "policy_dir",
    "threads",
    "limits",
    "offline",
    "log",
    "admin",
    "backends",
];

/// The first startup setting at the top of `text`, if it is TOML at all.
fn startup_key(text: &str) -> Option<&'static str> {
    let table = toml::from_str::<toml::Table>(text).ok()?;
    STARTUP_KEYS.into_iter().find(|k| table.contains_key(*k))
}

fn read_bounded(path: &Path) -> Result<String, String> {
    let meta = std::fs::metadata(path).map_err(|e| format!("cannot read: {e}"))?;
    if meta.len() > MAX_FILE_BYTES {
        return Err(format!(
            "is {} bytes; policy files are limited to {MAX_FILE_BYTES}",
            meta.len()
        ));
    }
    std::fs::read_to_string(path).map_err(|e| format!("cannot read: {e}"))
}

fn single(file: &Path, message: impl Into<String>) -> Problems {
    Problems(vec![Problem {
        file: file.to_owned(),
        path: String::new(),
        message: message.into(),
    }])
}

/// A TOML syntax or type error, located by line and column.
fn parse_problem(file: PathBuf, text: &str, e: &toml::de::Error) -> Problem {
    let location = e.span().map(|span| {
        let before = text.get(..span.start).unwrap_or(text);
        let line = before.matches('\n').count() + 1;
        let column = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
        format!("line {line}, column {column}")
    });
    Problem {
        file,
        path: location.unwrap_or_else(|| "(the whole file)".into()),
        message: e.message().trim().to_owned(),
    }
}

#[cfg(test)]
pub(crate) mod proptests;
#[cfg(test)]
mod tests;
