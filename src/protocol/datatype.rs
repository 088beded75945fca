//! Tensor element types of the KServe v2 protocol and their wire names.

use std::fmt;
use std::str::FromStr;

/// The element type of a tensor, as named on the wire (`"FP32"`, `"BYTES"`, ...).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Datatype {
    /// `BOOL`: one byte per element in binary, `true`/`false` in JSON.
    Bool,
    /// `UINT8`.
    Uint8,
    /// `UINT16`.
    Uint16,
    /// `UINT32`.
    Uint32,
    /// `UINT64`.
    Uint64,
    /// `INT8`.
    Int8,
    /// `INT16`.
    Int16,
    /// `INT32`.
    Int32,
    /// `INT64`.
    Int64,
    /// `FP16`: IEEE half precision, binary only (Triton refuses it in JSON).
    Fp16,
    /// `BF16`: bfloat16 (the high half of an `FP32`), binary only as `FP16` is.
    Bf16,
    /// `FP32`.
    Fp32,
    /// `FP64`.
    Fp64,
    /// `BYTES`: variable-length byte strings; strings in JSON, u32-LE length prefixed in binary.
    Bytes,
}

/// A datatype name that is not one of the KServe v2 datatypes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("\"{0}\" is not a KServe v2 datatype")]
pub struct ParseDatatypeError(pub String);

impl Datatype {
    /// Every datatype, in the protocol's table order.
    pub const ALL: [Datatype; 14] = [
        Datatype::Bool,
        Datatype::Uint8,
        Datatype::Uint16,
        Datatype::Uint32,
        Datatype::Uint64,
        Datatype::Int8,
        Datatype::Int16,
        Datatype::Int32,
        Datatype::Int64,
        Datatype::Fp16,
        Datatype::Bf16,
        Datatype::Fp32,
        Datatype::Fp64,
        Datatype::Bytes,
    ];

    /// The wire name, e.g. `"FP32"`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Datatype::Bool => "BOOL",
            Datatype::Uint8 => "UINT8",
            Datatype::Uint16 => "UINT16",
            Datatype::Uint32 => "UINT32",
            Datatype::Uint64 => "UINT64",
            Datatype::Int8 => "INT8",
            Datatype::Int16 => "INT16",
            Datatype::Int32 => "INT32",
            Datatype::Int64 => "INT64",
            Datatype::Fp16 => "FP16",
            Datatype::Bf16 => "BF16",
            Datatype::Fp32 => "FP32",
            Datatype::Fp64 => "FP64",
            Datatype::Bytes => "BYTES",
        }
    }

    /// Bytes per element in the raw layout; `None` for `BYTES`, whose elements vary.
    pub fn element_size(&self) -> Option<usize> {
        match self {
            Datatype::Bool | Datatype::Uint8 | Datatype::Int8 => Some(1),
            Datatype::Uint16 | Datatype::Int16 | Datatype::Fp16 | Datatype::Bf16 => Some(2),
            Datatype::Uint32 | Datatype::Int32 | Datatype::Fp32 => Some(4),
            Datatype::Uint64 | Datatype::Int64 | Datatype::Fp64 => Some(8),
            Datatype::Bytes => None,
        }
    }

    /// The inclusive integer range of an integer datatype; `None` for the others.
    pub(crate) fn int_range(&self) -> Option<(i128, i128)> {
        let range = match self {
            Datatype::Uint8 => (0, u8::MAX.into()),
            Datatype::Uint16 => (0, u16::MAX.into()),
            Datatype::Uint32 => (0, u32::MAX.into()),
            Datatype::Uint64 => (0, u64::MAX.into()),
            Datatype::Int8 => (i8::MIN.into(), i8::MAX.into()),
            Datatype::Int16 => (i16::MIN.into(), i16::MAX.into()),
            Datatype::Int32 => (i32::MIN.into(), i32::MAX.into()),
            Datatype::Int64 => (i64::MIN.into(), i64::MAX.into()),
            _ => return None,
        };
        Some(range)
    }
}

impl fmt::Display for Datatype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Datatype {
    type Err = ParseDatatypeError;

    /// Parses a wire name; names are case-sensitive, as in Triton.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Datatype::ALL
            .into_iter()
            .find(|d| d.as_str() == s)
            .ok_or_else(|| ParseDatatypeError(s.to_owned()))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // in tests a failed unwrap is a failed test
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for d in Datatype::ALL {
            assert_eq!(d.as_str().parse::<Datatype>(), Ok(d));
        }
    }

    #[test]
    fn unknown_and_lowercase_names_are_refused() {
        for bad in ["FP33", "fp32", "", "STRING"] {
            let err = bad.parse::<Datatype>().unwrap_err();
            assert_eq!(err.to_string(), format!("\"{bad}\" is not a KServe v2 datatype"));
        }
    }

    #[test]
    fn sizes() {
        let table = [
            (Datatype::Bool, Some(1)),
            (Datatype::Int16, Some(2)),
            (Datatype::Fp16, Some(2)),
            (Datatype::Bf16, Some(2)),
            (Datatype::Uint32, Some(4)),
            (Datatype::Fp64, Some(8)),
            (Datatype::Bytes, None),
        ];
        for (d, size) in table {
            assert_eq!(d.element_size(), size, "{d}");
        }
    }
}
