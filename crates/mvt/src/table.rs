//! The Match-Value Table: entries ⟨M(e), V(e)⟩ (HashMVT §III-A), their operations (§III-B)
//! and hash-based multi-prefix matching with a state cache (§III-C).
//!
//! Layout (§III-C, Fig. 3): rules are grouped by length rounded down to a whole byte (their
//! *group*: 32, 24, 16, 8 and 0 bits for IPv4). A lookup hashes the key once per group present
//! (not once per length present, 26 in a real routing table), and the group's node, found by
//! the CRC32C of the key's first `g` bits, holds a 255-bit map of the rules of lengths
//! `g..g+8` under those bits (as Tree Bitmap nodes do): the longest one present for the key's
//! next byte is then found by one exact probe, hashed at its length. Equal matches form one
//! class: the first sits in its row, the others on a first-in first-out side list behind it
//! (a pool of `*` entries costs a lookup one node, §III-D).
//!
//! The rows, slots, group rows and state cache are advised as huge pages
//! ([`flowstate_wire::mem`]): a NAT's table enumerates its pool, hundreds of megabytes looked
//! up at random.

use crate::key::{prefix_eq, Key, Match, KEY_BITS, KEY_BYTES};
use flowstate_wire::hash::{ByteCrc, Crc32cSteps, SoftCrc, Sse42};
use flowstate_wire::mem::{huge_vec, huge_with_capacity};

/// Time in nanoseconds (the runtime's clock; never read here, always passed in).
pub type Nanos = u64;

/// A timeout that never comes.
pub const NEVER: Nanos = u64::MAX;

const NIL: u32 = u32::MAX;

/// How a table computes CRC32C.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Hasher {
    /// The CPU's CRC32C instruction when it has one (SSE4.2), table-driven slicing software
    /// otherwise (default).
    #[default]
    Hardware,
    /// One table lookup per byte whatever the CPU (the software baseline of §VI-C, [32]).
    /// Same values.
    Software,
}

/// The CRC32C steps a table runs on, chosen once at construction.
#[derive(Debug, Clone, Copy)]
enum Unit {
    Hw(Sse42),
    Slicing(SoftCrc),
    Bytewise(ByteCrc),
}

impl Unit {
    fn of(h: Hasher) -> Unit {
        match (h, Sse42::detect()) {
            (Hasher::Hardware, Some(c)) => Unit::Hw(c),
            (Hasher::Hardware, None) => Unit::Slicing(SoftCrc),
            (Hasher::Software, _) => Unit::Bytewise(ByteCrc),
        }
    }
}

/// The group of a match `l` bits long: `l` rounded down to a whole byte.
#[inline(always)]
const fn group(l: u16) -> u16 {
    l & !7
}

/// CRC32C of the first `l` bits of `b` (the last byte masked), started from a value that
/// depends on `l` (so `10` as an 8-bit and as a 16-bit prefix hash apart): 8-byte steps,
/// then a 4-byte one, then single bytes.
#[inline(always)]
fn crc_prefix<C: Crc32cSteps>(c: C, b: &[u8; KEY_BYTES], l: u16) -> u32 {
    let l = l.min(KEY_BITS);
    let n = usize::from(l / 8);
    let mut r = (u32::from(l) + 1).wrapping_mul(0x9e37_79b9);
    let mut at = 0;
    while at + 8 <= n {
        let mut w = [0u8; 8];
        w.copy_from_slice(&b[at..at + 8]);
        r = c.step_u64(r, u64::from_le_bytes(w));
        at += 8;
    }
    if at + 4 <= n {
        let mut w = [0u8; 4];
        w.copy_from_slice(&b[at..at + 4]);
        r = c.step_u32(r, u32::from_le_bytes(w));
        at += 4;
    }
    while at < n {
        r = c.step_u8(r, b[at]);
        at += 1;
    }
    let rem = l % 8;
    if rem != 0 {
        r = c.step_u8(r, b[n] & (0xffu8 << (8 - rem)));
    }
    r
}

/// The bit of a rule `k` bits past its group (0–7) whose next bits are `v`, in its group
/// node's map: `2^k - 1 + v` (one level of a Tree Bitmap node).
#[inline(always)]
fn map_bit(k: u16, v: u8) -> usize {
    (1usize << k) - 1 + usize::from(v)
}

/// A group node: the rules of lengths `g..g+8` under one `g`-bit prefix, as a bit map.
#[derive(Clone)]
struct GroupNode {
    map: [u64; 4],
    prefix: [u8; KEY_BYTES],
    g: u16,
    hash: u32,
    next: u32,
}

/// The state cache's hash of a key of at most 16 bytes (two 8-byte steps, seeded by its
/// width).
#[inline(always)]
fn crc_key16<C: Crc32cSteps>(c: C, k: &Key) -> u32 {
    let b = k.raw();
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[..8]);
    let r = c.step_u64(u32::from(k.bits()), u64::from_le_bytes(w));
    w.copy_from_slice(&b[8..16]);
    c.step_u64(r, u64::from_le_bytes(w))
}

/// A row of the hash table: its first class, and one bit per 5-bit slice of the hashes
/// chained there (a one-word Bloom filter beside the head, so that a probe of a group with
/// no rule in the row reads one cache line and no entry). Bits are set on insert and cleared
/// when the row empties.
#[derive(Debug, Clone, Copy)]
struct Row {
    head: u32,
    filter: u32,
}

impl Row {
    const EMPTY: Row = Row {
        head: NIL,
        filter: 0,
    };
}

/// The bit of hash `h` in its row's filter (the top 5 bits; rows are chosen by the low ones).
#[inline(always)]
fn filter_bit(h: u32) -> u32 {
    1 << (h >> 27)
}

/// An entry's handle: stable while the entry lives (also across [`Mvt::rematch`]); a handle
/// of a removed entry is stale and finds nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EntryId {
    index: u32,
    gen: u32,
}

impl EntryId {
    /// The slot index (dense, below [`Mvt::slots`]).
    pub const fn index(self) -> u32 {
        self.index
    }
}

/// An entry ⟨M(e), V(e)⟩. V(e) is the state `value`, a `timestamp`, a `timeout`, a
/// validity flag and an auxiliary field (§III-A, Fig. 2).
///
/// Laid out with the match and the validity flag first, so that the probe of a row reads
/// one cache line per entry.
#[derive(Debug, Clone, PartialEq, Eq)]
#[repr(C)]
pub struct Entry<V> {
    m: Match,
    valid: bool,
    /// The state value.
    pub value: V,
    /// When the entry was created or last renewed.
    pub timestamp: Nanos,
    /// How long after `timestamp` the entry times out ([`NEVER`]: never).
    pub timeout: Nanos,
    /// The auxiliary field (reserved for the NF: a session count, a resource, ...).
    pub aux: u64,
}

impl<V> Entry<V> {
    /// A valid entry.
    pub fn new(m: Match, value: V, timestamp: Nanos, timeout: Nanos, aux: u64) -> Self {
        Entry {
            m,
            value,
            timestamp,
            timeout,
            valid: true,
            aux,
        }
    }

    /// Its matching field M(e).
    #[inline]
    pub fn matching(&self) -> &Match {
        &self.m
    }

    /// The validity flag: an invalid entry matches nothing and goes at the next cleaning.
    #[inline]
    pub fn is_valid(&self) -> bool {
        self.valid
    }

    /// When it times out.
    #[inline]
    pub fn deadline(&self) -> Nanos {
        self.timestamp.saturating_add(self.timeout)
    }

    /// Whether its time has come by `now`.
    #[inline]
    pub fn timed_out(&self, now: Nanos) -> bool {
        self.deadline() <= now
    }
}

/// An entry's slot: what a row probe reads (hash, chain link, match, validity) in its first
/// cache line.
#[repr(C, align(64))]
struct Slot<V> {
    /// Row hash of the entry's match (valid while `entry` is some).
    hash: u32,
    /// The row's chain of class heads (for a head).
    next: u32,
    entry: Option<Entry<V>>,
    gen: u32,
    /// The class of equal matches: next in first-in first-out order; `dprev` is the previous
    /// one, or for the head the last one (itself when alone).
    dnext: u32,
    dprev: u32,
    /// Whether this entry heads its class (sits in the row's chain).
    head: bool,
    /// Insertion order (for the order of equal matches across table operations).
    seq: u64,
}

/// A state-cache slot: a key of at most 128 bits, the table's epoch when it was filled, and
/// the entry it matched (`index` NIL: no entry).
#[derive(Clone, Copy)]
#[repr(C)]
struct CacheSlot {
    key: [u8; 16],
    epoch: u32,
    index: u32,
    gen: u32,
    /// Width of the key; [`EMPTY_BITS`] when the slot holds nothing.
    bits: u16,
}

const EMPTY_BITS: u16 = u16::MAX;

impl CacheSlot {
    const EMPTY: CacheSlot = CacheSlot {
        key: [0; 16],
        epoch: 0,
        index: NIL,
        gen: 0,
        bits: EMPTY_BITS,
    };
}

/// Two cache slots in one cache line: a set of the 2-way set-associative state cache.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct CacheSet([CacheSlot; 2]);

/// Widest key the state cache holds (wider keys are probed every time).
const CACHE_KEY_BITS: u16 = 128;

/// Why a table operation failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum MvtError {
    /// The handle names no live entry.
    #[error("no such entry")]
    NoEntry,
    /// A split of an entry that matches single keys of the table's width.
    #[error("the entry is as specific as the field allows")]
    TooSpecific,
    /// A split of an entry hidden behind an earlier entry of the same match (its halves would
    /// come to light and change what matches).
    #[error("an earlier entry of the same match shadows the entry")]
    Shadowed,
    /// A merge whose condition (§III-B) does not hold.
    #[error("entries cannot be merged: {0}")]
    NotMergeable(&'static str),
    /// More entries than handles can name.
    #[error("table full")]
    Full,
}

/// A Match-Value Table over keys `width` bits wide.
///
/// Lookups ([`Mvt::lookup`], [`Mvt::lookup_batch`], [`Mvt::find`]) allocate nothing. Inserts
/// allocate only when the table grows past its capacity (use [`Mvt::with_capacity`]).
pub struct Mvt<V> {
    width: u16,
    hasher: Hasher,
    unit: Unit,
    slots: Vec<Slot<V>>,
    free: Vec<u32>,
    live: usize,
    valid: usize,
    /// Rows: the first class head of each chain.
    heads: Vec<Row>,
    mask: u32,
    /// Entries per match length.
    len_count: Vec<u32>,
    /// Lengths with at least one entry, longest first.
    lens: Vec<u16>,
    /// Entries per group (by `group / 8`), and the groups present, longest first.
    group_count: Vec<u32>,
    groups: Vec<u16>,
    /// Group nodes, their rows (chain heads) and free nodes.
    gnodes: Vec<GroupNode>,
    grows: Vec<u32>,
    gmask: u32,
    gfree: Vec<u32>,
    cache: Vec<CacheSet>,
    cache_mask: u32,
    /// Slots the cache was asked for (0: off).
    cache_slots: usize,
    epoch: u32,
    seq: u64,
    inserts: u64,
    row_collisions: u64,
    hash_collisions: u64,
    shared_groups: u64,
}

impl<V> std::fmt::Debug for Mvt<V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mvt")
            .field("width", &self.width)
            .field("entries", &self.live)
            .field("lengths", &self.lens)
            .finish()
    }
}

/// Groups a key can have (one per whole byte of its width, and 0).
const MAX_GROUPS: usize = KEY_BYTES + 1;

/// Keys whose lookups [`Mvt::lookup_uncached_batch`] runs together.
const BATCH_LANES: usize = 8;

/// Default state-cache slots.
pub const DEFAULT_CACHE: usize = 4096;

impl<V> Mvt<V> {
    /// An empty table over keys `width` bits wide (see [`crate::Field::width`]).
    pub fn new(width: u16) -> Self {
        Self::with_capacity(width, 16)
    }

    /// An empty table with room for `entries` before it grows, and the default state cache.
    pub fn with_capacity(width: u16, entries: usize) -> Self {
        Self::with_options(width, entries, DEFAULT_CACHE, Hasher::default())
    }

    /// An empty table: room for `entries`, `cache` state-cache slots (rounded up to a power of
    /// two, 2-way set-associative; 0 turns the cache off, and keys wider than 128 bits never
    /// use it), and the CRC32C implementation.
    pub fn with_options(width: u16, entries: usize, cache: usize, hasher: Hasher) -> Self {
        let buckets = entries.max(8).next_power_of_two();
        let sets = if cache == 0 {
            0
        } else {
            cache.next_power_of_two().div_ceil(2)
        };
        Mvt {
            width: width.min(KEY_BITS),
            hasher,
            unit: Unit::of(hasher),
            slots: huge_with_capacity(entries),
            free: Vec::new(),
            live: 0,
            valid: 0,
            heads: huge_vec(Row::EMPTY, buckets),
            mask: (buckets - 1) as u32,
            len_count: vec![0; usize::from(KEY_BITS) + 1],
            lens: Vec::new(),
            group_count: vec![0; usize::from(KEY_BITS / 8) + 1],
            groups: Vec::new(),
            gnodes: Vec::new(),
            grows: huge_vec(NIL, buckets),
            gmask: (buckets - 1) as u32,
            gfree: Vec::new(),
            cache: huge_vec(CacheSet([CacheSlot::EMPTY; 2]), sets),
            cache_mask: sets.saturating_sub(1) as u32,
            cache_slots: cache,
            epoch: 0,
            seq: 0,
            inserts: 0,
            row_collisions: 0,
            hash_collisions: 0,
            shared_groups: 0,
        }
    }

    /// Width of the keys, bits.
    pub fn width(&self) -> u16 {
        self.width
    }

    /// The CRC32C implementation.
    pub fn hasher(&self) -> Hasher {
        self.hasher
    }

    /// Entries in the table (valid or not).
    pub fn len(&self) -> usize {
        self.live
    }

    /// Whether the table holds no entry.
    pub fn is_empty(&self) -> bool {
        self.live == 0
    }

    /// Valid entries ("active entries" of a heartbeat, §IV-C).
    pub fn valid_len(&self) -> usize {
        self.valid
    }

    /// Slot indices in use so far (an upper bound of [`EntryId::index`]).
    pub fn slots(&self) -> usize {
        self.slots.len()
    }

    /// Match lengths present, longest first.
    pub fn lengths(&self) -> &[u16] {
        &self.lens
    }

    /// Hash groups present (lengths rounded down to a byte), longest first: the hashes an
    /// uncached lookup computes.
    pub fn groups(&self) -> &[u16] {
        &self.groups
    }

    /// Insertions so far, insertions that landed in a row already holding another rule, and
    /// insertions whose 32-bit row hash equals that of another rule present over different
    /// bits (a CRC32C collision, §VI-B).
    pub fn collision_stats(&self) -> (u64, u64, u64) {
        (self.inserts, self.row_collisions, self.hash_collisions)
    }

    /// New matches (by insert or rematch) whose group's bits another rule present shares
    /// (e.g. `10.0.0.0/16` and `10.0.128.0/17`): told apart by the group node's map and the
    /// exact probe, where the paper's chains tell `10/8` and `160/4` apart (§III-C).
    pub fn shared_group_inserts(&self) -> u64 {
        self.shared_groups
    }

    /// Changes the epoch: every cached answer is forgotten.
    #[inline]
    fn bump(&mut self) {
        self.epoch = self.epoch.wrapping_add(1);
        if self.epoch == 0 {
            // Once per 2^32 changes: slots filled 2^32 epochs ago must not look current.
            for s in &mut self.cache {
                *s = CacheSet([CacheSlot::EMPTY; 2]);
            }
        }
    }

    // --------------------------------------------------------------------------------------
    // Hashing (§III-C)

    /// The row hash of match `m`: CRC32C of its bits.
    #[inline]
    fn match_hash(&self, m: &Match) -> u32 {
        self.prefix_hash(&m.as_key(), m.len())
    }

    /// CRC32C of the first `n` bits of `b`.
    #[inline]
    fn prefix_hash(&self, b: &Key, n: u16) -> u32 {
        match self.unit {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Hw` holds a `Sse42`, which exists only when the CPU has SSE4.2.
            Unit::Hw(c) => unsafe { crc_prefix_sse42(c, b.raw(), n) },
            #[cfg(not(target_arch = "x86_64"))]
            Unit::Hw(c) => crc_prefix(c, b.raw(), n),
            Unit::Slicing(c) => crc_prefix(c, b.raw(), n),
            Unit::Bytewise(c) => crc_prefix(c, b.raw(), n),
        }
    }

    // --------------------------------------------------------------------------------------
    // Lookup

    /// The entry matching `key` on the longest prefix, without the state cache (`&self`).
    #[inline]
    pub fn lookup_uncached(&self, key: &Key) -> Option<EntryId> {
        let i = self.probe(key);
        (i != NIL).then(|| self.id(i))
    }

    #[inline]
    fn probe(&self, key: &Key) -> u32 {
        match self.unit {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Hw` holds a `Sse42`, which exists only when the CPU has SSE4.2.
            Unit::Hw(c) => unsafe { self.probe_sse42(c, key) },
            #[cfg(not(target_arch = "x86_64"))]
            Unit::Hw(c) => self.probe_with(c, key),
            Unit::Slicing(c) => self.probe_with(c, key),
            Unit::Bytewise(c) => self.probe_with(c, key),
        }
    }

    /// [`Mvt::probe_with`] compiled for SSE4.2, so that every group's CRC32C steps are
    /// single instructions in the loop.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "sse4.2")]
    unsafe fn probe_sse42(&self, c: Sse42, key: &Key) -> u32 {
        self.probe_with(c, key)
    }

    #[inline(always)]
    fn probe_with<C: Crc32cSteps>(&self, c: C, key: &Key) -> u32 {
        let mut hs = [(0u16, 0u32); MAX_GROUPS];
        let n = self.hash_groups(c, key, &mut hs);
        self.probe_hashed(c, key, &hs[..n])
    }

    /// Hashes `key` at every group present (longest first) into `hs` and prefetches each
    /// group's row, so the probes' memory accesses overlap (§III-C computes the hashes
    /// "simultaneously"); how many groups apply.
    #[inline(always)]
    fn hash_groups<C: Crc32cSteps>(
        &self,
        c: C,
        key: &Key,
        hs: &mut [(u16, u32); MAX_GROUPS],
    ) -> usize {
        let mut n = 0;
        for &g in &self.groups {
            if g > key.bits() {
                continue;
            }
            let h = crc_prefix(c, key.raw(), g);
            prefetch(&self.grows[(h & self.gmask) as usize]);
            hs[n] = (g, h);
            n += 1;
        }
        n
    }

    /// The lookup of `key` from its group hashes: the longest group with a valid match ends
    /// it.
    #[inline(always)]
    fn probe_hashed<C: Crc32cSteps>(&self, c: C, key: &Key, hs: &[(u16, u32)]) -> u32 {
        let kb = key.raw();
        for &(g, h) in hs {
            let node = self.group_node(kb, g, h);
            if node == NIL {
                continue;
            }
            for l in self.shown(node, key, g) {
                let i = self.first_valid(self.class_at(c, key, l));
                if i != NIL {
                    return i;
                }
            }
        }
        NIL
    }

    /// The lengths of the rules group node `node` shows under `key`'s bits after its first
    /// `g`, longest first.
    #[inline(always)]
    fn shown(&self, node: u32, key: &Key, g: u16) -> impl Iterator<Item = u16> + '_ {
        let map = &self.gnodes[node as usize].map;
        let next = key.raw().get(usize::from(g / 8)).copied().unwrap_or(0);
        (0..=(key.bits() - g).min(7)).rev().filter_map(move |k| {
            let bit = map_bit(k, next.checked_shr(u32::from(8 - k)).unwrap_or(0));
            (map[bit / 64] & (1 << (bit % 64)) != 0).then_some(g + k)
        })
    }

    /// Looks every key up as [`Mvt::lookup_uncached`] does, answering in `out` (one per key,
    /// in order; the shorter of the two bounds the batch). The lookups of a few keys at a time
    /// go step by step together, each step's loads prefetched for all of them before any is
    /// read (group rows, group nodes, the longest candidate's row, its first entry), so their
    /// cache misses overlap instead of following one another. Same answers as one by one.
    pub fn lookup_uncached_batch(&self, keys: &[Key], out: &mut [Option<EntryId>]) {
        match self.unit {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Hw` holds a `Sse42`, which exists only when the CPU has SSE4.2.
            Unit::Hw(c) => unsafe { self.batch_sse42(c, keys, out) },
            #[cfg(not(target_arch = "x86_64"))]
            Unit::Hw(c) => self.batch_with(c, keys, out),
            Unit::Slicing(c) => self.batch_with(c, keys, out),
            Unit::Bytewise(c) => self.batch_with(c, keys, out),
        }
    }

    /// [`Mvt::batch_with`] compiled for SSE4.2 (see [`Mvt::probe_sse42`]).
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "sse4.2")]
    unsafe fn batch_sse42(&self, c: Sse42, keys: &[Key], out: &mut [Option<EntryId>]) {
        self.batch_with(c, keys, out)
    }

    #[inline(always)]
    fn batch_with<C: Crc32cSteps>(&self, c: C, keys: &[Key], out: &mut [Option<EntryId>]) {
        for (keys, out) in keys.chunks(BATCH_LANES).zip(out.chunks_mut(BATCH_LANES)) {
            let mut hs = [[(0u16, 0u32); MAX_GROUPS]; BATCH_LANES];
            let mut ns = [0usize; BATCH_LANES];
            // 1. Every key's group hashes; their rows prefetched.
            for ((key, hs), n) in keys.iter().zip(&mut hs).zip(&mut ns) {
                *n = self.hash_groups(c, key, hs);
            }
            // 2. The first node of every group row.
            for (hs, &n) in hs.iter().zip(&ns) {
                for &(_, h) in &hs[..n] {
                    if let Some(node) = self
                        .gnodes
                        .get(self.grows[(h & self.gmask) as usize] as usize)
                    {
                        prefetch(node);
                        prefetch_next_line(node);
                    }
                }
            }
            // 3. The row of the longest rule the longest group's node shows for the key.
            let mut rows = [NIL; BATCH_LANES];
            for ((key, hs), (&n, row)) in keys.iter().zip(&hs).zip(ns.iter().zip(&mut rows)) {
                let first = hs[..n].iter().find_map(|&(g, h)| {
                    let node = self.group_node(key.raw(), g, h);
                    (node != NIL)
                        .then(|| self.shown(node, key, g).next())
                        .flatten()
                });
                if let Some(l) = first {
                    *row = crc_prefix(c, key.raw(), l) & self.mask;
                    prefetch(&self.heads[*row as usize]);
                }
            }
            // 4. That row's first entry.
            for &row in rows.iter().filter(|&&r| r != NIL) {
                if let Some(s) = self.slots.get(self.heads[row as usize].head as usize) {
                    prefetch(s);
                    prefetch_next_line(s);
                }
            }
            // 5. The lookups, from the hashes of step 1, on warm lines.
            for ((key, hs), (&n, out)) in keys.iter().zip(&hs).zip(ns.iter().zip(out)) {
                let i = self.probe_hashed(c, key, &hs[..n]);
                *out = (i != NIL).then(|| self.id(i));
            }
        }
    }

    /// The group node of the `g`-bit prefix of `kb` (hashed `h`), or NIL.
    #[inline(always)]
    fn group_node(&self, kb: &[u8; KEY_BYTES], g: u16, h: u32) -> u32 {
        let mut i = self.grows[(h & self.gmask) as usize];
        while i != NIL {
            let node = &self.gnodes[i as usize];
            if node.hash == h && node.g == g && prefix_eq(&node.prefix, kb, g) {
                return i;
            }
            i = node.next;
        }
        NIL
    }

    /// The class whose match is the first `l` bits of `key`, or NIL.
    #[inline(always)]
    fn class_at<C: Crc32cSteps>(&self, c: C, key: &Key, l: u16) -> u32 {
        let h = crc_prefix(c, key.raw(), l);
        let b = (h & self.mask) as usize;
        let mut i = self.heads[b].head;
        while i != NIL {
            let s = &self.slots[i as usize];
            if s.hash == h {
                if let Some(e) = &s.entry {
                    if e.m.len() == l && e.m.matches(key) {
                        return i;
                    }
                }
            }
            i = s.next;
        }
        NIL
    }

    /// The first valid entry of the class headed by `i`, or NIL.
    #[inline(always)]
    fn first_valid(&self, mut i: u32) -> u32 {
        while i != NIL {
            let s = &self.slots[i as usize];
            if s.entry.as_ref().is_some_and(|e| e.valid) {
                return i;
            }
            i = s.dnext;
        }
        NIL
    }

    /// The state cache's hash of `key`.
    #[inline]
    fn key_hash(&self, key: &Key) -> u32 {
        match self.unit {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Hw` holds a `Sse42`, which exists only when the CPU has SSE4.2.
            Unit::Hw(c) => unsafe { crc_key16_sse42(c, key) },
            #[cfg(not(target_arch = "x86_64"))]
            Unit::Hw(c) => crc_key16(c, key),
            Unit::Slicing(c) => crc_key16(c, key),
            Unit::Bytewise(c) => crc_key16(c, key),
        }
    }

    /// The entry matching `key` on the longest prefix (the first inserted among equal
    /// matches), through the state cache: a hit costs one hash and one cache line; a miss
    /// probes every group present and caches the result (§III-C steps 1–4). Invalid entries
    /// match nothing.
    #[inline]
    pub fn lookup(&mut self, key: &Key) -> Option<EntryId> {
        if self.cache.is_empty() || key.bits() > CACHE_KEY_BITS {
            return self.lookup_uncached(key);
        }
        let h = self.key_hash(key);
        self.lookup_hashed(key, h)
    }

    #[inline]
    fn lookup_hashed(&mut self, key: &Key, h: u32) -> Option<EntryId> {
        let set = &mut self.cache[(h & self.cache_mask) as usize];
        let mut k16 = [0u8; 16];
        k16.copy_from_slice(&key.raw()[..16]);
        for s in &set.0 {
            if s.bits == key.bits() && s.epoch == self.epoch && s.key == k16 {
                return (s.index != NIL).then_some(EntryId {
                    index: s.index,
                    gen: s.gen,
                });
            }
        }
        let i = self.probe(key);
        let gen = if i == NIL {
            0
        } else {
            self.slots[i as usize].gen
        };
        let set = &mut self.cache[(h & self.cache_mask) as usize];
        set.0[1] = set.0[0];
        set.0[0] = CacheSlot {
            key: k16,
            epoch: self.epoch,
            index: i,
            gen,
            bits: key.bits(),
        };
        (i != NIL).then_some(EntryId { index: i, gen })
    }

    /// Looks `keys` up as [`Mvt::lookup`] does, into `out` (as many as the shorter of the
    /// two): every key's cache set is hashed and prefetched first, then resolved.
    pub fn lookup_batch(&mut self, keys: &[Key], out: &mut [Option<EntryId>]) {
        const CHUNK: usize = 32;
        let n = keys.len().min(out.len());
        if self.cache.is_empty() {
            self.lookup_uncached_batch(&keys[..n], &mut out[..n]);
            return;
        }
        let mut hs = [0u32; CHUNK];
        let mut at = 0;
        while at < n {
            let m = (n - at).min(CHUNK);
            for j in 0..m {
                let h = self.key_hash(&keys[at + j]);
                hs[j] = h;
                prefetch(&self.cache[(h & self.cache_mask) as usize]);
            }
            for j in 0..m {
                let k = &keys[at + j];
                out[at + j] = if k.bits() > CACHE_KEY_BITS {
                    self.lookup_uncached(k)
                } else {
                    self.lookup_hashed(k, hs[j])
                };
            }
            at += m;
        }
    }

    /// The class head whose match is exactly `m` in row `h`, or NIL.
    #[inline]
    fn class_of(&self, m: &Match, h: u32) -> u32 {
        let b = (h & self.mask) as usize;
        if self.heads[b].filter & filter_bit(h) == 0 {
            return NIL;
        }
        let mut i = self.heads[b].head;
        while i != NIL {
            let s = &self.slots[i as usize];
            if s.hash == h && s.entry.as_ref().is_some_and(|e| e.m == *m) {
                return i;
            }
            i = s.next;
        }
        NIL
    }

    /// The first valid entry whose match is exactly `m` (one probe; no cache).
    #[inline]
    pub fn find(&self, m: &Match) -> Option<EntryId> {
        let i = self.first_valid(self.class_of(m, self.match_hash(m)));
        (i != NIL).then(|| self.id(i))
    }

    /// Hints that [`Mvt::find`]`(m)` comes soon: prefetches its row (without waiting for it).
    /// The returned hint lets a caller that looks a batch up prefetch the row's first entry
    /// a few finds later, when the row has arrived ([`Mvt::prefetch_entry`]).
    #[inline]
    pub fn prefetch_find(&self, m: &Match) -> FindHint {
        let row = self.match_hash(m) & self.mask;
        prefetch(&self.heads[row as usize]);
        FindHint { row }
    }

    /// Second step of a prefetch: reads the hinted row (prefetched earlier) and prefetches
    /// its first entry, without waiting for it; returns a hint of that entry for
    /// [`Mvt::hinted_entry`] (maybe not the one the find will give).
    #[inline]
    pub fn prefetch_entry(&self, hint: FindHint) -> Option<EntryHint> {
        let i = self.heads.get(hint.row as usize)?.head;
        let s = self.slots.get(i as usize)?;
        prefetch(s);
        prefetch_next_line(s);
        Some(EntryHint { index: i })
    }

    /// The entry a [`Mvt::prefetch_entry`] hint points at, if one lives there now (whichever:
    /// a hint is no handle).
    #[inline]
    pub fn hinted_entry(&self, hint: EntryHint) -> Option<&Entry<V>> {
        self.slots.get(hint.index as usize)?.entry.as_ref()
    }

    /// Prefetches an entry (both cache lines of its slot) that is about to be used.
    #[inline]
    pub fn prefetch_id(&self, id: EntryId) {
        if let Some(s) = self.slots.get(id.index as usize) {
            prefetch(s);
            prefetch_next_line(s);
        }
    }

    #[inline]
    fn id(&self, i: u32) -> EntryId {
        EntryId {
            index: i,
            gen: self.slots[i as usize].gen,
        }
    }

    fn slot(&self, id: EntryId) -> Option<&Slot<V>> {
        self.slots
            .get(id.index as usize)
            .filter(|s| s.gen == id.gen && s.entry.is_some())
    }

    // --------------------------------------------------------------------------------------
    // Table operations (§III-B1)

    /// "new": inserts an entry; equal matches are kept in insertion order.
    pub fn insert(&mut self, e: Entry<V>) -> Result<EntryId, MvtError> {
        let i = match self.free.pop() {
            Some(i) => i,
            None => {
                if self.slots.len() >= NIL as usize {
                    return Err(MvtError::Full);
                }
                self.slots.push(Slot {
                    entry: None,
                    gen: 0,
                    hash: 0,
                    next: NIL,
                    dnext: NIL,
                    dprev: NIL,
                    head: false,
                    seq: 0,
                });
                (self.slots.len() - 1) as u32
            }
        };
        if self.live + 1 > self.heads.len() {
            self.grow();
        }
        self.seq += 1;
        let h = self.match_hash(&e.m);
        let valid = e.valid;
        let len = e.m.len();
        {
            let s = &mut self.slots[i as usize];
            s.hash = h;
            s.seq = self.seq;
            s.entry = Some(e);
        }
        self.count_collision(i, h);
        self.link(i);
        self.live += 1;
        if valid {
            self.valid += 1;
        }
        self.add_len(len);
        self.bump();
        Ok(self.id(i))
    }

    /// Counts an insertion landing in a row that holds another class (looking at the first
    /// few classes of the row only), and one whose 32-bit hash equals another rule's (a CRC32C
    /// collision, §VI-B). (One whose group node already holds another rule is counted by
    /// [`Mvt::group_add`].)
    fn count_collision(&mut self, i: u32, h: u32) {
        const LOOK: usize = 8;
        self.inserts += 1;
        let Some(m) = self.slots[i as usize].entry.as_ref().map(|e| e.m) else {
            return;
        };
        let mut j = self.heads[(h & self.mask) as usize].head;
        let (mut row, mut full) = (false, false);
        for _ in 0..LOOK {
            if j == NIL {
                break;
            }
            let s = &self.slots[j as usize];
            if s.entry.as_ref().is_some_and(|e| e.m != m) {
                row = true;
                full |= s.hash == h;
            }
            j = s.next;
        }
        self.row_collisions += u64::from(row);
        self.hash_collisions += u64::from(full);
    }

    /// Marks class `m` in its group node (made when missing; a node that was there counts a
    /// shared group).
    fn group_add(&mut self, m: &Match) {
        let (k, g, raw) = (m.len() % 8, group(m.len()), *m.as_key().raw());
        let h = self.prefix_hash(&m.as_key(), g);
        let mut node = self.group_node(&raw, g, h);
        self.shared_groups += u64::from(node != NIL);
        if node == NIL {
            if self.gnodes.len() - self.gfree.len() + 1 > self.grows.len() {
                self.grow_groups();
            }
            let fresh = GroupNode {
                map: [0; 4],
                prefix: raw,
                g,
                hash: h,
                next: self.grows[(h & self.gmask) as usize],
            };
            node = match self.gfree.pop() {
                Some(i) => {
                    self.gnodes[i as usize] = fresh;
                    i
                }
                None => {
                    self.gnodes.push(fresh);
                    (self.gnodes.len() - 1) as u32
                }
            };
            self.grows[(h & self.gmask) as usize] = node;
        }
        let v = raw.get(usize::from(g / 8)).copied().unwrap_or(0);
        let bit = map_bit(k, v.checked_shr(u32::from(8 - k)).unwrap_or(0));
        self.gnodes[node as usize].map[bit / 64] |= 1 << (bit % 64);
    }

    /// Clears class `m` from its group node (freed when empty).
    fn group_del(&mut self, m: &Match) {
        let (k, g, raw) = (m.len() % 8, group(m.len()), *m.as_key().raw());
        let h = self.prefix_hash(&m.as_key(), g);
        let node = self.group_node(&raw, g, h);
        if node == NIL {
            return;
        }
        let v = raw.get(usize::from(g / 8)).copied().unwrap_or(0);
        let bit = map_bit(k, v.checked_shr(u32::from(8 - k)).unwrap_or(0));
        let n = &mut self.gnodes[node as usize];
        n.map[bit / 64] &= !(1 << (bit % 64));
        if n.map != [0; 4] {
            return;
        }
        let r = (h & self.gmask) as usize;
        let next = n.next;
        if self.grows[r] == node {
            self.grows[r] = next;
        } else {
            let mut j = self.grows[r];
            while j != NIL {
                if self.gnodes[j as usize].next == node {
                    self.gnodes[j as usize].next = next;
                    break;
                }
                j = self.gnodes[j as usize].next;
            }
        }
        self.gfree.push(node);
    }

    fn grow_groups(&mut self) {
        let n = self.grows.len() * 2;
        self.grows = huge_vec(NIL, n);
        self.gmask = (n - 1) as u32;
        let mut free = vec![false; self.gnodes.len()];
        for &i in &self.gfree {
            free[i as usize] = true;
        }
        for (i, node) in self.gnodes.iter_mut().enumerate() {
            if !free[i] {
                let r = (node.hash & self.gmask) as usize;
                node.next = self.grows[r];
                self.grows[r] = i as u32;
            }
        }
    }

    /// "remove": takes the entry out.
    pub fn remove(&mut self, id: EntryId) -> Option<Entry<V>> {
        self.slot(id)?;
        let i = id.index;
        self.unlink(i);
        let s = &mut self.slots[i as usize];
        let e = s.entry.take()?;
        s.gen = s.gen.wrapping_add(1);
        self.free.push(i);
        self.live -= 1;
        if e.valid {
            self.valid -= 1;
        }
        self.sub_len(e.m.len());
        self.bump();
        Some(e)
    }

    /// Changes an entry's matching field, keeping its handle and value: the entry goes to the
    /// end of the order among its new equals (HashMVT §III-D: an allocated pool entry "'s
    /// matching field is changed").
    pub fn rematch(&mut self, id: EntryId, m: Match) -> Result<(), MvtError> {
        self.slot(id).ok_or(MvtError::NoEntry)?;
        let i = id.index;
        self.unlink(i);
        self.seq += 1;
        let h = self.match_hash(&m);
        let s = &mut self.slots[i as usize];
        let old = match s.entry.as_mut() {
            Some(e) => std::mem::replace(&mut e.m, m).len(),
            None => return Err(MvtError::NoEntry),
        };
        s.hash = h;
        s.seq = self.seq;
        self.link(i);
        self.sub_len(old);
        self.add_len(m.len());
        self.bump();
        Ok(())
    }

    /// Links entry `i` (its `hash` set): at the end of its class when one exists, else as a
    /// class head in its row, after every longer match.
    fn link(&mut self, i: u32) {
        let h = self.slots[i as usize].hash;
        let m = match &self.slots[i as usize].entry {
            Some(e) => e.m,
            None => return,
        };
        let head = self.class_of(&m, h);
        if head != NIL {
            let tail = self.slots[head as usize].dprev;
            self.slots[tail as usize].dnext = i;
            self.slots[head as usize].dprev = i;
            let s = &mut self.slots[i as usize];
            s.dprev = tail;
            s.dnext = NIL;
            s.head = false;
            s.next = NIL;
            return;
        }
        let s = &mut self.slots[i as usize];
        s.dprev = i;
        s.dnext = NIL;
        self.link_head(i);
        self.group_add(&m);
    }

    /// Puts class head `i` into its row's chain, after every longer match.
    fn link_head(&mut self, i: u32) {
        let h = self.slots[i as usize].hash;
        let len = self.len_of(i);
        let b = (h & self.mask) as usize;
        self.heads[b].filter |= filter_bit(h);
        let (mut prev, mut at) = (NIL, self.heads[b].head);
        while at != NIL && self.len_of(at) >= len {
            prev = at;
            at = self.slots[at as usize].next;
        }
        {
            let s = &mut self.slots[i as usize];
            s.head = true;
            s.next = at;
        }
        if prev == NIL {
            self.heads[b].head = i;
        } else {
            self.slots[prev as usize].next = i;
        }
    }

    #[inline]
    fn len_of(&self, i: u32) -> u16 {
        self.slots[i as usize]
            .entry
            .as_ref()
            .map_or(0, |e| e.m.len())
    }

    fn unlink(&mut self, i: u32) {
        let (head, dprev, dnext, h) = {
            let s = &self.slots[i as usize];
            (s.head, s.dprev, s.dnext, s.hash)
        };
        if !head {
            // Inside a class: off its side list (the class head keeps the tail).
            self.slots[dprev as usize].dnext = dnext;
            if dnext != NIL {
                self.slots[dnext as usize].dprev = dprev;
            } else if let Some(m) = self.slots[i as usize].entry.as_ref().map(|e| e.m) {
                let c = self.class_of(&m, h);
                if c != NIL {
                    self.slots[c as usize].dprev = dprev;
                }
            }
            return;
        }
        let next = self.slots[i as usize].next;
        let b = (h & self.mask) as usize;
        // Rows are short: the previous head is found by walking.
        let mut prev = NIL;
        let mut at = self.heads[b].head;
        while at != NIL && at != i {
            prev = at;
            at = self.slots[at as usize].next;
        }
        // The class's next entry takes the head's place in the row, or the class leaves it.
        let to = if dnext != NIL {
            let s = &mut self.slots[dnext as usize];
            s.head = true;
            s.dprev = dprev;
            s.next = next;
            dnext
        } else {
            next
        };
        if prev == NIL {
            self.heads[b].head = to;
        } else {
            self.slots[prev as usize].next = to;
        }
        if self.heads[b].head == NIL {
            self.heads[b].filter = 0;
        }
        self.slots[i as usize].head = false;
        if dnext == NIL {
            if let Some(m) = self.slots[i as usize].entry.as_ref().map(|e| e.m) {
                self.group_del(&m);
            }
        }
    }

    fn grow(&mut self) {
        let old = std::mem::take(&mut self.heads);
        let n = old.len() * 2;
        self.heads = huge_vec(Row::EMPTY, n);
        self.mask = (n - 1) as u32;
        // Class heads move with their side lists, which keep their order.
        for row in old {
            let mut i = row.head;
            while i != NIL {
                let next = self.slots[i as usize].next;
                self.link_head(i);
                i = next;
            }
        }
    }

    fn add_len(&mut self, l: u16) {
        let c = &mut self.len_count[usize::from(l)];
        *c += 1;
        if *c == 1 {
            let at = self.lens.partition_point(|&x| x > l);
            self.lens.insert(at, l);
        }
        let g = group(l);
        let c = &mut self.group_count[usize::from(g / 8)];
        *c += 1;
        if *c == 1 {
            let at = self.groups.partition_point(|&x| x > g);
            self.groups.insert(at, g);
        }
    }

    fn sub_len(&mut self, l: u16) {
        let c = &mut self.len_count[usize::from(l)];
        *c = c.saturating_sub(1);
        if *c == 0 {
            self.lens.retain(|&x| x != l);
        }
        let g = group(l);
        let c = &mut self.group_count[usize::from(g / 8)];
        *c = c.saturating_sub(1);
        if *c == 0 {
            self.groups.retain(|&x| x != g);
        }
    }

    /// Live entries in insertion order.
    fn ordered(&self) -> Vec<u32> {
        let mut v: Vec<u32> = (0..self.slots.len() as u32)
            .filter(|&i| self.slots[i as usize].entry.is_some())
            .collect();
        v.sort_by_key(|&i| self.slots[i as usize].seq);
        v
    }

    /// Every entry, in slot order.
    pub fn iter(&self) -> impl Iterator<Item = (EntryId, &Entry<V>)> + '_ {
        self.slots.iter().enumerate().filter_map(|(i, s)| {
            s.entry.as_ref().map(|e| {
                (
                    EntryId {
                        index: i as u32,
                        gen: s.gen,
                    },
                    e,
                )
            })
        })
    }

    /// "shard" (T ⇒ {T1, T2}): entries for which `to_second` holds move to a new table T2;
    /// the others stay. M(T) = M(T1) ∪ M(T2); order among equal matches is kept. Handles of
    /// moved entries are not valid in T2 ([`Mvt::iter`] gives the new ones).
    pub fn shard(&mut self, mut to_second: impl FnMut(&Entry<V>) -> bool) -> Mvt<V> {
        let mut t2 = Mvt::with_options(self.width, 16, self.cache_slots, self.hasher);
        for i in self.ordered() {
            let id = self.id(i);
            let go = self.slots[i as usize]
                .entry
                .as_ref()
                .is_some_and(&mut to_second);
            if go {
                if let Some(e) = self.remove(id) {
                    // Cannot fail: t2 holds fewer entries than self did.
                    let _ = t2.insert(e);
                }
            }
        }
        t2
    }

    /// "combine" (T = T1 ∪ T2): moves every entry of `other` into this table, after this
    /// table's entries in the order among equal matches.
    pub fn combine(&mut self, mut other: Mvt<V>) -> Result<(), MvtError> {
        for i in other.ordered() {
            let id = other.id(i);
            if let Some(e) = other.remove(id) {
                self.insert(e)?;
            }
        }
        Ok(())
    }

    // --------------------------------------------------------------------------------------
    // Entry operations (§III-B2)

    /// "get": the entry behind a handle, valid or not.
    #[inline]
    pub fn entry(&self, id: EntryId) -> Option<&Entry<V>> {
        self.slot(id)?.entry.as_ref()
    }

    /// "get": the state value of a valid entry.
    #[inline]
    pub fn get(&self, id: EntryId) -> Option<&V> {
        self.entry(id).filter(|e| e.valid).map(|e| &e.value)
    }

    /// The entry behind a handle, to change its value, timestamp, timeout or aux in place.
    /// (Its match changes only through [`Mvt::rematch`], its validity through
    /// [`Mvt::timeout`]/[`Mvt::invalidate`].)
    #[inline]
    pub fn entry_mut(&mut self, id: EntryId) -> Option<&mut Entry<V>> {
        let s = self.slots.get_mut(id.index as usize)?;
        if s.gen != id.gen {
            return None;
        }
        s.entry.as_mut()
    }

    /// "set": replaces the state value; returns the old one.
    pub fn set(&mut self, id: EntryId, value: V) -> Result<V, MvtError> {
        let e = self.entry_mut(id).ok_or(MvtError::NoEntry)?;
        Ok(std::mem::replace(&mut e.value, value))
    }

    /// "inc": adds `by` to the state value; returns the new value.
    pub fn inc(&mut self, id: EntryId, by: V) -> Result<V, MvtError>
    where
        V: std::ops::AddAssign + Copy,
    {
        let e = self.entry_mut(id).ok_or(MvtError::NoEntry)?;
        e.value += by;
        Ok(e.value)
    }

    /// "timeout": invalidates the entry if its time has come by `now`; returns whether it is
    /// now invalid.
    pub fn timeout(&mut self, id: EntryId, now: Nanos) -> Result<bool, MvtError> {
        let e = self.entry(id).ok_or(MvtError::NoEntry)?;
        if e.valid && e.timed_out(now) {
            self.invalidate(id);
        }
        Ok(!self.entry(id).is_some_and(|e| e.valid))
    }

    /// Clears the validity flag: the entry matches nothing from now on and goes at the next
    /// [`Mvt::clean`].
    pub fn invalidate(&mut self, id: EntryId) -> bool {
        let Some(e) = self.entry_mut(id) else {
            return false;
        };
        let was = std::mem::replace(&mut e.valid, false);
        if was {
            self.valid -= 1;
            self.bump();
        }
        was
    }

    /// "renew": restarts the entry's time at `now` with `timeout`.
    pub fn renew(&mut self, id: EntryId, now: Nanos, timeout: Nanos) -> Result<(), MvtError> {
        let e = self.entry_mut(id).ok_or(MvtError::NoEntry)?;
        e.timestamp = now;
        e.timeout = timeout;
        Ok(())
    }

    /// Periodic cleaning (§III-A): times out every entry whose time has come by `now`, then
    /// removes every invalid entry, handing each to `removed`. Returns how many went.
    pub fn clean(&mut self, now: Nanos, mut removed: impl FnMut(Entry<V>)) -> usize {
        let mut n = 0;
        for i in 0..self.slots.len() as u32 {
            let id = self.id(i);
            let gone = match &self.slots[i as usize].entry {
                Some(e) => !e.valid || e.timed_out(now),
                None => false,
            };
            if gone {
                if let Some(e) = self.remove(id) {
                    removed(e);
                    n += 1;
                }
            }
        }
        n
    }

    /// "split" (e → (e'1, e'2)): replaces a prefix entry by its two halves, one bit longer,
    /// each with a copy of V(e); M(e'1) ∩ M(e'2) = ∅ and M(e'1) ∪ M(e'2) = M(e) for keys of the
    /// table's width. Returns the handles of the halves (the lower first). Refused for an
    /// entry of `width` bits and for one shadowed by an earlier equal match.
    pub fn split(&mut self, id: EntryId) -> Result<(EntryId, EntryId), MvtError>
    where
        V: Clone,
    {
        let e = self.entry(id).ok_or(MvtError::NoEntry)?;
        let (lo, hi) = e.m.halves(self.width).ok_or(MvtError::TooSpecific)?;
        if e.valid && self.find(&e.m) != Some(id) {
            return Err(MvtError::Shadowed);
        }
        let mut twin = e.clone();
        twin.m = hi;
        self.rematch(id, lo)?;
        let b = self.insert(twin)?;
        Ok((id, b))
    }

    /// "merge" (e'1 + e'2 → e): the inverse of split. Succeeds when both entries are valid,
    /// their matches are the two halves of one prefix, their values, timeouts and aux fields
    /// are equal, and no entry already matches exactly that prefix (which the merged entry
    /// would shadow or be shadowed by). The merged entry keeps `a`'s handle and the later
    /// timestamp; `b` is removed. On failure nothing changes.
    pub fn merge(&mut self, a: EntryId, b: EntryId) -> Result<EntryId, MvtError>
    where
        V: PartialEq,
    {
        let ea = self.entry(a).ok_or(MvtError::NoEntry)?;
        let eb = self.entry(b).ok_or(MvtError::NoEntry)?;
        if a == b {
            return Err(MvtError::NotMergeable("an entry with itself"));
        }
        if !ea.valid || !eb.valid {
            return Err(MvtError::NotMergeable("an entry is invalid"));
        }
        let parent =
            ea.m.parent()
                .ok_or(MvtError::NotMergeable("`*` has no sibling"))?;
        let (lo, hi) = parent
            .halves(self.width)
            .ok_or(MvtError::NotMergeable("no halves"))?;
        if !((ea.m == lo && eb.m == hi) || (ea.m == hi && eb.m == lo)) {
            return Err(MvtError::NotMergeable(
                "matches are not the halves of one prefix",
            ));
        }
        if ea.value != eb.value || ea.timeout != eb.timeout || ea.aux != eb.aux {
            return Err(MvtError::NotMergeable("values differ"));
        }
        if self.find(&parent).is_some() {
            return Err(MvtError::NotMergeable("the merged prefix exists"));
        }
        let ts = ea.timestamp.max(eb.timestamp);
        self.remove(b);
        self.rematch(a, parent)?;
        if let Some(e) = self.entry_mut(a) {
            e.timestamp = ts;
        }
        Ok(a)
    }

    /// The matching range M(T) (§III-A): the matches of the valid entries, deduplicated,
    /// most specific first.
    pub fn matching_range(&self) -> Vec<Match> {
        let mut v: Vec<Match> = self
            .iter()
            .filter(|(_, e)| e.valid)
            .map(|(_, e)| e.m)
            .collect();
        v.sort_by(|a, b| b.len().cmp(&a.len()).then(a.bytes().cmp(b.bytes())));
        v.dedup();
        v
    }
}

/// A find on its way: the row [`Mvt::prefetch_find`] prefetched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FindHint {
    row: u32,
}

/// An entry [`Mvt::prefetch_entry`] prefetched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EntryHint {
    index: u32,
}

/// [`prefetch`] of the cache line after the one `at` starts in.
#[inline(always)]
fn prefetch_next_line<T>(at: &T) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        // SAFETY: a prefetch never faults, whatever the address; SSE is x86_64 baseline.
        unsafe { _mm_prefetch::<_MM_HINT_T0>((at as *const T).cast::<i8>().wrapping_add(64)) }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = at;
    }
}

/// Asks the CPU to start loading the cache line at `at` (a hint; no-op off x86_64).
#[inline(always)]
fn prefetch<T>(at: &T) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        // SAFETY: prefetching is a hint that never faults nor changes memory; SSE is part of
        // the x86_64 baseline.
        unsafe { _mm_prefetch::<_MM_HINT_T0>((at as *const T).cast::<i8>()) }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = at;
    }
}

/// [`crc_prefix`] on the CRC32C instruction, compiled for SSE4.2.
///
/// # Safety
/// The CPU must have SSE4.2 (a [`Sse42`] proves it).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse4.2")]
unsafe fn crc_prefix_sse42(c: Sse42, b: &[u8; KEY_BYTES], l: u16) -> u32 {
    crc_prefix(c, b, l)
}

/// [`crc_key16`] on the CRC32C instruction, compiled for SSE4.2.
///
/// # Safety
/// The CPU must have SSE4.2 (a [`Sse42`] proves it).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse4.2")]
unsafe fn crc_key16_sse42(c: Sse42, k: &Key) -> u32 {
    crc_key16(c, k)
}

#[cfg(test)]
mod tests {
    use super::*;
    use flowstate_wire::hash;
    use std::net::Ipv4Addr;

    fn v4(a: [u8; 4], l: u8) -> Match {
        Match::v4(Ipv4Addr::from(a), l)
    }

    fn k(a: [u8; 4]) -> Key {
        Key::v4(Ipv4Addr::from(a))
    }

    #[test]
    fn software_crc_agrees_with_wire() {
        for data in [
            &b""[..],
            b"a",
            b"123456789",
            b"a longer input of some bytes",
        ] {
            let r = data.iter().fold(!0, |c, &b| ByteCrc.step_u8(c, b));
            assert_eq!(!r, hash::crc32c_sw(data));
        }
        // Every unit gives every group's hash the same value.
        let key = Key::from_bytes(b"0123456789abcdefghijklmnopqrstuvwxyz0123");
        for l in 0..=KEY_BITS {
            let want = crc_prefix(ByteCrc, key.raw(), l);
            assert_eq!(crc_prefix(SoftCrc, key.raw(), l), want);
            if let Some(c) = Sse42::detect() {
                assert_eq!(crc_prefix(c, key.raw(), l), want);
            }
            // The hash of a prefix is that of its match (bits past `l` cleared).
            let m = Match::prefix(&key, l);
            assert_eq!(crc_prefix(ByteCrc, m.as_key().raw(), l), want);
        }
        let mut hw = Mvt::<u32>::with_options(32, 16, 16, Hasher::Hardware);
        let mut sw = Mvt::<u32>::with_options(32, 16, 16, Hasher::Software);
        let m = v4([10, 1, 0, 0], 13);
        assert_eq!(hw.match_hash(&m), sw.match_hash(&m));
        hw.insert(Entry::new(m, 1, 0, NEVER, 0)).unwrap();
        sw.insert(Entry::new(m, 1, 0, NEVER, 0)).unwrap();
        let key = k([10, 7, 3, 3]);
        assert!(hw.lookup(&key).is_some() && sw.lookup(&key).is_some());
    }

    #[test]
    fn longest_prefix_wins_and_cache_follows_changes() {
        let mut t = Mvt::new(32);
        let a = t
            .insert(Entry::new(v4([10, 0, 0, 0], 8), 'a', 0, NEVER, 0))
            .unwrap();
        let b = t
            .insert(Entry::new(v4([10, 1, 0, 0], 16), 'b', 0, NEVER, 0))
            .unwrap();
        let any = t.insert(Entry::new(Match::ANY, '*', 0, NEVER, 0)).unwrap();
        assert_eq!(t.lookup(&k([10, 1, 2, 3])), Some(b));
        assert_eq!(t.lookup(&k([10, 2, 2, 3])), Some(a));
        assert_eq!(t.lookup(&k([11, 2, 2, 3])), Some(any));
        // Cached now; a longer prefix must still win.
        let c = t
            .insert(Entry::new(v4([10, 1, 2, 0], 24), 'c', 0, NEVER, 0))
            .unwrap();
        assert_eq!(t.lookup(&k([10, 1, 2, 3])), Some(c));
        t.invalidate(c);
        assert_eq!(t.lookup(&k([10, 1, 2, 3])), Some(b));
        assert_eq!(t.remove(b).map(|e| e.value), Some('b'));
        assert_eq!(t.lookup(&k([10, 1, 2, 3])), Some(a));
        assert_eq!(t.get(b), None, "stale handle");
        assert_eq!(t.lengths(), &[24, 8, 0]);
        assert_eq!(t.clean(0, |_| {}), 1);
        assert_eq!(t.lengths(), &[8, 0]);
        let mut out = [None; 3];
        t.lookup_batch(
            &[k([10, 9, 9, 9]), k([9, 9, 9, 9]), k([10, 1, 2, 3])],
            &mut out,
        );
        assert_eq!(out, [Some(a), Some(any), Some(a)]);
    }

    #[test]
    fn equal_matches_are_first_in_first_out() {
        let mut t = Mvt::new(8);
        let ids: Vec<_> = (0..5)
            .map(|i| t.insert(Entry::new(Match::ANY, i, 0, NEVER, 0)).unwrap())
            .collect();
        assert_eq!(t.find(&Match::ANY), Some(ids[0]));
        t.rematch(ids[0], Match::exact(&Key::from_bytes(&[7])))
            .unwrap();
        assert_eq!(t.find(&Match::ANY), Some(ids[1]));
        t.rematch(ids[0], Match::ANY).unwrap();
        // Back at the end of the pool.
        for want in [1, 2, 3, 4, 0] {
            let id = t.find(&Match::ANY).unwrap();
            assert_eq!(t.get(id), Some(&want));
            t.rematch(id, Match::exact(&Key::from_bytes(&[want as u8 + 100])))
                .unwrap();
        }
        assert_eq!(t.find(&Match::ANY), None);
        // Growth keeps the order.
        let mut t = Mvt::with_capacity(8, 1);
        for i in 0..100 {
            t.insert(Entry::new(Match::ANY, i, 0, NEVER, 0)).unwrap();
        }
        let id = t.find(&Match::ANY).unwrap();
        assert_eq!(t.get(id), Some(&0));
    }

    #[test]
    fn entry_operations() {
        let mut t = Mvt::new(32);
        let e = t
            .insert(Entry::new(v4([1, 0, 0, 0], 8), 5u64, 100, 50, 9))
            .unwrap();
        assert_eq!(t.set(e, 6), Ok(5));
        assert_eq!(t.inc(e, 4), Ok(10));
        assert_eq!(t.timeout(e, 149), Ok(false));
        t.renew(e, 120, 50).unwrap();
        assert_eq!(t.timeout(e, 169), Ok(false));
        assert_eq!(t.timeout(e, 170), Ok(true));
        assert_eq!(t.get(e), None);
        assert_eq!(t.entry(e).map(|x| x.aux), Some(9));
        assert_eq!(t.lookup(&k([1, 2, 3, 4])), None);
        assert_eq!(t.valid_len(), 0);
        let mut gone = Vec::new();
        assert_eq!(t.clean(170, |x| gone.push(x.value)), 1);
        assert_eq!(gone, [10]);
        assert!(t.is_empty());
    }

    #[test]
    fn split_and_merge() {
        let mut t = Mvt::new(32);
        let e = t
            .insert(Entry::new(v4([10, 0, 0, 0], 8), 1, 0, NEVER, 0))
            .unwrap();
        let (lo, hi) = t.split(e).unwrap();
        assert_eq!(t.entry(lo).unwrap().matching(), &v4([10, 0, 0, 0], 9));
        assert_eq!(t.entry(hi).unwrap().matching(), &v4([10, 128, 0, 0], 9));
        assert_eq!(t.lookup(&k([10, 200, 0, 0])), Some(hi));
        t.set(hi, 2).unwrap();
        assert!(matches!(t.merge(lo, hi), Err(MvtError::NotMergeable(_))));
        t.set(hi, 1).unwrap();
        let m = t.merge(hi, lo).unwrap();
        assert_eq!(m, hi);
        assert_eq!(t.len(), 1);
        assert_eq!(t.entry(m).unwrap().matching(), &v4([10, 0, 0, 0], 8));
        let host = t
            .insert(Entry::new(v4([1, 1, 1, 1], 32), 1, 0, NEVER, 0))
            .unwrap();
        assert_eq!(t.split(host), Err(MvtError::TooSpecific));
    }
}
