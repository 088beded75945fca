//! A Batch API input file read line by line: each line `{custom_id, method, url, body}`
//! becomes a job for the route that serves `url` (its offline tier on), or a problem
//! with its line number. Untrusted input: every line is checked, nothing panics, and
//! each body is held to the limit a request sent directly would meet.

use std::collections::HashSet;

use bytes::Bytes;
use serde_json::{json, Map, Value};

use crate::policy::Policy;
use crate::queue::NewJob;

/// What the lines are read against.
#[derive(Debug, Clone, Copy)]
pub struct Within<'a> {
    /// The running policy (each line's url must name a route with its offline tier on).
    pub policy: &'a Policy,
    /// The batch's endpoint: every line's url must be it, as OpenAI's Batch API requires.
    pub endpoint: &'a str,
    /// Most requests in one file.
    pub max_lines: usize,
    /// Largest body a line may carry (`limits.max_body_bytes`).
    pub max_body_bytes: usize,
    /// When the jobs expire (ms since the Unix epoch).
    pub expires_at: i64,
    /// Whose jobs they are.
    pub tenant: &'a str,
    /// Whether the route's shadow candidate scores them too (a shadow batch).
    pub shadow: bool,
    /// How long their answers are kept in the route's cache (a precomputing batch).
    pub precompute: Option<std::time::Duration>,
}

/// Every valid line of `content` as a job, and the problems with the others (each
/// with its line number; with any, the batch fails whole and no job runs).
pub fn lines(content: &[u8], within: &Within<'_>) -> (Vec<(String, u64, NewJob)>, Vec<Value>) {
    let Within {
        policy,
        endpoint,
        max_lines: max,
        max_body_bytes,
        expires_at,
        tenant,
        shadow,
        precompute,
    } = *within;
    let (mut jobs, mut errors) = (Vec::new(), Vec::new());
    let mut seen = HashSet::new();
    for (i, raw) in content.split(|b| *b == b'\n').enumerate() {
        let line = i as u64 + 1;
        let raw = raw.strip_suffix(b"\r").unwrap_or(raw);
        if raw.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        if jobs.len() + errors.len() >= max {
            problem(
                &mut errors,
                line,
                "too_many_lines",
                format!("the file has more than {max} requests"),
                None,
            );
            break;
        }
        let obj: Map<String, Value> = match serde_json::from_slice(raw) {
            Ok(Value::Object(obj)) => obj,
            Ok(_) => {
                problem(
                    &mut errors,
                    line,
                    "invalid_json_line",
                    "the line is not a JSON object".into(),
                    None,
                );
                continue;
            }
            Err(e) => {
                problem(
                    &mut errors,
                    line,
                    "invalid_json_line",
                    format!("the line is not valid JSON: {e}"),
                    None,
                );
                continue;
            }
        };
        let Some(custom_id) = obj.get("custom_id").and_then(Value::as_str).filter(|c| !c.is_empty()) else {
            problem(
                &mut errors,
                line,
                "missing_required_parameter",
                "custom_id is required (a string)".into(),
                Some("custom_id"),
            );
            continue;
        };
        if !seen.insert(custom_id.to_owned()) {
            let message = format!("custom_id {custom_id:?} is used by an earlier line; each must be unique");
            problem(&mut errors, line, "duplicate_custom_id", message, Some("custom_id"));
            continue;
        }
        if obj.get("method").and_then(Value::as_str) != Some("POST") {
            problem(
                &mut errors,
                line,
                "invalid_method",
                "method must be \"POST\"".into(),
                Some("method"),
            );
            continue;
        }
        let Some(url) = obj.get("url").and_then(Value::as_str) else {
            problem(
                &mut errors,
                line,
                "missing_required_parameter",
                "url is required (a string)".into(),
                Some("url"),
            );
            continue;
        };
        if url != endpoint {
            let message =
                format!("url {url} is not the batch's endpoint {endpoint}; every line of a batch goes to its endpoint");
            problem(&mut errors, line, "invalid_url", message, Some("url"));
            continue;
        }
        // OpenAI's paths are routed by each line's `model` (a line asking for a stream
        // fails alone, when it runs: its answer is written whole).
        let llm = crate::llm::openai::is_path(url).then(|| obj.get("body").and_then(|b| b.get("model")));
        let route = match llm {
            Some(asked) => match asked.and_then(Value::as_str) {
                Some(model) => policy.route_for_openai(url, model).cloned(),
                None => {
                    let message = "body.model is required: lines on this path are routed by their model".into();
                    problem(
                        &mut errors,
                        line,
                        "missing_required_parameter",
                        message,
                        Some("body.model"),
                    );
                    continue;
                }
            },
            None => crate::front::paths::route_for(policy, url),
        };
        let Some(route) = route else {
            let what = match llm {
                Some(_) => "no route serves this line's model on it",
                None => "no route serves it",
            };
            problem(&mut errors, line, "invalid_url", format!("{url}: {what}"), Some("url"));
            continue;
        };
        if !route.flags.offline || route.micro_batch.is_none() {
            let message = format!("route {} (for {url}) has its offline tier switched off", route.name);
            problem(&mut errors, line, "invalid_url", message, Some("url"));
            continue;
        }
        let body = match obj.get("body") {
            Some(body @ Value::Object(_)) => Bytes::from(body.to_string()),
            _ if raw.len() > max_body_bytes => Bytes::new(), // refused below, whatever it is
            _ => {
                problem(
                    &mut errors,
                    line,
                    "invalid_body",
                    "body must be a JSON object".into(),
                    Some("body"),
                );
                continue;
            }
        };
        if body.len() > max_body_bytes || raw.len() > max_body_bytes {
            let message = format!(
                "the line is {} bytes, over the body limit of {} bytes (limits.max_body_bytes) that a request \
                 sent directly would meet",
                raw.len(),
                max_body_bytes
            );
            problem(&mut errors, line, "body_too_large", message, Some("body"));
            continue;
        }
        let params = obj
            .get("body")
            .and_then(|b| b.get("parameters"))
            .and_then(Value::as_object);
        if let Some(Ok(Some(sequence))) = params.map(crate::protocol::sequence) {
            let message = format!(
                "the request is a step of sequence {}: a batch runs its requests in any order, so a stateful \
                 model's steps cannot be sent this way; send them directly, in order",
                sequence.id
            );
            problem(&mut errors, line, "sequence_unsupported", message, Some("body"));
            continue;
        }
        let job = NewJob {
            route: route.name.clone(),
            method: "POST".into(),
            path: url.to_owned(),
            headers: std::iter::once(("content-type".into(), "application/json".into()))
                .chain(precompute.map(|ttl| (crate::queue::PRECOMPUTE.into(), ttl.as_millis().to_string())))
                .collect(),
            body,
            expires_at,
            idempotency_key: None,
            tenant: tenant.to_owned(),
            shadow,
        };
        jobs.push((custom_id.to_owned(), line, job));
    }
    if jobs.is_empty() && errors.is_empty() {
        problem(
            &mut errors,
            0,
            "empty_file",
            "the input file has no requests".into(),
            None,
        );
    }
    (jobs, errors)
}

/// Records a line's problem (the first 1,000; the rest are counted by their absence).
fn problem(errors: &mut Vec<Value>, line: u64, code: &str, message: String, param: Option<&str>) {
    if errors.len() < 1000 {
        errors.push(json!({"code": code, "message": message, "param": param, "line": line}));
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn policy() -> Policy {
        let text = r#"
[routes.r]
models = ["m"]
[routes.r.flags]
realtime = false
offline = true
[routes.r.micro_batch]
endpoints = ["http://127.0.0.1:9"]
"#;
        Policy::from_texts(vec![("p.toml".into(), text.to_owned())]).expect("valid")
    }

    fn within(policy: &Policy) -> Within<'_> {
        Within {
            policy,
            endpoint: "/v2/models/m/infer",
            max_lines: 50,
            max_body_bytes: 256,
            expires_at: 1,
            tenant: "t",
            shadow: false,
            precompute: None,
        }
    }

    fn valid(custom_id: &str, rows: usize) -> String {
        let data: Vec<usize> = (0..rows * 2).collect();
        json!({"custom_id": custom_id, "method": "POST", "url": "/v2/models/m/infer",
               "body": {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [rows, 2], "data": data}]}})
        .to_string()
    }

    #[test]
    fn a_line_for_another_endpoint_than_the_batch_is_refused_by_its_line() {
        let policy = policy();
        let within = Within {
            endpoint: "/v1/embeddings",
            ..within(&policy)
        };
        let (jobs, errors) = lines(valid("c0", 1).as_bytes(), &within);
        assert!(jobs.is_empty());
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert_eq!(
            (errors[0]["line"].as_u64(), errors[0]["code"].as_str()),
            (Some(1), Some("invalid_url"))
        );
        let message = errors[0]["message"].as_str().unwrap_or_default();
        assert!(
            message.contains("/v2/models/m/infer is not the batch's endpoint /v1/embeddings"),
            "{message}"
        );
    }

    #[test]
    fn a_sequence_step_cannot_go_in_a_batch() {
        let policy = policy();
        let line = json!({"custom_id": "c0", "method": "POST", "url": "/v2/models/m/infer",
                          "body": {"parameters": {"sequence_id": 9},
                                   "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 1], "data": [1]}]}});
        let (jobs, errors) = lines(line.to_string().as_bytes(), &within(&policy));
        assert!(jobs.is_empty());
        assert_eq!(errors[0]["code"], "sequence_unsupported", "{errors:?}");
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        /// Any bytes at all: no panic; every problem names a line of the file, every job
        /// a line of its own, in order, with a body within the limit and the tenant's.
        #[test]
        fn any_file_is_read_without_panicking_and_every_answer_names_its_line(content in proptest::collection::vec(any::<u8>(), 0..2048)) {
            let policy = policy();
            let (jobs, errors) = lines(&content, &within(&policy));
            let count = content.split(|b| *b == b'\n').count() as u64;
            for e in &errors {
                let line = e["line"].as_u64().expect("a line number");
                prop_assert!(line <= count, "{}", e);
            }
            let numbers: Vec<u64> = jobs.iter().map(|(_, line, _)| *line).collect();
            prop_assert!(numbers.windows(2).all(|w| w[0] < w[1]));
            for (_, _, job) in &jobs {
                prop_assert!(job.body.len() <= 256);
                prop_assert_eq!(job.tenant.as_str(), "t");
            }
            prop_assert!(jobs.len() + errors.len() <= 51);
        }

        /// Valid lines, mixed with blank ones and one line of the wrong shape, oversized
        /// or duplicated: the valid ones become jobs in order, the bad one is reported at
        /// its line, and nothing else is.
        #[test]
        fn valid_lines_become_jobs_and_the_one_bad_line_is_named(
            n in 1usize..20,
            blank_every in 2usize..5,
            bad_at in 0usize..20,
            bad_kind in 0usize..4,
        ) {
            let policy = policy();
            let bad_at = bad_at % n;
            let mut text = Vec::new();
            let mut expected_bad_line = 0;
            let mut good = Vec::new();
            for i in 0..n {
                if i % blank_every == 0 {
                    text.push(String::new());
                }
                if i == bad_at {
                    let (line, _) = match bad_kind {
                        0 => ("{not json".to_owned(), "invalid_json_line"),
                        1 => (valid(&format!("c{i}"), 100), "body_too_large"),
                        2 => (valid("c0", 1), "duplicate_custom_id"),
                        _ => (valid(&format!("c{i}"), 1).replace("/v2/models/m/infer", "/nowhere"), "invalid_url"),
                    };
                    // A duplicate only when there is an earlier c0 to repeat.
                    if bad_kind == 2 && bad_at == 0 {
                        text.push(valid(&format!("c{i}"), 1));
                        good.push(format!("c{i}"));
                        continue;
                    }
                    text.push(line);
                    expected_bad_line = text.len() as u64;
                } else {
                    text.push(valid(&format!("c{i}"), 1));
                    good.push(format!("c{i}"));
                }
            }
            let (jobs, errors) = lines(text.join("\n").as_bytes(), &within(&policy));
            let ids: Vec<&str> = jobs.iter().map(|(id, _, _)| id.as_str()).collect();
            prop_assert_eq!(ids, good.iter().map(String::as_str).collect::<Vec<_>>());
            if expected_bad_line == 0 {
                prop_assert!(errors.is_empty(), "{:?}", errors);
            } else {
                prop_assert_eq!(errors.len(), 1, "{:?}", errors);
                prop_assert_eq!(errors[0]["line"].as_u64(), Some(expected_bad_line), "{:?}", errors);
            }
        }
    }
}
