//! A `tiergate serve` child process on port 0, its addresses from its log, and its log
//! lines (JSON) as it writes them: for tests of what the process itself does (its stop,
//! what it logs).

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use tokio::time::Instant;

/// A `tiergate serve` child process and the addresses it reported.
pub struct Served {
    pub child: Child,
    pub http: SocketAddr,
    pub grpc: SocketAddr,
    pub metrics: SocketAddr,
    pub log: mpsc::Receiver<String>,
    /// The lines [`Served::lines`] has read so far.
    seen: std::sync::Mutex<Vec<String>>,
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill(); // only if a failed test left it running
        let _ = self.child.wait();
    }
}

/// Starts `tiergate serve` on port 0 with the policy in `dir/policies`, its data in
/// `dir/data` and the settings `env` adds, and waits for its "serving" log line.
pub fn serve(dir: &Path, env: &[(&str, &str)]) -> Served {
    let mut child = Command::new(env!("CARGO_BIN_EXE_tiergate"))
        .arg("serve")
        .env_clear()
        .env("TIERGATE_POLICY_DIR", dir.join("policies"))
        .env("TIERGATE_DATA_DIR", dir.join("data"))
        .env("TIERGATE_LISTEN__HTTP", "127.0.0.1:0")
        .env("TIERGATE_LISTEN__GRPC", "127.0.0.1:0")
        .env("TIERGATE_LISTEN__METRICS", "127.0.0.1:0")
        .env("TIERGATE_LOG__FORMAT", "json")
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("tiergate starts");
    let stderr = child.stderr.take().expect("piped");
    let (tx, log) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    // Owned from here on, so a failed wait below still stops the process.
    let mut served = Served {
        child,
        http: SocketAddr::from(([127, 0, 0, 1], 0)),
        grpc: SocketAddr::from(([127, 0, 0, 1], 0)),
        metrics: SocketAddr::from(([127, 0, 0, 1], 0)),
        log,
        seen: std::sync::Mutex::default(),
    };
    let limit = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let line = served
            .log
            .recv_timeout(limit.saturating_duration_since(std::time::Instant::now()))
            .expect("the gateway logs that it is serving within 20 s");
        let Ok(entry) = serde_json::from_str::<serde_json::Value>(&line) else {
            continue;
        };
        if entry["fields"]["message"] == "tiergate is serving" {
            let addr = |door: &str| {
                let text = entry["fields"][door].as_str().expect("an address");
                text.parse::<SocketAddr>().expect("address")
            };
            (served.http, served.grpc, served.metrics) = (addr("http"), addr("grpc"), addr("metrics"));
            return served;
        }
    }
}

impl Served {
    pub fn terminate(&self) {
        let pid = rustix::process::Pid::from_child(&self.child);
        rustix::process::kill_process(pid, rustix::process::Signal::TERM).expect("SIGTERM");
    }

    /// Waits for the process to exit (within `limit`), returning its status and the
    /// log lines it wrote since start-up. The test's own backends keep running meanwhile.
    pub async fn exit(&mut self, limit: Duration) -> (std::process::ExitStatus, Vec<String>) {
        let until = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                return (status, self.lines());
            }
            assert!(Instant::now() < until, "the gateway did not exit within {limit:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Served {
    /// Every line (each one JSON) the gateway has logged so far, read without waiting:
    /// those written since the last call added to those read before.
    pub fn lines(&self) -> Vec<String> {
        let mut seen = self.seen.lock().expect("not poisoned");
        seen.extend(self.log.try_iter());
        seen.clone()
    }
}
