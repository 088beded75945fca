//! A cached answer, kept in the form that lets every caller have it its own way: a
//! KServe v2 answer decoded (written back with the caller's id, JSON or binary outputs
//! as that caller asks), a JSON path's answer as its bytes.

use bytes::Bytes;
use http::{HeaderValue, StatusCode};

use super::key::Question;
use crate::protocol::grpc::bridge;
use crate::protocol::{self, InferResponse};
use crate::tiers::Reply;

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
