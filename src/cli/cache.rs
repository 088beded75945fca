//! `tiergate cache show|invalidate ROUTE`: a route's prediction cache through the admin
//! API (see `tiergate flags` for the connection options and exit codes).

use std::process::ExitCode;

use bytes::Bytes;
use clap::Subcommand;
use serde_json::Value;

use super::admin::{call, failed, Admin};

/// `tiergate cache` subcommands.
#[derive(Debug, Subcommand)]
pub enum CacheCommand {
    /// The route's cache: its settings, entries and bytes.
    Show {
        /// The route.
        route: String,
        #[command(flatten)]
        admin: Admin,
    },
    /// Drop every entry of the route's cache (new requests are answered afresh).
    Invalidate {
        /// The route.
        route: String,
        #[command(flatten)]
        admin: Admin,
    },
}

/// Runs `tiergate cache ...`.
pub async fn run(command: CacheCommand) -> anyhow::Result<ExitCode> {
    let (method, path, route, admin) = match command {
        CacheCommand::Show { route, admin } => ("GET", format!("/admin/cache/{route}"), route, admin),
        CacheCommand::Invalidate { route, admin } => ("POST", format!("/admin/cache/{route}/invalidate"), route, admin),
    };
    let (status, body) = call(&admin, method, &path, None, Bytes::new()).await?;
    if status != 200 {
        return Ok(failed(status, &body));
    }
    if let Some(n) = body.get("invalidated") {
        println!("route {route}: {n} entries invalidated");
    }
    if let Some(n) = body.get("invalidated_shared") {
        println!("route {route}: {n} entries invalidated in Redis (shared by the replicas)");
    }
    println!("{}", line(&body));
    Ok(ExitCode::SUCCESS)
}

/// The cache in one line.
fn line(c: &Value) -> String {
    format!(
        "route {} cache {}: {} entries, {} of {} bytes, ttl {}, coalesce {}, rows {}, shared across tenants {}",
        c["route"].as_str().unwrap_or_default(),
        if c["on"] == true { "on" } else { "off" },
        c["entries"],
        c["bytes"],
        c["max_bytes"],
        c["ttl"].as_str().unwrap_or_default(),
        c["coalesce"],
        c["rows"],
        c["shared_across_tenants"]
    )
}
