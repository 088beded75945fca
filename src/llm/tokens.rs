//! The tokens an OpenAI call may use, read from its body before it is sent: its
//! `max_tokens` (or `max_completion_tokens`, or the Responses API's
//! `max_output_tokens`), its `n`, how many prompts it generates for (a completions
//! call's prompt list), and an estimate of its prompt's tokens from the bytes of its
//! text. What a route's token limits reserve ([`Asked::reserve`]), and the body
//! rewritten to a route's ceilings or default ([`rewritten`]).

use bytes::Bytes;
use serde_json::Value;

/// The keys a call names its completion tokens' limit by, in the order they are read.
const MAX_KEYS: [&str; 3] = ["max_completion_tokens", "max_tokens", "max_output_tokens"];

/// What an OpenAI call asks for, as far as its tokens go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Asked {
    /// Its `max_tokens` (by whichever key it named it), if it named one.
    pub max_tokens: Option<(&'static str, u64)>,
    /// Its `n` (choices per prompt), if it named one.
    pub n: Option<u64>,
    /// Generations per choice: a completions call's prompt list's length, else 1.
    pub prompts: u64,
    /// Bytes of its prompt's text (messages' contents, prompt, input, instructions).
    pub prompt_bytes: u64,
    /// Messages or input items, each counted a few tokens of template.
    pub items: u64,
}

impl Asked {
    /// What the JSON `body` asks for; an error naming a field of the wrong type.
    pub fn of(body: &[u8]) -> Result<Asked, String> {
        let value: Value =
            serde_json::from_slice(body).map_err(|e| format!("the request body is not an OpenAI request: {e}"))?;
        let mut max_tokens = None;
        for key in MAX_KEYS {
            match value.get(key) {
                None | Some(Value::Null) => {}
                Some(v) => match v.as_u64() {
                    Some(n) if max_tokens.is_none() => max_tokens = Some((key, n)),
                    Some(_) => {}
                    None => return Err(format!("{key} must be a whole number of tokens, got {v}")),
                },
            }
        }
        let n = match value.get("n") {
            None | Some(Value::Null) => None,
            Some(v) => Some(
                v.as_u64()
                    .filter(|n| *n >= 1)
                    .ok_or(format!("n must be 1 or more, got {v}"))?,
            ),
        };
        let prompts = match value.get("prompt") {
            Some(Value::Array(list)) if list.first().is_some_and(|p| !p.is_number()) => list.len().max(1) as u64,
            _ => 1,
        };
        let mut prompt_bytes = 0u64;
        let mut items = 0u64;
        for key in ["messages", "prompt", "input", "instructions"] {
            if let Some(v) = value.get(key) {
                if let Value::Array(list) = v {
                    items += list.len() as u64;
                }
                prompt_bytes += text_bytes(v);
            }
        }
        Ok(Asked {
            max_tokens,
            n,
            prompts,
            prompt_bytes,
            items,
        })
    }

    /// The prompt's tokens as estimated: its text's bytes over `bytes_per_token`
    /// (rounded up), and four tokens of template a message.
    pub fn prompt_estimate(&self, bytes_per_token: u64) -> u64 {
        self.prompt_bytes
            .div_ceil(bytes_per_token.max(1))
            .saturating_add(self.items.saturating_mul(4))
    }

    /// The tokens the call is held to: its prompt's estimate, and `each` completion
    /// tokens for each of `n` choices of each prompt.
    pub fn reserve(&self, bytes_per_token: u64, each: u64, n: u64) -> u64 {
        self.prompt_estimate(bytes_per_token)
            .saturating_add(each.saturating_mul(n).saturating_mul(self.prompts))
    }
}

/// The bytes of text in `v`: its strings (a token list counts one byte a token), in
/// any depth of lists and objects (a message's `content` parts), not its keys.
fn text_bytes(v: &Value) -> u64 {
    match v {
        Value::String(s) => s.len() as u64,
        Value::Number(_) => 1,
        Value::Array(list) => list.iter().map(text_bytes).sum(),
        Value::Object(map) => map
            .iter()
            .filter(|(k, _)| !matches!(k.as_str(), "role" | "type" | "name"))
            .map(|(_, v)| text_bytes(v))
            .sum(),
        Value::Null | Value::Bool(_) => 0,
    }
}

/// `body` with its completion tokens' limit set to `max_tokens` under `key` and its `n`
/// to `n`, each when given; `None` when it is not a JSON object.
pub fn rewritten(body: &[u8], max_tokens: Option<(&str, u64)>, n: Option<u64>) -> Option<Bytes> {
    super::openai::edited(body, |object| {
        if let Some((key, max_tokens)) = max_tokens {
            object.insert(key.to_owned(), Value::from(max_tokens));
        }
        if let Some(n) = n {
            object.insert("n".into(), Value::from(n));
        }
        Some(())
    })
}

/// The key a call on `path` names its completion tokens' limit by when it names none.
pub fn default_key(path: &str) -> &'static str {
    match path {
        "/v1/responses" => "max_output_tokens",
        _ => "max_tokens",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_what_a_call_may_use() {
        let chat = br#"{"model":"m","max_completion_tokens":50,"n":2,
            "messages":[{"role":"system","content":"be brief"},{"role":"user","content":[{"type":"text","text":"hello there"}]}]}"#;
        let asked = Asked::of(chat).expect("reads");
        assert_eq!(asked.max_tokens, Some(("max_completion_tokens", 50)));
        assert_eq!(
            (asked.n, asked.prompts, asked.prompt_bytes, asked.items),
            (Some(2), 1, 19, 2)
        );
        // 19 bytes at 4 a token: 5, and 4 a message: 13; then 50 for each of 2 choices.
        assert_eq!(asked.reserve(4, 50, 2), 113);
        let completions = br#"{"model":"m","prompt":["a b","c"]}"#;
        let asked = Asked::of(completions).expect("reads");
        assert_eq!((asked.max_tokens, asked.prompts), (None, 2));
        assert_eq!(asked.reserve(1, 16, 1), 4 + 8 + 32);
        // A prompt of token ids is one prompt, a byte a token.
        let ids = Asked::of(br#"{"model":"m","prompt":[1,2,3],"max_tokens":1}"#).expect("reads");
        assert_eq!((ids.prompts, ids.prompt_bytes), (1, 3));
        let bad = Asked::of(br#"{"model":"m","max_tokens":"lots"}"#).expect_err("a string");
        assert!(bad.contains("max_tokens must be a whole number"), "{bad}");
        assert!(Asked::of(br#"{"model":"m","n":0}"#).is_err());
    }

    #[test]
    fn a_body_is_rewritten_to_a_ceiling() {
        let body = rewritten(
            br#"{"model":"m","max_tokens":900,"n":8}"#,
            Some(("max_tokens", 100)),
            Some(2),
        )
        .expect("json");
        let v: Value = serde_json::from_slice(&body).expect("json");
        assert_eq!((v["max_tokens"].as_u64(), v["n"].as_u64()), (Some(100), Some(2)));
        assert_eq!(default_key("/v1/responses"), "max_output_tokens");
    }
}
