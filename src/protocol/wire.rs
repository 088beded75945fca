//! The JSON shapes shared by requests and responses, and the checks that turn a wire
//! tensor list into validated tensors: names, datatypes, shapes, JSON element counts
//! and values, and the placement of binary tensors in the binary section.

use std::collections::HashMap;
use std::ops::Range;

use bytes::Bytes;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::binary::check_bytes_layout;
use super::data::{Data, Leaves, Problem, Sink, Summary, MAX_DEPTH};
use super::tensor::{fmt_shape, JsonData};
use super::{Datatype, Error, Tensor};

/// A tensor as the JSON header describes it.
#[derive(Deserialize)]
#[serde(bound(deserialize = "S: Sink"))]
pub(crate) struct WireTensor<S> {
    pub name: String,
    pub datatype: String,
    pub shape: Vec<i64>,
    #[serde(default)]
    pub parameters: Option<Map<String, Value>>,
    #[serde(default)]
    pub data: Option<Data<S>>,
}

/// A tensor as encoders describe it in a JSON header.
#[derive(Serialize)]
pub(crate) struct OutTensor<'a> {
    pub name: &'a str,
    pub datatype: &'static str,
    pub shape: &'a [u64],
    #[serde(skip_serializing_if = "Map::is_empty")]
    pub parameters: Map<String, Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data: Option<JsonData<'a>>,
}

/// A tensor that passed every check.
pub(crate) struct Checked<S> {
    pub name: String,
    pub datatype: Datatype,
    pub shape: Vec<u64>,
    pub source: Source<S>,
}

/// Where a checked tensor's data is.
pub(crate) enum Source<S> {
    /// In the JSON `data` field.
    Json(S),
    /// In the binary section, at `range` (offsets within the section).
    Binary { size: u64, range: Range<usize> },
}

/// Parses a JSON header, telling broken JSON apart from JSON of the wrong shape.
pub(crate) fn parse_json<T: DeserializeOwned>(body: &'static str, json: &[u8]) -> Result<T, Error> {
    serde_json::from_slice(json).map_err(|e| {
        let detail = e.to_string();
        match e.classify() {
            serde_json::error::Category::Data => Error::Malformed { body, detail },
            _ => Error::NotJson { body, detail },
        }
    })
}

/// The path of a parameter: `parameters.x` or `inputs[0].parameters.x`.
fn param_path(owner: &str, name: &str) -> String {
    if owner.is_empty() {
        format!("parameters.{name}")
    } else {
        format!("{owner}.parameters.{name}")
    }
}

pub(crate) fn bad_param(owner: &str, name: &str, expected: &'static str, value: &Value) -> Error {
    Error::BadParameter {
        param: param_path(owner, name),
        expected,
        value: value.to_string(),
    }
}

/// Reads an optional non-negative integer parameter.
pub(crate) fn param_u64(
    params: Option<&Map<String, Value>>,
    owner: &str,
    name: &str,
    expected: &'static str,
) -> Result<Option<u64>, Error> {
    match params.and_then(|p| p.get(name)) {
        None => Ok(None),
        Some(v) => v.as_u64().map(Some).ok_or_else(|| bad_param(owner, name, expected, v)),
    }
}

/// The parameters by which a Triton client points a tensor at a shared-memory region
/// it registered (system or CUDA).
const SHARED_MEMORY: [&str; 3] = [
    "shared_memory_region",
    "shared_memory_byte_size",
    "shared_memory_offset",
];

/// Refuses a tensor whose parameters (`has` says which it has) point at the client's shared memory: the
/// gateway runs on another host than the client's regions and forwards to model servers
/// on other hosts again, so it can neither read nor fill them.
pub(crate) fn no_shared_memory(owner: &str, has: impl Fn(&str) -> bool) -> Result<(), Error> {
    match SHARED_MEMORY.iter().find(|name| has(name)) {
        None => Ok(()),
        Some(name) => Err(Error::SharedMemory {
            param: format!("{owner}.parameters.{name}"),
        }),
    }
}

/// Reads an optional boolean parameter.
pub(crate) fn param_bool(params: Option<&Map<String, Value>>, owner: &str, name: &str) -> Result<Option<bool>, Error> {
    match params.and_then(|p| p.get(name)) {
        None => Ok(None),
        Some(v) => v
            .as_bool()
            .map(Some)
            .ok_or_else(|| bad_param(owner, name, "true or false", v)),
    }
}

/// Describes tensors for a JSON header; tensors chosen by `binary`, and those JSON
/// cannot carry exactly, go to the returned binary parts, in order.
pub(crate) fn out_tensors<'a>(
    tensors: &'a [Tensor],
    binary: &dyn Fn(&Tensor) -> bool,
) -> (Vec<OutTensor<'a>>, Vec<&'a Bytes>) {
    let mut parts = Vec::new();
    let out = tensors
        .iter()
        .map(|t| {
            let mut parameters = Map::new();
            let data = if binary(t) || !t.json_representable() {
                parameters.insert("binary_data_size".into(), t.data.len().into());
                parts.push(&t.data);
                None
            } else {
                Some(JsonData(t))
            };
            OutTensor {
                name: &t.name,
                datatype: t.datatype.as_str(),
                shape: &t.shape,
                parameters,
                data,
            }
        })
        .collect();
    (out, parts)
}

/// Each tensor's own parameters by name, `framing` left out, for the tensors that have
/// any left (requests' inputs, responses' outputs).
pub(crate) fn own_parameters<S>(
    wires: &[WireTensor<S>],
    framing: &[&str],
) -> std::collections::BTreeMap<String, Map<String, Value>> {
    let mut own = std::collections::BTreeMap::new();
    for wire in wires {
        let Some(parameters) = &wire.parameters else { continue };
        let kept: Map<String, Value> = parameters
            .iter()
            .filter(|(k, _)| !framing.contains(&k.as_str()))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        if !kept.is_empty() {
            own.insert(wire.name.clone(), kept);
        }
    }
    own
}

/// Gives each described tensor its own parameters from `own` (by name), beside the
/// framing ones the encoder wrote.
pub(crate) fn add_own_parameters(
    tensors: &mut [OutTensor<'_>],
    own: &std::collections::BTreeMap<String, Map<String, Value>>,
) {
    if own.is_empty() {
        return;
    }
    for t in tensors {
        if let Some(own) = own.get(t.name) {
            for (key, value) in own {
                t.parameters.entry(key.clone()).or_insert_with(|| value.clone());
            }
        }
    }
}

/// Builds a tensor from checked parts; binary data is a slice of `section`.
pub(crate) fn into_tensor(checked: Checked<Leaves>, section: &Bytes) -> Tensor {
    let data = match checked.source {
        Source::Json(leaves) => Bytes::from(leaves.to_raw(checked.datatype)),
        Source::Binary { range, .. } => section.slice(range),
    };
    Tensor {
        name: checked.name,
        datatype: checked.datatype,
        shape: checked.shape,
        data,
    }
}

/// Checks a tensor list (`kind` is `"inputs"` or `"outputs"`) against the binary section.
pub(crate) fn check_tensors<S: Sink>(
    kind: &'static str,
    wires: Vec<WireTensor<S>>,
    section: &[u8],
) -> Result<Vec<Checked<S>>, Error> {
    check_unique(kind, &wires)?;
    let mut checked = Vec::with_capacity(wires.len());
    for (i, wire) in wires.into_iter().enumerate() {
        checked.push(check_tensor(At::new(kind, i).as_str(), wire)?);
    }
    place_binary(kind, &mut checked, section)?;
    Ok(checked)
}

/// A tensor's path (`inputs[3]`), written on the stack: the path is needed only when
/// a check fails, so the success path makes no string.
pub(crate) struct At {
    bytes: [u8; 32],
    len: usize,
}

impl At {
    /// `kind[index]`; `kind` is `inputs` or `outputs`.
    pub(crate) fn new(kind: &str, index: usize) -> At {
        let mut at = At { bytes: [0; 32], len: 0 };
        let mut push = |b: u8| {
            if at.len < at.bytes.len() {
                at.bytes[at.len] = b;
                at.len += 1;
            }
        };
        kind.bytes().take(8).for_each(&mut push);
        push(b'[');
        decimal(index, &mut [0u8; 20]).iter().copied().for_each(&mut push);
        push(b']');
        at
    }

    pub(crate) fn as_str(&self) -> &str {
        std::str::from_utf8(&self.bytes[..self.len]).unwrap_or("?")
    }
}

/// `n` in decimal, written into `buf`: no formatter, no allocation.
pub(crate) fn decimal(mut n: usize, buf: &mut [u8; 20]) -> &[u8] {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return &buf[i..];
        }
    }
}

/// Up to this many tensors, names are compared pairwise: no allocation, and fewer
/// instructions than hashing for the one to four tensors of a typical request.
const PAIRWISE_UNIQUE: usize = 16;

fn check_unique<S>(kind: &str, wires: &[WireTensor<S>]) -> Result<(), Error> {
    let duplicate = |first: usize, i: usize| Error::DuplicateName {
        path: format!("{kind}[{i}]"),
        name: wires[i].name.clone(),
        first: format!("{kind}[{first}]"),
    };
    if wires.len() <= PAIRWISE_UNIQUE {
        for (i, wire) in wires.iter().enumerate() {
            if let Some(first) = wires[..i].iter().position(|w| w.name == wire.name) {
                return Err(duplicate(first, i));
            }
        }
        return Ok(());
    }
    let mut seen: HashMap<&str, usize> = HashMap::with_capacity(wires.len());
    for (i, wire) in wires.iter().enumerate() {
        if let Some(first) = seen.insert(&wire.name, i) {
            return Err(duplicate(first, i));
        }
    }
    Ok(())
}

fn check_tensor<S: Sink>(path: &str, wire: WireTensor<S>) -> Result<Checked<S>, Error> {
    if let Some(params) = &wire.parameters {
        no_shared_memory(path, |name| params.contains_key(name))?;
    }
    let datatype: Datatype = wire.datatype.parse().map_err(|_| Error::UnknownDatatype {
        path: path.to_owned(),
        value: wire.datatype.clone(),
    })?;
    let shape = check_shape(path, &wire.shape)?;
    let expected = "a non-negative integer (bytes)";
    let size = param_u64(wire.parameters.as_ref(), path, "binary_data_size", expected)?;
    let source = match (wire.data, size) {
        (Some(_), Some(_)) => return Err(Error::DataAndBinary { path: path.to_owned() }),
        (None, None) => return Err(Error::NoData { path: path.to_owned() }),
        (Some(Data(sink)), None) => {
            check_json(path, datatype, &shape, sink.summary())?;
            Source::Json(sink)
        }
        (None, Some(size)) => {
            check_binary_size(path, datatype, &shape, size)?;
            Source::Binary { size, range: 0..0 }
        }
    };
    Ok(Checked {
        name: wire.name,
        datatype,
        shape,
        source,
    })
}

/// Checks that every dimension is non-negative and the element count fits in a u64.
pub(crate) fn check_shape(path: &str, dims: &[i64]) -> Result<Vec<u64>, Error> {
    let mut shape = Vec::with_capacity(dims.len());
    let mut elements: u64 = 1;
    for (index, &value) in dims.iter().enumerate() {
        let dim = u64::try_from(value).map_err(|_| Error::NegativeDim {
            path: path.to_owned(),
            index,
            value,
        })?;
        elements = elements.checked_mul(dim).ok_or_else(|| Error::ShapeOverflow {
            path: path.to_owned(),
            shape: fmt_shape(dims),
        })?;
        shape.push(dim);
    }
    Ok(shape)
}

pub(crate) fn element_count(shape: &[u64]) -> u64 {
    // check_shape has ruled out overflow.
    shape.iter().product()
}

fn check_json(path: &str, datatype: Datatype, shape: &[u64], summary: &Summary) -> Result<(), Error> {
    if matches!(datatype, Datatype::Fp16 | Datatype::Bf16) {
        return Err(Error::JsonBinaryOnly {
            path: path.to_owned(),
            datatype,
        });
    }
    match summary.problem {
        Some(Problem::NotArray) => {
            let problem = "must be an array (flat or nested)".to_owned();
            return Err(Error::BadData {
                path: path.to_owned(),
                problem,
            });
        }
        Some(Problem::TooDeep) => {
            let problem = format!("is nested deeper than {MAX_DEPTH} arrays");
            return Err(Error::BadData {
                path: path.to_owned(),
                problem,
            });
        }
        Some(Problem::NotScalar(index, what)) => {
            let problem = format!("expected a number, boolean or string, got {what}");
            return Err(Error::BadElement {
                path: path.to_owned(),
                index,
                problem,
            });
        }
        None => {}
    }
    let expected = element_count(shape);
    if summary.count != expected {
        return Err(Error::ElementCount {
            path: path.to_owned(),
            shape: fmt_shape(shape),
            expected,
            actual: summary.count,
        });
    }
    summary.check(datatype).map_err(|(index, problem)| Error::BadElement {
        path: path.to_owned(),
        index,
        problem,
    })
}

fn check_binary_size(path: &str, datatype: Datatype, shape: &[u64], size: u64) -> Result<(), Error> {
    let Some(element_size) = datatype.element_size() else {
        return Ok(()); // BYTES: checked against the data once it is placed
    };
    let expected = u128::from(element_count(shape)) * element_size as u128;
    if u128::from(size) != expected {
        return Err(Error::BinarySize {
            path: path.to_owned(),
            size,
            datatype,
            shape: fmt_shape(shape),
            expected,
        });
    }
    Ok(())
}

/// Gives each binary tensor its range of the section, in tensor order, once the sizes
/// are known to add up to the section exactly; then checks BYTES layouts.
fn place_binary<S>(kind: &'static str, checked: &mut [Checked<S>], section: &[u8]) -> Result<(), Error> {
    let declared: u128 = checked
        .iter()
        .map(|c| match c.source {
            Source::Binary { size, .. } => u128::from(size),
            Source::Json(_) => 0,
        })
        .sum();
    if declared != section.len() as u128 {
        return Err(Error::BinarySection {
            tensors: kind,
            actual: section.len(),
            declared,
        });
    }
    let mut offset = 0usize;
    for (i, c) in checked.iter_mut().enumerate() {
        if let Source::Binary { size, range } = &mut c.source {
            // Every size fits: their sum equals the section length.
            let end = offset.saturating_add(usize::try_from(*size).unwrap_or(usize::MAX));
            *range = offset..end;
            offset = end;
            if c.datatype == Datatype::Bytes {
                let data = section.get(range.clone()).unwrap_or_default();
                check_bytes_layout(data, element_count(&c.shape)).map_err(|problem| Error::BadBytes {
                    path: format!("{kind}[{i}]"),
                    problem,
                })?;
            }
        }
    }
    Ok(())
}
