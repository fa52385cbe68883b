//! NF throughput on in-memory traffic of established flows (FlexState §V-B Fig. 5–6 and
//! StatelessNF §7 in spirit): each worker owns its share of the flows, as a NIC doing RSS
//! would give it, and runs its packets through the NF chain to completion in batches of 32,
//! dissecting each packet once. Beside it, in the same run: a no-op chain (the cost of moving
//! and dissecting a packet) and a loop of plain hash-map lookups on the same flow keys.
//!
//! Traffic: UDP flows from clients in 10.0.0.0/8 to the load balancer's VIP, 64-byte frames;
//! every flow is established by one warm-up pass before timing, so the timed passes measure
//! the steady state (lookups and rewrites, no state creation).
//!
//! `ratios.metrics_on_vs_off`: the chain runtime with metrics exported and scraped every
//! 100 ms against without, in the same run ([`crate::metrics_overhead`]).

use crate::{Effort, Report};
use flowstate_nf::stage::{Frames, Item, Stage};
use flowstate_nf::{registry, Direction, NfFactory, Placement};
use flowstate_state::local::LocalStore;
use flowstate_state::{Connector, Partition, StateConfig};
use flowstate_wire::build::{EthernetSpec, FrameSpec, IpSpec, Ipv4Spec, L4Spec, Payload, UdpSpec};
use flowstate_wire::hash::Toeplitz;
use flowstate_wire::{dissect, FlowKey};
use std::collections::HashMap;
use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::Ordering;
use std::time::Instant;

pub(crate) const FRAME: usize = 60;
const BATCH: usize = 32;

/// The chains measured, by name, and their `[[chain]]` tables.
pub(crate) fn chains() -> Vec<(&'static str, Vec<(&'static str, &'static str)>)> {
    // Room for every flow: the defaults (262,144 connections) would early-drop the unanswered
    // UDP flows of the million-flow runs (the LB's least-loaded method then drops their
    // packets), which then measure opening connections.
    let fw = ("firewall", "max_connections = 2097152");
    let nat = ("nat", "external = [\"203.0.113.1\", \"203.0.113.2\", \"203.0.113.3\", \"203.0.113.4\", \"203.0.113.5\", \"203.0.113.6\", \"203.0.113.7\", \"203.0.113.8\", \"203.0.113.9\", \"203.0.113.10\", \"203.0.113.11\", \"203.0.113.12\", \"203.0.113.13\", \"203.0.113.14\", \"203.0.113.15\", \"203.0.113.16\", \"203.0.113.17\", \"203.0.113.18\", \"203.0.113.19\", \"203.0.113.20\", \"203.0.113.21\", \"203.0.113.22\", \"203.0.113.23\", \"203.0.113.24\"]\nports = \"1024-65535\"");
    let lb = ("lb", "vips = [{ vip = \"198.51.100.10\", port = 53, proto = \"udp\", backends = [\"10.1.0.1\", \"10.1.0.2\", \"10.1.0.3\", \"10.1.0.4\"], method = \"least-loaded\" }]\nmax_connections = 2097152");
    vec![
        ("noop", vec![]),
        ("nat", vec![nat]),
        ("firewall", vec![fw]),
        ("lb", vec![lb]),
        ("chain", vec![fw, nat, lb]),
    ]
}

pub(crate) fn run(effort: Effort) -> Report {
    // Timed packets per measurement: the passes over the flows are as many as it takes (at
    // least 3), so a run over few flows is not over in a few milliseconds.
    let (flow_sets, packets): (&[(usize, &str)], usize) = match effort {
        Effort::Full => (&[(10_000, "10k_flows"), (1_000_000, "1m_flows")], 3_000_000),
        Effort::Quick => (&[(2_000, "10k_flows"), (20_000, "1m_flows")], 20_000),
    };
    let min_passes = match effort {
        Effort::Full => 3,
        Effort::Quick => 1,
    };
    let mut report = Report::new("nf-throughput");
    report
        .param("frame_bytes", FRAME + 4)
        .param("batch", BATCH)
        .param("timed_packets_min", packets);
    let cores = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(2);
    for &(flows, label) in flow_sets {
        let keys = flow_keys(flows);
        let passes = packets.div_ceil(flows).max(min_passes);
        report.param(&format!("timed_passes_{label}"), passes);
        let (lookup, lookup_cpu) = lookup_baseline_mpps(&keys, passes);
        report.metric(&format!("lookup_baseline_mpps_{label}"), lookup);
        report.metric(
            &format!("lookup_baseline_mpps_per_cpu_second_{label}"),
            lookup_cpu,
        );
        let mut per_core = HashMap::new();
        for (name, chain) in chains() {
            for workers in 1..=cores {
                let run = chain_run(&LocalStore::new(), 0, &chain, &keys, workers, passes);
                let (mpps, cpu) = (run.mpps, run.mpps_per_cpu);
                let pc = mpps / workers as f64;
                report.metric(&format!("{name}_mpps_per_core_{label}_{workers}w"), pc);
                report.metric(
                    &format!("{name}_mpps_per_cpu_second_{label}_{workers}w"),
                    cpu,
                );
                if workers == 1 && name != "noop" {
                    report.ratio(
                        &format!("{name}_vs_lookup_baseline_per_cpu_second_{label}"),
                        cpu / lookup_cpu,
                    );
                }
                if workers == 1 && name != "noop" {
                    // Not in the rates: the copy of a stopping worker's state into the store.
                    report.metric(&format!("{name}_write_out_s_{label}"), run.write_out_secs);
                }
                per_core.insert((name, workers), pc);
            }
            let one = per_core[&(name, 1)];
            report.metric(&format!("{name}_mpps_per_core_{label}"), one);
            if cores >= 2 {
                // Total throughput with two workers over one.
                report.ratio(
                    &format!("{name}_2w_vs_1w_{label}"),
                    2.0 * per_core[&(name, 2)] / one,
                );
            }
            if name != "noop" {
                report.ratio(
                    &format!("{name}_vs_noop_{label}"),
                    one / per_core[&("noop", 1)],
                );
                report.ratio(&format!("{name}_vs_lookup_baseline_{label}"), one / lookup);
            }
        }
    }
    // The names the issue fixes.
    let alias = |r: &mut Report, from: &str, to: &str, ratio: bool| {
        let v = if ratio {
            r.ratios.get(from)
        } else {
            r.metrics.get(from)
        }
        .copied();
        if let Some(v) = v {
            if ratio {
                r.ratio(to, v);
            } else {
                r.metric(to, v);
            }
        }
    };
    alias(
        &mut report,
        "noop_mpps_per_core_10k_flows",
        "noop_mpps_per_core",
        false,
    );
    alias(&mut report, "nat_2w_vs_1w_1m_flows", "nat_2w_vs_1w", true);
    // Metrics exported and scraped against not, on the chain runtime (issue #20).
    let (metrics_packets, runs) = match effort {
        Effort::Full => (3_000_000, 5),
        Effort::Quick => (50_000, 1),
    };
    crate::metrics_overhead::measure(&mut report, metrics_packets, runs);
    // The chain behind a flow cache against the chain alone, on the real runtime, over two
    // of the cache's refresh periods of trace time (renewals included) in a full run.
    let (trace, rounds) = match effort {
        Effort::Full => (2 * flowstate_nf::stage::DEFAULT_REFRESH, 3),
        Effort::Quick => (std::time::Duration::ZERO, 1),
    };
    crate::flow_cache::measure(&mut report, flow_sets, packets, trace, rounds);
    // The chain (this loop), and the chain behind its flow cache (the real runtime), against
    // the slowest of its NFs alone (this loop): issue #22's "a chain as fast as its slowest NF".
    for &(_, label) in flow_sets {
        let slowest = ["nat", "firewall", "lb"]
            .iter()
            .filter_map(|nf| report.metrics.get(&format!("{nf}_mpps_per_core_{label}")))
            .copied()
            .fold(f64::INFINITY, f64::min);
        for (chain, key) in [
            ("chain_mpps_per_core", "chain_vs_slowest_nf"),
            ("flow_cache_on_mpps", "chain_flow_cache_vs_slowest_nf"),
        ] {
            if let Some(&mpps) = report.metrics.get(&format!("{chain}_{label}")) {
                report.ratio(&format!("{key}_{label}"), mpps / slowest);
            }
        }
    }
    report
}

/// `n` distinct client flows to the VIP.
pub(crate) fn flow_keys(n: usize) -> Vec<FlowKey> {
    (0..n)
        .map(|i| {
            let host = 0x0a00_0000 | (i as u32 / 16 + 1);
            let port = 10_000 + (i % 16) as u16 * 3_000 + (i as u16 % 7);
            FlowKey::new(
                IpAddr::V4(Ipv4Addr::from(host)),
                IpAddr::V4(Ipv4Addr::new(198, 51, 100, 10)),
                port,
                53,
                17,
            )
        })
        .collect()
}

pub(crate) fn frame(key: &FlowKey) -> [u8; FRAME] {
    let (IpAddr::V4(src), IpAddr::V4(dst)) = (key.src, key.dst) else {
        unreachable!("IPv4 keys")
    };
    let spec = FrameSpec {
        ethernet: EthernetSpec::new([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2]),
        ip: IpSpec::V4(Ipv4Spec::new(src, dst)),
        l4: L4Spec::Udp(UdpSpec {
            src_port: key.src_port,
            dst_port: key.dst_port,
        }),
        payload: Payload::Fill {
            len: 18,
            byte: 0x5a,
        },
        min_len: FRAME,
    };
    let mut f = [0u8; FRAME];
    spec.write(&mut f).expect("60-byte frame");
    f
}

/// Mpps of a loop that looks each packet's flow key up in a hash map of all flows: the floor
/// of any NF that keeps per-flow state in a hash table (std's, with foldhash, the workspace's
/// hasher). Also per CPU-second of the thread.
fn lookup_baseline_mpps(keys: &[FlowKey], passes: usize) -> (f64, f64) {
    let map: foldhash::HashMap<FlowKey, u64> = keys
        .iter()
        .enumerate()
        .map(|(i, k)| (*k, i as u64))
        .collect();
    // The keys in arrival order, as packets come from a receive ring: reading the next key is
    // a sequential access, the lookup the random one, as in the NF runs.
    let arrivals: Vec<FlowKey> = visit_order(keys.len()).iter().map(|&i| keys[i]).collect();
    let start = Instant::now();
    let cpu = thread_cpu_seconds();
    let mut acc = 0u64;
    for _ in 0..passes {
        for k in &arrivals {
            acc = acc.wrapping_add(*map.get(black_box(k)).unwrap_or(&0));
        }
    }
    black_box(acc);
    let cpu = thread_cpu_seconds() - cpu;
    let n = (passes * keys.len()) as f64;
    (n / start.elapsed().as_secs_f64() / 1e6, n / cpu / 1e6)
}

/// CPU time this thread has used, in seconds (wall time where the platform cannot say).
///
/// Throughput per CPU-second counts only the time a worker ran: on a machine shared with other
/// work, a thread that waits for a core is not measured as slow (it still pays for caches it
/// shares).
pub(crate) fn thread_cpu_seconds() -> f64 {
    #[cfg(target_os = "linux")]
    {
        #[repr(C)]
        struct Timespec {
            sec: i64,
            nsec: i64,
        }
        extern "C" {
            fn clock_gettime(clock: i32, ts: *mut Timespec) -> i32;
        }
        const CLOCK_THREAD_CPUTIME_ID: i32 = 3;
        let mut ts = Timespec { sec: 0, nsec: 0 };
        // SAFETY: `ts` is a valid, writable timespec (64-bit time_t and long on the 64-bit
        // Linux targets this builds for) and the clock id is a constant Linux defines.
        if unsafe { clock_gettime(CLOCK_THREAD_CPUTIME_ID, &mut ts) } == 0 {
            return ts.sec as f64 + ts.nsec as f64 * 1e-9;
        }
    }
    static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_secs_f64()
}

/// A fixed pseudo-random permutation: packets of different flows interleave as in real traffic.
pub(crate) fn visit_order(n: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    for i in (1..n).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        order.swap(i, (x % (i as u64 + 1)) as usize);
    }
    order
}

/// What [`chain_run`] measured.
pub(crate) struct ChainRun {
    /// Total Mpps of the workers, until the store has every change they queued.
    pub(crate) mpps: f64,
    /// Total Mpps while packets flowed (the final drain of queued changes excluded).
    pub(crate) mpps_forwarding: f64,
    /// Packets per CPU-second the workers used, the final drain included.
    pub(crate) mpps_per_cpu: f64,
    /// Packets per CPU-second the workers used while packets flowed.
    pub(crate) mpps_per_cpu_forwarding: f64,
    /// Seconds the slowest worker's final drain of queued changes took.
    pub(crate) drain_secs: f64,
    /// Seconds the slowest worker's write-out of its whole state took after that
    /// ([`Partition::flush_all`], what a stopping worker does; nothing a packet waits for).
    pub(crate) write_out_secs: f64,
    /// Flushes held back because the store was behind, and failed flushes, over all workers.
    pub(crate) held_back: u64,
    pub(crate) errors: u64,
}

/// One worker's share of a [`ChainRun`]: seconds (and CPU seconds) forwarding and in all.
struct WorkerRun {
    packets: usize,
    forwarding: f64,
    total: f64,
    cpu: f64,
    cpu_forwarding: f64,
    write_out: f64,
    held_back: u64,
    errors: u64,
}

/// Runs `workers` threads, each running its own share of the flows through its own instance
/// of `chain` with its state on `store` (as NF instance `instance`), after a warm-up pass that
/// establishes every flow (in the store too).
pub(crate) fn chain_run(
    store: &dyn Connector,
    instance: u32,
    chain: &[(&str, &str)],
    keys: &[FlowKey],
    workers: usize,
    passes: usize,
) -> ChainRun {
    let rss = Toeplitz::symmetric();
    let shares: Vec<Vec<FlowKey>> = (0..workers)
        .map(|w| {
            keys.iter()
                .filter(|k| rss.hash_flow(k) as usize % workers == w)
                .copied()
                .collect()
        })
        .collect();
    let barrier = std::sync::Barrier::new(workers);
    // One core per worker, as a NIC queue per core would have it (when there are enough):
    // the last ones, leaving the first to stores started beside the bench (crate::remote).
    let cores = crate::remote::all_cpus();
    let cores = if cores.len() >= workers {
        cores[cores.len() - workers..].to_vec()
    } else {
        Vec::new()
    };
    let cores = &cores;
    let results: Vec<WorkerRun> = std::thread::scope(|s| {
        let handles: Vec<_> = shares
            .iter()
            .enumerate()
            .map(|(w, share)| {
                let barrier = &barrier;
                s.spawn(move || {
                    if let Some(&core) = cores.get(w) {
                        core_affinity::set_for_current(core);
                    }
                    let config = StateConfig {
                        stage: instance,
                        partition: w as u32,
                        exclusive: workers == 1,
                        ..StateConfig::default()
                    };
                    let mut part = Partition::new(store, config).expect("state partition");
                    let info = Placement {
                        partition: w as u32,
                        partitions: workers as u32,
                        stage: instance,
                    };
                    let factories: Vec<std::sync::Arc<dyn NfFactory>> = chain
                        .iter()
                        .map(|(name, table)| {
                            let table: toml::Table = table.parse().expect("bench config");
                            registry::factory(name, &table)
                                .unwrap_or_else(|e| panic!("configuring {name}: {e}"))
                        })
                        .collect();
                    let mut stage = Stage::build(&factories, &mut part, info, None)
                        .unwrap_or_else(|e| panic!("building {e}"));
                    // The frames in arrival order, as a receive ring holds them: copying the
                    // next one in is a sequential read, not a cache miss of the generator's.
                    let order = visit_order(share.len());
                    let frames: Vec<[u8; FRAME]> =
                        order.iter().map(|&i| frame(&share[i])).collect();
                    // Warm-up: establishes every flow's state, in the store too.
                    let origin = Instant::now();
                    let forwarded = run_passes(&mut stage, &mut part, &frames, 1, origin);
                    assert_eq!(forwarded, frames.len(), "every flow is established");
                    part.flush_all(now_since(origin)).expect("warm-up flush");
                    barrier.wait();
                    let start = Instant::now();
                    let cpu = thread_cpu_seconds();
                    let n = run_passes(&mut stage, &mut part, &frames, passes, origin);
                    // What is still queued for the store is part of the work.
                    let forwarding = start.elapsed().as_secs_f64();
                    let cpu_forwarding = thread_cpu_seconds() - cpu;
                    let stats = part.stats();
                    let (held, errors) = (
                        stats.held_back.load(Ordering::Relaxed),
                        stats.errors.load(Ordering::Relaxed),
                    );
                    part.sync(now_since(origin)).expect("final drain");
                    let cpu = thread_cpu_seconds() - cpu;
                    let total = start.elapsed().as_secs_f64();
                    part.flush_all(now_since(origin)).expect("write-out");
                    WorkerRun {
                        packets: n,
                        forwarding,
                        total,
                        cpu,
                        cpu_forwarding,
                        write_out: start.elapsed().as_secs_f64() - total,
                        held_back: held,
                        errors,
                    }
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("worker"))
            .collect()
    });
    let packets = results.iter().map(|r| r.packets).sum::<usize>() as f64;
    let slowest = |f: fn(&WorkerRun) -> f64| results.iter().map(f).fold(0.0, f64::max);
    ChainRun {
        mpps: packets / slowest(|r| r.total) / 1e6,
        mpps_forwarding: packets / slowest(|r| r.forwarding) / 1e6,
        mpps_per_cpu: packets / results.iter().map(|r| r.cpu).sum::<f64>() / 1e6,
        mpps_per_cpu_forwarding: packets
            / results.iter().map(|r| r.cpu_forwarding).sum::<f64>()
            / 1e6,
        drain_secs: slowest(|r| r.total - r.forwarding),
        write_out_secs: slowest(|r| r.write_out),
        held_back: results.iter().map(|r| r.held_back).sum(),
        errors: results.iter().map(|r| r.errors).sum(),
    }
}

/// Nanoseconds since `origin` on the NFs' clock (never 0: that means "no time" to timers).
pub(crate) fn now_since(origin: Instant) -> u64 {
    origin.elapsed().as_nanos() as u64 + 1
}

/// A receive ring's batch of frames, as the stage engine reads them.
struct Ring([[u8; FRAME]; BATCH]);

impl Frames for Ring {
    fn frame(&self, index: usize) -> Option<&[u8]> {
        self.0.get(index).map(|f| &f[..])
    }

    fn frame_mut(&mut self, index: usize) -> Option<&mut [u8]> {
        self.0.get_mut(index).map(|f| &mut f[..])
    }
}

/// Runs `passes` over the frames, in order and in batches, as the chain runtime does (each
/// batch dissected, then run NF by NF by the stage engine: its flows are distinct, one
/// segment); returns the packets forwarded.
pub(crate) fn run_passes(
    stage: &mut Stage,
    part: &mut Partition,
    frames: &[[u8; FRAME]],
    passes: usize,
    origin: Instant,
) -> usize {
    let mut batch = Ring([[0u8; FRAME]; BATCH]);
    let mut items = Vec::with_capacity(BATCH);
    let mut forwarded = 0;
    for _ in 0..passes {
        for chunk in frames.chunks(BATCH) {
            // Real time, so flushes go out every `flush_interval` as in a running chain.
            let now = now_since(origin);
            items.clear();
            for (i, (slot, f)) in batch.0.iter_mut().zip(chunk).enumerate() {
                *slot = *f;
                if let Ok(d) = dissect(slot) {
                    items.push(Item::new(i, d, now));
                }
            }
            stage.run(&mut batch, &mut items, Direction::Outbound);
            forwarded += items.iter().filter(|it| it.alive).count();
            stage.tick(now);
            part.maybe_flush(now);
        }
    }
    forwarded
}
