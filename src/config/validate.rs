//! The startup settings checked whole, before anything binds: every problem, each with
//! its dotted key (`limits.budget_reserve: ...`), the way policies are checked. What
//! needs more than the settings (the policy against the allowlist, the admin token file)
//! is checked beside it, in `app`.

use std::fmt;
use std::time::Duration;

use super::{Config, QueueKind};

/// One problem in the startup settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// The dotted key, e.g. `threads.batch_nice` or `kafka.sources[0].max_in_flight`.
    pub key: String,
    /// What is wrong and what would be right.
    pub message: String,
}

/// Every problem found in the startup settings; never empty.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct Problems(pub Vec<Problem>);

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.key, self.message)
    }
}

impl fmt::Display for Problems {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        crate::policy::one_a_line(f, &self.0)
    }
}

/// Collects problems while the settings are read.
#[derive(Default)]
struct Check(Vec<Problem>);

impl Check {
    fn fail(&mut self, key: impl Into<String>, message: impl Into<String>) {
        self.0.push(Problem {
            key: key.into(),
            message: message.into(),
        });
    }

    fn at_least(&mut self, key: &str, value: u64, least: u64) {
        if value < least {
            self.fail(key, format!("must be at least {least}, got {value}"));
        }
    }

    fn positive(&mut self, key: &str, value: Duration) {
        if value.is_zero() {
            self.fail(key, "must be more than 0s");
        }
    }
}

impl Config {
    /// Every problem in these settings, or none.
    pub fn validate(&self) -> Result<(), Problems> {
        let mut check = Check::default();
        self.check_threads(&mut check);
        self.check_limits(&mut check);
        self.check_offline(&mut check);
        self.check_kafka(&mut check);
        self.check_listen(&mut check);
        self.check_tls(&mut check);
        self.check_cache(&mut check);
        if self.shutdown.drain_delay >= self.shutdown.timeout {
            check.fail(
                "shutdown.drain_delay",
                format!(
                    "must be shorter than shutdown.timeout ({:?}), got {:?}: the drain happens within the timeout",
                    self.shutdown.timeout, self.shutdown.drain_delay
                ),
            );
        }
        let otlp = &self.trace.otlp_endpoint;
        if !otlp.is_empty() && otlp.parse::<http::Uri>().is_err() {
            check.fail(
                "trace.otlp_endpoint",
                "must be a URL such as http://otel-collector:4317, or empty",
            );
        }
        match check.0.is_empty() {
            true => Ok(()),
            false => Err(Problems(check.0)),
        }
    }

    fn check_threads(&self, check: &mut Check) {
        let threads = &self.threads;
        if !(0..=19).contains(&threads.batch_nice) {
            check.fail(
                "threads.batch_nice",
                format!(
                    "must be a nice value from 0 (the real-time threads' priority) to 19 (the lowest), got {}",
                    threads.batch_nice
                ),
            );
        }
        check.at_least("threads.batch_workers", threads.batch_workers as u64, 1);
        for (key, cpus) in [
            ("threads.realtime_cpus", &threads.realtime_cpus),
            ("threads.batch_cpus", &threads.batch_cpus),
        ] {
            if let Err(e) = cpus.check(key) {
                check.fail(key, e);
            }
        }
    }

    fn check_limits(&self, check: &mut Check) {
        let limits = &self.limits;
        for (key, value) in [
            ("limits.max_body_bytes", limits.max_body_bytes),
            ("limits.max_response_bytes", limits.max_response_bytes),
            ("limits.max_in_flight_requests", limits.max_in_flight_requests),
            ("limits.max_in_flight_body_bytes", limits.max_in_flight_body_bytes),
            ("limits.max_connections", limits.max_connections),
            ("limits.max_stream_event_bytes", limits.max_stream_event_bytes),
        ] {
            check.at_least(key, value as u64, 1);
        }
        check.at_least("limits.listen_backlog", u64::from(limits.listen_backlog), 1);
        check.positive("limits.header_read_timeout", limits.header_read_timeout);
        check.positive("limits.body_read_timeout", limits.body_read_timeout);
        check.positive("limits.idle_timeout", limits.idle_timeout);
        if !(0.0..=0.5).contains(&limits.budget_reserve) {
            check.fail(
                "limits.budget_reserve",
                format!(
                    "must be the share of each budget to keep back, from 0 to 0.5, got {}",
                    limits.budget_reserve
                ),
            );
        }
    }

    fn check_cache(&self, check: &mut Check) {
        let cache = &self.cache;
        if let Some(url) = &cache.redis {
            if let Err(e) = redis::Client::open(url.0.as_str()) {
                // The client's message never repeats the URL (which may hold a password).
                check.fail(
                    "cache.redis",
                    format!("must be a URL such as redis://host:6379 ({})", e.category()),
                );
            }
        }
        let keep_days = u64::from(self.usage.keep_days);
        if !(1..=3650).contains(&keep_days) {
            check.fail("usage.keep_days", format!("must be 1 to 3650 days, got {keep_days}"));
        }
        if let Some(url) = &self.usage.redis {
            if let Err(e) = redis::Client::open(url.0.as_str()) {
                check.fail(
                    "usage.redis",
                    format!("must be a URL such as redis://host:6379 ({})", e.category()),
                );
            }
        }
        check.positive("usage.redis_timeout", self.usage.redis_timeout);
        let series = self.metrics.max_tenant_series as u64;
        if !(1..=10_000).contains(&series) {
            check.fail("metrics.max_tenant_series", format!("must be 1 to 10000, got {series}"));
        }
        check.positive("cache.redis_timeout", cache.redis_timeout);
        check.positive("cache.redis_retry", cache.redis_retry);
        check.at_least("cache.max_redis_writes", cache.max_redis_writes as u64, 1);
        let prefix = &cache.redis_prefix;
        if prefix.is_empty() || !prefix.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b)) {
            check.fail("cache.redis_prefix", "must be letters, digits, '-', '_' or '.'");
        }
    }

    fn check_offline(&self, check: &mut Check) {
        let offline = &self.offline;
        check.at_least("offline.max_attempts", u64::from(offline.max_attempts), 1);
        check.at_least("offline.max_queued_jobs", offline.max_queued_jobs, 1);
        check.at_least("offline.max_file_bytes", offline.max_file_bytes as u64, 1);
        check.at_least("offline.max_file_lines", offline.max_file_lines as u64, 1);
        check.positive("offline.completion_window", offline.completion_window);
        check.positive("offline.attempt_timeout", offline.attempt_timeout);
    }

    fn check_kafka(&self, check: &mut Check) {
        let kafka = &self.kafka;
        let used = self.offline.queue == QueueKind::Kafka || !kafka.sources.is_empty();
        if used && kafka.brokers.trim().is_empty() {
            check.fail("kafka.brokers", "must name the brokers, host:port[,host:port...]");
        }
        if self.offline.queue == QueueKind::Kafka {
            check.at_least("kafka.queue.max_in_flight", kafka.queue.max_in_flight as u64, 1);
            check.positive("kafka.queue.member_timeout", kafka.queue.member_timeout);
        }
        for (i, source) in kafka.sources.iter().enumerate() {
            let at = format!("kafka.sources[{i}]");
            check.at_least(&format!("{at}.max_in_flight"), source.max_in_flight as u64, 1);
            check.positive(&format!("{at}.budget"), source.budget);
            if !source.path.starts_with('/') || source.path.parse::<http::uri::PathAndQuery>().is_err() {
                check.fail(
                    format!("{at}.path"),
                    format!(
                        "must be a request path such as /v2/models/NAME/infer, got {:?}",
                        source.path
                    ),
                );
            }
            if source.input == source.output {
                check.fail(
                    format!("{at}.output"),
                    "must differ from input: answers would be read as requests",
                );
            }
        }
    }

    fn check_tls(&self, check: &mut Check) {
        match (&self.tls.cert_file, &self.tls.key_file) {
            (Some(_), None) => check.fail("tls.key_file", "is needed with tls.cert_file".to_owned()),
            (None, Some(_)) => check.fail("tls.cert_file", "is needed with tls.key_file".to_owned()),
            (None, None) if self.admin.client_ca_file.is_some() => check.fail(
                "admin.client_ca_file",
                "asks for client certificates, which needs TLS: set tls.cert_file and tls.key_file".to_owned(),
            ),
            _ => {}
        }
    }

    fn check_listen(&self, check: &mut Check) {
        let l = &self.listen;
        let admin_on = self.admin.token.is_some() || self.admin.token_file.is_some() || self.admin.insecure_no_auth;
        let mut bound: Vec<(&str, std::net::SocketAddr)> = vec![
            ("listen.http", l.http),
            ("listen.grpc", l.grpc),
            ("listen.metrics", l.metrics),
        ];
        bound.extend(l.bulk_http.map(|a| ("listen.bulk_http", a)));
        bound.extend(l.bulk_grpc.map(|a| ("listen.bulk_grpc", a)));
        if admin_on {
            bound.push(("listen.admin", l.admin));
        }
        for (i, (key, addr)) in bound.iter().enumerate() {
            let taken = bound[..i].iter().find(|(_, other)| {
                addr.port() != 0
                    && other.port() == addr.port()
                    && (other.ip() == addr.ip() || other.ip().is_unspecified() || addr.ip().is_unspecified())
            });
            if let Some((first, _)) = taken {
                let why = match *key == "listen.admin" || *first == "listen.admin" {
                    true => "the admin API needs a port of its own, never a data or metrics port",
                    false => "every listener needs a port of its own",
                };
                check.fail(*key, format!("{addr} is also {first}: {why}"));
            }
        }
    }
}
