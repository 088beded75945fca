//! A `POST /v1/files` upload: the first line is the content type (with its boundary),
//! the rest the multipart body.
#![no_main]

use std::sync::OnceLock;

fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| tokio::runtime::Builder::new_current_thread().build().expect("runtime"))
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let split = data.iter().position(|b| *b == b'\n').unwrap_or(data.len());
    let Ok(content_type) = std::str::from_utf8(&data[..split]) else {
        return;
    };
    let body = bytes::Bytes::copy_from_slice(data.get(split + 1..).unwrap_or_default());
    let _ = runtime().block_on(tiergate::front::batch_api::read_upload(content_type, body));
});
