//! The bytes a client sends on the data door, as its own HTTP/1.1 server reads them
//! (`server::lean`): what it takes it takes whole and as httparse reads it, what it
//! leaves for hyper it leaves byte for byte.
#![no_main]

libfuzzer_sys::fuzz_target!(|bytes: &[u8]| {
    assert!(
        tiergate::server::reads_as_httparse(bytes),
        "{:?}",
        String::from_utf8_lossy(bytes)
    );
});
