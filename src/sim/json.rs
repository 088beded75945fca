//! The simulator's JSON services, for the micro-batch tier's JSON adapters: TF-Serving
//! REST predict (`POST /v1/models/{m}:predict`, `instances` or `inputs`) and OpenAI-style
//! embeddings (`POST /v1/embeddings`, the model named in the body). Each request is one
//! batch of its rows on the model's instances, like a KServe v2 infer request, and the
//! answers are deterministic per row: a TF-Serving prediction is the sum of the row's
//! numbers (a string counts its length); an embedding is `[characters, sum of bytes]` of
//! its input (a token list: `[tokens, sum of ids]`). A row that is the string `poison`
//! is refused with 400, as a model refuses input it cannot read.

use bytes::Bytes;
use http::{Request, StatusCode};
use hyper::body::Incoming;
use serde_json::{json, Map, Value};
use tokio::sync::oneshot;

use super::answer::{error, read_body, reply, InFlight, Refusal, Reply, POISON};
use super::instance::{Job, Outcome};
use super::Simulator;

/// Which JSON service a request is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Service<'a> {
    /// TF-Serving predict for the model named in the path.
    Predict(&'a str),
    /// OpenAI-style embeddings.
    Embeddings,
}

/// Parses `/v1/models/{m}:predict` and `/v1/embeddings`.
pub(crate) fn parse(path: &str) -> Option<Service<'_>> {
    if path == "/v1/embeddings" {
        return Some(Service::Embeddings);
    }
    let model = path.strip_prefix("/v1/models/")?.strip_suffix(":predict")?;
    (!model.is_empty() && !model.contains('/')).then_some(Service::Predict(model))
}

/// Answers a JSON service request.
pub(crate) async fn serve(sim: &Simulator, service: Service<'_>, req: Request<Incoming>) -> Reply {
    let answer = async {
        let body = read_body(req).await?;
        let Ok(Value::Object(body)) = serde_json::from_slice::<Value>(&body) else {
            return Err(Refusal::bad("the body must be a JSON object"));
        };
        match service {
            Service::Predict(model) => predict(sim, model, body).await,
            Service::Embeddings => embeddings(sim, body).await,
        }
    };
    match answer.await {
        Ok(value) => reply(StatusCode::OK, "application/json", Bytes::from(value.to_string())),
        Err(Refusal(status, message)) => error(status, &message),
    }
}

async fn predict(sim: &Simulator, model: &str, mut body: Map<String, Value>) -> Result<Value, Refusal> {
    let rows: Vec<Value> = match (body.remove("instances"), body.remove("inputs")) {
        (Some(Value::Array(rows)), None) | (None, Some(Value::Array(rows))) => rows,
        (None, Some(Value::Object(named))) => {
            let columns: Vec<Vec<Value>> = named
                .into_values()
                .map(|c| match c {
                    Value::Array(items) => Ok(items),
                    _ => Err(Refusal::bad("every named input must be a list with one entry per row")),
                })
                .collect::<Result<_, _>>()?;
            let n = columns.first().map_or(0, Vec::len);
            if columns.iter().any(|c| c.len() != n) {
                return Err(Refusal::bad("named inputs disagree on their number of rows"));
            }
            let rows = (0..n).map(|r| Value::Array(columns.iter().map(|c| c[r].clone()).collect()));
            let sums: Vec<f64> = rows.map(|r| sum(&r)).collect::<Result<_, _>>()?;
            execute(sim, model, sums.len()).await?;
            return Ok(json!({ "outputs": { "sum": sums } }));
        }
        _ => {
            return Err(Refusal::bad(
                "the body needs exactly one of \"instances\" and \"inputs\", a list",
            ))
        }
    };
    let sums: Vec<f64> = rows.iter().map(sum).collect::<Result<_, _>>()?;
    execute(sim, model, sums.len()).await?;
    Ok(json!({ "predictions": sums }))
}

async fn embeddings(sim: &Simulator, body: Map<String, Value>) -> Result<Value, Refusal> {
    let Some(model) = body.get("model").and_then(Value::as_str) else {
        return Err(Refusal::bad("\"model\" is required"));
    };
    let inputs: Vec<Value> = match body.get("input") {
        Some(Value::String(s)) => vec![Value::String(s.clone())],
        Some(Value::Array(items)) if !items.is_empty() && items.iter().all(Value::is_number) => {
            vec![Value::Array(items.clone())]
        }
        Some(Value::Array(items)) if !items.is_empty() => items.clone(),
        _ => return Err(Refusal::bad("\"input\" must be a string or a non-empty list")),
    };
    let mut data = Vec::with_capacity(inputs.len());
    let mut tokens = 0u64;
    for (index, input) in inputs.iter().enumerate() {
        let embedding = match input {
            Value::String(s) if s == POISON => return Err(poisoned(index)),
            Value::String(s) => {
                tokens += s.split_whitespace().count() as u64;
                [s.chars().count() as f64, s.bytes().map(f64::from).sum()]
            }
            Value::Array(ids) => {
                tokens += ids.len() as u64;
                [ids.len() as f64, ids.iter().filter_map(Value::as_f64).sum()]
            }
            _ => {
                return Err(Refusal::bad(format!(
                    "input[{index}] must be a string or a list of token ids"
                )))
            }
        };
        data.push(json!({"object": "embedding", "index": index, "embedding": embedding}));
    }
    execute(sim, model, inputs.len()).await?;
    Ok(json!({
        "object": "list",
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }))
}

/// The row's numbers summed (nested lists too; a string counts its length).
fn sum(row: &Value) -> Result<f64, Refusal> {
    Ok(match row {
        Value::Number(n) => n.as_f64().unwrap_or(0.0),
        Value::String(s) if s == POISON => return Err(poisoned(0)),
        Value::String(s) => s.chars().count() as f64,
        Value::Bool(b) => f64::from(u8::from(*b)),
        Value::Array(items) => items.iter().map(sum).sum::<Result<f64, _>>()?,
        Value::Object(map) => map.values().map(sum).sum::<Result<f64, _>>()?,
        Value::Null => 0.0,
    })
}

fn poisoned(index: usize) -> Refusal {
    Refusal::bad(format!(
        "a row (input {index} or later) is \"{POISON}\": the model refuses it"
    ))
}

/// Runs one batch of `rows` rows on `model`'s instances, counted in its statistics.
async fn execute(sim: &Simulator, model: &str, rows: usize) -> Result<(), Refusal> {
    let Some(m) = sim.model(model) else {
        return Err(Refusal(StatusCode::NOT_FOUND, format!("unknown model '{model}'")));
    };
    let mut guard = InFlight::enter(&m.stats);
    let (reply, done) = oneshot::channel();
    let queued = m.jobs.send(Job {
        rows: rows as u64,
        reply,
    });
    m.stats.send_modify(|s| s.requests += 1);
    queued.map_err(|_| Refusal::no_instance(model))?;
    let outcome = done.await;
    guard.answered = true;
    match outcome {
        Ok(Outcome::Done) => Ok(()),
        Ok(Outcome::Fault) => Err(Refusal(StatusCode::INTERNAL_SERVER_ERROR, "injected fault".into())),
        Err(_) => Err(Refusal::no_instance(model)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths() {
        assert_eq!(parse("/v1/embeddings"), Some(Service::Embeddings));
        assert_eq!(parse("/v1/models/m:predict"), Some(Service::Predict("m")));
        for other in [
            "/v1/models/:predict",
            "/v1/models/a/b:predict",
            "/v1/models/m",
            "/v2/models/m/infer",
        ] {
            assert_eq!(parse(other), None, "{other}");
        }
    }

    #[test]
    fn sums_are_per_row_and_poison_is_refused() {
        assert_eq!(sum(&json!([1, [2, 3], "ab", true])).ok(), Some(9.0));
        assert!(sum(&json!(["poison"])).is_err());
    }
}
