//! Triton's model config and statistics, between protobuf and JSON.
//!
//! The gRPC `ModelConfig` and `ModelStatistics` calls carry `inference.ModelConfig` and
//! `inference.ModelStatistics` messages; Triton's HTTP endpoints answer the same as JSON:
//! `GET /v2/models/{m}/config` the config's fields by their proto names with 64-bit
//! integers as numbers and enums by name, `/stats` an object whose `model_stats` lists one
//! statistics object per version. When a door and its route's backend speak different
//! protocols the answer is converted here, field by field, from the messages declared in
//! `proto/model_config.proto` (read by reflection: no code is generated from it). A field
//! that file does not declare is dropped from a converted answer; passed-through answers
//! (same protocol on both sides) are never touched.

use std::sync::LazyLock;

use bytes::Bytes;
use prost::Message;
use prost_reflect::{DescriptorPool, DeserializeOptions, DynamicMessage, MessageDescriptor, SerializeOptions};
use serde_json::Value;

/// The `FileDescriptorSet` that `build.rs` compiled from `proto/model_config.proto` (and
/// `proto/grpc_service.proto`, which the conformance test compares with Triton's too).
const DESCRIPTORS: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/model_config.bin"));

static POOL: LazyLock<DescriptorPool> =
    LazyLock::new(|| DescriptorPool::decode(DESCRIPTORS).expect("build.rs compiles a valid descriptor set"));

/// The encoded `FileDescriptorSet` of `proto/model_config.proto` and
/// `proto/grpc_service.proto`, for checking them against Triton's own (the conformance
/// test compares every field).
pub fn descriptor_set() -> &'static [u8] {
    DESCRIPTORS
}

/// JSON as Triton's HTTP endpoints write it: proto field names, every field (defaults
/// too), 64-bit integers as numbers, enums by name.
const AS_TRITON: SerializeOptions = SerializeOptions::new()
    .use_proto_field_name(true)
    .skip_default_fields(false)
    .stringify_64_bit_integers(false);

fn descriptor(name: &str) -> MessageDescriptor {
    POOL.get_message_by_name(name)
        .expect("proto/model_config.proto declares the message")
}

/// An encoded `inference.ModelConfig` as the JSON of `GET /v2/models/{m}/config`.
pub fn config_to_json(protobuf: &[u8]) -> Result<Bytes, String> {
    to_json(&descriptor("inference.ModelConfig"), protobuf)
        .map(|config| Bytes::from(config.to_string()))
        .map_err(|e| format!("the backend's model config does not decode: {e}"))
}

/// The JSON of `GET /v2/models/{m}/config` as an encoded `inference.ModelConfig`.
/// Fields it does not declare are left out; a declared field of the wrong type fails.
pub fn config_from_json(json: &[u8]) -> Result<Bytes, String> {
    let json: Value =
        serde_json::from_slice(json).map_err(|e| format!("the backend's model config is not JSON: {e}"))?;
    from_json(&descriptor("inference.ModelConfig"), json)
        .map_err(|e| format!("the backend's model config does not convert to protobuf: {e}"))
}

/// Encoded `inference.ModelStatistics` messages as the JSON of `GET /v2/models/{m}/stats`.
pub fn statistics_to_json(models: &[Bytes]) -> Result<Bytes, String> {
    let desc = descriptor("inference.ModelStatistics");
    let models = models
        .iter()
        .map(|m| to_json(&desc, m))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("the backend's model statistics do not decode: {e}"))?;
    Ok(Bytes::from(serde_json::json!({ "model_stats": models }).to_string()))
}

/// The JSON of `GET /v2/models/{m}/stats` as encoded `inference.ModelStatistics` messages.
pub fn statistics_from_json(json: &[u8]) -> Result<Vec<Bytes>, String> {
    let bad = |e: String| format!("the backend's model statistics do not convert to protobuf: {e}");
    let json: Value = serde_json::from_slice(json).map_err(|e| bad(format!("not JSON: {e}")))?;
    let Some(Value::Array(models)) = json.get("model_stats") else {
        return Err(bad("no \"model_stats\" list".into()));
    };
    let desc = descriptor("inference.ModelStatistics");
    models
        .iter()
        .map(|m| from_json(&desc, m.clone()).map_err(bad))
        .collect()
}

fn to_json(desc: &MessageDescriptor, protobuf: &[u8]) -> Result<Value, String> {
    let message = DynamicMessage::decode(desc.clone(), protobuf).map_err(|e| e.to_string())?;
    message
        .serialize_with_options(serde_json::value::Serializer, &AS_TRITON)
        .map_err(|e| e.to_string())
}

fn from_json(desc: &MessageDescriptor, json: Value) -> Result<Bytes, String> {
    let options = DeserializeOptions::new().deny_unknown_fields(false);
    DynamicMessage::deserialize_with_options(desc.clone(), json, &options)
        .map(|message| Bytes::from(message.encode_to_vec()))
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A config as Triton's HTTP endpoint answers one, trimmed to fields of every kind.
    fn triton_config() -> Value {
        json!({
            "name": "resnet", "platform": "onnxruntime_onnx", "backend": "onnxruntime",
            "version_policy": {"latest": {"num_versions": 1}},
            "max_batch_size": 8,
            "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "format": "FORMAT_NCHW",
                       "dims": [3, 224, 224], "is_shape_tensor": false}],
            "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [1000],
                        "label_filename": "labels.txt"}],
            "dynamic_batching": {"preferred_batch_size": [4, 8], "max_queue_delay_microseconds": 100},
            "instance_group": [{"name": "resnet_0", "kind": "KIND_GPU", "count": 2, "gpus": [0]}],
            "parameters": {"threads": {"string_value": "4"}},
            "model_transaction_policy": {"decoupled": false},
            "a_field_triton_adds_later": {"x": 1},
        })
    }

    #[test]
    fn config_round_trip_keeps_every_declared_field() {
        let protobuf = config_from_json(triton_config().to_string().as_bytes()).expect("converts");
        let back: Value = serde_json::from_slice(&config_to_json(&protobuf).expect("converts")).expect("converts");
        assert_eq!(back["max_batch_size"], 8);
        assert_eq!(
            back["input"][0]["dims"],
            json!([3, 224, 224]),
            "64-bit integers as numbers"
        );
        assert_eq!(back["input"][0]["format"], "FORMAT_NCHW");
        assert_eq!(back["output"][0]["label_filename"], "labels.txt");
        assert_eq!(back["dynamic_batching"]["preferred_batch_size"], json!([4, 8]));
        assert_eq!(back["dynamic_batching"]["max_queue_delay_microseconds"], 100);
        assert_eq!(back["instance_group"][0]["kind"], "KIND_GPU");
        assert_eq!(back["parameters"]["threads"]["string_value"], "4");
        assert_eq!(back["version_policy"]["latest"]["num_versions"], 1);
        // Defaults are written, as Triton writes them.
        assert_eq!(back["output"][0]["is_shape_tensor"], false);
        assert_eq!(back["runtime"], "");
        assert!(back.get("a_field_triton_adds_later").is_none());
    }

    #[test]
    fn config_fields_sit_at_tritons_numbers() {
        // max_batch_size is field 4 (varint), name field 1: the bytes a Triton client reads.
        let protobuf = config_from_json(br#"{"name": "m", "max_batch_size": 8}"#).expect("converts");
        assert_eq!(&protobuf[..], b"\x0a\x01m\x20\x08");
    }

    #[test]
    fn statistics_both_ways() {
        let stats = json!({"model_stats": [{
            "name": "m", "version": "1", "last_inference": 1_700_000_000_000_u64,
            "inference_count": 12, "execution_count": 3,
            "inference_stats": {"success": {"count": 12, "ns": 9_007_199_254_740_993_u64}},
            "batch_stats": [{"batch_size": 4, "compute_infer": {"count": 3, "ns": 600}}],
        }]});
        let models = statistics_from_json(stats.to_string().as_bytes()).expect("converts");
        assert_eq!(models.len(), 1);
        let back: Value = serde_json::from_slice(&statistics_to_json(&models).expect("converts")).expect("converts");
        let m = &back["model_stats"][0];
        assert_eq!(m["inference_count"], 12);
        assert_eq!(
            m["inference_stats"]["success"]["ns"], 9_007_199_254_740_993_u64,
            "exact past 2^53"
        );
        assert_eq!(m["batch_stats"][0]["compute_infer"]["ns"], 600);
        assert_eq!(m["last_inference"], 1_700_000_000_000_u64);
    }

    #[test]
    fn bad_answers_say_what_broke() {
        assert!(config_from_json(b"not json").expect_err("refused").contains("not JSON"));
        let wrong = config_from_json(br#"{"max_batch_size": "eight"}"#).expect_err("refused");
        assert!(wrong.contains("does not convert"), "{wrong}");
        assert!(config_to_json(b"\xff\xff")
            .expect_err("refused")
            .contains("does not decode"));
        assert!(statistics_from_json(br#"{"stats": []}"#)
            .expect_err("refused")
            .contains("model_stats"));
    }
}
