//! What a route's shadow has found since its report was last reset: totals per output,
//! drops by reason, and a bounded sample of the worst disagreements.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use serde_json::{json, Value};

use super::compare::{Agreement, Comparison, OutputComparison};
use crate::decision::Tier;

/// Disagreements kept for inspection, the worst (largest absolute difference) first.
pub const WORST_KEPT: usize = 20;

/// Why a shadow call was not compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Drop {
    /// The candidate's pool was at its concurrency limit.
    Full,
    /// The shadow budget ran out.
    Timeout,
    /// The candidate could not be reached (or every endpoint is ejected).
    Down,
    /// The candidate's answer (or the primary's) is not a KServe v2 response.
    Unreadable,
    /// Anything else the candidate's pool refused.
    Error,
}

impl Drop {
    /// Every reason, as metrics register them.
    pub const ALL: [Drop; 5] = [Drop::Full, Drop::Timeout, Drop::Down, Drop::Unreadable, Drop::Error];

    /// Its name in metrics and reports.
    pub fn as_str(self) -> &'static str {
        match self {
            Drop::Full => "full",
            Drop::Timeout => "timeout",
            Drop::Down => "down",
            Drop::Unreadable => "unreadable",
            Drop::Error => "error",
        }
    }
}

/// One route's findings.
#[derive(Debug)]
pub struct Report {
    since: SystemTime,
    compared: BTreeMap<&'static str, u64>,
    dropped: BTreeMap<Drop, u64>,
    status_mismatches: u64,
    shape_mismatches: u64,
    primary_seconds: f64,
    candidate_seconds: f64,
    outputs: BTreeMap<String, Totals>,
    worst: Vec<Worst>,
}

/// A report's totals, as a promotion gate judges them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Standing {
    /// Calls (and batches) compared.
    pub calls: u64,
    /// Of them, with another status, and outputs with another name, datatype or shape.
    pub mismatched: u64,
    /// Rows compared.
    pub rows: u64,
    /// Rows within tolerance, or outside it only where the primary disagreed with itself.
    pub agreeing: u64,
}

/// One output's totals.
#[derive(Debug)]
struct Totals {
    rows: u64,
    rows_exact: u64,
    rows_within: u64,
    rows_noisy: u64,
    values: u64,
    values_exact: u64,
    max_abs: f64,
    sum_abs: f64,
    max_rel: f64,
    sum_rel: f64,
    top1: Agreement,
    topk: Agreement,
    cosine_sum: f64,
    cosine_rows: u64,
    cosine_min: f64,
}

/// One disagreement kept for inspection.
#[derive(Debug, Clone)]
struct Worst {
    at: SystemTime,
    tier: Tier,
    request: Option<String>,
    output: String,
    row: u64,
    index: u64,
    primary: f64,
    candidate: f64,
}

impl Default for Report {
    fn default() -> Self {
        Report {
            since: SystemTime::now(),
            compared: BTreeMap::new(),
            dropped: BTreeMap::new(),
            status_mismatches: 0,
            shape_mismatches: 0,
            primary_seconds: 0.0,
            candidate_seconds: 0.0,
            outputs: BTreeMap::new(),
            worst: Vec::new(),
        }
    }
}

impl Report {
    /// Counts a call that was not compared.
    pub fn dropped(&mut self, why: Drop) {
        *self.dropped.entry(why).or_default() += 1;
    }

    /// Adds one compared pair: `request` names the caller (real-time) or is `None` (a
    /// batch's rows belong to several).
    pub fn add(&mut self, tier: Tier, cmp: &Comparison, took: (Duration, Duration), request: Option<&str>) {
        *self.compared.entry(tier.as_str()).or_default() += 1;
        self.primary_seconds += took.0.as_secs_f64();
        self.candidate_seconds += took.1.as_secs_f64();
        self.status_mismatches += u64::from(cmp.status_mismatch.is_some());
        self.shape_mismatches += cmp.shape_mismatches.len() as u64;
        for o in &cmp.outputs {
            self.outputs.entry(o.name.clone()).or_default().add(o);
            let held = o.rows - o.rows_within - o.rows_noisy;
            if let Some((row, index, primary, candidate)) = o.worst.filter(|_| held > 0) {
                self.keep(Worst {
                    at: SystemTime::now(),
                    tier,
                    request: request.map(str::to_owned),
                    output: o.name.clone(),
                    row,
                    index,
                    primary,
                    candidate,
                });
            }
        }
    }

    fn keep(&mut self, worst: Worst) {
        let diff = |w: &Worst| (w.candidate - w.primary).abs();
        self.worst.push(worst);
        self.worst.sort_by(|a, b| diff(b).total_cmp(&diff(a)));
        self.worst.truncate(WORST_KEPT);
    }

    /// What the gate judges: calls compared and mismatched, rows compared and agreeing.
    pub fn standing(&self) -> Standing {
        let (rows, within, noisy) = self.rows();
        Standing {
            calls: self.compared.values().sum(),
            mismatched: self.status_mismatches + self.shape_mismatches,
            rows,
            agreeing: within + noisy,
        }
    }

    /// Rows compared, rows within tolerance, and rows outside it that are noise (the
    /// primary disagreed with itself there), over every output.
    fn rows(&self) -> (u64, u64, u64) {
        self.outputs.values().fold((0, 0, 0), |(rows, within, noisy), t| {
            (rows + t.rows, within + t.rows_within, noisy + t.rows_noisy)
        })
    }

    /// The report as the admin API answers it.
    pub fn to_json(&self) -> Value {
        let (rows, within, noisy) = self.rows();
        let compared: u64 = self.compared.values().sum();
        let ratio = |a: f64, b: u64| if b == 0 { Value::Null } else { json!(a / b as f64) };
        let outputs: serde_json::Map<String, Value> = self
            .outputs
            .iter()
            .map(|(name, t)| (name.clone(), t.to_json()))
            .collect();
        let worst: Vec<Value> = self
            .worst
            .iter()
            .map(|w| {
                json!({"at": humantime::format_rfc3339_millis(w.at).to_string(), "tier": w.tier.as_str(),
                       "request_id": w.request, "output": w.output, "row": w.row, "index": w.index,
                       "primary": w.primary, "candidate": w.candidate,
                       "abs_diff": (w.candidate - w.primary).abs()})
            })
            .collect();
        json!({
            "since": humantime::format_rfc3339_millis(self.since).to_string(),
            "compared": compared,
            "compared_by_tier": self.compared,
            "dropped": self.dropped.iter().map(|(d, n)| (d.as_str(), *n)).collect::<BTreeMap<_, _>>(),
            "rows": rows,
            "rows_within": within,
            "rows_noisy": noisy,
            "agreement": ratio((within + noisy) as f64, rows),
            "status_mismatches": self.status_mismatches,
            "shape_mismatches": self.shape_mismatches,
            "latency": {
                "primary_mean_ms": ratio(self.primary_seconds * 1e3, compared),
                "candidate_mean_ms": ratio(self.candidate_seconds * 1e3, compared),
                "candidate_to_primary": if self.primary_seconds > 0.0 {
                    json!(self.candidate_seconds / self.primary_seconds)
                } else {
                    Value::Null
                },
            },
            "outputs": outputs,
            "worst": worst,
        })
    }
}

/// One output's figures from one comparison, as a report writes an output.
pub fn output_json(o: &OutputComparison) -> Value {
    let mut totals = Totals::default();
    totals.add(o);
    let mut json = totals.to_json();
    if let Some((row, index, primary, candidate)) = o.worst {
        json["worst"] = json!({"row": row, "index": index, "primary": primary, "candidate": candidate});
    }
    json
}

impl Default for Totals {
    fn default() -> Self {
        Totals {
            rows: 0,
            rows_exact: 0,
            rows_within: 0,
            rows_noisy: 0,
            values: 0,
            values_exact: 0,
            max_abs: 0.0,
            sum_abs: 0.0,
            max_rel: 0.0,
            sum_rel: 0.0,
            top1: Agreement::default(),
            topk: Agreement::default(),
            cosine_sum: 0.0,
            cosine_rows: 0,
            cosine_min: 1.0,
        }
    }
}

impl Totals {
    fn add(&mut self, o: &OutputComparison) {
        self.rows += o.rows;
        self.rows_exact += o.rows_exact;
        self.rows_within += o.rows_within;
        self.rows_noisy += o.rows_noisy;
        self.values += o.values;
        self.values_exact += o.values_exact;
        self.max_abs = self.max_abs.max(o.max_abs);
        self.sum_abs += o.sum_abs;
        self.max_rel = self.max_rel.max(o.max_rel);
        self.sum_rel += o.sum_rel;
        self.top1.agreed += o.top1.agreed;
        self.top1.of += o.top1.of;
        self.topk.agreed += o.topk.agreed;
        self.topk.of += o.topk.of;
        self.cosine_sum += o.cosine_sum;
        self.cosine_rows += o.top1.of;
        self.cosine_min = self.cosine_min.min(o.cosine_min);
    }

    fn to_json(&self) -> Value {
        let share = |a: u64, b: u64| {
            if b == 0 {
                Value::Null
            } else {
                json!(a as f64 / b as f64)
            }
        };
        let mean = |sum: f64, n: u64| if n == 0 { Value::Null } else { json!(sum / n as f64) };
        json!({
            "rows": self.rows,
            "rows_exact": self.rows_exact,
            "rows_within": self.rows_within,
            "rows_noisy": self.rows_noisy,
            "exact_rate": share(self.values_exact, self.values),
            "within_rate": share(self.rows_within + self.rows_noisy, self.rows),
            "max_abs_diff": self.max_abs,
            "mean_abs_diff": mean(self.sum_abs, self.values),
            "max_rel_diff": self.max_rel,
            "mean_rel_diff": mean(self.sum_rel, self.values),
            "top1_agreement": share(self.top1.agreed, self.top1.of),
            "topk_agreement": share(self.topk.agreed, self.topk.of),
            "cosine_mean": mean(self.cosine_sum, self.cosine_rows),
            "cosine_min": if self.cosine_rows == 0 { Value::Null } else { json!(self.cosine_min) },
        })
    }
}
