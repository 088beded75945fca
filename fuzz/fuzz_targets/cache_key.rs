//! A request as the cache reads it: headers (one `name: value` a line), a blank line,
//! then a body (a KServe v2 infer request, or JSON for a JSON route, by the first byte).
//! Its tenant on the route, the scan of its JSON, its cache key, twice (the same
//! request has the same key), and the envelope check of a backend answer of the bytes.
#![no_main]

use std::sync::OnceLock;

use tiergate::policy::Policy;

fn policy() -> &'static Policy {
    static POLICY: OnceLock<Policy> = OnceLock::new();
    POLICY.get_or_init(|| {
        let text = "[routes.r]\nmodels = [\"m\"]\npaths = [\"/v1/models/m:predict\"]\ntenant_header = \"x-team\"\n\
                    [routes.r.flags]\ncache = true\n[routes.r.realtime]\nendpoints = [\"http://127.0.0.1:9\"]\n\
                    [routes.r.cache]\nvary = [\"x-scale\"]\nignore_headers = [\"x-client\"]\n";
        Policy::from_texts(vec![("p.toml".into(), text.into())]).expect("valid")
    })
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let split = data.windows(2).position(|w| w == b"\n\n").unwrap_or(data.len());
    let (head, body) = (&data[..split], data.get(split + 2..).unwrap_or_default());
    let mut request = http::Request::new(bytes::Bytes::copy_from_slice(body));
    for line in head.split(|b| *b == b'\n') {
        let Some(colon) = line.iter().position(|b| *b == b':') else {
            continue;
        };
        let (name, value) = (&line[..colon], line[colon + 1..].trim_ascii());
        if let (Ok(name), Ok(value)) = (http::HeaderName::from_bytes(name), http::HeaderValue::from_bytes(value)) {
            request.headers_mut().append(name, value);
        }
    }
    *request.uri_mut() = match body.first() {
        Some(b'{') if data.len() % 2 == 0 => http::Uri::from_static("/v2/models/m/infer?v=1"),
        _ => http::Uri::from_static("/v1/models/m:predict"),
    };
    let route = policy().route("r").expect("the route");
    let spec = route.cache.as_ref().expect("a cache");
    let tenant = tiergate::tenant::Tenant::anonymous();
    let _ = route.tenant(&tenant, request.headers());
    let scan = tiergate::protocol::scan::scan(body);
    let first = tiergate::cache::asked(route, spec, &request).map(|(key, _)| key);
    let again = tiergate::cache::asked(route, spec, &request).map(|(key, _)| key);
    assert_eq!(first, again, "a request has one key");
    assert!(!(scan.wide_integer && first.is_some()), "an integer beyond 64 bits is never keyed");
    let _ = tiergate::protocol::answer_envelope(request.headers(), body, true);
});
