//! The admin API: read and change the running policy, over its own listener.
//!
//! Beside the request path, on `listen.admin` (127.0.0.1:8003 by default) and never on
//! a data port. Every request needs a bearer token (see [`auth`]) before anything else,
//! so an unauthenticated caller learns nothing, not even which paths exist; the one
//! exception is the console's page ([`console`]), which holds no data. Changes go
//! through [`Control`]: validated whole (400 with every problem and its path), checked
//! against `If-Match` (412 when stale), written back to the policy files, versioned and
//! audited; `?dry_run=true` reports the diff and the decisions that would change.
//!
//! | Method and path | Does |
//! |---|---|
//! | `GET /admin/policy` | version, ETag, files, routes |
//! | `PUT /admin/policy/files/{name}.toml` | replace or add a policy file (TOML body) |
//! | `GET /admin/policy/history` | kept versions: time, who, action |
//! | `GET /admin/policy/history/{version}/diff` | what a version changed: a unified diff against the version before it |
//! | `POST /admin/policy/rollback` | `{"version": N}`: restore version N as a new version |
//! | `GET /admin/routes`, `GET /admin/flags` | every route with its flags |
//! | `GET/PUT/PATCH /admin/routes/{name}` | one route; replace; JSON merge patch |
//! | `PUT /admin/routes/{name}/flags/{flag}` | `true`/`false`/`"on"`/`"off"` or a percent |
//! | `POST /admin/explain` | the decision for a described request, nothing sent |
//! | `GET /admin/shadow/{name}[?since=T]` | what the route's shadow found since its report was reset (or since `T`: an RFC 3339 time or a duration ago) |
//! | `POST /admin/shadow/{name}/reset` | start the report afresh |
//! | `POST /admin/shadow/{name}/promote` | the candidate becomes the route's pool (`?force=true` past the gate) |
//! | `GET /admin/ui/` | the console (its page needs no token; every call it makes does) |
//! | `GET /admin/stats[?since=T]` | every `tiergate_*` series once a second, the last 15 minutes (since `T`: unix ms or a duration ago) |
//! | `GET /admin/cache/{name}` | the route's cache: settings, entries, bytes |
//! | `POST /admin/cache/{name}/invalidate` | drop every entry of the route's cache |
//! | `GET /admin/batching` | every micro-batch route: size limit, learned cost and its error, rows waiting by band and tenant, tenants' shares served against their weights |
//! | `GET /admin/backends` | every pool's endpoints (real-time, batch, shadow candidate, fallback): circuit, failures, in flight, latency, last check |
//! | `GET /admin/offline[?after=ID&limit=N]` | jobs by state, the oldest queued job, every tenant's batches with their progress |
//! | `POST /admin/batches/{id}/cancel` | cancel any tenant's batch, as its owner would |

pub mod auth;
mod backends;
mod batching;
pub mod console;
mod offline;
mod shadow;
pub mod stats;
mod tokens;
mod usage;
pub mod views;

use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::control::{policy_etag, Control, Edit, Outcome, Refused};
use crate::metrics;
use crate::shadow::Shadow;
use crate::tiers::MicroBatch;
pub use auth::{AuthError, Tokens};

/// Largest admin request body: a policy file or a route.
const MAX_BODY: usize = 4 << 20;
/// How long an admin request body may take to arrive.
const BODY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);
/// Flags `PUT /admin/routes/{name}/flags/{flag}` sets.
const FLAGS: [&str; 6] = [
    "realtime",
    "micro_batch",
    "offline",
    "micro_batch_percent",
    "shadow",
    "cache",
];

/// The admin API of one gateway.
#[derive(Debug, Clone)]
pub struct Admin {
    /// Where changes go.
    pub control: Arc<Control>,
    /// Who may call.
    pub tokens: Tokens,
    /// The micro-batch tier, for the learned cost in explanations and its pools.
    pub micro_batch: MicroBatch,
    /// The real-time tier, for its pools.
    pub realtime: crate::tiers::Realtime,
    /// The routes' shadow candidates, for their reports and promotion.
    pub shadow: Shadow,
    /// The dispatch: the routes' prediction caches (to look into and invalidate), the
    /// usage ledger and capacity signal, the fallback pools.
    pub dispatch: Arc<crate::front::pipeline::dispatch::Dispatch>,
    /// The last 15 minutes of the gateway's series, for the console.
    pub stats: Arc<stats::Stats>,
    /// The offline queue, to list and cancel every tenant's batches.
    pub queue: crate::queue::Queue,
}

/// Serves the admin API on `listener` (over `tls` when given) until `shutdown`.
pub async fn listen(
    listener: TcpListener,
    admin: Arc<Admin>,
    tls: Option<tokio_rustls::TlsAcceptor>,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    if admin.tokens.is_open() {
        tracing::warn!(addr = %listener.local_addr()?, "the admin API is UNAUTHENTICATED (admin.insecure_no_auth): anyone on this host can change the policy");
    }
    let answer = move |req: Request<crate::server::Incoming>| {
        let admin = admin.clone();
        async move { admin.answer(req).await }
    };
    crate::server::listen(
        listener,
        crate::server::Connections::small(64).with_tls(tls),
        (shutdown.clone(), shutdown),
        answer,
    )
    .await
}

impl Admin {
    /// Answers one admin request (any body type, so tests drive it without a socket).
    pub async fn answer<B: crate::front::http::RequestBody>(&self, req: Request<B>) -> Response<Full<Bytes>> {
        // One name for each thing: a path with `.` or `..` segments, empty ones or
        // escaped separators names nothing here, whatever a resolver would make of it.
        if !plain_path(req.uri().path()) {
            ::metrics::counter!(metrics::ADMIN_REFUSALS, "reason" => "path").increment(1);
            let message = "the path has '.' or '..' segments, empty segments or escaped separators; send it plainly";
            return error(StatusCode::BAD_REQUEST, "bad_path", message);
        }
        // The console's page (no data in it: everything it shows is asked with the token).
        if req.method() == Method::GET && req.uri().query().is_none() {
            if let Some(page) = console::asset(req.uri().path()) {
                return page;
            }
        }
        let Some(who) = self.tokens.who(req.headers()) else {
            ::metrics::counter!(metrics::ADMIN_REFUSALS, "reason" => "unauthenticated").increment(1);
            let mut r = error(
                StatusCode::UNAUTHORIZED,
                "unauthenticated",
                "send Authorization: Bearer <admin token>",
            );
            r.headers_mut().insert(
                http::header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"tiergate-admin\""),
            );
            return r;
        };
        let (head, body) = req.into_parts();
        let read = tokio::time::timeout(BODY_TIMEOUT, Limited::new(body, MAX_BODY).collect());
        let body = match read.await {
            Ok(Ok(b)) => b.to_bytes(),
            Err(_) => {
                return error(
                    StatusCode::REQUEST_TIMEOUT,
                    "body_timeout",
                    "the body took too long to arrive",
                )
            }
            Ok(Err(_)) => {
                let message = format!("the body is over {MAX_BODY} bytes or could not be read");
                return error(StatusCode::PAYLOAD_TOO_LARGE, "body_too_large", &message);
            }
        };
        let dry_run = head
            .uri
            .query()
            .is_some_and(|q| q.split('&').any(|kv| kv == "dry_run=true" || kv == "dry_run=1"));
        let expect = head.headers.get(http::header::IF_MATCH).and_then(|v| v.to_str().ok());
        let path = head.uri.path().trim_end_matches('/');
        let parts: Vec<&str> = path.split('/').skip(1).collect();
        if let Some(edit) = edit(&head.method, &parts, &body) {
            return match edit {
                Ok(edit) => self.change(edit, expect, &who, dry_run).await,
                Err(bad) => bad.respond(),
            };
        }
        let force = head
            .uri
            .query()
            .is_some_and(|q| q.split('&').any(|kv| kv == "force=true"));
        match (&head.method, parts.as_slice()) {
            (&Method::GET, ["admin", "shadow", name]) => match shadow::since(head.uri.query()) {
                Ok(since) => self.shadow_report(name, since),
                Err((status, code, message)) => error(status, code, &message),
            },
            (&Method::POST, ["admin", "shadow", name, "reset"]) => self.shadow_reset(name),
            (&Method::POST, ["admin", "shadow", name, "promote"]) => {
                self.shadow_promote(name, (expect, &who), (force, dry_run)).await
            }
            (&Method::GET, ["admin", "policy"]) => self.policy(),
            (&Method::GET, ["admin", "policy", "history"]) => self.history().await,
            (&Method::GET, ["admin", "policy", "history", version, "diff"]) => self.version_diff(version).await,
            (&Method::GET, ["admin", "routes"]) => self.routes(),
            (&Method::GET, ["admin", "flags"]) => self.flags(),
            (&Method::GET, ["admin", "routes", name]) => self.route(name),
            (&Method::POST, ["admin", "explain"]) => self.explain(&body),
            (&Method::GET, ["admin", "usage"]) => {
                let one = |route: &str| self.micro_batch.pool_state(route).and_then(|s| s.one_row);
                usage::table(
                    self.dispatch.usage(),
                    (&self.control.store().load(), &one),
                    head.uri.query(),
                )
                .await
            }
            (&Method::GET, ["admin", "capacity"]) => usage::capacity(self.dispatch.usage()),
            (&Method::GET, ["admin", "tokens"]) => {
                let window = |route: &str| self.micro_batch.pool_state(route).and_then(|s| s.window);
                let now = crate::usage::unix(std::time::SystemTime::now());
                match tokens::table(self.dispatch.usage(), &self.control.store().load(), &window, now).await {
                    Ok(body) => ok(&body),
                    Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, "usage_unreadable", &e),
                }
            }
            (&Method::GET, ["admin", "stats"]) => match stats::since_ms(head.uri.query(), std::time::SystemTime::now())
            {
                Ok(since) => ok(&self.stats.since(since)),
                Err(message) => error(StatusCode::BAD_REQUEST, "invalid_since", &message),
            },
            (&Method::GET, ["admin", "cache", name]) => self.cache_usage(name, false).await,
            (&Method::POST, ["admin", "cache", name, "invalidate"]) => self.cache_usage(name, true).await,
            (&Method::GET, ["admin", "batching"]) => {
                let policy = self.control.store().load();
                match batching::pools(&policy, &self.micro_batch, self.dispatch.usage()).await {
                    Ok(body) => ok(&body),
                    Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, "usage_unreadable", &e),
                }
            }
            (&Method::GET, ["admin", "backends"]) => ok(&backends::pools(&self.control.store().load(), self)),
            (&Method::GET, ["admin", "offline"]) => answered(offline::overview(&self.queue, head.uri.query()).await),
            (&Method::POST, ["admin", "batches", id, "cancel"]) => {
                answered(offline::cancel(&self.queue, id, &who).await)
            }
            (
                _,
                ["admin", "policy" | "routes" | "flags" | "explain" | "shadow" | "cache" | "usage" | "capacity" | "stats" | "ui"
                | "offline" | "batches" | "backends" | "batching", ..],
            ) => error(
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                &format!(
                    "{} is not allowed on {path}; see docs/operations.md for the admin API",
                    head.method
                ),
            ),
            _ => error(
                StatusCode::NOT_FOUND,
                "not_found",
                &format!("no admin endpoint at {path}; see docs/operations.md"),
            ),
        }
    }

    /// Route `name`'s cache: its settings, entries and bytes; with `invalidate`, its
    /// entries dropped first (and how many), here and in the shared second level.
    async fn cache_usage(&self, name: &str, invalidate: bool) -> Response<Full<Bytes>> {
        let policy = self.control.store().load();
        let Some(route) = policy.route(name) else {
            return error(
                StatusCode::NOT_FOUND,
                "no_such_route",
                &format!("no route named {name:?}"),
            );
        };
        let Some(spec) = &route.cache else {
            let message = format!("route {name} has no [routes.{name}.cache] table");
            return error(StatusCode::CONFLICT, "no_cache", &message);
        };
        let dropped = invalidate.then(|| self.dispatch.cache().invalidate(name));
        let shared = match invalidate {
            true => self.dispatch.cache().invalidate_shared(name).await,
            false => None,
        };
        let (entries, bytes) = self.dispatch.cache().usage(name).unwrap_or((0, 0));
        let mut body = serde_json::json!({
            "route": name,
            "on": route.flags.cache,
            "ttl": humantime::format_duration(spec.ttl).to_string(),
            "max_bytes": spec.max_bytes,
            "shared_across_tenants": spec.shared_across_tenants,
            "coalesce": spec.coalesce,
            "rows": spec.rows,
            "entries": entries,
            "bytes": bytes,
        });
        if let Some(dropped) = dropped {
            tracing::info!(route = name, dropped, "cache invalidated through the admin API");
            body["invalidated"] = serde_json::json!(dropped);
        }
        match shared {
            Some(Ok(n)) => body["invalidated_shared"] = serde_json::json!(n),
            Some(Err(why)) => {
                // This gateway's entries are gone; the replicas' shared ones may not be.
                tracing::warn!(route = name, error = %why, "the cache's second level was not invalidated");
                let message = format!("this gateway's entries of route {name} were dropped, but not Redis's: {why}");
                return error(StatusCode::BAD_GATEWAY, "second_level_unavailable", &message);
            }
            None => {}
        }
        ok(&body)
    }

    async fn change(&self, edit: Edit, expect: Option<&str>, who: &str, dry_run: bool) -> Response<Full<Bytes>> {
        let control = self.control.clone();
        let (expect, who) = (expect.map(str::to_owned), who.to_owned());
        let done = tokio::task::spawn_blocking(move || control.change(&edit, expect.as_deref(), &who, dry_run)).await;
        match done {
            Ok(Ok(outcome)) => changed(&outcome),
            Ok(Err(refused)) => refusal(&refused),
            Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, "internal", &e.to_string()),
        }
    }

    fn policy(&self) -> Response<Full<Bytes>> {
        let policy = self.control.store().load();
        let body = json!({
            "version": policy.version(),
            "etag": policy_etag(&policy),
            "files": policy.sources().iter().map(|(p, _)| p.display().to_string()).collect::<Vec<_>>(),
            "routes": policy.routes().iter().map(|r| views::summary(&policy, r)).collect::<Vec<_>>(),
        });
        with_etag(ok(&body), &policy_etag(&policy))
    }

    async fn version_diff(&self, version: &str) -> Response<Full<Bytes>> {
        let Ok(version) = version.parse::<u64>() else {
            return error(
                StatusCode::BAD_REQUEST,
                "bad_version",
                &format!("{version:?} is not a version number"),
            );
        };
        let control = self.control.clone();
        match tokio::task::spawn_blocking(move || control.version_diff(version)).await {
            Ok(Ok(Some((before, diff)))) => ok(&json!({ "version": version, "before": before, "diff": diff })),
            Ok(Ok(None)) => error(
                StatusCode::NOT_FOUND,
                "no_such_version",
                &format!("version {version} is not kept (see GET /admin/policy/history)"),
            ),
            Ok(Err(e)) => error(StatusCode::INTERNAL_SERVER_ERROR, "history_unreadable", &e.to_string()),
            Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, "internal", &e.to_string()),
        }
    }

    async fn history(&self) -> Response<Full<Bytes>> {
        let control = self.control.clone();
        match tokio::task::spawn_blocking(move || control.history()).await {
            Ok(Ok(all)) => {
                let versions: Vec<Value> = all
                    .iter()
                    .rev()
                    .map(|s| {
                        json!({
                            "version": s.version,
                            "time": s.time,
                            "who": s.who,
                            "action": s.action,
                            "files": s.files.iter().map(|f| f.path.display().to_string()).collect::<Vec<_>>(),
                        })
                    })
                    .collect();
                ok(&json!({ "current": self.control.store().load().version(), "versions": versions }))
            }
            Ok(Err(e)) => error(StatusCode::INTERNAL_SERVER_ERROR, "history_unreadable", &e.to_string()),
            Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, "internal", &e.to_string()),
        }
    }

    fn routes(&self) -> Response<Full<Bytes>> {
        let policy = self.control.store().load();
        let routes: Vec<Value> = policy.routes().iter().map(|r| views::summary(&policy, r)).collect();
        ok(&json!({ "version": policy.version(), "routes": routes }))
    }

    fn flags(&self) -> Response<Full<Bytes>> {
        let policy = self.control.store().load();
        let flags: serde_json::Map<String, Value> = policy
            .routes()
            .iter()
            .map(|r| (r.name.clone(), views::flags(r)))
            .collect();
        ok(&json!({ "version": policy.version(), "flags": flags }))
    }

    fn route(&self, name: &str) -> Response<Full<Bytes>> {
        let policy = self.control.store().load();
        match policy.route(name) {
            Some(route) => {
                let view = views::route(&policy, route);
                let etag = view["etag"].as_str().unwrap_or_default().to_owned();
                with_etag(ok(&view), &etag)
            }
            None => error(
                StatusCode::NOT_FOUND,
                "no_such_route",
                &format!("no route named {name:?}"),
            ),
        }
    }

    fn shadow_report(&self, name: &str, since: Option<std::time::SystemTime>) -> Response<Full<Bytes>> {
        let policy = self.control.store().load();
        answered(shadow::report(&self.shadow, &policy, name, since))
    }

    fn shadow_reset(&self, name: &str) -> Response<Full<Bytes>> {
        let policy = self.control.store().load();
        if let Err((status, code, message)) = shadow::report(&self.shadow, &policy, name, None) {
            return error(status, code, &message);
        }
        self.shadow.reset(name);
        self.shadow_report(name, None)
    }

    async fn shadow_promote(
        &self,
        name: &str,
        (expect, who): (Option<&str>, &str),
        (force, dry_run): (bool, bool),
    ) -> Response<Full<Bytes>> {
        let policy = self.control.store().load();
        // A dry run previews the change below the gate too, saying what is unmet.
        match shadow::promotion(&self.shadow, &policy, name, force || dry_run) {
            Ok((edit, unmet)) => {
                let changed = self.change(edit, expect, who, dry_run).await;
                if changed.status().is_success() && !dry_run {
                    self.shadow.reset(name);
                }
                if !(dry_run && changed.status().is_success()) {
                    return changed;
                }
                let (head, body) = changed.into_parts();
                let body = body.collect().await.map(|b| b.to_bytes()).unwrap_or_default();
                let mut answer: Value = serde_json::from_slice(&body).unwrap_or_default();
                answer["gate"] = json!({"met": unmet.is_empty(), "unmet": unmet});
                let mut response = respond(head.status, &answer);
                if let Some(etag) = head.headers.get(http::header::ETAG) {
                    response.headers_mut().insert(http::header::ETAG, etag.clone());
                }
                response
            }
            Err((status, code, message)) => error(status, code, &message),
        }
    }

    fn explain(&self, body: &[u8]) -> Response<Full<Bytes>> {
        let described: views::Described = match serde_json::from_slice(body) {
            Ok(d) => d,
            Err(e) => return error(StatusCode::BAD_REQUEST, "invalid_body", &format!("explain: {e}")),
        };
        let policy = self.control.store().load();
        match views::explain(&policy, (&self.micro_batch, self.dispatch.cache()), &described) {
            Ok(v) => ok(&v),
            Err((404, m)) => error(StatusCode::NOT_FOUND, "no_such_route", &m),
            Err((_, m)) => error(StatusCode::BAD_REQUEST, "invalid_body", &m),
        }
    }
}

/// A request body that cannot be used: its error code and what to fix (answered 400).
#[derive(Debug)]
struct BadBody(&'static str, String);

impl BadBody {
    fn respond(&self) -> Response<Full<Bytes>> {
        error(StatusCode::BAD_REQUEST, self.0, &self.1)
    }
}

/// The change a write endpoint asks for; `None` for every other endpoint.
fn edit(method: &Method, parts: &[&str], body: &[u8]) -> Option<Result<Edit, BadBody>> {
    let route = |name: &str| name.to_owned();
    Some(match (method, parts) {
        (&Method::PUT, ["admin", "policy", "files", name]) => match std::str::from_utf8(body) {
            Ok(text) => Ok(Edit::PutFiles(vec![(route(name), text.to_owned())])),
            Err(_) => Err(BadBody("invalid_body", "a policy file is UTF-8 TOML text".into())),
        },
        (&Method::POST, ["admin", "policy", "rollback"]) => json_body(body).and_then(|v| {
            let version = v.get("version").and_then(Value::as_u64);
            version
                .map(Edit::Rollback)
                .ok_or_else(|| BadBody("invalid_body", "send {\"version\": N}".into()))
        }),
        (&Method::PUT, ["admin", "routes", name]) => json_body(body).map(|spec| Edit::PutRoute {
            name: route(name),
            spec,
        }),
        (&Method::PATCH, ["admin", "routes", name]) => json_body(body).map(|patch| Edit::PatchRoute {
            name: route(name),
            patch,
        }),
        (&Method::PUT, ["admin", "routes", name, "flags", flag]) => {
            flag_patch(flag, body).map(|patch| Edit::PatchRoute {
                name: route(name),
                patch,
            })
        }
        _ => return None,
    })
}

/// The merge patch that sets `flag` to the value in `body`.
fn flag_patch(flag: &str, body: &[u8]) -> Result<Value, BadBody> {
    if !FLAGS.contains(&flag) {
        let message = format!("unknown flag {flag:?}; flags are {}", FLAGS.join(", "));
        return Err(BadBody("unknown_flag", message));
    }
    let value = match json_body(body)? {
        Value::String(s) if s.eq_ignore_ascii_case("on") || s.eq_ignore_ascii_case("true") => Value::Bool(true),
        Value::String(s) if s.eq_ignore_ascii_case("off") || s.eq_ignore_ascii_case("false") => Value::Bool(false),
        other => other,
    };
    Ok(json!({ "flags": { flag: value } }))
}

fn json_body(body: &[u8]) -> Result<Value, BadBody> {
    serde_json::from_slice(body).map_err(|e| BadBody("invalid_json", format!("the body: {e}")))
}

fn changed(outcome: &Outcome) -> Response<Full<Bytes>> {
    let body = serde_json::to_value(outcome).unwrap_or(Value::Null);
    with_etag(ok(&body), &outcome.etag)
}

fn refusal(refused: &Refused) -> Response<Full<Bytes>> {
    match refused {
        Refused::Invalid(problems) => {
            let list: Vec<Value> = problems
                .0
                .iter()
                .map(|p| json!({"file": p.file.display().to_string(), "path": p.path, "message": p.message}))
                .collect();
            let body = json!({"error": {
                "code": "invalid_policy",
                "message": format!("the change would make the policy invalid ({} problem(s)); nothing was changed", list.len()),
                "problems": list,
            }});
            respond(StatusCode::BAD_REQUEST, &body)
        }
        Refused::Stale(m) => error(StatusCode::PRECONDITION_FAILED, "stale_version", m),
        Refused::NotFound(m) => error(StatusCode::NOT_FOUND, "not_found", m),
        Refused::Failed(m) => error(StatusCode::INTERNAL_SERVER_ERROR, "write_failed", m),
    }
}

fn ok(body: &Value) -> Response<Full<Bytes>> {
    respond(StatusCode::OK, body)
}

/// 200 with the body, or the refusal's status, code and message.
fn answered(result: Result<Value, (StatusCode, &'static str, String)>) -> Response<Full<Bytes>> {
    match result {
        Ok(body) => ok(&body),
        Err((status, code, message)) => error(status, code, &message),
    }
}

fn error(status: StatusCode, code: &str, message: &str) -> Response<Full<Bytes>> {
    respond(status, &json!({"error": {"code": code, "message": message}}))
}

fn respond(status: StatusCode, body: &Value) -> Response<Full<Bytes>> {
    let mut text = serde_json::to_vec_pretty(body).unwrap_or_default();
    text.push(b'\n');
    let mut response = Response::new(Full::new(Bytes::from(text)));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(http::header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    headers.insert(http::header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

fn with_etag(mut response: Response<Full<Bytes>>, etag: &str) -> Response<Full<Bytes>> {
    if let Ok(v) = HeaderValue::from_str(etag) {
        response.headers_mut().insert(http::header::ETAG, v);
    }
    response
}

/// Whether `path` is plain: `/`-separated segments, none empty (but a last one, for a
/// trailing slash), `.` or `..`, none with an escaped `.`, `/` or backslash.
fn plain_path(path: &str) -> bool {
    let lower = path.to_ascii_lowercase();
    if ["%2e", "%2f", "%5c", "\\"].iter().any(|bad| lower.contains(bad)) {
        return false;
    }
    let segments: Vec<&str> = path.split('/').skip(1).collect();
    let last = segments.len().saturating_sub(1);
    path.starts_with('/')
        && segments
            .iter()
            .enumerate()
            .all(|(i, s)| !matches!(*s, "." | "..") && (!s.is_empty() || i == last))
}
