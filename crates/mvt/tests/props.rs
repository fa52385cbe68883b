//! Property tests: MVT lookups agree with a naive longest-prefix match; shard/combine and
//! split/merge preserve the set of matches.

use flowstate_mvt::trie::BinaryTrie;
use flowstate_mvt::{Entry, Hasher, Key, Match, Mvt, NEVER};
use prefix_trie::PrefixMap;
use proptest::prelude::*;
use std::net::Ipv4Addr;

/// A rule: a prefix of a 32-bit address. Addresses are drawn from a few /8s so that rules
/// overlap and random keys hit them.
fn rule() -> impl Strategy<Value = (u32, u8)> {
    (
        0u32..4,
        any::<u32>(),
        prop_oneof![0u8..=32, Just(8u8), Just(16), Just(24), Just(32)],
    )
        .prop_map(|(net, low, len)| (((10 + net) << 24) | (low & 0x00ff_ffff), len))
}

fn key() -> impl Strategy<Value = u32> {
    (0u32..5, any::<u32>()).prop_map(|(net, low)| ((10 + net) << 24) | (low & 0x00ff_ffff))
}

fn m(addr: u32, len: u8) -> Match {
    Match::v4(Ipv4Addr::from(addr), len)
}

/// The value of the longest matching rule, the first among equal ones (naive oracle).
fn naive(rules: &[(Match, u32)], k: &Key) -> Option<u32> {
    let mut best: Option<(u16, u32)> = None;
    for (r, v) in rules {
        if r.matches(k) && best.is_none_or(|(l, _)| r.len() > l) {
            best = Some((r.len(), *v));
        }
    }
    best.map(|(_, v)| v)
}

fn table(rules: &[(Match, u32)], hasher: Hasher, cache: usize) -> Mvt<u32> {
    let mut t = Mvt::with_options(32, 4, cache, hasher);
    for (r, v) in rules {
        t.insert(Entry::new(*r, *v, 0, NEVER, 0)).unwrap();
    }
    t
}

fn value(t: &mut Mvt<u32>, k: &Key) -> Option<u32> {
    t.lookup(k).and_then(|id| t.get(id).copied())
}

fn unique(rules: Vec<(u32, u8)>) -> Vec<(Match, u32)> {
    let mut out: Vec<(Match, u32)> = Vec::new();
    for (i, (a, l)) in rules.into_iter().enumerate() {
        let r = m(a, l);
        if !out.iter().any(|(x, _)| *x == r) {
            out.push((r, i as u32));
        }
    }
    out
}

/// One step of `classes_follow_a_model`: insert a match, remove, rematch or invalidate the
/// `n`-th live entry.
#[derive(Debug, Clone)]
enum Op {
    Insert(u8, u8),
    Remove(usize),
    Rematch(usize, u8, u8),
    Invalidate(usize),
}

fn op() -> impl Strategy<Value = Op> {
    // Few distinct matches over 8-bit keys, so that equal matches pile up in classes (as a
    // pool of `*` entries does) and rows are shared.
    let mt = (
        prop_oneof![Just(0u8), Just(0x40), Just(0x48), Just(0xc0)],
        prop_oneof![Just(0u8), Just(2), Just(4), Just(8)],
    );
    prop_oneof![
        3 => mt.clone().prop_map(|(a, l)| Op::Insert(a, l)),
        1 => any::<usize>().prop_map(Op::Remove),
        2 => (any::<usize>(), mt).prop_map(|(i, (a, l))| Op::Rematch(i, a, l)),
        1 => any::<usize>().prop_map(Op::Invalidate),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn lookup_is_longest_prefix_match(
        rules in prop::collection::vec(rule(), 0..60),
        keys in prop::collection::vec(key(), 1..80),
        sw in any::<bool>(),
        cache in prop_oneof![Just(0usize), Just(4), Just(1024)],
    ) {
        // Duplicates included: the first inserted of equal matches wins.
        let rules: Vec<(Match, u32)> =
            rules.into_iter().enumerate().map(|(i, (a, l))| (m(a, l), i as u32)).collect();
        let hasher = if sw { Hasher::Software } else { Hasher::Hardware };
        let mut t = table(&rules, hasher, cache);
        let mut trie = BinaryTrie::new();
        for (r, v) in rules.iter().rev() {
            trie.insert(r, *v); // reversed: the first inserted wins, as in the MVT
        }
        let ks: Vec<Key> = keys.iter().map(|&a| Key::v4_u32(a)).collect();
        let mut batch = vec![None; ks.len()];
        t.lookup_batch(&ks, &mut batch);
        let mut uncached = vec![None; ks.len()];
        t.lookup_uncached_batch(&ks, &mut uncached);
        for (i, k) in ks.iter().enumerate() {
            let want = naive(&rules, k);
            prop_assert_eq!(value(&mut t, k), want, "key {:?}", k);
            prop_assert_eq!(value(&mut t, k), want, "cached, key {:?}", k);
            prop_assert_eq!(t.lookup_uncached(k).and_then(|id| t.get(id).copied()), want);
            prop_assert_eq!(batch[i].and_then(|id| t.get(id).copied()), want);
            prop_assert_eq!(uncached[i].and_then(|id| t.get(id).copied()), want);
            prop_assert_eq!(trie.lookup(k), want);
        }
        // Removing half the rules (the cache must forget them).
        let ids: Vec<_> = t.iter().map(|(id, _)| id).collect();
        let mut kept = Vec::new();
        for id in ids {
            let e = t.entry(id).unwrap().clone();
            if e.value.is_multiple_of(2) {
                t.remove(id);
            } else {
                kept.push((*e.matching(), e.value));
            }
        }
        kept.sort_by_key(|r| r.1);
        t.lookup_uncached_batch(&ks, &mut uncached);
        for (k, u) in ks.iter().zip(&uncached) {
            prop_assert_eq!(value(&mut t, k), naive(&kept, k));
            prop_assert_eq!(u.and_then(|id| t.get(id).copied()), naive(&kept, k));
        }
    }

    /// Equal matches stay first-in first-out through inserts, removals, rematches (to the end
    /// of the new class), invalidation and table growth; lookups and `find` agree with a model
    /// that keeps every entry in a list.
    #[test]
    fn classes_follow_a_model(ops in prop::collection::vec(op(), 1..120)) {
        let mk = |a: u8, l: u8| Match::prefix(&Key::from_bytes(&[a]), u16::from(l));
        let mut t: Mvt<u32> = Mvt::with_options(8, 1, 8, Hasher::Hardware);
        // (handle, match, value, valid), in the order of the last insert or rematch.
        let mut model: Vec<(flowstate_mvt::EntryId, Match, u32, bool)> = Vec::new();
        for (n, op) in ops.into_iter().enumerate() {
            let n = n as u32;
            match op {
                Op::Insert(a, l) => {
                    let id = t.insert(Entry::new(mk(a, l), n, 0, NEVER, 0)).unwrap();
                    model.push((id, mk(a, l), n, true));
                }
                Op::Remove(i) if !model.is_empty() => {
                    let (id, ..) = model.remove(i % model.len());
                    prop_assert!(t.remove(id).is_some());
                }
                Op::Rematch(i, a, l) if !model.is_empty() => {
                    let mut e = model.remove(i % model.len());
                    t.rematch(e.0, mk(a, l)).unwrap();
                    e.1 = mk(a, l);
                    model.push(e);
                }
                Op::Invalidate(i) if !model.is_empty() => {
                    let i = i % model.len();
                    t.invalidate(model[i].0);
                    model[i].3 = false;
                }
                _ => {}
            }
            let live: Vec<(Match, u32)> =
                model.iter().filter(|e| e.3).map(|e| (e.1, e.2)).collect();
            for a in [0u8, 0x41, 0x49, 0xc3, 0xff] {
                let k = Key::from_bytes(&[a]);
                prop_assert_eq!(value(&mut t, &k), naive(&live, &k), "key {:02x}", a);
            }
            for (a, l) in [(0u8, 0u8), (0x40, 2), (0x40, 4), (0x48, 8), (0xc0, 2), (0, 8)] {
                let want = live.iter().find(|e| e.0 == mk(a, l)).map(|e| e.1);
                prop_assert_eq!(t.find(&mk(a, l)).and_then(|id| t.get(id).copied()), want);
            }
            prop_assert_eq!(t.len(), model.len());
        }
    }

    #[test]
    fn shard_and_combine_preserve_matches(
        rules in prop::collection::vec(rule(), 0..60),
        keys in prop::collection::vec(key(), 1..60),
        salt in any::<u32>(),
    ) {
        let rules = unique(rules);
        let mut t1 = table(&rules, Hasher::Hardware, 64);
        let mut t2 = t1.shard(|e| (e.value ^ salt) % 3 == 0);
        prop_assert_eq!(t1.len() + t2.len(), rules.len());
        // M(T) = M(T1) ∪ M(T2), disjointly.
        let mut all: Vec<(Match, u32)> = t1.iter().chain(t2.iter()).map(|(_, e)| (*e.matching(), e.value)).collect();
        all.sort_by_key(|r| r.1);
        prop_assert_eq!(&all, &rules);
        for k in keys.iter().map(|&a| Key::v4_u32(a)) {
            // Each shard answers for its own rules.
            let r1: Vec<_> = rules.iter().copied().filter(|r| (r.1 ^ salt) % 3 != 0).collect();
            let r2: Vec<_> = rules.iter().copied().filter(|r| (r.1 ^ salt) % 3 == 0).collect();
            prop_assert_eq!(value(&mut t1, &k), naive(&r1, &k));
            prop_assert_eq!(value(&mut t2, &k), naive(&r2, &k));
        }
        t1.combine(t2).unwrap();
        prop_assert_eq!(t1.len(), rules.len());
        for k in keys.iter().map(|&a| Key::v4_u32(a)) {
            prop_assert_eq!(value(&mut t1, &k), naive(&rules, &k));
        }
    }

    #[test]
    fn split_and_merge_preserve_matches(
        rules in prop::collection::vec(rule(), 1..40),
        keys in prop::collection::vec(key(), 1..60),
        picks in prop::collection::vec(any::<prop::sample::Index>(), 1..8),
    ) {
        let rules = unique(rules);
        let mut t = table(&rules, Hasher::Hardware, 64);
        let ks: Vec<Key> = keys.iter().map(|&a| Key::v4_u32(a)).collect();
        let before: Vec<_> = ks.iter().map(|k| naive(&rules, k)).collect();
        let mut splits = Vec::new();
        for p in picks {
            let ids: Vec<_> = t.iter().map(|(id, _)| id).collect();
            let id = ids[p.index(ids.len())];
            let e = t.entry(id).unwrap().clone();
            match t.split(id) {
                Ok((a, b)) => {
                    let (ea, eb) = (t.entry(a).unwrap(), t.entry(b).unwrap());
                    prop_assert!(!ea.matching().overlaps(eb.matching()));
                    prop_assert!(ea.matching().within(e.matching()) && eb.matching().within(e.matching()));
                    splits.push((a, b));
                }
                Err(flowstate_mvt::MvtError::TooSpecific) => prop_assert_eq!(e.matching().len(), 32),
                Err(err) => prop_assert_eq!(err, flowstate_mvt::MvtError::Shadowed),
            }
            for (k, want) in ks.iter().zip(&before) {
                prop_assert_eq!(value(&mut t, k), *want);
            }
        }
        // Merge back, last split first: each pair is mergeable unless a later split or an
        // existing rule took its parent.
        for (a, b) in splits.into_iter().rev() {
            if t.entry(a).is_some() && t.entry(b).is_some() {
                let had = t.len();
                if t.merge(a, b).is_ok() {
                    prop_assert_eq!(t.len(), had - 1);
                }
            }
            for (k, want) in ks.iter().zip(&before) {
                prop_assert_eq!(value(&mut t, k), *want);
            }
        }
    }
}

/// The real prefix set: 324,903 IPv4 prefixes with a country label.
#[test]
fn real_prefix_set_agrees_with_trie_and_naive() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../../shared/data/ipv4-prefixes.tsv"
    );
    let Ok(text) = std::fs::read_to_string(path) else {
        eprintln!("skipped: {path} not found");
        return;
    };
    let mut labels: Vec<&str> = Vec::new();
    let mut rules: Vec<(Match, u32)> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for line in text.lines() {
        let Some((p, c)) = line.split_once('\t') else {
            continue;
        };
        let Some(mt) = flowstate_mvt::parse_v4_prefix(p) else {
            continue;
        };
        let label = match labels.iter().position(|l| *l == c) {
            Some(i) => i,
            None => {
                labels.push(c);
                labels.len() - 1
            }
        } as u32;
        if seen.insert(mt) {
            rules.push((mt, label));
        }
    }
    assert!(rules.len() > 300_000, "{} prefixes", rules.len());
    let mut t = Mvt::with_capacity(32, rules.len());
    let mut trie = BinaryTrie::new();
    let mut lpm = PrefixMap::<(u32, u8), u32>::new();
    for (r, v) in &rules {
        t.insert(Entry::new(*r, *v, 0, NEVER, 0)).unwrap();
        trie.insert(r, *v);
        let (a, l) = r.to_v4().unwrap();
        lpm.insert((u32::from(a), l), *v);
    }
    // Keys: random addresses, plus addresses inside (and just past) the prefixes.
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x as u32
    };
    let mut keys: Vec<u32> = (0..20_000).map(|_| next()).collect();
    for i in 0..20_000 {
        let (r, _) = rules[(next() as usize) % rules.len()];
        let (a, l) = r.to_v4().unwrap();
        let host = next() & u32::MAX.checked_shr(u32::from(l)).unwrap_or(0);
        keys.push(u32::from(a) | host);
        if i % 4 == 0 {
            keys.push(
                (u32::from(a) | u32::MAX.checked_shr(u32::from(l)).unwrap_or(0)).wrapping_add(1),
            );
        }
    }
    let mut matched = 0;
    for &a in &keys {
        let k = Key::v4_u32(a);
        let want = trie.lookup(&k);
        matched += usize::from(want.is_some());
        assert_eq!(value(&mut t, &k), want, "{}", Ipv4Addr::from(a));
        assert_eq!(
            crate_lpm(&lpm, a),
            want,
            "prefix-trie, {}",
            Ipv4Addr::from(a)
        );
    }
    assert!(matched > keys.len() / 2);
    // The trie itself against a linear scan, on a sample.
    for &a in keys.iter().step_by(400) {
        let k = Key::v4_u32(a);
        assert_eq!(trie.lookup(&k), naive(&rules, &k), "{}", Ipv4Addr::from(a));
    }
}

/// `prefix-trie`'s longest-prefix match of address `a` (an independent, maintained LPM).
fn crate_lpm(lpm: &PrefixMap<(u32, u8), u32>, a: u32) -> Option<u32> {
    lpm.get_lpm(&(a, 32)).map(|(_, v)| *v)
}

/// A random prefix set of every length 0–32 (runs where the real set is absent, as on CI):
/// the MVT, with and without its state cache, agrees with `prefix-trie` and with our trie on
/// random addresses and on addresses inside the prefixes.
#[test]
fn random_prefix_set_agrees_with_prefix_trie_crate() {
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x as u32
    };
    let mut rules: Vec<(Match, u32)> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for i in 0..30_000u32 {
        // Lengths skewed to /16–/24 as in routing tables, every length present; addresses
        // from a few /6s so that prefixes nest.
        let l = match next() % 4 {
            0 => (next() % 33) as u8,
            _ => 16 + (next() % 9) as u8,
        };
        let a = (next() & 0x0fff_ffff) | ((next() % 3) << 28);
        let r = m(a, l);
        if seen.insert(r) {
            rules.push((r, i));
        }
    }
    let mut cached = Mvt::with_options(32, 16, 1 << 12, Hasher::Hardware);
    let mut uncached = Mvt::with_options(32, 16, 0, Hasher::Software);
    let mut trie = BinaryTrie::new();
    let mut lpm = PrefixMap::<(u32, u8), u32>::new();
    for (r, v) in &rules {
        cached.insert(Entry::new(*r, *v, 0, NEVER, 0)).unwrap();
        uncached.insert(Entry::new(*r, *v, 0, NEVER, 0)).unwrap();
        trie.insert(r, *v);
        let (a, l) = r.to_v4().unwrap();
        lpm.insert((u32::from(a), l), *v);
    }
    let mut matched = 0;
    for i in 0..100_000 {
        let a = if i % 2 == 0 {
            next() & 0x3fff_ffff
        } else {
            let (r, _) = rules[next() as usize % rules.len()];
            let (a, l) = r.to_v4().unwrap();
            u32::from(a) | (next() & u32::MAX.checked_shr(u32::from(l)).unwrap_or(0))
        };
        let k = Key::v4_u32(a);
        let want = crate_lpm(&lpm, a);
        matched += usize::from(want.is_some());
        assert_eq!(trie.lookup(&k), want, "trie, {}", Ipv4Addr::from(a));
        assert_eq!(
            value(&mut cached, &k),
            want,
            "cached, {}",
            Ipv4Addr::from(a)
        );
        assert_eq!(value(&mut uncached, &k), want, "{}", Ipv4Addr::from(a));
    }
    assert!(matched > 50_000, "{matched}");
}

fn flow() -> impl Strategy<Value = flowstate_wire::FlowKey> {
    use std::net::IpAddr;
    let addr = prop_oneof![
        any::<u32>().prop_map(|a| IpAddr::from(Ipv4Addr::from(a))),
        any::<u128>().prop_map(|a| IpAddr::from(std::net::Ipv6Addr::from(a))),
    ];
    (addr.clone(), addr, any::<u16>(), any::<u16>(), any::<u8>()).prop_map(|(s, d, sp, dp, p)| {
        flowstate_wire::FlowKey {
            src: s,
            dst: d,
            src_port: sp,
            dst_port: dp,
            proto: p,
        }
    })
}

proptest! {
    /// The per-packet key constructors (fixed-offset writes, no clearing) build the keys and
    /// exact matches the general byte path builds.
    #[test]
    fn flow_keys_and_exact_matches_equal_the_byte_path(f in flow(), tag in any::<u8>(), len in 0u16..400) {
        let mut buf = [0u8; flowstate_wire::flow::FLOW_KEY_MAX_BYTES];
        let bytes = f.to_bytes(&mut buf).to_vec();
        let tagged: Vec<u8> = std::iter::once(tag).chain(bytes.iter().copied()).collect();
        let k = Key::tagged_flow(tag, &f);
        prop_assert_eq!(k, Key::from_bytes(&tagged));
        prop_assert_eq!(Match::exact(&k), Match::prefix(&k, k.bits()));
        prop_assert_eq!(Match::prefix(&k, len).len(), len.min(k.bits()));
        let mut padded = [0u8; flowstate_wire::flow::FLOW_KEY_MAX_BYTES];
        padded[..bytes.len()].copy_from_slice(&bytes);
        let whole = Key::flow(&f);
        prop_assert_eq!(whole, Key::from_bytes(&padded));
        prop_assert_eq!(Match::exact(&whole), Match::prefix(&whole, whole.bits()));
    }
}
