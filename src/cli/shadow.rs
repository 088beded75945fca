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

/// The report as lines for a terminal.
fn report(r: &Value) -> String {
    let mut out = format!(
        "route {} shadow {} -> candidate {} ({}% of calls)\n",
        text(&r["route"]),
        if r["on"].as_bool() == Some(true) { "on" } else { "off" },
        r["candidate"]
            .as_array()
            .map(|c| c.iter().map(text).collect::<Vec<_>>().join(", "))
            .unwrap_or_default(),
        r["percent"]
    );
    out += &format!(
        "since {}: {} calls compared {}, {} dropped {}\n",
        text(&r["since"]),
        r["compared"],
        r["compared_by_tier"],
        r["dropped"]
            .as_object()
            .map_or(0, |d| d.values().filter_map(Value::as_u64).sum::<u64>()),
        r["dropped"]
    );
    out += &format!(
        "rows {} within tolerance {} (agreement {}); status mismatches {}, shape mismatches {}\n",
        r["rows"], r["rows_within"], r["agreement"], r["status_mismatches"], r["shape_mismatches"]
    );
    out += &format!(
        "latency: primary {} ms, candidate {} ms (x{})\n",
        r["latency"]["primary_mean_ms"], r["latency"]["candidate_mean_ms"], r["latency"]["candidate_to_primary"]
    );
    for (name, o) in r["outputs"].as_object().into_iter().flatten() {
        out += &format!(
            "  {name}: within {} exact values {} max|d| {} mean|d| {} top1 {} topk {} cosine mean {} min {}\n",
            o["within_rate"],
            o["exact_rate"],
            o["max_abs_diff"],
            o["mean_abs_diff"],
            o["top1_agreement"],
            o["topk_agreement"],
            o["cosine_mean"],
            o["cosine_min"]
        );
    }
    for w in r["worst"].as_array().into_iter().flatten() {
        out += &format!(
            "  worst: {} {} request {} output {} row {} [{}]: primary {} candidate {}\n",
            text(&w["at"]),
            text(&w["tier"]),
            text(&w["request_id"]),
            text(&w["output"]),
            w["row"],
            w["index"],
            w["primary"],
            w["candidate"]
        );
    }
    let gate = &r["gate"];
    out += &format!(
        "gate: {} rows and {} agreement: {}\n",
        gate["min_compared"],
        gate["min_agreement"],
        if gate["met"].as_bool() == Some(true) {
            "met"
        } else {
            "not met"
        }
    );
    out
}
