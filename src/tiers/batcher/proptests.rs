//! Property test: for random arrivals, row counts, signatures (one lane per signature,
//! sharing the pool's slots), bands, tenants, deadlines, backend times and failing
//! batches, every caller is answered exactly once with its own result; no batch mixes
//! signatures or exceeds `max_batch` rows; nothing is sent past its deadline; a batch
//! is only ever sent at an event (a caller's arrival or a slot freeing), never after an
//! idle wait; and a batch with room left leaves behind, in its lane, only callers too
//! large for that room (or it was sealed for a deadline).
#![allow(clippy::unwrap_used)] // in tests a failed unwrap is a failed test

use std::collections::BTreeSet;
use std::sync::Mutex;

use proptest::prelude::*;

use super::*;

/// One caller: milliseconds after the previous one, its signature, rows, budget in ms,
/// whether its presence makes the backend fail the batch, and its band and tenant.
type Arrival = (u64, usize, u64, u64, bool, (usize, u64));

/// What the backend saw: when a batch went out, when it was answered, and its callers
/// as (signature, id, rows, queued_at, deadline).
#[derive(Debug, Clone)]
struct Sent {
    at: Instant,
    done: Instant,
    lane: usize,
    flush: Flush,
    callers: Vec<(usize, usize, u64, Instant, Instant)>,
}

const SIGNATURES: usize = 3;

fn arrivals() -> impl Strategy<Value = Vec<Arrival>> {
    prop::collection::vec(
        (
            0u64..15,
            0..SIGNATURES,
            1u64..6,
            1u64..200,
            prop::bool::weighted(0.1),
            (0usize..3, 0u64..3),
        ),
        1..60,
    )
}

fn run(settings: Settings, backend_ms: u64, learned: bool, arrivals: Vec<Arrival>) -> Result<(), TestCaseError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    rt.block_on(async move {
        let shared = Shared::new(&settings);
        if learned {
            // The cost the backend really has, so batches seal at deadlines too.
            for rows in 1..=8 {
                shared.cost.observe(rows, Duration::from_millis(backend_ms));
            }
        }
        let log: Arc<Mutex<Vec<Sent>>> = Arc::default();
        let lanes: Vec<Arc<usize>> = (0..SIGNATURES).map(Arc::new).collect();
        let (queue, worker) = pair_sharing::<usize, (usize, bool), usize>(settings, shared.clone());
        {
            let log = log.clone();
            let send = move |lane: Arc<usize>, batch: Batch<(usize, bool), usize>, flush: Flush| {
                let log = log.clone();
                let lane = *lane;
                async move {
                    let at = Instant::now();
                    tokio::time::sleep(Duration::from_millis(backend_ms)).await;
                    let fail = batch.iter().any(|e| e.payload.1);
                    let callers = batch
                        .iter()
                        .map(|e| (lane, e.payload.0, e.rows, e.queued_at, e.deadline))
                        .collect();
                    log.lock().unwrap().push(Sent {
                        at,
                        done: Instant::now(),
                        lane,
                        flush,
                        callers,
                    });
                    for e in batch {
                        let answer = match fail {
                            true => Err(Error::new(Kind::Backend, "the batch failed")),
                            false => Ok(e.payload.0 * 10),
                        };
                        let _ = e.reply.send(answer);
                    }
                }
            };
            tokio::spawn(worker.run(send, CancellationToken::new()));
        }
        let mut answers = Vec::new();
        let mut arrived = BTreeSet::new();
        for (id, &(gap, lane, rows, budget, poison, (band, tenant))) in arrivals.iter().enumerate() {
            tokio::time::sleep(Duration::from_millis(gap)).await;
            arrived.insert(Instant::now());
            let deadline = Instant::now() + Duration::from_millis(budget);
            let class = Class {
                priority: crate::policy::Priority::ALL[band],
                flow: tenant,
                weight: 1 + tenant as u32,
            };
            let answer = queue
                .submit(&lanes[lane], (id, poison), (rows, deadline), class)
                .unwrap();
            answers.push(tokio::spawn(answer));
        }
        let mut results = Vec::new();
        for answer in answers {
            let answered = answer.await.unwrap();
            prop_assert!(answered.is_ok(), "a caller was dropped without an answer");
            results.push(answered.unwrap());
        }
        let log = log.lock().unwrap().clone();

        // Exactly once, and each its own result.
        let mut sent_ids: Vec<usize> = log.iter().flat_map(|s| s.callers.iter().map(|c| c.1)).collect();
        sent_ids.sort_unstable();
        let unique: BTreeSet<usize> = sent_ids.iter().copied().collect();
        prop_assert_eq!(unique.len(), sent_ids.len(), "a caller was sent twice");
        for (id, result) in results.iter().enumerate() {
            let sent = unique.contains(&id);
            match result {
                Ok(v) => prop_assert!(sent && *v == id * 10, "caller {} got {}", id, v),
                Err(e) if e.kind == Kind::Backend => prop_assert!(sent),
                Err(e) => prop_assert!(
                    !sent && matches!(e.kind, Kind::Deadline | Kind::DeadlineUnmeetable),
                    "caller {}: {:?}",
                    id,
                    e
                ),
            }
        }

        let done: BTreeSet<Instant> = log.iter().map(|s| s.done).collect();
        for batch in &log {
            let rows: u64 = batch.callers.iter().map(|c| c.2).sum();
            prop_assert!(rows <= settings.max_batch || batch.callers.len() == 1, "{} rows", rows);
            for &(lane, id, _, _, deadline) in &batch.callers {
                prop_assert_eq!(lane, batch.lane, "caller {} mixed into another signature", id);
                prop_assert!(deadline > batch.at, "caller {} sent past its deadline", id);
            }
            // Sent at an event: an arrival or a slot freeing.
            prop_assert!(
                arrived.contains(&batch.at) || done.contains(&batch.at),
                "a batch left at {:?}, not at any event",
                batch.at
            );
            // Full, or nobody who was waiting in its lane would have fitted.
            if batch.flush != Flush::Deadline {
                let left: Vec<u64> = log
                    .iter()
                    .filter(|s| s.lane == batch.lane && s.at > batch.at)
                    .flat_map(|s| s.callers.iter().filter(|c| c.3 < batch.at).map(|c| c.2))
                    .collect();
                if left.len() < super::order::MAX_PASSED {
                    for rows_left in left {
                        prop_assert!(
                            rows + rows_left > settings.max_batch,
                            "a batch of {} rows left with room for a waiting caller's {}",
                            rows,
                            rows_left
                        );
                    }
                }
            }
        }
        Ok(())
    })
}

proptest! {
    #![proptest_config(ProptestConfig { failure_persistence: None, cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn every_caller_is_answered_once_within_its_rules(
        max_batch in 1u64..12,
        slots in 1usize..3,
        backend_ms in 1u64..30,
        learned in any::<bool>(),
        arrivals in arrivals(),
    ) {
        let settings = Settings {
            max_batch,
            max_bytes: u64::MAX,
            slots,
            capacity: 10_000,
            shed_at: 10_000,
        };
        run(settings, backend_ms, learned, arrivals)?;
    }
}
