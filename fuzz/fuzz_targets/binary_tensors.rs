//! A body with Triton's binary tensor extension: the first two bytes choose the
//! `Inference-Header-Content-Length` (any value, in range or not), the rest is the body.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Some((len, body)) = data.split_first_chunk::<2>() else {
        return;
    };
    let header_len = usize::from(u16::from_le_bytes(*len));
    for check in [tiergate::protocol::BodyCheck::Full, tiergate::protocol::BodyCheck::Envelope] {
        let _ = tiergate::protocol::inspect_request(body, Some(header_len), check);
    }
});
