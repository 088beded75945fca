//! The prediction cache: the same question answered once by the backend and again from
//! the cache, JSON and binary callers sharing an entry each in its own form, tenants
//! never sharing, errors never kept, `Cache-Control` honoured, the TTL and the memory
//! bound held, identical calls in flight sharing one backend call, and invalidation;
//! two gateways sharing entries through a real Redis, and a Redis killed or frozen
//! mid-run changing nothing for callers.

use crate::common;

use std::time::Duration;

use bytes::Bytes;
use common::*;
use serde_json::{json, Value};
use tiergate::app::Gateway;
use tiergate::sim::{Faults, ModelSpec, Profile};

/// Route `r` serving model `m` on the real-time pool at `backend`, its cache on with the
/// keys in `cache` (and `extra` in the route).
fn cached(backend: &str, cache: &str, extra: &str) -> String {
    cached_as("r", backend, cache, extra)
}

/// As [`cached`], the route named `route` (metrics are the test process's, so a test
/// that reads them has a route of its own).
fn cached_as(route: &str, backend: &str, cache: &str, extra: &str) -> String {
    format!(
        "[routes.r]\nmodels = [\"m\"]\n{extra}\n[routes.r.flags]\ncache = true\n\
         [routes.r.realtime]\nendpoints = [\"{backend}\"]\nmax_concurrency = 64\n\
         [routes.r.cache]\n{cache}\n"
    )
    .replace("routes.r", &format!("routes.{route}"))
}

/// A request for model `m` whose one row encodes `i`, with id `id`.
fn question(i: usize, id: &str) -> String {
    json!({"id": id, "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 2], "data": [i, i + 1]}]})
        .to_string()
}

async fn ask(gw: &Gateway, body: &str, headers: &[(&str, &str)]) -> Answer {
    let mut all = vec![("x-tiergate-budget-ms", "200")];
    all.extend_from_slice(headers);
    infer(gw.http_addr(), "m", &all, body).await
}

/// `body` in Triton's binary form, every output asked for in binary.
async fn ask_binary(gw: &Gateway, body: &str) -> Answer {
    let mut req = tiergate::protocol::decode_request(&Bytes::from(body.to_owned()), None).expect("a request");
    req.parameters.insert("binary_data_output".into(), json!(true));
    let (body, header_len) = tiergate::protocol::encode_request(&req, true);
    let len = header_len.expect("binary").to_string();
    let headers = [
        ("content-type", "application/octet-stream"),
        ("inference-header-content-length", len.as_str()),
        ("x-tiergate-budget-ms", "200"),
    ];
    send("POST", gw.http_addr(), "/v2/models/m/infer", &headers, body).await
}

/// An answer's JSON without its id (which is each caller's own).
fn without_id(answer: &Answer) -> Value {
    let mut json = answer.json();
    json["id"] = Value::Null;
    json
}

fn requests(b: &Backend) -> u64 {
    b.sim.stats("m").map_or(0, |s| s.requests)
}

#[tokio::test]
async fn one_question_is_answered_once_and_every_caller_gets_its_own_form() {
    let sim = backend(&["m"]).await;
    let gw = gateway(&cached_as("forms", &sim.url(), "", "")).await;
    let first = ask(&gw, &question(1, "a"), &[]).await;
    assert_eq!(first.status, 200, "{}", first.text());
    assert_eq!(first.header("x-tiergate-cache"), Some("miss"));
    let again = ask(&gw, &question(1, "b"), &[]).await;
    assert_eq!(again.header("x-tiergate-cache"), Some("hit"));
    assert_eq!(again.tier(), (None, Some("cache")), "no tier served it: the cache did");
    assert_eq!(again.json()["id"], "b", "the caller's own id");
    assert_eq!(without_id(&first), without_id(&again), "the same answer");
    assert_eq!(requests(&sim), 1, "one backend call");
    // The same question in binary shares the entry, answered in binary.
    let binary = ask_binary(&gw, &question(1, "c")).await;
    assert_eq!(binary.status, 200, "{}", binary.text());
    assert_eq!(binary.header("x-tiergate-cache"), Some("hit"));
    let len: usize = binary
        .header("inference-header-content-length")
        .expect("binary")
        .parse()
        .expect("n");
    let header: Value = serde_json::from_slice(&binary.body[..len]).expect("JSON header");
    assert_eq!(header["id"], "c");
    assert_eq!(header["outputs"][0]["parameters"]["binary_data_size"], 8);
    assert_eq!(requests(&sim), 1);
    // Another question is another entry; no-cache asks afresh (and keeps it); no-store
    // keeps away.
    assert_eq!(
        ask(&gw, &question(2, "d"), &[]).await.header("x-tiergate-cache"),
        Some("miss")
    );
    let fresh = ask(&gw, &question(1, "e"), &[("cache-control", "no-cache")]).await;
    assert_eq!(fresh.header("x-tiergate-cache"), Some("miss"));
    let bypass = ask(&gw, &question(1, "f"), &[("cache-control", "no-store")]).await;
    assert_eq!(bypass.header("x-tiergate-cache"), Some("bypass"));
    assert_eq!(requests(&sim), 4);
    let hits = "tiergate_cache_lookups_total{route=\"forms\",result=\"hit\"}";
    assert_eq!(metric(&gw, hits).await, 2.0);
    gw.stop().await.expect("stops");
}

#[tokio::test]
async fn tenants_never_share_an_entry_unless_the_route_says_so() {
    let sim = backend(&["m"]).await;
    let limits = "[routes.r.limits]\ntenant_rate = 1000\ntenant_header = \"x-api-key\"";
    let gw = gateway(&cached(&sim.url(), "", limits)).await;
    for tenant in ["alice", "bob"] {
        let answer = ask(&gw, &question(1, "a"), &[("x-api-key", tenant)]).await;
        assert_eq!(answer.header("x-tiergate-cache"), Some("miss"), "{tenant}");
    }
    let alice = ask(&gw, &question(1, "a"), &[("x-api-key", "alice")]).await;
    assert_eq!(alice.header("x-tiergate-cache"), Some("hit"));
    assert_eq!(requests(&sim), 2);
    gw.stop().await.expect("stops");

    let sim = backend(&["m"]).await;
    let gw = gateway(&cached(&sim.url(), "shared_across_tenants = true", limits)).await;
    ask(&gw, &question(1, "a"), &[("x-api-key", "alice")]).await;
    let bob = ask(&gw, &question(1, "a"), &[("x-api-key", "bob")]).await;
    assert_eq!(bob.header("x-tiergate-cache"), Some("hit"));
    gw.stop().await.expect("stops");
}

#[tokio::test]
async fn an_error_is_never_kept() {
    let failing = ModelSpec {
        faults: Faults {
            error_rate: 1.0,
            ..Faults::default()
        },
        ..ModelSpec::new("m", Profile::named("instant").expect("profile"))
    };
    let sim = backend_with(vec![failing]).await;
    let gw = gateway(&cached(&sim.url(), "", "")).await;
    for _ in 0..3 {
        let answer = ask(&gw, &question(1, "a"), &[]).await;
        assert_eq!(answer.status, 500, "{}", answer.text());
        assert_eq!(answer.header("x-tiergate-cache"), Some("miss"));
    }
    assert_eq!(requests(&sim), 3, "every one asked the backend");
    gw.stop().await.expect("stops");
}

#[tokio::test]
async fn entries_expire_and_the_memory_bound_holds() {
    let sim = backend(&["m"]).await;
    let gw = gateway(&cached_as(
        "bound",
        &sim.url(),
        "ttl = \"300ms\"\nmax_bytes = 16384",
        "",
    ))
    .await;
    ask(&gw, &question(1, "a"), &[]).await;
    assert_eq!(
        ask(&gw, &question(1, "a"), &[]).await.header("x-tiergate-cache"),
        Some("hit")
    );
    eventually(Duration::from_secs(5), "the entry expires", || async {
        let answer = ask(&gw, &question(1, "a"), &[]).await;
        (answer.header("x-tiergate-cache") == Some("miss")).then_some(())
    })
    .await;
    // A stream of unique questions: the cache stays within its bytes, letting entries go.
    for i in 0..400 {
        let answer = ask(&gw, &question(1000 + i, "u"), &[]).await;
        assert_eq!(answer.status, 200);
    }
    let (entries, bytes) = gw.door().dispatch().cache().usage("bound").expect("the route's cache");
    assert!(bytes <= 16384, "{bytes} bytes in {entries} entries");
    assert!(entries < 400, "{entries} entries kept");
    let evicted = metric(&gw, "tiergate_cache_evictions_total{route=\"bound\"}").await;
    assert!(evicted > 0.0, "entries were let go: {evicted}");
    gw.stop().await.expect("stops");
}

#[tokio::test]
async fn identical_requests_in_flight_share_one_backend_call() {
    let sim = backend(&["m"]).await;
    let gw = gateway(&cached_as("flights", &sim.url(), "", "")).await;
    sim.sim.hold();
    let addr = gw.http_addr();
    let calls: Vec<_> = (0..8)
        .map(|i| {
            let body = question(7, &format!("c{i}"));
            tokio::spawn(async move { infer(addr, "m", &[("x-tiergate-budget-ms", "250")], &body).await })
        })
        .collect();
    wait_for(&sim, |s| s.requests == 1).await;
    eventually(
        Duration::from_secs(5),
        "seven callers join the call in flight",
        || async {
            let joined = metric(
                &gw,
                "tiergate_cache_lookups_total{route=\"flights\",result=\"coalesced\"}",
            )
            .await;
            (joined == 7.0).then_some(())
        },
    )
    .await;
    sim.sim.release();
    let mut how = Vec::new();
    for (i, call) in calls.into_iter().enumerate() {
        let answer = call.await.expect("task");
        assert_eq!(answer.status, 200, "{}", answer.text());
        assert_eq!(answer.json()["id"], format!("c{i}"), "each its own id");
        how.push(answer.header("x-tiergate-cache").expect("said").to_owned());
    }
    how.sort();
    assert_eq!(
        how,
        ["coalesced"; 7]
            .iter()
            .map(|s| s.to_string())
            .chain(["miss".into()])
            .collect::<Vec<_>>()
    );
    assert_eq!(requests(&sim), 1, "one backend call for eight callers");
    gw.stop().await.expect("stops");
}

#[tokio::test]
async fn a_grpc_caller_and_an_http_caller_share_an_entry() {
    use common::grpc::{client, fp32_request, sums, with_budget};
    let sim = backend(&["m"]).await;
    let gw = gateway(&cached(&sim.url(), "", "")).await;
    let http = ask(
        &gw,
        &json!({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 2], "data": [1.5, 2.0]}]}).to_string(),
        &[],
    )
    .await;
    assert_eq!(http.header("x-tiergate-cache"), Some("miss"));
    let mut c = client(gw.grpc_addr()).await;
    let answer = c
        .model_infer(with_budget(fp32_request("g1", &[[1.5, 2.0]]), "200"))
        .await
        .expect("served");
    let how = answer.metadata().get("x-tiergate-cache").and_then(|v| v.to_str().ok());
    assert_eq!(how, Some("hit"));
    let out = answer.into_inner();
    assert_eq!((out.id.as_str(), sums(&out)), ("g1", vec![3.5]));
    assert_eq!(requests(&sim), 1, "one backend call for both doors");
    gw.stop().await.expect("stops");
}

const TOKEN: &str = "cache-admin-token-0123456789";

/// A gateway whose cache shares entries through the Redis at `redis`, retrying a failed
/// one after `retry`; the admin API on (token [`TOKEN`]).
async fn sharing(redis: &str, retry: Duration, policy: &str) -> Gateway {
    let mut config = config();
    config.cache.redis = Some(tiergate::config::Secret(redis.into()));
    config.cache.redis_retry = retry;
    config.listen.admin = "127.0.0.1:0".parse().expect("addr");
    config.admin.token = Some(tiergate::config::Secret(TOKEN.into()));
    gateway_with(config, policy).await
}

#[tokio::test]
async fn two_gateways_share_entries_through_redis() {
    let redis = common::redis::Redis::start().await;
    let sim = backend(&["m"]).await;
    let limits = "[routes.r.limits]\ntenant_rate = 1000\ntenant_header = \"x-api-key\"";
    let policy = cached_as("shared", &sim.url(), "", limits);
    let alice = [("x-api-key", "alice")];
    let (one, two) = (
        sharing(&redis.url(), Duration::from_secs(1), &policy).await,
        sharing(&redis.url(), Duration::from_secs(1), &policy).await,
    );
    let first = ask(&one, &question(3, "a"), &alice).await;
    assert_eq!(first.header("x-tiergate-cache"), Some("miss"));
    eventually(Duration::from_secs(5), "the entry reaches Redis", || async {
        (redis.keys().await == 1).then_some(())
    })
    .await;
    let other = ask(&two, &question(3, "b"), &alice).await;
    assert_eq!(other.status, 200, "{}", other.text());
    assert_eq!(other.header("x-tiergate-cache"), Some("hit"), "found in Redis");
    assert_eq!(other.json()["id"], "b", "with its own id");
    assert_eq!(without_id(&first), without_id(&other), "the same answer");
    assert_eq!(requests(&sim), 1, "one backend call for both gateways");
    let lookups = |result: &str| format!("tiergate_cache_redis_lookups_total{{route=\"shared\",result=\"{result}\"}}");
    assert_eq!(metric(&two, &lookups("hit")).await, 1.0);
    // Tenants stay apart in Redis too.
    let bob = ask(&two, &question(3, "c"), &[("x-api-key", "bob")]).await;
    assert_eq!(
        bob.header("x-tiergate-cache"),
        Some("miss"),
        "bob never reads alice's entry"
    );
    assert_eq!(requests(&sim), 2);

    eventually(Duration::from_secs(5), "bob's entry reaches Redis", || async {
        (redis.keys().await == 2).then_some(())
    })
    .await;
    // Invalidated at one gateway: gone from Redis, so the other asks the backend anew.
    let dropped = admin_call(&one, TOKEN, ("POST", "/admin/cache/shared/invalidate"), &[], "").await;
    assert_eq!(dropped.status, 200, "{}", dropped.text());
    assert_eq!(dropped.json()["invalidated_shared"], 2, "alice's and bob's");
    assert_eq!(redis.keys().await, 0);
    let fresh = ask(&one, &question(3, "d"), &alice).await;
    assert_eq!(fresh.header("x-tiergate-cache"), Some("miss"));
    assert_eq!(requests(&sim), 3);
    one.stop().await.expect("stops");
    two.stop().await.expect("stops");
}

#[tokio::test]
async fn redis_killed_or_frozen_mid_run_changes_nothing_for_callers() {
    let mut redis = common::redis::Redis::start().await;
    let sim = backend(&["m"]).await;
    let gw = sharing(
        &redis.url(),
        Duration::from_millis(200),
        &cached_as("killed", &sim.url(), "", ""),
    )
    .await;
    let up = format!("tiergate_cache_redis_up{{redis=\"{}\"}}", redis.addr);
    let errors = format!(
        "tiergate_cache_redis_errors_total{{redis=\"{}\",op=\"get\"}}",
        redis.addr
    );
    // Ten questions asked and kept (here and in Redis).
    for i in 0..10 {
        assert_eq!(ask(&gw, &question(100 + i, "k"), &[]).await.status, 200);
    }
    assert_eq!(metric(&gw, &up).await, 1.0);
    // Written behind: wait for all ten, so the first failure is a lookup, not a late write.
    eventually(Duration::from_secs(5), "the ten entries reach Redis", || async {
        (redis.keys().await == 10).then_some(())
    })
    .await;
    redis.kill();
    // Kept questions are still hits (this gateway's memory); new ones go to the backend.
    for i in 0..20 {
        let answer = ask(&gw, &question(100 + i, &format!("q{i}")), &[]).await;
        assert_eq!(answer.status, 200, "{}", answer.text());
        assert_eq!(answer.json()["id"], format!("q{i}"));
        let how = if i < 10 { "hit" } else { "miss" };
        assert_eq!(answer.header("x-tiergate-cache"), Some(how), "question {i}");
    }
    assert_eq!(metric(&gw, &up).await, 0.0, "serving from memory alone");
    assert!(metric(&gw, &errors).await >= 1.0, "the failure counted");
    assert_eq!(requests(&sim), 20);

    // Back: one request after the retry finds it in use again.
    redis.restart().await;
    let probes = std::sync::atomic::AtomicUsize::new(1000);
    eventually(Duration::from_secs(10), "the gateway uses Redis again", || async {
        // A new question each time, so the gateway's memory cannot answer it.
        let i = probes.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let answer = ask(&gw, &question(i, "probe"), &[]).await;
        assert_eq!(answer.status, 200, "{}", answer.text());
        (metric(&gw, &up).await == 1.0).then_some(())
    })
    .await;

    // Frozen (SIGSTOP): lookups wait at most redis_timeout, then the gateway goes on alone.
    redis.freeze();
    for i in 0..10 {
        let answer = ask(&gw, &question(700 + i, &format!("f{i}")), &[]).await;
        assert_eq!(answer.status, 200, "{}", answer.text());
    }
    assert_eq!(metric(&gw, &up).await, 0.0, "a frozen Redis is left alone too");
    redis.thaw();
    gw.stop().await.expect("stops");
}

/// `question(i)` with the first input's own parameters `own`.
fn question_with(i: usize, own: Value) -> String {
    json!({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 2], "parameters": own, "data": [i, i + 1]}]})
        .to_string()
}

#[tokio::test]
async fn nothing_the_key_leaves_out_reaches_the_backend_so_no_caller_can_poison_an_entry() {
    let sim = backend(&["m"]).await;
    let gw = gateway(&cached_as("poison", &sim.url(), "vary = [\"x-scale\"]", "")).await;
    let sum = |a: &Answer| a.json()["outputs"][1]["data"][0].as_f64();
    let honest = ask(&gw, &question_with(1, json!({})), &[]).await;
    assert_eq!(
        (honest.header("x-tiergate-cache"), sum(&honest)),
        (Some("miss"), Some(3.0))
    );
    // An input's own parameters change what the backend computes (the simulator scales
    // by them): a refresh asking otherwise is another question, and the entry stays.
    let attack = ask(
        &gw,
        &question_with(1, json!({"scale": 1000})),
        &[("cache-control", "no-cache")],
    )
    .await;
    assert_eq!(sum(&attack), Some(3000.0), "{}", attack.text());
    let next = ask(&gw, &question_with(1, json!({})), &[]).await;
    assert_eq!((next.header("x-tiergate-cache"), sum(&next)), (Some("hit"), Some(3.0)));
    let scaled = ask(&gw, &question_with(1, json!({"scale": 1000})), &[]).await;
    assert_eq!(
        (scaled.header("x-tiergate-cache"), sum(&scaled)),
        (Some("hit"), Some(3000.0))
    );
    // A header the key does not cover is not cached at all; one in `vary` is keyed.
    for _ in 0..2 {
        let unknown = ask(&gw, &question_with(1, json!({})), &[("x-model-variant", "b")]).await;
        assert_eq!(unknown.header("x-tiergate-cache"), Some("bypass"));
    }
    let before = requests(&sim);
    for (value, want) in [("2", "miss"), ("2", "hit"), ("3", "miss")] {
        let varied = ask(&gw, &question_with(1, json!({})), &[("x-scale", value)]).await;
        assert_eq!(varied.header("x-tiergate-cache"), Some(want), "x-scale: {value}");
    }
    assert_eq!(requests(&sim) - before, 2, "one call for each value of x-scale");
    // Neither does the query string.
    let path = |q: &str| format!("/v2/models/m/infer{q}");
    for (q, want) in [("?v=1", "miss"), ("?v=1", "hit"), ("?v=2", "miss"), ("", "hit")] {
        let headers = [("x-tiergate-budget-ms", "200"), ("content-type", "application/json")];
        let answer = send("POST", gw.http_addr(), &path(q), &headers, question_with(1, json!({}))).await;
        assert_eq!(answer.header("x-tiergate-cache"), Some(want), "query {q:?}");
    }
    gw.stop().await.expect("stops");
}

#[tokio::test]
async fn header_tenants_never_share_entries_even_without_rate_limits() {
    let sim = backend(&["m"]).await;
    let gw = gateway(&cached_as("header_tenants", &sim.url(), "", "")).await;
    let anonymous = ask(&gw, &question(7, "a"), &[]).await;
    assert_eq!(anonymous.header("x-tiergate-cache"), Some("miss"));
    for tenant in ["tenant-a", "tenant-b"] {
        let answer = ask(&gw, &question(7, "a"), &[("x-api-key", tenant)]).await;
        assert_eq!(
            answer.header("x-tiergate-cache"),
            Some("miss"),
            "{tenant} reads its own entries only"
        );
    }
    let again = ask(&gw, &question(7, "a"), &[("x-api-key", "tenant-a")]).await;
    assert_eq!(again.header("x-tiergate-cache"), Some("hit"));
    assert_eq!(requests(&sim), 3);
    gw.stop().await.expect("stops");
}

#[tokio::test]
async fn json_integers_beyond_64_bits_never_share_a_key() {
    let sim = backend(&["m"]).await;
    let toml = format!(
        "[routes.j]\npaths = [\"/v1/models/m:predict\"]\n[routes.j.flags]\ncache = true\n\
         [routes.j.realtime]\nendpoints = [\"{}\"]\n[routes.j.cache]\n",
        sim.url()
    );
    let gw = gateway(&toml).await;
    let predict = |body: String| {
        let addr = gw.http_addr();
        async move {
            let headers = [("x-tiergate-budget-ms", "200"), ("content-type", "application/json")];
            send("POST", addr, "/v1/models/m:predict", &headers, body).await
        }
    };
    let (a, b) = ("18446744073709551616", "18446744073709551617");
    for n in [a, b, a] {
        let answer = predict(format!("{{\"instances\": [[{n}]]}}")).await;
        assert_eq!(answer.status, 200, "{}", answer.text());
        assert_eq!(answer.header("x-tiergate-cache"), Some("bypass"), "{n}");
    }
    for want in ["miss", "hit"] {
        let answer = predict("{\"instances\": [[18446744073709551615]]}".to_owned()).await;
        assert_eq!(
            answer.header("x-tiergate-cache"),
            Some(want),
            "64-bit integers are keyed exactly"
        );
    }
    gw.stop().await.expect("stops");
}

#[tokio::test]
async fn async_and_idempotent_requests_are_never_answered_from_the_cache() {
    let sim = backend(&["m"]).await;
    let extra = "[routes.r.micro_batch]\nendpoints = [\"BATCH\"]";
    let toml = cached_as("async", &sim.url(), "", "").replace("cache = true\n", "cache = true\noffline = true\n")
        + &extra.replace("routes.r", "routes.async").replace("BATCH", &sim.url());
    let gw = gateway(&toml).await;
    let kept = ask(&gw, &question(5, "a"), &[]).await;
    assert_eq!(kept.header("x-tiergate-cache"), Some("miss"));
    // Asked for later, it is a job; with an idempotency key, the key is bound to it.
    let job = ask(
        &gw,
        &question(5, "a"),
        &[("prefer", "respond-async"), ("idempotency-key", "k1")],
    )
    .await;
    assert_eq!(job.status, 202, "{}", job.text());
    let other = ask(
        &gw,
        &question(6, "a"),
        &[("prefer", "respond-async"), ("idempotency-key", "k1")],
    )
    .await;
    assert_eq!(
        other.status,
        422,
        "the key was bound to the first request: {}",
        other.text()
    );
    let reused = ask(&gw, &question(5, "b"), &[("idempotency-key", "k2")]).await;
    assert_eq!(reused.header("x-tiergate-cache"), Some("bypass"));
    gw.stop().await.expect("stops");
}
