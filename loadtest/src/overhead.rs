//! `loadtest overhead`: the real-time overhead scenario with nothing running
//! beforehand. Starts `tiergate sim` (resnet50 on the `resnet50-trt` profile) and
//! `tiergate serve` with a one-route realtime-only policy in front of it, both on free
//! loopback ports, then compares `direct` (the simulator) with `gateway` (tiergate) under
//! the same load. Both children die with this process's future: `kill_on_drop`.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::Context as _;
use tokio::process::{Child, Command};

use crate::client;
use crate::compare::{self, Comparison, Report, Target};

/// Model the scenario serves, and the simulator profile behind it.
pub const MODEL: &str = "resnet50";
const PROFILE: &str = "resnet50-trt";
/// Budget sent with every request: well inside the realtime threshold (300 ms).
pub const BUDGET_MS: u64 = 200;
const READY_POLL: Duration = Duration::from_millis(20);
const READY_LIMIT: Duration = Duration::from_secs(10);

/// A child process, its log file, and its name for error messages.
struct Server {
    name: &'static str,
    child: Child,
    log: PathBuf,
}

/// Runs the scenario with `tiergate` as the binary; `cmp` supplies the load (its
/// targets, model and budget are replaced).
pub async fn run(tiergate: &Path, mut cmp: Comparison) -> anyhow::Result<Report> {
    let tiergate = tiergate
        .canonicalize()
        .with_context(|| format!("tiergate binary {}", tiergate.display()))?;
    let dir = tempfile::tempdir().context("creating a temp dir")?;
    let [sim_port, gateway_port] = free_ports()?;
    let sim_addr = format!("127.0.0.1:{sim_port}");
    let sim_url = format!("http://{sim_addr}");
    let model = format!("{MODEL}:{PROFILE}");
    let mut sim = Server::spawn(
        "sim",
        &tiergate,
        dir.path(),
        &["sim", "--http", &sim_addr, "--model", &model],
    )?;
    sim.wait_ready(&sim_url).await?;

    let policy_dir = dir.path().join("policy");
    std::fs::create_dir(&policy_dir)?;
    std::fs::write(policy_dir.join("overhead.toml"), policy_toml(&sim_url))?;
    let gateway_addr = format!("127.0.0.1:{gateway_port}");
    let gateway_url = format!("http://{gateway_addr}");
    let policy_arg = policy_dir.to_str().context("temp dir path is not UTF-8")?;
    let serve_args = [
        "serve",
        "--policy-dir",
        policy_arg,
        "--http",
        &gateway_addr,
        "--grpc",
        "127.0.0.1:0",
        "--metrics",
        "127.0.0.1:0",
    ];
    let mut gateway = Server::spawn("serve", &tiergate, dir.path(), &serve_args)?;
    gateway.wait_ready(&gateway_url).await?;

    cmp.targets = vec![
        Target {
            name: "direct".into(),
            url: sim_url,
        },
        Target {
            name: "gateway".into(),
            url: gateway_url,
        },
    ];
    cmp.model = MODEL.into();
    cmp.budget_ms = Some(BUDGET_MS);
    let report = compare::run(&cmp).await;
    gateway.stop().await;
    sim.stop().await;
    report
}

/// The policy: one route for the model, realtime only, the simulator as its pool.
pub fn policy_toml(endpoint: &str) -> String {
    format!(
        r#"[routes.{MODEL}]
models = ["{MODEL}"]
[routes.{MODEL}.flags]
realtime = true
micro_batch = false
offline = false
[routes.{MODEL}.realtime]
endpoints = ["{endpoint}"]
max_concurrency = 1024
"#
    )
}

/// Distinct free loopback ports: both bound at once, read, then released.
pub fn free_ports<const N: usize>() -> anyhow::Result<[u16; N]> {
    let listeners = (0..N)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0"))
        .collect::<Result<Vec<_>, _>>()
        .context("binding a free loopback port")?;
    let mut ports = [0; N];
    for (port, listener) in ports.iter_mut().zip(&listeners) {
        *port = listener.local_addr()?.port();
    }
    Ok(ports)
}

impl Server {
    /// Spawns `binary args...` in `dir`, output to `dir/{name}.log`, killed on drop.
    fn spawn(name: &'static str, binary: &Path, dir: &Path, args: &[&str]) -> anyhow::Result<Self> {
        let log = dir.join(format!("{name}.log"));
        let out = File::create(&log)?;
        let child = Command::new(binary)
            .args(args)
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {} {}", binary.display(), args.join(" ")))?;
        Ok(Self { name, child, log })
    }

    /// Waits for `GET {url}/v2/health/ready` = 200; fails early if the process exits.
    async fn wait_ready(&mut self, url: &str) -> anyhow::Result<()> {
        let probe = client::new(false);
        let (child, log) = (&mut self.child, &self.log);
        let gone = || match child.try_wait() {
            Ok(Some(status)) => Some(format!("it exited ({status})")),
            Err(e) => Some(format!("cannot check on it: {e}")),
            Ok(None) => None,
        };
        let ready = client::wait_ready(&probe, url, READY_POLL, READY_LIMIT, gone).await;
        ready.with_context(|| {
            format!(
                "tiergate {} at {url}; its output ends with:\n{}",
                self.name,
                log_tail(log)
            )
        })
    }

    /// Kills the process and reaps it.
    async fn stop(mut self) {
        let _ = self.child.kill().await;
    }
}

fn log_tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_distinct_and_nonzero() -> anyhow::Result<()> {
        let [a, b] = free_ports()?;
        assert!(a != 0 && b != 0 && a != b);
        Ok(())
    }

    #[test]
    fn policy_has_one_realtime_route_to_the_simulator() -> anyhow::Result<()> {
        let policy: toml::Value = toml::from_str(&policy_toml("http://127.0.0.1:4242"))?;
        let route = &policy["routes"]["resnet50"];
        assert_eq!(route["models"].as_array().map(Vec::len), Some(1));
        assert_eq!(route["flags"]["realtime"].as_bool(), Some(true));
        assert_eq!(route["flags"]["micro_batch"].as_bool(), Some(false));
        assert_eq!(route["flags"]["offline"].as_bool(), Some(false));
        assert_eq!(
            route["realtime"]["endpoints"][0].as_str(),
            Some("http://127.0.0.1:4242")
        );
        assert_eq!(route["realtime"]["max_concurrency"].as_integer(), Some(1024));
        Ok(())
    }
}
