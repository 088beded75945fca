//! Shadow scoring: a candidate model answers a share of a route's calls beside the
//! primary; callers only ever get the primary's answer, and the comparison is reported
//! (admin API, metrics), dropped calls counted, and the candidate promoted through the
//! control plane only past its gate.

use crate::common;

use std::path::PathBuf;
use std::time::Duration;

use common::*;
use serde_json::{json, Value};
use tiergate::app::Gateway;
use tiergate::policy::Policy;
use tiergate::sim::{Faults, ModelSpec, Profile};

const TOKEN: &str = "shadow-test-admin-token-0123456789";

/// Two rows: the first sums to 3, the second to -2 (where a drifting candidate is off).
const TWO_ROWS: &str = r#"{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[2,2],"data":[1,2,-3,1]}]}"#;

struct Shadowed {
    gw: Gateway,
    route: &'static str,
    _dir: tempfile::TempDir,
}

impl Shadowed {
    async fn admin(&self, method: &str, path: &str, body: &str) -> Answer {
        admin_call(&self.gw, TOKEN, (method, path), &[("x-tiergate-actor", "carol")], body).await
    }

    async fn report(&self) -> Value {
        let answer = self.admin("GET", &format!("/admin/shadow/{}", self.route), "").await;
        assert_eq!(answer.status, 200, "{}", answer.text());
        answer.json()
    }

    /// The report once `compared` calls were compared and `dropped` dropped.
    async fn report_after(&self, compared: u64, dropped: u64) -> Value {
        eventually(Duration::from_secs(10), "the shadow calls are counted", || async {
            let r = self.report().await;
            let drops: u64 = r["dropped"]
                .as_object()
                .map_or(0, |d| d.values().filter_map(Value::as_u64).sum());
            (r["compared"] == compared && drops == dropped).then_some(r)
        })
        .await
    }

    async fn call(&self, id: &str, budget: &'static str) -> Answer {
        let headers = [("x-tiergate-budget-ms", budget), ("x-request-id", id)];
        infer(self.gw.http_addr(), "m", &headers, TWO_ROWS).await
    }
}

fn drifting(drift: f64) -> ModelSpec {
    ModelSpec {
        drift,
        ..ModelSpec::new("m", Profile::named("instant").expect("profile"))
    }
}

/// Route `r` serving model `m` from `primary` (real-time, and micro-batch with `batch`),
/// mirrored to `candidate` as `shadow` (extra keys of the shadow table) says; from a
/// policy directory, with the admin API on.
async fn shadowed(primary: &str, batch: Option<&str>, candidate: &str, shadow: &str) -> Shadowed {
    shadowed_as("r", primary, batch, candidate, shadow).await
}

/// As [`shadowed`], the route named `route` (metrics are the test process's, so a test
/// that reads them has a route of its own).
async fn shadowed_as(
    route: &'static str,
    primary: &str,
    batch: Option<&str>,
    candidate: &str,
    shadow: &str,
) -> Shadowed {
    let micro = batch.map_or(String::new(), |b| {
        format!(
            "[routes.r.micro_batch]\nendpoints = [\"{b}\"]\nmax_batch = 64\nmax_wait = \"250ms\"\nmax_in_flight = 1\n"
        )
    });
    let text = format!(
        "[defaults]\nrealtime_below = \"300ms\"\n\
         [routes.r]\nmodels = [\"m\"]\n\
         [routes.r.flags]\nrealtime = true\nmicro_batch = {}\nshadow = true\n\
         [routes.r.realtime]\nendpoints = [\"{primary}\"]\nmax_concurrency = 16\n{micro}\
         [routes.r.shadow]\n{shadow}\n\
         [routes.r.shadow.candidate]\nendpoints = [\"{candidate}\"]\n",
        batch.is_some()
    )
    .replace("routes.r", &format!("routes.{route}"));
    with_policy(route, &text).await
}

/// A gateway with the admin API on whose policy is `text`, with a shadow on `route`.
async fn with_policy(route: &'static str, text: &str) -> Shadowed {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("routes.toml"), text).expect("write");
    let (gw, _) = admin_gateway(dir.path(), TOKEN).await;
    Shadowed { gw, route, _dir: dir }
}

#[tokio::test]
async fn callers_get_the_primarys_answer_and_the_rows_that_differ_are_reported() {
    let (primary, candidate) = (backend(&["m"]).await, backend_with(vec![drifting(0.5)]).await);
    let shadow = "tiers = [\"realtime\"]\natol = 1e-6\nrtol = 0.0";
    let s = shadowed_as("rows", &primary.url(), None, &candidate.url(), shadow).await;
    let direct = infer(primary.addr, "m", &[], TWO_ROWS).await.json();
    for i in 0..10 {
        let answer = s.call(&format!("q{i}"), "100").await;
        assert_eq!(answer.status, 200, "{}", answer.text());
        assert_eq!(answer.json(), direct, "the primary's answer, never the candidate's");
        assert_eq!(answer.header("x-tiergate-tier"), Some("realtime"));
    }
    let r = s.report_after(10, 0).await;
    assert_eq!(
        candidate.sim.stats("m").expect("stats").requests,
        10,
        "every call mirrored"
    );
    assert_eq!((&r["rows"], &r["rows_within"]), (&json!(40), &json!(30)), "{r:#}");
    let (echo, sums) = (&r["outputs"]["OUTPUT0"], &r["outputs"]["OUTPUT1"]);
    assert_eq!((&echo["rows"], &echo["rows_within"]), (&json!(20), &json!(20)));
    assert_eq!((&sums["rows"], &sums["rows_within"]), (&json!(20), &json!(10)));
    assert_eq!(sums["max_abs_diff"], 0.5);
    assert_eq!(r["compared_by_tier"], json!({"realtime": 10}));
    let worst = r["worst"].as_array().expect("a sample");
    assert_eq!(worst.len(), 10, "one per differing call");
    let w = &worst[0];
    assert_eq!(
        (&w["output"], &w["row"], &w["primary"], &w["candidate"]),
        (&json!("OUTPUT1"), &json!(1), &json!(-2.0), &json!(-1.5))
    );
    assert!(w["request_id"].as_str().is_some_and(|id| id.starts_with('q')), "{w}");
    assert_eq!(
        metric(&s.gw, "tiergate_shadow_rows_total{route=\"rows\",verdict=\"outside\"}").await,
        10.0
    );
    assert_eq!(
        metric(
            &s.gw,
            "tiergate_shadow_compared_total{route=\"rows\",tier=\"realtime\"}"
        )
        .await,
        10.0
    );
    // Since a point in time: the last ten minutes hold every call; a time that does not
    // read is refused, saying what would.
    let recent = s.admin("GET", "/admin/shadow/rows?since=10m", "").await.json();
    assert_eq!(
        (&recent["compared"], &recent["rows_within"]),
        (&json!(10), &json!(30)),
        "{recent:#}"
    );
    let bad = s.admin("GET", "/admin/shadow/rows?since=yesterday", "").await;
    assert_eq!(bad.status, 400);
    assert!(bad.text().contains("RFC 3339"), "{}", bad.text());
    // Reset: the report starts afresh.
    let reset = s.admin("POST", "/admin/shadow/rows/reset", "").await;
    assert_eq!((reset.status, &reset.json()["compared"]), (200, &json!(0)));
    s.gw.stop().await.expect("stops");
}

#[tokio::test]
async fn a_candidate_that_is_down_or_stalled_changes_nothing_for_callers_and_its_drops_are_counted() {
    let primary = backend(&["m"]).await;
    // Down: nothing listens.
    let dead = format!("http://{}", dead_addr().await);
    let s = shadowed(&primary.url(), None, &dead, "tiers = [\"realtime\"]").await;
    for i in 0..5 {
        assert_eq!(s.call(&format!("d{i}"), "100").await.status, 200);
    }
    let r = s.report_after(0, 5).await;
    assert_eq!(r["dropped"]["down"], 5, "{r:#}");
    s.gw.stop().await.expect("stops");
    // Stalled: the candidate holds every call. Callers are answered all the same (the
    // shadow call is detached); two calls take the candidate's slots until its budget
    // ends them, the rest are dropped at once as full.
    let stalled = backend(&["m"]).await;
    stalled.sim.hold();
    let shadow = "tiers = [\"realtime\"]\nbudget = \"300ms\"\n";
    let s = shadowed(&primary.url(), None, &stalled.url(), shadow).await;
    let limited = s
        .admin(
            "PATCH",
            "/admin/routes/r",
            r#"{"shadow": {"candidate": {"max_concurrency": 2}}}"#,
        )
        .await;
    assert_eq!(limited.status, 200, "{}", limited.text());
    let first = s.call("s0", "100").await;
    assert_eq!(first.status, 200);
    wait_for(&stalled, |st| st.requests == 1).await;
    let second = s.call("s1", "100").await;
    assert_eq!(second.status, 200);
    wait_for(&stalled, |st| st.requests == 2).await;
    for i in 2..10 {
        let answer = s.call(&format!("s{i}"), "100").await;
        assert_eq!(answer.status, 200, "{}", answer.text());
        assert_eq!(answer.json(), first.json(), "the primary's answer");
    }
    let r = s.report_after(0, 10).await;
    assert_eq!(
        (&r["dropped"]["full"], &r["dropped"]["timeout"]),
        (&json!(8), &json!(2)),
        "{r:#}"
    );
    assert_eq!(
        stalled.sim.stats("m").expect("stats").requests,
        2,
        "nothing queued for the candidate"
    );
    stalled.sim.release();
    s.gw.stop().await.expect("stops");
}

#[tokio::test]
async fn a_slow_candidate_is_compared_after_the_callers_have_their_answers() {
    let primary = backend(&["m"]).await;
    // Each of the candidate's calls takes 500 ms; the primary answers at once.
    let slow = Profile {
        floor: Duration::from_millis(500),
        ..Profile::named("instant").expect("profile")
    };
    let candidate = backend_with(vec![ModelSpec::new("m", slow)]).await;
    let s = shadowed(&primary.url(), None, &candidate.url(), "tiers = [\"realtime\"]").await;
    for i in 0..4 {
        let answer = s.call(&format!("slow{i}"), "100").await;
        assert_eq!(answer.status, 200, "{}", answer.text());
    }
    // Every caller was answered while the candidate was still working on the first call.
    assert_eq!(s.report().await["compared"], 0);
    let r = s.report_after(4, 0).await;
    assert!(
        r["latency"]["candidate_to_primary"].as_f64().expect("a ratio") > 1.0,
        "{r:#}"
    );
    s.gw.stop().await.expect("stops");
}

#[tokio::test]
async fn with_the_noise_floor_a_difference_the_primary_makes_with_itself_is_not_counted() {
    // The primary is not deterministic on rows with a negative sum (a random amount
    // below 0.5 added each time); the candidate is off by 0.1 there, and exact elsewhere.
    let noisy = ModelSpec {
        noise: 0.5,
        ..ModelSpec::new("m", Profile::named("instant").expect("profile"))
    };
    let (primary, candidate) = (backend_with(vec![noisy]).await, backend_with(vec![drifting(0.1)]).await);
    let shadow = "tiers = [\"realtime\"]\nnoise_floor = true\natol = 1e-9\nrtol = 0.0";
    let s = shadowed(&primary.url(), None, &candidate.url(), shadow).await;
    for i in 0..6 {
        assert_eq!(s.call(&format!("n{i}"), "100").await.status, 200);
    }
    let r = s.report_after(6, 0).await;
    let sums = &r["outputs"]["OUTPUT1"];
    // Each call: row 0 agrees, row 1 differs, and so does the primary with itself there.
    assert_eq!(
        (&sums["rows"], &sums["rows_within"], &sums["rows_noisy"]),
        (&json!(12), &json!(6), &json!(6)),
        "{r:#}"
    );
    assert_eq!(r["agreement"], 1.0);
    assert!(
        r["worst"].as_array().is_some_and(Vec::is_empty),
        "nothing held against the candidate: {r:#}"
    );
    assert_eq!(
        primary.sim.stats("m").expect("stats").requests,
        12,
        "each call asked twice"
    );
    s.gw.stop().await.expect("stops");
}

#[tokio::test]
async fn a_micro_batch_is_scored_as_the_same_batch() {
    let (rt, batch) = (backend(&["m"]).await, backend(&["m"]).await);
    let candidate = backend_with(vec![drifting(0.25)]).await;
    let shadow = "tiers = [\"micro_batch\"]";
    let s = shadowed_as("mbshadow", &rt.url(), Some(&batch.url()), &candidate.url(), shadow).await;
    // One call takes the batch slot while the backend holds it; eight more queue, and
    // go as one batch when it is released.
    batch.sim.hold();
    let addr = s.gw.http_addr();
    let spawn = move |id: String| {
        tokio::spawn(async move {
            let headers = [("x-tiergate-budget-ms", "3000"), ("x-request-id", id.as_str())];
            infer(addr, "m", &headers, TWO_ROWS).await
        })
    };
    let busy = spawn("busy".into());
    wait_for(&batch, |st| st.requests == 1).await;
    let callers: Vec<_> = (0..8).map(|i| spawn(format!("b{i}"))).collect();
    eventually(Duration::from_secs(10), "eight callers queue", || async {
        let line = "tiergate_batch_queue_rows{route=\"mbshadow\"}";
        (metric(&s.gw, line).await == 16.0).then_some(())
    })
    .await;
    batch.sim.release();
    for call in std::iter::once(busy).chain(callers) {
        let answer = call.await.expect("task");
        assert_eq!(answer.status, 200, "{}", answer.text());
        assert_eq!(answer.header("x-tiergate-tier"), Some("micro_batch"));
        assert_eq!(
            answer.json()["outputs"][1]["data"],
            json!([3.0, -2.0]),
            "the primary's sums"
        );
    }
    let r = s.report_after(2, 0).await;
    let (primary, shadowed) = (
        batch.sim.stats("m").expect("stats"),
        candidate.sim.stats("m").expect("stats"),
    );
    assert_eq!(primary.batch_sizes, [(2, 1), (16, 1)].into(), "rows per backend call");
    assert_eq!(
        shadowed.batch_sizes, primary.batch_sizes,
        "the candidate saw the same batches"
    );
    assert_eq!(r["compared_by_tier"], json!({"micro_batch": 2}));
    assert_eq!(
        (
            &r["outputs"]["OUTPUT1"]["rows"],
            &r["outputs"]["OUTPUT1"]["rows_within"]
        ),
        (&json!(18), &json!(9))
    );
    s.gw.stop().await.expect("stops");
}

#[tokio::test]
async fn promote_refuses_below_the_gate_passes_above_it_and_rolls_back() {
    let (primary, candidate) = (backend(&["m"]).await, backend(&["m"]).await);
    let shadow = "tiers = [\"realtime\"]\n[routes.r.shadow.gate]\nmin_compared = 12\nmin_agreement = 0.99";
    let s = shadowed(&primary.url(), None, &candidate.url(), shadow).await;
    let refused = s.admin("POST", "/admin/shadow/r/promote", "").await;
    assert_eq!(refused.status, 409, "{}", refused.text());
    assert!(
        refused.text().contains("0 rows compared, the gate asks for 12"),
        "{}",
        refused.text()
    );
    for i in 0..3 {
        assert_eq!(s.call(&format!("p{i}"), "100").await.status, 200);
    }
    let r = s.report_after(3, 0).await;
    assert_eq!((&r["rows"], &r["gate"]["met"]), (&json!(12), &json!(true)), "{r:#}");
    let promoted = s.admin("POST", "/admin/shadow/r/promote", "").await;
    assert_eq!(promoted.status, 200, "{}", promoted.text());
    let version = promoted.json()["version_after"].as_u64().expect("a new version");
    let route = s.admin("GET", "/admin/routes/r", "").await.json();
    assert_eq!(
        route["spec"]["realtime"]["endpoints"],
        json!([candidate.url()]),
        "{route:#}"
    );
    assert!(
        route["spec"].get("shadow").is_none(),
        "the shadow table is gone: {route:#}"
    );
    let before = candidate.sim.stats("m").expect("stats").requests;
    assert_eq!(s.call("after", "100").await.status, 200);
    assert_eq!(
        candidate.sim.stats("m").expect("stats").requests,
        before + 1,
        "served by the candidate"
    );
    // A promotion is a policy version like any other: rolled back, the primary serves.
    let back = s
        .admin(
            "POST",
            "/admin/policy/rollback",
            &json!({"version": version - 1}).to_string(),
        )
        .await;
    assert_eq!(back.status, 200, "{}", back.text());
    let served = primary.sim.stats("m").expect("stats").requests;
    assert_eq!(s.call("rolled-back", "100").await.status, 200);
    assert_eq!(primary.sim.stats("m").expect("stats").requests, served + 1);
    s.gw.stop().await.expect("stops");
}

#[tokio::test]
async fn a_disagreeing_candidate_is_promoted_only_by_force() {
    let (primary, candidate) = (backend(&["m"]).await, backend_with(vec![drifting(1.0)]).await);
    let shadow = "tiers = [\"realtime\"]\n[routes.r.shadow.gate]\nmin_compared = 4";
    let s = shadowed(&primary.url(), None, &candidate.url(), shadow).await;
    for i in 0..2 {
        assert_eq!(s.call(&format!("f{i}"), "100").await.status, 200);
    }
    s.report_after(2, 0).await;
    let refused = s.admin("POST", "/admin/shadow/r/promote", "").await;
    assert_eq!(refused.status, 409, "{}", refused.text());
    assert!(
        refused.text().contains("6 of 8 rows within tolerance"),
        "{}",
        refused.text()
    );
    let forced = s.admin("POST", "/admin/shadow/r/promote?force=true", "").await;
    assert_eq!(forced.status, 200, "{}", forced.text());
    s.gw.stop().await.expect("stops");
}

/// The policy's shadow table is checked like every other.
#[test]
fn a_shadow_table_is_validated_with_every_problem_named() {
    let text = "[routes.r]\nmodels = [\"m\"]\n[routes.r.flags]\nshadow = true\n[routes.r.realtime]\nendpoints = [\"http://h:1\"]\n\
                [routes.r.shadow]\npercent = 101\natol = -1.0\ntiers = []\ncanary_percent = -1\n[routes.r.shadow.gate]\nmin_agreement = 2.0\n\
                [routes.r.shadow.abort]\nmin_requests = 0\nmax_latency_ratio = 0.5\n";
    let problems = Policy::from_texts(vec![(PathBuf::from("p.toml"), text.into())]).expect_err("invalid");
    let text = problems.to_string();
    for needle in [
        "routes.r.shadow.candidate: is missing",
        "routes.r.shadow.percent: must be 0 to 100, got 101",
        "routes.r.shadow.atol: must be 0 or more, got -1",
        "routes.r.shadow.tiers: is empty",
        "routes.r.shadow.gate.min_agreement: must be 0 to 1, got 2",
        "routes.r.shadow.canary_percent: must be 0 to 100, got -1",
        "routes.r.shadow.abort.min_requests: must be 1 or more, got 0",
        "routes.r.shadow.abort.max_latency_ratio: must be 1 or more, got 0.5",
    ] {
        assert!(text.contains(needle), "{needle:?} in:\n{text}");
    }
    let flag_only = "[routes.r]\nmodels = [\"m\"]\n[routes.r.flags]\nshadow = true\n[routes.r.realtime]\nendpoints = [\"http://h:1\"]\n";
    let problems = Policy::from_texts(vec![(PathBuf::from("p.toml"), flag_only.into())]).expect_err("invalid");
    assert!(problems
        .to_string()
        .contains("routes.r.flags.shadow: is on but the route has no [shadow] table"));
}

#[tokio::test]
async fn a_canary_serves_its_share_from_the_candidate_and_is_counted_per_variant() {
    let (primary, candidate) = (backend(&["m"]).await, backend(&["m"]).await);
    let shadow = "tiers = [\"realtime\"]\npercent = 100\ncanary_percent = 50";
    let s = shadowed_as("split", &primary.url(), None, &candidate.url(), shadow).await;
    let mut served = 0;
    for i in 0..40 {
        let answer = s.call(&format!("k{i}"), "100").await;
        assert_eq!(answer.status, 200, "{}", answer.text());
        served += usize::from(answer.header("x-tiergate-variant") == Some("candidate"));
    }
    assert!((8..=32).contains(&served), "about half of 40 keys: {served}");
    // The calls the primary served are still mirrored; those the candidate served are not.
    s.report_after(40 - served as u64, 0).await;
    let by_candidate = candidate.sim.stats("m").expect("stats").requests as usize;
    assert_eq!(by_candidate, 40, "{served} served and {} mirrored", 40 - served);
    let count = |variant: &str| {
        let series = format!(
            "tiergate_canary_requests_total{{route=\"split\",tier=\"realtime\",variant=\"{variant}\",result=\"ok\"}}"
        );
        let gw = &s.gw;
        async move { metric(gw, &series).await }
    };
    assert_eq!(
        (count("candidate").await, count("primary").await),
        (served as f64, (40 - served) as f64)
    );
    let timed =
        "tiergate_canary_request_duration_seconds_count{route=\"split\",tier=\"realtime\",variant=\"candidate\"}";
    assert_eq!(metric(&s.gw, timed).await, served as f64);
    // The same keys go to the same variant every time.
    let again = s.call("k0", "100").await;
    let first = s.call("k0", "100").await;
    assert_eq!(again.header("x-tiergate-variant"), first.header("x-tiergate-variant"));
    s.gw.stop().await.expect("stops");
}

#[tokio::test]
async fn a_failing_canary_is_set_back_to_zero_on_its_own_and_audited() {
    let primary = backend(&["m"]).await;
    let failing = ModelSpec {
        faults: Faults {
            error_rate: 1.0,
            ..Faults::default()
        },
        ..ModelSpec::new("m", Profile::named("instant").expect("profile"))
    };
    let candidate = backend_with(vec![failing]).await;
    let shadow = "tiers = [\"realtime\"]\npercent = 0\ncanary_percent = 50\n\
                  [routes.aborts.shadow.abort]\nmin_requests = 3\nmax_error_rate_margin = 0.1";
    let s = shadowed_as("aborts", &primary.url(), None, &candidate.url(), shadow).await;
    let mut i = 0;
    eventually(Duration::from_secs(10), "the canary is aborted", || {
        i += 1;
        let id = format!("a{i}");
        let s = &s;
        async move {
            s.call(&id, "100").await;
            let route = s.admin("GET", "/admin/routes/aborts", "").await.json();
            (route["spec"]["shadow"]["canary_percent"] == 0).then_some(())
        }
    })
    .await;
    assert_eq!(
        metric(&s.gw, "tiergate_canary_aborts_total{route=\"aborts\"}").await,
        1.0
    );
    let history = s.admin("GET", "/admin/policy/history", "").await.json();
    assert_eq!(history["versions"][0]["who"], "canary abort", "{history:#}");
    // From now on the primary serves every call.
    let before = candidate.sim.stats("m").expect("stats").requests;
    for j in 0..10 {
        let answer = s.call(&format!("after{j}"), "100").await;
        assert_eq!(answer.status, 200, "{}", answer.text());
        assert_eq!(answer.header("x-tiergate-variant"), None);
    }
    assert_eq!(candidate.sim.stats("m").expect("stats").requests, before);
    s.gw.stop().await.expect("stops");
}

/// Line `i` of a Batch API file: one row, whose sum is negative (where a drifting
/// candidate is off) for odd `i`.
fn line(i: usize) -> String {
    let data = if i % 2 == 0 {
        [i as f64, 1.0]
    } else {
        [-(i as f64), 0.5]
    };
    json!({"custom_id": format!("req-{i}"), "method": "POST", "url": "/v2/models/m/infer",
           "body": {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 2], "data": data}]}})
    .to_string()
}

/// The lines of file `id`, by custom_id.
async fn lines_of(gw: &Gateway, id: &Value) -> std::collections::HashMap<String, Value> {
    let id = id.as_str().expect("a file id");
    let content = get(gw.http_addr(), &format!("/v1/files/{id}/content")).await;
    assert_eq!(content.status, 200, "{}", content.text());
    let text = content.text();
    let lines = text.lines().map(|l| serde_json::from_str::<Value>(l).expect("JSONL"));
    lines
        .map(|l| (l["custom_id"].as_str().expect("custom_id").to_owned(), l))
        .collect()
}

#[tokio::test]
async fn a_shadow_batch_keeps_the_primarys_answers_and_writes_a_comparison_file_and_summary() {
    let (primary, candidate) = (backend(&["m"]).await, backend_with(vec![drifting(0.5)]).await);
    let text = format!(
        "[routes.lines]\nmodels = [\"m\"]\n\
         [routes.lines.flags]\nrealtime = false\noffline = true\nshadow = true\n\
         [routes.lines.micro_batch]\nendpoints = [\"{}\"]\nmax_batch = 8\n\
         [routes.lines.shadow]\npercent = 0\natol = 1e-6\nrtol = 0.0\n\
         [routes.lines.shadow.candidate]\nendpoints = [\"{}\"]\nmax_concurrency = 2\n",
        primary.url(),
        candidate.url()
    );
    let s = with_policy("lines", &text).await;
    let addr = s.gw.http_addr();
    let n = 20;
    let content: Vec<String> = (0..n).map(line).collect();
    let file = upload_file(addr, &content.join("\n"), &[]).await.json();
    let create = |shadow: Value| {
        let body = json!({"input_file_id": file["id"], "endpoint": "/v2/models/m/infer",
                          "completion_window": "1h", "shadow": shadow});
        send(
            "POST",
            addr,
            "/v1/batches",
            &[("content-type", "application/json")],
            body.to_string(),
        )
    };
    let refused = create(json!("yes")).await;
    assert_eq!(
        (refused.status, refused.text().contains("true or false")),
        (400, true),
        "{}",
        refused.text()
    );
    let created = create(json!(true)).await;
    assert_eq!(created.status, 200, "{}", created.text());
    let id = created.json()["id"].as_str().expect("id").to_owned();
    let done = eventually(Duration::from_secs(20), "the shadow batch completes", || async {
        let batch = get(addr, &format!("/v1/batches/{id}")).await.json();
        (batch["status"] == "completed").then_some(batch)
    })
    .await;
    assert_eq!(done["request_counts"], json!({"total": n, "completed": n, "failed": 0}));
    // The output file holds the primary's answers.
    let output = lines_of(&s.gw, &done["output_file_id"]).await;
    for i in [0, 1] {
        let direct = infer(
            primary.addr,
            "m",
            &[],
            &serde_json::from_str::<Value>(&line(i)).expect("json")["body"].to_string(),
        )
        .await;
        assert_eq!(
            output[&format!("req-{i}")]["response"]["body"],
            direct.json(),
            "req-{i}"
        );
    }
    assert_eq!(
        candidate.sim.stats("m").expect("stats").requests,
        n as u64,
        "every line asked of the candidate"
    );
    // The summary, and the comparison file line by line.
    let summary = &done["shadow"]["summary"];
    assert_eq!(
        (&summary["lines"], &summary["compared"], &summary["agreeing_lines"]),
        (&json!(n), &json!(n), &json!(n / 2)),
        "{summary:#}"
    );
    assert_eq!(
        (&summary["rows"], &summary["rows_within"]),
        (&json!(2 * n), &json!(3 * n / 2))
    );
    assert_eq!(
        (&summary["max_abs_diff"], &summary["not_compared"]),
        (&json!(0.5), &json!({}))
    );
    let comparison = lines_of(&s.gw, &done["shadow"]["comparison_file_id"]).await;
    assert_eq!(comparison.len(), n);
    let (even, odd) = (&comparison["req-4"], &comparison["req-7"]);
    assert_eq!(
        (&even["rows"], &even["rows_within"], &even["primary_status"]),
        (&json!(2), &json!(2), &json!(200))
    );
    assert_eq!((&odd["rows"], &odd["rows_within"]), (&json!(2), &json!(1)), "{odd:#}");
    let worst = &odd["outputs"]["OUTPUT1"]["worst"];
    assert_eq!(
        (&worst["primary"], &worst["candidate"]),
        (&json!(-6.5), &json!(-6.0)),
        "{odd:#}"
    );
    assert_eq!(odd["id"], output["req-7"]["id"], "a line has one id in every file");
    // The route's report counts the batch's lines, so its gate sees them.
    let report = s.report().await;
    assert_eq!(report["compared_by_tier"], json!({"offline": n}), "{report:#}");
    // With the route's shadow flag off a shadow batch is refused, saying why.
    let off = s.admin("PUT", "/admin/routes/lines/flags/shadow", "false").await;
    assert_eq!(off.status, 200, "{}", off.text());
    let refused = create(json!(true)).await;
    assert_eq!(refused.status, 400);
    assert!(refused.text().contains("shadow flag is off"), "{}", refused.text());
    s.gw.stop().await.expect("stops");
}

#[tokio::test]
async fn a_micro_batch_canary_batches_its_share_on_the_candidate() {
    let (primary, candidate) = (backend(&["m"]).await, backend(&["m"]).await);
    let text = format!(
        "[defaults]\nrealtime_below = \"300ms\"\n\
         [routes.mbc]\nmodels = [\"m\"]\n\
         [routes.mbc.flags]\nrealtime = false\nmicro_batch = true\nshadow = true\n\
         [routes.mbc.micro_batch]\nendpoints = [\"{}\"]\nmax_batch = 64\nmax_wait = \"250ms\"\nmax_in_flight = 1\n\
         [routes.mbc.shadow]\ntiers = [\"micro_batch\"]\npercent = 0\ncanary_percent = 50\n\
         [routes.mbc.shadow.candidate]\nendpoints = [\"{}\"]\nmax_concurrency = 1\n",
        primary.url(),
        candidate.url()
    );
    let s = with_policy("mbc", &text).await;
    let mut keys = Vec::new();
    for i in 0..40 {
        let id = format!("k{i}");
        let answer = s.call(&id, "2000").await;
        assert_eq!(answer.status, 200, "{}", answer.text());
        assert_eq!(answer.header("x-tiergate-tier"), Some("micro_batch"));
        assert_eq!(answer.json()["outputs"][1]["data"], json!([3.0, -2.0]));
        if answer.header("x-tiergate-variant") == Some("candidate") {
            keys.push(id);
        }
    }
    assert!((8..=32).contains(&keys.len()), "about half of 40 keys: {}", keys.len());
    let rows = |b: &Backend| b.sim.stats("m").expect("stats").rows;
    assert_eq!(
        rows(&candidate),
        2 * keys.len() as u64,
        "the candidate served its share"
    );
    assert_eq!(rows(&primary), 2 * (40 - keys.len()) as u64, "the primary the rest");
    let series =
        "tiergate_canary_requests_total{route=\"mbc\",tier=\"micro_batch\",variant=\"candidate\",result=\"ok\"}";
    assert_eq!(metric(&s.gw, series).await, keys.len() as f64);
    // The candidate's share is batched: while it holds one call, four more of its keys
    // queue and go as one batch.
    candidate.sim.hold();
    let addr = s.gw.http_addr();
    let spawn = |id: String| {
        tokio::spawn(async move {
            let headers = [("x-tiergate-budget-ms", "3000"), ("x-request-id", id.as_str())];
            infer(addr, "m", &headers, TWO_ROWS).await
        })
    };
    let before = candidate.sim.stats("m").expect("stats").requests;
    let busy = spawn(keys[0].clone());
    wait_for(&candidate, |st| st.requests == before + 1).await;
    let queued: Vec<_> = keys[1..5].iter().cloned().map(spawn).collect();
    eventually(Duration::from_secs(10), "four calls queue", || async {
        (metric(&s.gw, "tiergate_batch_queue_rows{route=\"mbc\"}").await == 8.0).then_some(())
    })
    .await;
    candidate.sim.release();
    for call in std::iter::once(busy).chain(queued) {
        let answer = call.await.expect("task");
        assert_eq!(answer.status, 200, "{}", answer.text());
        assert_eq!(answer.header("x-tiergate-variant"), Some("candidate"));
    }
    let sizes = candidate.sim.stats("m").expect("stats").batch_sizes;
    assert_eq!(sizes.get(&8), Some(&1), "one batch of the four queued calls: {sizes:?}");
    s.gw.stop().await.expect("stops");
}

#[tokio::test]
async fn a_canary_with_a_dead_candidate_answers_every_caller_from_the_primary() {
    for tier in ["realtime", "micro_batch"] {
        let primary = backend(&["m"]).await;
        let dead = dead_addr().await;
        let route = match tier {
            "realtime" => "deadrt",
            _ => "deadmb",
        };
        let text = format!(
            "[defaults]\nrealtime_below = \"300ms\"\n\
             [routes.{route}]\nmodels = [\"m\"]\n\
             [routes.{route}.flags]\nrealtime = {rt}\nmicro_batch = {mb}\nshadow = true\n\
             [routes.{route}.{tier}]\nendpoints = [\"{p}\"]\n\
             [routes.{route}.shadow]\ntiers = [\"{tier}\"]\npercent = 0\ncanary_percent = 50\n\
             [routes.{route}.shadow.abort]\nmin_requests = 1000\n\
             [routes.{route}.shadow.candidate]\nendpoints = [\"http://{dead}\"]\n",
            rt = tier == "realtime",
            mb = tier == "micro_batch",
            p = primary.url(),
        );
        let s = with_policy(route, &text).await;
        let budget = if tier == "realtime" { "100" } else { "2000" };
        for i in 0..40 {
            let answer = s.call(&format!("k{i}"), budget).await;
            assert_eq!(answer.status, 200, "{tier}: {}", answer.text());
            assert_eq!(answer.header("x-tiergate-tier"), Some(tier));
            assert_eq!(answer.header("x-tiergate-variant"), None, "{tier}");
        }
        let series = |variant: &str, result: &str| {
            format!("tiergate_canary_requests_total{{route=\"{route}\",tier=\"{tier}\",variant=\"{variant}\",result=\"{result}\"}}")
        };
        let failed = metric(&s.gw, &series("candidate", "error")).await;
        let primary_ok = metric(&s.gw, &series("primary", "ok")).await;
        assert!(
            (8.0..=32.0).contains(&failed),
            "{tier}: the candidate's share, about half: {failed}"
        );
        assert_eq!(failed + primary_ok, 40.0, "{tier}: every call counted once");
        assert_eq!(primary.sim.stats("m").expect("stats").requests, 40, "{tier}");
        s.gw.stop().await.expect("stops");
    }
}
