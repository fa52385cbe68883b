//! Every submit mode gives exactly the full tables' verdict for every packet, whatever the
//! caches hold: the fast path (caches, bypass, lazy stacks, Bloom guesses) against
//! `FullTables::reference`, the pipeline run on the full tables alone.

use flowstate_fastpath::full::{self, FullTables};
use flowstate_fastpath::sim::{Costs, Sim};
use flowstate_fastpath::{
    FastPath, Field, Fields, Headers, Kind, Mode, Packet, Pipeline, Rule, Table,
};
use flowstate_state::local::LocalStore;
use proptest::prelude::*;

mod common;
use common::{packet_strategy, pipeline, rules, rules_strategy, Rules};

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
