//! `loadtest streams`: LLM chat streams (`"stream": true`). Closed loop by default: each
//! of `--concurrency` clients opens a stream, reads it to its end and opens the next, for
//! `--duration`, so as many streams are open at every moment. Open loop with `--rate`: a
//! stream is opened every 1/RATE seconds whatever is open, and its times count from
//! when it was due. It records each stream's time to first token (to its first content
//! event) and time per output token after it (TPOT: from the first content event to the
//! last, over the events between), each second's TTFT p50 and p99 (plotted with
//! `--plot`), and each content event's delivery: its arrival less the `x_sent_us` the
//! simulator stamps on it when it writes it (both clocks are this machine's), so a
//! proxy's added latency per event is read without the backend's own variance; and the
//! events read per second.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use hdrhistogram::Histogram;
use http::Request;
use http_body_util::{BodyExt as _, Full};
use serde::Serialize;

use crate::args::StreamsArgs;

/// What one `streams` run saw.
#[derive(Debug, Serialize)]
pub struct Report {
    /// Streams open at once.
    pub concurrency: usize,
    /// Streams read to their `[DONE]`.
    pub streams: u64,
    /// Streams that failed (an error status, an error event, a broken connection, an
    /// end without `[DONE]`).
    pub failed: u64,
    /// The failures by what went wrong (`connect`, `status 503`, `error event`, ...).
    pub failed_by: std::collections::BTreeMap<String, u64>,
    /// Content events read.
    pub events: u64,
    /// Content events read per second.
    pub events_per_second: f64,
    /// Streams opened per second, when open loop.
    pub rate: Option<f64>,
    /// Time to first token, µs: p50, p99.
    pub ttft_us: (u64, u64),
    /// Time per output token after the first, µs: p50, p99.
    pub tpot_us: (u64, u64),
    /// Each second's time to first token (by when its streams were due).
    pub ttft_over_time: Vec<Second>,
    /// The first content event's delivery (arrival less the backend's stamp), µs: p50, p99.
    pub first_delivery_us: (u64, u64),
    /// Every content event's delivery, µs: p50, p99.
    pub delivery_us: (u64, u64),
}

/// One second of a run: its streams' time to first token.
#[derive(Debug, Serialize)]
pub struct Second {
    /// Seconds since the run started.
    pub second: u64,
    /// Streams due in it that reached a first token.
    pub count: u64,
    /// Their time to first token, ms: p50, p99.
    pub p50_ms: f64,
    /// See `p50_ms`.
    pub p99_ms: f64,
}

/// The histograms the clients fill.
struct Record {
    ttft: Histogram<u64>,
    tpot: Histogram<u64>,
    /// Each stream's first token: (seconds since the start it was due, µs).
    firsts: Vec<(f64, u64)>,
    first: Histogram<u64>,
    all: Histogram<u64>,
    streams: u64,
    failed: std::collections::BTreeMap<String, u64>,
    events: u64,
}

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// The `x_sent_us` stamp of an event's data, if it has one.
fn stamp(data: &[u8]) -> Option<u64> {
    let at = data.windows(12).position(|w| w == b"\"x_sent_us\":")? + 12;
    let digits: String = data[at..]
        .iter()
        .take_while(|b| b.is_ascii_digit())
        .map(|b| *b as char)
        .collect();
    digits.parse().ok()
}

/// Whether `event` carries generated text: a non-empty `content` (not the role's
/// opening chunk, whose `content` is empty).
fn content_event(event: &[u8]) -> bool {
    const KEY: &[u8] = b"\"content\":\"";
    event
        .windows(KEY.len() + 1)
        .any(|w| w.starts_with(KEY) && w[KEY.len()] != b'"')
}

/// A streamed chat call's body: `template` (every field but the messages) with `prompt`.
fn chat(template: &serde_json::Value, prompt: &str) -> Bytes {
    let mut body = template.clone();
    body["messages"] = serde_json::json!([{"role": "user", "content": prompt}]);
    Bytes::from(body.to_string())
}

/// Runs `args`' streams and reports.
pub async fn run(args: &StreamsArgs) -> anyhow::Result<Report> {
    let client = crate::client::new(false);
    let url = crate::payload::join_url(&args.url, "/v1/chat/completions")?;
    let mut template = serde_json::json!({"model": args.model, "stream": true, "max_tokens": args.tokens});
    if args.ignore_eos {
        template["ignore_eos"] = true.into();
    }
    let body = chat(&template, "a stream for the relay's benchmark");
    // Long prompts each begin with their own number, so a server's prefix cache
    // cannot spare their prefill.
    let long = args
        .prompt_words
        .map(|n| (template, "word ".repeat(n), Arc::new(AtomicU64::new(0))));
    let record = Arc::new(Mutex::new(Record {
        ttft: Histogram::new(3)?,
        tpot: Histogram::new(3)?,
        firsts: Vec::new(),
        first: Histogram::new(3)?,
        all: Histogram::new(3)?,
        streams: 0,
        failed: Default::default(),
        events: 0,
    }));
    let started = Instant::now();
    let end = started + args.duration;
    let request = {
        let (url, body, key, headers) = (url.clone(), body.clone(), args.api_key.clone(), args.headers.clone());
        move || {
            let body = match &long {
                Some((template, words, next)) => {
                    chat(template, &format!("{}: {words}", next.fetch_add(1, Ordering::Relaxed)))
                }
                None => body.clone(),
            };
            let mut request = Request::post(url.clone()).header("content-type", "application/json");
            if let Some(key) = &key {
                request = request.header("authorization", format!("Bearer {key}"));
            }
            for (k, v) in &headers {
                request = request.header(k, v);
            }
            request.body(Full::new(body)).ok()
        }
    };
    let mut clients = tokio::task::JoinSet::new();
    let count = |ok: Result<(), String>, record: &Mutex<Record>| {
        let mut r = record.lock().unwrap_or_else(|e| e.into_inner());
        match ok {
            Ok(()) => r.streams += 1,
            Err(why) => *r.failed.entry(why).or_default() += 1,
        }
    };
    match args.rate {
        Some(rate) => {
            let every = std::time::Duration::from_secs_f64(1.0 / rate.max(1e-3));
            let mut due = started;
            while due < end {
                tokio::time::sleep_until(due.into()).await;
                let (client, record, request) = (client.clone(), record.clone(), request.clone());
                let at = due;
                clients.spawn(async move {
                    let Some(request) = request() else { return };
                    count(one(&client, request, (at, started), &record).await, &record);
                });
                due += every;
            }
        }
        None => {
            for _ in 0..args.concurrency {
                let (client, record, request) = (client.clone(), record.clone(), request.clone());
                clients.spawn(async move {
                    while Instant::now() < end {
                        let Some(request) = request() else { return };
                        let sent = Instant::now();
                        count(one(&client, request, (sent, started), &record).await, &record);
                    }
                });
            }
        }
    }
    while let Some(done) = clients.join_next().await {
        done?;
    }
    let took = started.elapsed().as_secs_f64();
    let r = record.lock().unwrap_or_else(|e| e.into_inner());
    let pair = |h: &Histogram<u64>| (h.value_at_quantile(0.5), h.value_at_quantile(0.99));
    Ok(Report {
        concurrency: args.concurrency,
        streams: r.streams,
        failed: r.failed.values().sum(),
        failed_by: r.failed.clone(),
        events: r.events,
        events_per_second: r.events as f64 / took,
        rate: args.rate,
        ttft_us: pair(&r.ttft),
        tpot_us: pair(&r.tpot),
        ttft_over_time: seconds(&r.firsts)?,
        first_delivery_us: pair(&r.first),
        delivery_us: pair(&r.all),
    })
}

/// Each second's TTFT p50 and p99 from `firsts` (seconds since the start, µs).
fn seconds(firsts: &[(f64, u64)]) -> anyhow::Result<Vec<Second>> {
    let last = firsts.iter().map(|(at, _)| *at as u64).max().unwrap_or(0);
    let mut out = Vec::new();
    for second in 0..=last {
        let mut h = Histogram::<u64>::new(3)?;
        for (_, us) in firsts.iter().filter(|(at, _)| *at as u64 == second) {
            h.record(*us)?;
        }
        let ms = |q: f64| h.value_at_quantile(q) as f64 / 1e3;
        out.push(Second {
            second,
            count: h.len(),
            p50_ms: ms(0.5),
            p99_ms: ms(0.99),
        });
    }
    Ok(out)
}

/// One stream, read to its end; whether it went well (its `[DONE]` read, no error
/// event before it).
async fn one(
    client: &crate::client::Client,
    request: Request<Full<Bytes>>,
    (sent, started): (Instant, Instant),
    record: &Mutex<Record>,
) -> Result<(), String> {
    let response = client.request(request).await.map_err(|e| match e.is_connect() {
        true => "connect".to_owned(),
        false => "no answer".to_owned(),
    })?;
    if !response.status().is_success() {
        return Err(format!("status {}", response.status().as_u16()));
    }
    let mut body = response.into_body();
    let (mut held, mut first, mut done) = (Vec::new(), true, false);
    let (mut first_at, mut last_at, mut events) = (None, None, 0u64);
    while let Some(frame) = body.frame().await {
        let Ok(frame) = frame else {
            return Err("broken stream".into());
        };
        let Ok(data) = frame.into_data() else { continue };
        held.extend_from_slice(&data);
        while let Some(end) = held.windows(2).position(|w| w == b"\n\n") {
            let event: Vec<u8> = held.drain(..end + 2).collect();
            if event.starts_with(b"data: {\"error\"") {
                return Err("error event".into()); // the stream was cut
            }
            done |= event.starts_with(b"data: [DONE]");
            if !content_event(&event) {
                continue;
            }
            let arrived = now_us();
            let now = Instant::now();
            first_at.get_or_insert(now);
            last_at = Some(now);
            events += 1;
            let mut r = record.lock().unwrap_or_else(|e| e.into_inner());
            r.events += 1;
            if let Some(stamp) = stamp(&event) {
                let delivery = arrived.saturating_sub(stamp).max(1);
                let _ = r.all.record(delivery);
                if first {
                    let _ = r.first.record(delivery);
                }
            }
            if first {
                let ttft = sent.elapsed().as_micros().max(1) as u64;
                let _ = r.ttft.record(ttft);
                r.firsts
                    .push((sent.saturating_duration_since(started).as_secs_f64(), ttft));
                first = false;
            }
        }
    }
    if let (Some(first), Some(last), true) = (first_at, last_at, events > 1) {
        let each = last.duration_since(first).as_micros() as u64 / (events - 1);
        let _ = record
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .tpot
            .record(each.max(1));
    }
    match done {
        true => Ok(()),
        false => Err("no [DONE]".into()),
    }
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: {} read whole, {} failed; {:.0} events/s; TTFT p50 {} p99 {} µs; TPOT p50 {} p99 {} µs; first event's delivery p50 {} p99 {} µs; every event's p50 {} p99 {} µs",
            match self.rate {
                Some(rate) => format!("{rate} streams/s"),
                None => format!("{} streams open", self.concurrency),
            },
            self.streams,
            self.failed,
            self.events_per_second,
            self.ttft_us.0,
            self.ttft_us.1,
            self.tpot_us.0,
            self.tpot_us.1,
            self.first_delivery_us.0,
            self.first_delivery_us.1,
            self.delivery_us.0,
            self.delivery_us.1
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_roles_opening_chunk_is_not_a_content_event() {
        let role = br#"data: {"choices":[{"delta":{"content":"","role":"assistant"}}]}"#;
        let token = br#"data: {"choices":[{"delta":{"content":"every "}}]}"#;
        assert!(!content_event(role));
        assert!(content_event(token));
        assert!(!content_event(
            br#"data: {"choices":[{"delta":{},"finish_reason":"length"}]}"#
        ));
    }

    #[test]
    fn an_events_stamp_is_read_from_its_data() {
        assert_eq!(stamp(br#"data: {"x_sent_us":1733,"choices":[]}"#), Some(1733));
        assert_eq!(stamp(b"data: [DONE]"), None);
    }
}
