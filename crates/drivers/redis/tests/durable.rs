//! `wait_replicas = 1` on the live cluster (`scripts/redis-cluster start`: 3 masters, each
//! with a replica): once a batch is acknowledged, the replica of each master it wrote has
//! acknowledged the master's replication stream past the point where the batch began. A
//! replica acknowledges on its own only once a second, so without the driver's `WAIT` the
//! master's record of it lags behind (the test fails with `wait_replicas = 0`).

mod common;

use flowstate_driver_redis::{RedisClusterConnector, Setting};
use flowstate_state::{Connector, Kind, ObjectKey, Op, Reply};
use redis::Value;

/// (first slot, last slot, master port) of every slot range `CLUSTER SLOTS` lists with a
/// replica.
fn masters(seed: &str) -> Vec<(i64, i64, u16)> {
    let mut c = redis::Client::open(seed).unwrap().get_connection().unwrap();
    let Value::Array(ranges) = redis::cmd("CLUSTER").arg("SLOTS").query(&mut c).unwrap() else {
        panic!("CLUSTER SLOTS");
    };
    ranges
        .iter()
        .filter_map(|r| match r {
            Value::Array(f) if f.len() > 3 => match (&f[0], &f[1], &f[2]) {
                (Value::Int(a), Value::Int(b), Value::Array(node)) => match node[1] {
                    Value::Int(port) => Some((*a, *b, port as u16)),
                    _ => None,
                },
                _ => None,
            },
            _ => None,
        })
        .collect()
}

/// The master at `port`'s replication offset, and the offset its first replica last
/// acknowledged (`INFO replication`).
fn offsets(port: u16) -> (i64, i64) {
    let mut c = redis::Client::open(format!("redis://127.0.0.1:{port}"))
        .unwrap()
        .get_connection()
        .unwrap();
    let info: String = redis::cmd("INFO").arg("replication").query(&mut c).unwrap();
    let field = |line: &str, key: &str| -> Option<i64> {
        line.split(',')
            .find_map(|kv| kv.trim().strip_prefix(key))
            .and_then(|v| v.trim().parse().ok())
    };
    let master = info
        .lines()
        .find_map(|l| field(l, "master_repl_offset:"))
        .expect("master_repl_offset");
    let acked = info
        .lines()
        .find(|l| l.starts_with("slave0:"))
        .and_then(|l| field(l, "offset="))
        .expect("a replica");
    (master, acked)
}

fn key_slot(seed: &str, key: &str) -> i64 {
    let mut c = redis::Client::open(seed).unwrap().get_connection().unwrap();
    redis::cmd("CLUSTER")
        .arg("KEYSLOT")
        .arg(key)
        .query(&mut c)
        .unwrap()
}

#[test]
fn an_acknowledged_batch_is_acknowledged_by_the_replicas() {
    let Some(_) = common::cluster() else { return };
    let seed = common::cluster_nodes()[0].clone();
    let ranges = masters(&seed);
    assert!(
        !ranges.is_empty(),
        "the cluster has no replicas: scripts/redis-cluster start makes one per master"
    );
    let nodes = common::cluster_nodes();
    let c = RedisClusterConnector::from_settings(
        None,
        [
            ("nodes", Setting::List(&nodes)),
            ("wait_replicas", Setting::Int(1)),
        ],
    )
    .unwrap();
    let mut b = c.connect().unwrap();
    let run = std::process::id();
    let nfs: Vec<String> = (0..12).map(|i| format!("durable{run}x{i}")).collect();
    let keys: Vec<ObjectKey> = nfs
        .iter()
        .map(|nf| ObjectKey::shared(nf, Kind::Counter, "n"))
        .collect();
    // The masters the batch writes (a shared object's Redis key is `{nf}@Type@id`).
    let mut touched: Vec<u16> = nfs
        .iter()
        .map(|nf| {
            let slot = key_slot(&seed, &format!("{{{nf}}}@Counter@n"));
            ranges
                .iter()
                .find(|(a, b, _)| (*a..=*b).contains(&slot))
                .map(|r| r.2)
                .expect("every slot served")
        })
        .collect();
    touched.sort_unstable();
    touched.dedup();
    let mut replies = Vec::new();
    for round in 1..=10i64 {
        let before: Vec<i64> = touched.iter().map(|&p| offsets(p).0).collect();
        let ops: Vec<Op> = keys
            .iter()
            .map(|k| Op::Add {
                key: k.clone(),
                delta: 1,
            })
            .collect();
        replies.clear();
        b.execute(&ops, &mut replies).unwrap();
        for (k, r) in keys.iter().zip(&replies) {
            assert_eq!(r, &Reply::Int(round), "{k:?}");
        }
        for (&port, before) in touched.iter().zip(before) {
            let (_, acked) = offsets(port);
            assert!(
                acked > before,
                "round {round}: the replica of {port} acknowledged {acked}, the batch began \
                 after {before}"
            );
        }
    }
    for k in &keys {
        replies.clear();
        b.execute(&[Op::Delete { key: k.clone() }], &mut replies)
            .unwrap();
    }
}
