//! The cluster in the lab, with real hosts: a root on the box's ports, a controller, NF
//! instances in their own namespaces, state in a store they share (our store, then Redis).
//! Instances are killed, added and drained under 100 concurrent HTTP downloads; every download
//! must complete byte for byte, the server must see only the NAT's address, and a UDP flow must
//! keep its mapping (needs root and scripts/setup-live; skipped with a message when not root).

mod common;

use common::{content, ipv6_hosts, run_all, HTTP_PY};
use flowstate_lab::{
    Cut, Lab, RoutedHost, System, BOX_OUTSIDE, CLIENT, CLIENT_IF, SERVER, STORE_ADDR,
};
use flowstate_testkit::is_root;
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
    /// The controller's command socket, when it was started on its own.
    socket: Option<PathBuf>,
    /// The runit service directory of a supervised root ([`Cluster::supervise_root`]).
    supervised: Option<PathBuf>,
}

impl Cluster {
    /// `input`: extra keys of `[input]` (the root's fast path).
    fn up(name: &str, state: &str, instances: u32, input: &str) -> Cluster {
        Cluster::up_with(name, &Cluster::config(state, instances, input), 4)
    }

    /// The deployment [`Cluster::up`] runs.
    fn config(state: &str, instances: u32, input: &str) -> String {
        format!(
            "[input]\ninterface = \"fs-in\"\naddress = \"10.0.0.1\"\n{input}\n\
             [output]\ninterface = \"fs-out\"\naddress = \"{BOX_OUTSIDE}\"\n\
             [runtime]\ninside = [\"10.0.0.0/24\"]\n\
             [state]\n{state}\n\
             [cluster]\npartitions = 16\ninstances = {instances}\nstore = \"managed\"\n\
             [[chain]]\nnf = \"firewall\"\ndefault_outbound = \"allow\"\ndefault_inbound = \"deny\"\n\
             [[chain]]\nnf = \"nat\"\nexternal = [\"{BOX_OUTSIDE}\"]\nports = \"20000-59999\"\n"
        )
    }

    /// The lab with `namespaces` instance namespaces and a cluster deployed by `config`.
    fn up_with(name: &str, config: &str, namespaces: u32) -> Cluster {
        Cluster::up_on(name, config, namespaces, false)
    }

    /// [`Cluster::up_with`], the cluster network `routed` (`lab up --routed`) or not.
    fn up_on(name: &str, config: &str, namespaces: u32, routed: bool) -> Cluster {
        let c = Cluster::lab_routed(name, config, namespaces, routed);
        let out = c.flowstate(&["cluster", "up", c.config.to_str().unwrap()]);
        assert!(out.status.success(), "cluster up: {}", text(&out));
        c
    }

    /// The lab with `namespaces` instance namespaces and `config` written, nothing started.
    fn lab_with(name: &str, config: &str, namespaces: u32) -> Cluster {
        Cluster::lab_routed(name, config, namespaces, false)
    }

    /// [`Cluster::lab_with`], the cluster network `routed` (`lab up --routed`) or not.
    fn lab_routed(name: &str, config: &str, namespaces: u32, routed: bool) -> Cluster {
        let prefix = format!("fc-{name}{}-", std::process::id() % 10_000);
        let lab = Lab::new(&prefix)
            .unwrap()
            .with_instances(namespaces)
            .unwrap()
            .with_routed(routed);
        lab.up(&mut System::default()).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cluster.toml");
        std::fs::write(&path, config).unwrap();
        let config = path;
        Cluster {
            lab,
            dir,
            config,
            background: Vec::new(),
            socket: None,
            supervised: None,
        }
    }

    fn flowstate(&self, args: &[&str]) -> Output {
        let socket = self
            .socket
            .iter()
            .flat_map(|s| ["--socket".as_ref(), s.as_os_str()]);
        Command::new(FLOWSTATE)
            .args(args)
            .args(["--prefix", self.lab.prefix()])
            .args(socket)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }

    fn status(&self) -> serde_json::Value {
        self.try_status()
            .unwrap_or_else(|e| panic!("cluster status: {e}"))
    }

    fn try_status(&self) -> Result<serde_json::Value, String> {
        let out = self.flowstate(&["cluster", "status", "--json"]);
        if !out.status.success() {
            return Err(text(&out));
        }
        serde_json::from_slice(&out.stdout).map_err(|e| e.to_string())
    }

    /// Waits until `ok` holds for the status (at most `secs`; a controller that does not
    /// answer yet is waited for too), and returns that status.
    fn wait_for(
        &self,
        secs: u64,
        what: &str,
        ok: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            let s = self.try_status();
            if s.as_ref().is_ok_and(&ok) {
                return s.unwrap();
            }
            assert!(
                Instant::now() < deadline,
                "{what}: never; status {s:#?}\n{}",
                self.role_logs()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Every download completed with exactly `want` (a failure shows the cluster's status and
    /// every role's log).
    fn check_downloads(&self, downloads: Vec<(Child, PathBuf)>, want: &[u8]) {
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
            "{} of {n} downloads failed: {failed:#?}\nstatus {:#?}\n{}",
            failed.len(),
            self.try_status(),
            self.role_logs()
        );
    }

    /// The last lines of every role's log (for a failure's message).
    fn role_logs(&self) -> String {
        let dir = self.lab.state_dir().join("cluster");
        let mut out = String::new();
        let mut names: Vec<_> = std::fs::read_dir(&dir)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "log"))
            .collect();
        names.sort();
        for p in names {
            let text = std::fs::read_to_string(&p).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            let tail = lines[lines.len().saturating_sub(40)..].join("\n");
            out.push_str(&format!("--- {} (last 40 lines)\n{tail}\n", p.display()));
        }
        out
    }

    fn in_ns(&self, ns: &str, argv: &[&str]) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", ns])
            .args(argv)
            .stdin(Stdio::null());
        c
    }

    /// An HTTP server on the server's port 8081 that sends `body` to every request at `rate`
    /// bytes per second, logging each peer to the returned file. The server paces: curl's
    /// `--limit-rate` does not hold when the box forwards at line rate (curl reads whatever
    /// the socket has, up to 100 reads of 16 kB, before it looks at its limit).
    fn serve_paced(&mut self, body: &[u8], rate: u32) -> PathBuf {
        let file = self.dir.path().join("paced.bin");
        std::fs::write(&file, body).unwrap();
        let log = self.dir.path().join("paced-peers.log");
        let server = format!(
            "import socket,threading,time\n\
             data=open('{}','rb').read()\n\
             log=open('{}','a',buffering=1)\n\
             s=socket.socket()\n\
             s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n\
             s.bind(('{SERVER}',8081))\n\
             s.listen(1024)\n\
             def serve(c,a):\n\
             \x20try:\n\
             \x20\x20c.recv(4096)\n\
             \x20\x20log.write('%s:%d\\n'%a)\n\
             \x20\x20c.sendall(b'HTTP/1.1 200 OK\\r\\nContent-Length: %d\\r\\nConnection: close\\r\\n\\r\\n'%len(data))\n\
             \x20\x20for i in range(0,len(data),16384):\n\
             \x20\x20\x20c.sendall(data[i:i+16384])\n\
             \x20\x20\x20time.sleep(16384/{rate})\n\
             \x20finally:\n\
             \x20\x20c.close()\n\
             while True:\n\
             \x20c,a=s.accept()\n\
             \x20threading.Thread(target=serve,args=(c,a),daemon=True).start()\n",
            file.display(),
            log.display()
        );
        let child = self
            .in_ns(&self.lab.server_ns(), &["python3", "-c", &server])
            .spawn()
            .unwrap();
        self.background.push(child);
        // Listening before the first download.
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self
            .in_ns(&self.lab.server_ns(), &["ss", "-Hltn", "sport = :8081"])
            .output()
            .is_ok_and(|o| !o.stdout.is_empty())
        {
            assert!(Instant::now() < deadline, "the paced server did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
        log
    }

    /// `n` concurrent downloads from the paced server ([`Cluster::serve_paced`]), in the
    /// client namespace.
    fn downloads(&mut self, n: usize) -> Vec<(Child, PathBuf)> {
        (0..n)
            .map(|i| {
                let to = self.dir.path().join(format!("dl{i}"));
                let url = format!("http://{SERVER}:8081/");
                let child = self
                    .in_ns(
                        &self.lab.client_ns(),
                        &["curl", "-sS", "-m", "90", "-o", to.to_str().unwrap(), &url],
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

    /// Waits (at most 10 s) until the instances hold `n` per-flow entries between them: each
    /// connection is one at the firewall and one at the NAT of its partition's owner.
    fn wait_for_entries(&self, n: u64) {
        self.wait_for(
            10,
            "an entry for every connection at the firewall and the NAT",
            |s| {
                let entries: u64 = s["instances"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|i| i["entries"].as_u64().unwrap_or(0))
                    .sum();
                entries >= n
            },
        );
    }

    fn root(&self) -> serde_json::Value {
        self.status()["root"].clone()
    }

    fn instance_stats(&self) -> Vec<serde_json::Value> {
        let dir = self.lab.state_dir().join("cluster");
        (1..=self.lab.instances())
            .filter_map(|k| std::fs::read_to_string(dir.join(format!("instance-{k}.json"))).ok())
            .map(|t| serde_json::from_str(&t).unwrap())
            .collect()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if let Some(sv) = &self.supervised {
            // The root first, then its supervisor (which would start it again).
            let _ = Command::new("sv")
                .args(["-w", "5", "force-stop"])
                .arg(sv)
                .status();
            let _ = Command::new("sv").arg("exit").arg(sv).status();
        }
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

/// The UDP flow of [`Cluster::udp_flow`] kept its NAT mapping through what happened at
/// `since` (seconds since the epoch): replies went on after it, and the server saw one peer,
/// the NAT's address.
fn udp_kept_its_mapping(udp: Child, peers: &std::path::Path, since: f64) {
    let replies = String::from_utf8(udp.wait_with_output().unwrap().stdout).unwrap();
    let after = replies
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        .filter(|&t| t > since + 1.0)
        .count();
    assert!(after > 20, "UDP replies after it: {after}\n{replies}");
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
}

/// The HTTP server (its log of peers) saw the NAT's address and never the client's.
fn server_saw_only_the_nat(peers: &std::path::Path) {
    let log = std::fs::read_to_string(peers).unwrap();
    assert!(log.contains(&BOX_OUTSIDE.to_string()), "{log}");
    assert!(
        !log.contains(&CLIENT.to_string()),
        "the client's address leaked: {log}"
    );
}

fn live(s: &serde_json::Value) -> Vec<u64> {
    in_state(s, "live")
}

fn owned(s: &serde_json::Value) -> usize {
    s["instances"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["partitions"].as_array().unwrap().len())
        .sum()
}

/// Partitions of instance `id`.
fn partitions_of(s: &serde_json::Value, id: u64) -> Vec<u64> {
    s["instances"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["id"] == id)
        .flat_map(|i| i["partitions"].as_array().unwrap().iter())
        .map(|p| p.as_u64().unwrap())
        .collect()
}

/// What the lab's controller logged.
fn controller_log(c: &Cluster) -> String {
    std::fs::read_to_string(c.lab.state_dir().join("cluster/controller.log")).unwrap_or_default()
}

/// Ids of the instances in `state` (`live`, `standby`, ...).
fn in_state(s: &serde_json::Value, state: &str) -> Vec<u64> {
    s["instances"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["state"] == state)
        .map(|i| i["id"].as_u64().unwrap())
        .collect()
}

/// Kill -9 one of three instances under 100 downloads and a UDP flow, with the root's XDP
/// fast path (the default) or every packet through the instances; `standby`: with a warm
/// standby (the instance that reported last), which takes the killed instance's partitions,
/// while its replacement stands by.
fn failover(name: &str, state: &str, fast_path: bool, standby: bool) {
    let mut config = Cluster::config(state, 3, &format!("fast_path = {fast_path}"));
    if standby {
        config = config.replacen("[cluster]\n", "[cluster]\nstandby = 1\n", 1);
    }
    let mut c = Cluster::up_with(name, &config, 4);
    let want = content(1_000_000, 7);
    let http_peers = c.serve_paced(&want, 200_000);
    let settled = |s: &serde_json::Value| {
        live(s).len() == 3 && in_state(s, "standby").len() == usize::from(standby) && owned(s) == 16
    };
    c.wait_for(5, "three live instances owning every partition", settled);
    let (udp, peers) = c.udp_flow(120);
    let mut downloads = c.downloads(100);
    std::thread::sleep(Duration::from_millis(1000));
    // Each connection is an entry of the firewall and of the NAT at its partition's owner
    // (100 curls take a while to connect on a loaded machine; the instances report on their
    // own schedule).
    c.wait_for_entries(200);
    still_transferring(&mut downloads, want.len());
    // The cluster just before the kill (on a loaded machine an instance may have been failed
    // over meanwhile: then its replacement has joined).
    let before = c.wait_for(10, "the cluster settled before the kill", settled);
    let spare = in_state(&before, "standby");
    let victim = live(&before)[0];
    let lost = partitions_of(&before, victim).len() as u64;
    assert!(lost > 0, "{before:#}");
    let moves_before = before["root"]["moves_done"].as_u64().unwrap();
    let killed_at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let out = c.flowstate(&["cluster", "kill", &victim.to_string()]);
    assert!(out.status.success(), "{}", text(&out));
    c.check_downloads(downloads, &want);
    server_saw_only_the_nat(&http_peers);
    udp_kept_its_mapping(udp, &peers, killed_at);
    // The victim's partitions went to the survivors (with a standby: to it first, the others
    // keeping theirs); a replacement was started for it (with a standby: it stands by, and no
    // partition moved to it).
    let mut s = c.status();
    for _ in 0..100 {
        if in_state(&s, "standby") == [victim] || !standby {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
        s = c.status();
    }
    assert_eq!(owned(&s), 16, "{s:#}");
    let root = c.root();
    assert_eq!(root["reordered"], 0, "{root:#}");
    let moves = root["moves_done"].as_u64().unwrap() - moves_before;
    if standby {
        let survivors: Vec<u64> = live(&before).into_iter().filter(|&i| i != victim).collect();
        let mut serving = [&survivors[..], &spare[..]].concat();
        serving.sort_unstable();
        assert_eq!(in_state(&s, "standby"), vec![victim], "{s:#}");
        assert_eq!(live(&s), serving, "{s:#}");
        assert!(
            partitions_of(&s, spare[0]).len() as u64 >= lost - 1,
            "{s:#}"
        );
        for id in survivors {
            let kept = partitions_of(&before, id);
            let now = partitions_of(&s, id);
            assert!(
                kept.iter().all(|p| now.contains(p)),
                "{id} lost one of {kept:?}: before {before:#}\nafter {s:#}\n{}",
                controller_log(&c)
            );
        }
        assert_eq!(moves, lost, "only the failover's moves: {root:#}");
    } else {
        assert!(moves >= lost, "{root:#}");
    }
    // The fast path carried the downloads (or, off, nothing).
    let fast = root["fast_path_packets"].as_u64().unwrap();
    assert_eq!(fast > 10_000, fast_path, "{root:#}");
    // The managed store takes only clients with the lab's credentials.
    let nf = c.lab.nf_ns();
    let anonymous = if state.contains("redis") {
        let out = c
            .in_ns(&nf, &["redis-cli", "-h", "192.0.2.1", "ping"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).contains("NOAUTH")
    } else {
        let ns = format!("/run/netns/{nf}");
        std::thread::spawn(move || {
            use flowstate_state::{Backend, Kind, ObjectKey, Op};
            use std::os::fd::AsRawFd;
            let f = std::fs::File::open(&ns).unwrap();
            // SAFETY: a namespace file descriptor; only this thread changes namespace.
            assert_eq!(unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) }, 0);
            let op = Op::Get {
                key: ObjectKey::shared("x", Kind::Value, "y"),
            };
            flowstate_driver_store::StoreConnector::new("192.0.2.1:7878")
                .open()
                .and_then(|mut b| b.execute(&[op], &mut Vec::new()))
                .is_err()
        })
        .join()
        .unwrap()
    };
    assert!(
        anonymous,
        "the managed store served a client without credentials"
    );
    eprintln!("after the failover: {s:#}");
    eprintln!("{}", controller_log(&c));
    // `cluster down` stops every process it started, the managed store included (a Redis
    // server rewrites its title).
    let store = store_pid(&c);
    let down = c.flowstate(&["cluster", "down"]);
    assert!(down.status.success(), "{}", text(&down));
    assert!(
        flowstate_lab::wait_stopped(store.parse().unwrap(), Duration::from_secs(10)),
        "cluster down left the managed store (pid {store}) running"
    );
}

#[test]
fn a_killed_instance_fails_over_to_a_standby_without_a_broken_connection_on_our_store() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    failover(
        "s",
        "backend = \"store\"\nurl = \"192.0.2.1:7878\"",
        true,
        true,
    );
}

#[test]
fn a_killed_instance_fails_over_without_a_broken_connection_on_redis() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    failover(
        "r",
        "backend = \"redis\"\nurl = \"redis://192.0.2.1:6379\"",
        false,
        false,
    );
}

#[test]
fn scaling_out_and_in_moves_partitions_without_loss_and_a_restarted_controller_changes_nothing() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    let mut c = Cluster::up("m", "backend = \"store\"\nurl = \"192.0.2.1:7878\"", 2, "");
    let want = content(1_000_000, 9);
    let peers = c.serve_paced(&want, 150_000);
    let mut downloads = c.downloads(60);
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
    c.check_downloads(downloads, &want);
    server_saw_only_the_nat(&peers);
    let root = c.root();
    assert!(root["moves_done"].as_u64().unwrap() >= 10, "{root:#}");
    for key in ["hold_dropped", "reordered", "release_timeouts", "no_owner"] {
        assert_eq!(root[key], 0, "{key}: {root:#}");
    }
    // Moving partitions' flows left the root's fast path (and came back to it after).
    assert!(
        root["fast_path_moved_out"].as_u64().unwrap() > 0,
        "{root:#}"
    );
    assert!(
        root["fast_path_packets"].as_u64().unwrap() > 10_000,
        "{root:#}"
    );
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
    // It takes its own lapsed lease over in the next term and publishes the same owners again.
    c.wait_for(10, "the restarted controller leads", |s| {
        s["leader"]["me"] == true && s["leader"]["term"] == 2
    });
    std::thread::sleep(Duration::from_millis(500));
    let after = c.status();
    let version = |s: &serde_json::Value| s["stages"][0]["version"].as_u64().unwrap();
    assert_eq!(
        version(&after),
        version(&before) + 1,
        "{before:#}\n{after:#}"
    );
    let unversioned = |s: &serde_json::Value| {
        let mut st = s["stages"].clone();
        st[0]["version"] = 0.into();
        st
    };
    assert_eq!(
        unversioned(&after),
        unversioned(&before),
        "{before:#}\n{after:#}"
    );
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

    // Kill the root and start it again: a new epoch, its clocks above the old root's, and
    // traffic flows through it.
    let old = c.root();
    let pid = std::fs::read_to_string(c.lab.state_dir().join("cluster/root.pid")).unwrap();
    assert!(Command::new("kill")
        .args(["-9", pid.trim()])
        .status()
        .unwrap()
        .success());
    // Gone (SIGKILL takes a moment): `cluster up` starts what is not running.
    assert!(
        flowstate_lab::wait_stopped(pid.trim().parse().unwrap(), Duration::from_secs(5)),
        "the root outlived SIGKILL"
    );
    let out = c.flowstate(&["cluster", "up", c.config.to_str().unwrap()]);
    assert!(out.status.success(), "cluster up again: {}", text(&out));
    let downloads = c.downloads(2);
    c.check_downloads(downloads, &want);
    let new = c.root();
    assert_eq!(
        new["root_epoch"].as_u64(),
        old["root_epoch"].as_u64().map(|e| e + 1),
        "{old:#}\n{new:#}"
    );
    assert!(
        new["clock"].as_u64().unwrap() > old["clock"].as_u64().unwrap(),
        "{old:#}\n{new:#}"
    );
}

/// The managed store's pid.
fn store_pid(c: &Cluster) -> String {
    let f = c.lab.state_dir().join("cluster/store.pid");
    std::fs::read_to_string(f).unwrap().trim().to_owned()
}

/// Kills (-9) the managed store; its pid.
fn kill_store(c: &Cluster) -> String {
    let pid = store_pid(c);
    assert!(Command::new("kill")
        .args(["-9", &pid])
        .status()
        .unwrap()
        .success());
    pid
}

/// A root whose port is deleted under it (as when the namespace at the other end of its link
/// goes) ends with an error naming it instead of running on; then `lab down` stops every role
/// still running in the lab's namespaces before deleting them: no process is left.
#[test]
fn roles_live_through_sighup_a_root_whose_port_is_deleted_exits_naming_it_and_lab_down_leaves_no_process(
) {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    let state = "backend = \"store\"\nurl = \"192.0.2.1:7878\"";
    let c = Cluster::up("g", state, 1, "fast_path = false");
    let dir = c.lab.state_dir().join("cluster");
    let pid = |role: &str| -> u32 {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            match std::fs::read_to_string(dir.join(format!("{role}.pid"))) {
                Ok(p) => return p.trim().parse().unwrap(),
                Err(e) if Instant::now() > deadline => panic!("{role}.pid: {e}"),
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    };
    let root = pid("root");
    let others = [pid("controller"), pid("store"), pid("instance-1")];
    // SIGHUP (a `systemctl reload`, a closed terminal) is logged, not fatal: roles reload
    // nothing.
    for p in others.iter().chain([&root]) {
        let hup = Command::new("kill").args(["-HUP", &p.to_string()]).status();
        assert!(hup.unwrap().success());
    }
    std::thread::sleep(Duration::from_secs(1));
    for (role, p) in ["controller", "store", "instance-1", "root"]
        .iter()
        .zip(others.iter().chain([&root]))
    {
        assert!(flowstate_lab::running(*p), "{role} ended on SIGHUP");
        let log = std::fs::read_to_string(dir.join(format!("{role}.log"))).unwrap();
        assert!(log.contains("SIGHUP"), "{role}: {log}");
    }
    let del = Command::new("ip")
        .args(["-n", &c.lab.nf_ns(), "link", "del", "fs-in"])
        .status()
        .unwrap();
    assert!(del.success());
    assert!(
        flowstate_lab::wait_stopped(root, Duration::from_secs(10)),
        "the root runs on without its port"
    );
    let log = std::fs::read_to_string(dir.join("root.log")).unwrap();
    assert!(log.contains("interface fs-in is gone"), "{log}");
    assert!(others.iter().all(|&p| flowstate_lab::running(p)));
    let out = Command::new(FLOWSTATE)
        .args(["lab", "down", "--prefix", c.lab.prefix()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("stopped what ran in its namespaces"),
        "{}",
        text(&out)
    );
    for p in others {
        assert!(!flowstate_lab::running(p), "{p} outlived lab down");
    }
}

/// The store is killed (SIGKILL) under downloads and a UDP flow, and `cluster up` starts it
/// again from its log: meanwhile the instances' commits wait (the driver reconnects for up to
/// `[state] retry`) and no packet leaves; afterwards every download completes and the UDP flow
/// keeps its mapping. Every packet goes through the instances (no fast path), so each depends
/// on a commit.
#[test]
fn a_store_killed_and_restarted_under_load_breaks_no_connection() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    let state = "backend = \"store\"\nurl = \"192.0.2.1:7878\"";
    let mut c = Cluster::up("k", state, 2, "fast_path = false");
    let want = content(1_000_000, 11);
    let http_peers = c.serve_paced(&want, 200_000);
    let (udp, peers) = c.udp_flow(160);
    let mut downloads = c.downloads(30);
    std::thread::sleep(Duration::from_millis(1000));
    still_transferring(&mut downloads, want.len());
    let pid = kill_store(&c);
    std::thread::sleep(Duration::from_millis(700));
    let restarted_at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let out = c.flowstate(&["cluster", "up", c.config.to_str().unwrap()]);
    assert!(out.status.success(), "cluster up again: {}", text(&out));
    assert_ne!(store_pid(&c), pid, "the store was started again");
    c.check_downloads(downloads, &want);
    server_saw_only_the_nat(&http_peers);
    udp_kept_its_mapping(udp, &peers, restarted_at);
    let s = c.status();
    assert_eq!(owned(&s), 16, "{s:#}");
}

/// An instance that hangs (SIGSTOP) under downloads is failed over like a dead one and
/// replaced, and the controller makes sure it never comes back (SIGKILL: a woken instance
/// could otherwise run its old partitions' timers); every download completes and no
/// partition has two owners.
#[test]
fn a_hung_instance_is_failed_over_and_killed() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    let state = "backend = \"store\"\nurl = \"192.0.2.1:7878\"";
    let mut c = Cluster::up("h", state, 3, "fast_path = false");
    let want = content(1_000_000, 13);
    let http_peers = c.serve_paced(&want, 200_000);
    let mut downloads = c.downloads(40);
    std::thread::sleep(Duration::from_millis(1000));
    still_transferring(&mut downloads, want.len());
    let s = c.status();
    let hung = s["instances"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["id"] == 1)
        .unwrap();
    let pid = hung["pid"].as_u64().unwrap() as libc::pid_t;
    assert!(!hung["partitions"].as_array().unwrap().is_empty(), "{s:#}");
    // SAFETY: a signal to the cluster's own instance process.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
    // Failed over, and a replacement started under the same id.
    c.wait_for(10, "instance 1 failed over and replaced", |s| {
        let replaced = s["instances"]
            .as_array()
            .unwrap()
            .iter()
            .any(|i| i["id"] == 1 && i["pid"].as_u64() != Some(pid as u64));
        replaced && owned(s) == 16 && s["root"]["moving"] == 0
    });
    // Killed: gone, or a zombie waiting for its parent (it runs nothing any more).
    assert!(
        flowstate_lab::wait_stopped(pid as u32, Duration::from_secs(5)),
        "the hung instance was not killed"
    );
    c.check_downloads(downloads, &want);
    server_saw_only_the_nat(&http_peers);
    let root = c.root();
    assert_eq!(root["reordered"], 0, "{root:#}");
    let s = c.status();
    let mut seen = std::collections::BTreeSet::new();
    for i in s["instances"].as_array().unwrap() {
        for p in i["partitions"].as_array().unwrap() {
            assert!(
                seen.insert(p.as_u64().unwrap()),
                "partition {p} twice: {s:#}"
            );
        }
    }
}

/// The ids of `stage`'s live instances and the partitions they own.
fn stage_of(s: &serde_json::Value, stage: u64) -> (Vec<u64>, usize) {
    let of: Vec<&serde_json::Value> = s["instances"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["stage"] == stage)
        .collect();
    let ids = of
        .iter()
        .filter(|i| i["state"] == "live")
        .map(|i| i["id"].as_u64().unwrap())
        .collect();
    let owned = of
        .iter()
        .map(|i| i["partitions"].as_array().unwrap().len())
        .sum();
    (ids, owned)
}

/// CHC §4.1, `examples/cluster-stages.toml` as it is: the firewall and the NAT as two
/// stages, each its own pool of instances with its own partitioning (16 by the firewall's
/// flows, 8 by the NAT's endpoints and ports). Under 100 downloads and a UDP flow an instance
/// of each stage is killed, then each stage is scaled out: nothing breaks, the NAT keeps its
/// mappings.
#[test]
fn a_chain_in_two_stages_fails_over_and_scales_each_stage_without_a_broken_connection() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    let example = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../examples/cluster-stages.toml"
    );
    let mut c = Cluster::up_with("st", &std::fs::read_to_string(example).unwrap(), 6);
    let s = c.status();
    assert_eq!(stage_of(&s, 0), (vec![1, 2], 16), "{s:#}");
    assert_eq!(stage_of(&s, 1), (vec![3, 4], 8), "{s:#}");
    let want = content(1_000_000, 5);
    let http_peers = c.serve_paced(&want, 200_000);
    let (udp, peers) = c.udp_flow(160);
    let mut downloads = c.downloads(100);
    std::thread::sleep(Duration::from_millis(1500));
    still_transferring(&mut downloads, want.len());
    // Each connection is an entry of the firewall in stage 0 and of the NAT in stage 1.
    let entries = |stage: u64| -> u64 {
        c.status()["instances"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|i| i["stage"] == stage)
            .map(|i| i["entries"].as_u64().unwrap())
            .sum()
    };
    assert!(entries(0) >= 100, "firewall entries: {}", entries(0));
    assert!(entries(1) >= 100, "NAT entries: {}", entries(1));
    let killed_at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    for id in ["1", "3"] {
        let out = c.flowstate(&["cluster", "kill", id]);
        assert!(out.status.success(), "{}", text(&out));
        std::thread::sleep(Duration::from_millis(700));
    }
    // Each stage replaced its dead instance with its own id; then each grows by one, and the
    // new instances take ids neither stage uses.
    c.wait_for(20, "both stages whole again", |s| {
        stage_of(s, 0) == (vec![1, 2], 16) && stage_of(s, 1) == (vec![3, 4], 8)
    });
    for stage in ["0", "1"] {
        let out = c.flowstate(&["cluster", "scale", "3", "--stage", stage]);
        assert!(out.status.success(), "{}", text(&out));
    }
    c.wait_for(20, "three instances in each stage", |s| {
        let (ids0, owned0) = stage_of(s, 0);
        let (ids1, owned1) = stage_of(s, 1);
        ids0.len() == 3
            && ids1.len() == 3
            && owned0 == 16
            && owned1 == 8
            && s["root"]["moving"] == 0
    });
    let s = c.status();
    let mut ids: Vec<u64> = [stage_of(&s, 0).0, stage_of(&s, 1).0].concat();
    ids.sort_unstable();
    assert_eq!(ids, [1, 2, 3, 4, 5, 6], "{s:#}");
    c.check_downloads(downloads, &want);
    server_saw_only_the_nat(&http_peers);
    udp_kept_its_mapping(udp, &peers, killed_at);
    let root = c.root();
    assert_eq!(root["reordered"], 0, "{root:#}");
    assert!(
        root["order_checked"].as_u64().unwrap() > root["from_instances"].as_u64().unwrap() / 2,
        "{root:#}"
    );
    assert_eq!(root["hold_dropped"], 0, "{root:#}");
    assert_eq!(
        root["assignment_versions"].as_array().unwrap().len(),
        2,
        "{root:#}"
    );
    // Every packet crossed both stages: stage 0's output went to stage 1 (or the reverse)
    // before it left.
    let (to, out) = (
        root["to_instances"].as_u64().unwrap(),
        root["sent_out"].as_u64().unwrap(),
    );
    assert!(to >= 2 * out, "{root:#}");
    // The fast path learnt from the last stage's output and carried the downloads.
    assert!(
        root["fast_path_packets"].as_u64().unwrap() > 10_000,
        "{root:#}"
    );
    eprintln!("two stages after failovers and scale-outs: {s:#}\nroot {root:#}");
}

/// Datagrams a numbered stream sends: `seq` on flow `seq % STREAM_FLOWS`.
const STREAM_FLOWS: u32 = 32;

impl Cluster {
    /// A one-way UDP stream from the client to the server's port 9998: `count` datagrams
    /// numbered 0.., at `rate` a second, spread over [`STREAM_FLOWS`] source ports, after one
    /// `warm-up` datagram (the root resolves the server's address on it: until then it drops,
    /// as the live box does). The server logs `source-port seq` per datagram to the returned
    /// file (flushed when the stream pauses for 200 ms).
    fn numbered_stream(&mut self, count: u32, rate: u32) -> (Child, PathBuf) {
        let log = self.dir.path().join("stream.log");
        let server = format!(
            "import socket\ns=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\n\
             s.setsockopt(socket.SOL_SOCKET,socket.SO_RCVBUF,1<<22)\n\
             s.bind(('{SERVER}',9998))\ns.settimeout(0.2)\nf=open('{}','a')\n\
             while True:\n\
             \x20try:\n\
             \x20\x20d,a=s.recvfrom(2048)\n\
             \x20\x20f.write('%d %s\\n'%(a[1],d.decode()))\n\
             \x20except socket.timeout:\n\
             \x20\x20f.flush()\n",
            log.display()
        );
        let s = self
            .in_ns(&self.lab.server_ns(), &["python3", "-c", &server])
            .spawn()
            .unwrap();
        self.background.push(s);
        std::thread::sleep(Duration::from_millis(300));
        let client = format!(
            "import socket,time\n\
             socks=[]\n\
             for k in range({STREAM_FLOWS}):\n\
             \x20s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\n\
             \x20s.bind(('{CLIENT}',41000+k))\n\
             \x20socks.append(s)\n\
             socks[0].sendto(b'warm-up',('{SERVER}',9998))\n\
             time.sleep(0.3)\n\
             t0=time.time()\n\
             for i in range({count}):\n\
             \x20socks[i%{STREAM_FLOWS}].sendto(b'%d'%i,('{SERVER}',9998))\n\
             \x20if i%20==0:\n\
             \x20\x20time.sleep(max(0,t0+i/{rate}-time.time()))\n"
        );
        let c = self
            .in_ns(&self.lab.client_ns(), &["python3", "-c", &client])
            .spawn()
            .unwrap();
        (c, log)
    }

    /// The value of the shared counter `nf@Counter@id` in the cluster's store (ours, in the
    /// instances' namespace: connected from a thread that joins it).
    /// Counter `nf@id` in the managed store the deployment's `[state]` names (our store or
    /// Redis), read from the box's namespace.
    fn store_counter(&self, nf: &str, id: &str) -> i64 {
        use flowstate_state::{Backend, Connector, Kind, ObjectKey, Op, Reply};
        let config = std::fs::read_to_string(&self.config).unwrap();
        let url = config
            .lines()
            .find_map(|l| l.strip_prefix("url = \""))
            .and_then(|u| u.strip_suffix('"'))
            .expect("a [state] url")
            .to_owned();
        let redis = config.contains("backend = \"redis\"");
        let ns = format!("/run/netns/{}", self.lab.nf_ns());
        // The managed store's secret, which the lab made.
        let secret = self.lab.state_dir().join(if redis {
            "cluster/redis.password"
        } else {
            "cluster/store.token"
        });
        let mut b = std::thread::spawn(move || -> Box<dyn Backend> {
            use std::os::fd::AsRawFd;
            let f = std::fs::File::open(&ns).unwrap();
            // SAFETY: a namespace file descriptor; only this thread changes namespace.
            assert_eq!(unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) }, 0);
            let secret = secret.to_string_lossy().into_owned();
            if redis {
                let password = std::fs::read_to_string(&secret).unwrap();
                let url = url.replace("redis://", &format!("redis://:{}@", password.trim()));
                flowstate_driver_redis::RedisConnector::new(&url)
                    .unwrap()
                    .connect()
                    .unwrap()
            } else {
                Box::new(
                    flowstate_driver_store::StoreConnector::from_config(
                        Some(&url),
                        [("token_file", secret.as_str())],
                    )
                    .unwrap()
                    .open()
                    .unwrap(),
                )
            }
        })
        .join()
        .unwrap();
        let mut replies = Vec::new();
        b.execute(
            &[Op::GetCounter {
                key: ObjectKey::shared(nf, Kind::Counter, id),
            }],
            &mut replies,
        )
        .unwrap();
        match replies.pop() {
            Some(Reply::Int(n)) => n,
            other => panic!("counter {nf}@{id}: {other:?}"),
        }
    }
}

/// What the server of a numbered stream received: per seq, how often; per flow, the source
/// ports it came from.
fn stream_received(log: &std::path::Path, count: u32) -> (Vec<u32>, Vec<Vec<u16>>) {
    let mut times = vec![0u32; count as usize];
    let mut ports = vec![Vec::new(); STREAM_FLOWS as usize];
    for line in std::fs::read_to_string(log).unwrap().lines() {
        let (port, seq) = line.split_once(' ').unwrap();
        let Ok(seq) = seq.parse::<u32>() else {
            continue; // the warm-up
        };
        let port: u16 = port.parse().unwrap();
        times[seq as usize] += 1;
        let p = &mut ports[(seq % STREAM_FLOWS) as usize];
        if !p.contains(&port) {
            p.push(port);
        }
    }
    (times, ports)
}

/// What a numbered stream through a disturbed cluster came to.
struct StreamRun {
    /// Datagrams the server never received.
    lost: u32,
    /// Their numbers.
    missing: Vec<usize>,
    /// The counter NF's count (the warm-up included).
    counted: i64,
    /// The root's counters.
    root: serde_json::Value,
    /// Replayed packets whose changes were committed before their first owner failed.
    committed: u64,
    /// What the controller logged.
    controller_log: String,
    /// The instances' stats files, by id.
    instances: Vec<serde_json::Value>,
}

/// CHC §7.3 R2/R6: a numbered UDP stream of 12,000 datagrams on 32 flows through counter →
/// firewall → NAT, every packet through the instances (3, on 16 partitions), `disturb`ed a
/// second in. No datagram may arrive twice and every flow must keep its NAT port.
/// `cluster`: extra keys of `[cluster]`.
/// `[telemetry] listen`: the root (in the box's namespace) and every instance (each in its
/// own) serve their metrics; the numbers agree with `cluster status` and with the stream.
fn scrape_the_roles(c: &Cluster, count: u32) {
    let scrape = |ns: &str| -> std::collections::BTreeMap<String, f64> {
        let o = c
            .in_ns(
                ns,
                &["curl", "-sSf", "-m", "5", "http://127.0.0.1:9464/metrics"],
            )
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "{ns}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8(o.stdout)
            .unwrap()
            .lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| {
                let (k, v) = l.rsplit_once(' ')?;
                Some((k.to_owned(), v.parse().ok()?))
            })
            .collect()
    };
    let status = c.status();
    let root = scrape(&c.lab.nf_ns());
    // A root that replaced a killed one counts from its own start.
    let received = root["flowstate_root_received_total"];
    assert!(received > 0.0, "{received} of {count} datagrams: {root:?}");
    assert!(received <= status["root"]["received"].as_f64().unwrap());
    assert_eq!(root["flowstate_root_moving"], 0.0);
    // Each instance publishes at its heartbeat: one that just released a partition may still
    // show it for a moment.
    let mut owned = 0.0;
    for _ in 0..50 {
        owned = 0.0;
        for id in live(&status) {
            let m = scrape(&c.lab.instance_ns(id as u32));
            assert!(m.contains_key("flowstate_instance_packets_total"), "{m:?}");
            owned += m["flowstate_instance_partitions"];
        }
        if owned == 16.0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(owned, 16.0, "the alive instances' partitions: {status}");
}

fn under_a_stream(name: &str, cluster: &str, disturb: impl FnOnce(&Cluster)) -> StreamRun {
    under_a_stream_on(name, BRIDGED, cluster, disturb)
}

/// Where a stream's cluster runs: `routed` lab or not, and its managed store's `[state]`.
#[derive(Clone, Copy)]
struct Site {
    routed: bool,
    state: &'static str,
}

const BRIDGED: Site = Site {
    routed: false,
    state: "backend = \"store\"\nurl = \"192.0.2.1:7878\"",
};

/// [`under_a_stream`] at `site`.
fn under_a_stream_on(
    name: &str,
    site: Site,
    cluster: &str,
    disturb: impl FnOnce(&Cluster),
) -> StreamRun {
    let state = site.state;
    let config = format!(
        "[input]\ninterface = \"fs-in\"\naddress = \"10.0.0.1\"\nfast_path = false\n\
         [output]\ninterface = \"fs-out\"\naddress = \"{BOX_OUTSIDE}\"\n\
         [runtime]\ninside = [\"10.0.0.0/24\"]\n\
         [state]\n{state}\n\
         [telemetry]\nlisten = \"127.0.0.1:9464\"\n\
         [cluster]\npartitions = 16\ninstances = 3\nstore = \"managed\"\n{cluster}\n\
         [[chain]]\nnf = \"counter\"\n\
         [[chain]]\nnf = \"firewall\"\ndefault_outbound = \"allow\"\ndefault_inbound = \"deny\"\n\
         [[chain]]\nnf = \"nat\"\nexternal = [\"{BOX_OUTSIDE}\"]\nports = \"20000-59999\"\n"
    );
    let mut c = Cluster::up_on(name, &config, 4, site.routed);
    let (count, rate) = (12_000, 4_000);
    let (mut sender, log) = c.numbered_stream(count, rate);
    std::thread::sleep(Duration::from_millis(1000));
    disturb(&c);
    assert!(sender.wait().unwrap().success());
    c.wait_for(20, "every partition owned and steady", |s| {
        owned(s) == 16 && s["root"]["moving"] == 0
    });
    std::thread::sleep(Duration::from_millis(1000));
    scrape_the_roles(&c, count);
    let (times, ports) = stream_received(&log, count);
    let twice: Vec<usize> = (0..times.len()).filter(|&i| times[i] > 1).collect();
    assert!(twice.is_empty(), "datagrams received twice: {twice:?}");
    for (flow, p) in ports.iter().enumerate() {
        assert_eq!(p.len(), 1, "flow {flow} came from the NAT ports {p:?}");
    }
    let missing: Vec<usize> = (0..times.len()).filter(|&i| times[i] == 0).collect();
    eprintln!("{name}: missing {missing:?}");
    StreamRun {
        lost: missing.len() as u32,
        missing,
        committed: c
            .instance_stats()
            .iter()
            .map(|i| i["replay_committed"].as_u64().unwrap_or(0))
            .sum(),
        counted: c.store_counter("counter", "packets"),
        root: c.root(),
        controller_log: controller_log(&c),
        instances: c.instance_stats(),
    }
}

fn kill_instance_1(c: &Cluster) {
    let out = c.flowstate(&["cluster", "kill", "1"]);
    assert!(out.status.success(), "{}", text(&out));
}

#[test]
fn a_killed_instance_loses_no_packet_and_counts_none_twice() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    // With the root's packet log: what the dead instance left unfinished is replayed.
    let r = under_a_stream("l", "", kill_instance_1);
    let root = &r.root;
    eprintln!(
        "with the log: lost {}, counted {}, committed replays {}, root {root:#}",
        r.lost, r.counted, r.committed
    );
    assert!(root["replayed"].as_u64().unwrap() > 0, "{root:#}");
    for key in ["log_evicted", "log_abandoned", "unlogged_outputs"] {
        assert_eq!(root[key], 0, "{key}: {root:#}");
    }
    // Every datagram arrived once (those the dead instance had committed too: their
    // outputs waited at the root for a commit notice, which the successor sent), and the
    // counter NF's state is that of one undisturbed instance: every datagram counted once.
    assert_eq!(r.lost, 0, "{root:#}");
    assert_eq!(r.counted, 12_001, "{root:#}");
    assert_eq!(root["outputs_missing"], 0, "{root:#}");
    // Without it the same kill loses what was in flight to the dead instance.
    let r = under_a_stream("n", "log_packets = 0", kill_instance_1);
    eprintln!("without the log: lost {}, counted {}", r.lost, r.counted);
    assert!(r.lost > 0, "{:#}", r.root);
}

/// CHC §7.3 R2: partitions move twice (scale out to 4, back in to 3) under the stream: no
/// datagram lost or duplicated, none counted twice, nothing replayed (a planned move hands
/// every packet over).
/// A host of the routed lab dies under the numbered stream (every process of instance 1's
/// host killed at once, then its link cut at the router), with the root's packet log: nothing
/// is lost or counted twice, with the state in our store and again in Redis, each on the
/// store's own host.
#[test]
fn a_killed_host_loses_no_packet_and_counts_none_twice_on_our_store_and_on_redis() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    let kill_host_1 = |c: &Cluster| {
        c.lab
            .kill_host(&mut System::default(), RoutedHost::Instance(1))
            .unwrap()
    };
    on_both_stores("h", kill_host_1, |state, r| {
        assert!(
            r.root["replayed"].as_u64().unwrap() > 0,
            "{state}: {:#}",
            r.root
        );
    });
}

/// The routed lab's managed stores, on the store's own host: ours, then Redis.
const ROUTED_STORES: [(&str, &str); 2] = [
    ("s", "backend = \"store\"\nurl = \"192.0.2.5:7878\""),
    ("r", "backend = \"redis\"\nurl = \"redis://192.0.2.5:6379\""),
];

/// `disturb`s the routed lab under the numbered stream, the state in our store and again in
/// Redis: with the root's packet log, nothing may be lost, arrive twice or count twice; `more`
/// checks the rest of each run.
fn on_both_stores(tag: &str, disturb: impl Fn(&Cluster), more: impl Fn(&str, &StreamRun)) {
    for (store, state) in ROUTED_STORES {
        let site = Site {
            routed: true,
            state,
        };
        let r = under_a_stream_on(&format!("{tag}{store}"), site, "", &disturb);
        let root = &r.root;
        eprintln!(
            "{state}: lost {}, counted {}, committed replays {}, root {root:#}, instances {:#?}",
            r.lost, r.counted, r.committed, r.instances
        );
        for key in [
            "log_evicted",
            "log_abandoned",
            "unlogged_outputs",
            "outputs_missing",
        ] {
            assert_eq!(root[key], 0, "{state}: {key}: {root:#}");
        }
        assert_eq!((r.lost, r.counted), (0, 12_001), "{state}: {root:#}");
        more(state, &r);
    }
}

/// Cuts instance 1's host off at the router, its processes alive, and puts it back once its
/// partitions moved; waits until it is a member with partitions again. The cut begins with
/// the host's way to the store, 300 ms before the rest, so that a commit of packets it has
/// taken is on the wire: the store gets it only after the link is back, when the partitions
/// have moved.
fn cut_host_1_and_back(c: &Cluster) {
    let link = |how| {
        c.lab
            .cut(&mut System::default(), RoutedHost::Instance(1), how)
            .unwrap()
    };
    link(Cut::Store);
    std::thread::sleep(Duration::from_millis(300));
    link(Cut::All);
    c.wait_for(10, "instance 1's partitions with the others", |s| {
        !live(s).contains(&1) && owned(s) == 16
    });
    std::thread::sleep(Duration::from_millis(500));
    link(Cut::None);
    c.wait_for(20, "instance 1 back as a member with partitions", |s| {
        live(s).contains(&1)
            && owned(s) == 16
            && s["instances"]
                .as_array()
                .unwrap()
                .iter()
                .any(|i| i["id"] == 1 && !i["partitions"].as_array().unwrap().is_empty())
    });
}

/// A host of the routed lab cut off under the numbered stream, its processes alive (its way
/// to the store 300 ms before the rest, so that a commit is on the wire), and back once its
/// partitions moved: the store refuses that commit, none of its outputs leaves the box (no
/// datagram arrives twice), nothing is lost or counted twice, and it rejoins with partitions;
/// with the state in our store and again in Redis, each on the store's own host.
#[test]
fn a_host_cut_off_under_a_stream_loses_and_repeats_nothing_on_our_store_and_on_redis() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    on_both_stores("c", cut_host_1_and_back, |state, r| {
        let i1 = r.instances.iter().find(|i| i["id"] == 1).unwrap();
        assert!(i1["fenced_commits"].as_u64() > Some(0), "{state}: {i1:#}");
    });
}

#[test]
fn moves_under_a_stream_lose_and_repeat_nothing() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    let r = under_a_stream("v", "", |c| {
        for n in ["4", "3"] {
            let out = c.flowstate(&["cluster", "scale", n]);
            assert!(out.status.success(), "{}", text(&out));
            c.wait_for(20, "the scale done", |s| {
                live(s).len() == n.parse::<usize>().unwrap() && s["root"]["moving"] == 0
            });
        }
    });
    let root = &r.root;
    assert!(root["moves_done"].as_u64().unwrap() >= 4, "{root:#}");
    assert_eq!((r.lost, r.counted), (0, 12_001), "{root:#}");
    for key in [
        "replayed",
        "log_evicted",
        "log_abandoned",
        "hold_dropped",
        "reordered",
    ] {
        assert_eq!(root[key], 0, "{key}: {root:#}");
    }
}

/// CHC §7.3 R6, the store killed (-9) under the stream and started again by `cluster up` from
/// its checkpoint and log: the instances' commits wait for it (their outputs wait at the
/// root), so no datagram is lost or repeated and none is counted twice.
#[test]
fn a_killed_store_loses_no_packet_and_counts_none_twice() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    let r = under_a_stream("d", "", |c| {
        let pid = kill_store(c);
        std::thread::sleep(Duration::from_millis(500));
        let out = c.flowstate(&["cluster", "up", c.config.to_str().unwrap()]);
        assert!(out.status.success(), "cluster up again: {}", text(&out));
        assert_ne!(store_pid(c), pid, "the store was started again");
    });
    let root = &r.root;
    eprintln!(
        "CTL LOG:\n{}\nINSTANCES: {:#?}",
        r.controller_log, r.instances
    );
    assert_eq!((r.lost, r.counted), (0, 12_001), "{root:#}");
    for key in ["log_evicted", "outputs_missing", "reordered"] {
        assert_eq!(root[key], 0, "{key}: {root:#}");
    }
}

/// CHC §7.3 R6, the root killed (-9) under the stream and started again by `cluster up`: the
/// datagrams that reach the box while no root runs are lost, as on any box that is down, and
/// nothing else: the loss is one stretch of well under a second, nothing arrives twice,
/// every flow keeps its NAT port, and the instances counted every datagram they saw once.
#[test]
fn a_killed_root_loses_only_what_came_while_none_ran() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    let r = under_a_stream("o", "", |c| {
        let pid = c.root()["pid"].as_u64().unwrap();
        assert!(Command::new("kill")
            .args(["-9", &pid.to_string()])
            .status()
            .unwrap()
            .success());
        // Gone before `cluster up` looks.
        assert!(
            flowstate_lab::wait_stopped(pid as u32, Duration::from_secs(5)),
            "the root outlived SIGKILL"
        );
        let out = c.flowstate(&["cluster", "up", c.config.to_str().unwrap()]);
        assert!(out.status.success(), "cluster up again: {}", text(&out));
        assert_ne!(c.root()["pid"].as_u64().unwrap(), pid, "a new root");
    });
    let root = &r.root;
    let (first, last) = (r.missing[0], *r.missing.last().unwrap());
    eprintln!("lost {} datagrams, {first}..={last}", r.lost);
    assert!(r.lost > 0, "the root was down: {root:#}");
    assert!(
        last - first < 4_000,
        "one stretch under a second: {:?}",
        r.missing
    );
    // What the instances counted: every delivered datagram, plus at most those whose output
    // went to the dead root.
    assert!(r.counted >= 12_001 - i64::from(r.lost), "{}", r.counted);
    assert!(r.counted <= 12_001, "{}", r.counted);
    assert!(root["ready_ms"].as_f64().unwrap() > 0.0, "{root:#}");
    assert_eq!(root["root_epoch"], 2, "{root:#}");
}

/// CHC §7.3 R5, a straggler: instance 2 runs 20 ms in every 120 (SIGSTOP/SIGCONT), alive to
/// the failure detector (5 missed reports) but its packets wait up to 100 ms. The root reports
/// the waits, the controller fails it over as a straggler (`straggler = "40ms"`), the root
/// replays what it left and drops its late outputs: nothing lost, nothing twice, every
/// datagram counted once.
#[test]
fn a_straggler_is_failed_over_and_nothing_is_lost_or_repeated() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    let r = under_a_stream("g", "missed = 5\nstraggler = \"40ms\"", |c| {
        let s = c.status();
        let pid = s["instances"]
            .as_array()
            .unwrap()
            .iter()
            .find(|i| i["id"] == 2)
            .and_then(|i| i["pid"].as_i64())
            .unwrap() as libc::pid_t;
        let deadline = Instant::now() + Duration::from_secs(4);
        // SAFETY: signals to a process of our cluster; it is left running or gone.
        while Instant::now() < deadline && unsafe { libc::kill(pid, 0) } == 0 {
            unsafe { libc::kill(pid, libc::SIGSTOP) };
            std::thread::sleep(Duration::from_millis(100));
            unsafe { libc::kill(pid, libc::SIGCONT) };
            std::thread::sleep(Duration::from_millis(20));
        }
        unsafe { libc::kill(pid, libc::SIGCONT) };
    });
    let root = &r.root;
    let log = &r.controller_log;
    assert!(
        log.contains("straggler"),
        "the controller did not call it a straggler: {log}"
    );
    assert_eq!((r.lost, r.counted), (0, 12_001), "{root:#}");
    for key in ["log_evicted", "outputs_missing"] {
        assert_eq!(root[key], 0, "{key}: {root:#}");
    }
}

fn rejected(stats: &serde_json::Value) -> u64 {
    stats["auth_rejected"]
        .as_object()
        .map_or(0, |m| m.values().filter_map(|v| v.as_u64()).sum())
}

/// A host on the cluster network without the key sends every kind of datagram the roles take
/// (a Report for a made-up instance, a Lag, Assignments, Claims with the largest epoch,
/// Releases, Data with and without a plausible clock, notices), bare and with a made-up
/// trailer, while 50 downloads run: none is taken (each is counted by the role it reached),
/// the downloads complete, nothing forged leaves the box, and scaling out afterwards starts a
/// real instance that takes its share.
#[test]
fn forged_datagrams_from_a_host_without_the_key_change_nothing() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    let mut c = Cluster::up("f", "backend = \"store\"\nurl = \"192.0.2.1:7878\"", 2, "");
    let want = content(1_500_000, 3);
    let http_peers = c.serve_paced(&want, 200_000);
    let (udp, udp_peers) = c.udp_flow(60);
    let mut downloads = c.downloads(50);
    std::thread::sleep(Duration::from_millis(500));
    let before = c.status();
    let script = flowstate_lab::forger(
        flowstate_lab::instance_addr(4),
        flowstate_lab::instance_addr(1),
    );
    let out = c
        .in_ns(&c.lab.instance_ns(4), &["python3", "-c", &script])
        .output()
        .unwrap();
    assert!(out.status.success(), "forger: {}", text(&out));
    let sent: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    still_transferring(&mut downloads, want.len());
    c.check_downloads(downloads, &want);
    udp.wait_with_output().unwrap();
    server_saw_only_the_nat(&http_peers);
    let peers = std::fs::read_to_string(&udp_peers).unwrap();
    assert!(
        !peers.contains("10.0.0.99"),
        "a forged frame left the box: {peers}"
    );
    // Every role counted what reached it; the stats are published every 200 ms.
    std::thread::sleep(Duration::from_millis(500));
    let s = c.status();
    let root = c.root();
    let i1 = c
        .instance_stats()
        .into_iter()
        .find(|i| i["id"] == 1)
        .unwrap();
    let (at_controller, at_root, at_instance) = (rejected(&s), rejected(&root), rejected(&i1));
    eprintln!(
        "sent {sent}: refused by the controller {at_controller}, the root {at_root}, \
         instance 1 {at_instance}; root {root:#}; instance 1 {i1:#}"
    );
    // Per round: controller 2 kinds, root 5, instance 1 33 (each bare and with a trailer).
    assert_eq!(sent, 3 * 2 * (2 + 5 + 33));
    assert_eq!(at_controller, 3 * 2 * 2, "{s:#}");
    assert_eq!(at_root, 3 * 2 * 5, "{root:#}");
    assert_eq!(at_instance, 3 * 2 * 33, "{i1:#}");
    assert_eq!(root["authenticated"], true);
    // Nothing changed: the members, the assignment, the owners.
    assert_eq!(live(&s), vec![1, 2], "{s:#}");
    assert_eq!(s["stages"], before["stages"], "{s:#}");
    assert_eq!(owned(&s), 16);
    assert!(s["instances"]
        .as_array()
        .unwrap()
        .iter()
        .all(|i| i["id"] != 9));
    assert_eq!(i1["refused"], 0, "{i1:#}");
    // Scaling out starts a real instance (3), which takes its share; the stranger none.
    let out = c.flowstate(&["cluster", "scale", "3"]);
    assert!(out.status.success(), "{}", text(&out));
    c.wait_for(30, "instance 3 live with partitions", |s| {
        live(s) == vec![1, 2, 3]
            && owned(s) == 16
            && s["instances"]
                .as_array()
                .unwrap()
                .iter()
                .any(|i| i["id"] == 3 && !i["partitions"].as_array().unwrap().is_empty())
    });
    let downloads = c.downloads(2);
    c.check_downloads(downloads, &want);
}

/// A key rotation under 50 downloads, as the operator's guide has it (`flowstate cluster key
/// add`, `use`, `remove` on the deployment's own key file, each step read by every role within
/// a second): no datagram is refused on the way, every download completes, and every role
/// ends signing with the new key alone.
#[test]
fn a_key_rotation_breaks_no_connection() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    let keydir = tempfile::tempdir().unwrap();
    let keys = keydir.path().join("cluster.key");
    let new = Command::new(FLOWSTATE)
        .args(["cluster", "key", "new", keys.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(new.status.success(), "{}", text(&new));
    let config = format!(
        "[input]\ninterface = \"fs-in\"\naddress = \"10.0.0.1\"\nfast_path = false\n\
         [output]\ninterface = \"fs-out\"\naddress = \"{BOX_OUTSIDE}\"\n\
         [runtime]\ninside = [\"10.0.0.0/24\"]\n\
         [state]\nbackend = \"store\"\nurl = \"192.0.2.1:7878\"\n\
         [cluster]\npartitions = 16\ninstances = 2\nstore = \"managed\"\nkey_file = \"{}\"\n\
         [[chain]]\nnf = \"firewall\"\ndefault_outbound = \"allow\"\ndefault_inbound = \"deny\"\n\
         [[chain]]\nnf = \"nat\"\nexternal = [\"{BOX_OUTSIDE}\"]\nports = \"20000-59999\"\n",
        keys.display()
    );
    let mut c = Cluster::up_with("k", &config, 2);
    let want = content(1_500_000, 5);
    c.serve_paced(&want, 150_000);
    let mut downloads = c.downloads(50);
    std::thread::sleep(Duration::from_millis(500));
    let key = |action: &str, id: &[&str]| {
        let out = Command::new(FLOWSTATE)
            .args(["cluster", "key", action, keys.to_str().unwrap()])
            .args(id)
            .output()
            .unwrap();
        assert!(out.status.success(), "key {action}: {}", text(&out));
        // Every role looks at the file every second.
        std::thread::sleep(Duration::from_millis(1500));
    };
    key("add", &[]);
    key("use", &["2"]);
    key("remove", &["1"]);
    still_transferring(&mut downloads, want.len());
    c.check_downloads(downloads, &want);
    std::thread::sleep(Duration::from_millis(500));
    let s = c.status();
    let root = c.root();
    let mut roles = vec![("controller", s), ("root", root)];
    roles.extend(c.instance_stats().into_iter().map(|i| ("instance", i)));
    assert_eq!(roles.len(), 4);
    for (role, stats) in &roles {
        assert_eq!(rejected(stats), 0, "{role}: {stats:#}");
        assert_eq!(stats["keys"], serde_json::json!([2]), "{role}: {stats:#}");
    }
}

/// An instance started by hand on a host of the cluster network (`flowstate instance`, as a
/// supervisor would start it) while 50 downloads run: it joins, takes a share of the
/// partitions, and every download completes.
#[test]
fn an_instance_started_by_hand_joins_and_takes_a_share() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    let keydir = tempfile::tempdir().unwrap();
    let keys = keydir.path().join("cluster.key");
    let new = Command::new(FLOWSTATE)
        .args(["cluster", "key", "new", keys.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(new.status.success(), "{}", text(&new));
    // The deployment names the managed store's token, as one on real hosts does: the
    // instance started by hand has it too.
    let token = keys.with_extension("token");
    std::fs::write(&token, "join-token\n").unwrap();
    let config = format!(
        "[input]\ninterface = \"fs-in\"\naddress = \"10.0.0.1\"\nfast_path = false\n\
         [output]\ninterface = \"fs-out\"\naddress = \"{BOX_OUTSIDE}\"\n\
         [runtime]\ninside = [\"10.0.0.0/24\"]\n\
         [state]\nbackend = \"store\"\nurl = \"192.0.2.1:7878\"\ntoken_file = \"{}\"\n\
         [cluster]\npartitions = 16\ninstances = 2\nstore = \"managed\"\nkey_file = \"{}\"\n\
         [[chain]]\nnf = \"firewall\"\ndefault_outbound = \"allow\"\ndefault_inbound = \"deny\"\n\
         [[chain]]\nnf = \"nat\"\nexternal = [\"{BOX_OUTSIDE}\"]\nports = \"20000-59999\"\n",
        token.display(),
        keys.display()
    );
    let mut c = Cluster::up_with("j", &config, 3);
    let want = content(1_000_000, 9);
    c.serve_paced(&want, 150_000);
    let mut downloads = c.downloads(50);
    std::thread::sleep(Duration::from_millis(500));
    let stats = c.dir.path().join("instance-3.json");
    let address = flowstate_lab::instance_addr(3).to_string();
    let joined = c
        .in_ns(
            &c.lab.instance_ns(3),
            &[
                FLOWSTATE,
                "instance",
                c.config.to_str().unwrap(),
                "--id",
                "3",
                "--address",
                &address,
                "--stats",
                stats.to_str().unwrap(),
            ],
        )
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    c.background.push(joined);
    c.wait_for(20, "instance 3 live with a share", |s| {
        live(s) == vec![1, 2, 3]
            && owned(s) == 16
            && s["instances"].as_array().unwrap().iter().all(|i| {
                let n = i["partitions"].as_array().unwrap().len();
                (5..=6).contains(&n)
            })
    });
    still_transferring(&mut downloads, want.len());
    c.check_downloads(downloads, &want);
    let i3: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&stats).unwrap()).unwrap();
    assert!(i3["packets"].as_u64().unwrap() > 0, "{i3:#}");
    assert_eq!(rejected(&i3), 0, "{i3:#}");
}

/// Where a cluster started by hand runs its store and controller.
struct ByHand<'a> {
    /// The store's namespace and address (it listens on port 7878).
    store: (String, &'a str),
    /// The controllers' namespaces, the addresses the deployment names for them (`None`: the
    /// root's) and their extra arguments; the first leads (it starts first).
    controllers: Vec<(String, Option<&'a str>, &'a [&'a str])>,
    instances: u32,
    /// The root run by a supervisor (runit's `runsv`, restarting it whenever it exits) in
    /// `DIR/sv-root`, instead of as a child of the test.
    supervised_root: bool,
}

impl Cluster {
    /// Starts every role on its own, as each host's supervisor would (the controller starts
    /// nothing): a fresh key and store token, one deployment file, the store, the controller,
    /// the root in the box's namespace, instances `1..=n` on their hosts (stats in
    /// `instance-K.json`, logs in `NAMESPACE.log`, both in the test's directory). Waits until
    /// every instance joined and every partition is owned.
    fn start_by_hand(&mut self, h: ByHand) {
        let dir = self.dir.path().to_path_buf();
        let keys = dir.join("cluster.key");
        let new = Command::new(FLOWSTATE)
            .args(["cluster", "key", "new", keys.to_str().unwrap()])
            .output()
            .unwrap();
        assert!(new.status.success(), "{}", text(&new));
        let token = dir.join("store.token");
        std::fs::write(&token, "s3cret-token\n").unwrap();
        let (store_ns, store_at) = h.store;
        let named: Vec<String> = h
            .controllers
            .iter()
            .map(|(_, a, _)| format!("\"{}\"", a.unwrap_or("192.0.2.1")))
            .collect();
        let named = format!("controller = [{}]\n", named.join(", "));
        let config = format!(
            "[input]\ninterface = \"fs-in\"\naddress = \"10.0.0.1\"\nfast_path = false\n\
             [output]\ninterface = \"fs-out\"\naddress = \"{BOX_OUTSIDE}\"\n\
             [runtime]\ninside = [\"10.0.0.0/24\"]\n\
             [state]\nbackend = \"store\"\nurl = \"{store_at}:7878\"\ntoken_file = \"{}\"\n\
             [cluster]\npartitions = 16\naddress = \"192.0.2.1\"\n{named}\
             store = \"external\"\nkey_file = \"cluster.key\"\n\
             [[chain]]\nnf = \"firewall\"\ndefault_outbound = \"allow\"\ndefault_inbound = \"deny\"\n\
             [[chain]]\nnf = \"nat\"\nexternal = [\"{BOX_OUTSIDE}\"]\nports = \"20000-59999\"\n",
            token.display()
        );
        std::fs::write(&self.config, config).unwrap();
        let check = Command::new(FLOWSTATE)
            .args(["check", self.config.to_str().unwrap()])
            .output()
            .unwrap();
        assert!(check.status.success(), "check: {}", text(&check));
        let cfg = self.config.to_str().unwrap().to_owned();
        let socket = dir.join("controller-0.sock");
        let data = dir.join("store-data");
        let root_stats = self.lab.state_dir().join("cluster/root.json");
        std::fs::create_dir_all(root_stats.parent().unwrap()).unwrap();
        let listen = format!("{store_at}:7878");
        let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let mut starts = vec![(
            store_ns,
            args(&[
                "store",
                "--listen",
                &listen,
                "--data-dir",
                data.to_str().unwrap(),
                "--token-file",
                token.to_str().unwrap(),
            ]),
        )];
        let root_args = args(&["root", &cfg, "--stats", root_stats.to_str().unwrap()]);
        if !h.supervised_root {
            starts.push((self.lab.nf_ns(), root_args.clone()));
        }
        for k in 1..=h.instances {
            let stats = dir.join(format!("instance-{k}.json"));
            starts.push((
                self.lab.instance_ns(k),
                args(&[
                    "instance",
                    &cfg,
                    "--id",
                    &k.to_string(),
                    "--address",
                    &flowstate_lab::instance_addr(k).to_string(),
                    "--stats",
                    stats.to_str().unwrap(),
                ]),
            ));
        }
        for (i, (ns, controller_args)) in (0..).zip(h.controllers.iter().map(|(ns, _, a)| (ns, a)))
        {
            let socket = dir.join(format!("controller-{i}.sock"));
            let mut a = args(&["controller", &cfg, "--socket", socket.to_str().unwrap()]);
            a.extend(args(controller_args));
            // The first leads: the others start once it holds the lease.
            starts.insert(1 + i as usize, (ns.clone(), a));
        }
        for (k, (ns, args)) in starts.iter().enumerate() {
            let mut argv = vec![FLOWSTATE];
            argv.extend(args.iter().map(String::as_str));
            let log = std::fs::File::create(dir.join(format!("{ns}.log"))).unwrap();
            let child = self
                .in_ns(ns, &argv)
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .unwrap();
            self.background.push(child);
            if k == 1 {
                self.socket = Some(socket.clone());
                self.wait_for(10, "the first controller leads", |s| {
                    s["leader"]["me"] == true
                });
            }
        }
        if h.supervised_root {
            self.supervise_root(&root_args);
        }
        let all: Vec<u64> = (1..=u64::from(h.instances)).collect();
        self.wait_for(
            30,
            "every instance joined, every partition owned, the root steady",
            |s| {
                live(s) == all
                    && owned(s) == 16
                    && s["root"]["moving"] == 0
                    && s["root"]["assignment_versions"][0].as_u64()
                        >= s["stages"][0]["version"].as_u64()
            },
        );
    }
}

impl Cluster {
    /// Runs `flowstate ROOT_ARGS` in the box's namespace under runit's `runsv` (a supervisor
    /// that starts it again whenever it exits, as `Restart=on-failure` of
    /// `packaging/systemd/flowstate-root.service` does; systemd is not PID 1 here), its log in
    /// `root.log` of the test's directory.
    fn supervise_root(&mut self, root_args: &[String]) {
        let sv = self.dir.path().join("sv-root");
        std::fs::create_dir_all(&sv).unwrap();
        let log = self.dir.path().join("root.log");
        let argv: Vec<String> = root_args.iter().map(|a| format!("'{a}'")).collect();
        let run = sv.join("run");
        std::fs::write(
            &run,
            format!(
                "#!/bin/sh
exec ip netns exec {} {FLOWSTATE} {} 2>>'{}'
",
                self.lab.nf_ns(),
                argv.join(" "),
                log.display()
            ),
        )
        .unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&run, std::fs::Permissions::from_mode(0o755)).unwrap();
        let runsv = Command::new("runsv")
            .arg(&sv)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("runsv (scripts/setup-live installs runit)");
        self.background.push(runsv);
        self.supervised = Some(sv);
    }
}

/// A root killed (-9) under 100 downloads is started again by its supervisor (runit's
/// `runsv`, standing in for systemd's `Restart=on-failure`) and resumes with no operator: a
/// new epoch, its clocks above every clock of the dead root, every partition's owner ready
/// again; every download completes byte for byte.
#[test]
fn a_root_restarted_by_its_supervisor_resumes_on_its_own() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    let store_at = flowstate_lab::STORE_ADDR.to_string();
    let mut c = Cluster::lab_routed("v", "", 3, true);
    c.start_by_hand(ByHand {
        store: (c.lab.store_ns(), &store_at),
        controllers: vec![(c.lab.nf_ns(), None, &[])],
        instances: 2,
        supervised_root: true,
    });
    let stats = c.lab.state_dir().join("cluster/root.json");
    let want = content(1_500_000, 7);
    let http_peers = c.serve_paced(&want, 200_000);
    let mut downloads = c.downloads(100);
    std::thread::sleep(Duration::from_millis(1000));
    let before = read_json(&stats);
    let pid = before["pid"].as_u64().unwrap();
    assert!(Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .unwrap()
        .success());
    let deadline = Instant::now() + Duration::from_secs(15);
    let after = loop {
        let s = read_json(&stats);
        if s["pid"].as_u64().is_some_and(|p| p != pid)
            && s["ready_ms"].as_f64().is_some_and(|r| r > 0.0)
        {
            break s;
        }
        assert!(Instant::now() < deadline, "no root came back: {s:#}");
        std::thread::sleep(Duration::from_millis(100));
    };
    eprintln!(
        "the supervisor's root was ready in {} ms",
        after["ready_ms"]
    );
    let epoch = |s: &serde_json::Value| s["root_epoch"].as_u64().unwrap();
    assert!(epoch(&after) > epoch(&before), "{before:#} then {after:#}");
    let high = |s: &serde_json::Value| s["clock"].as_u64().unwrap() >> 48;
    assert_eq!(
        high(&after),
        epoch(&after),
        "its clocks in its own epoch: {after:#}"
    );
    still_transferring(&mut downloads, want.len());
    c.check_downloads(downloads, &want);
    server_saw_only_the_nat(&http_peers);
    let s = c.status();
    assert_eq!(owned(&s), 16, "{s:#}");
    assert_eq!(s["root"]["moving"], 0, "{s:#}");
}

/// Every role started on its own, as a supervisor on each host would (`flowstate store`,
/// `flowstate controller` on its own host of the cluster network, `flowstate root`, `flowstate
/// instance` on two hosts), with the deployment's key file and the store's token: the
/// instances join, the partitions are shared, downloads go through; the controller, which has
/// no `start_command`, refuses to scale out and says how instances come.
#[test]
fn roles_started_on_their_own_hosts_form_a_cluster() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    let controller = flowstate_lab::instance_addr(3).to_string();
    let mut c = Cluster::lab_with("o", "", 3);
    let nf = c.lab.nf_ns();
    c.start_by_hand(ByHand {
        store: (nf.clone(), "192.0.2.1"),
        controllers: vec![(
            c.lab.instance_ns(3),
            Some(&controller),
            &["--metrics", "0.0.0.0:9465"],
        )],
        instances: 2,
        supervised_root: false,
    });
    let want = content(300_000, 4);
    let http_peers = c.serve_paced(&want, 1_000_000);
    let downloads = c.downloads(20);
    c.check_downloads(downloads, &want);
    server_saw_only_the_nat(&http_peers);
    let s = c.status();
    assert_eq!(rejected(&s), 0, "{s:#}");
    assert_eq!(s["keys"], serde_json::json!([1]), "{s:#}");
    // The same status from another host, through the controller's telemetry listener.
    let at = format!("{controller}:9465");
    let remote = c
        .in_ns(
            &nf,
            &[
                FLOWSTATE,
                "cluster",
                "status",
                "--json",
                "--controller",
                &at,
            ],
        )
        .output()
        .unwrap();
    assert!(remote.status.success(), "{}", text(&remote));
    let remote: serde_json::Value = serde_json::from_slice(&remote.stdout).unwrap();
    assert_eq!(live(&remote), vec![1, 2], "{remote:#}");
    assert_eq!(remote["stages"], s["stages"], "{remote:#}");
    // No start_command: scaling out is the hosts' job.
    let out = c.flowstate(&["cluster", "scale", "3"]);
    assert!(!out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("start_command"), "{}", text(&out));
}

/// `/proc/net/snmp`'s `Ip:` counters in namespace `ns`.
fn ip_counters(c: &Cluster, ns: &str) -> std::collections::HashMap<String, u64> {
    let out = c.in_ns(ns, &["cat", "/proc/net/snmp"]).output().unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    let ip: Vec<&str> = text.lines().filter(|l| l.starts_with("Ip:")).collect();
    assert_eq!(ip.len(), 2, "{text}");
    ip[0]
        .split_whitespace()
        .zip(ip[1].split_whitespace())
        .skip(1)
        .map(|(k, v)| (k.to_owned(), v.parse().unwrap()))
        .collect()
}

/// The lab routed (`lab up --instances 4 --routed`): the root's host, the store's and each
/// instance's on links of their own to a router. A managed store must be at the store's host
/// (192.0.2.5) and runs there; no two roles share a segment (each host's only neighbour is
/// the router, and one hop separates it from the root); 50 downloads through firewall -> NAT,
/// every packet through the instances, complete byte for byte while instance 1 is killed; and
/// the full-size GENEVE datagrams cross the router whole (none fragmented anywhere, none
/// refused, the root's sends all succeed).
#[test]
fn a_routed_lab_keeps_every_download_through_a_failover_and_fragments_nothing() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    let config = |url: &str| {
        format!(
            "[input]\ninterface = \"fs-in\"\naddress = \"10.0.0.1\"\nfast_path = false\n\
             [output]\ninterface = \"fs-out\"\naddress = \"{BOX_OUTSIDE}\"\n\
             [runtime]\ninside = [\"10.0.0.0/24\"]\n\
             [state]\nbackend = \"store\"\nurl = \"{url}\"\n\
             [cluster]\npartitions = 16\ninstances = 3\nstore = \"managed\"\n\
             [[chain]]\nnf = \"firewall\"\ndefault_outbound = \"allow\"\ndefault_inbound = \"deny\"\n\
             [[chain]]\nnf = \"nat\"\nexternal = [\"{BOX_OUTSIDE}\"]\nports = \"20000-59999\"\n"
        )
    };
    let mut c = Cluster::lab_routed("rt", &config("192.0.2.1:7878"), 4, true);
    let cfg = c.config.to_str().unwrap().to_owned();
    // The root's address is not the store's host in a routed lab.
    let out = c.flowstate(&["cluster", "up", &cfg]);
    assert!(!out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("state.url") && text(&out).contains("192.0.2.5:7878"),
        "{}",
        text(&out)
    );
    std::fs::write(&c.config, config(&format!("{STORE_ADDR}:7878"))).unwrap();
    let out = c.flowstate(&["cluster", "up", &cfg]);
    assert!(out.status.success(), "cluster up: {}", text(&out));
    let lab_status = c.flowstate(&["lab", "status"]);
    assert!(
        text(&lab_status).contains("up (routed)"),
        "{}",
        text(&lab_status)
    );

    // Our store runs in the store's namespace, listening at its address, and nowhere else.
    let (rt, st, nf) = (c.lab.cluster_router_ns(), c.lab.store_ns(), c.lab.nf_ns());
    let pid = std::fs::read_to_string(c.lab.state_dir().join("cluster/store.pid")).unwrap();
    let ns = Command::new("ip")
        .args(["netns", "identify", pid.trim()])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&ns.stdout).trim(), st);
    let listening = |ns: &str| {
        String::from_utf8(c.in_ns(ns, &["ss", "-Hltn"]).output().unwrap().stdout).unwrap()
    };
    assert!(
        listening(&st).contains("192.0.2.5:7878"),
        "{}",
        listening(&st)
    );
    assert!(!listening(&nf).contains(":7878"), "{}", listening(&nf));

    // Full-size datagrams the router forwards (the nftables counter, in the router only).
    let nft = c.dir.path().join("count.nft");
    std::fs::write(
        &nft,
        "table ip fs_test {\n chain count {\n  type filter hook forward priority 0; policy accept;\n  \
         ip length > 1500 counter\n }\n}\n",
    )
    .unwrap();
    let added = c
        .in_ns(&rt, &["nft", "-f", nft.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(added.status.success(), "{}", text(&added));

    let want = content(1_000_000, 11);
    let http_peers = c.serve_paced(&want, 200_000);
    let s = c.status();
    assert_eq!(live(&s), vec![1, 2, 3], "{s:#}");
    assert_eq!(owned(&s), 16, "{s:#}");
    let lost = s["instances"][0]["partitions"].as_array().unwrap().len() as u64;
    assert!(lost > 0, "{s:#}");
    let mut downloads = c.downloads(50);
    std::thread::sleep(Duration::from_millis(1000));
    c.wait_for_entries(100);
    still_transferring(&mut downloads, want.len());
    let out = c.flowstate(&["cluster", "kill", "1"]);
    assert!(out.status.success(), "{}", text(&out));
    c.check_downloads(downloads, &want);
    server_saw_only_the_nat(&http_peers);
    let s = c.status();
    assert_eq!(owned(&s), 16, "{s:#}");
    let root = c.root();
    assert_eq!(root["reordered"], 0, "{root:#}");
    assert_eq!(root["send_errors"], 0, "{root:#}");
    assert!(root["moves_done"].as_u64().unwrap() >= lost, "{root:#}");

    // (1) No segment shared between roles: each host's neighbours on its link are the router's
    // end only, never another role's address; every other role is one routed hop away.
    let hosts: Vec<(String, RoutedHost)> = [
        (nf.clone(), RoutedHost::Root),
        (st.clone(), RoutedHost::Store),
    ]
    .into_iter()
    .chain((1..=4).map(|k| (c.lab.instance_ns(k), RoutedHost::Instance(k))))
    .collect();
    for (ns, h) in &hosts {
        let (gw, _) = h.link();
        let out = c
            .in_ns(ns, &["ip", "-4", "neigh", "show"])
            .output()
            .unwrap();
        let neigh = String::from_utf8(out.stdout).unwrap();
        let on_link: Vec<&str> = neigh
            .lines()
            .filter(|l| l.contains(&format!(" dev {} ", h.interface())))
            .collect();
        assert!(
            on_link.iter().all(|l| l.starts_with(&format!("{gw} "))),
            "{ns}: {neigh}"
        );
        assert!(!neigh.contains("192.0.2."), "{ns}: {neigh}");
        let target = if *h == RoutedHost::Root {
            flowstate_lab::instance_addr(4)
        } else {
            flowstate_lab::ROOT_ADDR
        };
        let route = c
            .in_ns(ns, &["ip", "route", "get", &target.to_string()])
            .output()
            .unwrap();
        let route = String::from_utf8(route.stdout).unwrap();
        assert!(route.contains(&format!(" via {gw} ")), "{ns}: {route}");
        let ping = c
            .in_ns(ns, &["ping", "-c", "1", "-W", "2", &target.to_string()])
            .output()
            .unwrap();
        assert!(
            String::from_utf8_lossy(&ping.stdout).contains("ttl=63"),
            "{ns}: {}",
            text(&ping)
        );
    }
    // The running instances and the root did resolve the router (the check above is not empty).
    for ns in [nf.clone(), c.lab.instance_ns(2), c.lab.instance_ns(3)] {
        let out = c
            .in_ns(&ns, &["ip", "-4", "neigh", "show"])
            .output()
            .unwrap();
        assert!(
            String::from_utf8_lossy(&out.stdout).contains(" lladdr "),
            "{ns}: {}",
            text(&out)
        );
    }
    let bridges = c
        .in_ns(&nf, &["ip", "-o", "link", "show", "type", "bridge"])
        .output()
        .unwrap();
    assert!(bridges.stdout.is_empty(), "{}", text(&bridges));

    // (3) The full-size frames crossed whole: nothing fragmented, reassembled or refused for
    // its size on any host since the lab was made (its namespaces' counters start at 0), and
    // the router forwarded datagrams over 1500 bytes (a full-size frame in GENEVE) at least as
    // many as the downloads' bytes make in full-size segments (each data segment crosses it
    // twice, to its instance and back; the paced server's last segment of each 16 kB write is
    // short).
    let hosts_and_router = [nf.clone(), rt.clone(), st.clone()]
        .into_iter()
        .chain((1..=4).map(|k| c.lab.instance_ns(k)));
    for ns in hosts_and_router {
        let now = ip_counters(&c, &ns);
        for key in ["FragCreates", "FragFails", "FragOKs", "ReasmReqds"] {
            assert_eq!(now[key], 0, "{ns}: {key} {now:?}");
        }
    }
    let listed = c
        .in_ns(&rt, &["nft", "list", "table", "ip", "fs_test"])
        .output()
        .unwrap();
    let listed = String::from_utf8(listed.stdout).unwrap();
    let big: u64 = listed
        .split_whitespace()
        .skip_while(|w| *w != "packets")
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{listed}"));
    let forwarded = ip_counters(&c, &rt)["ForwDatagrams"];
    eprintln!("the router forwarded {forwarded} datagrams, {big} of them over 1500 bytes");
    let segments = (50 * want.len() / 1500) as u64;
    assert!(big >= segments, "{big} datagrams over 1500 bytes: {listed}");
    let links = c
        .in_ns(&rt, &["ip", "-o", "link", "show"])
        .output()
        .unwrap();
    let links = String::from_utf8(links.stdout).unwrap();
    let ports: Vec<&str> = links.lines().filter(|l| l.contains(": rt-")).collect();
    assert_eq!(ports.len(), 6, "{links}");
    assert!(ports.iter().all(|l| l.contains(" mtu 9000 ")), "{links}");
}

/// Two controllers on two hosts of a routed lab, the first leading: killed (-9) under 100
/// downloads, the standby takes the lease in the next term and leads with the same owners and
/// epochs (the root applies its term); an instance killed right after is failed over by the
/// new leader. Every download completes byte for byte.
#[test]
fn a_killed_leading_controller_is_replaced_by_its_standby_with_the_same_assignment() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    let store_at = flowstate_lab::STORE_ADDR.to_string();
    let standby = flowstate_lab::instance_addr(3).to_string();
    let mut c = Cluster::lab_routed("e", "", 3, true);
    c.start_by_hand(ByHand {
        store: (c.lab.store_ns(), &store_at),
        controllers: vec![
            (c.lab.nf_ns(), None, &[]),
            (c.lab.instance_ns(3), Some(&standby), &[]),
        ],
        instances: 2,
        supervised_root: false,
    });
    let dir = c.dir.path().to_path_buf();
    let want = content(1_500_000, 6);
    let http_peers = c.serve_paced(&want, 200_000);
    let mut downloads = c.downloads(100);
    std::thread::sleep(Duration::from_millis(1000));
    let before = c.status();
    assert_eq!(before["leader"]["term"], 1, "{before:#}");
    let owners = |s: &serde_json::Value| -> Vec<(u64, serde_json::Value)> {
        let mut v: Vec<_> = s["instances"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| (i["id"].as_u64().unwrap(), i["partitions"].clone()))
            .collect();
        v.sort_by_key(|(id, _)| *id);
        v
    };
    let killed = Instant::now();
    let sock = dir.join("controller-0.sock");
    assert!(Command::new("pkill")
        .args(["-9", "-f", sock.to_str().unwrap()])
        .status()
        .unwrap()
        .success());
    c.socket = Some(dir.join("controller-1.sock"));
    c.wait_for(10, "the standby leads", |s| {
        s["leader"]["me"] == true
            && s["leader"]["term"] == 2
            && s["root"]["assignment_terms"][0] == 2
    });
    eprintln!(
        "the standby led {} ms after the kill",
        killed.elapsed().as_millis()
    );
    let after = c.status();
    assert_eq!(
        owners(&after),
        owners(&before),
        "the same owners: {after:#}"
    );
    // The root took the new term's assignment and moved nothing.
    assert_eq!(after["root"]["moving"], 0, "{after:#}");
    let moves = after["root"]["moves_done"].clone();
    // An instance killed right after: the new leader fails it over.
    let stats = dir.join("instance-1.json");
    assert!(Command::new("pkill")
        .args(["-9", "-f", stats.to_str().unwrap()])
        .status()
        .unwrap()
        .success());
    c.wait_for(10, "instance 1 failed over by the new leader", |s| {
        live(s) == [2] && owned(s) == 16 && s["root"]["moving"] == 0
    });
    still_transferring(&mut downloads, want.len());
    c.check_downloads(downloads, &want);
    server_saw_only_the_nat(&http_peers);
    let end = c.status();
    assert_eq!(end["leader"]["term"], 2, "{end:#}");
    assert_ne!(
        end["root"]["moves_done"], moves,
        "instance 1's partitions moved: {end:#}"
    );
}

/// A host cut off in a routed lab, every role started on its own (as a supervisor would: the
/// controller kills nothing): instance 1's link goes down under 100 downloads, its processes
/// alive, while a commit of packets it has taken is on the wire (its way to the store went
/// 100 ms before the rest). The others take its partitions; when the link comes back, that
/// commit reaches the store after the partitions moved and is refused (fenced), none of its
/// outputs leaves, and the instance rejoins as a member and takes partitions again.
/// Every download completes byte for byte.
#[test]
fn a_host_cut_off_has_its_commits_refused_and_rejoins() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    let store_at = flowstate_lab::STORE_ADDR.to_string();
    let mut c = Cluster::lab_routed("x", "", 3, true);
    c.start_by_hand(ByHand {
        store: (c.lab.store_ns(), &store_at),
        controllers: vec![(c.lab.nf_ns(), None, &[])],
        instances: 3,
        supervised_root: false,
    });
    let dir = c.dir.path().to_path_buf();
    let stats = |k: u32| dir.join(format!("instance-{k}.json"));
    let want = content(1_500_000, 6);
    let http_peers = c.serve_paced(&want, 200_000);
    let mut downloads = c.downloads(100);
    std::thread::sleep(Duration::from_millis(1500));
    cut_host_1_and_back(&c);
    still_transferring(&mut downloads, want.len());
    c.check_downloads(downloads, &want);
    server_saw_only_the_nat(&http_peers);
    // Its stats once its loop turns again (the commit it was in waits for TCP to send again).
    let deadline = Instant::now() + Duration::from_secs(20);
    let i1 = loop {
        let i1: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(stats(1)).unwrap()).unwrap();
        if i1["fenced_commits"].as_u64() > Some(0) || Instant::now() > deadline {
            break i1;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let root = c.root();
    let log = std::fs::read_to_string(dir.join(format!("{}.log", c.lab.instance_ns(1))))
        .unwrap_or_default();
    assert!(
        i1["fenced_commits"].as_u64().unwrap() > 0,
        "no commit of the cut-off instance was refused: {i1:#}\n{log}"
    );
    assert_eq!(root["reordered"], 0, "{root:#}");
}

/// A root's counters from its stats file.
fn read_json(path: &std::path::Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap_or_default())
        .unwrap_or(serde_json::Value::Null)
}

/// CHC §4.1's several roots behind the upstream's ECMP, in the routed lab with its second root
/// host ([`Lab::second_root`]): `cluster up` starts root 0 with 3 instances of counter →
/// firewall → NAT on our store (`cluster` adds to `[cluster]`; `hosts` instance hosts), root 1
/// starts on its own host with the same deployment; returns once root 1 is ready, with its
/// stats file.
fn two_roots(name: &str, cluster: &str, hosts: u32) -> (Cluster, PathBuf) {
    let roots = format!(
        "address = [\"{}\", \"{}\"]",
        flowstate_lab::ROOT_ADDR,
        flowstate_lab::ROOT2_ADDR
    );
    let config = format!(
        "[input]\ninterface = \"fs-in\"\naddress = \"10.0.0.1\"\nfast_path = false\n\
         [output]\ninterface = \"fs-out\"\naddress = \"{BOX_OUTSIDE}\"\n\
         [runtime]\ninside = [\"10.0.0.0/24\"]\n\
         [state]\nbackend = \"store\"\nurl = \"{STORE_ADDR}:7878\"\n\
         [cluster]\npartitions = 16\ninstances = 3\nstore = \"managed\"\n{roots}\n{cluster}\
         [[chain]]\nnf = \"counter\"\n\
         [[chain]]\nnf = \"firewall\"\ndefault_outbound = \"allow\"\ndefault_inbound = \"deny\"\n\
         [[chain]]\nnf = \"nat\"\nexternal = [\"{BOX_OUTSIDE}\"]\nports = \"20000-59999\"\n"
    );
    let mut c = Cluster::up_on(name, &config, hosts, true);
    c.lab.second_root(&mut System::default(), true).unwrap();
    // Root 1's host has the deployment with the lab's key and store token at hand.
    let lab_files = c.lab.state_dir().join("cluster");
    let second = config
        .replace(
            "[state]\n",
            &format!(
                "[state]\ntoken_file = \"{}\"\n",
                lab_files.join("store.token").display()
            ),
        )
        .replace(
            "[cluster]\n",
            &format!(
                "[cluster]\nkey_file = \"{}\"\n",
                lab_files.join("cluster.key").display()
            ),
        );
    let second_config = c.dir.path().join("root-1.toml");
    std::fs::write(&second_config, second).unwrap();
    let stats1 = c.dir.path().join("root-1.json");
    let log = std::fs::File::create(c.dir.path().join("root-1.log")).unwrap();
    let root1 = c
        .in_ns(
            &c.lab.second_root_ns(),
            &[
                FLOWSTATE,
                "root",
                second_config.to_str().unwrap(),
                "--stats",
                stats1.to_str().unwrap(),
            ],
        )
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    c.background.push(root1);
    let deadline = Instant::now() + Duration::from_secs(20);
    while read_json(&stats1)["ready_ms"].as_f64().unwrap_or(0.0) == 0.0 {
        assert!(
            Instant::now() < deadline,
            "root 1 not ready: {}",
            read_json(&stats1)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let r1 = read_json(&stats1);
    assert_eq!(r1["root_index"], 1, "{r1:#}");
    assert_ne!(
        r1["root_epoch"],
        c.root()["root_epoch"],
        "a clock space of its own"
    );
    (c, stats1)
}

/// CHC §4.1's several roots, behind the upstream's ECMP (the routed lab's second root host,
/// [`Lab::second_root`]): `cluster up` starts root 0, root 1 is started on its own host with
/// the same deployment; the client and the server hash their flows over both. Under 100
/// downloads and a numbered UDP stream through counter → firewall → NAT, root 0 is killed
/// (-9): the upstream's path check takes its path away and its flows hash to root 1. (The
/// instances' failure detection is relaxed: two cores carry both roots, the instances, the
/// store and 100 downloads, and this test is about the roots.) Every
/// download completes byte for byte; no datagram arrives twice, each flow keeps its NAT port,
/// and less than a fifth of the stream is missing (what went to the dead root before its path
/// went, and what a loaded root drops on the wire); the store's counter equals the packets the
/// instances processed (none counted twice or lost), more than the datagrams delivered.
#[test]
fn one_of_two_roots_killed_breaks_no_download_and_repeats_nothing() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    let (mut c, stats1) = two_roots("m", "missed = 10\nstraggler = \"0s\"\n", 3);
    let want = content(1_500_000, 8);
    let http_peers = c.serve_paced(&want, 200_000);
    let mut downloads = c.downloads(100);
    let (count, rate) = (24_000, 4_000);
    let (mut sender, stream) = c.numbered_stream(count, rate);
    std::thread::sleep(Duration::from_millis(1500));
    let root0 = c.root();
    let before = read_json(&stats1)["received"].as_u64().unwrap();
    assert!(
        root0["received"].as_u64().unwrap() > 0 && before > 0,
        "both roots take traffic: root 0 {root0:#}, root 1 took {before}"
    );
    let pid = root0["pid"].as_u64().unwrap();
    assert!(Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .unwrap()
        .success());
    still_transferring(&mut downloads, want.len());
    assert!(sender.wait().unwrap().success());
    c.check_downloads(downloads, &want);
    server_saw_only_the_nat(&http_peers);
    std::thread::sleep(Duration::from_millis(1000));
    let (times, ports) = stream_received(&stream, count);
    let twice: Vec<usize> = (0..times.len()).filter(|&i| times[i] > 1).collect();
    assert!(twice.is_empty(), "datagrams received twice: {twice:?}");
    for (flow, p) in ports.iter().enumerate() {
        assert_eq!(p.len(), 1, "flow {flow} came from the NAT ports {p:?}");
    }
    let missing: Vec<usize> = (0..times.len()).filter(|&i| times[i] == 0).collect();
    let delivered = count as usize - missing.len();
    eprintln!("controller: {}", controller_log(&c));
    let r1 = read_json(&stats1);
    eprintln!(
        "lost {} datagrams ({:?}..={:?}); root 1 took {} before the kill, {} in all: {r1:#}",
        missing.len(),
        missing.first(),
        missing.last(),
        before,
        r1["received"]
    );
    for side in [c.lab.client_ns(), c.lab.server_ns()] {
        let log = c.lab.state_dir().join(format!("ecmp-check-{side}.log"));
        eprintln!(
            "{side}: {}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
    }
    // Half the flows went to the dead root: had they stayed there, 4.5 of the stream's 6
    // seconds of them would be lost (over a third of the stream).
    assert!(
        missing.len() < count as usize / 5,
        "the dead root's flows came back through root 1: {} of {count} lost",
        missing.len()
    );
    assert!(r1["received"].as_u64().unwrap() > before, "{r1:#}");
    // Each delivered datagram was counted; beyond them, the downloads' packets and at most
    // what root 0 had in the chain when it died.
    let counted = c.store_counter("counter", "packets");
    assert!(
        counted > delivered as i64,
        "{counted} counted, {delivered} delivered"
    );
    let instances = c.instance_stats();
    let processed: u64 = instances
        .iter()
        .map(|i| i["forwarded"].as_u64().unwrap() + i["dropped"].as_u64().unwrap())
        .sum();
    // Packets of partitions dropped before their commit (refused by the fence once a loaded
    // instance's partitions moved) were processed again by the next owner: counted once.
    let uncommitted: u64 = instances
        .iter()
        .map(|i| i["uncommitted"].as_u64().unwrap())
        .sum();
    assert!(
        (processed - uncommitted..=processed).contains(&(counted as u64)),
        "the counter agrees with what the instances processed: {counted} counted, \
         {processed} processed, {uncommitted} of them uncommitted: {instances:#?}"
    );
}

/// Scale out and in (4 instances, then 3) under a numbered stream whose flows the upstream
/// spreads over two roots: each root hands its own flows' packets over in every move (CHC
/// §4.1, §5.1), so no datagram is lost or arrives twice, each flow keeps its NAT port, both
/// roots moved partitions, and the store's counter equals the packets the instances
/// processed.
#[test]
fn moves_under_two_roots_lose_and_repeat_nothing() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    let (mut c, stats1) = two_roots("w", "", 4);
    let (count, rate) = (12_000, 2_000);
    let (mut sender, stream) = c.numbered_stream(count, rate);
    std::thread::sleep(Duration::from_millis(1000));
    for n in ["4", "3"] {
        let out = c.flowstate(&["cluster", "scale", n]);
        assert!(out.status.success(), "{}", text(&out));
        c.wait_for(20, "the scale done", |s| {
            live(s).len() == n.parse::<usize>().unwrap()
                && s["root"]["moving"] == 0
                && read_json(&stats1)["moving"] == 0
        });
    }
    assert!(sender.wait().unwrap().success());
    std::thread::sleep(Duration::from_millis(1000));
    let (times, ports) = stream_received(&stream, count);
    let missing: Vec<usize> = (0..times.len()).filter(|&i| times[i] == 0).collect();
    let twice: Vec<usize> = (0..times.len()).filter(|&i| times[i] > 1).collect();
    let (r0, r1) = (c.root(), read_json(&stats1));
    eprintln!(
        "root 0 took {} packets and did {} moves, root 1 {} and {}",
        r0["received"], r0["moves_done"], r1["received"], r1["moves_done"]
    );
    assert!(
        missing.is_empty() && twice.is_empty(),
        "lost {missing:?}, twice {twice:?}; root 0 {r0:#}, root 1 {r1:#}"
    );
    for (flow, p) in ports.iter().enumerate() {
        assert_eq!(p.len(), 1, "flow {flow} came from the NAT ports {p:?}");
    }
    for (i, r) in [&r0, &r1].into_iter().enumerate() {
        assert!(
            r["received"].as_u64() > Some(0),
            "root {i} took no packet: {r:#}"
        );
        assert!(r["moves_done"].as_u64() >= Some(4), "root {i}: {r:#}");
        for key in [
            "replayed",
            "log_evicted",
            "log_abandoned",
            "hold_dropped",
            "reordered",
        ] {
            assert_eq!(r[key], 0, "root {i}: {key}: {r:#}");
        }
    }
    let instances = c.instance_stats();
    let processed: u64 = instances
        .iter()
        .map(|i| i["forwarded"].as_u64().unwrap() + i["dropped"].as_u64().unwrap())
        .sum();
    assert_eq!(
        c.store_counter("counter", "packets") as u64,
        processed,
        "{instances:#?}"
    );
}

/// A Redis Cluster the test started with `scripts/redis-cluster` on the routed lab's store
/// host (192.0.2.5, ports 7001-7006: 3 masters, each with a replica), stopped on drop.
struct LabRedisCluster {
    ns: String,
    run: PathBuf,
}

impl LabRedisCluster {
    fn script(&self, action: &str) -> Output {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/redis-cluster");
        Command::new("ip")
            .args(["netns", "exec", &self.ns, "env"])
            .arg(format!("REDIS_CLUSTER_ADDRESS={STORE_ADDR}"))
            .arg(format!("FLOWSTATE_RUN_DIR={}", self.run.display()))
            .args(["bash", script, action])
            .output()
            .unwrap()
    }

    fn start(c: &Cluster) -> LabRedisCluster {
        let r = LabRedisCluster {
            ns: c.lab.store_ns(),
            run: c.lab.state_dir().join("redis-cluster"),
        };
        let out = r.script("start");
        assert!(out.status.success(), "redis-cluster start: {}", text(&out));
        r
    }

    /// `redis-cli ARGS` against node `port`, from the store's host.
    fn cli(&self, port: u16, args: &[&str]) -> String {
        let out = Command::new("ip")
            .args(["netns", "exec", &self.ns, "redis-cli", "-h"])
            .arg(STORE_ADDR.to_string())
            .args(["-p", &port.to_string()])
            .args(args)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The port of the master serving `slot`, from `CLUSTER NODES` (asked of `via`).
    fn master_of(&self, via: u16, slot: u64) -> Option<u16> {
        self.cli(via, &["cluster", "nodes"]).lines().find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let serves = f.get(8..)?.iter().any(|r| {
                let (a, b) = r.split_once('-').unwrap_or((r, r));
                matches!((a.parse::<u64>(), b.parse::<u64>()), (Ok(a), Ok(b)) if (a..=b).contains(&slot))
            });
            let master = f.get(2)?.contains("master") && !f[2].contains("fail");
            let port = f.get(1)?.split(['@', ':']).nth(1)?.parse().ok()?;
            (serves && master).then_some(port)
        })
    }

    fn pid(&self, port: u16) -> u32 {
        let f = self.run.join(format!("redis-cluster-{port}/redis.pid"));
        std::fs::read_to_string(&f).unwrap().trim().parse().unwrap()
    }
}

impl Drop for LabRedisCluster {
    fn drop(&mut self) {
        let _ = self.script("stop");
    }
}

/// State on a Redis Cluster of 3 masters, each with a replica (`scripts/redis-cluster` on the
/// routed lab's store host), every batch acknowledged only once a replica holds it
/// (`wait_replicas = 1`). Under 100 downloads and the numbered stream through counter →
/// firewall → NAT, the master serving the counter's shared objects (and the ownership records
/// of the partitions on its slots) is killed (-9): its replica is promoted, the instances'
/// commits fail until then and go on after. Every download completes byte for byte; no
/// datagram arrives twice, and every one missing was refused by the firewall, counted, as a
/// new connection whose state the store could not give during the failover (the roots keep
/// the outputs until their commits are acknowledged: nothing else is lost). The store's
/// counter equals the packets the root logged, each finished once: no acknowledged increment
/// was lost with the master, none was applied twice (batches whose answers the kill cut off
/// are sent again and run once: their marks, `crates/drivers/redis/src/fenced.rs`).
/// Stragglers are not failed over here (`straggler = "0s"`): on two cores this load makes
/// instances stragglers before any kill, and a straggler's batches committed after its last
/// recorded one may count twice when replayed (see the README, "Stragglers").
#[test]
fn a_redis_cluster_master_killed_under_load_loses_no_acknowledged_commit() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    let nodes: Vec<String> = (7001..=7003)
        .map(|p| format!("\"redis://{STORE_ADDR}:{p}\""))
        .collect();
    let config = format!(
        "[input]\ninterface = \"fs-in\"\naddress = \"10.0.0.1\"\nfast_path = false\n\
         [output]\ninterface = \"fs-out\"\naddress = \"{BOX_OUTSIDE}\"\n\
         [runtime]\ninside = [\"10.0.0.0/24\"]\n\
         [state]\nbackend = \"redis-cluster\"\nnodes = [{}]\nwait_replicas = 1\n\
         [cluster]\npartitions = 16\ninstances = 3\nstore = \"external\"\nstraggler = \"0s\"\n\
         [[chain]]\nnf = \"counter\"\n\
         [[chain]]\nnf = \"firewall\"\ndefault_outbound = \"allow\"\ndefault_inbound = \"deny\"\n\
         [[chain]]\nnf = \"nat\"\nexternal = [\"{BOX_OUTSIDE}\"]\nports = \"20000-59999\"\n",
        nodes.join(", ")
    );
    let mut c = Cluster::lab_routed("k", &config, 3, true);
    let redis = LabRedisCluster::start(&c);
    let out = c.flowstate(&["cluster", "up", c.config.to_str().unwrap()]);
    assert!(out.status.success(), "cluster up: {}", text(&out));
    c.wait_for(20, "every partition owned", |s| {
        owned(s) == 16 && s["root"]["moving"] == 0
    });
    let slot: u64 = redis
        .cli(7001, &["cluster", "keyslot", "counter"])
        .trim()
        .parse()
        .unwrap();
    let victim = redis
        .master_of(7001, slot)
        .expect("a master serves the slot");
    let want = content(1_500_000, 5);
    let http_peers = c.serve_paced(&want, 200_000);
    let mut downloads = c.downloads(100);
    let count = 12_000;
    let (mut sender, stream) = c.numbered_stream(count, 4_000);
    std::thread::sleep(Duration::from_millis(1000));
    assert!(Command::new("kill")
        .args(["-9", &redis.pid(victim).to_string()])
        .status()
        .unwrap()
        .success());
    still_transferring(&mut downloads, want.len());
    assert!(sender.wait().unwrap().success());
    c.check_downloads(downloads, &want);
    server_saw_only_the_nat(&http_peers);
    let survivor = if victim == 7001 { 7002 } else { 7001 };
    let promoted = redis
        .master_of(survivor, slot)
        .expect("a replica took the slot");
    assert_ne!(promoted, victim);
    c.wait_for(20, "every partition owned and steady", |s| {
        owned(s) == 16 && s["root"]["moving"] == 0 && s["root"]["log_live"] == 0
    });
    std::thread::sleep(Duration::from_millis(1000));
    let (times, _) = stream_received(&stream, count);
    let twice: Vec<usize> = (0..times.len()).filter(|&i| times[i] > 1).collect();
    let missing: Vec<usize> = (0..times.len()).filter(|&i| times[i] == 0).collect();
    assert!(twice.is_empty(), "datagrams received twice: {twice:?}");
    let instances = c.instance_stats();
    // New connections whose state the store could not give while the master failed over are
    // refused (fail closed) and counted: by the firewall (no connection record) or the NAT (no
    // port from its pool); nothing else is missing.
    let refused: u64 = instances
        .iter()
        .flat_map(|i| {
            ["connection state unavailable", "nat: state error"]
                .map(|why| i["drop_reasons"][why].as_u64().unwrap_or(0))
        })
        .sum();
    assert!(
        missing.len() as u64 <= refused,
        "{} datagrams lost, {refused} refused for want of state: {missing:?}; root {:#}, \
         instances {instances:#?}",
        missing.len(),
        c.root(),
    );
    let counted: u64 = redis
        .cli(promoted, &["-c", "get", "{counter}@Counter@packets"])
        .trim()
        .parse()
        .unwrap();
    let errors: u64 = instances
        .iter()
        .map(|i| i["commit_errors"].as_u64().unwrap())
        .sum();
    // Every packet the root took was logged once and ended once: committed or dropped by the
    // chain, or lost on the way between the root and an instance (UDP under load: a commit
    // notice without its output, or a packet never answered). The counter counted each
    // packet that ran through the chain once: those finished, dropped or whose output went
    // missing, and at most the ones lost on the way.
    let root = c.root();
    let logged = root["log_packets"].as_u64().unwrap();
    let at = |k: &str| root[k].as_u64().unwrap();
    let ran = at("log_finished") + at("log_deleted") + at("outputs_missing");
    eprintln!(
        "master {victim} killed, {promoted} serves slot {slot}; {errors} commits failed meanwhile; \
         {} datagrams missing, {refused} packets refused for want of state; counted {counted}, \
         logged {logged}; root {root:#}",
        missing.len(),
    );
    assert!(errors > 0, "the kill reached the instances' commits");
    for k in ["log_live", "log_evicted", "log_abandoned"] {
        assert_eq!(root[k], 0, "{k}: {root:#}");
    }
    assert_eq!(ran + at("lost_on_the_way"), logged, "{root:#}");
    assert!(
        (ran..=logged).contains(&counted),
        "counted {counted}, ran {ran}, logged {logged}: {instances:#?}"
    );
}

/// Port forwarding through the cluster: an inside web server published at the box's external
/// address serves outside clients, byte for byte, and an inside client through the external
/// address (hairpinning). Both directions of a forwarded connection go to the partition of
/// the inside server, wherever an instance owns it.
#[test]
fn a_forwarded_inside_server_is_reached_through_the_cluster_from_outside_and_by_hairpinning() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    let state = "backend = \"store\"\nurl = \"192.0.2.1:7878\"";
    let config = Cluster::config(state, 2, "fast_path = false").replace(
        "default_inbound = \"deny\"\n",
        "default_inbound = \"deny\"\n\
         rules = [{ action = \"allow\", proto = \"tcp\", dport = 8080, direction = \"inbound\" }]\n",
    ) + &format!(
        "forward = [{{ proto = \"tcp\", external = \"{BOX_OUTSIDE}:80\", internal = \"{CLIENT}:8080\" }}]\n"
    );
    let mut c = Cluster::up_with("pf", &config, 4);
    c.wait_for(60, "every partition owned", |s| owned(s) == 16);
    let www = c.dir.path().join("www");
    std::fs::create_dir(&www).unwrap();
    let body = content(1_500_000, 7);
    std::fs::write(www.join("f.bin"), &body).unwrap();
    let client_ns = c.lab.client_ns();
    let (client, dir) = (CLIENT.to_string(), www.display().to_string());
    let web = c
        .in_ns(
            &client_ns,
            &["python3", "-c", HTTP_PY, &client, "8080", &dir],
        )
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(c.dir.path().join("web.log")).unwrap())
        .spawn()
        .unwrap();
    c.background.push(web);
    let peer = "10.0.0.3";
    let add = c
        .in_ns(
            &client_ns,
            &["ip", "addr", "add", &format!("{peer}/24"), "dev", CLIENT_IF],
        )
        .output()
        .unwrap();
    assert!(add.status.success(), "{}", text(&add));
    let deadline = Instant::now() + Duration::from_secs(10);
    while !c
        .in_ns(&client_ns, &["ss", "-Hltn", "sport = :8080"])
        .output()
        .is_ok_and(|o| !o.stdout.is_empty())
    {
        assert!(
            Instant::now() < deadline,
            "the inside server did not start: {}",
            std::fs::read_to_string(c.dir.path().join("web.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let url = format!("http://{BOX_OUTSIDE}/f.bin");
    let fetch = |ns: &str, from: &str, i: usize| {
        let to = c.dir.path().join(format!("f{i}"));
        let child = c
            .in_ns(
                ns,
                &[
                    "curl",
                    "-sS",
                    "-m",
                    "60",
                    "--interface",
                    from,
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
    };
    let server_ns = c.lab.server_ns();
    let downloads: Vec<_> = (0..8)
        .map(|i| fetch(&server_ns, &SERVER.to_string(), i))
        .chain((8..10).map(|i| fetch(&client_ns, peer, i)))
        .collect();
    c.check_downloads(downloads, &body);
}

/// Jumbo frames through the cluster: with the client's, the box's and the server's links at
/// MTU 9,000 and `[runtime] max_frame` holding their frames, downloads in 9,000-byte frames
/// cross the root and the instances byte for byte (the cluster network keeps MTU 1,500: the
/// kernel fragments the larger datagrams between the roles).
#[test]
fn jumbo_frames_cross_the_cluster() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    let state = "backend = \"store\"\nurl = \"192.0.2.1:7878\"";
    let config = Cluster::config(state, 2, "fast_path = false")
        .replace("[runtime]\n", "[runtime]\nmax_frame = 9018\n");
    let mut c = Cluster::lab_with("jb", &config, 4);
    let nf = c.lab.nf_ns();
    for (ns, port) in [
        (c.lab.client_ns(), CLIENT_IF),
        (nf.clone(), flowstate_lab::NF_INSIDE_IF),
        (nf.clone(), flowstate_lab::NF_OUTSIDE_IF),
        (c.lab.server_ns(), flowstate_lab::SERVER_IF),
    ] {
        let o = c
            .in_ns(&ns, &["ip", "link", "set", port, "mtu", "9000"])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", text(&o));
    }
    let out = c.flowstate(&["cluster", "up", c.config.to_str().unwrap()]);
    assert!(out.status.success(), "cluster up: {}", text(&out));
    c.wait_for(60, "every partition owned", |s| owned(s) == 16);
    let want = content(2_000_000, 9);
    let http_peers = c.serve_paced(&want, 20_000_000);
    let downloads = c.downloads(6);
    c.check_downloads(downloads, &want);
    server_saw_only_the_nat(&http_peers);
}

/// IPv6 through the cluster's root and instances: with the root's ports given IPv6
/// addresses, `curl -6` downloads from the server byte for byte (the root answers neighbour
/// discovery and routes by the inside prefixes; the firewall tracks the connections, the NAT
/// passes IPv6).
#[test]
fn curl_6_crosses_the_cluster() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    let state = "backend = \"store\"\nurl = \"192.0.2.1:7878\"";
    let config = Cluster::config(state, 2, "fast_path = false\naddress6 = \"fd00:1::1\"")
        .replace(
            &format!("address = \"{BOX_OUTSIDE}\"\n"),
            &format!("address = \"{BOX_OUTSIDE}\"\naddress6 = \"fd00:2::1\"\n"),
        )
        .replace(
            "inside = [\"10.0.0.0/24\"]",
            "inside = [\"10.0.0.0/24\", \"fd00:1::/64\"]",
        );
    let mut c = Cluster::lab_with("v6", &config, 4);
    let (client_ns, server_ns) = (c.lab.client_ns(), c.lab.server_ns());
    run_all(ipv6_hosts(
        (&client_ns, CLIENT_IF),
        (&server_ns, flowstate_lab::SERVER_IF),
        &["fd00:2::2"],
    ));
    let out = c.flowstate(&["cluster", "up", c.config.to_str().unwrap()]);
    assert!(out.status.success(), "cluster up: {}", text(&out));
    c.wait_for(60, "every partition owned", |s| owned(s) == 16);
    let www = c.dir.path().join("www6");
    std::fs::create_dir(&www).unwrap();
    let body = content(1_000_000, 5);
    std::fs::write(www.join("f.bin"), &body).unwrap();
    let dir = www.display().to_string();
    let web = c
        .in_ns(
            &server_ns,
            &["python3", "-c", HTTP_PY, "fd00:2::2", "8080", &dir],
        )
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    c.background.push(web);
    let to = c.dir.path().join("got6");
    let o = c
        .in_ns(
            &client_ns,
            &[
                "curl",
                "-6",
                "-g",
                "-sS",
                "-m",
                "30",
                "--retry",
                "5",
                "--retry-all-errors",
                "-o",
                to.to_str().unwrap(),
                "http://[fd00:2::2]:8080/f.bin",
            ],
        )
        .output()
        .unwrap();
    assert!(o.status.success(), "curl -6: {}", text(&o));
    assert!(std::fs::read(&to).unwrap() == body, "the download is whole");
}
