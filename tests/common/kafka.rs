//! A real Kafka-protocol broker for the tests: tansu (`scripts/tansu.sh` installs it;
//! the test command passes its path in `TANSU_BIN`), started on loopback.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use tokio::time::Instant;

use super::peer_port;

/// A tansu broker on loopback, killed when dropped.
pub struct Broker {
    child: Child,
    /// `127.0.0.1:PORT`.
    pub addr: String,
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Broker {
    /// Starts tansu on a [`peer_port`] (it advertises the port it is given, so it cannot
    /// take port 0), on another when that one turns out taken; resolves once it listens.
    pub async fn start() -> Broker {
        let bin = std::env::var("TANSU_BIN")
            .expect("TANSU_BIN names the tansu broker (scripts/test sets it from scripts/tansu.sh)");
        for _attempt in 0..5 {
            let port = peer_port();
            let url = format!("tcp://127.0.0.1:{port}");
            let child = Command::new(&bin)
                .args(["broker", "--listener-url", &url, "--advertised-listener-url", &url])
                .args(["--storage-engine", "memory://tansu/"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("tansu starts");
            let mut broker = Broker {
                child,
                addr: format!("127.0.0.1:{port}"),
            };
            if broker.listening(Duration::from_secs(30)).await {
                return broker;
            }
        }
        panic!("tansu could not listen on any of five ports");
    }

    /// Whether this broker, and not another process, listens within `limit`: false as
    /// soon as it exits (its port was taken).
    async fn listening(&mut self, limit: Duration) -> bool {
        let until = Instant::now() + limit;
        loop {
            if self.child.try_wait().expect("tansu's status").is_some() {
                return false;
            }
            if tokio::net::TcpStream::connect(&self.addr).await.is_ok()
                && super::ports::listens(self.child.id(), &self.addr)
            {
                return true;
            }
            assert!(Instant::now() < until, "tansu did not listen within {limit:?}");
            tokio::time::sleep(Duration::from_millis(50)).await; // waiting for a child process to bind
        }
    }

    pub fn client(&self) -> ClientConfig {
        let mut config = ClientConfig::new();
        config.set("bootstrap.servers", &self.addr);
        config
    }

    pub async fn create_topics(&self, names: &[&str], partitions: i32) {
        let admin: AdminClient<DefaultClientContext> = self.client().create().expect("admin client");
        let topics: Vec<NewTopic> = names
            .iter()
            .map(|n| NewTopic::new(n, partitions, TopicReplication::Fixed(1)))
            .collect();
        let results = admin
            .create_topics(
                &topics,
                &AdminOptions::new().operation_timeout(Some(Duration::from_secs(10))),
            )
            .await
            .expect("create topics");
        for result in results {
            result.expect("topic created");
        }
    }
}
