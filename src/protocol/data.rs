//! JSON tensor `data` arrays, read in one pass without a `serde_json::Value` tree.
//!
//! A [`Summary`] records just enough about the elements (count, kinds seen, extreme
//! integers and floats, each with its row-major index) to check them against a datatype
//! without storing them: the real-time path's [`inspect_request`](super::inspect_request)
//! uses it alone and allocates nothing per element. [`Leaves`] also keeps the elements
//! so that [`decode_request`](super::decode_request) can turn them into raw bytes.
//! [`Counted`] reads no value at all: the array is skipped as raw JSON text and its
//! elements counted in one pass over the bytes (the envelope check, [`super::BodyCheck`]).

use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;

use super::Datatype;

/// Deepest array nesting accepted in `data`; far beyond any real tensor rank, and it
/// bounds the visitor's recursion.
pub(crate) const MAX_DEPTH: usize = 64;

/// One JSON scalar as the parser hands it over.
#[derive(Clone, Copy)]
pub(crate) enum Leaf<'a> {
    Bool(bool),
    U64(u64),
    I64(i64),
    F64(f64),
    Str(&'a str),
}

/// Something wrong with the structure of a `data` array, found while parsing.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Problem {
    NotArray,
    TooDeep,
    /// A null or an object at the given element index.
    NotScalar(u64, &'static str),
}

/// What a `data` array holds, enough to check it against any datatype.
#[derive(Debug, Default)]
pub(crate) struct Summary {
    pub count: u64,
    pub problem: Option<Problem>,
    first_bool: Option<u64>,
    first_str: Option<u64>,
    first_number: Option<u64>,
    first_float: Option<(u64, f64)>,
    first_long_str: Option<u64>,
    min_int: Option<(u64, i64)>,
    max_int: Option<(u64, u64)>,
    max_abs_float: Option<(u64, f64)>,
}

/// Where parsed elements go: a [`Summary`] alone, [`Leaves`], or [`Counted`].
pub(crate) trait Sink: Default {
    fn summary(&self) -> &Summary;
    fn summary_mut(&mut self) -> &mut Summary;
    fn keep(&mut self, leaf: Leaf<'_>);

    /// Reads a `data` array into a new sink: element by element, through the parser.
    fn read<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let mut sink = Self::default();
        deserializer.deserialize_any(Node {
            sink: &mut sink,
            depth: 0,
        })?;
        Ok(sink)
    }
}

/// A `data` array's elements counted and its structure checked (an array of arrays
/// and scalars, not too deep), its values never read: what the envelope check needs.
#[derive(Debug, Default)]
pub(crate) struct Counted(Summary);

/// The elements of a `data` array in row-major order, strings in one shared arena.
#[derive(Debug, Default)]
pub(crate) struct Leaves {
    summary: Summary,
    items: Vec<Stored>,
    arena: Vec<u8>,
}

#[derive(Debug, Clone, Copy)]
enum Stored {
    Bool(bool),
    U64(u64),
    I64(i64),
    F64(f64),
    Str(usize, usize),
}

/// A parsed `data` field.
pub(crate) struct Data<S>(pub S);

struct Node<'s, S> {
    sink: &'s mut S,
    depth: usize,
}

impl Summary {
    fn add(&mut self, leaf: Leaf<'_>) {
        let i = self.count;
        self.count += 1;
        match leaf {
            Leaf::Bool(_) => {
                self.first_bool.get_or_insert(i);
            }
            Leaf::Str(s) => {
                self.first_str.get_or_insert(i);
                if u32::try_from(s.len()).is_err() {
                    self.first_long_str.get_or_insert(i);
                }
            }
            Leaf::U64(v) => {
                self.first_number.get_or_insert(i);
                if self.max_int.is_none_or(|(_, m)| v > m) {
                    self.max_int = Some((i, v));
                }
            }
            Leaf::I64(v) => {
                self.first_number.get_or_insert(i);
                if self.min_int.is_none_or(|(_, m)| v < m) {
                    self.min_int = Some((i, v));
                }
            }
            Leaf::F64(v) => {
                self.first_number.get_or_insert(i);
                self.first_float.get_or_insert((i, v));
                if self.max_abs_float.is_none_or(|(_, m)| v.abs() > m.abs()) {
                    self.max_abs_float = Some((i, v));
                }
            }
        }
    }

    /// Checks every element against `datatype`; on failure returns the row-major index
    /// of an offending element (the earliest of the problems found) and what is wrong.
    /// FP16 is not checked here: JSON FP16 is refused before.
    pub(crate) fn check(&self, datatype: Datatype) -> Result<(), (u64, String)> {
        let kind = |found: Option<u64>, msg: &str| found.map(|i| (i, msg.to_owned()));
        let mut found: Vec<(u64, String)> = Vec::new();
        match datatype {
            Datatype::Bool => {
                found.extend(kind(self.first_number, "expected true or false, got a number"));
                found.extend(kind(self.first_str, "expected true or false, got a string"));
            }
            Datatype::Bytes => {
                found.extend(kind(self.first_number, "expected a string, got a number"));
                found.extend(kind(self.first_bool, "expected a string, got a boolean"));
                found.extend(kind(self.first_long_str, "string is longer than 4 GiB"));
            }
            Datatype::Fp16 | Datatype::Bf16 | Datatype::Fp32 | Datatype::Fp64 => {
                found.extend(kind(self.first_bool, "expected a number, got a boolean"));
                found.extend(kind(self.first_str, "expected a number, got a string"));
                let too_big = self.max_abs_float.filter(|(_, v)| (*v as f32).is_infinite());
                if datatype == Datatype::Fp32 {
                    found.extend(too_big.map(|(i, v)| (i, out_of_range(format!("{v:?}"), datatype))));
                }
            }
            _ => self.check_int(datatype, &mut found),
        }
        found.into_iter().min_by_key(|(i, _)| *i).map_or(Ok(()), Err)
    }

    fn check_int(&self, datatype: Datatype, found: &mut Vec<(u64, String)>) {
        let wrong = |found: Option<u64>, what: &str| found.map(|i| (i, format!("expected an integer, got {what}")));
        found.extend(wrong(self.first_bool, "a boolean"));
        found.extend(wrong(self.first_str, "a string"));
        found.extend(
            self.first_float
                .map(|(i, v)| (i, format!("expected an integer, got {v:?}"))),
        );
        let Some((lo, hi)) = datatype.int_range() else {
            return;
        };
        if let Some((i, v)) = self.min_int.filter(|(_, v)| i128::from(*v) < lo) {
            found.push((i, out_of_range(v, datatype)));
        }
        if let Some((i, v)) = self.max_int.filter(|(_, v)| i128::from(*v) > hi) {
            found.push((i, out_of_range(v, datatype)));
        }
    }
}

fn out_of_range(value: impl fmt::Display, datatype: Datatype) -> String {
    format!("{value} is out of range for {datatype}")
}

impl Sink for Summary {
    fn summary(&self) -> &Summary {
        self
    }
    fn summary_mut(&mut self) -> &mut Summary {
        self
    }
    fn keep(&mut self, leaf: Leaf<'_>) {
        self.add(leaf);
    }
}

impl Counted {
    /// A `data` array of `count` scalars, its structure already checked (as
    /// [`super::plain`] does).
    pub(crate) fn elements(count: u64) -> Counted {
        Counted(Summary {
            count,
            ..Summary::default()
        })
    }
}

impl Sink for Counted {
    fn summary(&self) -> &Summary {
        &self.0
    }
    fn summary_mut(&mut self) -> &mut Summary {
        &mut self.0
    }
    fn keep(&mut self, _: Leaf<'_>) {
        self.0.count += 1;
    }

    /// The array's text as the parser skipped it (checked as JSON, nothing built), then
    /// counted: a number is never turned into a float.
    fn read<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let raw = <&'de serde_json::value::RawValue>::deserialize(deserializer)?;
        Ok(Counted(count(raw.get().as_bytes())))
    }
}

/// What [`Summary`] would say of the structure of `text`, a JSON value already checked
/// as such: its scalars counted (in arrays nested up to [`MAX_DEPTH`]), the first null or
/// object in place of an element, or that it is not an array or nests too deep. Values
/// are only stepped over.
fn count(text: &[u8]) -> Summary {
    let mut summary = Summary::default();
    let mut depth = 0;
    let mut i = 0;
    while i < text.len() {
        match text[i] {
            b' ' | b'\t' | b'\n' | b'\r' | b',' => i += 1,
            b'[' => {
                depth += 1;
                if depth > MAX_DEPTH {
                    summary.problem.get_or_insert(Problem::TooDeep);
                    return summary;
                }
                i += 1;
            }
            b']' => {
                depth = depth.saturating_sub(1);
                i += 1;
                if depth == 0 {
                    break;
                }
            }
            _ if depth == 0 => {
                summary.problem.get_or_insert(Problem::NotArray);
                return summary;
            }
            b'"' => {
                summary.count += 1;
                i = after_string(text, i);
            }
            b'{' => {
                summary
                    .problem
                    .get_or_insert(Problem::NotScalar(summary.count, "an object"));
                i = after_object(text, i);
            }
            b'n' => {
                summary.problem.get_or_insert(Problem::NotScalar(summary.count, "null"));
                i += 4;
            }
            _ => {
                // A number, true or false: it holds neither a comma nor a bracket, so the
                // next of those (found a vector at a time) ends it.
                summary.count += 1;
                i = memchr::memchr2(b',', b']', &text[i..]).map_or(text.len(), |k| i + k);
            }
        }
    }
    summary
}

/// The index just past the string that opens at `text[start]` (a `"`).
fn after_string(text: &[u8], start: usize) -> usize {
    let mut i = start + 1;
    while let Some(k) = memchr::memchr2(b'"', b'\\', &text[i.min(text.len())..]) {
        match text[i + k] {
            b'"' => return i + k + 1,
            _ => i += k + 2, // an escape: the next byte is never the string's end
        }
    }
    text.len()
}

/// The index just past the object that opens at `text[start]` (a `{`), strings and
/// nested objects and arrays within it stepped over.
fn after_object(text: &[u8], start: usize) -> usize {
    let mut nesting = 0usize;
    let mut i = start;
    while i < text.len() {
        match text[i] {
            b'"' => {
                i = after_string(text, i);
                continue;
            }
            b'{' | b'[' => nesting += 1,
            b'}' | b']' => {
                nesting -= 1;
                if nesting == 0 {
                    return i + 1;
                }
            }
            _ => {}
        }
        i += 1;
    }
    i
}

impl Sink for Leaves {
    fn summary(&self) -> &Summary {
        &self.summary
    }
    fn summary_mut(&mut self) -> &mut Summary {
        &mut self.summary
    }
    fn keep(&mut self, leaf: Leaf<'_>) {
        self.summary.add(leaf);
        self.items.push(match leaf {
            Leaf::Bool(v) => Stored::Bool(v),
            Leaf::U64(v) => Stored::U64(v),
            Leaf::I64(v) => Stored::I64(v),
            Leaf::F64(v) => Stored::F64(v),
            Leaf::Str(s) => {
                let start = self.arena.len();
                self.arena.extend_from_slice(s.as_bytes());
                Stored::Str(start, self.arena.len())
            }
        });
    }
}

impl Leaves {
    /// The elements in the raw layout of `datatype`. Call only after
    /// `summary().check(datatype)` passed: conversions then lose nothing.
    pub(crate) fn to_raw(&self, datatype: Datatype) -> Vec<u8> {
        let size = datatype.element_size().unwrap_or(4);
        let mut out = Vec::with_capacity(self.items.len().saturating_mul(size) + self.arena.len());
        for item in &self.items {
            self.push_raw(&mut out, datatype, *item);
        }
        out
    }

    fn push_raw(&self, out: &mut Vec<u8>, datatype: Datatype, item: Stored) {
        let int = match item {
            Stored::U64(v) => i128::from(v),
            Stored::I64(v) => i128::from(v),
            _ => 0,
        };
        let float = match item {
            Stored::U64(v) => v as f64,
            Stored::I64(v) => v as f64,
            Stored::F64(v) => v,
            _ => 0.0,
        };
        match datatype {
            Datatype::Bool => out.push(u8::from(matches!(item, Stored::Bool(true)))),
            Datatype::Uint8 => out.push(int as u8),
            Datatype::Int8 => out.push(int as i8 as u8),
            Datatype::Uint16 => out.extend_from_slice(&(int as u16).to_le_bytes()),
            Datatype::Int16 => out.extend_from_slice(&(int as i16).to_le_bytes()),
            Datatype::Uint32 => out.extend_from_slice(&(int as u32).to_le_bytes()),
            Datatype::Int32 => out.extend_from_slice(&(int as i32).to_le_bytes()),
            Datatype::Uint64 => out.extend_from_slice(&(int as u64).to_le_bytes()),
            Datatype::Int64 => out.extend_from_slice(&(int as i64).to_le_bytes()),
            // Never reached: JSON FP16 and BF16 are refused before conversion.
            Datatype::Fp16 | Datatype::Bf16 => out.extend_from_slice(&[0, 0]),
            Datatype::Fp32 => out.extend_from_slice(&(float as f32).to_le_bytes()),
            Datatype::Fp64 => out.extend_from_slice(&float.to_le_bytes()),
            Datatype::Bytes => {
                let s = match item {
                    Stored::Str(start, end) => self.arena.get(start..end).unwrap_or_default(),
                    _ => &[],
                };
                let len = u32::try_from(s.len()).unwrap_or(u32::MAX);
                out.extend_from_slice(&len.to_le_bytes());
                out.extend_from_slice(s);
            }
        }
    }
}

impl<'de, S: Sink> Deserialize<'de> for Data<S> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        S::read(deserializer).map(Data)
    }
}

impl<'de, S: Sink> DeserializeSeed<'de> for Node<'_, S> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<S: Sink> Node<'_, S> {
    fn leaf(self, leaf: Leaf<'_>) {
        if self.depth == 0 {
            self.fail(Problem::NotArray);
        } else {
            self.sink.keep(leaf);
        }
    }

    fn not_scalar(self, what: &'static str) {
        let index = self.sink.summary().count;
        let problem = if self.depth == 0 {
            Problem::NotArray
        } else {
            Problem::NotScalar(index, what)
        };
        self.fail(problem);
    }

    fn fail(self, problem: Problem) {
        self.sink.summary_mut().problem.get_or_insert(problem);
    }
}

impl<'de, S: Sink> Visitor<'de> for Node<'_, S> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an array of numbers, booleans or strings, flat or nested")
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<(), E> {
        self.leaf(Leaf::Bool(v));
        Ok(())
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<(), E> {
        self.leaf(Leaf::I64(v));
        Ok(())
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<(), E> {
        self.leaf(Leaf::U64(v));
        Ok(())
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<(), E> {
        self.leaf(Leaf::F64(v));
        Ok(())
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<(), E> {
        self.leaf(Leaf::Str(v));
        Ok(())
    }

    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        self.not_scalar("null");
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        self.not_scalar("an object");
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        if self.depth >= MAX_DEPTH {
            // IgnoredAny still recurses, but serde_json's own depth limit bounds it.
            while seq.next_element::<IgnoredAny>()?.is_some() {}
            self.fail(Problem::TooDeep);
            return Ok(());
        }
        let depth = self.depth + 1;
        while seq
            .next_element_seed(Node {
                sink: &mut *self.sink,
                depth,
            })?
            .is_some()
        {}
        Ok(())
    }
}
