//! Readiness: whether this gateway should be sent new work, and if not, why.
//!
//! Beside the doors: `/v2/health/ready` and gRPC `ServerReady` ask [`Readiness::check`].
//! The gateway is not ready while it drains (from the stop signal until it stops
//! accepting), while the offline queue cannot commit (accepted jobs could not be kept),
//! or while every endpoint of one of a route's pools is ejected (every call to it
//! would be refused). Every check sets the `tiergate_ready` and
//! `tiergate_not_ready{reason}` gauges; [`Readiness::run`] keeps them current between
//! probes, so an alert sees what a probe would.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::decision::Tier;
use crate::metrics;
use crate::policy::{Policy, Store};
use crate::queue::{JobStore as _, Queue};
use crate::tiers::{MicroBatch, Realtime};

/// How often [`Readiness::run`] refreshes the gauges.
const REFRESH: Duration = Duration::from_secs(1);

/// What the gateway's readiness depends on.
#[derive(Debug)]
pub struct Readiness {
    draining: AtomicBool,
    queue: Queue,
    realtime: Realtime,
    micro_batch: MicroBatch,
}

/// One reason the gateway is not ready.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotReady {
    /// The gateway is stopping: it still answers, but should be sent nothing new.
    Draining,
    /// The offline queue's last commit failed, with why.
    OfflineStore(String),
    /// Every endpoint of `route`'s `tier` pool is ejected.
    PoolEjected {
        /// The route.
        route: String,
        /// Which of its pools.
        tier: Tier,
    },
}

impl NotReady {
    /// The `reason` label of `tiergate_not_ready`.
    pub fn reason(&self) -> &'static str {
        match self {
            NotReady::Draining => "draining",
            NotReady::OfflineStore(_) => "offline_store",
            NotReady::PoolEjected { .. } => "pool_ejected",
        }
    }

    /// Every `reason` label, so each gauge is exported (as 0) before it is ever 1.
    pub const REASONS: [&'static str; 3] = ["draining", "offline_store", "pool_ejected"];
}

impl std::fmt::Display for NotReady {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NotReady::Draining => f.write_str("the gateway is draining: it is stopping and takes no new work"),
            NotReady::OfflineStore(why) => write!(f, "the offline queue cannot commit: {why}"),
            NotReady::PoolEjected { route, tier } => {
                write!(f, "every endpoint of route {route}'s {} pool is ejected", tier.as_str())
            }
        }
    }
}

impl Readiness {
    /// Readiness over the gateway's offline queue and the pools of its tiers.
    pub fn new(queue: Queue, realtime: Realtime, micro_batch: MicroBatch) -> Arc<Self> {
        Arc::new(Readiness {
            draining: AtomicBool::new(false),
            queue,
            realtime,
            micro_batch,
        })
    }

    /// From now on the gateway is not ready: it is draining.
    pub fn drain(&self) {
        self.draining.store(true, Ordering::Release);
    }

    /// Whether the gateway is draining.
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }

    /// Why the gateway is not ready for `policy`'s routes (empty when it is ready);
    /// sets the readiness gauges.
    pub fn check(&self, policy: &Policy) -> Vec<NotReady> {
        let mut not = Vec::new();
        if self.is_draining() {
            not.push(NotReady::Draining);
        }
        if let Some(why) = self.queue.failing() {
            not.push(NotReady::OfflineStore(why));
        }
        let ejected = |tier, routes: Vec<String>| {
            routes
                .into_iter()
                .map(move |route| NotReady::PoolEjected { route, tier })
        };
        not.extend(ejected(Tier::Realtime, self.realtime.ejected(policy)));
        not.extend(ejected(Tier::MicroBatch, self.micro_batch.ejected(policy)));
        ::metrics::gauge!(metrics::READY).set(if not.is_empty() { 1.0 } else { 0.0 });
        for reason in NotReady::REASONS {
            let on = not.iter().any(|n| n.reason() == reason);
            ::metrics::gauge!(metrics::NOT_READY, "reason" => reason).set(if on { 1.0 } else { 0.0 });
        }
        not
    }

    /// Keeps the readiness gauges current until `shutdown`.
    pub async fn run(self: Arc<Self>, policy: Arc<Store>, shutdown: CancellationToken) -> std::io::Result<()> {
        let mut tick = tokio::time::interval(REFRESH);
        loop {
            tokio::select! {
                _ = tick.tick() => {
                    self.check(&policy.load());
                }
                () = shutdown.cancelled() => return Ok(()),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // in tests a failed unwrap is a failed test

    use super::*;
    use crate::queue::{embedded, Embedded};

    fn policy() -> Policy {
        Policy::from_texts(vec![(
            "p.toml".into(),
            "[routes.r]\nmodels = [\"m\"]\n[routes.r.realtime]\nendpoints = [\"http://127.0.0.1:9\"]\n".into(),
        )])
        .unwrap()
    }

    #[tokio::test]
    async fn an_offline_store_that_cannot_commit_makes_the_gateway_unready_until_it_commits_again() {
        let _one_at_a_time = crate::queue::embedded::ABORTING.lock().await;
        let dir = tempfile::tempdir().unwrap();
        let limits = embedded::Limits {
            max_unfinished: 10,
            writer_nice: 0,
            writer_cpus: Default::default(),
        };
        let store = Embedded::open(dir.path(), limits).unwrap();
        let micro = MicroBatch::new(
            crate::backend::Settings::new(1 << 20),
            CancellationToken::new(),
            None,
            (None, crate::cache::Cache::new()),
            Arc::new(crate::usage::Ledger::in_memory()),
        );
        let ready = Readiness::new(
            Queue::Embedded(store.clone()),
            Realtime::new(crate::backend::Settings::new(1 << 20), None),
            micro,
        );
        let policy = policy();
        assert_eq!(ready.check(&policy), vec![], "ready, with pools never used");

        // SQLite rolls a transaction back on an I/O error or a full disk; so does this.
        let failed = store.abort_a_commit().await;
        assert!(failed.is_err());
        let not = ready.check(&policy);
        assert!(
            matches!(&not[..], [NotReady::OfflineStore(why)] if why.contains("simulated")),
            "{not:?}"
        );
        store.counts().await.unwrap(); // a commit that succeeds
        assert_eq!(ready.check(&policy), vec![]);

        ready.drain();
        assert_eq!(ready.check(&policy), vec![NotReady::Draining]);
    }
}
