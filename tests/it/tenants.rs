//! Tenants: with API keys configured, every door authenticates, and a tenant sees only
//! its own offline jobs, batches and files (the admin token sees every tenant's batches
//! and can cancel any); idempotency keys are scoped to the tenant and the endpoint and
//! bound to the request; without keys, a key reused for another request is still
//! refused. Batch lines meet the body limit, and the store's files are private.

use crate::common;

use std::time::Duration;

use common::*;
use serde_json::{json, Value};
use tiergate::app::Gateway;

fn policy(rt: &str, batch: &str) -> String {
    format!(
        r#"
[routes.r]
models = ["m"]
[routes.r.flags]
realtime = true
offline = true
[routes.r.realtime]
endpoints = ["{rt}"]
[routes.r.micro_batch]
endpoints = ["{batch}"]
"#
    )
}

const KEY_A: &str = "key-of-team-a";
const KEY_B: &str = "key-of-team-b";

/// A gateway whose data plane takes the keys of teams a and b, and the keys file.
async fn with_keys(be: &Backend) -> (Gateway, std::path::PathBuf) {
    with_keys_serving(&policy(&be.url(), &be.url())).await
}

/// The admin token of the gateways here.
const ADMIN: &str = "tenants-admin-token";

/// A gateway serving `policy` whose data plane takes the keys of teams a and b (and
/// whose admin API takes [`ADMIN`]), and the keys file.
async fn with_keys_serving(policy: &str) -> (Gateway, std::path::PathBuf) {
    let mut cfg = config();
    cfg.listen.admin = "127.0.0.1:0".parse().expect("addr");
    cfg.admin.token = Some(tiergate::config::Secret(ADMIN.into()));
    std::fs::create_dir_all(&cfg.data_dir).expect("data dir");
    let keys = cfg.data_dir.with_extension("keys");
    let text = format!(
        "# two teams\n{}\n{}\n",
        tiergate::front::auth::line("team-a", KEY_A),
        tiergate::front::auth::line("team-b", KEY_B)
    );
    std::fs::write(&keys, text).expect("keys file");
    cfg.auth.keys_file = Some(keys.clone());
    (gateway_with(cfg, policy).await, keys)
}

fn bearer(key: &str) -> (&'static str, String) {
    ("authorization", format!("Bearer {key}"))
}

/// Sends as the holder of `key` (none: no credential).
async fn as_(
    key: Option<&str>,
    method: &str,
    gw: &Gateway,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Answer {
    let auth = key.map(bearer);
    let mut all: Vec<(&str, &str)> = headers.to_vec();
    if let Some((k, v)) = &auth {
        all.push((k, v.as_str()));
    }
    send(method, gw.http_addr(), path, &all, body.to_owned()).await
}

const ASYNC: (&str, &str) = ("prefer", "respond-async");
const JSON: (&str, &str) = ("content-type", "application/json");

#[tokio::test]
async fn without_a_known_key_nothing_but_the_health_checks_is_served() {
    let be = backend(&["m"]).await;
    let (gw, keys) = with_keys(&be).await;
    for key in [None, Some("not-a-key")] {
        let a = as_(key, "POST", &gw, "/v2/models/m/infer", &[JSON], BODY).await;
        assert_eq!(
            (a.status, a.header("www-authenticate")),
            (401, Some("Bearer")),
            "{}",
            a.text()
        );
        assert!(a.tier().0.is_none(), "never classified");
        for path in ["/v2", "/v2/models/m", "/v1/batches", "/v1/jobs/job_x"] {
            assert_eq!(as_(key, "GET", &gw, path, &[], "").await.status, 401, "{path}");
        }
    }
    for path in ["/v2/health/live", "/v2/health/ready"] {
        assert_eq!(get(gw.http_addr(), path).await.status, 200, "{path} needs no key");
    }
    assert_eq!(
        be.sim.stats("m").expect("stats").requests,
        0,
        "nothing reached the backend"
    );
    let a = as_(Some(KEY_A), "POST", &gw, "/v2/models/m/infer", &[JSON], BODY).await;
    assert_eq!(a.status, 200, "{}", a.text());
    let a = send(
        "POST",
        gw.http_addr(),
        "/v2/models/m/infer",
        &[JSON, ("x-api-key", KEY_B)],
        BODY,
    )
    .await;
    assert_eq!(a.status, 200, "x-api-key works too: {}", a.text());

    // gRPC: UNAUTHENTICATED without a key, served with one; readiness needs none.
    let mut grpc = common::grpc::client(gw.grpc_addr()).await;
    let refused = grpc
        .model_infer(common::grpc::fp32_request("g", &[[1.0, 2.0]]))
        .await
        .expect_err("no key");
    assert_eq!(refused.code(), tonic::Code::Unauthenticated, "{refused:?}");
    let mut call = tonic::Request::new(common::grpc::fp32_request("g", &[[1.0, 2.0]]));
    call.metadata_mut()
        .insert("authorization", format!("Bearer {KEY_A}").parse().expect("ascii"));
    assert!(grpc.model_infer(call).await.is_ok());
    let ready = grpc
        .server_ready(tiergate::protocol::grpc::pb::ServerReadyRequest {})
        .await;
    assert!(ready.is_ok(), "{ready:?}");

    // A key added to the file is taken without a restart.
    let mut text = std::fs::read_to_string(&keys).expect("read");
    text.push_str(&tiergate::front::auth::line("team-c", "key-of-team-c"));
    text.push('\n');
    std::fs::write(&keys, text).expect("write");
    eventually(Duration::from_secs(10), "the new key is taken", || async {
        let a = as_(Some("key-of-team-c"), "POST", &gw, "/v2/models/m/infer", &[JSON], BODY).await;
        (a.status == 200).then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_tenant_reads_only_its_own_jobs_batches_and_files() {
    let be = backend(&["m"]).await;
    let (gw, _keys) = with_keys(&be).await;

    // A job: its owner reads it; the other tenant is told it does not exist.
    let a = as_(Some(KEY_A), "POST", &gw, "/v2/models/m/infer", &[JSON, ASYNC], BODY).await;
    assert_eq!(a.status, 202, "{}", a.text());
    let location = a.header("location").expect("location").to_owned();
    let done = eventually(Duration::from_secs(10), "the job finishes", || async {
        let a = as_(Some(KEY_A), "GET", &gw, &location, &[], "").await;
        (a.status == 200).then_some(a)
    })
    .await;
    assert!(done.text().contains("OUTPUT"), "{}", done.text());
    for method in ["GET", "DELETE"] {
        let b = as_(Some(KEY_B), method, &gw, &location, &[], "").await;
        assert_eq!(b.status, 404, "{method} by another tenant: {}", b.text());
        assert!(!b.text().contains("OUTPUT"));
    }

    // A file and a batch made from it.
    let lines = batch_lines("m", 3);
    let (_, auth_a) = bearer(KEY_A);
    let (_, auth_b) = bearer(KEY_B);
    let file = upload_file(gw.http_addr(), &lines, &[("authorization", &auth_a)]).await;
    assert_eq!(file.status, 200, "{}", file.text());
    let file_id = file.json()["id"].as_str().expect("id").to_owned();
    for path in [format!("/v1/files/{file_id}"), format!("/v1/files/{file_id}/content")] {
        assert_eq!(as_(Some(KEY_A), "GET", &gw, &path, &[], "").await.status, 200, "{path}");
        assert_eq!(as_(Some(KEY_B), "GET", &gw, &path, &[], "").await.status, 404, "{path}");
    }
    let create =
        json!({"input_file_id": file_id, "endpoint": "/v2/models/m/infer", "completion_window": "1h"}).to_string();
    let b = as_(Some(KEY_B), "POST", &gw, "/v1/batches", &[JSON], &create).await;
    assert_eq!(b.status, 404, "another tenant's file cannot feed a batch: {}", b.text());
    let a = as_(Some(KEY_A), "POST", &gw, "/v1/batches", &[JSON], &create).await;
    assert_eq!(a.status, 200, "{}", a.text());
    let batch_id = a.json()["id"].as_str().expect("id").to_owned();
    let batch = eventually(Duration::from_secs(10), "the batch completes", || async {
        let a = as_(Some(KEY_A), "GET", &gw, &format!("/v1/batches/{batch_id}"), &[], "").await;
        (a.json()["status"] == "completed").then(|| a.json())
    })
    .await;
    let output = batch["output_file_id"].as_str().expect("output file").to_owned();
    let path = format!("/v1/files/{output}/content");
    assert_eq!(as_(Some(KEY_A), "GET", &gw, &path, &[], "").await.status, 200);
    assert_eq!(
        as_(Some(KEY_B), "GET", &gw, &path, &[], "").await.status,
        404,
        "nor its output"
    );
    for (method, path) in [
        ("GET", format!("/v1/batches/{batch_id}")),
        ("POST", format!("/v1/batches/{batch_id}/cancel")),
    ] {
        assert_eq!(
            as_(Some(KEY_B), method, &gw, &path, &[], "").await.status,
            404,
            "{method} {path}"
        );
    }
    let listed = |key| {
        let gw = &gw;
        async move {
            let list: Value = as_(Some(key), "GET", gw, "/v1/batches", &[], "").await.json();
            list["data"].as_array().expect("data").len()
        }
    };
    assert_eq!((listed(KEY_A).await, listed(KEY_B).await), (1, 0), "each lists its own");
    let files = |key| {
        let gw = &gw;
        async move {
            let list: Value = as_(Some(key), "GET", gw, "/v1/files", &[], "").await.json();
            list["data"].as_array().expect("data").len()
        }
    };
    assert_eq!(
        (files(KEY_A).await, files(KEY_B).await),
        (2, 0),
        "input and output, the owner's only"
    );
    let path = format!("/v1/files/{file_id}");
    assert_eq!(
        as_(Some(KEY_B), "DELETE", &gw, &path, &[], "").await.status,
        404,
        "nor delete it"
    );
    assert_eq!(as_(Some(KEY_A), "DELETE", &gw, &path, &[], "").await.status, 200);
    assert_eq!(
        as_(Some(KEY_A), "GET", &gw, &path, &[], "").await.status,
        404,
        "deleted"
    );
    let _ = auth_b;
}

/// Uploads `n` lines for model `m` as the holder of `key` and makes a batch of them.
async fn batch_of(gw: &Gateway, key: &str, n: usize) -> String {
    let (name, auth) = bearer(key);
    let file = upload_file(gw.http_addr(), &batch_lines("m", n), &[(name, &auth)]).await;
    assert_eq!(file.status, 200, "{}", file.text());
    create_batch(gw.http_addr(), &file.json()["id"], "m", &[(name, &auth)]).await
}

#[tokio::test]
async fn the_admin_token_lists_every_tenants_batches_and_cancels_any_as_its_owner_would() {
    // The offline pool takes a second a request, one at a time: the batches stay in
    // progress while the admin looks (team a's for a minute).
    let rt = backend(&["m"]).await;
    let slow = tiergate::sim::Profile {
        a: Duration::from_secs(1),
        b: Duration::ZERO,
        floor: Duration::ZERO,
    };
    let pool = backend_with(vec![tiergate::sim::ModelSpec::new("m", slow)]).await;
    let policy = format!(
        "[routes.r]\nmodels = [\"m\"]\n[routes.r.flags]\nrealtime = true\noffline = true\n\
         [routes.r.realtime]\nendpoints = [\"{}\"]\n\
         [routes.r.micro_batch]\nendpoints = [\"{}\"]\nmax_batch = 1\nmax_in_flight = 1\n",
        rt.url(),
        pool.url()
    );
    let (gw, _keys) = with_keys_serving(&policy).await;
    let a = batch_of(&gw, KEY_A, 60).await;
    let b = batch_of(&gw, KEY_B, 20).await;
    let admin = |method, path: String| {
        let gw = &gw;
        async move { admin_call(gw, ADMIN, (method, &path), &[], "").await }
    };

    // Every tenant's batches, newest first, each with its tenant; the queue's jobs.
    let all = admin("GET", "/admin/offline".into()).await;
    assert_eq!(all.status, 200, "{}", all.text());
    let all = all.json();
    let listed: Vec<(&str, &str)> = all["batches"]
        .as_array()
        .expect("batches")
        .iter()
        .map(|b| {
            (
                b["id"].as_str().unwrap_or_default(),
                b["tenant"].as_str().unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(listed, [(b.as_str(), "team-b"), (a.as_str(), "team-a")], "{all}");
    let jobs: u64 = all["jobs"]
        .as_object()
        .expect("jobs")
        .values()
        .filter_map(Value::as_u64)
        .sum();
    assert_eq!(jobs, 80, "{all}");
    assert!(all["oldest_queued_age_s"].as_f64().is_some_and(|s| s >= 0.0), "{all}");
    assert_eq!(all["batches"][0]["cancellable"], true, "{all}");
    // Paged: one at a time.
    let first = admin("GET", "/admin/offline?limit=1".into()).await.json();
    assert_eq!(
        (first["batches"][0]["id"].as_str(), &first["has_more"]),
        (Some(b.as_str()), &json!(true))
    );
    let after = first["last_id"].as_str().expect("last id");
    let next = admin("GET", format!("/admin/offline?limit=1&after={after}"))
        .await
        .json();
    assert_eq!(
        (next["batches"][0]["id"].as_str(), &next["has_more"]),
        (Some(a.as_str()), &json!(false))
    );
    assert_eq!(admin("GET", "/admin/offline?limit=x".into()).await.status, 400);

    // Team b's batch cancelled by the admin: its owner sees what its own cancel gives.
    let cancelled = admin("POST", format!("/admin/batches/{b}/cancel")).await;
    assert_eq!(cancelled.status, 200, "{}", cancelled.text());
    assert_eq!(cancelled.json()["tenant"], "team-b");
    assert!(
        matches!(cancelled.json()["status"].as_str(), Some("cancelling" | "cancelled")),
        "{}",
        cancelled.text()
    );
    let owner = eventually(Duration::from_secs(20), "team b's batch ends cancelled", || async {
        let seen = as_(Some(KEY_B), "GET", &gw, &format!("/v1/batches/{b}"), &[], "")
            .await
            .json();
        (seen["status"] == "cancelled").then_some(seen)
    })
    .await;
    let counts = &owner["request_counts"];
    assert!(
        counts["failed"].as_u64().is_some_and(|n| n >= 18),
        "its queued requests never ran: {owner}"
    );
    // Team a's batch goes on.
    let other = as_(Some(KEY_A), "GET", &gw, &format!("/v1/batches/{a}"), &[], "")
        .await
        .json();
    assert_eq!(other["status"], "in_progress", "{other}");

    // Only an open batch can be cancelled; an unknown one is not there; the token is needed.
    let again = admin("POST", format!("/admin/batches/{b}/cancel")).await;
    assert_eq!(
        (again.status, again.json()["error"]["code"].as_str()),
        (409, Some("not_cancellable"))
    );
    for id in ["batch_nope", "batch_x%27"] {
        let missing = admin("POST", format!("/admin/batches/{id}/cancel")).await;
        assert_eq!(missing.status, 404, "{id}: {}", missing.text());
    }
    let path = format!("/admin/batches/{a}/cancel");
    let refused = admin_call(&gw, "not-the-token", ("POST", &path), &[], "").await;
    assert_eq!(refused.status, 401);
    let still = as_(Some(KEY_A), "GET", &gw, &format!("/v1/batches/{a}"), &[], "")
        .await
        .json();
    assert_eq!(
        still["status"], "in_progress",
        "a refused call changes nothing: {still}"
    );
}

#[tokio::test]
async fn an_idempotency_key_is_the_tenants_own_and_bound_to_its_request() {
    let be = backend(&["m"]).await;
    let (gw, _keys) = with_keys(&be).await;
    let key = ("idempotency-key", "order-17");
    let submit = |who, body: &'static str| {
        let gw = &gw;
        async move { as_(Some(who), "POST", gw, "/v2/models/m/infer", &[JSON, ASYNC, key], body).await }
    };
    let first = submit(KEY_A, BODY).await;
    assert_eq!(first.status, 202, "{}", first.text());
    let again = submit(KEY_A, BODY).await;
    assert_eq!(
        (again.status, &again.json()["id"]),
        (202, &first.json()["id"]),
        "the same job"
    );
    let other_tenant = submit(KEY_B, BODY).await;
    assert_eq!(other_tenant.status, 202);
    assert_ne!(
        other_tenant.json()["id"],
        first.json()["id"],
        "another tenant's key is its own"
    );
    let other_body = r#"{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[1,2],"data":[9,9]}]}"#;
    let reused = submit(KEY_A, other_body).await;
    assert_eq!(reused.status, 422, "{}", reused.text());
    assert!(reused.text().contains("different request"), "{}", reused.text());
}

#[tokio::test]
async fn without_keys_a_reused_idempotency_key_is_refused_and_lines_meet_the_body_limit() {
    let be = backend(&["m"]).await;
    let mut cfg = config();
    cfg.limits.max_body_bytes = 4096;
    cfg.offline.max_file_bytes = 1 << 20;
    let gw = gateway_with(cfg.clone(), &policy(&be.url(), &be.url())).await;
    let key = ("idempotency-key", "k");
    let first = infer(gw.http_addr(), "m", &[ASYNC, key], BODY).await;
    assert_eq!(first.status, 202, "{}", first.text());
    let other = r#"{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[1,2],"data":[9,9]}]}"#;
    let reused = infer(gw.http_addr(), "m", &[ASYNC, key], other).await;
    assert_eq!(reused.status, 422, "{}", reused.text());

    // A line whose body is over limits.max_body_bytes fails the batch, by its line.
    let big: Vec<u32> = (0..2000).collect();
    let lines = [
        json!({"custom_id": "small", "method": "POST", "url": "/v2/models/m/infer",
               "body": {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 2], "data": [1, 2]}]}}),
        json!({"custom_id": "big", "method": "POST", "url": "/v2/models/m/infer",
               "body": {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 2000], "data": big}]}}),
    ]
    .map(|l| l.to_string())
    .join("\n");
    let file = upload_file(gw.http_addr(), &lines, &[]).await;
    assert_eq!(file.status, 200, "{}", file.text());
    let create = json!({"input_file_id": file.json()["id"], "endpoint": "/v2/models/m/infer",
                        "completion_window": "1h"});
    let batch = send("POST", gw.http_addr(), "/v1/batches", &[JSON], create.to_string()).await;
    let batch = batch.json();
    assert_eq!(batch["status"], "failed", "{batch}");
    let errors = &batch["errors"]["data"];
    assert_eq!(errors[0]["code"], "body_too_large", "{batch}");
    assert_eq!(errors[0]["line"], 2, "{batch}");
    assert_eq!(
        batch["request_counts"]["total"], 0,
        "no job of the batch is queued: {batch}"
    );

    // The store and its directory are private to the gateway's user.
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &std::path::Path| std::fs::metadata(p).expect("metadata").permissions().mode() & 0o777;
    assert_eq!(mode(&cfg.data_dir), 0o700, "the data directory");
    for entry in std::fs::read_dir(&cfg.data_dir).expect("list") {
        let path = entry.expect("entry").path();
        if path.is_file() {
            assert_eq!(mode(&path), 0o600, "{}", path.display());
        }
    }
}

#[tokio::test]
async fn a_key_made_by_the_cli_lets_its_tenant_in() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tiergate"))
        .args(["auth", "new-key", "team-x"])
        .output()
        .expect("runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).expect("utf-8");
    let field = |prefix: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(prefix))
            .unwrap_or_else(|| panic!("{prefix} in {text}"))
            .trim()
            .to_owned()
    };
    let (key, line) = (
        field("key (give it to the tenant; it is not kept anywhere):"),
        field("line for auth.keys_file:"),
    );
    assert!(!line.contains(&key), "the file's line never holds the key");
    let be = backend(&["m"]).await;
    let mut cfg = config();
    std::fs::create_dir_all(&cfg.data_dir).expect("data dir");
    let keys = cfg.data_dir.with_extension("cli-keys");
    std::fs::write(&keys, format!("{line}\n")).expect("keys file");
    cfg.auth.keys_file = Some(keys);
    let gw = gateway_with(cfg, &policy(&be.url(), &be.url())).await;
    let a = as_(Some(&key), "POST", &gw, "/v2/models/m/infer", &[JSON], BODY).await;
    assert_eq!(a.status, 200, "{}", a.text());
    let bad = std::process::Command::new(env!("CARGO_BIN_EXE_tiergate"))
        .args(["auth", "new-key", "no spaces"])
        .output()
        .expect("runs");
    assert!(!bad.status.success(), "an invalid tenant name is refused");
}
