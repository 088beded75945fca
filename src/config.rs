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
    /// Where backend pools may point.
    pub backends: Backends,
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

/// Kafka settings. Sources need a build with the `kafka` feature.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Kafka {
    /// Bootstrap brokers, `host:port[,host:port...]`.
    pub brokers: String,
    /// Extra librdkafka client settings for every client (`"security.protocol" = "ssl"`, ...).
    pub client: std::collections::BTreeMap<String, String>,
    /// Topics of inference requests served through a route's micro-batch tier, with
    /// the answers produced to another topic.
    pub sources: Vec<KafkaSource>,
    /// The offline queue's topics, when `offline.queue = "kafka"`.
    pub queue: KafkaQueue,
}

/// The offline queue on Kafka: jobs on a partitioned topic consumed by every replica
/// as one group, job states on a compacted topic every replica reads whole.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct KafkaQueue {
    /// The jobs topic (partitioned; its partitions bound how many replicas share work).
    pub jobs: String,
    /// The job-state topic (`cleanup.policy=compact`), keyed by job, file and batch id.
    pub states: String,
    /// The consumer group the replicas share.
    pub group: String,
    /// Most jobs one replica holds read and unfinished; past it its partitions pause.
    pub max_in_flight: usize,
    /// This replica's name in job states and heartbeats (default: the host name and
    /// process id). Names must differ between replicas.
    pub replica: Option<String>,
    /// How long a replica's heartbeats may be missing before its partitions of the
    /// jobs topic go to the others.
    #[serde(with = "humantime_serde")]
    pub member_timeout: Duration,
}

impl Default for KafkaQueue {
    fn default() -> Self {
        KafkaQueue {
            jobs: "tiergate-jobs".to_owned(),
            states: "tiergate-job-states".to_owned(),
            group: "tiergate-offline".to_owned(),
            max_in_flight: 1024,
            replica: None,
            member_timeout: Duration::from_secs(10),
        }
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

impl Default for Kafka {
    fn default() -> Self {
        Kafka {
            brokers: "127.0.0.1:9092".to_owned(),
            client: Default::default(),
            sources: Vec::new(),
            queue: KafkaQueue::default(),
        }
    }
}

/// One Kafka source: requests from `input`, answers to `output` under the same key.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct KafkaSource {
    /// The route that serves the requests (its micro-batch tier).
    pub route: String,
    /// The topic the requests are read from.
    pub input: String,
    /// The topic the answers are written to, keyed like the requests.
    pub output: String,
    /// The request path each message is served as: a KServe v2 infer path
    /// (`/v2/models/NAME/infer`) or the route's JSON path.
    pub path: String,
    /// Consumer group; default `tiergate-ROUTE`.
    #[serde(default)]
    pub group: Option<String>,
    /// Each request's budget in the micro-batch tier.
    #[serde(default = "default_source_budget", with = "humantime_serde")]
    pub budget: Duration,
    /// Most requests read ahead of the answers (the partitions are paused while the
    /// batch pool is saturated; nothing more is read).
    #[serde(default = "default_source_in_flight")]
    pub max_in_flight: usize,
}

fn default_source_budget() -> Duration {
    Duration::from_secs(2)
}

fn default_source_in_flight() -> usize {
    512
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
}

impl Default for Backends {
    fn default() -> Self {
        Backends {
            allow: ["127.0.0.0/8", "::1/128", "localhost"].map(String::from).to_vec(),
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
    /// How long a client may take to send its request headers (slow clients are cut).
    #[serde(with = "humantime_serde")]
    pub header_read_timeout: Duration,
    /// How long a client may take to send its request body (408 past it).
    #[serde(with = "humantime_serde")]
    pub body_read_timeout: Duration,
    /// Requests in flight across the gateway (both doors); past it new ones get 503.
    pub max_in_flight_requests: usize,
    /// Request body bytes held across the gateway; past it new requests get 503.
    pub max_in_flight_body_bytes: usize,
    /// Resident memory past which new requests get 503 until it falls; 0 is off.
    pub max_rss_bytes: u64,
    /// Open client connections per door; past it new ones are closed at once.
    pub max_connections: usize,
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
pub const CLIENT_VARIABLES: [&str; 4] = [
    "TIERGATE_URL",
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
            kafka: Kafka::default(),
            log: Log::default(),
            admin: Admin::default(),
            backends: Backends::default(),
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
            max_rss_bytes: 0,
            max_connections: 10_000,
            listen_backlog: 4096,
            budget_reserve: 0.0,
        }
    }
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
mod tests {
    use super::*;

    #[test]
    fn defaults_bind_loopback_on_triton_ports() {
        let config = Config::load(None, Vec::new()).expect("defaults load");
        assert_eq!(config.listen.http.to_string(), "127.0.0.1:8000");
        assert_eq!(config.listen.grpc.to_string(), "127.0.0.1:8001");
        assert_eq!(config.listen.metrics.to_string(), "127.0.0.1:8002");
        assert_eq!(config.listen.admin.to_string(), "127.0.0.1:8003");
        assert_eq!(
            (config.listen.bulk_http, config.listen.bulk_grpc),
            (None, None),
            "bulk doors off"
        );
    }

    #[test]
    fn bulk_doors_come_from_the_file_or_the_environment() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("tiergate.toml");
        std::fs::write(&file, "[listen]\nbulk_http = \"0.0.0.0:8010\"\n").expect("write");
        let env = vec![("TIERGATE_LISTEN__BULK_GRPC".to_owned(), "0.0.0.0:8011".to_owned())];
        let config = Config::load(Some(&file), env).expect("loads");
        assert_eq!(config.listen.bulk_http, Some("0.0.0.0:8010".parse().expect("addr")));
        assert_eq!(config.listen.bulk_grpc, Some("0.0.0.0:8011".parse().expect("addr")));
        let env = vec![("TIERGATE_LISTEN__BULK_HTTP".to_owned(), "nowhere".to_owned())];
        let err = Config::load(None, env).expect_err("a bad address is refused");
        assert!(err.to_string().contains("bulk_http"), "{err}");
    }

    #[test]
    fn file_then_environment() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("tiergate.toml");
        std::fs::write(
            &file,
            "policy_dir = \"/etc/tiergate\"\n[listen]\nhttp = \"0.0.0.0:9000\"\n[limits]\nheader_read_timeout = \"3s\"\n",
        )
        .expect("write");
        let env = vec![
            ("TIERGATE_LISTEN__HTTP".to_owned(), "0.0.0.0:9001".to_owned()),
            ("TIERGATE_THREADS__WORKERS".to_owned(), "3".to_owned()),
            ("TIERGATE_DATA_DIR".to_owned(), "/var/lib/tiergate".to_owned()),
            ("OTHER".to_owned(), "ignored".to_owned()),
            ("TIERGATE_URL".to_owned(), "http://client.side".to_owned()),
            ("TIERGATE_ADMIN__TOKEN".to_owned(), "s3cret-token-value".to_owned()),
            (
                "TIERGATE_BACKENDS__ALLOW".to_owned(),
                "10.0.0.0/8,triton.internal".to_owned(),
            ),
        ];
        let config = Config::load(Some(&file), env).expect("loads");
        assert_eq!(config.listen.http.to_string(), "0.0.0.0:9001");
        assert_eq!(config.policy_dir, PathBuf::from("/etc/tiergate"));
        assert_eq!(config.data_dir, PathBuf::from("/var/lib/tiergate"));
        assert_eq!(config.threads.workers, 3);
        assert_eq!(config.limits.header_read_timeout, Duration::from_secs(3));
        assert_eq!(config.backends.allow, ["10.0.0.0/8", "triton.internal"]);
        let token = config.admin.token.expect("token from the environment");
        assert_eq!(token.0, "s3cret-token-value");
        assert!(!format!("{token:?}").contains("s3cret"), "secrets never print");
    }

    #[test]
    fn unknown_keys_are_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("tiergate.toml");
        std::fs::write(&file, "[listen]\nhtp = \"0.0.0.0:9000\"\n").expect("write");
        let err = Config::load(Some(&file), Vec::new()).expect_err("typo refused");
        assert!(err.to_string().contains("htp"), "{err}");
    }

    #[test]
    fn cpu_lists_come_from_the_file_or_the_environment_and_bad_ones_say_why() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("tiergate.toml");
        std::fs::write(&file, "[threads]\nrealtime_cpus = \"0-3,8\"\n").expect("write");
        let env = vec![("TIERGATE_THREADS__BATCH_CPUS".to_owned(), "1".to_owned())];
        let config = Config::load(Some(&file), env).expect("loads");
        assert_eq!(config.threads.realtime_cpus.to_string(), "0-3,8");
        assert_eq!(
            config.threads.batch_cpus.to_string(),
            "1",
            "a bare number from the environment"
        );
        assert_eq!(
            config.threads.realtime_workers(),
            5,
            "workers = 0: one per real-time CPU"
        );
        assert_eq!(Config::default().threads.realtime_workers(), 0, "tokio's one per core");
        let env = vec![("TIERGATE_THREADS__BATCH_CPUS".to_owned(), "3-1".to_owned())];
        let err = Config::load(None, env).expect_err("a backwards range is refused");
        assert!(err.to_string().contains("runs backwards"), "{err}");
    }
}
