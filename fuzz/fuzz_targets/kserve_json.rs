//! A KServe v2 JSON infer request body, as the HTTP door inspects it at both levels,
//! and as the envelope check's plain reader reads it beside serde.
#![no_main]

use tiergate::protocol::{agrees_with_serde, inspect_request, BodyCheck};

libfuzzer_sys::fuzz_target!(|body: &[u8]| {
    let full = inspect_request(body, None, BodyCheck::Full);
    let envelope = inspect_request(body, None, BodyCheck::Envelope);
    // Whatever the full check accepts, the envelope check accepts.
    assert!(full.is_err() || envelope.is_ok(), "{full:?} but {envelope:?}");
    // Whatever the plain reader accepts, serde reads the same way.
    assert!(agrees_with_serde(body), "{}", String::from_utf8_lossy(body));
});
