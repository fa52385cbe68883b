//! The pipeline and rules the differential tests share: seven tables exercising every
//! mechanism (Bloom-selected branches, LPM, keys on earlier writes, balancing, drops).

#![allow(dead_code)] // each test binary uses its own part

use flowstate_fastpath::bloom::BloomParams;
use flowstate_fastpath::cache::Prefix;
use flowstate_fastpath::{Field, Headers, Kind, Next, OnMiss, Pipeline, Rule, Table};
use proptest::prelude::*;

pub(crate) const NET: u32 = 0x0a00_0000; // 10.0.0.0/24 holds every destination

/// Seven tables: a branching ACL with a Bloom selector, two LPM route tables on the branches,
/// a tagger and a table keyed on its tag (a key that depends on an earlier write), a load
/// balancer that admits new flows, and a table keyed on the balanced destination.
pub(crate) fn pipeline(caches: &[usize], bloom_bits: usize) -> Pipeline {
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
pub(crate) type AclRule = ((u8, u16), Option<u32>, u8, bool);

#[derive(Debug, Clone)]
pub(crate) struct Rules {
    pub(crate) acl: Vec<AclRule>,
    pub(crate) web: Vec<(u8, u8, u16)>,
    pub(crate) route: Vec<(u8, u8, u16)>,
    pub(crate) tag: Vec<(u8, u32)>,
    pub(crate) by_mark: Vec<(u32, u16)>,
    pub(crate) post: Vec<(u8, u16, bool)>,
}

pub(crate) fn prefix(host: u8, len: u8) -> Prefix {
    Prefix::of(NET | u32::from(host), 24 + len % 9)
}

pub(crate) fn rules(r: &Rules) -> Vec<Vec<(u128, Rule)>> {
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

pub(crate) fn rules_strategy() -> impl Strategy<Value = Rules> {
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

pub(crate) fn packet_strategy() -> impl Strategy<Value = Headers> {
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
