//! The offline queue on Kafka, against a real Kafka-protocol broker (tansu, on
//! loopback): two `tiergate serve` replicas share the jobs of one consumer group; one is
//! killed with SIGKILL while it holds jobs; every job still ends, exactly once on the
//! state topic, and the survivor answers for all of them. And, with two gateways in
//! this process, the Batch API across replicas: a file uploaded at one, a batch created
//! at the other, its output read back at the first; a job cancelled at one is cancelled
//! at the other; an idempotency key names the same job at both.
#![cfg(feature = "kafka")]

use crate::common;

use std::collections::HashMap;
use std::future::Future;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::kafka::Broker;
use common::*;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::Headers;
use rdkafka::{Message, Offset, TopicPartitionList};
use serde_json::{json, Value};
use tiergate::config::{Config, QueueKind};
use tiergate::sim::{ModelSpec, Profile};
use tokio::sync::Notify;
use tokio::time::Instant;

const PARTITIONS: i32 = 4;

/// Per job, its records' (state, replica), in order.
type Records = HashMap<String, Vec<(String, String)>>;

/// Every job record of the state topic seen so far.
#[derive(Clone, Default)]
struct States {
    jobs: Arc<Mutex<Records>>,
    changed: Arc<Notify>,
}

impl States {
    /// Reads `topic` from the beginning, for as long as the test runs.
    fn follow(broker: &Broker, topic: &str) -> States {
        let states = States::default();
        let consumer: StreamConsumer = broker
            .client()
            .set("group.id", "test-states")
            .set("enable.auto.commit", "false")
            .create()
            .expect("consumer");
        let mut all = TopicPartitionList::new();
        for p in 0..PARTITIONS {
            all.add_partition_offset(topic, p, Offset::Beginning)
                .expect("partition");
        }
        consumer.assign(&all).expect("assign");
        let seen = states.clone();
        tokio::spawn(async move {
            while let Ok(m) = consumer.recv().await {
                let Some(record) = m
                    .headers()
                    .and_then(|h| h.iter().find(|h| h.key == "tiergate-record"))
                    .and_then(|h| serde_json::from_slice::<Value>(h.value?).ok())
                else {
                    continue;
                };
                if record["kind"] != "job" {
                    continue;
                }
                let id = record["job"]["id"].as_str().expect("job id").to_owned();
                let state = record["state"].as_str().expect("state").to_owned();
                let by = record["by"].as_str().expect("by").to_owned();
                seen.jobs.lock().expect("lock").entry(id).or_default().push((state, by));
                seen.changed.notify_waiters();
            }
        });
        states
    }

    fn terminal(state: &str) -> bool {
        !matches!(state, "queued" | "running")
    }

    /// Terminal records written by `replica`.
    fn ended_by(&self, replica: &str) -> usize {
        let jobs = self.jobs.lock().expect("lock");
        jobs.values()
            .flatten()
            .filter(|(s, by)| Self::terminal(s) && by == replica)
            .count()
    }

    /// Waits (up to `limit`) until every job of `ids` has a terminal record; `context`
    /// explains a failure.
    async fn all_ended<F: Future<Output = String>>(
        &self,
        ids: &[String],
        limit: Duration,
        context: impl FnOnce(Vec<String>) -> F,
    ) {
        let deadline = Instant::now() + limit;
        loop {
            let changed = self.changed.notified();
            let open: Vec<(String, Vec<(String, String)>)> = {
                let jobs = self.jobs.lock().expect("lock");
                ids.iter()
                    .filter(|id| !jobs.get(*id).is_some_and(|r| r.iter().any(|(s, _)| Self::terminal(s))))
                    .map(|id| (id.clone(), jobs.get(id).cloned().unwrap_or_default()))
                    .collect()
            };
            if open.is_empty() {
                return;
            }
            if Instant::now() >= deadline {
                let first: Vec<String> = open.iter().take(3).map(|(id, _)| id.clone()).collect();
                panic!(
                    "{} jobs had not ended within {limit:?}, among them {:?}\n{}",
                    open.len(),
                    &open[..open.len().min(3)],
                    context(first).await
                );
            }
            let _ = tokio::time::timeout(Duration::from_millis(500), changed).await;
        }
    }
}

/// Where each of `ids` is on the jobs and the state topics (partition, offset and, for
/// states, the state and the replica) and the offsets committed under the queue's
/// group: what a failure needs to be explained.
fn jobs_and_commits(brokers: &str, ids: &[String]) -> String {
    use rdkafka::consumer::BaseConsumer;
    let client = |group: &str| {
        rdkafka::ClientConfig::new()
            .set("bootstrap.servers", brokers)
            .set("group.id", group)
            .set("enable.auto.commit", "false")
            .create::<BaseConsumer>()
            .expect("consumer")
    };
    let mut all = TopicPartitionList::new();
    for p in 0..PARTITIONS {
        all.add_partition("jobs", p);
    }
    let committed = client("tiergate-offline").committed_offsets(all, Duration::from_secs(5));
    let scan = |topic: &str| {
        let reader = client(&format!("test-scan-{topic}"));
        let mut from = TopicPartitionList::new();
        for p in 0..PARTITIONS {
            let _ = from.add_partition_offset(topic, p, Offset::Beginning);
        }
        let _ = reader.assign(&from);
        let mut found = Vec::new();
        // The replicas' heartbeats keep coming: stop after 2 quiet seconds, or 15 in all.
        let (mut quiet, until) = (0, std::time::Instant::now() + Duration::from_secs(15));
        while quiet < 20 && std::time::Instant::now() < until {
            let Some(Ok(m)) = reader.poll(Duration::from_millis(100)) else {
                quiet += 1;
                continue;
            };
            quiet = 0;
            let key = String::from_utf8_lossy(m.key().unwrap_or_default()).into_owned();
            if ids.contains(&key) {
                let record = m
                    .headers()
                    .and_then(|h| h.iter().find(|h| h.key == "tiergate-record"))
                    .and_then(|h| serde_json::from_slice::<Value>(h.value?).ok())
                    .unwrap_or_default();
                found.push((
                    key,
                    m.partition(),
                    m.offset(),
                    format!("{} {}", record["state"], record["by"]),
                ));
            }
        }
        found
    };
    format!(
        "on the jobs topic: {:?}\non the state topic: {:?}\ncommitted under tiergate-offline: {committed:?}\n",
        scan("jobs"),
        scan("states")
    )
}

/// A `tiergate serve` replica with the Kafka queue, killed when dropped.
struct Replica {
    child: Option<Child>,
    http: std::net::SocketAddr,
    metrics: std::net::SocketAddr,
    log: std::path::PathBuf,
}

impl Drop for Replica {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Replica {
    async fn start(name: &str, dir: &Path, broker: &Broker) -> Replica {
        let log = dir.join(format!("{name}.log"));
        let mut command = Command::new(env!("CARGO_BIN_EXE_tiergate"));
        for (key, _) in std::env::vars().filter(|(k, _)| k.starts_with("TIERGATE_")) {
            command.env_remove(key);
        }
        let child = command
            .args(["serve", "--policy-dir"])
            .arg(dir.join("policy"))
            .arg("--data-dir")
            .arg(dir.join(name))
            .args([
                "--http",
                "127.0.0.1:0",
                "--grpc",
                "127.0.0.1:0",
                "--metrics",
                "127.0.0.1:0",
            ])
            .env("TIERGATE_OFFLINE__QUEUE", "kafka")
            .env("TIERGATE_KAFKA__BROKERS", &broker.addr)
            .env("TIERGATE_KAFKA__QUEUE__JOBS", "jobs")
            .env("TIERGATE_KAFKA__QUEUE__STATES", "states")
            .env("TIERGATE_KAFKA__QUEUE__MAX_IN_FLIGHT", "64")
            .env("TIERGATE_KAFKA__QUEUE__REPLICA", name)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("tiergate starts");
        let mut child = child;
        let at = common::ports::wait_serving(&log, 0, &mut child, Duration::from_secs(60)).await;
        let replica = Replica {
            child: Some(child),
            http: at.http,
            metrics: at.metrics,
            log,
        };
        wait_ready(at.http.port(), "/v2/health/ready", Duration::from_secs(60)).await;
        replica
    }

    fn addr(&self) -> std::net::SocketAddr {
        self.http
    }

    /// The partitions of the jobs topic it was last assigned (from its log: the only
    /// signal of group membership a process gives).
    fn assigned(&self) -> Option<Vec<u32>> {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let log = plain(&log);
        let line = log.lines().rev().find(|l| l.contains("partitions of the jobs topic"))?;
        if !line.contains("assigned") {
            return Some(Vec::new());
        }
        let list = line.split("partitions=[").nth(1)?.split(']').next()?;
        Some(list.split(',').filter_map(|p| p.trim().parse().ok()).collect())
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().expect("SIGKILL"); // std's kill is SIGKILL on Unix
            child.wait().expect("reaped");
        }
    }
}

/// `text` without its terminal colour codes.
fn plain(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            chars.by_ref().find(|c| *c == 'm');
        } else {
            out.push(c);
        }
    }
    out
}

fn body(i: usize) -> String {
    format!(r#"{{"inputs":[{{"name":"INPUT0","datatype":"FP32","shape":[1,1],"data":[{i}]}}]}}"#)
}

/// The echoed value of an answer to [`body`].
fn echoed(answer: &Value) -> usize {
    answer["outputs"][0]["data"][0].as_f64().expect("OUTPUT0") as usize
}

async fn submit(addr: std::net::SocketAddr, i: usize, headers: &[(&str, &str)]) -> String {
    let mut all = vec![("prefer", "respond-async")];
    all.extend_from_slice(headers);
    let answer = infer(addr, "m", &all, &body(i)).await;
    assert_eq!(answer.status, 202, "job {i}: {}", answer.text());
    answer.json()["id"].as_str().expect("job id").to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_killed_mid_run_loses_no_job_and_no_job_ends_twice() {
    const N: usize = 1200;
    let broker = Broker::start().await;
    broker.create_topics(&["jobs", "states"], PARTITIONS).await;
    // A batch costs 5 ms + 1 ms per row: slow enough that a replica always has work in flight.
    let profile = Profile {
        a: Duration::from_millis(5),
        b: Duration::from_millis(1),
        floor: Duration::ZERO,
    };
    let sim = backend_with(vec![ModelSpec::new("m", profile)]).await;
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir(dir.path().join("policy")).expect("policy dir");
    let policy = route_r(&sim.url(), &sim.url())
        .flags(&["offline", "micro_batch"])
        .set("micro_batch.max_batch", 16)
        .toml();
    std::fs::write(dir.path().join("policy/route.toml"), policy).expect("policy");
    let states = States::follow(&broker, "states");

    let mut a = Replica::start("a", dir.path(), &broker).await;
    let b = Replica::start("b", dir.path(), &broker).await;
    // Submit only once the group has settled with both (a rebalance while jobs run is
    // not what this test is about).
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (pa, pb) = (a.assigned().unwrap_or_default(), b.assigned().unwrap_or_default());
        if !pa.is_empty() && !pb.is_empty() && pa.len() + pb.len() == PARTITIONS as usize {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the group did not settle: a {pa:?}, b {pb:?}; a's log:\n{}",
            std::fs::read_to_string(&a.log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(100)).await; // polling the children's logs
    }

    // Submitted 16 at a time, alternately to each replica, while the backend holds every
    // batch: each replica then has a backlog when the backend lets go, and a has jobs
    // left when it is killed, however fast this machine is.
    sim.sim.hold();
    let mut ids = vec![String::new(); N];
    for chunk in (0..N).collect::<Vec<_>>().chunks(16) {
        let mut sent = tokio::task::JoinSet::new();
        for &i in chunk {
            let to = if i % 2 == 0 { a.addr() } else { b.addr() };
            sent.spawn(async move { (i, submit(to, i, &[]).await) });
        }
        while let Some(done) = sent.join_next().await {
            let (i, id) = done.expect("submitted");
            ids[i] = id;
        }
    }
    sim.sim.release();
    // Kill a while it holds jobs it read and has not finished, after it finished some.
    let deadline = Instant::now() + Duration::from_secs(60);
    let held = loop {
        let scrape = get(a.metrics, "/metrics").await.text();
        let held = scrape
            .lines()
            .find(|l| l.starts_with("tiergate_kafka_queue_held "))
            .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .unwrap_or(0.0);
        if held > 0.0 && states.ended_by("a") >= 50 {
            a.kill();
            break held;
        }
        assert!(
            Instant::now() < deadline,
            "replica a never held jobs after finishing 50"
        );
        tokio::time::sleep(Duration::from_millis(20)).await; // polling a child's metrics
    };

    let b_log = b.log.clone();
    let (jobs_at, b_addr) = (broker.addr.clone(), b.addr());
    let context = move |open: Vec<String>| async move {
        let mut why = String::new();
        for id in &open {
            let answer = get(b_addr, &format!("/v1/jobs/{id}")).await;
            why += &format!("b says of {id}: {} {}\n", answer.status, answer.text());
        }
        let where_ = tokio::task::spawn_blocking(move || jobs_and_commits(&jobs_at, &open)).await;
        why += &where_.unwrap_or_default();
        let scrape = get(b.metrics, "/metrics").await.text();
        why += &scrape
            .lines()
            .filter(|l| l.starts_with("tiergate_kafka_queue_held"))
            .collect::<Vec<_>>()
            .join("\n");
        let a_log = b_log.with_file_name("a.log");
        why + "\nb's log:\n"
            + &plain(&std::fs::read_to_string(&b_log).unwrap_or_default())
            + "\na's log:\n"
            + &plain(&std::fs::read_to_string(&a_log).unwrap_or_default())
    };
    states.all_ended(&ids, Duration::from_secs(60), context).await;
    let (by_a, by_b) = (states.ended_by("a"), states.ended_by("b"));
    {
        let jobs = states.jobs.lock().expect("lock");
        for id in &ids {
            let ends: Vec<&(String, String)> = jobs[id].iter().filter(|(s, _)| States::terminal(s)).collect();
            assert_eq!(ends.len(), 1, "job {id} ended exactly once: {:?}", jobs[id]);
            assert_eq!(ends[0].0, "succeeded", "job {id}: {:?}", jobs[id]);
        }
    }
    assert_eq!(by_a + by_b, N);
    assert!(by_a >= 50 && by_b > 0, "both replicas ran jobs: a {by_a}, b {by_b}");
    assert!(held > 0.0, "a held unfinished jobs when it was killed");

    // The survivor answers for every job, with that job's own answer.
    for (i, id) in ids.iter().enumerate() {
        let answer = get(b.addr(), &format!("/v1/jobs/{id}")).await;
        assert_eq!(answer.status, 200, "job {id}: {}", answer.text());
        assert_eq!(answer.header("x-tiergate-job-status"), Some("succeeded"));
        assert_eq!(echoed(&answer.json()), i, "job {id} has its own answer");
    }
}

fn kafka_config(broker: &Broker, name: &str) -> Config {
    let mut config = config();
    config.offline.queue = QueueKind::Kafka;
    config.kafka.brokers = broker.addr.clone();
    config.kafka.queue.jobs = "jobs".into();
    config.kafka.queue.states = "states".into();
    config.kafka.queue.replica = Some(name.into());
    config
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_batch_api_cancellation_and_idempotency_work_across_replicas() {
    let broker = Broker::start().await;
    broker.create_topics(&["jobs", "states"], PARTITIONS).await;
    let (sim, candidate) = (backend(&["m"]).await, backend(&["m"]).await);
    // Batches scored by a shadow candidate (live calls are not: percent = 0).
    let shadow = format!(
        "[routes.r.shadow]\npercent = 0\n[routes.r.shadow.candidate]\nendpoints = [\"{}\"]\n",
        candidate.url()
    );
    let flags = "offline = true\nmicro_batch = true\nshadow = true";
    let policy = route(&sim.url(), &sim.url(), flags, &shadow);
    let one = gateway_with(kafka_config(&broker, "one"), &policy).await;
    let two = gateway_with(kafka_config(&broker, "two"), &policy).await;

    // An idempotency key names one job at both replicas.
    let first = submit(one.http_addr(), 7, &[("idempotency-key", "k-7")]).await;
    let again = infer(
        two.http_addr(),
        "m",
        &[("prefer", "respond-async"), ("idempotency-key", "k-7")],
        &body(7),
    )
    .await;
    assert_eq!(again.status, 202, "{}", again.text());
    assert_eq!(again.json()["id"], first.as_str());
    assert_eq!(again.json()["existing"], true);
    // The same key with another request is refused at either replica.
    let reused = infer(
        two.http_addr(),
        "m",
        &[("prefer", "respond-async"), ("idempotency-key", "k-7")],
        &body(8),
    )
    .await;
    assert_eq!(reused.status, 422, "{}", reused.text());

    // A file uploaded at one replica, a shadow batch of it created at the other.
    let lines = jsonl("c", 40);
    let file = upload(one.http_addr(), &lines).await;
    let created = send(
        "POST",
        two.http_addr(),
        "/v1/batches",
        &[("content-type", "application/json")],
        json!({"input_file_id": file, "endpoint": "/v2/models/m/infer", "completion_window": "24h", "shadow": true})
            .to_string(),
    )
    .await;
    assert_eq!(created.status, 200, "{}", created.text());
    let batch = created.json()["id"].as_str().expect("batch id").to_owned();

    // A file of several chunks (512 KiB each on the state topic) reads back whole at the other replica.
    let big = jsonl("big", 9000);
    assert!(big.len() > 2 * 512 * 1024, "{} bytes", big.len());
    let big_id = upload(two.http_addr(), &big).await;
    let read_back = get(one.http_addr(), &format!("/v1/files/{big_id}/content")).await;
    assert_eq!(read_back.status, 200, "{}", read_back.text());
    assert!(
        read_back.body == big.as_bytes(),
        "the file came back whole and in order"
    );
    // Deleted at one replica, it is gone at the other too.
    let deleted = send("DELETE", one.http_addr(), &format!("/v1/files/{big_id}"), &[], "").await;
    assert_eq!(deleted.status, 200, "{}", deleted.text());
    eventually(Duration::from_secs(10), "the other replica drops the file", || async {
        let listed = get(two.http_addr(), "/v1/files").await.json();
        let ids: Vec<&str> = listed["data"]
            .as_array()?
            .iter()
            .filter_map(|f| f["id"].as_str())
            .collect();
        (!ids.contains(&big_id.as_str()) && ids.contains(&file.as_str())).then_some(())
    })
    .await;
    assert_eq!(get(two.http_addr(), &format!("/v1/files/{big_id}")).await.status, 404);

    // Both replicas see it complete, with the same output file, readable at either.
    let deadline = Instant::now() + Duration::from_secs(60);
    let (at_one, at_two) = loop {
        let one_view = get(one.http_addr(), &format!("/v1/batches/{batch}")).await.json();
        let two_view = get(two.http_addr(), &format!("/v1/batches/{batch}")).await.json();
        if one_view["status"] == "completed" && two_view["status"] == "completed" {
            break (one_view, two_view);
        }
        assert!(
            Instant::now() < deadline,
            "not completed in 60 s: {one_view} / {two_view}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await; // polling, as a client does
    };
    assert_eq!(at_one["output_file_id"], at_two["output_file_id"]);
    assert_eq!(
        at_one["request_counts"],
        json!({"total": 40, "completed": 40, "failed": 0})
    );
    let output = at_two["output_file_id"].as_str().expect("output file");
    let content = get(one.http_addr(), &format!("/v1/files/{output}/content"))
        .await
        .text();
    let mut seen: Vec<usize> = content
        .lines()
        .map(|l| {
            let line: Value = serde_json::from_str(l).expect("JSONL");
            let custom: usize = line["custom_id"].as_str().expect("custom_id")[1..].parse().expect("n");
            assert_eq!(echoed(&line["response"]["body"]), custom, "{line}");
            custom
        })
        .collect();
    seen.sort_unstable();
    assert_eq!(seen, (0..40).collect::<Vec<_>>());
    // Its comparison, the same at both replicas: every line scored, the candidate (the
    // same model) agreeing on all.
    assert_eq!(at_one["shadow"], at_two["shadow"]);
    let summary = &at_one["shadow"]["summary"];
    assert_eq!(
        (&summary["compared"], &summary["agreement"]),
        (&json!(40), &json!(1.0)),
        "{summary}"
    );
    let comparison = at_one["shadow"]["comparison_file_id"]
        .as_str()
        .expect("comparison file");
    let content = get(two.http_addr(), &format!("/v1/files/{comparison}/content"))
        .await
        .text();
    assert_eq!(content.lines().count(), 40, "{content}");

    // A job cancelled at one replica while it runs at the backend: the cancellation
    // lands first and wins at both replicas; the result that lands after it is ignored.
    let states = States::follow(&broker, "states");
    let before = sim.sim.stats("m").expect("model").requests;
    sim.sim.hold();
    let running = submit(two.http_addr(), 99, &[]).await;
    wait_for(&sim, |s| s.requests > before).await; // it is at the held backend
    let cancelled = send("DELETE", one.http_addr(), &format!("/v1/jobs/{running}"), &[], "").await;
    assert_eq!(cancelled.status, 200, "{}", cancelled.text());
    assert_eq!(cancelled.json()["status"], "cancelled");
    sim.sim.release();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let changed = states.changed.notified();
        let ends: Vec<String> = states.jobs.lock().expect("lock").get(&running).map_or(Vec::new(), |r| {
            r.iter()
                .filter(|(s, _)| States::terminal(s))
                .map(|(s, _)| s.clone())
                .collect()
        });
        if ends.len() == 2 {
            assert_eq!(
                ends,
                ["cancelled", "succeeded"],
                "the result came after the cancellation"
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the held job's result never landed: {ends:?}"
        );
        let _ = tokio::time::timeout(Duration::from_millis(500), changed).await;
    }
    for gw in [&one, &two] {
        let answer = get(gw.http_addr(), &format!("/v1/jobs/{running}")).await;
        assert_eq!(answer.status, 410, "{}", answer.text());
        assert_eq!(answer.header("x-tiergate-job-status"), Some("cancelled"));
    }
    one.stop().await.expect("stops");
    two.stop().await.expect("stops");
}

/// A Batch API input file of `n` requests [`body`]`(i)`, with custom ids `{prefix}{i}`.
fn jsonl(prefix: &str, n: usize) -> String {
    (0..n)
        .map(|i| {
            let body: Value = serde_json::from_str(&body(i)).expect("json");
            json!({"custom_id": format!("{prefix}{i}"), "method": "POST", "url": "/v2/models/m/infer", "body": body})
                .to_string()
                + "\n"
        })
        .collect()
}

/// Uploads `content` as a Batch API input file; its id.
async fn upload(addr: std::net::SocketAddr, content: &str) -> String {
    let boundary = "tiergate-test-boundary";
    let body = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n--{boundary}\r\n\
         Content-Disposition: form-data; name=\"file\"; filename=\"in.jsonl\"\r\nContent-Type: application/jsonl\r\n\r\n\
         {content}\r\n--{boundary}--\r\n"
    );
    let answer = send(
        "POST",
        addr,
        "/v1/files",
        &[("content-type", &format!("multipart/form-data; boundary={boundary}"))],
        body,
    )
    .await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    answer.json()["id"].as_str().expect("file id").to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_the_kafka_queue_a_tenant_reads_only_its_own_jobs_and_files_and_the_admin_every_batch() {
    let broker = Broker::start().await;
    broker.create_topics(&["jobs", "states"], PARTITIONS).await;
    let sim = backend(&["m"]).await;
    let policy = route_r(&sim.url(), &sim.url())
        .flags(&["offline", "micro_batch"])
        .toml();
    let mut config = kafka_config(&broker, "one");
    std::fs::create_dir_all(&config.data_dir).expect("data dir");
    let keys = config.data_dir.with_extension("keys");
    let lines = [("team-a", "key-a"), ("team-b", "key-b")].map(|(t, k)| tiergate::front::auth::line(t, k));
    std::fs::write(&keys, lines.join("\n")).expect("keys");
    config.auth.keys_file = Some(keys);
    config.listen.admin = "127.0.0.1:0".parse().expect("addr");
    config.admin.token = Some(tiergate::config::Secret("kafka-admin-token".into()));
    let gw = gateway_with(config, &policy).await;
    let (a, b) = (("authorization", "Bearer key-a"), ("authorization", "Bearer key-b"));

    let job = submit(gw.http_addr(), 3, &[a]).await;
    let path = format!("/v1/jobs/{job}");
    let theirs = send("GET", gw.http_addr(), &path, &[b], "").await;
    assert_eq!(theirs.status, 404, "{}", theirs.text());
    let cancel = send("DELETE", gw.http_addr(), &path, &[b], "").await;
    assert_eq!(cancel.status, 404, "{}", cancel.text());
    let own = send("GET", gw.http_addr(), &path, &[a], "").await;
    assert!(matches!(own.status, 200 | 202), "{}", own.text());

    let file = upload_file(gw.http_addr(), &jsonl("c", 2), &[a]).await;
    assert_eq!(file.status, 200, "{}", file.text());
    let id = file.json()["id"].as_str().expect("id").to_owned();
    let content = format!("/v1/files/{id}/content");
    assert_eq!(send("GET", gw.http_addr(), &content, &[b], "").await.status, 404);
    assert_eq!(send("GET", gw.http_addr(), &content, &[a], "").await.status, 200);

    // The admin token sees team a's batch in the view of the state topic, with its
    // tenant, and finds its owner to cancel it (too late: it completed).
    let batch = create_batch(gw.http_addr(), &Value::from(id), "m", &[a]).await;
    let path = format!("/v1/batches/{batch}");
    eventually(Duration::from_secs(20), "team a's batch completes", || async {
        (send("GET", gw.http_addr(), &path, &[a], "").await.json()["status"] == "completed").then_some(())
    })
    .await;
    let admin = |method, path: String| {
        let gw = &gw;
        async move { admin_call(gw, "kafka-admin-token", (method, &path), &[], "").await }
    };
    let all = admin("GET", "/admin/offline".into()).await.json();
    assert_eq!(all["batches"][0]["id"], batch.as_str(), "{all:#}");
    assert_eq!(all["batches"][0]["tenant"], "team-a", "{all:#}");
    let late = admin("POST", format!("/admin/batches/{batch}/cancel")).await;
    assert_eq!(
        (late.status, late.json()["error"]["code"].as_str()),
        (409, Some("not_cancellable"))
    );
    gw.stop().await.expect("stops");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_usage_ledger_adds_up_across_two_replicas_and_a_restart() {
    let broker = Broker::start().await;
    broker.create_topics(&["jobs", "states"], PARTITIONS).await;
    let sim = backend(&["m"]).await;
    // Tenant c may make 3 requests a day on the route, at every replica together.
    let policy = route(
        &sim.url(),
        &sim.url(),
        "",
        "[routes.r.quotas.tenants.c]\ndaily_requests = 3\n",
    );
    let token = "fleet-usage-token";
    let with_admin = |name: &str| {
        let mut config = kafka_config(&broker, name);
        config.listen.admin = "127.0.0.1:0".parse().expect("addr");
        config.admin.token = Some(tiergate::config::Secret(token.into()));
        config
    };
    let one = gateway_with(with_admin("one"), &policy).await;
    let two_config = with_admin("two");
    let two = gateway_with(two_config.clone(), &policy).await;
    let ask = |gw: &tiergate::app::Gateway, tenant: &'static str, n: usize| {
        let addr = gw.http_addr();
        async move {
            for i in 0..n {
                let answer = infer(addr, "m", &[("x-api-key", tenant)], &body(i)).await;
                assert_eq!(answer.status, 200, "{}", answer.text());
            }
        }
    };
    ask(&one, "a", 5).await;
    ask(&two, "a", 3).await;
    ask(&two, "b", 4).await;
    let usage = |gw: &tiergate::app::Gateway| {
        let gw_admin = gw.admin_api().expect("admin").clone();
        async move {
            let auth = format!("Bearer {token}");
            let answer = oneshot(
                |r| async move { gw_admin.answer(r).await },
                "GET",
                "/admin/usage?by=tenant",
                &[("authorization", auth.as_str())],
                String::new(),
            )
            .await;
            assert_eq!(answer.status, 200, "{}", answer.text());
            answer.json()
        }
    };
    let requests = |report: &Value, tenant: &str| {
        report["rows"]
            .as_array()
            .expect("rows")
            .iter()
            .find(|l| l["tenant"] == tenant)
            .map_or(0, |l| l["requests"].as_u64().expect("requests"))
    };
    // Read at replica one (its own share written and published by the read; replica
    // two's by its own read just before): the fleet's, summed.
    usage(&two).await;
    let fleet = usage(&one).await;
    assert_eq!((requests(&fleet, "a"), requests(&fleet, "b")), (8, 4), "{fleet:#}");
    assert_eq!(fleet["total"]["requests"], 12);
    // Replica two stopped and started again (its view rebuilt from the state topic): the
    // same table from it, with its own share and the other's.
    two.stop().await.expect("stops");
    let two = gateway_with(two_config, &policy).await;
    let again = usage(&two).await;
    assert_eq!((requests(&again, "a"), requests(&again, "b")), (8, 4), "{again:#}");
    // More at the restarted replica adds to the same periods.
    ask(&two, "b", 2).await;
    let after = usage(&two).await;
    assert_eq!(requests(&after, "b"), 6, "{after:#}");
    // A quota counts every replica's use: two at one, then (once each has shared its
    // ledger) the third at two is the last the day allows.
    ask(&one, "c", 2).await;
    usage(&one).await;
    usage(&two).await;
    ask(&two, "c", 1).await;
    usage(&two).await;
    let refused = infer(two.http_addr(), "m", &[("x-api-key", "c")], &body(9)).await;
    assert_eq!(refused.status, 429, "{}", refused.text());
    assert!(
        refused
            .text()
            .contains("daily_requests 3 reached for tenant c on route r"),
        "{}",
        refused.text()
    );
    drop(one);
}
