//! `loadtest streams`: LLM streams held open, closed loop. Each of `--concurrency`
//! clients opens a chat stream (`"stream": true`), reads it to its end and opens the next,
//! for `--duration`, so as many streams are open at every moment. It records each
//! stream's time to first token (from sending the request to its first content event),
//! and each content event's delivery: its arrival less the `x_sent_us` the simulator
//! stamps on it when it writes it (both clocks are this machine's), so a proxy's added
//! latency per event is read without the backend's own variance; and the events read
//! per second.

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
    /// Time to first token, µs: p50, p99.
    pub ttft_us: (u64, u64),
    /// The first content event's delivery (arrival less the backend's stamp), µs: p50, p99.
    pub first_delivery_us: (u64, u64),
    /// Every content event's delivery, µs: p50, p99.
    pub delivery_us: (u64, u64),
}

/// The histograms the clients fill.
struct Record {
    ttft: Histogram<u64>,
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

/// Runs `args`' streams and reports.
pub async fn run(args: &StreamsArgs) -> anyhow::Result<Report> {
    let client = crate::client::new(false);
    let url = crate::payload::join_url(&args.url, "/v1/chat/completions")?;
    let body = Bytes::from(
        serde_json::json!({"model": args.model, "stream": true, "max_tokens": args.tokens,
            "messages": [{"role": "user", "content": "a stream for the relay's benchmark"}]})
        .to_string(),
    );
    let record = Arc::new(Mutex::new(Record {
        ttft: Histogram::new(3)?,
        first: Histogram::new(3)?,
        all: Histogram::new(3)?,
        streams: 0,
        failed: Default::default(),
        events: 0,
    }));
    let started = Instant::now();
    let end = started + args.duration;
    let mut clients = Vec::new();
    for _ in 0..args.concurrency {
        let (client, url, body, record) = (client.clone(), url.clone(), body.clone(), record.clone());
        let key = args.api_key.clone();
        clients.push(tokio::spawn(async move {
            while Instant::now() < end {
                let mut request = Request::post(url.clone()).header("content-type", "application/json");
                if let Some(key) = &key {
                    request = request.header("authorization", format!("Bearer {key}"));
                }
                let request = request.body(Full::new(body.clone()));
                let Ok(request) = request else { return };
                let sent = Instant::now();
                let ok = one(&client, request, sent, &record).await;
                let mut r = record.lock().unwrap_or_else(|e| e.into_inner());
                match ok {
                    Ok(()) => r.streams += 1,
                    Err(why) => *r.failed.entry(why).or_default() += 1,
                }
            }
        }));
    }
    for client in clients {
        client.await?;
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
        ttft_us: pair(&r.ttft),
        first_delivery_us: pair(&r.first),
        delivery_us: pair(&r.all),
    })
}

/// One stream, read to its end; whether it went well (its `[DONE]` read, no error
/// event before it).
async fn one(
    client: &crate::client::Client,
    request: Request<Full<Bytes>>,
    sent: Instant,
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
            if !event.windows(11).any(|w| w == b"\"content\":\"") || event.windows(13).any(|w| w == b"\"content\":\"\"")
            {
                continue; // not a content event
            }
            let arrived = now_us();
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
                let _ = r.ttft.record(sent.elapsed().as_micros().max(1) as u64);
                first = false;
            }
        }
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
            "{} streams open: {} read whole, {} failed; {:.0} events/s; TTFT p50 {} p99 {} µs; first event's delivery p50 {} p99 {} µs; every event's p50 {} p99 {} µs",
            self.concurrency,
            self.streams,
            self.failed,
            self.events_per_second,
            self.ttft_us.0,
            self.ttft_us.1,
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
    fn an_events_stamp_is_read_from_its_data() {
        assert_eq!(stamp(br#"data: {"x_sent_us":1733,"choices":[]}"#), Some(1733));
        assert_eq!(stamp(b"data: [DONE]"), None);
    }
}
