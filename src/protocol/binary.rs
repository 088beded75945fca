//! Triton's binary tensor extension: a body is a JSON header of
//! `inference-header-content-length` bytes followed by the binary section, which holds
//! the binary tensors back to back in tensor order.

use bytes::{BufMut, Bytes, BytesMut};

use super::tensor::BytesElements;
use super::{Error, HEADER_LEN};

/// Reads the JSON header length from request or response headers: `None` when the
/// header is absent (the whole body is JSON).
pub fn header_len(headers: &http::HeaderMap) -> Result<Option<usize>, Error> {
    header_len_of(headers.get(HEADER_LEN))
}

/// [`header_len`] from the header's value, when sent.
pub fn header_len_of(value: Option<&http::HeaderValue>) -> Result<Option<usize>, Error> {
    let Some(value) = value else {
        return Ok(None);
    };
    let bad = || Error::BadHeaderLen {
        value: String::from_utf8_lossy(value.as_bytes()).into_owned(),
    };
    let text = value.to_str().map_err(|_| bad())?;
    text.trim().parse::<usize>().map(Some).map_err(|_| bad())
}

/// Splits a body into its JSON header and the offset where the binary section starts.
pub(crate) fn split(body: &[u8], header_len: Option<usize>) -> Result<(&[u8], usize), Error> {
    let json_len = header_len.unwrap_or(body.len());
    match body.get(..json_len) {
        Some(json) => Ok((json, json_len)),
        None => Err(Error::HeaderTooLong {
            header_len: json_len,
            body_len: body.len(),
        }),
    }
}

/// Checks that BYTES binary data is exactly `elements` length-prefixed elements.
pub(crate) fn check_bytes_layout(data: &[u8], elements: u64) -> Result<(), String> {
    let mut it = BytesElements(data);
    let found = it.by_ref().count() as u64;
    if let Some(rest) = Some(it.0).filter(|r| !r.is_empty()) {
        return Err(match rest.split_first_chunk::<4>() {
            None => format!(
                "element {found} has a truncated length prefix ({} of 4 bytes)",
                rest.len()
            ),
            Some((prefix, tail)) => format!(
                "element {found} declares {} bytes but only {} remain",
                u32::from_le_bytes(*prefix),
                tail.len()
            ),
        });
    }
    if found != elements {
        return Err(format!("it holds {found} elements but the shape holds {elements}"));
    }
    Ok(())
}

/// Joins a JSON header and the binary tensors into one body; returns the JSON header
/// length when there is a binary section, `None` (plain JSON) when there is not.
pub(crate) fn assemble(header: Vec<u8>, parts: &[&Bytes]) -> (Bytes, Option<usize>) {
    if parts.is_empty() {
        return (Bytes::from(header), None);
    }
    let json_len = header.len();
    let total = json_len + parts.iter().map(|p| p.len()).sum::<usize>();
    let mut body = BytesMut::with_capacity(total);
    body.put_slice(&header);
    for part in parts {
        body.put_slice(part);
    }
    (body.freeze(), Some(json_len))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // in tests a failed unwrap is a failed test
mod tests {
    use super::*;

    #[test]
    fn bytes_layout() {
        let table: [(&[u8], u64, Result<(), &str>); 5] = [
            (&[1, 0, 0, 0, b'a', 0, 0, 0, 0], 2, Ok(())),
            (&[], 0, Ok(())),
            (
                &[1, 0, 0, 0, b'a', 7, 0],
                2,
                Err("element 1 has a truncated length prefix (2 of 4 bytes)"),
            ),
            (
                &[5, 0, 0, 0, b'a'],
                1,
                Err("element 0 declares 5 bytes but only 1 remain"),
            ),
            (&[0, 0, 0, 0], 2, Err("it holds 1 elements but the shape holds 2")),
        ];
        for (data, elements, want) in table {
            assert_eq!(
                check_bytes_layout(data, elements),
                want.map_err(String::from),
                "{data:?}"
            );
        }
    }

    #[test]
    fn header_len_parsing() {
        let mut headers = http::HeaderMap::new();
        assert_eq!(header_len(&headers), Ok(None));
        headers.insert(HEADER_LEN, http::HeaderValue::from_static("12"));
        assert_eq!(header_len(&headers), Ok(Some(12)));
        headers.insert(HEADER_LEN, http::HeaderValue::from_static("-1"));
        let err = header_len(&headers).unwrap_err();
        assert_eq!(
            err.to_string(),
            "inference-header-content-length \"-1\" is not a byte count"
        );
    }

    #[test]
    fn split_checks_the_header_length() {
        assert_eq!(split(b"{}xy", Some(2)), Ok((&b"{}"[..], 2)));
        assert_eq!(split(b"{}", None), Ok((&b"{}"[..], 2)));
        let err = split(&[0; 512], Some(900)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "inference-header-content-length 900 is larger than the body (512 bytes)"
        );
    }
}
