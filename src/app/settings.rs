//! The startup checks that need no socket: settings that must agree with each other,
//! the policy against the backend allowlist, the admin token. `tiergate serve --check`
//! runs them alone; [`super::Gateway::start`] runs them first.

use crate::admin::Tokens;
use crate::config::Config;
use crate::policy::{Allowlist, Policy};

use super::StartError;

/// Why the admin API is off when no token is configured.
pub(super) const NO_TOKEN: &str = "no admin token is configured (admin.token_file, or TIERGATE_ADMIN__TOKEN); \
                        set one, or admin.insecure_no_auth = true on a loopback address for a local test";

/// The admin API's tokens, checking that it does not share a port with a data listener.
pub(super) fn admin_tokens(config: &Config) -> Result<Option<Tokens>, StartError> {
    let tokens =
        Tokens::from_settings(&config.admin, config.listen.admin).map_err(|e| StartError::Settings(e.to_string()))?;
    let l = &config.listen;
    let shared = [Some(l.http), Some(l.grpc), Some(l.metrics), l.bulk_http, l.bulk_grpc]
        .into_iter()
        .flatten()
        .any(|data| data.port() != 0 && data.port() == l.admin.port());
    if tokens.is_some() && shared {
        return Err(StartError::Settings(format!(
            "listen.admin ({}) shares a port with a data or metrics listener; the admin API needs its own",
            l.admin
        )));
    }
    Ok(tokens)
}

/// Checks what `config` and `policy` must agree on before anything starts: the policy's
/// pools inside the backend allowlist, thread priorities and CPU lists, the budget
/// reserve, the stop's timings, and the admin API's token and port.
pub fn check(config: &Config, policy: &Policy) -> Result<(), StartError> {
    let allow = Allowlist::parse(&config.backends.allow).map_err(StartError::Settings)?;
    allow.check(policy).map_err(StartError::Policy)?;
    let threads = &config.threads;
    let nice = threads.batch_nice;
    if !(0..=19).contains(&nice) {
        return Err(StartError::Settings(format!(
            "threads.batch_nice is {nice}: give a nice value from 0 (the real-time threads' priority) to 19 (the lowest)"
        )));
    }
    for (cpus, setting) in [
        (&threads.batch_cpus, "threads.batch_cpus"),
        (&threads.realtime_cpus, "threads.realtime_cpus"),
    ] {
        cpus.check(setting).map_err(StartError::Settings)?;
    }
    let reserve = config.limits.budget_reserve;
    if !(0.0..=0.5).contains(&reserve) {
        return Err(StartError::Settings(format!(
            "limits.budget_reserve is {reserve}: give the share of each budget to keep back, from 0 to 0.5"
        )));
    }
    let stop = &config.shutdown;
    if stop.drain_delay >= stop.timeout {
        return Err(StartError::Settings(format!(
            "shutdown.drain_delay ({:?}) must be shorter than shutdown.timeout ({:?}): the drain happens within the timeout",
            stop.drain_delay, stop.timeout
        )));
    }
    admin_tokens(config).map(|_| ())
}
