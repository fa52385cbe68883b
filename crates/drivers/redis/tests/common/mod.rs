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
