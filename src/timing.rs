//! Where an answer's time went: its `Server-Timing` field (W3C Server Timing), its
//! parts noted by the steps of the path that spend the time and the field written by
//! the door.
//!
//! Noted, in milliseconds with microsecond precision: `queue` (a micro-batch request's
//! wait for its batch to go out: tiergate forms a batch the moment a slot frees, so
//! this is also its batch wait; an offline job's 202, its durable write into the
//! queue, with no `backend`), `cache` (the cache's lookup, or a coalesced request's
//! wait for the call it joined), `backend` (the backend call that gave the answer: the
//! micro-batch the request rode in, or the real-time tier's call to its pool, from the
//! endpoint's choice to the answer read), `retry` (calls that failed before it, on
//! other endpoints), `hedge` (how long the call ran before the copy that answered was
//! sent). A step with parts to say notes them ([`Noted`]) in the answer's extensions;
//! the real-time tier's plain call notes none (the door is given the tier's time beside
//! the answer, so the common path adds nothing to the answer before the door). The door
//! settles the [`Line`]: the parts, `gateway` (the rest of the total: the gateway's own
//! work) and `total` (from the request's head read to the answer), so the parts add up
//! to the total to the microsecond; the server writes it with the answer's head, or
//! into the header map for hyper ([`Line::store`]); the gRPC door puts it in metadata. A backend's own `Server-Timing` is
//! replaced. An error answer carries `total` only. An LLM's whole answer also says
//! the tokens its `usage` counts (`prompt_tokens;desc=N, completion_tokens;desc=N`,
//! after the times: [`tokens`]). A leaf, as [`crate::headers`].

use std::time::Duration;

use http::{Extensions, HeaderMap, HeaderName, HeaderValue};

/// `Server-Timing`.
pub const SERVER_TIMING: HeaderName = HeaderName::from_static("server-timing");

/// Where a part of an answer's time was spent, in the order the field names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Spent {
    /// A micro-batch request's wait for its batch, or an offline job's durable write.
    Queue,
    /// The cache's lookup, or a coalesced request's wait.
    Cache,
    /// The backend call that gave the answer.
    Backend,
    /// Calls that failed before it.
    Retry,
    /// How long the call ran before the copy that answered was sent.
    Hedge,
}

/// The parts of an answer's time noted for it, in its extensions until the door
/// writes them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Noted([Option<Duration>; 5]);

/// The LLM tokens an answer says it used (prompt, completion), in its extensions until
/// the door writes them after the times.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tokens([u32; 2]);

/// Notes `parts` for an answer with `extensions`, replacing any noted before.
pub fn set(extensions: &mut Extensions, parts: &[(Spent, Duration)]) {
    let mut noted = Noted::default();
    for (part, took) in parts {
        noted.0[*part as usize] = Some(*took);
    }
    extensions.insert(noted);
}

/// Notes the LLM tokens an answer says it used: `prompt_tokens;desc=N,
/// completion_tokens;desc=N` after the times.
pub fn tokens(extensions: &mut Extensions, prompt: u64, completion: u64) {
    // Below the line's mark for a count it does not have.
    let at_most = |n: u64| u32::try_from(n).unwrap_or(u32::MAX).min(Line::ABSENT - 1);
    extensions.insert(Tokens([at_most(prompt), at_most(completion)]));
}

/// Notes `parts` for an answer with `extensions`, beside those noted before (a part
/// noted twice adds up).
pub fn add(extensions: &mut Extensions, parts: &[(Spent, Duration)]) {
    let mut noted = extensions.get::<Noted>().copied().unwrap_or_default();
    for (part, took) in parts {
        let slot = &mut noted.0[*part as usize];
        *slot = Some(slot.unwrap_or_default() + *took);
    }
    extensions.insert(noted);
}

/// An answer's `Server-Timing` as the door settles it: each part in microseconds
/// (saturating at about 71 minutes, past any real-time or micro-batch budget), in the
/// field's order: the [`Spent`] parts, `gateway`, `total`; `u32::MAX` for a part it
/// does not have; then an LLM answer's prompt and completion tokens, `u32::MAX` when
/// it has none. Small and `Copy`, so it rides with the answer to the server that
/// writes the head (see `front::body::Stamp`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Line([u32; 9]);

impl Line {
    const NAMES: [&'static [u8]; 7] = [b"queue", b"cache", b"backend", b"retry", b"hedge", b"gateway", b"total"];
    const ABSENT: u32 = u32::MAX;

    /// An answer that took `total`: the `noted` parts, `backend` as `tier` when they
    /// do not name it and a tier served the answer, `gateway` (what the other parts do
    /// not account for) and `total`.
    pub fn answer(noted: Option<Noted>, total: Duration, tier: Option<Duration>) -> Line {
        let mut noted = noted.unwrap_or_default();
        if noted.0[Spent::Backend as usize].is_none() {
            noted.0[Spent::Backend as usize] = tier;
        }
        let mut line = [Self::ABSENT; 9];
        let mut spent = Duration::ZERO;
        for (slot, took) in line.iter_mut().zip(noted.0) {
            if let Some(took) = took {
                spent = spent.saturating_add(took);
                *slot = micros(took);
            }
        }
        line[5] = micros(total.saturating_sub(spent));
        line[6] = micros(total);
        Line(line)
    }

    /// The line with an LLM answer's `tokens`, when it has them.
    pub fn with_tokens(mut self, tokens: Option<Tokens>) -> Line {
        if let Some(Tokens([prompt, completion])) = tokens {
            self.0[7] = prompt;
            self.0[8] = completion;
        }
        self
    }

    /// An error answer that took `total`: `total` alone (the parts of a call that failed
    /// are not known to the door).
    pub fn error(total: Duration) -> Line {
        let mut line = [Self::ABSENT; 9];
        line[6] = micros(total);
        Line(line)
    }

    /// Writes the field, `server-timing: ...\r\n`, into an answer's `head`.
    pub fn write(&self, head: &mut Vec<u8>) {
        head.extend_from_slice(b"server-timing: ");
        head.extend_from_slice(self.field().bytes());
        self.write_tokens(head);
        head.extend_from_slice(b"\r\n");
    }

    /// The field as `headers`' `Server-Timing` (replacing a backend's own).
    pub fn store(&self, headers: &mut HeaderMap) {
        let field = self.field();
        let value = match self.0[7] == Self::ABSENT {
            true => HeaderValue::from_bytes(field.bytes()),
            false => {
                let mut with = field.bytes().to_vec();
                self.write_tokens(&mut with);
                HeaderValue::from_bytes(&with)
            }
        };
        if let Ok(value) = value {
            headers.insert(SERVER_TIMING, value);
        }
    }

    fn field(&self) -> Field {
        let mut field = Field::default();
        for (name, took) in Self::NAMES.iter().zip(self.0) {
            if took != Self::ABSENT {
                field.part(name, u64::from(took));
            }
        }
        field
    }

    /// `, prompt_tokens;desc=N, completion_tokens;desc=N` after the times, for an LLM
    /// answer that says its tokens.
    fn write_tokens(&self, out: &mut Vec<u8>) {
        if self.0[7] == Self::ABSENT {
            return;
        }
        for (name, n) in [(&b"prompt_tokens"[..], self.0[7]), (b"completion_tokens", self.0[8])] {
            let mut digits = [0u8; 20];
            out.extend_from_slice(b", ");
            out.extend_from_slice(name);
            out.extend_from_slice(b";desc=");
            out.extend_from_slice(crate::protocol::decimal(n as usize, &mut digits));
        }
    }
}

/// `took` in microseconds, saturating below [`Line::ABSENT`].
fn micros(took: Duration) -> u32 {
    u32::try_from(took.as_micros())
        .unwrap_or(u32::MAX)
        .min(Line::ABSENT - 1)
}

/// The field's text (`backend;dur=1.311, gateway;dur=0.339, total;dur=1.651`): for
/// the gRPC door's metadata.
impl std::fmt::Display for Line {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Only ASCII names, digits and punctuation are written.
        f.write_str(std::str::from_utf8(self.field().bytes()).map_err(|_| std::fmt::Error)?)?;
        let mut tokens = Vec::new();
        self.write_tokens(&mut tokens);
        f.write_str(std::str::from_utf8(&tokens).map_err(|_| std::fmt::Error)?)
    }
}

/// Room for a field: seven parts of at most 26 bytes each.
const MAX: usize = 7 * 26;

/// A field being written, on the stack.
struct Field {
    buf: [u8; MAX],
    len: usize,
}

impl Default for Field {
    fn default() -> Self {
        Field { buf: [0; MAX], len: 0 }
    }
}

impl Field {
    /// `name;dur=MS.mmm`, after `, ` when not first: at most 2 + 7 + 5 + 8 + 4 bytes
    /// (a name is at most 7 bytes, a part under 2^32 µs).
    fn part(&mut self, name: &[u8], micros: u64) {
        let Some(out) = self.buf.get_mut(self.len..self.len + 26) else {
            return;
        };
        let mut at = 0;
        if self.len > 0 {
            out[..2].copy_from_slice(b", ");
            at = 2;
        }
        out[at..at + name.len()].copy_from_slice(name);
        at += name.len();
        out[at..at + 5].copy_from_slice(b";dur=");
        at += 5;
        let mut digits = [0u8; 20];
        let whole = crate::protocol::decimal((micros / 1000) as usize, &mut digits);
        out[at..at + whole.len()].copy_from_slice(whole);
        at += whole.len();
        let fraction = micros % 1000;
        out[at..at + 4].copy_from_slice(&[
            b'.',
            b'0' + (fraction / 100) as u8,
            b'0' + (fraction / 10 % 10) as u8,
            b'0' + (fraction % 10) as u8,
        ]);
        self.len += at + 4;
    }

    fn bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn us(n: u64) -> Duration {
        Duration::from_micros(n)
    }

    /// `headers`' field for an answer, as the hyper path stores it.
    fn close(headers: &mut HeaderMap, parts: Option<Noted>, total: Duration, tier: Option<Duration>) {
        Line::answer(parts, total, tier).store(headers);
    }

    fn close_error(headers: &mut HeaderMap, total: Duration) {
        Line::error(total).store(headers);
    }

    #[test]
    fn parts_are_written_to_the_microsecond_and_the_gateway_is_the_rest_of_the_total() {
        let mut headers = HeaderMap::new();
        headers.insert(SERVER_TIMING, HeaderValue::from_static("db;dur=99"));
        let mut extensions = Extensions::new();
        set(&mut extensions, &[(Spent::Backend, us(4_512))]);
        add(
            &mut extensions,
            &[(Spent::Hedge, us(1_000_005)), (Spent::Retry, us(70))],
        );
        add(&mut extensions, &[(Spent::Retry, us(30))]);
        close(&mut headers, extensions.remove::<Noted>(), us(1_010_000), Some(us(7)));
        assert_eq!(
            headers[SERVER_TIMING],
            "backend;dur=4.512, retry;dur=0.100, hedge;dur=1000.005, gateway;dur=5.383, total;dur=1010.000",
            "a backend's own replaced, the noted backend kept over the tier's time"
        );
    }

    #[test]
    fn the_tiers_time_is_the_backends_when_no_part_names_it() {
        let mut headers = HeaderMap::new();
        close(&mut headers, None, us(1_250), Some(us(1_000)));
        assert_eq!(
            headers[SERVER_TIMING],
            "backend;dur=1.000, gateway;dur=0.250, total;dur=1.250"
        );
        let mut extensions = Extensions::new();
        set(&mut extensions, &[(Spent::Cache, us(20))]);
        close(&mut headers, extensions.remove::<Noted>(), us(1_250), None);
        assert_eq!(
            headers[SERVER_TIMING],
            "cache;dur=0.020, gateway;dur=1.230, total;dur=1.250"
        );
        close_error(&mut headers, us(3));
        assert_eq!(headers[SERVER_TIMING], "total;dur=0.003");
    }

    #[test]
    fn every_part_and_the_longest_durations_fit_and_the_line_writes_the_same_field() {
        let mut extensions = Extensions::new();
        let all = [Spent::Queue, Spent::Cache, Spent::Backend, Spent::Retry, Spent::Hedge];
        let parts: Vec<_> = all.iter().map(|p| (*p, Duration::from_secs(100_000))).collect();
        set(&mut extensions, &parts);
        let line = Line::answer(extensions.remove::<Noted>(), Duration::from_secs(u64::MAX), None);
        let mut headers = HeaderMap::new();
        line.store(&mut headers);
        let field = headers[SERVER_TIMING].to_str().expect("ascii").to_owned();
        assert_eq!(field.matches(";dur=").count(), 7, "{field}");
        assert!(field.ends_with("total;dur=4294967.294"), "saturates: {field}");
        let mut head = b"HTTP/1.1 200 OK\r\n".to_vec();
        line.write(&mut head);
        assert_eq!(
            head,
            format!("HTTP/1.1 200 OK\r\nserver-timing: {field}\r\n").into_bytes()
        );
    }

    #[test]
    fn an_llm_answers_tokens_follow_its_times() {
        let mut extensions = Extensions::new();
        tokens(&mut extensions, 21, u64::MAX);
        set(&mut extensions, &[(Spent::Queue, us(40))]);
        let mut headers = HeaderMap::new();
        let line = Line::answer(extensions.remove::<Noted>(), us(1_000), Some(us(900)));
        line.with_tokens(extensions.remove::<Tokens>()).store(&mut headers);
        assert_eq!(
            headers[SERVER_TIMING],
            "queue;dur=0.040, backend;dur=0.900, gateway;dur=0.060, total;dur=1.000, \
             prompt_tokens;desc=21, completion_tokens;desc=4294967294"
        );
    }
}
