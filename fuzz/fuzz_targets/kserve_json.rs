//! A KServe v2 JSON infer request body, as the HTTP door inspects it at both levels.
#![no_main]

use tiergate::protocol::{inspect_request, BodyCheck};

libfuzzer_sys::fuzz_target!(|body: &[u8]| {
    let full = inspect_request(body, None, BodyCheck::Full);
    let envelope = inspect_request(body, None, BodyCheck::Envelope);
    // Whatever the full check accepts, the envelope check accepts.
    assert!(full.is_err() || envelope.is_ok(), "{full:?} but {envelope:?}");
});
