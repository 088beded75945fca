//! History without Prometheus: every `tiergate_*` series the metrics endpoint exports,
//! read from the same recorder once a second and kept for 15 minutes, for the console
//! (`GET /admin/stats?since=…`).
//!
//! The sampler, a thread of its own (one a process: the recorder is the process's),
//! renders the recorder's text as a scrape would and keeps the values that changed since the sample before (a counter that did not
//! move costs nothing to keep): nothing is added to the request path. Bounded: at most
//! `MAX_SERIES` (20,000) series are named (the rest are not kept, and the answer says how
//! many), 900 samples.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};

/// Time between samples.
pub const EVERY: Duration = Duration::from_secs(1);
/// Samples kept: 15 minutes at one a second.
const KEEP: usize = 900;
/// Series named at most; a gateway with more (a tenant label on too many tenants) keeps
/// the first ones.
const MAX_SERIES: usize = 20_000;

/// Which gateway the history is of, so a fleet is never mistaken for one gateway.
#[derive(Debug, Clone)]
pub struct Replica {
    /// Its name (the Kafka queue's replica name, or the host name and process id).
    pub name: String,
    /// Its data port's address.
    pub address: String,
    /// When it started, unix milliseconds.
    pub started_ms: i64,
}

/// The last 15 minutes of the gateway's series.
#[derive(Debug, Clone)]
pub struct Stats {
    replica: Replica,
    ring: Arc<Mutex<Ring>>,
}

#[derive(Debug, Default)]
struct Ring {
    /// Series by index, as `name{labels}`.
    names: Vec<Arc<str>>,
    index: HashMap<Arc<str>, u32>,
    /// Each series' value at the last sample, by index.
    last: Vec<f64>,
    samples: VecDeque<Sample>,
    /// Series not kept for [`MAX_SERIES`].
    dropped: u64,
}

/// One reading: the series whose value changed since the reading before (the first
/// reading has every series).
#[derive(Debug)]
struct Sample {
    at_ms: i64,
    changed: Vec<(u32, f64)>,
}

impl Stats {
    /// An empty history of `replica`, sampled by nobody (its owner calls
    /// [`Stats::sample`]).
    pub fn new(replica: Replica) -> Self {
        Stats {
            replica,
            ring: Arc::default(),
        }
    }

    /// The process's history, `replica` named beside it: the recorder is the process's
    /// (every gateway in it shares it), so one thread of its own samples it, started by
    /// the first call, from `render` (the recorder's text) every [`EVERY`].
    pub fn shared(replica: Replica, render: impl Fn() -> String + Send + 'static) -> Result<Self, std::io::Error> {
        static RING: std::sync::OnceLock<Arc<Mutex<Ring>>> = std::sync::OnceLock::new();
        let mut started = Ok(());
        let ring = RING.get_or_init(|| {
            let ring: Arc<Mutex<Ring>> = Arc::default();
            let sampled = Stats {
                replica: replica.clone(),
                ring: ring.clone(),
            };
            started = std::thread::Builder::new()
                .name("tiergate-stats".into())
                .spawn(move || loop {
                    std::thread::sleep(EVERY);
                    sampled.sample(&render(), SystemTime::now());
                })
                .map(drop);
            ring
        });
        started.map(|()| Stats {
            replica,
            ring: ring.clone(),
        })
    }

    /// Takes a sample from `text` (the Prometheus text format) read at `at`.
    pub fn sample(&self, text: &str, at: SystemTime) {
        let at_ms = unix_ms(at);
        let mut ring = self.ring.lock().unwrap_or_else(|e| e.into_inner());
        let first = ring.samples.is_empty();
        let mut changed = Vec::new();
        for (series, value) in parse(text) {
            let Some(i) = ring.slot(series) else { continue };
            let last = &mut ring.last[i as usize];
            if first || last.to_bits() != value.to_bits() {
                *last = value;
                changed.push((i, value));
            }
        }
        ring.samples.push_back(Sample { at_ms, changed });
        if ring.samples.len() > KEEP {
            // The oldest kept sample becomes whole again: every series' value as of it.
            let gone = ring.samples.pop_front().map(|s| s.changed).unwrap_or_default();
            if let Some(next) = ring.samples.front_mut() {
                let had: std::collections::HashSet<u32> = next.changed.iter().map(|(i, _)| *i).collect();
                next.changed.extend(gone.into_iter().filter(|(i, _)| !had.contains(i)));
            }
        }
    }

    /// The samples after `since_ms` (unix milliseconds; 0: all kept), as JSON: the
    /// replica, the series' names, and per sample its time and the values that
    /// changed (a reader keeps each series' last value; the first sample returned
    /// carries every series as of it).
    pub fn since(&self, since_ms: i64) -> Value {
        let ring = self.ring.lock().unwrap_or_else(|e| e.into_inner());
        let mut samples = Vec::new();
        // Every series' value as of `since_ms`, for the first sample after it.
        let mut before: Option<HashMap<u32, f64>> = None;
        for sample in &ring.samples {
            if sample.at_ms <= since_ms {
                before
                    .get_or_insert_with(HashMap::new)
                    .extend(sample.changed.iter().copied());
                continue;
            }
            let pairs: Vec<(u32, f64)> = match before.take() {
                Some(mut state) => {
                    state.extend(sample.changed.iter().copied());
                    let mut all: Vec<(u32, f64)> = state.into_iter().collect();
                    all.sort_unstable_by_key(|(i, _)| *i);
                    all
                }
                None => sample.changed.clone(),
            };
            let values: Vec<Value> = pairs.into_iter().map(|(i, v)| json!([i, finite(v)])).collect();
            samples.push(json!({ "at_ms": sample.at_ms, "values": values }));
        }
        json!({
            "replica": {
                "name": self.replica.name,
                "address": self.replica.address,
                "started_ms": self.replica.started_ms,
            },
            "every_ms": EVERY.as_millis() as u64,
            "series": ring.names.iter().map(|n| n.as_ref()).collect::<Vec<_>>(),
            "series_dropped": ring.dropped,
            "samples": samples,
        })
    }
}

impl Ring {
    /// The index of `series`, named now if new (none past [`MAX_SERIES`]).
    fn slot(&mut self, series: &str) -> Option<u32> {
        if let Some(i) = self.index.get(series) {
            return Some(*i);
        }
        if self.names.len() >= MAX_SERIES {
            self.dropped += 1;
            return None;
        }
        let i = u32::try_from(self.names.len()).ok()?;
        let name: Arc<str> = Arc::from(series);
        self.names.push(name.clone());
        self.index.insert(name, i);
        self.last.push(f64::NAN);
        Some(i)
    }
}

/// The `tiergate_*` samples of a Prometheus text exposition: `name{labels}` and value.
fn parse(text: &str) -> impl Iterator<Item = (&str, f64)> {
    text.lines()
        .filter(|line| line.starts_with("tiergate_"))
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let value = match value {
                "+Inf" => f64::INFINITY,
                "-Inf" => f64::NEG_INFINITY,
                v => v.parse().ok()?,
            };
            Some((series, value))
        })
}

/// JSON has no NaN or infinity: those as null.
fn finite(v: f64) -> Value {
    match v.is_finite() {
        true => json!(v),
        false => Value::Null,
    }
}

fn unix_ms(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// `since` of `GET /admin/stats`: unix milliseconds, or a duration ago (`90s`, `5m`);
/// none: everything kept.
pub fn since_ms(query: Option<&str>, now: SystemTime) -> Result<i64, String> {
    let Some(text) = query.unwrap_or("").split('&').find_map(|kv| kv.strip_prefix("since=")) else {
        return Ok(0);
    };
    if let Ok(ms) = text.parse::<i64>() {
        return Ok(ms.max(0));
    }
    match humantime::parse_duration(text) {
        Ok(ago) => Ok(unix_ms(now.checked_sub(ago).unwrap_or(UNIX_EPOCH))),
        Err(_) => Err(format!(
            "since={text}: send unix milliseconds (the at_ms of the last sample you have) or a duration ago such as 5m"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats() -> Stats {
        Stats::new(Replica {
            name: "r1".into(),
            address: "127.0.0.1:8000".into(),
            started_ms: 0,
        })
    }

    fn at(ms: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(ms)
    }

    /// Each series' value as of the last sample, from an answer.
    fn values(answer: &Value) -> HashMap<String, Option<f64>> {
        let names: Vec<&str> = answer["series"]
            .as_array()
            .expect("a list")
            .iter()
            .map(|v| v.as_str().expect("a name"))
            .collect();
        let mut out = HashMap::new();
        for sample in answer["samples"].as_array().expect("a list") {
            for pair in sample["values"].as_array().expect("a list") {
                out.insert(
                    names[pair[0].as_u64().expect("an index") as usize].to_owned(),
                    pair[1].as_f64(),
                );
            }
        }
        out
    }

    #[test]
    fn keeps_the_tiergate_series_and_only_what_changed() {
        let stats = stats();
        let text = "# HELP tiergate_requests_total x\n# TYPE tiergate_requests_total counter\n\
                    tiergate_requests_total{route=\"a\",tier=\"realtime\"} 5\nother_total 9\n\
                    tiergate_in_flight_requests{route=\"a\"} 1\n";
        stats.sample(text, at(1_000));
        stats.sample(&text.replace("} 5", "} 8"), at(2_000));
        let answer = stats.since(0);
        let samples = answer["samples"].as_array().expect("a list");
        assert_eq!(samples.len(), 2);
        assert_eq!(
            samples[0]["values"].as_array().expect("a list").len(),
            2,
            "the first has every series"
        );
        assert_eq!(samples[1]["values"], json!([[0, 8.0]]), "then what changed");
        assert_eq!(
            answer["series"][0],
            "tiergate_requests_total{route=\"a\",tier=\"realtime\"}"
        );
        assert_eq!(answer["replica"]["name"], "r1");
        // Since the first: the one after it, whole.
        let later = stats.since(1_000);
        let later_samples = later["samples"].as_array().expect("a list");
        assert_eq!(later_samples.len(), 1);
        assert_eq!(
            values(&later)["tiergate_requests_total{route=\"a\",tier=\"realtime\"}"],
            Some(8.0)
        );
        assert_eq!(values(&later)["tiergate_in_flight_requests{route=\"a\"}"], Some(1.0));
    }

    #[test]
    fn keeps_fifteen_minutes_and_the_oldest_stays_whole() {
        let stats = stats();
        stats.sample("tiergate_a 1\ntiergate_b 1\n", at(0));
        for s in 1..=KEEP as u64 + 10 {
            stats.sample(&format!("tiergate_a {s}\ntiergate_b 1\n"), at(s * 1_000));
        }
        let answer = stats.since(0);
        assert_eq!(answer["samples"].as_array().expect("a list").len(), KEEP);
        let all = values(&answer);
        assert_eq!(all["tiergate_b"], Some(1.0), "b never changed, still known");
        assert_eq!(all["tiergate_a"], Some((KEEP + 10) as f64));
    }

    #[test]
    fn since_takes_milliseconds_or_a_duration_and_says_what_else() {
        let now = at(600_000);
        assert_eq!(since_ms(None, now), Ok(0));
        assert_eq!(since_ms(Some("since=1234"), now), Ok(1_234));
        assert_eq!(since_ms(Some("x=1&since=5m"), now), Ok(300_000));
        assert!(since_ms(Some("since=yesterday"), now)
            .expect_err("refused")
            .contains("unix milliseconds"));
    }
}
