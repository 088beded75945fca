//! Server-sent events as a stream's bytes arrive: each complete event cut out as soon
//! as its blank line comes ([`Framer`]), its bytes kept as the backend sent them, and
//! its `event` name and `data` read ([`Event`]). Bounded: a framer holds at most one
//! event in progress, and refuses one larger than its limit.

use bytes::{Bytes, BytesMut};

/// One complete event: its bytes as sent (with the blank line that ended it), and what
/// its fields say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// The event's bytes, to relay unchanged.
    pub raw: Bytes,
    /// Its `event:` field, when it has one.
    pub name: Option<String>,
    /// Its `data:` lines joined by `\n`, when it has any.
    pub data: Option<Bytes>,
}

/// Why a stream's bytes are not events.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Malformed {
    /// One event is over the limit before its end came.
    #[error("an event is over {0} bytes (limits.max_stream_event_bytes)")]
    TooBig(usize),
    /// An event is not UTF-8.
    #[error("an event is not UTF-8 text")]
    NotText,
}

/// Cuts a stream's bytes into events, holding at most one event in progress. Bytes
/// taken in are cut into events where they lie (an event's `raw` and its one `data`
/// line are slices of them, not copies); only half an event is copied, to be joined
/// with the rest when it comes.
#[derive(Debug)]
pub struct Framer {
    /// Bytes taken in and not yet cut, while nothing is held.
    fresh: Bytes,
    held: BytesMut,
    max: usize,
    /// Bytes of `held` already searched for an event's end.
    searched: usize,
}

impl Framer {
    /// A framer refusing events over `max` bytes.
    pub fn new(max: usize) -> Self {
        Framer {
            fresh: Bytes::new(),
            held: BytesMut::new(),
            max,
            searched: 0,
        }
    }

    /// Takes `bytes` in.
    pub fn push(&mut self, bytes: Bytes) {
        if self.held.is_empty() && self.fresh.is_empty() {
            self.fresh = bytes;
            return;
        }
        self.hold_fresh();
        self.held.extend_from_slice(&bytes);
    }

    /// Copies what is left of the bytes taken in into `held` (half an event, or bytes
    /// to be joined with more).
    fn hold_fresh(&mut self) {
        if !self.fresh.is_empty() {
            self.held.extend_from_slice(&self.fresh);
            self.fresh = Bytes::new();
        }
    }

    /// The next complete event, `Ok(None)` while none is whole, or why the bytes are
    /// not events.
    pub fn next_event(&mut self) -> Result<Option<Event>, Malformed> {
        if !self.fresh.is_empty() {
            // Nothing held: an event whole in what came is cut where it lies.
            if let Some(end) = blank_line(&self.fresh, 0) {
                if end > self.max {
                    return Err(Malformed::TooBig(self.max));
                }
                return parse(self.fresh.split_to(end)).map(Some);
            }
            self.hold_fresh();
        }
        let Some(end) = blank_line(&self.held, self.searched) else {
            if self.held.len() > self.max {
                return Err(Malformed::TooBig(self.max));
            }
            // The last bytes may be half a line ending: search them again.
            self.searched = self.held.len().saturating_sub(3);
            return Ok(None);
        };
        if end > self.max {
            return Err(Malformed::TooBig(self.max));
        }
        self.searched = 0;
        let raw = self.held.split_to(end).freeze();
        parse(raw).map(Some)
    }

    /// Bytes held of an event not yet whole (or taken in and not yet cut).
    pub fn held(&self) -> usize {
        self.held.len() + self.fresh.len()
    }
}

/// Where the first event in `bytes` ends (after its blank line), searching from `from`.
fn blank_line(bytes: &[u8], from: usize) -> Option<usize> {
    let mut i = from;
    while i < bytes.len() {
        let at = memchr::memchr2(b'\n', b'\r', &bytes[i..])? + i;
        // A line ends at `at`; the event ends if the next line is empty.
        let next = match (bytes[at], bytes.get(at + 1)) {
            (b'\r', Some(b'\n')) => at + 2,
            (b'\r', None) => return None, // a CR that may be a CRLF's first half
            _ => at + 1,
        };
        match bytes.get(next) {
            Some(b'\n') => return Some(next + 1),
            Some(b'\r') => match bytes.get(next + 1) {
                Some(b'\n') => return Some(next + 2),
                Some(_) => return Some(next + 1),
                None => return None,
            },
            Some(_) => i = next,
            None => return None,
        }
    }
    None
}

/// An event's `data` lines as they are read: one is a slice of the event's bytes,
/// more are joined.
enum Data<'a> {
    One(&'a str),
    Joined(String),
}

/// An event's fields from its bytes.
fn parse(raw: Bytes) -> Result<Event, Malformed> {
    let text = std::str::from_utf8(&raw).map_err(|_| Malformed::NotText)?;
    let (mut name, mut data): (Option<String>, Option<Data<'_>>) = (None, None);
    for line in text.split(['\n', '\r']).filter(|l| !l.is_empty()) {
        let (field, value) = match line.split_once(':') {
            Some((field, value)) => (field, value.strip_prefix(' ').unwrap_or(value)),
            None => (line, ""),
        };
        match field {
            "event" => name = Some(value.to_owned()),
            "data" => {
                data = Some(match data {
                    None => Data::One(value),
                    Some(Data::One(first)) => Data::Joined(format!("{first}\n{value}")),
                    Some(Data::Joined(mut joined)) => {
                        joined.push('\n');
                        joined.push_str(value);
                        Data::Joined(joined)
                    }
                })
            }
            _ => {} // id, retry, comments (an empty field name)
        }
    }
    let data = data.map(|data| match data {
        Data::One(value) => raw.slice_ref(value.as_bytes()),
        Data::Joined(joined) => Bytes::from(joined),
    });
    Ok(Event { raw, name, data })
}

/// An event of one `data:` line holding `data` (which must have no line breaks).
pub fn data_event(data: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(data.len() + 8);
    out.extend_from_slice(b"data: ");
    out.extend_from_slice(data);
    out.extend_from_slice(b"\n\n");
    Bytes::from(out)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // in tests a failed unwrap is a failed test
mod tests {
    use super::*;

    fn all(framer: &mut Framer) -> Vec<Event> {
        std::iter::from_fn(|| framer.next_event().expect("events")).collect()
    }

    #[test]
    fn events_are_cut_at_their_blank_line_whatever_the_line_endings() {
        let mut f = Framer::new(1024);
        f.push(Bytes::from_static(
            b"data: {\"a\":1}\n\ndata: [DONE]\r\n\r\nevent: response.completed\ndata: x\ndata: y\r\rdata: z\n\n",
        ));
        let events = all(&mut f);
        assert_eq!(events.len(), 4);
        assert_eq!(events[0].raw, Bytes::from_static(b"data: {\"a\":1}\n\n"));
        assert_eq!(events[0].data.as_deref(), Some(&b"{\"a\":1}"[..]));
        assert_eq!(events[1].data.as_deref(), Some(&b"[DONE]"[..]));
        assert_eq!(events[2].name.as_deref(), Some("response.completed"));
        assert_eq!(events[2].data.as_deref(), Some(&b"x\ny"[..]));
        assert_eq!(f.held(), 0);
    }

    #[test]
    fn an_event_split_anywhere_comes_out_once_whole() {
        let stream = b": comment\n\ndata: one\n\ndata: two\r\n\r\n";
        for cut in 0..stream.len() {
            let mut f = Framer::new(1024);
            f.push(Bytes::from_static(&stream[..cut]));
            let mut got = all(&mut f);
            f.push(Bytes::from_static(&stream[cut..]));
            got.extend(all(&mut f));
            let data: Vec<_> = got.iter().map(|e| e.data.clone()).collect();
            assert_eq!(
                data,
                vec![None, Some(Bytes::from_static(b"one")), Some(Bytes::from_static(b"two"))],
                "cut at {cut}"
            );
            assert_eq!(got.iter().map(|e| e.raw.len()).sum::<usize>(), stream.len());
        }
    }

    #[test]
    fn bytes_taken_in_twice_before_a_look_come_out_joined_and_in_order() {
        let mut f = Framer::new(1024);
        f.push(Bytes::from_static(b"data: one\n\ndata: t"));
        f.push(Bytes::from_static(b"wo\n\n"));
        assert_eq!(f.held(), 22);
        let data: Vec<_> = all(&mut f).into_iter().map(|e| e.data).collect();
        assert_eq!(
            data,
            vec![Some(Bytes::from_static(b"one")), Some(Bytes::from_static(b"two"))]
        );
        assert_eq!(f.held(), 0);
    }

    #[test]
    fn an_event_over_the_limit_or_not_text_is_refused() {
        let mut f = Framer::new(16);
        f.push(Bytes::from_static(b"data: 0123456789abcdef"));
        assert_eq!(f.next_event(), Err(Malformed::TooBig(16)));
        let mut f = Framer::new(16);
        f.push(Bytes::from_static(b"data: \xff\n\n"));
        assert_eq!(f.next_event(), Err(Malformed::NotText));
        assert_eq!(data_event(b"[DONE]"), Bytes::from_static(b"data: [DONE]\n\n"));
    }
}
