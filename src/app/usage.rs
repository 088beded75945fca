//! The pools the capacity signal watches: each route's real-time and batch pool in the
//! running policy, with its endpoints healthy now.

use std::sync::Arc;

use crate::policy::Store;
use crate::tiers::{MicroBatch, Realtime};
use crate::usage::capacity::{self, Pool};
use crate::usage::Source;

/// The running policy's pools, as the tiers see them.
pub(super) struct Pools {
    pub policy: Arc<Store>,
    pub realtime: Realtime,
    pub micro_batch: MicroBatch,
}

impl capacity::Pools for Pools {
    fn pools(&self) -> Vec<Pool> {
        let policy = self.policy.load();
        let mut pools = Vec::new();
        for route in policy.routes() {
            let name: Arc<str> = Arc::from(route.name.as_str());
            if let Some(spec) = &route.realtime {
                pools.push(Pool {
                    route: name.clone(),
                    source: Source::Realtime,
                    healthy: self.realtime.healthy(&route.name, spec),
                    capacity: route.usage.realtime.capacity,
                });
            }
            if let Some(spec) = &route.micro_batch {
                pools.push(Pool {
                    route: name,
                    source: Source::MicroBatch,
                    healthy: self.micro_batch.healthy(&route.name, &spec.pool),
                    capacity: route.usage.micro_batch.capacity,
                });
            }
        }
        pools
    }
}
