//! Property test: the admin API's edits (merge patches of random keys and values, on a
//! route and on its flags) become either a policy that keeps the model's invariants or
//! a list of problems, each with its file and a path; never a panic. The documents and
//! the check are the policy's own property tests' (`policy::proptests`).
#![allow(clippy::unwrap_used)] // in tests a failed unwrap is a failed test

use std::path::PathBuf;

use proptest::prelude::*;
use serde_json::json;

use crate::policy::proptests::{holds, value, VALID};
use crate::policy::{Policy, Problem, Problems};

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn random_admin_patches_validate_or_report_located_problems(patch in value()) {
        let json = serde_json::to_value(&patch).unwrap();
        let route = json!({ "flags": json.clone() });
        for candidate in [json, route] {
            let result = super::edit::patch_route(VALID, "r", &candidate)
                .map_err(|bad| Problems(vec![Problem { file: PathBuf::from("a.toml"), path: bad.path, message: bad.message }]))
                .and_then(|text| Policy::from_texts(vec![(PathBuf::from("a.toml"), text)]));
            holds(result, &["a.toml"]);
        }
    }
}
