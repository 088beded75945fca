//! Hedging: a real-time call not answered by the pool's learned p95 (or `hedge.after`)
//! goes again to another endpoint, the first answer is taken and the other call is
//! cancelled at its backend; within the duplicate-work budget, never for what is not
//! safe to repeat, never for a step of a sequence.

use crate::common;

use std::time::Duration;

use common::*;
use tiergate::app::Gateway;
use tiergate::sim::{ModelSpec, Profile};

/// Route `name` (each test its own: the metrics registry is the process's) for model
/// `m` on `endpoints`, nobody ever ejected, no active checks, and `keys` set below
/// `realtime`.
fn hedged_route(name: &str, endpoints: &[&Backend], keys: &[(&str, toml::Value)]) -> String {
    let endpoints: Vec<String> = endpoints.iter().map(|b| b.url()).collect();
    let route = Route::new(name)
        .model("m")
        .set("realtime.endpoints", endpoints)
        .set("realtime.health.eject_after", 0)
        .set("realtime.health.check_path", "");
    keys.iter()
        .fold(route, |r, (key, value)| {
            r.set(&format!("realtime.{key}"), value.clone())
        })
        .toml()
}

/// `calls` inference calls to model `m` one after another with `budget` ms: statuses.
async fn calls(gw: &Gateway, calls: usize, budget: &str) -> Vec<u16> {
    answers(gw, calls, budget).await.iter().map(|a| a.status).collect()
}

/// [`calls`], the answers.
async fn answers(gw: &Gateway, calls: usize, budget: &str) -> Vec<Answer> {
    let mut answers = Vec::new();
    for _ in 0..calls {
        answers.push(infer(gw.http_addr(), "m", &[("x-tiergate-budget-ms", budget)], BODY).await);
    }
    answers
}

/// A simulator serving `m` whose every call takes 5 ms.
async fn five_ms() -> Backend {
    let profile = Profile {
        a: Duration::from_millis(5),
        ..Profile::default()
    };
    backend_with(vec![ModelSpec::new("m", profile)]).await
}

/// The route's hedge counter with `outcome`.
async fn hedges(gw: &Gateway, route: &str, outcome: &str) -> u64 {
    let series = format!("tiergate_backend_hedges_total{{route=\"{route}\",tier=\"realtime\",outcome=\"{outcome}\"}}");
    metric(gw, &series).await as u64
}

#[tokio::test]
async fn a_hedge_after_the_learned_p95_wins_against_a_stalled_endpoint_and_the_loser_is_cancelled_at_its_backend() {
    // Both take 5 ms a call, so their learned costs are alike and the work is shared.
    let (a, b) = (five_ms().await, five_ms().await);
    let keys = [("hedge.budget_percent", toml::Value::from(100))];
    let gw = gateway(&hedged_route("hedged", &[&a, &b], &keys)).await;
    // Both answer until the pool has learned its p95 (a call slower than it may be
    // hedged already: counted from here on).
    assert!(calls(&gw, 40, "500").await.iter().all(|s| *s == 200));
    let before = |outcome| hedges(&gw, "hedged", outcome);
    let (sent, cancelled, won) = (before("sent").await, before("cancelled").await, before("won").await);
    let warm = a.sim.stats("m").expect("stats");
    a.sim.hold(); // a stalls: it accepts calls and never answers them
                  // At once, so the calls in flight spread them over both endpoints (one after
                  // another, each would go to whichever has learned the lower cost).
    let at_once: Vec<_> = (0..16)
        .map(|_| {
            let addr = gw.http_addr();
            tokio::spawn(async move { infer(addr, "m", &[("x-tiergate-budget-ms", "500")], BODY).await })
        })
        .collect();
    let mut answers = Vec::new();
    for call in at_once {
        answers.push(call.await.expect("task"));
    }
    let statuses: Vec<u16> = answers.iter().map(|a| a.status).collect();
    assert!(
        statuses.iter().all(|s| *s == 200),
        "every caller answered: {statuses:?}"
    );
    let stalled = a.sim.stats("m").expect("stats").requests - warm.requests;
    assert!(stalled > 0, "no call of 16 went to the stalled endpoint");
    // Every call that reached a was dropped unfinished once the other answered: a's
    // simulator sees each one's client go away. (A call to b slower than the p95 may be
    // hedged to a too, and then b's answer wins.)
    wait_for(&a, |s| s.cancelled == warm.cancelled + stalled && s.in_flight == 0).await;
    // Each of those was hedged and cancelled; a call to b slower than the p95 on a busy
    // machine is hedged too, and its copy may be cancelled before a's simulator counts
    // it: at least as many hedges as calls that reached a, never more than the calls.
    let sent = hedges(&gw, "hedged", "sent").await - sent;
    assert!(
        (stalled..=16).contains(&sent),
        "{sent} hedges, {stalled} calls reached a"
    );
    let cancelled = hedges(&gw, "hedged", "cancelled").await - cancelled;
    assert!((stalled..=sent).contains(&cancelled), "{cancelled} cancelled of {sent}");
    let won = hedges(&gw, "hedged", "won").await - won;
    assert!(won >= 1 && won <= sent, "{won} of {sent}");
    // An answer the copy gave says how long the call ran before the copy went.
    let hedged: Vec<_> = answers
        .iter()
        .map(Answer::timing)
        .filter(|t| part_names(t).contains(&"hedge"))
        .collect();
    assert_eq!(hedged.len() as u64, won, "{hedged:?}");
    for parts in &hedged {
        assert_eq!(part_names(parts), ["backend", "hedge", "gateway", "total"]);
    }
    a.sim.release();
}

#[tokio::test]
async fn no_hedge_goes_past_the_duplicate_work_budget_or_for_what_is_unsafe_to_repeat() {
    // A spent budget (0%), a path the route does not call idempotent (`retry.on = []`)
    // and a step of a sequence: the call caught on the stalled endpoint waits out its
    // budget (504), and no copy goes.
    for (name, keys) in [
        (
            "hedge_budget_spent",
            vec![("hedge.budget_percent", toml::Value::from(0))],
        ),
        (
            "hedge_unsafe",
            vec![
                ("retry.on", toml::Value::Array(Vec::new())),
                ("hedge.budget_percent", 100.into()),
            ],
        ),
    ] {
        let (a, b) = (backend(&["m"]).await, backend(&["m"]).await);
        let mut keys = keys;
        keys.push(("hedge.after", "10ms".into()));
        let gw = gateway(&hedged_route(name, &[&a, &b], &keys)).await;
        a.sim.hold();
        let statuses = calls(&gw, 16, "150").await;
        let stalled = a.sim.stats("m").expect("stats").requests;
        assert!(stalled > 0, "{name}: no call of 16 went to the stalled endpoint");
        let timed_out = statuses.iter().filter(|s| **s == 504).count() as u64;
        assert_eq!(timed_out, stalled, "{name}: {statuses:?}");
        assert_eq!(hedges(&gw, name, "sent").await, 0, "{name}");
        let over_budget = hedges(&gw, name, "over_budget").await;
        match name {
            "hedge_budget_spent" => assert_eq!(over_budget, stalled, "{name}: each refusal counted"),
            _ => assert_eq!(over_budget, 0, "{name}: nothing to refuse"),
        }
        a.sim.release();
    }
}

#[tokio::test]
async fn a_step_of_a_sequence_is_never_hedged() {
    let (a, b) = (backend(&["m"]).await, backend(&["m"]).await);
    let keys = [
        ("hedge.after", toml::Value::from("10ms")),
        ("hedge.budget_percent", 100.into()),
    ];
    let gw = gateway(&hedged_route("hedge_sequence", &[&a, &b], &keys)).await;
    a.sim.hold();
    let statuses = one_step_sequences(&gw, 12, "150").await;
    let pinned = a.sim.stats("m").expect("stats").requests;
    assert!(pinned > 0, "no sequence was pinned to the stalled endpoint in 12");
    assert_eq!(
        statuses.iter().filter(|s| **s == 504).count() as u64,
        pinned,
        "{statuses:?}"
    );
    assert_eq!(
        b.sim.stats("m").expect("stats").requests + pinned,
        12,
        "no step went twice"
    );
    assert_eq!(hedges(&gw, "hedge_sequence", "sent").await, 0);
    a.sim.release();
}
