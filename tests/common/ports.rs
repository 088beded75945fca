//! Where child processes listen, without a test ever picking a port and hoping it stays
//! free: `tiergate sim` and `tiergate serve` bind port 0 and say what they bound (the sim
//! on stdout, the gateway in its "serving" log line); a peer that must be told its port
//! (tansu advertises it, Triton and MLServer take it as a setting) gets one below the
//! kernel's ephemeral range, where no port-0 socket of this or any process can land, and
//! is started again on another if that one turns out taken.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// A `tiergate sim` child process serving `m` (instant) and where it listens.
pub struct SimChild {
    pub child: Child,
    pub http: SocketAddr,
    pub grpc: Option<SocketAddr>,
}

impl Drop for SimChild {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl SimChild {
    /// Kills the process (SIGKILL) and waits for it to end.
    pub fn kill(&mut self) {
        self.child.kill().expect("SIGKILL");
        self.child.wait().expect("reaped");
    }
}

/// Starts `tiergate sim` on `http` (0: a port the system picks), with a gRPC door on
/// `grpc` when given, and reads the addresses from the line it prints once it listens.
/// A port given again (a backend coming back where it was) is the one it had.
pub fn sim_process(http: u16, grpc: Option<u16>) -> SimChild {
    let mut command = Command::new(env!("CARGO_BIN_EXE_tiergate"));
    command.args(["sim", "--http", &format!("127.0.0.1:{http}"), "--model", "m:instant"]);
    if let Some(grpc) = grpc {
        command.args(["--grpc", &format!("127.0.0.1:{grpc}")]);
    }
    let mut child = command
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("sim starts");
    let stdout = child.stdout.take().expect("piped");
    let (tx, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let line = lines
        .recv_timeout(Duration::from_secs(20))
        .unwrap_or_else(|_| panic!("tiergate sim did not say where it listens within 20 s"));
    let addr = |key: &str| field(&line, key).map(|v| v.parse::<SocketAddr>().expect("an address"));
    SimChild {
        http: addr("http").unwrap_or_else(|| panic!("no http= in {line:?}")),
        grpc: addr("grpc"),
        child,
    }
}

/// The addresses a gateway's "tiergate is serving" log line names (text or JSON), if
/// `log` holds one.
#[derive(Clone, Copy, Debug)]
pub struct Serving {
    pub http: SocketAddr,
    pub grpc: SocketAddr,
    pub metrics: SocketAddr,
}

/// The last "tiergate is serving" line of `log`, if there is one.
pub fn serving(log: &str) -> Option<Serving> {
    let line = log.lines().rev().find(|l| l.contains("tiergate is serving"))?;
    let addr = |key| field(line, key)?.parse().ok();
    Some(Serving {
        http: addr("http")?,
        grpc: addr("grpc")?,
        metrics: addr("metrics")?,
    })
}

/// Waits (up to `limit`) for the "tiergate is serving" line a gateway `child` writes to
/// the file `log` after its first `from` bytes; fails with the log when the child exits
/// first or the time is up. Polling the file is the only signal such a process gives.
pub async fn wait_serving(log: &std::path::Path, from: usize, child: &mut Child, limit: Duration) -> Serving {
    let until = std::time::Instant::now() + limit;
    loop {
        let written = std::fs::read(log).unwrap_or_default();
        let this_life = String::from_utf8_lossy(&written[from.min(written.len())..]).into_owned();
        if let Some(at) = serving(&this_life) {
            return at;
        }
        if let Some(status) = child.try_wait().expect("child status") {
            panic!("the gateway exited ({status}) before it served; its log:\n{this_life}");
        }
        assert!(
            std::time::Instant::now() < until,
            "the gateway did not serve within {limit:?}; its log:\n{this_life}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `key`'s value in `line`, written `key=value` (text logs, the sim's line) or
/// `"key":"value"` (JSON logs).
fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    let padded = format!(" {line}");
    for (open, close) in [(format!(" {key}="), ' '), (format!("\"{key}\":\""), '"')] {
        if let Some(at) = padded.find(&open) {
            let start = at + open.len() - 1; // `padded` is one longer than `line`
            let rest = &line[start..];
            return Some(rest.split(close).next().unwrap_or(rest));
        }
    }
    None
}

/// A loopback port for a peer that must be told where to listen: random, below the
/// kernel's ephemeral range (so never one a port-0 bind or an outgoing connection holds),
/// and not listening now. Another test's peer may still take it first: the caller starts
/// its peer again on another when the peer fails to bind.
pub fn peer_port() -> u16 {
    let (low, _) = ephemeral_range();
    let floor = 10_000u16.min(low.saturating_sub(1_000));
    loop {
        let port = floor + (rand::random::<u16>() % (low - floor));
        if !listening(port) {
            return port;
        }
    }
}

/// `N` different [`peer_port`]s.
pub fn peer_ports<const N: usize>() -> [u16; N] {
    let mut ports = [0u16; N];
    for i in 0..N {
        ports[i] = loop {
            let port = peer_port();
            if !ports[..i].contains(&port) {
                break port;
            }
        };
    }
    ports
}

/// The kernel's ephemeral port range (Linux's default when it cannot be read).
fn ephemeral_range() -> (u16, u16) {
    let text = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").unwrap_or_default();
    let mut parts = text.split_whitespace().filter_map(|p| p.parse().ok());
    match (parts.next(), parts.next()) {
        (Some(low), Some(high)) if low > 11_000 => (low, high),
        _ => (32_768, 60_999),
    }
}

/// Whether something listens on `port` (any address, IPv4 or IPv6), from /proc/net.
fn listening(port: u16) -> bool {
    !listening_inodes(port).is_empty()
}

/// The socket inodes listening on `port` (IPv4 or IPv6), from /proc/net.
fn listening_inodes(port: u16) -> Vec<String> {
    let hex = format!(":{port:04X}");
    ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .flat_map(|table| {
            let text = std::fs::read_to_string(table).unwrap_or_default();
            text.lines()
                .skip(1)
                .filter_map(|l| {
                    // local_address is column 1, st (0A = LISTEN) column 3, inode column 9.
                    let cols: Vec<&str> = l.split_whitespace().collect();
                    (cols.len() > 9 && cols[1].ends_with(&hex) && cols[3] == "0A").then(|| cols[9].to_owned())
                })
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Whether process `pid` or one of its descendants (a peer's server may be a child of a
/// launcher) holds the socket listening on `addr`'s port: a peer that lost the race
/// for its port to another process is not mistaken for listening.
pub fn listens(pid: u32, addr: &str) -> bool {
    let Some(port) = addr.rsplit(':').next().and_then(|p| p.parse().ok()) else {
        return false;
    };
    let inodes = listening_inodes(port);
    let mut pids = vec![pid.to_string()];
    let mut at = 0;
    while at < pids.len() {
        let tasks = std::fs::read_dir(format!("/proc/{}/task", pids[at]))
            .into_iter()
            .flatten()
            .flatten();
        for task in tasks {
            let children = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
            pids.extend(children.split_whitespace().map(str::to_owned));
        }
        at += 1;
    }
    pids.iter().any(|pid| {
        let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
            .into_iter()
            .flatten()
            .flatten();
        fds.filter_map(|fd| std::fs::read_link(fd.path()).ok()).any(|link| {
            let link = link.to_string_lossy();
            inodes.iter().any(|inode| link == format!("socket:[{inode}]"))
        })
    })
}

#[test]
fn fields_are_read_from_text_and_json_lines() {
    let text = "2026-12-03T10:00:00Z  INFO tiergate::app: tiergate is serving http=127.0.0.1:4001 \
                grpc=127.0.0.1:4002 metrics=127.0.0.1:4003 bulk_http=None";
    let json = r#"{"fields":{"message":"tiergate is serving","http":"127.0.0.1:5001","grpc":"127.0.0.1:5002","metrics":"127.0.0.1:5003","bulk_http":"None"}}"#;
    assert_eq!(serving(text).expect("text").http.port(), 4001);
    assert_eq!(serving(text).expect("text").metrics.port(), 4003);
    assert_eq!(serving(json).expect("json").grpc.port(), 5002);
    assert_eq!(
        field("listening http=127.0.0.1:7 grpc=127.0.0.1:8", "grpc"),
        Some("127.0.0.1:8")
    );
    assert_eq!(field("listening http=127.0.0.1:7", "grpc"), None);
    assert!(serving("tiergate is starting").is_none());
}
