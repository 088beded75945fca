//! `tiergate usage [--since 24h] [--by route,tier] [--csv]`: the usage ledger's table
//! through the admin API (`GET /admin/usage`; see `tiergate flags` for the connection
//! options and exit codes).

use std::fmt::Write as _;
use std::process::ExitCode;

use bytes::Bytes;
use clap::Args;

use super::admin::{call, failed, Admin};
use tiergate::usage::report::{Line, Report};

/// `tiergate usage` options.
#[derive(Debug, Args)]
pub struct UsageArgs {
    /// From when: a duration before now (24h, 30m) or an RFC 3339 time.
    #[arg(long, default_value = "24h")]
    since: String,
    /// Group by route, tier and/or tenant (comma-separated).
    #[arg(long, default_value = "route,tier")]
    by: String,
    /// Print CSV instead of a table.
    #[arg(long)]
    csv: bool,
    #[command(flatten)]
    admin: Admin,
}

/// Runs `tiergate usage`.
pub async fn run(args: UsageArgs) -> anyhow::Result<ExitCode> {
    let path = format!("/admin/usage?since={}&by={}&format=json", args.since, args.by);
    let (status, body) = call(&args.admin, "GET", &path, None, Bytes::new()).await?;
    if status != 200 {
        return Ok(failed(status, &body));
    }
    let report: Report = serde_json::from_value(body)?;
    match args.csv {
        true => print!("{}", report.csv()),
        false => print!("{}", table(&report)),
    }
    Ok(ExitCode::SUCCESS)
}

/// The report as an aligned table: seconds used, would-have and saved by cause.
fn table(report: &Report) -> String {
    let mut out = format!(
        "{:<36} {:>9} {:>9} {:>9} {:>10} {:>10} {:>10} {:>9} {:>9} {:>9} {:>9} {:>6} {:>8} {:>11} {:>11}\n",
        "group",
        "requests",
        "rows",
        "calls",
        "used s",
        "alone s",
        "saved s",
        "batching",
        "cache",
        "precomp",
        "dedupe",
        "share",
        "req/call",
        "prompt tok",
        "output tok"
    );
    for (line, name) in report
        .rows
        .iter()
        .map(|l| (l, group(l)))
        .chain([(&report.total, "total".to_owned())])
    {
        let _ = writeln!(
            out,
            "{:<36} {:>9} {:>9} {:>9.1} {:>10.3} {:>10.3} {:>10.3} {:>9.3} {:>9.3} {:>9.3} {:>9.3} {:>5.1}% {:>8} {:>11} {:>11}",
            name,
            line.requests,
            line.rows,
            line.backend_calls,
            line.used_seconds,
            line.would_have_seconds,
            line.saved_seconds,
            line.saved_batching_seconds,
            line.saved_cache_seconds,
            line.saved_precomputed_seconds,
            line.saved_dedupe_seconds,
            line.share * 100.0,
            line.requests_per_call.map_or("-".to_owned(), |r| format!("{r:.2}")),
            line.prompt_tokens,
            line.completion_tokens,
        );
    }
    let estimated = report.total.estimated_tokens;
    if estimated > 0 {
        let _ = writeln!(
            out,
            "{estimated} output tokens were counted from streams' events (their backends sent no usage): an estimate"
        );
    }
    let unpriced = report.total.unpriced_rows;
    if unpriced > 0 {
        let _ = writeln!(
            out,
            "{unpriced} rows were sent while their pool cannot tell its cost yet: counted at what they used, nothing claimed saved on them"
        );
    }
    for line in report.rows.iter().chain([&report.total]) {
        let name = if std::ptr::eq(line, &report.total) {
            "total".to_owned()
        } else {
            group(line)
        };
        if let Some(cost) = &line.cost {
            let _ = writeln!(
                out,
                "{name}: {:.4} {} used, {:.4} would have been, {:.4} saved",
                cost.used, cost.currency, cost.would_have, cost.saved
            );
        }
        if let Some(cost) = &line.token_cost {
            let _ = writeln!(
                out,
                "{name}: tokens {:.4} {} at its tiers' prices, {:.4} at the real-time price, {:.4} saved",
                cost.used, cost.currency, cost.would_have, cost.saved
            );
        }
    }
    out
}

/// A line's group, as `route/tier/tenant` of what it is grouped by.
fn group(line: &Line) -> String {
    let parts: Vec<&str> = [&line.route, &line.tier, &line.tenant]
        .into_iter()
        .filter_map(|p| p.as_deref())
        .collect();
    parts.join("/")
}
