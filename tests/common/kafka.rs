//! A real Kafka-protocol broker for the tests: tansu (`scripts/tansu.sh` installs it;
//! the test command passes its path in `TANSU_BIN`), started on loopback.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use tokio::time::Instant;

use super::free_port;

/// A tansu broker on a free loopback port, killed when dropped.
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
    pub async fn start() -> Broker {
        let bin = std::env::var("TANSU_BIN")
            .expect("TANSU_BIN names the tansu broker (scripts/test sets it from scripts/tansu.sh)");
        let port = free_port();
        let url = format!("tcp://127.0.0.1:{port}");
        let child = Command::new(bin)
            .args(["broker", "--listener-url", &url, "--advertised-listener-url", &url])
            .args(["--storage-engine", "memory://tansu/"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("tansu starts");
        let broker = Broker {
            child,
            addr: format!("127.0.0.1:{port}"),
        };
        let limit = Instant::now() + Duration::from_secs(30);
        while tokio::net::TcpStream::connect(&broker.addr).await.is_err() {
            assert!(Instant::now() < limit, "tansu did not listen within 30 s");
            tokio::time::sleep(Duration::from_millis(50)).await; // waiting for a child process to bind
        }
        broker
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
