//! The HTTP messages a pool exchanges with a backend: the request with only the
//! client's end-to-end headers, in origin form for the endpoint, and the answer with
//! only the backend's. Hop-by-hop headers (RFC 9110 §7.6.1) never cross the gateway.

use bytes::Bytes;
use http::uri::PathAndQuery;
use http::{header, HeaderMap, HeaderName, Request, Response, Uri};
use http_body_util::Full;

/// A copy of a request (its body is shared, not copied), with its trace ids: for a
/// second call of the same request (real-time overflow, a shadow's or a noise floor's).
pub fn copy(request: &Request<Bytes>) -> Request<Bytes> {
    let mut copy = Request::new(request.body().clone());
    *copy.method_mut() = request.method().clone();
    *copy.uri_mut() = request.uri().clone();
    *copy.version_mut() = request.version();
    *copy.headers_mut() = request.headers().clone();
    if let Some(ids) = request.extensions().get::<crate::trace::Ids>() {
        copy.extensions_mut().insert(ids.clone());
    }
    copy
}

/// The request's path and query (`/` when it has none).
pub(super) fn path_and_query(parts: &http::request::Parts) -> PathAndQuery {
    parts
        .uri
        .path_and_query()
        .cloned()
        .unwrap_or_else(|| PathAndQuery::from_static("/"))
}

/// The backend request for `parts`: its method, `uri`, headers and `body`, for the
/// HTTP/1.1 writer, which writes only the end-to-end headers ([`is_hop_by_hop`],
/// [`keep_end_to_end`]). The headers are moved out of `parts`, not copied, and put back
/// after the call ([`restore`]) so `parts` can be sent again.
pub(super) fn outgoing(parts: &mut http::request::Parts, uri: Uri, body: Bytes) -> Request<Bytes> {
    let mut request = Request::new(body);
    *request.method_mut() = parts.method.clone();
    *request.uri_mut() = uri;
    *request.headers_mut() = std::mem::take(&mut parts.headers);
    request
}

/// [`outgoing`] with the headers copied, `parts` left whole.
pub(super) fn outgoing_copy(parts: &http::request::Parts, uri: Uri, body: Bytes) -> Request<Full<Bytes>> {
    let mut request = Request::new(Full::new(body));
    *request.method_mut() = parts.method.clone();
    *request.uri_mut() = uri;
    *request.headers_mut() = parts.headers.clone();
    keep_end_to_end(request.headers_mut());
    request
}

/// Puts the headers of `sent`, a request [`outgoing`] made from `parts`, back into
/// `parts`, so `parts` can be sent elsewhere.
pub(super) fn restore(parts: &mut http::request::Parts, sent: Request<Bytes>) {
    parts.headers = sent.into_parts().0.headers;
}

/// A backend answer with only its end-to-end headers.
pub(super) fn end_to_end(mut response: Response<Bytes>) -> Response<Bytes> {
    keep_end_to_end(response.headers_mut());
    response
}

/// Copies end-to-end headers from `from` to `to`, leaving out hop-by-hop ones and any
/// named in `Connection`.
fn copy_end_to_end(from: &HeaderMap, to: &mut HeaderMap) {
    let connection = from.get_all(header::CONNECTION);
    let named = |name: &HeaderName| {
        connection
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|t| t.trim().eq_ignore_ascii_case(name.as_str()))
    };
    for (name, value) in from {
        if !is_hop_by_hop(name) && !named(name) {
            to.append(name.clone(), value.clone());
        }
    }
}

/// Whether `name` describes one connection, not the message (RFC 9110 §7.6.1), or is
/// `host` (the client sets it for the backend), `content-length` (recomputed) or
/// `cookie` (the client's session with whatever site set it, nothing a model server
/// needs, and not the gateway's to pass on). One match on its text: the HTTP/1.1 writer
/// and reader ask it of every header.
pub(super) fn is_hop_by_hop(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "proxy-connection"
            | "proxy-authenticate"
            | "proxy-authorization"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
            | "host"
            | "content-length"
            | "cookie"
    )
}

/// Leaves only end-to-end headers in `headers`, as [`copy_end_to_end`] would copy them:
/// `content-length` and `host` (in nearly every message) are removed in place, and the
/// map is copied only when another hop-by-hop header is there.
pub(super) fn keep_end_to_end(headers: &mut HeaderMap) {
    headers.remove(header::CONTENT_LENGTH);
    headers.remove(header::HOST);
    if headers.keys().any(is_hop_by_hop) {
        let all = std::mem::take(headers);
        copy_end_to_end(&all, headers);
    }
}

#[cfg(test)]
mod tests {
    use http::HeaderValue;

    use super::*;

    #[test]
    fn hop_by_hop_headers_stay_behind() {
        let mut from = HeaderMap::new();
        for (k, v) in [
            ("connection", "keep-alive, x-private"),
            ("x-private", "1"),
            ("host", "gateway"),
            ("content-length", "3"),
            ("transfer-encoding", "chunked"),
            ("content-type", "application/json"),
            ("cookie", "session=secret"),
            ("inference-header-content-length", "42"),
        ] {
            from.append(k, v.parse().expect("valid"));
        }
        let mut to = HeaderMap::new();
        copy_end_to_end(&from, &mut to);
        let kept: Vec<&str> = to.keys().map(|k| k.as_str()).collect();
        assert_eq!(kept, ["content-type", "inference-header-content-length"]);
        let mut in_place = from.clone();
        keep_end_to_end(&mut in_place);
        assert_eq!(in_place, to, "in place, the same headers stay");
        let mut plain = HeaderMap::new();
        plain.insert("content-length", HeaderValue::from_static("3"));
        plain.insert("host", HeaderValue::from_static("gateway"));
        plain.insert("content-type", HeaderValue::from_static("text/plain"));
        keep_end_to_end(&mut plain);
        let kept: Vec<&str> = plain.keys().map(|k| k.as_str()).collect();
        assert_eq!(kept, ["content-type"]);
        for name in [
            "connection",
            "keep-alive",
            "proxy-connection",
            "proxy-authenticate",
            "proxy-authorization",
            "te",
            "trailer",
            "transfer-encoding",
            "upgrade",
            "host",
            "content-length",
            "cookie",
        ] {
            assert!(is_hop_by_hop(&HeaderName::from_static(name)), "{name}");
        }
        for name in [
            header::CONTENT_TYPE,
            header::ACCEPT,
            HeaderName::from_static("x-request-id"),
        ] {
            assert!(!is_hop_by_hop(&name), "{name}");
        }
    }
}
