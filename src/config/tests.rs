use super::*;

#[test]
fn defaults_bind_loopback_on_triton_ports() {
    let config = Config::load(None, Vec::new()).expect("defaults load");
    assert_eq!(config.listen.http.to_string(), "127.0.0.1:8000");
    assert_eq!(config.listen.grpc.to_string(), "127.0.0.1:8001");
    assert_eq!(config.listen.metrics.to_string(), "127.0.0.1:8002");
    assert_eq!(config.listen.admin.to_string(), "127.0.0.1:8003");
    assert_eq!(
        (config.listen.bulk_http, config.listen.bulk_grpc),
        (None, None),
        "bulk doors off"
    );
}

#[test]
fn bulk_doors_come_from_the_file_or_the_environment() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("tiergate.toml");
    std::fs::write(&file, "[listen]\nbulk_http = \"0.0.0.0:8010\"\n").expect("write");
    let env = vec![("TIERGATE_LISTEN__BULK_GRPC".to_owned(), "0.0.0.0:8011".to_owned())];
    let config = Config::load(Some(&file), env).expect("loads");
    assert_eq!(config.listen.bulk_http, Some("0.0.0.0:8010".parse().expect("addr")));
    assert_eq!(config.listen.bulk_grpc, Some("0.0.0.0:8011".parse().expect("addr")));
    let env = vec![("TIERGATE_LISTEN__BULK_HTTP".to_owned(), "nowhere".to_owned())];
    let err = Config::load(None, env).expect_err("a bad address is refused");
    assert!(err.to_string().contains("bulk_http"), "{err}");
}

#[test]
fn file_then_environment() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("tiergate.toml");
    std::fs::write(
        &file,
        "policy_dir = \"/etc/tiergate\"\n[listen]\nhttp = \"0.0.0.0:9000\"\n[limits]\nheader_read_timeout = \"3s\"\n",
    )
    .expect("write");
    let env = vec![
        ("TIERGATE_LISTEN__HTTP".to_owned(), "0.0.0.0:9001".to_owned()),
        ("TIERGATE_THREADS__WORKERS".to_owned(), "3".to_owned()),
        ("TIERGATE_DATA_DIR".to_owned(), "/var/lib/tiergate".to_owned()),
        ("OTHER".to_owned(), "ignored".to_owned()),
        ("TIERGATE_URL".to_owned(), "http://client.side".to_owned()),
        ("TIERGATE_ADMIN__TOKEN".to_owned(), "s3cret-token-value".to_owned()),
        (
            "TIERGATE_BACKENDS__ALLOW".to_owned(),
            "10.0.0.0/8,triton.internal".to_owned(),
        ),
        (
            "TIERGATE_BACKENDS__CA_FILE".to_owned(),
            "/etc/tiergate/ca.pem".to_owned(),
        ),
        ("TIERGATE_GRPC__ANSWER_COMPRESSION".to_owned(), "gzip".to_owned()),
    ];
    let config = Config::load(Some(&file), env).expect("loads");
    assert_eq!(config.listen.http.to_string(), "0.0.0.0:9001");
    assert_eq!(config.policy_dir, PathBuf::from("/etc/tiergate"));
    assert_eq!(config.data_dir, PathBuf::from("/var/lib/tiergate"));
    assert_eq!(config.threads.workers, 3);
    assert_eq!(config.limits.header_read_timeout, Duration::from_secs(3));
    assert_eq!(config.backends.allow, ["10.0.0.0/8", "triton.internal"]);
    assert_eq!(config.backends.ca_file, Some(PathBuf::from("/etc/tiergate/ca.pem")));
    assert_eq!(config.grpc.answer_compression, crate::config::Compression::Gzip);
    let token = config.admin.token.expect("token from the environment");
    assert_eq!(token.0, "s3cret-token-value");
    assert!(!format!("{token:?}").contains("s3cret"), "secrets never print");
}

#[test]
fn unknown_keys_are_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("tiergate.toml");
    std::fs::write(&file, "[listen]\nhtp = \"0.0.0.0:9000\"\n").expect("write");
    let err = Config::load(Some(&file), Vec::new()).expect_err("typo refused");
    assert!(err.to_string().contains("htp"), "{err}");
}

#[test]
fn cpu_lists_come_from_the_file_or_the_environment_and_bad_ones_say_why() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("tiergate.toml");
    std::fs::write(&file, "[threads]\nrealtime_cpus = \"0-3,8\"\n").expect("write");
    let env = vec![("TIERGATE_THREADS__BATCH_CPUS".to_owned(), "1".to_owned())];
    let config = Config::load(Some(&file), env).expect("loads");
    assert_eq!(config.threads.realtime_cpus.to_string(), "0-3,8");
    assert_eq!(
        config.threads.batch_cpus.to_string(),
        "1",
        "a bare number from the environment"
    );
    assert_eq!(
        config.threads.realtime_workers(),
        5,
        "workers = 0: one per real-time CPU"
    );
    assert_eq!(Config::default().threads.realtime_workers(), 0, "tokio's one per core");
    let env = vec![("TIERGATE_THREADS__BATCH_CPUS".to_owned(), "3-1".to_owned())];
    let err = Config::load(None, env).expect_err("a backwards range is refused");
    assert!(err.to_string().contains("runs backwards"), "{err}");
}

#[test]
fn validation_reports_every_problem_with_its_key() {
    let mut config = Config::default();
    config.threads.batch_nice = 25;
    config.threads.batch_workers = 0;
    config.limits.budget_reserve = 0.9;
    config.limits.max_connections = 0;
    config.offline.max_attempts = 0;
    config.shutdown.drain_delay = Duration::from_secs(30);
    config.listen.grpc = config.listen.http;
    config.kafka.sources = vec![KafkaSource {
        route: "r".into(),
        input: "t".into(),
        output: "t".into(),
        path: "v2/models/m/infer".into(),
        group: None,
        budget: Duration::ZERO,
        max_in_flight: 0,
        precompute: None,
    }];
    let problems = config.validate().expect_err("refused").0;
    let keys: Vec<&str> = problems.iter().map(|p| p.key.as_str()).collect();
    assert_eq!(
        keys,
        [
            "threads.batch_nice",
            "threads.batch_workers",
            "limits.max_connections",
            "limits.budget_reserve",
            "offline.max_attempts",
            "kafka.sources[0].max_in_flight",
            "kafka.sources[0].budget",
            "kafka.sources[0].path",
            "kafka.sources[0].output",
            "listen.grpc",
            "shutdown.drain_delay",
        ],
        "{problems:?}"
    );
    assert!(problems.iter().all(|p| !p.message.is_empty()));
    let grpc = problems.iter().find(|p| p.key == "listen.grpc").expect("listen.grpc");
    assert!(grpc.message.contains("listen.http"), "{grpc:?}");
    assert!(Config::default().validate().is_ok(), "the defaults are valid");
}

#[test]
fn the_admin_api_may_not_share_a_data_port() {
    let mut config = Config::default();
    config.listen.admin = config.listen.metrics;
    assert!(config.validate().is_ok(), "no admin API configured: nothing shares");
    config.admin.token = Some(Secret("a-long-enough-admin-token".into()));
    let problems = config.validate().expect_err("refused").0;
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert_eq!(problems[0].key, "listen.admin");
    assert!(problems[0].message.contains("a port of its own"), "{problems:?}");
}

#[test]
fn the_memory_limit_defaults_to_most_of_what_the_process_may_use() {
    let limit = Limits::default().max_rss_bytes;
    let meminfo = std::fs::read_to_string("/proc/meminfo").expect("Linux");
    let kib: u64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .expect("MemTotal");
    assert!(limit > 0, "on by default");
    assert!(
        limit <= kib * 1024 / 5 * 4,
        "at most 80% of the machine's memory: {limit}"
    );
}
