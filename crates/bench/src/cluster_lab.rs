//! The harness the cluster benchmarks (`failover`, `scale`) share: a namespace lab with
//! instance namespaces ([`flowstate_lab`]), a cluster in it driven through this binary's own
//! `flowstate cluster up|down|status|kill|scale` (the benchmarks run inside the `flowstate`
//! binary), and the traffic: HTTP downloads by `curl` in the client namespace from a paced
//! HTTP server in the server namespace, each compared byte for byte; UDP probe flows answered by an echo server in the server
//! namespace; short UDP flows that fill the NAT's session tables; `iperf3` goodput.
//!
//! Threads of this process enter the client or server namespace (`setns`) to run the probe,
//! the echo server, the paced HTTP server and the flood: no helper process, and reply times to the microsecond.
//! Everything stays inside the lab's namespaces; the lab (and any cluster or kernel HA in it)
//! is removed when a [`ClusterLab`] is dropped.

use flowstate_lab::{Lab, System, BOX_OUTSIDE, CLIENT, CLIENT_IF, SERVER};
use serde_json::Value;
use std::net::{IpAddr, SocketAddrV4, UdpSocket};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The TCP port of the paced HTTP server (on [`SERVER`], beside the lab's own on 8080).
pub(crate) const PACED_PORT: u16 = 8081;
/// The UDP port of the echo server (on [`SERVER`]).
pub(crate) const ECHO_PORT: u16 = 9999;
/// Traffic partitions of the benchmarks' clusters.
pub(crate) const PARTITIONS: u32 = 16;
/// First client source port of the probe flows.
const PROBE_PORT_BASE: u16 = 41000;

/// The chain every box and cluster of these benchmarks runs: a stateful firewall, then a NAT
/// (as `examples/cluster.toml`).
const CHAIN: &str = "[[chain]]\nnf = \"firewall\"\ndefault_outbound = \"allow\"\ndefault_inbound = \"deny\"\n\
                     [[chain]]\nnf = \"nat\"\nexternal = [\"198.51.100.1\"]\nports = \"20000-59999\"\n";

/// Seconds since the epoch, as `ping -D` and [`flowstate_lab::failover_gap`] count.
pub(crate) fn now_secs() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// Moves this thread (and only it) into namespace `ns`.
fn enter_ns(ns: &str) -> Result<(), String> {
    let path = format!("/run/netns/{ns}");
    let f = std::fs::File::open(&path).map_err(|e| format!("{path}: {e}"))?;
    // SAFETY: setns on a file we opened; it changes this thread's network namespace only.
    if unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(format!("setns {path}: {}", std::io::Error::last_os_error()));
    }
    Ok(())
}

/// Runs `f` in a thread inside namespace `ns` and waits for it.
fn in_ns<T: Send>(ns: &str, f: impl FnOnce() -> Result<T, String> + Send) -> Result<T, String> {
    std::thread::scope(|s| {
        s.spawn(|| {
            enter_ns(ns)?;
            f()
        })
        .join()
        .unwrap_or_else(|_| Err(format!("a thread in {ns} panicked")))
    })
}

/// The deployment file of a cluster of `instances` running [`CHAIN`] on the managed store.
/// `moves`: `"claim"` or `"copy"`; `fast_path`: the root's XDP fast path (the default) or
/// every packet through the instances.
pub(crate) fn cluster_config(instances: u32, moves: &str, fast_path: bool) -> String {
    format!(
        "[input]\ninterface = \"{}\"\naddress = \"10.0.0.1\"\nfast_path = {fast_path}\n\
         [output]\ninterface = \"{}\"\naddress = \"{BOX_OUTSIDE}\"\n\
         [runtime]\ninside = [\"10.0.0.0/24\"]\n\
         [state]\nbackend = \"store\"\nurl = \"{}:7878\"\n\
         [cluster]\npartitions = {PARTITIONS}\ninstances = {instances}\nstore = \"managed\"\nmoves = \"{moves}\"\n\
         {CHAIN}",
        flowstate_lab::NF_INSIDE_IF,
        flowstate_lab::NF_OUTSIDE_IF,
        flowstate_lab::ROOT_ADDR,
    )
}

/// [`cluster_config`] with the firewall and the NAT as two stages, `per_stage` instances each
/// (`examples/cluster-stages.toml`, both stages with [`PARTITIONS`]).
pub(crate) fn staged_config(per_stage: u32, fast_path: bool) -> String {
    cluster_config(per_stage, "claim", fast_path).replacen(
        "[[chain]]\nnf = \"nat\"",
        "[[chain]]\nstage = 1\nnf = \"nat\"",
        1,
    )
}

/// The configuration of the single live box running [`CHAIN`] (`flowstate run`), state on the
/// local store; `fast_path`: the XDP fast path (a live box's default) or every packet through
/// the chain.
pub(crate) fn box_config(fast_path: bool) -> String {
    format!(
        "[input]\ninterface = \"{}\"\naddress = \"10.0.0.1\"\nfast_path = {fast_path}\n\
         [output]\ninterface = \"{}\"\naddress = \"{BOX_OUTSIDE}\"\n\
         [runtime]\ninside = [\"10.0.0.0/24\"]\n\
         [state]\nbackend = \"local\"\n\
         {CHAIN}",
        flowstate_lab::NF_INSIDE_IF,
        flowstate_lab::NF_OUTSIDE_IF,
    )
}

/// The cluster partition of a UDP flow from the client's `src_port` to the echo server: the
/// root's own choice (the chain's owners, else the flow hash).
pub(crate) fn udp_partition(src_port: u16) -> Result<u32, String> {
    let config = flowstate_deploy::Config::parse(&cluster_config(1, "claim", false), "bench.toml")
        .map_err(|e| e.to_string())?;
    let chain = config.factories().map_err(|e| e.to_string())?;
    let key = flowstate_wire::FlowKey::new(
        IpAddr::V4(CLIENT),
        IpAddr::V4(SERVER),
        src_port,
        ECHO_PORT,
        flowstate_wire::flow::proto::UDP,
    );
    let owners = flowstate_nf::steer::Owners::new(&chain);
    Ok(owners
        .partition(&key, None, flowstate_nf::Direction::Outbound, PARTITIONS)
        .unwrap_or_else(|| {
            flowstate_nf::steer::Steering::new(
                config.runtime.inside_prefixes(),
                PARTITIONS as usize,
            )
            .worker_of_flow(&key) as u32
        }))
}

/// One probe source port per partition, in partition order.
pub(crate) fn probe_ports() -> Result<Vec<u16>, String> {
    let mut ports = vec![0u16; PARTITIONS as usize];
    let mut found = 0;
    for port in PROBE_PORT_BASE..PROBE_PORT_BASE + 4096 {
        let p = udp_partition(port)? as usize;
        if ports[p] == 0 {
            ports[p] = port;
            found += 1;
            if found == ports.len() {
                return Ok(ports);
            }
        }
    }
    Err("no probe port for some partition".into())
}

/// A lab with instance namespaces, the echo server running, and the cluster commands.
pub(crate) struct ClusterLab {
    pub(crate) lab: Lab,
    exe: PathBuf,
    scratch: PathBuf,
    echo: Option<Echo>,
}

impl ClusterLab {
    /// Makes lab `fb{tag}{pid}-` with `instances` instance namespaces and starts the echo
    /// server.
    pub(crate) fn up(tag: &str, instances: u32) -> Result<ClusterLab, String> {
        ClusterLab::with(tag, instances, false)
    }

    /// [`ClusterLab::up`] of a routed lab (`lab up --routed`): the root's host, each
    /// instance's host and the store's host on subnets of their own behind a router.
    pub(crate) fn up_routed(tag: &str, instances: u32) -> Result<ClusterLab, String> {
        ClusterLab::with(tag, instances, true)
    }

    fn with(tag: &str, instances: u32, routed: bool) -> Result<ClusterLab, String> {
        let prefix = format!("fb{tag}{}-", std::process::id() % 100_000);
        let lab = Lab::new(&prefix)
            .and_then(|l| l.with_instances(instances))
            .map(|l| l.with_routed(routed))
            .map_err(|e| e.to_string())?;
        let exe = std::env::current_exe().map_err(|e| format!("finding this binary: {e}"))?;
        if let Err(e) = lab.up(&mut System::default()) {
            let _ = lab.down(&mut System::default());
            return Err(e.to_string());
        }
        let scratch = lab.state_dir().join("bench");
        let mut c = ClusterLab {
            lab,
            exe,
            scratch,
            echo: None,
        };
        std::fs::create_dir_all(&c.scratch).map_err(|e| format!("{}: {e}", c.scratch.display()))?;
        c.echo = Some(Echo::start(&c.lab)?);
        Ok(c)
    }

    /// A file in the scratch directory (removed with the lab).
    pub(crate) fn scratch(&self, name: &str) -> PathBuf {
        self.scratch.join(name)
    }

    /// Runs `flowstate ARGS --prefix P`; its stdout, or an error with its output.
    pub(crate) fn flowstate(&self, args: &[&str]) -> Result<String, String> {
        let out = Command::new(&self.exe)
            .args(args)
            .args(["--prefix", self.lab.prefix()])
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("flowstate {}: {e}", args.join(" ")))?;
        if !out.status.success() {
            return Err(format!(
                "flowstate {}: {}{}",
                args.join(" "),
                String::from_utf8_lossy(&out.stdout).trim(),
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// `cluster up` of deployment `text` (written to the scratch directory as `name.toml`).
    pub(crate) fn cluster_up(&self, name: &str, text: &str) -> Result<(), String> {
        self.forget_time_wait();
        let path = self.scratch(&format!("{name}.toml"));
        std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
        self.flowstate(&["cluster", "up", &path.to_string_lossy()])?;
        self.wait_reachable()
    }

    /// `cluster down`.
    pub(crate) fn cluster_down(&self) -> Result<(), String> {
        self.flowstate(&["cluster", "down"]).map(drop)
    }

    /// `cluster status --json` (with the root's counters under `root`).
    pub(crate) fn status(&self) -> Result<Value, String> {
        let out = self.flowstate(&["cluster", "status", "--json"])?;
        serde_json::from_str(&out).map_err(|e| format!("cluster status: {e}"))
    }

    /// Polls the status until `ok` holds (at most `secs`); the status that satisfied it.
    pub(crate) fn wait_for(
        &self,
        secs: u64,
        what: &str,
        ok: impl Fn(&Value) -> bool,
    ) -> Result<Value, String> {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            let s = self.status();
            if let Ok(s) = &s {
                if ok(s) {
                    return Ok(s.clone());
                }
            }
            if Instant::now() > deadline {
                return Err(format!("{what}: not within {secs} s; last status {s:?}"));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits until `n` instances (of every stage) are live, own every partition of their
    /// stage between them, the root applied every stage's assignment and nothing moves.
    pub(crate) fn wait_settled(&self, n: usize, secs: u64) -> Result<Value, String> {
        self.wait_for(
            secs,
            &format!("{n} live instances owning every partition"),
            |s| {
                let stages = s["stages"].as_array().map_or(&[][..], Vec::as_slice);
                live(s).len() == n
                    && !stages.is_empty()
                    && s["root"]["moving"] == 0
                    && stages.iter().all(|st| {
                        let k = &st["stage"];
                        let owned: usize = s["instances"]
                            .as_array()
                            .map_or(&[][..], Vec::as_slice)
                            .iter()
                            .filter(|i| &i["stage"] == k)
                            .map(|i| i["partitions"].as_array().map_or(0, Vec::len))
                            .sum();
                        Some(owned as u64) == st["partitions"].as_u64()
                            && k.as_u64().is_some_and(|k| {
                                s["root"]["assignment_versions"][k as usize] == st["version"]
                            })
                    })
            },
        )
    }

    /// The counters instance `k` left in `instance-K.json` (also after it stopped).
    pub(crate) fn instance_file(&self, k: u32) -> Option<Value> {
        let path = self
            .lab
            .state_dir()
            .join(format!("cluster/instance-{k}.json"));
        serde_json::from_str(&std::fs::read_to_string(path).ok()?).ok()
    }

    /// The pid of a cluster role (`root`, `store`, `instance-2`, ...), if it runs.
    pub(crate) fn role_pid(&self, role: &str) -> Option<u32> {
        let path = self.lab.state_dir().join(format!("cluster/{role}.pid"));
        let pid: u32 = std::fs::read_to_string(path).ok()?.trim().parse().ok()?;
        Path::new(&format!("/proc/{pid}")).exists().then_some(pid)
    }

    /// The cluster's processes now: (role, pid).
    pub(crate) fn roles(&self) -> Vec<(String, u32)> {
        let mut v: Vec<String> = ["root", "controller", "store"]
            .iter()
            .map(|s| (*s).to_owned())
            .collect();
        v.extend((1..=flowstate_lab::MAX_INSTANCES).map(|k| format!("instance-{k}")));
        v.into_iter()
            .filter_map(|r| self.role_pid(&r).map(|p| (r, p)))
            .collect()
    }

    /// Drops the servers' TCP connections left from the deployment before (`ss -K` of every
    /// connected socket in the server namespace: TIME-WAIT, LAST-ACK, ...; listeners stay).
    /// Each box or cluster starts with a fresh NAT, which hands out the same external ports
    /// as the one before; a SYN on a port whose old connection the server still holds is
    /// answered with an ACK that flowstate's firewall drops (the client never resets it), and
    /// the connection would wait out the server's timers (60 s in TIME-WAIT). A new
    /// deployment meets servers as a new NAT address would.
    pub(crate) fn forget_time_wait(&self) {
        let _ = Command::new("ip")
            .args(["netns", "exec", &self.lab.server_ns()])
            .args(["ss", "-K", "-t", "state", "connected"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }

    /// Waits until the client reaches the server (ping through whatever is the box).
    pub(crate) fn wait_reachable(&self) -> Result<(), String> {
        for _ in 0..40 {
            let ok = Command::new("ip")
                .args(["netns", "exec", &self.lab.client_ns()])
                .args(["ping", "-c1", "-W1", &SERVER.to_string()])
                .stdin(Stdio::null())
                .output()
                .is_ok_and(|o| o.status.success());
            if ok {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Err(format!("the client does not reach {SERVER}"))
    }

    /// Starts an HTTP server on [`SERVER`]:[`PACED_PORT`] (threads in the server namespace)
    /// that answers every GET with `body`, each response paced at `rate` bytes per second.
    pub(crate) fn serve_paced(&self, body: Arc<Vec<u8>>, rate: u64) -> Result<Paced, String> {
        Paced::start(&self.lab, body, rate)
    }

    /// Starts the single live box (`flowstate run`) in the nf namespace; waits until the
    /// client reaches the server through it.
    pub(crate) fn box_up(&self, fast_path: bool) -> Result<LiveBox, String> {
        self.forget_time_wait();
        let path = self.scratch("box.toml");
        std::fs::write(&path, box_config(fast_path))
            .map_err(|e| format!("{}: {e}", path.display()))?;
        let log = std::fs::File::create(self.scratch("box.log")).map_err(|e| e.to_string())?;
        let child = Command::new("ip")
            .args(["netns", "exec", &self.lab.nf_ns()])
            .arg(&self.exe)
            .args(["run", &path.to_string_lossy()])
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| e.to_string())?)
            .stderr(log)
            .spawn()
            .map_err(|e| format!("starting flowstate run: {e}"))?;
        let b = LiveBox { child };
        self.wait_reachable()?;
        Ok(b)
    }

    /// iperf3 TCP for `secs` from the client to the lab's iperf3 server: the receiver's
    /// bits per second and the sender's retransmits.
    pub(crate) fn iperf3(&self, secs: u32) -> Result<(f64, f64), String> {
        self.iperf3_streams(secs, 1)
    }

    /// [`ClusterLab::iperf3`] with `streams` parallel connections (`-P`): flows an upstream
    /// hashing on the 5-tuple spreads over several roots.
    pub(crate) fn iperf3_streams(&self, secs: u32, streams: u32) -> Result<(f64, f64), String> {
        let t = secs.to_string();
        let p = streams.to_string();
        let server = SERVER.to_string();
        for _ in 0..20 {
            let out = Command::new("ip")
                .args(["netns", "exec", &self.lab.client_ns()])
                .args(["iperf3", "-c", &server, "--json", "-t", &t, "-P", &p])
                .stdin(Stdio::null())
                .output()
                .map_err(|e| format!("iperf3: {e}"))?;
            let j: Value =
                serde_json::from_slice(&out.stdout).map_err(|e| format!("iperf3: {e}"))?;
            match j.get("error").and_then(Value::as_str) {
                Some(e) if e.contains("busy") => std::thread::sleep(Duration::from_secs(1)),
                Some(e) => return Err(format!("iperf3: {e}")),
                None => {
                    return Ok((
                        j["end"]["sum_received"]["bits_per_second"]
                            .as_f64()
                            .unwrap_or(0.0),
                        j["end"]["sum_sent"]["retransmits"].as_f64().unwrap_or(0.0),
                    ))
                }
            }
        }
        Err("iperf3: the server stayed busy".into())
    }

    /// Bytes the client's interface has received so far (its kernel counter).
    pub(crate) fn client_rx_bytes(&self) -> Result<u64, String> {
        in_ns(&self.lab.client_ns(), || {
            let text = std::fs::read_to_string("/proc/thread-self/net/dev")
                .map_err(|e| format!("/proc/thread-self/net/dev: {e}"))?;
            text.lines()
                .find_map(|l| {
                    let (dev, rest) = l.split_once(':')?;
                    (dev.trim() == CLIENT_IF)
                        .then(|| rest.split_whitespace().next()?.parse().ok())?
                })
                .ok_or_else(|| format!("no {CLIENT_IF} in the client's /proc/net/dev"))
        })
    }

    /// Opens `n` UDP flows from the client (source ports `first..first+n`) to the echo
    /// server, one datagram each, a chunk at a time: NAT sessions and firewall connections in
    /// the cluster's partitions. The flows that were answered.
    pub(crate) fn open_flows(&self, first: u16, n: usize) -> Result<usize, String> {
        in_ns(&self.lab.client_ns(), || {
            let server = SocketAddrV4::new(SERVER, ECHO_PORT);
            let mut answered = 0;
            let mut port = first;
            let end = u32::from(first) + n as u32;
            while u32::from(port) < end {
                let chunk = (end - u32::from(port)).min(200) as u16;
                let mut socks = Vec::with_capacity(usize::from(chunk));
                for p in port..port + chunk {
                    let s = UdpSocket::bind(SocketAddrV4::new(CLIENT, p))
                        .map_err(|e| format!("bind {CLIENT}:{p}: {e}"))?;
                    s.set_nonblocking(true).map_err(|e| e.to_string())?;
                    let _ = s.send_to(b"flow", server);
                    socks.push(s);
                }
                // Their answers (the sessions are made whether or not one comes back); a flow
                // not answered within 100 ms is sent again, twice at most.
                let start = Instant::now();
                let mut got = vec![false; socks.len()];
                let mut resent = 0;
                let mut buf = [0u8; 64];
                while start.elapsed() < Duration::from_millis(400) && got.iter().any(|g| !g) {
                    for (s, g) in socks.iter().zip(got.iter_mut()) {
                        if !*g && s.recv(&mut buf).is_ok() {
                            *g = true;
                        }
                    }
                    if start.elapsed() > Duration::from_millis(100 * (resent + 1)) && resent < 2 {
                        resent += 1;
                        for (s, g) in socks.iter().zip(&got) {
                            if !*g {
                                let _ = s.send_to(b"flow", server);
                            }
                        }
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
                answered += got.iter().filter(|g| **g).count();
                port += chunk;
            }
            Ok(answered)
        })
    }
}

impl Drop for ClusterLab {
    fn drop(&mut self) {
        if let Some(e) = self.echo.take() {
            e.stop();
        }
        let _ = self.cluster_down();
        let _ = self.lab.down(&mut System::default());
    }
}

/// Live instances' ids in a status.
pub(crate) fn live(s: &Value) -> Vec<u64> {
    s["instances"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter(|i| i["state"] == "live")
                .filter_map(|i| i["id"].as_u64())
                .collect()
        })
        .unwrap_or_default()
}

/// The instance a status gives partition `p` to.
pub(crate) fn owner_of(s: &Value, p: u32) -> Option<u64> {
    s["instances"].as_array()?.iter().find_map(|i| {
        i["partitions"]
            .as_array()?
            .iter()
            .any(|x| x.as_u64() == Some(u64::from(p)))
            .then(|| i["id"].as_u64())?
    })
}

/// A root counter of a status.
pub(crate) fn root_counter(s: &Value, key: &str) -> f64 {
    s["root"][key].as_f64().unwrap_or(0.0)
}

/// The single live box, stopped (SIGINT, as Ctrl-C) on drop.
pub(crate) struct LiveBox {
    child: Child,
}

impl LiveBox {
    /// Its process id.
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for LiveBox {
    fn drop(&mut self) {
        // SAFETY: a signal to our own child.
        unsafe {
            libc::kill(self.child.id() as libc::pid_t, libc::SIGINT);
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if !matches!(self.child.try_wait(), Ok(None)) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// CPU time (user + system) of processes, to turn into cores over a phase.
pub(crate) fn cpu_seconds(pid: u32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    // Fields after the command name (which may hold spaces): state is the 3rd field overall.
    let Some(rest) = stat.rsplit(')').next() else {
        return 0.0;
    };
    let f: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 (1-based), i.e. 11 and 12 after the name.
    let ticks: f64 = [11, 12]
        .iter()
        .filter_map(|&i| f.get(i)?.parse::<f64>().ok())
        .sum();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    ticks / hz
}

/// Cores each group of processes used between two CPU readings over `secs`.
pub(crate) struct CpuMeter {
    start: Vec<(String, u32, f64)>,
    at: Instant,
}

impl CpuMeter {
    /// Starts measuring `procs` (group name, pid).
    pub(crate) fn start(procs: &[(String, u32)]) -> CpuMeter {
        CpuMeter {
            start: procs
                .iter()
                .map(|(g, p)| (g.clone(), *p, cpu_seconds(*p)))
                .collect(),
            at: Instant::now(),
        }
    }

    /// Cores per group since the start (a group is a role without its instance number);
    /// processes of `now` that were not there at the start count all their CPU time (they
    /// started meanwhile). Processes that ended meanwhile are not counted.
    pub(crate) fn cores(&self, now: &[(String, u32)]) -> std::collections::BTreeMap<String, f64> {
        let wall = self.at.elapsed().as_secs_f64().max(1e-9);
        let mut m = std::collections::BTreeMap::new();
        let group = |g: &str| g.split('-').next().unwrap_or(g).to_owned();
        for (g, p, c0) in &self.start {
            *m.entry(group(g)).or_insert(0.0) += (cpu_seconds(*p) - c0).max(0.0) / wall;
        }
        for (g, p) in now {
            if !self.start.iter().any(|(_, q, _)| q == p) {
                *m.entry(group(g)).or_insert(0.0) += cpu_seconds(*p) / wall;
            }
        }
        m
    }
}

/// A UDP echo server on [`SERVER`]:[`ECHO_PORT`] (a thread in the server namespace).
struct Echo {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<()>,
}

impl Echo {
    fn start(lab: &Lab) -> Result<Echo, String> {
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = std::sync::mpsc::channel();
        let ns = lab.server_ns();
        let st = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let sock = enter_ns(&ns).and_then(|()| {
                let s = UdpSocket::bind(SocketAddrV4::new(SERVER, ECHO_PORT))
                    .map_err(|e| format!("echo server: bind {SERVER}:{ECHO_PORT}: {e}"))?;
                s.set_read_timeout(Some(Duration::from_millis(50)))
                    .map_err(|e| e.to_string())?;
                Ok(s)
            });
            let sock = match sock {
                Ok(s) => {
                    let _ = tx.send(Ok(()));
                    s
                }
                Err(e) => {
                    let _ = tx.send(Err(e));
                    return;
                }
            };
            let mut buf = [0u8; 2048];
            while !st.load(Ordering::Relaxed) {
                if let Ok((n, from)) = sock.recv_from(&mut buf) {
                    let _ = sock.send_to(&buf[..n], from);
                }
            }
        });
        rx.recv()
            .map_err(|_| "the echo server did not start".to_owned())??;
        Ok(Echo { stop, thread })
    }

    fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.thread.join();
    }
}

/// UDP probe flows: from the client, one datagram per flow every interval to the echo
/// server; the time each reply came back, per flow.
pub(crate) struct Probe {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Result<Vec<Vec<f64>>, String>>,
}

impl Probe {
    /// Starts flows from client source ports `ports`, a datagram every `every` on each.
    pub(crate) fn start(lab: &Lab, ports: &[u16], every: Duration) -> Result<Probe, String> {
        let stop = Arc::new(AtomicBool::new(false));
        let st = Arc::clone(&stop);
        let ns = lab.client_ns();
        let ports = ports.to_vec();
        let (tx, rx) = std::sync::mpsc::channel();
        let thread = std::thread::spawn(move || -> Result<Vec<Vec<f64>>, String> {
            let setup = || -> Result<Vec<UdpSocket>, String> {
                enter_ns(&ns)?;
                ports
                    .iter()
                    .map(|&p| {
                        let s = UdpSocket::bind(SocketAddrV4::new(CLIENT, p))
                            .map_err(|e| format!("probe: bind {CLIENT}:{p}: {e}"))?;
                        s.connect(SocketAddrV4::new(SERVER, ECHO_PORT))
                            .map_err(|e| e.to_string())?;
                        s.set_nonblocking(true).map_err(|e| e.to_string())?;
                        Ok(s)
                    })
                    .collect()
            };
            let socks = match setup() {
                Ok(s) => {
                    let _ = tx.send(Ok(()));
                    s
                }
                Err(e) => {
                    let _ = tx.send(Err(e.clone()));
                    return Err(e);
                }
            };
            let mut replies = vec![Vec::new(); socks.len()];
            let mut pfds: Vec<libc::pollfd> = socks
                .iter()
                .map(|s| libc::pollfd {
                    fd: s.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                })
                .collect();
            let mut seq = 0u64;
            let mut next = Instant::now();
            let mut buf = [0u8; 64];
            while !st.load(Ordering::Relaxed) {
                let now = Instant::now();
                if now >= next {
                    seq += 1;
                    for s in &socks {
                        let _ = s.send(&seq.to_be_bytes());
                    }
                    next += every;
                    if next < now {
                        next = now + every;
                    }
                }
                let wait = next.saturating_duration_since(Instant::now());
                let ms = wait.as_millis().clamp(1, 100) as libc::c_int;
                // SAFETY: pfds is a valid array of pollfd for the duration of the call.
                let n = unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, ms) };
                if n <= 0 {
                    continue;
                }
                let t = now_secs();
                for (i, pfd) in pfds.iter_mut().enumerate() {
                    if pfd.revents != 0 {
                        pfd.revents = 0;
                        while socks[i].recv(&mut buf).is_ok() {
                            replies[i].push(t);
                        }
                    }
                }
            }
            Ok(replies)
        });
        rx.recv()
            .map_err(|_| "the probe did not start".to_owned())??;
        Ok(Probe { stop, thread })
    }

    /// Stops the probe; the reply times (seconds since the epoch) of each flow.
    pub(crate) fn finish(self) -> Result<Vec<Vec<f64>>, String> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .join()
            .unwrap_or_else(|_| Err("the probe panicked".into()))
    }
}

/// The UDP port a [`Stream`]'s receiver listens on (on [`SERVER`]).
const STREAM_PORT: u16 = 9998;
/// First client source port of a [`Stream`]'s flows.
const STREAM_PORT_BASE: u16 = 42000;

/// A one-way numbered UDP stream from the client to the server: `count` datagrams at `rate`
/// a second on `flows` source ports, each carrying its number and send time; the receiver
/// notes when each arrived (CHC §7.3's packet-for-packet comparison: an undisturbed chain
/// delivers each exactly once). A `warm-up` datagram goes first, 300 ms ahead (the root
/// resolves the server's address on it). Sender and receiver are threads of this process in
/// the client and server namespaces.
pub(crate) struct Stream {
    count: u32,
    sender: JoinHandle<Result<f64, String>>,
    receiver: JoinHandle<Result<Vec<Arrival>, String>>,
    stop: Arc<AtomicBool>,
}

/// A datagram of a [`Stream`] received: its number, when it was sent and when it arrived
/// (seconds since the epoch).
type Arrival = (u32, f64, f64);

/// What a [`Stream`] came to.
#[derive(Debug, Default)]
pub(crate) struct Streamed {
    /// Datagrams never received.
    pub(crate) lost: u32,
    /// The first few of them.
    pub(crate) missing: Vec<u32>,
    /// Receptions beyond the first of a datagram.
    pub(crate) duplicates: u32,
    /// One-way delay of the received datagrams, ms: median and maximum.
    pub(crate) delay_ms_p50: f64,
    pub(crate) delay_ms_max: f64,
    /// The longest time without any datagram arriving while the stream was sent (until the
    /// last one sent had its median delay to arrive), ms.
    pub(crate) longest_gap_ms: f64,
}

impl Stream {
    pub(crate) fn start(lab: &Lab, count: u32, rate: u32, flows: u16) -> Result<Stream, String> {
        let stop = Arc::new(AtomicBool::new(false));
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let server_ns = lab.server_ns();
        let st = Arc::clone(&stop);
        let receiver = std::thread::spawn(move || -> Result<Vec<Arrival>, String> {
            let bound = enter_ns(&server_ns).and_then(|()| {
                let s = UdpSocket::bind(SocketAddrV4::new(SERVER, STREAM_PORT))
                    .map_err(|e| format!("stream: bind {SERVER}:{STREAM_PORT}: {e}"))?;
                s.set_read_timeout(Some(Duration::from_millis(50)))
                    .map_err(|e| e.to_string())?;
                Ok(s)
            });
            let _ = ready_tx.send(bound.as_ref().map(drop).map_err(Clone::clone));
            let s = bound?;
            let mut got = Vec::new();
            let mut buf = [0u8; 64];
            while !st.load(Ordering::Relaxed) {
                let Ok(n) = s.recv(&mut buf) else { continue };
                if n == 12 {
                    let seq = u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]);
                    let mut t = [0u8; 8];
                    t.copy_from_slice(&buf[4..12]);
                    got.push((seq, f64::from_be_bytes(t), now_secs()));
                }
            }
            Ok(got)
        });
        ready_rx
            .recv()
            .map_err(|_| "the stream's receiver did not start".to_owned())??;
        let client_ns = lab.client_ns();
        let sender = std::thread::spawn(move || -> Result<f64, String> {
            enter_ns(&client_ns)?;
            let socks = (0..flows)
                .map(|k| {
                    let s = UdpSocket::bind(SocketAddrV4::new(CLIENT, STREAM_PORT_BASE + k))
                        .map_err(|e| format!("stream: bind: {e}"))?;
                    s.connect(SocketAddrV4::new(SERVER, STREAM_PORT))
                        .map_err(|e| e.to_string())?;
                    Ok(s)
                })
                .collect::<Result<Vec<_>, String>>()?;
            let _ = socks[0].send(b"warm-up");
            std::thread::sleep(Duration::from_millis(300));
            let start = Instant::now();
            let mut msg = [0u8; 12];
            for seq in 0..count {
                let due = start + Duration::from_secs_f64(f64::from(seq) / f64::from(rate));
                if let Some(wait) = due.checked_duration_since(Instant::now()) {
                    std::thread::sleep(wait);
                }
                msg[..4].copy_from_slice(&seq.to_be_bytes());
                msg[4..].copy_from_slice(&now_secs().to_be_bytes());
                let _ = socks[seq as usize % socks.len()].send(&msg);
            }
            Ok(now_secs())
        });
        Ok(Stream {
            count,
            sender,
            receiver,
            stop,
        })
    }

    /// Waits for the sender, gives the last datagrams `linger` to arrive, and counts.
    pub(crate) fn finish(self, linger: Duration) -> Result<Streamed, String> {
        let sent = self
            .sender
            .join()
            .unwrap_or_else(|_| Err("the stream's sender panicked".into()));
        std::thread::sleep(linger);
        self.stop.store(true, Ordering::Relaxed);
        let got = self
            .receiver
            .join()
            .unwrap_or_else(|_| Err("the stream's receiver panicked".into()))?;
        let ended = sent?;
        let mut times = vec![0u32; self.count as usize];
        let mut delays = Vec::with_capacity(got.len());
        let mut arrivals = Vec::with_capacity(got.len());
        for &(seq, sent, recv) in &got {
            if let Some(t) = times.get_mut(seq as usize) {
                *t += 1;
                if *t == 1 {
                    delays.push((recv - sent) * 1e3);
                    arrivals.push(recv);
                }
            }
        }
        delays.sort_by(f64::total_cmp);
        let p50 = median(&delays);
        arrivals.sort_by(f64::total_cmp);
        if arrivals.last().is_some_and(|&t| t < ended + p50 / 1e3) {
            arrivals.push(ended + p50 / 1e3);
        }
        let missing: Vec<u32> = (0..self.count)
            .filter(|&i| times[i as usize] == 0)
            .collect();
        Ok(Streamed {
            lost: missing.len() as u32,
            missing: missing.into_iter().take(20).collect(),
            duplicates: times.iter().map(|&t| t.saturating_sub(1)).sum(),
            delay_ms_p50: p50,
            delay_ms_max: delays.last().copied().unwrap_or(0.0),
            longest_gap_ms: arrivals
                .windows(2)
                .map(|w| (w[1] - w[0]) * 1e3)
                .fold(0.0, f64::max),
        })
    }
}

/// `len` pseudo-random bytes (xorshift), the body the downloads fetch.
pub(crate) fn content(len: usize) -> Arc<Vec<u8>> {
    let mut x = (len as u64) | 1;
    Arc::new(
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect(),
    )
}

/// The HTTP server of the downloads ([`ClusterLab::serve_paced`]). The pace is the server's:
/// curl 7.88's `--limit-rate` does not hold when the data comes faster than it reads (it
/// drains a full socket buffer at once: 1 MB in 0.7-2 s through Linux's NAT at a limit of
/// 100 kB/s, 10 s through the cluster), so the same downloads would be a different load on
/// different boxes; a sender's pace is the same whatever the box.
pub(crate) struct Paced {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<()>,
}

impl Paced {
    fn start(lab: &Lab, body: Arc<Vec<u8>>, rate: u64) -> Result<Paced, String> {
        let stop = Arc::new(AtomicBool::new(false));
        let st = Arc::clone(&stop);
        let ns = lab.server_ns();
        let (tx, rx) = std::sync::mpsc::channel();
        let thread = std::thread::spawn(move || {
            let listener = enter_ns(&ns).and_then(|()| {
                let l = std::net::TcpListener::bind(SocketAddrV4::new(SERVER, PACED_PORT))
                    .map_err(|e| format!("paced server: bind {SERVER}:{PACED_PORT}: {e}"))?;
                l.set_nonblocking(true).map_err(|e| e.to_string())?;
                Ok(l)
            });
            let listener = match listener {
                Ok(l) => {
                    let _ = tx.send(Ok(()));
                    l
                }
                Err(e) => {
                    let _ = tx.send(Err(e));
                    return;
                }
            };
            while !st.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((conn, _)) => {
                        let (body, st) = (Arc::clone(&body), Arc::clone(&st));
                        std::thread::spawn(move || {
                            let _ = serve_paced_conn(conn, &body, rate, &st);
                        });
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        rx.recv()
            .map_err(|_| "the paced server did not start".to_owned())??;
        Ok(Paced { stop, thread })
    }
}

impl Drop for Paced {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        while !self.thread.is_finished() {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// One response: the request read up to its blank line, then `body` at `rate` bytes per
/// second (a chunk every 20 ms, on a schedule from the first byte: a stall is caught up).
fn serve_paced_conn(
    mut conn: std::net::TcpStream,
    body: &[u8],
    rate: u64,
    stop: &AtomicBool,
) -> std::io::Result<()> {
    use std::io::{Read, Write};
    conn.set_nonblocking(false)?;
    conn.set_read_timeout(Some(Duration::from_secs(10)))?;
    conn.set_write_timeout(Some(Duration::from_secs(60)))?;
    let mut req = Vec::new();
    let mut buf = [0u8; 1024];
    while !req.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = conn.read(&mut buf)?;
        if n == 0 || req.len() > 16384 {
            return Ok(());
        }
        req.extend_from_slice(&buf[..n]);
    }
    let head = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    conn.write_all(head.as_bytes())?;
    let tick = Duration::from_millis(20);
    let chunk = (rate as f64 * tick.as_secs_f64()).max(1.0);
    let start = Instant::now();
    let mut sent = 0usize;
    while sent < body.len() && !stop.load(Ordering::Relaxed) {
        let due = ((start.elapsed().as_secs_f64() / tick.as_secs_f64()).floor() + 1.0) * chunk;
        let due = (due as usize).min(body.len());
        if due > sent {
            conn.write_all(&body[sent..due])?;
            sent = due;
        }
        let next = start + tick.mul_f64((sent as f64 / chunk).floor());
        std::thread::sleep(
            next.saturating_duration_since(Instant::now())
                .max(Duration::from_millis(1)),
        );
    }
    conn.shutdown(std::net::Shutdown::Write)
}

/// The longest silence between two replies of a flow that ends after `from`: (its length,
/// when it ended), seconds; `None` with fewer than two replies.
pub(crate) fn longest_gap_after(replies: &[f64], from: f64) -> Option<(f64, f64)> {
    replies
        .windows(2)
        .filter(|w| w[1] > from)
        .map(|w| (w[1] - w[0], w[1]))
        .max_by(|a, b| a.0.total_cmp(&b.0))
}

/// What a download load asks.
#[derive(Clone)]
pub(crate) struct LoadSpec {
    /// What the paced server sends ([`ClusterLab::serve_paced`]).
    pub(crate) want: Arc<Vec<u8>>,
    /// Downloads running at once.
    pub(crate) concurrency: usize,
    /// Downloads in all (`None`: until stopped).
    pub(crate) total: Option<usize>,
    /// A download slower than 1 kB/s for this long is given up (a broken connection).
    pub(crate) stall_secs: u32,
}

/// What a load did.
#[derive(Debug, Default)]
pub(crate) struct LoadResult {
    /// Downloads that completed with exactly the file.
    pub(crate) ok: usize,
    /// Those that did not: why.
    pub(crate) failed: Vec<String>,
    /// How long each complete download took, seconds.
    pub(crate) secs: Vec<f64>,
    /// From the first start to the last end, seconds.
    pub(crate) elapsed: f64,
}

/// Concurrent `curl` downloads in the client namespace (see [`LoadSpec`]).
pub(crate) struct Load {
    stop: Arc<AtomicBool>,
    started: Arc<AtomicUsize>,
    thread: JoinHandle<LoadResult>,
}

impl Load {
    /// Starts the downloads; each is written under `dir` and compared when it ends.
    pub(crate) fn start(lab: &Lab, dir: &Path, spec: LoadSpec) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let started = Arc::new(AtomicUsize::new(0));
        let (st, sd) = (Arc::clone(&stop), Arc::clone(&started));
        let ns = lab.client_ns();
        let dir = dir.to_owned();
        let thread = std::thread::spawn(move || run_load(&ns, &dir, &spec, &st, &sd));
        Load {
            stop,
            started,
            thread,
        }
    }

    /// Downloads started so far.
    pub(crate) fn started(&self) -> usize {
        self.started.load(Ordering::Relaxed)
    }

    /// Starts no more downloads; waits for those running.
    pub(crate) fn finish(self) -> LoadResult {
        self.stop.store(true, Ordering::Relaxed);
        self.wait()
    }

    /// Waits until every download ended (a load with a total).
    pub(crate) fn wait(self) -> LoadResult {
        self.thread.join().unwrap_or_else(|_| LoadResult {
            failed: vec!["the load thread panicked".into()],
            ..LoadResult::default()
        })
    }
}

fn run_load(
    ns: &str,
    dir: &Path,
    spec: &LoadSpec,
    stop: &AtomicBool,
    started: &AtomicUsize,
) -> LoadResult {
    let url = format!("http://{SERVER}:{PACED_PORT}/download");
    let stall = spec.stall_secs.to_string();
    let mut result = LoadResult::default();
    let mut running: Vec<(Child, PathBuf, Instant)> = Vec::new();
    let mut n = 0usize;
    let t0 = Instant::now();
    loop {
        let more = |n: usize| !stop.load(Ordering::Relaxed) && spec.total.is_none_or(|t| n < t);
        while running.len() < spec.concurrency && more(n) {
            let to = dir.join(format!("dl-{n}"));
            let child = Command::new("ip")
                .args(["netns", "exec", ns])
                .args(["curl", "-sS"])
                .args(["--speed-limit", "1000", "--speed-time", &stall])
                .arg("-o")
                .arg(&to)
                .arg(&url)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn();
            n += 1;
            started.store(n, Ordering::Relaxed);
            match child {
                Ok(c) => running.push((c, to, Instant::now())),
                Err(e) => result.failed.push(format!("#{n}: curl: {e}")),
            }
        }
        if running.is_empty() && !more(n) {
            break;
        }
        let mut i = 0;
        while i < running.len() {
            let done = matches!(running[i].0.try_wait(), Ok(Some(_)) | Err(_));
            if !done {
                i += 1;
                continue;
            }
            let (child, to, at) = running.swap_remove(i);
            let secs = at.elapsed().as_secs_f64();
            let out = child.wait_with_output();
            let got = std::fs::read(&to).unwrap_or_default();
            let _ = std::fs::remove_file(&to);
            match out {
                Ok(o) if o.status.success() && got == *spec.want => {
                    result.ok += 1;
                    result.secs.push(secs);
                }
                Ok(o) => result.failed.push(format!(
                    "{}: {} ({} of {} bytes after {secs:.1} s) {}",
                    to.display(),
                    o.status,
                    got.len(),
                    spec.want.len(),
                    String::from_utf8_lossy(&o.stderr).trim()
                )),
                Err(e) => result.failed.push(format!("{}: {e}", to.display())),
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    result.elapsed = t0.elapsed().as_secs_f64();
    result
}

/// The median and the spread (min, max) of some numbers.
pub(crate) fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    match s.len() {
        0 => 0.0,
        n if n % 2 == 1 => s[n / 2],
        n => (s[n / 2 - 1] + s[n / 2]) / 2.0,
    }
}

/// `a / b`, 0 when `b` is not positive.
pub(crate) fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 {
        a / b
    } else {
        0.0
    }
}
