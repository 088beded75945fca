//! What a route's shadow has found since its report was last reset, or since any
//! minute of the last day: totals per output, drops by reason, and a bounded sample of
//! the worst disagreements.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};

use super::compare::{Agreement, Comparison, OutputComparison, DIFF_BOUNDS, DIFF_BUCKETS};
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

/// Minutes of findings a report keeps apart, so it can answer since any of them.
pub const MINUTES_KEPT: usize = 24 * 60;

/// Minutes a report shows one by one (its `minutes`), the newest.
pub const MINUTES_SHOWN: usize = 120;

/// One route's findings: since it was reset, and minute by minute for the last
/// [`MINUTES_KEPT`] minutes.
#[derive(Debug)]
pub struct Report {
    since: SystemTime,
    total: Slice,
    /// (minute since the Unix epoch, what it found), oldest first.
    minutes: VecDeque<(u64, Slice)>,
    /// Minutes before this one were let go (0: none was).
    kept_from: u64,
}

/// What was found over some time.
#[derive(Debug, Default, Clone)]
struct Slice {
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
#[derive(Debug, Clone)]
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
    abs_diffs: [u64; DIFF_BUCKETS],
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
        Report::starting(SystemTime::now())
    }
}

impl Report {
    /// An empty report, counting from `since`.
    fn starting(since: SystemTime) -> Report {
        Report {
            since,
            total: Slice::default(),
            minutes: VecDeque::new(),
            kept_from: 0,
        }
    }

    /// Counts a call that was not compared.
    pub fn dropped(&mut self, why: Drop) {
        self.total.dropped(why);
        self.minute(SystemTime::now()).dropped(why);
    }

    /// Adds one compared pair: `request` names the caller (real-time) or is `None` (a
    /// batch's rows belong to several).
    pub fn add(&mut self, tier: Tier, cmp: &Comparison, took: (Duration, Duration), request: Option<&str>) {
        self.add_at(SystemTime::now(), tier, cmp, took, request);
    }

    fn add_at(
        &mut self,
        at: SystemTime,
        tier: Tier,
        cmp: &Comparison,
        took: (Duration, Duration),
        request: Option<&str>,
    ) {
        self.total.add(tier, cmp, took, request, at);
        self.minute(at).add(tier, cmp, took, request, at);
    }

    /// The slice of the minute `at` falls in (a new one each minute; those older than a
    /// day are let go).
    fn minute(&mut self, at: SystemTime) -> &mut Slice {
        let minute = minute(at);
        if self.minutes.back().is_none_or(|(m, _)| *m != minute) {
            if self.minutes.len() >= MINUTES_KEPT {
                if let Some((gone, _)) = self.minutes.pop_front() {
                    self.kept_from = gone + 1;
                }
            }
            self.minutes.push_back((minute, Slice::default()));
        }
        let (_, slice) = self.minutes.back_mut().expect("pushed above");
        slice
    }

    /// What the gate judges: calls compared and mismatched, rows compared and agreeing,
    /// since the report was reset.
    pub fn standing(&self) -> Standing {
        self.total.standing()
    }

    /// The report as the admin API answers it: since it was reset, or, given `since`,
    /// since the start of that minute (no earlier than the reset, nor than the oldest
    /// minute kept); its `since` says which.
    ///
    /// Beside the totals, `minutes` has the last [`MINUTES_SHOWN`] minutes of that
    /// time one by one (compared, rows, agreement, each side's mean latency): the
    /// report over time.
    pub fn to_json(&self, since: Option<SystemTime>) -> Value {
        let Some(asked) = since.filter(|s| *s > self.since) else {
            let mut json = self.total.to_json(self.since);
            json["minutes"] = self.minutes_json(minute(self.since));
            return json;
        };
        let first = minute(asked).max(self.kept_from);
        let mut slice = Slice::default();
        for (_, minute) in self.minutes.iter().filter(|(m, _)| *m >= first) {
            slice.merge(minute);
        }
        let from = UNIX_EPOCH + Duration::from_secs(first * 60);
        let mut json = slice.to_json(from.max(self.since));
        json["minutes"] = self.minutes_json(first);
        json
    }

    /// The kept minutes from `first` on, the last [`MINUTES_SHOWN`] of them.
    fn minutes_json(&self, first: u64) -> Value {
        let shown: Vec<&(u64, Slice)> = self.minutes.iter().filter(|(m, _)| *m >= first).collect();
        let from = shown.len().saturating_sub(MINUTES_SHOWN);
        Value::Array(
            shown[from..]
                .iter()
                .map(|(m, slice)| {
                    let (rows, within, noisy) = slice.rows();
                    let compared: u64 = slice.compared.values().sum();
                    let mean = |seconds: f64| (compared > 0).then(|| seconds * 1e3 / compared as f64);
                    json!({
                        "at": humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_secs(m * 60)).to_string(),
                        "compared": compared,
                        "rows": rows,
                        "agreement": (rows > 0).then(|| (within + noisy) as f64 / rows as f64),
                        "primary_mean_ms": mean(slice.primary_seconds),
                        "candidate_mean_ms": mean(slice.candidate_seconds),
                    })
                })
                .collect(),
        )
    }
}

/// The values by absolute difference, each bucket named by its upper bound (`0`: equal).
fn diff_histogram(counts: &[u64; DIFF_BUCKETS]) -> Value {
    let bounds = std::iter::once("0".to_owned())
        .chain(DIFF_BOUNDS.iter().map(|b| format!("{b:e}").replace("e0", "")))
        .chain(std::iter::once("+Inf".to_owned()));
    Value::Array(
        bounds
            .zip(counts)
            .map(|(le, n)| json!({"le": le, "values": n}))
            .collect(),
    )
}

/// The minute (since the Unix epoch) `at` falls in.
fn minute(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs() / 60)
}

impl Slice {
    fn dropped(&mut self, why: Drop) {
        *self.dropped.entry(why).or_default() += 1;
    }

    fn add(&mut self, tier: Tier, cmp: &Comparison, took: (Duration, Duration), request: Option<&str>, at: SystemTime) {
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
                    at,
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
        self.worst.push(worst);
        self.keep_worst();
    }

    fn keep_worst(&mut self) {
        let diff = |w: &Worst| (w.candidate - w.primary).abs();
        self.worst.sort_by(|a, b| diff(b).total_cmp(&diff(a)));
        self.worst.truncate(WORST_KEPT);
    }

    /// Adds what `other` found.
    fn merge(&mut self, other: &Slice) {
        for (tier, n) in &other.compared {
            *self.compared.entry(tier).or_default() += n;
        }
        for (why, n) in &other.dropped {
            *self.dropped.entry(*why).or_default() += n;
        }
        self.status_mismatches += other.status_mismatches;
        self.shape_mismatches += other.shape_mismatches;
        self.primary_seconds += other.primary_seconds;
        self.candidate_seconds += other.candidate_seconds;
        for (name, totals) in &other.outputs {
            self.outputs.entry(name.clone()).or_default().merge(totals);
        }
        self.worst.extend(other.worst.iter().cloned());
        self.keep_worst();
    }

    fn standing(&self) -> Standing {
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

    fn to_json(&self, since: SystemTime) -> Value {
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
            "since": humantime::format_rfc3339_millis(since).to_string(),
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
    let mut json = Totals::of(o).to_json();
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
            abs_diffs: [0; DIFF_BUCKETS],
        }
    }
}

impl Totals {
    /// One comparison's output as totals.
    fn of(o: &OutputComparison) -> Totals {
        Totals {
            rows: o.rows,
            rows_exact: o.rows_exact,
            rows_within: o.rows_within,
            rows_noisy: o.rows_noisy,
            values: o.values,
            values_exact: o.values_exact,
            max_abs: o.max_abs,
            sum_abs: o.sum_abs,
            max_rel: o.max_rel,
            sum_rel: o.sum_rel,
            top1: o.top1,
            topk: o.topk,
            cosine_sum: o.cosine_sum,
            cosine_rows: o.top1.of,
            cosine_min: o.cosine_min,
            abs_diffs: o.abs_diffs,
        }
    }

    fn add(&mut self, o: &OutputComparison) {
        self.merge(&Totals::of(o));
    }

    fn merge(&mut self, t: &Totals) {
        self.rows += t.rows;
        self.rows_exact += t.rows_exact;
        self.rows_within += t.rows_within;
        self.rows_noisy += t.rows_noisy;
        self.values += t.values;
        self.values_exact += t.values_exact;
        self.max_abs = self.max_abs.max(t.max_abs);
        self.sum_abs += t.sum_abs;
        self.max_rel = self.max_rel.max(t.max_rel);
        self.sum_rel += t.sum_rel;
        self.top1.agreed += t.top1.agreed;
        self.top1.of += t.top1.of;
        self.topk.agreed += t.topk.agreed;
        self.topk.of += t.topk.of;
        self.cosine_sum += t.cosine_sum;
        self.cosine_rows += t.cosine_rows;
        self.cosine_min = self.cosine_min.min(t.cosine_min);
        for (mine, theirs) in self.abs_diffs.iter_mut().zip(t.abs_diffs) {
            *mine += theirs;
        }
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
            "abs_diff_histogram": diff_histogram(&self.abs_diffs),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shadow::compare::OutputComparison;

    /// A comparison of `rows` rows, `within` of them within tolerance.
    fn rows(rows: u64, within: u64) -> Comparison {
        Comparison {
            outputs: vec![OutputComparison {
                name: "OUTPUT0".into(),
                rows,
                rows_within: within,
                ..OutputComparison::default()
            }],
            ..Comparison::default()
        }
    }

    #[test]
    fn a_report_answers_since_any_minute_it_keeps() {
        let now = SystemTime::now();
        let ago = |minutes: u64| now - Duration::from_secs(minutes * 60);
        let mut report = Report::starting(ago(30));
        let took = (Duration::from_millis(1), Duration::from_millis(2));
        report.add_at(ago(20), Tier::Realtime, &rows(4, 1), took, Some("old"));
        report.add_at(ago(2), Tier::MicroBatch, &rows(6, 6), took, None);
        let all = report.to_json(None);
        assert_eq!(
            (&all["compared"], &all["rows"], &all["rows_within"]),
            (&json!(2), &json!(10), &json!(7))
        );
        let recent = report.to_json(Some(ago(10)));
        assert_eq!(
            (&recent["compared"], &recent["rows"]),
            (&json!(1), &json!(6)),
            "{recent:#}"
        );
        assert_eq!(recent["compared_by_tier"], json!({"micro_batch": 1}));
        // Over time: each minute with what it found, the one before `since` left out.
        let minutes = all["minutes"].as_array().expect("minutes");
        let agreement: Vec<&Value> = minutes.iter().map(|m| &m["agreement"]).collect();
        assert_eq!(agreement, [&json!(0.25), &json!(1.0)], "{all:#}");
        assert_eq!(minutes[1]["candidate_mean_ms"], json!(2.0));
        assert_eq!(recent["minutes"].as_array().map(Vec::len), Some(1));
        let minute_start = UNIX_EPOCH + Duration::from_secs(minute(ago(10)) * 60);
        assert_eq!(
            recent["since"],
            json!(humantime::format_rfc3339_millis(minute_start).to_string())
        );
        // Before the reset is since the reset.
        assert_eq!(report.to_json(Some(ago(60))), all);
        assert_eq!(report.standing().rows, 10, "the gate judges everything since the reset");
    }

    #[test]
    fn a_report_keeps_a_day_of_minutes_and_says_where_it_starts() {
        let start = UNIX_EPOCH + Duration::from_secs(1_000_000 * 60);
        let mut report = Report::starting(start);
        let took = (Duration::ZERO, Duration::ZERO);
        for m in 0..=MINUTES_KEPT as u64 {
            report.add_at(
                start + Duration::from_secs(m * 60),
                Tier::Realtime,
                &rows(1, 1),
                took,
                None,
            );
        }
        assert_eq!(report.minutes.len(), MINUTES_KEPT);
        let since_start = report.to_json(Some(start + Duration::from_secs(1)));
        assert_eq!(
            since_start["compared"],
            json!(MINUTES_KEPT),
            "the first minute was let go"
        );
        let kept = UNIX_EPOCH + Duration::from_secs((1_000_000 + 1) * 60);
        assert_eq!(
            since_start["since"],
            json!(humantime::format_rfc3339_millis(kept).to_string())
        );
        assert_eq!(report.to_json(None)["compared"], json!(MINUTES_KEPT + 1));
    }
}
