//! [`FlowTable`]: the open-addressing hash table behind the typed caches, built so a batch of
//! lookups can be prefetched (DESIGN.md "Work in batches (32 packets) so lookups can be
//! prefetched").
//!
//! `std`'s `HashMap` hides where a key lives, so with a million flows every lookup is a
//! DRAM miss that the core waits for alone. Here the slot a key starts probing at is a
//! function of its hash that callers can compute early: [`FlowTable::hash`] a batch of keys,
//! [`FlowTable::prefetch`] each, then look them up — the misses overlap.
//!
//! Layout: a power-of-two number of slots, in two arrays of the same length:
//! * `tags`: one byte per slot, `0` for empty, else 8 bits of the key's hash (never 0), so a
//!   probe past the prefetched slots compares keys only on a tag match; 64 tags share a
//!   cache line.
//! * `slots`: the entries, `Some((key, value))` where the tag is non-zero, each aligned to a
//!   cache line ([`Line`]): an entry of up to 64 bytes (a flow key, a small value and its
//!   timer fields: the NAT's sessions are exactly 64) is one cache line to load, not two.
//!
//! Arrays of 2 MiB or more are advised to the kernel as huge-page candidates
//! (`MADV_HUGEPAGE`): random lookups in a table of a million flows otherwise miss the TLB on
//! nearly every packet.
//!
//! Linear probing from `hash & mask`, at most 7/8 full (the table doubles and rehashes
//! before it gets fuller), so a probe always ends at an empty slot. Removal shifts the
//! entries after the hole back (no tombstones), so probe lengths never degrade over time.
//! The hash is foldhash's `quality` variant under a seed drawn per table: keys come from
//! packets, and with a fixed hash a sender could pick flows whose slots collide, so that every
//! lookup walks one long cluster. The `quality` variant ends with one more folded
//! multiplication than `fast` (the variant of the workspace's `HashMap`s), so every bit of the
//! hash, the low ones that index a slot and the top ones of the tag, depends on every bit of
//! the key, which linear probing needs more than SwissTable's groups do; it replaced Fx's
//! multiply-rotate with murmur3's 64-bit finaliser after it, at about the same cost.

use flowstate_wire::mem::{advise_huge_pages, huge_with_capacity, prefetch_bytes};
use std::hash::{BuildHasher, Hash};

/// Fewest slots of a non-empty table.
const MIN_SLOTS: usize = 8;

/// Slots, from a key's home slot on, that [`FlowTable::prefetch`] loads and lookups compare
/// first (at most [`MIN_SLOTS`]).
const PREFETCH_SLOTS: usize = 2;

/// A hash map from `K` to `V` whose lookups can be prefetched.
pub(crate) struct FlowTable<K, V> {
    /// Per slot: 0 when empty, else the key's [`tag`].
    tags: Vec<u8>,
    /// Per slot: the entry, `Some` exactly where the tag is non-zero.
    slots: Vec<Line<Option<(K, V)>>>,
    /// Entries.
    len: usize,
    /// The keyed hash of this table.
    hasher: foldhash::quality::RandomState,
}

/// A slot of its own cache line(s): entries never straddle a line boundary they need not.
#[repr(align(64))]
struct Line<T>(T);

/// The non-zero tag byte of a hash (its top 8 bits; the index uses the low bits).
#[inline]
fn tag(hash: u64) -> u8 {
    ((hash >> 56) as u8).max(1)
}

impl<K, V> Default for FlowTable<K, V> {
    fn default() -> Self {
        Self::new()
    }
}

impl<K: Hash + Eq, V> FlowTable<K, V> {
    /// The hash of `k` that [`prefetch`](Self::prefetch) takes.
    #[inline]
    pub(crate) fn hash(&self, k: &K) -> u64 {
        self.hasher.hash_one(k)
    }

    /// Starts loading the cache lines a lookup of a key with this `hash` reads: the first
    /// [`PREFETCH_SLOTS`] slots of its probe sequence, which a lookup compares by key before
    /// it reads any tag. A hint: it changes nothing and never fails.
    #[inline]
    pub(crate) fn prefetch(&self, hash: u64) {
        if self.tags.is_empty() {
            return;
        }
        let i = self.home(hash);
        let mask = self.mask();
        // At most half full after growing past 7/8, linear probing leaves about a quarter
        // of the keys past their home slot (1M keys in 2M slots: 76% at home, 14% one slot
        // on, 5% two, 2% three). Two slots cover 90% in two lines; each more line costs
        // every packet memory bandwidth and a fill buffer (measured at a million flows: the
        // tag line and four slots ran 10% slower than two slots alone).
        for d in 0..PREFETCH_SLOTS {
            prefetch_bytes(
                &self.slots[(i + d) & mask].0,
                std::mem::size_of::<Option<(K, V)>>(),
            );
        }
    }

    /// Number of entries.
    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Whether the table has no entries.
    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    #[inline]
    fn mask(&self) -> usize {
        self.tags.len().wrapping_sub(1)
    }

    #[inline]
    fn home(&self, hash: u64) -> usize {
        hash as usize & self.mask()
    }

    /// The slot holding `k`.
    #[inline]
    fn find(&self, hash: u64, k: &K) -> Option<usize> {
        if self.len == 0 {
            return None;
        }
        let t = tag(hash);
        let mask = self.mask();
        let mut i = hash as usize & mask;
        // The slots a prefetch loaded first, by their keys: most keys are found without
        // reading their tags, a line the prefetch did not load.
        for d in 0..PREFETCH_SLOTS {
            match &self.slots[(i + d) & mask].0 {
                Some((key, _)) if key == k => return Some((i + d) & mask),
                Some(_) => {}
                None => return None,
            }
        }
        // Those held other keys: the probe goes on after them.
        i = (i + PREFETCH_SLOTS) & mask;
        loop {
            match self.tags[i] {
                0 => return None,
                x if x == t => {
                    if matches!(&self.slots[i].0, Some((key, _)) if key == k) {
                        return Some(i);
                    }
                }
                _ => {}
            }
            i = (i + 1) & mask;
        }
    }

    /// The value of `k`.
    #[inline]
    pub(crate) fn get(&self, k: &K) -> Option<&V> {
        self.at(self.index_of(k)?)
    }

    /// The value of `k`, to change in place.
    #[inline]
    pub(crate) fn get_mut(&mut self, k: &K) -> Option<&mut V> {
        self.at_mut(self.index_of(k)?)
    }

    /// Where `k`'s entry is, for [`at`](Self::at) and [`at_mut`](Self::at_mut) until the
    /// table next changes: one lookup serving several steps.
    #[inline]
    pub(crate) fn index_of(&self, k: &K) -> Option<usize> {
        self.find(self.hash(k), k)
    }

    /// The value at `i`, from [`index_of`](Self::index_of).
    #[inline]
    pub(crate) fn at(&self, i: usize) -> Option<&V> {
        self.slots.get(i)?.0.as_ref().map(|(_, v)| v)
    }

    /// The value at `i`, from [`index_of`](Self::index_of), to change in place.
    #[inline]
    pub(crate) fn at_mut(&mut self, i: usize) -> Option<&mut V> {
        self.slots.get_mut(i)?.0.as_mut().map(|(_, v)| v)
    }

    /// Sets the value of `k`; returns the value it replaces.
    pub(crate) fn insert(&mut self, k: K, v: V) -> Option<V> {
        let hash = self.hash(&k);
        if let Some(i) = self.find(hash, &k) {
            return self.slots[i]
                .0
                .as_mut()
                .map(|(_, old)| std::mem::replace(old, v));
        }
        if (self.len + 1) * 8 > self.tags.len() * 7 {
            self.grow();
        }
        self.place(hash, k, v);
        self.len += 1;
        None
    }

    /// Puts a key known to be absent in the first empty slot of its probe sequence.
    fn place(&mut self, hash: u64, k: K, v: V) {
        let mask = self.mask();
        let mut i = hash as usize & mask;
        while self.tags[i] != 0 {
            i = (i + 1) & mask;
        }
        self.tags[i] = tag(hash);
        self.slots[i] = Line(Some((k, v)));
    }

    /// Doubles the slots and puts every entry back.
    fn grow(&mut self) {
        let slots = (self.tags.len() * 2).max(MIN_SLOTS);
        self.tags = vec![0; slots];
        advise_huge_pages(&self.tags);
        let old = std::mem::replace(&mut self.slots, huge_with_capacity(slots));
        self.slots.resize_with(slots, || Line(None));
        for (k, v) in old.into_iter().filter_map(|l| l.0) {
            let hash = self.hash(&k);
            self.place(hash, k, v);
        }
    }

    /// Removes the entry of `k`; returns its value.
    pub(crate) fn remove(&mut self, k: &K) -> Option<V> {
        let mut hole = self.find(self.hash(k), k)?;
        let (_, v) = self.slots[hole].0.take()?;
        self.tags[hole] = 0;
        self.len -= 1;
        // Backward shift: move back each following entry of the cluster that may live in
        // the hole (its home is not between the hole and where it is), so that no probe
        // meets an empty slot before its key.
        let mask = self.mask();
        let mut j = hole;
        loop {
            j = (j + 1) & mask;
            if self.tags[j] == 0 {
                break;
            }
            let Some((key, _)) = &self.slots[j].0 else {
                break; // unreachable: a non-zero tag has an entry
            };
            let home = self.hash(key) as usize & mask;
            if (j.wrapping_sub(home) & mask) >= (j.wrapping_sub(hole) & mask) {
                self.tags[hole] = self.tags[j];
                self.tags[j] = 0;
                self.slots[hole].0 = self.slots[j].0.take();
                hole = j;
            }
        }
        Some(v)
    }

    /// Removes every entry, keeping the slots.
    pub(crate) fn clear(&mut self) {
        if self.len == 0 {
            return;
        }
        for (t, s) in self.tags.iter_mut().zip(&mut self.slots) {
            if *t != 0 {
                *t = 0;
                s.0 = None;
            }
        }
        self.len = 0;
    }
}

impl<K, V> FlowTable<K, V> {
    /// An empty table, with a seed of its own; it allocates on the first insert.
    pub(crate) fn new() -> Self {
        Self {
            tags: Vec::new(),
            slots: Vec::new(),
            len: 0,
            hasher: foldhash::quality::RandomState::default(),
        }
    }

    /// The entries, in no particular order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&K, &V)> + '_ {
        self.slots
            .iter()
            .filter_map(|s| s.0.as_ref().map(|(k, v)| (k, v)))
    }

    /// The entries, values mutable, in no particular order.
    pub(crate) fn iter_mut(&mut self) -> impl Iterator<Item = (&K, &mut V)> + '_ {
        self.slots
            .iter_mut()
            .filter_map(|s| s.0.as_mut().map(|(k, v)| (&*k, v)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    #[test]
    fn basics() {
        let mut t: FlowTable<u32, &str> = FlowTable::new();
        assert!(t.is_empty());
        assert_eq!(t.get(&1), None);
        assert!(t.index_of(&1).is_none());
        assert_eq!(t.remove(&1), None);
        t.prefetch(t.hash(&1)); // empty: a no-op
        assert_eq!(t.insert(1, "a"), None);
        assert_eq!(t.insert(1, "b"), Some("a"));
        assert_eq!(t.get(&1), Some(&"b"));
        *t.get_mut(&1).unwrap() = "c";
        assert_eq!(t.len(), 1);
        assert_eq!(t.remove(&1), Some("c"));
        assert!(t.is_empty());
    }

    #[test]
    fn grows_and_clears() {
        let mut t = FlowTable::new();
        for i in 0..10_000u64 {
            t.insert(i, i * 2);
            t.prefetch(t.hash(&i));
        }
        assert_eq!(t.len(), 10_000);
        assert!(t.tags.len() * 7 >= t.len() * 8);
        assert!((0..10_000u64).all(|i| t.get(&i) == Some(&(i * 2))));
        for (_, v) in t.iter_mut() {
            *v += 1;
        }
        assert_eq!(
            t.iter().map(|(_, v)| *v).sum::<u64>(),
            10_000 * 9_999 + 10_000
        );
        let slots = t.tags.len();
        t.clear();
        assert!(t.is_empty());
        assert_eq!(t.iter().count(), 0);
        assert_eq!(t.tags.len(), slots);
        assert_eq!(t.get(&5), None);
    }

    #[test]
    fn each_table_hashes_with_its_own_seed() {
        // Slots an attacker worked out for one table (or one run) say nothing of another's.
        let (a, b) = (FlowTable::<u64, ()>::new(), FlowTable::<u64, ()>::new());
        assert!((0..64u64).any(|k| a.hash(&k) != b.hash(&k)));
        assert!((0..64u64).all(|k| a.hash(&k) == a.hash(&k)));
    }

    /// Every entry is reachable from its home slot without crossing an empty slot.
    fn check_invariants<K: Hash + Eq, V>(t: &FlowTable<K, V>) {
        let mask = t.mask();
        let mut n = 0;
        for (i, (tg, s)) in t.tags.iter().zip(&t.slots).enumerate() {
            assert_eq!(*tg != 0, s.0.is_some());
            if let Some((k, _)) = &s.0 {
                n += 1;
                let h = t.hash(k);
                assert_eq!(*tg, tag(h));
                let mut j = h as usize & mask;
                while j != i {
                    assert_ne!(t.tags[j], 0, "a gap in a probe sequence");
                    j = (j + 1) & mask;
                }
            }
        }
        assert_eq!(n, t.len());
    }

    #[derive(Debug, Clone)]
    enum Op {
        Insert(u16, u32),
        Remove(u16),
        Get(u16),
        Mutate(u16),
        Clear,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            8 => (any::<u16>(), any::<u32>()).prop_map(|(k, v)| Op::Insert(k % 512, v)),
            5 => any::<u16>().prop_map(|k| Op::Remove(k % 512)),
            3 => any::<u16>().prop_map(|k| Op::Get(k % 512)),
            2 => any::<u16>().prop_map(|k| Op::Mutate(k % 512)),
            1 => Just(Op::Clear),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        #[test]
        fn behaves_like_std_hashmap(ops in proptest::collection::vec(op(), 0..2_000)) {
            let mut t: FlowTable<u16, u32> = FlowTable::new();
            let mut m: HashMap<u16, u32> = HashMap::new();
            for op in ops {
                match op {
                    Op::Insert(k, v) => prop_assert_eq!(t.insert(k, v), m.insert(k, v)),
                    Op::Remove(k) => prop_assert_eq!(t.remove(&k), m.remove(&k)),
                    Op::Get(k) => {
                        t.prefetch(t.hash(&k));
                        prop_assert_eq!(t.get(&k), m.get(&k));
                        prop_assert_eq!(t.index_of(&k).is_some(), m.contains_key(&k));
                    }
                    Op::Mutate(k) => {
                        if let Some(v) = t.get_mut(&k) {
                            *v = v.wrapping_add(1);
                        }
                        if let Some(v) = m.get_mut(&k) {
                            *v = v.wrapping_add(1);
                        }
                    }
                    Op::Clear => {
                        t.clear();
                        m.clear();
                    }
                }
                prop_assert_eq!(t.len(), m.len());
            }
            check_invariants(&t);
            let mut got: Vec<(u16, u32)> = t.iter().map(|(k, v)| (*k, *v)).collect();
            let mut want: Vec<(u16, u32)> = m.iter().map(|(k, v)| (*k, *v)).collect();
            got.sort_unstable();
            want.sort_unstable();
            prop_assert_eq!(got, want);
            let mut keys: Vec<u16> = t.iter().map(|(k, _)| *k).collect();
            keys.sort_unstable();
            let mut want_keys: Vec<u16> = m.keys().copied().collect();
            want_keys.sort_unstable();
            prop_assert_eq!(keys, want_keys);
        }
    }
}
