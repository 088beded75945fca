//! An LLM call fitted to its route's token rules before it is sent or reserved for:
//! its `max_tokens` and `n` held to the route's ceilings (refused, or clamped where the
//! route says `clamp = true`), the route's `default_max_tokens` sent where it names
//! none, and the tokens it reserves worked out from what is sent.

use crate::llm::tokens::{default_key, rewritten, Asked};
use crate::policy::tokens::TokenRules;

/// An LLM call fitted to a route's rules: the body to send, and the tokens it reserves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fitted {
    /// The body: at the ceilings where it asked past them (with `clamp`), with the
    /// route's `default_max_tokens` where it named none; else as it came.
    pub body: bytes::Bytes,
    /// Its prompt's estimate, and `max_tokens` for each choice of each prompt.
    pub tokens: u64,
}

/// Why a call does not fit: the field at fault, and what to change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unfit {
    /// The body's field at fault, when one is.
    pub param: Option<&'static str>,
    /// What is wrong, and what to ask instead.
    pub message: String,
}

/// `body`, a call to OpenAI's `path` on `route`, fitted to the route's `rules`.
pub fn fit(rules: &TokenRules, route: &str, path: &str, body: bytes::Bytes) -> Result<Fitted, Unfit> {
    let asked = Asked::of(&body).map_err(|message| Unfit { param: None, message })?;
    let generates = path != "/v1/embeddings";
    let mut max_tokens = asked.max_tokens;
    if let (Some(ceiling), Some((key, n))) = (rules.max_tokens, max_tokens) {
        if n > ceiling {
            if !rules.clamp {
                return Err(Unfit {
                    param: Some(key),
                    message: format!(
                        "{key} = {n} is above route {route}'s ceiling tokens.max_tokens = {ceiling}: ask for {ceiling} or fewer"
                    ),
                });
            }
            max_tokens = Some((key, ceiling));
        }
    }
    let mut n = None;
    if let (Some(ceiling), Some(asked)) = (rules.max_n, asked.n) {
        if asked > ceiling {
            if !rules.clamp {
                return Err(Unfit {
                    param: Some("n"),
                    message: format!(
                        "n = {asked} is above route {route}'s ceiling tokens.max_n = {ceiling}: ask for {ceiling} choices or fewer"
                    ),
                });
            }
            n = Some(ceiling);
        }
    }
    // What is sent: the ceiling in place of more, the default where none is named.
    let send = generates.then(|| max_tokens.unwrap_or((default_key(path), rules.default_max_tokens)));
    let tokens = asked.reserve(
        rules.prompt_bytes_per_token,
        send.map_or(0, |(_, m)| m),
        n.or(asked.n).unwrap_or(1),
    );
    let body = match (send.filter(|m| Some(*m) != asked.max_tokens), n) {
        (None, None) => body,
        (m, n) => rewritten(&body, m, n).unwrap_or(body),
    };
    Ok(Fitted { body, tokens })
}
