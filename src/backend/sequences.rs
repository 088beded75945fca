//! Triton sequences on a pool: a stateful model keeps each correlation id's state on the
//! instance that saw its first step, so every step of one sequence goes to the endpoint
//! its first step went to, one at a time, in the order the steps reached the pool. The
//! pin is released after the step with `sequence_end`, or once the sequence has been
//! idle for [`IDLE`]. Beside the pool, which asks for a step's turn before it calls.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

/// How long a sequence with no step keeps its endpoint.
pub(super) const IDLE: Duration = Duration::from_secs(60);
/// Most sequences a pool keeps pinned at once; past it, idle ones are let go first.
pub(super) const MAX_LIVE: usize = 100_000;

/// The live sequences of one pool.
#[derive(Debug, Default)]
pub(super) struct Sequences {
    live: Mutex<Live>,
}

#[derive(Debug, Default)]
struct Live {
    by_id: HashMap<String, Arc<Pinned>>,
    swept: Option<Instant>,
}

/// One live sequence: its endpoint, whose step may go now, and when it last had one.
#[derive(Debug)]
pub(super) struct Pinned {
    /// The endpoint (index in the pool) holding its state.
    pub(super) endpoint: usize,
    /// Held by the step being sent: tokio's mutex is fair, so steps go in the order
    /// they asked.
    pub(super) turn: tokio::sync::Mutex<()>,
    last: Mutex<Instant>,
}

impl Sequences {
    /// The pin of sequence `id`, made with `pick`'s endpoint when the sequence is new;
    /// `None` when [`MAX_LIVE`] sequences are live and none is idle.
    pub(super) fn pin<E>(&self, id: &str, pick: impl FnOnce() -> Result<usize, E>) -> Result<Option<Arc<Pinned>>, E> {
        let now = Instant::now();
        let mut live = self.live.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(pinned) = live.by_id.get(id) {
            *pinned.last.lock().unwrap_or_else(|e| e.into_inner()) = now;
            return Ok(Some(pinned.clone()));
        }
        if live.by_id.len() >= MAX_LIVE || live.swept.is_none_or(|at| now.duration_since(at) >= IDLE / 4) {
            live.sweep(now);
        }
        if live.by_id.len() >= MAX_LIVE {
            return Ok(None);
        }
        let pinned = Arc::new(Pinned {
            endpoint: pick()?,
            turn: tokio::sync::Mutex::new(()),
            last: Mutex::new(now),
        });
        live.by_id.insert(id.to_owned(), pinned.clone());
        Ok(Some(pinned))
    }

    /// Lets sequence `id` go (its last step was sent), if `pinned` is still its pin.
    pub(super) fn release(&self, id: &str, pinned: &Arc<Pinned>) {
        let mut live = self.live.lock().unwrap_or_else(|e| e.into_inner());
        if live.by_id.get(id).is_some_and(|p| Arc::ptr_eq(p, pinned)) {
            live.by_id.remove(id);
        }
    }

    /// How many sequences are pinned now.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.live.lock().unwrap_or_else(|e| e.into_inner()).by_id.len()
    }
}

impl Live {
    /// Lets go of the sequences idle for [`IDLE`] whose no step is waiting or in flight.
    fn sweep(&mut self, now: Instant) {
        self.by_id.retain(|_, pinned| {
            let idle = now.duration_since(*pinned.last.lock().unwrap_or_else(|e| e.into_inner())) >= IDLE;
            !(idle && Arc::strong_count(pinned) == 1)
        });
        self.swept = Some(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_sequence_keeps_its_endpoint_until_released_or_idle() {
        let sequences = Sequences::default();
        let first = sequences.pin::<()>("77", || Ok(1)).expect("pinned").expect("room");
        let again = sequences.pin::<()>("77", || Ok(0)).expect("pinned").expect("room");
        assert_eq!((first.endpoint, again.endpoint), (1, 1), "the first step's endpoint");
        sequences.release("77", &first);
        let fresh = sequences.pin::<()>("77", || Ok(0)).expect("pinned").expect("room");
        assert_eq!(fresh.endpoint, 0, "released: the next first step picks again");
        drop((first, again, fresh));
        tokio::time::advance(IDLE + Duration::from_secs(1)).await;
        let _other = sequences.pin::<()>("78", || Ok(0)).expect("pinned");
        assert_eq!(sequences.len(), 1, "the idle sequence was let go");
    }

    #[tokio::test]
    async fn steps_take_their_turn_in_the_order_they_asked() {
        let sequences = Arc::new(Sequences::default());
        let pinned = sequences.pin::<()>("s", || Ok(0)).expect("pinned").expect("room");
        let first = pinned.turn.lock().await;
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut waiting = Vec::new();
        for step in 0..5 {
            let (pinned, order) = (pinned.clone(), order.clone());
            waiting.push(tokio::spawn(async move {
                let _turn = pinned.turn.lock().await;
                order.lock().expect("not poisoned").push(step);
            }));
            // Each step asks before the next is spawned.
            tokio::task::yield_now().await;
        }
        drop(first);
        for w in waiting {
            w.await.expect("task");
        }
        assert_eq!(*order.lock().expect("not poisoned"), [0, 1, 2, 3, 4]);
    }
}
