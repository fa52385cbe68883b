//! Brings a real lab up and down (needs root, iproute2, ethtool, python3, iperf3, and for
//! kernel HA keepalived and conntrackd: scripts/setup-live). Skipped with a message when not
//! root.

use flowstate_lab::{
    failover_gap, instance_addr, ping_reply_times, Cmd, Exec, Lab, System, BOX_OUTSIDE, CLIENT_IF,
    HTTP_PORT, ROOT_ADDR, SERVER, STORE_ADDR,
};
use flowstate_testkit::is_root;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Takes the lab down however the test ends.
struct Guard(Lab);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.down(&mut System::default());
    }
}

fn sh(exec: &mut System, argv: Vec<String>) -> String {
    exec.run(&Cmd {
        argv,
        may_fail: false,
    })
    .unwrap()
}

#[test]
fn lab_comes_up_idempotently_and_goes_away() {
    if !is_root() {
        eprintln!("skipped: the lab needs root");
        return;
    }
    let prefix = format!("fs-lt{}-", std::process::id() % 100_000);
    let lab = Lab::new(&prefix).unwrap();
    let guard = Guard(lab.clone());
    let mut exec = System::default();
    assert!(lab.up(&mut exec).unwrap(), "made");
    let status = lab.status(&mut exec).unwrap();
    assert!(status.complete, "{status:?}");
    assert!(!lab.up(&mut exec).unwrap(), "second up makes nothing");

    // The client has its address and route; the server answers HTTP on its own namespace.
    let addr = sh(
        &mut exec,
        Lab::in_ns(
            &lab.client_ns(),
            &["ip", "-4", "-o", "addr", "show", CLIENT_IF],
        ),
    );
    assert!(addr.contains("10.0.0.2/24"), "{addr}");
    let body = sh(
        &mut exec,
        Lab::in_ns(
            &lab.server_ns(),
            &[
                "curl",
                "-sf",
                &format!("http://{SERVER}:{HTTP_PORT}/backend"),
            ],
        ),
    );
    assert_eq!(body, "a\n");
    // Nothing crosses the box yet: no one forwards.
    let ping = exec
        .run(&Cmd {
            argv: Lab::in_ns(
                &lab.client_ns(),
                &["ping", "-c1", "-W1", &SERVER.to_string()],
            ),
            may_fail: true,
        })
        .unwrap();
    assert!(!ping.contains(" 0% packet loss"), "{ping}");

    // Processes left in its namespaces go with the lab: one that ends on SIGTERM, one that
    // ignores it (and its child, which inherits that).
    let inside = |ns: String, argv: &[&str]| -> Child {
        Command::new("ip")
            .args(["netns", "exec", &ns])
            .args(argv)
            .stdin(Stdio::null())
            .spawn()
            .unwrap()
    };
    let mut left = [
        inside(lab.client_ns(), &["sleep", "600"]),
        inside(lab.server_ns(), &["sh", "-c", "trap '' TERM; sleep 600; :"]),
    ];
    let deadline = Instant::now() + Duration::from_secs(5);
    let netns_pids = ["ip", "netns", "pids", &lab.server_ns()].map(str::to_owned);
    while sh(&mut exec, netns_pids.to_vec())
        .split_whitespace()
        .count()
        < 2
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(20));
    }
    let stopped = lab.down(&mut exec).unwrap();
    for c in &mut left {
        assert!(stopped.contains(&c.id()), "{stopped:?} {}", c.id());
        c.wait().unwrap();
    }
    assert!(stopped.len() >= 3, "the shell's sleep too: {stopped:?}");
    for pid in &stopped {
        assert!(!flowstate_lab::running(*pid), "{pid} still runs");
    }
    let status = lab.status(&mut exec).unwrap();
    assert!(
        status.namespaces.is_empty() && status.servers.is_empty(),
        "{status:?}"
    );
    assert!(!lab.state_dir().exists());
    drop(guard);
}

/// The lab's namespaces whose name starts with `prefix`.
fn namespaces_with(prefix: &str) -> Vec<String> {
    let out = Command::new("ip").args(["netns", "list"]).output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| n.starts_with(prefix))
        .map(str::to_owned)
        .collect()
}

fn pings(exec: &mut System, ns: &str, to: &str) -> bool {
    exec.run(&Cmd {
        argv: Lab::in_ns(ns, &["ping", "-c1", "-W1", to]),
        may_fail: true,
    })
    .unwrap()
    .contains(" 1 received")
}

#[test]
fn instances_reach_the_root_and_each_other_and_go_away() {
    if !is_root() {
        eprintln!("skipped: the lab needs root");
        return;
    }
    let t0 = Instant::now();
    let prefix = format!("fk{}-", std::process::id() % 100_000);
    let lab = Lab::new(&prefix).unwrap().with_instances(3).unwrap();
    let guard = Guard(lab.clone());
    let mut exec = System::default();
    assert!(lab.up(&mut exec).unwrap(), "made");
    let status = lab.status(&mut exec).unwrap();
    assert!(status.complete, "{status:?}");
    assert_eq!(
        status.instances,
        (1..=3).map(|k| lab.instance_ns(k)).collect::<Vec<_>>()
    );
    assert!(!lab.up(&mut exec).unwrap(), "second up makes nothing");

    let root = ROOT_ADDR.to_string();
    for k in 1..=3 {
        assert!(pings(&mut exec, &lab.instance_ns(k), &root), "i{k} -> root");
    }
    let (i1, i2) = (lab.instance_ns(1), lab.instance_ns(2));
    assert!(pings(&mut exec, &i1, &instance_addr(2).to_string()));
    assert!(pings(&mut exec, &i2, &instance_addr(1).to_string()));
    // The cluster net is not routed to the client or server side.
    let fwd = sh(
        &mut exec,
        Lab::in_ns(&lab.nf_ns(), &["sysctl", "-n", "net.ipv4.ip_forward"]),
    );
    assert_eq!(fwd.trim(), "0");
    assert!(!pings(&mut exec, &i1, &SERVER.to_string()));

    // Fewer instances: the extra ones go, the rest stay; more: they come back.
    let one = lab.clone().with_instances(1).unwrap();
    assert!(one.up(&mut exec).unwrap());
    let status = one.status(&mut exec).unwrap();
    assert!(status.complete, "{status:?}");
    assert_eq!(status.instances, vec![i1.clone()]);
    assert!(pings(&mut exec, &i1, &root));
    assert!(lab.up(&mut exec).unwrap());
    assert!(pings(&mut exec, &lab.instance_ns(3), &root));
    assert!(Lab::new(&prefix).unwrap().with_instances(17).is_err());

    lab.down(&mut exec).unwrap();
    assert_eq!(namespaces_with(&prefix), Vec::<String>::new());
    drop(guard);
    eprintln!("instances test: {:?}", t0.elapsed());
}

/// The routed cluster network on the real system: every host reaches every other through the
/// router (one hop, TTL 63), a 9000-byte datagram with DF crosses whole, the cluster network
/// reaches neither the client nor the server, and the lab switches to the bridge and back and
/// goes away leaving nothing.
#[test]
fn routed_hosts_reach_each_other_through_the_router_only() {
    if !is_root() {
        eprintln!("skipped: the lab needs root");
        return;
    }
    let prefix = format!("fq{}-", std::process::id() % 100_000);
    let lab = Lab::new(&prefix)
        .unwrap()
        .with_instances(2)
        .unwrap()
        .with_routed(true);
    let guard = Guard(lab.clone());
    let mut exec = System::default();
    assert!(lab.up(&mut exec).unwrap(), "made");
    let status = lab.status(&mut exec).unwrap();
    assert!(status.complete && status.routed, "{status:?}");
    assert!(!lab.up(&mut exec).unwrap(), "second up makes nothing");
    let ping = |exec: &mut System, ns: &str, args: &[&str]| {
        let mut argv = vec!["ping", "-c1", "-W1"];
        argv.extend(args);
        exec.run(&Cmd {
            argv: Lab::in_ns(ns, &argv),
            may_fail: true,
        })
        .unwrap()
    };
    let hosts = [
        (lab.nf_ns(), ROOT_ADDR),
        (lab.store_ns(), STORE_ADDR),
        (lab.instance_ns(1), instance_addr(1)),
        (lab.instance_ns(2), instance_addr(2)),
    ];
    for (from, _) in &hosts {
        for (to, addr) in &hosts {
            if from != to {
                let out = ping(&mut exec, from, &[&addr.to_string()]);
                assert!(out.contains("ttl=63"), "{from} -> {to}: {out}");
            }
        }
    }
    // A full 9000-byte datagram, not to be fragmented, crosses two links and the router.
    let out = ping(
        &mut exec,
        &lab.instance_ns(1),
        &["-M", "do", "-s", "8972", &ROOT_ADDR.to_string()],
    );
    assert!(out.contains(" 1 received"), "{out}");
    let out = ping(
        &mut exec,
        &lab.instance_ns(1),
        &["-M", "do", "-s", "8973", &ROOT_ADDR.to_string()],
    );
    assert!(!out.contains(" 1 received"), "more than the MTU: {out}");
    // Only the router forwards, and not to the client's or the server's side.
    let router = lab.cluster_router_ns();
    let fwd = |exec: &mut System, ns: &str| {
        sh(
            exec,
            Lab::in_ns(ns, &["sysctl", "-n", "net.ipv4.ip_forward"]),
        )
    };
    assert_eq!(fwd(&mut exec, &router).trim(), "1");
    assert_eq!(fwd(&mut exec, &lab.nf_ns()).trim(), "0");
    assert!(!ping(&mut exec, &lab.instance_ns(1), &[&SERVER.to_string()]).contains(" 1 received"));

    // Without --routed: the bridge again (one hop less); routed again; then nothing left.
    let bridged = Lab::new(&prefix).unwrap().with_instances(2).unwrap();
    assert!(bridged.up(&mut exec).unwrap());
    assert!(!bridged.status(&mut exec).unwrap().routed);
    assert!(!namespaces_with(&prefix).contains(&router));
    let out = ping(&mut exec, &lab.instance_ns(2), &[&ROOT_ADDR.to_string()]);
    assert!(out.contains("ttl=64"), "{out}");
    assert!(lab.up(&mut exec).unwrap());
    let out = ping(&mut exec, &lab.instance_ns(2), &[&ROOT_ADDR.to_string()]);
    assert!(out.contains("ttl=63"), "{out}");
    lab.down(&mut exec).unwrap();
    assert_eq!(namespaces_with(&prefix), Vec::<String>::new());
    drop(guard);
}

/// Stops the processes a test started however it ends.
struct Children(Vec<Child>);

impl Drop for Children {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A UDP echo server: prints each new peer's address.
const UDP_ECHO: &str = r#"
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind((sys.argv[1], int(sys.argv[2])))
seen = set()
while True:
    data, peer = s.recvfrom(2048)
    if peer[0] not in seen:
        seen.add(peer[0])
        print(peer[0], flush=True)
    s.sendto(data, peer)
"#;

/// An HTTP download read at argv[3] bytes/s (curl 7.88's --limit-rate does not hold its rate
/// here: it often reads the whole response at once), written to argv[2] as it comes.
const SLOW_GET: &str = r#"
import sys, time, urllib.request
url, out, rate = sys.argv[1], sys.argv[2], float(sys.argv[3])
start = time.time()
got = 0
with urllib.request.urlopen(url, timeout=30) as r, open(out, "wb") as f:
    while True:
        chunk = r.read(16384)
        if not chunk:
            break
        f.write(chunk)
        f.flush()
        got += len(chunk)
        ahead = got / rate - (time.time() - start)
        if ahead > 0:
            time.sleep(ahead)
print(got, "bytes in", round(time.time() - start, 2), "s")
"#;

/// A UDP request/response loop: one request every 10 ms for argv[3] seconds; prints the
/// receive time of every response, one a line.
const UDP_LOOP: &str = r#"
import select, socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setblocking(False)
dst = (sys.argv[1], int(sys.argv[2]))
start = time.time()
nxt = start
seq = 0
times = []
while time.time() - start < float(sys.argv[3]):
    if time.time() >= nxt:
        try:
            s.sendto(str(seq).encode(), dst)
        except OSError:
            pass
        seq += 1
        nxt += 0.01
    r, _, _ = select.select([s], [], [], max(0.0, nxt - time.time()))
    while r:
        try:
            s.recv(2048)
            times.append(time.time())
        except OSError:
            break
print("sent", seq)
for t in times:
    print("[%.6f] 5 bytes from echo" % t)
"#;

#[test]
fn kernel_ha_keeps_a_download_through_a_primary_crash() {
    if !is_root() {
        eprintln!("skipped: the lab needs root");
        return;
    }
    let t0 = Instant::now();
    let prefix = format!("fh{}-", std::process::id() % 100_000);
    let lab = Lab::new(&prefix).unwrap();
    let guard = Guard(lab.clone());
    let mut exec = System::default();
    lab.up(&mut exec).unwrap();
    lab.kernel_ha(&mut exec, true).unwrap();
    eprintln!("kernel HA up after {:?}", t0.elapsed());
    let (r1, r2) = (lab.router_ns(1), lab.router_ns(2));
    assert_eq!(lab.ha_master(&mut exec).unwrap(), Some(r1.clone()));
    let status = lab.status(&mut exec).unwrap();
    assert!(status.complete, "{status:?}");
    assert_eq!(status.routers, vec![r1.clone(), r2.clone()]);
    // Again: complete, left as it is.
    lab.kernel_ha(&mut exec, true).unwrap();
    assert_eq!(lab.ha_master(&mut exec).unwrap(), Some(r1.clone()));

    // 4 MiB read at 512 KiB/s: about 8 s, the primary dies after 3. A small receive buffer in
    // the client, so that the data crosses the routers as the client reads it (by default most
    // of the file fits in the client's window and is through before the crash).
    sh(
        &mut exec,
        Lab::in_ns(
            &lab.client_ns(),
            &["sysctl", "-qw", "net.ipv4.tcp_rmem=4096 65536 131072"],
        ),
    );
    let body: Vec<u8> = (0..4u32 << 20)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    std::fs::write(lab.www('a').join("big"), &body).unwrap();
    let out = lab.state_dir().join("download");
    let log = |name: &str| std::fs::File::create(lab.state_dir().join(name)).unwrap();
    let spawn_in = |ns: &str, argv: &[&str], out: std::fs::File| {
        Command::new("ip")
            .args(["netns", "exec", ns])
            .args(argv)
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .unwrap()
    };
    let mut children = Children(Vec::new());
    children.0.push(spawn_in(
        &lab.server_ns(),
        &["python3", "-u", "-c", UDP_ECHO, &SERVER.to_string(), "9000"],
        log("udp-echo.log"),
    ));
    std::thread::sleep(Duration::from_millis(300));
    let url = format!("http://{SERVER}:{HTTP_PORT}/big");
    let out_s = out.to_string_lossy().into_owned();
    let download = spawn_in(
        &lab.client_ns(),
        &["python3", "-u", "-c", SLOW_GET, &url, &out_s, "524288"],
        log("download.log"),
    );
    children.0.push(spawn_in(
        &lab.client_ns(),
        &[
            "python3",
            "-u",
            "-c",
            UDP_LOOP,
            &SERVER.to_string(),
            "9000",
            "10",
        ],
        log("udp-loop.log"),
    ));
    let probe = lab
        .start_gap_probe(&mut exec, Duration::from_secs(10))
        .unwrap();
    std::thread::sleep(Duration::from_secs(3));

    // The backup holds the download's state, synced by conntrackd.
    let conf = lab.ha_router_dir(2).join("conntrackd.conf");
    let external = sh(
        &mut exec,
        Lab::in_ns(&r2, &["conntrackd", "-C", &conf.to_string_lossy(), "-e"]),
    );
    assert!(
        external
            .lines()
            .any(|l| l.contains("ESTABLISHED") && l.contains(&format!("dport={HTTP_PORT}"))),
        "r2's external cache: {external}"
    );
    // The crash comes in the middle of the download.
    let part = std::fs::metadata(&out).map(|m| m.len()).unwrap_or(0);
    assert!(
        part > 0 && part < body.len() as u64 * 3 / 4,
        "{part} of {} bytes downloaded before the crash",
        body.len()
    );

    // No failover yet (VRRP did not flap under the load).
    let notify2 = lab.ha_router_dir(2).join("notify.log");
    let before = std::fs::read_to_string(&notify2).unwrap();
    assert!(!before.contains("primary"), "{before}");

    let kill_at = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let killed = Instant::now();
    lab.kill_ha_primary(&mut exec).unwrap();
    let mut master = None;
    while killed.elapsed() < Duration::from_secs(5) {
        master = lab.ha_master(&mut exec).unwrap();
        if master.as_deref() == Some(r2.as_str()) {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(master, Some(r2.clone()), "the backup took over");
    eprintln!(
        "r2 holds the addresses {:?} after the kill",
        killed.elapsed()
    );

    let mut download = Children(vec![download]);
    let status = loop {
        if let Some(status) = download.0[0].try_wait().unwrap() {
            break status;
        }
        assert!(t0.elapsed() < Duration::from_secs(50), "the download hangs");
        std::thread::sleep(Duration::from_millis(100));
    };
    let download_log = std::fs::read_to_string(lab.state_dir().join("download.log")).unwrap();
    assert!(status.success(), "download: {status} {download_log}");
    let got = std::fs::read(&out).unwrap();
    assert!(
        got == body,
        "download differs: {} bytes of {}",
        got.len(),
        body.len()
    );

    // The server saw only the shared outside address.
    let http_log = std::fs::read_to_string(lab.log("http-a")).unwrap();
    let requests: Vec<&str> = http_log.lines().filter(|l| l.contains("\"GET ")).collect();
    assert!(!requests.is_empty(), "{http_log}");
    for l in &requests {
        assert!(l.starts_with(&format!("{BOX_OUTSIDE} ")), "{l}");
    }
    // r2's notify script committed the synced state.
    let notify = std::fs::read_to_string(&notify2).unwrap();
    assert!(notify.contains("done primary"), "{notify}");
    assert!(!notify.contains("ERROR"), "{notify}");

    // Ping and UDP came back through the backup; the gap each saw.
    let replies = probe.finish(&mut exec).unwrap();
    let ping_gap = failover_gap(&replies, kill_at).expect("ping replies around the kill");
    let mut udp = children.0.pop().unwrap();
    let udp_status = udp.wait().unwrap();
    assert!(udp_status.success());
    let udp_out = std::fs::read_to_string(lab.state_dir().join("udp-loop.log")).unwrap();
    let udp_gap =
        failover_gap(&ping_reply_times(&udp_out), kill_at).expect("UDP responses around the kill");
    let peers = std::fs::read_to_string(lab.state_dir().join("udp-echo.log")).unwrap();
    assert_eq!(peers.trim(), BOX_OUTSIDE.to_string(), "UDP peers");
    eprintln!(
        "failover gap: ping {} ms ({} replies), udp {} ms",
        ping_gap.as_millis(),
        replies.len(),
        udp_gap.as_millis()
    );
    assert!(ping_gap < Duration::from_secs(5), "{ping_gap:?}");
    assert!(udp_gap < Duration::from_secs(5), "{udp_gap:?}");

    drop(children);

    // The helper for benchmarks: kernel HA is made anew (its primary is dead) and measured.
    let t1 = Instant::now();
    let gap = lab.peer_failover_gap(&mut exec).unwrap();
    eprintln!(
        "peer_failover_gap: {} ms (rebuild and measurement {:?})",
        gap.as_millis(),
        t1.elapsed()
    );
    assert!(
        gap > Duration::from_millis(50) && gap < Duration::from_secs(5),
        "{gap:?}"
    );
    assert_eq!(lab.ha_master(&mut exec).unwrap(), Some(r2.clone()));

    // Off: the ordinary lab again (no routers, no bridges), then down leaves nothing.
    lab.kernel_ha(&mut exec, false).unwrap();
    let status = lab.status(&mut exec).unwrap();
    assert!(status.complete && status.routers.is_empty(), "{status:?}");
    assert!(!lab.ha_dir().exists());
    lab.down(&mut exec).unwrap();
    assert_eq!(namespaces_with(&prefix), Vec::<String>::new());
    assert!(!lab.state_dir().exists());
    drop(guard);
    eprintln!("kernel HA test: {:?}", t0.elapsed());
}
