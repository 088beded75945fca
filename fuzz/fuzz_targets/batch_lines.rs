//! A Batch API input file (JSONL), read line by line as `POST /v1/batches` reads it.
#![no_main]

use std::sync::OnceLock;

use tiergate::front::batch_api::lines::{lines, Within};
use tiergate::policy::Policy;

fn policy() -> &'static Policy {
    static POLICY: OnceLock<Policy> = OnceLock::new();
    POLICY.get_or_init(|| {
        let text = "[routes.r]\nmodels = [\"m\"]\n[routes.r.flags]\nrealtime = false\noffline = true\n\
                    [routes.r.micro_batch]\nendpoints = [\"http://127.0.0.1:9\"]\n";
        Policy::from_texts(vec![("p.toml".into(), text.into())]).expect("valid")
    })
}

libfuzzer_sys::fuzz_target!(|content: &[u8]| {
    let within = Within {
        policy: policy(),
        endpoint: "/v2/models/m/infer",
        max_lines: 1000,
        max_body_bytes: 4096,
        expires_at: 1,
        tenant: "t",
        shadow: false,
        precompute: None,
    };
    let (jobs, _) = lines(content, &within);
    assert!(
        jobs.iter().all(|(_, _, job)| job.body.len() <= 4096),
        "a body over the limit became a job"
    );
});
