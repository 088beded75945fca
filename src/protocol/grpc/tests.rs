use std::collections::HashMap;

use bytes::Bytes;
use serde_json::json;

use super::*;

/// One tensor of every datatype, raw, with the values its typed contents hold.
fn every_datatype() -> Vec<(Tensor, InferTensorContents)> {
    let t = |name: &str, datatype, shape: Vec<u64>, data: Vec<u8>| Tensor {
        name: name.into(),
        datatype,
        shape,
        data: Bytes::from(data),
    };
    let le =
        |vs: &[i64], size: usize| -> Vec<u8> { vs.iter().flat_map(|v| v.to_le_bytes()[..size].to_vec()).collect() };
    let c = InferTensorContents::default;
    vec![
        (
            t("b", Datatype::Bool, vec![3], vec![1, 0, 1]),
            InferTensorContents {
                bool_contents: vec![true, false, true],
                ..c()
            },
        ),
        (
            t("i8", Datatype::Int8, vec![2], le(&[-128, 127], 1)),
            InferTensorContents {
                int_contents: vec![-128, 127],
                ..c()
            },
        ),
        (
            t("i16", Datatype::Int16, vec![2], le(&[-300, 300], 2)),
            InferTensorContents {
                int_contents: vec![-300, 300],
                ..c()
            },
        ),
        (
            t("i32", Datatype::Int32, vec![2], le(&[-70000, 70000], 4)),
            InferTensorContents {
                int_contents: vec![-70000, 70000],
                ..c()
            },
        ),
        (
            t("i64", Datatype::Int64, vec![1], le(&[i64::MIN], 8)),
            InferTensorContents {
                int64_contents: vec![i64::MIN],
                ..c()
            },
        ),
        (
            t("u8", Datatype::Uint8, vec![2], vec![0, 255]),
            InferTensorContents {
                uint_contents: vec![0, 255],
                ..c()
            },
        ),
        (
            t("u16", Datatype::Uint16, vec![1], le(&[65535], 2)),
            InferTensorContents {
                uint_contents: vec![65535],
                ..c()
            },
        ),
        (
            t("u32", Datatype::Uint32, vec![1], le(&[4_000_000_000], 4)),
            InferTensorContents {
                uint_contents: vec![4_000_000_000],
                ..c()
            },
        ),
        (
            t("u64", Datatype::Uint64, vec![1], u64::MAX.to_le_bytes().to_vec()),
            InferTensorContents {
                uint64_contents: vec![u64::MAX],
                ..c()
            },
        ),
        (
            t(
                "f32",
                Datatype::Fp32,
                vec![1, 2],
                [1.5f32, -0.25].iter().flat_map(|v| v.to_le_bytes()).collect(),
            ),
            InferTensorContents {
                fp32_contents: vec![1.5, -0.25],
                ..c()
            },
        ),
        (
            t("f64", Datatype::Fp64, vec![1], 0.1f64.to_le_bytes().to_vec()),
            InferTensorContents {
                fp64_contents: vec![0.1],
                ..c()
            },
        ),
        (
            t(
                "s",
                Datatype::Bytes,
                vec![2],
                [&2u32.to_le_bytes()[..], b"hi", &0u32.to_le_bytes()[..]].concat(),
            ),
            InferTensorContents {
                bytes_contents: vec![Bytes::from_static(b"hi"), Bytes::new()],
                ..c()
            },
        ),
    ]
}

fn request(inputs: Vec<Tensor>) -> InferRequest {
    let mut parameters = Map::new();
    parameters.insert("timeout".into(), json!(5000));
    parameters.insert("tag".into(), json!("x"));
    // An input's own parameters (MLServer reads content_type there) go across too.
    let own: Map<String, Value> = [("content_type".to_owned(), json!("np")), ("scale".to_owned(), json!(2))]
        .into_iter()
        .collect();
    InferRequest {
        id: Some("r1".into()),
        parameters,
        input_parameters: [("b".to_owned(), own)].into(),
        inputs,
        outputs: vec![RequestedOutput {
            name: "OUT".into(),
            binary_data: Some(true),
            parameters: Map::new(),
        }],
    }
}

#[test]
fn raw_round_trip_is_exact_for_every_datatype_and_fp16() {
    let mut inputs: Vec<Tensor> = every_datatype().into_iter().map(|(t, _)| t).collect();
    inputs.push(Tensor {
        name: "h".into(),
        datatype: Datatype::Fp16,
        shape: vec![2],
        data: Bytes::from_static(&[0, 60, 0, 188]),
    });
    inputs.push(Tensor {
        name: "bf".into(),
        datatype: Datatype::Bf16,
        shape: vec![2],
        data: Bytes::from_static(&[0x80, 0x3f, 0x00, 0xc0]),
    });
    let req = request(inputs);
    let msg = request_to_grpc("m", Some("2"), &req);
    assert_eq!((msg.model_name.as_str(), msg.model_version.as_str()), ("m", "2"));
    assert_eq!(request_from_grpc(msg).expect("valid"), req);
}

#[test]
fn typed_contents_give_the_same_bytes_as_raw() {
    for (tensor, contents) in every_datatype() {
        let msg = ModelInferRequest {
            inputs: vec![InferInputTensor {
                name: tensor.name.clone(),
                datatype: tensor.datatype.as_str().into(),
                shape: dims(&tensor.shape),
                parameters: HashMap::new(),
                contents: Some(contents),
            }],
            ..Default::default()
        };
        let got = request_from_grpc(msg).expect("valid").inputs.remove(0);
        assert_eq!(got, tensor, "{}", tensor.datatype);
    }
}

#[test]
fn http_json_to_grpc_and_back_is_exact() {
    let body = Bytes::from_static(br#"{"id":"j","inputs":[{"name":"a","datatype":"INT64","shape":[2],"data":[-1,9007199254740993]},{"name":"s","datatype":"BYTES","shape":[1],"data":["caf\u00e9"]}],"outputs":[{"name":"o","parameters":{"binary_data":false}}]}"#);
    let http = super::super::decode_request(&body, None).expect("valid");
    let back = request_from_grpc(request_to_grpc("m", None, &http)).expect("valid");
    assert_eq!(back, http);
    let (binary, header) = super::super::encode_request(&back, true);
    assert_eq!(super::super::decode_request(&binary, header).expect("valid"), http);
}

#[test]
fn responses_round_trip() {
    let resp = InferResponse {
        model_name: "m".into(),
        model_version: Some("1".into()),
        id: None,
        parameters: Map::new(),
        outputs: every_datatype().into_iter().map(|(t, _)| t).collect(),
        output_parameters: [("b".to_owned(), {
            let mut own = Map::new();
            own.insert("content_type".into(), "np".into());
            own
        })]
        .into(),
    };
    assert_eq!(response_from_grpc(response_to_grpc(&resp)).expect("valid"), resp);
}

#[test]
fn malformed_messages_say_what_to_fix() {
    let input = |datatype: &str, shape: Vec<i64>, contents: Option<InferTensorContents>| InferInputTensor {
        name: "x".into(),
        datatype: datatype.into(),
        shape,
        parameters: HashMap::new(),
        contents,
    };
    let ints = |v: Vec<i32>| {
        Some(InferTensorContents {
            int_contents: v,
            ..Default::default()
        })
    };
    let cases: Vec<(ModelInferRequest, &str)> = vec![
        (ModelInferRequest::default(), "inputs is empty"),
        (
            ModelInferRequest {
                inputs: vec![input("FP32", vec![1], None)],
                raw_input_contents: vec![Bytes::new(), Bytes::new()],
                ..Default::default()
            },
            "raw_input_contents: has 2 entries for 1 inputs",
        ),
        (
            ModelInferRequest {
                inputs: vec![input("FP32", vec![2], None)],
                raw_input_contents: vec![Bytes::from_static(&[0; 4])],
                ..Default::default()
            },
            "inputs[0]: raw contents are 4 bytes but 2 FP32 elements need 8",
        ),
        (
            ModelInferRequest {
                inputs: vec![input("INT8", vec![1], ints(vec![300]))],
                ..Default::default()
            },
            "int_contents[0] = 300 is out of range",
        ),
        (
            ModelInferRequest {
                inputs: vec![input("INT32", vec![3], ints(vec![1, 2]))],
                ..Default::default()
            },
            "contents hold 2 INT32 elements but the shape needs 3",
        ),
        (
            ModelInferRequest {
                inputs: vec![input("FP16", vec![1], ints(vec![]))],
                ..Default::default()
            },
            "FP16 has no typed contents",
        ),
        (
            ModelInferRequest {
                inputs: vec![input("FP33", vec![1], None)],
                ..Default::default()
            },
            "\"FP33\" is not a KServe v2 datatype",
        ),
        (
            ModelInferRequest {
                inputs: vec![input("FP32", vec![-1], None)],
                ..Default::default()
            },
            "shape[0] is -1",
        ),
        (
            ModelInferRequest {
                inputs: vec![input("FP32", vec![1], None)],
                ..Default::default()
            },
            "has no contents and no raw contents",
        ),
        (
            ModelInferRequest {
                inputs: vec![input("BYTES", vec![1], None)],
                raw_input_contents: vec![Bytes::from_static(&[9, 0, 0, 0, 1])],
                ..Default::default()
            },
            "BYTES binary data is malformed",
        ),
        (
            ModelInferRequest {
                inputs: vec![
                    input("INT32", vec![1], ints(vec![1])),
                    input("INT32", vec![1], ints(vec![1])),
                ],
                ..Default::default()
            },
            "already used by inputs[0]",
        ),
        (
            ModelInferRequest {
                inputs: vec![input("INT32", vec![1], ints(vec![1]))],
                raw_input_contents: vec![Bytes::from_static(&[0; 4])],
                ..Default::default()
            },
            "has typed contents while raw contents are used",
        ),
    ];
    for (msg, needle) in cases {
        let err = request_from_grpc(msg).expect_err(needle).to_string();
        assert!(err.contains(needle), "{err:?} should contain {needle:?}");
    }
}

#[test]
fn parameters_keep_their_types() {
    let mut json = Map::new();
    for (k, v) in [
        ("b", json!(true)),
        ("i", json!(-3)),
        ("u", json!(u64::MAX)),
        ("d", json!(0.5)),
        ("s", json!("x")),
    ] {
        json.insert(k.into(), v);
    }
    assert_eq!(params_to_json(params_to_grpc(&json)), json);
    let mut nested = Map::new();
    nested.insert("a".into(), json!([1, 2]));
    assert_eq!(params_to_json(params_to_grpc(&nested))["a"], json!("[1,2]"));
}
