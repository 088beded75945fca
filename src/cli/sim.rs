//! `tiergate sim`: the simulated KServe v2 model server of the tests, the demo and the
//! load tests, as a process of its own; it prints the addresses it bound.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use clap::Args;
use tiergate::config::Config;
use tiergate::sim::{Faults, LlmProfile, ModelSpec, Profile, Simulator};
use tokio_util::sync::CancellationToken;

/// `tiergate sim`'s flags.
#[derive(Debug, Args)]
pub struct SimArgs {
    /// Address of the KServe v2 HTTP side (port 0: any free port, printed at start).
    #[arg(long, default_value = "127.0.0.1:9000")]
    http: SocketAddr,
    /// Address of the KServe v2 gRPC side (none unless given).
    #[arg(long)]
    grpc: Option<SocketAddr>,
    /// A model as NAME:PROFILE (profiles: resnet50-trt, resnet50-eager, bert-base-trt,
    /// instant), a combined model as NAME:PROFILE:HEAD,HEAD,... (outputs HEAD_OUTPUT0
    /// and HEAD_OUTPUT1 per head), or an LLM as NAME:llm-PROFILE (llm-8b-a100,
    /// llm-tiny: OpenAI's API and Triton's generate); repeat for several models.
    #[arg(long = "model", default_value = "resnet50:resnet50-trt")]
    models: Vec<String>,
    /// LLMs: at most this many tokens in one engine step, decodes and prompt chunks
    /// together (vLLM's `max_num_batched_tokens`), in place of the profile's.
    #[arg(long)]
    max_batched_tokens: Option<u64>,
    /// LLMs: a prompt longer than this is prefilled one at a time, at most this many
    /// tokens a step, so shorter prompts pass it (vLLM's `long_prefill_token_threshold`
    /// with `max_long_partial_prefills` 1); by default every prompt in the order let in.
    #[arg(long)]
    long_prefill_tokens: Option<u64>,
    /// Instances per model (batches run one at a time on each, FIFO).
    #[arg(long, default_value_t = 1)]
    instances: usize,
    /// Uniform jitter on each batch's cost, as a fraction (0.1 = ±10%).
    #[arg(long, default_value_t = 0.0)]
    jitter: f64,
    /// Fraction of batches answered with an injected 500.
    #[arg(long, default_value_t = 0.0)]
    error_rate: f64,
    /// Fraction of batches that stall for --stall instead of their cost.
    #[arg(long, default_value_t = 0.0)]
    stall_rate: f64,
    /// How long a stalled batch takes.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    stall: Duration,
    /// Every batch costs this many times its profile's cost (a slower candidate model).
    #[arg(long, default_value_t = 1.0)]
    slowdown: f64,
    /// Added to OUTPUT1 of every row whose sum is negative (a model wrong on some rows).
    #[arg(long, default_value_t = 0.0)]
    drift: f64,
    /// Also added to OUTPUT1 of every row whose sum is negative: a random amount below
    /// this, drawn afresh for every answer (a model that does not answer the same twice,
    /// as the shadow's noise floor is for).
    #[arg(long, default_value_t = 0.0)]
    noise: f64,
}

/// Runs `tiergate sim` until Ctrl-C or SIGTERM.
pub fn run(args: SimArgs) -> anyhow::Result<ExitCode> {
    tiergate::telemetry::logs::init(&Config::default()).map_err(anyhow::Error::msg)?;
    super::runtime(0)?.block_on(serve(args))
}

/// The models `args` describes.
fn models(args: &SimArgs) -> anyhow::Result<Vec<ModelSpec>> {
    if !(args.noise >= 0.0 && args.noise.is_finite()) {
        anyhow::bail!("--noise {}: give 0 or more", args.noise);
    }
    if !(args.slowdown > 0.0 && args.slowdown <= 1000.0) {
        anyhow::bail!("--slowdown {}: give a factor above 0 and at most 1000", args.slowdown);
    }
    let mut models = Vec::new();
    for text in &args.models {
        let (name, profile) = text
            .split_once(':')
            .with_context(|| format!("--model {text:?}: write it as NAME:PROFILE"))?;
        let (profile, heads) = profile.split_once(':').unwrap_or((profile, ""));
        let heads: Vec<String> = heads.split(',').filter(|h| !h.is_empty()).map(str::to_owned).collect();
        let unknown = || {
            let known: Vec<&str> = Profile::NAMES.iter().chain(LlmProfile::NAMES).copied().collect();
            format!("--model {text:?}: unknown profile; known: {}", known.join(", "))
        };
        let mut spec = match LlmProfile::named(profile) {
            Some(llm) => {
                let mut llm = llm.scaled(args.slowdown);
                if let Some(tokens) = args.max_batched_tokens {
                    anyhow::ensure!(tokens > 0, "--max-batched-tokens 0: give 1 or more");
                    llm.max_batched_tokens = tokens;
                }
                if let Some(tokens) = args.long_prefill_tokens {
                    anyhow::ensure!(tokens > 0, "--long-prefill-tokens 0: give 1 or more");
                    llm.long_prefill_tokens = tokens;
                }
                ModelSpec::llm(name, llm)
            }
            None => {
                let profile = Profile::named(profile).with_context(unknown)?;
                ModelSpec::new(name, profile.scaled(args.slowdown))
            }
        };
        spec.instances = args.instances.max(1);
        spec.heads = heads;
        spec.drift = args.drift;
        spec.noise = args.noise;
        spec.jitter = args.jitter;
        spec.faults = Faults {
            error_rate: args.error_rate,
            stall_rate: args.stall_rate,
            stall: args.stall,
        };
        models.push(spec);
    }
    Ok(models)
}

async fn serve(args: SimArgs) -> anyhow::Result<ExitCode> {
    let models = models(&args)?;
    let listener = tokio::net::TcpListener::bind(args.http)
        .await
        .with_context(|| format!("cannot listen on {}", args.http))?;
    let grpc = match args.grpc {
        Some(addr) => Some(
            tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("cannot listen on {addr}"))?,
        ),
        None => None,
    };
    // The addresses bound (port 0 picks a free one), on stdout for whoever started it.
    let http = listener.local_addr()?;
    let grpc_addr = grpc.as_ref().map(tokio::net::TcpListener::local_addr).transpose()?;
    match grpc_addr {
        Some(grpc) => println!("listening http={http} grpc={grpc}"),
        None => println!("listening http={http}"),
    }
    tracing::info!(%http, grpc = ?grpc_addr, models = ?args.models, "simulated model server is serving");
    let shutdown = CancellationToken::new();
    let sim = Simulator::new(models);
    if let Some(grpc) = grpc {
        tokio::spawn(sim.clone().listen_grpc(grpc, shutdown.clone()));
    }
    let server = tokio::spawn(sim.listen(listener, shutdown.clone()));
    super::stopped().await;
    shutdown.cancel();
    server.await??;
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // in tests a failed unwrap is a failed test
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        sim: SimArgs,
    }

    fn models_of(line: &[&str]) -> anyhow::Result<Vec<ModelSpec>> {
        models(&Cli::parse_from(std::iter::once("sim").chain(line.iter().copied())).sim)
    }

    #[test]
    fn an_llms_tokens_a_step_can_be_set_in_place_of_its_profiles() {
        let tokens = |line: &[&str]| models_of(line).unwrap()[0].llm.unwrap().max_batched_tokens;
        assert_eq!(tokens(&["--model", "l:llm-8b-a100"]), 2048);
        assert_eq!(
            tokens(&["--model", "l:llm-8b-a100", "--max-batched-tokens", "256"]),
            256
        );
        assert!(models_of(&["--model", "l:llm-8b-a100", "--max-batched-tokens", "0"]).is_err());
        let long = |line: &[&str]| models_of(line).unwrap()[0].llm.unwrap().long_prefill_tokens;
        assert_eq!(long(&["--model", "l:llm-8b-a100"]), u64::MAX);
        assert_eq!(long(&["--model", "l:llm-8b-a100", "--long-prefill-tokens", "256"]), 256);
    }
}
