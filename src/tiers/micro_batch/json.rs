//! The JSON forms of the micro-batch tier, for routes whose backends do not speak
//! KServe v2: TF-Serving REST (`instances` / `inputs` → `predictions` / `outputs`) and
//! OpenAI-style embeddings (`input` → `data[]` by `index`). Callers' arrays are merged
//! into one backend body and the answer's array is cut back by each caller's rows.
//! Everything else in a body must agree for callers to share a batch.

use bytes::Bytes;
use http::{HeaderValue, Request, Response, StatusCode};
use serde_json::{Map, Value};

use super::Unbatched;
use crate::error::{Error, Kind};
use crate::policy::JsonAdapter;
use crate::protocol::batch::canonical;
use crate::tiers::Reply;

/// A JSON caller's rows and the rest of its body.
#[derive(Debug)]
pub(super) struct Part {
    layout: Layout,
    /// The body without the batched key; equal for every caller of a batch.
    rest: Map<String, Value>,
    /// The rows, per column (one column unless `inputs` is named columns). An OpenAI
    /// `input` that is one item (a string, or one list of token ids) is one row.
    columns: Vec<Vec<Value>>,
}

/// Where a body keeps its rows.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Layout {
    /// TF-Serving row format: `{"instances": [...]}`.
    Instances,
    /// TF-Serving columnar format with one unnamed input: `{"inputs": [...]}`.
    InputsList,
    /// TF-Serving columnar format with named inputs: `{"inputs": {"a": [...], ...}}` (names sorted).
    InputsColumns(Vec<String>),
    /// OpenAI embeddings: `{"input": ...}`.
    Input,
}

impl Part {
    fn rows(&self) -> usize {
        self.columns.first().map_or(0, Vec::len)
    }
}

/// A caller's body as rows plus the signature that callers sharing its batch must have;
/// or why it cannot share one (then the backend answers it alone).
pub(super) fn parse(adapter: JsonAdapter, body: &Bytes) -> Result<Result<(String, Part, u64), Unbatched>, Error> {
    let mut rest = match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(map)) => map,
        Ok(_) => return Err(bad(adapter, "the body must be a JSON object")),
        Err(e) => return Err(bad(adapter, &format!("the body is not JSON: {e}"))),
    };
    let part = match adapter {
        JsonAdapter::TfServing => tf_serving(&mut rest),
        JsonAdapter::OpenaiEmbeddings => embeddings(&mut rest),
    };
    let Some((layout, columns)) = part else {
        return Ok(Err(Unbatched(format!(
            "its body has no non-empty {} array to batch",
            key(adapter)
        ))));
    };
    let signature = format!("{layout:?}{}", canonical(&rest, &[]));
    let part = Part { layout, rest, columns };
    let rows = part.rows() as u64;
    Ok(Ok((signature, part, rows)))
}

fn key(adapter: JsonAdapter) -> &'static str {
    match adapter {
        JsonAdapter::TfServing => "\"instances\" or \"inputs\"",
        JsonAdapter::OpenaiEmbeddings => "\"input\"",
    }
}

fn bad(adapter: JsonAdapter, why: &str) -> Error {
    Error::new(
        Kind::BadRequest,
        format!("{why}; this route batches bodies like {{{}: [...]}}", key(adapter)),
    )
}

type Rows = (Layout, Vec<Vec<Value>>);

fn tf_serving(body: &mut Map<String, Value>) -> Option<Rows> {
    if body.contains_key("instances") == body.contains_key("inputs") {
        return None; // neither or both: the backend says what is wrong
    }
    if let Some(Value::Array(rows)) = body.get("instances") {
        if rows.is_empty() {
            return None;
        }
        let Some(Value::Array(rows)) = body.remove("instances") else {
            return None;
        };
        return Some((Layout::Instances, vec![rows]));
    }
    match body.get("inputs")? {
        Value::Array(rows) if !rows.is_empty() => {
            let Some(Value::Array(rows)) = body.remove("inputs") else {
                return None;
            };
            Some((Layout::InputsList, vec![rows]))
        }
        Value::Object(named) => {
            let mut names: Vec<String> = named.keys().cloned().collect();
            names.sort_unstable();
            let len = match named.get(names.first()?)? {
                Value::Array(a) if !a.is_empty() => a.len(),
                _ => return None,
            };
            if !named.values().all(|v| matches!(v, Value::Array(a) if a.len() == len)) {
                return None; // scalar or ragged inputs cannot be cut by rows
            }
            let Some(Value::Object(mut named)) = body.remove("inputs") else {
                return None;
            };
            let columns = names
                .iter()
                .map(|n| match named.remove(n) {
                    Some(Value::Array(a)) => a,
                    _ => Vec::new(),
                })
                .collect();
            Some((Layout::InputsColumns(names), columns))
        }
        _ => None,
    }
}

fn embeddings(body: &mut Map<String, Value>) -> Option<Rows> {
    match body.get("input")? {
        Value::String(_) => {}
        Value::Array(items) if items.is_empty() => return None,
        // One pre-tokenized input: a list of token ids is one row.
        Value::Array(items) if items.iter().all(Value::is_number) => {}
        Value::Array(_) => {
            let Some(Value::Array(items)) = body.remove("input") else {
                return None;
            };
            return Some((Layout::Input, vec![items]));
        }
        _ => return None,
    }
    let one = body.remove("input")?;
    Some((Layout::Input, vec![vec![one]]))
}

/// One backend body carrying every caller's rows, POSTed to `path`.
pub(super) fn build(path: &str, parts: &[&Part]) -> Result<Request<Bytes>, Error> {
    let first = parts
        .first()
        .ok_or_else(|| Error::new(Kind::BadRequest, "no requests to batch"))?;
    let mut body = first.rest.clone();
    let merged = |column: usize| -> Vec<Value> {
        parts
            .iter()
            .flat_map(|p| p.columns.get(column).into_iter().flatten().cloned())
            .collect()
    };
    let (key, value) = match &first.layout {
        Layout::Instances => ("instances", Value::Array(merged(0))),
        Layout::InputsList => ("inputs", Value::Array(merged(0))),
        Layout::InputsColumns(names) => {
            let columns = names
                .iter()
                .enumerate()
                .map(|(i, n)| (n.clone(), Value::Array(merged(i))));
            ("inputs", Value::Object(columns.collect()))
        }
        Layout::Input => ("input", Value::Array(merged(0))),
    };
    body.insert(key.into(), value);
    let mut request = Request::new(Bytes::from(Value::Object(body).to_string()));
    *request.method_mut() = http::Method::POST;
    *request.uri_mut() = path
        .parse()
        .map_err(|_| Error::new(Kind::BadRequest, format!("{path} is not a valid path")))?;
    request
        .headers_mut()
        .insert(http::header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    Ok(request)
}

/// The backend's answer to a batch, cut into one answer per caller.
pub(super) fn scatter(adapter: JsonAdapter, reply: &Reply, parts: &[&Part]) -> Result<Vec<Reply>, Error> {
    let broke = |why: &str| Error::new(Kind::Backend, format!("the batch's backend broke the protocol: {why}"));
    let Ok(Value::Object(mut body)) = serde_json::from_slice::<Value>(reply.body()) else {
        return Err(broke("its answer is not a JSON object"));
    };
    let rows: Vec<usize> = parts.iter().map(|p| p.rows()).collect();
    let total: usize = rows.iter().sum();
    let answers = match adapter {
        JsonAdapter::TfServing => tf_answers(&mut body, &rows, total).map_err(|w| broke(&w))?,
        JsonAdapter::OpenaiEmbeddings => embedding_answers(&mut body, parts, &rows, total).map_err(|w| broke(&w))?,
    };
    Ok(answers
        .into_iter()
        .map(|answer| {
            let mut reply = Response::new(Bytes::from(Value::Object(answer).to_string()));
            *reply.status_mut() = StatusCode::OK;
            reply
                .headers_mut()
                .insert(http::header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
            reply
        })
        .collect())
}

/// Cuts `items` into consecutive runs of `rows`.
fn cut(items: Vec<Value>, rows: &[usize]) -> Vec<Vec<Value>> {
    let mut items = items.into_iter();
    rows.iter().map(|&n| items.by_ref().take(n).collect()).collect()
}

fn tf_answers(body: &mut Map<String, Value>, rows: &[usize], total: usize) -> Result<Vec<Map<String, Value>>, String> {
    let (key, value) = match (body.remove("predictions"), body.remove("outputs")) {
        (Some(p), None) => ("predictions", p),
        (None, Some(o)) => ("outputs", o),
        _ => return Err("its answer has neither \"predictions\" nor \"outputs\" (or both)".into()),
    };
    let pieces: Vec<Value> = match value {
        Value::Array(items) if items.len() == total => cut(items, rows).into_iter().map(Value::Array).collect(),
        Value::Object(named) => {
            let mut per_caller: Vec<Map<String, Value>> = rows.iter().map(|_| Map::new()).collect();
            for (name, column) in named {
                let Value::Array(items) = column else {
                    return Err(format!("output \"{name}\" is not an array with one entry per row"));
                };
                if items.len() != total {
                    return Err(format!(
                        "output \"{name}\" has {} rows but the batch has {total}",
                        items.len()
                    ));
                }
                for (caller, piece) in per_caller.iter_mut().zip(cut(items, rows)) {
                    caller.insert(name.clone(), Value::Array(piece));
                }
            }
            per_caller.into_iter().map(Value::Object).collect()
        }
        Value::Array(items) => return Err(format!("\"{key}\" has {} rows but the batch has {total}", items.len())),
        _ => return Err(format!("\"{key}\" is not an array")),
    };
    Ok(pieces
        .into_iter()
        .map(|piece| {
            let mut answer = body.clone();
            answer.insert(key.into(), piece);
            answer
        })
        .collect())
}

fn embedding_answers(
    body: &mut Map<String, Value>,
    parts: &[&Part],
    rows: &[usize],
    total: usize,
) -> Result<Vec<Map<String, Value>>, String> {
    let Some(Value::Array(data)) = body.remove("data") else {
        return Err("its answer has no \"data\" array".into());
    };
    if data.len() != total {
        return Err(format!(
            "\"data\" has {} items but the batch has {total} inputs",
            data.len()
        ));
    }
    // Place every item by its index: each of 0..total exactly once.
    let mut ordered: Vec<Option<Value>> = vec![None; total];
    for item in data {
        let index = item
            .get("index")
            .and_then(Value::as_u64)
            .and_then(|i| usize::try_from(i).ok());
        match index.and_then(|i| ordered.get_mut(i)) {
            Some(slot @ None) => *slot = Some(item),
            Some(Some(_)) => return Err("two items in \"data\" share an index".into()),
            None => return Err(format!("an item in \"data\" has no index in 0..{total}")),
        }
    }
    let ordered: Vec<Value> = ordered.into_iter().flatten().collect();
    let usage = body.remove("usage");
    Ok(cut(ordered, rows)
        .into_iter()
        .zip(parts)
        .map(|(items, part)| {
            let items: Vec<Value> = items
                .into_iter()
                .enumerate()
                .map(|(i, mut item)| {
                    if let Some(obj) = item.as_object_mut() {
                        obj.insert("index".into(), Value::from(i));
                    }
                    item
                })
                .collect();
            let mut answer = body.clone();
            answer.insert("data".into(), Value::Array(items));
            if let Some(usage) = &usage {
                answer.insert("usage".into(), share(usage, part.rows(), total));
            }
            answer
        })
        .collect())
}

/// A caller's share of the batch's `usage` counts, in proportion to its rows (the
/// backend counts tokens for the whole batch only, so the split is an estimate).
fn share(usage: &Value, rows: usize, total: usize) -> Value {
    let Value::Object(counts) = usage else {
        return usage.clone();
    };
    let scaled = counts.iter().map(|(k, v)| {
        let v = match v.as_u64() {
            Some(n) if total > 0 => Value::from((n as u128 * rows as u128 / total as u128) as u64),
            _ => v.clone(),
        };
        (k.clone(), v)
    });
    Value::Object(scaled.collect())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // in tests a failed unwrap is a failed test
mod tests {
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
}
