//! The fast path's caches of table entries, bounded in entries, evicting by frequency
//! (HyperSFC §III-C).
//!
//! * [`ExactCache`]: entries hit on the slow path are installed as they are.
//! * [`LpmCache`]: installing a prefix installs every longer prefix of the full table under it
//!   (its dependents), and evicting a prefix evicts every cached shorter prefix that covers it,
//!   so the cache never answers with a shorter prefix than the full table would. Invariant:
//!   a cached prefix has all of its full-table descendants cached.
//!
//! Eviction samples [`SAMPLE`] entries and evicts the one the count-min sketch ranks least
//! used (Redis's approximated LFU, here with HyperSFC's sketch): constant work per eviction,
//! no per-entry counters. Nothing is allocated by lookups.
//!
//! A cache can be the master copy of a cache held elsewhere (the XDP program's maps): made
//! with a shared sketch ([`ExactCache::mirrored`], [`LpmCache::mirrored`]), it ranks evictions
//! by the uses counted there and records every change ([`Change`]) in an order that keeps the
//! copy's answers right at every step.

use crate::headers::Rule;
use crate::sketch::CountMin;

/// Entries sampled per eviction.
pub const SAMPLE: usize = 8;

/// Counters of one cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Lookups that found an entry.
    pub hits: u64,
    /// Lookups that found none.
    pub misses: u64,
    /// Entries installed.
    pub installed: u64,
    /// Entries evicted to make room (for an LPM cache, with their dependency groups).
    pub evicted: u64,
    /// Installs refused because their dependency group is larger than the whole cache.
    pub uncacheable: u64,
}

/// A change to a cache's entries, for a copy of the cache kept elsewhere.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    /// The entry for the key is now this rule.
    Put(u128, Rule),
    /// The key's entry is gone.
    Remove(u128),
}

/// The sketch a cache of `capacity` entries ranks by: counters per row, and the uses after
/// which its counts are halved.
pub fn sketch_size(capacity: usize) -> (usize, u64) {
    (
        CountMin::row_width(capacity.max(64) * 2),
        (capacity as u64).max(64) * 8,
    )
}

/// A slab of entries with sampled-LFU eviction, shared by both caches.
#[derive(Debug)]
struct Slab {
    capacity: usize,
    /// Keys come from packets: foldhash's seed per map keeps them from being chosen to collide.
    index: foldhash::HashMap<u128, u32>,
    entries: Vec<(u128, Rule)>,
    sketch: CountMin,
    rng: u64,
    /// Changes not yet taken, when the cache is mirrored.
    changes: Option<Vec<Change>>,
}

impl Slab {
    fn new(capacity: usize, sketch: Option<CountMin>) -> Slab {
        let mirrored = sketch.is_some();
        let sketch = sketch.unwrap_or_else(|| {
            let (width, halve_every) = sketch_size(capacity);
            CountMin::new(width, halve_every)
        });
        Slab {
            capacity,
            index: foldhash::HashMap::with_capacity_and_hasher(capacity, Default::default()),
            entries: Vec::with_capacity(capacity),
            sketch,
            rng: 0x2545_f491_4f6c_dd1d,
            changes: mirrored.then(Vec::new),
        }
    }

    fn take_changes(&mut self) -> Vec<Change> {
        self.changes
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    fn record(&mut self, c: Change) {
        if let Some(changes) = &mut self.changes {
            changes.push(c);
        }
    }

    fn get(&self, key: u128) -> Option<&Rule> {
        self.index.get(&key).map(|&i| &self.entries[i as usize].1)
    }

    fn insert(&mut self, key: u128, rule: Rule) {
        if let Some(&i) = self.index.get(&key) {
            if self.entries[i as usize].1 != rule {
                self.record(Change::Put(key, rule));
                self.entries[i as usize].1 = rule;
            }
            return;
        }
        self.record(Change::Put(key, rule));
        self.index.insert(key, self.entries.len() as u32);
        self.entries.push((key, rule));
    }

    fn remove(&mut self, key: u128) -> bool {
        let Some(i) = self.index.remove(&key) else {
            return false;
        };
        self.record(Change::Remove(key));
        self.entries.swap_remove(i as usize);
        if let Some(&(moved, _)) = self.entries.get(i as usize) {
            self.index.insert(moved, i);
        }
        true
    }

    /// The least used of a few sampled entries.
    fn victim(&mut self) -> Option<u128> {
        if self.entries.is_empty() {
            return None;
        }
        let mut best: Option<(u16, u128)> = None;
        for _ in 0..SAMPLE.min(self.entries.len()) {
            // xorshift64
            self.rng ^= self.rng << 13;
            self.rng ^= self.rng >> 7;
            self.rng ^= self.rng << 17;
            let key = self.entries[(self.rng % self.entries.len() as u64) as usize].0;
            let f = self.sketch.estimate(key);
            if best.is_none_or(|(bf, _)| f < bf) {
                best = Some((f, key));
            }
        }
        best.map(|(_, k)| k)
    }
}

/// An exact-match cache.
#[derive(Debug)]
pub struct ExactCache {
    slab: Slab,
    stats: CacheStats,
}

impl ExactCache {
    /// An empty cache of at most `capacity` entries.
    pub fn new(capacity: usize) -> ExactCache {
        ExactCache {
            slab: Slab::new(capacity, None),
            stats: CacheStats::default(),
        }
    }

    /// An empty cache that is the master copy of one held elsewhere: it ranks evictions by
    /// `sketch` (where the copy counts its uses) and records its changes.
    pub fn mirrored(capacity: usize, sketch: CountMin) -> ExactCache {
        ExactCache {
            slab: Slab::new(capacity, Some(sketch)),
            stats: CacheStats::default(),
        }
    }

    /// The changes since the last call, in order (none unless [`mirrored`](Self::mirrored)).
    pub fn take_changes(&mut self) -> Vec<Change> {
        self.slab.take_changes()
    }

    /// The sketch evictions rank by.
    pub fn sketch_mut(&mut self) -> &mut CountMin {
        &mut self.slab.sketch
    }

    /// The entry for `key`, counting the use.
    pub fn lookup(&mut self, key: u128) -> Option<Rule> {
        self.slab.sketch.touch(key);
        let r = self.slab.get(key).copied();
        match r {
            Some(_) => self.stats.hits += 1,
            None => self.stats.misses += 1,
        }
        r
    }

    /// Installs an entry, evicting the least used of a sample when full.
    pub fn install(&mut self, key: u128, rule: Rule) {
        if self.slab.capacity == 0 {
            self.stats.uncacheable += 1;
            return;
        }
        if self.slab.get(key).is_none() && self.slab.entries.len() >= self.slab.capacity {
            if let Some(v) = self.slab.victim() {
                self.slab.remove(v);
                self.stats.evicted += 1;
            }
        }
        self.slab.insert(key, rule);
        self.stats.installed += 1;
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.slab.entries.len()
    }

    /// Whether the cache is empty.
    pub fn is_empty(&self) -> bool {
        self.slab.entries.is_empty()
    }

    /// Counters.
    pub fn stats(&self) -> CacheStats {
        self.stats
    }
}

/// An IPv4 prefix: address (host bits zero) and length.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Prefix {
    /// The address, host bits zero.
    pub addr: u32,
    /// The length, 0..=32.
    pub len: u8,
}

impl Prefix {
    /// The prefix of length `len` containing `addr`.
    pub fn of(addr: u32, len: u8) -> Prefix {
        Prefix {
            addr: addr & mask(len),
            len,
        }
    }

    /// Whether `addr` is in the prefix.
    pub fn contains(&self, addr: u32) -> bool {
        addr & mask(self.len) == self.addr
    }

    /// Whether `other` is this prefix or lies inside it.
    pub fn covers(&self, other: &Prefix) -> bool {
        other.len >= self.len && self.contains(other.addr)
    }

    /// The last address of the prefix.
    pub fn last(&self) -> u32 {
        self.addr | !mask(self.len)
    }

    /// The prefix as a table key.
    pub fn key(&self) -> u128 {
        u128::from(self.addr) << 8 | u128::from(self.len)
    }

    /// The prefix a table key stands for (the inverse of [`key`](Self::key); a key that
    /// is no prefix's gives a prefix whose length exceeds 32 or whose host bits are set).
    pub fn from_key(key: u128) -> Prefix {
        Prefix {
            addr: (key >> 8) as u32,
            len: key as u8,
        }
    }
}

impl std::fmt::Display for Prefix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", std::net::Ipv4Addr::from(self.addr), self.len)
    }
}

/// The network mask of a prefix length.
pub fn mask(len: u8) -> u32 {
    if len == 0 {
        0
    } else {
        u32::MAX << (32 - u32::from(len.min(32)))
    }
}

/// A longest-prefix-match cache with dependency-aware install and eviction.
#[derive(Debug)]
pub struct LpmCache {
    slab: Slab,
    /// How many cached prefixes have each length (bit `l` of `lengths` set iff nonzero).
    per_length: [u32; 33],
    lengths: u64,
    stats: CacheStats,
}

impl LpmCache {
    /// An empty cache of at most `capacity` prefixes.
    pub fn new(capacity: usize) -> LpmCache {
        Self::with_slab(Slab::new(capacity, None))
    }

    /// An empty cache that is the master copy of one held elsewhere: it ranks evictions by
    /// `sketch` (where the copy counts its uses) and records its changes, in an order that
    /// keeps the invariant at every step: a prefix is put after its dependents and removed
    /// before them.
    pub fn mirrored(capacity: usize, sketch: CountMin) -> LpmCache {
        Self::with_slab(Slab::new(capacity, Some(sketch)))
    }

    fn with_slab(slab: Slab) -> LpmCache {
        LpmCache {
            slab,
            per_length: [0; 33],
            lengths: 0,
            stats: CacheStats::default(),
        }
    }

    /// The changes since the last call, in order (none unless [`mirrored`](Self::mirrored)).
    pub fn take_changes(&mut self) -> Vec<Change> {
        self.slab.take_changes()
    }

    /// The sketch evictions rank by.
    pub fn sketch_mut(&mut self) -> &mut CountMin {
        &mut self.slab.sketch
    }

    /// The longest cached prefix containing `addr`, with its rule. Counts the use of the
    /// prefix found (or of the address, on a miss).
    pub fn lookup(&mut self, addr: u32) -> Option<(Prefix, Rule)> {
        let mut lengths = self.lengths;
        while lengths != 0 {
            let len = 63 - lengths.leading_zeros() as u8;
            lengths &= !(1 << len);
            let p = Prefix::of(addr, len);
            if let Some(r) = self.slab.get(p.key()).copied() {
                self.slab.sketch.touch(p.key());
                self.stats.hits += 1;
                return Some((p, r));
            }
        }
        self.stats.misses += 1;
        None
    }

    /// Whether `p` is cached.
    pub fn contains(&self, p: Prefix) -> bool {
        self.slab.get(p.key()).is_some()
    }

    fn remove(&mut self, p: Prefix) -> bool {
        if !self.slab.remove(p.key()) {
            return false;
        }
        let l = usize::from(p.len);
        self.per_length[l] -= 1;
        if self.per_length[l] == 0 {
            self.lengths &= !(1 << l);
        }
        true
    }

    /// Evicts `p` with every cached prefix covering it (they depend on it: without `p` they
    /// would answer for `p`'s addresses), the shortest first, `p` last. Returns how many were
    /// evicted.
    fn evict_group(&mut self, p: Prefix) -> usize {
        let mut n = 0;
        let mut lengths = self.lengths & ((1u64 << p.len) - 1);
        while lengths != 0 {
            let len = lengths.trailing_zeros() as u8;
            lengths &= lengths - 1;
            n += usize::from(self.remove(Prefix::of(p.addr, len)));
        }
        n + usize::from(self.remove(p))
    }

    /// Installs `group`: a prefix the slow path hit followed by all its full-table descendants.
    /// A group larger than the cache is refused (counted in `uncacheable`); otherwise the least
    /// used prefixes are evicted, each with its covering prefixes, until the group fits. The
    /// group goes in longest prefix first.
    pub fn install(&mut self, group: &[(Prefix, Rule)]) {
        if group.len() > self.slab.capacity {
            self.stats.uncacheable += 1;
            return;
        }
        loop {
            let new = group.iter().filter(|(p, _)| !self.contains(*p)).count();
            if self.slab.entries.len() + new <= self.slab.capacity {
                break;
            }
            let Some(v) = self.slab.victim() else { break };
            self.stats.evicted += self.evict_group(Prefix::from_key(v)) as u64;
        }
        let mut group = group.to_vec();
        group.sort_by_key(|(p, _)| std::cmp::Reverse(p.len));
        for (p, r) in &group {
            if !self.contains(*p) {
                let l = usize::from(p.len);
                self.per_length[l] += 1;
                self.lengths |= 1 << l;
            }
            self.slab.insert(p.key(), *r);
            self.stats.installed += 1;
        }
    }

    /// Prefixes held.
    pub fn len(&self) -> usize {
        self.slab.entries.len()
    }

    /// Whether the cache is empty.
    pub fn is_empty(&self) -> bool {
        self.slab.entries.is_empty()
    }

    /// Every cached prefix.
    pub fn prefixes(&self) -> impl Iterator<Item = Prefix> + '_ {
        self.slab.entries.iter().map(|(k, _)| Prefix::from_key(*k))
    }

    /// Counters.
    pub fn stats(&self) -> CacheStats {
        self.stats
    }
}
