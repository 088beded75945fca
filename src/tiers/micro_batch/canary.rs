//! A canary on the micro-batch tier: the share of a route's micro-batch calls whose
//! rollout keys fall to the candidate are batched in lanes of their own, sent to the
//! candidate's pool (its connections and concurrency limit, shared with the real-time
//! canary), so the candidate serves them as batches, the way it will once promoted. Both
//! variants are counted per tier, and the abort rule judges them against each other.

use std::sync::Arc;

use tokio::time::Instant;

use super::{enqueue_in, BatchMetrics, Inner, RouteLanes};
use crate::decision::Tier;
use crate::error::Error;
use crate::policy::{BatchSpec, ShadowSpec};
use crate::protocol::Reply;
use crate::shadow::{self, Shadow, Variant};
use crate::tiers::Call;

impl Inner {
    /// Serves `call` of a route running a canary from `variant`, and counts it. The
    /// candidate's failures (every endpoint ejected before the call is queued; an error
    /// or 5xx answer) are counted as its own and the call is served by the primary, so
    /// no caller sees them.
    pub(super) async fn serve_canary(
        &self,
        shadow: &Shadow,
        spec: &ShadowSpec,
        variant: Variant,
        call: Call,
    ) -> Result<Reply, Error> {
        let started = Instant::now();
        let route = call.route.name.clone();
        if variant == Variant::Primary {
            let answer = self.enqueue(call, false)?.answer().await;
            shadow.counted(&route, spec, (Tier::MicroBatch, variant), &answer, started.elapsed());
            return answer;
        }
        let candidate = shadow.candidate(&route, spec);
        let spare = Call {
            request: crate::backend::copy(&call.request),
            route: call.route.clone(),
            ..call
        };
        let answer = match candidate.ejected() {
            Some(ejected) => Err(ejected),
            None => {
                async {
                    let batch = super::batch_spec(&call)?.clone();
                    let (lanes, batch) = self.canary_lanes(&route, &batch, shadow, spec);
                    let answer = enqueue_in(lanes, &batch, call, false)?.answer().await;
                    answer.map(shadow::marked)
                }
                .await
            }
        };
        shadow.counted(&route, spec, (Tier::MicroBatch, variant), &answer, started.elapsed());
        match answer {
            Ok(answer) if !answer.status().is_server_error() => Ok(answer),
            _ => self.enqueue(spare, false)?.answer().await,
        }
    }

    /// The lanes of `route`'s canary: the route's batch settings, the candidate's pool.
    /// Replaced (the old ones drain) when either changes.
    fn canary_lanes(
        &self,
        route: &str,
        batch: &Arc<BatchSpec>,
        shadow: &Shadow,
        spec: &ShadowSpec,
    ) -> (Arc<RouteLanes>, Arc<BatchSpec>) {
        let wanted = BatchSpec {
            pool: spec.candidate.clone(),
            ..(**batch).clone()
        };
        if let Some(lanes) = self.canaries.get(route).filter(|l| *l.spec == wanted) {
            return (lanes.clone(), lanes.spec.clone());
        }
        let wanted = Arc::new(wanted);
        let lanes = Arc::new(RouteLanes {
            shadow: None, // a canary's batches are not mirrored
            cache: None,  // nor its answers kept
            metrics: Arc::new(BatchMetrics::new(route).without_cost()),
            ..self.lanes_on(route, &wanted, None, shadow.candidate(route, spec))
        });
        self.canaries.insert(route.to_owned(), lanes.clone());
        (lanes, wanted)
    }
}
