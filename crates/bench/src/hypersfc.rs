//! HyperSFC's evaluation (`hypersfc.txt` §V, Figs. 7–14) on flowstate's fast path
//! (`flowstate_fastpath`), in-process realization: the fast path on one thread, the slow path
//! on others, the full tables in our store on loopback (HyperSFC's agent kept them in Redis).
//!
//! * Figs. 7–9: latency of a packet that misses in every table, 1–10 tables, for `base` (every
//!   entry cached), `busy`, `lazy` and `lazy-p` (4 search threads). One packet in flight at a
//!   time; median of all packets.
//! * Fig. 11: bytes between fast and slow path, busy vs lazy, 4 tables.
//! * Fig. 10: latency against the Bloom branch selector's false-positive rate.
//! * Fig. 12: memory of the 2D Bloom filters against the number of branches.
//! * Fig. 13: an L4 load balancer's completion time against the share of its entries cached.
//! * Fig. 14: CPU of the slow path against the same LB run entirely in software (every packet
//!   through a CPU thread), same packets at the same rate.
//! * The fast path's own rate, ten cached tables: in-process, and the XDP program
//!   (`xdp_vs_inprocess_rate_10_tables`, the kernel's time per packet by `BPF_PROG_TEST_RUN`;
//!   needs root).
//!
//! What differs from the paper's setting: the "switch" is a thread, so a circulation costs two
//! thread hand-offs (on one core for the latency figures, see [`on_one_core`]), not a BMv2
//! pass and a veth hop; and its CPU is reported apart (`fast_path_cpu_pct`), as HyperSFC's
//! switch ASIC costs no CPU. With the full tables in the embedded store a search costs about a
//! microsecond and the hand-offs dominate; in our store on loopback a search is a round trip
//! and dominates (keys ending in `_store`).

use crate::{Effort, Report};
use flowstate_fastpath::bloom::{Bloom2d, BloomParams};
use flowstate_fastpath::config::TableRules;
use flowstate_fastpath::full::{self, Found, FullTables, Loaded};
use flowstate_fastpath::threaded::{self, thread_cpu, Offer, RunReport};
use flowstate_fastpath::{
    FastPath, Field, Headers, Kind, Mode, Next, OnMiss, Packet, Pipeline, Rule, Step, Table,
};
use flowstate_state::Connector;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

const SEARCH_THREADS: usize = 4;

/// What a run puts in the fast path's caches before the first packet.
type Preinstall<'a> = dyn Fn(&mut FastPath) + 'a;

fn exact(name: &str, key: &[Field], writes: &[Field], cache: usize) -> Table {
    Table::new(name, Kind::Exact, key, writes, cache)
}

const MARK: &[Field] = &[Field::Mark];

/// `n` exact tables on (source address, port), named `prefix` and their index, each holding
/// the keys of packets `0..keys`, and their rules.
fn marking_tables(
    prefix: &str,
    n: usize,
    keys: usize,
    cache: usize,
) -> (Vec<Table>, Vec<TableRules>) {
    let tables: Vec<Table> = (0..n)
        .map(|i| {
            exact(
                &format!("{prefix}{i}"),
                &[Field::SrcIp, Field::SrcPort],
                MARK,
                cache,
            )
        })
        .collect();
    let rules = marking_rules(&tables, keys);
    (tables, rules)
}

/// For each of `tables`, an entry for the keys of packets `0..keys` that marks the packet
/// with the table's number (from 1).
fn marking_rules(tables: &[Table], keys: usize) -> Vec<TableRules> {
    tables
        .iter()
        .enumerate()
        .map(|(t, table)| {
            (0..keys)
                .map(|i| (flow_key(table, i), Rule::set(Field::Mark, t as u32 + 1)))
                .collect()
        })
        .collect()
}

/// Packet `i`'s headers: a key of its own in every table.
fn headers(i: usize) -> Headers {
    Headers {
        src_ip: 0x0a00_0000 + i as u32,
        dst_ip: 0xc633_6401,
        src_port: 1024 + (i % 50_000) as u16,
        dst_port: 80,
        proto: 6,
        ..Headers::default()
    }
}

fn flow_key(t: &Table, i: usize) -> u128 {
    t.key_of(&headers(i))
}

fn median_us(v: &[u64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_unstable();
    v.get(v.len() / 2).map_or(0.0, |x| *x as f64 / 1e3)
}

fn p99_us(v: &[u64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_unstable();
    v.get(v.len() * 99 / 100).map_or(0.0, |x| *x as f64 / 1e3)
}

#[allow(clippy::too_many_arguments)]
fn run_mode(
    p: &Pipeline,
    loaded: &Loaded,
    connector: &Arc<dyn Connector>,
    mode: Mode,
    preinstall: &Preinstall<'_>,
    packets: &[(Headers, u16)],
    offer: Offer,
) -> Option<RunReport> {
    let mut fast = FastPath::new(p, mode, loaded.blooms.clone());
    preinstall(&mut fast);
    threaded::run(
        &mut fast,
        p,
        &loaded.prefixes,
        Arc::clone(connector),
        SEARCH_THREADS,
        packets,
        offer,
    )
    .map_err(|e| tracing::warn!("hypersfc: {e}"))
    .ok()
}

pub(crate) fn run(effort: Effort) -> Report {
    let mut report = Report::new("hypersfc");
    let quick = effort == Effort::Quick;
    report.param("search_threads", SEARCH_THREADS as u64);
    // The full tables in the embedded store (the default), then in our store on loopback
    // (HyperSFC's agent searched Redis): keys of the second end in `_store`.
    let local: Arc<dyn Connector> = Arc::new(flowstate_state::local::LocalStore::new());
    on_one_core(|| latency_by_tables(&mut report, &local, "", quick));
    on_one_core(|| bloom_false_positives(&mut report, &local, quick));
    on_one_core(|| fast_path_rate(&mut report, &local, quick));
    bloom_memory(&mut report);
    load_balancer(&mut report, &local, "", quick);
    if let Some((server, store)) = crate::chc::loopback_store(&mut report, "store") {
        let store: Arc<dyn Connector> = Arc::new(store);
        on_one_core(|| latency_by_tables(&mut report, &store, "_store", quick));
        load_balancer(&mut report, &store, "_store", quick);
        server.stop();
    }
    report
}

/// Runs `f` on a thread pinned to the last CPU, with every thread it starts (they inherit the
/// CPU set): a latency measurement then sees every fast↔slow hand-off as a switch on one
/// core, not sometimes that and sometimes a wake-up of another (idle, on a virtual machine:
/// tens of microseconds), which made the latencies bimodal from run to run. The store
/// server, started before, keeps every CPU.
fn on_one_core<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    let core = crate::remote::all_cpus().last().copied();
    std::thread::scope(|s| {
        s.spawn(|| {
            if let Some(c) = core {
                core_affinity::set_for_current(c);
            }
            f()
        })
        .join()
        .expect("a bench section does not panic")
    })
}

/// Figs. 7–9 and 11.
fn latency_by_tables(report: &mut Report, connector: &Arc<dyn Connector>, sfx: &str, quick: bool) {
    let packets = if quick { 100 } else { 1_000 };
    let counts: &[usize] = if quick {
        &[1, 4, 10]
    } else {
        &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    };
    report.param("latency_packets", packets as u64);
    let (tables, rules) = marking_tables(&format!("lat{sfx}_"), 10, packets, 1024);
    let all = Pipeline {
        tables: tables.clone(),
    };
    let Ok(loaded) = full::load(&**connector, &all, &rules) else {
        report.param("latency_error", "loading the full tables failed");
        return;
    };
    let input: Vec<(Headers, u16)> = (0..packets).map(|i| (headers(i), 64)).collect();
    let closed = Offer {
        window: 1,
        rate_pps: None,
    };
    for &n in counts {
        let p = Pipeline {
            tables: tables[..n].to_vec(),
        };
        let none = |_: &mut FastPath| {};
        let everything = |f: &mut FastPath| {
            for (t, table_rules) in rules.iter().enumerate().take(n) {
                for (k, r) in table_rules {
                    f.install(t, &Found::entry(*k, *r));
                }
            }
        };
        let runs: [(&str, Mode, &Preinstall<'_>); 4] = [
            ("base", Mode::Busy, &everything),
            ("busy", Mode::Busy, &none),
            ("lazy", Mode::Lazy, &none),
            ("lazyp", Mode::LazyParallel, &none),
        ];
        for (name, mode, pre) in runs {
            let Some(r) = run_mode(&p, &loaded, connector, mode, pre, &input, closed) else {
                continue;
            };
            let expect = n as u32;
            if r.outcomes.iter().any(|o| o.headers.mark != expect) {
                report.param("latency_error", format!("{name}: a wrong verdict"));
            }
            let per = |x: u64| x as f64 / packets as f64;
            report.metric(
                &format!("latency_us_{name}_{n}_tables{sfx}"),
                median_us(&r.latency_ns),
            );
            if n == 10 || n == 4 {
                report.metric(
                    &format!("latency_p99_us_{name}_{n}_tables{sfx}"),
                    p99_us(&r.latency_ns),
                );
                let circ: u64 = r.circulations.iter().map(|c| u64::from(*c)).sum();
                report.metric(
                    &format!("circulations_per_packet_{name}_{n}_tables{sfx}"),
                    per(circ),
                );
                report.metric(
                    &format!("slow_path_cpu_us_per_packet_{name}_{n}_tables{sfx}"),
                    r.slow_cpu.as_secs_f64() * 1e6 / packets as f64,
                );
                report.metric(
                    &format!("link_bytes_per_packet_{name}_{n}_tables{sfx}"),
                    per(r.bytes_up + r.bytes_down),
                );
                report.metric(
                    &format!("completion_ms_{name}_{n}_tables{sfx}"),
                    r.wall.as_secs_f64() * 1e3,
                );
            }
        }
    }
    let metrics = report.metrics.clone();
    let m = |k: &str| metrics.get(k).copied().unwrap_or(f64::NAN);
    let busy10 = m(&format!("latency_us_busy_10_tables{sfx}"));
    report.ratio(
        &format!("lazy_vs_busy_latency_10_tables{sfx}"),
        m(&format!("latency_us_lazy_10_tables{sfx}")) / busy10,
    );
    report.ratio(
        &format!("lazyp_vs_busy_latency_10_tables{sfx}"),
        m(&format!("latency_us_lazyp_10_tables{sfx}")) / busy10,
    );
    report.ratio(
        &format!("lazyp_vs_lazy_latency_10_tables{sfx}"),
        m(&format!("latency_us_lazyp_10_tables{sfx}"))
            / m(&format!("latency_us_lazy_10_tables{sfx}")),
    );
    report.ratio(
        &format!("lazy_vs_busy_bytes_4_tables{sfx}"),
        m(&format!("link_bytes_per_packet_lazy_4_tables{sfx}"))
            / m(&format!("link_bytes_per_packet_busy_4_tables{sfx}")),
    );
    report.ratio(
        &format!("lazy_vs_busy_completion_4_tables{sfx}"),
        m(&format!("completion_ms_lazy_4_tables{sfx}"))
            / m(&format!("completion_ms_busy_4_tables{sfx}")),
    );
}

/// What a pass through ten tables costs when every entry is cached (the fast path's own
/// rate, one thread), against the same pipeline searched in the full tables (the embedded
/// store, through the state API) for every packet.
fn fast_path_rate(report: &mut Report, connector: &Arc<dyn Connector>, quick: bool) {
    let (keys, packets) = if quick {
        (1_000, 200_000)
    } else {
        (10_000, 2_000_000)
    };
    let (tables, rules) = marking_tables("rate", 10, keys, keys);
    let p = Pipeline { tables };
    let Ok(loaded) = full::load(&**connector, &p, &rules) else {
        return;
    };
    let mut fast = FastPath::new(&p, Mode::Lazy, Vec::new());
    for (t, table_rules) in rules.iter().enumerate() {
        for (k, r) in table_rules {
            fast.install(t, &Found::entry(*k, *r));
        }
    }
    let trace: Vec<Headers> = (0..keys).map(headers).collect();
    let start = Instant::now();
    let mut marks = 0u64;
    for i in 0..packets {
        let mut pkt = Packet::new(i as u64, trace[i % keys], 64, 0);
        if fast.pass(&mut pkt) == (Step::Done { dropped: false }) {
            marks += u64::from(pkt.headers.mark);
        }
    }
    let fast_s = start.elapsed().as_secs_f64();
    let Ok(mut slow) = FullTables::open(&**connector, &p, loaded.prefixes) else {
        return;
    };
    let software = packets / 20;
    let start = Instant::now();
    for i in 0..software {
        if let Ok(o) = slow.reference(trace[i % keys]) {
            marks += u64::from(o.headers.mark);
        }
    }
    let slow_s = start.elapsed().as_secs_f64();
    std::hint::black_box(marks);
    #[cfg(target_os = "linux")]
    xdp_rate(report, &p, &rules, &trace, &mut fast, quick);
    report.metric("fast_path_mpps_10_tables", packets as f64 / fast_s / 1e6);
    report.metric("full_tables_mpps_10_tables", software as f64 / slow_s / 1e6);
    report.ratio(
        "fast_path_vs_full_tables_rate_10_tables",
        (packets as f64 / fast_s) / (software as f64 / slow_s),
    );
}

/// The same ten tables, every entry cached, in the XDP realization: the kernel's time per
/// packet (`BPF_PROG_TEST_RUN` repeated on one frame, for each of a sample of the flows: the
/// program alone, without a NIC's or veth's receive path) against the in-process fast path
/// `fast` on the same packets the same way (each repeated, so both run from warm caches).
/// Needs root (loading the program); without it the keys are absent.
#[cfg(target_os = "linux")]
fn xdp_rate(
    report: &mut Report,
    p: &Pipeline,
    rules: &[TableRules],
    trace: &[Headers],
    fast: &mut FastPath,
    quick: bool,
) {
    use flowstate_fastpath::xdp::XdpFastPath;
    const LO: u32 = 1;
    const XDP_PASS: u32 = 2;
    let mut xdp = match XdpFastPath::new(p, Mode::Lazy, &[]) {
        Ok(x) => x,
        Err(e) => {
            eprintln!("hypersfc: the XDP section is skipped: {e}");
            return;
        }
    };
    if xdp.serve_port(LO, 1).is_err() {
        return;
    }
    for (t, table_rules) in rules.iter().enumerate() {
        for (k, r) in table_rules {
            if xdp.install(t, &Found::entry(*k, *r)).is_err() {
                return;
            }
        }
    }
    let (flows, repeat) = if quick { (16, 2_000) } else { (256, 20_000) };
    let step = (trace.len() / flows).max(1);
    let sample: Vec<&Headers> = trace.iter().step_by(step).take(flows).collect();
    let mut xdp_ns = 0.0;
    for h in &sample {
        match xdp.test_run_repeated(LO, &tcp_frame(h), repeat) {
            Ok((XDP_PASS, _, t)) => xdp_ns += f64::from(t),
            _ => return,
        }
    }
    let xdp_ns = xdp_ns / sample.len().max(1) as f64;
    let start = Instant::now();
    let mut marks = 0u64;
    for h in &sample {
        for _ in 0..repeat {
            let mut pkt = Packet::new(0, **h, 64, 0);
            fast.pass(&mut pkt);
            marks += u64::from(pkt.headers.mark);
        }
    }
    std::hint::black_box(marks);
    let inprocess_ns = start.elapsed().as_nanos() as f64 / (sample.len() * repeat as usize) as f64;
    if xdp_ns > 0.0 {
        report.metric("xdp_ns_per_packet_10_tables", xdp_ns);
        report.metric("inprocess_ns_per_packet_10_tables", inprocess_ns);
        report.ratio("xdp_vs_inprocess_rate_10_tables", inprocess_ns / xdp_ns);
    }
}

/// An Ethernet + IPv4 + TCP frame (ACK, no payload) of `h`; its checksums are not needed by
/// the tables.
#[cfg(target_os = "linux")]
fn tcp_frame(h: &Headers) -> Vec<u8> {
    let mut f = vec![2, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0, 2, 0x08, 0x00];
    f.extend_from_slice(&[0x45, 0, 0, 40, 0, 1, 0x40, 0, 64, h.proto, 0, 0]);
    f.extend_from_slice(&h.src_ip.to_be_bytes());
    f.extend_from_slice(&h.dst_ip.to_be_bytes());
    f.extend_from_slice(&h.src_port.to_be_bytes());
    f.extend_from_slice(&h.dst_port.to_be_bytes());
    f.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 0, 0x50, 0x10, 0xff, 0xff, 0, 0, 0, 0]);
    f
}

/// Fig. 10: a branching table with a Bloom selector, then four tables; every table misses.
/// A detected false positive ends the lazy pass at the branch: one more circulation.
fn bloom_false_positives(report: &mut Report, connector: &Arc<dyn Connector>, quick: bool) {
    let packets = if quick { 100 } else { 1_000 };
    let key = [Field::SrcIp, Field::SrcPort];
    let mut branch = exact("fp_branch", &key, MARK, 1024);
    branch.branches = vec![Next::Table(1), Next::Table(2)];
    let mut a = exact("fp_a", &key, MARK, 1024);
    a.branches = vec![Next::Table(3)];
    let b = exact("fp_b", &key, MARK, 1024);
    let rest: Vec<Table> = (0..3)
        .map(|i| exact(&format!("fp_t{i}"), &key, MARK, 1024))
        .collect();
    let mut tables = vec![branch, a, b];
    tables.extend(rest);
    let mut rules = marking_rules(&tables, packets);
    for (i, (_, r)) in rules[0].iter_mut().enumerate() {
        r.branch = (i % 2) as u8;
    }
    let input: Vec<(Headers, u16)> = (0..packets).map(|i| (headers(i), 64)).collect();
    let closed = Offer {
        window: 1,
        rate_pps: None,
    };
    for (label, fp) in [
        ("0_1", 0.001),
        ("1", 0.01),
        ("5", 0.05),
        ("20", 0.2),
        ("50", 0.5),
    ] {
        let mut params = BloomParams::sized(2, packets, fp);
        if fp >= 0.5 {
            params.bits = 64; // saturated: nearly every selection a detected false positive
        }
        let mut tables = tables.clone();
        tables[0].bloom = Some(params);
        let p = Pipeline { tables };
        let Ok(loaded) = full::load(&**connector, &p, &rules) else {
            report.param("fp_error", "loading the full tables failed");
            return;
        };
        let Some(r) = run_mode(&p, &loaded, connector, Mode::Lazy, &|_| {}, &input, closed) else {
            continue;
        };
        let s = r.fast;
        let selections = (s.bloom_guesses + s.bloom_unsure + s.bloom_absent).max(1);
        report.metric(
            &format!("bloom_unsure_pct_fp_target_{label}pct"),
            100.0 * s.bloom_unsure as f64 / selections as f64,
        );
        report.metric(
            &format!("latency_us_lazy_fp_target_{label}pct"),
            median_us(&r.latency_ns),
        );
        report.metric(
            &format!("circulations_per_packet_fp_target_{label}pct"),
            r.circulations.iter().map(|c| f64::from(*c)).sum::<f64>() / packets as f64,
        );
        report.metric(
            &format!("bloom_bits_fp_target_{label}pct"),
            params.bits as f64,
        );
    }
}

/// Fig. 12: bytes of 2D Bloom filters coding 100,000 keys at a 1% false-positive rate per
/// filter, by number of branches; beside, a plain binary code (no false-positive detection).
fn bloom_memory(report: &mut Report) {
    let keys = 100_000;
    for branches in 2..=10usize {
        let p = BloomParams::sized(branches, keys, 0.01);
        if let Ok(b) = Bloom2d::new(p, branches, 1) {
            report.metric(
                &format!("bloom_kb_{branches}_branches"),
                b.memory_bytes() as f64 / 1024.0,
            );
            report.metric(
                &format!("bloom_filters_{branches}_branches"),
                f64::from(p.filters),
            );
        }
        // A binary code: ceil(log2(branches)) filters, each holding about half the keys.
        let filters = usize::BITS - (branches - 1).leading_zeros();
        let per = BloomParams::sized(2, keys, 0.01).bits; // one filter of `keys` keys' size
        report.metric(
            &format!("bloom_kb_binary_code_{branches}_branches"),
            (filters as usize * per / 8) as f64 / 1024.0,
        );
    }
    report.param("bloom_memory_keys", keys as u64);
}

/// The LB of Figs. 13–14: one exact table on the 5-tuple whose full table holds every flow.
fn lb_pipeline(flows: usize) -> Pipeline {
    let mut lb = exact(
        "lb",
        &[
            Field::SrcIp,
            Field::DstIp,
            Field::SrcPort,
            Field::DstPort,
            Field::Proto,
        ],
        &[Field::DstIp, Field::DstPort],
        flows,
    );
    lb.on_miss = OnMiss::Balance {
        backends: (1..=8).map(|i| (0x0a64_0000 | i, 8080)).collect(),
    };
    Pipeline { tables: vec![lb] }
}

/// `flows` flows of `per_flow` packets, interleaved in a fixed pseudo-random order.
fn lb_trace(flows: usize, per_flow: usize) -> Vec<(Headers, u16)> {
    let mut order: Vec<usize> = (0..flows * per_flow).map(|i| i % flows).collect();
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for i in (1..order.len()).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        order.swap(i, (x % (i as u64 + 1)) as usize);
    }
    order.into_iter().map(|f| (headers(f), 64)).collect()
}

fn load_balancer(report: &mut Report, connector: &Arc<dyn Connector>, sfx: &str, quick: bool) {
    let (flows, per_flow) = if quick { (200, 8) } else { (4_000, 32) };
    report.param("lb_flows", flows as u64);
    report.param("lb_packets_per_flow", per_flow as u64);
    let p = lb_pipeline(flows);
    let table = &p.tables[0];
    let rules: Vec<(u128, Rule)> = (0..flows)
        .map(|f| {
            let k = flow_key(table, f);
            (k, table.balance(k).unwrap_or_default())
        })
        .collect();
    let Ok(loaded) = full::load(&**connector, &p, std::slice::from_ref(&rules)) else {
        report.param("lb_error", "loading the full table failed");
        return;
    };
    let trace = lb_trace(flows, per_flow);
    // Fig. 13: completion time with a share of the entries only on the CPU.
    for pct in [0usize, 10, 30, 50, 70, 90] {
        let cached = flows * (100 - pct) / 100;
        let pre = |f: &mut FastPath| {
            for (k, r) in rules.iter().take(cached) {
                f.install(0, &Found::entry(*k, *r));
            }
        };
        let offer = Offer {
            window: 64,
            rate_pps: None,
        };
        if let Some(r) = run_mode(&p, &loaded, connector, Mode::Busy, &pre, &trace, offer) {
            report.metric(
                &format!("lb_completion_ms_cpu_only_{pct}pct{sfx}"),
                r.wall.as_secs_f64() * 1e3,
            );
        }
    }
    // Fig. 14: CPU at the same offered rate, nothing cached at first (the paper's extreme
    // case), against every packet through a software LB thread.
    let rate = if quick { 20_000.0 } else { 40_000.0 };
    report.param("lb_rate_pps", rate);
    let offer = Offer {
        window: 4096,
        rate_pps: Some(rate),
    };
    if let Some(r) = run_mode(&p, &loaded, connector, Mode::Busy, &|_| {}, &trace, offer) {
        let wall = r.wall.as_secs_f64();
        report.metric(
            &format!("slow_path_cpu_pct{sfx}"),
            100.0 * r.slow_cpu.as_secs_f64() / wall,
        );
        report.metric(
            &format!("fast_path_cpu_pct{sfx}"),
            100.0 * r.fast_cpu.as_secs_f64() / wall,
        );
        report.metric(
            &format!("lb_fastpath_latency_us{sfx}"),
            median_us(&r.latency_ns),
        );
    }
    if let Some((cpu, wall, latency)) = software_lb(&p, &loaded, connector, &trace, rate) {
        report.metric(
            &format!("software_lb_cpu_pct{sfx}"),
            100.0 * cpu.as_secs_f64() / wall.as_secs_f64(),
        );
        report.metric(&format!("lb_software_latency_us{sfx}"), median_us(&latency));
    }
    let metrics = report.metrics.clone();
    let m = |k: &str| metrics.get(k).copied().unwrap_or(f64::NAN);
    report.ratio(
        &format!("software_vs_fastpath_cpu{sfx}"),
        m(&format!("software_lb_cpu_pct{sfx}")) / m(&format!("slow_path_cpu_pct{sfx}")),
    );
}

/// The same LB entirely in software: every packet handed to one CPU thread that holds the
/// table in memory (its fast path's cache, as large as the table) and searches the full
/// table for a flow's first packet. Returns that thread's CPU time, the run's wall time and
/// the packets' latencies.
fn software_lb(
    p: &Pipeline,
    loaded: &Loaded,
    connector: &Arc<dyn Connector>,
    trace: &[(Headers, u16)],
    rate: f64,
) -> Option<(Duration, Duration, Vec<u64>)> {
    let (to_cpu, cpu_rx) = mpsc::channel::<Packet>();
    let (done_tx, done_rx) = mpsc::channel::<Packet>();
    let start = Instant::now();
    std::thread::scope(|scope| {
        let worker = scope.spawn(move || -> Option<Duration> {
            let mut fast = FastPath::new(p, Mode::Busy, loaded.blooms.clone());
            let mut tables = FullTables::open(&**connector, p, loaded.prefixes.clone()).ok()?;
            for mut pkt in cpu_rx {
                while fast.pass(&mut pkt) == Step::Submit {
                    flowstate_fastpath::sim::serve(&mut tables, &mut pkt, |t, f| {
                        fast.install(t, &f)
                    })
                    .ok()?;
                }
                let _ = done_tx.send(pkt);
            }
            Some(thread_cpu())
        });
        let mut latency = vec![0u64; trace.len()];
        let mut got = 0;
        for (i, (h, len)) in trace.iter().enumerate() {
            let due = start + Duration::from_secs_f64(i as f64 / rate);
            while Instant::now() < due {
                match done_rx.recv_timeout(due.saturating_duration_since(Instant::now())) {
                    Ok(pkt) => {
                        latency[pkt.id as usize] =
                            (start.elapsed().as_nanos() as u64).saturating_sub(pkt.born_ns);
                        got += 1;
                    }
                    Err(mpsc::RecvTimeoutError::Timeout) => break,
                    Err(mpsc::RecvTimeoutError::Disconnected) => return None,
                }
            }
            let born = start.elapsed().as_nanos() as u64;
            let _ = to_cpu.send(Packet::new(i as u64, *h, *len, born));
        }
        drop(to_cpu);
        while got < trace.len() {
            let pkt = done_rx.recv().ok()?;
            latency[pkt.id as usize] =
                (start.elapsed().as_nanos() as u64).saturating_sub(pkt.born_ns);
            got += 1;
        }
        let wall = start.elapsed();
        let cpu = worker.join().ok()??;
        Some((cpu, wall, latency))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The keys are a contract other tools read: a quick run reports each of them.
    #[test]
    fn a_quick_run_reports_the_contract_names() {
        let r = run(Effort::Quick);
        for k in [
            "lazy_vs_busy_latency_10_tables",
            "lazyp_vs_busy_latency_10_tables",
            "lazy_vs_busy_bytes_4_tables",
            "software_vs_fastpath_cpu",
        ] {
            let v = r.ratios.get(k).copied().unwrap_or(f64::NAN);
            assert!(
                v.is_finite() && v > 0.0,
                "ratios.{k} = {v} in {}",
                r.to_json()
            );
        }
        for k in [
            "slow_path_cpu_pct",
            "software_lb_cpu_pct",
            "latency_us_busy_10_tables",
        ] {
            assert!(
                r.metrics.get(k).is_some_and(|v| v.is_finite()),
                "metrics.{k}"
            );
        }
        // Deterministic parts: one circulation per missing table in busy mode, one in lazy.
        assert_eq!(r.metrics["circulations_per_packet_busy_10_tables"], 10.0);
        assert_eq!(r.metrics["circulations_per_packet_lazy_10_tables"], 1.0);
        assert!(!r.params.contains_key("latency_error"), "{}", r.to_json());
    }
}
