//! Every submit mode gives exactly the full tables' verdict for every packet, whatever the
//! caches hold: the fast path (caches, bypass, lazy stacks, Bloom guesses) against
//! `FullTables::reference`, the pipeline run on the full tables alone.

use flowstate_fastpath::bloom::BloomParams;
use flowstate_fastpath::cache::Prefix;
use flowstate_fastpath::full::{self, FullTables};
use flowstate_fastpath::sim::{Costs, Sim};
use flowstate_fastpath::{
    FastPath, Field, Fields, Headers, Kind, Mode, Next, OnMiss, Packet, Pipeline, Rule, Table,
};
use flowstate_state::local::LocalStore;
use proptest::prelude::*;

const NET: u32 = 0x0a00_0000; // 10.0.0.0/24 holds every destination

/// Seven tables: a branching ACL with a Bloom selector, two LPM route tables on the branches,
/// a tagger and a table keyed on its tag (a key that depends on an earlier write), a load
/// balancer that admits new flows, and a table keyed on the balanced destination.
fn pipeline(caches: &[usize], bloom_bits: usize) -> Pipeline {
    use Field::*;
    let mut acl = Table::new("acl", Kind::Exact, &[Proto, DstPort], &[Mark], caches[0]);
    acl.branches = vec![Next::Table(1), Next::Table(2)];
    acl.default = Rule::default().to_branch(1);
    acl.bloom = Some(BloomParams {
        filters: 4,
        weight: 2,
        bits: bloom_bits,
        hashes: 2,
    });
    let mut web = Table::new("web", Kind::Lpm, &[DstIp], &[Egress], caches[1]);
    web.default = Rule::dropping();
    web.branches = vec![Next::Table(3)];
    let route = Table::new("route", Kind::Lpm, &[DstIp], &[Egress], caches[2]);
    let tag = Table::new("tag", Kind::Exact, &[SrcIp], &[Mark], caches[3]);
    let by_mark = Table::new("by_mark", Kind::Exact, &[Mark], &[Egress], caches[4]);
    let mut lb = Table::new(
        "lb",
        Kind::Exact,
        &[SrcIp, DstIp, SrcPort, DstPort, Proto],
        &[DstIp, DstPort],
        caches[5],
    );
    lb.on_miss = OnMiss::Balance {
        backends: vec![(NET | 200, 8080), (NET | 201, 8080), (NET | 202, 9090)],
    };
    let post = Table::new("post", Kind::Exact, &[DstIp], &[Egress], caches[6]);
    let p = Pipeline {
        tables: vec![acl, web, route, tag, by_mark, lb, post],
    };
    p.check().unwrap();
    p
}

/// (proto, port), mark to set, branch, drop.
type AclRule = ((u8, u16), Option<u32>, u8, bool);

#[derive(Debug, Clone)]
struct Rules {
    acl: Vec<AclRule>,
    web: Vec<(u8, u8, u16)>,
    route: Vec<(u8, u8, u16)>,
    tag: Vec<(u8, u32)>,
    by_mark: Vec<(u32, u16)>,
    post: Vec<(u8, u16, bool)>,
}

fn prefix(host: u8, len: u8) -> Prefix {
    Prefix::of(NET | u32::from(host), 24 + len % 9)
}

fn rules(r: &Rules) -> Vec<Vec<(u128, Rule)>> {
    let acl = r
        .acl
        .iter()
        .map(|((proto, port), mark, branch, drop)| {
            let mut rule = mark.map_or(Rule::default(), |m| Rule::set(Field::Mark, m));
            rule.branch = branch % 2;
            rule.drop = *drop;
            (u128::from(*proto) << 16 | u128::from(*port), rule)
        })
        .collect();
    let lpm = |v: &[(u8, u8, u16)]| {
        let mut out: Vec<(u128, Rule)> = v
            .iter()
            .map(|(h, l, e)| {
                (
                    prefix(*h, *l).key(),
                    Rule::set(Field::Egress, u32::from(*e)),
                )
            })
            .collect();
        out.sort_by_key(|(k, _)| *k);
        out.dedup_by_key(|(k, _)| *k);
        out
    };
    let tag = r
        .tag
        .iter()
        .map(|(s, m)| {
            (
                u128::from(0x0a01_0000 | u32::from(*s)),
                Rule::set(Field::Mark, *m),
            )
        })
        .collect();
    let by_mark = r
        .by_mark
        .iter()
        .map(|(m, e)| (u128::from(*m), Rule::set(Field::Egress, u32::from(*e))))
        .collect();
    let post = r
        .post
        .iter()
        .map(|(h, e, drop)| {
            let mut rule = Rule::set(Field::Egress, u32::from(*e));
            rule.drop = *drop;
            (u128::from(NET | u32::from(*h)), rule)
        })
        .collect();
    vec![
        acl,
        lpm(&r.web),
        lpm(&r.route),
        tag,
        by_mark,
        Vec::new(),
        post,
    ]
}

fn rules_strategy() -> impl Strategy<Value = Rules> {
    (
        prop::collection::vec(
            (
                (prop_oneof![Just(6u8), Just(17)], 0u16..12),
                prop::option::of(0u32..4),
                0u8..2,
                prop::bool::weighted(0.1),
            ),
            0..16,
        ),
        prop::collection::vec((any::<u8>(), any::<u8>(), 1u16..9), 0..24),
        prop::collection::vec((any::<u8>(), any::<u8>(), 1u16..9), 0..24),
        prop::collection::vec((0u8..6, 0u32..4), 0..6),
        prop::collection::vec((0u32..4, 10u16..14), 0..4),
        prop::collection::vec(
            (
                prop_oneof![Just(200u8), Just(201), Just(202), any::<u8>()],
                20u16..24,
                prop::bool::weighted(0.1),
            ),
            0..4,
        ),
    )
        .prop_map(|(acl, web, route, tag, by_mark, post)| Rules {
            acl,
            web,
            route,
            tag,
            by_mark,
            post,
        })
}

fn packet_strategy() -> impl Strategy<Value = Headers> {
    (
        prop_oneof![Just(6u8), Just(17)],
        0u16..12,
        0u8..6,
        any::<u8>(),
        0u16..3,
    )
        .prop_map(|(proto, dst_port, s, d, sp)| Headers {
            src_ip: 0x0a01_0000 | u32::from(s),
            dst_ip: NET | u32::from(d),
            src_port: 1000 + sp,
            dst_port,
            proto,
            mark: 0,
            egress: 0,
        })
}

const COSTS: Costs = Costs {
    pass_ns: 100,
    link_ns: 1_000,
    link_ns_per_byte: 1.0,
    search_ns: 500,
    threads: 4,
};

fn check(
    mode: Mode,
    caches: &[usize],
    bloom_bits: usize,
    r: &Rules,
    packets: &[Headers],
) -> Result<(), TestCaseError> {
    let store = LocalStore::new();
    let p = pipeline(caches, bloom_bits);
    let loaded = full::load(&store, &p, &rules(r)).unwrap();
    let slow = FullTables::open(&store, &p, loaded.prefixes.clone()).unwrap();
    let mut oracle = FullTables::open(&store, &p, loaded.prefixes.clone()).unwrap();
    let mut sim = Sim {
        fast: FastPath::new(&p, mode, loaded.blooms),
        slow,
        costs: COSTS,
    };
    for (i, h) in packets.iter().enumerate() {
        let want = oracle.reference(*h).unwrap();
        let got = sim.run(Packet::new(i as u64, *h, 64, 0)).unwrap();
        prop_assert_eq!(got.outcome, want, "packet {} {:?} in {:?}", i, h, mode);
        // Each circulation settles at least the first table that missed.
        prop_assert!(usize::from(got.circulations) <= p.tables.len());
        if mode == Mode::Busy {
            prop_assert!(got.link_bytes <= u64::from(got.circulations) * 2 * 100);
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn every_mode_gives_the_full_tables_verdict(
        r in rules_strategy(),
        caches in prop::collection::vec(0usize..6, 7),
        bloom_bits in prop_oneof![Just(64usize), Just(4096)],
        packets in prop::collection::vec(packet_strategy(), 1..120),
    ) {
        for mode in [Mode::Busy, Mode::Lazy, Mode::LazyParallel] {
            check(mode, &caches, bloom_bits, &r, &packets)?;
        }
    }
}

/// A linear pipeline whose every table misses: busy submit circulates once per table, lazy
/// once in all (HyperSFC Fig. 7's setting), and both give the full tables' verdict.
#[test]
fn lazy_submit_circulates_once_where_busy_circulates_per_table() {
    for n in [1usize, 4, 10] {
        let tables: Vec<Table> = (0..n)
            .map(|i| {
                let mut t = Table::new(&format!("t{i}"), Kind::Exact, &[Field::SrcPort], &[], 1024);
                t.writes = Fields::default().with(Field::Mark);
                t
            })
            .collect();
        let p = Pipeline { tables };
        p.check().unwrap();
        let rules: Vec<Vec<(u128, Rule)>> = (0..n)
            .map(|i| {
                (0..100u128)
                    .map(|k| (k, Rule::set(Field::Mark, i as u32)))
                    .collect()
            })
            .collect();
        let mut latency = Vec::new();
        for mode in [Mode::Busy, Mode::Lazy, Mode::LazyParallel] {
            let store = LocalStore::new();
            let loaded = full::load(&store, &p, &rules).unwrap();
            let mut sim = Sim {
                fast: FastPath::new(&p, mode, loaded.blooms),
                slow: FullTables::open(&store, &p, loaded.prefixes).unwrap(),
                costs: COSTS,
            };
            let h = Headers {
                src_port: 7,
                ..Headers::default()
            };
            let first = sim.run(Packet::new(0, h, 64, 0)).unwrap();
            let want = if mode == Mode::Busy { n } else { 1 };
            assert_eq!(
                usize::from(first.circulations),
                want,
                "{mode:?} with {n} tables"
            );
            assert_eq!(first.outcome.headers.mark, n as u32 - 1);
            // The entries are cached now: the flow's next packet takes no circulation.
            let second = sim.run(Packet::new(1, h, 64, 0)).unwrap();
            assert_eq!((second.circulations, second.outcome), (0, first.outcome));
            latency.push(first.latency_ns);
        }
        if n > 1 {
            assert!(
                latency[1] < latency[0] && latency[2] < latency[1],
                "{latency:?}"
            );
        } else {
            assert_eq!(latency[0], latency[1]);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 6, ..ProptestConfig::default() })]

    /// The same on real threads, with packets of many flows in flight at once (a flow's
    /// entries may be installed, or evicted, while its packets circulate).
    #[test]
    fn threads_give_the_full_tables_verdict_too(
        r in rules_strategy(),
        caches in prop::collection::vec(0usize..6, 7),
        packets in prop::collection::vec(packet_strategy(), 1..400),
        window in 1usize..16,
    ) {
        use flowstate_fastpath::threaded::{self, Offer};
        use std::sync::Arc;
        for mode in [Mode::Busy, Mode::Lazy, Mode::LazyParallel] {
            let store = Arc::new(LocalStore::new());
            let p = pipeline(&caches, 64);
            let loaded = full::load(&*store, &p, &rules(&r)).unwrap();
            let mut oracle = FullTables::open(&*store, &p, loaded.prefixes.clone()).unwrap();
            let want: Vec<_> = packets.iter().map(|h| oracle.reference(*h).unwrap()).collect();
            let input: Vec<(Headers, u16)> = packets.iter().map(|h| (*h, 64)).collect();
            let report = threaded::run(
                &mut FastPath::new(&p, mode, loaded.blooms),
                &p,
                &loaded.prefixes,
                store,
                3,
                &input,
                Offer { window, rate_pps: None },
            )
            .unwrap();
            prop_assert_eq!(&report.outcomes, &want, "{:?}", mode);
            let circulations: u64 = report.circulations.iter().map(|c| u64::from(*c)).sum();
            prop_assert_eq!(circulations, report.fast.submits);
        }
    }
}
