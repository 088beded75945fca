//! Token limits that hold, against the simulator's LLMs: a call reserves its prompt's
//! estimate and `max_tokens` before it is sent, so parallel callers (on one gateway, or
//! on two sharing Redis) never spend past a limit by more than one call's reservation;
//! what a call did not use is given back when its usage is known; a refusal is
//! OpenAI's 429 with `Retry-After` and `x-ratelimit-*`; ceilings refuse or clamp; and
//! offline jobs wait for tokens rather than fail.

use crate::common;

use std::net::SocketAddr;
use std::time::Duration;

use common::*;
use serde_json::{json, Value};
use tiergate::app::Gateway;
use tiergate::sim::{LlmProfile, ModelSpec};

/// Calls refused for a spent tokens-per-minute limit.
const SPENT: &str = "tiergate_token_limited_total{route=\"llm\",limit=\"tokens_per_minute\",why=\"spent\"}";

async fn llm() -> Backend {
    let profile = LlmProfile::named("llm-tiny").expect("profile");
    backend_with(vec![ModelSpec::llm("m", profile)]).await
}

/// A route serving model `m` from `url` on real time (and offline), with `tokens` as
/// its `[tokens]` table's lines.
fn route(url: &str, tokens: &str) -> String {
    format!(
        "[routes.llm]\nmodels = [\"m\"]\npaths = [\"/v1/chat/completions\", \"/v1/completions\"]\n\
         default_budget = \"5s\"\nrealtime_below = \"10s\"\n\
         [routes.llm.flags]\nrealtime = true\noffline = true\n\
         [routes.llm.realtime]\nendpoints = [\"{url}\"]\n[routes.llm.micro_batch]\nendpoints = [\"{url}\"]\n\
         [routes.llm.tokens]\n{tokens}"
    )
}

/// The route, each tenant held to `per_minute` tokens a minute, prompts counted a byte
/// a token.
fn limited(url: &str, per_minute: u64) -> String {
    route(
        url,
        &format!("prompt_bytes_per_token = 1\n[routes.llm.tokens.default]\ntokens_per_minute = {per_minute}\n"),
    )
}

fn chat(max_tokens: Option<u64>, content: &str) -> Value {
    let mut body = json!({"model": "m", "messages": [{"role": "user", "content": content}]});
    if let Some(m) = max_tokens {
        body["max_tokens"] = json!(m);
    }
    body
}

async fn call(addr: SocketAddr, body: &Value, tenant: &str) -> Answer {
    let headers = [("content-type", "application/json"), ("x-api-key", tenant)];
    send("POST", addr, "/v1/chat/completions", &headers, body.to_string()).await
}

/// Tokens an answer says it used.
fn used(answer: &Answer) -> u64 {
    let usage = &answer.json()["usage"];
    usage["prompt_tokens"].as_u64().unwrap_or(0) + usage["completion_tokens"].as_u64().unwrap_or(0)
}

/// `n` calls at once, spread over `gateways`, each of `max_tokens`: what the answered
/// ones used, and the refusals.
async fn flood(gateways: &[&Gateway], n: usize, max_tokens: u64) -> (u64, usize, Vec<Answer>) {
    let mut calls = tokio::task::JoinSet::new();
    for i in 0..n {
        let addr = gateways[i % gateways.len()].http_addr();
        calls.spawn(async move { call(addr, &chat(Some(max_tokens), "one two three"), "a").await });
    }
    let answers = calls.join_all().await;
    let spent: u64 = answers.iter().filter(|a| a.status == 200).map(used).sum();
    let answered = answers.iter().filter(|a| a.status == 200).count();
    let refused = answers.into_iter().filter(|a| a.status != 200).collect();
    (spent, answered, refused)
}

/// What one call of `max_tokens` reserves at one byte a token: its 13 bytes, 4 for its
/// message, and `max_tokens`.
fn reservation(max_tokens: u64) -> u64 {
    13 + 4 + max_tokens
}

fn assert_refused_as_openai(refused: &[Answer], limit: &str) {
    assert!(!refused.is_empty(), "some calls are refused");
    for answer in refused {
        assert_eq!(answer.status, 429, "{}", answer.text());
        let error = &answer.json()["error"];
        assert_eq!(error["code"], "rate_limit_exceeded", "{error}");
        assert_eq!(error["type"], "tokens", "{error}");
        let message = error["message"].as_str().expect("message");
        assert!(message.contains(limit), "names the limit: {message}");
        let header = |name: &str| {
            answer
                .headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        assert!(header("retry-after").is_some_and(|s| s.parse::<u64>().is_ok_and(|s| s >= 1)));
        assert!(header("x-ratelimit-limit-tokens").is_some(), "{:?}", answer.headers);
        assert!(header("x-ratelimit-remaining-tokens").is_some());
        assert!(header("x-ratelimit-reset-tokens").is_some());
    }
}

#[tokio::test]
async fn parallel_callers_never_spend_past_a_limit() {
    let backend = llm().await;
    let limit = 400;
    let policy = limited(&backend.url(), limit);
    let gw = gateway(&policy).await;
    let started = std::time::Instant::now();
    let (spent, answered, refused) = flood(&[&gw], 40, 50).await;
    // What refilled while the calls ran counts too (the limit over a minute).
    let refilled = limit as f64 * started.elapsed().as_secs_f64() / 60.0;
    let bound = limit as f64 + refilled + reservation(50) as f64;
    assert!(
        (spent as f64) <= bound,
        "{answered} calls spent {spent} tokens against {limit} a minute (bound {bound:.0})"
    );
    assert!(
        answered >= 5,
        "the limit lets its tokens through: {answered} answered, {spent} spent: {:?}",
        refused
            .iter()
            .filter(|a| a.status != 429)
            .map(|a| (a.status, a.text()))
            .collect::<Vec<_>>()
    );
    assert_refused_as_openai(&refused, "tokens.default.tokens_per_minute = 400");
    assert!(metric(&gw, SPENT).await >= 1.0);
}

#[tokio::test]
async fn two_replicas_sharing_redis_hold_one_limit() {
    let redis = common::redis::Redis::start().await;
    let backend = llm().await;
    let limit = 400;
    let policy = limited(&backend.url(), limit);
    let replica = || {
        let mut config = config();
        config.usage.redis = Some(tiergate::config::Secret(redis.url()));
        config.usage.redis_timeout = Duration::from_secs(1);
        gateway_with(config, &policy)
    };
    let (one, two) = (replica().await, replica().await);
    let started = std::time::Instant::now();
    let (spent, answered, refused) = flood(&[&one, &two], 40, 50).await;
    let refilled = limit as f64 * started.elapsed().as_secs_f64() / 60.0;
    let bound = limit as f64 + refilled + reservation(50) as f64;
    assert!(
        (spent as f64) <= bound,
        "{answered} calls on two replicas spent {spent} tokens against {limit} a minute (bound {bound:.0})"
    );
    assert!(answered >= 5, "{answered} answered");
    assert_refused_as_openai(&refused, "tokens.default.tokens_per_minute");
    // Both replicas refused some: they held one count, not one each.
    assert!(metric(&one, SPENT).await >= 1.0 && metric(&two, SPENT).await >= 1.0);
}

#[tokio::test]
async fn a_reservation_gives_back_what_the_call_did_not_use() {
    let backend = llm().await;
    let policy = limited(&backend.url(), 1000);
    let gw = gateway(&policy).await;
    // 600 bytes of prompt, one word: it reserves 604 + 8 tokens and uses 1 + 8.
    let long = "x".repeat(600);
    let first = call(gw.http_addr(), &chat(Some(8), &long), "a").await;
    assert_eq!(first.status, 200, "{}", first.text());
    assert_eq!(used(&first), 9);
    let remaining = |a: &Answer| {
        a.headers["x-ratelimit-remaining-tokens"]
            .to_str()
            .expect("ascii")
            .parse::<u64>()
            .expect("a number")
    };
    assert!(remaining(&first) < 400, "{:?}", first.headers);
    // Had the first kept its 612, this one's 612 would not fit in what is left.
    let streamed = json!({"model": "m", "stream": true, "max_tokens": 8,
        "messages": [{"role": "user", "content": long}]});
    let second = call(gw.http_addr(), &streamed, "a").await;
    assert_eq!(second.status, 200, "{}", second.text());
    assert!(second.text().contains("data: [DONE]"));
    // A streamed call settles when its stream ends: a third fits too.
    let third = eventually(Duration::from_secs(5), "the stream's tokens given back", || async {
        let answer = call(gw.http_addr(), &chat(Some(8), &long), "a").await;
        (answer.status == 200).then_some(answer)
    })
    .await;
    assert!(remaining(&third) < 400);
    // Another tenant has its own count.
    let other = call(gw.http_addr(), &chat(Some(8), "hi"), "b").await;
    assert!(remaining(&other) > 900, "{:?}", other.headers);
}

#[tokio::test]
async fn ceilings_refuse_or_clamp_and_the_default_is_sent() {
    let backend = llm().await;
    let gw = gateway(&route(
        &backend.url(),
        "default_max_tokens = 12\nmax_tokens = 20\nmax_n = 1\n",
    ))
    .await;
    let over = call(gw.http_addr(), &chat(Some(50), "hi"), "a").await;
    assert_eq!(over.status, 400, "{}", over.text());
    let error = &over.json()["error"];
    assert_eq!(error["param"], "max_tokens");
    assert!(
        error["message"]
            .as_str()
            .expect("message")
            .contains("tokens.max_tokens = 20"),
        "{error}"
    );
    let mut two = chat(Some(5), "hi");
    two["n"] = json!(2);
    let refused = call(gw.http_addr(), &two, "a").await;
    assert_eq!(refused.status, 400);
    assert!(refused.text().contains("tokens.max_n = 1"), "{}", refused.text());
    // No max_tokens named: the route's default is sent (the simulator writes that many).
    let default = call(gw.http_addr(), &chat(None, "hi"), "a").await;
    assert_eq!(default.status, 200, "{}", default.text());
    assert_eq!(default.json()["usage"]["completion_tokens"], 12);
    // With clamp, a call past the ceiling is sent at it.
    let clamped = gateway(&route(&backend.url(), "max_tokens = 20\nclamp = true\n")).await;
    let answer = call(clamped.http_addr(), &chat(Some(50), "hi"), "a").await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(answer.json()["usage"]["completion_tokens"], 20);
}

#[tokio::test]
async fn offline_jobs_wait_for_tokens_and_do_not_fail() {
    let backend = llm().await;
    // Each line reserves about 3,000 tokens (its prompt's bytes) of 4,000 a minute and
    // uses a few: one at a time runs, the others wait until it gives its tokens back.
    let policy = limited(&backend.url(), 4000);
    let gw = gateway(&policy).await;
    let long = "x".repeat(3000);
    let lines: Vec<String> = (0..3)
        .map(|i| {
            json!({"custom_id": format!("c{i}"), "method": "POST", "url": "/v1/chat/completions",
                   "body": chat(Some(4), &long)})
            .to_string()
        })
        .collect();
    let batch = chat_batch_completed(gw.http_addr(), &lines).await;
    assert_eq!(batch["request_counts"]["completed"], 3, "{batch}");
    assert_eq!(batch["request_counts"]["failed"], 0, "{batch}");
    assert!(
        metric(&gw, "tiergate_offline_attempts_total{route=\"llm\",result=\"waiting\"}").await >= 1.0,
        "a line waited for tokens"
    );
}
