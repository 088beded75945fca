//! A cached answer, kept in the form that lets every caller have it its own way: a
//! KServe v2 answer decoded (written back with the caller's id, JSON or binary outputs
//! as that caller asks), a JSON path's answer as its bytes.

use bytes::Bytes;
use http::{HeaderValue, StatusCode};

use super::key::Question;
use crate::protocol::grpc::bridge;
use crate::protocol::Reply;
use crate::protocol::{self, InferResponse};

/// One cached answer.
#[derive(Debug)]
pub enum Entry {
    /// A KServe v2 answer, without the id of the request that made it.
    Kserve(InferResponse),
    /// A JSON path's answer: its status, content type and body.
    Raw {
        /// The backend's status (a success).
        status: StatusCode,
        /// Its content type.
        content_type: Option<HeaderValue>,
        /// Its body.
        body: Bytes,
    },
}

impl Entry {
    /// The entry `reply` makes for `question`: only a success the backend did not mark
    /// `no-store` or `private`, that a canary's candidate did not serve (its answers
    /// reach only the canary's share of callers), and for KServe v2 only one that decodes.
    pub fn of(question: &Question, reply: &Reply) -> Option<Entry> {
        let candidate = reply
            .headers()
            .get(crate::headers::VARIANT)
            .is_some_and(|v| v == "candidate");
        if !reply.status().is_success() || forbids_storing(reply.headers()) || candidate {
            return None;
        }
        match question {
            Question::Kserve(_) => {
                let header_len = protocol::header_len(reply.headers()).ok()?;
                let mut answer = protocol::decode_response(reply.body(), header_len).ok()?;
                answer.id = None;
                Some(Entry::Kserve(answer))
            }
            Question::Json => Some(Entry::Raw {
                status: reply.status(),
                content_type: reply.headers().get(http::header::CONTENT_TYPE).cloned(),
                body: reply.body().clone(),
            }),
        }
    }

    /// The KServe v2 answer kept, if it is one.
    pub fn kserve(&self) -> Option<&InferResponse> {
        match self {
            Entry::Kserve(answer) => Some(answer),
            Entry::Raw { .. } => None,
        }
    }

    /// The answer for the caller who asked `question`.
    pub fn answer(&self, question: &Question) -> Reply {
        match self {
            Entry::Kserve(answer) => {
                // A key names one path, so a KServe entry is only asked for by KServe requests.
                let req = match question {
                    Question::Kserve(req) => Some(req),
                    Question::Json => None,
                };
                let mut answer = answer.clone();
                answer.id = req.and_then(|r| r.id.clone());
                bridge::infer_response_to_http(&answer, &|t| req.is_some_and(|r| r.wants_binary(&t.name)))
            }
            Entry::Raw {
                status,
                content_type,
                body,
            } => {
                let mut reply = Reply::new(body.clone());
                *reply.status_mut() = *status;
                if let Some(ct) = content_type {
                    reply.headers_mut().insert(http::header::CONTENT_TYPE, ct.clone());
                }
                reply
            }
        }
    }

    /// What the entry weighs against the route's `max_bytes`: its data and names, and a
    /// little for the entry itself.
    pub fn weight(&self) -> u32 {
        let bytes = match self {
            Entry::Kserve(a) => {
                a.outputs
                    .iter()
                    .map(|t| t.data.len() + t.name.len() + 8 * t.shape.len() + 32)
                    .sum::<usize>()
                    + a.model_name.len()
            }
            Entry::Raw { body, .. } => body.len(),
        };
        u32::try_from(bytes + 128).unwrap_or(u32::MAX)
    }
}

/// The first byte of an entry as bytes (the second level's form): a new layout gets a
/// new version, and an entry of another version is read as a miss.
const VERSION: u8 = 1;

impl Entry {
    /// The entry as bytes, for the second level: the version, then a KServe v2 answer in
    /// Triton's binary form (its JSON header's length, then the answer), or a raw
    /// answer's status, content type and body.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = vec![VERSION];
        match self {
            Entry::Kserve(answer) => {
                let (body, header_len) = protocol::encode_response(answer, &|_| true);
                out.push(0);
                out.extend_from_slice(&(header_len.unwrap_or(body.len()) as u64).to_le_bytes());
                out.extend_from_slice(&body);
            }
            Entry::Raw {
                status,
                content_type,
                body,
            } => {
                out.push(1);
                out.extend_from_slice(&status.as_u16().to_le_bytes());
                let ct = content_type.as_ref().map_or(&b""[..], HeaderValue::as_bytes);
                out.extend_from_slice(&(ct.len() as u64).to_le_bytes());
                out.extend_from_slice(ct);
                out.extend_from_slice(body);
            }
        }
        out
    }

    /// An entry from [`Entry::to_bytes`]; `None` for anything else (another version,
    /// or bytes that do not decode).
    pub fn from_bytes(bytes: &Bytes) -> Option<Entry> {
        let (&[VERSION, kind], rest) = bytes.split_first_chunk::<2>()? else {
            return None;
        };
        let at = bytes.len() - rest.len();
        match kind {
            0 => {
                let len = u64::from_le_bytes(*rest.first_chunk::<8>()?);
                let body = bytes.slice(at + 8..);
                let header_len = usize::try_from(len).ok().filter(|n| *n <= body.len())?;
                let header_len = (header_len < body.len()).then_some(header_len);
                protocol::decode_response(&body, header_len).ok().map(Entry::Kserve)
            }
            1 => {
                let status = StatusCode::from_u16(u16::from_le_bytes(*rest.first_chunk::<2>()?)).ok()?;
                let ct_len = usize::try_from(u64::from_le_bytes(*rest.get(2..)?.first_chunk::<8>()?)).ok()?;
                let ct = rest.get(10..10usize.checked_add(ct_len)?)?;
                let content_type = match ct.is_empty() {
                    true => None,
                    false => Some(HeaderValue::from_bytes(ct).ok()?),
                };
                let body = bytes.slice(at + 10 + ct_len..);
                Some(Entry::Raw {
                    status,
                    content_type,
                    body,
                })
            }
            _ => None,
        }
    }
}

/// Whether `headers` (a request's or an answer's) say `no-store` or (an answer's)
/// `private`.
pub fn forbids_storing(headers: &http::HeaderMap) -> bool {
    directives(headers).any(|d| d.eq_ignore_ascii_case("no-store") || d.eq_ignore_ascii_case("private"))
}

/// Whether a request's `Cache-Control` says `no-cache`: answer it afresh (and keep the
/// fresh answer).
pub fn wants_fresh(headers: &http::HeaderMap) -> bool {
    directives(headers).any(|d| d.eq_ignore_ascii_case("no-cache") || d.eq_ignore_ascii_case("max-age=0"))
}

fn directives(headers: &http::HeaderMap) -> impl Iterator<Item = &str> {
    headers
        .get_all(http::header::CACHE_CONTROL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{Datatype, Tensor};

    #[test]
    fn an_entry_survives_its_bytes_and_anything_else_reads_as_nothing() {
        let answer = InferResponse {
            model_name: "m".into(),
            model_version: Some("2".into()),
            outputs: vec![Tensor {
                name: "out".into(),
                datatype: Datatype::Fp32,
                shape: vec![1, 2],
                data: Bytes::from_static(&[0, 0, 128, 63, 0, 0, 0, 64]),
            }],
            ..InferResponse::default()
        };
        let kept = Entry::from_bytes(&Bytes::from(Entry::Kserve(answer.clone()).to_bytes()));
        assert!(matches!(kept, Some(Entry::Kserve(a)) if a == answer));
        let raw = Entry::Raw {
            status: StatusCode::OK,
            content_type: Some(HeaderValue::from_static("application/json")),
            body: Bytes::from_static(b"{\"predictions\":[1]}"),
        };
        match Entry::from_bytes(&Bytes::from(raw.to_bytes())) {
            Some(Entry::Raw {
                status,
                content_type,
                body,
            }) => {
                assert_eq!(
                    (status, content_type.as_ref().map(HeaderValue::as_bytes)),
                    (StatusCode::OK, Some(&b"application/json"[..]))
                );
                assert_eq!(&body[..], b"{\"predictions\":[1]}");
            }
            other => panic!("{other:?}"),
        }
        let whole = Entry::Kserve(answer).to_bytes();
        for cut in 0..whole.len() {
            // Every prefix, and every byte changed, reads as an entry or as nothing: never a panic.
            let _ = Entry::from_bytes(&Bytes::copy_from_slice(&whole[..cut]));
            let mut bent = whole.clone();
            bent[cut] ^= 0xff;
            let _ = Entry::from_bytes(&Bytes::from(bent));
        }
        assert!(
            Entry::from_bytes(&Bytes::from_static(b"\x02\x00anything")).is_none(),
            "another version"
        );
    }
}
