//! Table tests for every rule of the protocol, and round trips.
#![allow(clippy::unwrap_used)] // in tests a failed unwrap is a failed test

use bytes::Bytes;
use serde_json::{json, Map, Value};

use super::*;

fn json_body(value: Value) -> Bytes {
    Bytes::from(value.to_string())
}

/// A binary-extension body: JSON header then `section`.
fn binary_body(header: Value, section: &[u8]) -> (Bytes, Option<usize>) {
    let mut body = header.to_string().into_bytes();
    let len = body.len();
    body.extend_from_slice(section);
    (Bytes::from(body), Some(len))
}

fn input(name: &str, datatype: &str, shape: Value, data: Value) -> Value {
    json!({"name": name, "datatype": datatype, "shape": shape, "data": data})
}

fn bin_input(name: &str, datatype: &str, shape: Value, size: Value) -> Value {
    json!({"name": name, "datatype": datatype, "shape": shape, "parameters": {"binary_data_size": size}})
}

fn one(i: Value) -> Value {
    json!({ "inputs": [i] })
}

/// A body and its JSON header length.
type Body = (Bytes, Option<usize>);

fn error_cases() -> Vec<(&'static str, Bytes, Option<usize>, String)> {
    let f = |i: Value| (json_body(one(i)), None);
    let fp32 = |data: Value| f(input("x", "FP32", json!([1]), data));
    let mut cases: Vec<(&str, Body, &str)> = vec![
        ("not json", (Bytes::from_static(b"[x"), None), "request body is not JSON: expected value at line 1 column 2"),
        ("empty body", (Bytes::new(), None), "request body is not JSON: EOF while parsing a value at line 1 column 0"),
        ("wrong type", (json_body(json!({"inputs": 5})), None), "request JSON is not a KServe v2 inference request: invalid type: integer `5`, expected a sequence at line 1 column 11"),
        ("no inputs field", (json_body(json!({})), None), "request JSON is not a KServe v2 inference request: missing field `inputs` at line 1 column 2"),
        ("empty inputs", (json_body(json!({"inputs": []})), None), "inputs is empty; an inference request needs at least one input"),
        ("duplicate", (json_body(json!({"inputs": [input("a", "INT8", json!([1]), json!([1])), input("b", "INT8", json!([1]), json!([1])), input("a", "INT8", json!([1]), json!([1]))]})), None), "inputs[2].name \"a\" is already used by inputs[0]; tensor names must be unique"),
        ("datatype", (json_body(json!({"inputs": [input("a", "INT8", json!([1]), json!([1])), input("b", "FP33", json!([1]), json!([1]))]})), None), "inputs[1].datatype \"FP33\" is not a KServe v2 datatype"),
        ("negative dim", f(input("x", "FP32", json!([2, -1]), json!([]))), "inputs[0].shape[1] is -1; shape elements must be non-negative"),
        ("overflow", f(input("x", "FP32", json!([i64::MAX, 4]), json!([]))), "inputs[0].shape [9223372036854775807,4] holds more than 2^64 elements"),
        ("count", (json_body(json!({"inputs": [input("a", "INT8", json!([1]), json!([1])), input("b", "INT32", json!([2, 3]), json!([1, 2, 3, 4, 5]))]})), None), "inputs[1].shape [2,3] holds 6 elements but data has 5"),
        ("nested count", f(input("x", "INT32", json!([2, 2]), json!([[1, 2], [3]]))), "inputs[0].shape [2,2] holds 4 elements but data has 3"),
        ("int8 range", f(input("x", "INT8", json!([3]), json!([1, 300, -1]))), "inputs[0].data[1]: 300 is out of range for INT8"),
        ("uint8 negative", f(input("x", "UINT8", json!([2]), json!([1, -1]))), "inputs[0].data[1]: -1 is out of range for UINT8"),
        ("int64 range", f(input("x", "INT64", json!([1]), json!([u64::MAX]))), "inputs[0].data[0]: 18446744073709551615 is out of range for INT64"),
        ("uint32 range", f(input("x", "UINT32", json!([1]), json!([4294967296u64]))), "inputs[0].data[0]: 4294967296 is out of range for UINT32"),
        ("fp32 range", fp32(json!([1e300])), "inputs[0].data[0]: 1e300 is out of range for FP32"),
        ("float in int", f(input("x", "INT32", json!([2]), json!([1, 1.5]))), "inputs[0].data[1]: expected an integer, got 1.5"),
        ("string in fp32", fp32(json!(["1"])), "inputs[0].data[0]: expected a number, got a string"),
        ("number in bool", f(input("x", "BOOL", json!([2]), json!([true, 1]))), "inputs[0].data[1]: expected true or false, got a number"),
        ("bool in bytes", f(input("x", "BYTES", json!([2]), json!(["a", false]))), "inputs[0].data[1]: expected a string, got a boolean"),
        ("null element", fp32(json!([null])), "inputs[0].data[0]: expected a number, boolean or string, got null"),
        ("object element", f(input("x", "FP32", json!([2]), json!([1, {"a": 1}]))), "inputs[0].data[1]: expected a number, boolean or string, got an object"),
        ("data not array", fp32(json!(1.0)), "inputs[0].data must be an array (flat or nested)"),
        ("json fp16", f(input("x", "FP16", json!([1]), json!([1.0]))), "inputs[0].data: FP16 cannot be sent as JSON; send this tensor with the binary tensor extension"),
        ("json bf16", f(input("x", "BF16", json!([1]), json!([1.0]))), "inputs[0].data: BF16 cannot be sent as JSON; send this tensor with the binary tensor extension"),
        ("no data", f(json!({"name": "x", "datatype": "FP32", "shape": [1]})), "inputs[0] has neither data nor parameters.binary_data_size"),
        ("both", f(json!({"name": "x", "datatype": "FP32", "shape": [1], "data": [1], "parameters": {"binary_data_size": 4}})), "inputs[0] has both data and parameters.binary_data_size; send one of them"),
        ("size param", binary_body(one(bin_input("x", "FP32", json!([1]), json!("4"))), &[0; 4]), "inputs[0].parameters.binary_data_size must be a non-negative integer (bytes), got \"4\""),
        ("timeout", (json_body(json!({"parameters": {"timeout": -5}, "inputs": [input("x", "BOOL", json!([1]), json!([true]))]})), None), "parameters.timeout must be a non-negative integer (microseconds), got -5"),
        ("binary_data_output", (json_body(json!({"parameters": {"binary_data_output": 1}, "inputs": [input("x", "BOOL", json!([1]), json!([true]))]})), None), "parameters.binary_data_output must be true or false, got 1"),
        ("binary_data", (json_body(json!({"inputs": [input("x", "BOOL", json!([1]), json!([true]))], "outputs": [{"name": "y", "parameters": {"binary_data": "yes"}}]})), None), "outputs[0].parameters.binary_data must be true or false, got \"yes\""),
        ("section short", binary_body(one(bin_input("x", "FP32", json!([3]), json!(12))), &[0; 10]), "binary section is 10 bytes but inputs declare binary_data_size 12 in total"),
        ("section trailing", binary_body(one(input("x", "INT8", json!([1]), json!([1]))), &[0; 3]), "binary section is 3 bytes but inputs declare binary_data_size 0 in total"),
        ("no header length", (json_body(one(bin_input("x", "FP32", json!([1]), json!(4)))), None), "binary section is 0 bytes but inputs declare binary_data_size 4 in total"),
        ("fixed size", binary_body(one(bin_input("x", "INT16", json!([2, 2]), json!(6))), &[0; 6]), "inputs[0].parameters.binary_data_size is 6 but INT16 shape [2,2] needs 8 bytes"),
        ("bytes layout", binary_body(one(bin_input("x", "BYTES", json!([2]), json!(9))), &[1, 0, 0, 0, b'a', 9, 0, 0, 0]), "inputs[0]: BYTES binary data is malformed: element 1 declares 9 bytes but only 0 remain"),
        ("bytes count", binary_body(one(bin_input("x", "BYTES", json!([2]), json!(5))), &[1, 0, 0, 0, b'a']), "inputs[0]: BYTES binary data is malformed: it holds 1 elements but the shape holds 2"),
        ("header too long", (Bytes::from(vec![b' '; 512]), Some(900)), "inference-header-content-length 900 is larger than the body (512 bytes)"),
        ("shm input", f(json!({"name": "x", "datatype": "FP32", "shape": [1], "parameters": {"shared_memory_region": "r", "shared_memory_byte_size": 4}})), "inputs[0].parameters.shared_memory_region: tiergate cannot use shared memory (the client's regions are on another host than the model servers it forwards to); send the tensor's data in the request instead"),
        ("shm output", (json_body(json!({"inputs": [input("x", "BOOL", json!([1]), json!([true]))], "outputs": [{"name": "y", "parameters": {"binary_data": true, "shared_memory_byte_size": 8}}]})), None), "outputs[0].parameters.shared_memory_byte_size: tiergate cannot use shared memory (the client's regions are on another host than the model servers it forwards to); send the tensor's data in the request instead"),
    ];
    let mut deep = json!([1.0]);
    for _ in 0..70 {
        deep = json!([deep]);
    }
    cases.push(("too deep", fp32(deep), "inputs[0].data is nested deeper than 64 arrays"));
    // More tensors than are compared pairwise: the names go through a hash map instead.
    let mut many: Vec<Value> = (0..20)
        .map(|i| input(&format!("t{i}"), "INT8", json!([1]), json!([1])))
        .collect();
    many.push(input("t3", "INT8", json!([1]), json!([1])));
    cases.push((
        "duplicate among many",
        (json_body(json!({ "inputs": many })), None),
        "inputs[20].name \"t3\" is already used by inputs[3]; tensor names must be unique",
    ));
    cases
        .into_iter()
        .map(|(n, (b, h), m)| (n, b, h, m.to_owned()))
        .collect()
}

#[test]
fn every_error_says_what_to_fix_and_inspect_agrees() {
    for (name, body, header_len, want) in error_cases() {
        let decoded = decode_request(&body, header_len).map(|_| ()).map_err(|e| e.to_string());
        assert_eq!(decoded, Err(want.clone()), "decode: {name}");
        let inspected = inspect_request(&body, header_len, BodyCheck::Full)
            .map(|_| ())
            .map_err(|e| e.to_string());
        assert_eq!(inspected, Err(want), "inspect: {name}");
    }
}

fn tensor(name: &str, datatype: Datatype, shape: &[u64], data: Vec<u8>) -> Tensor {
    let shape = shape.to_vec();
    Tensor {
        name: name.into(),
        datatype,
        shape,
        data: data.into(),
    }
}

fn le_all<const N: usize, T>(values: &[T], f: impl Fn(&T) -> [u8; N]) -> Vec<u8> {
    values.iter().flat_map(f).collect()
}

#[test]
fn json_data_becomes_raw_bytes() {
    let bytes_raw = [&[1u8, 0, 0, 0][..], b"a", &[3, 0, 0, 0], "é!".as_bytes()].concat();
    let table = vec![
        (
            input("x", "FP32", json!([2]), json!([1.5, -2])),
            tensor("x", Datatype::Fp32, &[2], le_all(&[1.5f32, -2.0], |v| v.to_le_bytes())),
        ),
        (
            input("x", "INT16", json!([2, 2]), json!([[1, -2], [3, 4]])),
            tensor(
                "x",
                Datatype::Int16,
                &[2, 2],
                le_all(&[1i16, -2, 3, 4], |v| v.to_le_bytes()),
            ),
        ),
        (
            input("x", "UINT64", json!([1]), json!([u64::MAX])),
            tensor("x", Datatype::Uint64, &[1], u64::MAX.to_le_bytes().to_vec()),
        ),
        (
            input("x", "BOOL", json!([3]), json!([true, false, true])),
            tensor("x", Datatype::Bool, &[3], vec![1, 0, 1]),
        ),
        (
            input("x", "BYTES", json!([2]), json!(["a", "é!"])),
            tensor("x", Datatype::Bytes, &[2], bytes_raw),
        ),
        (
            input("x", "FP64", json!([]), json!([7])),
            tensor("x", Datatype::Fp64, &[], 7f64.to_le_bytes().to_vec()),
        ),
        (
            input("x", "INT8", json!([0, 3]), json!([])),
            tensor("x", Datatype::Int8, &[0, 3], vec![]),
        ),
    ];
    for (wire, want) in table {
        let req = decode_request(&json_body(one(wire.clone())), None).unwrap();
        assert_eq!(req.inputs, vec![want], "{wire}");
    }
}

#[test]
fn nested_and_flat_data_decode_alike() {
    let flat = input("x", "INT32", json!([2, 2, 2]), json!([1, 2, 3, 4, 5, 6, 7, 8]));
    let nested = input(
        "x",
        "INT32",
        json!([2, 2, 2]),
        json!([[[1, 2], [3, 4]], [[5, 6], [7, 8]]]),
    );
    let a = decode_request(&json_body(one(flat)), None).unwrap();
    let b = decode_request(&json_body(one(nested)), None).unwrap();
    assert_eq!(a, b);
}

#[test]
fn binary_inputs_are_slices_of_the_body() {
    let header = json!({"id": "r1", "inputs": [
        bin_input("a", "FP32", json!([1, 2]), json!(8)),
        input("b", "BOOL", json!([1]), json!([true])),
        bin_input("c", "BYTES", json!([1]), json!(6)),
    ]});
    let section = [
        le_all(&[1.0f32, 2.0], |v| v.to_le_bytes()),
        vec![2, 0, 0, 0, b'h', b'i'],
    ]
    .concat();
    let (body, len) = binary_body(header, &section);
    let req = decode_request(&body, len).unwrap();
    assert_eq!(req.id.as_deref(), Some("r1"));
    assert_eq!(&req.inputs[0].data[..], &section[..8]);
    assert_eq!(&req.inputs[2].data[..], &section[8..]);
    let body_range = body.as_ptr_range();
    assert!(body_range.contains(&req.inputs[0].data.as_ptr()), "zero copy");
    let info = inspect_request(&body, len, BodyCheck::Full).unwrap();
    assert_eq!(
        info,
        RequestInfo {
            id: Some("r1".into()),
            timeout_us: None,
            rows: Some(1),
            sequence: None,
        }
    );
}

#[test]
fn inspect_reports_rows_and_timeout() {
    let table = [
        (
            json!([
                input("a", "INT8", json!([3, 1]), json!([1, 2, 3])),
                input("b", "INT8", json!([3]), json!([1, 2, 3]))
            ]),
            Some(3),
        ),
        (
            json!([
                input("a", "INT8", json!([3]), json!([1, 2, 3])),
                input("b", "INT8", json!([2]), json!([1, 2]))
            ]),
            None,
        ),
        (json!([input("a", "INT8", json!([]), json!([1]))]), None),
    ];
    for (inputs, rows) in table {
        let body = json_body(json!({"parameters": {"timeout": 2500}, "inputs": inputs}));
        let info = inspect_request(&body, None, BodyCheck::Full).unwrap();
        assert_eq!((info.rows, info.timeout_us), (rows, Some(2500)), "{inputs}");
    }
}

#[test]
fn requested_outputs_keep_their_binary_flag() {
    let body = json_body(json!({
        "inputs": [input("x", "INT8", json!([1]), json!([1]))],
        "outputs": [{"name": "a", "parameters": {"binary_data": true, "classification": 2}}, {"name": "b"}],
    }));
    let req = decode_request(&body, None).unwrap();
    assert_eq!(req.outputs[0].binary_data, Some(true));
    assert_eq!(
        req.outputs[0].parameters,
        json!({"classification": 2}).as_object().unwrap().clone()
    );
    assert_eq!((req.outputs[1].name.as_str(), req.outputs[1].binary_data), ("b", None));
    let (again, len) = encode_request(&req, false);
    assert_eq!((decode_request(&again, len).unwrap(), len), (req, None));
}

#[test]
fn inputs_keep_their_own_parameters_json_and_binary() {
    let header = json!({"inputs": [
        {"name": "x", "datatype": "INT8", "shape": [1], "parameters": {"content_type": "np", "binary_data_size": 1}},
        input("y", "INT8", json!([1]), json!([2])),
    ]});
    let (body, len) = binary_body(header, &[7]);
    let req = decode_request(&body, len).unwrap();
    let own: Map<String, Value> = json!({"content_type": "np"}).as_object().unwrap().clone();
    assert_eq!(req.input_parameters, [("x".to_owned(), own)].into(), "framing left out");
    for binary in [false, true] {
        let (again, len) = encode_request(&req, binary);
        assert_eq!(decode_request(&again, len).unwrap(), req, "binary inputs: {binary}");
    }
}

fn sample_response() -> InferResponse {
    InferResponse {
        model_name: "m".into(),
        model_version: Some("1".into()),
        id: Some("r".into()),
        parameters: Default::default(),
        outputs: vec![
            tensor("a", Datatype::Fp32, &[2], le_all(&[0.5f32, 3.0], |v| v.to_le_bytes())),
            tensor("b", Datatype::Bytes, &[1], vec![1, 0, 0, 0, b'z']),
            tensor("c", Datatype::Fp16, &[1], vec![0x00, 0x3c]),
            tensor("d", Datatype::Bf16, &[1], vec![0x80, 0x3f]),
        ],
        output_parameters: [(
            "a".to_owned(),
            json!({"content_type": "np"}).as_object().cloned().unwrap_or_default(),
        )]
        .into(),
    }
}

#[test]
fn responses_round_trip_json_and_binary() {
    let resp = sample_response();
    let only_b = |t: &Tensor| t.name == "b";
    for (binary, json_outputs) in [
        (&(|_: &Tensor| false) as &dyn Fn(&Tensor) -> bool, 2),
        (&only_b, 1),
        (&|_: &Tensor| true, 0),
    ] {
        let (body, len) = encode_response(&resp, binary);
        // FP16 always travels binary, so every body here has a binary section.
        let header: Value = serde_json::from_slice(&body[..len.unwrap()]).unwrap();
        let outputs = header["outputs"].as_array().unwrap();
        assert_eq!(outputs.iter().filter(|o| o.get("data").is_some()).count(), json_outputs);
        assert_eq!(outputs[2]["parameters"]["binary_data_size"], json!(2));
        assert_eq!(decode_response(&body, len).unwrap(), resp);
    }
}

#[test]
fn plain_json_response_has_no_header_length() {
    let mut resp = sample_response();
    resp.outputs.truncate(2);
    let (body, len) = encode_response(&resp, &|_| false);
    assert_eq!(len, None);
    let header: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(header["outputs"][0]["data"], json!([0.5, 3.0]));
    assert_eq!(header["outputs"][1]["data"], json!(["z"]));
    assert_eq!(decode_response(&body, None).unwrap(), resp);
}

#[test]
fn response_errors_name_outputs() {
    let body = json_body(json!({"model_name": "m", "outputs": [input("o", "INT8", json!([2]), json!([1]))]}));
    let err = decode_response(&body, None).unwrap_err().to_string();
    assert_eq!(err, "outputs[0].shape [2] holds 2 elements but data has 1");
    let err = decode_response(&json_body(json!({"outputs": []})), None)
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("response JSON is not a KServe v2 inference response: missing field `model_name`"),
        "{err}"
    );
}

#[test]
fn error_body_is_protocol_json() {
    let body = error_body("bad \"thing\"");
    assert_eq!(
        serde_json::from_slice::<Value>(&body).unwrap(),
        json!({"error": "bad \"thing\""})
    );
}

#[test]
fn a_sequence_is_read_from_the_request_parameters() {
    let with = |params: Value| {
        let body = json_body(json!({"parameters": params, "inputs": [input("x", "BOOL", json!([1]), json!([true]))]}));
        inspect_request(&body, None, BodyCheck::Full)
            .map(|info| info.sequence)
            .map_err(|e| e.to_string())
    };
    assert_eq!(
        with(json!({"sequence_id": 77, "sequence_start": true})),
        Ok(Some(crate::protocol::Sequence {
            id: "77".into(),
            start: true,
            end: false
        }))
    );
    assert_eq!(
        with(json!({"sequence_id": "a"})).map(|s| s.map(|s| s.id)),
        Ok(Some("\"a\"".into()))
    );
    assert_eq!(with(json!({"sequence_id": 0})), Ok(None), "0 is no sequence");
    assert_eq!(
        with(json!({"sequence_id": -1})),
        Err("parameters.sequence_id must be a non-negative integer or a string, got -1".into())
    );
    assert_eq!(
        with(json!({"sequence_id": 1, "sequence_end": "yes"})),
        Err("parameters.sequence_end must be true or false, got \"yes\"".into())
    );
}

#[test]
fn a_tensors_path_is_written_on_the_stack() {
    assert_eq!(wire::At::new("inputs", 0).as_str(), "inputs[0]");
    assert_eq!(wire::At::new("outputs", 12345).as_str(), "outputs[12345]");
    assert_eq!(
        wire::At::new("inputs", usize::MAX).as_str(),
        format!("inputs[{}]", usize::MAX)
    );
}

#[test]
fn the_envelope_check_counts_what_the_full_parse_counts() {
    use super::data::{Counted, Data, Sink, Summary};
    let deep = "[".repeat(70) + &"]".repeat(70);
    let texts = [
        "[1, 2.5, -3e7]",
        "[[1, 2], [3, 4]]",
        "[]",
        "[[], [[]]]",
        r#"["a\"]", "b,c", "\\"]"#,
        "[1, null, 2]",
        r#"[1, {"a": [1, "]"]}, 2]"#,
        "[true, false, 0]",
        "[[[[1]]], 2]",
        " [ 1 , 2 ] ",
        "1",
        r#""x""#,
        "{}",
        "null",
        &deep,
    ];
    for text in texts {
        let full: Data<Summary> = serde_json::from_str(text).expect("valid JSON");
        let envelope: Data<Counted> = serde_json::from_str(text).expect("valid JSON");
        let (full, envelope) = (full.0, envelope.0.summary());
        assert_eq!(full.problem, envelope.problem, "{text}");
        if full.problem.is_none() {
            assert_eq!(full.count, envelope.count, "{text}");
        }
    }
}

#[test]
fn numbers_are_written_in_decimal_without_a_formatter() {
    for n in [0, 7, 10, 1_048_576, usize::MAX] {
        assert_eq!(decimal(n, &mut [0; 20]), n.to_string().as_bytes());
    }
    assert_eq!(wire::At::new("inputs", 12).as_str(), "inputs[12]");
}
