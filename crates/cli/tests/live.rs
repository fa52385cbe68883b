//! Real hosts through a live flowstate box: the lab's client and servers talk through
//! `flowstate run` on AF_PACKET in the lab's `nf` namespace (needs root and scripts/setup-live;
//! skipped with a message when not root).
//!
//! Each test makes its own lab (a unique prefix) and takes it down however it ends; the tests
//! run one at a time so that the boxes do not compete for the machine's cores.

mod common;

use common::{content, is_root};
use flowstate_lab::{Lab, System, BOX_OUTSIDE, CLIENT, CLIENT_IF, HTTP_PORT, SERVER, VIP};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Mutex;
use std::time::Duration;

static SERIAL: Mutex<()> = Mutex::new(());

/// A lab with a flowstate box in it; everything is stopped and removed on drop.
struct Live {
    lab: Lab,
    dir: tempfile::TempDir,
    flowstate: Option<Child>,
    others: Vec<Child>,
}

impl Live {
    fn up(name: &str) -> Live {
        let prefix = format!("fs-{name}{}-", std::process::id() % 100_000);
        let lab = Lab::new(&prefix).unwrap();
        let live = Live {
            lab,
            dir: tempfile::tempdir().unwrap(),
            flowstate: None,
            others: Vec::new(),
        };
        live.lab.up(&mut System::default()).unwrap();
        live
    }

    /// Starts `flowstate run` with `config` in the box's namespace and waits until the client
    /// reaches `probe` through it.
    fn start_box(&mut self, config: &str, probe: std::net::Ipv4Addr) {
        self.start_box_with(config, probe, &[]);
    }

    /// [`Live::start_box`] with more arguments for `flowstate run`.
    fn start_box_with(&mut self, config: &str, probe: std::net::Ipv4Addr, args: &[&str]) {
        let path = self.dir.path().join("box.toml");
        std::fs::write(&path, config).unwrap();
        let child = Command::new("ip")
            .args(["netns", "exec", &self.lab.nf_ns()])
            .arg(env!("CARGO_BIN_EXE_flowstate"))
            .args(["run", "--json"])
            .args(args)
            .arg(&path)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        self.flowstate = Some(child);
        for _ in 0..40 {
            if self
                .client(&["ping", "-c1", "-W1", &probe.to_string()])
                .status
                .success()
            {
                return;
            }
            if let Some(Ok(Some(status))) = self.flowstate.as_mut().map(Child::try_wait) {
                let out = self.flowstate.take().unwrap().wait_with_output().unwrap();
                panic!(
                    "flowstate exited early ({status}): {}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
        }
        panic!("the client never reached {probe} through the box");
    }

    /// Stops the box with SIGTERM; its JSON summary.
    fn stop_box(&mut self) -> serde_json::Value {
        let child = self.flowstate.take().expect("a box runs");
        let pid = child.id().to_string();
        assert!(Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success());
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "flowstate exits cleanly on SIGTERM: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!("{e}: {}", String::from_utf8_lossy(&out.stdout));
        })
    }

    fn run_in(&self, ns: &str, argv: &[&str]) -> Output {
        Command::new("ip")
            .args(["netns", "exec", ns])
            .args(argv)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }

    fn client(&self, argv: &[&str]) -> Output {
        self.run_in(&self.lab.client_ns(), argv)
    }

    fn server(&self, argv: &[&str]) -> Output {
        self.run_in(&self.lab.server_ns(), argv)
    }

    /// Downloads `url` in the client namespace into a file; its bytes.
    fn download(&self, url: &str) -> Vec<u8> {
        let to = self.dir.path().join("download");
        let out = self.client(&["curl", "-sSf", "-m", "60", "-o", path(&to), url]);
        assert!(
            out.status.success(),
            "curl {url}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::fs::read(&to).unwrap()
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        for c in self.flowstate.iter_mut().chain(self.others.iter_mut()) {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = self.lab.down(&mut System::default());
    }
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Files of several sizes in both backends' web roots.
fn publish(lab: &Lab) -> Vec<(String, Vec<u8>)> {
    let files: Vec<(String, Vec<u8>)> = [(1_000, 1), (100_000, 2), (3_000_000, 3)]
        .into_iter()
        .map(|(n, seed)| (format!("f{n}.bin"), content(n, seed)))
        .collect();
    for b in ['a', 'b'] {
        for (name, data) in &files {
            std::fs::write(lab.www(b).join(name), data).unwrap();
        }
    }
    files
}

fn config(chain: &str) -> String {
    format!(
        "[input]\ninterface = \"fs-in\"\naddress = \"10.0.0.1\"\n\
         [output]\ninterface = \"fs-out\"\naddress = \"{BOX_OUTSIDE}\"\n\
         [runtime]\nworkers = 2\ninside = [\"10.0.0.0/24\"]\n\
         [state]\nbackend = \"local\"\n{chain}"
    )
}

fn nat_chain() -> String {
    format!(
        "[[chain]]\nnf = \"firewall\"\n[[chain]]\nnf = \"nat\"\nexternal = [\"{BOX_OUTSIDE}\"]\nports = \"20000-59999\"\n"
    )
}

fn report(summary: &serde_json::Value, nf: &str, key: &str) -> i64 {
    summary["nfs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["name"] == nf)
        .unwrap_or_else(|| panic!("{nf} in {summary}"))["report"][key]
        .as_i64()
        .unwrap_or(0)
}

#[test]
fn nat_carries_http_iperf3_and_ping_and_hides_the_client() {
    if !is_root() {
        eprintln!("skipped: live tests need root");
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut live = Live::up("n");
    let files = publish(&live.lab);
    live.start_box(&config(&nat_chain()), SERVER);

    for (name, data) in &files {
        let got = live.download(&format!("http://{SERVER}:{HTTP_PORT}/{name}"));
        assert!(got == *data, "{name}: {} bytes, content differs", got.len());
    }

    let ping = live.client(&["ping", "-c3", "-i0.2", "-W2", &SERVER.to_string()]);
    assert!(
        ping.status.success(),
        "{}",
        String::from_utf8_lossy(&ping.stdout)
    );

    let tcp = live.client(&["iperf3", "-c", &SERVER.to_string(), "-t", "2", "--json"]);
    assert!(
        tcp.status.success(),
        "iperf3 tcp: {}",
        String::from_utf8_lossy(&tcp.stdout)
    );
    let j: serde_json::Value = serde_json::from_slice(&tcp.stdout).unwrap();
    assert!(
        j["end"]["sum_received"]["bytes"].as_f64().unwrap() > 0.0,
        "{j}"
    );

    let udp = live.client(&[
        "iperf3",
        "-c",
        &SERVER.to_string(),
        "-u",
        "-b",
        "20M",
        "-t",
        "2",
        "--json",
    ]);
    assert!(
        udp.status.success(),
        "iperf3 udp: {}",
        String::from_utf8_lossy(&udp.stdout)
    );
    let j: serde_json::Value = serde_json::from_slice(&udp.stdout).unwrap();
    // iperf3 3.12's UDP summary (`end.sum`) carries the server's packet and loss counts.
    let sum = &j["end"]["sum"];
    assert!(
        matches!(
            (sum["packets"].as_i64(), sum["lost_packets"].as_i64()),
            (Some(sent), Some(lost)) if sent > lost
        ),
        "datagrams arrive: {j}"
    );

    // An unsolicited connection to the external address has no mapping: it fails.
    let unsolicited = live.server(&[
        "curl",
        "-s",
        "-m",
        "3",
        &format!("http://{BOX_OUTSIDE}:{HTTP_PORT}/"),
    ]);
    assert!(!unsolicited.status.success());

    // The servers saw the NAT's external address only.
    let http_log = std::fs::read_to_string(live.lab.log("http-a")).unwrap();
    let requests: Vec<&str> = http_log.lines().filter(|l| l.contains("\"GET ")).collect();
    assert_eq!(requests.len(), files.len(), "{http_log}");
    for r in &requests {
        assert!(r.starts_with(&format!("{BOX_OUTSIDE} ")), "{r}");
    }
    let iperf_log = std::fs::read_to_string(live.lab.log("iperf3")).unwrap();
    assert!(iperf_log.contains(&format!("Accepted connection from {BOX_OUTSIDE}")));
    assert!(!iperf_log.contains(&CLIENT.to_string()), "{iperf_log}");
    assert!(!http_log.contains(&CLIENT.to_string()));

    let s = live.stop_box();
    assert!(report(&s, "nat", "translations") >= 5, "{s}");
    assert!(s["packets_out"].as_u64().unwrap() > 1000, "{s}");
    let dropped = s["dropped"].as_object().unwrap();
    assert!(
        dropped["nat: no mapping"].as_u64() >= Some(1),
        "the unsolicited SYN was dropped: {s}"
    );
}

#[test]
fn firewall_lets_replies_in_and_keeps_unsolicited_connections_out() {
    if !is_root() {
        eprintln!("skipped: live tests need root");
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut live = Live::up("f");
    publish(&live.lab);
    // A server on the client, which the outside must not reach.
    let www = live.dir.path().join("client-www");
    std::fs::create_dir_all(&www).unwrap();
    std::fs::write(www.join("secret"), "inside\n").unwrap();
    let client_server = Command::new("ip")
        .args(["netns", "exec", &live.lab.client_ns()])
        // socketserver rather than `http.server`, which looks its own name up in the DNS (and
        // the client's DNS traffic would go to the box, not started yet).
        .args(["python3", "-c"])
        .arg(format!(
            "import functools, socketserver, http.server as h\n\
             socketserver.TCPServer(('{CLIENT}', 8081), functools.partial(\
             h.SimpleHTTPRequestHandler, directory='{}')).serve_forever()",
            path(&www)
        ))
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(live.dir.path().join("client-www.log")).unwrap())
        .spawn()
        .unwrap();
    live.others.push(client_server);
    live.start_box(
        &config("[[chain]]\nnf = \"firewall\"\ndefault_outbound = \"allow\"\ndefault_inbound = \"deny\"\n"),
        SERVER,
    );
    // The client is up locally.
    let mut local = false;
    for _ in 0..50 {
        let o = live.client(&[
            "curl",
            "-s",
            "-m",
            "1",
            &format!("http://{CLIENT}:8081/secret"),
        ]);
        if o.status.success() {
            local = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        local,
        "the client's own server runs: {}",
        std::fs::read_to_string(live.dir.path().join("client-www.log")).unwrap_or_default()
    );

    // Solicited: the client's connection and its replies pass (routed, no NAT).
    let got = live.download(&format!("http://{SERVER}:{HTTP_PORT}/f100000.bin"));
    assert_eq!(got, content(100_000, 2));
    let log = std::fs::read_to_string(live.lab.log("http-a")).unwrap();
    assert!(log.contains(&format!("{CLIENT} ")), "no NAT here: {log}");

    // Unsolicited: the server cannot open a connection to the client.
    for _ in 0..2 {
        let o = live.server(&[
            "curl",
            "-s",
            "-m",
            "3",
            &format!("http://{CLIENT}:8081/secret"),
        ]);
        assert!(
            !o.status.success(),
            "{}",
            String::from_utf8_lossy(&o.stdout)
        );
    }
    let s = live.stop_box();
    let dropped = s["dropped"].as_object().unwrap();
    assert!(
        dropped.keys().any(|k| k.starts_with("firewall:")),
        "the firewall dropped the server's SYNs: {s}"
    );
}

#[test]
fn lb_spreads_connections_and_keeps_each_on_one_backend() {
    if !is_root() {
        eprintln!("skipped: live tests need root");
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut live = Live::up("l");
    let files = publish(&live.lab);
    let chain = format!(
        "[[chain]]\nnf = \"lb\"\nvips = [{{ vip = \"{VIP}\", port = {HTTP_PORT}, backends = [\"{SERVER}\", \"198.51.100.3\"] }}]\n"
    );
    live.start_box(&config(&chain), SERVER);

    // Many connections, each from a new source port: both backends answer.
    let mut seen = std::collections::BTreeMap::new();
    for _ in 0..16 {
        let who = live.download(&format!("http://{VIP}:{HTTP_PORT}/backend"));
        *seen
            .entry(String::from_utf8_lossy(&who).trim().to_owned())
            .or_insert(0) += 1;
    }
    assert_eq!(
        seen.keys().cloned().collect::<Vec<_>>(),
        ["a", "b"],
        "{seen:?}"
    );

    // Long connections: every packet of each stays on one backend (else the transfer breaks).
    let (name, data) = &files[2];
    for _ in 0..4 {
        assert!(live.download(&format!("http://{VIP}:{HTTP_PORT}/{name}")) == *data);
    }
    let served: usize = ['a', 'b']
        .iter()
        .map(|b| {
            let log = std::fs::read_to_string(live.lab.log(&format!("http-{b}"))).unwrap();
            log.lines()
                .filter(|l| l.contains(&format!("GET /{name}")))
                .count()
        })
        .sum();
    assert_eq!(served, 4, "each download served once, by one backend");

    let s = live.stop_box();
    assert!(report(&s, "lb", "flows") >= 20, "{s}");
}

#[test]
fn a_missing_interface_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let cfg: PathBuf = dir.path().join("box.toml");
    std::fs::write(
        &cfg,
        config("[[chain]]\nnf = \"firewall\"\n").replace("fs-in", "fs-nosuch0"),
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_flowstate"))
        .args(["run", path(&cfg)])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("fs-nosuch0"), "{err}");
    assert!(
        err.contains("no such interface") || err.contains("CAP_NET_RAW"),
        "says what is missing: {err}"
    );
}

#[test]
fn nat_over_af_xdp_carries_http_and_tcp() {
    if !is_root() {
        eprintln!("skipped: live tests need root");
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut live = Live::up("x");
    let files = publish(&live.lab);
    let cfg = config(&nat_chain()).replace(
        "address = \"10.0.0.1\"\n",
        "address = \"10.0.0.1\"\ndriver = \"af-xdp\"\n",
    );
    assert!(cfg.contains("af-xdp"));
    live.start_box(&cfg, SERVER);
    for (name, data) in &files {
        let got = live.download(&format!("http://{SERVER}:{HTTP_PORT}/{name}"));
        assert!(got == *data, "{name}: {} bytes, content differs", got.len());
    }
    let tcp = live.client(&["iperf3", "-c", &SERVER.to_string(), "-t", "1"]);
    assert!(
        tcp.status.success(),
        "{}",
        String::from_utf8_lossy(&tcp.stdout)
    );
    let http_log = std::fs::read_to_string(live.lab.log("http-a")).unwrap();
    assert!(!http_log.contains(&CLIENT.to_string()), "{http_log}");
    let s = live.stop_box();
    assert!(report(&s, "nat", "translations") >= 4, "{s}");
}

/// One worker (the live box's default): it owns both ports and runs to completion, with no
/// dispatcher or output thread; on both drivers, with the XDP fast path (the default) and
/// without, and it stops cleanly on SIGTERM.
#[test]
fn one_worker_runs_to_completion_on_both_drivers() {
    if !is_root() {
        eprintln!("skipped: live tests need root");
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let combos = [
        ("af-packet", true),
        ("af-xdp", true),
        ("af-packet", false),
        ("af-xdp", false),
    ];
    for (driver, fast) in combos {
        let mut live = Live::up("r");
        let files = publish(&live.lab);
        let cfg = config(&nat_chain()).replace("workers = 2\n", "").replace(
            "address = \"10.0.0.1\"\n",
            &format!("address = \"10.0.0.1\"\ndriver = \"{driver}\"\n"),
        );
        let cfg = if fast {
            cfg
        } else {
            cfg.replace("\"\ndriver", "\"\nfast_path = false\ndriver")
        };
        assert_eq!(cfg.contains("fast_path = false"), !fast);
        assert!(cfg.contains(driver) && !cfg.contains("workers"));
        live.start_box(&cfg, SERVER);
        for (name, data) in &files {
            let got = live.download(&format!("http://{SERVER}:{HTTP_PORT}/{name}"));
            assert!(
                got == *data,
                "{driver}: {name}: {} bytes, content differs",
                got.len()
            );
        }
        let tcp = live.client(&["iperf3", "-c", &SERVER.to_string(), "-t", "1", "--json"]);
        assert!(
            tcp.status.success(),
            "{driver}: {}",
            String::from_utf8_lossy(&tcp.stdout)
        );
        let j: serde_json::Value = serde_json::from_slice(&tcp.stdout).unwrap();
        assert!(
            j["end"]["sum_received"]["bytes"].as_f64().unwrap() > 0.0,
            "{driver}: {j}"
        );
        let unsolicited = live.server(&[
            "curl",
            "-s",
            "-m",
            "2",
            &format!("http://{BOX_OUTSIDE}:{HTTP_PORT}/"),
        ]);
        assert!(!unsolicited.status.success(), "{driver}");
        let http_log = std::fs::read_to_string(live.lab.log("http-a")).unwrap();
        assert!(
            !http_log.contains(&CLIENT.to_string()),
            "{driver}: {http_log}"
        );
        let s = live.stop_box();
        assert_eq!(s["workers"].as_u64(), Some(1), "{driver}: {s}");
        assert!(report(&s, "nat", "translations") >= 4, "{driver}: {s}");
        // With the fast path, established flows bypass the chain: the kernel forwards them.
        let fast_path = s["live_box"]["fast_path_packets"].as_u64().unwrap_or(0);
        let by_chain = s["packets_out"].as_u64().unwrap();
        if fast {
            assert!(fast_path > 1000 && fast_path > by_chain, "{driver}: {s}");
        } else {
            assert!(by_chain > 1000 && fast_path == 0, "{driver}: {s}");
        }
    }
}

#[test]
fn bench_live_nat_reports_the_ratios() {
    if !is_root() {
        eprintln!("skipped: live tests need root");
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("live-nat.json");
    let child = Command::new(env!("CARGO_BIN_EXE_flowstate"))
        .args(["bench", "live-nat", "--quick", "--json", path(&json)])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert_eq!(v["name"], "live-nat");
    assert!(v["params"].get("error").is_none(), "{v}");
    for key in [
        "xdp_vs_linux_pps",
        "afpacket_vs_linux_pps",
        "xdp_vs_linux_tcp_goodput",
        "afpacket_vs_linux_tcp_goodput",
        "xdp_slow_vs_linux_pps",
        "afpacket_slow_vs_linux_tcp_goodput",
    ] {
        assert!(v["ratios"][key].as_f64().unwrap() > 0.0, "{key}: {v}");
    }
    // The default boxes forward most packets on their fast path.
    for key in ["afpacket_fast_path_share", "xdp_fast_path_share"] {
        assert!(v["metrics"][key].as_f64().unwrap() > 0.5, "{key}: {v}");
    }
    // Its lab (named after its process) is gone.
    let netns = Command::new("ip").args(["netns", "list"]).output().unwrap();
    let netns = String::from_utf8_lossy(&netns.stdout);
    assert!(!netns.contains(&format!("fs-bench{pid}-")), "{netns}");
}

/// The portscan detector on a live box: a real scanner (nmap, a SYN scan from a second address
/// of the client's namespace) is detected and blocked while a download from the client's own
/// address goes on and completes byte for byte; afterwards the scanner reaches nothing and the
/// client everything.
#[test]
fn a_real_scanner_is_detected_and_blocked_while_downloads_go_on() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    if Command::new("nmap").arg("--version").output().is_err() {
        eprintln!("skipped: no nmap (scripts/setup-live installs it)");
        return;
    }
    let mut live = Live::up("p");
    let files = publish(&live.lab);
    let scanner = "10.0.0.3";
    let add = live.client(&[
        "ip",
        "addr",
        "add",
        &format!("{scanner}/24"),
        "dev",
        CLIENT_IF,
    ]);
    assert!(
        add.status.success(),
        "{}",
        String::from_utf8_lossy(&add.stderr)
    );
    live.start_box(
        &config(
            "[[chain]]\nnf = \"portscan\"\nblock = true\nblock_time = \"10m\"\nwatch = \"outbound\"\n",
        ),
        SERVER,
    );
    // A slow download from the client's own address, meanwhile.
    let (name, want) = &files[2];
    let to = live.dir.path().join("during-scan");
    let download = Command::new("ip")
        .args(["netns", "exec", &live.lab.client_ns()])
        .args([
            "curl",
            "-sSf",
            "-m",
            "60",
            "--limit-rate",
            "500k",
            "-o",
            path(&to),
        ])
        .arg(format!("http://{SERVER}:{HTTP_PORT}/{name}"))
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(500));
    let scan = live.client(&[
        "nmap",
        "-sS",
        "-Pn",
        "-n",
        "-e",
        CLIENT_IF,
        "-S",
        scanner,
        "-p",
        "1-300",
        "--max-retries",
        "0",
        "-T4",
        &SERVER.to_string(),
    ]);
    assert!(
        scan.status.success(),
        "nmap: {}",
        String::from_utf8_lossy(&scan.stderr)
    );
    let out = download.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "the download during the scan: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(std::fs::read(&to).unwrap(), *want, "the download's bytes");
    // The scanner is blocked, the client is not.
    let blocked = live.client(&[
        "curl",
        "-s",
        "-m",
        "3",
        "--interface",
        scanner,
        "-o",
        "/dev/null",
        &format!("http://{SERVER}:{HTTP_PORT}/{}", files[0].0),
    ]);
    assert!(
        !blocked.status.success(),
        "the scanner still reaches the server"
    );
    assert_eq!(
        live.download(&format!("http://{SERVER}:{HTTP_PORT}/{}", files[0].0)),
        files[0].1
    );
    let summary = live.stop_box();
    eprintln!(
        "portscan: {} alerts, {} packets of the scanner dropped",
        report(&summary, "portscan", "alerts_scanner_outbound"),
        report(&summary, "portscan", "dropped_blocked")
    );
    assert_eq!(
        report(&summary, "portscan", "alerts_scanner_outbound"),
        1,
        "{summary:#}"
    );
    assert!(
        report(&summary, "portscan", "dropped_blocked") > 0,
        "{summary:#}"
    );
}

/// A live box keeps time while no packet comes: its NAT's sessions expire on schedule when
/// the box is idle, not at the next packet (a NAT that frees ports only under traffic runs out
/// of them after a burst). With one worker (run to completion) and two (a dispatcher).
#[test]
fn an_idle_box_expires_its_nat_sessions_on_schedule() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    for workers in [1, 2] {
        let mut live = Live::up(&format!("idle{workers}"));
        let chain = format!(
            "[[chain]]\nnf = \"nat\"\nexternal = [\"{BOX_OUTSIDE}\"]\nports = \"20000-59999\"\nudp = \"1s\"\nicmp = \"1s\"\n"
        );
        let config = config(&chain).replace("workers = 2", &format!("workers = {workers}"));
        // The start's pings make ICMP sessions; one UDP datagram makes a UDP session.
        live.start_box(&config, SERVER);
        let send = format!(
            "import socket\ns=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\ns.sendto(b'x',('{SERVER}',9))\n"
        );
        assert!(live.client(&["python3", "-c", &send]).status.success());
        // Then nothing for 3 s: three times the timeouts.
        std::thread::sleep(Duration::from_secs(3));
        let summary = live.stop_box();
        assert!(
            report(&summary, "nat", "expired_sessions") >= 2,
            "{workers} workers: the ICMP and UDP sessions expired while the box was idle: {summary}"
        );
        assert_eq!(
            report(&summary, "nat", "active_sessions"),
            0,
            "{workers} workers: {summary}"
        );
    }
}

/// HyperSFC on a live box: `examples/live-hypersfc.toml`'s tables in XDP on both ports, the
/// kernel routing what they pass. Real TCP downloads go through the rewriting tables (a
/// virtual address in front of the second server, both ways) and a direct one, with every
/// miss taken to the slow path over AF_XDP and answered through the recirculation port; the
/// ACL's port is dropped (a timeout, where without the box the server would refuse).
#[test]
fn a_table_pipeline_in_xdp_filters_and_rewrites_real_tcp() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    let mut live = Live::up("x");
    let files = publish(&live.lab);
    live.lab
        .kernel_router(&mut System::default(), true)
        .unwrap();
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/live-hypersfc.toml");
    // The kernel routes pings by itself: the box is up once the virtual address answers.
    live.start_box(&std::fs::read_to_string(example).unwrap(), SERVER);
    let up = (0..40).any(|_| {
        let url = format!("http://{VIP}:{HTTP_PORT}/{}", files[0].0);
        let ok = live
            .client(&["curl", "-sf", "-m", "1", "-o", "/dev/null", &url])
            .status
            .success();
        if !ok {
            std::thread::sleep(Duration::from_millis(250));
        }
        ok
    });
    assert!(up, "the virtual address never answered");

    // Through the virtual address to the second server, and straight to the first.
    let (name, data) = &files[2];
    assert_eq!(
        &live.download(&format!("http://{VIP}:{HTTP_PORT}/{name}")),
        data
    );
    let log = std::fs::read_to_string(live.lab.log("http-b")).unwrap();
    assert!(
        log.contains(&format!("{CLIENT} ")),
        "backend b saw the client: {log}"
    );
    let (name, data) = &files[1];
    assert_eq!(
        &live.download(&format!("http://{SERVER}:{HTTP_PORT}/{name}")),
        data
    );
    // The ACL's port: dropped by the box (curl times out: 28), not refused by the server (7).
    let o = live.client(&["curl", "-s", "-m", "2", &format!("http://{SERVER}:8081/")]);
    assert_eq!(o.status.code(), Some(28), "{o:?}");

    let s = live.stop_box();
    let n = |k: &str| s[k].as_u64().unwrap_or_else(|| panic!("{k} in {s}"));
    let l = |k: &str| {
        s["live"][k]
            .as_u64()
            .unwrap_or_else(|| panic!("live.{k} in {s}"))
    };
    assert!(n("dropped") >= 1, "{s}");
    assert!(n("circulations") >= 4, "every table missed at first: {s}");
    assert_eq!(l("answered"), n("circulations"), "{s}");
    assert_eq!(
        l("forged") + l("malformed") + l("no_room") + l("no_socket"),
        0,
        "{s}"
    );
    // A 3 MB download is some 2,000 packets: the fast path took nearly all of them.
    assert!(n("fast_path_only") > 10 * n("circulations"), "{s}");
    for t in s["tables"].as_array().unwrap() {
        assert!(t["hits"].as_u64() > t["misses"].as_u64(), "{t}");
    }
    // The recirculation pair went with the box.
    let o = live.run_in(&live.lab.nf_ns(), &["ip", "link", "show", "fs-rc"]);
    assert!(!o.status.success(), "fs-rc left behind");
}

/// The samples of an OpenMetrics/Prometheus text page: `name{labels}` → value.
fn parse_exposition(page: &str) -> std::collections::BTreeMap<String, f64> {
    page.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            Some((series.to_owned(), value.parse().ok()?))
        })
        .collect()
}

#[test]
fn a_live_nat_box_is_scraped_mid_run_and_agrees_with_its_summary() {
    if !is_root() {
        eprintln!("skipped: live tests need root");
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut live = Live::up("m");
    let files = publish(&live.lab);
    let metrics = "127.0.0.1:9464";
    live.start_box_with(&config(&nat_chain()), SERVER, &["--metrics", metrics]);
    let nf_ns = live.lab.nf_ns();
    let scrape = |what: &str| -> String {
        let o = live.run_in(
            &nf_ns,
            &[
                "curl",
                "-sSf",
                "-m",
                "5",
                &format!("http://{metrics}{what}"),
            ],
        );
        assert!(
            o.status.success(),
            "curl {what}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8(o.stdout).unwrap()
    };

    // A slow download (rate-limited) runs while the box is scraped.
    let (name, data) = files.last().unwrap();
    let to = live.dir.path().join("slow");
    let download = Command::new("ip")
        .args(["netns", "exec", &live.lab.client_ns()])
        .args(["curl", "-sSf", "-m", "60", "--limit-rate", "400k", "-o"])
        .arg(&to)
        .arg(format!("http://{SERVER}:{HTTP_PORT}/{name}"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let nat_in = "flowstate_nf_packets_total{nf=\"nat\"}";
    let inside_rx = "flowstate_packets_total{port=\"inside\",direction=\"rx\"}";
    let mut first = None;
    for _ in 0..100 {
        let page = scrape("/metrics");
        assert!(page.ends_with("# EOF\n"), "{page}");
        let m = parse_exposition(&page);
        if m.get(nat_in).copied().unwrap_or(0.0) > 0.0 {
            first = Some(m);
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let first = first.expect("the NAT's packets show in /metrics while the download runs");
    let mid_summary: serde_json::Value =
        serde_json::from_str(&scrape("/api/v1/summary")).expect("/api/v1/summary is JSON");
    assert!(
        mid_summary["packets_in"].as_u64().is_some(),
        "{mid_summary}"
    );
    assert_eq!(scrape("/healthz"), "ok\n");

    let out = download.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "download: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        std::fs::read(&to).unwrap() == *data,
        "the download is whole"
    );
    let second = parse_exposition(&scrape("/metrics"));
    for series in [nat_in, "flowstate_input_packets_total", inside_rx] {
        assert!(
            second[series] >= first[series],
            "{series}: counters only grow ({} then {})",
            first[series],
            second[series]
        );
    }
    let s = live.stop_box();

    // Everything scraped was counted, and at most what the final summary counts.
    let nf = |name: &str| {
        s["nfs"]
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["name"] == name)
            .unwrap_or_else(|| panic!("{name} in {s}"))
            .clone()
    };
    let checks = [
        (
            "flowstate_input_packets_total".to_owned(),
            s["packets_in"].as_u64(),
        ),
        (
            "flowstate_output_packets_total".to_owned(),
            s["packets_out"].as_u64(),
        ),
        (nat_in.to_owned(), nf("nat")["packets_in"].as_u64()),
        (
            "flowstate_nf_packets_total{nf=\"firewall\"}".to_owned(),
            nf("firewall")["packets_in"].as_u64(),
        ),
        (
            "flowstate_nf_forwarded_packets_total{nf=\"nat\"}".to_owned(),
            nf("nat")["forwarded"].as_u64(),
        ),
        (
            inside_rx.to_owned(),
            s["live_box"]["inside_rx_packets"].as_u64(),
        ),
        (
            "flowstate_packets_total{port=\"outside\",direction=\"tx\"}".to_owned(),
            s["live_box"]["outside_tx_packets"].as_u64(),
        ),
        (
            "flowstate_nf_translations{nf=\"nat\"}".to_owned(),
            nf("nat")["report"]["translations"]
                .as_i64()
                .map(|v| v as u64),
        ),
    ];
    for (series, last) in checks {
        let last = last.unwrap_or_else(|| panic!("{series}: in the summary {s}")) as f64;
        for (when, m) in [("mid-run", &first), ("after the download", &second)] {
            let v = *m
                .get(&series)
                .unwrap_or_else(|| panic!("{series} scraped {when}: {m:?}"));
            assert!(v > 0.0, "{series} {when}: {v}");
            assert!(v <= last, "{series} {when}: {v} > final {last}");
        }
    }
    assert!(
        mid_summary["packets_in"].as_u64() <= s["packets_in"].as_u64(),
        "{mid_summary}"
    );
    assert!(
        first.contains_key("flowstate_state_flushes_total{worker=\"0\"}"),
        "{first:?}"
    );
    assert!(first
        .keys()
        .any(|k| k.starts_with("flowstate_batch_duration_seconds_bucket")));
}
