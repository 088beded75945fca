//! `tiergate shadow report|reset|promote ROUTE`: a route's shadow candidate through the
//! admin API (see `tiergate flags` for the connection options and exit codes).

use std::process::ExitCode;

use bytes::Bytes;
use clap::Subcommand;
use serde_json::Value;

use super::admin::{call, change, failed, text, Admin, Write};

/// `tiergate shadow` subcommands.
#[derive(Debug, Subcommand)]
pub enum ShadowCommand {
    /// What the route's candidate agreed and disagreed on since its report was reset (or
    /// since --since).
    Report {
        /// The route.
        route: String,
        /// Print the admin API's JSON answer as it is.
        #[arg(long)]
        json: bool,
        /// Only what was found since then: a duration before now (`1h`, `30m`) or a UTC
        /// time (`2026-12-01T08:00:00Z`), to the minute, within the last day.
        #[arg(long)]
        since: Option<String>,
        #[command(flatten)]
        admin: Admin,
    },
    /// Start the route's report afresh (the metrics keep counting).
    Reset {
        /// The route.
        route: String,
        #[command(flatten)]
        admin: Admin,
    },
    /// Make the candidate the route's pool (validated, versioned, audited; undo with
    /// `tiergate policy rollback`). Refused below the route's gate unless --force.
    Promote {
        /// The route.
        route: String,
        /// Promote even though the gate is not met.
        #[arg(long)]
        force: bool,
        #[command(flatten)]
        write: Write,
        #[command(flatten)]
        admin: Admin,
    },
}

/// Runs `tiergate shadow ...`.
pub async fn run(command: ShadowCommand) -> anyhow::Result<ExitCode> {
    match command {
        ShadowCommand::Report {
            route,
            json,
            since,
            admin,
        } => {
            let query = since.map_or(String::new(), |s| format!("?since={}", s.replace(':', "%3A")));
            let path = format!("/admin/shadow/{route}{query}");
            let (status, body) = call(&admin, "GET", &path, None, Bytes::new()).await?;
            if status != 200 {
                return Ok(failed(status, &body));
            }
            match json {
                true => println!("{body:#}"),
                false => print!("{}", report(&body)),
            }
            Ok(ExitCode::SUCCESS)
        }
        ShadowCommand::Reset { route, admin } => {
            let path = format!("/admin/shadow/{route}/reset");
            let (status, body) = call(&admin, "POST", &path, None, Bytes::new()).await?;
            if status != 200 {
                return Ok(failed(status, &body));
            }
            println!("route {route}: shadow report reset at {}", text(&body["since"]));
            Ok(ExitCode::SUCCESS)
        }
        ShadowCommand::Promote {
            route,
            force,
            write,
            admin,
        } => {
            let path = match force {
                true => format!("/admin/shadow/{route}/promote?force=true"),
                false => format!("/admin/shadow/{route}/promote"),
            };
            let path = match (write.dry_run(), force) {
                (true, true) => format!("{path}&dry_run=true"),
                (true, false) => format!("{path}?dry_run=true"),
                _ => path,
            };
            change(&admin, &write.applied(), "POST", &path, Bytes::new()).await
        }
    }
}

/// A number for a person: `-` for none, a whole number with thousands separators, else
/// four significant digits.
fn n(v: &Value) -> String {
    match v {
        Value::Null => "-".to_owned(),
        Value::Number(x) if x.is_u64() || x.is_i64() => thousands(x.as_f64().unwrap_or(0.0)),
        Value::Number(x) => {
            let x = x.as_f64().unwrap_or(0.0);
            match x.abs() {
                0.0 => "0".to_owned(),
                a if a >= 1000.0 => thousands(x.round()),
                a if a >= 0.001 => format!("{:.4}", x)
                    .trim_end_matches('0')
                    .trim_end_matches('.')
                    .to_owned(),
                _ => format!("{x:.3e}"),
            }
        }
        other => text(other),
    }
}

/// A share for a person: `-` for none, else a percentage.
fn pct(v: &Value) -> String {
    v.as_f64().map_or("-".to_owned(), |x| format!("{:.2}%", 100.0 * x))
}

/// A whole number with thousands separators.
fn thousands(x: f64) -> String {
    let digits = format!("{:.0}", x.abs());
    let mut out = String::new();
    for (i, d) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(d);
    }
    if x < 0.0 {
        out.insert(0, '-');
    }
    out
}

/// `{"a": 1, "b": 2}` as `a 1, b 2` (`none` when empty).
fn counts(v: &Value) -> String {
    let parts: Vec<String> = v
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, c)| format!("{k} {}", n(c)))
        .collect();
    match parts.is_empty() {
        true => "none".to_owned(),
        false => parts.join(", "),
    }
}

/// The report as lines for a terminal.
fn report(r: &Value) -> String {
    let candidate = r["candidate"]
        .as_array()
        .map(|c| c.iter().map(text).collect::<Vec<_>>().join(", "))
        .unwrap_or_default();
    let on = if r["on"].as_bool() == Some(true) { "on" } else { "off" };
    let mut out = format!(
        "route {}: shadow {on}, candidate {candidate}, {}% of calls\n",
        text(&r["route"]),
        n(&r["percent"])
    );
    let dropped: u64 = r["dropped"]
        .as_object()
        .map_or(0, |d| d.values().filter_map(Value::as_u64).sum());
    out += &format!(
        "since {}: {} calls compared ({}); {} dropped ({})\n",
        text(&r["since"]),
        n(&r["compared"]),
        counts(&r["compared_by_tier"]),
        thousands(dropped as f64),
        counts(&r["dropped"])
    );
    out += &format!(
        "rows: {} compared, {} within tolerance (agreement {}); {} status and {} shape mismatches\n",
        n(&r["rows"]),
        n(&r["rows_within"]),
        pct(&r["agreement"]),
        n(&r["status_mismatches"]),
        n(&r["shape_mismatches"])
    );
    let latency = &r["latency"];
    out += &format!(
        "latency: primary {} ms, candidate {} ms ({}x the primary's)\n",
        n(&latency["primary_mean_ms"]),
        n(&latency["candidate_mean_ms"]),
        n(&latency["candidate_to_primary"])
    );
    let outputs = r["outputs"].as_object().into_iter().flatten().collect::<Vec<_>>();
    if !outputs.is_empty() {
        out += &format!(
            "  {:<16} {:>8} {:>8} {:>10} {:>10} {:>7} {:>7} {:>8}\n",
            "output", "within", "exact", "max |d|", "mean |d|", "top-1", "top-k", "cos min"
        );
    }
    for (name, o) in outputs {
        out += &format!(
            "  {:<16} {:>8} {:>8} {:>10} {:>10} {:>7} {:>7} {:>8}\n",
            name,
            pct(&o["within_rate"]),
            pct(&o["exact_rate"]),
            n(&o["max_abs_diff"]),
            n(&o["mean_abs_diff"]),
            pct(&o["top1_agreement"]),
            pct(&o["topk_agreement"]),
            n(&o["cosine_min"])
        );
    }
    for w in r["worst"].as_array().into_iter().flatten() {
        out += &format!(
            "  worst: {} {} request {} output {} row {} [{}]: primary {}, candidate {}\n",
            text(&w["at"]),
            text(&w["tier"]),
            text(&w["request_id"]),
            text(&w["output"]),
            n(&w["row"]),
            n(&w["index"]),
            n(&w["primary"]),
            n(&w["candidate"])
        );
    }
    let gate = &r["gate"];
    out += &format!(
        "gate: {} rows and {} agreement: {}\n",
        n(&gate["min_compared"]),
        pct(&gate["min_agreement"]),
        if gate["met"].as_bool() == Some(true) {
            "met"
        } else {
            "not met"
        }
    );
    for unmet in gate["unmet"].as_array().into_iter().flatten() {
        out += &format!("  not met: {}\n", text(unmet));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_reads_as_a_person_reads_it() {
        let report = report(&serde_json::json!({
            "route": "r", "on": true, "candidate": ["http://c:1"], "percent": 100,
            "since": "2026-12-01T08:00:00Z", "compared": 12345, "compared_by_tier": {"micro_batch": 60, "realtime": 12285},
            "dropped": {"full": 2}, "rows": 24690, "rows_within": 18723, "agreement": 0.7583333333333333,
            "status_mismatches": 0, "shape_mismatches": 1,
            "latency": {"primary_mean_ms": 1.23456, "candidate_mean_ms": null, "candidate_to_primary": null},
            "outputs": {"OUTPUT1": {"within_rate": 0.5, "exact_rate": 0.25, "max_abs_diff": 0.000012, "mean_abs_diff": 3.5,
                                    "top1_agreement": null, "topk_agreement": null, "cosine_min": 0.999}},
            "gate": {"min_compared": 1000, "min_agreement": 0.99, "met": false,
                     "unmet": ["18723 of 24690 rows within tolerance (0.7583), the gate asks for 0.99"]},
        }));
        for want in [
            "12,345 calls compared (micro_batch 60, realtime 12,285); 2 dropped (full 2)",
            "agreement 75.83%",
            "primary 1.2346 ms, candidate - ms",
            "1.200e-5",
            "gate: 1,000 rows and 99.00% agreement: not met",
            "not met: 18723 of 24690",
        ] {
            assert!(report.contains(want), "{want:?} in\n{report}");
        }
        assert!(!report.contains("null") && !report.contains("0.7583333"), "{report}");
    }
}
