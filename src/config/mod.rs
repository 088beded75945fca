//! Startup settings: listen addresses, directories, threads and limits.
//!
//! Read once at start from an optional `tiergate.toml` and `TIERGATE_*` environment
//! variables (nested keys joined by `__`, e.g. `TIERGATE_LISTEN__HTTP=0.0.0.0:8000`),
//! with the `config` crate. Unlike the policy, these are never reloaded: changing one
//! needs a restart. Unknown keys are refused so a typo cannot silently do nothing.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::cpu::CpuList;

mod kafka;
mod validate;

pub use kafka::{Kafka, KafkaQueue, KafkaSource};
pub use validate::{Problem, Problems};

/// The startup settings.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Where each listener binds.
    pub listen: Listen,
    /// Directory for durable state (the offline queue).
    pub data_dir: PathBuf,
    /// Directory of `*.toml` policy files.
    pub policy_dir: PathBuf,
    /// Runtime threads.
    pub threads: Threads,
    /// Trace export.
    pub trace: Trace,
    /// Request limits applied by every door.
    pub limits: Limits,
    /// The offline tier: its queue, retries, windows and limits.
    pub offline: Offline,
    /// Kafka: brokers, client settings, and topics consumed as sources.
    pub kafka: Kafka,
    /// Log output.
    pub log: Log,
    /// The admin API: authentication and audit.
    pub admin: Admin,
    /// Data-plane authentication: who may call the doors, and as which tenant.
    pub auth: Auth,
    /// TLS on the doors and the admin API.
    pub tls: Tls,
    /// The gRPC doors' own settings.
    pub grpc: Grpc,
    /// Where backend pools may point.
    pub backends: Backends,
    /// How a stop signal drains the gateway.
    pub shutdown: Shutdown,
    /// The prediction cache's shared second level.
    pub cache: CacheConfig,
    /// The usage ledger: how long it is kept.
    pub usage: UsageConfig,
    /// What the metrics endpoint exports beyond the defaults.
    pub metrics: MetricsConfig,
}

/// Optional metric series: per-tenant usage, off by default (a tenant per series can
/// be many series).
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsConfig {
    /// Export the usage ledger's totals per route and tenant too.
    pub tenant_labels: bool,
    /// Tenants that get series of their own (the first seen); the rest are `other`.
    pub max_tenant_series: usize,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        MetricsConfig {
            tenant_labels: false,
            max_tenant_series: 100,
        }
    }
}

/// The usage ledger (`crate::usage`), kept in `data_dir/usage.db`: per minute for a
/// day, then per hour for `keep_days`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct UsageConfig {
    /// Days the hourly figures are kept (1 to 3650).
    pub keep_days: u32,
    /// A Redis every replica shares the token limits' counts in
    /// (`redis://[:PASSWORD@]HOST:PORT[/DB]`; a secret, as it may hold a password).
    /// Unset: each replica holds the limits on its own calls.
    pub redis: Option<Secret>,
    /// The longest a token limits' check waits for Redis before the replica holds the
    /// limit on its own counts.
    #[serde(with = "humantime_serde")]
    pub redis_timeout: Duration,
    /// Prefix of the token limits' keys in Redis.
    pub redis_prefix: String,
}

impl Default for UsageConfig {
    fn default() -> Self {
        UsageConfig {
            keep_days: crate::usage::store::KEEP_DAYS,
            redis: None,
            redis_timeout: Duration::from_millis(50),
            redis_prefix: "tiergate".into(),
        }
    }
}

/// The prediction cache's second level: a Redis the gateway's replicas share, behind
/// each one's own memory (see `crate::cache`). Off unless `redis` is set. When Redis is
/// slow or down the gateway goes on with its own memory alone, and tries Redis again
/// after `redis_retry`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct CacheConfig {
    /// `redis://[:PASSWORD@]HOST:PORT[/DB]`; a secret, as it may hold a password.
    pub redis: Option<Secret>,
    /// Longest a lookup or a write waits for Redis before the gateway goes on without it.
    #[serde(with = "humantime_serde")]
    pub redis_timeout: Duration,
    /// How long a Redis that failed is left alone before it is tried again.
    #[serde(with = "humantime_serde")]
    pub redis_retry: Duration,
    /// The prefix of every key the gateway writes (`PREFIX:ROUTE:KEY`), so gateways
    /// of different deployments can share one Redis without meeting.
    pub redis_prefix: String,
    /// Writes to Redis in flight at once; past it a new entry is kept in memory only.
    pub max_redis_writes: usize,
}

impl Default for CacheConfig {
    fn default() -> Self {
        CacheConfig {
            redis: None,
            redis_timeout: Duration::from_millis(25),
            redis_retry: Duration::from_secs(1),
            redis_prefix: "tiergate".into(),
            max_redis_writes: 256,
        }
    }
}

/// How the gateway stops on SIGTERM (or Ctrl-C): readiness turns 503 at once; new
/// connections and requests are still served for `drain_delay`, so load balancers
/// take the gateway out of rotation before it stops accepting; then it stops
/// accepting, lets in-flight requests and queued micro-batch callers finish, hands
/// leased offline jobs back to the queue, and exits, all within `timeout` of the signal.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Shutdown {
    /// How long the gateway keeps accepting after the signal while readiness is 503.
    #[serde(with = "humantime_serde")]
    pub drain_delay: Duration,
    /// The longest a stop takes, from the signal to exit. Work still open past it is
    /// answered 503 (micro-batch callers) or handed back (offline jobs) and connections
    /// are closed. Keep it below Kubernetes' `terminationGracePeriodSeconds`.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
}

impl Default for Shutdown {
    fn default() -> Self {
        Shutdown {
            drain_delay: Duration::from_secs(5),
            timeout: Duration::from_secs(25),
        }
    }
}

/// The admin API's settings. It listens on `listen.admin` only when a token is
/// configured, or when `insecure_no_auth` is set and that address is loopback.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Admin {
    /// File of bearer tokens, one per line as `name:token` (or a bare `token`, named
    /// `admin`); the name is who the audit log says made a change.
    pub token_file: Option<PathBuf>,
    /// One bearer token, named `admin` (`TIERGATE_ADMIN__TOKEN`); prefer `token_file`.
    pub token: Option<Secret>,
    /// Serve the admin API without authentication. Refused unless `listen.admin` is a
    /// loopback address; logs a warning at start.
    pub insecure_no_auth: bool,
    /// The append-only audit log of policy changes (default `data_dir/policy/audit.jsonl`).
    pub audit_log: Option<PathBuf>,
    /// With TLS on: the admin API also asks each client for a certificate signed by a
    /// CA in this PEM file (mutual TLS), on top of its bearer token.
    pub client_ca_file: Option<PathBuf>,
}

/// Data-plane authentication (see `front::auth`). Without `keys_file`, every request
/// is the anonymous tenant's: anyone who reaches a data port may call any route and
/// read any offline job, batch or file.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Auth {
    /// File of API keys, one a line as `TENANT:sha256:HEX` (the SHA-256 of the key;
    /// `tiergate auth new-key TENANT` makes one), read again when it changes. When set,
    /// every request but the health checks needs a key from it.
    pub keys_file: Option<PathBuf>,
}

/// TLS on the HTTP and gRPC doors (the bulk doors too) and the admin API (see
/// `server::tls`); the metrics endpoint stays plain HTTP. Off unless both files are set.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Tls {
    /// The certificate chain, PEM, leaf first; read again when it changes.
    pub cert_file: Option<PathBuf>,
    /// The certificate's private key, PEM; read again when it changes.
    pub key_file: Option<PathBuf>,
}

/// The gRPC doors' own settings.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct Grpc {
    /// How answers are compressed for a client that accepts it (its
    /// `grpc-accept-encoding`): `none` (as Triton by default), `gzip` or `deflate`.
    /// Compressed requests are read whatever this says.
    pub answer_compression: Compression,
}

/// A message compression.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Compression {
    /// None.
    #[default]
    None,
    /// gzip.
    Gzip,
    /// deflate.
    Deflate,
}

/// A secret setting: never shown by `Debug`, so it cannot reach a log line.
#[derive(Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(transparent)]
pub struct Secret(pub String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret([redacted])")
    }
}

/// Where the offline tier keeps its jobs.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum QueueKind {
    /// One SQLite file under `data_dir`: one gateway.
    #[default]
    Embedded,
    /// Kafka topics (`[kafka.queue]`): several gateway replicas; needs the `kafka` build.
    Kafka,
}

/// The backend allowlist: every pool endpoint in the policy (from files or the admin
/// API) must match one entry, or the policy is refused.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Backends {
    /// Networks (`10.0.0.0/8`, `::1/128`), addresses (`10.1.2.3`), host names
    /// (`triton.internal`), host suffixes (`*.svc.cluster.local`), or `*` for any.
    /// Host names are matched as written, never resolved.
    pub allow: Vec<String>,
    /// CA certificates (PEM) that `https://` and `grpcs://` endpoints' certificates must
    /// chain to, read at start; unset: the platform's.
    pub ca_file: Option<PathBuf>,
}

impl Default for Backends {
    fn default() -> Self {
        Backends {
            allow: ["127.0.0.0/8", "::1/128", "localhost"].map(String::from).to_vec(),
            ca_file: None,
        }
    }
}

/// The offline tier's settings.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Offline {
    /// Where jobs are kept: `embedded` (the default) or `kafka`.
    pub queue: QueueKind,
    /// How long an accepted job may wait to finish before it expires.
    #[serde(with = "humantime_serde")]
    pub completion_window: Duration,
    /// Attempts before a job that keeps failing (backend unreachable, 5xx) fails for good.
    pub max_attempts: u32,
    /// Wait before the first retry; doubled for each further one (with jitter).
    #[serde(with = "humantime_serde")]
    pub retry_backoff: Duration,
    /// How long one attempt may take at the backend.
    #[serde(with = "humantime_serde")]
    pub attempt_timeout: Duration,
    /// Unfinished jobs the queue holds; past it submissions get 507.
    pub max_queued_jobs: u64,
    /// How long finished jobs (and their results) are kept.
    #[serde(with = "humantime_serde")]
    pub retention: Duration,
    /// Largest Batch API input file, in bytes (413 above it).
    pub max_file_bytes: usize,
    /// Most lines (requests) in one Batch API input file.
    pub max_file_lines: usize,
}

/// Listen addresses. Ports follow Triton's defaults; all bind loopback unless told
/// otherwise, so a gateway is never exposed by accident.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Listen {
    /// The KServe v2 HTTP door and JSON routes (Triton: 8000).
    pub http: SocketAddr,
    /// The KServe v2 gRPC door (Triton: 8001).
    pub grpc: SocketAddr,
    /// Prometheus metrics (Triton: 8002).
    pub metrics: SocketAddr,
    /// The admin API: loopback by default and never on a data port.
    pub admin: SocketAddr,
    /// A second HTTP door, the bulk door, served by the batch threads (off unless set).
    /// It answers exactly what the HTTP door answers; callers whose work is bulk
    /// (micro-batch floods, Batch API uploads) send it here, so reading and answering
    /// them never takes the real-time threads.
    pub bulk_http: Option<SocketAddr>,
    /// A second gRPC door on the batch threads, like `bulk_http` (off unless set).
    pub bulk_grpc: Option<SocketAddr>,
}

/// Thread counts.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Threads {
    /// Tokio worker threads for the doors and the real-time tier; 0 means one per core
    /// (one per CPU of `realtime_cpus` when that is set).
    pub workers: usize,
    /// Threads of the micro-batch tier (decoding, batch assembly and splitting, batch
    /// backend calls), kept apart from the real-time ones; at least 1.
    pub batch_workers: usize,
    /// The nice value (0..=19) of the micro-batch threads and the offline store's writer
    /// thread: above 0, the real-time threads run first on a busy CPU, at the cost of
    /// the batch tier's own deadlines when the whole process is CPU-bound (see
    /// docs/performance.md). 0 (the default) runs them at the same priority. Linux
    /// only; elsewhere ignored.
    pub batch_nice: i32,
    /// The CPUs the doors and the real-time tier run on, as a Linux CPU list (`"0"`,
    /// `"0-3,8"`); empty (the default) leaves them to the operating system. With
    /// `batch_cpus`, batch work stays off the cores that serve real-time requests.
    pub realtime_cpus: CpuList,
    /// The CPUs the micro-batch threads and the offline store's writer run on (a CPU
    /// list as above; empty by default).
    pub batch_cpus: CpuList,
}

impl Threads {
    /// Tokio worker threads for the doors and the real-time tier: `workers`, or when
    /// that is 0, one per CPU of `realtime_cpus` (0 again when that is empty: tokio's
    /// one per core).
    pub fn realtime_workers(&self) -> usize {
        match self.workers {
            0 => self.realtime_cpus.len(),
            n => n,
        }
    }
}

/// Trace export (OTLP); spans stay in the process unless an endpoint is set.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Trace {
    /// OTLP/gRPC collector to export spans to, e.g. `http://otel-collector:4317`;
    /// empty (the default) exports nothing.
    pub otlp_endpoint: String,
    /// The `service.name` the spans carry.
    pub service_name: String,
}

impl Default for Trace {
    fn default() -> Self {
        Trace {
            otlp_endpoint: String::new(),
            service_name: "tiergate".to_owned(),
        }
    }
}

/// Limits every door enforces before any work is done.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Largest request body (HTTP) or message (gRPC) accepted, in bytes: 413 or
    /// RESOURCE_EXHAUSTED above it.
    pub max_body_bytes: usize,
    /// Largest backend response body accepted, in bytes (502 above it); also the
    /// largest gRPC message the gateway sends.
    pub max_response_bytes: usize,
    /// How long a client may take, from connecting, to send its first complete request
    /// head (HTTP/2: the preface and first frame); less once the connection table is
    /// more than half full. A later request on a kept-alive connection is held to
    /// `idle_timeout` instead.
    #[serde(with = "humantime_serde")]
    pub header_read_timeout: Duration,
    /// How long a client may take to send its request body, from its request's head
    /// (408 past it); less once the connection table is more than half full, down to a
    /// tenth when it is full.
    #[serde(with = "humantime_serde")]
    pub body_read_timeout: Duration,
    /// Requests in flight across the gateway (both doors); past it new ones get 503.
    pub max_in_flight_requests: usize,
    /// Request body bytes held across the gateway; past it new requests get 503.
    pub max_in_flight_body_bytes: usize,
    /// Resident memory past which new requests get 503 until it falls; 0 is off. By
    /// default 80% of the memory the process may use (its cgroup's limit when it has
    /// one, else the machine's), so a flood is shed before the kernel kills the process.
    pub max_rss_bytes: u64,
    /// Open client connections per door; past it new ones are closed at once.
    pub max_connections: usize,
    /// Open connections per door from one client address; past it that client's new
    /// ones are closed at once. 0 is no limit (behind a load balancer or a NAT every
    /// client may share one address: raise it or set 0 there).
    pub max_connections_per_client: usize,
    /// Bytes a second a client must take of an answer waiting to be written, measured
    /// over 10 s windows; a slower reader's connection is closed, so it cannot hold an
    /// answer (a Batch API file, say) and its connection for as long as it likes. 0 is off.
    pub min_send_rate: u64,
    /// The largest event a stream may relay, in bytes: a larger one cuts the stream
    /// (the client gets an error event). A relay holds at most one event in progress.
    pub max_stream_event_bytes: usize,
    /// Bytes a second a request body on its way must arrive at, measured over 10 s
    /// windows; a slower body fails with 408 (its connection then closes), so a client
    /// sending a body a byte at a time cannot hold its connection for long. 0 is off.
    pub min_receive_rate: u64,
    /// How long a connection may have no request in flight before it is closed (an idle
    /// keep-alive HTTP/1.1 connection, an HTTP/2 connection with no open stream); it is
    /// looked at four times per `idle_timeout`, so closed within 1.25 × of it.
    #[serde(with = "humantime_serde")]
    pub idle_timeout: Duration,
    /// Connections the kernel may hold for each listener before the gateway takes them
    /// (the listen backlog); the kernel caps it at `net.core.somaxconn`.
    pub listen_backlog: u32,
    /// The share of every budget kept back for the time the gateway cannot see: the
    /// request waiting to be read, the answer waiting to be written and carried back.
    /// A request's tiers aim at `budget × (1 − budget_reserve)`; 0 (the default) aims
    /// at the whole budget. At most 0.5.
    pub budget_reserve: f64,
}

/// Log settings.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Log {
    /// `text` or `json`.
    pub format: LogFormat,
    /// A `tracing` filter such as `info` or `tiergate=debug`; `RUST_LOG` wins when set.
    pub level: String,
}

/// Log line format.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Variables read by tiergate's client commands (`jobs`, `flags`, `policy`, `explain`),
/// not startup settings: `serve` ignores them rather than refusing them as unknown.
pub const CLIENT_VARIABLES: [&str; 6] = [
    "TIERGATE_URL",
    "TIERGATE_METRICS_URL",
    "TIERGATE_API_KEY",
    "TIERGATE_ADMIN_URL",
    "TIERGATE_ADMIN_TOKEN",
    "TIERGATE_ADMIN_TOKEN_FILE",
];

/// A settings file or variable that could not be read.
#[derive(Debug, thiserror::Error)]
#[error("startup settings: {0}")]
pub struct ConfigError(#[from] config::ConfigError);

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: Listen::default(),
            data_dir: PathBuf::from("data"),
            policy_dir: PathBuf::from("policies"),
            threads: Threads::default(),
            trace: Trace::default(),
            limits: Limits::default(),
            offline: Offline::default(),
            auth: Auth::default(),
            tls: Tls::default(),
            grpc: Grpc::default(),
            kafka: Kafka::default(),
            log: Log::default(),
            admin: Admin::default(),
            backends: Backends::default(),
            shutdown: Shutdown::default(),
            cache: CacheConfig::default(),
            usage: UsageConfig::default(),
            metrics: MetricsConfig::default(),
        }
    }
}

impl Default for Threads {
    fn default() -> Self {
        Threads {
            workers: 0,
            batch_workers: 1,
            batch_nice: 0,
            realtime_cpus: CpuList::default(),
            batch_cpus: CpuList::default(),
        }
    }
}

impl Default for Offline {
    fn default() -> Self {
        Offline {
            queue: QueueKind::Embedded,
            completion_window: Duration::from_secs(24 * 3600),
            max_attempts: 5,
            retry_backoff: Duration::from_secs(1),
            attempt_timeout: Duration::from_secs(60),
            max_queued_jobs: 1_000_000,
            retention: Duration::from_secs(7 * 24 * 3600),
            max_file_bytes: 200 << 20,
            max_file_lines: 50_000,
        }
    }
}

impl Default for Listen {
    fn default() -> Self {
        let loopback = |port| SocketAddr::from(([127, 0, 0, 1], port));
        Listen {
            http: loopback(8000),
            grpc: loopback(8001),
            metrics: loopback(8002),
            admin: loopback(8003),
            bulk_http: None,
            bulk_grpc: None,
        }
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_body_bytes: 64 << 20,
            max_response_bytes: 256 << 20,
            header_read_timeout: Duration::from_secs(10),
            body_read_timeout: Duration::from_secs(30),
            max_in_flight_requests: 10_000,
            max_in_flight_body_bytes: 1 << 30,
            max_rss_bytes: default_max_rss(),
            max_connections: 10_000,
            max_connections_per_client: 1_000,
            min_send_rate: 4096,
            min_receive_rate: 4096,
            max_stream_event_bytes: 1 << 20,
            idle_timeout: Duration::from_secs(120),
            listen_backlog: 4096,
            budget_reserve: 0.0,
        }
    }
}

/// 80% of the memory this process may use: its cgroup's `memory.max` when set, else
/// the machine's memory (`/proc/meminfo`); 0 (off) where neither can be read.
fn default_max_rss() -> u64 {
    let cgroup = std::fs::read_to_string("/sys/fs/cgroup/memory.max")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok());
    let machine = std::fs::read_to_string("/proc/meminfo").ok().and_then(|s| {
        let line = s.lines().find(|l| l.starts_with("MemTotal:"))?;
        let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kib.saturating_mul(1024))
    });
    let usable = match (cgroup, machine) {
        (Some(c), Some(m)) => c.min(m),
        (c, m) => c.or(m).unwrap_or(0),
    };
    usable / 5 * 4
}

impl Default for Log {
    fn default() -> Self {
        Log {
            format: LogFormat::Text,
            level: "info".to_owned(),
        }
    }
}

impl Config {
    /// Loads defaults, then `file` (required when given; `tiergate.toml` in the current
    /// directory when present otherwise), then `TIERGATE_*` variables from `env`.
    pub fn load(file: Option<&Path>, env: impl IntoIterator<Item = (String, String)>) -> Result<Config, ConfigError> {
        let mut builder = config::Config::builder();
        builder = match file {
            Some(path) => builder.add_source(config::File::from(path).required(true)),
            None => builder.add_source(config::File::with_name("tiergate.toml").required(false)),
        };
        let vars = env
            .into_iter()
            .filter(|(k, _)| k.starts_with("TIERGATE_") && !CLIENT_VARIABLES.contains(&k.as_str()))
            .collect();
        let environment = config::Environment::with_prefix("TIERGATE")
            .prefix_separator("_")
            .separator("__")
            .try_parsing(true)
            .list_separator(",")
            .with_list_parse_key("backends.allow")
            .source(Some(vars));
        Ok(builder.add_source(environment).build()?.try_deserialize()?)
    }
}

#[cfg(test)]
mod tests;
