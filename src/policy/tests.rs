use std::path::PathBuf;
use std::time::Duration;

use super::*;

fn load(files: &[(&str, &str)]) -> Result<Policy, Problems> {
    Policy::from_texts(
        files
            .iter()
            .map(|(name, text)| (PathBuf::from(name), (*text).to_owned()))
            .collect(),
    )
}

/// Checks that loading `text` as `name` reports a problem starting with each of `expect`.
fn reports(name: &str, text: &str, expect: &[&str]) {
    let lines: Vec<String> = load(&[(name, text)])
        .expect_err("invalid")
        .0
        .iter()
        .map(|p| p.to_string())
        .collect();
    for expect in expect {
        assert!(
            lines.iter().any(|l| l.starts_with(expect)),
            "missing {expect:?} in {lines:#?}"
        );
    }
}

const GOOD: &str = r#"
[defaults]
default_budget = "150ms"
offline_from = "30s"

[routes.resnet50]
models = ["resnet50", "resnet50_v2"]
when_unmet = "best_effort"
[routes.resnet50.flags]
micro_batch = true
micro_batch_percent = 25
[routes.resnet50.realtime]
endpoints = ["http://127.0.0.1:9000", "http://127.0.0.1:9001/"]
max_concurrency = 8
[routes.resnet50.micro_batch]
endpoints = ["grpc://127.0.0.1:9100", "grpc://127.0.0.1:9101"]
max_batch = 128
max_wait = "250ms"
max_in_flight = 3

[routes.embed]
paths = ["/v1/embeddings"]
realtime_below = "100ms"
[routes.embed.realtime]
endpoints = ["http://embed.internal:8080"]
"#;

#[test]
fn a_good_policy_validates_with_defaults_applied() {
    let policy = load(&[("a.toml", GOOD)]).expect("valid");
    let r = policy.route_for_model("resnet50_v2").expect("indexed by model");
    assert_eq!(r.name, "resnet50");
    assert_eq!(r.budgets.default, Duration::from_millis(150));
    assert_eq!(r.budgets.realtime_below, Duration::from_millis(300));
    assert_eq!(r.budgets.offline_from, Duration::from_secs(30));
    assert_eq!(r.when_unmet, WhenUnmet::BestEffort);
    assert_eq!(
        r.flags,
        Flags {
            realtime: true,
            micro_batch: true,
            offline: false,
            micro_batch_percent: 25,
            shadow: false,
            cache: false,
        }
    );
    let rt = r.realtime.as_ref().expect("pool");
    assert_eq!(rt.max_concurrency.get(), 8);
    assert_eq!(rt.endpoints[1].to_string(), "http://127.0.0.1:9001/");
    let mb = r.micro_batch.as_ref().expect("batch pool");
    assert_eq!((mb.max_batch.get(), mb.max_in_flight.get()), (128, 3));
    assert_eq!(mb.pool.max_concurrency.get(), 6, "two endpoints x max_in_flight");
    assert!(mb.pool.is_grpc() && !rt.is_grpc());
    let e = policy.route_for_path("/v1/embeddings").expect("indexed by path");
    assert_eq!(e.budgets.realtime_below, Duration::from_millis(100));
    assert_eq!(e.when_unmet, WhenUnmet::Reject);
    assert!(policy.route_for_model("nope").is_none());
}

#[test]
fn every_problem_is_reported_with_file_and_path() {
    let bad = r#"
[routes.r1]
models = ["m"]
offline_from = "100ms"
[routes.r1.flags]
micro_batch = true
micro_batch_percent = 150
[routes.r1.realtime]
endpoints = ["ftp://x:1", "http://h", "http://h:1/path", "http://a:1", "http://a:1", "grpc://a:2"]
max_concurrency = 0

[routes."bad name"]
paths = ["/v2/models/x/infer", "relative", "/v1/batches"]
[routes."bad name".realtime]
endpoints = []
[routes."bad name".micro_batch]
endpoints = ["http://b:2"]
max_batch = 100
queue_capacity = 10
max_wait = "10s"
"#;
    let other = r#"
[routes.r2]
models = ["m"]
[routes.r2.flags]
realtime = false
offline = true
"#;
    let problems = load(&[("bad.toml", bad), ("other.toml", other)])
        .expect_err("invalid")
        .0;
    let lines: Vec<String> = problems.iter().map(|p| p.to_string()).collect();
    let expect = [
        "bad.toml: routes.r1.offline_from: must be above realtime_below",
        "bad.toml: routes.r1.flags.micro_batch_percent: must be 0 to 100, got 150",
        "bad.toml: routes.r1.realtime.endpoints[0]: \"ftp://x:1\" must start with http://",
        "bad.toml: routes.r1.realtime.endpoints[1]: \"http://h\" has no port",
        "bad.toml: routes.r1.realtime.endpoints[2]: \"http://h:1/path\" must not have a path",
        "bad.toml: routes.r1.realtime.endpoints[4]: \"http://a:1\" is listed twice",
        "bad.toml: routes.r1.realtime.endpoints[5]: \"grpc://a:2\" speaks another protocol than http://a:1/",
        "bad.toml: routes.r1.realtime.max_concurrency: must be between 1",
        "bad.toml: routes.r1.flags.micro_batch: is on but the route has no [micro_batch] pool",
        "bad.toml: routes.bad name: route names use only letters",
        "bad.toml: routes.bad name.realtime.endpoints: needs at least one backend URL",
        "bad.toml: routes.bad name.micro_batch.queue_capacity: must hold at least one full batch",
        "bad.toml: routes.bad name.micro_batch.max_wait: must be more than 0ms and at most 5s",
        "bad.toml: routes.bad name.paths[0]: \"/v2/models/x/infer\" must start with '/' and must not be under /v2",
        "bad.toml: routes.bad name.paths[1]: \"relative\"",
        "bad.toml: routes.bad name.paths[2]: \"/v1/batches\" is under /v1/jobs, /v1/files, /v1/batches",
        "other.toml: routes.r2.flags.offline: is on but the route has no [micro_batch] pool",
        "other.toml: routes.r2.models[0]: model \"m\" is already served by route r1 (bad.toml)",
    ];
    for e in expect {
        assert!(
            lines.iter().any(|l| l.starts_with(e)),
            "missing {e:?} in:\n{}",
            lines.join("\n")
        );
    }
    assert_eq!(
        lines.len(),
        expect.len(),
        "unexpected extra problems:\n{}",
        lines.join("\n")
    );
}

#[test]
fn syntax_and_unknown_keys_are_located() {
    let problems = load(&[
        ("typo.toml", "[routes.a]\nmodels = [\"m\"]\nmax_batch = 3\n"),
        ("syntax.toml", "[routes.b\nmodels = 1\n"),
        ("dur.toml", "[routes.c]\nmodels = [\"c\"]\ndefault_budget = \"soon\"\n[routes.c.realtime]\nendpoints=[\"http://a:1\"]\n"),
    ])
    .expect_err("invalid")
    .0;
    let text = Problems(problems.clone()).to_string();
    assert_eq!(problems.len(), 3, "{text}");
    assert!(
        text.contains("typo.toml: line 3, column 1: unknown field `max_batch`"),
        "{text}"
    );
    assert!(text.contains("syntax.toml: line 1"), "{text}");
    assert!(text.contains("dur.toml: line 3"), "{text}");
}

#[test]
fn defaults_may_be_set_once() {
    let a = "[defaults]\ndefault_budget = \"1s\"\n";
    let problems = load(&[("a.toml", a), ("b.toml", a)]).expect_err("twice").0;
    assert_eq!(problems.len(), 1);
    assert_eq!(
        problems[0].to_string(),
        "b.toml: defaults: already set in a.toml; keep one [defaults] table"
    );
}

#[test]
fn a_directory_loads_sorted_and_reports_unreadable_input() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        dir.path().join("b.toml"),
        "[routes.b]\nmodels=[\"b\"]\n[routes.b.realtime]\nendpoints=[\"http://x:1\"]\n",
    )
    .expect("write");
    std::fs::write(
        dir.path().join("a.toml"),
        "[routes.a]\nmodels=[\"a\"]\n[routes.a.realtime]\nendpoints=[\"http://x:1\"]\n",
    )
    .expect("write");
    std::fs::write(dir.path().join("notes.txt"), "ignored").expect("write");
    let policy = Policy::load_dir(dir.path()).expect("valid");
    let names: Vec<&str> = policy.routes().iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, ["a", "b"]);
    let empty = tempfile::tempdir().expect("tempdir");
    let problems = Policy::load_dir(empty.path()).expect_err("no files");
    assert!(problems.to_string().contains("holds no *.toml policy files"));
}

#[test]
fn store_swaps_snapshots_without_touching_held_ones() {
    let store = Store::new(load(&[("a.toml", GOOD)]).expect("valid"));
    let held = store.load();
    store.swap(Policy::default());
    assert!(
        held.route_for_model("resnet50").is_some(),
        "a request keeps its snapshot"
    );
    assert!(store.load().route_for_model("resnet50").is_none());
}

#[test]
fn tls_endpoints_are_named_by_their_scheme_and_keep_to_one_protocol() {
    let good = r#"
[routes.a]
models = ["a"]
[routes.a.realtime]
endpoints = ["https://triton.internal:8443", "https://10.0.0.5:8443"]
[routes.a.micro_batch]
endpoints = ["grpcs://[::1]:8001"]
"#;
    let policy = load(&[("tls.toml", good)]).expect("valid");
    let route = policy.route("a").expect("route");
    let realtime = route.realtime.as_ref().expect("realtime");
    let batch = &route.micro_batch.as_ref().expect("batch").pool;
    assert!(realtime.is_tls() && !realtime.is_grpc());
    assert!(batch.is_tls() && batch.is_grpc());

    let mixed = r#"
[routes.b]
models = ["b"]
[routes.b.realtime]
endpoints = ["https://a:1", "http://a:2"]
"#;
    let problems = load(&[("mixed.toml", mixed)]).expect_err("two protocols").0;
    let text: Vec<String> = problems.iter().map(|p| p.to_string()).collect();
    assert!(
        text.iter()
            .any(|p| p.contains("\"http://a:2\" speaks another protocol than https://a:1/")),
        "{text:?}"
    );
}

#[test]
fn a_bad_default_is_reported_once_where_it_is_written() {
    let with_defaults = r#"
[defaults]
realtime_below = "2h"
default_budget = "0s"
[routes.a]
models = ["a"]
[routes.a.realtime]
endpoints = ["http://127.0.0.1:1"]
"#;
    let other = r#"
[routes.c]
models = ["c"]
[routes.c.realtime]
endpoints = ["http://127.0.0.1:1"]
[routes.d]
models = ["d"]
offline_from = "1s"
[routes.d.realtime]
endpoints = ["http://127.0.0.1:1"]
"#;
    let problems = load(&[("a.toml", with_defaults), ("b.toml", other)])
        .expect_err("invalid")
        .0;
    let lines: Vec<String> = problems.iter().map(|p| p.to_string()).collect();
    assert_eq!(
        lines,
        [
            "a.toml: defaults.default_budget: must be more than 0ms",
            "a.toml: defaults.offline_from: must be above realtime_below (2h), got 1m",
            "b.toml: routes.d.offline_from: must be above realtime_below (2h), got 1s",
        ],
        "the defaults once, and a route only for what it sets itself"
    );
}

#[test]
fn a_batch_pools_bands_and_tenant_weights_are_checked() {
    let text = r#"
[routes.r]
models = ["m"]
[routes.r.flags]
realtime = false
micro_batch = true
[routes.r.micro_batch]
endpoints = ["http://b:1"]
queue_capacity = 100
priority = "sheddable"
shed_above = 0.3
tenant_weights = { gold = 4 }
tenant_max_priority = { gold = "critical", lead = "sheddable" }
"#;
    let policy = load(&[("ok.toml", text)]).expect("valid");
    let route = policy.route("r").expect("route");
    let s = &route.micro_batch.as_ref().expect("pool").scheduling;
    assert_eq!(
        (s.priority, s.max_priority, s.shed_at),
        (Priority::Sheddable, Priority::Standard, 30),
        "nobody names a band above standard unless the operator says so"
    );
    assert_eq!(s.tenant_weights["gold"].get(), 4);
    assert_eq!(route.tenant_header.as_str(), "x-api-key");
    use crate::tenant::Tenant;
    let ceilings = [
        Tenant::named("gold"),
        Tenant::named("lead"),
        Tenant::named("other"),
        Tenant::anonymous(),
    ]
    .map(|t| s.ceiling(&t));
    assert_eq!(
        ceilings,
        [
            Priority::Critical,
            Priority::Sheddable,
            Priority::Standard,
            Priority::Standard
        ],
        "a tenant's own ceiling holds only for a tenant with a credential"
    );
    let critical = load(&[(
        "c.toml",
        &text.replace("priority = \"sheddable\"", "priority = \"critical\""),
    )])
    .expect("valid");
    let c = &critical
        .route("r")
        .expect("route")
        .micro_batch
        .as_ref()
        .expect("pool")
        .scheduling;
    assert_eq!(
        c.max_priority,
        Priority::Critical,
        "a route's own band is never above its ceiling"
    );

    let bad = text
        .replace(
            "priority = \"sheddable\"",
            "priority = \"critical\"\nmax_priority = \"urgent\"",
        )
        .replace("shed_above = 0.3", "shed_above = 1.5\ntenant_header = \"bad header\"")
        .replace("gold = 4", "gold = 0")
        .replace("lead = \"sheddable\"", "lead = \"top\"");
    reports(
        "bad.toml",
        &bad,
        &[
            "bad.toml: routes.r.micro_batch.max_priority: \"urgent\" is not a band",
            "bad.toml: routes.r.micro_batch.shed_above: must be a share of queue_capacity",
            "bad.toml: routes.r.micro_batch.tenant_max_priority.lead: \"top\" is not a band",
            "bad.toml: routes.r.micro_batch.tenant_weights.gold: must be between 1 and 1000, got 0",
            "bad.toml: routes.r.micro_batch.tenant_header: \"bad header\" is not a valid header name",
        ],
    );
    // One tenant header per route: set in more than one place, they must agree.
    let twice = text.replace("[routes.r.flags]", "tenant_header = \"x-team\"\n[routes.r.flags]")
        + "tenant_header = \"x-api-key\"\n[routes.r.limits]\ntenant_rate = 5.0\ntenant_header = \"x-team\"\n";
    reports(
        "twice.toml",
        &twice,
        &["twice.toml: routes.r.micro_batch.tenant_header: names x-api-key but routes.r.tenant_header names x-team"],
    );
    let agreed = load(&[(
        "one.toml",
        &twice.replace("tenant_header = \"x-api-key\"", "tenant_header = \"x-team\""),
    )])
    .expect("valid");
    assert_eq!(agreed.route("r").expect("route").tenant_header.as_str(), "x-team");
    let above = text.replace(
        "priority = \"sheddable\"",
        "priority = \"critical\"\nmax_priority = \"standard\"",
    );
    let lines = load(&[("above.toml", &above)]).expect_err("invalid").0;
    assert!(
        lines[0]
            .to_string()
            .contains("priority: critical is above max_priority (standard)"),
        "{lines:?}"
    );
}

#[test]
fn combined_models_are_checked() {
    let text = r#"
[routes.r]
models = ["ctr", "cvr"]
[routes.r.flags]
realtime = false
micro_batch = true
[routes.r.micro_batch]
endpoints = ["http://b:1"]
[routes.r.micro_batch.combined.heads]
ctr = { prob = "ctr_prob", logit = "ctr_logit" }
cvr = { prob = "cvr_prob" }
"#;
    let policy = load(&[("ok.toml", text)]).expect("valid");
    let spec = policy.route("r").expect("route").micro_batch.clone().expect("pool");
    let ctr = &spec.combined["ctr"];
    assert_eq!(ctr.combined, "heads");
    assert_eq!(
        ctr.outputs,
        [
            ("prob".to_owned(), "ctr_prob".to_owned()),
            ("logit".to_owned(), "ctr_logit".to_owned())
        ],
        "in the order the file writes them"
    );
    assert_eq!(spec.combined["cvr"].outputs.len(), 1);

    let bad = text
        .replace("models = [\"ctr\", \"cvr\"]", "models = [\"ctr\"]")
        .replace("cvr = { prob = \"cvr_prob\" }", "cvr = {}\n\"a/b\" = { x = \"\" }")
        + "[routes.r.micro_batch.combined.other]\nctr = { p = \"q\" }\n[routes.r.micro_batch.combined.empty]\n";
    reports(
        "bad.toml",
        &bad,
        &[
            "bad.toml: routes.r.micro_batch.combined.heads.cvr: names no output",
            "bad.toml: routes.r.micro_batch.combined.heads.a/b: the member's name \"a/b\" is not a model name",
            "bad.toml: routes.r.micro_batch.combined.heads.a/b.x: \"\" is not an output name",
            "bad.toml: routes.r.micro_batch.combined.other.ctr: ctr is already a member of heads",
            "bad.toml: routes.r.micro_batch.combined.empty: names no member",
            "bad.toml: routes.r.micro_batch.combined.heads.cvr: cvr is not one of the route's models",
        ],
    );
}

#[test]
fn retry_and_fallback_tables_are_checked() {
    let bad = r#"
[routes.r]
models = ["m"]
[routes.r.flags]
realtime = false
micro_batch = true
[routes.r.micro_batch]
endpoints = ["http://b:1"]
[routes.r.micro_batch.retry]
on = ["reset", "always"]
max_retries = 11
budget_percent = 150
min_per_second = -1
[routes.r.fallback]
endpoints = ["http://f:1"]
model = "m/../x"
[routes.r.fallback.hedge]
after = "2m"
budget_percent = -2
"#;
    reports(
        "r.toml",
        bad,
        &[
            "r.toml: routes.r.micro_batch.retry.on[1]: must be \"reset\", \"unavailable\" or \"error\", got \"always\" (an unreachable endpoint is always retried)",
            "r.toml: routes.r.micro_batch.retry.max_retries: must be 0 to 10, got 11",
            "r.toml: routes.r.micro_batch.retry.budget_percent: must be 0 to 100, got 150",
            "r.toml: routes.r.micro_batch.retry.min_per_second: must be 0 to 10000, got -1",
            "r.toml: routes.r.fallback.model: must be a model name (letters, digits, '-', '_' and '.', at most 256), got \"m/../x\"",
            "r.toml: routes.r.fallback.hedge.after: must be 1ms to 60s, got 120s",
            "r.toml: routes.r.fallback.hedge.budget_percent: must be 0 to 100, got -2",
            "r.toml: routes.r.fallback: stands in for the [realtime] pool, and the route has none",
        ],
    );
    let good = "[routes.r]\nmodels = [\"m\"]\n[routes.r.realtime]\nendpoints = [\"http://a:1\"]\n\
                [routes.r.realtime.retry]\non = []\n[routes.r.realtime.hedge]\n\
                [routes.r.fallback]\nendpoints = [\"http://f:1\"]\n";
    let policy = load(&[("r.toml", good)]).expect("valid");
    let route = &policy.routes()[0];
    let retry = route.realtime.as_ref().expect("pool").retry;
    assert_eq!(
        (
            retry.on,
            retry.max_retries,
            retry.budget_per_mille,
            retry.min_per_second
        ),
        (Some(RetryOn::default()), 2, 100, 3)
    );
    let hedge = route.realtime.as_ref().expect("pool").hedge;
    assert_eq!(
        hedge,
        Some(HedgeSpec {
            after: None,
            budget_per_mille: 20
        }),
        "the p95, within 2%"
    );
    assert_eq!(route.fallback.as_ref().expect("fallback").hedge, None, "off unless set");
}
