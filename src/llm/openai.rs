//! OpenAI's API as the gateway reads it: what a request asks ([`Ask`]: its `model`,
//! whether it streams, its `service_tier`), the request rewritten to ask the backend
//! for a stream's usage ([`asking_usage`]), the tokens an answer or an event counts
//! ([`Usage`]), and the events a relay writes itself (an error, in OpenAI's shape).
//! The paths it serves are [`PATHS`].

use bytes::Bytes;
use serde::Deserialize;
use serde_json::Value;

/// The paths routed by the body's `model`.
pub const PATHS: [&str; 4] = [
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/responses",
    "/v1/embeddings",
];

/// Whether `path` is one of [`PATHS`].
pub fn is_path(path: &str) -> bool {
    PATHS.contains(&path)
}

/// Whether `path` is one of [`PATHS`] that generates tokens (every one but embeddings):
/// a call that holds a sequence and KV cache on its engine while it runs.
pub fn generates(path: &str) -> bool {
    is_path(path) && path != "/v1/embeddings"
}

/// What a request body asks, as far as routing and streaming go.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ask {
    /// Its `model`.
    pub model: Option<String>,
    /// Whether it asks for a stream (`"stream": true`).
    pub stream: bool,
    /// Its `service_tier`, when given.
    pub service_tier: Option<String>,
    /// Whether a stream's usage was asked for (`stream_options.include_usage`).
    pub include_usage: bool,
}

#[derive(Deserialize)]
struct AskFile<'a> {
    #[serde(borrow, default)]
    model: Option<std::borrow::Cow<'a, str>>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(borrow, default)]
    service_tier: Option<std::borrow::Cow<'a, str>>,
    #[serde(default)]
    stream_options: Option<StreamOptions>,
}

#[derive(Deserialize)]
struct StreamOptions {
    #[serde(default)]
    include_usage: Option<bool>,
}

impl Ask {
    /// What `body` asks; an error saying what is wrong when it is not a JSON object
    /// with those fields' types.
    pub fn of(body: &[u8]) -> Result<Ask, String> {
        let file: AskFile<'_> =
            serde_json::from_slice(body).map_err(|e| format!("the request body is not an OpenAI request: {e}"))?;
        Ok(Ask {
            model: file.model.map(|m| m.into_owned()),
            stream: file.stream.unwrap_or(false),
            service_tier: file.service_tier.map(|t| t.into_owned()),
            include_usage: file.stream_options.and_then(|o| o.include_usage).unwrap_or(false),
        })
    }
}

/// `json` (an object) changed by `edit`, written again; `None` when it is not a JSON
/// object, or `edit` finds nothing to change.
pub fn edited(json: &[u8], edit: impl FnOnce(&mut serde_json::Map<String, Value>) -> Option<()>) -> Option<Bytes> {
    let mut value: Value = serde_json::from_slice(json).ok()?;
    edit(value.as_object_mut()?)?;
    serde_json::to_vec(&value).ok().map(Bytes::from)
}

/// `body` (a streamed chat or completions request) asking for the stream's usage
/// (`stream_options.include_usage`), or `None` when it cannot be rewritten.
pub fn asking_usage(body: &[u8]) -> Option<Bytes> {
    edited(body, |object| {
        let options = object
            .entry("stream_options")
            .or_insert_with(|| Value::Object(Default::default()));
        options
            .as_object_mut()?
            .insert("include_usage".into(), Value::Bool(true));
        Some(())
    })
}

/// `body` (an OpenAI request) carrying vLLM's `priority` = `priority` (lower is served
/// first), or `None` when it is not a JSON object.
pub fn with_priority(body: &[u8], priority: i64) -> Option<Bytes> {
    edited(body, |object| {
        object.insert("priority".into(), Value::from(priority));
        Some(())
    })
}

/// `answer` (an OpenAI object) saying `tier` in its `service_tier`, or `None` when it
/// is not a JSON object with an `object` field (an OpenAI answer).
pub fn with_service_tier(answer: &[u8], tier: &str) -> Option<Bytes> {
    edited(answer, |object| {
        object.contains_key("object").then_some(())?;
        object.insert("service_tier".into(), Value::String(tier.to_owned()));
        Some(())
    })
}

/// Tokens a call used, as the backend counted them (or estimated from a stream's
/// content events where it counted none).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Prompt (input) tokens.
    pub prompt: u64,
    /// Completion (output) tokens.
    pub completion: u64,
    /// Whether these are estimates (no `usage` from the backend).
    pub estimated: bool,
}

#[derive(Deserialize)]
struct UsageFile {
    #[serde(default, alias = "input_tokens")]
    prompt_tokens: Option<u64>,
    #[serde(default, alias = "output_tokens")]
    completion_tokens: Option<u64>,
    /// Set by the gateway on a caller's share of a coalesced call's usage split in
    /// proportion (not by the backend's token ids).
    #[serde(default)]
    tiergate_estimated: bool,
}

#[derive(Deserialize)]
struct WithUsage {
    #[serde(default)]
    usage: Option<UsageFile>,
    /// The Responses API's `response.completed` event holds the response.
    #[serde(default)]
    response: Option<Box<WithUsage>>,
}

impl Usage {
    /// The `usage` of an answer's or an event's JSON, when it has one.
    pub fn of(json: &[u8]) -> Option<Usage> {
        // Most events have none: a look for the word before a parse.
        memchr::memmem::find(json, b"\"usage\"")?;
        let with: WithUsage = serde_json::from_slice(json).ok()?;
        let usage = match (with.usage, with.response) {
            (Some(u), _) => u,
            (None, Some(inner)) => inner.usage?,
            (None, None) => return None,
        };
        Some(Usage {
            prompt: usage.prompt_tokens.unwrap_or(0),
            completion: usage.completion_tokens.unwrap_or(0),
            estimated: usage.tiergate_estimated,
        })
    }
}

/// What one event of a chat, completions or Responses stream carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Carries {
    /// Generated text (a first token, or one after it).
    Content,
    /// Only the usage (a chunk with no choices): the one the gateway asked for itself.
    UsageOnly,
    /// Anything else: a role, a finish reason, `[DONE]`, a lifecycle event.
    Other,
}

#[derive(Deserialize)]
struct Chunk<'a> {
    #[serde(default)]
    choices: Option<Vec<Choice<'a>>>,
    #[serde(borrow, default, rename = "type")]
    kind: Option<std::borrow::Cow<'a, str>>,
    #[serde(default)]
    usage: Option<serde::de::IgnoredAny>,
    #[serde(borrow, default)]
    delta: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow, default)]
    text_output: Option<std::borrow::Cow<'a, str>>,
    /// A decoupled model's response (KServe v2): content when it has outputs.
    #[serde(default)]
    outputs: Option<Vec<serde::de::IgnoredAny>>,
}

#[derive(Deserialize)]
struct Choice<'a> {
    #[serde(borrow, default)]
    delta: Option<Delta<'a>>,
    #[serde(borrow, default)]
    text: Option<std::borrow::Cow<'a, str>>,
}

#[derive(Deserialize)]
struct Delta<'a> {
    #[serde(borrow, default)]
    content: Option<std::borrow::Cow<'a, str>>,
}

/// What the event whose data is `data` carries; `None` when the data is neither JSON
/// nor `[DONE]` (a malformed event). JSON's `null` carries nothing: llama.cpp's server
/// sends it first on a completions stream of several prompts.
pub fn carries(data: &[u8]) -> Option<Carries> {
    if data == b"[DONE]" || data == b"null" {
        return Some(Carries::Other);
    }
    let chunk: Chunk<'_> = serde_json::from_slice(data).ok()?;
    let text = |t: &Option<std::borrow::Cow<'_, str>>| t.as_deref().is_some_and(|t| !t.is_empty());
    if let Some(choices) = &chunk.choices {
        if choices.is_empty() && chunk.usage.is_some() {
            return Some(Carries::UsageOnly);
        }
        let content = choices
            .iter()
            .any(|c| text(&c.text) || c.delta.as_ref().is_some_and(|d| text(&d.content)));
        return Some(if content { Carries::Content } else { Carries::Other });
    }
    // The Responses API's text deltas, Triton's generate stream, a decoupled model's
    // responses (a final one may have no outputs).
    let delta = chunk.kind.as_deref() == Some("response.output_text.delta") && text(&chunk.delta);
    let outputs = chunk.outputs.as_ref().is_some_and(|o| !o.is_empty());
    Some(if delta || text(&chunk.text_output) || outputs {
        Carries::Content
    } else {
        Carries::Other
    })
}

/// An error event in OpenAI's shape (`data: {"error": {...}}`), as its SDKs raise it.
pub fn error_event(message: &str, code: &str) -> Bytes {
    let body = serde_json::json!({
        "error": {"message": message, "type": "server_error", "param": null, "code": code}
    });
    super::sse::data_event(body.to_string().as_bytes())
}

/// An error event in Triton's generate shape (`data: {"error": "..."}`).
pub fn triton_error_event(message: &str) -> Bytes {
    super::sse::data_event(serde_json::json!({ "error": message }).to_string().as_bytes())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // in tests a failed unwrap is a failed test
mod tests {
    use super::*;

    #[test]
    fn a_request_says_its_model_whether_it_streams_and_its_tier() {
        let ask = Ask::of(br#"{"model":"llama","stream":true,"service_tier":"flex","messages":[]}"#).unwrap();
        assert_eq!(ask.model.as_deref(), Some("llama"));
        assert!(ask.stream && !ask.include_usage);
        assert_eq!(ask.service_tier.as_deref(), Some("flex"));
        let plain = Ask::of(br#"{"model":"m","input":"x","stream_options":{"include_usage":true}}"#).unwrap();
        assert!(!plain.stream && plain.include_usage);
        assert!(Ask::of(b"[1]").is_err());
        assert!(Ask::of(br#"{"model":1}"#).is_err());
    }

    #[test]
    fn a_stream_asks_for_its_usage_keeping_every_other_field() {
        let body = asking_usage(br#"{"model":"m","stream":true,"stream_options":{"x":1}}"#).unwrap();
        let v: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["stream_options"], serde_json::json!({"x": 1, "include_usage": true}));
        assert_eq!(v["model"], "m");
        assert!(asking_usage(b"[]").is_none());
    }

    #[test]
    fn usage_is_read_from_answers_chunks_and_the_responses_api() {
        let chat = br#"{"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":3,"total_tokens":10}}"#;
        assert_eq!(
            Usage::of(chat),
            Some(Usage {
                prompt: 7,
                completion: 3,
                estimated: false
            })
        );
        let done = br#"{"type":"response.completed","response":{"usage":{"input_tokens":5,"output_tokens":2}}}"#;
        assert_eq!(
            Usage::of(done),
            Some(Usage {
                prompt: 5,
                completion: 2,
                estimated: false
            })
        );
        assert_eq!(Usage::of(br#"{"choices":[{"delta":{"content":"hi"}}]}"#), None);
    }

    #[test]
    fn events_say_whether_they_carry_content() {
        let chunk = |json: &str| carries(json.as_bytes());
        assert_eq!(
            chunk(r#"{"choices":[{"delta":{"role":"assistant","content":""}}]}"#),
            Some(Carries::Other)
        );
        assert_eq!(
            chunk(r#"{"choices":[{"delta":{"content":"Hel"}}]}"#),
            Some(Carries::Content)
        );
        assert_eq!(
            chunk(r#"{"choices":[{"index":0,"text":"lo"}]}"#),
            Some(Carries::Content)
        );
        assert_eq!(
            chunk(r#"{"choices":[],"usage":{"prompt_tokens":1}}"#),
            Some(Carries::UsageOnly)
        );
        assert_eq!(
            chunk(r#"{"type":"response.output_text.delta","delta":"x"}"#),
            Some(Carries::Content)
        );
        assert_eq!(chunk(r#"{"model_name":"m","text_output":"x"}"#), Some(Carries::Content));
        assert_eq!(chunk("[DONE]"), Some(Carries::Other));
        assert_eq!(
            chunk("null"),
            Some(Carries::Other),
            "llama.cpp's first event of several prompts"
        );
        assert_eq!(chunk("not json"), None);
    }
}
