//! The JSON adapters: bodies merged and split by rows, rows cut one by one and joined back.
#![allow(clippy::unwrap_used)] // in tests a failed unwrap is a failed test

use serde_json::json;

use super::*;

fn part(adapter: JsonAdapter, body: Value) -> (String, Part, u64) {
    parse(adapter, &Bytes::from(body.to_string())).unwrap().unwrap()
}

fn reply(body: Value) -> Reply {
    Response::new(Bytes::from(body.to_string()))
}

fn json_of(reply: &Reply) -> Value {
    serde_json::from_slice(reply.body()).unwrap()
}

#[test]
fn tf_serving_instances_merge_and_split_by_rows() {
    let (sa, a, ra) = part(
        JsonAdapter::TfServing,
        json!({"signature_name": "s", "instances": [[1], [2]]}),
    );
    let (sb, b, rb) = part(
        JsonAdapter::TfServing,
        json!({"instances": [[3]], "signature_name": "s"}),
    );
    assert_eq!((sa.clone(), ra, rb), (sb, 2, 1), "key order does not matter");
    let (sc, _, _) = part(
        JsonAdapter::TfServing,
        json!({"instances": [[3]], "signature_name": "t"}),
    );
    assert_ne!(sa, sc, "another signature_name never shares a batch");
    let request = build("/v1/models/m:predict", &[&a, &b]).unwrap();
    let sent: Value = serde_json::from_slice(request.body()).unwrap();
    assert_eq!(sent, json!({"signature_name": "s", "instances": [[1], [2], [3]]}));
    let answers = scatter(
        JsonAdapter::TfServing,
        &reply(json!({"predictions": [10, 20, 30]})),
        &[&a, &b],
    )
    .unwrap();
    assert_eq!(json_of(&answers[0]), json!({"predictions": [10, 20]}));
    assert_eq!(json_of(&answers[1]), json!({"predictions": [30]}));
}

#[test]
fn tf_serving_named_columns_merge_per_column() {
    let (_, a, _) = part(
        JsonAdapter::TfServing,
        json!({"inputs": {"x": [1, 2], "y": ["a", "b"]}}),
    );
    let (_, b, _) = part(JsonAdapter::TfServing, json!({"inputs": {"y": ["c"], "x": [3]}}));
    let request = build("/p", &[&a, &b]).unwrap();
    let sent: Value = serde_json::from_slice(request.body()).unwrap();
    assert_eq!(sent, json!({"inputs": {"x": [1, 2, 3], "y": ["a", "b", "c"]}}));
    let answer = json!({"outputs": {"s": [1, 2, 3], "t": [[0], [1], [2]]}});
    let answers = scatter(JsonAdapter::TfServing, &reply(answer), &[&a, &b]).unwrap();
    assert_eq!(json_of(&answers[1]), json!({"outputs": {"s": [3], "t": [[2]]}}));
}

#[test]
fn what_cannot_be_cut_by_rows_is_served_alone_or_refused() {
    for body in [
        json!({"instances": []}),
        json!({"inputs": {"x": [1, 2], "y": [1]}}),
        json!({"inputs": {"x": 1}}),
        json!({"instances": [1], "inputs": [1]}),
    ] {
        let parsed = parse(JsonAdapter::TfServing, &Bytes::from(body.to_string())).unwrap();
        assert!(parsed.is_err(), "{body} is unbatched");
    }
    let err = parse(JsonAdapter::TfServing, &Bytes::from_static(b"[1]")).unwrap_err();
    assert_eq!(err.kind, Kind::BadRequest);
    assert!(err.message.contains("\"instances\""), "{err}");
}

#[test]
fn a_backend_answer_with_the_wrong_row_count_is_its_fault() {
    let (_, a, _) = part(JsonAdapter::TfServing, json!({"instances": [1, 2]}));
    let err = scatter(JsonAdapter::TfServing, &reply(json!({"predictions": [1]})), &[&a]).unwrap_err();
    assert_eq!(err.kind, Kind::Backend);
    assert!(err.message.contains("1 rows but the batch has 2"), "{err}");
}

#[test]
fn embeddings_renumber_each_callers_items_and_keep_single_inputs_single() {
    let (s1, one, r1) = part(JsonAdapter::OpenaiEmbeddings, json!({"model": "e", "input": "hello"}));
    let (s2, many, r2) = part(
        JsonAdapter::OpenaiEmbeddings,
        json!({"model": "e", "input": ["a", "b"]}),
    );
    let (s3, tokens, r3) = part(JsonAdapter::OpenaiEmbeddings, json!({"model": "e", "input": [1, 2, 3]}));
    assert_eq!((r1, r2, r3), (1, 2, 1), "a list of token ids is one input");
    assert!(s1 == s2 && s2 == s3);
    let request = build("/v1/embeddings", &[&one, &many, &tokens]).unwrap();
    let sent: Value = serde_json::from_slice(request.body()).unwrap();
    assert_eq!(sent, json!({"model": "e", "input": ["hello", "a", "b", [1, 2, 3]]}));
    // The backend may list items in any order; index says which is which.
    let answer = json!({"object": "list", "model": "e", "usage": {"prompt_tokens": 8, "total_tokens": 8},
        "data": [{"index": 3, "embedding": [3.0]}, {"index": 0, "embedding": [0.0]},
                 {"index": 2, "embedding": [2.0]}, {"index": 1, "embedding": [1.0]}]});
    let answers = scatter(JsonAdapter::OpenaiEmbeddings, &reply(answer), &[&one, &many, &tokens]).unwrap();
    assert_eq!(json_of(&answers[0])["data"], json!([{"index": 0, "embedding": [0.0]}]));
    assert_eq!(
        json_of(&answers[1])["data"],
        json!([{"index": 0, "embedding": [1.0]}, {"index": 1, "embedding": [2.0]}])
    );
    assert_eq!(json_of(&answers[2])["data"], json!([{"index": 0, "embedding": [3.0]}]));
    assert_eq!(json_of(&answers[1])["usage"]["prompt_tokens"], json!(4));
    assert_eq!(json_of(&answers[1])["model"], json!("e"));
}

#[test]
fn embedding_answers_with_bad_indexes_are_refused() {
    let (_, a, _) = part(JsonAdapter::OpenaiEmbeddings, json!({"input": ["a", "b"]}));
    for data in [
        json!([{"index": 0}, {"index": 0}]),
        json!([{"index": 0}, {"index": 2}]),
        json!([{"index": 0}]),
        json!([{"index": 0}, {}]),
    ] {
        let err = scatter(JsonAdapter::OpenaiEmbeddings, &reply(json!({"data": data})), &[&a]).unwrap_err();
        assert_eq!(err.kind, Kind::Backend, "{data}");
    }
}
#[test]
fn rows_cut_one_by_one_join_back_into_the_callers_answer() {
    let obj = |v: Value| match v {
        Value::Object(m) => m,
        _ => panic!("an object"),
    };
    let (_, a, _) = part(
        JsonAdapter::TfServing,
        json!({"signature_name": "s", "instances": [[1], [2]]}),
    );
    let one = a.row(1).unwrap();
    assert_eq!(
        Value::Object(body(&[&one])),
        json!({"signature_name": "s", "instances": [[2]]})
    );
    assert!(a.row(2).is_none());
    let tf = [
        json!({"predictions": [10], "model_version": "3"}),
        json!({"predictions": [20]}),
    ];
    let joined = join(JsonAdapter::TfServing, tf.map(obj).to_vec()).unwrap();
    assert_eq!(
        Value::Object(joined),
        json!({"predictions": [10, 20], "model_version": "3"})
    );
    let named = [
        json!({"outputs": {"s": [1], "t": [[0]]}}),
        json!({"outputs": {"s": [2], "t": [[1]]}}),
    ];
    let joined = join(JsonAdapter::TfServing, named.map(obj).to_vec()).unwrap();
    assert_eq!(
        Value::Object(joined),
        json!({"outputs": {"s": [1, 2], "t": [[0], [1]]}})
    );
    let emb = [
        json!({"object": "list", "data": [{"object": "embedding", "index": 0, "embedding": [1.0]}], "usage": {"prompt_tokens": 2, "total_tokens": 2}}),
        json!({"object": "list", "data": [{"object": "embedding", "index": 0, "embedding": [2.0]}], "usage": {"prompt_tokens": 3, "total_tokens": 3}}),
    ];
    let joined = Value::Object(join(JsonAdapter::OpenaiEmbeddings, emb.map(obj).to_vec()).unwrap());
    assert_eq!(
        joined["data"][1],
        json!({"object": "embedding", "index": 1, "embedding": [2.0]})
    );
    assert_eq!(joined["usage"], json!({"prompt_tokens": 5, "total_tokens": 5}));
    let mixed = [json!({"predictions": [1]}), json!({"outputs": {"s": [2]}})];
    assert!(
        join(JsonAdapter::TfServing, mixed.map(obj).to_vec()).is_err(),
        "rows of another form never join"
    );
}

#[test]
fn completions_merge_prompts_and_split_choices_by_index() {
    let c = JsonAdapter::OpenaiCompletions;
    let (sa, a, ra) = part(c, json!({"model": "m", "max_tokens": 4, "n": 2, "prompt": "one"}));
    let (sb, b, rb) = part(
        c,
        json!({"model": "m", "n": 2, "max_tokens": 4, "prompt": ["two", "three"]}),
    );
    assert_eq!((sa.clone(), ra, rb), (sb, 1, 2));
    let (sc, _, _) = part(c, json!({"model": "m", "max_tokens": 5, "n": 2, "prompt": "one"}));
    assert_ne!(sa, sc, "other parameters never share a call");
    // Token ids go alone.
    let alone = json!({"model": "m", "prompt": [1, 2]});
    assert!(parse(c, &Bytes::from(alone.to_string())).unwrap().is_err(), "{alone}");
    let request = build("/v1/completions", &[&a, &b]).unwrap();
    let sent: Value = serde_json::from_slice(request.body()).unwrap();
    assert_eq!(sent["prompt"], json!(["one", "two", "three"]));
    // Three prompts, two choices each, out of order; no token ids: split in proportion.
    let choice = |i: u64, text: &str| json!({"index": i, "text": text, "finish_reason": "length"});
    let answer = json!({"id": "cmpl", "object": "text_completion", "model": "m",
        "choices": [choice(5, "3b"), choice(0, "1a"), choice(1, "1b"), choice(2, "2a"), choice(3, "2b"), choice(4, "3a")],
        "usage": {"prompt_tokens": 11, "completion_tokens": 24, "total_tokens": 35}});
    let answers = scatter(c, &reply(answer), &[&a, &b]).unwrap();
    let (one, two) = (json_of(&answers[0]), json_of(&answers[1]));
    let texts = |v: &Value| {
        v["choices"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| (c["index"].as_u64().unwrap(), c["text"].as_str().unwrap().to_owned()))
            .collect::<Vec<_>>()
    };
    assert_eq!(texts(&one), [(0, "1a".to_owned()), (1, "1b".to_owned())]);
    assert_eq!(
        texts(&two),
        [(0, "2a".into()), (1, "2b".into()), (2, "3a".into()), (3, "3b".into())]
    );
    assert_eq!(one["id"], "cmpl");
    let tokens = |v: &Value, k: &str| v["usage"][k].as_u64().unwrap();
    assert_eq!(
        tokens(&one, "prompt_tokens") + tokens(&two, "prompt_tokens"),
        11,
        "the split adds up"
    );
    assert_eq!(
        tokens(&one, "completion_tokens") + tokens(&two, "completion_tokens"),
        24
    );
    assert_eq!(tokens(&one, "completion_tokens"), 8, "2 of 6 choices' text");
    assert_eq!(one["usage"]["tiergate_estimated"], true);
    // With every choice's token ids the split is exact, and not marked.
    let ids = |i: u64, prompt: usize, out: usize| json!({"index": i, "text": "t", "prompt_token_ids": vec![1; prompt], "token_ids": vec![2; out]});
    let exact = json!({"choices": [ids(0, 3, 4), ids(1, 3, 5), ids(2, 1, 1), ids(3, 1, 1), ids(4, 2, 2), ids(5, 2, 2)],
        "usage": {"prompt_tokens": 6, "completion_tokens": 15}});
    let answers = scatter(c, &reply(exact), &[&a, &b]).unwrap();
    let one = json_of(&answers[0]);
    assert_eq!(
        (tokens(&one, "prompt_tokens"), tokens(&one, "completion_tokens")),
        (3, 9)
    );
    assert!(one["usage"].get("tiergate_estimated").is_none());
    // Too few choices is the backend's fault.
    let short = json!({"choices": [choice(0, "x")]});
    assert!(scatter(c, &reply(short), &[&a])
        .unwrap_err()
        .message
        .contains("\"choices\" has 1 items"));
}

/// The events `raw` holds, whole.
fn events(raw: &str) -> Vec<crate::llm::sse::Event> {
    let mut framer = crate::llm::sse::Framer::new(1 << 20);
    framer.push(bytes::Bytes::copy_from_slice(raw.as_bytes()));
    std::iter::from_fn(|| framer.next_event().unwrap()).collect()
}

/// The JSON of each event `out` sends, by caller.
fn sent(out: stream::Out) -> Vec<(usize, Value)> {
    let stream::Out::To(events) = out else {
        panic!("{out:?} is not for some callers");
    };
    let data = |b: &Bytes| serde_json::from_slice(b.strip_prefix(b"data: ").unwrap()).unwrap();
    events.iter().map(|(c, b)| (*c, data(b))).collect()
}

#[test]
fn a_streamed_batch_is_cut_by_caller_with_each_index_its_own() {
    let body = |p: Value| json!({"model": "m", "prompt": p, "stream": true, "n": 2});
    let (sa, a, _) = part(JsonAdapter::OpenaiCompletions, body(json!("one")));
    let (sb, b, _) = part(JsonAdapter::OpenaiCompletions, body(json!(["two", "three"])));
    let (_, c, _) = part(JsonAdapter::OpenaiCompletions, body(json!("four")));
    assert_eq!(sa, sb, "streamed callers share a batch");
    let (s_whole, _, _) = part(
        JsonAdapter::OpenaiCompletions,
        json!({"model": "m", "prompt": "one", "n": 2}),
    );
    assert_ne!(sa, s_whole, "a streamed caller never shares a whole answer's batch");
    assert!(a.streamed());
    let request = build("/v1/completions", &[&a, &b, &c]).unwrap();
    assert!(
        crate::backend::stream::wanted(&request),
        "the pool is asked to hand the stream up"
    );
    let mut splitter = stream::Splitter::new(&[&a, &b, &c]);
    // Indexes: a 0..2, b 2..6 (two prompts, n = 2), c 6..8.
    let chunk = r#"data: {"id":"x","choices":[{"index":3,"text":"B"},{"index":6,"text":"C"},{"index":5,"text":"b"}]}

"#;
    let out = sent(splitter.event(&events(chunk)[0]));
    assert_eq!(
        out,
        vec![
            (
                1,
                json!({"id": "x", "choices": [{"index": 1, "text": "B"}, {"index": 3, "text": "b"}]})
            ),
            (2, json!({"id": "x", "choices": [{"index": 0, "text": "C"}]})),
        ],
        "each caller gets its own choices only, indexed as its own"
    );
    for (raw, expected) in [
        ("data: [DONE]\n\n", "all"),
        (": keep-alive\n\n", "all"),
        ("data: {\"error\": {\"message\": \"m\"}}\n\n", "all"),
        ("data: null\n\n", "none"),
        ("data: nope\n\n", "broke"),
        ("data: {\"choices\": [{\"index\": 8, \"text\": \"x\"}]}\n\n", "broke"),
        ("data: {\"choices\": [{\"text\": \"x\"}]}\n\n", "broke"),
        ("data: {\"choices\": {\"0\": \"x\"}}\n\n", "broke"),
    ] {
        let out = splitter.event(&events(raw)[0]);
        let kind = match &out {
            stream::Out::All(bytes) => {
                assert_eq!(bytes.as_ref(), raw.as_bytes());
                "all"
            }
            stream::Out::To(events) if events.is_empty() => "none",
            stream::Out::To(_) => "some",
            stream::Out::Broke(_) => "broke",
        };
        assert_eq!(kind, expected, "{raw}");
    }
}

#[test]
fn a_streamed_batch_s_usage_is_split_between_its_callers() {
    let body = |p: &str| json!({"prompt": p, "stream": true});
    let (_, a, _) = part(JsonAdapter::OpenaiCompletions, body("aaaa"));
    let (_, b, _) = part(JsonAdapter::OpenaiCompletions, body("bbbbbbbbbbbb"));
    let mut splitter = stream::Splitter::new(&[&a, &b]);
    let chunk = |i: usize, text: &str| format!("data: {{\"choices\":[{{\"index\":{i},\"text\":\"{text}\"}}]}}\n\n");
    splitter.event(&events(&chunk(0, "xxx"))[0]);
    splitter.event(&events(&chunk(1, "y"))[0]);
    // vLLM's last chunk: the batch's usage, no choices.
    let usage = r#"data: {"id":"x","choices":[],"usage":{"prompt_tokens":16,"completion_tokens":8,"total_tokens":24}}

"#;
    let out = sent(splitter.event(&events(usage)[0]));
    let each: Vec<(u64, u64)> = out
        .iter()
        .map(|(_, v)| {
            assert_eq!(v["choices"], json!([]));
            assert_eq!(v["usage"]["tiergate_estimated"], true);
            (
                v["usage"]["prompt_tokens"].as_u64().unwrap(),
                v["usage"]["completion_tokens"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        each,
        vec![(4, 4), (12, 4)],
        "by prompt text, and by the chunks of text each was sent"
    );

    // llama.cpp: each prompt's last chunk carries that prompt's usage; a caller of two
    // prompts is told both, summed.
    let (_, two, _) = part(
        JsonAdapter::OpenaiCompletions,
        json!({"prompt": ["p", "q"], "stream": true}),
    );
    let mut splitter = stream::Splitter::new(&[&two, &a]);
    let last = |i: usize, prompt: u64| {
        format!(
            "data: {{\"choices\":[{{\"index\":{i},\"text\":\"\",\"finish_reason\":\"length\"}}],\"usage\":{{\"prompt_tokens\":{prompt},\"completion_tokens\":3,\"total_tokens\":{}}}}}\n\n",
            prompt + 3
        )
    };
    let first = sent(splitter.event(&events(&last(1, 5))[0]));
    assert_eq!(first[0].1["usage"]["prompt_tokens"], 5);
    let content = sent(splitter.event(&events(&chunk(0, "z"))[0]));
    assert_eq!(content[0].0, 0);
    assert!(
        content[0].1.get("usage").is_none(),
        "a chunk without usage is sent none"
    );
    let theirs = sent(splitter.event(&events(&last(2, 9))[0]));
    assert_eq!(theirs[0].0, 1);
    assert_eq!(theirs[0].1["usage"]["prompt_tokens"], 9, "the other caller's own");
    let second = sent(splitter.event(&events(&last(0, 7))[0]));
    assert_eq!(second[0].0, 0);
    assert_eq!(
        (
            second[0].1["usage"]["prompt_tokens"].as_u64(),
            second[0].1["usage"]["completion_tokens"].as_u64()
        ),
        (Some(12), Some(6)),
        "its two prompts' usage, summed"
    );
}
