//! The capacity signal: how many endpoints each pool needs for the load it sees.
//!
//! Per pool (a route's real-time or batch pool), over the policy's window (30 s by
//! default): the arrival rate of requests (every request that reached the tier, the
//! refused ones too) times what one served request cost its backends (the backend time
//! the ledger charged, so a micro-batch's share of its batch, a cached row nothing),
//! divided by the busy share an endpoint should have (`target_utilisation`, 0.7 by
//! default) and the calls one endpoint runs at once (`calls_per_endpoint`):
//!
//! `needed = arrivals/s × cost per request ÷ (target × calls per endpoint)`
//!
//! A request's cost is its measured time, at most what the pool's endpoints had to give
//! each request answered (`healthy × calls per endpoint × window ÷ answered`): past its
//! capacity a pool measures its callers' wait at the backend too (and calls that timed
//! out there), and counting it would ask for endpoints the load does not need.
//!
//! A pool that refused requests for its capacity (full, queue full, deadline
//! unmeetable) in the window needs at least one endpoint more than it has healthy,
//! whatever the arithmetic says: queueing broke budgets even under the target.
//! Exported as `tiergate_endpoints_needed{route,tier}` beside
//! `tiergate_endpoints_healthy{route,tier}`; an autoscaler (KEDA, an HPA on an external
//! metric) scales the pool's Deployment on it. Offline rows ride spare capacity and
//! are left out: a pool is never grown for them.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use super::{Field, Figures, Source};
use crate::policy::usage::Capacity;

/// One pool, as the capacity signal needs to know it.
#[derive(Debug, Clone)]
pub struct Pool {
    /// Its route.
    pub route: Arc<str>,
    /// Its tier's source (`Realtime` or `MicroBatch`).
    pub source: Source,
    /// Its endpoints not ejected now.
    pub healthy: usize,
    /// How its signal is worked out.
    pub capacity: Capacity,
}

/// Where the signal learns which pools there are.
pub trait Pools: Send + Sync {
    /// Every pool of the running policy.
    fn pools(&self) -> Vec<Pool>;
}

/// One pool's signal now.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Need {
    /// Endpoints the load needs.
    pub needed: f64,
    /// Endpoints not ejected now.
    pub healthy: usize,
    /// Requests arriving per second, over the window.
    pub arrivals_per_second: f64,
    /// Backend seconds one served request cost, over the window; `None`: none served.
    pub cost_seconds: Option<f64>,
    /// Requests refused for the pool's capacity in the window.
    pub refused: u64,
    /// The seconds the figures span (the window, or less just after start).
    pub seconds: u64,
}

/// A tick's sample: arrivals, refused, served (refused or not, failed or not), answered
/// (of them, those that got their answer), backend ns.
type Sample = [u64; 5];

struct Window {
    samples: VecDeque<Sample>,
    need: Option<Need>,
    /// `tiergate_endpoints_needed` and `tiergate_endpoints_healthy` of the pool.
    gauges: [::metrics::Gauge; 2],
}

impl std::fmt::Debug for Window {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Window")
            .field("need", &self.need)
            .finish_non_exhaustive()
    }
}

/// Every pool's signal (kept by the ledger, fed every tick).
#[derive(Debug, Default)]
pub struct Signals {
    pools: Mutex<super::Fast<(Arc<str>, Source), Window>>,
}

impl Signals {
    /// One tick's figures (`drained`, per route and source) for `pools`: each pool's
    /// window moves on a tick and its signal is worked out again and exported.
    pub fn tick(&self, drained: &[(Arc<str>, Source, Figures)], pools: &dyn Pools) {
        let mut windows = self.pools.lock().unwrap_or_else(|e| e.into_inner());
        let pools = pools.pools();
        windows.retain(|(route, source), _| pools.iter().any(|p| p.route == *route && p.source == *source));
        for pool in pools {
            let figures = drained
                .iter()
                .find(|(r, s, _)| *r == pool.route && *s == pool.source)
                .map(|(_, _, f)| *f)
                .unwrap_or_default();
            let window = windows
                .entry((pool.route.clone(), pool.source))
                .or_insert_with(|| Window {
                    samples: VecDeque::new(),
                    need: None,
                    gauges: crate::metrics::endpoints(&pool.route, pool.source.as_str()),
                });
            let requests = figures.get(Field::Requests);
            let refused = figures.get(Field::Refused);
            let served = requests.saturating_sub(refused);
            // A real-time request answered counts a row; a micro-batch request, its rows.
            let answered = figures.get(Field::Rows).min(served);
            window
                .samples
                .push_back([requests, refused, served, answered, figures.get(Field::UsedNs)]);
            let keep = usize::try_from(pool.capacity.window.as_secs().div_ceil(super::TICK.as_secs()))
                .unwrap_or(usize::MAX)
                .max(1);
            while window.samples.len() > keep {
                window.samples.pop_front();
            }
            let need = need(&window.samples, &pool, window.need.and_then(|n| n.cost_seconds));
            window.gauges[0].set(need.needed);
            window.gauges[1].set(pool.healthy as f64);
            window.need = Some(need);
        }
    }

    /// `route`'s pool for `source`: its signal now, if it has one.
    pub fn need(&self, route: &str, source: Source) -> Option<Need> {
        let windows = self.pools.lock().unwrap_or_else(|e| e.into_inner());
        windows
            .iter()
            .find(|((r, s), _)| &**r == route && *s == source)
            .and_then(|(_, w)| w.need)
    }

    /// Every pool's signal now.
    pub fn all(&self) -> Vec<(String, Source, Need)> {
        let windows = self.pools.lock().unwrap_or_else(|e| e.into_inner());
        let mut all: Vec<_> = windows
            .iter()
            .filter_map(|((r, s), w)| Some((r.to_string(), *s, w.need?)))
            .collect();
        all.sort_by(|a, b| (&a.0, a.1).cmp(&(&b.0, b.1)));
        all
    }
}

/// The signal of `pool` from its window's `samples`; a window that served nothing
/// keeps the cost last seen (`last_cost`), so a pool refusing everything still needs some.
fn need(samples: &VecDeque<Sample>, pool: &Pool, last_cost: Option<f64>) -> Need {
    let mut sum = [0u64; 5];
    for sample in samples {
        for (total, value) in sum.iter_mut().zip(sample) {
            *total = total.saturating_add(*value);
        }
    }
    let [arrivals, refused, served, answered, used_ns] = sum;
    let seconds = samples.len().max(1) as u64 * super::TICK.as_secs();
    let arrivals_per_second = arrivals as f64 / seconds as f64;
    // What a served request cost: its measured time, but never more than the pool's
    // endpoints had to give each one answered (`healthy × calls per endpoint × window ÷
    // answered`): a pool past its capacity measures its callers' wait at the backend
    // too, and calls that timed out there, which no more endpoints' worth of work is.
    let cost_seconds = match served {
        0 => last_cost,
        n => {
            let measured = used_ns as f64 / 1e9 / n as f64;
            let busy = (pool.healthy.max(1) as f64) * f64::from(pool.capacity.calls_per_endpoint) * seconds as f64;
            Some(match answered {
                0 => measured,
                a => measured.min(busy / a as f64),
            })
        }
    };
    let per_endpoint = pool.capacity.target_utilisation * f64::from(pool.capacity.calls_per_endpoint);
    let mut needed = arrivals_per_second * cost_seconds.unwrap_or(0.0) / per_endpoint;
    if refused > 0 {
        needed = needed.max(pool.healthy as f64 + 1.0);
    }
    Need {
        needed,
        healthy: pool.healthy,
        arrivals_per_second,
        cost_seconds,
        refused,
        seconds,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    struct One(Pool);

    impl Pools for One {
        fn pools(&self) -> Vec<Pool> {
            vec![self.0.clone()]
        }
    }

    fn pool(window: u64, healthy: usize) -> One {
        One(Pool {
            route: Arc::from("r"),
            source: Source::MicroBatch,
            healthy,
            capacity: Capacity {
                target_utilisation: 0.5,
                window: Duration::from_secs(window),
                calls_per_endpoint: 1,
            },
        })
    }

    fn tick(signals: &Signals, pools: &One, requests: u64, refused: u64, used_ms: u64) {
        // Every request served answered, one row each.
        let figures = Figures::default()
            .with(Field::Requests, requests)
            .with(Field::Refused, refused)
            .with(Field::Rows, requests - refused)
            .with(Field::UsedNs, used_ms * 1_000_000);
        signals.tick(&[(Arc::from("r"), Source::MicroBatch, figures)], pools);
    }

    /// `per_second` for a tick's length.
    fn per_tick(per_second: u64) -> u64 {
        per_second * crate::usage::TICK.as_secs()
    }

    #[test]
    fn is_rate_times_cost_over_target() {
        let (signals, pools) = (Signals::default(), pool(10, 16));
        // 100 requests a second at 10 ms each: one endpoint busy, two at 0.5.
        for _ in 0..10 {
            tick(&signals, &pools, per_tick(100), 0, per_tick(1_000));
        }
        let need = signals.need("r", Source::MicroBatch).expect("signal");
        assert!((need.needed - 2.0).abs() < 1e-9, "{need:?}");
        assert_eq!(need.healthy, 16);
        assert_eq!(need.seconds, 10);
        // The rate steps up 5x: the signal rises within the window, all the way at its end.
        tick(&signals, &pools, per_tick(500), 0, per_tick(5_000));
        let early = signals.need("r", Source::MicroBatch).expect("signal").needed;
        assert!(early > 2.0 && early < 10.0, "{early}");
        for _ in 0..10 {
            tick(&signals, &pools, per_tick(500), 0, per_tick(5_000));
        }
        let need = signals.need("r", Source::MicroBatch).expect("signal");
        assert!((need.needed - 10.0).abs() < 1e-9, "{need:?}");
    }

    #[test]
    fn a_saturated_pool_s_queueing_is_not_cost() {
        // Two endpoints each serve 100 calls a second (10 ms each), and every call
        // measures 50 ms (queued at the backend): each had only 10 ms of an endpoint.
        let (signals, pools) = (Signals::default(), pool(10, 2));
        for _ in 0..5 {
            tick(&signals, &pools, per_tick(200), 0, per_tick(200 * 50));
        }
        let need = signals.need("r", Source::MicroBatch).expect("signal");
        assert!((need.cost_seconds.expect("a cost") - 0.01).abs() < 1e-9, "{need:?}");
        assert!((need.needed - 4.0).abs() < 1e-9, "200/s × 10 ms ÷ 0.5: {need:?}");
        // Calls that timed out waiting there were served (with their time) but not
        // answered: the endpoints' time went to the ones answered.
        let figures = Figures::default()
            .with(Field::Requests, per_tick(400))
            .with(Field::Rows, per_tick(200))
            .with(Field::UsedNs, per_tick(400 * 90) * 1_000_000);
        for _ in 0..5 {
            signals.tick(&[(Arc::from("r"), Source::MicroBatch, figures)], &pools);
        }
        let need = signals.need("r", Source::MicroBatch).expect("signal");
        assert!((need.cost_seconds.expect("a cost") - 0.01).abs() < 1e-9, "{need:?}");
        assert!((need.needed - 8.0).abs() < 1e-9, "400/s × 10 ms ÷ 0.5: {need:?}");
    }

    #[test]
    fn refusals_need_more_than_there_are() {
        let (signals, pools) = (Signals::default(), pool(10, 2));
        tick(&signals, &pools, 10, 5, 10);
        let need = signals.need("r", Source::MicroBatch).expect("signal");
        assert!(need.needed >= 3.0, "{need:?}");
    }

    #[test]
    fn a_window_that_served_nothing_keeps_the_last_cost() {
        let (signals, pools) = (Signals::default(), pool(1, 2));
        tick(&signals, &pools, 10, 0, 100);
        tick(&signals, &pools, 10, 10, 0);
        let need = signals.need("r", Source::MicroBatch).expect("signal");
        assert_eq!(need.cost_seconds, Some(0.01));
    }
}
