//! `failover`: StatelessNF §7.3 (Fig. 8) in the namespace lab. HTTP downloads through a
//! stateful firewall and a NAT (the chain of `examples/cluster.toml`) on a cluster of three
//! instances and a warm standby (`standby = 1`: the killed instance's partitions go to it,
//! and its replacement stands by) whose state is in our store (`backend = "store"`,
//! `store = "managed"`); one instance is killed (`flowstate cluster kill`, SIGKILL)
//! half-way through. Then the same
//! downloads through Linux's HA NAT (two routers: nftables SNAT, keepalived VRRP every 100 ms,
//! conntrackd FTFW; [`flowstate_lab::Lab::kernel_ha`]) with its primary crashed half-way
//! ([`flowstate_lab::Lab::kill_ha_primary`]).
//!
//! * **Downloads**: `downloads` in all, `concurrency` at once, each a `curl` of
//!   `file_bytes` pseudo-random bytes from an HTTP server in the server namespace that paces
//!   every response at `rate_bytes_per_s` (the same load whatever the box: see
//!   `cluster_lab::Paced`), compared byte for byte; a
//!   download that fails, or moves less than 1 kB/s for 20 s (a connection the box lost), is
//!   failed (`metrics.failed_downloads`, `metrics.peer_failed_downloads`; StatelessNF's
//!   paper counts completed downloads). The kill comes when half of them have started.
//! * **Failover gap** (`metrics.failover_gap_ms`, `metrics.peer_failover_gap_ms`), as a client
//!   sees it: 16 UDP probe flows, one whose NAT partition is each of the cluster's 16
//!   partitions (their source ports are chosen with the root's own steering), send a datagram
//!   every 10 ms to an echo server behind the box; each reply's arrival time is recorded. A
//!   flow's gap is the time from the kill to the reply that ends its longest silence after the
//!   kill ([`flowstate_lab::failover_gap`]). On the cluster, the moved flows are those whose
//!   partition the killed instance owned (the instance with the most partitions is killed);
//!   through Linux's pair every flow moves. Each side's gap is the **largest** over its moved
//!   flows (the median is `*_failover_gap_ms_median`). Both kills are timed right before
//!   their first signal: the instance is killed as `flowstate cluster kill` does it (SIGKILL
//!   of the process in its pid file; the command itself, a process start and a request to
//!   the controller, takes 30-110 ms on the loaded machine, which is no part of the
//!   failover), Linux's primary as [`flowstate_lab::Lab::kill_ha_primary`] crashes it
//!   (SIGSTOP of every process in the router's namespace, links down, SIGKILL).
//!   `ratios.failover_gap_vs_conntrackd` = the peer's gap / ours. The gap counts, for a flow
//!   that never stopped, the time until its longest hiccup after the kill, however short;
//!   `metrics.failover_outage_ms` (and `peer_`, `slow_path_`) is the longest silence itself,
//!   the outage a client saw, and `ratios.failover_outage_vs_conntrackd` their ratio.
//! * **Without the root's fast path**: the failover runs with the cluster's defaults, where
//!   the root's XDP fast path (`flowstate_cluster::fast`) keeps forwarding established flows
//!   while their partitions are taken over. The same kill is then repeated on a cluster whose
//!   every packet goes through the instances (`fast_path = false`), with the probe flows
//!   only: `metrics.slow_path_failover_gap_ms` (largest over the moved flows) and its median.
//! * **Goodput before the kill**: iperf3 TCP through the single live box (`flowstate run`
//!   with the same chain in the box's namespace, state on the local store) and through a
//!   one-instance cluster, each with its XDP fast path (their default) and without it:
//!   `ratios.cluster_vs_box_goodput` (both as they run by default),
//!   `ratios.cluster_vs_box_slow_path_goodput` (both without a fast path). The cores each of
//!   the cluster's processes used meanwhile are `metrics.cluster_cores_*` and
//!   `metrics.cluster_slow_path_cores_*`; the root's CPU time per packet it took from its
//!   ports, `metrics.root_ns_per_packet` (without the fast path; `metrics.NAME_root_ns_per_packet`
//!   for each variant below). The same chain cut into two stages (firewall, then
//!   NAT: `examples/cluster-stages.toml`), one instance each, without the fast path:
//!   `ratios.two_stages_vs_one_slow_path_goodput` against the one-instance cluster (every
//!   packet takes one more hop through the root and one more instance). What the root's
//!   packet log (CHC §5: a copy of every packet and of every output it holds until the
//!   commit's notice) costs: `ratios.slow_path_goodput_log_vs_no_log`, the one-instance
//!   cluster without the fast path against the same with `log_packets = 0`. What signing
//!   and checking every datagram between the roles costs ([`flowstate_cluster::auth`]):
//!   `ratios.authenticated_vs_plain_slow_path_goodput`, the one-instance cluster without the
//!   fast path against the same with `unauthenticated = true` (two runs each, in the order
//!   signed, unsigned, unsigned, signed; the ratio of the sums; the slow path's goodput in
//!   the other ratios is the signed runs' mean), and, in this process,
//!   `metrics.auth_seal_open_ns_{64,1514}` (one datagram signed and checked, a
//!   datagram encrypted in place and tagged with AES-256-GCM: see flowstate_cluster::auth)
//!   beside `metrics.auth_plain_seal_open_ns_{64,1514}` (the same trailer, no tag).
//!
//! * **Hosts in a routed lab** (`lab up --routed`: the root's, each instance's and the
//!   store's host on subnets of their own behind a router; the lab's launcher acts as each
//!   host's supervisor, starting an instance only where none runs and killing none): three
//!   instances, every packet through them (no fast path), the same downloads twice. While
//!   the first run goes, the fourth host, which holds no key, sends every kind of datagram
//!   the roles take ([`flowstate_lab::forger`]): `metrics.forged_sent`, `forged_refused` (the
//!   roles' refusal counters meanwhile), `forged_accepted` (sent, not refused: 0) and
//!   `forged_members` (the made-up instance among the members: 0). Half-way, the host of the
//!   instance owning the most partitions dies (every process of it killed, then its link
//!   cut at the router): `metrics.host_kill_failed_downloads`. In the second run that host
//!   is cut off instead, its processes alive (its way to the store 300 ms before the rest,
//!   so that a commit is on the wire), and put back once its partitions moved:
//!   `metrics.host_cut_failed_downloads`, `metrics.fenced_commits` (the cut-off instance's
//!   commits the store refused), `host_cut_failover_ms`, `host_cut_rejoined` (1 when it came
//!   back as a member with partitions) and `host_cut_rejoin_ms`.
//!
//! Needs root, iproute2, curl, iperf3, python3, keepalived and conntrackd
//! (scripts/setup-live); without them the report carries `params.error`.

use crate::cluster_lab::{
    cluster_config, content, cpu_seconds, live, median, now_secs, owner_of, probe_ports, ratio,
    root_counter, staged_config, ClusterLab, CpuMeter, Load, LoadResult, LoadSpec, Probe,
};
use crate::{Effort, Report};
use flowstate_lab::{Cut, RoutedHost, System};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Probe datagrams per flow and second (every 10 ms).
const PROBE_EVERY: Duration = Duration::from_millis(10);
/// How long the probe runs after the kill.
const PROBE_AFTER_KILL: Duration = Duration::from_secs(4);

struct Params {
    downloads: usize,
    concurrency: usize,
    file_bytes: usize,
    rate: u64,
    iperf_secs: u32,
}

pub(crate) fn run(effort: Effort) -> Report {
    let p = match effort {
        Effort::Full => Params {
            downloads: 500,
            concurrency: 100,
            file_bytes: 1_000_000,
            rate: 100_000,
            iperf_secs: 5,
        },
        Effort::Quick => Params {
            downloads: 60,
            concurrency: 30,
            file_bytes: 200_000,
            rate: 100_000,
            iperf_secs: 2,
        },
    };
    let mut report = Report::new("failover");
    report
        .param("downloads", p.downloads as u64)
        .param("concurrency", p.concurrency as u64)
        .param("file_bytes", p.file_bytes as u64)
        .param("rate_bytes_per_s", p.rate)
        .param("instances", 3)
        .param("partitions", u64::from(crate::cluster_lab::PARTITIONS))
        .param("chain", "firewall -> nat")
        .param("state", "store (managed)")
        .param(
            "probe",
            "16 UDP flows (one per partition), a datagram every 10 ms each",
        )
        .param(
            "failover_gap",
            "kill -> reply ending the longest silence, largest over the moved probe flows",
        )
        .param(
            "peer",
            "Linux HA NAT: nftables SNAT + keepalived (VRRP 100 ms) + conntrackd FTFW",
        )
        .param("iperf_secs", p.iperf_secs);
    if let Some(load) = loadavg() {
        report.metric("loadavg_1m_start", load);
    }
    let started = Instant::now();
    let result = ClusterLab::up("f", 4)
        .and_then(|lab| measure(&lab, &p, &mut report))
        .and_then(|()| ClusterLab::up_routed("r", 4))
        .and_then(|lab| host_faults(&lab, &p, &mut report));
    report.metric("run_secs", started.elapsed().as_secs_f64());
    if let Err(e) = result {
        eprintln!("failover: {e}");
        report.param("error", e);
    }
    report
}

pub(crate) fn loadavg() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

fn measure(lab: &ClusterLab, p: &Params, report: &mut Report) -> Result<(), String> {
    let want = content(p.file_bytes);
    let _server = lab.serve_paced(Arc::clone(&want), p.rate)?;
    let ports = probe_ports()?;
    let spec = LoadSpec {
        want,
        concurrency: p.concurrency,
        total: Some(p.downloads),
        stall_secs: 20,
    };

    // Goodput: the single live box, with and without its fast path, then a one-instance
    // cluster.
    eprintln!("failover: goodput through the single box");
    let mut box_bps = [0.0; 2];
    for (i, fast) in [true, false].into_iter().enumerate() {
        let b = lab.box_up(fast)?;
        let meter = CpuMeter::start(&[("box".to_owned(), b.pid())]);
        let (bps, retr) = lab.iperf3(p.iperf_secs)?;
        let name = if fast { "box" } else { "box_slow_path" };
        report.metric(&format!("{name}_goodput_mbps"), bps / 1e6);
        report.metric(&format!("{name}_tcp_retransmits"), retr);
        report.metric(
            &format!("{name}_cores"),
            meter.cores(&[]).values().sum::<f64>(),
        );
        box_bps[i] = bps;
        drop(b);
    }
    // A one-instance cluster without the root's fast path and without its packet log; then
    // without the fast path, signed (the default) and unsigned in the order A B B A, so that
    // a drift of the machine's load over the runs weighs on both alike; then with the fast
    // path (the default, which then goes on to the failover).
    let variants = [
        ("cluster_slow_path_no_log", false, "log_packets = 0\n"),
        ("cluster_slow_path", false, ""),
        (
            "cluster_slow_path_unauthenticated",
            false,
            "unauthenticated = true\n",
        ),
        (
            "cluster_slow_path_unauthenticated_2",
            false,
            "unauthenticated = true\n",
        ),
        ("cluster_slow_path_2", false, ""),
        ("cluster", true, ""),
    ];
    let mut cluster_bps = [0.0; 6];
    for (i, (name, fast, log)) in variants.into_iter().enumerate() {
        eprintln!("failover: goodput through a one-instance cluster ({name})");
        let config = cluster_config(1, "claim", fast).replacen(
            "[cluster]\n",
            &format!("[cluster]\n{log}"),
            1,
        );
        lab.cluster_up(name, &config)?;
        lab.wait_settled(1, 30)?;
        let meter = CpuMeter::start(&lab.roles());
        let root = lab.role_pid("root").map(|pid| (pid, cpu_seconds(pid)));
        let received = root_counter(&lab.status()?, "received");
        let (bps, retr) = lab.iperf3(p.iperf_secs)?;
        for (group, cores) in meter.cores(&lab.roles()) {
            report.metric(&format!("{name}_cores_{group}"), cores);
        }
        // The root's CPU time per packet it took from its ports (each also comes back from
        // the instance and leaves by the other port).
        if let Some((pid, cpu)) = root {
            let packets = root_counter(&lab.status()?, "received") - received;
            let ns = (cpu_seconds(pid) - cpu) * 1e9 / packets.max(1.0);
            report.metric(&format!("{name}_root_ns_per_packet"), ns);
            if name == "cluster_slow_path" {
                report.metric("root_ns_per_packet", ns);
            }
        }
        report.metric(&format!("{name}_goodput_mbps"), bps / 1e6);
        report.metric(&format!("{name}_tcp_retransmits"), retr);
        cluster_bps[i] = bps;
        lab.cluster_down()?;
    }
    let slow_path = (cluster_bps[1] + cluster_bps[4]) / 2.0;
    report.ratio("cluster_vs_box_goodput", ratio(cluster_bps[5], box_bps[0]));
    report.ratio(
        "slow_path_goodput_log_vs_no_log",
        ratio(slow_path, cluster_bps[0]),
    );
    report.ratio(
        "authenticated_vs_plain_slow_path_goodput",
        ratio(
            cluster_bps[1] + cluster_bps[4],
            cluster_bps[2] + cluster_bps[3],
        ),
    );
    auth_cost(report);
    let staged_bps = staged_goodput(lab, p, report);
    // The one-stage cluster goes on to the failover, with a warm standby: bring it back.
    lab.cluster_up("cluster", &with_standby(&cluster_config(1, "claim", true)))?;
    lab.wait_settled(1, 30)?;
    report.ratio(
        "two_stages_vs_one_slow_path_goodput",
        ratio(staged_bps?, slow_path),
    );
    report.ratio(
        "cluster_vs_box_slow_path_goodput",
        ratio(slow_path, box_bps[1]),
    );

    // Failover on three instances.
    lab.flowstate(&["cluster", "scale", "3"])?;
    lab.wait_settled(3, 30)?;
    eprintln!(
        "failover: {} downloads through three instances, one killed half-way",
        p.downloads
    );
    let dl_dir = lab.scratch("downloads");
    std::fs::create_dir_all(&dl_dir).map_err(|e| format!("{}: {e}", dl_dir.display()))?;
    let probe = Probe::start(&lab.lab, &ports, PROBE_EVERY)?;
    let load = Load::start(&lab.lab, &dl_dir, spec.clone());
    wait_half(&load, p.downloads);
    let pre = lab.status()?;
    let (victim, moved, kill_at) = kill_one(lab)?;
    std::thread::sleep(PROBE_AFTER_KILL);
    let replies = probe.finish()?;
    let result = load.wait();
    let after = lab.wait_settled(3, 30).or_else(|_| lab.status())?;
    downloads(report, "", &result, p.downloads);
    let moved_gaps: Vec<f64> = replies
        .iter()
        .zip(&moved)
        .filter(|(_, m)| **m)
        .map(|(r, _)| gap_ms(r, kill_at))
        .collect();
    // The flows the kill did not move: their longest silence after it, and when it ended.
    let others = replies
        .iter()
        .zip(&moved)
        .filter(|(_, m)| !**m)
        .filter_map(|(r, _)| crate::cluster_lab::longest_gap_after(r, kill_at))
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .unwrap_or((0.0, kill_at));
    let gap = moved_gaps.iter().copied().fold(0.0, f64::max);
    let outage = max_outage_ms(&replies, &moved, kill_at);
    report.metric("failover_outage_ms", outage);
    report.metric("failover_gap_ms", gap);
    report.metric("failover_gap_ms_median", median(&moved_gaps));
    report.metric("failover_gap_ms_min", min(&moved_gaps));
    report.metric("probe_flows_moved", moved_gaps.len() as f64);
    report.metric("unmoved_probe_flows_max_silence_ms", others.0 * 1e3);
    report.metric(
        "unmoved_probe_flows_max_silence_end_ms",
        (others.1 - kill_at) * 1e3,
    );
    report.metric("killed_instance", victim as f64);
    for key in ["hold_dropped", "no_owner", "reordered", "moves_done"] {
        report.metric(
            &format!("root_{key}_on_failover"),
            root_counter(&after, key) - root_counter(&pre, key),
        );
    }

    // The same kill with every packet through the instances: the gap of the slow path alone
    // (with the fast path, established flows go on through the root while their partitions
    // are taken over).
    lab.cluster_down()?;
    eprintln!("failover: the kill again, without the root's fast path");
    lab.cluster_up("slow", &with_standby(&cluster_config(3, "claim", false)))?;
    lab.wait_settled(3, 30)?;
    let probe = Probe::start(&lab.lab, &ports, PROBE_EVERY)?;
    std::thread::sleep(Duration::from_secs(1));
    let (_, moved, kill_at) = kill_one(lab)?;
    std::thread::sleep(PROBE_AFTER_KILL);
    let replies = probe.finish()?;
    report.metric(
        "slow_path_failover_outage_ms",
        max_outage_ms(&replies, &moved, kill_at),
    );
    let slow: Vec<f64> = replies
        .iter()
        .zip(&moved)
        .filter(|(_, m)| **m)
        .map(|(r, _)| gap_ms(r, kill_at))
        .collect();
    report.metric(
        "slow_path_failover_gap_ms",
        slow.iter().copied().fold(0.0, f64::max),
    );
    report.metric("slow_path_failover_gap_ms_median", median(&slow));

    // Linux's HA pair.
    lab.cluster_down()?;
    eprintln!(
        "failover: {} downloads through Linux's HA NAT, primary crashed half-way",
        p.downloads
    );
    let mut exec = System::default();
    for ns in [lab.lab.client_ns(), lab.lab.server_ns()] {
        let _ = std::process::Command::new("ip")
            .args(["-n", &ns, "neigh", "flush", "all"])
            .status();
    }
    lab.forget_time_wait();
    lab.lab
        .kernel_ha(&mut exec, true)
        .map_err(|e| e.to_string())?;
    lab.wait_reachable()?;
    let probe = Probe::start(&lab.lab, &ports, PROBE_EVERY)?;
    let load = Load::start(&lab.lab, &dl_dir, spec);
    wait_half(&load, p.downloads);
    let kill_at = crash_primary(&lab.lab)?;
    std::thread::sleep(PROBE_AFTER_KILL);
    let replies = probe.finish()?;
    let result = load.wait();
    downloads(report, "peer_", &result, p.downloads);
    let gaps: Vec<f64> = replies.iter().map(|r| gap_ms(r, kill_at)).collect();
    let peer_gap = gaps.iter().copied().fold(0.0, f64::max);
    let peer_outage = max_outage_ms(&replies, &vec![true; replies.len()], kill_at);
    report.metric("peer_failover_outage_ms", peer_outage);
    report.ratio("failover_outage_vs_conntrackd", ratio(peer_outage, outage));
    report.metric("peer_failover_gap_ms", peer_gap);
    report.metric("peer_failover_gap_ms_median", median(&gaps));
    report.metric("peer_failover_gap_ms_min", min(&gaps));
    report.ratio("failover_gap_vs_conntrackd", ratio(peer_gap, gap));
    lab.lab
        .kernel_ha(&mut exec, false)
        .map_err(|e| e.to_string())?;
    Ok(())
}

/// Hosts killed and cut off in a routed lab, every packet through the instances (no fast
/// path), three instance hosts and a fourth holding no key.
fn host_faults(lab: &ClusterLab, p: &Params, report: &mut Report) -> Result<(), String> {
    let want = content(p.file_bytes);
    let _server = lab.serve_paced(Arc::clone(&want), p.rate)?;
    let spec = LoadSpec {
        want,
        concurrency: p.concurrency,
        total: Some(p.downloads),
        stall_secs: 20,
    };
    let config = cluster_config(3, "claim", false).replace(
        &format!("url = \"{}:7878\"", flowstate_lab::ROOT_ADDR),
        &format!("url = \"{}:7878\"", flowstate_lab::STORE_ADDR),
    );
    let dl_dir = lab.scratch("downloads");
    std::fs::create_dir_all(&dl_dir).map_err(|e| format!("{}: {e}", dl_dir.display()))?;

    eprintln!("failover: routed lab, datagrams forged by a host without the key");
    lab.cluster_up("host-kill", &config)?;
    let before = lab.wait_settled(3, 30)?;
    let load = Load::start(&lab.lab, &dl_dir, spec.clone());
    wait_half(&load, p.downloads);
    forged(lab, &before, report)?;
    eprintln!("failover: routed lab, a host killed (its processes, then its link)");
    let victim = most_partitions(&lab.status()?)?;
    lab.lab
        .kill_host(&mut System::default(), RoutedHost::Instance(victim as u32))
        .map_err(|e| e.to_string())?;
    let result = load.wait();
    downloads(report, "host_kill_", &result, p.downloads);
    lab.cluster_down()?;
    cut(lab, victim, Cut::None)?;

    eprintln!("failover: routed lab, a host cut off (its processes alive), then back");
    lab.cluster_up("host-cut", &config)?;
    lab.wait_settled(3, 30)?;
    let load = Load::start(&lab.lab, &dl_dir, spec);
    wait_half(&load, p.downloads);
    let victim = most_partitions(&lab.status()?)?;
    // Its way to the store first, so that a commit of packets it has taken is on the wire
    // when the rest goes: the store gets that commit only after the partitions moved.
    cut(lab, victim, Cut::Store)?;
    std::thread::sleep(Duration::from_millis(300));
    cut(lab, victim, Cut::All)?;
    let cut_at = Instant::now();
    lab.wait_for(
        20,
        "the cut-off instance's partitions with the others",
        |s| !live(s).contains(&victim) && owned(s) == crate::cluster_lab::PARTITIONS as usize,
    )?;
    report.metric("host_cut_failover_ms", cut_at.elapsed().as_secs_f64() * 1e3);
    std::thread::sleep(Duration::from_millis(500));
    cut(lab, victim, Cut::None)?;
    let back = Instant::now();
    let rejoined = lab.wait_for(30, "the cut-off instance back with partitions", |s| {
        live(s).contains(&victim)
            && (0..crate::cluster_lab::PARTITIONS).any(|q| owner_of(s, q) == Some(victim))
    });
    report.metric("host_cut_rejoined", f64::from(u8::from(rejoined.is_ok())));
    report.metric("host_cut_rejoin_ms", back.elapsed().as_secs_f64() * 1e3);
    let result = load.wait();
    downloads(report, "host_cut_", &result, p.downloads);
    let fenced = lab
        .instance_file(victim as u32)
        .and_then(|v| v["fenced_commits"].as_u64())
        .unwrap_or(0);
    report.metric("fenced_commits", fenced as f64);
    lab.cluster_down()
}

/// The partitions owned in a status.
fn owned(s: &serde_json::Value) -> usize {
    (0..crate::cluster_lab::PARTITIONS)
        .filter(|&q| owner_of(s, q).is_some())
        .count()
}

/// The live instance owning the most partitions.
fn most_partitions(s: &serde_json::Value) -> Result<u64, String> {
    live(s)
        .into_iter()
        .max_by_key(|&id| {
            (0..crate::cluster_lab::PARTITIONS)
                .filter(|&q| owner_of(s, q) == Some(id))
                .count()
        })
        .ok_or_else(|| "no live instance".into())
}

/// Datagrams of every kind the roles take, sent by the routed lab's fourth host, which holds
/// no key ([`flowstate_lab::forger`]): `metrics.forged_sent`, `metrics.forged_refused` (what
/// the controller, the root and the instances counted as refused meanwhile) and
/// `metrics.forged_accepted`, those sent and not refused.
fn forged(lab: &ClusterLab, before: &serde_json::Value, report: &mut Report) -> Result<(), String> {
    let refused = |s: &serde_json::Value| -> Result<u64, String> {
        let sum = |v: &serde_json::Value| {
            v["auth_rejected"]
                .as_object()
                .map_or(0, |m| m.values().filter_map(|v| v.as_u64()).sum::<u64>())
        };
        let instances: u64 = (1..=3)
            .filter_map(|k| lab.instance_file(k))
            .map(|v| sum(&v))
            .sum();
        Ok(sum(s) + sum(&s["root"]) + instances)
    };
    let first = refused(before)?;
    let script = flowstate_lab::forger(
        flowstate_lab::instance_addr(4),
        flowstate_lab::instance_addr(1),
    );
    let out = std::process::Command::new("ip")
        .args([
            "netns",
            "exec",
            &lab.lab.instance_ns(4),
            "python3",
            "-c",
            &script,
        ])
        .output()
        .map_err(|e| format!("the forger: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "the forger: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let sent: u64 = String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .map_err(|e| format!("the forger's count: {e}"))?;
    // The roles publish their counters every 200 ms.
    std::thread::sleep(Duration::from_millis(600));
    let now = lab.status()?;
    let got = refused(&now)? - first;
    report.metric("forged_sent", sent as f64);
    report.metric("forged_refused", got as f64);
    report.metric("forged_accepted", sent.saturating_sub(got) as f64);
    report.metric(
        "forged_members",
        now["instances"]
            .as_array()
            .map_or(0, |a| a.iter().filter(|i| i["id"] == 9).count()) as f64,
    );
    Ok(())
}

/// Cuts instance host `k`'s link at the router as `how` says ([`flowstate_lab::Lab::cut`]).
fn cut(lab: &ClusterLab, k: u64, how: Cut) -> Result<(), String> {
    lab.lab
        .cut(&mut System::default(), RoutedHost::Instance(k as u32), how)
        .map_err(|e| e.to_string())
}

/// Kills (SIGKILL) the live instance owning the most partitions, as `flowstate cluster kill`
/// does: its id, which partitions it owned, and the kill's time (seconds since the epoch).
fn kill_one(lab: &ClusterLab) -> Result<(u64, Vec<bool>, f64), String> {
    let before = lab.status()?;
    let victim = most_partitions(&before)?;
    let moved: Vec<bool> = (0..crate::cluster_lab::PARTITIONS)
        .map(|q| owner_of(&before, q) == Some(victim))
        .collect();
    let pid = lab
        .role_pid(&format!("instance-{victim}"))
        .ok_or_else(|| format!("instance {victim} has no running process"))?;
    let kill_at = now_secs();
    // SAFETY: a signal to the cluster's own instance process (what `cluster kill` sends).
    if unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) } != 0 {
        return Err(format!(
            "killing instance {victim} (pid {pid}): {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok((victim, moved, kill_at))
}

/// Crashes kernel HA's primary router r1 as [`flowstate_lab::Lab::kill_ha_primary`] does
/// (every process in its namespace stopped at once, its links down, the processes killed);
/// done here to take the crash's time right before the SIGSTOP (the lab's call lists the
/// namespaces and their processes first, which takes hundreds of ms under the downloads'
/// load). The crash's time, seconds since the epoch.
fn crash_primary(lab: &flowstate_lab::Lab) -> Result<f64, String> {
    let ns = lab.router_ns(1);
    let out = std::process::Command::new("ip")
        .args(["netns", "pids", &ns])
        .output()
        .map_err(|e| format!("ip netns pids {ns}: {e}"))?;
    let pids: Vec<libc::pid_t> = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect();
    if pids.is_empty() {
        return Err(format!("no process in {ns}: kernel HA is not running"));
    }
    let at = now_secs();
    let signal = |sig| {
        for &p in &pids {
            // SAFETY: signals to the lab's own router processes.
            unsafe {
                libc::kill(p, sig);
            }
        }
    };
    signal(libc::SIGSTOP);
    for dev in [
        flowstate_lab::HA_INSIDE_IF,
        flowstate_lab::HA_OUTSIDE_IF,
        flowstate_lab::HA_SYNC_IF,
    ] {
        let _ = std::process::Command::new("ip")
            .args(["-n", &ns, "link", "set", dev, "down"])
            .status();
    }
    signal(libc::SIGKILL);
    Ok(at)
}

/// Goodput through the chain cut into two stages, one slow-path instance each.
fn staged_goodput(lab: &ClusterLab, p: &Params, report: &mut Report) -> Result<f64, String> {
    eprintln!("failover: goodput through two stages, one instance each (no fast path)");
    lab.cluster_up("staged", &staged_config(1, false))?;
    lab.wait_settled(2, 30)?;
    let meter = CpuMeter::start(&lab.roles());
    let (bps, retr) = lab.iperf3(p.iperf_secs)?;
    for (group, cores) in meter.cores(&lab.roles()) {
        report.metric(&format!("staged_slow_path_cores_{group}"), cores);
    }
    report.metric("staged_slow_path_goodput_mbps", bps / 1e6);
    report.metric("staged_slow_path_tcp_retransmits", retr);
    lab.cluster_down()?;
    Ok(bps)
}

/// `config` with one warm standby instance (`[cluster] standby = 1`): a failover moves the
/// failed instance's partitions once, to it, and starts no process meanwhile (Linux's HA
/// pair, the peer, is an active router and a standby one).
fn with_standby(config: &str) -> String {
    config.replacen("[cluster]\n", "[cluster]\nstandby = 1\n", 1)
}

fn min(v: &[f64]) -> f64 {
    if v.is_empty() {
        0.0
    } else {
        v.iter().copied().fold(f64::INFINITY, f64::min)
    }
}

/// A flow's failover gap in ms; a flow never answered after the kill counts the whole probe
/// time after it (a lower bound).
fn gap_ms(replies: &[f64], kill_at: f64) -> f64 {
    flowstate_lab::failover_gap(replies, kill_at)
        .map(|d| d.as_secs_f64() * 1e3)
        .unwrap_or(PROBE_AFTER_KILL.as_secs_f64() * 1e3)
}

/// The longest silence, ms, of the flows `moved` says, among the silences that end after
/// `kill_at` (the one the kill began included): the outage a client of theirs saw. Unlike
/// [`gap_ms`] (the kill to the end of that silence) it does not count, for a flow that never
/// stopped, the time until some short hiccup after the kill.
fn max_outage_ms(replies: &[Vec<f64>], moved: &[bool], kill_at: f64) -> f64 {
    replies
        .iter()
        .zip(moved)
        .filter(|(_, m)| **m)
        .filter_map(|(r, _)| crate::cluster_lab::longest_gap_after(r, kill_at))
        .map(|(silence, _)| silence * 1e3)
        .fold(0.0, f64::max)
}

/// Waits until half the downloads have started.
pub(crate) fn wait_half(load: &Load, total: usize) {
    while load.started() < total.div_ceil(2) {
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub(crate) fn downloads(report: &mut Report, prefix: &str, r: &LoadResult, total: usize) {
    let failed = total.saturating_sub(r.ok);
    report.metric(&format!("{prefix}failed_downloads"), failed as f64);
    report.metric(&format!("{prefix}completed_downloads"), r.ok as f64);
    report.metric(&format!("{prefix}downloads_secs"), r.elapsed);
    report.metric(&format!("{prefix}download_secs_p50"), median(&r.secs));
    report.metric(
        &format!("{prefix}download_secs_max"),
        r.secs.iter().copied().fold(0.0, f64::max),
    );
    for (i, f) in r.failed.iter().take(5).enumerate() {
        report.param(&format!("{prefix}failed_download_{i}"), f.clone());
    }
}

/// Nanoseconds to sign and check one datagram of `len` bytes, with and without a key
/// (`metrics.auth_seal_open_ns_LEN`, `metrics.auth_plain_seal_open_ns_LEN`), in this process.
fn auth_cost(report: &mut Report) {
    use flowstate_cluster::auth::{KeyRing, Keys, Sender, TRAILER_LEN};
    let keyed = Keys::parse(&format!("1 {}", "5a".repeat(32))).expect("a key");
    for (name, ring) in [
        ("auth", KeyRing::fixed(keyed)),
        ("auth_plain", KeyRing::fixed(Keys::unauthenticated())),
    ] {
        for len in [64, 1514] {
            let seal = ring.sealer(Sender::root(0), 1).expect("random bytes");
            let mut open = ring.opener(0);
            let mut buf = vec![0u8; len + TRAILER_LEN];
            let n = 200_000;
            let start = Instant::now();
            for _ in 0..n {
                let m = seal.seal(&mut buf, len).unwrap_or(0);
                let _ = std::hint::black_box(open.open(&mut buf[..m], u64::MAX / 2));
            }
            let ns = start.elapsed().as_nanos() as f64 / f64::from(n);
            report.metric(&format!("{name}_seal_open_ns_{len}"), ns);
        }
    }
}
