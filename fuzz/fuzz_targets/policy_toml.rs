//! A policy file, checked as `tiergate policy check` and every reload check it.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data).into_owned();
    let _ = tiergate::policy::Policy::from_texts(vec![("fuzz.toml".into(), text)]);
});
