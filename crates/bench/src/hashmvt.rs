//! HashMVT §VI on our Match-Value Tables, every claim against a baseline in the same run:
//!
//! 1. insertion collisions as the number of rules grows, on the real prefix set (§VI-B, Fig. 6);
//! 2. MVT matching with the CPU's CRC32C vs table-driven software CRC32C (§VI-C, Fig. 7), and
//!    the bare hashes of the truncated keys;
//! 3. MVT lookups vs a binary-trie LPM on the real prefix set (§II-C), and vs a maintained
//!    LPM crate (`prefix-trie`'s `PrefixMap`): uncached lookups of distinct addresses, and
//!    lookups of a flow trace (each flow's packets come back, so the state cache answers
//!    them, §III-C);
//! 4. NAT throughput, MVT-partitioned (each worker its own table shard) vs the same NAT with
//!    one table and pool shared between the workers behind a lock (VigNAT-style, §VI-D), 1
//!    and 2 workers, over flows that are created and then carry traffic; and the `nat` NF
//!    with `table = "mvt"` against the default flow-table `nat` on the same established
//!    traffic, driven as `bench nf-throughput` drives it (its final state write-out excluded);
//! 5. a scale-out in the middle of a run (§IV-B): established flows broken (must be 0) and
//!    the share of new flows the new instance takes, with rules aggregated to a budget.
//!
//! The prefix set is `../shared/data/ipv4-prefixes.tsv` (or `$FLOWSTATE_PREFIXES`); without
//! it a synthetic set of the same size is used and `params.prefix_set` says so.

use crate::{Effort, Report};
use flowstate_mvt::trie::BinaryTrie;
use flowstate_mvt::{Entry, Hasher, Key, Match, Mvt, NEVER};
use flowstate_nf::nat::mvt::MvtNat;
use flowstate_nf::nat::Config as NatConfig;
use flowstate_nf::{Context, Direction, NetworkFunction, Packet, Placement, Verdict};
use flowstate_state::local::LocalStore;
use flowstate_state::{Partition, StateConfig};
use flowstate_wire::build::{EthernetSpec, FrameSpec, IpSpec, Ipv4Spec, L4Spec, Payload, UdpSpec};
use flowstate_wire::dissect;
use flowstate_wire::hash::{
    crc32c_bytewise, crc32c_hw_available, Crc32cSteps, SoftCrc, Sse42, Toeplitz,
};
use flowstate_wire::{ipv4, udp, FlowKey};
use prefix_trie::PrefixMap;
use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::{Arc, Mutex};
use std::time::Instant;

pub(crate) fn run(effort: Effort) -> Report {
    let quick = effort == Effort::Quick;
    let mut report = Report::new("hashmvt");
    let (rules, source) = prefixes();
    let rules: Vec<(Match, u32)> = if quick {
        rules.into_iter().step_by(20).collect()
    } else {
        rules
    };
    report
        .param("prefix_set", source)
        .param("prefixes", rules.len())
        .param("crc32c_hw", crc32c_hw_available());
    collisions(&mut report, &rules);
    matching(&mut report, &rules, quick);
    nat(&mut report, quick);
    scale_out(&mut report, quick);
    report
}

/// §IV-B, §VI: a scale-out in the middle of a run. One instance (an MVT pool of `*` entries)
/// takes flows from inside hosts (dispatch is by source prefix, so a host's new flows follow
/// its old ones: "new flows" here are those of hosts that were not active before); its agent reports a load above the threshold; the
/// coordinator starts a second instance, moves 80% of the free pool and installs aggregated
/// dispatch rules; then every established flow is steered again and new flows arrive.
fn scale_out(report: &mut Report, quick: bool) {
    use flowstate_control::{move_free, Action, Agent, Config, Coordinator, Dispatcher};
    let (before, after) = if quick { (500, 500) } else { (20_000, 20_000) };
    let budget = 1024;
    let mut coord = Coordinator::new(
        Config {
            rule_budget: budget,
            ..Config::default()
        },
        0,
        0,
    );
    let mut disp = Dispatcher::new(flowstate_mvt::Field::SrcV4, 0);
    let mut pools: Vec<Mvt<u16>> = vec![Mvt::with_capacity(32, 65_536)];
    let mut flows: Vec<Vec<u32>> = vec![Vec::new()];
    for p in 1024..=65535u16 {
        let _ = pools[0].insert(Entry::new(Match::ANY, p, 0, NEVER, 0));
    }
    // Inside hosts get addresses in order (as DHCP hands them out), four flows each; new
    // hosts after the scale-out come after the old ones.
    let host = |i: u32| 0x0a00_0000 | (i / 4 + 1);
    let open = |pools: &mut [Mvt<u16>], flows: &mut [Vec<u32>], to: usize, h: u32| {
        if let Some(id) = pools[to].find(&Match::ANY) {
            if pools[to].rematch(id, Match::exact(&Key::v4_u32(h))).is_ok() {
                flows[to].push(h);
            }
        }
    };
    for i in 0..before {
        let h = host(i);
        let to = disp.steer(&Key::v4_u32(h)).unwrap_or(0) as usize;
        open(&mut pools, &mut flows, to, h);
    }
    let mut agent = Agent::new(0);
    agent.record(900, 1000);
    let range = flows[0]
        .iter()
        .map(|h| Match::exact(&Key::v4_u32(*h)))
        .collect();
    let free = pools[0]
        .iter()
        .filter(|(_, e)| e.matching().is_any())
        .count() as u64;
    let hb = agent.heartbeat(1_000_000_000, flows[0].len() as u64, free, range);
    coord.on_heartbeat(hb, 1_000_000_000);
    let start = Instant::now();
    let mut rules = 1;
    for a in coord.tick(1_000_000_000) {
        match a {
            Action::ScaleOut { from, .. } => {
                let moved = move_free(&mut pools[from as usize], 0.8, |e| e.matching().is_any());
                report.metric("scale_out_moved_resources", moved.len() as f64);
                pools.push(moved);
                flows.push(Vec::new());
            }
            Action::Rules(r) => {
                rules = r.len();
                disp.install(&r);
            }
            _ => {}
        }
    }
    report.metric("scale_out_decision_ms", start.elapsed().as_secs_f64() * 1e3);
    let mut broken = 0;
    for (i, fs) in flows.iter().enumerate() {
        for h in fs {
            broken += usize::from(disp.steer(&Key::v4_u32(*h)) != Some(i as u32));
        }
    }
    for i in before..before + after {
        let h = host(i);
        let to = (disp.steer(&Key::v4_u32(h)).unwrap_or(0) as usize).min(pools.len() - 1);
        open(&mut pools, &mut flows, to, h);
    }
    let new_at_new = flows.get(1).map_or(0, |f| f.len());
    report.metric("flows_broken_on_scale_out", broken as f64);
    report.metric("instances_after_scale_out", pools.len() as f64);
    report.metric("dispatch_rules", rules as f64);
    report.metric("dispatch_rule_budget", budget as f64);
    report.metric(
        "new_flows_to_new_instance_pct",
        100.0 * new_at_new as f64 / after as f64,
    );
}

/// The real prefix set, each with its label's index; synthetic if the file is missing.
fn prefixes() -> (Vec<(Match, u32)>, String) {
    let candidates = [
        std::env::var("FLOWSTATE_PREFIXES").unwrap_or_default(),
        "../shared/data/ipv4-prefixes.tsv".to_owned(),
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../../shared/data/ipv4-prefixes.tsv"
        )
        .to_owned(),
    ];
    for path in candidates.iter().filter(|p| !p.is_empty()) {
        let Ok(text) = std::fs::read_to_string(path) else {
            continue;
        };
        let mut labels: Vec<String> = Vec::new();
        let mut seen = std::collections::HashSet::new();
        let mut out = Vec::new();
        for line in text.lines() {
            let Some((p, c)) = line.split_once('\t') else {
                continue;
            };
            let Some(m) = flowstate_mvt::parse_v4_prefix(p) else {
                continue;
            };
            let label = match labels.iter().position(|l| l == c) {
                Some(i) => i,
                None => {
                    labels.push(c.to_owned());
                    labels.len() - 1
                }
            };
            if seen.insert(m) {
                out.push((m, label as u32));
            }
        }
        if !out.is_empty() {
            return (out, path.clone());
        }
    }
    let mut x = Rng(7);
    let lens = [8u8, 12, 16, 19, 20, 21, 22, 23, 24, 24, 24, 24];
    let out = (0..324_903)
        .map(|i| {
            let l = lens[x.next() as usize % lens.len()];
            (Match::v4(Ipv4Addr::from(x.next()), l), i % 200)
        })
        .collect();
    (out, "synthetic".to_owned())
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 16) as u32
    }
}

/// §VI-B: the share of insertions that collide, at 10%, 20%, ... of the rules. Two notions:
/// a rule whose 32-bit CRC32C equals that of another rule present (a hash collision, what
/// the paper's chains resolve), and a rule landing in a row (bucket) already holding another
/// rule (depends on the row count; the table keeps at most one rule per row on average).
fn collisions(report: &mut Report, rules: &[(Match, u32)]) {
    let mut t: Mvt<u32> = Mvt::with_capacity(32, 16);
    let step = rules.len().div_ceil(10);
    let (mut max_hash, mut max_row, mut max_shared) = (0f64, 0f64, 0f64);
    for (i, (m, v)) in rules.iter().enumerate() {
        let _ = t.insert(Entry::new(*m, *v, 0, NEVER, 0));
        if (i + 1) % step == 0 || i + 1 == rules.len() {
            let (n, row, hash) = t.collision_stats();
            let (hash_pct, row_pct) = (
                100.0 * hash as f64 / n as f64,
                100.0 * row as f64 / n as f64,
            );
            max_hash = max_hash.max(hash_pct);
            max_row = max_row.max(row_pct);
            max_shared = max_shared.max(100.0 * t.shared_group_inserts() as f64 / n as f64);
            let tenth = (i + 1) * 10 / rules.len();
            report.metric(&format!("collision_rate_pct_at_{}0pct", tenth), hash_pct);
            report.metric(&format!("row_collision_rate_pct_at_{}0pct", tenth), row_pct);
        }
    }
    report.metric("max_collision_rate_pct", max_hash);
    report.metric("max_row_collision_rate_pct", max_row);
    report.metric("max_shared_group_pct", max_shared);
    report.metric("prefix_lengths", t.lengths().len() as f64);
    report.metric("hash_groups", t.groups().len() as f64);
}

/// §VI-C and §II-C: lookups per second of the MVT (hardware and software CRC32C, with and
/// without the state cache) and of the binary trie, on the same keys.
fn matching(report: &mut Report, rules: &[(Match, u32)], quick: bool) {
    let mut hw: Mvt<u32> = Mvt::with_options(32, rules.len(), 1 << 18, Hasher::Hardware);
    let mut sw: Mvt<u32> = Mvt::with_options(32, rules.len(), 1 << 18, Hasher::Software);
    let mut trie = BinaryTrie::new();
    let mut lpm: PrefixMap<(u32, u8), u32> = PrefixMap::new();
    for (m, v) in rules {
        let _ = hw.insert(Entry::new(*m, *v, 0, NEVER, 0));
        let _ = sw.insert(Entry::new(*m, *v, 0, NEVER, 0));
        trie.insert(m, *v);
        if let Some((a, l)) = m.to_v4() {
            lpm.insert((u32::from(a), l), *v);
        }
    }
    let crate_lpm = |k: &Key| {
        let r = k.raw();
        let a = u32::from_be_bytes([r[0], r[1], r[2], r[3]]);
        lpm.get_lpm(&(a, 32)).map_or(0, |(_, v)| *v)
    };
    report.metric("trie_nodes", trie.nodes() as f64);
    // Distinct keys: half uniform over the address space, half inside the prefixes.
    let n = if quick { 20_000 } else { 1_000_000 };
    let mut x = Rng(0x1234_5678);
    let keys: Vec<Key> = (0..n)
        .map(|i| {
            if i % 2 == 0 {
                Key::v4_u32(x.next())
            } else {
                let (m, _) = rules[x.next() as usize % rules.len()];
                let (a, l) = m.to_v4().unwrap_or((Ipv4Addr::UNSPECIFIED, 0));
                Key::v4_u32(
                    u32::from(a) | (x.next() & u32::MAX.checked_shr(u32::from(l)).unwrap_or(0)),
                )
            }
        })
        .collect();
    // A flow trace: 64k flows (addresses drawn as above), 32 packets each, interleaved.
    let flows = if quick { 1 << 10 } else { 1 << 16 };
    let trace: Vec<Key> = (0..flows * 32).map(|i| keys[(i * 7919) % flows]).collect();
    let rounds = if quick { 1 } else { 5 };
    let mut best = [f64::INFINITY; 9];
    for _ in 0..rounds {
        best[7] = best[7].min(time_batched(&keys, |k, o| hw.lookup_uncached_batch(k, o)));
        best[8] = best[8].min(time_batched(&keys, |k, o| sw.lookup_uncached_batch(k, o)));
        best[0] = best[0].min(time(&keys, |k| {
            hw.lookup_uncached(k).map_or(0, |e| e.index())
        }));
        best[1] = best[1].min(time(&keys, |k| {
            sw.lookup_uncached(k).map_or(0, |e| e.index())
        }));
        best[2] = best[2].min(time(&keys, |k| trie.lookup(k).unwrap_or(0)));
        best[3] = best[3].min(time_batched(&trace, |k, o| hw.lookup_batch(k, o)));
        best[4] = best[4].min(time(&trace, |k| trie.lookup(k).unwrap_or(0)));
        best[5] = best[5].min(time(&keys, crate_lpm));
        best[6] = best[6].min(time(&trace, crate_lpm));
    }
    let mlps = |ns: f64| 1e3 / ns;
    report.metric("mvt_hw_uncached_mlookups", mlps(best[0]));
    report.metric("mvt_sw_uncached_mlookups", mlps(best[1]));
    report.metric("trie_mlookups", mlps(best[2]));
    report.metric("mvt_hw_cached_trace_mlookups", mlps(best[3]));
    report.metric("trie_trace_mlookups", mlps(best[4]));
    report.metric("mvt_hw_uncached_ns", best[0]);
    report.metric("trie_ns", best[2]);
    report.ratio("crc32c_hw_vs_sw", best[1] / best[0]);
    report.ratio("mvt_uncached_vs_trie_lookup", best[2] / best[0]);
    report.ratio("mvt_vs_trie_lookup", best[4] / best[3]);
    report.ratio("mvt_cached_vs_uncached", best[0] / best[3]);
    report.metric("crate_lpm_mlookups", mlps(best[5]));
    report.metric("crate_lpm_trace_mlookups", mlps(best[6]));
    report.metric("mvt_hash_groups_probed", hw.groups().len() as f64);
    report.ratio("mvt_vs_crate_lpm_lookup", best[6] / best[3]);
    report.ratio("mvt_uncached_vs_crate_lpm_lookup", best[5] / best[0]);
    // The same distinct keys looked up a batch at a time, their misses overlapped.
    report.metric("mvt_hw_uncached_batch_mlookups", mlps(best[7]));
    report.metric("mvt_sw_uncached_batch_mlookups", mlps(best[8]));
    report.ratio("crc32c_hw_vs_sw_batched", best[8] / best[7]);
    report.ratio("mvt_uncached_batch_vs_trie_lookup", best[2] / best[7]);
    report.ratio("mvt_uncached_batch_vs_crate_lpm_lookup", best[5] / best[7]);
    report.ratio("mvt_uncached_batch_vs_one_by_one", best[0] / best[7]);
    // The hashes alone (the paper's Fig. 7): a 4-byte key as one fixed-width CRC32C step
    // (the instruction, inlined) against the byte-table CRC; and the slice API
    // (`hash::crc32c`, a call that finds its way per key) against the same baseline.
    let reps = rounds.max(3);
    let best_of = |f: &dyn Fn() -> f64| (0..reps).map(|_| f()).fold(f64::INFINITY, f64::min);
    let sw = best_of(&|| time(&keys, |k| crc32c_bytewise(k.bytes())));
    let steps = best_of(&|| time_steps(&keys));
    let slice = best_of(&|| time(&keys, |k| flowstate_wire::hash::crc32c(k.bytes())));
    report.ratio("crc32c_hw_vs_sw_hash_only", sw / steps);
    report.ratio("crc32c_slice_api_vs_sw_hash_only", sw / slice);
}

/// ns per key of the CRC32C of each key's first four bytes in one fixed-width step: the
/// instruction where the CPU has it (compiled in, no call), slicing tables otherwise.
fn time_steps(keys: &[Key]) -> f64 {
    #[cfg(target_arch = "x86_64")]
    if let Some(c) = Sse42::detect() {
        /// # Safety
        /// The CPU must have SSE4.2 (`c` proves it).
        #[target_feature(enable = "sse4.2")]
        unsafe fn on_sse42(keys: &[Key], c: Sse42) -> f64 {
            time(keys, |k| step4(c, k))
        }
        // SAFETY: `c` exists only on a CPU with SSE4.2.
        return unsafe { on_sse42(keys, c) };
    }
    time(keys, |k| step4(SoftCrc, k))
}

#[inline(always)]
fn step4<C: Crc32cSteps>(c: C, k: &Key) -> u32 {
    let r = k.raw();
    !c.step_u32(!0, u32::from_le_bytes([r[0], r[1], r[2], r[3]]))
}

/// ns per key of `f` over `keys`.
#[inline(always)]
fn time(keys: &[Key], mut f: impl FnMut(&Key) -> u32) -> f64 {
    let start = Instant::now();
    let mut acc = 0u32;
    for k in keys {
        acc = acc.wrapping_add(f(black_box(k)));
    }
    black_box(acc);
    start.elapsed().as_nanos() as f64 / keys.len() as f64
}

/// ns per key of `lookup` over `keys` in batches of 32 (as the runtime processes).
fn time_batched(
    keys: &[Key],
    mut lookup: impl FnMut(&[Key], &mut [Option<flowstate_mvt::EntryId>]),
) -> f64 {
    let mut out = [None; 32];
    let start = Instant::now();
    let mut acc = 0u32;
    for chunk in keys.chunks(32) {
        lookup(chunk, &mut out);
        for o in &out[..chunk.len()] {
            acc = acc.wrapping_add(o.map_or(0, |e| e.index()));
        }
    }
    black_box(acc);
    start.elapsed().as_nanos() as f64 / keys.len() as f64
}

// ------------------------------------------------------------------------------------------
// NAT throughput (§VI-D)

const FRAME: usize = 60;

fn nat_config() -> NatConfig {
    let external = (1..=8).map(|i| Ipv4Addr::new(203, 0, 113, i)).collect();
    NatConfig::new(external)
}

/// The translation core of a NAT on an MVT, as §III-D has it: pool entries ⟨external
/// address, port⟩ match `*`; a new flow takes the first and its matching field becomes the
/// flow's 5-tuple. The same code runs partitioned (one core per worker, each with its own
/// share of the pool) and shared (one core for all workers behind a lock, VigNAT-style), so
/// the two differ only in sharing.
struct Core {
    table: Mvt<(Ipv4Addr, u16)>,
}

impl Core {
    fn new(worker: usize, workers: usize, flows: usize) -> Core {
        let mut table = Mvt::with_options(flowstate_mvt::KEY_BITS, flows * 2, 0, Hasher::Hardware);
        for ip in 1..=8u8 {
            for port in (1024 + worker as u32..=65535).step_by(workers) {
                let v = (Ipv4Addr::new(203, 0, 113, ip), port as u16);
                let _ = table.insert(Entry::new(Match::ANY, v, 0, NEVER, 0));
            }
        }
        Core { table }
    }

    fn translate(&mut self, pkt: &mut Packet<'_>) -> bool {
        let Some(flow) = pkt.dissection.flow else {
            return false;
        };
        let m = Match::exact(&Key::flow(&flow));
        let id = match self.table.find(&m) {
            Some(id) => id,
            None => {
                let Some(id) = self.table.find(&Match::ANY) else {
                    return false;
                };
                if self.table.rematch(id, m).is_err() {
                    return false;
                }
                id
            }
        };
        let Some(&(ip, port)) = self.table.get(id) else {
            return false;
        };
        let d = pkt.dissection;
        let Some(l3) = pkt.data.get_mut(d.l3_offset..d.l3_end) else {
            return false;
        };
        let Ok(mut p) = ipv4::Packet::new_checked(l3) else {
            return false;
        };
        let old = p.src_addr().octets();
        p.set_src_addr(ip);
        let Ok(mut u) = udp::Packet::new_checked(p.payload_mut()) else {
            return false;
        };
        u.set_src_port(port);
        u.update_checksum_for_addr(&old, &ip.octets());
        true
    }
}

fn nat(report: &mut Report, quick: bool) {
    let flows = if quick { 4_000 } else { 200_000 };
    let passes = if quick { 2 } else { 8 };
    let keys: Vec<FlowKey> = (0..flows)
        .map(|i| {
            FlowKey::new(
                IpAddr::V4(Ipv4Addr::from(0x0a00_0000 | (i as u32 / 8 + 1))),
                IpAddr::V4(Ipv4Addr::new(198, 51, 100, 10)),
                10_000 + (i % 8) as u16,
                53,
                17,
            )
        })
        .collect();
    let cores = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(2);
    let mut res = std::collections::HashMap::new();
    for workers in 1..=cores {
        for (name, variant) in [
            ("mvt_nat", Variant::Nf),
            ("mvt_core", Variant::Partitioned),
            ("shared_pool", Variant::Shared),
        ] {
            let mpps = nat_mpps(&keys, workers, passes, variant);
            report.metric(&format!("{name}_mpps_{workers}w"), mpps);
            res.insert((name, workers), mpps);
        }
    }
    if cores >= 2 {
        report.ratio(
            "mvt_nat_2w_vs_1w",
            res[&("mvt_nat", 2)] / res[&("mvt_nat", 1)],
        );
        report.ratio(
            "mvt_core_2w_vs_1w",
            res[&("mvt_core", 2)] / res[&("mvt_core", 1)],
        );
        report.ratio(
            "shared_pool_2w_vs_1w",
            res[&("shared_pool", 2)] / res[&("shared_pool", 1)],
        );
        report.ratio(
            "mvt_vs_shared_pool_2w",
            res[&("mvt_core", 2)] / res[&("shared_pool", 2)],
        );
    }
    report.param("nat_flows", flows).param("nat_passes", passes);
    nat_vs_flowtable(report, quick);
}

/// The `nat` NF on an MVT against the default flow-table `nat` (state API, in-process
/// store), one worker each, on the same established flows, driven by `bench nf-throughput`'s
/// runner. Rates are while packets flow: the flow-table NAT's final write-out of its state
/// to the store is left out of both (it is not forwarding work, and the MVT has none).
/// Best of interleaved rounds.
fn nat_vs_flowtable(report: &mut Report, quick: bool) {
    use crate::nf_throughput::{chain_run, chains, flow_keys};
    let (flows, passes, rounds) = if quick {
        (4_000, 2, 1)
    } else {
        (200_000, 10, 3)
    };
    let Some(nat) = chains()
        .into_iter()
        .find(|(name, _)| *name == "nat")
        .and_then(|(_, c)| c.first().map(|(_, t)| *t))
    else {
        return;
    };
    let mvt = format!("{nat}\ntable = \"mvt\"");
    let keys = flow_keys(flows);
    let (mut flow_table, mut on_mvt) = (0f64, 0f64);
    for _ in 0..rounds {
        let store = LocalStore::new();
        flow_table =
            flow_table.max(chain_run(&store, 0, &[("nat", nat)], &keys, 1, passes).mpps_forwarding);
        let store = LocalStore::new();
        on_mvt = on_mvt
            .max(chain_run(&store, 0, &[("nat", mvt.as_str())], &keys, 1, passes).mpps_forwarding);
    }
    report.metric("flowtable_nat_nf_mpps", flow_table);
    report.metric("mvt_nat_nf_mpps", on_mvt);
    report.ratio("mvt_nat_vs_flowtable_nat", on_mvt / flow_table);
    report
        .param("nat_nf_flows", flows)
        .param("nat_nf_passes", passes);
}

fn frame(key: &FlowKey) -> [u8; FRAME] {
    let (IpAddr::V4(src), IpAddr::V4(dst)) = (key.src, key.dst) else {
        return [0; FRAME];
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
    let _ = spec.write(&mut f);
    f
}

/// Total Mpps of `workers` threads over their RSS share of the flows: the first pass creates
/// every flow (allocation from the pool), the others translate established flows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Variant {
    /// The `nat` NF with `table = "mvt"`, one table shard per worker.
    Nf,
    /// The translation core, one table shard per worker.
    Partitioned,
    /// The translation core, one table shared by all workers behind a lock.
    Shared,
}

fn nat_mpps(keys: &[FlowKey], workers: usize, passes: usize, variant: Variant) -> f64 {
    let rss = Toeplitz::symmetric();
    let config = nat_config();
    let store = LocalStore::new();
    let shared_core = Arc::new(Mutex::new(Core::new(0, 1, keys.len())));
    let barrier = std::sync::Barrier::new(workers);
    let cores = core_affinity::get_core_ids().unwrap_or_default();
    let results: Vec<(usize, f64)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..workers)
            .map(|w| {
                let (store, barrier, config, cores) = (&store, &barrier, &config, &cores);
                let shared_core = Arc::clone(&shared_core);
                let share: Vec<[u8; FRAME]> = keys
                    .iter()
                    .filter(|k| rss.hash_flow(k) as usize % workers == w)
                    .map(frame)
                    .collect();
                s.spawn(move || {
                    if cores.len() >= workers {
                        core_affinity::set_for_current(cores[w]);
                    }
                    let mut part = Partition::new(
                        store,
                        StateConfig {
                            partition: w as u32,
                            ..StateConfig::default()
                        },
                    )
                    .expect("local partition");
                    let info = Placement {
                        partition: w as u32,
                        partitions: workers as u32,
                        stage: 0,
                    };
                    let mut nf = (variant == Variant::Nf)
                        .then(|| MvtNat::new(config, &mut part.declare("nat"), info).expect("nat"));
                    let mut own = (variant == Variant::Partitioned)
                        .then(|| Core::new(w, workers, share.len()));
                    barrier.wait();
                    let start = Instant::now();
                    let mut forwarded = 0;
                    let mut clock = 0u64;
                    let mut batch = [[0u8; FRAME]; 32];
                    for _ in 0..passes {
                        for chunk in share.chunks(32) {
                            clock += 3_200;
                            let cx = Context {
                                now: clock,
                                clock: 0,
                                partition: w as u32,
                            };
                            for (slot, f) in batch.iter_mut().zip(chunk) {
                                *slot = *f;
                            }
                            for slot in batch.iter_mut().take(chunk.len()) {
                                let Ok(d) = dissect(slot) else { continue };
                                let mut pkt = Packet {
                                    data: slot,
                                    dissection: d,
                                    direction: Direction::Outbound,
                                };
                                let ok = match (&mut nf, &mut own) {
                                    (Some(nf), _) => nf.process(&mut pkt, &cx) == Verdict::Forward,
                                    (_, Some(core)) => core.translate(&mut pkt),
                                    _ => match shared_core.lock() {
                                        Ok(mut core) => core.translate(&mut pkt),
                                        Err(_) => false,
                                    },
                                };
                                forwarded += usize::from(ok);
                            }
                            if let Some(nf) = &mut nf {
                                nf.on_tick(clock);
                            }
                            part.maybe_flush(clock);
                        }
                    }
                    (forwarded, start.elapsed().as_secs_f64())
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or((0, 1.0)))
            .collect()
    });
    let packets: usize = results.iter().map(|r| r.0).sum();
    let slowest = results.iter().map(|r| r.1).fold(0.0, f64::max);
    packets as f64 / slowest / 1e6
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quick_run_reports_the_contract_keys() {
        let r = run(Effort::Quick);
        assert_eq!(r.name, "hashmvt");
        for k in [
            "max_collision_rate_pct",
            "mvt_hw_uncached_mlookups",
            "trie_mlookups",
            "mvt_nat_mpps_1w",
        ] {
            let v = r.metrics.get(k).copied().unwrap_or(f64::NAN);
            assert!(v.is_finite() && v >= 0.0, "{k} = {v}");
        }
        assert_eq!(r.metrics.get("flows_broken_on_scale_out"), Some(&0.0));
        assert_eq!(r.metrics.get("new_flows_to_new_instance_pct"), Some(&100.0));
        for k in [
            "crc32c_hw_vs_sw",
            "crc32c_hw_vs_sw_batched",
            "mvt_uncached_batch_vs_trie_lookup",
            "mvt_vs_trie_lookup",
            "mvt_vs_crate_lpm_lookup",
            "mvt_nat_vs_flowtable_nat",
        ] {
            assert!(r.ratios.contains_key(k), "{k}");
        }
    }
}
