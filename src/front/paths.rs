//! The paths the HTTP door answers: what a request path asks for ([`target`]), which
//! route serves an infer path ([`route_for`]), and the offline tier's API paths. A leaf
//! under the HTTP door and the Batch API.

use std::sync::Arc;

use crate::policy::{Policy, Route};

/// Where the offline jobs' answers are (`/v1/jobs/{id}`).
pub const JOBS: &str = "/v1/jobs/";
/// The Batch API's files.
pub const FILES: &str = "/v1/files";
/// The Batch API's batches.
pub const BATCHES: &str = "/v1/batches";

/// What a request path asks for.
#[derive(Debug, PartialEq, Eq)]
pub enum Target<'a> {
    /// `/v2/health/live`.
    Live,
    /// `/v2/health/ready`.
    Ready,
    /// `/v2`: server metadata.
    Server,
    /// `/v2/models/{name}[/versions/{v}]` followed by `rest` ("", "/ready", "/infer", ...).
    Model {
        /// The model name.
        name: &'a str,
        /// What follows it (the version part left out).
        rest: &'a str,
    },
    /// `/v2/models/stats`: every model's statistics (as Triton; no model is "stats").
    AllStats,
    /// Triton's shared-memory extension (`/v2/systemsharedmemory/...` and
    /// `/v2/cudasharedmemory/...`), which the gateway cannot offer.
    SharedMemory {
        /// The region named, if any.
        region: Option<&'a str>,
        /// `status`, `register` or `unregister` (anything else: unknown).
        action: &'a str,
    },
    /// `/v2/repository/index`: the models the policy routes.
    RepositoryIndex,
    /// `/v2/repository/models/{name}/load` or `/unload` (`action`; anything else too).
    ModelControl {
        /// The model named.
        name: &'a str,
        /// What was asked of it.
        action: &'a str,
    },
    /// `/v2/logging`, `/v2/trace/setting` (`what`: "log settings", "trace settings").
    Settings {
        /// Which settings.
        what: &'static str,
    },
    /// Anything else: a JSON route if the policy has one for this exact path.
    Other(&'a str),
}

/// Whether `path` belongs to the offline tier's API.
pub fn offline_path(path: &str) -> bool {
    path.starts_with(JOBS)
        || [FILES, BATCHES]
            .iter()
            .any(|p| path == *p || path.strip_prefix(p).is_some_and(|rest| rest.starts_with('/')))
}

/// The route serving `path` (a KServe v2 infer path or a JSON route's path).
pub fn route_for(policy: &Policy, path: &str) -> Option<Arc<Route>> {
    match target(path) {
        Target::Model { name, rest: "/infer" } => policy.route_for_model(name).cloned(),
        Target::Other(p) => policy.route_for_path(p).cloned(),
        _ => None,
    }
}

/// A path that is not a model's: Triton's repository, logging, trace or shared-memory
/// extensions, or anything else.
fn other(path: &str) -> Target<'_> {
    match path {
        "/v2/repository/index" => return Target::RepositoryIndex,
        "/v2/logging" => return Target::Settings { what: "log settings" },
        "/v2/trace/setting" => return Target::Settings { what: "trace settings" },
        _ => {}
    }
    if let Some(tail) = path.strip_prefix("/v2/repository/models/") {
        let (name, action) = tail.rsplit_once('/').unwrap_or((tail, ""));
        return Target::ModelControl { name, action };
    }
    let shared = ["/v2/systemsharedmemory", "/v2/cudasharedmemory"];
    let Some(tail) = shared.iter().find_map(|p| path.strip_prefix(p)) else {
        return Target::Other(path);
    };
    let tail = tail.trim_start_matches('/');
    let (region, action) = match tail.strip_prefix("region/") {
        Some(named) => match named.rsplit_once('/') {
            Some((region, action)) => (Some(region), action),
            None => (Some(named), ""),
        },
        None => (None, tail),
    };
    Target::SharedMemory { region, action }
}

/// Splits a request path into what it asks for.
pub fn target(path: &str) -> Target<'_> {
    match path {
        "/v2/health/live" => return Target::Live,
        "/v2/health/ready" => return Target::Ready,
        "/v2" | "/v2/" => return Target::Server,
        "/v2/models/stats" => return Target::AllStats,
        _ => {}
    }
    let Some(tail) = path.strip_prefix("/v2/models/") else {
        return other(path);
    };
    let (name, mut rest) = tail.split_at(tail.find('/').unwrap_or(tail.len()));
    if let Some(after) = rest.strip_prefix("/versions/") {
        rest = &after[after.find('/').unwrap_or(after.len())..];
    }
    if name.is_empty() {
        return Target::Other(path);
    }
    Target::Model { name, rest }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths() {
        let model = |name, rest| Target::Model { name, rest };
        let cases = [
            ("/v2/health/live", Target::Live),
            ("/v2/health/ready", Target::Ready),
            ("/v2", Target::Server),
            ("/v2/models/stats", Target::AllStats),
            (
                "/v2/systemsharedmemory/region/r1/register",
                Target::SharedMemory {
                    region: Some("r1"),
                    action: "register",
                },
            ),
            (
                "/v2/cudasharedmemory/status",
                Target::SharedMemory {
                    region: None,
                    action: "status",
                },
            ),
            ("/v2/models/resnet", model("resnet", "")),
            ("/v2/models/resnet/ready", model("resnet", "/ready")),
            ("/v2/models/resnet/infer", model("resnet", "/infer")),
            ("/v2/models/resnet/versions/3", model("resnet", "")),
            ("/v2/models/resnet/versions/3/infer", model("resnet", "/infer")),
            ("/v2/models/resnet/versions/3/ready", model("resnet", "/ready")),
            ("/v2/models/resnet/config", model("resnet", "/config")),
            ("/v2/models/", Target::Other("/v2/models/")),
            ("/v2/repository/index", Target::RepositoryIndex),
            (
                "/v2/repository/models/resnet/load",
                Target::ModelControl {
                    name: "resnet",
                    action: "load",
                },
            ),
            ("/v2/logging", Target::Settings { what: "log settings" }),
            ("/v2/trace/setting", Target::Settings { what: "trace settings" }),
            ("/v1/embeddings", Target::Other("/v1/embeddings")),
        ];
        for (path, want) in cases {
            assert_eq!(target(path), want, "{path}");
        }
    }
}
