//! A shadow batch's comparison: how the candidate's answer to each line compared with
//! the primary's ([`Scored`], kept with the line's answer), and the batch's summary
//! ([`Summary`], every line added up), written beside the output file when the batch
//! ends.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// Why a line's answers were not compared, when nothing more precise is known: the
/// primary never answered it (it failed, expired or was cancelled).
pub const NO_ANSWER: &str = "no_primary_answer";

/// One line's comparison, as the comparison file holds it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Scored {
    /// Why the answers were not compared (the shadow's drop reasons: `full`, `timeout`,
    /// `down`, `unreadable`, `error`; `off` when the route's shadow was switched off;
    /// [`NO_ANSWER`]), when they were not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_compared: Option<String>,
    /// The primary's and the candidate's statuses, when they differ.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status_mismatch: Option<(u16, u16)>,
    /// Outputs whose name, datatype or shape differ, with what differs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shape_mismatches: Vec<String>,
    /// Rows compared, over every output.
    #[serde(default)]
    pub rows: u64,
    /// Rows with every value within the route's tolerance.
    #[serde(default)]
    pub rows_within: u64,
    /// Rows outside tolerance where the primary also disagreed with itself.
    #[serde(default)]
    pub rows_noisy: u64,
    /// The largest absolute difference of any value.
    #[serde(default)]
    pub max_abs_diff: f64,
    /// How long the candidate took, in ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub candidate_ms: Option<f64>,
    /// Each output's figures (exact and within-tolerance rates, differences, top-k
    /// agreement, cosine, its worst value), by name.
    #[serde(default, skip_serializing_if = "Value::is_null")]
    pub outputs: Value,
}

impl Scored {
    /// A line whose answers were not compared, for `why`.
    pub fn not_compared(why: &str) -> Scored {
        Scored {
            not_compared: Some(why.to_owned()),
            ..Scored::default()
        }
    }

    /// Whether the candidate agreed on the whole line: compared, the same status and
    /// shapes, and every row within tolerance (or noise).
    pub fn agrees(&self) -> bool {
        self.not_compared.is_none()
            && self.status_mismatch.is_none()
            && self.shape_mismatches.is_empty()
            && self.rows_within + self.rows_noisy == self.rows
    }

    /// As stored with the line's answer.
    pub fn to_text(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// A stored comparison read back; one that does not read is reported as not compared.
    pub fn from_text(text: &str) -> Scored {
        serde_json::from_str(text).unwrap_or_else(|_| Scored::not_compared("unreadable"))
    }
}

/// A shadow batch's lines added up.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Summary {
    lines: u64,
    compared: u64,
    agreeing_lines: u64,
    not_compared: BTreeMap<String, u64>,
    status_mismatches: u64,
    shape_mismatches: u64,
    rows: u64,
    rows_within: u64,
    rows_noisy: u64,
    max_abs_diff: f64,
    candidate_ms: f64,
}

impl Summary {
    /// Adds one line.
    pub fn add(&mut self, line: &Scored) {
        self.lines += 1;
        if let Some(why) = &line.not_compared {
            *self.not_compared.entry(why.clone()).or_default() += 1;
            return;
        }
        self.compared += 1;
        self.agreeing_lines += u64::from(line.agrees());
        self.status_mismatches += u64::from(line.status_mismatch.is_some());
        self.shape_mismatches += line.shape_mismatches.len() as u64;
        self.rows += line.rows;
        self.rows_within += line.rows_within;
        self.rows_noisy += line.rows_noisy;
        self.max_abs_diff = self.max_abs_diff.max(line.max_abs_diff);
        self.candidate_ms += line.candidate_ms.unwrap_or(0.0);
    }

    /// The summary as the batch object shows it.
    pub fn to_json(&self) -> Value {
        let share = |a: u64, b: u64| {
            if b == 0 {
                Value::Null
            } else {
                json!(a as f64 / b as f64)
            }
        };
        json!({
            "lines": self.lines,
            "compared": self.compared,
            "not_compared": self.not_compared,
            "agreeing_lines": self.agreeing_lines,
            "status_mismatches": self.status_mismatches,
            "shape_mismatches": self.shape_mismatches,
            "rows": self.rows,
            "rows_within": self.rows_within,
            "rows_noisy": self.rows_noisy,
            "agreement": share(self.rows_within + self.rows_noisy, self.rows),
            "max_abs_diff": self.max_abs_diff,
            "candidate_mean_ms": if self.compared == 0 {
                Value::Null
            } else {
                json!(self.candidate_ms / self.compared as f64)
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_summary_adds_up_its_lines() {
        let agreeing = Scored {
            rows: 4,
            rows_within: 4,
            max_abs_diff: 0.0,
            candidate_ms: Some(2.0),
            ..Scored::default()
        };
        let differing = Scored {
            rows: 4,
            rows_within: 2,
            rows_noisy: 1,
            max_abs_diff: 0.5,
            candidate_ms: Some(4.0),
            ..Scored::default()
        };
        let mut summary = Summary::default();
        for line in [&agreeing, &differing, &Scored::not_compared("timeout")] {
            summary.add(&Scored::from_text(&line.to_text()));
        }
        let json = summary.to_json();
        assert_eq!((&json["lines"], &json["compared"]), (&json!(3), &json!(2)));
        assert_eq!(json["not_compared"], json!({"timeout": 1}));
        assert_eq!(
            (&json["rows"], &json["rows_within"], &json["rows_noisy"]),
            (&json!(8), &json!(6), &json!(1))
        );
        assert_eq!(json["agreement"], json!(7.0 / 8.0));
        assert_eq!(
            (&json["agreeing_lines"], &json["max_abs_diff"]),
            (&json!(1), &json!(0.5))
        );
        assert_eq!(json["candidate_mean_ms"], json!(3.0));
        assert_eq!(
            Scored::from_text("not json").not_compared.as_deref(),
            Some("unreadable")
        );
    }
}
