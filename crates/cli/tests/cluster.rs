//! The cluster in the lab, with real hosts: a root on the box's ports, a controller, NF
//! instances in their own namespaces, state in a store they share (our store, then Redis).
//! Instances are killed, added and drained under 100 concurrent HTTP downloads; every download
//! must complete byte for byte, the server must see only the NAT's address, and a UDP flow must
//! keep its mapping (needs root and scripts/setup-live; skipped with a message when not root).

mod common;

use common::{content, is_root};
use flowstate_lab::{Lab, System, BOX_OUTSIDE, CLIENT, SERVER};
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

static SERIAL: Mutex<()> = Mutex::new(());

const FLOWSTATE: &str = env!("CARGO_BIN_EXE_flowstate");

/// A lab with instance namespaces and a cluster in it; both are taken down on drop.
struct Cluster {
    lab: Lab,
    dir: tempfile::TempDir,
    config: PathBuf,
    background: Vec<Child>,
}

impl Cluster {
    fn up(name: &str, state: &str, instances: u32) -> Cluster {
        let prefix = format!("fc-{name}{}-", std::process::id() % 10_000);
        let lab = Lab::new(&prefix).unwrap().with_instances(4).unwrap();
        lab.up(&mut System::default()).unwrap();
        // A small receive buffer, so a rate-limited download's bytes cross the cluster while
        // curl reads them rather than all at once into the client's socket.
        let rmem = Command::new("ip")
            .args(["netns", "exec", &lab.client_ns(), "sysctl", "-qw"])
            .arg("net.ipv4.tcp_rmem=4096 32768 65536")
            .status()
            .unwrap();
        assert!(rmem.success());
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("cluster.toml");
        std::fs::write(
            &config,
            format!(
                "[input]\ninterface = \"fs-in\"\naddress = \"10.0.0.1\"\n\
                 [output]\ninterface = \"fs-out\"\naddress = \"{BOX_OUTSIDE}\"\n\
                 [runtime]\ninside = [\"10.0.0.0/24\"]\n\
                 [state]\n{state}\n\
                 [cluster]\npartitions = 16\ninstances = {instances}\nstore = \"managed\"\n\
                 [[chain]]\nnf = \"firewall\"\ndefault_outbound = \"allow\"\ndefault_inbound = \"deny\"\n\
                 [[chain]]\nnf = \"nat\"\nexternal = [\"{BOX_OUTSIDE}\"]\nports = \"20000-59999\"\n"
            ),
        )
        .unwrap();
        let c = Cluster {
            lab,
            dir,
            config,
            background: Vec::new(),
        };
        let out = c.flowstate(&["cluster", "up", c.config.to_str().unwrap()]);
        assert!(out.status.success(), "cluster up: {}", text(&out));
        c
    }

    fn flowstate(&self, args: &[&str]) -> Output {
        Command::new(FLOWSTATE)
            .args(args)
            .args(["--prefix", self.lab.prefix()])
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }

    fn status(&self) -> serde_json::Value {
        let out = self.flowstate(&["cluster", "status", "--json"]);
        assert!(out.status.success(), "cluster status: {}", text(&out));
        serde_json::from_slice(&out.stdout).unwrap()
    }

    /// Waits until `ok` holds for the status (at most `secs`).
    fn wait_for(&self, secs: u64, what: &str, ok: impl Fn(&serde_json::Value) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            let s = self.status();
            if ok(&s) {
                return;
            }
            assert!(Instant::now() < deadline, "{what}: never; status {s:#}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn in_ns(&self, ns: &str, argv: &[&str]) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", ns])
            .args(argv)
            .stdin(Stdio::null());
        c
    }

    /// `n` concurrent downloads of `file` at `rate` each, in the client namespace.
    fn downloads(&mut self, n: usize, file: &str, rate: &str) -> Vec<(Child, PathBuf)> {
        (0..n)
            .map(|i| {
                let to = self.dir.path().join(format!("dl{i}"));
                let url = format!("http://{SERVER}:8080/{file}");
                let child = self
                    .in_ns(
                        &self.lab.client_ns(),
                        &[
                            "curl",
                            "-sS",
                            "-m",
                            "90",
                            "--limit-rate",
                            rate,
                            "-o",
                            to.to_str().unwrap(),
                            &url,
                        ],
                    )
                    .stdout(Stdio::null())
                    .stderr(Stdio::piped())
                    .spawn()
                    .unwrap();
                (child, to)
            })
            .collect()
    }

    /// A UDP echo server on the server (logging every peer) and a client sending one request
    /// every 50 ms from one source port, `count` times; the client prints when each reply came.
    fn udp_flow(&mut self, count: u32) -> (Child, PathBuf) {
        let log = self.dir.path().join("udp-peers.log");
        let server = format!(
            "import socket\ns=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\ns.bind(('{SERVER}',9999))\n\
             f=open('{}','a',buffering=1)\nwhile True:\n d,a=s.recvfrom(2048)\n f.write('%s:%d\\n'%a)\n s.sendto(d,a)\n",
            log.display()
        );
        let s = self
            .in_ns(&self.lab.server_ns(), &["python3", "-c", &server])
            .spawn()
            .unwrap();
        self.background.push(s);
        let client = format!(
            "import socket,time\n\
             s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\n\
             s.bind(('{CLIENT}',40000))\n\
             s.settimeout(0.05)\n\
             for i in range({count}):\n\
             \x20t=time.time()\n\
             \x20s.sendto(b'%d'%i,('{SERVER}',9999))\n\
             \x20try:\n\
             \x20\x20d,a=s.recvfrom(2048)\n\
             \x20\x20print('%d %f'%(i,time.time()),flush=True)\n\
             \x20except OSError:\n\
             \x20\x20pass\n\
             \x20time.sleep(max(0,0.05-(time.time()-t)))\n"
        );
        let c = self
            .in_ns(&self.lab.client_ns(), &["python3", "-c", &client])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        (c, log)
    }

    fn root(&self) -> serde_json::Value {
        self.status()["root"].clone()
    }

    fn instance_stats(&self) -> Vec<serde_json::Value> {
        let dir = self.lab.state_dir().join("cluster");
        (1..=4)
            .filter_map(|k| std::fs::read_to_string(dir.join(format!("instance-{k}.json"))).ok())
            .map(|t| serde_json::from_str(&t).unwrap())
            .collect()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for c in &mut self.background {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = self.flowstate(&["cluster", "down"]);
        let _ = self.lab.down(&mut System::default());
    }
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn publish(lab: &Lab, name: &str, len: usize) -> Vec<u8> {
    let data = content(len, len as u64);
    std::fs::write(lab.www('a').join(name), &data).unwrap();
    data
}

/// Every download is still running and has less than three quarters of its `len` bytes: what
/// happens next happens in the middle of every connection.
fn still_transferring(downloads: &mut [(Child, PathBuf)], len: usize) {
    for (i, (child, to)) in downloads.iter_mut().enumerate() {
        let got = std::fs::metadata(&*to).map_or(0, |m| m.len() as usize);
        assert!(
            child.try_wait().unwrap().is_none() && got < len * 3 / 4,
            "download #{i} is not in the middle ({got} of {len} bytes)"
        );
    }
}

/// Every download completed with exactly `want`.
fn check_downloads(downloads: Vec<(Child, PathBuf)>, want: &[u8]) {
    let n = downloads.len();
    let mut failed = Vec::new();
    for (i, (child, to)) in downloads.into_iter().enumerate() {
        let out = child.wait_with_output().unwrap();
        let got = std::fs::read(&to).unwrap_or_default();
        if !out.status.success() || got != want {
            failed.push(format!(
                "#{i}: {} ({} of {} bytes) {}",
                out.status,
                got.len(),
                want.len(),
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
    }
    assert!(
        failed.is_empty(),
        "{} of {n} downloads failed: {failed:#?}",
        failed.len()
    );
}

/// The HTTP server saw the NAT's address and never the client's.
fn server_saw_only_the_nat(lab: &Lab) {
    let log = std::fs::read_to_string(lab.log("http-a")).unwrap();
    assert!(log.contains(&BOX_OUTSIDE.to_string()), "{log}");
    assert!(
        !log.contains(&CLIENT.to_string()),
        "the client's address leaked: {log}"
    );
}

fn live(s: &serde_json::Value) -> Vec<u64> {
    s["instances"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["state"] == "live")
        .map(|i| i["id"].as_u64().unwrap())
        .collect()
}

fn owned(s: &serde_json::Value) -> usize {
    s["instances"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["partitions"].as_array().unwrap().len())
        .sum()
}

/// Kill -9 one of three instances under 100 downloads and a UDP flow.
fn failover(name: &str, state: &str) {
    let mut c = Cluster::up(name, state, 3);
    let want = publish(&c.lab, "f1m.bin", 1_000_000);
    let s = c.status();
    assert_eq!(live(&s), vec![1, 2, 3], "{s:#}");
    assert_eq!(owned(&s), 16);
    let lost = s["instances"][0]["partitions"].as_array().unwrap().len() as u64;
    assert!(lost > 0, "{s:#}");
    let (udp, peers) = c.udp_flow(120);
    let mut downloads = c.downloads(100, "f1m.bin", "200k");
    std::thread::sleep(Duration::from_millis(1500));
    still_transferring(&mut downloads, want.len());
    let killed_at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let out = c.flowstate(&["cluster", "kill", "1"]);
    assert!(out.status.success(), "{}", text(&out));
    check_downloads(downloads, &want);
    server_saw_only_the_nat(&c.lab);
    // The UDP flow kept its mapping: one peer at the server, replies after the failover.
    let replies = String::from_utf8(udp.wait_with_output().unwrap().stdout).unwrap();
    let after = replies
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        .filter(|&t| t > killed_at + 1.0)
        .count();
    assert!(
        after > 20,
        "UDP replies after the failover: {after}\n{replies}"
    );
    let peers = std::fs::read_to_string(peers).unwrap();
    let distinct: std::collections::BTreeSet<&str> = peers.lines().collect();
    assert_eq!(
        distinct.len(),
        1,
        "the UDP flow's mapping changed: {distinct:?}"
    );
    assert!(distinct
        .iter()
        .all(|p| p.starts_with(&format!("{BOX_OUTSIDE}:"))));
    // Instance 1's partitions went to the survivors; a replacement was started for it.
    let s = c.status();
    assert_eq!(owned(&s), 16, "{s:#}");
    let root = c.root();
    assert_eq!(root["reordered"], 0, "{root:#}");
    assert!(root["moves_done"].as_u64().unwrap() >= lost, "{root:#}");
    eprintln!("after the failover: {s:#}");
    eprintln!(
        "{}",
        std::fs::read_to_string(c.lab.state_dir().join("cluster/controller.log")).unwrap()
    );
}

#[test]
fn a_killed_instance_fails_over_without_a_broken_connection_on_our_store() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    failover("s", "backend = \"store\"\nurl = \"192.0.2.1:7878\"");
}

#[test]
fn a_killed_instance_fails_over_without_a_broken_connection_on_redis() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    failover("r", "backend = \"redis\"\nurl = \"redis://192.0.2.1:6379\"");
}

#[test]
fn scaling_out_and_in_moves_partitions_without_loss_and_a_restarted_controller_changes_nothing() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    let mut c = Cluster::up("m", "backend = \"store\"\nurl = \"192.0.2.1:7878\"", 2);
    let want = publish(&c.lab, "f1m.bin", 1_000_000);
    let mut downloads = c.downloads(60, "f1m.bin", "150k");
    std::thread::sleep(Duration::from_millis(1000));
    still_transferring(&mut downloads, want.len());
    let out = c.flowstate(&["cluster", "scale", "3"]);
    assert!(out.status.success(), "{}", text(&out));
    c.wait_for(20, "three instances sharing the partitions", |s| {
        live(s).len() == 3
            && s["instances"]
                .as_array()
                .unwrap()
                .iter()
                .all(|i| i["partitions"].as_array().unwrap().len() >= 5)
            && s["root"]["moving"] == 0
    });
    std::thread::sleep(Duration::from_millis(1000));
    let out = c.flowstate(&["cluster", "scale", "2"]);
    assert!(out.status.success(), "{}", text(&out));
    c.wait_for(20, "back to two instances", |s| {
        live(s).len() == 2 && owned(s) == 16 && s["root"]["moving"] == 0
    });
    check_downloads(downloads, &want);
    server_saw_only_the_nat(&c.lab);
    let root = c.root();
    assert!(root["moves_done"].as_u64().unwrap() >= 10, "{root:#}");
    for key in ["hold_dropped", "reordered", "release_timeouts", "no_owner"] {
        assert_eq!(root[key], 0, "{key}: {root:#}");
    }
    for i in c.instance_stats() {
        assert_eq!(i["misdirected"], 0, "{i:#}");
    }

    // Kill the controller and start it again: the same assignment, nothing moves.
    let before = c.status();
    let pid = std::fs::read_to_string(c.lab.state_dir().join("cluster/controller.pid")).unwrap();
    assert!(Command::new("kill")
        .args(["-9", pid.trim()])
        .status()
        .unwrap()
        .success());
    let out = c.flowstate(&["cluster", "up", c.config.to_str().unwrap()]);
    assert!(out.status.success(), "cluster up again: {}", text(&out));
    std::thread::sleep(Duration::from_millis(1000));
    let after = c.status();
    assert_eq!(after["version"], before["version"], "{before:#}\n{after:#}");
    let parts = |s: &serde_json::Value| -> Vec<(u64, serde_json::Value)> {
        s["instances"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|i| i["state"] == "live")
            .map(|i| (i["id"].as_u64().unwrap(), i["partitions"].clone()))
            .collect()
    };
    assert_eq!(parts(&after), parts(&before));
}
