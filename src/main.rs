//! The `tiergate` command: `serve`, `demo`, `sim`, `policy`, `jobs`, `flags`, `explain`,
//! `top` and `health`.

mod cli;

use cli::{admin, cache, demo, health, jobs, shadow, top};

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Args, Parser, Subcommand};
use tiergate::app::Gateway;
use tiergate::config::{Config, LogFormat};
use tiergate::policy::Policy;
use tiergate::sim::{Faults, ModelSpec, Profile, Simulator};
use tokio_util::sync::CancellationToken;

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

/// `tiergate auth`.
#[derive(Debug, Subcommand)]
enum AuthCommand {
    /// Print a new random API key for TENANT, and the line for the keys file (which
    /// holds only the key's SHA-256, never the key).
    NewKey {
        /// The tenant the key lets in: 1 to 64 letters, digits, '.', '_' or '-'.
        tenant: String,
    },
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the gateway with the startup settings and the policy directory.
    ///
    /// Settings come from --config (else ./tiergate.toml when present), then
    /// TIERGATE_* environment variables (e.g. TIERGATE_LISTEN__HTTP=0.0.0.0:8000),
    /// then the flags below. Stops on Ctrl-C or SIGTERM, draining open requests.
    Serve(ServeArgs),
    /// Run a self-contained demo: a gateway and two simulated pools on this machine.
    ///
    /// Starts simulated real-time (127.0.0.1:9100) and batch (127.0.0.1:9101) pools and
    /// a gateway serving policies/demo.toml, then prints curl lines showing each tier's
    /// decision. Needs nothing else installed.
    Demo(DemoArgs),
    /// Run the simulated KServe v2 model server used by the tests, demo and load tests.
    ///
    /// Each model costs t(B) = max(floor, a + b*B) per batch of B rows on N instances,
    /// FIFO; outputs are a deterministic function of each input row.
    Sim(SimArgs),
    /// Work with policy files.
    Policy {
        #[command(subcommand)]
        command: PolicyCommand,
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
    /// A live view of a running gateway (per route and tier: rate, p50/p99, SLO, shed
    /// rate, queue depth, batch size), read from its metrics endpoint.
    Top(top::TopArgs),
    /// Data-plane API keys: `tiergate auth new-key TENANT` makes a key and the line
    /// that lets it in (for the file `auth.keys_file` names).
    Auth {
        #[command(subcommand)]
        command: AuthCommand,
    },
    /// Exit 0 when a gateway is ready (its /v2/health/ready answers 200), else say why
    /// and exit 1: the container image's health check, which needs no curl.
    Health(health::HealthArgs),
}

#[derive(Debug, Args)]
struct ServeArgs {
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

#[derive(Debug, Args)]
struct DemoArgs {
    /// Send the example requests, check every decision, print the results and exit
    /// (non-zero on any mismatch) instead of serving until Ctrl-C.
    #[arg(long)]
    self_check: bool,
    /// Address of the gateway's HTTP door.
    #[arg(long, default_value = "127.0.0.1:8000")]
    http: SocketAddr,
    /// Address of the gateway's gRPC door.
    #[arg(long, default_value = "127.0.0.1:8001")]
    grpc: SocketAddr,
    /// Address of the gateway's metrics endpoint.
    #[arg(long, default_value = "127.0.0.1:8002")]
    metrics: SocketAddr,
    /// Address of the gateway's admin API (unauthenticated in the demo, so loopback only).
    #[arg(long, default_value = "127.0.0.1:8003")]
    admin: SocketAddr,
}

#[derive(Debug, Args)]
struct SimArgs {
    /// Address of the KServe v2 HTTP side.
    #[arg(long, default_value = "127.0.0.1:9000")]
    http: SocketAddr,
    /// Address of the KServe v2 gRPC side (none unless given).
    #[arg(long)]
    grpc: Option<SocketAddr>,
    /// A model as NAME:PROFILE (profiles: resnet50-trt, resnet50-eager, bert-base-trt,
    /// instant), or a combined model as NAME:PROFILE:HEAD,HEAD,... (outputs HEAD_OUTPUT0
    /// and HEAD_OUTPUT1 per head); repeat for several models.
    #[arg(long = "model", default_value = "resnet50:resnet50-trt")]
    models: Vec<String>,
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

#[derive(Debug, Subcommand)]
enum PolicyCommand {
    /// Validate every *.toml file in DIR as one policy; print every problem with its
    /// file and path, and exit non-zero if there is any.
    Check {
        /// The policy directory.
        dir: PathBuf,
    },
    #[command(flatten)]
    Admin(admin::PolicyOps),
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

fn run(command: Command) -> anyhow::Result<ExitCode> {
    match command {
        Command::Policy {
            command: PolicyCommand::Check { dir },
        } => Ok(policy_check(&dir)),
        Command::Policy {
            command: PolicyCommand::Admin(command),
        } => runtime(1)?.block_on(admin::policy(command)),
        Command::Jobs { command } => runtime(1)?.block_on(jobs::run(command)),
        Command::Flags { command } => runtime(1)?.block_on(admin::flags(command)),
        Command::Explain(args) => runtime(1)?.block_on(admin::explain(args)),
        Command::Shadow { command } => runtime(1)?.block_on(shadow::run(command)),
        Command::Cache { command } => runtime(1)?.block_on(cache::run(command)),
        Command::Top(args) => runtime(1)?.block_on(top::run(args)),
        Command::Health(args) => runtime(1)?.block_on(health::run(args)),
        Command::Auth {
            command: AuthCommand::NewKey { tenant },
        } => new_key(&tenant),
        Command::Serve(args) => {
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
                return Ok(serve_check(&config));
            }
            let runtime = realtime_runtime(&config.threads)?;
            let _entered = runtime.enter(); // the trace exporter's connection lives on this runtime
            let _exporter = init_logs(&config)?;
            runtime.block_on(serve_command(config))
        }
        Command::Demo(args) => {
            let mut config = Config::default();
            config.listen.http = args.http;
            config.listen.grpc = args.grpc;
            config.listen.metrics = args.metrics;
            config.listen.admin = args.admin;
            init_logs(&config)?;
            runtime(0)?.block_on(run_demo(config, args.self_check))
        }
        Command::Sim(args) => {
            init_logs(&Config::default())?;
            runtime(0)?.block_on(sim(args))
        }
    }
}

fn policy_check(dir: &std::path::Path) -> ExitCode {
    if dir.is_file() {
        eprintln!(
            "{} is a file: tiergate policy check takes the policy directory (such as {}), and checks every .toml \
             file in it together",
            dir.display(),
            dir.parent()
                .filter(|p| !p.as_os_str().is_empty())
                .unwrap_or(std::path::Path::new("."))
                .display()
        );
        return ExitCode::FAILURE;
    }
    match Policy::load_dir(dir) {
        Ok(policy) => {
            println!("{}: ok, {} routes", dir.display(), policy.routes().len());
            // A table whose flag is off does nothing: valid, but maybe not what was meant.
            for route in policy.routes() {
                let inert = [
                    ("cache", route.cache.is_some() && !route.flags.cache),
                    ("shadow", route.shadow.is_some() && !route.flags.shadow),
                ];
                for (table, off) in inert {
                    if off {
                        println!(
                            "note: {}: routes.{}.{table} is inert while the {table} flag is off \
                             (tiergate flags set {} {table} on)",
                            route.file.display(),
                            route.name,
                            route.name
                        );
                    }
                }
            }
            ExitCode::SUCCESS
        }
        Err(problems) => {
            eprintln!("{problems}");
            eprintln!("{} problem(s) in {}", problems.0.len(), dir.display());
            ExitCode::FAILURE
        }
    }
}

/// `tiergate serve --check`: the startup checks that need no socket, and their verdict.
/// `tiergate auth new-key TENANT`: a key of 32 random bytes (hex, `tg_` first) and its
/// keys-file line.
fn new_key(tenant: &str) -> anyhow::Result<ExitCode> {
    if !tiergate::front::auth::valid_tenant(tenant) {
        anyhow::bail!("the tenant must be 1 to 64 letters, digits, '.', '_' or '-', got {tenant:?}");
    }
    let key: String = (0..32).map(|_| format!("{:02x}", rand::random::<u8>())).collect();
    let key = format!("tg_{key}");
    println!("key (give it to the tenant; it is not kept anywhere): {key}");
    println!("line for auth.keys_file: {}", tiergate::front::auth::line(tenant, &key));
    Ok(ExitCode::SUCCESS)
}

fn serve_check(config: &Config) -> ExitCode {
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

async fn serve_command(config: Config) -> anyhow::Result<ExitCode> {
    let policy = Policy::load_dir(&config.policy_dir)
        .map_err(|p| anyhow::anyhow!("the policy in {} is invalid:\n{p}", config.policy_dir.display()))?;
    let mut gateway = Gateway::start(&config, policy).await?;
    if let Err(e) = gateway.watch_policy(&config.policy_dir) {
        // Serving matters more than reloading: say so loudly and keep serving.
        tracing::error!(error = %e, "hot reload is off: policy file changes take effect only after a restart");
    }
    stopped().await;
    let stop = &config.shutdown;
    let deadline = tokio::time::Instant::now() + stop.timeout;
    gateway.drain();
    tracing::info!(drain_delay = ?stop.drain_delay, timeout = ?stop.timeout,
        "stopping: readiness is 503; still accepting for drain_delay, then finishing open work");
    tokio::select! {
        _ = tokio::time::sleep(stop.drain_delay) => {}
        _ = stopped() => tracing::info!("a second stop signal: no longer accepting"),
    }
    gateway
        .stop_within(deadline.saturating_duration_since(tokio::time::Instant::now()))
        .await?;
    tracing::info!("stopped");
    Ok(ExitCode::SUCCESS)
}

async fn run_demo(config: Config, self_check: bool) -> anyhow::Result<ExitCode> {
    let running = demo::Demo::start(&config).await?;
    if self_check {
        let result = running.self_check().await;
        running.stop().await?;
        for line in result? {
            println!("{line}");
        }
        println!("demo self-check passed");
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "tiergate demo: gateway on http://{} (metrics on http://{}/metrics)",
        running.http_addr(),
        running.metrics_addr()
    );
    println!(
        "simulated pools: real-time {} and batch {}; policy: policies/demo.toml\n",
        demo::REALTIME_POOL,
        demo::BATCH_POOL
    );
    for ex in demo::examples() {
        println!("# {} (expect {})", ex.title, ex.status);
        println!("{}\n", demo::curl(running.http_addr(), &ex));
    }
    println!(
        "# an offline job's answer: the respond-async example above printed `Location: /v1/jobs/ID`\n\
         curl -si http://{}/v1/jobs/ID\n",
        running.http_addr()
    );
    // This binary by its path: a newcomer who ran `cargo run` has no `tiergate` on the PATH.
    let exe = std::env::current_exe().map_or_else(|_| "tiergate".to_owned(), |p| shell_word(&p.display().to_string()));
    println!(
        "# the Batch API file the demo wrote ({} requests, one {{custom_id, method, url, body}} per line), with a progress bar\n\
         {exe} jobs submit {} --endpoint /v2/models/resnet50/infer --gateway http://{}\n",
        demo::REQUESTS,
        shell_word(&running.requests_file().display().to_string()),
        running.http_addr()
    );
    if let Some(admin) = running.admin_addr() {
        println!(
            "# the admin API (unauthenticated on loopback in the demo only): switch a flag, see why, roll back\n\
             {exe} flags set resnet50 micro_batch off --admin http://{admin}\n\
             {exe} explain --model resnet50 --budget-ms 2000 --admin http://{admin}\n\
             {exe} policy history --admin http://{admin}\n"
        );
    }
    println!(
        "# the metrics those requests produced\ncurl -s http://{}/metrics | grep tiergate_requests_total\n",
        running.metrics_addr()
    );
    println!("Ctrl-C to stop.");
    stopped().await;
    running.stop().await?;
    Ok(ExitCode::SUCCESS)
}

/// `word` as one shell word: quoted when it holds anything a shell would split or expand.
fn shell_word(word: &str) -> String {
    match word
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "/._-+:=@".contains(c))
    {
        true => word.to_owned(),
        false => format!("'{}'", word.replace('\'', r"'\''")),
    }
}

async fn sim(args: SimArgs) -> anyhow::Result<ExitCode> {
    let mut models = Vec::new();
    for text in &args.models {
        let (name, profile) = text
            .split_once(':')
            .with_context(|| format!("--model {text:?}: write it as NAME:PROFILE"))?;
        let (profile, heads) = profile.split_once(':').unwrap_or((profile, ""));
        let heads: Vec<String> = heads.split(',').filter(|h| !h.is_empty()).map(str::to_owned).collect();
        let profile = Profile::named(profile).with_context(|| {
            format!(
                "--model {text:?}: unknown profile; known: {}",
                Profile::NAMES.join(", ")
            )
        })?;
        if !(args.noise >= 0.0 && args.noise.is_finite()) {
            anyhow::bail!("--noise {}: give 0 or more", args.noise);
        }
        if !(args.slowdown > 0.0 && args.slowdown <= 1000.0) {
            anyhow::bail!("--slowdown {}: give a factor above 0 and at most 1000", args.slowdown);
        }
        let mut spec = ModelSpec::new(name, profile.scaled(args.slowdown));
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
    stopped().await;
    shutdown.cancel();
    server.await??;
    Ok(ExitCode::SUCCESS)
}

fn runtime(workers: usize) -> anyhow::Result<tokio::runtime::Runtime> {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if workers > 0 {
        builder.worker_threads(workers);
    }
    Ok(builder.enable_all().build()?)
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

/// Logs to stderr in the configured format (a request's `served` line carries its
/// `request_id` and `trace_id` as fields); with `trace.otlp_endpoint` set, spans are
/// also exported (keep the returned exporter alive while serving).
fn init_logs(config: &Config) -> anyhow::Result<Option<tiergate::telemetry::Exporter>> {
    use tracing_subscriber::filter::{filter_fn, FilterExt as _};
    use tracing_subscriber::layer::{Layer as _, SubscriberExt};
    use tracing_subscriber::util::SubscriberInitExt;
    // Each layer has its own filter, so a span no layer wants is never made: with no
    // exporter, a request's spans cost nothing.
    let level = || {
        tracing_subscriber::EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(&config.log.level))
    };
    let logged = || level().and(filter_fn(tiergate::telemetry::logged));
    let mut layers: Vec<Box<dyn tracing_subscriber::Layer<tracing_subscriber::Registry> + Send + Sync>> = Vec::new();
    layers.push(match config.log.format {
        LogFormat::Text => tracing_subscriber::fmt::layer()
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .with_writer(std::io::stderr)
            .with_filter(logged())
            .boxed(),
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .json()
            .with_current_span(false)
            .with_span_list(true)
            .with_writer(std::io::stderr)
            .with_filter(logged())
            .boxed(),
    });
    let exporter = match tiergate::telemetry::layer(&config.trace).map_err(anyhow::Error::msg)? {
        Some((layer, exporter)) => {
            layers.push(layer.with_filter(level()).boxed());
            Some(exporter)
        }
        None => None,
    };
    tracing_subscriber::registry().with(layers).init();
    Ok(exporter)
}

/// Resolves on Ctrl-C or SIGTERM.
async fn stopped() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(s) => s,
            Err(_) => {
                let _ = ctrl_c.await;
                return;
            }
        };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory as _;

    #[test]
    fn the_command_line_is_consistent() {
        super::Cli::command().debug_assert();
    }
}
