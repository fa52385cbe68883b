//! Finding the test servers: `scripts/redis start` and `scripts/redis-cluster start`. In CI
//! (`CI=true`) a missing server fails the test; elsewhere the test is skipped with a message.

#![allow(dead_code, unreachable_pub)]

use flowstate_driver_redis::{RedisClusterConnector, RedisConnector, Setting};
use flowstate_state::Connector;
use std::path::PathBuf;

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

/// Where `scripts/tls-certs` put the test certificates and the ACL user's password
/// (`$FLOWSTATE_RUN_DIR/tls`, default `<repo>/.run/tls`).
pub fn tls_dir() -> PathBuf {
    std::env::var_os("FLOWSTATE_RUN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../.run"))
        .join("tls")
}

/// A file of [`tls_dir`], as a string.
pub fn tls_file(name: &str) -> String {
    tls_dir().join(name).to_string_lossy().into_owned()
}

/// The `[state]` keys of the TLS servers' ACL user: its password file and the CA.
pub fn tls_keys() -> Vec<(&'static str, String)> {
    vec![
        ("password_file", tls_file("password")),
        ("ca_file", tls_file("ca.pem")),
    ]
}

fn settings<'a>(keys: &'a [(&'static str, String)]) -> Vec<(&'static str, Setting<'a>)> {
    keys.iter().map(|(k, v)| (*k, Setting::Str(v))).collect()
}

/// The TLS + ACL server of `scripts/redis start --tls` (`REDIS_TLS_PORT`, default 6380) as
/// user `flowstate`, or `None` (test skipped) when it does not run outside CI.
pub fn redis_tls() -> Option<RedisConnector> {
    let port = std::env::var("REDIS_TLS_PORT").unwrap_or_else(|_| "6380".into());
    let url = format!("rediss://flowstate@127.0.0.1:{port}");
    let keys = tls_keys();
    let c = match RedisConnector::from_settings(Some(&url), settings(&keys)) {
        Ok(c) => c,
        Err(e) => return missing("the TLS test files", "scripts/redis start --tls", e).and(None),
    };
    match c.check() {
        Ok(()) => Some(c),
        Err(e) => missing("the TLS redis-server", "scripts/redis start --tls", e).map(|()| c),
    }
}

/// The TLS + ACL cluster of `scripts/redis-cluster start --tls` (first node
/// `REDIS_CLUSTER_TLS_PORT`, default 7101), or `None` (test skipped) outside CI.
pub fn cluster_tls() -> Option<RedisClusterConnector> {
    let port = std::env::var("REDIS_CLUSTER_TLS_PORT").unwrap_or_else(|_| "7101".into());
    let url = format!("rediss://flowstate@127.0.0.1:{port}");
    let keys = tls_keys();
    let c = match RedisClusterConnector::from_settings(Some(&url), settings(&keys)) {
        Ok(c) => c,
        Err(e) => {
            return missing("the TLS test files", "scripts/redis-cluster start --tls", e).and(None)
        }
    };
    match c.check("url") {
        Ok(()) => Some(c),
        Err(e) => missing(
            "the TLS Redis Cluster",
            "scripts/redis-cluster start --tls",
            e,
        )
        .map(|()| c),
    }
}

/// A redis-server of a test's own on a free loopback port, stopped when dropped.
pub struct OwnServer {
    /// Its port.
    pub port: u16,
    child: Option<std::process::Child>,
    dir: std::path::PathBuf,
    /// Extra arguments (TLS).
    args: Vec<String>,
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
            args: Vec::new(),
        };
        match s.restart() {
            Ok(()) => Some(s),
            Err(e) => missing("redis-server (the program)", "scripts/redis start", e).and(None),
        }
    }

    /// Starts one (plain) wanting `password` from every client (`requirepass`, the legacy
    /// password before ACL users).
    pub fn start_requirepass(password: &str) -> Option<OwnServer> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free port");
        let dir =
            std::env::temp_dir().join(format!("flowstate-redis-{}-{port}", std::process::id()));
        let args = vec![
            "--port".into(),
            port.to_string(),
            "--requirepass".into(),
            password.into(),
        ];
        let mut s = OwnServer {
            port,
            child: None,
            dir,
            args,
        };
        match s.restart() {
            Ok(()) => Some(s),
            Err(e) => missing("redis-server (the program)", "scripts/redis start", e).and(None),
        }
    }

    /// Starts one serving TLS only (the certificates of [`tls_dir`]) that wants a client
    /// certificate signed by the test CA, without a password; `None` (test skipped) when
    /// redis-server or the certificates are missing outside CI.
    pub fn start_mutual_tls() -> Option<OwnServer> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free port");
        if !tls_dir().join("server.pem").exists() {
            return missing("the TLS test files", "scripts/tls-certs", "no server.pem").and(None);
        }
        let dir =
            std::env::temp_dir().join(format!("flowstate-redis-{}-{port}", std::process::id()));
        let args = vec![
            "--port".into(),
            "0".into(),
            "--tls-port".into(),
            port.to_string(),
            "--tls-cert-file".into(),
            tls_file("server.pem"),
            "--tls-key-file".into(),
            tls_file("server.key"),
            "--tls-ca-cert-file".into(),
            tls_file("ca.pem"),
            "--tls-auth-clients".into(),
            "yes".into(),
        ];
        let mut s = OwnServer {
            port,
            child: None,
            dir,
            args,
        };
        match s.restart() {
            Ok(()) => Some(s),
            Err(e) => missing("redis-server (the program)", "scripts/redis start", e).and(None),
        }
    }

    /// Starts the server again (empty) after [`OwnServer::stop`].
    pub fn restart(&mut self) -> std::io::Result<()> {
        std::fs::create_dir_all(&self.dir)?;
        let mut cmd = std::process::Command::new("redis-server");
        if self.args.is_empty() {
            cmd.args(["--port", &self.port.to_string()]);
        } else {
            cmd.args(&self.args);
        }
        let child = cmd
            .args(["--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&self.dir)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()?;
        self.child = Some(child);
        // Ready when it answers PING (over TLS: when it takes connections).
        for _ in 0..500 {
            let ok = if self.args.is_empty() {
                redis::Client::open(format!("redis://127.0.0.1:{}", self.port))
                    .and_then(|c| c.get_connection())
                    .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c))
                    .is_ok()
            } else {
                std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok()
            };
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
