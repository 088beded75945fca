//! The JSON forms of the micro-batch tier, for routes whose backends do not speak
//! KServe v2: TF-Serving REST (`instances` / `inputs` → `predictions` / `outputs`),
//! OpenAI-style embeddings (`input` → `data[]` by `index`) and OpenAI completions
//! (`prompt` → `choices[]` by `index`, [`completions`]; streamed, [`stream`]). Callers'
//! arrays are merged into one backend body and the answer's array is cut back by each
//! caller's rows. Everything else in a body must agree for callers to share a batch.

use bytes::Bytes;
use http::{HeaderValue, Request, Response, StatusCode};
use serde_json::{Map, Value};

use super::Unbatched;
use crate::error::{Error, Kind};
use crate::policy::JsonAdapter;
use crate::protocol::batch::canonical;
use crate::protocol::Reply;

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
    /// OpenAI completions: `{"prompt": ...}`.
    Prompt,
}

impl Part {
    /// Its rows.
    pub(super) fn rows(&self) -> usize {
        self.columns.first().map_or(0, Vec::len)
    }

    /// Whether it asks for a stream (`"stream": true`): its batch is sent asking for one,
    /// which [`stream::split`] cuts by caller.
    pub(super) fn streamed(&self) -> bool {
        self.rest.get("stream").and_then(Value::as_bool) == Some(true)
    }

    /// Its row `i` alone: the same layout and rest, that one row of every column.
    pub(super) fn row(&self, i: usize) -> Option<Part> {
        let columns = self.columns.iter().map(|c| c.get(i).map(|v| vec![v.clone()]));
        Some(Part {
            layout: self.layout.clone(),
            rest: self.rest.clone(),
            columns: columns.collect::<Option<Vec<_>>>()?,
        })
    }
}

/// A caller's body as rows plus the signature that callers sharing its batch must have;
/// or why it cannot share one (then the backend answers it alone).
pub(super) fn parse(adapter: JsonAdapter, body: &Bytes) -> Result<Result<(String, Part, u64), Unbatched>, Error> {
    // Parsed, such an integer is the nearest f64: merged and written again, it would
    // reach the backend changed, and two callers' could share a batch they differ in.
    if crate::protocol::scan::scan(body).wide_integer {
        return Ok(Err(Unbatched(
            "its body holds an integer beyond 64 bits, which only its own call carries exactly".to_owned(),
        )));
    }
    let mut rest = match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(map)) => map,
        Ok(_) => return Err(bad(adapter, "the body must be a JSON object")),
        Err(e) => return Err(bad(adapter, &format!("the body is not JSON: {e}"))),
    };
    let part = match adapter {
        JsonAdapter::TfServing => tf_serving(&mut rest),
        JsonAdapter::OpenaiEmbeddings => embeddings(&mut rest),
        JsonAdapter::OpenaiCompletions => completions::rows(&mut rest),
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
        JsonAdapter::OpenaiCompletions => "\"prompt\" (strings)",
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

/// One backend request carrying every caller's rows ([`body`]), POSTed to `path`;
/// asking the pool to hand its stream up when the callers' bodies ask for one.
pub(super) fn build(path: &str, parts: &[&Part]) -> Result<Request<Bytes>, Error> {
    let Some(first) = parts.first() else {
        return Err(Error::new(Kind::BadRequest, "no requests to batch"));
    };
    let body = body(parts);
    let mut request = Request::new(Bytes::from(Value::Object(body).to_string()));
    if first.streamed() {
        request
            .extensions_mut()
            .insert(crate::backend::stream::Wanted::default());
    }
    *request.method_mut() = http::Method::POST;
    *request.uri_mut() = path
        .parse()
        .map_err(|_| Error::new(Kind::BadRequest, format!("{path} is not a valid path")))?;
    request
        .headers_mut()
        .insert(http::header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    Ok(request)
}

/// The body carrying every one of `parts`' rows, in order: the first part's rest, and
/// its layout's key holding the rows (empty without parts).
pub(super) fn body(parts: &[&Part]) -> Map<String, Value> {
    let Some(first) = parts.first() else {
        return Map::new();
    };
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
        Layout::Prompt => ("prompt", Value::Array(merged(0))),
    };
    body.insert(key.into(), value);
    body
}

/// One caller's answer joined from its rows' answers, in order, each an answer to one
/// row as [`scatter`] cuts them (or as a one-row request got it): the first row's
/// answer with every row's predictions or outputs (TF-Serving) or embeddings, indexed
/// afresh, and their usage summed (OpenAI).
pub(super) fn join(adapter: JsonAdapter, rows: Vec<Map<String, Value>>) -> Result<Map<String, Value>, String> {
    let mut rows = rows.into_iter();
    let Some(mut first) = rows.next() else {
        return Err("no rows to join".into());
    };
    match adapter {
        JsonAdapter::TfServing => {
            let key = if first.contains_key("predictions") {
                "predictions"
            } else {
                "outputs"
            };
            let mut joined = first
                .remove(key)
                .ok_or("a row's answer has neither \"predictions\" nor \"outputs\"")?;
            for mut row in rows {
                match (&mut joined, row.remove(key)) {
                    (Value::Array(all), Some(Value::Array(more))) => all.extend(more),
                    (Value::Object(all), Some(Value::Object(more))) if all.len() == more.len() => {
                        for (name, column) in more {
                            match (all.get_mut(&name), column) {
                                (Some(Value::Array(all)), Value::Array(more)) => all.extend(more),
                                _ => return Err(format!("output \"{name}\" differs between rows")),
                            }
                        }
                    }
                    _ => return Err(format!("\"{key}\" differs in form between rows")),
                }
            }
            first.insert(key.into(), joined);
        }
        JsonAdapter::OpenaiEmbeddings => {
            let mut data = match first.remove("data") {
                Some(Value::Array(data)) => data,
                _ => return Err("a row's answer has no \"data\" array".into()),
            };
            let mut usage = first.remove("usage");
            for mut row in rows {
                match row.remove("data") {
                    Some(Value::Array(more)) => data.extend(more),
                    _ => return Err("a row's answer has no \"data\" array".into()),
                }
                usage = summed(usage, row.remove("usage"));
            }
            first.insert("data".into(), Value::Array(renumbered(data)));
            if let Some(usage) = usage {
                first.insert("usage".into(), usage);
            }
        }
        JsonAdapter::OpenaiCompletions => completions::join(&mut first, rows)?,
    }
    Ok(first)
}

/// `items` with each one's `index` set to its place among them.
fn renumbered(items: Vec<Value>) -> Vec<Value> {
    items
        .into_iter()
        .enumerate()
        .map(|(i, mut item)| {
            if let Some(obj) = item.as_object_mut() {
                obj.insert("index".into(), Value::from(i));
            }
            item
        })
        .collect()
}

/// Two answers' `usage` counts added up (the first as it is when the second is not a
/// count table).
fn summed(usage: Option<Value>, more: Option<Value>) -> Option<Value> {
    match (usage, more) {
        (Some(Value::Object(mut sum)), Some(Value::Object(more))) => {
            for (k, v) in more {
                let total = sum.get(&k).and_then(Value::as_u64).zip(v.as_u64()).map(|(a, b)| a + b);
                sum.insert(k, total.map_or(v, Value::from));
            }
            Some(Value::Object(sum))
        }
        (usage, _) => usage,
    }
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
        JsonAdapter::OpenaiCompletions => {
            completions::answers(&mut body, parts, &rows, total).map_err(|w| broke(&w))?
        }
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
            let mut answer = body.clone();
            answer.insert("data".into(), Value::Array(renumbered(items)));
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

mod completions;
pub(super) mod stream;
#[cfg(test)]
mod tests;
