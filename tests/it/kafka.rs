//! Kafka as a source and sink, against a real Kafka-protocol broker (tansu, started
//! here on loopback; `scripts/tansu.sh` installs it and the test command passes its
//! path in `TANSU_BIN`): a topic of requests becomes a topic of answers with none
//! missing, through the micro-batch tier, with back-pressure; and start refuses clearly
//! when the brokers cannot be reached or a topic is missing.
#![cfg(feature = "kafka")]

use crate::common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::kafka::Broker;
use common::*;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::Headers;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::Message;
use tiergate::app::Gateway;
use tiergate::config::KafkaSource;
use tokio::time::Instant;

fn request(i: u32) -> String {
    let row: Vec<u32> = (0..4).map(|j| i * 10 + j).collect();
    format!(r#"{{"inputs":[{{"name":"INPUT0","datatype":"FP32","shape":[1,4],"data":{row:?}}}]}}"#)
}

fn source(input: &str, output: &str) -> KafkaSource {
    KafkaSource {
        route: "kafka".into(),
        input: input.into(),
        output: output.into(),
        path: "/v2/models/m/infer".into(),
        group: None,
        budget: Duration::from_secs(2),
        max_in_flight: 256,
        precompute: None,
    }
}

const ROUTE_EXTRA: &str = "";

/// Produces requests 0..n to `topic`, keyed `k{i}`.
async fn produce(broker: &Broker, topic: &str, n: u32) {
    let producer: FutureProducer = broker.client().create().expect("producer");
    for i in 0..n {
        let (key, body) = (format!("k{i}"), request(i));
        producer
            .send(
                FutureRecord::to(topic).key(&key).payload(&body),
                Duration::from_secs(10),
            )
            .await
            .map_err(|(e, _)| e)
            .expect("request produced");
    }
}

/// A consumer of `topic` from its start.
fn reader(broker: &Broker, topic: &str) -> StreamConsumer {
    let consumer: StreamConsumer = broker
        .client()
        .set("group.id", "test-reader")
        .set("auto.offset.reset", "earliest")
        .create()
        .expect("consumer");
    consumer.subscribe(&[topic]).expect("subscribe");
    consumer
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_of_requests_becomes_a_topic_of_answers_with_none_missing() {
    const N: u32 = 2000;
    let broker = Broker::start().await;
    broker.create_topics(&["requests", "answers"], 3).await;
    let sim = backend(&["m"]).await;

    // Produce every request before the gateway starts: a backlog it must drain.
    produce(&broker, "requests", N).await;

    // A small queue, so the source meets back-pressure (429s) and has to pause.
    // A route of its own (kafka): metrics are the test process's.
    let policy = (route(&sim.url(), &sim.url(), "micro_batch = true", ROUTE_EXTRA)
        + "max_batch = 32\nmax_wait = \"5ms\"\nqueue_capacity = 64\n")
        .replace("routes.r", "routes.kafka");
    let mut config = config();
    config.kafka.brokers = broker.addr.clone();
    config.kafka.sources = vec![source("requests", "answers")];
    let gw = gateway_with(config, &policy).await;

    let consumer = reader(&broker, "answers");
    let mut answers: BTreeMap<String, (String, serde_json::Value)> = BTreeMap::new();
    let limit = Instant::now() + Duration::from_secs(120);
    while answers.len() < N as usize {
        let left = limit.saturating_duration_since(Instant::now());
        let message = tokio::time::timeout(left, consumer.recv())
            .await
            .unwrap_or_else(|_| panic!("only {} of {N} answers within 120 s", answers.len()))
            .expect("read an answer");
        let key = String::from_utf8(message.key().expect("answers are keyed").to_vec()).expect("utf-8 key");
        let status = message
            .headers()
            .and_then(|h| h.iter().find(|h| h.key == "tiergate-status"))
            .and_then(|h| h.value)
            .map(|v| String::from_utf8_lossy(v).into_owned())
            .expect("a status header");
        let batch = message
            .headers()
            .and_then(|h| h.iter().find(|h| h.key == "tiergate-batch-id"))
            .and_then(|h| h.value);
        assert!(
            batch.is_some_and(|b| b.starts_with(b"mb_")),
            "every answer names its batch"
        );
        let body: serde_json::Value = serde_json::from_slice(message.payload().expect("a body")).expect("JSON answer");
        answers.insert(key, (status, body));
    }
    for i in 0..N {
        let (status, body) = &answers[&format!("k{i}")];
        assert_eq!(status, "200", "k{i}: {body}");
        let echoed: Vec<u32> = body["outputs"][0]["data"]
            .as_array()
            .expect("OUTPUT0 data")
            .iter()
            .map(|v| v.as_f64().expect("a number") as u32)
            .collect();
        assert_eq!(
            echoed,
            (0..4).map(|j| i * 10 + j).collect::<Vec<_>>(),
            "k{i} got its own answer"
        );
    }
    let stats = sim.sim.stats("m").expect("model");
    assert!(
        stats.batches < u64::from(N) / 4,
        "the requests were micro-batched: {} batches for {N} requests",
        stats.batches
    );
    let scrape = get(gw.metrics_addr(), "/metrics").await.text();
    assert!(
        scrape.contains(&format!(
            "tiergate_kafka_source_messages_total{{source=\"requests\",result=\"answered\"}} {N}"
        )),
        "{scrape}"
    );
    let retried = scrape
        .lines()
        .find(|l| l.starts_with("tiergate_kafka_source_retries_total{source=\"requests\"}"))
        .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .unwrap_or(0.0);
    assert!(
        retried > 0.0,
        "chunks of 256 against a queue of 64 met back-pressure:\n{scrape}"
    );
    // The source is a door like the others: its requests are counted as decided
    // (always micro-batch), as served, and against the SLO.
    let counter = |name: &str| {
        scrape
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    let decided = counter("tiergate_decisions_total{route=\"kafka\",tier=\"micro_batch\",reason=\"kafka_source\"}");
    assert!(
        decided >= f64::from(N),
        "every message decided micro-batch, retries too:\n{scrape}"
    );
    let ok = counter("tiergate_requests_total{route=\"kafka\",tier=\"micro_batch\",outcome=\"ok\"}");
    assert_eq!(ok, f64::from(N), "{scrape}");
    let met = counter("tiergate_slo_requests_total{route=\"kafka\",tier=\"micro_batch\",result=\"met\"}");
    assert_eq!(met, f64::from(N), "{scrape}");
    gw.stop().await.expect("stops");
}

#[tokio::test]
async fn start_refuses_an_unreachable_broker_and_a_missing_topic() {
    let sim = backend(&["m"]).await;
    let policy = route(&sim.url(), &sim.url(), "micro_batch = true", ROUTE_EXTRA).replace("routes.r", "routes.kafka");

    let mut config = config();
    config.kafka.brokers = dead_addr().await.to_string();
    config.kafka.sources = vec![source("requests", "answers")];
    let error = Gateway::start(&config, common::policy(&policy))
        .await
        .expect_err("refused");
    assert!(error.to_string().contains("cannot reach the brokers"), "{error}");

    let broker = Broker::start().await;
    broker.create_topics(&["present"], 1).await;
    let mut config = common::config();
    config.kafka.brokers = broker.addr.clone();
    config.kafka.sources = vec![source("present", "absent")];
    let error = Gateway::start(&config, common::policy(&policy))
        .await
        .expect_err("refused");
    assert!(error.to_string().contains("topic absent does not exist"), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_precomputing_source_turns_later_calls_into_cache_hits() {
    const N: u32 = 20;
    let broker = Broker::start().await;
    broker.create_topics(&["nightly", "scores"], 1).await;
    let sim = backend(&["m"]).await;
    // A route of its own: metrics are the test process's.
    let policy = (route(&sim.url(), &sim.url(), "micro_batch = true\ncache = true", ROUTE_EXTRA)
        + "[routes.r.cache]\n")
        .replace("routes.r", "routes.kafkapre");
    let mut config = config();
    config.kafka.brokers = broker.addr.clone();
    config.kafka.sources = vec![KafkaSource {
        route: "kafkapre".into(),
        precompute: Some(Duration::from_secs(3600)),
        ..source("nightly", "scores")
    }];
    let gw = gateway_with(config, &policy).await;
    produce(&broker, "nightly", N).await;
    let consumer = reader(&broker, "scores");
    for _ in 0..N {
        tokio::time::timeout(Duration::from_secs(60), consumer.recv())
            .await
            .expect("an answer within 60 s")
            .expect("read an answer");
    }
    let computed = sim.sim.stats("m").expect("model").rows;
    assert_eq!(computed, u64::from(N));
    // The next day's real-time calls: lookups, not model calls.
    for i in 0..N {
        let answer = infer(gw.http_addr(), "m", &[("x-tiergate-budget-ms", "100")], &request(i)).await;
        assert_eq!(answer.status, 200, "{}", answer.text());
        assert_eq!(answer.header("x-tiergate-cache"), Some("hit"), "request {i}");
        let echoed = answer.json()["outputs"][0]["data"].clone();
        assert_eq!(
            echoed,
            serde_json::json!((0..4).map(|j| f64::from(i * 10 + j)).collect::<Vec<_>>())
        );
    }
    assert_eq!(sim.sim.stats("m").expect("model").rows, computed, "no backend call");
    assert_eq!(
        metric(&gw, "tiergate_cache_precomputed_total{route=\"kafkapre\"}").await,
        f64::from(N)
    );
    assert_eq!(
        metric(&gw, "tiergate_cache_precomputed_hits_total{route=\"kafkapre\"}").await,
        f64::from(N)
    );
    gw.stop().await.expect("stops");
}
