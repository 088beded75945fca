//! The startup checks that need no socket: the settings checked whole (every problem
//! with its dotted key, [`Config::validate`]), the backend allowlist and the admin
//! token read, then the policy against the allowlist. `tiergate serve --check` runs
//! them alone; [`super::Gateway::start`] runs them before it binds anything.

use crate::admin::{AuthError, Tokens};
use crate::config::{Config, Problem, Problems};
use crate::policy::{Allowlist, Policy};

use super::StartError;

/// Why the admin API is off when no token is configured.
pub(super) const NO_TOKEN: &str = "no admin token is configured (admin.token_file, or TIERGATE_ADMIN__TOKEN); \
                        set one, or admin.insecure_no_auth = true on a loopback address for a local test";

/// What the checks found usable: the allowlist and the admin API's tokens.
pub(super) struct Checked {
    pub(super) allow: Allowlist,
    pub(super) tokens: Option<Tokens>,
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
    let (allow, tokens) = match (allow, tokens) {
        (Ok(allow), Ok(tokens)) if problems.is_empty() => (allow, tokens),
        (allow, tokens) => {
            problems.extend(allow.err());
            problems.extend(tokens.err());
            return Err(StartError::Invalid(Problems(problems)));
        }
    };
    allow.check(policy).map_err(StartError::Policy)?;
    Ok(Checked { allow, tokens })
}

/// The problem `message` about `key`, which the message may already start with.
fn problem(key: &str, message: &str) -> Problem {
    Problem {
        key: key.to_owned(),
        message: message.strip_prefix(key).unwrap_or(message).trim_start().to_owned(),
    }
}
