//! The plain infer request read in one pass over its bytes, without serde: the
//! envelope check's common case.
//!
//! Most real-time bodies are plain: an `id`, `inputs` each with a `name`, a `datatype`,
//! a `shape` and a JSON `data` array of numbers, and `outputs` by name. [`request`]
//! reads exactly those, and says `None` for anything else: `parameters` anywhere, a key
//! it does not know or sees twice, an escape or a byte outside printable ASCII in a
//! string, a string or null or object among the data, nesting past [`MAX_NESTING`], a
//! shape dimension that is negative or past 18 digits, any syntax error. serde then
//! reads the body as before, so every message of a bad-input answer is still serde's
//! and this reader needs none of its own. Whatever it accepts, serde accepts with the
//! same meaning ([`agrees_with_serde`], checked by a property test and a fuzz target).
//!
//! Why: serde_json validates each number of a `data` array digit by digit through its
//! general `ignore_value`, and builds every key and string through its visitors; for
//! the overhead scenario's `[1, 16]` FP32 body that was about 9,000 instructions, more
//! than a tenth of the whole real-time path (docs/performance-history.md).

use super::data::{Counted, Data};
use super::request::{WireOutput, WireRequest};
use super::wire::WireTensor;

/// The deepest array nesting the plain reader follows in `data`; deeper bodies go to
/// serde (the envelope check refuses nesting past 64, so nothing it would say is lost).
pub(crate) const MAX_NESTING: usize = 32;

/// The longest shape dimension, in digits, read here: any 18 digits fit in an `i64`.
const MAX_DIGITS: usize = 18;

/// `json` as serde would read it into a [`WireRequest`], when it is plain (see the
/// module's docs); `None` when it is not, or is not JSON.
pub(crate) fn request(json: &[u8]) -> Option<WireRequest<Counted>> {
    let mut r = Reader { json, at: 0 };
    let (mut id, mut inputs, mut outputs) = (None, None, None);
    r.object(|r, key| match key {
        b"id" => fill(&mut id, r.string()),
        b"inputs" => fill(&mut inputs, r.list(Reader::tensor)),
        b"outputs" => fill(&mut outputs, r.list(Reader::output)),
        _ => None,
    })?;
    r.space();
    (r.at == json.len()).then_some(())?;
    Some(WireRequest {
        id,
        parameters: None,
        inputs: inputs?,
        outputs,
    })
}

/// Whether serde reads `json` as [`request`] does, whenever [`request`] reads it:
/// the same id, tensors (names, datatypes, shapes, element counts) and outputs. For the
/// property test and the fuzz target.
#[doc(hidden)]
pub fn agrees_with_serde(json: &[u8]) -> bool {
    let Some(plain) = request(json) else {
        return true;
    };
    let Ok(serde) = super::wire::parse_json::<WireRequest<Counted>>("request", json) else {
        return false;
    };
    let tensor = |t: &WireTensor<Counted>| {
        let count = t.data.as_ref().map(|d| {
            let summary = super::data::Sink::summary(&d.0);
            (summary.count, format!("{:?}", summary.problem))
        });
        (
            t.name.clone(),
            t.datatype.clone(),
            t.shape.clone(),
            count,
            t.parameters.is_some(),
        )
    };
    let outputs = |o: &Option<Vec<WireOutput>>| {
        o.as_ref().map(|o| {
            o.iter()
                .map(|o| (o.name.clone(), o.parameters.is_some()))
                .collect::<Vec<_>>()
        })
    };
    plain.id == serde.id
        && serde.parameters.is_none()
        && plain.inputs.iter().map(tensor).eq(serde.inputs.iter().map(tensor))
        && outputs(&plain.outputs) == outputs(&serde.outputs)
}

/// Sets `slot` to `value` (a member's value, `None` when it is not plain): `None` when
/// either is, or the member came before (serde refuses a key twice).
fn fill<T>(slot: &mut Option<T>, value: Option<T>) -> Option<()> {
    if slot.is_some() {
        return None;
    }
    *slot = Some(value?);
    Some(())
}

/// A position in the body.
struct Reader<'a> {
    json: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn peek(&self) -> Option<u8> {
        self.json.get(self.at).copied()
    }

    /// JSON's whitespace: space, tab, line feed, carriage return.
    fn space(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.peek() {
            self.at += 1;
        }
    }

    /// Whitespace, then `byte`.
    fn eat(&mut self, byte: u8) -> Option<()> {
        self.space();
        (self.peek()? == byte).then(|| self.at += 1)
    }

    /// Whitespace, then a string of printable ASCII with no escape; its bytes (a key
    /// is compared as they are).
    fn raw_string(&mut self) -> Option<&'a [u8]> {
        self.eat(b'"')?;
        let start = self.at;
        loop {
            match self.peek()? {
                b'"' => break,
                b'\\' | ..=0x1f | 0x7f.. => return None,
                _ => self.at += 1,
            }
        }
        let text = &self.json[start..self.at];
        self.at += 1;
        Some(text)
    }

    /// [`Reader::raw_string`] as an owned string.
    fn string(&mut self) -> Option<String> {
        let text = self.raw_string()?;
        std::str::from_utf8(text).ok().map(str::to_owned)
    }

    /// An object, each member's value read by `member` (given the key) up to its end.
    fn object(&mut self, mut member: impl FnMut(&mut Self, &[u8]) -> Option<()>) -> Option<()> {
        self.eat(b'{')?;
        self.space();
        if self.peek()? == b'}' {
            self.at += 1;
            return Some(());
        }
        loop {
            let key = self.raw_string()?;
            self.eat(b':')?;
            member(self, key)?;
            self.space();
            match self.peek()? {
                b',' => self.at += 1,
                b'}' => {
                    self.at += 1;
                    return Some(());
                }
                _ => return None,
            }
        }
    }

    /// An array, each element read by `element`.
    fn list<T>(&mut self, mut element: impl FnMut(&mut Self) -> Option<T>) -> Option<Vec<T>> {
        self.eat(b'[')?;
        let mut items = Vec::new();
        self.space();
        if self.peek()? == b']' {
            self.at += 1;
            return Some(items);
        }
        loop {
            items.push(element(self)?);
            self.space();
            match self.peek()? {
                b',' => self.at += 1,
                b']' => {
                    self.at += 1;
                    return Some(items);
                }
                _ => return None,
            }
        }
    }

    /// An input: `name`, `datatype`, `shape` and optionally `data`, each once.
    fn tensor(&mut self) -> Option<WireTensor<Counted>> {
        let (mut name, mut datatype, mut shape, mut data) = (None, None, None, None);
        self.object(|r, key| match key {
            b"name" => fill(&mut name, r.string()),
            b"datatype" => fill(&mut datatype, r.string()),
            b"shape" => fill(&mut shape, r.list(Reader::dimension)),
            b"data" => fill(&mut data, r.elements().map(|n| Data(Counted::elements(n)))),
            _ => None,
        })?;
        Some(WireTensor {
            name: name?,
            datatype: datatype?,
            shape: shape?,
            parameters: None,
            data,
        })
    }

    /// An output asked for by name alone.
    fn output(&mut self) -> Option<WireOutput> {
        let mut name = None;
        self.object(|r, key| match key {
            b"name" => fill(&mut name, r.string()),
            _ => None,
        })?;
        Some(WireOutput {
            name: name?,
            parameters: None,
        })
    }

    /// A non-negative integer of at most [`MAX_DIGITS`] digits, no leading zero.
    fn dimension(&mut self) -> Option<i64> {
        self.space();
        let start = self.at;
        let mut value: i64 = 0;
        while let Some(digit @ b'0'..=b'9') = self.peek() {
            if self.at - start == MAX_DIGITS {
                return None;
            }
            value = value * 10 + i64::from(digit - b'0');
            self.at += 1;
        }
        let digits = self.at - start;
        (digits == 1 || (digits > 1 && self.json[start] != b'0')).then_some(value)
    }

    /// A `data` array of numbers, `true`, `false` and arrays of those, nested at most
    /// [`MAX_NESTING`] deep; how many scalars it holds.
    fn elements(&mut self) -> Option<u64> {
        self.eat(b'[')?;
        let (mut depth, mut count) = (1usize, 0u64);
        // Whether an array has just opened, so that `]` may come instead of a value.
        let mut opened = true;
        loop {
            self.space();
            match self.peek()? {
                b'[' => {
                    depth += 1;
                    if depth > MAX_NESTING {
                        return None;
                    }
                    self.at += 1;
                    opened = true;
                    continue;
                }
                b']' if opened => {}
                first => {
                    match first {
                        b't' => self.word(b"true")?,
                        b'f' => self.word(b"false")?,
                        _ => self.number()?,
                    }
                    count += 1;
                }
            }
            // After a value or an empty array's `[`: a comma, or arrays closing.
            loop {
                self.space();
                match self.peek()? {
                    b',' => {
                        self.at += 1;
                        opened = false;
                        break;
                    }
                    b']' => {
                        self.at += 1;
                        depth -= 1;
                        if depth == 0 {
                            return Some(count);
                        }
                    }
                    _ => return None,
                }
            }
        }
    }

    /// The literal `word`.
    fn word(&mut self, word: &[u8]) -> Option<()> {
        let end = self.at + word.len();
        (self.json.get(self.at..end)? == word).then(|| self.at = end)
    }

    /// A number as JSON writes one: `-`?, `0` or digits not starting with `0`, then an
    /// optional fraction and exponent, each with at least one digit.
    fn number(&mut self) -> Option<()> {
        if self.peek() == Some(b'-') {
            self.at += 1;
        }
        match self.peek()? {
            b'0' => self.at += 1,
            b'1'..=b'9' => self.digits(),
            _ => return None,
        }
        if self.peek() == Some(b'.') {
            self.at += 1;
            self.some_digits()?;
        }
        if let Some(b'e' | b'E') = self.peek() {
            self.at += 1;
            if let Some(b'+' | b'-') = self.peek() {
                self.at += 1;
            }
            self.some_digits()?;
        }
        Some(())
    }

    /// Steps over a run of ASCII digits, eight bytes at a time while eight are left.
    fn digits(&mut self) {
        while let Some(eight) = self.json.get(self.at..self.at + 8) {
            let word = u64::from_le_bytes(eight.try_into().unwrap_or_default());
            // A byte's top bit is set when it is below '0' (the subtraction borrows) or
            // above '9' (the addition reaches 0x80). A borrow or carry only spills into
            // the bytes after the first non-digit, so the lowest flagged byte is it.
            let flagged = (word.wrapping_sub(0x3030_3030_3030_3030) | word.wrapping_add(0x4646_4646_4646_4646))
                & 0x8080_8080_8080_8080;
            if flagged != 0 {
                self.at += (flagged.trailing_zeros() / 8) as usize;
                return;
            }
            self.at += 8;
        }
        while let Some(b'0'..=b'9') = self.peek() {
            self.at += 1;
        }
    }

    fn some_digits(&mut self) -> Option<()> {
        let start = self.at;
        self.digits();
        (self.at > start).then_some(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(json: &str) -> Option<WireRequest<Counted>> {
        let plain = request(json.as_bytes());
        assert!(agrees_with_serde(json.as_bytes()), "serde reads {json} otherwise");
        plain
    }

    fn counts(req: &WireRequest<Counted>) -> Vec<Option<u64>> {
        let count = |t: &WireTensor<Counted>| t.data.as_ref().map(|d| super::super::data::Sink::summary(&d.0).count);
        req.inputs.iter().map(count).collect()
    }

    #[test]
    fn a_plain_body_is_read_as_serde_reads_it() {
        let body = r#" {"id":"r-1","inputs":[{"name":"INPUT0","shape":[1,16],"datatype":"FP32","data":[0.0,0.003984064,1e-3,-2.5E+7,12,-0,true,false,[1,[2,3]],[]]}],
            "outputs" : [ {"name":"OUTPUT0"} ] }
"#;
        let req = read(body).expect("plain");
        assert_eq!(req.id.as_deref(), Some("r-1"));
        assert_eq!(req.inputs[0].shape, vec![1, 16]);
        assert_eq!(counts(&req), vec![Some(11)]);
        assert_eq!(req.outputs.as_ref().map(|o| o[0].name.as_str()), Some("OUTPUT0"));
        let empty = read(r#"{"inputs":[]}"#).expect("plain");
        assert!(empty.inputs.is_empty());
        let nested =
            read(r#"{"inputs":[{"name":"a","shape":[2,0],"datatype":"BOOL","data":[[],[[]]]}]}"#).expect("plain");
        assert_eq!(counts(&nested), vec![Some(0)]);
        let widest =
            read(r#"{"inputs":[{"name":"a","shape":[999999999999999999,0],"datatype":"FP32"}]}"#).expect("plain");
        assert_eq!(widest.inputs[0].shape, vec![999_999_999_999_999_999, 0]);
        let no_data = read(r#"{"inputs":[{"name":"a","shape":[0],"datatype":"FP32"}]}"#).expect("plain");
        assert_eq!(counts(&no_data), vec![None]);
    }

    #[test]
    fn runs_of_digits_end_at_the_first_other_byte_whatever_follows() {
        for text in ["", "7", "0123456789", "01234567", "012345678", "1234567890123456789x"] {
            for tail in ["", ",", "]", "/", ":", "\u{7f}", "\u{ff}", ".5e3", " 99999999"] {
                let json = format!("{text}{tail}");
                let mut r = Reader {
                    json: json.as_bytes(),
                    at: 0,
                };
                r.digits();
                let expected = json.bytes().take_while(u8::is_ascii_digit).count();
                assert_eq!(r.at, expected, "{json:?}");
            }
        }
        for byte in 0..=255u8 {
            let json = [b'1', b'2', b'3', byte, b'4', b'5', b'6', b'7', b'8', b'9'];
            let mut r = Reader { json: &json, at: 0 };
            r.digits();
            let expected = if byte.is_ascii_digit() { json.len() } else { 3 };
            assert_eq!(r.at, expected, "byte {byte:#x}");
        }
    }

    #[test]
    fn anything_else_goes_to_serde() {
        let tensor =
            |extra: &str| format!(r#"{{"inputs":[{{"name":"a","shape":[1],"datatype":"FP32","data":[1]{extra}}}]}}"#);
        for body in [
            tensor(r#","parameters":{"binary_data_size":4}"#),
            tensor(r#","name":"b""#),
            tensor(r#","extra":1"#),
            r#"{"inputs":[],"parameters":{"timeout":5}}"#.into(),
            r#"{"inputs":[],"inputs":[]}"#.into(),
            r#"{"id":"a\"b","inputs":[]}"#.into(),
            r#"{"id":"é","inputs":[]}"#.into(),
            r#"{"id":null,"inputs":[]}"#.into(),
            r#"{"outputs":[{"name":"o","parameters":{"binary_data":true}}],"inputs":[]}"#.into(),
            r#"{"inputs":[{"name":"a","shape":[-1],"datatype":"FP32"}]}"#.into(),
            r#"{"inputs":[{"name":"a","shape":[01],"datatype":"FP32"}]}"#.into(),
            r#"{"inputs":[{"name":"a","shape":[1234567890123456789],"datatype":"FP32"}]}"#.into(),
            r#"{"inputs":[{"name":"a","shape":[99999999999999999999999],"datatype":"FP32"}]}"#.into(),
            r#"{"inputs":[{"name":"a","shape":[1],"datatype":"BYTES","data":["x"]}]}"#.into(),
            r#"{"inputs":[{"name":"a","shape":[1],"datatype":"FP32","data":[null]}]}"#.into(),
            r#"{"inputs":[{"name":"a","shape":[1],"datatype":"FP32","data":5}]}"#.into(),
            r#"{"inputs":[{"name":"a","shape":[1],"datatype":"FP32"}]"#.into(),
            r#"{"inputs":[]} x"#.into(),
            r#"{}"#.into(),
        ] {
            assert!(read(&body).is_none(), "{body} read as plain");
        }
        for number in [
            "01", "1.", ".5", "+1", "-", "1e", "1e+", "NaN", "1.5e3.2", "0x1", "--1", "1 2", "tru",
        ] {
            let body = format!(r#"{{"inputs":[{{"name":"a","shape":[1],"datatype":"FP32","data":[{number}]}}]}}"#);
            assert!(read(&body).is_none(), "{body} read as plain");
            assert!(super::super::inspect_request(body.as_bytes(), None, super::super::BodyCheck::Envelope).is_err());
        }
        let deep = format!(
            r#"{{"inputs":[{{"name":"a","shape":[1],"datatype":"FP32","data":{}1{}}}]}}"#,
            "[".repeat(40),
            "]".repeat(40)
        );
        assert!(read(&deep).is_none());
    }
}
