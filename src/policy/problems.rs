//! What is wrong with a policy, and the collector validation reports it to.

use std::fmt;
use std::num::NonZeroU32;
use std::path::{Path, PathBuf};

/// One thing wrong with a policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// The file it is in.
    pub file: PathBuf,
    /// Dotted path to the key, e.g. `routes.resnet50.realtime.endpoints[0]`.
    pub path: String,
    /// What is wrong and, where it helps, what would be right.
    pub message: String,
}

/// Every problem found in a policy; never empty.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct Problems(pub Vec<Problem>);

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            write!(f, "{}: {}", self.file.display(), self.message)
        } else {
            write!(f, "{}: {}: {}", self.file.display(), self.path, self.message)
        }
    }
}

impl fmt::Display for Problems {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        one_a_line(f, &self.0)
    }
}

/// Writes `items` one a line, as every list of problems (policy or startup) prints.
pub(crate) fn one_a_line(f: &mut fmt::Formatter<'_>, items: &[impl fmt::Display]) -> fmt::Result {
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            writeln!(f)?;
        }
        write!(f, "{item}")?;
    }
    Ok(())
}

/// Collects problems while one file is validated.
pub(super) struct Check<'a> {
    pub(super) file: &'a Path,
    pub(super) problems: &'a mut Vec<Problem>,
}

impl Check<'_> {
    pub(super) fn fail(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.problems.push(Problem {
            file: self.file.to_owned(),
            path: path.into(),
            message: message.into(),
        });
    }

    /// `value` at `path` as a count of 1 or more, when set; a problem otherwise.
    pub(super) fn count(&mut self, path: impl FnOnce() -> String, value: Option<i64>) -> Option<u64> {
        value.and_then(|n| match u64::try_from(n) {
            Ok(n) if n > 0 => Some(n),
            _ => {
                self.fail(path(), format!("must be 1 or more, got {n}"));
                None
            }
        })
    }

    pub(super) fn nonzero(&mut self, path: String, value: Option<i64>, default: u32) -> NonZeroU32 {
        let fallback = NonZeroU32::new(default).expect("defaults are non-zero");
        match value {
            None => fallback,
            Some(v) => match u32::try_from(v).ok().and_then(NonZeroU32::new) {
                Some(n) => n,
                None => {
                    self.fail(path, format!("must be between 1 and {}, got {v}", u32::MAX));
                    fallback
                }
            },
        }
    }
}
