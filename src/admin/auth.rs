//! Who may use the admin API: bearer tokens, compared in constant time.

use std::net::SocketAddr;

use http::HeaderMap;
use subtle::ConstantTimeEq;

use crate::config;
use crate::headers;

/// Shortest token accepted: anything shorter is guessable.
pub const MIN_TOKEN_BYTES: usize = 16;

/// The accepted tokens, each with the name the audit log gives its holder.
#[derive(Clone)]
pub struct Tokens {
    named: Vec<(String, Vec<u8>)>,
    open: bool,
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.named.iter().map(|(n, _)| n.as_str()).collect();
        f.debug_struct("Tokens")
            .field("names", &names)
            .field("open", &self.open)
            .finish()
    }
}

/// Why the admin API cannot start as configured.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    /// The token file could not be read or holds a bad line.
    #[error("admin.token_file {0}")]
    TokenFile(String),
    /// A token is too short.
    #[error("admin token {0:?} is shorter than {MIN_TOKEN_BYTES} bytes; use a long random one (e.g. `openssl rand -hex 32`)")]
    Weak(String),
    /// Unauthenticated mode on an address that is not loopback.
    #[error(
        "admin.insecure_no_auth is only allowed on a loopback address, not {0}; configure admin.token_file instead"
    )]
    InsecureExposed(SocketAddr),
}

impl Tokens {
    /// The tokens `settings` configure for an admin API on `addr`; `None` when none is
    /// configured and unauthenticated mode is off (the admin API then stays off).
    pub fn from_settings(settings: &config::Admin, addr: SocketAddr) -> Result<Option<Tokens>, AuthError> {
        let mut named = Vec::new();
        if let Some(path) = &settings.token_file {
            let text =
                std::fs::read_to_string(path).map_err(|e| AuthError::TokenFile(format!("{}: {e}", path.display())))?;
            for (i, line) in text.lines().enumerate() {
                let line = line.trim();
                if line.is_empty() || line.starts_with('#') {
                    continue;
                }
                let (name, token) = line.split_once(':').unwrap_or(("admin", line));
                let (name, token) = (name.trim(), token.trim());
                if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b"_-.@".contains(&b)) {
                    return Err(AuthError::TokenFile(format!(
                        "{} line {}: write `name:token` with a name of letters, digits, '_', '-', '.', '@'",
                        path.display(),
                        i + 1
                    )));
                }
                named.push((name.to_owned(), token.as_bytes().to_vec()));
            }
        }
        if let Some(token) = &settings.token {
            named.push(("admin".to_owned(), token.0.trim().as_bytes().to_vec()));
        }
        for (name, token) in &named {
            if token.len() < MIN_TOKEN_BYTES {
                return Err(AuthError::Weak(name.clone()));
            }
        }
        if !named.is_empty() {
            return Ok(Some(Tokens { named, open: false }));
        }
        if settings.insecure_no_auth {
            if !addr.ip().is_loopback() {
                return Err(AuthError::InsecureExposed(addr));
            }
            return Ok(Some(Tokens { named, open: true }));
        }
        Ok(None)
    }

    /// Whether anyone on the loopback address may call the admin API.
    pub fn is_open(&self) -> bool {
        self.open
    }

    /// Who `headers` authenticate as (`token-name` or `token-name (actor)`), if anyone.
    pub fn who(&self, headers: &HeaderMap) -> Option<String> {
        let name = if self.open {
            "unauthenticated".to_owned()
        } else {
            let presented = headers
                .get(http::header::AUTHORIZATION)?
                .to_str()
                .ok()?
                .strip_prefix("Bearer ")?
                .trim()
                .as_bytes();
            // Compare against every token, without stopping early.
            let mut found = None;
            for (name, token) in &self.named {
                if bool::from(token.as_slice().ct_eq(presented)) && found.is_none() {
                    found = Some(name.clone());
                }
            }
            found?
        };
        let actor = headers
            .get(headers::ACTOR)
            .and_then(|v| v.to_str().ok())
            .map(|a| a.trim())
            .filter(|a| !a.is_empty() && a.len() <= 64 && a.bytes().all(|b| b.is_ascii_graphic() || b == b' '));
        Some(match actor {
            Some(actor) => format!("{name} ({actor})"),
            None => name,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(token: Option<&str>, insecure: bool) -> config::Admin {
        config::Admin {
            token: token.map(|t| config::Secret(t.to_owned())),
            insecure_no_auth: insecure,
            ..config::Admin::default()
        }
    }

    fn bearer(token: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(
            http::header::AUTHORIZATION,
            format!("Bearer {token}").parse().expect("value"),
        );
        h
    }

    #[test]
    fn tokens_names_and_refusals() {
        let loopback: SocketAddr = "127.0.0.1:8003".parse().expect("addr");
        let tokens = Tokens::from_settings(&settings(Some("0123456789abcdef0"), false), loopback)
            .expect("valid")
            .expect("on");
        assert_eq!(tokens.who(&bearer("0123456789abcdef0")).as_deref(), Some("admin"));
        assert_eq!(tokens.who(&bearer("0123456789abcdef1")), None);
        assert_eq!(tokens.who(&bearer("0123")), None);
        assert_eq!(tokens.who(&HeaderMap::new()), None);
        let mut with_actor = bearer("0123456789abcdef0");
        with_actor.insert(headers::ACTOR, "alice".parse().expect("value"));
        assert_eq!(tokens.who(&with_actor).as_deref(), Some("admin (alice)"));

        assert!(
            Tokens::from_settings(&settings(None, false), loopback)
                .expect("ok")
                .is_none(),
            "off"
        );
        assert!(matches!(
            Tokens::from_settings(&settings(Some("short"), false), loopback),
            Err(AuthError::Weak(_))
        ));
        let open = Tokens::from_settings(&settings(None, true), loopback)
            .expect("ok")
            .expect("on");
        assert_eq!(open.who(&HeaderMap::new()).as_deref(), Some("unauthenticated"));
        let exposed: SocketAddr = "0.0.0.0:8003".parse().expect("addr");
        assert!(matches!(
            Tokens::from_settings(&settings(None, true), exposed),
            Err(AuthError::InsecureExposed(_))
        ));
    }

    #[test]
    fn a_token_file_names_its_holders() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("tokens");
        std::fs::write(&file, "# ops team\nalice:aaaaaaaaaaaaaaaaaaaa\nbbbbbbbbbbbbbbbbbbbb\n").expect("write");
        let settings = config::Admin {
            token_file: Some(file),
            ..config::Admin::default()
        };
        let tokens = Tokens::from_settings(&settings, "127.0.0.1:1".parse().expect("addr"))
            .expect("valid")
            .expect("on");
        assert_eq!(tokens.who(&bearer("aaaaaaaaaaaaaaaaaaaa")).as_deref(), Some("alice"));
        assert_eq!(tokens.who(&bearer("bbbbbbbbbbbbbbbbbbbb")).as_deref(), Some("admin"));
        assert!(!format!("{tokens:?}").contains("aaaa"), "tokens never print");
    }
}
