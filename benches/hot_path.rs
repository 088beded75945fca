//! What the request paths do per request besides moving bytes: inspect the KServe
//! body, read the budget, classify (real time); decode, concatenate 64 callers into one
//! batch and split the answer back (micro-batch). `cargo bench --bench hot_path`;
//! results in docs/performance.md.
#![allow(missing_docs)]

use std::hint::black_box;
use std::path::PathBuf;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use tiergate::classify::classify;
use tiergate::front::meta;
use tiergate::policy::Policy;
use tiergate::protocol::batch::{concat, split};
use tiergate::protocol::{decode_request, inspect_request, BodyCheck, InferResponse, Tensor};

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
        for check in [BodyCheck::Full, BodyCheck::Envelope] {
            group.bench_function(format!("json_fp32_{elements}_{}", check.as_str()), |b| {
                b.iter(|| inspect_request(black_box(&json), None, check))
            });
        }
        let (binary, header_len) = binary_body(elements);
        group.throughput(Throughput::Bytes(binary.len() as u64));
        group.bench_function(format!("binary_fp32_{elements}"), |b| {
            b.iter(|| inspect_request(black_box(&binary), Some(header_len), BodyCheck::Full))
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

/// The micro-batch tier's tensor work for a batch of 64 callers of one FP32 `[1, 16]` row.
fn batch(c: &mut Criterion) {
    let (binary, header_len) = binary_body(16);
    let binary = bytes::Bytes::from(binary);
    let reqs: Vec<_> = (0..64)
        .map(|_| decode_request(&binary, Some(header_len)).expect("valid"))
        .collect();
    let refs: Vec<_> = reqs.iter().collect();
    let merged = concat(&refs).expect("one signature");
    let answer = InferResponse {
        model_name: "m".into(),
        outputs: vec![Tensor {
            name: "OUTPUT0".into(),
            ..merged.inputs[0].clone()
        }],
        ..Default::default()
    };
    let rows = vec![1u64; 64];
    let mut group = c.benchmark_group("micro_batch_64x_fp32_16");
    group.bench_function("decode_one_binary", |b| {
        b.iter(|| decode_request(black_box(&binary), Some(header_len)))
    });
    group.bench_function("concat", |b| b.iter(|| concat(black_box(&refs))));
    group.bench_function("split", |b| b.iter(|| split(black_box(&answer), &rows)));
    group.finish();
}

criterion_group!(benches, inspect, decide, batch);
criterion_main!(benches);
