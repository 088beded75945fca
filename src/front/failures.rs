//! One warn line for each answer the gateway turns into a 5xx: the route, tier, door,
//! request id and the cause (which names the backend endpoint when one failed), so a
//! single 502 among millions can be traced from the log alone. At most [`PER_SECOND`]
//! lines a second per route (a burst of [`BURST`]), so a dead backend cannot flood the
//! log; the lines a route left out are counted and reported with its next line. Beside
//! the dispatch, which calls it when it counts a request.

use std::num::NonZeroU32;
use std::sync::OnceLock;

use dashmap::DashMap;
use governor::{DefaultKeyedRateLimiter, Quota};

use crate::decision::{Decision, Door};
use crate::error::Error;
use crate::trace;

/// Lines a second per route, sustained.
pub const PER_SECOND: u32 = 5;
/// Lines per route at once.
pub const BURST: u32 = 20;

/// Each route's allowance, and the lines it left out since its last one.
struct Lines {
    limit: DefaultKeyedRateLimiter<String>,
    left_out: DashMap<String, u64>,
}

fn lines() -> &'static Lines {
    static LINES: OnceLock<Lines> = OnceLock::new();
    LINES.get_or_init(|| {
        let per_second = NonZeroU32::new(PER_SECOND).expect("PER_SECOND is not zero");
        let burst = NonZeroU32::new(BURST).expect("BURST is not zero");
        Lines {
            limit: governor::RateLimiter::keyed(Quota::per_second(per_second).allow_burst(burst)),
            left_out: DashMap::new(),
        }
    })
}

/// Logs `error`, the answer to a request on `route` that came in by `door`, when it is a
/// 5xx and the route's lines allow.
pub fn log(route: &str, door: Door, decision: Option<Decision>, error: &Error, ids: Option<&trace::Ids>) {
    if !error.kind.status().is_server_error() {
        return;
    }
    let (lines, route_key) = (lines(), route.to_owned());
    if lines.limit.check_key(&route_key).is_err() {
        *lines.left_out.entry(route_key).or_default() += 1;
        return;
    }
    let left_out = lines.left_out.remove(&route_key).map_or(0, |(_, n)| n);
    tracing::warn!(
        route,
        door = door.as_str(),
        tier = decision.map(|d| d.tier.as_str()),
        status = error.kind.status().as_u16(),
        outcome = error.kind.outcome(),
        request_id = ids.and_then(|ids| ids.request_id.to_str().ok()),
        left_out,
        "answered {}: {}",
        error.kind.status().as_u16(),
        error.message
    );
}

/// Logs a 5xx answer to a request on no route's infer path (metadata, readiness,
/// config, statistics: `what` is the path or the gRPC method), with the request id it
/// was answered with, when `what`'s lines allow.
pub fn log_answer(door: Door, what: &str, status: u16, detail: &str, request_id: &http::HeaderValue) {
    let (lines, key) = (lines(), what.to_owned());
    if lines.limit.check_key(&key).is_err() {
        *lines.left_out.entry(key).or_default() += 1;
        return;
    }
    let left_out = lines.left_out.remove(&key).map_or(0, |(_, n)| n);
    let detail: String = detail.chars().take(300).collect();
    tracing::warn!(
        door = door.as_str(),
        what,
        status,
        request_id = request_id.to_str().unwrap_or_default(),
        left_out,
        "answered {status}: {detail}"
    );
}

/// Logs a model left out of an answer of every model's statistics because its route's
/// backend failed (the other models are answered).
pub fn skipped_statistics(model: &str, door: &str, why: &str, request_id: &http::HeaderValue) {
    tracing::warn!(
        model,
        door,
        request_id = request_id.to_str().unwrap_or_default(),
        "statistics of every model: {model} left out, its backend failed: {why}"
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Kind;

    /// Everything logged while `f` runs, as text.
    fn logged(f: impl FnOnce()) -> String {
        let lines = crate::telemetry::Lines::default();
        let writer = lines.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .finish();
        tracing::subscriber::with_default(subscriber, f);
        lines.text()
    }

    #[test]
    fn a_5xx_is_logged_with_its_cause_and_a_flood_is_cut_to_the_burst() {
        let dead = Error::new(
            Kind::Backend,
            "backend 10.0.0.9:8000 is unreachable: tcp connect error: Connection refused",
        );
        let text = logged(|| {
            log(
                "failures-a",
                Door::Http,
                None,
                &Error::new(Kind::BadRequest, "a 4xx"),
                None,
            );
            for _ in 0..200 {
                log("failures-a", Door::Http, None, &dead, None);
            }
            log("failures-b", Door::Grpc, None, &dead, None);
            // Once the allowance refills, the flooded route's next line says how many it left out.
            std::thread::sleep(std::time::Duration::from_millis(1000 / u64::from(PER_SECOND) + 50));
            log("failures-a", Door::Http, None, &dead, None);
        });
        assert!(
            !text.contains("a 4xx"),
            "4xx answers are the caller's, not logged:\n{text}"
        );
        let lines: Vec<&str> = text.lines().collect();
        let a = lines.iter().filter(|l| l.contains("route=\"failures-a\"")).count();
        // The burst, and at most a few more refilled while the loop ran.
        assert!((BURST as usize..BURST as usize + 5).contains(&a), "{a} lines:\n{text}");
        let b = lines
            .iter()
            .find(|l| l.contains("route=\"failures-b\""))
            .expect("another route's line is not held back by the flood");
        assert!(b.contains("left_out=0"), "{b}");
        assert!(
            b.contains("WARN")
                && b.contains("answered 502: backend 10.0.0.9:8000 is unreachable")
                && b.contains("door=\"grpc\""),
            "{b}"
        );
        // Every call is either a line or counted on the route's next line.
        let left_out: u64 = lines
            .iter()
            .filter(|l| l.contains("route=\"failures-a\""))
            .filter_map(|l| {
                l.split("left_out=")
                    .nth(1)?
                    .split_whitespace()
                    .next()?
                    .parse::<u64>()
                    .ok()
            })
            .sum();
        assert_eq!(left_out as usize, 201 - a, "{text}");
    }
}
