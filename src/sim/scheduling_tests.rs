//! The simulator's scheduling over real sockets: batch cost, FIFO order on one
//! instance, hold and release, clients leaving while queued, and injected faults.
#![allow(clippy::unwrap_used)] // in tests a failed unwrap is a failed test

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use http::StatusCode;
use serde_json::json;

use super::tests::{instant, raw_post, rows_request, start};
use super::{Faults, ModelSpec, Profile};
use crate::protocol;

#[tokio::test]
async fn a_batch_costs_its_profile() {
    let h = start(vec![ModelSpec::new("eager", Profile::named("resnet50-eager").unwrap())]).await;
    let started = Instant::now();
    let answer = h.caller.infer("eager", &rows_request("c", 4), false).await;
    assert_eq!(answer.status, StatusCode::OK);
    assert!(
        started.elapsed() >= Duration::from_micros(7_500 + 4 * 85),
        "{:?}",
        started.elapsed()
    );
    h.stop().await;
}

#[tokio::test]
async fn one_instance_runs_held_batches_one_after_another_in_order() {
    let profile = Profile {
        a: Duration::from_millis(20),
        ..Profile::default()
    };
    let h = start(vec![ModelSpec::new("slow", profile)]).await;
    h.sim.hold();
    let (done_tx, mut done_rx) = tokio::sync::mpsc::unbounded_channel();
    for (i, (id, rows)) in [("a", 1), ("b", 2)].into_iter().enumerate() {
        let (caller, done) = (h.caller.clone(), done_tx.clone());
        tokio::spawn(async move {
            let answer = caller.infer("slow", &rows_request(id, rows), false).await;
            done.send(answer.response().id.unwrap()).unwrap();
        });
        h.wait_for("slow", |s| s.requests == i as u64 + 1).await;
    }
    let stats = h.sim.stats("slow").unwrap();
    assert_eq!((stats.batches, stats.in_flight), (0, 2));
    let released = Instant::now();
    h.sim.release();
    assert_eq!(done_rx.recv().await.unwrap(), "a");
    assert_eq!(done_rx.recv().await.unwrap(), "b");
    assert!(
        released.elapsed() >= Duration::from_millis(40),
        "{:?}",
        released.elapsed()
    );
    let stats = h.sim.stats("slow").unwrap();
    assert_eq!((stats.batches, stats.max_in_flight), (2, 2));
    assert_eq!(stats.batch_sizes, BTreeMap::from([(1, 1), (2, 1)]));
    h.stop().await;
}

#[tokio::test]
async fn a_client_leaving_while_held_is_counted_once_and_its_batch_skipped() {
    let h = start(vec![instant("m")]).await;
    h.sim.hold();
    let (body, _) = protocol::encode_request(&rows_request("gone", 7), false);
    let stream = raw_post(h.addr, body.len(), &body).await;
    h.wait_for("m", |s| s.requests == 1 && s.in_flight == 1).await;
    drop(stream);
    h.wait_for("m", |s| s.cancelled == 1 && s.in_flight == 0).await;
    h.sim.release();
    let answer = h.caller.infer("m", &rows_request("stays", 3), false).await;
    assert_eq!(answer.status, StatusCode::OK);
    let stats = h.sim.stats("m").unwrap();
    assert_eq!((stats.requests, stats.batches, stats.cancelled), (2, 1, 1));
    assert_eq!(stats.batch_sizes, BTreeMap::from([(3, 1)]));
    h.stop().await;
}

#[tokio::test]
async fn faults_are_injected() {
    let mut failing = instant("fail");
    failing.faults.error_rate = 1.0;
    let mut stalling = instant("stall");
    stalling.faults = Faults {
        stall_rate: 1.0,
        stall: Duration::from_millis(30),
        ..Faults::default()
    };
    let h = start(vec![failing, stalling]).await;
    let answer = h.caller.infer("fail", &rows_request("f", 1), false).await;
    assert_eq!(
        (answer.status, answer.json()),
        (StatusCode::INTERNAL_SERVER_ERROR, json!({"error": "injected fault"}))
    );
    let stats = h.sim.stats("fail").unwrap();
    assert_eq!((stats.errors, stats.batches, stats.cancelled), (1, 0, 0));
    let started = Instant::now();
    assert_eq!(
        h.caller.infer("stall", &rows_request("s", 1), false).await.status,
        StatusCode::OK
    );
    assert!(started.elapsed() >= Duration::from_millis(30));
    h.stop().await;
}
