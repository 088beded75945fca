//! Property tests: random and malformed policy documents never panic validation; every
//! one becomes either a policy that keeps the model's invariants or a list of problems,
//! each with its file and a path. The generators and the check are shared with the
//! control plane's property test (`control::proptests`), which holds the admin API's
//! edits to the same.
#![allow(clippy::unwrap_used)] // in tests a failed unwrap is a failed test

use std::path::PathBuf;

use proptest::prelude::*;

use super::*;

/// Keys a policy knows, plus typos, so documents are mostly near-valid.
const KEYS: [&str; 31] = [
    "routes",
    "defaults",
    "models",
    "paths",
    "flags",
    "realtime",
    "micro_batch",
    "offline",
    "micro_batch_percent",
    "endpoints",
    "max_concurrency",
    "http2",
    "binary_tensors",
    "connect_timeout",
    "max_batch",
    "max_wait",
    "max_in_flight",
    "queue_capacity",
    "json_adapter",
    "default_budget",
    "realtime_below",
    "offline_from",
    "when_unmet",
    "rollout_key_header",
    "body_check",
    "r",
    "m",
    "micro_bach",
    "listen",
    "x",
    "",
];

fn key() -> impl Strategy<Value = String> {
    prop::sample::select(KEYS.to_vec()).prop_map(str::to_owned)
}

fn scalar() -> impl Strategy<Value = toml::Value> {
    let durations = prop::sample::select(vec![
        "0s",
        "1ms",
        "20ms",
        "300ms",
        "5s",
        "1h",
        "-1s",
        "abc",
        "9999999999999d",
    ]);
    let strings = prop::sample::select(vec![
        "http://127.0.0.1:9000",
        "grpc://127.0.0.1:9001",
        "http://[::1]:1",
        "ftp://x",
        "http://",
        "m",
        "/v1/models/x:predict",
        "/v1/jobs",
        "tf_serving",
        "reject",
        "best_effort",
        "x-request-id",
        "bad header",
    ]);
    prop_oneof![
        any::<bool>().prop_map(toml::Value::Boolean),
        prop_oneof![any::<i64>(), -2i64..200].prop_map(toml::Value::Integer),
        any::<f64>().prop_map(toml::Value::Float),
        durations.prop_map(|s| toml::Value::String(s.into())),
        strings.prop_map(|s| toml::Value::String(s.into())),
        ".{0,12}".prop_map(toml::Value::String),
    ]
}

pub(crate) fn value() -> impl Strategy<Value = toml::Value> {
    scalar().prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(toml::Value::Array),
            prop::collection::btree_map(key(), inner, 0..6).prop_map(|m| toml::Value::Table(m.into_iter().collect())),
        ]
    })
}

/// A document of random keys and values, rendered as TOML.
fn document() -> impl Strategy<Value = String> {
    prop::collection::btree_map(key(), value(), 0..4)
        .prop_map(|m| toml::to_string(&toml::Value::Table(m.into_iter().collect())).unwrap_or_default())
}

pub(crate) const VALID: &str =
    "[defaults]\nrealtime_below = \"300ms\"\n[routes.r]\nmodels = [\"m\"]\n[routes.r.flags]\n\
                     realtime = true\nmicro_batch = true\n[routes.r.realtime]\nendpoints = [\"http://127.0.0.1:1\"]\n\
                     [routes.r.micro_batch]\nendpoints = [\"http://127.0.0.1:2\"]\nmax_batch = 8\n";

/// A valid document with a few bytes replaced, inserted or cut.
fn damaged() -> impl Strategy<Value = String> {
    prop::collection::vec((0..VALID.len(), any::<u8>(), 0..3u8), 1..6).prop_map(|edits| {
        let mut bytes = VALID.as_bytes().to_vec();
        for (at, byte, how) in edits {
            let at = at.min(bytes.len());
            match how {
                0 if at < bytes.len() => bytes[at] = byte,
                1 => bytes.insert(at, byte),
                _ => bytes.truncate(at.max(1)),
            }
        }
        String::from_utf8_lossy(&bytes).into_owned()
    })
}

/// The property: either a policy keeping the model's invariants, or located problems.
pub(crate) fn holds(result: Result<Policy, Problems>, files: &[&str]) {
    match result {
        Ok(policy) => {
            for route in policy.routes() {
                assert!(route.budgets.realtime_below < route.budgets.offline_from, "{route:?}");
                assert!(!route.flags.realtime || route.realtime.is_some(), "{route:?}");
                let batch = route.flags.micro_batch || route.flags.offline;
                assert!(!batch || route.micro_batch.is_some(), "{route:?}");
                assert!(route.flags.micro_batch_percent <= 100);
            }
        }
        Err(Problems(problems)) => {
            assert!(!problems.is_empty(), "an error names its problems");
            for p in &problems {
                assert!(!p.path.is_empty(), "problem without a path: {p}");
                assert!(
                    files.iter().any(|f| p.file == PathBuf::from(f)),
                    "problem in an unknown file: {p}"
                );
                assert!(!p.message.is_empty());
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn random_documents_validate_or_report_located_problems(doc in document(), other in document()) {
        let texts = vec![(PathBuf::from("a.toml"), doc), (PathBuf::from("b.toml"), other)];
        holds(Policy::from_texts(texts), &["a.toml", "b.toml"]);
    }

    #[test]
    fn damaged_documents_validate_or_report_located_problems(doc in damaged()) {
        holds(Policy::from_texts(vec![(PathBuf::from("a.toml"), doc)]), &["a.toml"]);
    }

    #[test]
    fn any_text_validates_or_reports_located_problems(doc in ".{0,200}") {
        holds(Policy::from_texts(vec![(PathBuf::from("a.toml"), doc)]), &["a.toml"]);
    }

}
