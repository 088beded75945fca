//! The command line: `run`, `compare` and `overhead`, their shared option groups, and
//! the conversion of options into runtime types (`Plan`, `Payload`, `Comparison`).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{ensure, Context as _};
use clap::{Args, Parser, Subcommand};
use http::header::{HeaderName, HeaderValue};

use crate::compare::{Comparison, Target};
use crate::generator::{Pacer, Plan};
use crate::payload::Payload;
use crate::schedule::Schedule;

/// Open-loop load generator for tiergate and any KServe v2 server.
#[derive(Debug, Parser)]
#[command(name = "loadtest", version, about)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// One open-loop run against one server.
    Run(RunArgs),
    /// The same load against several servers, interleaved in rounds, side by side.
    Compare(CompareArgs),
    /// Start `tiergate sim` and `tiergate serve`, then compare direct vs gateway.
    Overhead(OverheadArgs),
    /// LLM chat streams held open, closed loop: time to first token, each event's
    /// delivery, events per second.
    Streams(StreamsArgs),
}

/// `loadtest streams`.
#[derive(Debug, Args)]
pub struct StreamsArgs {
    /// Base URL of the server (OpenAI's `/v1/chat/completions` there).
    #[arg(long, default_value = "http://127.0.0.1:8000")]
    pub url: String,
    /// The model asked for.
    #[arg(long, default_value = "llama")]
    pub model: String,
    /// Streams open at once.
    #[arg(long, default_value_t = 100)]
    pub concurrency: usize,
    /// Tokens each stream asks for (`max_tokens`).
    #[arg(long, default_value_t = 50)]
    pub tokens: u64,
    /// How long streams are opened for (each one opened is read to its end).
    #[arg(long, default_value = "20s", value_parser = humantime::parse_duration)]
    pub duration: Duration,
    /// An API key sent as `Authorization: Bearer KEY` (a gateway that requires one).
    #[arg(long)]
    pub api_key: Option<String>,
    /// Open loop: a stream opened every 1/RATE seconds for `--duration`, however many
    /// are open (`--concurrency` unused).
    #[arg(long)]
    pub rate: Option<f64>,
    /// Words in each stream's prompt (a token each on the simulator), after the stream's
    /// own number so no two prompts share a prefix; a short sentence when not given.
    #[arg(long)]
    pub prompt_words: Option<usize>,
    /// Asks the server for every one of `--tokens` (`ignore_eos`: llama.cpp's and vLLM's),
    /// so a model that would end early still streams them all.
    #[arg(long)]
    pub ignore_eos: bool,
    /// Extra request header K:V; repeat.
    #[arg(long = "header", value_parser = parse_header)]
    pub headers: Vec<(HeaderName, HeaderValue)>,
    #[command(flatten)]
    pub output: OutputArgs,
}

/// `loadtest run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// Base URL of the server.
    #[arg(long, default_value = "http://127.0.0.1:8000")]
    pub url: String,
    #[command(flatten)]
    pub request: RequestArgs,
    /// Requests per second (the base rate of a burst schedule).
    #[arg(long)]
    pub rate: f64,
    /// Measured window.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub duration: Duration,
    /// Load sent before the measured window, not recorded.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    pub warmup: Duration,
    #[command(flatten)]
    pub payload: PayloadArgs,
    #[command(flatten)]
    pub client: ClientArgs,
    #[command(flatten)]
    pub output: OutputArgs,
}

/// `loadtest compare`.
#[derive(Debug, Args)]
pub struct CompareArgs {
    /// A server to compare, NAME=URL; repeat. The first is the baseline.
    #[arg(long = "target", required = true, value_parser = parse_target)]
    pub targets: Vec<Target>,
    #[command(flatten)]
    pub request: RequestArgs,
    /// Requests per second (the base rate of a burst schedule).
    #[arg(long)]
    pub rate: f64,
    /// Measured time per target, split evenly over the rounds.
    #[arg(long, default_value = "20s", value_parser = humantime::parse_duration)]
    pub duration: Duration,
    /// Rounds; each runs every target once, alternating the order.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    pub rounds: u32,
    /// Warmup before each phase, not recorded.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    pub warmup: Duration,
    #[command(flatten)]
    pub payload: PayloadArgs,
    #[command(flatten)]
    pub client: ClientArgs,
    #[command(flatten)]
    pub output: OutputArgs,
}

/// `loadtest overhead`.
#[derive(Debug, Args)]
pub struct OverheadArgs {
    /// Path to the tiergate binary.
    #[arg(long)]
    pub tiergate: PathBuf,
    /// Requests per second.
    #[arg(long, default_value_t = 200.0)]
    pub rate: f64,
    /// Measured time per target, split evenly over the rounds.
    #[arg(long, default_value = "20s", value_parser = humantime::parse_duration)]
    pub duration: Duration,
    /// Rounds; each runs both targets once, alternating the order.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..))]
    pub rounds: u32,
    /// Warmup before each phase, not recorded.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    pub warmup: Duration,
    #[command(flatten)]
    pub payload: PayloadArgs,
    #[command(flatten)]
    pub client: ClientArgs,
    #[command(flatten)]
    pub output: OutputArgs,
}

/// What every request says, beyond its body.
#[derive(Debug, Args)]
pub struct RequestArgs {
    /// KServe v2 model: requests go to POST {url}/v2/models/{model}/infer.
    #[arg(long)]
    pub model: String,
    /// `constant`, `burst:peak=X,every=Ns,for=Ms` (rate X for M at the start of every N),
    /// or `steps:Ns@X,Ms@Y,...` (rate X for N, then Y for M, ...; `--rate` unused).
    #[arg(long, default_value = "constant")]
    pub schedule: String,
    /// Sets `x-tiergate-budget-ms` on every request (omitted otherwise).
    #[arg(long)]
    pub budget_ms: Option<u64>,
    /// Extra request header K:V; repeat.
    #[arg(long = "header", value_parser = parse_header)]
    pub headers: Vec<(HeaderName, HeaderValue)>,
}

/// The request body: FP32 input `INPUT0` of shape [rows, cols].
#[derive(Debug, Args)]
pub struct PayloadArgs {
    /// Rows of INPUT0 (the batch dimension).
    #[arg(long, default_value_t = 1)]
    pub rows: usize,
    /// Columns of INPUT0.
    #[arg(long, default_value_t = 16)]
    pub cols: usize,
    /// Triton binary tensor extension (JSON header + raw bytes) instead of JSON tensors.
    #[arg(long)]
    pub binary: bool,
    /// Ask for the outputs in the binary section (`binary_data_output`).
    #[arg(long, conflicts_with = "grpc")]
    pub binary_output: bool,
    /// KServe v2 over gRPC (ModelInfer with raw contents, HTTP/2) instead of HTTP; the
    /// URL is the gRPC port. Implies --http2.
    #[arg(long, conflicts_with = "binary")]
    pub grpc: bool,
    /// Percent of requests asking a question never asked before; the rest ask the same
    /// one (`100 - distinct` is the hit ratio a cache can reach).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u8).range(0..=100), conflicts_with = "grpc")]
    pub distinct: u8,
}

/// Connection and client-side limits.
#[derive(Debug, Args)]
pub struct ClientArgs {
    /// HTTP/2 with prior knowledge instead of HTTP/1.1.
    #[arg(long)]
    pub http2: bool,
    /// Outstanding requests at most; beyond, requests count as dropped_client_side.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_in_flight: u64,
    /// Per-request timeout, from the moment it is sent.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
    /// How to wait for intended send times: `thread` (µs precision) or `tokio` (1 ms timer).
    #[arg(long, value_enum, default_value_t = Pacer::Thread)]
    pub pacer: Pacer,
}

/// Where results go besides stdout.
#[derive(Debug, Args)]
pub struct OutputArgs {
    /// Write the results as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Free text carried into the report.
    #[arg(long)]
    pub label: Option<String>,
    /// Write SVG plots (latency over time, percentile distribution) into this directory.
    #[arg(long)]
    pub plot: Option<PathBuf>,
}

impl PayloadArgs {
    /// The payload, after checking it is not empty.
    pub fn payload(&self) -> anyhow::Result<Payload> {
        ensure!(self.rows > 0 && self.cols > 0, "--rows and --cols must be > 0");
        Ok(Payload {
            rows: self.rows,
            cols: self.cols,
            binary: self.binary,
            binary_output: self.binary_output,
            grpc: self.grpc,
            distinct: self.distinct,
        })
    }
}

impl ClientArgs {
    /// A plan for one phase of `duration` after `warmup`.
    pub fn plan(&self, schedule: Schedule, warmup: Duration, duration: Duration) -> anyhow::Result<Plan> {
        ensure!(!duration.is_zero(), "--duration must be > 0");
        ensure!(!self.timeout.is_zero(), "--timeout must be > 0");
        let max_in_flight = usize::try_from(self.max_in_flight).context("--max-in-flight is too large")?;
        Ok(Plan {
            schedule,
            warmup,
            duration,
            max_in_flight,
            timeout: self.timeout,
            pacer: self.pacer,
        })
    }
}

impl CompareArgs {
    /// The comparison these options describe.
    pub fn comparison(&self) -> anyhow::Result<Comparison> {
        let schedule = Schedule::parse(&self.request.schedule, self.rate)?;
        let phase = self.duration / self.rounds;
        Ok(Comparison {
            targets: self.targets.clone(),
            model: self.request.model.clone(),
            payload: self.payload.payload()?,
            budget_ms: self.request.budget_ms,
            headers: self.request.headers.clone(),
            phase: self.client.plan(schedule, self.warmup, phase)?,
            rounds: self.rounds,
            http2: self.client.http2,
            label: self.output.label.clone(),
        })
    }
}

impl OverheadArgs {
    /// The comparison, without targets: `overhead` fills them in once its servers run.
    pub fn comparison(&self) -> anyhow::Result<Comparison> {
        let schedule = Schedule::parse("constant", self.rate)?;
        Ok(Comparison {
            targets: Vec::new(),
            model: crate::overhead::MODEL.into(),
            payload: self.payload.payload()?,
            budget_ms: Some(crate::overhead::BUDGET_MS),
            headers: Vec::new(),
            phase: self.client.plan(schedule, self.warmup, self.duration / self.rounds)?,
            rounds: self.rounds,
            http2: self.client.http2,
            label: self.output.label.clone(),
        })
    }
}

fn parse_target(s: &str) -> anyhow::Result<Target> {
    Target::parse(s)
}

fn parse_header(s: &str) -> anyhow::Result<(HeaderName, HeaderValue)> {
    let (name, value) = s.split_once(':').context("expected K:V")?;
    let name = HeaderName::try_from(name.trim()).with_context(|| format!("header name {name:?}"))?;
    let value = HeaderValue::try_from(value.trim()).with_context(|| format!("header value {value:?}"))?;
    Ok((name, value))
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory as _;

    use super::*;

    #[test]
    fn cli_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn parses_compare() -> anyhow::Result<()> {
        let cli = Cli::try_parse_from([
            "loadtest",
            "compare",
            "--target",
            "direct=http://127.0.0.1:9000",
            "--target",
            "gateway=http://127.0.0.1:8000",
            "--model",
            "resnet50",
            "--rate",
            "200",
            "--duration",
            "3s",
            "--rounds",
            "3",
            "--budget-ms",
            "200",
            "--header",
            "x-tenant: a",
            "--header",
            "x-b:c",
        ])?;
        let Command::Compare(args) = cli.command else {
            anyhow::bail!("expected compare")
        };
        let cmp = args.comparison()?;
        assert_eq!(cmp.targets.len(), 2);
        assert_eq!(cmp.phase.duration, Duration::from_secs(1));
        assert_eq!(cmp.phase.warmup, Duration::from_secs(1));
        assert_eq!(cmp.budget_ms, Some(200));
        assert_eq!(
            cmp.headers[0],
            (HeaderName::from_static("x-tenant"), HeaderValue::from_static("a"))
        );
        assert_eq!(cmp.phase.max_in_flight, 10_000);
        Ok(())
    }

    #[test]
    fn rejects_bad_options() {
        let run = |extra: &[&str]| {
            let base = ["loadtest", "run", "--model", "m", "--rate", "10"];
            Cli::try_parse_from(base.iter().chain(extra)).map_err(|e| e.to_string())
        };
        assert!(run(&[]).is_ok());
        assert!(run(&["--header", "no-colon"]).is_err());
        assert!(run(&["--header", "bad name:v"]).is_err());
        assert!(run(&["--duration", "ten"]).is_err());
        assert!(run(&["--max-in-flight", "0"]).is_err());
        assert!(run(&["--pacer", "spin"]).is_err());
        assert!(Cli::try_parse_from(["loadtest", "compare", "--model", "m", "--rate", "1"]).is_err());
    }
}
