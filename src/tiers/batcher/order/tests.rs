use std::time::Duration;

use super::*;

type Answer = oneshot::Receiver<Result<u32, Error>>;

/// Lanes 0..3 and what waits in them.
struct Fixture {
    lanes: Vec<Arc<u8>>,
    waiting: Waiting<u8, u32, u32>,
    answers: Vec<(u32, Answer)>,
    start: Instant,
}

impl Fixture {
    fn new() -> Self {
        Fixture {
            lanes: (0..3).map(Arc::new).collect(),
            waiting: Waiting::default(),
            answers: Vec::new(),
            start: Instant::now(),
        }
    }

    /// Queues caller `p` in `lane` with `rows` rows, `budget_ms` from the start, as `class`.
    fn push(&mut self, lane: usize, class: Class, p: u32, rows: u64, budget_ms: u64) {
        let (mut entry, answer) = Entry::new(p, rows, self.start + ms(budget_ms), (false, class.priority));
        entry.queued_at = self.start;
        self.waiting.push(&self.lanes[lane], class, entry);
        self.answers.push((p, answer));
    }

    fn rule(&self, limit: u64) -> Rule {
        Rule {
            now: self.start,
            limit,
            max_bytes: u64::MAX,
            cost: None,
        }
    }

    /// The next batch's payloads under `rule`, from the lane the order picks.
    fn next(&mut self, rule: &Rule) -> Option<(u8, Vec<u32>, Option<Flush>)> {
        let lane = self.waiting.next_lane(rule)?;
        let (formed, _) = self.waiting.form(lane, rule);
        formed.map(|f| (*f.lane, f.entries.iter().map(|e| e.payload).collect(), f.sealed))
    }
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn class(priority: Priority, flow: u64, weight: u32) -> Class {
    Class { priority, flow, weight }
}

#[test]
fn higher_bands_go_first_and_lower_ones_fill_what_is_left() {
    let mut f = Fixture::new();
    f.push(0, class(Priority::Sheddable, 0, 1), 1, 1, 10);
    f.push(0, class(Priority::Standard, 0, 1), 2, 1, 500);
    f.push(0, class(Priority::Critical, 0, 1), 3, 1, 900);
    f.push(0, class(Priority::Standard, 0, 1), 4, 1, 100);
    let rule = f.rule(3);
    assert_eq!(f.next(&rule), Some((0, vec![3, 4, 2], Some(Flush::Full))));
    assert_eq!(
        f.next(&rule),
        Some((0, vec![1], None)),
        "sheddable last, whatever its deadline"
    );
    assert!(f.waiting.is_empty());
}

#[test]
fn earliest_deadline_first_across_lanes() {
    let mut f = Fixture::new();
    for p in 0..5 {
        f.push(0, Class::default(), p, 1, 1000 + u64::from(p));
    }
    f.push(1, Class::default(), 10, 1, 200);
    f.push(2, Class::default(), 20, 1, 600);
    let rule = f.rule(8);
    assert_eq!(
        f.next(&rule).map(|b| b.0),
        Some(1),
        "the lane with the earliest deadline goes first"
    );
    assert_eq!(f.next(&rule).map(|b| b.0), Some(2));
    assert_eq!(f.next(&rule), Some((0, vec![0, 1, 2, 3, 4], None)));
}

#[test]
fn tenants_share_rows_by_weight() {
    let mut f = Fixture::new();
    for p in 0..30 {
        f.push(0, class(Priority::Standard, 1, 1), p, 1, 1000);
    }
    for p in 100..130 {
        f.push(0, class(Priority::Standard, 2, 2), p, 1, 1000);
    }
    let rule = f.rule(9);
    for _ in 0..3 {
        let (_, batch, _) = f.next(&rule).expect("a batch");
        let light = batch.iter().filter(|&&p| p < 100).count();
        assert_eq!(
            (light, batch.len() - light),
            (3, 6),
            "weights 1:2 → rows 1:2: {batch:?}"
        );
    }
}

#[test]
fn rows_not_requests_are_charged() {
    let mut f = Fixture::new();
    for p in 0..10 {
        f.push(0, class(Priority::Standard, 1, 1), p, 4, 1000); // 4 rows each
    }
    for p in 100..140 {
        f.push(0, class(Priority::Standard, 2, 1), p, 1, 1000); // 1 row each
    }
    let rule = f.rule(16);
    let (_, batch, _) = f.next(&rule).expect("a batch");
    let big = batch.iter().filter(|&&p| p < 100).count() as u64;
    let small = batch.iter().filter(|&&p| p >= 100).count() as u64;
    assert_eq!((big * 4, small), (8, 8), "equal rows, not equal requests: {batch:?}");
}

#[test]
fn a_flood_cannot_push_a_newcomer_behind_it_and_an_idle_tenant_banks_no_credit() {
    let mut f = Fixture::new();
    for p in 0..200 {
        f.push(0, class(Priority::Standard, 1, 1), p, 1, 5000);
    }
    let rule = f.rule(10);
    for _ in 0..5 {
        f.next(&rule); // the flooding tenant alone: 50 rows served
    }
    for p in 1000..1020 {
        f.push(0, class(Priority::Standard, 2, 1), p, 1, 5000);
    }
    let (_, batch, _) = f.next(&rule).expect("a batch");
    let newcomer = batch.iter().filter(|&&p| p >= 1000).count();
    assert_eq!(newcomer, 5, "half the next batch, not all of it nor none: {batch:?}");
}

#[test]
fn ahead_counts_higher_bands_the_tenants_own_rows_and_others_fair_share() {
    let mut f = Fixture::new();
    f.push(0, class(Priority::Critical, 9, 1), 1, 5, 1000);
    for p in 0..100 {
        f.push(0, class(Priority::Standard, 1, 1), p, 1, 1000);
    }
    f.push(0, class(Priority::Sheddable, 3, 1), 2, 50, 1000);
    let due = f.start + ms(1000);
    let newcomer = class(Priority::Standard, 2, 1);
    assert_eq!(
        f.waiting.ahead(&newcomer, 2, due),
        5 + 2 + 2,
        "critical, its own 2, the flood's 2"
    );
    let heavy = class(Priority::Standard, 2, 4);
    assert_eq!(
        f.waiting.ahead(&heavy, 4, due),
        5 + 4 + 1,
        "weight 4: the flood gets 1 row per 4"
    );
    assert_eq!(f.waiting.ahead(&class(Priority::Standard, 1, 1), 1, due), 5 + 101);
    let urgent = f.start + ms(10);
    assert_eq!(
        f.waiting.ahead(&class(Priority::Standard, 1, 1), 1, urgent),
        5 + 1,
        "its own tenant's later deadlines go after it"
    );
}

#[test]
fn shedding_takes_the_latest_sheddable_callers_only() {
    let mut f = Fixture::new();
    f.push(0, class(Priority::Standard, 0, 1), 1, 4, 100);
    f.push(0, class(Priority::Sheddable, 0, 1), 2, 2, 300);
    f.push(1, class(Priority::Sheddable, 0, 1), 3, 2, 900);
    f.push(0, class(Priority::Sheddable, 0, 1), 4, 2, 500);
    let (shed, freed) = f.waiting.shed(3);
    assert_eq!(shed.iter().map(|e| e.payload).collect::<Vec<_>>(), vec![3, 4]);
    assert_eq!(freed, 4);
    let (shed, freed) = f.waiting.shed(10);
    assert_eq!((shed.len(), freed), (1, 2), "never a caller of another band");
    assert_eq!(f.waiting.rows(), 4);
}

#[test]
fn the_doomed_the_expired_and_the_departed_are_never_sent() {
    let mut f = Fixture::new();
    f.push(0, Class::default(), 1, 1, 0); // its budget is spent
    f.push(0, Class::default(), 2, 1, 30); // the learned cost says 50 ms
    f.push(0, Class::default(), 3, 1, 1000);
    f.push(0, Class::default(), 4, 1, 1000);
    let departed = f.answers.remove(3);
    drop(departed);
    let rule = Rule {
        cost: Some(Estimate {
            fixed: ms(50),
            per_row: Duration::ZERO,
            samples: 10,
            rms_error: Duration::ZERO,
        }),
        ..f.rule(8)
    };
    let lane = f.waiting.next_lane(&rule).expect("a lane");
    let (formed, released) = f.waiting.form(lane, &rule);
    let sent: Vec<u32> = formed.expect("a batch").entries.iter().map(|e| e.payload).collect();
    assert_eq!(sent, vec![3]);
    assert_eq!(released, 4, "every row left the queue");
    let mut answers = std::mem::take(&mut f.answers).into_iter();
    let kind = |a: Option<(u32, Answer)>| {
        a.expect("an answer")
            .1
            .try_recv()
            .expect("answered")
            .expect_err("refused")
            .kind
    };
    assert_eq!(kind(answers.next()), Kind::Deadline);
    assert_eq!(kind(answers.next()), Kind::DeadlineUnmeetable);
}

#[test]
fn a_batch_takes_every_caller_waiting_whenever_it_came_unless_one_would_make_it_miss() {
    let mut f = Fixture::new();
    f.push(0, Class::default(), 1, 1, 1000);
    let (mut late, answer) = Entry::new(2, 1, f.start + ms(2000), (false, Priority::Standard));
    late.queued_at = f.start + ms(30);
    f.waiting.push(&f.lanes[0], Class::default(), late);
    f.answers.push((2, answer));
    assert_eq!(
        f.next(&f.rule(8)),
        Some((0, vec![1, 2], None)),
        "the slot is free now: a caller that came later joins"
    );

    let mut f = Fixture::new();
    f.push(0, Class::default(), 1, 1, 100);
    f.push(0, Class::default(), 2, 1, 2000);
    let rule = Rule {
        cost: Some(Estimate {
            fixed: ms(80),
            per_row: ms(15),
            samples: 10,
            rms_error: Duration::ZERO,
        }),
        ..f.rule(8)
    };
    // One row costs 95 ms, two 110 ms: the second would make the first miss.
    assert_eq!(f.next(&rule), Some((0, vec![1], Some(Flush::Deadline))));
    assert_eq!(f.next(&rule), Some((0, vec![2], None)));
}

#[test]
fn a_higher_band_arriving_all_the_time_leaves_the_rest_of_each_batch_to_lower_bands() {
    // Critical callers keep coming, each later than the last; standard and sheddable
    // callers came before them. Each batch takes every critical caller, then fills up
    // from the standard band, then the sheddable one.
    let mut f = Fixture::new();
    f.push(0, class(Priority::Standard, 2, 1), 20, 1, 900);
    f.push(0, class(Priority::Sheddable, 3, 1), 30, 1, 900);
    for p in 1..=3 {
        let (mut entry, answer) = Entry::new(p, 1, f.start + ms(500), (false, Priority::Critical));
        entry.queued_at = f.start + ms(u64::from(p) * 40);
        f.waiting.push(&f.lanes[0], class(Priority::Critical, 1, 1), entry);
        f.answers.push((p, answer));
    }
    assert_eq!(f.next(&f.rule(8)), Some((0, vec![1, 2, 3, 20, 30], None)));
}

#[test]
fn a_caller_too_large_for_the_room_left_leads_the_next_batch_and_smaller_ones_fill_this() {
    let mut f = Fixture::new();
    f.push(0, class(Priority::Critical, 1, 1), 1, 5, 100);
    f.push(0, class(Priority::Critical, 1, 1), 2, 4, 200);
    f.push(0, class(Priority::Standard, 2, 1), 3, 2, 300);
    f.push(0, class(Priority::Standard, 2, 1), 4, 2, 400);
    let rule = f.rule(8);
    assert_eq!(
        f.next(&rule),
        Some((0, vec![1, 3], Some(Flush::Full))),
        "4 rows do not fit beside 5; 2 do, and then 2 more would not"
    );
    assert_eq!(
        f.next(&rule),
        Some((0, vec![2, 4], None)),
        "the one passed over goes first"
    );
    assert!(f.waiting.is_empty());
}

#[test]
fn a_full_queue_makes_room_from_the_tenant_longest_beyond_its_share() {
    let mut f = Fixture::new();
    for p in 0..10 {
        f.push(0, class(Priority::Standard, 1, 1), p, 1, 1000 + u64::from(p));
    }
    for p in 100..103 {
        f.push(1, class(Priority::Standard, 2, 1), p, 1, 1000);
    }
    let newcomer = class(Priority::Standard, 3, 1);
    let (evicted, freed) = f.waiting.push_out(&newcomer, 2, 2);
    assert_eq!(
        evicted.iter().map(|e| e.payload).collect::<Vec<_>>(),
        vec![9, 8],
        "the flood's latest"
    );
    assert_eq!(freed, 2);
    let (evicted, _) = f.waiting.push_out(&class(Priority::Standard, 1, 1), 1, 5);
    assert!(evicted.is_empty(), "the longest tenant never evicts a shorter one");
    let (evicted, _) = f.waiting.push_out(&class(Priority::Critical, 3, 1), 1, 5);
    assert!(evicted.is_empty(), "only within the caller's band");
    let weighty = class(Priority::Standard, 2, 8);
    let (evicted, freed) = f.waiting.push_out(&weighty, 8, 100);
    // The caller's tenant would hold 11 rows for weight 8 (1.4 a unit): the flood keeps 1.
    assert_eq!((evicted.len(), freed), (7, 7), "down to the caller's weighted backlog");
}
