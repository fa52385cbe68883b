//! flowstate's experiments: each reproduces a measurement from one of the papers and reports
//! it as JSON `{"name", "params", "metrics", "ratios", "machine"}` (DESIGN.md "Benchmarks").
//!
//! `html` turns a directory of those JSON files into one page with plots (`flowstate report`),
//! drawing beside each bench the numbers its paper reports (`paper`).
//!
//! Promises: every claim is a ratio between two variants measured in the same run, side by
//! side; absolute figures are reported but nothing here asserts a timing.

mod chc;
#[cfg(target_os = "linux")]
mod cluster_lab;
#[cfg(target_os = "linux")]
mod failover;
mod flexstate_counter;
mod flow_cache;
#[cfg(target_os = "linux")]
mod ha;
mod hashing;
mod hashmvt;
pub mod html;
mod hypersfc;
#[cfg(target_os = "linux")]
mod ips;
#[cfg(target_os = "linux")]
mod live_nat;
mod metrics_overhead;
#[cfg(target_os = "linux")]
pub mod nat_churn;
mod nat_events;
mod nf_throughput;
pub mod paper;
mod remote;
mod report;
#[cfg(target_os = "linux")]
mod scale;
pub mod soak;
mod store_abuse;
pub mod store_ops;

pub use report::{Machine, Report};

/// How much work a benchmark does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Effort {
    /// The full experiment (default).
    #[default]
    Full,
    /// A short run that exercises the code path (for tests and smoke runs); its numbers are noisy.
    Quick,
}

/// A benchmark that can be run by name.
#[derive(Debug, Clone, Copy)]
pub struct Bench {
    /// Name on the command line (`flowstate bench NAME`).
    pub name: &'static str,
    /// One line on what it measures and what it reproduces.
    pub about: &'static str,
    run: fn(Effort) -> Report,
}

impl Bench {
    /// Runs the benchmark.
    pub fn run(&self, effort: Effort) -> Report {
        (self.run)(effort)
    }
}

/// Every benchmark, in the order `flowstate bench --list` shows them.
pub const BENCHES: &[Bench] = &[
    Bench {
        name: "hashing",
        about: "ns per 5-tuple: hardware vs software CRC32C and symmetric Toeplitz (HashMVT §VI-C)",
        run: hashing::run,
    },
    Bench {
        name: "flexstate-counter",
        about: "Counter NF, sync vs async (no_wait + 1 ms flush) updates on the local store (FlexState §V-B Fig. 7)",
        run: flexstate_counter::run,
    },
    Bench {
        name: "flexstate",
        about: "sync vs async Counter NF on every backend (local, store, redis, redis-cluster, cassandra) and flush interval 1/10/100 ms vs store traffic (FlexState §V)",
        run: flexstate_counter::run_all_backends,
    },
    Bench {
        name: "nf-throughput",
        about: "Mpps per core of no-op, NAT, firewall, LB and the chain on established flows (10k, 1M), 1 and 2 workers, vs plain hash-map lookups",
        run: nf_throughput::run,
    },
    Bench {
        name: "nat-ipfix",
        about: "sessions per second of a NAT creating and ending 1M sessions with IPFIX event logging (RFC 8158) to a loopback collector vs without, in one run (issue #39)",
        run: nat_events::run,
    },
    #[cfg(target_os = "linux")]
    Bench {
        name: "live-nat",
        about: "in the netns lab: pps of a small-UDP flood and iperf3 TCP goodput through Linux's NAT (nftables) vs flowstate's NAT over AF_PACKET and AF_XDP (needs root)",
        run: live_nat::run,
    },
    #[cfg(target_os = "linux")]
    Bench {
        name: "nat-churn",
        about: "in the netns lab: short TCP connections per second through a NAT with a 100-port pool and 1 s closed-connection hold, Linux's NAT (nftables) vs flowstate's, with recovery time after the churn (issue #21; needs root)",
        run: nat_churn::run,
    },
    Bench {
        name: "store-ops",
        about: "our store vs redis-server: ops/s, p50/p99 and ops per server CPU second at pipeline depths 1, 16, 64 (CHC §7.1)",
        run: store_ops::run_ops,
    },
    Bench {
        name: "store-abuse",
        about: "a well-behaved store client's ops/s and p99 alone vs beside adversaries (amplifying batches, fresh client ids, slow partial frames, idle connections at the limit), and the store's peak memory vs the bound its limits set (issue #37)",
        run: store_abuse::run,
    },
    Bench {
        name: "store-batching",
        about: "per-operation cost through the store driver: single requests vs multi-op frames of 100 (StatelessNF §5.3)",
        run: store_ops::run_batching,
    },
    #[cfg(target_os = "linux")]
    Bench {
        name: "ha",
        about: "in the routed netns lab: no single point of failure — one of two roots, the leading controller and a Redis Cluster master each killed under 100 verified downloads (failed downloads, failover gaps, takeover time, lost or doubled updates); two roots vs one and durable vs async commits goodput (CHC §4-5, StatelessNF §4.2; needs root)",
        run: ha::run,
    },
    #[cfg(target_os = "linux")]
    Bench {
        name: "failover",
        about: "in the netns lab: 500 verified HTTP downloads and a client-seen failover gap through a 3-instance cluster with one instance killed vs Linux's HA NAT (keepalived + conntrackd) with its primary killed; cluster vs single-box goodput (StatelessNF §7.3 Fig. 8; needs root)",
        run: failover::run,
    },
    #[cfg(target_os = "linux")]
    Bench {
        name: "scale",
        about: "in the netns lab: goodput, broken flows, lost and reordered packets while scaling 1-2-3-2-1 under load vs static clusters; move time with state transfer (moves = copy) vs ownership claim (StatelessNF §7.4 Fig. 9, CHC §7.3 R2; needs root)",
        run: scale::run,
    },
    #[cfg(target_os = "linux")]
    Bench {
        name: "ips",
        about: "the IPS vs Suricata (--runmode single) on a mixed trace with 100, 1k and 10k content rules: packets per CPU second, alerts (StatelessNF §7.2.3; needs suricata)",
        run: ips::run,
    },
    Bench {
        name: "hypersfc",
        about: "HyperSFC's fast path (§V Figs. 7-14): latency by number of tables for base/busy/lazy/lazy-p, fast-slow bytes busy vs lazy, latency vs Bloom false positives, Bloom memory by branches, an LB's completion time vs share cached, slow-path CPU vs the LB in software",
        run: hypersfc::run,
    },
    Bench {
        name: "chc",
        about: "CHC's correctness experiments: trojans found with and without logical clocks behind slow scrubbers (W1-W3, §7.3 R4), offloaded updates vs lock-read-modify-write on shared state (§7.1), store recovery from checkpoint and log at 30/75/150 ms checkpoints (§5.4 Fig. 14)",
        run: chc::run,
    },
    Bench {
        name: "hashmvt",
        about: "Match-Value Tables on the real prefix set: insertion collisions, HW vs SW CRC32C matching, MVT vs binary-trie LPM, MVT-partitioned NAT vs shared pool at 1 and 2 workers (HashMVT §VI)",
        run: hashmvt::run,
    },
    Bench {
        name: "soak",
        about: "memory over minutes of churning flows through firewall -> NAT -> LB with their default timeouts: RSS after the warm-up vs at the end (--duration sets the run's length; default 3 min)",
        run: soak::run,
    },
];

/// The benchmark called `name`.
pub fn find(name: &str) -> Option<&'static Bench> {
    BENCHES.iter().find(|b| b.name == name)
}
