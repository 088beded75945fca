//! Durable submissions to the offline store, as the offline tier makes them: many
//! concurrent submitters, one job each, every one acknowledged only after its commit
//! (WAL, `synchronous = FULL`) is on disk. Group commit lets them share fsyncs. Prints
//! jobs/s and the acknowledgement latency per concurrency, on the disk under `$TMPDIR`
//! (or `--dir DIR`). `cargo bench --bench offline_store`; results in docs/performance.md.
#![allow(missing_docs)]

use std::time::{Duration, Instant};

use bytes::Bytes;
use hdrhistogram::Histogram;
use tiergate::queue::embedded::Limits;
use tiergate::queue::{after, Embedded, JobStore, NewJob};

fn job() -> NewJob {
    NewJob {
        route: "resnet50".into(),
        method: "POST".into(),
        path: "/v2/models/resnet50/infer".into(),
        headers: vec![("content-type".into(), "application/json".into())],
        body: Bytes::from_static(
            br#"{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[1,16],"data":[0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15]}]}"#,
        ),
        expires_at: after(Duration::from_secs(86_400)),
        idempotency_key: None,
        tenant: String::new(),
        shadow: false,
    }
}

async fn run(store: &Embedded, concurrency: usize, per_task: usize) -> (f64, Histogram<u64>) {
    let started = Instant::now();
    let tasks: Vec<_> = (0..concurrency)
        .map(|_| {
            let store = store.clone();
            tokio::spawn(async move {
                let mut h = Histogram::<u64>::new(3).expect("histogram");
                for _ in 0..per_task {
                    let t = Instant::now();
                    store.submit(vec![job()]).await.expect("durable");
                    h.record(t.elapsed().as_micros() as u64).expect("record");
                }
                h
            })
        })
        .collect();
    let mut all = Histogram::<u64>::new(3).expect("histogram");
    for t in tasks {
        all.add(t.await.expect("task")).expect("merge");
    }
    let rate = (concurrency * per_task) as f64 / started.elapsed().as_secs_f64();
    (rate, all)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let base = args
        .iter()
        .position(|a| a == "--dir")
        .and_then(|i| args.get(i + 1))
        .map(std::path::PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    let dir = base.join(format!("tiergate-store-bench-{}", std::process::id()));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let store = Embedded::open(
            &dir,
            Limits {
                max_unfinished: u64::MAX,
                writer_nice: 0,
                writer_cpus: Default::default(),
            },
        )
        .expect("store opens");
        println!(
            "durable job submissions, one job per submission, store under {}",
            dir.display()
        );
        println!(
            "{:>11} {:>9} {:>10} {:>9} {:>9} {:>9}",
            "concurrency", "jobs", "jobs/s", "p50 ms", "p99 ms", "max ms"
        );
        // `cargo bench` passes --bench; `cargo test --all-targets` runs this file too, and
        // then a small smoke run is enough.
        let levels: &[usize] = match args.iter().any(|a| a == "--bench") {
            true => &[1, 16, 256, 1024, 4096],
            false => &[1, 16],
        };
        for &concurrency in levels {
            let total = (concurrency * 20).clamp(500, 100_000);
            let per_task = (total / concurrency).max(1);
            let (rate, h) = run(&store, concurrency, per_task).await;
            let ms = |q: f64| h.value_at_quantile(q) as f64 / 1000.0;
            println!(
                "{concurrency:>11} {:>9} {rate:>10.0} {:>9.2} {:>9.2} {:>9.2}",
                concurrency * per_task,
                ms(0.5),
                ms(0.99),
                h.max() as f64 / 1000.0
            );
        }
    });
    let _ = std::fs::remove_dir_all(&dir);
}
