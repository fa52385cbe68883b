//! `ha`: no single point of failure (CHC §4.1–§5.4, StatelessNF §4.2), each failure measured
//! against the same traffic through the cluster it leaves, in one run of the routed lab
//! (`lab up --routed`: every role on a host of its own behind a router). The chain is the
//! counter NF, the stateful firewall and the NAT on three instances, every packet through
//! them (no fast path, so that the roots carry the traffic).
//!
//! * **Roots scale** (`ratios.two_roots_vs_one_goodput`): iperf3 TCP with `streams` parallel
//!   connections through one root, then through two (`Lab::second_root`: a second root host,
//!   the client's and the server's routes multipath, hashed on the 5-tuple), each its own
//!   clock space and packet log; the goal is 1.6. The cores each role used meanwhile are
//!   `metrics.{one_root,two_roots}_cores_ROLE`.
//! * **A root killed** (`metrics.root_kill_failed_downloads`, goal 0;
//!   `metrics.root_kill_failover_gap_ms`, `root_kill_outage_ms`): `downloads` verified HTTP
//!   downloads and 16 UDP probe flows (a datagram every 10 ms each, for 10 s after each kill)
//!   through both roots; half-way, the second root's process is killed (-9). Its flows move
//!   to the first when the upstream's path check (ARP every 100 ms, 3 misses) takes its path
//!   out. Each failure's gap is the largest over the probe flows of the time from the kill to
//!   the reply that ends a flow's longest silence after it ([`flowstate_lab::failover_gap`]),
//!   its outage the longest silence itself.
//! * **The leading controller killed** (`metrics.controller_takeover_ms`,
//!   `metrics.controller_kill_failed_downloads`, `controller_kill_{failover_gap,outage}_ms`):
//!   the same cluster with a standby controller on the second root's host; the leader is
//!   killed (-9) under the same downloads and probes; the takeover is the time from the kill
//!   to the standby leading in the next term with the root applying that term's assignment
//!   (status polled every 20 ms; the lease is 1 s). Then an instance is killed:
//!   `metrics.instance_failover_after_takeover_ms` until the new leader gave its partitions
//!   to the others.
//! * **Durability's cost** (`ratios.durable_vs_async_commit_goodput`): state on a Redis
//!   Cluster of 3 masters + 3 replicas (`scripts/redis-cluster` on the store's host), iperf3
//!   as above with every commit acknowledged once a replica holds it (`wait_replicas = 1`)
//!   against the same without (`wait_replicas = 0`).
//! * **A store node killed** (`metrics.store_node_kill_failed_downloads`, goal 0;
//!   `metrics.store_node_kill_lost_updates` and `store_node_kill_double_updates`, goal 0;
//!   `store_node_kill_{failover_gap,outage}_ms`): on the durable Redis Cluster, the downloads,
//!   the probes and a numbered UDP stream; half-way the master serving the counter's total is
//!   killed (-9) and its replica promoted. The counter must equal the packets the root logged
//!   that ran through the chain: `lost_updates` counts those missing from it, `double_updates`
//!   those beyond every packet the root logged. New connections whose state the failover
//!   withheld are refused (fail closed) by the firewall or the NAT:
//!   `store_node_kill_refused_packets`.
//!
//! Needs root, iproute2, curl, iperf3, python3 and redis-server (scripts/setup-live,
//! scripts/setup); without them the report carries `params.error`.

use crate::cluster_lab::{
    content, live, longest_gap_after, now_secs, owner_of, probe_ports, ratio, ClusterLab, CpuMeter,
    Load, LoadSpec, Probe, Stream, PARTITIONS,
};
use crate::failover::{downloads, wait_half};
use crate::{Effort, Report};
use flowstate_lab::System;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Probe datagrams: one every 10 ms on each flow.
const PROBE_EVERY: Duration = Duration::from_millis(10);
/// How long the probes run after a kill (Redis Cluster's failover takes seconds).
const PROBE_AFTER_KILL: Duration = Duration::from_secs(10);

struct Params {
    downloads: usize,
    concurrency: usize,
    file_bytes: usize,
    rate: u64,
    iperf_secs: u32,
    streams: u32,
    stream_count: u32,
    stream_rate: u32,
}

pub(crate) fn run(effort: Effort) -> Report {
    let p = match effort {
        Effort::Full => Params {
            downloads: 100,
            concurrency: 100,
            file_bytes: 1_500_000,
            rate: 200_000,
            iperf_secs: 5,
            streams: 8,
            stream_count: 24_000,
            stream_rate: 4_000,
        },
        Effort::Quick => Params {
            downloads: 40,
            concurrency: 40,
            file_bytes: 600_000,
            rate: 200_000,
            iperf_secs: 2,
            streams: 8,
            stream_count: 12_000,
            stream_rate: 4_000,
        },
    };
    let mut report = Report::new("ha");
    report
        .param("downloads", p.downloads as u64)
        .param("concurrency", p.concurrency as u64)
        .param("file_bytes", p.file_bytes as u64)
        .param("rate_bytes_per_s", p.rate)
        .param("instances", 3)
        .param("partitions", u64::from(PARTITIONS))
        .param("chain", "counter -> firewall -> nat")
        .param("fast_path", "off")
        .param("iperf_secs", p.iperf_secs)
        .param("iperf_streams", p.streams)
        .param("stream", format!("{} datagrams at {}/s", p.stream_count, p.stream_rate))
        .param(
            "probe",
            "16 UDP flows, a datagram every 10 ms each; gap: kill -> reply ending the longest silence, largest over the flows",
        );
    let started = Instant::now();
    let result = ClusterLab::up_routed("h", 3).and_then(|lab| {
        let r = roots_and_controllers(&lab, &p, &mut report)
            .and_then(|()| store_node(&lab, &p, &mut report));
        let _ = lab.lab.second_root(&mut System::default(), false);
        r
    });
    report.metric("run_secs", started.elapsed().as_secs_f64());
    if let Err(e) = result {
        eprintln!("ha: {e}");
        report.param("error", e);
    }
    report
}

/// The deployment: the chain on three instances, no fast path, `roots` (one or two roots, the
/// controllers the same list), state in `state` (a `[state]` section's keys).
fn config(two: bool, state: &str, store: &str) -> String {
    let (root, second) = (flowstate_lab::ROOT_ADDR, flowstate_lab::ROOT2_ADDR);
    let roles = if two {
        format!("address = [\"{root}\", \"{second}\"]\ncontroller = [\"{root}\", \"{second}\"]\n")
    } else {
        String::new()
    };
    format!(
        "[input]\ninterface = \"{}\"\naddress = \"10.0.0.1\"\nfast_path = false\n\
         [output]\ninterface = \"{}\"\naddress = \"{}\"\n\
         [runtime]\ninside = [\"10.0.0.0/24\"]\n\
         [state]\n{state}\
         [cluster]\npartitions = {PARTITIONS}\ninstances = 3\nstore = \"{store}\"\n{roles}\
         [[chain]]\nnf = \"counter\"\n\
         [[chain]]\nnf = \"firewall\"\ndefault_outbound = \"allow\"\ndefault_inbound = \"deny\"\n\
         [[chain]]\nnf = \"nat\"\nexternal = [\"{}\"]\nports = \"20000-59999\"\n",
        flowstate_lab::NF_INSIDE_IF,
        flowstate_lab::NF_OUTSIDE_IF,
        flowstate_lab::BOX_OUTSIDE,
        flowstate_lab::BOX_OUTSIDE,
    )
}

/// Our store on the store's host (`store = "managed"`).
fn our_store() -> String {
    format!(
        "backend = \"store\"\nurl = \"{}:7878\"\n",
        flowstate_lab::STORE_ADDR
    )
}

/// Roles started by hand on the second root's host, as its supervisor would: the second root
/// and the standby controller. Killed when dropped.
struct SecondHost {
    root: Option<Child>,
    controller: Option<Child>,
    socket: PathBuf,
}

impl SecondHost {
    /// Starts them with `text` (the lab's key and store token added, as that host would
    /// have them) and waits until the root is ready.
    fn start(lab: &ClusterLab, text: &str) -> Result<SecondHost, String> {
        let files = lab.lab.state_dir().join("cluster");
        let text = text
            .replacen(
                "[state]\n",
                &format!(
                    "[state]\ntoken_file = \"{}\"\n",
                    files.join("store.token").display()
                ),
                1,
            )
            .replacen(
                "[cluster]\n",
                &format!(
                    "[cluster]\nkey_file = \"{}\"\n",
                    files.join("cluster.key").display()
                ),
                1,
            );
        let path = lab.scratch("second-host.toml");
        std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
        let ns = lab.lab.second_root_ns();
        let stats = lab.scratch("root-1.json");
        let _ = std::fs::remove_file(&stats);
        let socket = lab.scratch("controller-1.sock");
        let mut host = SecondHost {
            root: None,
            controller: None,
            socket: socket.clone(),
        };
        let cfg = path.to_string_lossy().into_owned();
        host.root = Some(spawn(
            lab,
            &ns,
            &["root", &cfg, "--stats", &stats.to_string_lossy()],
            "root-1.log",
        )?);
        host.controller = Some(spawn(
            lab,
            &ns,
            &["controller", &cfg, "--socket", &socket.to_string_lossy()],
            "controller-1.log",
        )?);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let ready = std::fs::read_to_string(&stats)
                .ok()
                .and_then(|t| serde_json::from_str::<Value>(&t).ok())
                .and_then(|v| v["ready_ms"].as_f64())
                .is_some_and(|ms| ms > 0.0);
            if ready {
                return Ok(host);
            }
            if Instant::now() > deadline {
                return Err("the second root is not ready within 20 s (root-1.log)".into());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn kill_root(&mut self) {
        kill(&mut self.root);
    }
}

impl Drop for SecondHost {
    fn drop(&mut self) {
        kill(&mut self.root);
        kill(&mut self.controller);
    }
}

fn kill(c: &mut Option<Child>) {
    if let Some(mut c) = c.take() {
        let _ = c.kill();
        let _ = c.wait();
    }
}

/// `flowstate ARGS` in namespace `ns`, its output into `log` in the scratch directory.
fn spawn(lab: &ClusterLab, ns: &str, args: &[&str], log: &str) -> Result<Child, String> {
    let exe = std::env::current_exe().map_err(|e| format!("finding this binary: {e}"))?;
    let log = std::fs::File::create(lab.scratch(log)).map_err(|e| e.to_string())?;
    Command::new("ip")
        .args(["netns", "exec", ns])
        .arg(exe)
        .args(args)
        .stdin(Stdio::null())
        .stdout(log.try_clone().map_err(|e| e.to_string())?)
        .stderr(log)
        .spawn()
        .map_err(|e| format!("starting flowstate {}: {e}", args.join(" ")))
}

/// SIGKILL of `pid`; when it was sent, seconds since the epoch.
fn kill_pid(pid: u32) -> Result<f64, String> {
    let at = now_secs();
    // SAFETY: kill(2) with a pid read from the role's own pid file.
    if unsafe { libc::kill(pid as i32, libc::SIGKILL) } != 0 {
        return Err(format!("kill {pid}: {}", std::io::Error::last_os_error()));
    }
    Ok(at)
}

fn roots_and_controllers(lab: &ClusterLab, p: &Params, report: &mut Report) -> Result<(), String> {
    eprintln!(
        "ha: goodput through one root ({} iperf3 streams)",
        p.streams
    );
    lab.cluster_up("one-root", &config(false, &our_store(), "managed"))?;
    lab.wait_settled(3, 30)?;
    let one = goodput(lab, p, &[], "one_root", report)?;
    lab.cluster_down()?;

    eprintln!("ha: goodput through two roots");
    let text = config(true, &our_store(), "managed");
    lab.cluster_up("two-roots", &text)?;
    lab.lab
        .second_root(&mut System::default(), true)
        .map_err(|e| e.to_string())?;
    let mut second = SecondHost::start(lab, &text)?;
    lab.wait_settled(3, 30)?;
    let root1 = second.root.as_ref().map(|c| ("root-1".to_owned(), c.id()));
    let two = goodput(lab, p, root1.as_slice(), "two_roots", report)?;
    report.ratio("two_roots_vs_one_goodput", ratio(two, one));

    let want = content(p.file_bytes);
    let _server = lab.serve_paced(Arc::clone(&want), p.rate)?;
    let spec = LoadSpec {
        want,
        concurrency: p.concurrency,
        total: Some(p.downloads),
        stall_secs: 20,
    };
    let dl_dir = lab.scratch("downloads");
    std::fs::create_dir_all(&dl_dir).map_err(|e| format!("{}: {e}", dl_dir.display()))?;
    let ports = probe_ports()?;

    eprintln!(
        "ha: one of two roots killed under {} downloads",
        p.downloads
    );
    let load = Load::start(&lab.lab, &dl_dir, spec.clone());
    let probe = Probe::start(&lab.lab, &ports, PROBE_EVERY)?;
    wait_half(&load, p.downloads);
    let root1 = second
        .root
        .as_ref()
        .map(Child::id)
        .ok_or("the second root is not running")?;
    let kill_at = kill_pid(root1)?;
    second.kill_root();
    std::thread::sleep(PROBE_AFTER_KILL);
    let replies = probe.finish()?;
    gaps(report, "root_kill_", &replies, kill_at);
    downloads(report, "root_kill_", &load.wait(), p.downloads);

    eprintln!(
        "ha: the leading controller killed under {} downloads",
        p.downloads
    );
    let load = Load::start(&lab.lab, &dl_dir, spec);
    let probe = Probe::start(&lab.lab, &ports, PROBE_EVERY)?;
    wait_half(&load, p.downloads);
    let leader = lab
        .role_pid("controller")
        .ok_or("the leading controller is not running")?;
    let term = lab.status()?["leader"]["term"].as_u64().unwrap_or(0);
    let killed = Instant::now();
    let kill_at = kill_pid(leader)?;
    let standby = |ok: &dyn Fn(&Value) -> bool, what: &str| -> Result<Value, String> {
        poll(&second.socket, lab, 20, what, ok)
    };
    standby(
        &|s| {
            s["leader"]["me"] == true
                && s["leader"]["term"].as_u64() > Some(term)
                && s["root"]["assignment_terms"][0] == s["leader"]["term"]
        },
        "the standby leading, its term applied by the root",
    )?;
    report.metric(
        "controller_takeover_ms",
        killed.elapsed().as_secs_f64() * 1e3,
    );
    std::thread::sleep(PROBE_AFTER_KILL);
    let replies = probe.finish()?;
    gaps(report, "controller_kill_", &replies, kill_at);
    let victim = (1..=3u64)
        .find(|&k| lab.role_pid(&format!("instance-{k}")).is_some())
        .ok_or("no instance runs")?;
    let pid = lab
        .role_pid(&format!("instance-{victim}"))
        .ok_or("the instance stopped")?;
    let failing = Instant::now();
    kill_pid(pid)?;
    standby(
        &|s| {
            !live(s).contains(&victim)
                && (0..PARTITIONS).all(|q| owner_of(s, q).is_some_and(|o| o != victim))
        },
        "the killed instance's partitions with the others",
    )?;
    report.metric(
        "instance_failover_after_takeover_ms",
        failing.elapsed().as_secs_f64() * 1e3,
    );
    downloads(report, "controller_kill_", &load.wait(), p.downloads);
    drop(second);
    lab.cluster_down()?;
    lab.lab
        .second_root(&mut System::default(), false)
        .map_err(|e| e.to_string())
}

/// iperf3 goodput (`NAME_goodput_mbps`) and the cores each role used meanwhile
/// (`NAME_cores_ROLE`, `more` beside the lab's own roles): what bounds it.
fn goodput(
    lab: &ClusterLab,
    p: &Params,
    more: &[(String, u32)],
    name: &str,
    report: &mut Report,
) -> Result<f64, String> {
    let roles = || [lab.roles(), more.to_vec()].concat();
    let meter = CpuMeter::start(&roles());
    let (bps, _) = lab.iperf3_streams(p.iperf_secs, p.streams)?;
    for (group, cores) in meter.cores(&roles()) {
        report.metric(&format!("{name}_cores_{group}"), cores);
    }
    report.metric(&format!("{name}_goodput_mbps"), bps / 1e6);
    Ok(bps)
}

/// Polls the status of the controller at `socket` until `ok` holds (at most `secs`).
fn poll(
    socket: &Path,
    lab: &ClusterLab,
    secs: u64,
    what: &str,
    ok: &dyn Fn(&Value) -> bool,
) -> Result<Value, String> {
    let deadline = Instant::now() + Duration::from_secs(secs);
    let sock = socket.to_string_lossy();
    loop {
        let s = lab
            .flowstate(&["cluster", "status", "--json", "--socket", &sock])
            .and_then(|o| serde_json::from_str::<Value>(&o).map_err(|e| e.to_string()));
        if let Ok(s) = &s {
            if ok(s) {
                return Ok(s.clone());
            }
        }
        if Instant::now() > deadline {
            return Err(format!("{what}: not within {secs} s; last status {s:?}"));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The Redis Cluster of `scripts/redis-cluster` on the store's host; stopped when dropped.
struct RedisCluster<'a> {
    lab: &'a ClusterLab,
    run: PathBuf,
}

impl<'a> RedisCluster<'a> {
    fn start(lab: &'a ClusterLab) -> Result<RedisCluster<'a>, String> {
        let r = RedisCluster {
            lab,
            run: lab.scratch("redis-cluster"),
        };
        r.script("start")?;
        Ok(r)
    }

    fn script(&self, action: &str) -> Result<String, String> {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/redis-cluster");
        let out = Command::new("ip")
            .args(["netns", "exec", &self.lab.lab.store_ns(), "env"])
            .arg(format!(
                "REDIS_CLUSTER_ADDRESS={}",
                flowstate_lab::STORE_ADDR
            ))
            .arg(format!("FLOWSTATE_RUN_DIR={}", self.run.display()))
            .args(["bash", script, action])
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("{script}: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "scripts/redis-cluster {action}: {}{}",
                String::from_utf8_lossy(&out.stdout).trim(),
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// `redis-cli ARGS` against node `port`, from the store's host.
    fn cli(&self, port: u16, args: &[&str]) -> String {
        Command::new("ip")
            .args(["netns", "exec", &self.lab.lab.store_ns(), "redis-cli", "-h"])
            .arg(flowstate_lab::STORE_ADDR.to_string())
            .args(["-p", &port.to_string()])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    }

    /// The port of the live master serving `slot`, as node `via` sees the cluster.
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

    /// Empties every master (and so its replica): the next deployment starts afresh, as a
    /// new cluster would.
    fn flush(&self) {
        for port in 7001..=7006 {
            if self.cli(port, &["role"]).starts_with("master") {
                self.cli(port, &["flushall"]);
            }
        }
    }

    fn pid(&self, port: u16) -> Result<u32, String> {
        let f = self.run.join(format!("redis-cluster-{port}/redis.pid"));
        std::fs::read_to_string(&f)
            .ok()
            .and_then(|t| t.trim().parse().ok())
            .ok_or_else(|| format!("no pid in {}", f.display()))
    }
}

impl Drop for RedisCluster<'_> {
    fn drop(&mut self) {
        let _ = self.script("stop");
    }
}

fn store_node(lab: &ClusterLab, p: &Params, report: &mut Report) -> Result<(), String> {
    let redis = RedisCluster::start(lab)?;
    let nodes: Vec<String> = (7001..=7003)
        .map(|port| format!("\"redis://{}:{port}\"", flowstate_lab::STORE_ADDR))
        .collect();
    let state = |wait: u32| {
        format!(
            "backend = \"redis-cluster\"\nnodes = [{}]\nwait_replicas = {wait}\n",
            nodes.join(", ")
        )
    };
    let mut goodput = [0.0; 2];
    for (i, wait) in [0, 1].into_iter().enumerate() {
        eprintln!("ha: goodput on Redis Cluster, wait_replicas = {wait}");
        redis.flush();
        lab.cluster_up(
            &format!("redis-wait-{wait}"),
            &config(false, &state(wait), "external"),
        )?;
        lab.wait_settled(3, 30)?;
        let name = format!("redis_cluster_wait_{wait}");
        goodput[i] = self::goodput(lab, p, &[], &name, report)?;
        if wait == 0 {
            lab.cluster_down()?;
        }
    }
    report.ratio(
        "durable_vs_async_commit_goodput",
        ratio(goodput[1], goodput[0]),
    );

    eprintln!(
        "ha: a Redis Cluster master killed under {} downloads",
        p.downloads
    );
    let slot: u64 = redis
        .cli(7001, &["cluster", "keyslot", "counter"])
        .trim()
        .parse()
        .map_err(|e| format!("cluster keyslot: {e}"))?;
    let victim = redis
        .master_of(7001, slot)
        .ok_or("no master serves the counter's slot")?;
    // What the cluster counted and logged so far (the goodput runs'): the kill's are beyond.
    let counter = || -> Result<u64, String> {
        let at = redis
            .master_of(7001, slot)
            .or_else(|| redis.master_of(7002, slot))
            .ok_or("no master serves the counter's slot")?;
        let got = redis.cli(at, &["-c", "get", "{counter}@Counter@packets"]);
        got.trim()
            .parse()
            .map_err(|e| format!("the counter ({got:?}): {e}"))
    };
    let root_counts = |s: &Value| {
        let at = |k: &str| s["root"][k].as_u64().unwrap_or(0);
        let ran = at("log_finished") + at("log_deleted") + at("outputs_missing");
        (at("log_packets"), ran)
    };
    let settled = |lab: &ClusterLab| -> Result<(u64, u64), String> {
        lab.wait_for(30, "every packet finished", |s| {
            s["root"]["log_live"] == 0 && s["root"]["moving"] == 0
        })?;
        // The root's counters as its stats file has them a while after the last packet.
        std::thread::sleep(Duration::from_secs(1));
        Ok(root_counts(&lab.status()?))
    };
    let (logged0, ran0) = settled(lab)?;
    let counted0 = counter()?;
    let want = content(p.file_bytes);
    let _server = lab.serve_paced(Arc::clone(&want), p.rate)?;
    let dl_dir = lab.scratch("downloads");
    std::fs::create_dir_all(&dl_dir).map_err(|e| format!("{}: {e}", dl_dir.display()))?;
    let probe = Probe::start(&lab.lab, &probe_ports()?, PROBE_EVERY)?;
    let load = Load::start(
        &lab.lab,
        &dl_dir,
        LoadSpec {
            want,
            concurrency: p.concurrency,
            total: Some(p.downloads),
            stall_secs: 20,
        },
    );
    let stream = Stream::start(&lab.lab, p.stream_count, p.stream_rate, 16)?;
    wait_half(&load, p.downloads);
    let kill_at = kill_pid(redis.pid(victim)?)?;
    std::thread::sleep(PROBE_AFTER_KILL);
    let replies = probe.finish()?;
    gaps(report, "store_node_kill_", &replies, kill_at);
    downloads(report, "store_node_kill_", &load.wait(), p.downloads);
    let streamed = stream.finish(Duration::from_secs(1))?;
    report.metric("store_node_kill_stream_lost", f64::from(streamed.lost));
    report.metric(
        "store_node_kill_stream_duplicates",
        f64::from(streamed.duplicates),
    );
    let (logged, ran) = settled(lab)?;
    let (logged, ran) = (logged - logged0, ran - ran0);
    let counted = counter()?.saturating_sub(counted0);
    report.metric("store_node_kill_logged_packets", logged as f64);
    report.metric("store_node_kill_counted_packets", counted as f64);
    report.metric(
        "store_node_kill_lost_updates",
        ran.saturating_sub(counted) as f64,
    );
    report.metric(
        "store_node_kill_double_updates",
        counted.saturating_sub(logged) as f64,
    );
    let refused: u64 = (1..=3)
        .filter_map(|k| lab.instance_file(k))
        .flat_map(|i| {
            ["connection state unavailable", "nat: state error"]
                .map(|why| i["drop_reasons"][why].as_u64().unwrap_or(0))
        })
        .sum();
    report.metric("store_node_kill_refused_packets", refused as f64);
    lab.cluster_down()?;
    drop(redis);
    Ok(())
}

/// Over the probe flows answered before the kill, the largest failover gap
/// (`PREFIXfailover_gap_ms`: from the kill to the reply ending a flow's longest silence after
/// it; for a flow that never stopped, the time until its longest hiccup, however short) and
/// the longest silence itself (`PREFIXoutage_ms`: what a client saw), ms. A flow never
/// answered after the kill counts the whole probe time after it (a lower bound). Flows not
/// answered before the kill are counted apart (`PREFIXprobe_flows_new`).
fn gaps(report: &mut Report, prefix: &str, replies: &[Vec<f64>], kill_at: f64) {
    let never = PROBE_AFTER_KILL.as_secs_f64() * 1e3;
    let (mut gap, mut outage, mut new) = (0.0f64, 0.0f64, 0);
    for r in replies {
        if !r.first().is_some_and(|&t| t <= kill_at) {
            new += 1;
            continue;
        }
        gap = gap
            .max(flowstate_lab::failover_gap(r, kill_at).map_or(never, |d| d.as_secs_f64() * 1e3));
        outage = outage.max(longest_gap_after(r, kill_at).map_or(never, |(s, _)| s * 1e3));
    }
    report.metric(&format!("{prefix}failover_gap_ms"), gap);
    report.metric(&format!("{prefix}outage_ms"), outage);
    report.metric(&format!("{prefix}probe_flows_new"), f64::from(new));
}
