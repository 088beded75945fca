//! A shadow batch's lines: each line the primary answered is asked of its route's
//! candidate too and compared. Nobody waits on a line, so at the candidate's concurrency
//! limit it waits for a slot (within the shadow budget) instead of being dropped. What
//! the comparison found is kept with the line's answer for the batch's comparison file,
//! and counted in the route's report and metrics (tier `offline`) like any shadow call.

use std::time::Duration;

use bytes::Bytes;
use serde_json::Value;

use super::compare::Comparison;
use super::{report, Asked, Primary, Shadow, Slot};
use crate::decision::Tier;
use crate::policy::Route;
use crate::queue::scored::Scored;

impl Shadow {
    /// Scores a line of a shadow batch on `route`: its `request` asked of the route's
    /// candidate and compared with the `primary`'s answer; the line is named `line` (its
    /// id in the batch's files) in the report's sample of disagreements.
    pub async fn score_line(
        &self,
        route: &Route,
        request: http::Request<Bytes>,
        primary: Primary<'_>,
        line: &str,
    ) -> Scored {
        let Some(spec) = route.shadow.as_ref().filter(|_| route.flags.shadow) else {
            return Scored::not_compared("off");
        };
        let asked = Asked {
            route: &route.name,
            spec,
            tier: Tier::Offline,
            caller: Some(line),
        };
        match self.inner.score(asked, request, primary, Slot::Wait).await {
            Ok((cmp, took)) => scored(&cmp, took),
            Err(why) => Scored::not_compared(why.as_str()),
        }
    }
}

/// A line's comparison as its batch's comparison file holds it.
fn scored(cmp: &Comparison, took: Duration) -> Scored {
    let outputs: serde_json::Map<String, Value> = cmp
        .outputs
        .iter()
        .map(|o| (o.name.clone(), report::output_json(o)))
        .collect();
    Scored {
        not_compared: None,
        status_mismatch: cmp.status_mismatch,
        shape_mismatches: cmp.shape_mismatches.clone(),
        rows: cmp.outputs.iter().map(|o| o.rows).sum(),
        rows_within: cmp.outputs.iter().map(|o| o.rows_within).sum(),
        rows_noisy: cmp.outputs.iter().map(|o| o.rows_noisy).sum(),
        max_abs_diff: cmp.outputs.iter().map(|o| o.max_abs).fold(0.0, f64::max),
        candidate_ms: Some(took.as_secs_f64() * 1e3),
        outputs: Value::Object(outputs),
    }
}
