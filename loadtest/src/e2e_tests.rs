//! End-to-end tests: the real generator, client and report against in-test servers on
//! 127.0.0.1:0. Runs are short real-time runs; nothing waits on a sleep to synchronise
//! (every run returns only once all its requests have answered or timed out).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use clap::Parser as _;

use crate::args::{Cli, Command};
use crate::client;
use crate::compare::{self, Comparison, Target};
use crate::generator::{self, Pacer, Plan};
use crate::overhead;
use crate::payload::{Payload, Template};
use crate::schedule::Schedule;
use crate::test_server::{Behaviour, TestServer};

fn plan(rate: f64, warmup_ms: u64, duration_ms: u64, pacer: Pacer) -> anyhow::Result<Plan> {
    Ok(Plan {
        schedule: Schedule::parse("constant", rate)?,
        warmup: Duration::from_millis(warmup_ms),
        duration: Duration::from_millis(duration_ms),
        max_in_flight: 10_000,
        timeout: Duration::from_secs(5),
        pacer,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_counts_statuses_and_tiers() -> anyhow::Result<()> {
    let server = TestServer::start(Behaviour::Realtime).await?;
    let cli = Cli::try_parse_from([
        "loadtest",
        "run",
        "--url",
        &server.url,
        "--model",
        "resnet50",
        "--rate",
        "200",
        "--warmup",
        "100ms",
        "--duration",
        "500ms",
        "--budget-ms",
        "200",
        "--label",
        "e2e",
    ])?;
    let Command::Run(args) = cli.command else {
        anyhow::bail!("expected run")
    };
    let summary = crate::run(&args).await?;
    // 200/s: 20 warmup requests in [0, 100 ms), 100 measured in [100 ms, 600 ms).
    assert_eq!(
        server.requests(),
        120,
        "every request, warmup included, reached the server"
    );
    assert_eq!(server.seen.budget_200.load(std::sync::atomic::Ordering::Acquire), 120);
    assert_eq!((summary.scheduled, summary.completed, summary.failures), (100, 100, 0));
    assert_eq!(summary.status_counts, BTreeMap::from([("200".to_owned(), 100)]));
    assert_eq!(summary.tiers.keys().collect::<Vec<_>>(), ["realtime"]);
    assert_eq!(summary.tiers["realtime"].count, 100);
    assert_eq!(summary.offered_rps, 200.0);
    assert!(
        // Responses ending in [100 ms, 600 ms): at most all 120, at least the measured
        // ones that were not still in flight at 600 ms (on a loaded CI box, a few).
        (100.0..=240.0).contains(&summary.achieved_rps),
        "achieved {}",
        summary.achieved_rps
    );
    assert_eq!(summary.latency_ms.count, 100);
    assert!(summary.latency_ms.p50 > 0.0 && summary.latency_ms.p50 <= summary.latency_ms.max);
    assert_eq!(summary.series.iter().map(|s| s.count).sum::<u64>(), 100);
    assert_eq!(summary.label.as_deref(), Some("e2e"));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokio_pacer_over_http2_with_binary_tensors() -> anyhow::Result<()> {
    let server = TestServer::start(Behaviour::Realtime).await?;
    let payload = Payload {
        rows: 4,
        cols: 8,
        binary: true,
        binary_output: false,
        grpc: false,
        distinct: 0,
    };
    let template = Arc::new(Template::new(&server.url, "m", &payload, None, &[])?);
    let rec = generator::run(&client::new(true), &template, &plan(100.0, 50, 300, Pacer::Tokio)?).await?;
    assert_eq!(server.requests(), 35);
    assert_eq!(server.seen.http2.load(std::sync::atomic::Ordering::Acquire), 35);
    assert_eq!(
        server.seen.budget_200.load(std::sync::atomic::Ordering::Acquire),
        0,
        "no --budget-ms, no header"
    );
    assert_eq!((rec.scheduled, rec.completed()), (30, 30));
    assert_eq!(rec.tiers["realtime"].len(), 30);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_path_is_a_status_error_with_tier_none() -> anyhow::Result<()> {
    let server = TestServer::start(Behaviour::Realtime).await?;
    // A path prefix in the base URL leads away from /v2/models: the server answers 404.
    let url = format!("{}/elsewhere", server.url);
    let template = Arc::new(Template::new(
        &url,
        "m",
        &Payload {
            rows: 1,
            cols: 1,
            binary: false,
            binary_output: false,
            grpc: false,
            distinct: 0,
        },
        None,
        &[],
    )?);
    let rec = generator::run(&client::new(false), &template, &plan(100.0, 0, 100, Pacer::Thread)?).await?;
    assert_eq!(rec.statuses, BTreeMap::from([(404, 10)]));
    assert_eq!(rec.tiers["none"].len(), 10);
    assert_eq!(rec.failures(), 10);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_in_flight_drops_are_counted_not_skipped() -> anyhow::Result<()> {
    let server = TestServer::start(Behaviour::Hang).await?;
    let template = Arc::new(Template::new(
        &server.url,
        "m",
        &Payload {
            rows: 1,
            cols: 1,
            binary: false,
            binary_output: false,
            grpc: false,
            distinct: 0,
        },
        None,
        &[],
    )?);
    let plan = Plan {
        max_in_flight: 2,
        timeout: Duration::from_secs(1),
        ..plan(100.0, 0, 200, Pacer::Thread)?
    };
    // The first two requests hang until their 1 s timeout, long after the last of the
    // 20 intended sends (at 190 ms): the other 18 find the bound reached.
    let rec = generator::run(&client::new(false), &template, &plan).await?;
    assert_eq!(rec.scheduled, 20);
    assert_eq!(rec.dropped_client_side, 18);
    assert_eq!(rec.errors, BTreeMap::from([("timeout".to_owned(), 2)]));
    assert_eq!(rec.completed(), 0);
    assert_eq!(server.requests(), 2);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compare_interleaves_and_merges_rounds() -> anyhow::Result<()> {
    let (a, b) = (
        TestServer::start(Behaviour::Realtime).await?,
        TestServer::start(Behaviour::Realtime).await?,
    );
    let cmp = Comparison {
        targets: vec![
            Target {
                name: "a".into(),
                url: a.url.clone(),
            },
            Target {
                name: "b".into(),
                url: b.url.clone(),
            },
        ],
        model: "m".into(),
        payload: Payload {
            rows: 1,
            cols: 16,
            binary: false,
            binary_output: false,
            grpc: false,
            distinct: 0,
        },
        budget_ms: Some(200),
        headers: Vec::new(),
        phase: plan(100.0, 50, 200, Pacer::Thread)?,
        rounds: 2,
        http2: false,
        label: None,
    };
    let report = compare::run(&cmp).await?;
    assert_eq!(report.order, [["a", "b"], ["b", "a"]]);
    assert_eq!(
        (a.requests(), b.requests()),
        (50, 50),
        "2 rounds x (5 warmup + 20 measured)"
    );
    for t in &report.targets {
        assert_eq!((t.summary.scheduled, t.summary.completed), (40, 40), "{}", t.name);
        assert_eq!(t.summary.tiers["realtime"].count, 40);
        assert_eq!(t.summary.duration_s, 0.4);
    }
    assert_eq!((report.targets[0].added_p50_us, report.targets[0].added_p99_us), (0, 0));
    let table = report.to_string();
    assert!(table.lines().any(|l| l.starts_with("b ")), "{table}");
    let json = serde_json::to_value(&report)?;
    assert_eq!(json["targets"][1]["summary"]["status_counts"]["200"], 40);
    assert_eq!(json["baseline"], "a");
    Ok(())
}

#[tokio::test]
async fn readiness_probe_waits_for_200() -> anyhow::Result<()> {
    let server = TestServer::start(Behaviour::Realtime).await?;
    let probe = client::new(false);
    let (every, limit) = (Duration::from_millis(20), Duration::from_secs(10));
    client::wait_ready(&probe, &server.url, every, limit, || None).await?;
    let [port] = overhead::free_ports()?;
    let refused = client::wait_ready(&probe, &format!("http://127.0.0.1:{port}"), every, every * 3, || None).await;
    assert!(refused.is_err(), "nothing listens there");
    let gone = client::wait_ready(&probe, &server.url, every, limit, || Some("it exited".into())).await;
    assert!(gone
        .err()
        .context("a gone process is never ready")?
        .to_string()
        .contains("it exited"));
    Ok(())
}

#[tokio::test]
async fn overhead_reports_a_server_that_exits() -> anyhow::Result<()> {
    let cli = Cli::try_parse_from(["loadtest", "overhead", "--tiergate", "/bin/false", "--duration", "1s"])?;
    let Command::Overhead(args) = cli.command else {
        anyhow::bail!("expected overhead")
    };
    let err = overhead::run(Path::new("/bin/false"), args.comparison()?)
        .await
        .err()
        .context("/bin/false serves nothing")?;
    let text = format!("{err:#}");
    assert!(text.contains("tiergate sim") && text.contains("exited"), "{text}");
    let missing = overhead::run(Path::new("/nonexistent/tiergate"), args.comparison()?).await;
    assert!(missing.is_err());
    Ok(())
}
