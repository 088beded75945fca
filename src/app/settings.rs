//! The startup checks that need no socket: the settings checked whole (every problem
//! with its dotted key, [`Config::validate`]), the backend allowlist, the admin token,
//! the data plane's API keys, the TLS certificate and the backends' CA certificates
//! read, then the policy against the allowlist. `tiergate serve --check` runs
//! them alone; [`super::Gateway::start`] runs them before it binds anything.

use crate::admin::{AuthError, Tokens};
use crate::backend::Trust;
use crate::config::{Config, Problem, Problems};
use std::sync::Arc;

use tokio_rustls::TlsAcceptor;

use crate::front::auth::Callers;
use crate::policy::{Allowlist, Policy};
use crate::server::tls::{Certificate, GRPC_ALPN, HTTP_ALPN};

use super::StartError;

/// Why the admin API is off when no token is configured.
pub(super) const NO_TOKEN: &str = "no admin token is configured (admin.token_file, or TIERGATE_ADMIN__TOKEN); \
                        set one, or admin.insecure_no_auth = true on a loopback address for a local test";

/// What the checks found usable: the allowlist, the admin API's tokens, the data
/// plane's callers, the listeners' TLS and whom TLS backends must prove themselves to.
pub(super) struct Checked {
    pub(super) allow: Allowlist,
    pub(super) trust: Trust,
    pub(super) tokens: Option<Tokens>,
    pub(super) callers: Callers,
    pub(super) tls: Option<Tls>,
}

/// The listeners' TLS: the certificate, and an acceptor for each kind of listener.
pub(super) struct Tls {
    pub(super) certificate: Arc<Certificate>,
    pub(super) http: TlsAcceptor,
    pub(super) grpc: TlsAcceptor,
    pub(super) admin: TlsAcceptor,
}

/// The TLS `config` asks for, read and checked; `None` when it is off.
fn tls(config: &Config) -> Result<Option<Tls>, Problem> {
    let (Some(cert), Some(key)) = (&config.tls.cert_file, &config.tls.key_file) else {
        return Ok(None);
    };
    let certificate = Certificate::load(cert, key).map_err(|m| problem("tls.cert_file", &m))?;
    let http = certificate.acceptor(&HTTP_ALPN, None).map_err(|m| problem("tls", &m))?;
    let grpc = certificate.acceptor(&GRPC_ALPN, None).map_err(|m| problem("tls", &m))?;
    let admin = certificate
        .acceptor(&HTTP_ALPN, config.admin.client_ca_file.as_deref())
        .map_err(|m| problem("admin.client_ca_file", &m))?;
    Ok(Some(Tls {
        certificate,
        http,
        grpc,
        admin,
    }))
}

/// Checks `config` whole, then `policy` against its backend allowlist.
pub fn check(config: &Config, policy: &Policy) -> Result<(), StartError> {
    checked(config, policy).map(|_| ())
}

/// [`check`], keeping what it read.
pub(super) fn checked(config: &Config, policy: &Policy) -> Result<Checked, StartError> {
    let mut problems = config.validate().err().map_or_else(Vec::new, |p| p.0);
    let allow = Allowlist::parse(&config.backends.allow).map_err(|message| problem("backends.allow", &message));
    let tokens = Tokens::from_settings(&config.admin, config.listen.admin).map_err(|e| {
        let key = match e {
            AuthError::TokenFile(_) => "admin.token_file",
            AuthError::Weak(_) => "admin.token",
            AuthError::InsecureExposed(_) => "admin.insecure_no_auth",
        };
        problem(key, &e.to_string())
    });
    let callers = match &config.auth.keys_file {
        None => Ok(Callers::open()),
        Some(file) => Callers::from_file(file).map_err(|message| problem("auth.keys_file", &message)),
    };
    let trust = match &config.backends.ca_file {
        None => Ok(Trust::platform()),
        Some(file) => Trust::from_file(file).map_err(|message| problem("backends.ca_file", &message)),
    };
    // TLS only once the settings hold together (both files, or neither).
    let tls = match problems.is_empty() {
        true => tls(config),
        false => Ok(None),
    };
    let (allow, trust, tokens, callers, tls) = match (allow, trust, tokens, callers, tls) {
        (Ok(allow), Ok(trust), Ok(tokens), Ok(callers), Ok(tls)) if problems.is_empty() => {
            (allow, trust, tokens, callers, tls)
        }
        (allow, trust, tokens, callers, tls) => {
            problems.extend(allow.err());
            problems.extend(trust.err());
            problems.extend(tokens.err());
            problems.extend(callers.err());
            problems.extend(tls.err());
            return Err(StartError::Invalid(Problems(problems)));
        }
    };
    allow.check(policy).map_err(StartError::Policy)?;
    Ok(Checked {
        allow,
        trust,
        tokens,
        callers,
        tls,
    })
}

/// The problem `message` about `key`, which the message may already start with.
fn problem(key: &str, message: &str) -> Problem {
    Problem {
        key: key.to_owned(),
        message: message.strip_prefix(key).unwrap_or(message).trim_start().to_owned(),
    }
}
