//! NAT and LB over the same input on `local` and on `redis` / `redis-cluster` (the example
//! configurations, which differ only under `[state]`): the output packets are the same, byte
//! for byte (FlexState §III-A2: changing the store is a line of configuration and changes
//! nothing an NF does).
//!
//! Needs `scripts/redis start` and `scripts/redis-cluster start`. In CI (`CI=true`) a missing
//! server fails the test; elsewhere the test is skipped with a message.

mod common;

use common::{tls_file, with_state};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn server_up(addr: &str, what: &str, start: &str) -> bool {
    let up = redis::Client::open(format!("redis://{addr}"))
        .and_then(|c| c.get_connection())
        .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c))
        .is_ok();
    if !up {
        if std::env::var("CI").is_ok_and(|v| v == "true" || v == "1") {
            panic!("{what} is not running at {addr}; CI starts it with {start}");
        }
        eprintln!("SKIPPED: {what} is not running at {addr}; start it with {start}");
    }
    up
}

/// An instance id of its own for each run, so runs never see each other's state.
fn instance() -> u32 {
    static N: AtomicU32 = AtomicU32::new(0);
    (std::process::id() % 100_000) * 100 + N.fetch_add(1, Ordering::Relaxed) + 1_000_000
}

/// Runs `example` with its output to a pcap; returns the file's bytes.
fn run(dir: &Path, example: &str, workers: u32, tag: &str) -> Vec<u8> {
    run_summary(dir, example, workers, tag).0
}

/// As [`run`], with the run's JSON summary and the configuration it ran.
fn run_summary(
    dir: &Path,
    example: &str,
    workers: u32,
    tag: &str,
) -> (Vec<u8>, serde_json::Value, PathBuf) {
    run_summary_with(dir, example, workers, tag, None)
}

/// As [`run_summary`], with `[state]` replaced by `state` when given.
fn run_summary_with(
    dir: &Path,
    example: &str,
    workers: u32,
    tag: &str,
    state: Option<&str>,
) -> (Vec<u8>, serde_json::Value, PathBuf) {
    let mut text =
        std::fs::read_to_string(root().join(format!("examples/{example}.toml"))).expect("example");
    if let Some(state) = state {
        text = with_state(&text, state);
    }
    let out = dir.join(format!("{example}-{workers}-{tag}.pcap"));
    let mut config = text.replacen(
        "discard = true",
        &format!("pcap = {:?}", out.to_string_lossy()),
        1,
    );
    assert_ne!(config, text, "{example}: no `discard = true` to replace");
    if !example.ends_with("redis") && !example.ends_with("cluster") {
        assert!(config.contains("backend = \"local\""));
    } else {
        config = config.replacen(
            "[state]\n",
            &format!("[state]\nnf_instance = {}\n", instance()),
            1,
        );
    }
    let path = dir.join(format!("{example}-{workers}-{tag}.toml"));
    std::fs::write(&path, config).expect("write config");
    let o = Command::new(env!("CARGO_BIN_EXE_flowstate"))
        .args(["run", path.to_str().expect("utf-8 path"), "--json"])
        .args(["--workers", &workers.to_string()])
        .current_dir(root())
        .output()
        .expect("run flowstate");
    assert!(
        o.status.success(),
        "{example}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let s: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON summary");
    let workers_sum = |key: &str| -> u64 {
        s["per_worker"]
            .as_array()
            .expect("per_worker")
            .iter()
            .map(|w| w[key].as_u64().expect("a count"))
            .sum()
    };
    assert_eq!(workers_sum("state_errors"), 0, "{example}: {s}");
    if s["backend"] != "local" {
        // The state really went to the store.
        assert!(workers_sum("state_flushes") > 0, "{example}: {s}");
    }
    (std::fs::read(&out).expect("output pcap"), s, path)
}

/// The packet records of a classic pcap (header and bytes each), sorted: what several
/// workers write in an order of their own.
fn records(pcap: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    let mut at = 24;
    while at + 16 <= pcap.len() {
        let len = u32::from_le_bytes(pcap[at + 8..at + 12].try_into().expect("4 bytes")) as usize;
        out.push(&pcap[at..at + 16 + len]);
        at += 16 + len;
    }
    assert_eq!(at, pcap.len(), "whole records");
    out.sort_unstable();
    out
}

fn same_output(local: &str, remote: &str) {
    let dir = tempfile::tempdir().expect("tempdir");
    let a = run(dir.path(), local, 1, "a");
    let b = run(dir.path(), remote, 1, "b");
    assert!(records(&a).len() > 1000, "{local}: a real run");
    assert!(
        a == b,
        "{local} and {remote} wrote different packets (1 worker)"
    );
    let a = run(dir.path(), local, 2, "a");
    let b = run(dir.path(), remote, 2, "b");
    assert!(
        records(&a) == records(&b),
        "{local} and {remote} wrote different packets (2 workers)"
    );
}

#[test]
fn nat_and_lb_write_the_same_packets_on_local_and_redis() {
    if !server_up("127.0.0.1:6379", "redis-server", "scripts/redis start") {
        return;
    }
    same_output("nat", "nat-redis");
    same_output("lb", "lb-redis");
}

#[test]
fn nat_writes_the_same_packets_on_local_and_redis_cluster() {
    if !server_up(
        "127.0.0.1:7001",
        "the Redis Cluster",
        "scripts/redis-cluster start",
    ) {
        return;
    }
    same_output("nat", "nat-redis-cluster");
}

/// `flowstate state list --config` reads a NAT's sessions and mappings from Redis after a run,
/// decoded with the NAT's codecs: as many as the NAT reported active at its end, each once,
/// all on the NAT's external address; the run's own instance only.
#[test]
fn state_list_reads_the_nat_sessions_a_run_left_in_redis() {
    if !server_up("127.0.0.1:6379", "redis-server", "scripts/redis start") {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let (_, summary, config) = run_summary(dir.path(), "nat-redis", 2, "list");
    let nat = &summary["nfs"][0];
    assert_eq!(nat["name"], "nat");
    let list = |table: &str| -> serde_json::Value {
        let o = Command::new(env!("CARGO_BIN_EXE_flowstate"))
            .args(["state", "list", "--config"])
            .arg(&config)
            .args([table, "--json"])
            .current_dir(root())
            .output()
            .expect("run flowstate");
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        serde_json::from_slice(&o.stdout).expect("JSON")
    };
    let sessions = list("nat.sessions");
    let rows = sessions[0]["rows"].as_array().expect("rows");
    assert_eq!(sessions[0]["source"], "redis");
    assert_eq!(
        rows.len() as i64,
        nat["report"]["active_sessions"].as_i64().unwrap(),
        "{summary}"
    );
    assert!(
        rows.len() > 100,
        "a real run leaves sessions: {}",
        rows.len()
    );
    let mut inside = std::collections::HashSet::new();
    for r in rows {
        assert!(r[3].as_str().unwrap().starts_with("203.0.113.1:"), "{r}");
        assert!(r[5].is_null(), "a store does not say the time left: {r}");
        assert!(
            inside.insert((r[0].to_string(), r[1].to_string(), r[2].to_string())),
            "{r}"
        );
    }
    let mappings = list("nat.mappings");
    assert_eq!(
        mappings[0]["rows"].as_array().unwrap().len() as i64,
        nat["report"]["active_mappings"].as_i64().unwrap()
    );
}

/// Whether the TLS + ACL server of `scripts/redis start --tls` (or the cluster's first node)
/// answers on `port`; skips (or fails in CI) as [`server_up`].
fn tls_server_up(port: u16, what: &str, start: &str) -> bool {
    let up = std::fs::read_to_string(tls_file("password")).is_ok_and(|pw| {
        let url = format!("rediss://flowstate:{}@127.0.0.1:{port}", pw.trim());
        let ca = std::fs::read(tls_file("ca.pem")).unwrap_or_default();
        let certs = redis::TlsCertificates {
            client_tls: None,
            root_cert: Some(ca),
        };
        redis::Client::build_with_tls(url, certs)
            .and_then(|c| c.get_connection())
            .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c))
            .is_ok()
    });
    if !up {
        if std::env::var("CI").is_ok_and(|v| v == "true" || v == "1") {
            panic!("{what} is not running on port {port}; CI starts it with {start}");
        }
        eprintln!("SKIPPED: {what} is not running on port {port}; start it with {start}");
    }
    up
}

/// The `[state]` of the TLS server as user `flowstate`, its password in a file.
fn tls_state(backend: &str, address: &str, password_file: &str, ca_file: &str) -> String {
    format!(
        "backend = \"{backend}\"\n{address}\npassword_file = {password_file:?}\n\
         ca_file = {ca_file:?}\nflush_interval = \"1ms\""
    )
}

/// A NAT run over `rediss://` as an ACL user whose password is in a file, then `flowstate
/// state list` reading back what it left: the same sessions the run reported; `check` shows
/// no secret.
#[test]
fn nat_state_makes_a_round_trip_over_rediss_as_an_acl_user() {
    if !tls_server_up(6380, "the TLS redis-server", "scripts/redis start --tls") {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let state = tls_state(
        "redis",
        "url = \"rediss://flowstate@127.0.0.1:6380\"",
        &tls_file("password"),
        &tls_file("ca.pem"),
    );
    let (pcap, summary, config) = run_summary_with(dir.path(), "nat-redis", 2, "tls", Some(&state));
    assert_eq!(summary["backend"], "redis", "{summary}");
    let local = run(dir.path(), "nat", 2, "tls-local");
    assert!(
        records(&pcap) == records(&local),
        "nat over rediss:// and on local wrote different packets"
    );
    let o = Command::new(env!("CARGO_BIN_EXE_flowstate"))
        .args(["state", "list", "--config"])
        .arg(&config)
        .args(["nat.sessions", "--json"])
        .current_dir(root())
        .output()
        .expect("run flowstate");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let sessions: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON");
    let rows = sessions[0]["rows"].as_array().expect("rows");
    assert!(rows.len() > 100, "{sessions}");
    assert_eq!(
        rows.len() as i64,
        summary["nfs"][0]["report"]["active_sessions"]
            .as_i64()
            .unwrap()
    );
    let o = Command::new(env!("CARGO_BIN_EXE_flowstate"))
        .arg("check")
        .arg(&config)
        .current_dir(root())
        .output()
        .expect("run flowstate");
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{text}");
    assert!(text.contains("rediss://flowstate@127.0.0.1:6380"), "{text}");
}

/// A wrong password, a wrong CA and a plain address for a TLS server stop `flowstate run` at
/// start-up with an error naming the key to fix; no password is printed.
#[test]
fn wrong_credentials_or_ca_stop_a_run_naming_the_key() {
    if !tls_server_up(6380, "the TLS redis-server", "scripts/redis start --tls") {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let wrong = dir.path().join("wrong-password");
    std::fs::write(&wrong, "s3cret-but-wrong\n").expect("write");
    let wrong = wrong.to_string_lossy().into_owned();
    let url = "url = \"rediss://flowstate@127.0.0.1:6380\"";
    let cases = [
        (
            tls_state("redis", url, &wrong, &tls_file("ca.pem")),
            "state.password_file",
        ),
        (
            tls_state(
                "redis",
                url,
                &tls_file("password"),
                &tls_file("other-ca.pem"),
            ),
            "state.ca_file",
        ),
        (
            tls_state(
                "redis-cluster",
                "nodes = [\"rediss://flowstate@127.0.0.1:7101\"]",
                &tls_file("password"),
                &tls_file("other-ca.pem"),
            ),
            "state.ca_file",
        ),
        (
            "backend = \"redis\"\nurl = \"rediss://flowstate:s3cret-but-wrong@127.0.0.1:6380\"\n\
             ca_file = \"CA\""
                .replace("CA", &tls_file("ca.pem")),
            "state.url",
        ),
    ];
    let text = std::fs::read_to_string(root().join("examples/nat-redis.toml")).expect("example");
    for (i, (state, key)) in cases.iter().enumerate() {
        let path = dir.path().join(format!("bad-{i}.toml"));
        std::fs::write(&path, with_state(&text, state)).expect("write");
        let o = Command::new(env!("CARGO_BIN_EXE_flowstate"))
            .arg("run")
            .arg(&path)
            .current_dir(root())
            .output()
            .expect("run flowstate");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{state}: {err}");
        assert!(err.contains(&format!(": {key}: ")), "{state}: {err}");
        assert!(!err.contains("s3cret-but-wrong"), "{err}");
        assert!(!err.contains("panicked"), "{err}");
    }
}

/// The NAT over a Redis Cluster with TLS and an ACL user, known by one seed: every master is
/// opened with the seed's TLS and user, and the packets are those of the embedded store.
#[test]
fn nat_writes_the_same_packets_on_local_and_a_tls_redis_cluster() {
    if !tls_server_up(
        7101,
        "the TLS Redis Cluster",
        "scripts/redis-cluster start --tls",
    ) {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let state = tls_state(
        "redis-cluster",
        "nodes = [\"rediss://flowstate@127.0.0.1:7101\"]",
        &tls_file("password"),
        &tls_file("ca.pem"),
    );
    let (pcap, summary, _) =
        run_summary_with(dir.path(), "nat-redis-cluster", 2, "tls", Some(&state));
    assert_eq!(summary["backend"], "redis-cluster", "{summary}");
    let local = run(dir.path(), "nat", 2, "tls-cluster-local");
    assert!(
        records(&pcap) == records(&local),
        "nat over a TLS cluster and on local wrote different packets"
    );
}
