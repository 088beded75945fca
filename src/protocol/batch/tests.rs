//! Table tests for signatures, concat and split, and the property that every caller
//! gets exactly its own rows back, exactly once.
#![allow(clippy::unwrap_used)] // in tests a failed unwrap is a failed test

use bytes::Bytes;
use proptest::prelude::*;
use serde_json::{json, Map, Value};

use super::*;
use crate::protocol::rows::{cut, join};

fn tensor(name: &str, datatype: Datatype, shape: &[u64], data: Vec<u8>) -> Tensor {
    Tensor {
        name: name.into(),
        datatype,
        shape: shape.to_vec(),
        data: data.into(),
    }
}

fn params(value: Value) -> Map<String, Value> {
    match value {
        Value::Object(map) => map,
        _ => panic!("params takes a JSON object"),
    }
}

fn request(inputs: Vec<Tensor>) -> InferRequest {
    InferRequest {
        id: Some("caller".into()),
        inputs,
        ..InferRequest::default()
    }
}

/// BYTES raw data from elements.
fn bytes_data(elements: &[&[u8]]) -> Vec<u8> {
    elements
        .iter()
        .flat_map(|e| [&(e.len() as u32).to_le_bytes()[..], e].concat())
        .collect()
}

/// A backend that answers each input with an output of the same shape and data.
fn echo(req: &InferRequest) -> InferResponse {
    InferResponse {
        model_name: "m".into(),
        model_version: Some("3".into()),
        id: Some("batch".into()),
        parameters: params(json!({"backend": "b1"})),
        outputs: req
            .inputs
            .iter()
            .map(|t| Tensor {
                name: format!("out_{}", t.name),
                ..t.clone()
            })
            .collect(),
        output_parameters: req
            .inputs
            .iter()
            .map(|t| (format!("out_{}", t.name), params(json!({"content_type": "np"}))))
            .collect(),
    }
}

fn base() -> InferRequest {
    let mut req = request(vec![
        tensor("a", Datatype::Fp32, &[2, 3], vec![0; 24]),
        tensor("b", Datatype::Int64, &[2], vec![0; 16]),
    ]);
    req.parameters = params(json!({"timeout": 100, "binary_data_output": true, "opts": {"x": 1, "y": [1, 2]}}));
    req.outputs = vec![RequestedOutput {
        name: "o".into(),
        ..RequestedOutput::default()
    }];
    req
}

/// A named edit to [`base`].
type Change = (&'static str, fn(&mut InferRequest));

#[test]
fn signatures() {
    let same: [Change; 5] = [
        ("identical", |_| {}),
        ("more rows", |r| {
            r.inputs[0] = tensor("a", Datatype::Fp32, &[5, 3], vec![0; 60]);
            r.inputs[1] = tensor("b", Datatype::Int64, &[5], vec![0; 40]);
        }),
        ("timeout differs", |r| {
            r.parameters.insert("timeout".into(), json!(9));
        }),
        ("binary_data_output dropped", |r| {
            r.parameters.remove("binary_data_output");
        }),
        ("key order and output binary_data", |r| {
            r.parameters
                .insert("opts".into(), serde_json::from_str(r#"{"y":[1,2],"x":1}"#).unwrap());
            r.outputs[0].binary_data = Some(true);
        }),
    ];
    let different: [Change; 9] = [
        ("an input's own parameters", |r| {
            r.input_parameters
                .insert("a".into(), params(json!({"content_type": "np"})));
        }),
        ("trailing dim", |r| {
            r.inputs[0] = tensor("a", Datatype::Fp32, &[2, 4], vec![0; 32])
        }),
        ("rank", |r| {
            r.inputs[0] = tensor("a", Datatype::Fp32, &[2, 3, 1], vec![0; 24])
        }),
        ("datatype", |r| r.inputs[0].datatype = Datatype::Int32),
        ("input name", |r| r.inputs[0].name = "c".into()),
        ("input order", |r| r.inputs.swap(0, 1)),
        ("requested outputs", |r| {
            r.outputs.push(RequestedOutput {
                name: "p".into(),
                ..RequestedOutput::default()
            })
        }),
        ("output parameters", |r| {
            r.outputs[0].parameters.insert("classification".into(), json!(3));
        }),
        ("shared parameter", |r| {
            r.parameters.insert("opts".into(), json!({"x": 2, "y": [1, 2]}));
        }),
    ];
    let (expected, rows) = signature(&base()).unwrap();
    assert_eq!(rows, 2);
    for (case, change) in same {
        let mut req = base();
        change(&mut req);
        assert_eq!(signature(&req).unwrap().0, expected, "{case}");
    }
    for (case, change) in different {
        let mut req = base();
        change(&mut req);
        assert_ne!(signature(&req).unwrap().0, expected, "{case}");
    }
}

#[test]
fn unbatchable_requests_are_refused() {
    let scalar = request(vec![tensor("s", Datatype::Fp32, &[], vec![0; 4])]);
    assert_eq!(
        signature(&scalar).unwrap_err(),
        BatchError::Scalar { input: "s".into() }
    );
    let mismatch = request(vec![
        tensor("a", Datatype::Uint8, &[2], vec![0; 2]),
        tensor("b", Datatype::Uint8, &[3], vec![0; 3]),
    ]);
    let err = signature(&mismatch).unwrap_err();
    assert_eq!(
        err.to_string(),
        "inputs disagree on dimension 0: \"a\" has 2 rows but \"b\" has 3"
    );
    assert_eq!(signature(&request(vec![])).unwrap_err(), BatchError::NoInputs);
    assert_eq!(concat(&[]).unwrap_err(), BatchError::Empty);
}

#[test]
fn concat_checks_its_precondition() {
    let a = base();
    let mut b = base();
    b.inputs[0].datatype = Datatype::Int32;
    assert_eq!(
        concat(&[&a, &b]).unwrap_err(),
        BatchError::SignatureMismatch { index: 1 }
    );
    let mut short = base();
    short.inputs[0].data = Bytes::from(vec![0; 20]);
    let err = concat(&[&a, &short]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "request 1 input \"a\" FP32 shape [2,3] needs 24 bytes but data has 20"
    );
    let bad_bytes = request(vec![tensor("s", Datatype::Bytes, &[2], bytes_data(&[b"ab"]))]);
    assert!(matches!(
        concat(&[&bad_bytes]),
        Err(BatchError::BadInput { index: 0, .. })
    ));
}

#[test]
fn concat_builds_one_request() {
    let (a, b) = (base(), {
        let mut b = base();
        b.inputs[0] = tensor("a", Datatype::Fp32, &[1, 3], vec![1; 12]);
        b.inputs[1] = tensor("b", Datatype::Int64, &[1], vec![1; 8]);
        b.outputs[0].binary_data = Some(true);
        b
    });
    let batch = concat(&[&a, &b]).unwrap();
    assert_eq!(batch.id, None);
    assert_eq!(batch.parameters, params(json!({"opts": {"x": 1, "y": [1, 2]}})));
    assert_eq!(
        batch.outputs,
        vec![RequestedOutput {
            name: "o".into(),
            ..RequestedOutput::default()
        }]
    );
    assert_eq!(batch.inputs[0].shape, [3, 3]);
    assert_eq!(batch.inputs[0].data, [vec![0; 24], vec![1; 12]].concat());
    assert_eq!(batch.inputs[1].shape, [3]);
    assert_eq!(batch.inputs[1].data, [vec![0; 16], vec![1; 8]].concat());
}

/// Distinct data for `rows` rows of 2 elements; BYTES elements of varied lengths.
fn caller_data(datatype: Datatype, rows: u64, seed: usize) -> Vec<u8> {
    let elements = rows as usize * 2;
    match datatype.element_size() {
        _ if datatype == Datatype::Bool => (0..elements).map(|k| ((k + seed) % 2) as u8).collect(),
        Some(size) => (0..elements * size).map(|k| (k * 7 + seed) as u8).collect(),
        None => {
            let words: [&[u8]; 4] = [b"", b"hello", b"\xff\x00", b"a much longer element"];
            bytes_data(&(0..elements).map(|k| words[(k + seed) % 4]).collect::<Vec<_>>())
        }
    }
}

#[test]
fn every_datatype_round_trips() {
    for datatype in Datatype::ALL {
        let callers: Vec<InferRequest> = [3u64, 0, 4, 1]
            .iter()
            .enumerate()
            .map(|(seed, &rows)| {
                request(vec![tensor(
                    "x",
                    datatype,
                    &[rows, 2],
                    caller_data(datatype, rows, seed),
                )])
            })
            .collect();
        let refs: Vec<&InferRequest> = callers.iter().collect();
        let rows: Vec<u64> = callers.iter().map(|r| r.inputs[0].rows()).collect();
        let answers = split(&echo(&concat(&refs).unwrap()), &rows).unwrap();
        assert_eq!(answers.len(), callers.len());
        for (caller, answer) in callers.iter().zip(&answers) {
            // The batch's id (the tier gives callers that sent one their own).
            assert_eq!(
                (answer.id.as_deref(), answer.model_version.as_deref()),
                (Some("batch"), Some("3"))
            );
            assert_eq!(answer.parameters, params(json!({"backend": "b1"})));
            assert_eq!(
                answer.output_parameters.get("out_x"),
                Some(&params(json!({"content_type": "np"}))),
                "each output's own parameters"
            );
            assert_eq!(answer.outputs.len(), 1);
            assert_eq!(answer.outputs[0].name, "out_x");
            assert_eq!(answer.outputs[0].shape, caller.inputs[0].shape, "{datatype}");
            assert_eq!(answer.outputs[0].data, caller.inputs[0].data, "{datatype}");
        }
    }
}

#[test]
fn single_caller_shares_its_buffers() {
    let req = base();
    let batch = concat(&[&req]).unwrap();
    assert_eq!(batch.inputs[0].data.as_ptr(), req.inputs[0].data.as_ptr());
}

#[test]
fn broken_answers_are_refused() {
    let fp32 = |shape: &[u64], len| tensor("y", Datatype::Fp32, shape, vec![0; len]);
    let strings = |shape: &[u64], data: Vec<u8>| tensor("s", Datatype::Bytes, shape, data);
    let huge = u64::MAX / 2;
    let table: [(Tensor, &[u64], &str); 9] = [
        (fp32(&[3, 2], 24), &[1, 1], "has 3 rows but the batch has 2"),
        (fp32(&[3, 2], 24), &[2, 2], "has 3 rows but the batch has 4"),
        (
            fp32(&[u64::MAX], 0),
            &[u64::MAX, 1],
            "has 18446744073709551615 rows but the batch has more than 2^64",
        ),
        (fp32(&[], 4), &[1], "is a scalar (rank 0), so it has no rows to split"),
        (
            fp32(&[3, 2], 20),
            &[1, 2],
            "FP32 shape [3,2] needs 24 bytes but data has 20",
        ),
        (
            fp32(&[huge, 4], 8),
            &[huge],
            "shape [9223372036854775807,4] holds more than 2^64 elements",
        ),
        (
            strings(&[2], bytes_data(&[b"ab", b"c"])[..8].to_vec()),
            &[1, 1],
            "BYTES data ends at element 1 but shape [2] holds 2",
        ),
        (
            strings(&[1 << 40], bytes_data(&[b"a"])),
            &[1 << 40],
            "BYTES data ends at element 1 but shape [1099511627776] holds 1099511627776",
        ),
        (
            strings(&[1], [bytes_data(&[b"a"]), vec![9]].concat()),
            &[1],
            "BYTES data has 1 bytes after the 1 elements of shape [1]",
        ),
    ];
    for (output, rows, problem) in table {
        let resp = InferResponse {
            outputs: vec![output.clone()],
            ..InferResponse::default()
        };
        let err = split(&resp, rows).unwrap_err();
        assert!(err.is_backend_fault());
        assert_eq!(
            err,
            BatchError::BadOutput {
                output: output.name.clone(),
                problem: problem.into()
            },
            "{rows:?}"
        );
    }
}

#[test]
fn zero_rows_and_no_callers() {
    let resp = InferResponse {
        outputs: vec![tensor("y", Datatype::Int32, &[0, 5], vec![])],
        ..InferResponse::default()
    };
    let answers = split(&resp, &[0, 0]).unwrap();
    assert!(answers
        .iter()
        .all(|a| a.outputs[0].shape == [0, 5] && a.outputs[0].data.is_empty()));
    assert_eq!(split(&resp, &[]).unwrap(), vec![]);
}

fn element(datatype: Datatype) -> BoxedStrategy<Vec<u8>> {
    match datatype {
        Datatype::Bool => (0u8..=1).prop_map(|b| vec![b]).boxed(),
        Datatype::Bytes => prop::collection::vec(any::<u8>(), 0..6)
            .prop_map(|e| bytes_data(&[&e]))
            .boxed(),
        other => prop::collection::vec(any::<u8>(), other.element_size().unwrap_or(1)).boxed(),
    }
}

/// A datatype, a trailing shape, and per caller its row count and raw data.
type Case = (Datatype, Vec<u64>, Vec<(u64, Vec<u8>)>);

fn callers() -> impl Strategy<Value = Case> {
    let datatypes = prop::sample::select(vec![Datatype::Fp32, Datatype::Int64, Datatype::Bytes, Datatype::Bool]);
    let trailing = prop::collection::vec(0u64..4, 0..3);
    let rows = prop::collection::vec(0u64..5, 1..8);
    (datatypes, trailing, rows).prop_flat_map(|(datatype, trailing, rows)| {
        let per_row: u64 = trailing.iter().product();
        let callers: Vec<_> = rows
            .into_iter()
            .map(|n| {
                let data = prop::collection::vec(element(datatype), (n * per_row) as usize);
                (Just(n), data.prop_map(|elements| elements.concat()))
            })
            .collect();
        (Just(datatype), Just(trailing), callers)
    })
}

proptest! {
    #[test]
    fn every_caller_gets_exactly_its_own_rows((datatype, trailing, callers) in callers()) {
        let reqs: Vec<InferRequest> = callers
            .iter()
            .map(|(n, data)| {
                let shape = [&[*n][..], &trailing].concat();
                request(vec![tensor("x", datatype, &shape, data.clone())])
            })
            .collect();
        let refs: Vec<&InferRequest> = reqs.iter().collect();
        let rows: Vec<u64> = callers.iter().map(|(n, _)| *n).collect();
        let batch = concat(&refs).unwrap();
        prop_assert_eq!(batch.inputs[0].rows(), rows.iter().sum::<u64>());
        let answers = split(&echo(&batch), &rows).unwrap();
        prop_assert_eq!(answers.len(), reqs.len());
        for ((req, answer), n) in reqs.iter().zip(&answers).zip(&rows) {
            prop_assert_eq!(answer.outputs.len(), 1);
            prop_assert_eq!(answer.outputs[0].shape[0], *n);
            prop_assert_eq!(&answer.outputs[0].shape, &req.inputs[0].shape);
            prop_assert_eq!(&answer.outputs[0].data, &req.inputs[0].data);
        }
    }

    #[test]
    fn split_never_panics(dims in prop::collection::vec(any::<u64>(), 0..3), rows in prop::collection::vec(any::<u64>(), 0..4),
                          data in prop::collection::vec(any::<u8>(), 0..40), bytes in any::<bool>()) {
        let datatype = if bytes { Datatype::Bytes } else { Datatype::Int16 };
        let resp = InferResponse { outputs: vec![tensor("y", datatype, &dims, data)], ..InferResponse::default() };
        if let Ok(answers) = split(&resp, &rows) {
            // Whatever it accepts, it hands out every byte exactly once, in order.
            let joined: Vec<u8> = answers.iter().flat_map(|a| a.outputs[0].data.to_vec()).collect();
            prop_assert_eq!(&joined[..], &resp.outputs[0].data[..]);
        }
    }
}

#[test]
fn a_sequence_step_never_shares_a_batch() {
    let mut req = request(vec![tensor("a", Datatype::Fp32, &[1, 1], vec![0; 4])]);
    req.parameters.insert("sequence_id".into(), json!(77));
    let err = signature(&req).unwrap_err();
    assert_eq!(
        err.to_string(),
        "it belongs to sequence 77 (a stateful model's requests are never combined)"
    );
    req.parameters.insert("sequence_id".into(), json!("session-a"));
    assert!(matches!(signature(&req), Err(BatchError::Sequence { .. })));
    // 0 (or an empty string) is Triton's "no sequence".
    req.parameters.insert("sequence_id".into(), json!(0));
    assert!(signature(&req).is_ok());
}

#[test]
fn a_request_cut_into_rows_and_its_rows_answers_joined_give_the_request_and_its_answer() {
    for datatype in Datatype::ALL {
        let mut req = request(vec![
            tensor("x", datatype, &[3, 2], caller_data(datatype, 3, 1)),
            tensor("y", datatype, &[3, 2], caller_data(datatype, 3, 2)),
        ]);
        req.parameters = params(json!({"opts": 1}));
        let rows = cut(&req).unwrap();
        assert_eq!(rows.len(), 3, "{datatype}");
        for row in &rows {
            assert_eq!((row.id.as_deref(), &row.parameters), (None, &req.parameters));
            assert!(row.inputs.iter().all(|t| t.shape == [1, 2]), "{datatype}");
        }
        let refs: Vec<&InferRequest> = rows.iter().collect();
        let whole = concat(&refs).unwrap();
        assert_eq!(whole.inputs, req.inputs, "{datatype}: the rows are the request");
        let answers: Vec<InferResponse> = rows.iter().map(echo).collect();
        let joined = join(&answers.iter().collect::<Vec<_>>()).unwrap();
        let direct = echo(&req);
        assert_eq!(
            joined.outputs, direct.outputs,
            "{datatype}: the rows' answers are the answer"
        );
        assert_eq!(joined.id, None);
    }
    let one = echo(&request(vec![tensor("x", Datatype::Fp32, &[1, 2], vec![0; 8])]));
    let other = echo(&request(vec![tensor("x", Datatype::Fp32, &[1, 3], vec![0; 12])]));
    assert!(
        matches!(join(&[&one, &other]), Err(BatchError::BadOutput { .. })),
        "rows of different shapes never join"
    );
    let bad = request(vec![tensor("x", Datatype::Fp32, &[2, 2], vec![0; 12])]);
    assert!(matches!(cut(&bad), Err(BatchError::BadInput { .. })));
}
