//! Three Cassandra nodes (`scripts/cassandra-cluster`, started and stopped here), keyspaces
//! with `replication_factor = 3`, every read and write at QUORUM: a node killed (-9) loses
//! no acknowledged write, and writes, reads and lightweight transactions (compare-and-set,
//! locks: what a cluster's lease and ownership records are) go on with the other two.
//!
//! Needs Java and the Cassandra jars `scripts/cassandra start` fetches; without them the test
//! prints why and passes, except in CI (`CI=true`).

use flowstate_driver_cassandra::{CassandraConfig, CassandraConnector};
use flowstate_state::conformance::{self, Options};
use flowstate_state::{Backend, BackendError, Connector, Kind, ObjectKey, Op, Reply};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

const ADDRESSES: [&str; 3] = ["127.0.2.1", "127.0.2.2", "127.0.2.3"];
/// How long the two left may take to convict the dead node.
const LIMIT: Duration = Duration::from_secs(60);

/// The cluster of this test, stopped on drop.
struct Nodes {
    run: tempfile::TempDir,
}

impl Nodes {
    fn script(run: &Path, action: &str) -> Output {
        Command::new("bash")
            .arg(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../../../scripts/cassandra-cluster"
            ))
            .arg(action)
            .env("CASSANDRA_CLUSTER_ADDRESSES", ADDRESSES.join(" "))
            .env("FLOWSTATE_RUN_DIR", run)
            .output()
            .unwrap()
    }

    fn start() -> Option<Nodes> {
        let run = tempfile::tempdir().unwrap();
        let out = Nodes::script(run.path(), "start");
        if out.status.success() {
            return Some(Nodes { run });
        }
        let why = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        Nodes::script(run.path(), "stop");
        if std::env::var("CI").is_ok_and(|v| v == "true") {
            panic!("CI=true but scripts/cassandra-cluster could not start: {why}");
        }
        eprintln!("skipping the replicated Cassandra test: {why}");
        None
    }

    fn pid_file(&self, k: usize) -> PathBuf {
        self.run
            .path()
            .join(format!("cassandra-cluster/node{}/cassandra.pid", k + 1))
    }
}

impl Drop for Nodes {
    fn drop(&mut self) {
        Nodes::script(self.run.path(), "stop");
    }
}

fn quorum() -> CassandraConnector {
    let nodes: Vec<String> = ADDRESSES.iter().map(|a| format!("\"{a}:9042\"")).collect();
    let settings = format!(
        "nodes = [{}]\nreplication_factor = 3\nconsistency = \"quorum\"",
        nodes.join(", ")
    );
    let config = CassandraConfig::from_settings(None, &toml::from_str(&settings).unwrap()).unwrap();
    CassandraConnector::new(config).unwrap()
}

fn run(b: &mut Box<dyn Backend>, ops: &[Op]) -> Vec<Reply> {
    let mut replies = Vec::new();
    b.execute(ops, &mut replies).unwrap();
    replies
}

#[test]
fn a_node_killed_loses_no_acknowledged_write_and_quorum_and_lwt_go_on() {
    let Some(nodes) = Nodes::start() else { return };
    let c = quorum();
    let nf = format!("repl-{}", std::process::id());
    let mut b = c.connect().unwrap();
    let counter = ObjectKey::shared(&nf, Kind::Counter, "n");
    let lease = ObjectKey::shared(&nf, Kind::Value, "lease");
    let value = |i: u32| ObjectKey::shared(&nf, Kind::Value, &format!("v{i}"));
    // Acknowledged before the kill: 200 values, 200 adds, a lease taken by compare-and-set.
    for i in 0..200u32 {
        run(
            &mut b,
            &[
                Op::Set {
                    key: value(i),
                    value: i.to_be_bytes().to_vec(),
                },
                Op::Add {
                    key: counter.clone(),
                    delta: 1,
                },
            ],
        );
    }
    let took = run(
        &mut b,
        &[Op::CompareAndSet {
            key: lease.clone(),
            expected: None,
            new: Some(b"term 1".to_vec()),
        }],
    );
    assert_eq!(took, [Reply::Bool(true)]);

    let pid = std::fs::read_to_string(nodes.pid_file(0)).unwrap();
    assert!(Command::new("kill")
        .args(["-9", pid.trim()])
        .status()
        .unwrap()
        .success());

    // Until the two left convict the dead node (Cassandra's failure detector, seconds), a
    // request that waits on it fails, and says so: a counter add's leader is any replica
    // thought alive, one in three the dead one. A probe adds until 20 in a row go through.
    let probe = ObjectKey::shared(&nf, Kind::Counter, "probe");
    let killed = Instant::now();
    let (mut failed, mut in_a_row) = (0, 0);
    while in_a_row < 20 {
        let mut replies = Vec::new();
        match b.execute(
            &[Op::Add {
                key: probe.clone(),
                delta: 1,
            }],
            &mut replies,
        ) {
            Ok(()) => in_a_row += 1,
            Err(BackendError::Unreachable { .. }) if killed.elapsed() < LIMIT => {
                failed += 1;
                in_a_row = 0;
            }
            Err(e) => panic!("{e} ({:?} after the kill)", killed.elapsed()),
        }
    }
    eprintln!(
        "20 counter adds in a row went through {:?} after the kill ({failed} failed before)",
        killed.elapsed()
    );
    // Every acknowledged write is read back at QUORUM from the two left.
    let reads: Vec<Op> = (0..200u32)
        .map(|i| Op::Get { key: value(i) })
        .chain([Op::GetCounter {
            key: counter.clone(),
        }])
        .collect();
    let replies = run(&mut b, &reads);
    for (i, r) in replies[..200].iter().enumerate() {
        assert_eq!(
            r,
            &Reply::Value(Some((i as u32).to_be_bytes().to_vec())),
            "v{i}"
        );
    }
    assert_eq!(replies[200], Reply::Int(200));
    // The lease moves on by compare-and-set (Paxos over the two left); a stale term is refused.
    let moved = run(
        &mut b,
        &[
            Op::CompareAndSet {
                key: lease.clone(),
                expected: Some(b"term 1".to_vec()),
                new: Some(b"term 2".to_vec()),
            },
            Op::CompareAndSet {
                key: lease.clone(),
                expected: Some(b"term 1".to_vec()),
                new: Some(b"term 3".to_vec()),
            },
            Op::Get { key: lease },
        ],
    );
    assert_eq!(
        moved,
        [
            Reply::Bool(true),
            Reply::Bool(false),
            Reply::Value(Some(b"term 2".to_vec()))
        ]
    );
    // And the store's whole vocabulary still works on the two left (a fresh connection).
    for name in ["value", "compare_and_set", "counter", "map", "locks"] {
        conformance::run_check_with(&c, name, &Options::WHOLE_SECONDS);
    }
}
