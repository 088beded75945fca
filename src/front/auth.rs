//! Data-plane authentication: API keys, kept hashed, each mapped to a tenant.
//!
//! First on the request path, in each door. With `auth.keys_file` set, every request
//! but the health checks must carry a key (`Authorization: Bearer KEY` or
//! `x-api-key: KEY`); the key's tenant becomes the request's [`Tenant`] (for rate
//! limits, and as the owner of its offline jobs, batches and files), and the credential
//! headers are removed before anything is sent on to a backend. A missing or unknown
//! key gets 401 (UNAUTHENTICATED). Without a keys file, every request is the anonymous
//! tenant's, as before authentication existed (see docs/operations.md, "Security").
//!
//! The file holds one key a line, `TENANT:sha256:HEX` (HEX the SHA-256 of the key, so
//! the file never holds a usable key; `tiergate auth new-key TENANT` makes a key and
//! its line), `#` comments and blank lines. It is read again when it changes; a file
//! with a mistake is refused whole, every mistake with its line, and the keys in use
//! stay.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arc_swap::ArcSwap;
use http::HeaderMap;
use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;

use crate::error::{Error, Kind};
use crate::tenant::Tenant;

/// The header a key may come in instead of `Authorization: Bearer`.
pub const API_KEY: http::HeaderName = http::HeaderName::from_static("x-api-key");

/// Who may call the data plane: nobody needs a key (open), or the keys of a file.
#[derive(Debug)]
pub struct Callers {
    keys: Option<Keys>,
}

#[derive(Debug)]
struct Keys {
    file: PathBuf,
    /// SHA-256 of each key → its tenant.
    by_hash: ArcSwap<HashMap<[u8; 32], Tenant>>,
}

impl Callers {
    /// Every caller is the anonymous tenant.
    pub fn open() -> Self {
        Callers { keys: None }
    }

    /// The callers whose keys `file` holds; every mistake in it, each with its line.
    pub fn from_file(file: &Path) -> Result<Self, String> {
        let by_hash = read(file)?;
        Ok(Callers {
            keys: Some(Keys {
                file: file.to_owned(),
                by_hash: ArcSwap::from_pointee(by_hash),
            }),
        })
    }

    /// Whether requests need a key.
    pub fn required(&self) -> bool {
        self.keys.is_some()
    }

    /// The tenant `headers` authenticate as; 401 without a known key when keys are
    /// required. The credential headers are removed, so no backend sees them.
    pub fn authenticate(&self, headers: &mut HeaderMap) -> Result<Tenant, Error> {
        let Some(keys) = &self.keys else {
            return Ok(Tenant::anonymous());
        };
        let key = presented(headers);
        let tenant = key.and_then(|key| keys.by_hash.load().get(&digest(key.as_bytes())).cloned());
        let had_key = key.is_some();
        headers.remove(http::header::AUTHORIZATION);
        headers.remove(API_KEY);
        tenant.ok_or_else(|| {
            Error::new(
                Kind::Unauthenticated,
                match had_key {
                    false => "this gateway needs an API key: send `Authorization: Bearer KEY` or `x-api-key: KEY`",
                    true => "the API key is not known here (revoked, or mistyped)",
                },
            )
        })
    }

    /// Reads the keys file again whenever it changes, until `shutdown`.
    pub async fn watch(self: Arc<Self>, shutdown: CancellationToken) -> std::io::Result<()> {
        let Some(keys) = &self.keys else { return Ok(()) };
        crate::files::on_change(std::slice::from_ref(&keys.file), shutdown, || match read(&keys.file) {
            Ok(by_hash) => {
                tracing::info!(file = %keys.file.display(), keys = by_hash.len(), "API keys reloaded");
                keys.by_hash.store(Arc::new(by_hash));
            }
            Err(e) => tracing::warn!(file = %keys.file.display(), "API keys not reloaded, the keys in use stay: {e}"),
        })
        .await;
        Ok(())
    }
}

/// The key in `headers`, if any: `Authorization: Bearer KEY`, else `x-api-key`.
fn presented(headers: &HeaderMap) -> Option<&str> {
    let bearer = headers
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, key)| key.trim());
    bearer
        .or_else(|| headers.get(API_KEY).and_then(|v| v.to_str().ok()).map(str::trim))
        .filter(|k| !k.is_empty())
}

fn digest(key: &[u8]) -> [u8; 32] {
    Sha256::digest(key).into()
}

/// The line for a keys file that lets `key` in as `tenant`.
pub fn line(tenant: &str, key: &str) -> String {
    let hex: String = digest(key.as_bytes()).iter().map(|b| format!("{b:02x}")).collect();
    format!("{tenant}:sha256:{hex}")
}

/// Whether `name` is a tenant name a keys file may use.
pub fn valid_tenant(name: &str) -> bool {
    (1..=64).contains(&name.len()) && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

/// Every key in `file`, or every mistake in it.
fn read(file: &Path) -> Result<HashMap<[u8; 32], Tenant>, String> {
    let text = std::fs::read_to_string(file).map_err(|e| format!("{}: cannot read: {e}", file.display()))?;
    parse(&text).map_err(|problems| {
        problems
            .iter()
            .map(|p| format!("{}:{p}", file.display()))
            .collect::<Vec<_>>()
            .join("\n")
    })
}

/// The keys of a keys file's text, or its mistakes (`LINE: what`).
fn parse(text: &str) -> Result<HashMap<[u8; 32], Tenant>, Vec<String>> {
    let (mut keys, mut problems) = (HashMap::new(), Vec::new());
    for (i, line) in text.lines().enumerate() {
        let n = i + 1;
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut parts = line.splitn(3, ':');
        let (tenant, scheme, hex) = (parts.next(), parts.next(), parts.next());
        let (Some(tenant), Some("sha256"), Some(hex)) = (tenant, scheme, hex) else {
            problems.push(format!("{n}: expected TENANT:sha256:HEX (64 hex digits), got {line:?}"));
            continue;
        };
        if !valid_tenant(tenant) {
            problems.push(format!(
                "{n}: tenant {tenant:?} must be 1 to 64 letters, digits, '.', '_' or '-'"
            ));
            continue;
        }
        let mut hash = [0u8; 32];
        let decoded = hex.len() == 64
            && hash.iter_mut().enumerate().all(|(j, byte)| {
                u8::from_str_radix(hex.get(2 * j..2 * j + 2).unwrap_or("zz"), 16)
                    .map(|b| *byte = b)
                    .is_ok()
            });
        if !decoded {
            problems.push(format!("{n}: the hash must be 64 hex digits (SHA-256 of the key)"));
            continue;
        }
        if keys.insert(hash, Tenant::named(tenant)).is_some() {
            problems.push(format!("{n}: this key is listed twice"));
        }
    }
    match problems.is_empty() {
        true => Ok(keys),
        false => Err(problems),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(
                http::HeaderName::from_bytes(k.as_bytes()).expect("name"),
                v.parse().expect("value"),
            );
        }
        h
    }

    fn callers(text: &str) -> Callers {
        Callers {
            keys: Some(Keys {
                file: PathBuf::from("keys"),
                by_hash: ArcSwap::from_pointee(parse(text).expect("valid")),
            }),
        }
    }

    #[test]
    fn a_key_names_its_tenant_and_the_credential_goes_no_further() {
        let c = callers(&format!(
            "# team keys\n{}\n\n{}\n",
            line("team-a", "ka"),
            line("team-b", "kb")
        ));
        for pairs in [[("authorization", "Bearer ka")], [("x-api-key", "ka")]] {
            let mut h = headers(&pairs);
            assert_eq!(c.authenticate(&mut h).expect("known"), Tenant::named("team-a"));
            assert!(h.is_empty(), "the credential is removed");
        }
        let mut h = headers(&[("authorization", "bearer kb"), ("x-api-key", "ka")]);
        assert_eq!(
            c.authenticate(&mut h).expect("known"),
            Tenant::named("team-b"),
            "Bearer first"
        );
    }

    #[test]
    fn no_key_or_an_unknown_one_is_unauthenticated_and_says_what_to_send() {
        let c = callers(&line("team-a", "ka"));
        for pairs in [
            vec![],
            vec![("authorization", "Bearer nope")],
            vec![("authorization", "Basic ka")],
        ] {
            let e = c.authenticate(&mut headers(&pairs)).expect_err("refused");
            assert_eq!(e.kind, Kind::Unauthenticated, "{pairs:?}");
        }
        let e = c.authenticate(&mut HeaderMap::new()).expect_err("refused");
        assert!(e.message.contains("Authorization: Bearer KEY"), "{}", e.message);
        let open = Callers::open();
        assert_eq!(
            open.authenticate(&mut HeaderMap::new()).expect("open"),
            Tenant::anonymous()
        );
    }

    #[test]
    fn every_mistake_in_a_keys_file_is_named_with_its_line() {
        let text = format!(
            "{}\nteam-b:sha256:abc\nno colons\nbad tenant!:sha256:{}\n{}\n",
            line("team-a", "ka"),
            "0".repeat(64),
            line("team-c", "ka")
        );
        let problems = parse(&text).expect_err("invalid");
        assert_eq!(problems.len(), 4, "{problems:?}");
        for (n, what) in [(2, "64 hex"), (3, "TENANT:sha256:HEX"), (4, "tenant"), (5, "twice")] {
            assert!(
                problems
                    .iter()
                    .any(|p| p.starts_with(&format!("{n}: ")) && p.contains(what)),
                "{problems:?}"
            );
        }
    }
}
