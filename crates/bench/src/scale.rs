//! `scale`: StatelessNF §7.4 (Fig. 9) and CHC §7.3 R2 in the namespace lab. A cluster running
//! a stateful firewall and a NAT (the chain of `examples/cluster.toml`, state in our store)
//! under a steady load of concurrent rate-limited HTTP downloads is scaled
//! 1 → 2 → 3 → 2 → 1 instances (`flowstate cluster scale`, one step per phase), and the same
//! load runs on static clusters of 1, 2 and 3 instances.
//!
//! * **State**: before the load, each cluster gets `flows` short UDP flows from the client to
//!   an echo server behind it (one datagram and its answer each): that many NAT sessions and
//!   firewall connections spread over the 16 partitions, besides each partition's NAT port
//!   pool. A move carries them all (claim: they stay in the store; copy: they are copied).
//! * **Load**: `concurrency` downloads at once, each a `curl` of `file_bytes` pseudo-random
//!   bytes from an HTTP server in the server namespace that paces every response at
//!   `rate_bytes_per_s`, compared byte for byte when it ends; a finished download is
//!   followed by a new one (new connections keep arriving through the moves). A download that
//!   fails or moves less than 1 kB/s for 10 s is broken (`metrics.broken_flows_on_scale`).
//! * **Goodput**: bytes the client's interface received per phase (its kernel counter) →
//!   `metrics.goodput_mbps_phase_{k}` (k = 0..4, sizes 1, 2, 3, 2, 1) and
//!   `metrics.static_goodput_mbps_{n}` for the static clusters (one window of the same
//!   length each). `ratios.scale_goodput_vs_static` = bytes over the five phases / what the
//!   static cluster of each phase's size carried in as long.
//! * **Moves** (the root's and the instances' counters, scaling run with `moves = "claim"`):
//!   `metrics.lost_packets_on_move` = the root's `hold_dropped` + `no_owner` + every
//!   instance's `misdirected`; `metrics.reordered_packets_on_move` = the root's `reordered`;
//!   `metrics.move_ms_p50` = the root's median move time (release → claim → ready).
//! * **Moves vs state transfer** (CHC R2: 35×): the same scaling run (same flows, same load)
//!   on a cluster with `moves = "copy"`, where every move reads the partition's whole state
//!   at the old owner and writes it again at the new one (OpenNF-style):
//!   `ratios.move_vs_state_transfer` = copy's `move_ms_p50` / claim's. The copy run's own
//!   counters are `metrics.copy_*`.
//!
//! Needs root, iproute2, curl and python3 (scripts/setup-live); without them the report
//! carries `params.error`.

use crate::cluster_lab::{
    cluster_config, content, median, ratio, root_counter, ClusterLab, CpuMeter, Load, LoadSpec,
};
use crate::{Effort, Report};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Instances per phase of the scaling run (StatelessNF Fig. 9 goes 1 → 2 → 1; CHC scales
/// out; this does both, one instance at a time).
const SIZES: [u32; 5] = [1, 2, 3, 2, 1];
/// First client source port of the state-filling flows.
const FLOW_PORT_BASE: u16 = 10000;

struct Params {
    phase_secs: u64,
    warmup_secs: u64,
    concurrency: usize,
    file_bytes: usize,
    rate: u64,
    flows: usize,
}

/// What one cluster run measured.
#[derive(Debug, Default)]
struct Run {
    /// Goodput per phase, Mbit/s.
    goodput: Vec<f64>,
    /// Per-second goodput samples over the whole run, Mbit/s.
    samples: Vec<f64>,
    /// Time from each scale command to the assignment settling, ms.
    settle_ms: Vec<f64>,
    flows_answered: usize,
    ok: usize,
    broken: usize,
    failed: Vec<String>,
    download_secs_p50: f64,
    root: serde_json::Value,
    misdirected: f64,
    copied_bytes: f64,
    cores: std::collections::BTreeMap<String, f64>,
}

pub(crate) fn run(effort: Effort) -> Report {
    let p = match effort {
        Effort::Full => Params {
            phase_secs: 10,
            warmup_secs: 3,
            concurrency: 60,
            file_bytes: 1_000_000,
            rate: 125_000,
            flows: 8000,
        },
        Effort::Quick => Params {
            phase_secs: 3,
            warmup_secs: 1,
            concurrency: 16,
            file_bytes: 200_000,
            rate: 100_000,
            flows: 1000,
        },
    };
    let mut report = Report::new("scale");
    report
        .param("sizes", "1,2,3,2,1")
        .param("phase_secs", p.phase_secs)
        .param("warmup_secs", p.warmup_secs)
        .param("concurrency", p.concurrency as u64)
        .param("file_bytes", p.file_bytes as u64)
        .param("rate_bytes_per_s", p.rate)
        .param("flows", p.flows as u64)
        .param("partitions", u64::from(crate::cluster_lab::PARTITIONS))
        .param("chain", "firewall -> nat")
        .param("state", "store (managed)");
    if let Some(load) = crate::failover::loadavg() {
        report.metric("loadavg_1m_start", load);
    }
    let started = Instant::now();
    let result = ClusterLab::up("s", 3).and_then(|lab| measure(&lab, &p, &mut report));
    report.metric("run_secs", started.elapsed().as_secs_f64());
    if let Err(e) = result {
        eprintln!("scale: {e}");
        report.param("error", e);
    }
    report
}

fn measure(lab: &ClusterLab, p: &Params, report: &mut Report) -> Result<(), String> {
    let want = content(p.file_bytes);
    let _server = lab.serve_paced(Arc::clone(&want), p.rate)?;
    let dir = lab.scratch("downloads");
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let spec = LoadSpec {
        want,
        concurrency: p.concurrency,
        total: None,
        stall_secs: 10,
    };

    eprintln!("scale: scaling 1-2-3-2-1 with moves = \"claim\"");
    let claim = cluster_run(lab, p, &spec, &SIZES, "claim", p.phase_secs)?;
    eprintln!("scale: scaling 1-2-3-2-1 with moves = \"copy\"");
    let copy = cluster_run(lab, p, &spec, &SIZES, "copy", p.phase_secs)?;
    let mut statics = Vec::new();
    for n in 1..=3u32 {
        eprintln!("scale: a static cluster of {n}");
        let r = cluster_run(lab, p, &spec, &[n], "claim", p.phase_secs)?;
        report.metric(&format!("static_goodput_mbps_{n}"), r.goodput[0]);
        report.metric(&format!("static_broken_flows_{n}"), r.broken as f64);
        report.metric(
            &format!("static_flows_answered_{n}"),
            r.flows_answered as f64,
        );
        statics.push(r.goodput[0]);
    }

    // Goodput: the scaling run against the static clusters of each phase's size.
    let scaled: f64 = claim.goodput.iter().sum();
    let fixed: f64 = SIZES.iter().map(|&n| statics[n as usize - 1]).sum();
    report.ratio("scale_goodput_vs_static", ratio(scaled, fixed));
    for (k, g) in claim.goodput.iter().enumerate() {
        report.metric(&format!("goodput_mbps_phase_{k}"), *g);
        report.ratio(
            &format!("goodput_vs_static_phase_{k}"),
            ratio(*g, statics[SIZES[k] as usize - 1]),
        );
    }
    for (k, g) in claim.samples.iter().enumerate() {
        report.metric(&format!("goodput_mbps_second_{k:02}"), *g);
    }
    for (k, s) in claim.settle_ms.iter().enumerate() {
        report.metric(&format!("settle_ms_phase_{}", k + 1), *s);
    }

    // Moves.
    let moves = |r: &Run, prefix: &str, report: &mut Report| {
        let root = |k: &str| root_counter(&serde_json::json!({ "root": r.root }), k);
        let lost = root("hold_dropped") + root("no_owner") + r.misdirected;
        report.metric(&format!("{prefix}broken_flows_on_scale"), r.broken as f64);
        report.metric(&format!("{prefix}completed_downloads"), r.ok as f64);
        report.metric(&format!("{prefix}download_secs_p50"), r.download_secs_p50);
        report.metric(&format!("{prefix}lost_packets_on_move"), lost);
        report.metric(&format!("{prefix}hold_dropped"), root("hold_dropped"));
        report.metric(&format!("{prefix}no_owner"), root("no_owner"));
        report.metric(&format!("{prefix}misdirected"), r.misdirected);
        report.metric(
            &format!("{prefix}reordered_packets_on_move"),
            root("reordered"),
        );
        report.metric(&format!("{prefix}move_ms_p50"), root("move_ms_p50"));
        report.metric(&format!("{prefix}moves_done"), root("moves_done"));
        report.metric(
            &format!("{prefix}release_timeouts"),
            root("release_timeouts"),
        );
        report.metric(&format!("{prefix}held_packets"), root("held"));
        report.metric(&format!("{prefix}flows_answered"), r.flows_answered as f64);
        report.metric(&format!("{prefix}copied_bytes"), r.copied_bytes);
        for (g, c) in &r.cores {
            report.metric(&format!("{prefix}cores_{g}"), *c);
        }
        for (i, f) in r.failed.iter().take(5).enumerate() {
            report.param(&format!("{prefix}broken_flow_{i}"), f.clone());
        }
    };
    moves(&claim, "", report);
    moves(&copy, "copy_", report);
    let p50 = |r: &Run| r.root["move_ms_p50"].as_f64().unwrap_or(0.0);
    report.ratio("move_vs_state_transfer", ratio(p50(&copy), p50(&claim)));
    let copy_scaled: f64 = copy.goodput.iter().sum();
    report.ratio("copy_scale_goodput_vs_static", ratio(copy_scaled, fixed));
    Ok(())
}

/// One cluster under the load: up with `sizes[0]` instances and `moves`, `flows` flows
/// opened, the load started, then one phase of `phase_secs` per size (a `cluster scale` at
/// the start of each but the first); the load ends, every download is checked, the cluster
/// goes down.
fn cluster_run(
    lab: &ClusterLab,
    p: &Params,
    spec: &LoadSpec,
    sizes: &[u32],
    moves: &str,
    phase_secs: u64,
) -> Result<Run, String> {
    lab.cluster_up(
        &format!("{moves}-{}", sizes.len()),
        &cluster_config(sizes[0], moves, true),
    )?;
    let result = loaded_phases(lab, p, spec, sizes, phase_secs);
    let status = lab.status();
    let mut r = result?;
    let status = status?;
    r.root = status["root"].clone();
    for k in 1..=3 {
        if let Some(i) = lab.instance_file(k) {
            r.misdirected += i["misdirected"].as_f64().unwrap_or(0.0);
            r.copied_bytes += i["copied_bytes"].as_f64().unwrap_or(0.0);
        }
    }
    lab.cluster_down()?;
    Ok(r)
}

fn loaded_phases(
    lab: &ClusterLab,
    p: &Params,
    spec: &LoadSpec,
    sizes: &[u32],
    phase_secs: u64,
) -> Result<Run, String> {
    let mut r = Run {
        flows_answered: lab.open_flows(FLOW_PORT_BASE, p.flows)?,
        ..Run::default()
    };
    let dir = lab.scratch("downloads");
    let load = Load::start(&lab.lab, &dir, spec.clone());
    std::thread::sleep(Duration::from_secs(p.warmup_secs));
    let meter = CpuMeter::start(&lab.roles());
    let mut last = lab.client_rx_bytes()?;
    let mut last_t = Instant::now();
    for (k, &n) in sizes.iter().enumerate() {
        let start = Instant::now();
        let rx0 = last;
        if k > 0 {
            lab.flowstate(&["cluster", "scale", &n.to_string()])?;
            let settled = lab.wait_settled(n as usize, phase_secs.max(5));
            r.settle_ms.push(start.elapsed().as_secs_f64() * 1e3);
            settled?;
        }
        // One sample a second until the phase ends.
        let end = start + Duration::from_secs(phase_secs);
        loop {
            let next = (last_t + Duration::from_secs(1)).min(end);
            std::thread::sleep(next.saturating_duration_since(Instant::now()));
            let rx = lab.client_rx_bytes()?;
            let dt = last_t.elapsed().as_secs_f64().max(1e-9);
            if dt > 0.5 {
                r.samples.push((rx - last) as f64 * 8.0 / dt / 1e6);
            }
            last = rx;
            last_t = Instant::now();
            if last_t >= end {
                break;
            }
        }
        let secs = start.elapsed().as_secs_f64();
        r.goodput.push((last - rx0) as f64 * 8.0 / secs / 1e6);
    }
    r.cores = meter.cores(&lab.roles());
    let result = load.finish();
    r.ok = result.ok;
    r.broken = result.failed.len();
    r.failed = result.failed;
    r.download_secs_p50 = median(&result.secs);
    Ok(r)
}
