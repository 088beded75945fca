//! Triton sequences: a stateful model keeps each correlation id's state on the instance
//! that saw its first step, so every step of one sequence goes where its first step went.
//! A pool pins each sequence to an endpoint and sends its steps one at a time, in the
//! order they reached the pool (it asks for a step's turn before it calls); the dispatch
//! pins each sequence to the tier its first step was served by, so later steps with other
//! budgets reach the same pool. A pin is released after the step with `sequence_end`, or
//! once the sequence has been idle for [`IDLE`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

/// How long a sequence with no step keeps its endpoint.
pub(crate) const IDLE: Duration = Duration::from_secs(60);
/// Most sequences a pool keeps pinned at once; past it, idle ones are let go first.
pub(crate) const MAX_LIVE: usize = 100_000;

/// The live sequences of one pool (pinned to an endpoint's index) or of the dispatch
/// (pinned to a tier).
#[derive(Debug)]
pub(crate) struct Sequences<T> {
    live: Mutex<Live<T>>,
}

impl<T> Default for Sequences<T> {
    fn default() -> Self {
        Self {
            live: Mutex::new(Live {
                by_id: HashMap::new(),
                swept: None,
            }),
        }
    }
}

#[derive(Debug)]
struct Live<T> {
    by_id: HashMap<String, Arc<Pinned<T>>>,
    swept: Option<Instant>,
}

/// One live sequence: where it is pinned, whose step may go now, and when it last had one.
#[derive(Debug)]
pub(crate) struct Pinned<T> {
    /// Where its state is: an endpoint's index in the pool, or a tier.
    pub(crate) to: T,
    /// Held by the step being sent: tokio's mutex is fair, so steps go in the order
    /// they asked.
    pub(crate) turn: tokio::sync::Mutex<()>,
    last: Mutex<Instant>,
}

impl<T> Sequences<T> {
    /// The pin of sequence `id`, if it is live.
    pub(crate) fn find(&self, id: &str) -> Option<Arc<Pinned<T>>> {
        let live = self.live.lock().unwrap_or_else(|e| e.into_inner());
        let pinned = live.by_id.get(id)?;
        *pinned.last.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
        Some(pinned.clone())
    }

    /// The pin of sequence `id`, made with `pick`'s answer when the sequence is new;
    /// `None` when [`MAX_LIVE`] sequences are live and none is idle.
    pub(crate) fn pin<E>(&self, id: &str, pick: impl FnOnce() -> Result<T, E>) -> Result<Option<Arc<Pinned<T>>>, E> {
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
            to: pick()?,
            turn: tokio::sync::Mutex::new(()),
            last: Mutex::new(now),
        });
        live.by_id.insert(id.to_owned(), pinned.clone());
        Ok(Some(pinned))
    }

    /// Lets sequence `id` go (its last step was sent), if `pinned` is still its pin.
    pub(crate) fn release(&self, id: &str, pinned: &Arc<Pinned<T>>) {
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

impl<T> Live<T> {
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
        let sequences = Sequences::<usize>::default();
        let first = sequences.pin::<()>("77", || Ok(1)).expect("pinned").expect("room");
        let again = sequences.pin::<()>("77", || Ok(0)).expect("pinned").expect("room");
        assert_eq!((first.to, again.to), (1, 1), "the first step's endpoint");
        assert_eq!(sequences.find("77").map(|p| p.to), Some(1));
        sequences.release("77", &first);
        let fresh = sequences.pin::<()>("77", || Ok(0)).expect("pinned").expect("room");
        assert!(sequences.find("77").is_some_and(|p| Arc::ptr_eq(&p, &fresh)));
        assert_eq!(fresh.to, 0, "released: the next first step picks again");
        drop((first, again, fresh));
        tokio::time::advance(IDLE + Duration::from_secs(1)).await;
        let _other = sequences.pin::<()>("78", || Ok(0)).expect("pinned");
        assert_eq!(sequences.len(), 1, "the idle sequence was let go");
    }

    #[tokio::test]
    async fn steps_take_their_turn_in_the_order_they_asked() {
        let sequences = Arc::new(Sequences::<usize>::default());
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
