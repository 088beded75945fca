//! `tiergate policy check` prints every problem with its file and path.

use std::process::Command;

fn check(dir: &std::path::Path) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_tiergate"))
        .args(["policy", "check"])
        .arg(dir)
        .output()
        .expect("runs");
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

#[test]
fn several_mistakes_are_all_reported() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        dir.path().join("a.toml"),
        "[routes.a]\nmodels = [\"m\"]\noffline_from = \"10ms\"\n[routes.a.flags]\nmicro_batch_percent = 101\n[routes.a.realtime]\nendpoints = [\"http://nohost\"]\n",
    )
    .expect("write");
    std::fs::write(
        dir.path().join("b.toml"),
        "[routes.b]\nmodels = [\"m\"]\nmax_batch = 3\n",
    )
    .expect("write");
    std::fs::write(
        dir.path().join("c.toml"),
        "[routes.c]\nmodels = [\"m\"]\n[routes.c.realtime]\nendpoints = [\"http://a:1\"]\n",
    )
    .expect("write");
    let (ok, text) = check(dir.path());
    assert!(!ok, "exit status is non-zero:\n{text}");
    for needle in [
        "a.toml: routes.a.offline_from: must be above realtime_below",
        "a.toml: routes.a.flags.micro_batch_percent: must be 0 to 100, got 101",
        "a.toml: routes.a.realtime.endpoints[0]: \"http://nohost\" has no port",
        "b.toml: line 3, column 1: unknown field `max_batch`",
        "c.toml: routes.c.models[0]: model \"m\" is already served by route a",
        "5 problem(s)",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
    }
}

#[test]
fn the_shipped_policies_are_valid() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    for dir in ["policies", "policies/examples"] {
        let (ok, text) = check(&root.join(dir));
        assert!(ok, "{dir}:\n{text}");
    }
}

#[test]
fn a_file_is_pointed_to_its_directory_and_an_inert_table_is_noted() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("r.toml");
    std::fs::write(
        &file,
        "[routes.r]\nmodels = [\"m\"]\n[routes.r.realtime]\nendpoints = [\"http://a:1\"]\n[routes.r.cache]\nttl = \"1m\"\n",
    )
    .expect("write");
    let (ok, text) = check(&file);
    assert!(!ok, "{text}");
    assert!(
        text.contains("is a file: tiergate policy check takes the policy directory"),
        "{text}"
    );
    let (ok, text) = check(dir.path());
    assert!(ok, "{text}");
    assert!(
        text.contains("note: ") && text.contains("routes.r.cache is inert while the cache flag is off"),
        "{text}"
    );
}
