//! Where an answer's time went: its `Server-Timing` field (W3C Server Timing), its
//! parts noted by the steps of the path that spend the time and the field written by
//! the door.
//!
//! Noted, in milliseconds with microsecond precision: `queue` (a micro-batch request's
//! wait for its batch to go out: tiergate forms a batch the moment a slot frees, so
//! this is also its batch wait), `cache` (the cache's lookup, or a coalesced request's
//! wait for the call it joined), `backend` (the backend call that gave the answer: the
//! micro-batch the request rode in, or the real-time tier's call to its pool, from the
//! endpoint's choice to the answer read), `retry` (calls that failed before it, on
//! other endpoints), `hedge` (how long the call ran before the copy that answered was
//! sent). A step with parts to say notes them ([`Noted`]) in the answer's extensions;
//! the real-time tier's plain call notes none (the door is given the tier's time beside
//! the answer, so the common path adds nothing to the answer before the door). The door
//! [`close`]s: the parts, `gateway` (the rest of the total: the gateway's own work) and
//! `total` (from the request's head read to the answer), so the parts add up to the
//! total to the microsecond. A backend's own `Server-Timing` is replaced. An error
//! answer carries `total` only. A leaf, as [`crate::headers`].

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::{Extensions, HeaderMap, HeaderName, HeaderValue};

/// `Server-Timing`.
pub const SERVER_TIMING: HeaderName = HeaderName::from_static("server-timing");

/// Where a part of an answer's time was spent, in the order the field names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Spent {
    /// A micro-batch request's wait for its batch.
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

impl Spent {
    const ALL: [Spent; 5] = [Spent::Queue, Spent::Cache, Spent::Backend, Spent::Retry, Spent::Hedge];

    fn name(self) -> &'static [u8] {
        match self {
            Spent::Queue => b"queue",
            Spent::Cache => b"cache",
            Spent::Backend => b"backend",
            Spent::Retry => b"retry",
            Spent::Hedge => b"hedge",
        }
    }
}

/// The parts of an answer's time noted for it, in its extensions until the door
/// writes them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Noted([Option<Duration>; 5]);

/// Notes `parts` for an answer with `extensions`, replacing any noted before.
pub fn set(extensions: &mut Extensions, parts: &[(Spent, Duration)]) {
    let mut noted = Noted::default();
    for (part, took) in parts {
        noted.0[*part as usize] = Some(*took);
    }
    extensions.insert(noted);
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

/// Writes `headers`' `Server-Timing` for an answer that took `total`: the `parts` noted
/// (taken from its extensions), `backend` as `tier` when they do not name it and a tier
/// served the answer, `gateway` (what the other parts do not account for) and `total`.
pub fn close(headers: &mut HeaderMap, parts: Option<Noted>, total: Duration, tier: Option<Duration>) {
    let mut parts = parts.unwrap_or_default();
    if parts.0[Spent::Backend as usize].is_none() {
        parts.0[Spent::Backend as usize] = tier;
    }
    let mut field = Field::default();
    let mut spent = Duration::ZERO;
    for part in Spent::ALL {
        if let Some(took) = parts.0[part as usize] {
            spent += took;
            field.part(part.name(), took);
        }
    }
    field.part(b"gateway", total.saturating_sub(spent));
    field.part(b"total", total);
    field.store(headers);
}

/// Writes `headers`' `Server-Timing` for an error answer that took `total`: `total`
/// alone (the parts of a call that failed are not known to the door).
pub fn close_error(headers: &mut HeaderMap, total: Duration) {
    let mut field = Field::default();
    field.part(b"total", total);
    field.store(headers);
}

/// Room for a field: seven parts of at most 28 bytes each.
const MAX: usize = 7 * 28;

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
    /// `name;dur=MS.mmm`, after `, ` when not first. A name is at most 7 bytes and a
    /// duration at most 10^8 ms (27 hours, more than any budget): 28 bytes at most.
    fn part(&mut self, name: &[u8], took: Duration) {
        let micros = u64::try_from(took.as_micros()).unwrap_or(u64::MAX).min(99_999_999_999);
        let Some(out) = self.buf.get_mut(self.len..self.len + 28) else {
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

    /// Stores the field as `headers`' `Server-Timing` (replacing a backend's own), its
    /// bytes cut from this thread's chunk (see [`shared`]).
    fn store(&self, headers: &mut HeaderMap) {
        if let Ok(value) = HeaderValue::from_maybe_shared(shared(&self.buf[..self.len])) {
            headers.insert(SERVER_TIMING, value);
        }
    }
}

/// `bytes` as shared bytes cut from a chunk this thread keeps for answers' fields, as
/// a buffer pool does: a chunk serves forty fields or more before the next is
/// allocated, and is freed when the last answer cut from it is gone. (A field
/// allocated on its own would add an allocation to every request.)
fn shared(bytes: &[u8]) -> Bytes {
    const CHUNK: usize = 8 << 10;
    thread_local!(static CHUNK_LEFT: std::cell::RefCell<BytesMut> = std::cell::RefCell::new(BytesMut::new()));
    CHUNK_LEFT.with_borrow_mut(|chunk| {
        if chunk.capacity() < bytes.len() {
            *chunk = BytesMut::with_capacity(CHUNK.max(bytes.len()));
        }
        chunk.extend_from_slice(bytes);
        chunk.split().freeze()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn us(n: u64) -> Duration {
        Duration::from_micros(n)
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
    fn every_part_and_the_longest_durations_fit() {
        let mut extensions = Extensions::new();
        let parts: Vec<_> = Spent::ALL.iter().map(|p| (*p, Duration::from_secs(100_000))).collect();
        set(&mut extensions, &parts);
        let mut headers = HeaderMap::new();
        close(
            &mut headers,
            extensions.remove::<Noted>(),
            Duration::from_secs(u64::MAX),
            None,
        );
        let field = headers[SERVER_TIMING].to_str().expect("ascii").to_owned();
        assert_eq!(field.matches(";dur=").count(), 7, "{field}");
        assert!(field.ends_with("total;dur=99999999.999"), "{field}");
    }

    #[test]
    fn fields_cut_from_one_chunk_stay_apart() {
        let values: Vec<_> = (0..500u64)
            .map(|i| {
                let mut headers = HeaderMap::new();
                close(&mut headers, None, us(i), None);
                headers.remove(SERVER_TIMING).expect("made")
            })
            .collect();
        for (i, value) in values.iter().enumerate() {
            assert!(
                value.to_str().expect("ascii").ends_with(&format!("total;dur=0.{i:03}")),
                "{value:?}"
            );
        }
    }
}
