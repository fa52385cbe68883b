//! Dependency-aware LPM caching (HyperSFC §III-C) over the real prefix set: the cache never
//! answers with a shorter prefix than the full table (nor with a negative entry for an address
//! the table matches), and eviction keeps every cached prefix's longer dependents with it.

use flowstate_fastpath::cache::{LpmCache, Prefix};
use flowstate_fastpath::full::PrefixIndex;
use flowstate_fastpath::Rule;
use proptest::prelude::*;
use std::sync::OnceLock;

/// The real prefixes (`../shared/data/ipv4-prefixes.tsv`, 324,903 of them, nearly disjoint)
/// plus covering prefixes every 97th one (its /12 and /16), so that dependency groups of
/// every size exist; or `None` when the data set is not there.
fn index() -> Option<&'static (PrefixIndex, Vec<Prefix>)> {
    static INDEX: OnceLock<Option<(PrefixIndex, Vec<Prefix>)>> = OnceLock::new();
    INDEX
        .get_or_init(|| {
            let path = concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../../../shared/data/ipv4-prefixes.tsv"
            );
            let text = std::fs::read_to_string(path).ok()?;
            let mut index = PrefixIndex::default();
            let mut all = Vec::new();
            for (i, line) in text.lines().enumerate() {
                let Some((p, _)) = line.split_once('\t') else {
                    continue;
                };
                let Some((a, l)) = p.split_once('/') else {
                    continue;
                };
                let (Ok(a), Ok(l)) = (a.parse::<std::net::Ipv4Addr>(), l.parse::<u8>()) else {
                    continue;
                };
                let p = Prefix::of(u32::from(a), l);
                let mut add = |p: Prefix| {
                    index.insert(p);
                    all.push(p);
                };
                add(p);
                if i % 97 == 0 {
                    add(Prefix::of(p.addr, 12));
                    add(Prefix::of(p.addr, 16));
                }
            }
            assert!(all.len() > 300_000, "{} prefixes", all.len());
            Some((index, all))
        })
        .as_ref()
}

fn group(index: &PrefixIndex, p: Prefix) -> Vec<(Prefix, Rule)> {
    std::iter::once(p)
        .chain(index.descendants(p))
        .map(|q| (q, Rule::default().to_branch(q.len)))
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn the_cache_never_answers_with_a_shorter_prefix(
        capacity in prop_oneof![Just(1usize), Just(16), Just(200), Just(5_000)],
        window in any::<prop::sample::Index>(),
        picks in prop::collection::vec((any::<prop::sample::Index>(), any::<u32>(), prop::bool::weighted(0.8)), 1..3_000),
    ) {
        let Some((index, all)) = index() else {
            eprintln!("skipped: ../shared/data/ipv4-prefixes.tsv not found");
            return Ok(());
        };
        let mut cache = LpmCache::new(capacity);
        let mut hits = 0;
        for (pick, noise, inside) in picks {
            // Mostly addresses inside 3,000 neighbouring real prefixes (so that covering
            // prefixes and their dependents meet in the cache), sometimes anywhere.
            let addr = if inside {
                let start = window.index(all.len() - 3_000);
                let p = all[start + pick.index(3_000)];
                p.addr | (noise & !flowstate_fastpath::cache::mask(p.len))
            } else {
                noise
            };
            let truth = index.lpm(addr);
            match cache.lookup(addr) {
                Some((p, rule)) if rule.drop => {
                    // A negative entry: no prefix of the table may contain the address.
                    hits += 1;
                    prop_assert_eq!(truth, None, "negative {} cached for {:#x}", p, addr);
                }
                Some((p, rule)) => {
                    hits += 1;
                    prop_assert_eq!(Some(p), truth, "cache answered {} for {:#x}", p, addr);
                    prop_assert_eq!(rule.branch, p.len);
                }
                None => match truth {
                    Some(p) => cache.install(&group(index, p)),
                    None => {
                        let q = index.widest_empty(addr).expect("an unmatched address has one");
                        prop_assert!(q.contains(addr) && index.descendants(q).next().is_none());
                        cache.install(&[(q, Rule::dropping())]);
                    }
                },
            }
            prop_assert!(cache.len() <= capacity);
        }
        // The invariant behind it: a cached prefix has all of its dependents cached.
        for p in cache.prefixes() {
            for d in index.descendants(p) {
                prop_assert!(cache.contains(d), "{} cached without its dependent {}", p, d);
            }
        }
        let s = cache.stats();
        prop_assert_eq!(s.hits, hits);
        if capacity >= 200 {
            prop_assert!(s.installed > 0);
        }
    }
}

#[test]
fn eviction_takes_the_covering_prefixes_along() {
    let mut index = PrefixIndex::default();
    let wide = Prefix::of(0x0a00_0000, 8); // 10/8
    let mid = Prefix::of(0x0a01_0000, 16); // 10.1/16
    let narrow = Prefix::of(0x0a01_0100, 24); // 10.1.1/24
    let other = Prefix::of(0x0b00_0000, 8);
    for p in [wide, mid, narrow, other] {
        index.insert(p);
    }
    let mut cache = LpmCache::new(3);
    cache.install(&group(&index, wide));
    assert_eq!(cache.len(), 3, "10/8 comes with 10.1/16 and 10.1.1/24");
    // Make the narrow prefix the least used, then force an eviction.
    for _ in 0..50 {
        assert_eq!(cache.lookup(0x0a02_0000).map(|(p, _)| p), Some(wide));
        assert_eq!(cache.lookup(0x0a01_0200).map(|(p, _)| p), Some(mid));
    }
    cache.install(&group(&index, other));
    assert!(cache.contains(other));
    // Whichever went, no prefix stayed without a dependent.
    for p in cache.prefixes() {
        for d in index.descendants(p) {
            assert!(cache.contains(d), "{p} cached without {d}");
        }
    }
    assert!(!cache.contains(wide), "10/8 depends on everything under it");
    // A group larger than the cache is refused, and counted.
    let mut tiny = LpmCache::new(2);
    tiny.install(&group(&index, wide));
    assert_eq!((tiny.len(), tiny.stats().uncacheable), (0, 1));
    assert_eq!(tiny.lookup(0x0a01_0101), None);
}
