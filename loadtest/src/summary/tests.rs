//! Tests of the summary: percentiles, text and JSON shape.

use std::time::Instant;

use anyhow::Context as _;

use super::*;
use crate::record::{Failure, Outcome, Reply};

fn outcome(intended: Instant, latency: Duration, result: Result<Reply, Failure>) -> Outcome {
    Outcome {
        intended,
        started: intended,
        done: intended + latency,
        result,
    }
}

fn reply(status: u16, tier: &str) -> Result<Reply, Failure> {
    Ok(Reply {
        status,
        tier: tier.into(),
    })
}

/// 1000 responses of 1..=1000 µs in second 0, tier realtime; in second 1 a 404 of 20 ms
/// without tier, a timeout and a dropped request.
fn recording() -> Recording {
    let start = Instant::now();
    let mut rec = Recording::new(start, Duration::from_secs(2));
    for us in 1..=1000u64 {
        let latency = Duration::from_micros(us);
        rec.record(outcome(start + latency, latency, reply(200, "realtime")));
    }
    let late = start + Duration::from_millis(1500);
    rec.record(outcome(late, Duration::from_millis(20), reply(404, "none")));
    rec.record(outcome(late, Duration::ZERO, Err(Failure::Transport("timeout".into()))));
    rec.record(outcome(late, Duration::ZERO, Err(Failure::DroppedClientSide)));
    rec
}

fn meta() -> Meta {
    Meta {
        label: Some("unit".into()),
        url: "http://127.0.0.1:1".into(),
        model: "m".into(),
        schedule: "constant 501.5/s".into(),
        warmup: Duration::from_secs(1),
        budget_ms: None,
    }
}

#[test]
fn percentiles_and_counts() {
    let s = Summary::new(&meta(), &recording());
    assert_eq!(s.scheduled, 1003);
    assert_eq!(s.completed, 1001);
    assert_eq!(s.failures, 3);
    assert_eq!(s.offered_rps, 501.5);
    assert_eq!(s.achieved_rps, 500.5);
    let realtime = s.tiers["realtime"];
    assert_eq!(realtime.count, 1000);
    assert_eq!(realtime.p50_ms, 0.5);
    assert_eq!(realtime.p99_ms, 0.99);
    assert_eq!(s.latency_ms.count, 1001);
    assert_eq!(s.latency_ms.p90, 0.901, "rank ceil(0.9 x 1001) = 901");
    assert_eq!(s.latency_ms.p999, 1.0);
    // 20 ms lies above 3 significant digits' exact range: HdrHistogram reports the
    // highest value equivalent to it, within 0.1%.
    assert!((s.latency_ms.max - 20.0).abs() <= 0.02, "{}", s.latency_ms.max);
    assert_eq!(s.series.len(), 2);
    assert_eq!((s.series[0].count, s.series[0].errors), (1000, 0));
    assert_eq!((s.series[1].count, s.series[1].errors), (1, 3));
}

#[test]
fn text_has_every_section() {
    let text = Summary::new(&meta(), &recording()).to_string();
    for needle in [
        "unit: http://127.0.0.1:1 model m",
        "offered      501.5 req/s (1003 scheduled)",
        "achieved     500.5 req/s (1001 completed)",
        "p50 0.501  p90 0.901  p99 0.991  p99.9 1.000",
        "status       200=1000  404=1",
        "errors       timeout=1  dropped_client_side=1",
        "tier         realtime     n=1000     p50 0.500  p99 0.990",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in\n{text}");
    }
}

#[test]
fn json_shape_is_stable() -> anyhow::Result<()> {
    let s = Summary::new(&meta(), &recording());
    let v = serde_json::to_value(&s)?;
    let keys: Vec<&str> = v
        .as_object()
        .map(|o| o.keys().map(String::as_str).collect())
        .unwrap_or_default();
    let mut expected: Vec<&str> = "label url model schedule duration_s warmup_s offered_rps achieved_rps scheduled \
        completed dropped_client_side failures latency_ms ok_latency_ms ok_within_budget send_lag_ms latency_distribution \
        status_counts errors \
        tiers series"
        .split_whitespace()
        .collect();
    expected.sort_unstable();
    let mut keys = keys;
    keys.sort_unstable();
    assert_eq!(keys, expected);
    assert_eq!(v["latency_ms"]["p999"], 1.0);
    assert_eq!(v["status_counts"]["404"], 1);
    assert_eq!(v["errors"]["timeout"], 1);
    assert_eq!(v["tiers"]["realtime"]["count"], 1000);
    assert_eq!(v["series"][1]["errors"], 3);
    let distribution = v["latency_distribution"].as_array().context("distribution")?;
    assert_eq!(distribution.len(), 41);
    assert_eq!(distribution[0]["percentile"], 0.0);
    assert_eq!(distribution[10]["percentile"], 90.0);
    assert_eq!(distribution[10]["ms"], 0.901);
    assert_eq!(distribution[40]["percentile"], 99.99);
    assert_eq!(serde_json::from_value::<Summary>(v)?, s, "JSON round-trips");
    Ok(())
}
