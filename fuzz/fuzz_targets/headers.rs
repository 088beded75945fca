//! Request headers, one `name: value` a line, as the doors read them: the budget
//! (`x-tiergate-budget-ms`, `grpc-timeout`, the KServe timeout), `Prefer`, the binary
//! extension's header length, and an API key.
#![no_main]

use std::sync::OnceLock;

use tiergate::policy::Policy;

fn policy() -> &'static Policy {
    static POLICY: OnceLock<Policy> = OnceLock::new();
    POLICY.get_or_init(|| {
        let text = "[routes.r]\nmodels = [\"m\"]\n[routes.r.realtime]\nendpoints = [\"http://127.0.0.1:9\"]\n";
        Policy::from_texts(vec![("p.toml".into(), text.into())]).expect("valid")
    })
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let mut headers = http::HeaderMap::new();
    for line in data.split(|b| *b == b'\n') {
        let Some(colon) = line.iter().position(|b| *b == b':') else {
            continue;
        };
        let (name, value) = (&line[..colon], line[colon + 1..].trim_ascii());
        if let (Ok(name), Ok(value)) = (http::HeaderName::from_bytes(name), http::HeaderValue::from_bytes(value)) {
            headers.append(name, value);
        }
    }
    let timeout = data.first().map(|b| u64::from(*b) * 1000);
    if let Some(route) = policy().route_for_model("m") {
        let _ = tiergate::front::meta::read(&headers, timeout, Some("id"), route);
    }
    let _ = tiergate::protocol::header_len(&headers);
    let _ = tiergate::front::auth::Callers::open().authenticate(&mut headers);
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = tiergate::front::meta::grpc_timeout(text);
    }
});
