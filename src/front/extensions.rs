//! Triton's extensions beyond inference, answered alike on both doors: the repository
//! index (the models the policy routes, and whether each is ready), and what the gateway
//! refuses, each with a status and a message saying why and what to do instead: model
//! control (load, unload) and log and trace settings, which belong to the model servers
//! behind it; and shared memory, since the gateway runs on another host than its
//! clients' regions. Beside the doors, which call it from their own paths and methods.

use crate::error::{Error, Kind};

use super::pipeline::dispatch::Dispatch;
use super::ready::NotReady;

/// One model of the repository index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Indexed {
    /// The model's name, as a route of the policy serves it.
    pub name: String,
    /// Why it is not ready (every endpoint of its route's pool ejected, the gateway
    /// draining), or `None` when it is.
    pub not_ready: Option<String>,
}

impl Indexed {
    /// Its state as Triton names it: `READY` or `UNAVAILABLE`.
    pub fn state(&self) -> &'static str {
        match self.not_ready {
            None => "READY",
            Some(_) => "UNAVAILABLE",
        }
    }
}

/// The repository index: every model the policy routes, in the policy's order, ready or
/// not as the gateway's readiness says (only the ready ones when `ready`).
pub fn repository(dispatch: &Dispatch, ready: bool) -> Vec<Indexed> {
    let policy = dispatch.policy();
    let not_ready = dispatch.not_ready();
    let why = |route: &str| {
        not_ready.iter().find_map(|reason| match reason {
            NotReady::PoolEjected { route: r, .. } if r != route => None,
            NotReady::OfflineStore(_) => None,
            other => Some(other.to_string()),
        })
    };
    let mut index = Vec::new();
    for route in policy.routes() {
        let not_ready = why(&route.name);
        for model in &route.models {
            if !(ready && not_ready.is_some()) {
                index.push(Indexed {
                    name: model.clone(),
                    not_ready: not_ready.clone(),
                });
            }
        }
    }
    index
}

/// The refusal of a model load or unload.
pub fn model_control(action: &str, model: &str) -> Error {
    Error::new(
        Kind::Unsupported,
        format!(
            "tiergate does not {action} models: {model:?} is loaded and unloaded on the model servers behind it \
             (their own repository API); tiergate routes to them by its policy (tiergate policy, docs/policy.md)"
        ),
    )
}

/// The refusal of log or trace settings (`what`: "log settings", "trace settings").
pub fn settings(what: &str) -> Error {
    Error::new(
        Kind::Unsupported,
        format!(
            "tiergate does not take {what}: set them on the model servers behind it; tiergate's own logs and \
             traces are its startup settings (log.level, trace.otlp_endpoint; docs/operations.md)"
        ),
    )
}

/// Why no shared memory: the gateway's clients' regions are on another host.
const NO_SHARED_MEMORY: &str = "tiergate cannot use shared memory (the client's regions are on another host than \
                                the model servers it forwards to); send tensors' data in the request instead";

/// The status of shared-memory regions: none at all (`region: None`), or a refusal
/// for a named one, which cannot be registered.
pub fn shared_memory_status(region: Option<&str>) -> Result<(), Error> {
    match region {
        None => Ok(()),
        Some(region) => Err(Error::new(
            Kind::BadRequest,
            format!("no shared memory region {region:?} is registered: {NO_SHARED_MEMORY}"),
        )),
    }
}

/// The refusal of a shared-memory region's registration.
pub fn shared_memory_register() -> Error {
    Error::new(
        Kind::BadRequest,
        format!("shared memory regions cannot be registered: {NO_SHARED_MEMORY}"),
    )
}

/// A shared-memory endpoint that does not exist (`action`: what was asked).
pub fn shared_memory_unknown(method: &str, action: &str) -> Error {
    Error::new(
        Kind::NotFound,
        format!("no shared memory endpoint for {method} {action}: {NO_SHARED_MEMORY}"),
    )
}
