//! `flowstate store` and the `store` backend end to end: the server binary, `flowstate run`
//! with `backend = "store"`, and the same packets out as with the embedded store.

mod common;

use common::{
    attr, chromium, elements, headless, pane_command, polled_dashboard, rows, screenshot, si, Tmux,
};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A `flowstate store` process, killed when dropped.
struct StoreProcess {
    child: Child,
    addr: String,
}

impl StoreProcess {
    fn start(extra: &[&str]) -> StoreProcess {
        StoreProcess::start_on("127.0.0.1:0", extra)
    }

    /// A store whose clients must present `token` (given as the environment's
    /// FLOWSTATE_STORE_TOKEN: the command line takes no token).
    fn with_token(token: &str) -> StoreProcess {
        StoreProcess::spawn("127.0.0.1:0", &[], Some(token))
    }

    fn start_on(listen: &str, extra: &[&str]) -> StoreProcess {
        StoreProcess::spawn(listen, extra, None)
    }

    fn spawn(listen: &str, extra: &[&str], token: Option<&str>) -> StoreProcess {
        let mut command = Command::new(env!("CARGO_BIN_EXE_flowstate"));
        if let Some(t) = token {
            command.env("FLOWSTATE_STORE_TOKEN", t);
        }
        let mut child = command
            .args(["store", "--listen", listen])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start flowstate store");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let addr = line
            .trim()
            .rsplit(' ')
            .next()
            .expect("the store prints its address")
            .to_owned();
        assert!(addr.contains(':'), "{line:?}");
        StoreProcess { child, addr }
    }
}

impl Drop for StoreProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The lines of a configuration outside its `[state]` table.
/// The settings of a configuration outside `[state]` (comments aside: each example's header
/// names its own file).
fn outside_state(text: &str) -> Vec<&str> {
    let mut in_state = false;
    text.lines()
        .filter(|l| {
            let t = l.trim();
            if t.starts_with('[') {
                in_state = t == "[state]";
            }
            !in_state && !t.is_empty() && !t.starts_with('#')
        })
        .collect()
}

fn run(config: &Path) -> serde_json::Value {
    let out = Command::new(env!("CARGO_BIN_EXE_flowstate"))
        .args(["run", config.to_str().unwrap(), "--json"])
        .current_dir(root())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}: {}",
        config.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn nat_on_the_store_sends_the_same_packets_as_on_the_embedded_store() {
    let local = std::fs::read_to_string(root().join("examples/nat.toml")).unwrap();
    let store = std::fs::read_to_string(root().join("examples/nat-store.toml")).unwrap();
    assert_eq!(
        outside_state(&local),
        outside_state(&store),
        "examples/nat-store.toml differs from examples/nat.toml only under [state]"
    );
    let server = StoreProcess::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let mut outputs = Vec::new();
    for (name, text) in [("local", &local), ("store", &store)] {
        let out = dir.path().join(format!("{name}.pcap"));
        let text = text
            .replace(
                "discard = true",
                &format!("pcap = {:?}", out.to_str().unwrap()),
            )
            .replace("127.0.0.1:7878", &server.addr);
        assert!(text.contains(".pcap"));
        let cfg = dir.path().join(format!("{name}.toml"));
        std::fs::write(&cfg, text).unwrap();
        let summary = run(&cfg);
        assert_eq!(summary["backend"], name);
        assert!(summary["packets_out"].as_u64().unwrap() > 0);
        outputs.push(packets(&std::fs::read(&out).unwrap()));
    }
    assert!(outputs[0].len() > 1000);
    assert_eq!(outputs[0].len(), outputs[1].len());
    // Two workers interleave their output differently from run to run (on either store), and
    // pcap timestamps are taken when written: compare every packet's bytes, in a fixed order.
    assert!(
        outputs[0] == outputs[1],
        "the NAT's output packets differ between the embedded store and the store server"
    );
}

/// The packets of a classic pcap file, each byte for byte, sorted.
fn packets(pcap: &[u8]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut at = 24;
    while at + 16 <= pcap.len() {
        let len = u32::from_le_bytes(pcap[at + 8..at + 12].try_into().unwrap()) as usize;
        out.push(pcap[at + 16..at + 16 + len].to_vec());
        at += 16 + len;
    }
    assert_eq!(at, pcap.len(), "whole pcap records");
    out.sort_unstable();
    out
}

#[test]
fn every_nf_runs_on_the_store() {
    let server = StoreProcess::with_token("s3cret");
    let dir = tempfile::tempdir().unwrap();
    for example in ["firewall", "lb", "chain"] {
        let text =
            std::fs::read_to_string(root().join(format!("examples/{example}.toml"))).unwrap();
        let text = text.replace(
            "backend = \"local\"",
            &format!(
                "backend = \"store\"\nurl = {:?}\ntoken = \"s3cret\"",
                server.addr
            ),
        );
        assert!(text.contains("backend = \"store\""), "{example}");
        let cfg = dir.path().join(format!("{example}.toml"));
        std::fs::write(&cfg, text).unwrap();
        let s = run(&cfg);
        assert_eq!(s["backend"], "store");
        let total_in = s["packets_in"].as_u64().unwrap() + s["reflected"].as_u64().unwrap();
        let total_out = s["packets_out"].as_u64().unwrap()
            + s["dropped_total"].as_u64().unwrap()
            + s["skipped"].as_u64().unwrap();
        assert_eq!(total_in, total_out, "{example}: every packet accounted for");
        assert!(s["packets_out"].as_u64().unwrap() > 0, "{example}");
    }
}

#[test]
fn a_wrong_token_is_a_clear_error() {
    let server = StoreProcess::with_token("right");
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(root().join("examples/nat-store.toml"))
        .unwrap()
        .replace("127.0.0.1:7878", &server.addr)
        .replace("# token = \"...\"", "token = \"wrong\"");
    let cfg = dir.path().join("bad.toml");
    std::fs::write(&cfg, text).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_flowstate"))
        .args(["run", cfg.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("Unauthorized") || err.contains("token"),
        "{err}"
    );
}

#[test]
fn limits_below_their_floor_are_refused_naming_the_option() {
    for (option, value) in [
        ("--max-output", "100"),
        ("--max-frame", "10"),
        ("--max-inflight", "0"),
        ("--checkpoint-interval", "0s"),
        ("--checkpoint-interval", "1 fortnight"),
    ] {
        // A data directory that cannot be made: if the value were taken, the store would
        // fail to start (exit 1) rather than serve forever.
        let out = Command::new(env!("CARGO_BIN_EXE_flowstate"))
            .args(["store", "--data-dir", "/proc/flowstate-none", option, value])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{option} {value}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(option), "{err}");
    }
}

/// Crash test: concurrent writers, `kill -9` of the store mid-load, restart on the same data
/// directory; the store then holds exactly every acknowledged update, none twice (the driver
/// sends unanswered batches again with their op ids, and the store's log remembers which it
/// applied).
#[test]
fn after_kill_9_and_restart_the_store_holds_every_acknowledged_update_once() {
    use flowstate_driver_store::{Settings, StoreConnector};
    use flowstate_state::{Backend, Kind, Object, ObjectKey, Op, OpError, Reply};
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let listen = format!("127.0.0.1:{port}");
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_str().unwrap().to_owned();
    let args = ["--data-dir", data.as_str(), "--shards", "3"];
    let mut server = StoreProcess::start_on(&listen, &args);
    const WRITERS: usize = 4;
    let stop = Arc::new(AtomicBool::new(false));
    let acked: Arc<Vec<AtomicU64>> = Arc::new((0..WRITERS).map(|_| AtomicU64::new(0)).collect());
    let list = |w: usize| ObjectKey::shared("crash", Kind::List, &format!("w{w}"));
    let counter = |w: usize| ObjectKey::shared("crash", Kind::Counter, &format!("w{w}"));
    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            let (stop, acked, addr) = (stop.clone(), acked.clone(), listen.clone());
            std::thread::spawn(move || {
                let mut b = StoreConnector::with_settings(Settings {
                    addr,
                    retry_for: Duration::from_secs(60),
                    ..Settings::default()
                })
                .open()
                .unwrap();
                let mut i = 0u64;
                let mut replies = Vec::new();
                while !stop.load(Ordering::SeqCst) {
                    // A batch of 4 updates on two objects of two shards (at most).
                    let ops: Vec<Op> = (i..i + 4)
                        .flat_map(|j| {
                            [
                                Op::Push {
                                    key: list(w),
                                    item: j.to_le_bytes().to_vec(),
                                },
                                Op::Add {
                                    key: counter(w),
                                    delta: 1,
                                },
                            ]
                        })
                        .collect();
                    replies.clear();
                    b.execute(&ops, &mut replies).expect("the store comes back");
                    for r in &replies {
                        match r {
                            Reply::Len(_) | Reply::Int(_) => {}
                            // Applied before the crash; its answer died with the store.
                            Reply::Error(OpError::Refused(m)) if m.contains("already applied") => {}
                            other => panic!("writer {w}: {other:?}"),
                        }
                    }
                    i += 4;
                    acked[w].store(i, Ordering::SeqCst);
                }
            })
        })
        .collect();
    let wait_for = |at_least: u64| {
        while acked.iter().any(|a| a.load(Ordering::SeqCst) < at_least) {
            std::thread::sleep(Duration::from_millis(5));
        }
    };
    wait_for(400);
    // kill -9 mid-load.
    server.child.kill().unwrap();
    server.child.wait().unwrap();
    let before: Vec<u64> = acked.iter().map(|a| a.load(Ordering::SeqCst)).collect();
    server = StoreProcess::start_on(&listen, &args);
    wait_for(before.iter().max().unwrap() + 400);
    stop.store(true, Ordering::SeqCst);
    for w in writers {
        w.join().unwrap();
    }
    let mut b = StoreConnector::new(server.addr.clone()).open().unwrap();
    let stats: std::collections::HashMap<String, u64> = b.stats().unwrap().into_iter().collect();
    assert!(
        stats["recovered_records"] > 0,
        "the restart replayed the log: {stats:?}"
    );
    for w in 0..WRITERS {
        let n = acked[w].load(Ordering::SeqCst);
        let mut r = Vec::new();
        b.execute(
            &[
                Op::ReadAll {
                    key: list(w),
                    kind: Kind::List,
                },
                Op::GetCounter { key: counter(w) },
            ],
            &mut r,
        )
        .unwrap();
        let want: Vec<Vec<u8>> = (0..n).map(|j| j.to_le_bytes().to_vec()).collect();
        assert_eq!(
            r[0],
            Reply::Object(Some(Object::List(want))),
            "writer {w}: every acknowledged push once, in order"
        );
        assert_eq!(
            r[1],
            Reply::Int(n as i64),
            "writer {w}: every acknowledged add once"
        );
    }
    drop(server);
}

#[test]
fn a_log_damaged_before_its_end_stops_the_start_and_salvage_keeps_what_precedes() {
    use flowstate_driver_store::StoreConnector;
    use flowstate_state::{Backend, Kind, ObjectKey, Op};

    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_str().unwrap().to_owned();
    let args = ["--data-dir", data.as_str(), "--shards", "1"];
    let mut server = StoreProcess::start(&args);
    let mut b = StoreConnector::new(server.addr.clone()).open().unwrap();
    for i in 0..1000 {
        let set = Op::Set {
            key: ObjectKey::shared("wal", Kind::Value, &format!("k{i:04}")),
            value: vec![b'v'; 20],
        };
        b.execute(&[set], &mut Vec::new()).unwrap();
    }
    drop(b);
    server.child.kill().unwrap();
    server.child.wait().unwrap();
    // One bit flipped a tenth of the way into the log of 1,000 equal acknowledged records.
    let wal = dir.path().join("shard-0-0.wal");
    let mut log = std::fs::read(&wal).unwrap();
    let (at, record) = (log.len() / 10, log.len() / 1000);
    log[at] ^= 0x10;
    std::fs::write(&wal, &log).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_flowstate"))
        .args(["store", "--listen", "127.0.0.1:0"])
        .args(args)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    let offset = at / record * record;
    assert!(
        err.contains(&format!("at byte {offset} is corrupt")) && err.contains("--salvage-log"),
        "{err}"
    );
    assert_eq!(
        std::fs::read(&wal).unwrap(),
        log,
        "the log is kept as it is"
    );
    // Salvaged: the records before the damage, the whole log kept beside.
    let server = StoreProcess::start(&[&args[..], &["--salvage-log"]].concat());
    let stats = stats_json(&server.addr);
    assert_eq!(stats["objects"].as_u64().unwrap() as usize, at / record);
    assert_eq!(
        stats["log_bytes_cut"].as_u64().unwrap() as usize,
        log.len() - offset
    );
    assert_eq!(
        std::fs::read(dir.path().join("shard-0-0.wal.corrupt")).unwrap(),
        log
    );
}

/// Crash test of a fenced batch's atomicity: each batch adds 1 to a counter placed with its
/// fence (a cluster partition's objects) and 1 to a shared counter, on another shard for about
/// half of the partitions. Writers give up at the kill, as an instance whose partition moved
/// to another owner does, and after each of several `kill -9`s and restarts every pair of
/// counters is equal: a batch is applied whole or not at all, whatever shards it spans.
#[test]
fn after_kill_9_a_fenced_batch_over_several_shards_is_applied_whole_or_not_at_all() {
    use flowstate_driver_store::{Settings, StoreConnector};
    use flowstate_state::{Backend, Fence, Kind, ObjectKey, Op, Owner, Reply};
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;

    const PARTITIONS: u32 = 8;
    let listen = format!("127.0.0.1:{}", free_port());
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_str().unwrap().to_owned();
    let args = ["--data-dir", data.as_str(), "--shards", "2"];
    let record = |p| ObjectKey::partitioned(&Owner::new("cluster", 0, p), Kind::Value, "owner");
    let own = |p| ObjectKey::partitioned(&Owner::new("crash", 0, p), Kind::Counter, "own");
    let shared = |p| ObjectKey::shared("crash", Kind::Counter, &format!("shared-{p}"));
    let connect = |addr: &str| {
        StoreConnector::with_settings(Settings {
            addr: addr.to_owned(),
            retry_for: Duration::from_millis(50),
            ..Settings::default()
        })
        .open()
        .unwrap()
    };
    let mut applied = vec![0i64; PARTITIONS as usize];
    let mut rolled_forward = 0;
    for cycle in 0..12 {
        let mut server = StoreProcess::start_on(&listen, &args);
        let acked: Arc<Vec<AtomicU64>> =
            Arc::new((0..PARTITIONS).map(|_| AtomicU64::new(0)).collect());
        let writers: Vec<_> = (0..PARTITIONS)
            .map(|p| {
                let (acked, mut b) = (acked.clone(), connect(&listen));
                std::thread::spawn(move || {
                    let fence = Fence {
                        key: record(p),
                        value: b"owner".to_vec(),
                        batch: 0,
                    };
                    let mut r = Vec::new();
                    b.execute(
                        &[Op::Set {
                            key: fence.key.clone(),
                            value: fence.value.clone(),
                        }],
                        &mut r,
                    )
                    .unwrap();
                    let ops = [
                        Op::Add {
                            key: own(p),
                            delta: 1,
                        },
                        Op::Add {
                            key: shared(p),
                            delta: 1,
                        },
                    ];
                    // Until the kill: the batch then in flight is given up.
                    loop {
                        r.clear();
                        if b.execute_fenced(&fence, &ops, &mut r).is_err() {
                            return;
                        }
                        assert!(r.iter().all(|r| matches!(r, Reply::Int(_))), "{r:?}");
                        acked[p as usize].fetch_add(1, Ordering::SeqCst);
                    }
                })
            })
            .collect();
        while acked.iter().any(|a| a.load(Ordering::SeqCst) < 50) {
            std::thread::sleep(Duration::from_millis(2));
        }
        server.child.kill().unwrap();
        server.child.wait().unwrap();
        for w in writers {
            w.join().unwrap();
        }
        server = StoreProcess::start_on(&listen, &args);
        let mut b = connect(&server.addr);
        let stats: std::collections::HashMap<String, u64> =
            b.stats().unwrap().into_iter().collect();
        rolled_forward += stats["recovered_parts"];
        for p in 0..PARTITIONS {
            let mut r = Vec::new();
            b.execute(
                &[
                    Op::GetCounter { key: own(p) },
                    Op::GetCounter { key: shared(p) },
                ],
                &mut r,
            )
            .unwrap();
            let (Reply::Int(own), Reply::Int(shared)) = (&r[0], &r[1]) else {
                panic!("{r:?}")
            };
            let acked = applied[p as usize] + acked[p as usize].load(Ordering::SeqCst) as i64;
            assert_eq!(
                own, shared,
                "cycle {cycle}, partition {p}: a batch applied in part"
            );
            assert!(
                (acked..=acked + 1).contains(own),
                "cycle {cycle}, partition {p}: {own} applied, {acked} acknowledged"
            );
            applied[p as usize] = *own;
        }
        drop(server);
    }
    // The kills cut batches between their shards: the case this test is for happened.
    assert!(rolled_forward > 0, "no batch was cut off by a kill");
}

/// `flowstate store stats` as text and JSON.
fn stats(addr: &str, json: bool) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_flowstate"))
        .args(["store", "stats", "--url", addr])
        .args(json.then_some("--json"))
        .output()
        .unwrap()
}

fn stats_json(addr: &str) -> serde_json::Value {
    let out = stats(addr, true);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// An operator's view: `flowstate store stats` shows what a NAT run did; SIGTERM stops the
/// store cleanly (exit 0, a final checkpoint, so a restart replays no log record and holds
/// the same objects); an unreachable store is an error naming its address.
#[test]
fn stats_show_the_work_and_sigterm_stops_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let data = data.to_str().unwrap();
    let args = ["--data-dir", data, "--shards", "2"];
    let mut server = StoreProcess::start(&args);
    let text = std::fs::read_to_string(root().join("examples/nat-store.toml"))
        .unwrap()
        .replace("127.0.0.1:7878", &server.addr);
    let cfg = dir.path().join("nat.toml");
    std::fs::write(&cfg, text).unwrap();
    let summary = run(&cfg);
    assert!(summary["packets_out"].as_u64().unwrap() > 0);

    let s = stats_json(&server.addr);
    let objects = s["objects"].as_u64().unwrap();
    assert!(objects > 0, "{s}");
    assert!(s["connections_total"].as_u64().unwrap() >= 1, "{s}");
    assert_eq!(s["shards"], 2);
    let ops: u64 = s
        .as_object()
        .unwrap()
        .iter()
        .filter(|(k, _)| k.starts_with("ops_") && !k.starts_with("ops_per_sec"))
        .map(|(_, v)| v.as_u64().unwrap())
        .sum();
    assert!(ops > 0, "{s}");
    let text = stats(&server.addr, false);
    assert!(text.status.success());
    let text = String::from_utf8(text.stdout).unwrap();
    let line = text
        .lines()
        .find(|l| l.starts_with("objects "))
        .unwrap_or_else(|| panic!("no objects line in {text}"));
    assert!(line.ends_with(&format!(" {objects}")), "{line}");

    let pid = server.child.id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let status = loop {
        if let Some(st) = server.child.try_wait().unwrap() {
            break st;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the store did not stop on SIGTERM"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert!(status.success(), "{status:?}");
    let dead = server.addr.clone();

    server = StoreProcess::start(&args);
    let s = stats_json(&server.addr);
    assert_eq!(s["recovered_records"], 0, "a clean stop leaves no log: {s}");
    assert_eq!(s["objects"].as_u64().unwrap(), objects, "{s}");
    drop(server);

    let out = stats(&dead, false);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&dead), "{err}");
}

/// A port that was free a moment ago on loopback.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `curl -s` of a URL; its body.
fn curl(url: &str) -> String {
    let out = Command::new("curl")
        .args(["-sSf", "-m", "5", url])
        .output()
        .expect("curl runs");
    assert!(
        out.status.success(),
        "curl {url}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// `flowstate store --metrics`: after a NAT run on the store, `/metrics` (scraped with curl)
/// shows the operations by type, the objects and the connections, never more than the
/// store's own statistics read after it, and `/api/v1/stats` is JSON.
#[test]
fn store_metrics_show_operations_by_type() {
    let metrics = format!("127.0.0.1:{}", free_port());
    let server = StoreProcess::start(&["--metrics", &metrics]);
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(root().join("examples/nat-store.toml"))
        .unwrap()
        .replace("127.0.0.1:7878", &server.addr);
    let cfg = dir.path().join("nat.toml");
    std::fs::write(&cfg, text).unwrap();
    assert!(run(&cfg)["packets_out"].as_u64().unwrap() > 0);

    let page = curl(&format!("http://{metrics}/metrics"));
    assert!(page.ends_with("# EOF\n"), "{page}");
    let mut ops = std::collections::BTreeMap::new();
    let mut values = std::collections::BTreeMap::new();
    for line in page.lines().filter(|l| !l.starts_with('#')) {
        let (series, v) = line.rsplit_once(' ').unwrap();
        let v: f64 = v.parse().unwrap();
        if let Some(op) = series
            .strip_prefix("flowstate_store_operations_total{op=\"")
            .and_then(|r| r.strip_suffix("\"}"))
        {
            ops.insert(op.to_owned(), v as u64);
        }
        values.insert(series.to_owned(), v);
    }
    let s = stats_json(&server.addr);
    assert!(ops.values().sum::<u64>() > 0, "{page}");
    for (op, n) in &ops {
        let total = s[format!("ops_{op}")]
            .as_u64()
            .unwrap_or_else(|| panic!("ops_{op} in {s}"));
        assert!(
            *n <= total,
            "{op}: scraped {n} > {total} in the stats after"
        );
    }
    assert!(values["flowstate_store_objects"] > 0.0, "{page}");
    assert_eq!(
        values["flowstate_store_objects"] as u64,
        s["objects"].as_u64().unwrap()
    );
    assert!(values["flowstate_store_connections_accepted_total"] >= 1.0);
    assert_eq!(values["flowstate_up"], 1.0);
    let api: serde_json::Value =
        serde_json::from_str(&curl(&format!("http://{metrics}/api/v1/stats"))).unwrap();
    assert!(api["ops"].as_object().unwrap().len() == ops.len(), "{api}");
    assert_eq!(curl(&format!("http://{metrics}/healthz")), "ok\n");
}

/// A store with `--metrics` that a NAT run has used: the store, its metrics address and the
/// NAT configuration on it.
fn used_store() -> (StoreProcess, String, tempfile::TempDir, PathBuf) {
    let metrics = format!("127.0.0.1:{}", free_port());
    let server = StoreProcess::start(&["--metrics", &metrics]);
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(root().join("examples/nat-store.toml"))
        .unwrap()
        .replace("127.0.0.1:7878", &server.addr);
    let cfg = dir.path().join("nat.toml");
    std::fs::write(&cfg, text).unwrap();
    assert!(run(&cfg)["packets_out"].as_u64().unwrap() > 0);
    (server, metrics, dir, cfg)
}

/// The dashboard at `/` of `flowstate store --metrics`, as headless Chromium renders it after
/// its script polled a few times: a line per operation type the store applied, and the
/// numbers of `/api/v1/stats` (the store is idle, so they are exact); the screenshot is a
/// drawn page, not a blank one.
#[test]
fn the_dashboard_shows_the_store_in_headless_chromium() {
    let Some(browser) = chromium() else { return };
    let (_server, metrics, dir, _) = used_store();
    let stats: serde_json::Value =
        serde_json::from_str(&curl(&format!("http://{metrics}/api/v1/stats"))).unwrap();
    let applied: Vec<(&String, u64)> = stats["ops"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(op, n)| (op, n.as_u64().unwrap()))
        .filter(|(_, n)| *n > 0)
        .collect();
    assert!(!applied.is_empty(), "{stats}");

    let url = format!("http://{metrics}/");
    let profile = dir.path().join("profile");
    let out = headless(
        &[],
        browser,
        &profile,
        &["--virtual-time-budget=6000", "--dump-dom"],
        &url,
    );
    let dom = polled_dashboard(out, "store");
    let chart = elements(&dom, "figure", "data-chart", "ops");
    assert_eq!(chart.len(), 1, "one chart of operations");
    let chart = &chart[0][..chart[0].find("</figure>").unwrap()];
    for (op, n) in &applied {
        let path = elements(chart, "path", "data-series", op);
        let path = path
            .first()
            .unwrap_or_else(|| panic!("a line for {op}: {chart}"));
        let points: usize = attr(path, "data-points").unwrap().parse().unwrap();
        assert!(points >= 2, "{op}: {points} points");
        let d = attr(path, "d").unwrap();
        assert_eq!(d.matches(['M', 'L']).count(), points, "{op}: {d}");
        let row = elements(&dom, "tr", "data-key", &format!("ops.{op}"));
        let cell = &row.first().unwrap_or_else(|| panic!("ops.{op} listed"))[..];
        let td = &cell[cell.find("<td").unwrap()..];
        assert_eq!(
            attr(td, "data-value"),
            Some(n.to_string().as_str()),
            "ops.{op}"
        );
    }
    assert!(
        elements(chart, "path", "data-series", "claim").is_empty(),
        "operations never applied have no line"
    );
    let kpi = elements(&dom, "div", "data-key", "objects");
    let value = elements(kpi[0], "div", "class", "value");
    assert_eq!(
        attr(value[0], "data-value"),
        Some(stats["objects"].to_string().as_str()),
        "the objects the store holds"
    );

    let pixels = screenshot(&[], browser, &profile, &url, (1200, 900));
    // The header's dark band and the first series' blue line.
    let band = pixels.iter().filter(|p| **p == (38, 50, 56)).count();
    let blue = pixels.iter().filter(|p| **p == (52, 101, 164)).count();
    assert!(band > 1200 * 20, "the header is drawn: {band}");
    assert!(blue > 100, "a line is drawn: {blue}");
}

/// `flowstate top` on a store, in a tmux pane: the operations by type with a rate while NAT
/// runs use the store, the store's own totals once it is idle, and `q` ends it with the
/// terminal back in its ordinary mode.
#[test]
fn top_shows_the_store_operations_in_tmux() {
    let Some(tmux) = Tmux::new("top-store") else {
        return;
    };
    let (_server, metrics, _dir, cfg) = used_store();
    tmux.start(
        "top",
        100,
        40,
        &pane_command(&[env!("CARGO_BIN_EXE_flowstate"), "top", &metrics]),
    );
    // NAT runs on the store while top reads it, until a rate shows (at most ten runs).
    let rate_of =
        |screen: &str, op: &str| -> Option<f64> { si(rows(screen).find(|r| r[0] == op)?.get(1)?) };
    let mut seen = None;
    for _ in 0..10 {
        let mut nat = Command::new(env!("CARGO_BIN_EXE_flowstate"))
            .args(["run", cfg.to_str().unwrap()])
            .current_dir(root())
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        while nat.try_wait().unwrap().is_none() && seen.is_none() {
            let screen = tmux.capture("top");
            if rate_of(&screen, "all").is_some_and(|r| r > 0.0) {
                seen = Some(screen);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        assert!(nat.wait().unwrap().success());
        if seen.is_some() {
            break;
        }
    }
    let seen = seen.unwrap_or_else(|| {
        panic!(
            "a rate of operations while NAT runs: {}",
            tmux.capture("top")
        )
    });
    assert!(seen.contains("connected"), "{seen}");
    assert!(seen.contains("Operations by type"), "{seen}");

    // Idle: the pane comes to show the store's own totals.
    let stats = stats_json(&_server.addr);
    let (ok, screen) = tmux.wait_for("top", Duration::from_secs(20), |screen| {
        ["push", "map_set", "all"].iter().all(|op| {
            let total = if *op == "all" {
                stats
                    .as_object()
                    .unwrap()
                    .iter()
                    .filter(|(k, _)| k.starts_with("ops_") && !k.starts_with("ops_per_sec"))
                    .map(|(_, v)| v.as_u64().unwrap())
                    .sum::<u64>()
            } else {
                stats[format!("ops_{op}")].as_u64().unwrap()
            };
            rows(screen).any(|r| r[0] == *op && r.get(2) == Some(&total.to_string()))
        })
    });
    assert!(ok, "the totals of `store stats` {stats}: {screen}");

    tmux.run(&["send-keys", "-t", "top", "q"]);
    let (ok, screen) = tmux.wait_for("top", Duration::from_secs(10), |s| {
        s.lines().any(|l| l.starts_with("tty "))
    });
    assert!(ok, "top ends on q: {screen}");
    assert!(screen.contains("exited 0"), "{screen}");
    assert!(
        screen.contains("tty icanon echo"),
        "the terminal is restored: {screen}"
    );
    assert!(
        !screen.contains("Operations by type"),
        "the view is gone: {screen}"
    );
}

/// Test certificates made by `scripts/tls-certs` (openssl) into `dir`.
fn tls_certs(dir: &Path) -> PathBuf {
    let certs = dir.join("tls");
    let out = Command::new("bash")
        .arg(root().join("scripts/tls-certs"))
        .arg(&certs)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "scripts/tls-certs: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    certs
}

/// `flowstate store` serving TLS with a token read from a file; `flowstate run` with
/// `ca_file` and `token_file` sends the NAT's packets as on the embedded store, `store stats
/// --ca-file` reads it; a configuration without TLS, with another CA or with a wrong token
/// stops at start-up naming the key, and the store goes on serving.
#[test]
fn nat_over_tls_with_a_token_sends_the_same_packets_and_bad_settings_name_their_key() {
    let dir = tempfile::tempdir().unwrap();
    let certs = tls_certs(dir.path());
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "tls-s3cret\n").unwrap();
    let cert = certs.join("server.pem");
    let key = certs.join("server.key");
    let server = StoreProcess::start(&[
        "--tls-cert",
        cert.to_str().unwrap(),
        "--tls-key",
        key.to_str().unwrap(),
        "--token-file",
        token_file.to_str().unwrap(),
    ]);
    let ca = certs.join("ca.pem");
    let store = std::fs::read_to_string(root().join("examples/nat-store.toml")).unwrap();
    let local = std::fs::read_to_string(root().join("examples/nat.toml")).unwrap();
    let with_state = |lines: &str| -> String {
        store
            .replace("127.0.0.1:7878", &server.addr)
            .replace("# token = \"...\"", lines)
    };
    let tls = format!(
        "token_file = {:?}\nca_file = {:?}",
        token_file.to_str().unwrap(),
        ca.to_str().unwrap()
    );
    let mut outputs = Vec::new();
    for (name, text) in [("local", local.clone()), ("store", with_state(&tls))] {
        let out = dir.path().join(format!("{name}.pcap"));
        let text = text.replace(
            "discard = true",
            &format!("pcap = {:?}", out.to_str().unwrap()),
        );
        let cfg = dir.path().join(format!("{name}.toml"));
        std::fs::write(&cfg, text).unwrap();
        let summary = run(&cfg);
        assert_eq!(summary["backend"], name);
        outputs.push(packets(&std::fs::read(&out).unwrap()));
    }
    assert!(outputs[0].len() > 1000);
    assert!(
        outputs[0] == outputs[1],
        "the NAT's output packets differ between the embedded store and the TLS store"
    );

    let other_ca = certs.join("other-ca.pem");
    for (lines, key) in [
        (
            format!("token_file = {:?}", token_file.to_str().unwrap()),
            "state.ca_file",
        ),
        (
            format!(
                "token_file = {:?}\nca_file = {:?}",
                token_file.to_str().unwrap(),
                other_ca.to_str().unwrap()
            ),
            "state.ca_file",
        ),
        (
            format!("token = \"wrong\"\nca_file = {:?}", ca.to_str().unwrap()),
            "state.token",
        ),
    ] {
        let cfg = dir.path().join("bad.toml");
        std::fs::write(&cfg, with_state(&lines)).unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_flowstate"))
            .args(["run", cfg.to_str().unwrap()])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{lines}: {err}");
        assert!(err.contains(&format!(": {key}: ")), "{lines}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }

    let out = Command::new(env!("CARGO_BIN_EXE_flowstate"))
        .args(["store", "stats", "--url", &server.addr, "--json"])
        .args(["--token-file", token_file.to_str().unwrap()])
        .args(["--ca-file", ca.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let s: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(s["ops_set"].as_u64().unwrap() > 0, "{s}");
    assert!(
        s["errors"].as_u64().unwrap() >= 2,
        "the refusals are counted: {s}"
    );
}
