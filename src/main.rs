//! The `tiergate` command: `main` and the command enum; each command lives in `cli/`
//! (`serve`, `demo`, `sim`, `policy`, `jobs`, `flags`, `explain`, `shadow`, `cache`,
//! `usage`, `top`, `auth`, `infer` and `health`).

mod cli;

use cli::{admin, auth, cache, demo, health, infer, jobs, policy, serve, shadow, sim, top, usage};

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// mimalloc in place of the system allocator: under a burst, glibc's malloc and free
/// took a fifth of the gateway's CPU (see docs/architecture.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// tiergate: a hybrid tiered inference gateway.
///
/// Sits in front of KServe v2 model servers (Triton, MLServer, ...) and serves each
/// request on the tier its latency budget and its route's flags call for: realtime,
/// micro_batch or offline.
#[derive(Debug, Parser)]
#[command(name = "tiergate", version, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the gateway with the startup settings and the policy directory.
    ///
    /// Settings come from --config (else ./tiergate.toml when present), then
    /// TIERGATE_* environment variables (e.g. TIERGATE_LISTEN__HTTP=0.0.0.0:8000),
    /// then the flags below. Stops on Ctrl-C or SIGTERM, draining open requests.
    Serve(serve::ServeArgs),
    /// Run a self-contained demo: a gateway and two simulated pools on this machine.
    ///
    /// Starts simulated real-time (127.0.0.1:9100) and batch (127.0.0.1:9101) pools and
    /// a gateway serving policies/demo.toml, then prints curl lines showing each tier's
    /// decision. Needs nothing else installed; --realtime-pool and --batch-pool move the
    /// pools (port 0: any free port).
    Demo(demo::DemoArgs),
    /// Run the simulated KServe v2 model server used by the tests, demo and load tests.
    ///
    /// Each model costs t(B) = max(floor, a + b*B) per batch of B rows on N instances,
    /// FIFO; outputs are a deterministic function of each input row.
    Sim(sim::SimArgs),
    /// Work with policy files.
    Policy {
        #[command(subcommand)]
        command: policy::PolicyCommand,
    },
    /// Run Batch API jobs on a running gateway: submit, status, results, cancel.
    Jobs {
        #[command(subcommand)]
        command: jobs::JobsCommand,
    },
    /// Read and set a running gateway's per-route flags (through its admin API).
    Flags {
        #[command(subcommand)]
        command: admin::FlagsCommand,
    },
    /// Show how a running gateway would serve a described request; nothing is sent.
    Explain(admin::ExplainArgs),
    /// A route's shadow candidate (through the admin API): what it agreed on, and
    /// promoting it to the route's pool.
    Shadow {
        #[command(subcommand)]
        command: shadow::ShadowCommand,
    },
    /// A route's prediction cache (through the admin API): what it holds, and dropping it.
    Cache {
        #[command(subcommand)]
        command: cache::CacheCommand,
    },
    /// What the backends did for whom and what was saved (through the admin API): the
    /// usage ledger's table.
    Usage(usage::UsageArgs),
    /// A live view of a running gateway (per route and tier: rate, p50/p99, SLO, shed
    /// rate, queue depth, batch size), read from its metrics endpoint.
    Top(top::TopArgs),
    /// Data-plane API keys: `tiergate auth new-key TENANT` makes a key and the line
    /// that lets it in (for the file `auth.keys_file` names).
    Auth {
        #[command(subcommand)]
        command: auth::AuthCommand,
    },
    /// Send one KServe v2 inference over gRPC (the request written as KServe v2 JSON) and
    /// print the answer, with the tier that served it.
    Infer(infer::InferArgs),
    /// Exit 0 when a gateway is ready (its /v2/health/ready answers 200), else say why
    /// and exit 1: the container image's health check, which needs no curl.
    Health(health::HealthArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli.command) {
        Ok(code) => code,
        Err(e) if e.downcast_ref::<admin::Unreachable>().is_some() => {
            eprintln!("tiergate: {}", report(&e));
            ExitCode::from(admin::UNREACHABLE)
        }
        Err(e) => {
            eprintln!("tiergate: {}", report(&e));
            ExitCode::FAILURE
        }
    }
}

/// An error and its causes on one line, each said once: a message that already quotes
/// its cause (as most library errors do) is not followed by the cause again.
fn report(e: &anyhow::Error) -> String {
    let mut text = e.to_string();
    for cause in e.chain().skip(1) {
        let cause = cause.to_string();
        if !text.contains(&cause) {
            text.push_str(": ");
            text.push_str(&cause);
        }
    }
    text
}

/// Runs one command: each has its module in `cli/`.
fn run(command: Command) -> anyhow::Result<ExitCode> {
    match command {
        Command::Serve(args) => serve::run(args),
        Command::Demo(args) => demo::run(args),
        Command::Sim(args) => sim::run(args),
        Command::Policy { command } => policy::run(command),
        Command::Auth { command } => auth::run(command),
        Command::Infer(args) => infer::run(args),
        Command::Jobs { command } => cli::runtime(1)?.block_on(jobs::run(command)),
        Command::Flags { command } => cli::runtime(1)?.block_on(admin::flags(command)),
        Command::Explain(args) => cli::runtime(1)?.block_on(admin::explain(args)),
        Command::Shadow { command } => cli::runtime(1)?.block_on(shadow::run(command)),
        Command::Cache { command } => cli::runtime(1)?.block_on(cache::run(command)),
        Command::Top(args) => cli::runtime(1)?.block_on(top::run(args)),
        Command::Usage(args) => cli::runtime(1)?.block_on(usage::run(args)),
        Command::Health(args) => cli::runtime(1)?.block_on(health::run(args)),
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory as _;

    #[test]
    fn the_command_line_is_consistent() {
        super::Cli::command().debug_assert();
    }
}
