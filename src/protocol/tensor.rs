//! [`Tensor`], the one in-memory form of tensor data (raw little-endian bytes), and
//! its JSON rendering for encoders. Decoders build tensors in `wire`/`data`.

use bytes::Bytes;
use serde::ser::{Serialize, Serializer};

use super::Datatype;

/// One tensor with its data in raw form: little-endian elements, row-major; BYTES
/// elements each as a u32 LE length followed by the bytes (Triton's binary layout);
/// BOOL one byte per element (0 or 1); FP16 as raw 2-byte halves.
///
/// Decoders guarantee `data` matches `datatype` and `shape`; encoders accept any
/// tensor and never panic (data JSON cannot represent is sent binary).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tensor {
    /// Tensor name, unique within a request or response.
    pub name: String,
    /// Element type.
    pub datatype: Datatype,
    /// Dimensions, outermost first; dimension 0 is the batch dimension.
    pub shape: Vec<u64>,
    /// Raw element bytes, see the type's documentation.
    pub data: Bytes,
}

/// Serializes a tensor's raw data as a flat JSON array.
pub(crate) struct JsonData<'a>(pub &'a Tensor);

/// Iterates over the elements of BYTES raw data; stops at the first malformed prefix.
pub(crate) struct BytesElements<'a>(pub &'a [u8]);

impl Tensor {
    /// The number of rows: `shape[0]`, or 1 for a rank-0 (scalar) tensor.
    pub fn rows(&self) -> u64 {
        self.shape.first().copied().unwrap_or(1)
    }

    /// The product of the shape (1 for rank 0), saturating at `u64::MAX`; decoded
    /// tensors never saturate.
    pub fn element_count(&self) -> u64 {
        self.shape.iter().fold(1u64, |n, d| n.saturating_mul(*d))
    }

    /// The elements of a BYTES tensor, in order, without their length prefixes.
    /// Stops early at malformed data (decoded tensors are never malformed); for other
    /// datatypes the raw data is read as if it were BYTES, which is rarely useful.
    pub fn bytes_elements(&self) -> impl Iterator<Item = &[u8]> + '_ {
        BytesElements(&self.data)
    }

    /// Whether JSON can carry this tensor exactly: not FP16 or BF16, no NaN or infinity,
    /// BYTES only when every element is UTF-8, and data that tiles into whole elements.
    pub(crate) fn json_representable(&self) -> bool {
        let data = &self.data[..];
        match self.datatype {
            Datatype::Fp16 | Datatype::Bf16 => false,
            Datatype::Fp32 => {
                data.len() % 4 == 0 && data.chunks_exact(4).all(|c| f32::from_le_bytes(le(c)).is_finite())
            }
            Datatype::Fp64 => {
                data.len() % 8 == 0 && data.chunks_exact(8).all(|c| f64::from_le_bytes(le(c)).is_finite())
            }
            Datatype::Bytes => {
                let mut it = BytesElements(data);
                it.by_ref().all(|e| std::str::from_utf8(e).is_ok()) && it.0.is_empty()
            }
            other => other.element_size().is_some_and(|size| data.len() % size == 0),
        }
    }
}

/// Copies a chunk from `chunks_exact(N)` into an array (always exactly N bytes).
pub(crate) fn le<const N: usize>(chunk: &[u8]) -> [u8; N] {
    chunk.try_into().unwrap_or([0; N])
}

/// Formats a shape the way error messages show it: `[2,3]`.
pub(crate) fn fmt_shape<T: std::fmt::Display>(shape: &[T]) -> String {
    let dims: Vec<String> = shape.iter().map(ToString::to_string).collect();
    format!("[{}]", dims.join(","))
}

impl<'a> Iterator for BytesElements<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        let (prefix, rest) = self.0.split_first_chunk::<4>()?;
        let len = usize::try_from(u32::from_le_bytes(*prefix)).ok()?;
        if len > rest.len() {
            return None;
        }
        let (element, rest) = rest.split_at(len);
        self.0 = rest;
        Some(element)
    }
}

macro_rules! le_seq {
    ($s:expr, $data:expr, $t:ty) => {
        $s.collect_seq(
            $data
                .chunks_exact(std::mem::size_of::<$t>())
                .map(|c| <$t>::from_le_bytes(le(c))),
        )
    };
}

impl Serialize for JsonData<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let data = &self.0.data[..];
        match self.0.datatype {
            Datatype::Bool => s.collect_seq(data.iter().map(|b| *b != 0)),
            Datatype::Uint8 => s.collect_seq(data.iter()),
            Datatype::Int8 => s.collect_seq(data.iter().map(|b| *b as i8)),
            Datatype::Uint16 => le_seq!(s, data, u16),
            Datatype::Int16 => le_seq!(s, data, i16),
            Datatype::Uint32 => le_seq!(s, data, u32),
            Datatype::Int32 => le_seq!(s, data, i32),
            Datatype::Uint64 => le_seq!(s, data, u64),
            Datatype::Int64 => le_seq!(s, data, i64),
            Datatype::Fp32 => le_seq!(s, data, f32),
            Datatype::Fp64 => le_seq!(s, data, f64),
            // Encoders send FP16 and BF16 binary; an empty array keeps this total.
            Datatype::Fp16 | Datatype::Bf16 => s.collect_seq(std::iter::empty::<u8>()),
            Datatype::Bytes => s.collect_seq(BytesElements(data).map(|e| std::str::from_utf8(e).unwrap_or_default())),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // in tests a failed unwrap is a failed test
mod tests {
    use super::*;

    fn tensor(datatype: Datatype, shape: &[u64], data: &[u8]) -> Tensor {
        Tensor {
            name: "t".into(),
            datatype,
            shape: shape.to_vec(),
            data: Bytes::copy_from_slice(data),
        }
    }

    #[test]
    fn rows_and_elements() {
        let table: [(&[u64], u64, u64); 4] = [(&[], 1, 1), (&[4], 4, 4), (&[2, 3], 2, 6), (&[0, 5], 0, 0)];
        for (shape, rows, elements) in table {
            let t = tensor(Datatype::Uint8, shape, &[]);
            assert_eq!((t.rows(), t.element_count()), (rows, elements), "{shape:?}");
        }
        assert_eq!(tensor(Datatype::Uint8, &[u64::MAX, 2], &[]).element_count(), u64::MAX);
    }

    #[test]
    fn representable_in_json() {
        let nan = f32::NAN.to_le_bytes();
        let table: [(Datatype, &[u8], bool); 8] = [
            (Datatype::Fp16, &[0, 0], false),
            (Datatype::Bf16, &[0x80, 0x3f], false),
            (Datatype::Fp32, &1.5f32.to_le_bytes(), true),
            (Datatype::Fp32, &nan, false),
            (Datatype::Int32, &[1, 2, 3], false),
            (Datatype::Bytes, &[2, 0, 0, 0, b'h', b'i'], true),
            (Datatype::Bytes, &[1, 0, 0, 0, 0xff], false),
            (Datatype::Bytes, &[9, 0, 0, 0, b'h'], false),
        ];
        for (datatype, data, json) in table {
            assert_eq!(
                tensor(datatype, &[1], data).json_representable(),
                json,
                "{datatype} {data:?}"
            );
        }
    }

    #[test]
    fn json_rendering() {
        let table: [(Datatype, &[u8], &str); 5] = [
            (Datatype::Bool, &[1, 0], "[true,false]"),
            (Datatype::Int8, &[0xff, 2], "[-1,2]"),
            (Datatype::Uint16, &[1, 1], "[257]"),
            (Datatype::Fp32, &0.1f32.to_le_bytes(), "[0.1]"),
            (Datatype::Bytes, &[1, 0, 0, 0, b'a', 0, 0, 0, 0], "[\"a\",\"\"]"),
        ];
        for (datatype, data, json) in table {
            let t = tensor(datatype, &[2], data);
            assert_eq!(serde_json::to_string(&JsonData(&t)).unwrap(), json, "{datatype}");
        }
    }
}
