//! A request's cache key: a SHA-256 of everything that determines its answer, in
//! canonical form, so two requests asking the same thing share an entry however they
//! were written, and two asking anything different never do.
//!
//! In the key is everything the gateway forwards that can change the answer: the
//! route; the endpoints of its pools (a change of backends is a new key, so their
//! answers are never mixed); the path (model and version) and the query; the tenant,
//! unless the route shares entries across tenants; the values of the route's `vary`
//! headers; and the question. For a KServe v2 infer request the question is its inputs
//! by name (datatype, shape, the values' raw bytes, so a JSON caller and a binary
//! caller asking the same thing share an entry, and the input's own parameters), its
//! requested outputs by name with their parameters (`binary_data` aside: only how the
//! answer is written), and its parameters but `timeout` and `binary_data_output`. For
//! a route's JSON path it is the body as canonical JSON (keys sorted). Each part is
//! length-prefixed, so no two questions hash alike by running into each other.
//!
//! What cannot be keyed is not cached: a request carrying a header that is neither in
//! `vary`, nor in `ignore_headers`, nor one that never changes an answer (framing,
//! credentials, tracing, tiergate's own: [`neutral`]); JSON holding an integer beyond
//! 64 bits (read as the nearest `f64`, two of them could share a key); a step of a Triton
//! sequence; a body that does not decode.

use bytes::Bytes;
use http::HeaderName;
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::policy::{CacheSpec, Route};
use crate::protocol::{self, batch, InferRequest};

/// A cache key.
pub type Key = [u8; 32];

/// What a cacheable request asks, as its answer is written back to it.
#[derive(Debug)]
pub enum Question {
    /// A KServe v2 infer request, decoded (its id, and which outputs it wants in binary).
    Kserve(Box<InferRequest>),
    /// A request on a JSON path.
    Json,
}

/// Request parameters that change how an answer is delivered, not what it is.
const DELIVERY: [&str; 2] = ["timeout", "binary_data_output"];

/// The key of `request` on `route` for `tenant`, and what it asks; `None` when it is not
/// cached: a step of a Triton sequence (its answer depends on the steps before), a body
/// that does not decode (the tier answers what is wrong with it), or a JSON body that is
/// not an object.
pub fn key(route: &Route, spec: &CacheSpec, tenant: &str, request: &http::Request<Bytes>) -> Option<(Key, Question)> {
    if request.extensions().get::<protocol::Sequence>().is_some() {
        return None;
    }
    let path = request.uri().path();
    let scope = Scope::of(route, spec, tenant, request)?;
    let body = request.body();
    if path.starts_with("/v2/models/") && path.ends_with("/infer") {
        let header_len = protocol::header_len(request.headers()).ok()?;
        let json = header_len.and_then(|n| body.get(..n)).unwrap_or(body);
        if protocol::scan::scan(json).wide_integer {
            return None;
        }
        let req = protocol::decode_request(body, header_len).ok()?;
        if matches!(protocol::sequence(&req.parameters), Ok(Some(_)) | Err(_)) {
            return None;
        }
        Some((scope.kserve(&req), Question::Kserve(Box::new(req))))
    } else {
        if protocol::scan::scan(body).wide_integer {
            return None;
        }
        let Ok(Value::Object(body)) = serde_json::from_slice::<Value>(body) else {
            return None;
        };
        Some((scope.json(&body), Question::Json))
    }
}

/// Whether request header `name` never changes what a backend answers on `route`: how
/// the message travels (framing, coding, the connection), what the gateway reads for
/// itself (credentials, the route's tenant and rollout headers, budgets and priorities,
/// trace context, request ids) and caching directives.
pub fn neutral(route: &Route, name: &HeaderName) -> bool {
    use http::header;
    const STANDARD: [HeaderName; 19] = [
        header::ACCEPT,
        header::ACCEPT_ENCODING,
        header::ACCEPT_LANGUAGE,
        header::USER_AGENT,
        header::HOST,
        header::CONTENT_TYPE,
        header::CONTENT_LENGTH,
        header::CONTENT_ENCODING,
        header::TRANSFER_ENCODING,
        header::CONNECTION,
        header::TE,
        header::CACHE_CONTROL,
        header::PRAGMA,
        header::AUTHORIZATION,
        header::ORIGIN,
        header::REFERER,
        header::FORWARDED,
        header::VIA,
        header::COOKIE,
    ];
    const OTHERS: [&str; 13] = [
        "keep-alive",
        "x-api-key",
        "x-request-id",
        "traceparent",
        "tracestate",
        "baggage",
        "b3",
        "x-real-ip",
        "x-amzn-trace-id",
        "x-cloud-trace-context",
        "uber-trace-id",
        "inference-header-content-length",
        "prefer",
    ];
    const PREFIXES: [&str; 6] = ["x-tiergate-", "grpc-", "x-b3-", "x-forwarded-", "x-datadog-", "sec-"];
    let text = name.as_str();
    STANDARD.contains(name)
        || OTHERS.contains(&text)
        || PREFIXES.iter().any(|p| text.starts_with(p))
        || *name == route.tenant_header
        || *name == route.rollout_key_header
}

/// Everything in a key but the question: the route, its pools' endpoints, the tenant
/// (unless shared) and the path. The micro-batch tier keeps one per caller and keys
/// each of its rows with it ([`Scope::kserve`] of a one-row request).
#[derive(Clone)]
pub struct Scope(Parts);

impl std::fmt::Debug for Scope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Scope")
    }
}

impl Scope {
    /// The scope of a request on `path` of `route` for `tenant` that sends the backend
    /// nothing else (no query, no headers): a micro-batch caller's rows.
    pub fn new(route: &Route, spec: &CacheSpec, tenant: &str, path: &str) -> Self {
        Self::with(route, spec, tenant, (path, None), &|_| None)
    }

    /// The scope of `request` on `route` for `tenant`, with its query and its `vary`
    /// headers; `None` when it carries a header the key cannot cover (see the module's
    /// docs).
    pub fn of<B>(route: &Route, spec: &CacheSpec, tenant: &str, request: &http::Request<B>) -> Option<Self> {
        let headers = request.headers();
        let keyable = |name: &HeaderName| spec.vary.contains(name) || spec.ignore_headers.contains(name);
        if headers.keys().any(|name| !keyable(name) && !neutral(route, name)) {
            return None;
        }
        let uri = request.uri();
        let vary = |name: &HeaderName| Some(headers.get_all(name));
        Some(Self::with(route, spec, tenant, (uri.path(), uri.query()), &vary))
    }

    /// The scope: `vary` gives the values a `vary` header has (none: absent).
    fn with<'a>(
        route: &Route,
        spec: &CacheSpec,
        tenant: &str,
        (path, query): (&str, Option<&str>),
        vary: &dyn Fn(&HeaderName) -> Option<http::header::GetAll<'a, http::HeaderValue>>,
    ) -> Self {
        let mut hash = Parts(Sha256::new());
        hash.part(b"tiergate-cache/2");
        hash.part(route.name.as_bytes());
        let pools = [
            route.realtime.as_deref(),
            route.micro_batch.as_deref().map(|b| &*b.pool),
        ];
        for pool in pools {
            let endpoints: Vec<String> =
                pool.map_or(Vec::new(), |p| p.endpoints.iter().map(ToString::to_string).collect());
            hash.part(endpoints.join(" ").as_bytes());
        }
        hash.part(if spec.shared_across_tenants {
            b""
        } else {
            tenant.as_bytes()
        });
        hash.part(path.as_bytes());
        hash.part(query.unwrap_or_default().as_bytes());
        for name in &spec.vary {
            let values: Vec<&[u8]> = vary(name).map_or(Vec::new(), |all| all.iter().map(|v| v.as_bytes()).collect());
            hash.part(&(values.len() as u64).to_le_bytes());
            for value in values {
                hash.part(value);
            }
        }
        Scope(hash)
    }

    /// The key of the JSON body `body` in this scope (its canonical form).
    pub fn json(&self, body: &serde_json::Map<String, Value>) -> Key {
        let mut hash = self.0.clone();
        hash.part(batch::canonical(body, &[]).as_bytes());
        hash.0.finalize().into()
    }

    /// The key of the KServe v2 infer request `req` in this scope.
    pub fn kserve(&self, req: &InferRequest) -> Key {
        let mut hash = self.0.clone();
        hash.kserve(req);
        hash.0.finalize().into()
    }
}

/// Whose entries a request reads: the route's tenant of it ([`Route::tenant`]: its
/// authenticated tenant, else the value of the route's tenant header).
pub fn tenant<B>(route: &Route, request: &http::Request<B>) -> String {
    crate::tenant::Tenant::name_of(request, &route.tenant_header)
}

/// A hash fed length-prefixed parts.
#[derive(Clone)]
struct Parts(Sha256);

impl Parts {
    fn part(&mut self, bytes: &[u8]) {
        self.0.update((bytes.len() as u64).to_le_bytes());
        self.0.update(bytes);
    }

    fn kserve(&mut self, req: &InferRequest) {
        self.part(batch::canonical(&req.parameters, &DELIVERY).as_bytes());
        let mut inputs: Vec<_> = req.inputs.iter().collect();
        inputs.sort_by(|a, b| a.name.cmp(&b.name));
        self.part(&(inputs.len() as u64).to_le_bytes());
        for t in inputs {
            self.part(t.name.as_bytes());
            self.part(t.datatype.as_str().as_bytes());
            let shape: Vec<u8> = t.shape.iter().flat_map(|d| d.to_le_bytes()).collect();
            self.part(&shape);
            self.part(&t.data);
            let own = req.input_parameters.get(&t.name);
            self.part(own.map(|p| batch::canonical(p, &[])).unwrap_or_default().as_bytes());
        }
        let mut outputs: Vec<_> = req.outputs.iter().collect();
        outputs.sort_by(|a, b| a.name.cmp(&b.name));
        self.part(&(outputs.len() as u64).to_le_bytes());
        for o in outputs {
            self.part(o.name.as_bytes());
            self.part(batch::canonical(&o.parameters, &[]).as_bytes());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(text: &str) -> std::sync::Arc<Route> {
        let policy = crate::policy::Policy::from_texts(vec![("p.toml".into(), text.into())]).expect("valid");
        policy.route("r").expect("route").clone()
    }

    const ROUTE: &str =
        "[routes.r]\nmodels = [\"m\"]\n[routes.r.realtime]\nendpoints = [\"http://h:1\"]\n[routes.r.cache]\n";

    fn request(body: &str) -> http::Request<Bytes> {
        let mut r = http::Request::new(Bytes::from(body.to_owned()));
        *r.uri_mut() = "/v2/models/m/infer".parse().expect("uri");
        r
    }

    fn key_of(route: &Route, tenant: &str, body: &str) -> Option<Key> {
        let spec = route.cache.as_ref().expect("a cache");
        key(route, spec, tenant, &request(body)).map(|(k, _)| k)
    }

    #[test]
    fn equal_questions_share_a_key_and_different_ones_do_not() {
        let r = route(ROUTE);
        let a = r#"{"id":"1","inputs":[{"name":"B","datatype":"FP32","shape":[1,2],"data":[1,2]},{"name":"A","datatype":"INT32","shape":[1],"data":[7]}],"parameters":{"timeout":5,"x":{"b":1,"a":2}}}"#;
        let same = r#"{"id":"2","parameters":{"x":{"a":2,"b":1}},"inputs":[{"name":"A","datatype":"INT32","shape":[1],"data":[7]},{"name":"B","datatype":"FP32","shape":[1,2],"data":[1.0,2.0]}]}"#;
        assert_eq!(
            key_of(&r, "", a),
            key_of(&r, "", same),
            "ids, order, timeout and spacing aside"
        );
        let other_value = a.replace("[1,2]}", "[1,3]}");
        let other_shape = a.replace("\"shape\":[1,2],\"data\":[1,2]", "\"shape\":[2,1],\"data\":[1,2]");
        let other_param = a.replace("\"a\":2", "\"a\":3");
        for other in [other_value, other_shape, other_param] {
            assert_ne!(key_of(&r, "", a), key_of(&r, "", &other), "{other}");
        }
        assert_ne!(key_of(&r, "t1", a), key_of(&r, "t2", a), "tenants never share");
        let shared = route(&format!("{ROUTE}shared_across_tenants = true\n"));
        assert_eq!(key_of(&shared, "t1", a), key_of(&shared, "t2", a));
        let moved = route(&ROUTE.replace("http://h:1", "http://h:2"));
        assert_ne!(key_of(&r, "", a), key_of(&moved, "", a), "new backends, new keys");
        assert_eq!(key_of(&r, "", "{not json"), None, "the tier says what is wrong");
        let step = a.replace("\"x\":", "\"sequence_id\":3,\"x\":");
        assert_eq!(key_of(&r, "", &step), None, "a sequence's steps are never cached");
    }
}
