use std::sync::Mutex;

use tokio::sync::Notify;

use super::*;

type Log = Arc<Mutex<Vec<Vec<u32>>>>;

fn settings(max_batch: u64, slots: usize, capacity: u64) -> Settings {
    Settings {
        max_batch,
        max_bytes: u64::MAX,
        slots,
        capacity,
        shed_at: capacity,
    }
}

/// A pool's queue with lanes named by numbers; `submit` queues in lane 0 as the
/// anonymous tenant in the standard band.
struct Lanes {
    queue: Queue<u8, u32, u32>,
    lanes: Vec<Arc<u8>>,
}

type Answer = oneshot::Receiver<Result<u32, Error>>;

impl Lanes {
    fn submit(&self, payload: u32, rows: u64, deadline: Instant) -> Result<Answer, Error> {
        self.submit_as(0, Class::default(), payload, (rows, deadline))
    }

    fn submit_as(&self, lane: usize, class: Class, payload: u32, at: (u64, Instant)) -> Result<Answer, Error> {
        self.queue.submit(&self.lanes[lane], payload, at, class)
    }

    fn submit_filler(&self, payload: u32, rows: u64, deadline: Instant) -> Result<Answer, Error> {
        self.queue.submit_filler(&self.lanes[0], payload, (rows, 0), deadline)
    }

    fn queued_rows(&self) -> u64 {
        self.queue.queued_rows()
    }
}

/// Starts a worker whose backend echoes each payload and records every batch; while
/// `gate` is set, each batch waits for a `notify_one` before answering.
fn start(settings: Settings, gate: Option<Arc<Notify>>) -> (Lanes, Log, CancellationToken) {
    let (queue, worker) = pair::<u8, u32, u32>(settings);
    let queue = Lanes {
        queue,
        lanes: (0..4).map(Arc::new).collect(),
    };
    let log: Log = Arc::default();
    let shutdown = CancellationToken::new();
    let seen = log.clone();
    let send = move |_lane: Arc<u8>, batch: Batch<u32, u32>, _flush: Flush| {
        let (seen, gate) = (seen.clone(), gate.clone());
        async move {
            seen.lock()
                .expect("lock")
                .push(batch.iter().map(|e| e.payload).collect());
            if let Some(gate) = gate {
                gate.notified().await;
            }
            for entry in batch {
                let _ = entry.reply.send(Ok(entry.payload * 10));
            }
        }
    };
    tokio::spawn(worker.run(send, shutdown.clone()));
    (queue, log, shutdown)
}

fn far() -> Instant {
    Instant::now() + Duration::from_secs(60)
}

#[tokio::test(start_paused = true)]
async fn a_lone_request_is_sent_at_once() {
    let (queue, log, _stop) = start(settings(8, 1, 64), None);
    let started = Instant::now();
    let answer = queue.submit(7, 1, far()).expect("queued").await.expect("answered");
    assert_eq!(answer.expect("ok"), 70);
    assert_eq!(started.elapsed(), Duration::ZERO, "nothing waits for a batch to fill");
    assert_eq!(*log.lock().expect("lock"), vec![vec![7]]);
}

#[tokio::test(start_paused = true)]
async fn requests_coalesce_while_every_slot_is_busy_and_batches_respect_max_batch() {
    let gate = Arc::new(Notify::new());
    let (queue, log, _stop) = start(settings(4, 1, 64), Some(gate.clone()));
    let first = queue.submit(1, 1, far()).expect("queued");
    tokio::task::yield_now().await;
    let rest: Vec<_> = (2..=6).map(|p| queue.submit(p, 2, far()).expect("queued")).collect();
    // release batches one by one
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_millis(1)).await;
        gate.notify_one();
    }
    assert_eq!(first.await.expect("answered").expect("ok"), 10);
    for (i, answer) in rest.into_iter().enumerate() {
        assert_eq!(
            answer.await.expect("answered").expect("ok"),
            (i as u32 + 2) * 10,
            "each caller gets its own answer"
        );
    }
    let batches = log.lock().expect("lock").clone();
    assert_eq!(
        batches,
        vec![vec![1], vec![2, 3], vec![4, 5], vec![6]],
        "2-row callers, max_batch 4 rows"
    );
}

#[tokio::test(start_paused = true)]
async fn a_full_queue_refuses_at_once() {
    let gate = Arc::new(Notify::new());
    let (queue, _log, _stop) = start(settings(100, 1, 4), Some(gate.clone()));
    let mut answers = vec![queue.submit(0, 1, far()).expect("queued")];
    tokio::task::yield_now().await; // the first batch is out, holding the only slot
    for p in 1..=4 {
        answers.push(queue.submit(p, 1, far()).expect("fits"));
    }
    let refused = queue.submit(5, 1, far()).expect_err("full");
    assert_eq!(refused.kind, Kind::QueueFull);
    assert!(refused.message.contains("capacity 4"), "{refused}");
    for _ in 0..2 {
        gate.notify_one();
        tokio::task::yield_now().await;
    }
    for answer in answers {
        assert!(answer.await.expect("answered").is_ok());
    }
    assert!(queue.submit(6, 1, far()).is_ok(), "room again once the batch left");
}

#[tokio::test(start_paused = true)]
async fn expired_and_departed_callers_are_never_sent() {
    let gate = Arc::new(Notify::new());
    let (queue, log, _stop) = start(settings(8, 1, 64), Some(gate.clone()));
    let busy = queue.submit(1, 1, far()).expect("queued");
    tokio::task::yield_now().await;
    let expiring = queue
        .submit(2, 1, Instant::now() + Duration::from_millis(5))
        .expect("queued");
    drop(queue.submit(3, 1, far()).expect("queued")); // the caller goes away
    let kept = queue.submit(4, 1, far()).expect("queued");
    tokio::time::sleep(Duration::from_millis(10)).await;
    gate.notify_one();
    gate.notify_one();
    assert!(busy.await.expect("answered").is_ok());
    let err = expiring.await.expect("answered").expect_err("expired");
    assert_eq!(err.kind, Kind::Deadline);
    assert_eq!(kept.await.expect("answered").expect("ok"), 40);
    assert_eq!(*log.lock().expect("lock"), vec![vec![1], vec![4]]);
    assert_eq!(queue.queued_rows(), 0);
}

/// Shutdown (the end of a stop) answers every caller not yet sent, the batch waiting
/// for a slot included, so nothing waits on a backend that may never answer; the batch
/// already at the backend keeps its answer.
#[tokio::test(start_paused = true)]
async fn shutdown_answers_whatever_is_not_yet_sent() {
    let gate = Arc::new(Notify::new());
    let (queue, log, stop) = start(settings(1, 1, 64), Some(gate.clone()));
    let busy = queue.submit(1, 1, far()).expect("queued");
    tokio::task::yield_now().await;
    let waiting = queue.submit(2, 1, far()).expect("queued");
    tokio::task::yield_now().await;
    let late = queue.submit(3, 1, far()).expect("queued");
    tokio::task::yield_now().await;
    stop.cancel();
    for refused in [waiting, late] {
        let refused = refused.await.expect("answered").expect_err("refused at shutdown");
        assert_eq!(refused.kind, Kind::Unavailable);
    }
    gate.notify_one();
    assert!(
        busy.await.expect("answered").is_ok(),
        "the batch at the backend is answered"
    );
    assert_eq!(*log.lock().expect("lock"), vec![vec![1]], "nothing more is sent");
    assert_eq!(queue.queued_rows(), 0, "every refused row left the queue count");
}

#[tokio::test(start_paused = true)]
async fn every_caller_is_answered_exactly_once_with_its_own_result() {
    let gate = Arc::new(Notify::new());
    let (queue, log, _stop) = start(settings(5, 2, 10_000), Some(gate.clone()));
    let mut answers = Vec::new();
    for p in 0..200u32 {
        answers.push((p, queue.submit(p, u64::from(p % 3) + 1, far()).expect("queued")));
        if p % 7 == 0 {
            tokio::task::yield_now().await;
            gate.notify_one();
        }
    }
    let releaser = tokio::spawn(async move {
        loop {
            gate.notify_one();
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    });
    for (p, answer) in answers {
        assert_eq!(answer.await.expect("answered").expect("ok"), p * 10);
    }
    releaser.abort();
    let batches = log.lock().expect("lock").clone();
    let mut sent: Vec<u32> = batches.iter().flatten().copied().collect();
    sent.sort_unstable();
    assert_eq!(sent, (0..200).collect::<Vec<_>>(), "each caller sent exactly once");
    for batch in batches {
        let rows: u64 = batch.iter().map(|p| u64::from(p % 3) + 1).sum();
        assert!(rows <= 5, "no batch over max_batch rows: {batch:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn filler_rides_only_within_the_cost_slack_and_never_before_callers() {
    let gate = Arc::new(Notify::new());
    let (queue, log, _stop) = start(settings(64, 1, 1000), Some(gate.clone()));
    // A learned cost of 10 ms + 0.1 ms per row: 4 callers' rows cost 10.4 ms, so 5% of
    // slack lets 5 filler rows ride (10.9 ms).
    for rows in 1..=8 {
        queue
            .queue
            .shared
            .cost
            .observe(rows, Duration::from_micros(10_000 + 100 * rows));
    }
    let busy = queue.submit(0, 1, far()).expect("queued");
    tokio::task::yield_now().await; // the first batch holds the only slot
    let fillers: Vec<_> = (100..120)
        .map(|p| queue.submit_filler(p, 1, far()).expect("queued"))
        .collect();
    let callers: Vec<_> = (1..=4).map(|p| queue.submit(p, 1, far()).expect("queued")).collect();
    for _ in 0..8 {
        gate.notify_one();
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert!(busy.await.expect("answered").is_ok());
    for c in callers {
        assert!(c.await.expect("answered").is_ok());
    }
    for f in fillers {
        assert!(f.await.expect("answered").is_ok(), "every filler is served in the end");
    }
    let batches = log.lock().expect("lock").clone();
    assert_eq!(batches[0], vec![0]);
    assert_eq!(
        batches[1],
        vec![1, 2, 3, 4, 100, 101, 102, 103, 104],
        "callers first, 5 filler rows ride"
    );
    assert_eq!(
        batches[2],
        (105..120).collect::<Vec<_>>(),
        "the rest when the pool is idle"
    );
    assert_eq!(queue.queued_rows(), 0, "filler is never counted in the queue");
}

#[tokio::test(start_paused = true)]
async fn filler_alone_waits_for_an_idle_pool_then_fills_a_batch() {
    let gate = Arc::new(Notify::new());
    let (queue, log, _stop) = start(settings(8, 1, 1000), Some(gate.clone()));
    let busy = queue.submit(0, 1, far()).expect("queued");
    tokio::task::yield_now().await;
    let fillers: Vec<_> = (100..110)
        .map(|p| queue.submit_filler(p, 1, far()).expect("queued"))
        .collect();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(
        log.lock().expect("lock").len(),
        1,
        "no filler batch while the pool is busy"
    );
    for _ in 0..3 {
        gate.notify_one();
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert!(busy.await.expect("answered").is_ok());
    for f in fillers {
        assert!(f.await.expect("answered").is_ok());
    }
    let batches = log.lock().expect("lock").clone();
    assert_eq!(
        batches[1],
        (100..108).collect::<Vec<_>>(),
        "an idle pool takes a full batch of filler"
    );
    assert_eq!(batches[2], vec![108, 109]);
}

#[test]
fn the_progressive_batch_size_halves_on_trouble_and_grows_back_by_a_sixteenth() {
    let limit = super::Limit::new(64);
    assert_eq!(limit.now(64), 64);
    let shrunk: Vec<u64> = (0..8).map(|_| limit.shrink(64)).collect();
    assert_eq!(shrunk, [32, 16, 8, 4, 2, 1, 1, 1], "halved, never below one row");
    let grown: Vec<u64> = (0..17).map(|_| limit.grow(64)).collect();
    assert_eq!(grown[0], 5);
    assert_eq!(grown[15], 64, "back to max_batch within 16 good batches");
    assert_eq!(grown[16], 64, "never above it");
    assert_eq!(limit.now(8), 8, "a smaller max_batch caps it");
}
