//! `tiergate serve`: the gateway with the startup settings and the policy directory,
//! until Ctrl-C or SIGTERM, then a graceful stop; `--check` says whether it would start.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use tiergate::app::Gateway;
use tiergate::config::Config;
use tiergate::policy::Policy;

/// `tiergate serve`'s flags: each overrides the setting it names.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Startup settings file (TOML).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Directory of policy files (overrides policy_dir).
    #[arg(long)]
    policy_dir: Option<PathBuf>,
    /// Address of the HTTP door (overrides listen.http).
    #[arg(long)]
    http: Option<SocketAddr>,
    /// Address of the gRPC door (overrides listen.grpc).
    #[arg(long)]
    grpc: Option<SocketAddr>,
    /// Address of the metrics endpoint (overrides listen.metrics).
    #[arg(long)]
    metrics: Option<SocketAddr>,
    /// Directory of the offline tier's durable store (overrides data_dir).
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Address of the admin API (overrides listen.admin).
    #[arg(long)]
    admin: Option<SocketAddr>,
    /// Address of the bulk HTTP door, served by the batch threads (overrides listen.bulk_http).
    #[arg(long)]
    bulk_http: Option<SocketAddr>,
    /// Address of the bulk gRPC door, served by the batch threads (overrides listen.bulk_grpc).
    #[arg(long)]
    bulk_grpc: Option<SocketAddr>,
    /// Check the startup settings and the policy (its pools against the backend
    /// allowlist, the admin token, the stop's timings), print the result and exit
    /// without serving: 0 when the gateway would start with them.
    #[arg(long)]
    check: bool,
}

/// Runs `tiergate serve`: settings from the file, then `TIERGATE_*`, then the flags.
pub fn run(args: ServeArgs) -> anyhow::Result<ExitCode> {
    let mut config = Config::load(args.config.as_deref(), std::env::vars())?;
    config.policy_dir = args.policy_dir.unwrap_or(config.policy_dir);
    config.listen.http = args.http.unwrap_or(config.listen.http);
    config.listen.grpc = args.grpc.unwrap_or(config.listen.grpc);
    config.listen.metrics = args.metrics.unwrap_or(config.listen.metrics);
    config.data_dir = args.data_dir.unwrap_or(config.data_dir);
    config.listen.admin = args.admin.unwrap_or(config.listen.admin);
    config.listen.bulk_http = args.bulk_http.or(config.listen.bulk_http);
    config.listen.bulk_grpc = args.bulk_grpc.or(config.listen.bulk_grpc);
    if args.check {
        return Ok(check(&config));
    }
    let runtime = realtime_runtime(&config.threads)?;
    let _entered = runtime.enter(); // the trace exporter's connection lives on this runtime
    let _exporter = tiergate::telemetry::logs::init(&config).map_err(anyhow::Error::msg)?;
    // The serving future on the heap: the main thread only waits, on a small stack (a
    // build at a low optimisation level keeps large futures whole on the stack).
    runtime.block_on(Box::pin(serve(config)))
}

/// `tiergate serve --check`: the startup checks that need no socket, and their verdict.
fn check(config: &Config) -> ExitCode {
    let policy = match Policy::load_dir(&config.policy_dir) {
        Ok(policy) => policy,
        Err(problems) => {
            eprintln!("the policy in {} is invalid:\n{problems}", config.policy_dir.display());
            return ExitCode::FAILURE;
        }
    };
    match tiergate::app::check(config, &policy) {
        Ok(()) => {
            let l = &config.listen;
            println!(
                "ok: {} route(s) from {}; would serve HTTP on {}, gRPC on {}, metrics on {}",
                policy.routes().len(),
                config.policy_dir.display(),
                l.http,
                l.grpc,
                l.metrics
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("tiergate would not start: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Serves until the first stop signal, then drains: readiness 503 at once, still
/// accepting for `drain_delay` (or until a second signal), then every open request
/// finished within `shutdown.timeout`.
async fn serve(config: Config) -> anyhow::Result<ExitCode> {
    let policy = Policy::load_dir(&config.policy_dir)
        .map_err(|p| anyhow::anyhow!("the policy in {} is invalid:\n{p}", config.policy_dir.display()))?;
    let mut gateway = Gateway::start(&config, policy).await?;
    if let Err(e) = gateway.watch_policy(&config.policy_dir) {
        // Serving matters more than reloading: say so loudly and keep serving.
        tracing::error!(error = %e, "hot reload is off: policy file changes take effect only after a restart");
    }
    super::stopped().await;
    let stop = &config.shutdown;
    let deadline = tokio::time::Instant::now() + stop.timeout;
    gateway.drain();
    tracing::info!(drain_delay = ?stop.drain_delay, timeout = ?stop.timeout,
        "stopping: readiness is 503; still accepting for drain_delay, then finishing open work");
    tokio::select! {
        _ = tokio::time::sleep(stop.drain_delay) => {}
        _ = super::stopped() => tracing::info!("a second stop signal: no longer accepting"),
    }
    gateway
        .stop_within(deadline.saturating_duration_since(tokio::time::Instant::now()))
        .await?;
    tracing::info!("stopped");
    Ok(ExitCode::SUCCESS)
}

/// The runtime of the doors and the real-time tier, its threads on
/// `threads.realtime_cpus` when that is set (the main thread, which only waits for the
/// signal to stop, stays where it is).
fn realtime_runtime(threads: &tiergate::config::Threads) -> anyhow::Result<tokio::runtime::Runtime> {
    threads
        .realtime_cpus
        .check("threads.realtime_cpus")
        .map_err(anyhow::Error::msg)?;
    let cpus = threads.realtime_cpus.clone();
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if threads.realtime_workers() > 0 {
        builder.worker_threads(threads.realtime_workers());
    }
    Ok(builder
        .on_thread_start(move || cpus.pin_this_thread())
        .enable_all()
        .build()?)
}
