//! Side-by-side comparison: the same load against several targets in one invocation,
//! interleaved in rounds whose order alternates (A B, B A, ...) so that drift of the
//! machine (thermal, other tenants, page cache) falls on every target alike. Each
//! target's phases merge into one summary; the table reports what each target adds to
//! the first one's p50 and p99.

use std::fmt;
use std::sync::Arc;

use anyhow::{ensure, Context as _};
use hdrhistogram::Histogram;
use http::header::{HeaderName, HeaderValue};
use serde::{Deserialize, Serialize};

use crate::client;
use crate::generator::{self, Plan};
use crate::payload::{Payload, Template};
use crate::record::Recording;
use crate::summary::{Meta, Summary};

/// A named base URL, from `--target NAME=URL`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// Short name for the table (`direct`, `gateway`, `nginx`).
    pub name: String,
    /// Base URL, `http://host:port`.
    pub url: String,
}

/// What to compare and how: every target gets the same model, payload, headers and
/// per-phase plan.
#[derive(Clone, Debug)]
pub struct Comparison {
    /// The targets; the first is the baseline for "added" latency.
    pub targets: Vec<Target>,
    /// KServe v2 model name.
    pub model: String,
    /// Request body.
    pub payload: Payload,
    /// `x-tiergate-budget-ms`, if any.
    pub budget_ms: Option<u64>,
    /// Extra request headers.
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// One phase: its `duration` is the total duration divided by `rounds`.
    pub phase: Plan,
    /// Rounds; each runs every target once.
    pub rounds: u32,
    /// HTTP/2 with prior knowledge.
    pub http2: bool,
    /// Free text for the report.
    pub label: Option<String>,
}

/// The result of a comparison, printed as a table and written with `--json`:
/// `{"label", "model", "rounds", "phase_s", "baseline", "order": [["direct",
/// "gateway"], ["gateway", "direct"], ...], "targets": [{"name", "url", "added_p50_us",
/// "added_p99_us", "summary": Summary}]}`. Added latencies are relative to the
/// baseline (the first target), in µs, negative when faster.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Report {
    /// `--label`.
    pub label: Option<String>,
    /// Model name.
    pub model: String,
    /// Number of rounds.
    pub rounds: u32,
    /// Measured length of each phase, s.
    pub phase_s: f64,
    /// Name of the first target.
    pub baseline: String,
    /// The order in which targets ran, per round.
    pub order: Vec<Vec<String>>,
    /// One entry per target, in `--target` order.
    pub targets: Vec<TargetReport>,
}

/// One target's merged result.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct TargetReport {
    /// Target name.
    pub name: String,
    /// Base URL.
    pub url: String,
    /// p50 of this target minus p50 of the baseline, µs.
    pub added_p50_us: i64,
    /// p99 of this target minus p99 of the baseline, µs.
    pub added_p99_us: i64,
    /// The target's phases merged.
    pub summary: Summary,
}

impl Target {
    /// Parses `NAME=URL`.
    pub fn parse(s: &str) -> anyhow::Result<Self> {
        let (name, url) = s
            .split_once('=')
            .context("expected NAME=URL, e.g. direct=http://127.0.0.1:9000")?;
        ensure!(!name.is_empty() && !url.is_empty(), "expected NAME=URL, got {s:?}");
        Ok(Self {
            name: name.to_owned(),
            url: url.to_owned(),
        })
    }
}

/// The order of target indices in round `round` (0-based): forward in even rounds,
/// backward in odd ones.
pub fn round_order(targets: usize, round: u32) -> Vec<usize> {
    let forward = 0..targets;
    if round % 2 == 0 {
        forward.collect()
    } else {
        forward.rev().collect()
    }
}

/// Runs every round and returns the merged report. Progress goes to stderr.
pub async fn run(cmp: &Comparison) -> anyhow::Result<Report> {
    ensure!(!cmp.targets.is_empty(), "compare needs at least one --target");
    let mut names: Vec<&str> = cmp.targets.iter().map(|t| t.name.as_str()).collect();
    names.sort_unstable();
    ensure!(names.windows(2).all(|w| w[0] != w[1]), "target names must be unique");
    let templates = cmp
        .targets
        .iter()
        .map(|t| Template::new(&t.url, &cmp.model, &cmp.payload, cmp.budget_ms, &cmp.headers).map(Arc::new))
        .collect::<anyhow::Result<Vec<_>>>()?;
    // One client (one keep-alive pool) per target, kept across rounds.
    let clients: Vec<_> = cmp
        .targets
        .iter()
        .map(|_| client::new(cmp.http2 || cmp.payload.grpc))
        .collect();
    let mut merged: Vec<Option<Recording>> = vec![None; cmp.targets.len()];
    let mut order = Vec::new();
    for round in 0..cmp.rounds {
        let indices = round_order(cmp.targets.len(), round);
        for &i in &indices {
            eprintln!(
                "round {}/{}: {} ({})",
                round + 1,
                cmp.rounds,
                cmp.targets[i].name,
                cmp.targets[i].url
            );
            let recording = generator::run(&clients[i], &templates[i], &cmp.phase).await?;
            match &mut merged[i] {
                Some(total) => total.merge(recording),
                slot @ None => *slot = Some(recording),
            }
        }
        order.push(indices.iter().map(|&i| cmp.targets[i].name.clone()).collect());
    }
    let recordings: Vec<Recording> = merged.into_iter().flatten().collect();
    ensure!(recordings.len() == cmp.targets.len(), "--rounds must be >= 1");
    Ok(report(cmp, order, &recordings))
}

fn report(cmp: &Comparison, order: Vec<Vec<String>>, recordings: &[Recording]) -> Report {
    let baseline = &recordings[0].latency;
    let added = |h: &Histogram<u64>, q: f64| h.value_at_quantile(q) as i64 - baseline.value_at_quantile(q) as i64;
    let targets = cmp
        .targets
        .iter()
        .zip(recordings)
        .map(|(t, rec)| {
            let meta = Meta {
                label: Some(t.name.clone()),
                url: t.url.clone(),
                model: cmp.model.clone(),
                schedule: cmp.phase.schedule.to_string(),
                warmup: cmp.phase.warmup,
                budget_ms: cmp.budget_ms,
            };
            TargetReport {
                name: t.name.clone(),
                url: t.url.clone(),
                added_p50_us: added(&rec.latency, 0.5),
                added_p99_us: added(&rec.latency, 0.99),
                summary: Summary::new(&meta, rec),
            }
        })
        .collect();
    Report {
        label: cmp.label.clone(),
        model: cmp.model.clone(),
        rounds: cmp.rounds,
        phase_s: cmp.phase.duration.as_secs_f64(),
        baseline: cmp.targets[0].name.clone(),
        order,
        targets,
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let label = self.label.as_deref().map(|l| format!("{l}: ")).unwrap_or_default();
        let schedule = self
            .targets
            .first()
            .map(|t| t.summary.schedule.as_str())
            .unwrap_or_default();
        writeln!(
            f,
            "{label}model {}, {schedule}, {} rounds of {:.3}s per target; latency in ms",
            self.model, self.rounds, self.phase_s
        )?;
        writeln!(
            f,
            "{:<12} {:>10} {:>9} {:>9} {:>9} {:>9} {:>8} {:>14} {:>14}",
            "target", "req/s", "p50", "p90", "p99", "p99.9", "errors", "added p50 µs", "added p99 µs"
        )?;
        for t in &self.targets {
            let (s, l) = (&t.summary, &t.summary.latency_ms);
            writeln!(
                f,
                "{:<12} {:>10.1} {:>9.3} {:>9.3} {:>9.3} {:>9.3} {:>8} {:>+14} {:>+14}",
                t.name, s.achieved_rps, l.p50, l.p90, l.p99, l.p999, s.failures, t.added_p50_us, t.added_p99_us
            )?;
        }
        write!(
            f,
            "added = target minus {}; errors = transport + dropped + status >= 400",
            self.baseline
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_alternate_order() {
        assert_eq!(round_order(2, 0), [0, 1]);
        assert_eq!(round_order(2, 1), [1, 0]);
        assert_eq!(round_order(3, 2), [0, 1, 2]);
        assert_eq!(round_order(3, 3), [2, 1, 0]);
    }

    #[test]
    fn parses_targets() -> anyhow::Result<()> {
        let t = Target::parse("direct=http://127.0.0.1:9000")?;
        assert_eq!(
            t,
            Target {
                name: "direct".into(),
                url: "http://127.0.0.1:9000".into()
            }
        );
        assert!(Target::parse("http://127.0.0.1:9000").is_err());
        assert!(Target::parse("=http://x").is_err());
        Ok(())
    }
}
