//! Kafka's startup settings: brokers and client settings, the sources, the offline
//! queue's topics.

use std::time::Duration;

use serde::Deserialize;

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

impl KafkaQueue {
    /// This replica's name: `replica`, else the host name and process id (also what the
    /// admin API's history names the gateway by).
    pub fn replica_name(&self) -> String {
        if let Some(name) = &self.replica {
            return name.clone();
        }
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_else(|_| "tiergate".into());
        format!("{}-{}", host.trim(), std::process::id())
    }
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
    /// Keep every answer in the route's cache for this long (at most 7 d), so the same
    /// questions asked of the doors later are answered from it; needs the route's
    /// `[cache]` table. Unset: answers are kept only as the route's cache keeps any.
    #[serde(default, with = "humantime_serde")]
    pub precompute: Option<Duration>,
}

fn default_source_budget() -> Duration {
    Duration::from_secs(2)
}

fn default_source_in_flight() -> usize {
    512
}
