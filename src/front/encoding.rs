//! Compressed bodies on the HTTP door, as Triton takes and gives them (tritonclient's
//! `request_compression_algorithm` and `response_compression_algorithm`):
//! `Content-Encoding: gzip` or `deflate` (zlib) request bodies are decoded before
//! anything reads them, the decoded size held to the same limit as any body (413 past
//! it, however small the compressed body was); answers are compressed when the
//! client's `Accept-Encoding` asks for gzip or deflate. The backends see neither: the
//! gateway reads their answers, so it never asks them to compress.
//!
//! In the door's own step, right after the body is read (and, for the answer, right
//! before it is rendered).

use std::io::{Read, Write};

use bytes::Bytes;
use http::header::{ACCEPT_ENCODING, CONTENT_ENCODING, CONTENT_LENGTH};
use http::{HeaderMap, HeaderValue, Response};

use crate::error::{Error, Kind};

/// A compression the door reads and writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Coding {
    /// `gzip` (RFC 1952).
    Gzip,
    /// `deflate`: the zlib format (RFC 1950), as HTTP means it.
    Deflate,
}

impl Coding {
    fn name(self) -> &'static str {
        match self {
            Coding::Gzip => "gzip",
            Coding::Deflate => "deflate",
        }
    }
}

/// The request body `body` decoded as its `Content-Encoding` says, at most `max` bytes
/// once decoded; the header is removed, so what follows sees a plain body. 400 for a
/// coding the door does not read or a body that does not decode, 413 past `max`.
pub fn decode(headers: &mut HeaderMap, body: Bytes, max: usize) -> Result<Bytes, Error> {
    let Some(value) = headers.get(CONTENT_ENCODING) else {
        return Ok(body);
    };
    let named = value.to_str().unwrap_or_default().trim().to_ascii_lowercase();
    let coding = match named.as_str() {
        "" | "identity" => None,
        "gzip" | "x-gzip" => Some(Coding::Gzip),
        "deflate" => Some(Coding::Deflate),
        _ => {
            return Err(Error::new(
                Kind::BadRequest,
                format!("Content-Encoding {named:?} is not supported: send the body as it is, or with gzip or deflate"),
            ))
        }
    };
    headers.remove(CONTENT_ENCODING);
    headers.remove(CONTENT_LENGTH);
    let Some(coding) = coding else {
        return Ok(body);
    };
    let mut decoded = Vec::with_capacity(body.len().saturating_mul(2).min(max));
    let read = match coding {
        Coding::Gzip => flate2::read::MultiGzDecoder::new(&body[..])
            .take(max as u64 + 1)
            .read_to_end(&mut decoded),
        Coding::Deflate => flate2::read::ZlibDecoder::new(&body[..])
            .take(max as u64 + 1)
            .read_to_end(&mut decoded),
    };
    if let Err(e) = read {
        return Err(Error::new(
            Kind::BadRequest,
            format!("the request body does not decode as {}: {e}", coding.name()),
        ));
    }
    if decoded.len() > max {
        return Err(Error::new(
            Kind::TooLarge,
            format!(
                "the request body decodes ({}) to more than the {max}-byte limit (limits.max_body_bytes)",
                coding.name()
            ),
        ));
    }
    Ok(Bytes::from(decoded))
}

/// The compression the client's `Accept-Encoding` asks for (gzip first, then deflate;
/// one with `q=0` is refused), taken out of `headers` so the backend is not asked.
pub fn take_accepted(headers: &mut HeaderMap) -> Option<Coding> {
    let value = headers.remove(ACCEPT_ENCODING)?;
    let mut found = None;
    for item in value.to_str().ok()?.split(',') {
        let mut parts = item.split(';');
        let name = parts.next().unwrap_or_default().trim().to_ascii_lowercase();
        let refused = parts.any(|p| {
            p.trim()
                .strip_prefix("q=")
                .and_then(|q| q.trim().parse::<f32>().ok())
                .is_some_and(|q| q <= 0.0)
        });
        let coding = match name.as_str() {
            "gzip" | "x-gzip" => Coding::Gzip,
            "deflate" => Coding::Deflate,
            _ => continue,
        };
        if !refused && (found.is_none() || coding == Coding::Gzip) {
            found = Some(coding);
        }
    }
    found
}

/// Compresses `answer`'s body with `coding` (and says `Vary: Accept-Encoding`), unless
/// it is empty or already encoded.
pub fn encode(answer: &mut Response<Bytes>, coding: Coding) {
    if answer.body().is_empty() || answer.headers().contains_key(CONTENT_ENCODING) {
        return;
    }
    let level = flate2::Compression::fast();
    let body = answer.body();
    let encoded = match coding {
        Coding::Gzip => {
            let mut e = flate2::write::GzEncoder::new(Vec::with_capacity(body.len() / 2), level);
            e.write_all(body).and_then(|()| e.finish())
        }
        Coding::Deflate => {
            let mut e = flate2::write::ZlibEncoder::new(Vec::with_capacity(body.len() / 2), level);
            e.write_all(body).and_then(|()| e.finish())
        }
    };
    // Writing to memory does not fail; if it did, the answer goes as it is.
    if let Ok(encoded) = encoded {
        *answer.body_mut() = Bytes::from(encoded);
        let headers = answer.headers_mut();
        headers.insert(CONTENT_ENCODING, HeaderValue::from_static(coding.name()));
        headers.remove(CONTENT_LENGTH);
        // Another client's `Accept-Encoding` gets another body: caches must know.
        headers.append(http::header::VARY, HeaderValue::from_static("accept-encoding"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gzip(bytes: &[u8]) -> Bytes {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(bytes).expect("write");
        Bytes::from(e.finish().expect("finish"))
    }

    fn with_encoding(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(CONTENT_ENCODING, HeaderValue::from_str(value).expect("value"));
        headers
    }

    #[test]
    fn gzip_and_deflate_bodies_are_decoded_and_the_header_removed() {
        let text = br#"{"inputs":[]}"#;
        let mut headers = with_encoding("gzip");
        assert_eq!(decode(&mut headers, gzip(text), 1024).expect("decodes"), &text[..]);
        assert!(headers.get(CONTENT_ENCODING).is_none());
        let mut zlib = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
        zlib.write_all(text).expect("write");
        let mut headers = with_encoding("Deflate");
        let body = Bytes::from(zlib.finish().expect("finish"));
        assert_eq!(decode(&mut headers, body, 1024).expect("decodes"), &text[..]);
    }

    #[test]
    fn a_small_body_that_inflates_past_the_limit_is_too_large() {
        let bomb = gzip(&vec![0u8; 10 << 20]);
        assert!(bomb.len() < 64 << 10, "{} bytes compressed", bomb.len());
        let err = decode(&mut with_encoding("gzip"), bomb, 1 << 20).expect_err("too large");
        assert_eq!(err.kind, Kind::TooLarge, "{}", err.message);
    }

    #[test]
    fn unknown_codings_and_broken_bodies_say_what_to_send() {
        let err = decode(&mut with_encoding("br"), Bytes::from_static(b"x"), 10).expect_err("br");
        assert!(
            err.kind == Kind::BadRequest && err.message.contains("gzip or deflate"),
            "{}",
            err.message
        );
        let err = decode(&mut with_encoding("gzip"), Bytes::from_static(b"not gzip"), 10).expect_err("broken");
        assert!(err.message.contains("does not decode as gzip"), "{}", err.message);
    }

    #[test]
    fn accept_encoding_prefers_gzip_and_honours_q_zero() {
        let take = |v: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(ACCEPT_ENCODING, HeaderValue::from_str(v).expect("value"));
            let coding = take_accepted(&mut headers);
            assert!(headers.get(ACCEPT_ENCODING).is_none(), "never passed to the backend");
            coding
        };
        assert_eq!(take("deflate, gzip"), Some(Coding::Gzip));
        assert_eq!(take("deflate"), Some(Coding::Deflate));
        assert_eq!(take("gzip;q=0, deflate;q=0.5"), Some(Coding::Deflate));
        assert_eq!(take("br, identity"), None);
    }

    #[test]
    fn answers_are_compressed_and_read_back() {
        let mut answer = Response::new(Bytes::from_static(b"{\"outputs\":[1,2,3]}"));
        encode(&mut answer, Coding::Gzip);
        assert_eq!(answer.headers()[CONTENT_ENCODING], "gzip");
        let mut back = Vec::new();
        flate2::read::GzDecoder::new(&answer.body()[..])
            .read_to_end(&mut back)
            .expect("gunzip");
        assert_eq!(back, b"{\"outputs\":[1,2,3]}");
    }
}
