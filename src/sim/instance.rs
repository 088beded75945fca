//! Model instances: one OS thread each (`std::thread::sleep` keeps tens-of-µs
//! accuracy where tokio's timer has 1 ms), taking batches FIFO from the model's
//! queue, paused by the [`Gate`] while a test holds the simulator.

use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread;
use std::time::Duration;

use rand::Rng;
use tokio::sync::{oneshot, watch};

use super::{Faults, ModelSpec, Profile, Stats};

/// One batch waiting for an instance.
pub(crate) struct Job {
    pub rows: u64,
    pub reply: oneshot::Sender<Outcome>,
}

/// How a batch ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    Done,
    Fault,
}

/// Stops instances from starting batches while held; closed when the simulator goes.
#[derive(Default)]
pub(crate) struct Gate {
    state: Mutex<GateState>,
    changed: Condvar,
}

#[derive(Default)]
struct GateState {
    held: bool,
    closed: bool,
    /// Every batch fails with an injected fault (see `Simulator::fail`).
    failing: bool,
    /// Every inference request is answered 503 at once (see `Simulator::unavailable`).
    unavailable: bool,
    /// Every batch takes this many times its cost (0 and 1: as its model says).
    slow: u32,
    /// Request bodies larger than this are refused with 413 (0: the simulator's own
    /// limit), as a server started with a smaller input limit refuses them.
    max_body: u64,
    /// Requests refused for their body's size.
    too_large: u64,
    /// What new LLM streams do wrong.
    streams: super::StreamFaults,
}

/// What one instance thread needs.
struct Instance {
    jobs: Arc<Mutex<Receiver<Job>>>,
    gate: Arc<Gate>,
    stats: Arc<watch::Sender<Stats>>,
    profile: Profile,
    jitter: f64,
    faults: Faults,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // The guarded data stays consistent even if a holder panicked.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Gate {
    pub(crate) fn set_held(&self, held: bool) {
        lock(&self.state).held = held;
        self.changed.notify_all();
    }

    pub(crate) fn set_failing(&self, failing: bool) {
        lock(&self.state).failing = failing;
    }

    fn failing(&self) -> bool {
        lock(&self.state).failing
    }

    pub(crate) fn set_unavailable(&self, unavailable: bool) {
        lock(&self.state).unavailable = unavailable;
    }

    /// The faults set from outside (see `sim::server`), as JSON.
    pub(crate) fn faults(&self) -> serde_json::Value {
        let state = lock(&self.state);
        serde_json::json!({"unavailable": state.unavailable, "slow": state.slow.max(1), "max_body_bytes": state.max_body,
            "stall_after_tokens": state.streams.stall_after, "malformed_after_tokens": state.streams.malformed_after})
    }

    pub(crate) fn set_stream_faults(&self, faults: super::StreamFaults) {
        lock(&self.state).streams = faults;
    }

    pub(crate) fn stream_faults(&self) -> super::StreamFaults {
        lock(&self.state).streams
    }

    pub(crate) fn set_max_body(&self, bytes: u64) {
        lock(&self.state).max_body = bytes;
    }

    /// Whether a body of `bytes` is over the limit set from outside (counted if so).
    pub(crate) fn too_large(&self, bytes: u64) -> bool {
        let mut state = lock(&self.state);
        let over = state.max_body > 0 && bytes > state.max_body;
        state.too_large += u64::from(over);
        over
    }

    /// Requests refused so far for their body's size.
    pub(crate) fn refused_too_large(&self) -> u64 {
        lock(&self.state).too_large
    }

    pub(crate) fn unavailable(&self) -> bool {
        lock(&self.state).unavailable
    }

    pub(crate) fn set_slow(&self, factor: u32) {
        lock(&self.state).slow = factor;
    }

    fn slow(&self) -> u32 {
        lock(&self.state).slow.max(1)
    }

    pub(crate) fn close(&self) {
        lock(&self.state).closed = true;
        self.changed.notify_all();
    }

    /// Blocks while held; false once closed.
    fn wait_open(&self) -> bool {
        let state = lock(&self.state);
        let state = self
            .changed
            .wait_while(state, |s| s.held && !s.closed)
            .unwrap_or_else(PoisonError::into_inner);
        !state.closed
    }
}

/// Starts the instance threads of one model; returns the sender of its batch queue.
/// A thread that cannot be spawned is logged and skipped; with none, sends fail and
/// requests are answered 500.
pub(crate) fn spawn(spec: &ModelSpec, gate: &Arc<Gate>, stats: &Arc<watch::Sender<Stats>>) -> mpsc::Sender<Job> {
    let (tx, rx) = mpsc::channel();
    let jobs = Arc::new(Mutex::new(rx));
    for i in 0..spec.instances.max(1) {
        let instance = Instance {
            jobs: Arc::clone(&jobs),
            gate: Arc::clone(gate),
            stats: Arc::clone(stats),
            profile: spec.profile,
            jitter: if spec.jitter > 0.0 { spec.jitter.min(1.0) } else { 0.0 },
            faults: spec.faults,
        };
        let name = format!("sim-{}-{i}", spec.name);
        if let Err(error) = thread::Builder::new().name(name).spawn(move || instance.run()) {
            tracing::error!(model = %spec.name, %error, "cannot start a simulator instance");
        }
    }
    tx
}

impl Instance {
    fn run(self) {
        loop {
            // The lock is released before the job runs, so other instances keep taking jobs.
            let Ok(job) = lock(&self.jobs).recv() else {
                return; // the simulator is gone
            };
            if !self.gate.wait_open() {
                return;
            }
            if job.reply.is_closed() {
                // The client left before its batch started; its handler counted the cancel.
                continue;
            }
            let outcome = self.execute(job.rows);
            let _ = job.reply.send(outcome); // the client may have left meanwhile
        }
    }

    fn execute(&self, rows: u64) -> Outcome {
        let mut rng = rand::rng();
        if self.gate.failing() || rng.random::<f64>() < self.faults.error_rate {
            self.stats.send_modify(|s| s.errors += 1);
            return Outcome::Fault;
        }
        let cost = if rng.random::<f64>() < self.faults.stall_rate {
            self.faults.stall
        } else {
            jittered(self.profile.cost(rows), self.jitter, &mut rng) * self.gate.slow()
        };
        if !cost.is_zero() {
            thread::sleep(cost);
        }
        self.stats.send_modify(|s| {
            s.batches += 1;
            s.rows += rows;
            *s.batch_sizes.entry(rows).or_default() += 1;
        });
        Outcome::Done
    }
}

/// Scales `cost` by a uniform factor in `1 ± jitter` (`jitter` in 0..=1).
fn jittered(cost: Duration, jitter: f64, rng: &mut impl Rng) -> Duration {
    if jitter <= 0.0 {
        return cost;
    }
    let factor = 1.0 + rng.random_range(-jitter..=jitter);
    Duration::try_from_secs_f64(cost.as_secs_f64() * factor).unwrap_or(cost)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_stays_within_its_band() {
        let mut rng = rand::rng();
        let cost = Duration::from_millis(10);
        for _ in 0..1_000 {
            let t = jittered(cost, 0.2, &mut rng);
            assert!(t >= Duration::from_millis(8) && t <= Duration::from_millis(12), "{t:?}");
        }
        assert_eq!(jittered(cost, 0.0, &mut rng), cost);
    }
}
