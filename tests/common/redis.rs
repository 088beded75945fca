//! A real Redis for the cache tests: Debian's server (`scripts/redis.sh` installs it;
//! the test command passes its path in `REDIS_SERVER`), listening on a Unix socket of
//! its own (no TCP port to pick, none another test can take), with nothing written to
//! disk, and stopped by its PID.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::Instant;

/// A redis-server on a Unix socket, killed when dropped.
pub struct Redis {
    child: Option<Child>,
    /// The socket's path, as the gateway's metrics name it.
    pub addr: String,
    _dir: tempfile::TempDir,
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.kill();
    }
}

impl Redis {
    pub async fn start() -> Redis {
        let dir = tempfile::tempdir().expect("a directory for the socket");
        let mut redis = Redis {
            child: None,
            addr: dir.path().join("redis.sock").display().to_string(),
            _dir: dir,
        };
        redis.restart().await;
        redis
    }

    /// `redis+unix:///PATH`.
    pub fn url(&self) -> String {
        format!("redis+unix://{}", self.addr)
    }

    /// Kills the server (SIGKILL, by its PID) and waits for it to end.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops the server answering (SIGSTOP): a slow Redis, as slow as can be.
    pub fn freeze(&self) {
        self.signal("-STOP");
    }

    /// Lets a frozen server go on (SIGCONT).
    pub fn thaw(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, signal: &str) {
        let pid = self.child.as_ref().expect("running").id().to_string();
        let status = Command::new("kill").args([signal, &pid]).status().expect("kill runs");
        assert!(status.success(), "kill {signal} {pid}");
    }

    /// Starts the server (again) on its socket, empty; resolves once it answers PING.
    pub async fn restart(&mut self) {
        self.kill();
        let bin = std::env::var("REDIS_SERVER")
            .expect("REDIS_SERVER names redis-server (scripts/test sets it from scripts/redis.sh)");
        let child = Command::new(bin)
            .args([
                "--port",
                "0",
                "--unixsocket",
                &self.addr,
                "--unixsocketperm",
                "700",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server starts");
        self.child = Some(child);
        let limit = Instant::now() + Duration::from_secs(30);
        while !self.pong().await {
            assert!(Instant::now() < limit, "redis-server did not answer within 30 s");
            tokio::time::sleep(Duration::from_millis(20)).await; // waiting for a child process to listen
        }
    }

    /// Whether the server answers PING.
    async fn pong(&self) -> bool {
        let Ok(mut conn) = tokio::net::UnixStream::connect(&self.addr).await else {
            return false;
        };
        let mut buf = [0u8; 7];
        conn.write_all(b"PING\r\n").await.is_ok() && conn.read_exact(&mut buf).await.is_ok() && &buf == b"+PONG\r\n"
    }

    /// How many keys the server holds (`DBSIZE`).
    pub async fn keys(&self) -> u64 {
        let mut conn = tokio::net::UnixStream::connect(&self.addr)
            .await
            .expect("redis answers");
        conn.write_all(b"DBSIZE\r\n").await.expect("asked");
        let mut reply = Vec::new();
        let mut byte = [0u8; 1];
        while !reply.ends_with(b"\r\n") {
            conn.read_exact(&mut byte).await.expect("an answer");
            reply.push(byte[0]);
        }
        let text = String::from_utf8_lossy(&reply);
        text.trim().trim_start_matches(':').parse().expect("an integer reply")
    }
}
