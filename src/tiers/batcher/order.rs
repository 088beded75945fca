//! Who a batch pool serves next: the waiting callers of every lane, in the pool's order.
//!
//! Three rules, applied in turn (the order of the Gateway API Inference Extension's flow
//! control, with Triton's per-request deadlines):
//!
//! 1. **Priority bands.** A higher band is always served before a lower one; the lowest
//!    (`sheddable`) is refused first under pressure and evicted to make room (see
//!    [`Waiting::shed`]).
//! 2. **Weighted fair shares between tenants**, within a band: start-time fair queuing
//!    (Goyal, Vin and Cheng, 1996) over rows. Each tenant (a *flow*) has a finish tag; the
//!    flow served next is the one whose next start tag, `max(band clock, finish)`, is
//!    least, and serving `n` of its rows moves its finish tag to `start + n / weight`.
//!    Rows, not requests, are charged, so a tenant sending 64-row requests gets no more
//!    than one sending single rows. A flow that was idle starts at the band's clock and
//!    banks no credit. SFQ rather than deficit round robin: it needs no quantum (rows per
//!    request vary from 1 to `max_batch`), serves a flow as soon as its tag allows rather
//!    than at its turn in a round, and its fairness bound holds for variable-size work.
//! 3. **Earliest deadline first** within a tenant, across the pool's lanes: the lane of
//!    the next batch is the one holding the chosen tenant's most urgent caller (its
//!    deadline less the learned cost of the lane's waiting rows), and a batch is filled
//!    from its lane by the same rules.
//!
//! A caller the learned cost says can no longer be answered in time is answered at once
//! ([`Kind::DeadlineUnmeetable`]) rather than sent; one whose deadline passed gets
//! [`Kind::Deadline`]; one who went away is dropped. Filler (offline work riding on
//! spare room) waits apart, first in first out per lane, and is never counted as a caller.
//!
//! Plain data: the batcher holds it under a lock and does the waiting.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;

use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::error::{Error, Kind};
use crate::policy::Priority;
use crate::tiers::cost::Estimate;

/// Idle flows (no caller waiting, finish tag ahead of the clock) a band keeps before it
/// forgets them all; bounds memory when tenants' names are many.
const MAX_IDLE_FLOWS: usize = 4096;

/// Callers too large for the room left that one batch passes over looking for smaller
/// ones behind them, before it goes as it is: bounds the work of forming one batch.
pub(super) const MAX_PASSED: usize = 32;

/// One caller's place in a batch: its payload, rows, deadline and reply channel.
#[derive(Debug)]
pub struct Entry<T, R> {
    /// What the caller sent.
    pub payload: T,
    /// Its rows (dimension 0).
    pub rows: u64,
    /// What it adds to the batch's request body, in bytes (0: not counted).
    pub bytes: u64,
    /// When its budget runs out.
    pub deadline: Instant,
    /// When it was queued.
    pub queued_at: Instant,
    /// Offline work riding on spare room: never counted in the queue, never delays a
    /// caller (see [`super::Queue::submit_filler`]).
    pub filler: bool,
    /// Its band.
    pub priority: Priority,
    /// Where its answer goes; answered exactly once.
    pub reply: oneshot::Sender<Result<R, Error>>,
}

impl<T, R> Entry<T, R> {
    /// An entry queued now, and where its answer will come.
    pub(super) fn new(
        payload: T,
        rows: u64,
        deadline: Instant,
        (filler, priority): (bool, Priority),
    ) -> (Self, oneshot::Receiver<Result<R, Error>>) {
        let (reply, answer) = oneshot::channel();
        let entry = Entry {
            payload,
            rows,
            bytes: 0,
            deadline,
            queued_at: Instant::now(),
            filler,
            priority,
            reply,
        };
        (entry, answer)
    }

    /// Answers it with a failure of `kind`.
    pub(super) fn refuse(self, error: Error) {
        let _ = self.reply.send(Err(error));
    }
}

/// Whom a caller's rows are charged to and in which band it waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Class {
    /// Its band.
    pub priority: Priority,
    /// Its tenant, as a hash (tenants with the same hash share one flow).
    pub flow: u64,
    /// Its tenant's weight in the fair share (at least 1).
    pub weight: u32,
}

impl Default for Class {
    /// The default band, the anonymous tenant, weight 1.
    fn default() -> Self {
        Class {
            priority: Priority::Standard,
            flow: 0,
            weight: 1,
        }
    }
}

/// Why a batch stopped growing and went out (the `reason` label of the flush metric).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flush {
    /// It reached the batch size, or the next caller would not fit.
    Full,
    /// A backend slot was free and nobody else was waiting in its lane.
    IdleBackend,
    /// One more caller would make the batch's earliest deadline miss under the learned cost.
    Deadline,
}

impl Flush {
    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Flush::Full => "full",
            Flush::IdleBackend => "idle_backend",
            Flush::Deadline => "deadline",
        }
    }
}

/// What bounds the batch being formed.
#[derive(Debug, Clone, Copy)]
pub(super) struct Rule {
    /// The time the batch goes out.
    pub now: Instant,
    /// Most rows it may carry (the progressive batch size).
    pub limit: u64,
    /// Most bytes of request body it may carry (a caller alone may carry more).
    pub max_bytes: u64,
    /// The pool's learned cost, once known.
    pub cost: Option<Estimate>,
}

/// A formed batch: its callers and why it stopped growing.
pub(super) struct Formed<L, T, R> {
    /// The lane it goes to.
    pub lane: Arc<L>,
    /// Its callers, in the order they were chosen.
    pub entries: Vec<Entry<T, R>>,
    /// Why it stopped growing, if anything stopped it.
    pub sealed: Option<Flush>,
}

/// A lane's identity while it has anyone waiting: the address of its `Arc`.
type LaneId = usize;

fn id_of<L>(lane: &Arc<L>) -> LaneId {
    Arc::as_ptr(lane) as *const () as usize
}

/// A lane with callers or filler waiting.
struct LaneState<L> {
    lane: Arc<L>,
    /// Callers' rows waiting in it.
    rows: u64,
}

/// Callers by deadline, then arrival.
type ByDeadline<T, R> = BTreeMap<(Instant, u64), Entry<T, R>>;

/// A tenant's callers in one band.
struct Flow<T, R> {
    /// Its finish tag: where its next start tag begins.
    finish: f64,
    weight: f64,
    /// Callers' rows waiting.
    rows: u64,
    /// Its callers by lane, earliest deadline first (ties in arrival order).
    lanes: HashMap<LaneId, ByDeadline<T, R>>,
}

impl<T, R> Flow<T, R> {
    fn start(&self, clock: f64) -> f64 {
        self.finish.max(clock)
    }

    /// The key of its most urgent caller in `lane`, leaving out those `passed` over.
    fn head_in(&self, lane: LaneId, passed: &[(Instant, u64)]) -> Option<(Instant, u64)> {
        let callers = self.lanes.get(&lane)?;
        callers.keys().find(|k| !passed.contains(k)).copied()
    }
}

/// One band's flows and its virtual clock.
struct Band<T, R> {
    /// The start tag of the last rows served (monotone while the band is busy).
    clock: f64,
    rows: u64,
    flows: HashMap<u64, Flow<T, R>>,
}

impl<T, R> Default for Band<T, R> {
    fn default() -> Self {
        Band {
            clock: 0.0,
            rows: 0,
            flows: HashMap::new(),
        }
    }
}

impl<T, R> Band<T, R> {
    /// The flow served next among those with a caller in `lane` (any lane when `None`)
    /// other than those `passed` over: least start tag, then earliest deadline.
    fn next_flow(&self, lane: Option<LaneId>, passed: &[(Instant, u64)]) -> Option<u64> {
        let mut best: Option<(f64, (Instant, u64), u64)> = None;
        for (&key, flow) in &self.flows {
            let head = match lane {
                Some(lane) => flow.head_in(lane, passed),
                None => flow
                    .lanes
                    .values()
                    .filter_map(|m| m.first_key_value().map(|(k, _)| *k))
                    .min(),
            };
            let Some(head) = head else { continue };
            let start = flow.start(self.clock);
            let better = best.as_ref().is_none_or(|(s, h, _)| (start, head) < (*s, *h));
            if better {
                best = Some((start, head, key));
            }
        }
        best.map(|(_, _, key)| key)
    }

    /// Takes `key` out of `flow`'s callers in `lane`, charging its rows to the flow
    /// when `charge`; forgets what no longer needs remembering.
    fn remove(&mut self, flow: u64, lane: LaneId, key: (Instant, u64), charge: bool) -> Option<Entry<T, R>> {
        let f = self.flows.get_mut(&flow)?;
        let lane_entries = f.lanes.get_mut(&lane)?;
        let entry = lane_entries.remove(&key)?;
        if lane_entries.is_empty() {
            f.lanes.remove(&lane);
        }
        if charge {
            let start = f.start(self.clock);
            f.finish = start + entry.rows as f64 / f.weight;
            self.clock = self.clock.max(start);
        }
        f.rows -= entry.rows;
        self.rows -= entry.rows;
        if f.rows == 0 && f.finish <= self.clock {
            self.flows.remove(&flow);
        }
        if self.rows == 0 {
            // Nobody waits in the band: no flow is owed anything.
            self.flows.clear();
            self.clock = 0.0;
        } else if self.flows.len() > MAX_IDLE_FLOWS {
            self.flows.retain(|_, f| f.rows > 0);
        }
        Some(entry)
    }
}

/// Every caller and filler waiting for a batch pool, in the pool's order.
pub(super) struct Waiting<L, T, R> {
    /// By [`Priority::index`].
    bands: [Band<T, R>; 3],
    lanes: HashMap<LaneId, LaneState<L>>,
    /// Filler entries by lane, in arrival order.
    fillers: HashMap<LaneId, VecDeque<Entry<T, R>>>,
    /// Arrival counter: breaks deadline ties in arrival order.
    seq: u64,
}

impl<L, T, R> Default for Waiting<L, T, R> {
    fn default() -> Self {
        Waiting {
            bands: Default::default(),
            lanes: HashMap::new(),
            fillers: HashMap::new(),
            seq: 0,
        }
    }
}

impl<L, T, R> Waiting<L, T, R> {
    /// Callers' rows waiting.
    pub fn rows(&self) -> u64 {
        self.bands.iter().map(|b| b.rows).sum()
    }

    /// Callers' rows waiting by band and tenant: `(band, flow, weight, rows)` for each
    /// flow with rows, highest band first.
    pub fn by_flow(&self) -> Vec<(Priority, u64, f64, u64)> {
        let mut out = Vec::new();
        for priority in Priority::ALL {
            for (&flow, f) in &self.bands[priority.index()].flows {
                if f.rows > 0 {
                    out.push((priority, flow, f.weight, f.rows));
                }
            }
        }
        out
    }

    /// Whether no caller and no filler waits.
    pub fn is_empty(&self) -> bool {
        self.lanes.is_empty()
    }

    /// Whether filler waits.
    pub fn has_filler(&self) -> bool {
        !self.fillers.is_empty()
    }

    /// Queues `entry` in `lane`, charged as `class` (filler waits apart).
    pub fn push(&mut self, lane: &Arc<L>, class: Class, entry: Entry<T, R>) {
        let id = id_of(lane);
        let state = self.lanes.entry(id).or_insert_with(|| LaneState {
            lane: lane.clone(),
            rows: 0,
        });
        if entry.filler {
            self.fillers.entry(id).or_default().push_back(entry);
            return;
        }
        state.rows += entry.rows;
        let band = &mut self.bands[class.priority.index()];
        let clock = band.clock;
        band.rows += entry.rows;
        let flow = band.flows.entry(class.flow).or_insert_with(|| Flow {
            finish: clock,
            weight: 1.0,
            rows: 0,
            lanes: HashMap::new(),
        });
        flow.weight = f64::from(class.weight.max(1));
        flow.rows += entry.rows;
        self.seq += 1;
        flow.lanes
            .entry(id)
            .or_default()
            .insert((entry.deadline, self.seq), entry);
    }

    /// Rows that would be served before a new caller of `class` with `rows` rows due by
    /// `deadline`, its own included: every higher band's, its own tenant's that are due
    /// no later, and of each other tenant in its band the share that tenant's weight
    /// earns while this one's rows go.
    pub fn ahead(&self, class: &Class, rows: u64, deadline: Instant) -> u64 {
        let higher: u64 = self.bands[class.priority.index() + 1..].iter().map(|b| b.rows).sum();
        let band = &self.bands[class.priority.index()];
        let due_before = |f: &Flow<T, R>| -> u64 {
            f.lanes
                .values()
                .flat_map(|m| m.range(..=(deadline, u64::MAX)).map(|(_, e)| e.rows))
                .sum()
        };
        let own = band.flows.get(&class.flow).map_or(0, due_before) + rows;
        let weight = f64::from(class.weight.max(1));
        let others: u64 = band
            .flows
            .iter()
            .filter(|(key, _)| **key != class.flow)
            .map(|(_, f)| f.rows.min((own as f64 * f.weight / weight).ceil() as u64))
            .sum();
        higher + own + others
    }

    /// Evicts sheddable callers, latest deadline first, until at least `rows` rows are
    /// free or none is left; returns them (to be answered) and the rows freed.
    pub fn shed(&mut self, rows: u64) -> (Vec<Entry<T, R>>, u64) {
        let mut shed = Vec::new();
        let mut freed = 0;
        while freed < rows {
            let band = &self.bands[Priority::Sheddable.index()];
            let last = band
                .flows
                .iter()
                .flat_map(|(&flow, f)| {
                    f.lanes
                        .iter()
                        .filter_map(move |(&lane, m)| m.last_key_value().map(|(k, _)| (*k, flow, lane)))
                })
                .max();
            let Some((key, flow, lane)) = last else { break };
            let Some(entry) = self.take_out(Priority::Sheddable, flow, lane, key, false) else {
                break;
            };
            freed += entry.rows;
            shed.push(entry);
        }
        (shed, freed)
    }

    /// Makes room for a caller of `class` with `rows` rows in a full queue by evicting
    /// from the tenant of its band with the longest backlog for its weight (longest queue
    /// drop), latest deadline first, while that tenant's weighted backlog stays longer
    /// than the caller's own would be; so a flood fills the queue only until someone
    /// else needs its share. Returns the evicted (to be answered) and the rows freed,
    /// which stop at `needed` or when no tenant is longer.
    pub fn push_out(&mut self, class: &Class, rows: u64, needed: u64) -> (Vec<Entry<T, R>>, u64) {
        let mut evicted = Vec::new();
        let mut freed = 0;
        let own_weight = f64::from(class.weight.max(1));
        while freed < needed {
            let band = &self.bands[class.priority.index()];
            let own = (band.flows.get(&class.flow).map_or(0, |f| f.rows) + rows) as f64 / own_weight;
            let longest = band
                .flows
                .iter()
                .filter(|(&key, f)| key != class.flow && f.rows > 0)
                .map(|(&key, f)| (f.rows as f64 / f.weight, key))
                .max_by(|a, b| a.0.total_cmp(&b.0));
            let Some((_, flow)) = longest.filter(|(backlog, _)| *backlog > own) else {
                break;
            };
            let last = band.flows[&flow]
                .lanes
                .iter()
                .filter_map(|(&lane, m)| m.last_key_value().map(|(k, _)| (*k, lane)))
                .max();
            let Some((key, lane)) = last else { break };
            let Some(entry) = self.take_out(class.priority, flow, lane, key, false) else {
                break;
            };
            freed += entry.rows;
            evicted.push(entry);
        }
        (evicted, freed)
    }

    /// The lane the next batch goes to: the one holding the most urgent caller of the
    /// tenant served next in the highest band with anyone waiting.
    pub fn next_lane(&self, rule: &Rule) -> Option<LaneId> {
        let band = Priority::ALL
            .iter()
            .map(|p| &self.bands[p.index()])
            .find(|b| b.rows > 0)?;
        let flow = &band.flows[&band.next_flow(None, &[])?];
        flow.lanes
            .iter()
            .filter_map(|(&lane, m)| m.first_key_value().map(|(k, _)| (lane, k.0)))
            .min_by_key(|&(lane, deadline)| {
                // Less the time its batch would take: a bigger batch must start sooner.
                let rows = self.lanes.get(&lane).map_or(0, |s| s.rows.min(rule.limit));
                let cost = rule.cost.map(|c| c.predict(rows)).unwrap_or_default();
                (deadline.checked_sub(cost).unwrap_or(deadline), deadline)
            })
            .map(|(lane, _)| lane)
    }

    /// Forms `lane`'s next batch under `rule`, in the pool's order, answering callers
    /// who cannot be served in time as it meets them; returns it (possibly empty) and the
    /// callers' rows it took out of the queue (sent or answered).
    ///
    /// Every caller waiting in the lane may join, whenever it came: the batch goes now
    /// (a slot is free), so taking one more delays nobody but through the batch's cost,
    /// which the deadline rule bounds. A caller that cannot join is passed over, not a
    /// reason to stop: one too large for the room left leads a later batch, one that
    /// would make the batch's earliest deadline (or its own) miss waits for a smaller
    /// one, and the callers behind it in the pool's order (a lower band's among them)
    /// fill this one.
    pub fn form(&mut self, lane: LaneId, rule: &Rule) -> (Option<Formed<L, T, R>>, u64) {
        let Some(state) = self.lanes.get(&lane) else {
            return (None, 0);
        };
        let handle = state.lane.clone();
        let mut entries: Vec<Entry<T, R>> = Vec::new();
        let mut passed: Vec<(Instant, u64)> = Vec::new();
        let (mut rows, mut bytes, mut released) = (0u64, 0u64, 0u64);
        let mut earliest: Option<Instant> = None;
        let mut sealed = None;
        while let Some((priority, flow, key)) = self.next_in(lane, &passed) {
            let entry = self.peek(priority, flow, lane, key);
            let (entry_rows, deadline, queued_at) = (entry.rows, entry.deadline, entry.queued_at);
            let entry_bytes = entry.bytes;
            let departed = entry.reply.is_closed();
            let doomed = rule.cost.map(|c| rule.now + c.predict(entry_rows) > deadline);
            if departed || deadline <= rule.now || doomed == Some(true) {
                let entry = self.take_out(priority, flow, lane, key, false).expect("peeked");
                released += entry_rows;
                if !departed {
                    refuse_late(entry, rule.now, queued_at); // nothing to answer when it left
                }
                continue;
            }
            if !entries.is_empty() {
                let full = rows + entry_rows > rule.limit || bytes.saturating_add(entry_bytes) > rule.max_bytes;
                // Too late for this batch: it would make the batch's earliest deadline, or
                // its own, miss under the learned cost (while the batch makes it without).
                let late = rule.cost.is_some_and(|c| {
                    let earliest = earliest.unwrap_or(deadline);
                    rule.now + c.predict(rows) <= earliest
                        && rule.now + c.predict(rows + entry_rows) > earliest.min(deadline)
                });
                if full || late {
                    // Passed over, not a reason to stop: callers behind it may fit.
                    sealed = Some(if full { Flush::Full } else { Flush::Deadline });
                    if passed.len() < MAX_PASSED {
                        passed.push(key);
                        continue;
                    }
                    break;
                }
            }
            let entry = self.take_out(priority, flow, lane, key, true).expect("peeked");
            released += entry_rows;
            rows += entry_rows;
            bytes = bytes.saturating_add(entry_bytes);
            earliest = Some(earliest.map_or(deadline, |e| e.min(deadline)));
            entries.push(entry);
            if rows >= rule.limit || bytes >= rule.max_bytes {
                sealed = Some(Flush::Full);
                break;
            }
        }
        let formed = (!entries.is_empty()).then(|| Formed {
            lane: handle,
            entries,
            sealed,
        });
        (formed, released)
    }

    /// The next caller of `lane` in the pool's order, other than those `passed` over:
    /// its band, flow and key.
    fn next_in(&self, lane: LaneId, passed: &[(Instant, u64)]) -> Option<(Priority, u64, (Instant, u64))> {
        if self.lanes.get(&lane).is_none_or(|s| s.rows == 0) {
            return None;
        }
        Priority::ALL.into_iter().find_map(|priority| {
            let band = &self.bands[priority.index()];
            let flow = band.next_flow(Some(lane), passed)?;
            let key = band.flows[&flow].head_in(lane, passed)?;
            Some((priority, flow, key))
        })
    }

    fn peek(&self, priority: Priority, flow: u64, lane: LaneId, key: (Instant, u64)) -> &Entry<T, R> {
        &self.bands[priority.index()].flows[&flow].lanes[&lane][&key]
    }

    /// Takes one caller out (charged to its flow when `charge`), keeping the lane's
    /// count; a lane with nobody left is forgotten.
    fn take_out(
        &mut self,
        priority: Priority,
        flow: u64,
        lane: LaneId,
        key: (Instant, u64),
        charge: bool,
    ) -> Option<Entry<T, R>> {
        let entry = self.bands[priority.index()].remove(flow, lane, key, charge)?;
        if let Some(state) = self.lanes.get_mut(&lane) {
            state.rows -= entry.rows;
        }
        self.forget_if_idle(lane);
        Some(entry)
    }

    fn forget_if_idle(&mut self, lane: LaneId) {
        let idle = self.lanes.get(&lane).is_some_and(|s| s.rows == 0) && !self.fillers.contains_key(&lane);
        if idle {
            self.lanes.remove(&lane);
        }
    }

    /// The lane whose oldest filler waited longest, if any filler waits.
    pub fn filler_lane(&self) -> Option<LaneId> {
        self.fillers
            .iter()
            .filter_map(|(&lane, q)| q.front().map(|e| (e.queued_at, lane)))
            .min()
            .map(|(_, lane)| lane)
    }

    /// A batch of `lane`'s filler alone, up to `limit` rows and `max_bytes` bytes
    /// (callers are quiet).
    pub fn form_filler(&mut self, lane: LaneId, (limit, max_bytes): (u64, u64)) -> Option<Formed<L, T, R>> {
        let handle = self.lanes.get(&lane)?.lane.clone();
        let mut entries = Vec::new();
        self.top_up(lane, &mut entries, |rows, bytes| rows <= limit && bytes <= max_bytes);
        (!entries.is_empty()).then_some(Formed {
            lane: handle,
            entries,
            sealed: None,
        })
    }

    /// Adds `lane`'s filler, in arrival order, to `entries` while `fits(rows, bytes)`
    /// holds for the batch with it (the first always goes into an empty batch). Filler
    /// whose caller went away is dropped; filler past its deadline is answered.
    pub fn top_up(&mut self, lane: LaneId, entries: &mut Vec<Entry<T, R>>, fits: impl Fn(u64, u64) -> bool) {
        let mut rows: u64 = entries.iter().map(|e| e.rows).sum();
        let mut bytes: u64 = entries.iter().map(|e| e.bytes).sum();
        let now = Instant::now();
        if let Some(queue) = self.fillers.get_mut(&lane) {
            while let Some(entry) = queue.front() {
                if entry.reply.is_closed() || entry.deadline <= now {
                    let entry = queue.pop_front().expect("front");
                    if !entry.reply.is_closed() {
                        entry.refuse(Error::new(
                            Kind::Deadline,
                            "the budget ran out while the request waited for its batch",
                        ));
                    }
                    continue;
                }
                if !entries.is_empty() && !fits(rows + entry.rows, bytes.saturating_add(entry.bytes)) {
                    break;
                }
                let entry = queue.pop_front().expect("front");
                rows += entry.rows;
                bytes = bytes.saturating_add(entry.bytes);
                entries.push(entry);
            }
            if queue.is_empty() {
                self.fillers.remove(&lane);
            }
        }
        self.forget_if_idle(lane);
    }

    /// Everything waiting, callers and filler, emptied out; and the callers' rows.
    pub fn drain(&mut self) -> (Vec<Entry<T, R>>, u64) {
        let rows = self.rows();
        let mut all = Vec::new();
        for band in &mut self.bands {
            for (_, flow) in band.flows.drain() {
                all.extend(flow.lanes.into_values().flat_map(BTreeMap::into_values));
            }
            band.rows = 0;
            band.clock = 0.0;
        }
        for (_, queue) in self.fillers.drain() {
            all.extend(queue);
        }
        self.lanes.clear();
        (all, rows)
    }
}

/// Answers a caller taken out at `now` because its deadline passed, or because the
/// learned cost says it can no longer be met (it waited since `queued_at`).
fn refuse_late<T, R>(entry: Entry<T, R>, now: Instant, queued_at: Instant) {
    let error = match entry.deadline <= now {
        true => Error::new(
            Kind::Deadline,
            "the budget ran out while the request waited for its batch",
        ),
        false => Error::new(
            Kind::DeadlineUnmeetable,
            format!(
                "deadline unmeetable: learned cost of a batch > {:.1} ms left of the budget (the request waited \
                 {:.1} ms); send a larger budget or retry later",
                entry.deadline.saturating_duration_since(now).as_secs_f64() * 1e3,
                now.saturating_duration_since(queued_at).as_secs_f64() * 1e3,
            ),
        )
        .knob("deadline"),
    };
    entry.refuse(error);
}

#[cfg(test)]
mod tests;
