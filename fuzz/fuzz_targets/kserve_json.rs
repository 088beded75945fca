//! A KServe v2 JSON infer request body, as the HTTP door inspects it.
#![no_main]

libfuzzer_sys::fuzz_target!(|body: &[u8]| {
    let _ = tiergate::protocol::inspect_request(body, None);
});
