//! What the real-time path does per request besides moving bytes: inspect the KServe
//! body, read the budget, classify. `cargo bench --bench hot_path`; results in
//! docs/performance.md.
#![allow(missing_docs)]

use std::hint::black_box;
use std::path::PathBuf;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use tiergate::classify::classify;
use tiergate::front::meta;
use tiergate::policy::Policy;
use tiergate::protocol::inspect_request;

fn json_body(elements: usize) -> Vec<u8> {
    let data: Vec<String> = (0..elements).map(|k| format!("{}", (k % 251) as f32 / 251.0)).collect();
    format!(
        r#"{{"id":"r","inputs":[{{"name":"INPUT0","datatype":"FP32","shape":[1,{elements}],"data":[{}]}}]}}"#,
        data.join(",")
    )
    .into_bytes()
}

fn binary_body(elements: usize) -> (Vec<u8>, usize) {
    let header = format!(
        r#"{{"inputs":[{{"name":"INPUT0","datatype":"FP32","shape":[1,{elements}],"parameters":{{"binary_data_size":{}}}}}]}}"#,
        elements * 4
    );
    let mut body = header.clone().into_bytes();
    body.extend((0..elements).flat_map(|k| ((k % 251) as f32).to_le_bytes()));
    (body, header.len())
}

fn inspect(c: &mut Criterion) {
    let mut group = c.benchmark_group("inspect_request");
    for elements in [16usize, 4096] {
        let json = json_body(elements);
        group.throughput(Throughput::Bytes(json.len() as u64));
        group.bench_function(format!("json_fp32_{elements}"), |b| {
            b.iter(|| inspect_request(black_box(&json), None))
        });
        let (binary, header_len) = binary_body(elements);
        group.throughput(Throughput::Bytes(binary.len() as u64));
        group.bench_function(format!("binary_fp32_{elements}"), |b| {
            b.iter(|| inspect_request(black_box(&binary), Some(header_len)))
        });
    }
    group.finish();
}

fn decide(c: &mut Criterion) {
    let text = "[routes.r]\nmodels = [\"m\"]\n[routes.r.flags]\nmicro_batch = true\n[routes.r.realtime]\nendpoints = [\"http://127.0.0.1:1\"]\n[routes.r.micro_batch]\nendpoints = [\"http://127.0.0.1:2\"]\n";
    let policy = Policy::from_texts(vec![(PathBuf::from("b.toml"), text.to_owned())]).expect("valid policy");
    let route = policy.route_for_model("m").expect("route").clone();
    let mut headers = http::HeaderMap::new();
    headers.insert("x-tiergate-budget-ms", http::HeaderValue::from_static("120"));
    headers.insert("x-request-id", http::HeaderValue::from_static("req-0001"));
    c.bench_function("meta_read_and_classify", |b| {
        b.iter(|| {
            let m = meta::read(black_box(&headers), None, None, &route).expect("valid");
            classify(&route, &m)
        })
    });
}

criterion_group!(benches, inspect, decide);
criterion_main!(benches);
