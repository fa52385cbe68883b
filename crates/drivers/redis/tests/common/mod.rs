//! Finding the test servers: `scripts/redis start` and `scripts/redis-cluster start`. In CI
//! (`CI=true`) a missing server fails the test; elsewhere the test is skipped with a message.

#![allow(dead_code, unreachable_pub)]

use flowstate_driver_redis::{RedisClusterConnector, RedisConnector};
use flowstate_state::Connector;

/// The single server's address (`REDIS_URL`, default port 6379).
pub fn redis_url() -> String {
    std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

/// The cluster's seed nodes (`REDIS_CLUSTER_NODES`, comma-separated; default ports 7001-7003).
pub fn cluster_nodes() -> Vec<String> {
    std::env::var("REDIS_CLUSTER_NODES")
        .unwrap_or_else(|_| {
            "redis://127.0.0.1:7001,redis://127.0.0.1:7002,redis://127.0.0.1:7003".into()
        })
        .split(',')
        .map(str::to_owned)
        .collect()
}

fn missing(what: &str, start: &str, e: impl std::fmt::Display) -> Option<()> {
    if std::env::var("CI").is_ok_and(|v| v == "true" || v == "1") {
        panic!("{what} is not running ({e}); CI starts it with {start}");
    }
    eprintln!("SKIPPED: {what} is not running ({e}); start it with {start}");
    None
}

/// A connector to the single server, or `None` (test skipped) when none runs outside CI.
pub fn redis() -> Option<RedisConnector> {
    let c = RedisConnector::new(&redis_url()).expect("REDIS_URL");
    match c.connect() {
        Ok(_) => Some(c),
        Err(e) => missing("redis-server", "scripts/redis start", e).map(|()| c),
    }
}

/// A connector to the cluster, or `None` (test skipped) when none runs outside CI.
pub fn cluster() -> Option<RedisClusterConnector> {
    let c = RedisClusterConnector::new(&cluster_nodes()).expect("REDIS_CLUSTER_NODES");
    match c.connect() {
        Ok(_) => Some(c),
        Err(e) => missing("the Redis Cluster", "scripts/redis-cluster start", e).map(|()| c),
    }
}

/// A redis-server of a test's own on a free loopback port, stopped when dropped.
pub struct OwnServer {
    /// Its port.
    pub port: u16,
    child: Option<std::process::Child>,
    dir: std::path::PathBuf,
}

impl OwnServer {
    /// Starts one, or `None` (test skipped) when redis-server is not installed outside CI.
    pub fn start() -> Option<OwnServer> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free port");
        let dir =
            std::env::temp_dir().join(format!("flowstate-redis-{}-{port}", std::process::id()));
        let mut s = OwnServer {
            port,
            child: None,
            dir,
        };
        match s.restart() {
            Ok(()) => Some(s),
            Err(e) => missing("redis-server (the program)", "scripts/redis start", e).and(None),
        }
    }

    /// Starts the server again (empty) after [`OwnServer::stop`].
    pub fn restart(&mut self) -> std::io::Result<()> {
        std::fs::create_dir_all(&self.dir)?;
        let child = std::process::Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&self.dir)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()?;
        self.child = Some(child);
        // Ready when it answers PING.
        for _ in 0..500 {
            let ok = redis::Client::open(format!("redis://127.0.0.1:{}", self.port))
                .and_then(|c| c.get_connection())
                .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c))
                .is_ok();
            if ok {
                return Ok(());
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        Err(std::io::Error::other("redis-server did not answer PING"))
    }

    /// Stops the server and waits until it is gone.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for OwnServer {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
