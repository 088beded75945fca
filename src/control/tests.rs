use std::path::Path;

use serde_json::json;

use super::*;

const FILE: &str = "# Routes of the test.\n[routes.r]\nmodels = [\"m\"]\n\n[routes.r.flags]\nrealtime = true\n\
                    micro_batch = false   # not yet\n\n[routes.r.realtime]\nendpoints = [\"http://127.0.0.1:1\"]\n\n\
                    [routes.r.micro_batch]\nendpoints = [\"http://127.0.0.1:2\"]\n";
const OTHER: &str =
    "# Untouched.\n[routes.o]\nmodels = [\"o\"]\n[routes.o.realtime]\nendpoints = [\"http://127.0.0.1:3\"]\n";

struct Fixture {
    _dir: tempfile::TempDir,
    policies: PathBuf,
    control: Control,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().expect("tempdir");
    let policies = dir.path().join("policies");
    std::fs::create_dir_all(&policies).expect("mkdir");
    std::fs::write(policies.join("a.toml"), FILE).expect("write");
    std::fs::write(policies.join("b.toml"), OTHER).expect("write");
    let policy = Policy::load_dir(&policies).expect("valid");
    let history = History::open(&dir.path().join("data"), None).expect("history");
    let allow = Allowlist::parse(&["127.0.0.0/8"]).expect("allowlist");
    let control = Control::new(Arc::new(Store::new(policy)), policies.clone(), allow, history).expect("control");
    Fixture {
        _dir: dir,
        policies,
        control,
    }
}

fn flag(value: bool) -> Edit {
    Edit::PatchRoute {
        name: "r".into(),
        patch: json!({"flags": {"micro_batch": value}}),
    }
}

fn audit_lines(control: &Control) -> Vec<serde_json::Value> {
    std::fs::read_to_string(control.history.audit_path())
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON line"))
        .collect()
}

#[test]
fn a_change_is_written_back_versioned_and_audited() {
    let f = fixture();
    let out = f.control.change(&flag(true), None, "alice", false).expect("accepted");
    assert_eq!((out.version_before, out.version_after), (1, 2));
    assert_eq!(out.files, vec![f.policies.join("a.toml").display().to_string()]);
    assert!(
        out.diff.contains("-micro_batch = false   # not yet") && out.diff.contains("+micro_batch = true   # not yet")
    );
    assert_eq!(out.decisions.len(), 2, "{:#?}", out.decisions);
    let on_disk = std::fs::read_to_string(f.policies.join("a.toml")).expect("read");
    assert_eq!(on_disk, FILE.replace("micro_batch = false", "micro_batch = true"));
    assert_eq!(std::fs::read_to_string(f.policies.join("b.toml")).expect("read"), OTHER);
    assert!(f.control.store().load().route("r").expect("r").flags.micro_batch);
    let audit = audit_lines(&f.control);
    assert_eq!(audit.len(), 1);
    assert_eq!(audit[0]["who"], "alice");
    assert_eq!(
        (audit[0]["version_before"].as_u64(), audit[0]["version_after"].as_u64()),
        (Some(1), Some(2))
    );
    // The same change again changes nothing and is not a new version.
    let again = f.control.change(&flag(true), None, "alice", false).expect("accepted");
    assert!(!again.changed && again.version_after == 2);
    assert_eq!(audit_lines(&f.control).len(), 1);
    // The write-back is already running: reloading the directory makes no new version.
    assert!(f.control.reload(&f.policies));
    assert_eq!(f.control.store().load().version(), 2);
}

#[test]
fn stale_etags_invalid_edits_and_dry_runs_change_nothing() {
    let f = fixture();
    let etag = route_etag(&f.control.store().load(), "r").expect("etag");
    f.control
        .change(&flag(true), Some(&etag), "a", false)
        .expect("fresh ETag");
    let err = f
        .control
        .change(&flag(false), Some(&etag), "b", false)
        .expect_err("stale");
    assert!(matches!(err, Refused::Stale(_)), "{err}");

    let bad = Edit::PatchRoute {
        name: "r".into(),
        patch: json!({"micro_batch": {"max_batch": 0, "max_wait": "1h"}}),
    };
    let Err(Refused::Invalid(problems)) = f.control.change(&bad, None, "a", false) else {
        panic!("invalid edit accepted");
    };
    let paths: Vec<&str> = problems.0.iter().map(|p| p.path.as_str()).collect();
    assert!(paths.contains(&"routes.r.micro_batch.max_batch"), "{paths:?}");
    assert!(
        paths.contains(&"routes.r.micro_batch.max_wait"),
        "every problem: {paths:?}"
    );

    let before = std::fs::read_to_string(f.policies.join("a.toml")).expect("read");
    let dry = f.control.change(&flag(false), None, "a", true).expect("dry run");
    assert!(dry.dry_run && dry.changed && dry.version_after == dry.version_before);
    assert_eq!(dry.decisions.len(), 2);
    assert_eq!(
        std::fs::read_to_string(f.policies.join("a.toml")).expect("read"),
        before
    );
    assert_eq!(f.control.store().load().version(), 2);
    assert_eq!(audit_lines(&f.control).len(), 1, "only the accepted change is audited");
}

#[test]
fn backends_outside_the_allowlist_are_refused() {
    let f = fixture();
    let ssrf = Edit::PatchRoute {
        name: "r".into(),
        patch: json!({"realtime": {"endpoints": ["http://169.254.169.254:80"]}}),
    };
    let Err(Refused::Invalid(problems)) = f.control.change(&ssrf, None, "a", false) else {
        panic!("SSRF accepted");
    };
    assert_eq!(problems.0[0].path, "routes.r.realtime.endpoints[0]");
    assert!(problems.0[0].message.contains("allowlist"));
}

#[test]
fn rollback_restores_an_earlier_version_as_a_new_one() {
    let f = fixture();
    f.control.change(&flag(true), None, "a", false).expect("v2");
    let file = Edit::PutFiles(vec![(
        "c.toml".into(),
        OTHER.replace("routes.o", "routes.c").replace("\"o\"", "\"c\""),
    )]);
    f.control.change(&file, None, "a", false).expect("v3");
    assert!(f.policies.join("c.toml").exists());
    let back = f
        .control
        .change(&Edit::Rollback(1), Some("\"v3\""), "a", false)
        .expect("rolled back");
    assert_eq!(back.version_after, 4);
    let running = f.control.store().load();
    assert!(!running.route("r").expect("r").flags.micro_batch);
    assert!(running.route("c").is_none(), "the added file is gone from the policy");
    assert!(!f.policies.join("c.toml").exists() && f.policies.join("c.toml.removed-v4").exists());
    assert_eq!(std::fs::read_to_string(f.policies.join("a.toml")).expect("read"), FILE);
    assert!(matches!(
        f.control.change(&Edit::Rollback(99), None, "a", false),
        Err(Refused::NotFound(_))
    ));
    let actions: Vec<String> = f
        .control
        .history()
        .expect("history")
        .into_iter()
        .map(|s| s.action)
        .collect();
    assert_eq!(actions, ["start", "patch_route", "put_files", "rollback"]);
}

#[test]
fn new_routes_get_their_own_file_and_bad_names_are_refused() {
    let f = fixture();
    let spec = json!({"models": ["n"], "realtime": {"endpoints": ["http://127.0.0.1:9"]}});
    let put = |name: &str| Edit::PutRoute {
        name: name.into(),
        spec: spec.clone(),
    };
    f.control.change(&put("n"), None, "a", false).expect("created");
    let text = std::fs::read_to_string(f.policies.join("n.toml")).expect("new file");
    assert!(text.starts_with("# Route n, created through the tiergate admin API."));
    assert!(Policy::load_dir(&f.policies).expect("valid").route("n").is_some());
    assert!(matches!(
        f.control.change(&put("../x"), None, "a", false),
        Err(Refused::Invalid(_))
    ));
    let traversal = Edit::PutFiles(vec![("../x.toml".into(), String::new())]);
    assert!(matches!(
        f.control.change(&traversal, None, "a", false),
        Err(Refused::Invalid(_))
    ));
    assert!(!Path::new(&f.policies).join("../x.toml").exists());
}
