//! `loadtest`: the open-loop load generator for tiergate. It sends KServe v2 infer
//! requests on a schedule that does not wait for answers, measures each latency from the
//! request's *intended* send time (so a stalled server cannot hide its tail), and reports
//! HdrHistogram percentiles overall, per tier and per second. It speaks HTTP only and
//! does not link the gateway: it can measure tiergate, a backend, or a proxy alike.
//!
//! # Layout
//!
//! - `args`: the command line (`run`, `compare`, `overhead`) and its conversion to plans.
//! - `schedule`: intended send times (constant, burst).
//! - `payload`: the request body (JSON or binary tensors) and the request template.
//! - `client`: the pooled HTTP client, transport error kinds, readiness probe.
//! - `generator`: the open-loop pacer and per-request tasks.
//! - `record`: outcomes folded into histograms and counts.
//! - `summary`: the text and JSON report of one run.
//! - `compare`: several targets in alternating rounds, side by side.
//! - `overhead`: starts `tiergate sim` + `tiergate serve` and compares them.
//! - `plot`: SVG plots of a summary.
//! - `streams`: LLM chat streams held open, closed loop (`loadtest streams`).

mod args;
mod client;
mod compare;
mod generator;
mod overhead;
mod payload;
mod plot;
mod record;
mod schedule;
mod streams;
mod summary;

#[cfg(test)]
mod e2e_tests;
#[cfg(test)]
mod test_server;

use std::path::Path;
use std::sync::Arc;

use anyhow::Context as _;
use clap::Parser as _;
use serde::Serialize;

use crate::args::{Cli, Command, OutputArgs, RunArgs};
use crate::compare::Report;
use crate::payload::Template;
use crate::schedule::Schedule;
use crate::summary::{Meta, Summary};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    // Dropping the command's future on Ctrl-C stops the pacer and kills child servers.
    tokio::select! {
        result = execute(cli.command) => result,
        _ = tokio::signal::ctrl_c() => anyhow::bail!("interrupted"),
    }
}

async fn execute(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Run(args) => {
            let summary = run(&args).await?;
            println!("{summary}");
            write_outputs(&args.output, &summary, |dir| plot::summary(dir, &summary))
        }
        Command::Compare(args) => {
            let report = compare::run(&args.comparison()?).await?;
            print_report(&args.output, &report)
        }
        Command::Overhead(args) => {
            let report = overhead::run(&args.tiergate, args.comparison()?).await?;
            print_report(&args.output, &report)
        }
        Command::Streams(args) => {
            let report = streams::run(&args).await?;
            println!("{report}");
            let label = args.output.label.clone().unwrap_or_else(|| "streams".to_owned());
            write_outputs(&args.output, &report, |dir| {
                plot::ttft(dir, &label, &report.ttft_over_time)
            })
        }
    }
}

/// `loadtest run`: one phase against one server.
async fn run(args: &RunArgs) -> anyhow::Result<Summary> {
    let schedule = Schedule::parse(&args.request.schedule, args.rate)?;
    let req = &args.request;
    let template = Template::new(
        &args.url,
        &req.model,
        &args.payload.payload()?,
        req.budget_ms,
        &req.headers,
    )?;
    let meta = Meta {
        label: args.output.label.clone(),
        url: args.url.clone(),
        model: req.model.clone(),
        schedule: schedule.to_string(),
        warmup: args.warmup,
        budget_ms: req.budget_ms,
    };
    let plan = args.client.plan(schedule, args.warmup, args.duration)?;
    eprintln!(
        "{} for {:?} after {:?} warmup: POST {}",
        meta.schedule,
        plan.duration,
        plan.warmup,
        template.uri()
    );
    let client = client::new(args.client.http2 || args.payload.grpc);
    let recording = generator::run(&client, &Arc::new(template), &plan).await?;
    Ok(Summary::new(&meta, &recording))
}

fn print_report(output: &OutputArgs, report: &Report) -> anyhow::Result<()> {
    println!("{report}");
    write_outputs(output, report, |dir| plot::report(dir, report))
}

/// Writes `--json` and `--plot` outputs, if asked for.
fn write_outputs<T: Serialize>(
    output: &OutputArgs,
    value: &T,
    plot: impl FnOnce(&Path) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    if let Some(path) = &output.json {
        let json = serde_json::to_vec_pretty(value)?;
        std::fs::write(path, json).with_context(|| format!("writing {}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    if let Some(dir) = &output.plot {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        plot(dir)?;
        eprintln!("wrote plots to {}", dir.display());
    }
    Ok(())
}
