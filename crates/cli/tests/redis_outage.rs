//! The store going away must never stop packet processing (FlexState §III-A2 asynchronous
//! flush; CHC §4.3 non-blocking updates): with Redis stopped mid-run, the NAT keeps forwarding
//! on its cache, failed flushes are counted and logged, and flushing resumes when Redis is
//! back. Runs a redis-server of its own on a free port (skipped outside CI when the program is
//! not installed).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn start_redis(port: u16, dir: &Path) -> Option<Child> {
    let child = Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        // Every write on disk before it is answered: a restarted server has what the run
        // wrote before the outage (the outage is the network's, not a loss of data).
        .args([
            "--save",
            "",
            "--appendonly",
            "yes",
            "--appendfsync",
            "always",
        ])
        .arg("--dir")
        .arg(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn();
    let child = match child {
        Ok(c) => c,
        Err(e) => {
            if std::env::var("CI").is_ok_and(|v| v == "true" || v == "1") {
                panic!(
                    "redis-server cannot be started ({e}); CI installs it with scripts/redis start"
                );
            }
            eprintln!(
                "SKIPPED: redis-server cannot be started ({e}); install it (scripts/redis start)"
            );
            return None;
        }
    };
    for _ in 0..500 {
        if keys(port).is_some() {
            return Some(child);
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    panic!("redis-server on port {port} did not answer");
}

/// The number of keys the server holds, or `None` when it does not answer.
fn keys(port: u16) -> Option<u64> {
    redis::Client::open(format!("redis://127.0.0.1:{port}"))
        .and_then(|c| c.get_connection())
        .and_then(|mut c| redis::cmd("DBSIZE").query::<u64>(&mut c))
        .ok()
}

/// The NAT's mapping maps in the store (one per worker once flows are flushed).
fn nat_maps(port: u16) -> usize {
    redis::Client::open(format!("redis://127.0.0.1:{port}"))
        .and_then(|c| c.get_connection())
        .and_then(|mut c| {
            redis::cmd("KEYS")
                .arg("{*}@nat@Map@*")
                .query::<Vec<String>>(&mut c)
        })
        .map_or(0, |k| k.len())
}

/// How many `INCRBY`s (counter flushes) the server has run since it started.
fn incrbys(port: u16) -> u64 {
    let info: String = redis::Client::open(format!("redis://127.0.0.1:{port}"))
        .and_then(|c| c.get_connection())
        .and_then(|mut c| redis::cmd("INFO").arg("commandstats").query(&mut c))
        .unwrap_or_default();
    info.lines()
        .find_map(|l| l.strip_prefix("cmdstat_incrby:calls="))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// The sum of the NAT's per-worker `packets_out` and `packets_in` counters in the store.
fn translated_in_store(port: u16) -> i64 {
    let mut c = redis::Client::open(format!("redis://127.0.0.1:{port}"))
        .and_then(|c| c.get_connection())
        .expect("connect to redis");
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("{*}@nat@Counter@packets_*")
        .query(&mut c)
        .expect("KEYS");
    keys.iter()
        .map(|k| redis::cmd("GET").arg(k).query::<i64>(&mut c).expect("GET"))
        .sum()
}

#[test]
fn nat_keeps_forwarding_while_redis_is_down_and_flushes_again_after() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port");
    let dir = tempfile::tempdir().expect("tempdir");
    let Some(mut server) = start_redis(port, dir.path()) else {
        return;
    };

    let example = std::fs::read_to_string(root().join("examples/nat-redis.toml")).expect("example");
    let config = example
        .replace(
            "redis://127.0.0.1:6379",
            &format!("redis://127.0.0.1:{port}"),
        )
        .replace("packets = 100000", "packets = 300000");
    assert!(config.contains(&format!(":{port}")) && config.contains("300000"));
    let path = dir.path().join("nat-outage.toml");
    std::fs::write(&path, config).expect("config");
    let mut run = Command::new(env!("CARGO_BIN_EXE_flowstate"))
        .args(["run", path.to_str().expect("utf-8"), "--json"])
        .current_dir(root())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run flowstate");

    // Stop Redis once both workers have flushed NAT mappings to it.
    while nat_maps(port) < 2 {
        if run.try_wait().expect("wait").is_some() {
            panic!("the run ended before writing to Redis");
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    server.kill().expect("stop redis");
    server.wait().expect("reap redis");

    // Start it again (empty) once the run has reported a failed flush.
    let mut stderr = BufReader::new(run.stderr.take().expect("stderr"));
    let mut log = String::new();
    loop {
        let mut line = String::new();
        let n = stderr.read_line(&mut line).expect("read stderr");
        assert!(n > 0, "the run ended without reporting the outage: {log}");
        log.push_str(&line);
        if line.contains("state flush failed") {
            assert!(line.contains("unreachable"), "{line}");
            break;
        }
    }
    let mut server = start_redis(port, dir.path()).expect("restart redis");
    let guard = Stop(Some(server.id()));
    let rest = std::thread::spawn(move || {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut stderr, &mut s).map(|_| s)
    });
    let out = run.wait_with_output().expect("run");
    let log = log + &rest.join().expect("stderr reader").unwrap_or_default();
    assert!(out.status.success(), "the run failed: {log}");
    let s: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON summary");

    // Every packet went through the NAT; nothing stopped.
    assert_eq!(s["packets_in"], 300_000, "{s}");
    let total_in = s["packets_in"].as_u64().unwrap_or(0) + s["reflected"].as_u64().unwrap_or(0);
    let total_out = s["packets_out"].as_u64().unwrap_or(0)
        + s["dropped_total"].as_u64().unwrap_or(0)
        + s["skipped"].as_u64().unwrap_or(0);
    assert_eq!(total_in, total_out, "every packet accounted for: {s}");
    assert!(s["packets_out"].as_u64().unwrap_or(0) > 0, "{s}");
    let sum = |key: &str| -> u64 {
        s["per_worker"]
            .as_array()
            .map(|w| w.iter().filter_map(|w| w[key].as_u64()).sum())
            .unwrap_or(0)
    };
    assert!(sum("state_errors") > 0, "the outage was counted: {s}");
    // Logged once per interval, not once per failed flush.
    let lines = log
        .lines()
        .filter(|l| l.contains("state flush failed"))
        .count() as u64;
    assert!(
        lines < sum("state_errors") || sum("state_errors") <= 2,
        "{lines} log lines for {} errors",
        sum("state_errors")
    );
    // Flushing resumed: the restarted server ran the run's counter updates.
    assert!(incrbys(port) > 0, "nothing flushed after Redis came back");
    // ... and the flushes that failed during the outage were sent again: no count is lost (a
    // batch cut off by the kill may count twice, never zero times).
    let forwarded = s["packets_out"].as_i64().unwrap_or(0);
    let stored = translated_in_store(port);
    assert!(
        stored >= forwarded,
        "the store counts {stored} translated packets of {forwarded} forwarded: {log} {s}"
    );
    assert!(keys(port).unwrap_or(0) > 0);
    drop(guard);
    let _ = server.kill();
    let _ = server.wait();
}

/// Kills a server left running by a failed assertion (its stderr would hold the test's
/// output pipe open).
struct Stop(Option<u32>);

impl Drop for Stop {
    fn drop(&mut self) {
        if let Some(pid) = self.0.take() {
            if std::thread::panicking() {
                let _ = Command::new("kill").arg(pid.to_string()).status();
            }
        }
    }
}
