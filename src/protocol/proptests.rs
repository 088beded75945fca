//! Property tests: any request survives JSON and binary encoding exactly, and no
//! body, however damaged, panics a decoder or makes decode and inspect disagree.
#![allow(clippy::unwrap_used)] // in tests a failed unwrap is a failed test

use bytes::Bytes;
use proptest::prelude::*;

use super::*;

fn tensor(name: &str, datatype: Datatype, shape: &[u64], data: Vec<u8>) -> Tensor {
    let shape = shape.to_vec();
    Tensor {
        name: name.into(),
        datatype,
        shape,
        data: data.into(),
    }
}

fn raw_for(datatype: Datatype, elements: usize) -> BoxedStrategy<Vec<u8>> {
    match datatype {
        Datatype::Bool => prop::collection::vec(0u8..=1, elements).boxed(),
        Datatype::Bytes => {
            let element = prop_oneof![any::<String>().prop_map(String::into_bytes), any::<Vec<u8>>()];
            prop::collection::vec(element, elements)
                .prop_map(|els| {
                    els.iter()
                        .flat_map(|e| [&(e.len() as u32).to_le_bytes()[..], e].concat())
                        .collect()
                })
                .boxed()
        }
        other => {
            let size = other.element_size().unwrap_or(1);
            prop::collection::vec(any::<u8>(), elements * size).boxed()
        }
    }
}

fn tensor_strategy(name: String) -> impl Strategy<Value = Tensor> {
    let shape = prop::collection::vec(0u64..4, 0..4);
    (prop::sample::select(Datatype::ALL.to_vec()), shape).prop_flat_map(move |(datatype, shape)| {
        let elements = shape.iter().product::<u64>() as usize;
        let name = name.clone();
        raw_for(datatype, elements).prop_map(move |data| tensor(&name, datatype, &shape, data))
    })
}

fn request_strategy() -> impl Strategy<Value = InferRequest> {
    (1usize..4).prop_flat_map(|n| {
        let tensors: Vec<_> = (0..n).map(|i| tensor_strategy(format!("in{i}"))).collect();
        (tensors, proptest::option::of("[a-z0-9-]{0,8}")).prop_map(|(inputs, id)| InferRequest {
            id,
            inputs,
            ..Default::default()
        })
    })
}

proptest! {
    // No failure files: the tree outside src/protocol is not ours to write.
    #![proptest_config(ProptestConfig { failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn requests_survive_json_and_binary(req in request_strategy(), binary in any::<bool>()) {
        let (body, len) = encode_request(&req, binary);
        prop_assert_eq!(&decode_request(&body, len).unwrap(), &req);
        let info = inspect_request(&body, len, BodyCheck::Full).unwrap();
        prop_assert_eq!(&info.id, &req.id);
        prop_assert_eq!(inspect_request(&body, len, BodyCheck::Envelope).unwrap(), info);
    }

    #[test]
    fn damaged_bodies_never_panic(req in request_strategy(), binary in any::<bool>(), at in any::<prop::sample::Index>(), byte in any::<u8>(), cut in any::<bool>()) {
        let (body, len) = encode_request(&req, binary);
        let mut damaged = body.to_vec();
        let i = at.index(damaged.len());
        if cut { damaged.truncate(i) } else { damaged[i] = byte }
        let damaged = Bytes::from(damaged);
        let a = decode_request(&damaged, len).map(|_| ());
        let b = inspect_request(&damaged, len, BodyCheck::Full).map(|_| ());
        prop_assert_eq!(&a, &b);
        // The envelope check refuses what the full one does, but for a data value's own
        // fault, which it leaves to the backend.
        let envelope = inspect_request(&damaged, len, BodyCheck::Envelope).map(|_| ());
        match &a {
            Ok(()) => prop_assert_eq!(envelope, Ok(())),
            // A data value's own fault, or a number no float holds, is the backend's to find.
            Err(Error::BadElement { .. } | Error::Malformed { .. } | Error::NotJson { .. }) => {}
            Err(_) => prop_assert_eq!(a, envelope),
        }
    }

    #[test]
    fn the_plain_reader_reads_as_serde_does(
        req in request_strategy(),
        edits in prop::collection::vec((any::<prop::sample::Index>(), prop::sample::select(b" \t\r\n\"\\,:[]{}-+.eE019tfnx\x7f\xc3".to_vec()), 0u8..3), 0..3),
    ) {
        let (body, len) = encode_request(&req, false);
        let json = &body[..len.unwrap_or(body.len())];
        // A JSON body with no string in its data is plain: the fast path is taken.
        if len.is_none() && req.inputs.iter().all(|t| t.datatype != Datatype::Bytes) {
            prop_assert!(plain::request(json).is_some(), "{}", String::from_utf8_lossy(json));
        }
        let mut damaged = json.to_vec();
        for (at, byte, how) in edits {
            let i = at.index(damaged.len() + 1);
            match how {
                0 => damaged.insert(i, byte),
                1 if i < damaged.len() => { damaged.remove(i); }
                _ if i < damaged.len() => damaged[i] = byte,
                _ => {}
            }
        }
        prop_assert!(agrees_with_serde(&damaged), "{}", String::from_utf8_lossy(&damaged));
    }

    #[test]
    fn garbage_never_panics(body in any::<Vec<u8>>(), len in proptest::option::of(0usize..64)) {
        let body = Bytes::from(body);
        let a = decode_request(&body, len).map(|_| ());
        let b = inspect_request(&body, len, BodyCheck::Full).map(|_| ());
        prop_assert_eq!(&a, &b);
        let envelope = inspect_request(&body, len, BodyCheck::Envelope).map(|_| ());
        if a.is_ok() {
            prop_assert_eq!(envelope, Ok(()));
        }
        let _ = decode_response(&body, len);
    }
}
