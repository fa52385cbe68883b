//! What each benchmark reproduces: the seed paper's figure and the numbers it reports, so the
//! report (`crate::html`) can draw the paper's value beside the measured one.
//!
//! Every value below is read from the papers' evaluation sections (`../shared/papers/*.txt`);
//! `source` says where. A key is `ratios.NAME` or `metrics.NAME` as the bench writes it. Where
//! the paper gives a bound ("< 0.6%", "< 2 Mpps") the bound itself is the reference value.

/// One number the paper reports for a key the bench writes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Reference {
    /// `ratios.NAME` or `metrics.NAME`.
    pub key: &'static str,
    /// The paper's value, in the unit of the bench's key.
    pub value: f64,
    /// Section / figure / table of the paper, and how the value was read.
    pub source: &'static str,
}

/// The figure a benchmark reproduces and the paper's numbers for it.
#[derive(Debug, Clone, Copy)]
pub struct Figure {
    /// The benchmark's name (`flowstate bench --list`).
    pub bench: &'static str,
    /// The paper and figure, as BENCHMARKS.md names it.
    pub figure: &'static str,
    /// What the paper's figure shows, in one sentence.
    pub shows: &'static str,
    /// The paper's numbers (may be empty: a bench against a baseline of our own choosing).
    pub refs: &'static [Reference],
}

const fn r(key: &'static str, value: f64, source: &'static str) -> Reference {
    Reference { key, value, source }
}

/// Every benchmark's figure, in `BENCHES` order.
pub const FIGURES: &[Figure] = &[
    Figure {
        bench: "hashing",
        figure: "HashMVT §VI-C (Fig. 7)",
        shows: "matching with the CPU's CRC32C instruction against a table-driven software CRC",
        refs: &[r(
            "ratios.crc32c_hw_vs_bytewise",
            5.0,
            "HashMVT §VI-C: hardware CRC32C 5× a table-driven CRC",
        )],
    },
    Figure {
        bench: "flexstate-counter",
        figure: "FlexState §V-B (Fig. 7)",
        shows: "the Counter NF with asynchronous (no-wait) state updates against synchronous ones",
        refs: &[
            r(
                "metrics.async_counter_mpps",
                12.0,
                "FlexState §V-B Fig. 7: Async Counter ≈ 12 Mpps",
            ),
            r(
                "metrics.sync_counter_mpps",
                2.0,
                "FlexState §V-B Fig. 7: Sync Counter never above 2 Mpps",
            ),
            r(
                "ratios.async_vs_sync_counter",
                6.0,
                "FlexState §V-B Fig. 7: ≈ 12 vs < 2 Mpps",
            ),
        ],
    },
    Figure {
        bench: "flexstate",
        figure: "FlexState §V (Figs. 5-8)",
        shows: "NAT, LB and Counter throughput on every store, and store traffic by flush interval",
        refs: &[
            r(
                "metrics.throughput_spread_pct",
                10.0,
                "FlexState §V Fig. 8: throughput within 10% across stores",
            ),
            r(
                "ratios.async_vs_sync_counter_redis",
                6.0,
                "FlexState §V-B Fig. 7: ≈ 12 vs < 2 Mpps",
            ),
            r(
                "ratios.async_vs_sync_counter_cassandra",
                6.0,
                "FlexState §V-B Fig. 7: ≈ 12 vs < 2 Mpps",
            ),
        ],
    },
    Figure {
        bench: "nf-throughput",
        figure: "FlexState §V-B (Figs. 5-6)",
        shows: "packets per second of the NAT and LB on established flows, near 10 Mpps line rate",
        refs: &[r(
            "metrics.nat_mpps_per_core_1m_flows",
            10.0,
            "FlexState §V-B Figs. 5-6: NAT close to 10 Mpps",
        )],
    },
    Figure {
        bench: "live-nat",
        figure: "issue #7 (no paper figure)",
        shows: "flowstate's NAT on real hosts against Linux's own NAT in the same run",
        refs: &[],
    },
    Figure {
        bench: "nat-churn",
        figure: "issue #21 (no paper figure)",
        shows: "short TCP connections per second through a 100-port NAT pool against Linux's NAT in the same run",
        refs: &[],
    },
    Figure {
        bench: "nat-ipfix",
        figure: "issue #39 (no paper figure)",
        shows: "sessions per second of a NAT creating and ending 1M sessions with RFC 8158 event logging over IPFIX against without, in the same run (goal: at least 0.95)",
        refs: &[],
    },
    Figure {
        bench: "store-ops",
        figure: "CHC §7.1 (Table 2)",
        shows: "operations per second of the state store against Redis",
        refs: &[r(
            "metrics.store_ops_per_sec_depth64_clients64",
            5.1e6,
            "CHC §7.1 Table 2: 5.1M ops/s on four threads",
        )],
    },
    Figure {
        bench: "store-abuse",
        figure: "issue #37 (no paper)",
        shows: "a well-behaved store client's p99 latency beside adversarial clients against alone (goal: at most 3), and the store's peak memory against the bound its limits set",
        refs: &[],
    },
    Figure {
        bench: "store-batching",
        figure: "StatelessNF §5.3",
        shows: "per-request cost of single requests against multi-requests of 100 objects",
        refs: &[r(
            "ratios.single_vs_batch100_cost_per_op",
            6.0 / 0.51,
            "StatelessNF §5.3: RAMCloud read 6 µs, multi-read of 100 0.51 µs each",
        )],
    },
    Figure {
        bench: "failover",
        figure: "StatelessNF §7.3 (Fig. 8)",
        shows: "connections kept and the outage while an instance fails",
        refs: &[],
    },
    Figure {
        bench: "ha",
        figure: "CHC §4.1, §5.4; StatelessNF §4.2 (no figure: issue #36)",
        shows: "downloads kept, outages and updates counted while a root, the leading controller and a store node fail; goodput of two roots and of durable commits",
        refs: &[],
    },
    Figure {
        bench: "scale",
        figure: "StatelessNF §7.4 (Fig. 9), CHC §7.3 R2",
        shows: "goodput while scaling out and in under load",
        refs: &[],
    },
    Figure {
        bench: "ips",
        figure: "StatelessNF §7.2.3",
        shows: "the IPS's packet rate against Suricata's",
        refs: &[],
    },
    Figure {
        bench: "hypersfc",
        figure: "HyperSFC §V (Figs. 7-14)",
        shows: "latency and bytes of busy vs lazy submit, Bloom branch selection, slow-path CPU",
        refs: &[
            r(
                "ratios.lazy_vs_busy_latency_10_tables",
                0.53,
                "HyperSFC §V Fig. 7: lazy submit 47% less latency at 10 tables",
            ),
            r(
                "ratios.lazyp_vs_busy_latency_10_tables",
                0.40,
                "HyperSFC §V Fig. 7: lazy submit with parallel search 60% less",
            ),
            r(
                "ratios.lazy_vs_busy_bytes_4_tables",
                0.56,
                "HyperSFC §V Fig. 11: 624 vs 1120 kbps, 44% less",
            ),
            r(
                "ratios.lazy_vs_busy_completion_4_tables",
                0.80,
                "HyperSFC §V Fig. 11: 20% less total processing time",
            ),
            r(
                "ratios.software_vs_fastpath_cpu",
                20.86 / 3.0,
                "HyperSFC §V Fig. 14: software LB 20.86% CPU vs < 3%",
            ),
        ],
    },
    Figure {
        bench: "chc",
        figure: "CHC §7.1, §7.3 R4-R6, §5.4 (Figs. 8, 13, 14)",
        shows: "per-packet cost of externalized state, offloaded updates, logical clocks, recovery",
        refs: &[
            r(
                "metrics.overhead_us_p50_t",
                2.07,
                "CHC §7.1: traditional NAT median 2.07 µs",
            ),
            r(
                "metrics.overhead_us_p50_na",
                2.61,
                "CHC §7.1: #3 (non-blocking, cached) median 2.61 µs",
            ),
            r(
                "ratios.na_vs_t_overhead_us",
                0.54,
                "CHC §7.1: 2.61 − 2.07 µs",
            ),
            r(
                "metrics.overhead_us_p50_eo",
                192.7,
                "CHC §7.1: every operation to the store, median 192.7 µs",
            ),
            r(
                "metrics.offload_us_p50",
                29.7,
                "CHC §7.1: offloaded update 29.7 µs",
            ),
            r(
                "metrics.lock_rw_us_p50",
                64.6,
                "CHC §7.1: naive lock-read-modify-write 64.6 µs",
            ),
            r(
                "ratios.offload_vs_lock_rw",
                2.17,
                "CHC §7.1: naive approach 2.17× worse",
            ),
            r(
                "metrics.trojans_found_with_clocks",
                11.0,
                "CHC §7.3 R4: all 11 trojans found with logical clocks",
            ),
            r(
                "metrics.store_recovery_ms_10w_150ms",
                388.2,
                "CHC §5.4 Fig. 14: store recovery 388.2 ms at 150 ms checkpoints",
            ),
            r(
                "metrics.root_recovery_ms",
                0.041,
                "CHC §7.3 R6: root recovery 41 µs",
            ),
        ],
    },
    Figure {
        bench: "hashmvt",
        figure: "HashMVT §VI (Figs. 6-7)",
        shows: "insertion collisions on real prefixes, hardware CRC32C matching, MVT vs trie",
        refs: &[
            r(
                "metrics.max_collision_rate_pct",
                0.6,
                "HashMVT §VI-B Fig. 6: maximum collision rate below 0.6%",
            ),
            r(
                "ratios.crc32c_hw_vs_sw",
                5.0,
                "HashMVT §VI-C: hardware CRC32C 5× a table-driven CRC",
            ),
        ],
    },
    Figure {
        bench: "soak",
        figure: "issue #21 (no paper)",
        shows: "the process's memory after minutes of churning flows against after the warm-up (goal: at most 1.05)",
        refs: &[],
    },
];

/// The figure `bench` reproduces, if we know it.
pub fn figure(bench: &str) -> Option<&'static Figure> {
    FIGURES.iter().find(|f| f.bench == bench)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_bench_has_a_figure_and_keys_are_qualified() {
        for b in crate::BENCHES {
            assert!(figure(b.name).is_some(), "{} has no figure", b.name);
        }
        for f in FIGURES {
            for r in f.refs {
                assert!(
                    r.key.starts_with("ratios.") || r.key.starts_with("metrics."),
                    "{}: {}",
                    f.bench,
                    r.key
                );
                assert!(r.value.is_finite() && r.value > 0.0, "{}", r.key);
            }
        }
    }
}
