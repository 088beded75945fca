//! The pool's order end to end on paused time: earliest deadline first across lanes,
//! the sheddable band, and two tenants, one flooding at ten times its share, against a
//! backend whose batches cost `10 ms + 0.5 ms` per row.
#![allow(clippy::unwrap_used)] // in tests a failed unwrap is a failed test

use std::sync::Mutex;

use tokio::sync::Notify;

use super::*;

type Seen = Arc<Mutex<Vec<(u8, Vec<u32>)>>>;

/// A worker over lanes 0..3 whose backend records each batch (lane, payloads) and
/// answers it after `gate` (when given) or after the batch's cost.
fn start(settings: Settings, gate: Option<Arc<Notify>>) -> (Queue<u8, u32, u32>, Vec<Arc<u8>>, Seen) {
    let (queue, worker) = pair::<u8, u32, u32>(settings);
    let seen: Seen = Arc::default();
    let log = seen.clone();
    let send = move |lane: Arc<u8>, batch: Batch<u32, u32>, _: Flush| {
        let (log, gate) = (log.clone(), gate.clone());
        async move {
            log.lock()
                .unwrap()
                .push((*lane, batch.iter().map(|e| e.payload).collect()));
            match gate {
                Some(gate) => gate.notified().await,
                None => {
                    let rows: u64 = batch.iter().map(|e| e.rows).sum();
                    tokio::time::sleep(Duration::from_micros(10_000 + 500 * rows)).await;
                }
            }
            for e in batch {
                let _ = e.reply.send(Ok(e.payload));
            }
        }
    };
    tokio::spawn(worker.run(send, CancellationToken::new()));
    (queue, (0..3).map(Arc::new).collect(), seen)
}

fn settings(max_batch: u64, slots: usize, capacity: u64) -> Settings {
    Settings {
        max_batch,
        max_bytes: u64::MAX,
        slots,
        capacity,
        shed_at: capacity / 2,
    }
}

fn band(priority: Priority) -> Class {
    Class {
        priority,
        ..Class::default()
    }
}

fn within(ms: u64) -> Instant {
    Instant::now() + Duration::from_millis(ms)
}

#[tokio::test(start_paused = true)]
async fn a_freed_slot_goes_to_the_lane_with_the_earliest_deadline() {
    let gate = Arc::new(Notify::new());
    let (queue, lanes, seen) = start(settings(8, 1, 64), Some(gate.clone()));
    let busy = queue.submit(&lanes[2], 0, (1, within(5000)), Class::default()).unwrap();
    tokio::task::yield_now().await; // lane 2's batch holds the only slot
    let long: Vec<_> = (1..=3)
        .map(|p| queue.submit(&lanes[0], p, (1, within(2000)), Class::default()).unwrap())
        .collect();
    tokio::time::sleep(Duration::from_millis(5)).await;
    let short = queue.submit(&lanes[1], 10, (1, within(100)), Class::default()).unwrap();
    for _ in 0..3 {
        gate.notify_one();
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert!(busy.await.unwrap().is_ok() && short.await.unwrap().is_ok());
    for answer in long {
        assert!(answer.await.unwrap().is_ok());
    }
    let order: Vec<u8> = seen.lock().unwrap().iter().map(|(lane, _)| *lane).collect();
    assert_eq!(
        order,
        vec![2, 1, 0],
        "the later, shorter budget goes before the earlier, longer ones"
    );
}

#[tokio::test(start_paused = true)]
async fn the_sheddable_band_is_refused_under_pressure_and_evicted_for_others() {
    let gate = Arc::new(Notify::new());
    let (queue, lanes, _) = start(settings(100, 1, 8), Some(gate.clone()));
    let busy = queue.submit(&lanes[0], 0, (1, within(5000)), Class::default()).unwrap();
    tokio::task::yield_now().await;
    let mut sheddable: Vec<_> = (1..=4)
        .map(|p| {
            queue
                .submit(&lanes[0], p, (1, within(5000)), band(Priority::Sheddable))
                .unwrap()
        })
        .collect();
    let refused = queue
        .submit(&lanes[0], 5, (1, within(5000)), band(Priority::Sheddable))
        .expect_err("past shed_at (4 of 8 rows)");
    assert_eq!(refused.kind, Kind::QueueFull);
    assert!(refused.message.contains("sheddable"), "{refused}");
    let standard: Vec<_> = (6..=11)
        .map(|p| queue.submit(&lanes[0], p, (1, within(5000)), Class::default()).unwrap())
        .collect();
    let evicted: Vec<bool> = sheddable
        .iter_mut()
        .map(|answer| {
            answer
                .try_recv()
                .is_ok_and(|a| a.is_err_and(|e| e.kind == Kind::QueueFull))
        })
        .collect();
    assert_eq!(evicted, vec![false, false, true, true], "the latest two made room");
    let more: Vec<_> = (12..=13)
        .map(|p| queue.submit(&lanes[0], p, (1, within(5000)), Class::default()).unwrap())
        .collect();
    let full = queue
        .submit(&lanes[0], 14, (1, within(5000)), Class::default())
        .expect_err("nothing sheddable left to evict");
    assert_eq!(full.kind, Kind::QueueFull);
    gate.notify_one();
    tokio::time::sleep(Duration::from_millis(1)).await;
    gate.notify_one();
    assert!(busy.await.unwrap().is_ok());
    for answer in standard.into_iter().chain(more) {
        assert!(answer.await.unwrap().is_ok(), "every standard caller was served");
    }
}

/// What tenant B saw: its latencies (ms) and the share of its calls answered in time.
#[derive(Debug)]
struct Outcome {
    p99_ms: f64,
    attained: f64,
}

/// Tenant B sends one row every 5 ms (200 rows/s, budget 100 ms) for 2 s; tenant A
/// (unless `a_rows_per_s` is 0) sends 10-row requests at `a_rows_per_s` (budget 1 s),
/// as its own tenant when `apart`, else as B's. The pool: 2 slots, batches of 16 rows at
/// most, 512 rows of queue; full batches cost 18 ms, so it serves about 1,780 rows/s and
/// each tenant's share, both busy, is about 890.
async fn tenant_b(a_rows_per_s: u64, apart: bool) -> Outcome {
    let (queue, lanes, _) = start(settings(16, 2, 512), None);
    let (a, b) = (
        Class {
            flow: 1,
            ..Class::default()
        },
        Class {
            flow: 2,
            ..Class::default()
        },
    );
    let a = if apart { a } else { b };
    let flood = (a_rows_per_s > 0).then(|| {
        let (queue, lane) = (queue.clone(), lanes[0].clone());
        let every = Duration::from_micros(10_000_000 / a_rows_per_s);
        tokio::spawn(async move {
            let mut answers = Vec::new();
            let mut tick = tokio::time::interval(every);
            for p in 0..(2_000_000 / every.as_micros() as u64) {
                tick.tick().await;
                if let Ok(answer) = queue.submit(&lane, p as u32, (10, within(1000)), a) {
                    answers.push(answer);
                }
            }
            for answer in answers {
                let _ = answer.await;
            }
        })
    });
    let mut calls = Vec::new();
    let mut tick = tokio::time::interval(Duration::from_millis(5));
    for p in 0..400u32 {
        tick.tick().await;
        let sent = Instant::now();
        let answer = queue.submit(&lanes[0], 100_000 + p, (1, within(100)), b);
        calls.push(tokio::spawn(async move {
            match answer {
                Ok(answer) => matches!(answer.await, Ok(Ok(_))).then(|| sent.elapsed()),
                Err(_) => None,
            }
        }));
    }
    let mut latencies = Vec::new();
    let mut attained = 0;
    for call in calls {
        if let Some(took) = call.await.unwrap() {
            attained += usize::from(took <= Duration::from_millis(100));
            latencies.push(took.as_secs_f64() * 1e3);
        }
    }
    if let Some(flood) = flood {
        flood.await.unwrap();
    }
    latencies.sort_by(f64::total_cmp);
    let p99 = latencies
        .get(latencies.len() * 99 / 100)
        .copied()
        .unwrap_or(f64::INFINITY);
    Outcome {
        p99_ms: p99,
        attained: attained as f64 / 400.0,
    }
}

#[tokio::test(start_paused = true)]
async fn a_tenant_flooding_at_ten_times_its_share_leaves_the_other_on_time() {
    let alone = tenant_b(0, true).await;
    let at_share = tenant_b(890, true).await;
    let flood = tenant_b(8_900, true).await;
    let mixed = tenant_b(8_900, false).await;
    eprintln!("alone {alone:?}, other at its share {at_share:?}, flooding {flood:?}, one tenant {mixed:?}");
    assert_eq!(alone.attained, 1.0);
    assert!(
        flood.attained >= 0.9 * alone.attained,
        "deadline attainment within 10%: {flood:?}"
    );
    assert!(
        flood.p99_ms <= 1.1 * at_share.p99_ms,
        "the flood beyond its share costs the other nothing: {flood:?} against {at_share:?}"
    );
    assert!(
        flood.p99_ms <= alone.p99_ms + 2.0 * 18.0,
        "at most a batch in flight and a full batch more than alone: {flood:?} against {alone:?}"
    );
    // As one tenant, earliest deadline first still puts B's shorter budgets first, but
    // the flood holds the queue and B is refused at the door.
    assert!(mixed.attained < 0.9, "as one tenant, the flood shuts B out: {mixed:?}");
}

/// What one band saw of a run: callers sent, answered within their budget, answered at all.
#[derive(Debug, Default, Clone, Copy)]
struct BandOutcome {
    sent: u32,
    in_budget: u32,
    answered: u32,
}

/// A critical load of one-row callers at `critical_per_s` (budget 500 ms) beside a
/// standard and a sheddable load (`lower_per_s` each, budgets 500 ms and 1 s), for 3 s,
/// on a pool of one slot whose batches of at most 8 rows cost 20 ms + 1.75 ms a row (34
/// ms full: about 235 rows/s), its cost learned. Returns each band's outcome, highest
/// band first, and the batches that left with room while a caller who had been waiting
/// in time for them went in a later one.
async fn bands(critical_per_s: u64, lower_per_s: u64) -> ([BandOutcome; 3], usize) {
    type Sent = (Instant, u64, Vec<Instant>);
    let shared = Shared::new(&settings(8, 1, 4096));
    for rows in 1..=8 {
        shared.cost.observe(rows, Duration::from_micros(20_000 + 1_750 * rows));
    }
    let (queue, worker) = pair_sharing::<u8, u32, u32>(settings(8, 1, 4096), shared);
    let sent: Arc<Mutex<Vec<Sent>>> = Arc::default();
    let log = sent.clone();
    let send = move |_lane: Arc<u8>, batch: Batch<u32, u32>, _: Flush| {
        let log = log.clone();
        async move {
            let rows: u64 = batch.iter().map(|e| e.rows).sum();
            let queued = batch.iter().map(|e| e.queued_at).collect();
            log.lock().unwrap().push((Instant::now(), rows, queued));
            tokio::time::sleep(Duration::from_micros(20_000 + 1_750 * rows)).await;
            for e in batch {
                let _ = e.reply.send(Ok(e.payload));
            }
        }
    };
    tokio::spawn(worker.run(send, CancellationToken::new()));
    let lane = Arc::new(0u8);
    let load = |priority: Priority, every: Duration, budget_ms: u64| {
        let (queue, lane) = (queue.clone(), lane.clone());
        tokio::spawn(async move {
            let mut calls = Vec::new();
            let mut tick = tokio::time::interval(every);
            let end = Instant::now() + Duration::from_secs(3);
            while tick.tick().await < end {
                let at = Instant::now();
                let answer = queue.submit(&lane, 0, (1, at + Duration::from_millis(budget_ms)), band(priority));
                calls.push(tokio::spawn(async move {
                    match answer {
                        Ok(answer) => matches!(answer.await, Ok(Ok(_))).then(|| at.elapsed()),
                        Err(_) => None,
                    }
                }));
            }
            let mut outcome = BandOutcome::default();
            for call in calls {
                outcome.sent += 1;
                if let Some(took) = call.await.unwrap() {
                    outcome.answered += 1;
                    outcome.in_budget += u32::from(took <= Duration::from_millis(budget_ms));
                }
            }
            outcome
        })
    };
    let critical = load(
        Priority::Critical,
        Duration::from_micros(1_000_000 / critical_per_s),
        500,
    );
    let lower = Duration::from_micros(1_000_000 / lower_per_s);
    let standard = load(Priority::Standard, lower, 500);
    let sheddable = load(Priority::Sheddable, lower, 1000);
    let outcomes = [
        critical.await.unwrap(),
        standard.await.unwrap(),
        sheddable.await.unwrap(),
    ];
    let sent = sent.lock().unwrap().clone();
    // A batch with room left while a caller queued before it left went in a later one.
    let short = sent
        .iter()
        .filter(|(at, rows, _)| {
            *rows < 8
                && sent
                    .iter()
                    .any(|(later, _, queued)| later > at && queued.iter().any(|q| q < at))
        })
        .count();
    (outcomes, short)
}

#[tokio::test(start_paused = true)]
async fn a_critical_load_at_40_percent_leaves_lower_bands_within_their_budgets() {
    let (outcomes, short) = bands(94, 20).await;
    eprintln!("critical at 40%: {outcomes:?}, batches left short: {short}");
    for (band, outcome) in ["critical", "standard", "sheddable"].iter().zip(outcomes) {
        assert_eq!(
            outcome.in_budget, outcome.sent,
            "{band}: every caller within its budget: {outcome:?}"
        );
    }
    assert_eq!(short, 0, "no batch leaves room while someone who fits waits");
}

#[tokio::test(start_paused = true)]
async fn a_critical_load_at_80_percent_leaves_lower_bands_what_is_left_in_full_batches() {
    let (outcomes, short) = bands(188, 20).await;
    eprintln!("critical at 80%: {outcomes:?}, batches left short: {short}");
    let [critical, standard, sheddable] = outcomes;
    assert_eq!(
        critical.in_budget, critical.sent,
        "the critical band first: {critical:?}"
    );
    // 235 rows/s less 188 leave about 47 for the 40 a second of the lower bands.
    assert_eq!(
        standard.in_budget, standard.sent,
        "standard is served from what is left: {standard:?}"
    );
    assert_eq!(
        sheddable.in_budget, sheddable.sent,
        "and sheddable after it: {sheddable:?}"
    );
    assert_eq!(short, 0, "no batch leaves room while someone who fits waits");
}

#[tokio::test(start_paused = true)]
async fn lower_bands_asking_more_than_a_critical_load_leaves_get_the_rest_in_full_batches() {
    // 188 critical rows a second leave about 47 of the pool's 235; the lower bands ask 80.
    let (outcomes, short) = bands(188, 40).await;
    eprintln!("critical at 80%, 80 rows a second below it: {outcomes:?}, batches left short: {short}");
    let [critical, standard, sheddable] = outcomes;
    assert_eq!(
        critical.in_budget, critical.sent,
        "the critical band first: {critical:?}"
    );
    let below = f64::from(standard.answered + sheddable.answered) / 3.0;
    assert!(
        below >= 0.85 * 47.0,
        "the lower bands get what is left: {below:.1} rows/s"
    );
    assert!(
        standard.answered > sheddable.answered,
        "standard before sheddable: {outcomes:?}"
    );
    assert_eq!(short, 0, "no batch leaves room while someone who fits waits");
}
