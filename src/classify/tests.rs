use std::time::Duration;

use super::*;
use crate::decision::key_hash;
use crate::policy::{Flags, Route, WhenUnmet};

const MS: fn(u64) -> Duration = Duration::from_millis;

fn route(flags: &str, when_unmet: WhenUnmet) -> Route {
    let flags = Flags {
        realtime: flags.contains('R'),
        micro_batch: flags.contains('M'),
        offline: flags.contains('O'),
        micro_batch_percent: if flags.contains('%') { 50 } else { 100 },
        shadow: false,
        cache: false,
    };
    Route::test(flags, when_unmet)
}

fn meta(budget_ms: Option<u64>, prefer_async: bool, key: u64) -> Meta {
    Meta {
        budget: budget_ms.map(|b| (MS(b), BudgetSource::Header)),
        prefer_async,
        key,
    }
}

/// The README's decision table, row by row. Flags: R realtime, M micro_batch, O offline,
/// % a 50 percent micro-batch rollout. Keys 10 and 60 fall inside and outside it.
#[test]
fn decision_table() {
    use Reason::*;
    use Tier::*;
    type Row = (
        &'static str,
        WhenUnmet,
        Option<u64>,
        bool,
        u64,
        Result<(Tier, Reason), &'static str>,
    );
    let reject = WhenUnmet::Reject;
    let best = WhenUnmet::BestEffort;
    let rows: &[Row] = &[
        // realtime band (< 300 ms)
        ("RMO", reject, Some(100), false, 0, Ok((Realtime, BudgetRealtime))),
        ("RMO", reject, Some(0), false, 0, Ok((Realtime, BudgetRealtime))),
        ("RMO", reject, Some(299), false, 0, Ok((Realtime, BudgetRealtime))),
        ("RMO", reject, None, false, 0, Ok((Realtime, BudgetRealtime))), // route default 200 ms
        ("MO", reject, Some(100), false, 0, Err("no_tier")),
        ("MO", best, Some(100), false, 0, Ok((MicroBatch, BestEffort))),
        ("O", best, Some(100), false, 0, Err("no_tier")),
        // micro-batch band (300 ms .. 60 s)
        ("RMO", reject, Some(300), false, 0, Ok((MicroBatch, BudgetMicroBatch))),
        (
            "RMO",
            reject,
            Some(59_999),
            false,
            0,
            Ok((MicroBatch, BudgetMicroBatch)),
        ),
        ("RO", reject, Some(1_000), false, 0, Ok((Realtime, MicroBatchOff))),
        (
            "RM%",
            reject,
            Some(1_000),
            false,
            10,
            Ok((MicroBatch, BudgetMicroBatch)),
        ),
        ("RM%", reject, Some(1_000), false, 60, Ok((Realtime, MicroBatchRollout))),
        ("M%", reject, Some(1_000), false, 60, Ok((MicroBatch, BudgetMicroBatch))),
        ("O", reject, Some(1_000), false, 0, Err("no_tier")),
        // offline band (>= 60 s) and Prefer: respond-async
        ("RMO", reject, Some(60_000), false, 0, Ok((Offline, BudgetOffline))),
        ("RMO", reject, Some(100), true, 0, Ok((Offline, PreferAsync))),
        ("RMO", reject, None, true, 0, Ok((Offline, PreferAsync))),
        ("RM", reject, Some(60_000), false, 0, Ok((MicroBatch, OfflineOff))),
        ("RM", reject, Some(1_000), true, 0, Ok((MicroBatch, OfflineOff))),
        ("RM", reject, Some(100), true, 0, Ok((Realtime, OfflineOff))),
        ("R", reject, Some(60_000), false, 0, Ok((Realtime, OfflineOff))),
        ("RM%", reject, Some(60_000), false, 60, Ok((Realtime, OfflineOff))),
        ("M", reject, Some(100), true, 0, Err("no_tier")),
        // every tier off
        ("", reject, Some(100), false, 0, Err("route_disabled")),
        ("", best, Some(100), true, 0, Err("route_disabled")),
    ];
    for (i, &(flags, when, budget, prefer, key, want)) in rows.iter().enumerate() {
        let got = classify(&route(flags, when), &meta(budget, prefer, key));
        let got = got.map(|d| (d.tier, d.reason)).map_err(Refusal::as_str);
        assert_eq!(
            got, want,
            "row {i}: flags {flags:?} budget {budget:?} prefer_async {prefer} key {key}"
        );
    }
}

/// Every combination of flags, bands, preferences and keys keeps the table's promises.
#[test]
fn invariants_hold_for_every_combination() {
    let budgets = [
        None,
        Some(0),
        Some(299),
        Some(300),
        Some(5_000),
        Some(60_000),
        Some(u64::MAX / 2),
    ];
    for bits in 0..16u8 {
        let mut flags = String::new();
        for (bit, c) in [(1, 'R'), (2, 'M'), (4, 'O'), (8, '%')] {
            if bits & bit != 0 {
                flags.push(c);
            }
        }
        for when in [WhenUnmet::Reject, WhenUnmet::BestEffort] {
            let r = route(&flags, when);
            for budget in budgets {
                for prefer in [false, true] {
                    for key in [0, 49, 50, 99] {
                        let m = meta(budget, prefer, key);
                        check(&r, &m, classify(&r, &m));
                    }
                }
            }
        }
    }
}

fn check(r: &Route, m: &Meta, got: Result<Decision, Refusal>) {
    let f = r.flags;
    let budget = m.budget.map_or(r.budgets.default, |b| b.0);
    let ctx = format!("{f:?} {m:?} -> {got:?}");
    match got {
        Ok(d) => {
            assert_eq!(d.budget, budget, "{ctx}");
            let on = match d.tier {
                Tier::Realtime => f.realtime,
                Tier::MicroBatch => f.micro_batch,
                Tier::Offline => f.offline,
            };
            assert!(on, "a tier that is off never serves: {ctx}");
            if d.tier == Tier::Offline {
                assert!(m.prefer_async || budget >= r.budgets.offline_from, "{ctx}");
            }
            if d.tier == Tier::MicroBatch && budget < r.budgets.realtime_below {
                assert_eq!(d.reason, Reason::BestEffort, "{ctx}");
            }
            if (m.prefer_async || budget >= r.budgets.offline_from) && f.offline {
                assert_eq!(d.tier, Tier::Offline, "{ctx}");
            }
        }
        Err(Refusal::RouteDisabled) => assert!(!(f.realtime || f.micro_batch || f.offline), "{ctx}"),
        Err(Refusal::NoTier { .. }) => {
            assert!(!f.realtime, "real-time meets every budget: {ctx}");
            let offline_fits = f.offline && (m.prefer_async || budget >= r.budgets.offline_from);
            assert!(!offline_fits, "{ctx}");
        }
    }
}

#[test]
fn rollout_is_deterministic_per_key() {
    assert_eq!(key_hash(b"req-42"), key_hash(b"req-42"));
    assert_ne!(key_hash(b"req-42"), key_hash(b"req-43"));
    // FNV-1a reference value for the empty input and for "a".
    assert_eq!(key_hash(b""), 0xcbf2_9ce4_8422_2325);
    assert_eq!(key_hash(b"a"), 0xaf63_dc4c_8601_ec8c);
    let r = route("RM%", WhenUnmet::Reject);
    let inside = (0..1000u64).filter(|k| {
        let d = classify(&r, &meta(Some(1_000), false, key_hash(&k.to_le_bytes()))).expect("served");
        d.tier == Tier::MicroBatch
    });
    let n = inside.count();
    assert!((400..600).contains(&n), "about half of keys roll out, got {n}/1000");
}
