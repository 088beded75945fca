//! OpenAI's API and Triton's generate extension over the simulator's LLMs: chat
//! completions, completions (a prompt list answered one choice per prompt, by `index`),
//! the Responses API and the models list, streamed (server-sent events, usage in a last
//! chunk when `stream_options.include_usage` asks) or whole; `/v2/models/M/generate`
//! and `generate_stream`. Prompt tokens are the words of the prompt's text (at least
//! one), completion tokens `max_tokens` (16 unless asked): exact, as a test reads them.

use bytes::Bytes;
use http::{Method, StatusCode};
use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::Out;
use crate::sim::answer::{reply, Reply, SimBody};
use crate::sim::Simulator;

/// Most tokens a simulated generation is asked for.
pub(super) const MAX_TOKENS: u64 = 4096;
/// Tokens a generation makes unless asked for another number.
const DEFAULT_TOKENS: u64 = 16;

/// The API paths the LLMs serve.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Api<'a> {
    Chat,
    Completions,
    Responses,
    Models,
    /// Triton's generate (`stream`: generate_stream) for a model.
    Generate(&'a str, bool),
}

/// What an answer is shaped as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Chat,
    Completions,
    Responses,
    Generate,
}

impl Api<'_> {
    fn kind(self) -> Kind {
        match self {
            Api::Chat | Api::Models => Kind::Chat,
            Api::Completions => Kind::Completions,
            Api::Responses => Kind::Responses,
            Api::Generate(..) => Kind::Generate,
        }
    }
}

/// The LLM API `path` names, if any.
pub(crate) fn parse(path: &str) -> Option<Api<'_>> {
    match path {
        "/v1/chat/completions" => return Some(Api::Chat),
        "/v1/completions" => return Some(Api::Completions),
        "/v1/responses" => return Some(Api::Responses),
        "/v1/models" => return Some(Api::Models),
        _ => {}
    }
    let rest = path.strip_prefix("/v2/models/")?;
    let (model, op) = rest.split_once('/')?;
    let op = op.strip_prefix("versions/1/").unwrap_or(op);
    match op {
        "generate" => Some(Api::Generate(model, false)),
        "generate_stream" => Some(Api::Generate(model, true)),
        _ => None,
    }
}

/// OpenAI's error object.
fn openai_error(status: StatusCode, message: &str, code: &str) -> Reply {
    let body = json!({"error": {"message": message, "type": "invalid_request_error", "param": null, "code": code}});
    reply(status, "application/json", Bytes::from(body.to_string()))
}

/// Answers `api` with `body` (read already; empty for GET).
pub(crate) async fn serve(sim: &Simulator, api: Api<'_>, method: &Method, body: Bytes) -> Reply {
    if api == Api::Models {
        if method != Method::GET {
            return openai_error(
                StatusCode::METHOD_NOT_ALLOWED,
                "/v1/models takes GET",
                "method_not_allowed",
            );
        }
        let data: Vec<Value> = sim
            .llm_models()
            .into_iter()
            .map(|m| json!({"id": m, "object": "model", "created": 0, "owned_by": "tiergate-sim"}))
            .collect();
        return reply(
            StatusCode::OK,
            "application/json",
            Bytes::from(json!({"object": "list", "data": data}).to_string()),
        );
    }
    if method != Method::POST {
        return openai_error(
            StatusCode::METHOD_NOT_ALLOWED,
            "this path takes POST",
            "method_not_allowed",
        );
    }
    let Ok(request) = serde_json::from_slice::<Value>(&body) else {
        return openai_error(StatusCode::BAD_REQUEST, "the body is not JSON", "invalid_json");
    };
    let model = match api {
        Api::Generate(model, _) => model.to_owned(),
        _ => request["model"].as_str().unwrap_or_default().to_owned(),
    };
    let Some(engine) = sim.llm(&model) else {
        let message = format!("The model `{model}` does not exist");
        return openai_error(StatusCode::NOT_FOUND, &message, "model_not_found");
    };
    let asked = Asked::of(api, &request);
    let faults = sim.stream_faults();
    let generations: Vec<_> = asked
        .prompts
        .iter()
        .enumerate()
        .map(|(i, prompt)| engine.generate((*prompt, asked.max_tokens, seed(&model, asked.keys[i])), faults))
        .collect();
    let shape = Shape {
        api: api.kind(),
        model,
        id: format!("{:016x}", rand::random::<u64>()),
        prompt: asked.prompts.iter().sum(),
        include_usage: asked.include_usage,
    };
    match asked.stream {
        true => streamed(shape, generations),
        false => whole(shape, generations).await,
    }
}

/// What a request asks of the engine.
struct Asked {
    /// Prompt tokens of each generation (one per prompt).
    prompts: Vec<u64>,
    /// Each prompt's text, hashed: what its generation's text depends on.
    keys: Vec<u64>,
    max_tokens: u64,
    stream: bool,
    include_usage: bool,
}

impl Asked {
    fn of(api: Api<'_>, r: &Value) -> Asked {
        let words = |v: &Value| -> u64 {
            let text = match v {
                Value::String(s) => s.clone(),
                Value::Array(parts) => parts
                    .iter()
                    .map(|p| p["text"].as_str().or(p["content"].as_str()).unwrap_or_default())
                    .collect::<Vec<_>>()
                    .join(" "),
                _ => String::new(),
            };
            (text.split_whitespace().count() as u64).max(1)
        };
        let messages = |v: &Value| -> u64 {
            match v.as_array() {
                Some(list) => list.iter().map(|m| words(&m["content"])).sum::<u64>().max(1),
                None => words(v),
            }
        };
        let texts: Vec<&Value> = match api {
            Api::Chat => vec![&r["messages"]],
            Api::Completions => match r["prompt"].as_array() {
                Some(list) if !list.is_empty() => list.iter().collect(),
                _ => vec![&r["prompt"]],
            },
            Api::Responses => vec![&r["input"]],
            Api::Generate(..) => vec![&r["text_input"]],
            Api::Models => Vec::new(),
        };
        let prompts = match api {
            Api::Chat | Api::Responses => texts.iter().map(|t| messages(t)).collect(),
            _ => texts.iter().map(|t| words(t)).collect(),
        };
        // FNV-1a of the prompt's JSON: the same prompt makes the same text wherever it
        // stands in a list, so a coalesced call answers as separate ones would.
        let keys = texts
            .iter()
            .map(|t| {
                t.to_string().bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
                    (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
                })
            })
            .collect();
        let asked = ["max_completion_tokens", "max_tokens", "max_output_tokens"]
            .iter()
            .find_map(|k| r[*k].as_u64())
            .or_else(|| r["parameters"]["max_tokens"].as_u64());
        Asked {
            prompts,
            keys,
            max_tokens: asked.unwrap_or(DEFAULT_TOKENS).clamp(1, MAX_TOKENS),
            stream: matches!(api, Api::Generate(_, true)) || r["stream"].as_bool() == Some(true),
            include_usage: r["stream_options"]["include_usage"].as_bool() == Some(true),
        }
    }
}

/// The text a generation makes depends on its model and its prompt (`key`).
pub(super) fn seed(model: &str, key: u64) -> u64 {
    model.bytes().map(u64::from).sum::<u64>().wrapping_add(key)
}

/// What every answer of one request shares.
struct Shape {
    api: Kind,
    model: String,
    id: String,
    prompt: u64,
    include_usage: bool,
}

impl Shape {
    fn usage(&self, completion: u64) -> Value {
        match self.api {
            Kind::Responses => json!({"input_tokens": self.prompt, "output_tokens": completion,
                "total_tokens": self.prompt + completion}),
            _ => json!({"prompt_tokens": self.prompt, "completion_tokens": completion,
                "total_tokens": self.prompt + completion}),
        }
    }

    /// A streamed chunk carrying `text` for choice `index` (or the finish reason).
    fn chunk(&self, index: usize, text: Option<&str>) -> Value {
        let finish = text.is_none().then_some("length");
        match self.api {
            Kind::Chat => json!({"id": format!("chatcmpl-{}", self.id), "object": "chat.completion.chunk",
                "created": 0, "model": self.model,
                "choices": [{"index": index, "delta": text.map_or(json!({}), |t| json!({"content": t})),
                    "finish_reason": finish}]}),
            Kind::Completions => json!({"id": format!("cmpl-{}", self.id), "object": "text_completion",
                "created": 0, "model": self.model,
                "choices": [{"index": index, "text": text.unwrap_or(""), "finish_reason": finish}]}),
            Kind::Responses => json!({"type": "response.output_text.delta", "item_id": format!("msg_{}", self.id),
                "output_index": 0, "content_index": 0, "delta": text.unwrap_or("")}),
            Kind::Generate => {
                json!({"model_name": self.model, "model_version": "1", "text_output": text.unwrap_or("")})
            }
        }
    }

    /// The whole answer with each choice's text.
    fn whole(&self, texts: &[String], completion: u64) -> Value {
        match self.api {
            Kind::Chat => json!({"id": format!("chatcmpl-{}", self.id), "object": "chat.completion",
                "created": 0, "model": self.model,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": texts[0]},
                    "finish_reason": "length"}],
                "usage": self.usage(completion)}),
            Kind::Completions => json!({"id": format!("cmpl-{}", self.id), "object": "text_completion",
                "created": 0, "model": self.model,
                "choices": texts.iter().enumerate().map(|(i, t)| json!({"index": i, "text": t,
                    "finish_reason": "length"})).collect::<Vec<_>>(),
                "usage": self.usage(completion)}),
            Kind::Responses => self.response("completed", Some(&texts[0]), completion),
            Kind::Generate => {
                json!({"model_name": self.model, "model_version": "1", "text_output": texts[0]})
            }
        }
    }

    /// A Responses API response object.
    fn response(&self, status: &str, text: Option<&str>, completion: u64) -> Value {
        let output = text.map_or(json!([]), |t| {
            json!([{"type": "message", "id": format!("msg_{}", self.id), "role": "assistant", "status": status,
                "content": [{"type": "output_text", "text": t, "annotations": []}]}])
        });
        json!({"id": format!("resp_{}", self.id), "object": "response", "created_at": 0, "status": status,
            "model": self.model, "output": output,
            "usage": if status == "completed" { self.usage(completion) } else { Value::Null }})
    }
}

/// Waits for every generation, then answers whole.
async fn whole(shape: Shape, generations: Vec<mpsc::UnboundedReceiver<Out>>) -> Reply {
    let mut texts = Vec::new();
    let mut completion = 0;
    for mut rx in generations {
        let mut text = String::new();
        loop {
            match rx.recv().await {
                Some(Out::Token(word)) => {
                    text.push_str(word);
                    completion += 1;
                }
                Some(Out::Done) => break,
                Some(Out::Malformed) | None => {
                    return reply(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "text/plain",
                        Bytes::from_static(b"<html>broken"),
                    )
                }
            }
        }
        texts.push(text);
    }
    reply(
        StatusCode::OK,
        "application/json",
        Bytes::from(shape.whole(&texts, completion).to_string()),
    )
}

/// Answers with a stream, its events written as the generations' tokens come.
fn streamed(shape: Shape, generations: Vec<mpsc::UnboundedReceiver<Out>>) -> Reply {
    let (events, body) = mpsc::channel::<Bytes>(16);
    let (merged_tx, mut merged) = mpsc::unbounded_channel();
    for (index, mut rx) in generations.into_iter().enumerate() {
        let tx = merged_tx.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    out = rx.recv() => {
                        let end = !matches!(out, Some(Out::Token(_)));
                        if tx.send((index, out)).is_err() || end {
                            return;
                        }
                    }
                    // The writer is gone (the client left): drop the generation now.
                    () = tx.closed() => return,
                }
            }
        });
    }
    drop(merged_tx);
    tokio::spawn(async move {
        let send = |event: Bytes| events.send(event);
        // Each event says when it was written (`x_sent_us`, µs of the Unix epoch), so a
        // load test on this machine reads how long a proxy took to relay it.
        let event = |v: &Value| {
            let mut v = v.clone();
            if let Some(object) = v.as_object_mut() {
                let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
                object.insert("x_sent_us".into(), json!(now.map_or(0, |d| d.as_micros() as u64)));
            }
            crate::llm::sse::data_event(v.to_string().as_bytes())
        };
        let named = |name: &str, v: &Value| Bytes::from(format!("event: {name}\ndata: {v}\n\n"));
        let opening = match shape.api {
            Kind::Chat => Some(event(
                &json!({"id": format!("chatcmpl-{}", shape.id), "object": "chat.completion.chunk",
                "created": 0, "model": shape.model,
                "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": null}]}),
            )),
            Kind::Responses => {
                let created = json!({"type": "response.created", "response": shape.response("in_progress", None, 0)});
                Some(named("response.created", &created))
            }
            _ => None,
        };
        if let Some(opening) = opening {
            if send(opening).await.is_err() {
                return;
            }
        }
        let (mut completion, mut texts) = (0u64, vec![String::new(); 1]);
        loop {
            // The client gone (its body dropped), the generations go with it.
            let (index, out) = tokio::select! {
                next = merged.recv() => match next {
                    Some(next) => next,
                    None => break,
                },
                () = events.closed() => return,
            };
            let bytes = match out {
                Some(Out::Token(word)) => {
                    completion += 1;
                    if index >= texts.len() {
                        texts.resize(index + 1, String::new());
                    }
                    texts[index].push_str(word);
                    match shape.api {
                        Kind::Responses => named("response.output_text.delta", &shape.chunk(index, Some(word))),
                        _ => event(&shape.chunk(index, Some(word))),
                    }
                }
                Some(Out::Done) => match shape.api {
                    Kind::Chat | Kind::Completions => event(&shape.chunk(index, None)),
                    _ => continue,
                },
                Some(Out::Malformed) => Bytes::from_static(b"data: {\"choices\": [oops\n\n"),
                None => return,
            };
            let malformed = bytes.starts_with(b"data: {\"choices\": [oops");
            if send(bytes).await.is_err() || malformed {
                return;
            }
        }
        let closing: Vec<Bytes> = match shape.api {
            Kind::Chat | Kind::Completions => {
                let mut end = Vec::new();
                if shape.include_usage {
                    end.push(event(
                        &json!({"id": format!("x-{}", shape.id), "object": "chat.completion.chunk",
                        "created": 0, "model": shape.model, "choices": [], "usage": shape.usage(completion)}),
                    ));
                }
                end.push(Bytes::from_static(b"data: [DONE]\n\n"));
                end
            }
            Kind::Responses => {
                let done = json!({"type": "response.completed",
                    "response": shape.response("completed", Some(&texts.concat()), completion)});
                vec![named("response.completed", &done)]
            }
            Kind::Generate => Vec::new(),
        };
        for bytes in closing {
            if send(bytes).await.is_err() {
                return;
            }
        }
    });
    let mut answer = http::Response::new(SimBody::Stream(body));
    answer.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/event-stream"),
    );
    answer
        .headers_mut()
        .insert(http::header::CACHE_CONTROL, http::HeaderValue::from_static("no-cache"));
    answer
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // in tests a failed unwrap is a failed test
mod tests {
    use super::*;

    #[test]
    fn llm_paths_are_parsed() {
        assert_eq!(parse("/v1/chat/completions"), Some(Api::Chat));
        assert_eq!(parse("/v1/models"), Some(Api::Models));
        assert_eq!(parse("/v2/models/llama/generate"), Some(Api::Generate("llama", false)));
        assert_eq!(
            parse("/v2/models/llama/versions/1/generate_stream"),
            Some(Api::Generate("llama", true))
        );
        assert_eq!(parse("/v2/models/llama/infer"), None);
    }

    #[test]
    fn prompts_count_their_words_and_a_list_is_one_generation_each() {
        let asked = Asked::of(Api::Completions, &json!({"prompt": ["a b c", "d"], "max_tokens": 5}));
        assert_eq!((asked.prompts, asked.max_tokens, asked.stream), (vec![3, 1], 5, false));
        let chat = json!({"messages": [{"role": "user", "content": "hello there"},
            {"role": "user", "content": [{"type": "text", "text": "x y z"}]}], "stream": true});
        let asked = Asked::of(Api::Chat, &chat);
        assert_eq!(
            (asked.prompts, asked.max_tokens, asked.stream),
            (vec![5], DEFAULT_TOKENS, true)
        );
    }
}
