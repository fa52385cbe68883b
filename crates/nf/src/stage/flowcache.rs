//! The flow cache: a fast path in front of the chain, in the worker itself, for every driver
//! (HyperSFC §III: a fast path caching NF table entries in front of a slow path that holds
//! the full tables; the live box's XDP fast path, `flowstate_fastpath::flowcache`, is the same
//! idea in the kernel, under the same contract).
//!
//! After the chain forwarded a packet of an established IPv4 TCP or UDP flow, the cache
//! compares the packet as it came with the packet as the chain left it. When they differ only
//! in the addresses, the ports and the two checksums that cover them, and the RFC 1624 update
//! of those fields reproduces the chain's checksums bit for bit, the flow's later packets in
//! that direction skip the NFs: one lookup (a set of two adjacent cache lines, prefetched with
//! the batch), the rewrite of 12 bytes, two incremental checksum updates (RFC 1624 eqn. 3).
//!
//! Promises:
//! * **Only chains whose every NF allows it** ([`crate::NfFactory::fast_path`]): an NF
//!   says yes only when every later packet of a flow it forwarded, without SYN, FIN or RST,
//!   gets the same header changes and changes nothing in its state but the flow's idle timer.
//!   The NFs' per-packet counters then count the chain's packets only; the stage counts the
//!   cache's (`flow_cache` in the summary).
//! * **Control packets take the chain**: TCP SYN, FIN and RST, IPv4 fragments and options,
//!   ICMP, IPv6, anything not TCP or UDP. A FIN or RST the chain forwarded forgets its flow in
//!   both directions; a packet the chain dropped forgets its own entry.
//! * **Bounded staleness**: an entry lives `refresh` after the chain last ran a packet of its
//!   flow and direction. The first packet after half of that runs the chain again, which
//!   renews every NF's idle timer and the entry. So with `refresh` shorter than the NFs'
//!   timeouts no state expires under an active flow, and a decision of the chain that changes
//!   (a backend gone, a rule added) reaches an active flow within `refresh / 2`.
//! * **Bounded memory, nothing allocated per packet**: `capacity` entries in four-way sets of
//!   two adjacent cache lines (one 128-byte block, one page); a new flow takes an empty or
//!   expired way, else the one that expires first.
//! * Per-flow order is the chain's: a batch's packets leave in the order they came, whichever
//!   path they took.
//!
//! Time is the runtime's (packet timestamps for captures and synthetic traffic), in ticks of
//! 2^20 ns (about a millisecond), wrapping every 52 days: comparisons are of differences.

use super::{Frames, Item};
use crate::Direction;
use flowstate_wire::checksum;
use flowstate_wire::dissect::{Fragment, Network};
use flowstate_wire::flow::proto::{TCP, UDP};
use flowstate_wire::mem::prefetch_bytes;
use flowstate_wire::tcp::Flags;
use flowstate_wire::{Dissection, FlowKey};
use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

/// Default `[runtime] flow_cache_refresh`.
pub const DEFAULT_REFRESH: Duration = Duration::from_secs(1);
/// Default `[runtime] flow_cache_capacity` (entries; 32 MiB).
pub const DEFAULT_CAPACITY: usize = 1 << 20;
/// Smallest `flow_cache_capacity`: one set.
pub const MIN_CAPACITY: usize = WAYS;
/// Largest `flow_cache_capacity`.
pub const MAX_CAPACITY: usize = 1 << 26;
/// Longest `flow_cache_refresh` (2^31 ticks is where the wrapping comparison ends).
pub const MAX_REFRESH: Duration = Duration::from_secs(3600);

/// Nanoseconds per tick, as a shift.
const TICK_SHIFT: u32 = 20;
/// The TCP flags that open or close a connection: such segments always run the chain.
const TCP_CONTROL: u8 = Flags::FIN.0 | Flags::SYN.0 | Flags::RST.0;
/// Bytes of a packet's headers the cache keeps while the chain runs it (Ethernet with two VLAN
/// tags, IPv4 without options, TCP without options: 62).
const HEAD: usize = 64;

/// A flow direction: the direction the packet came from, its protocol, addresses and ports
/// as on the wire. Never 0 (the direction byte is 1 or 2), which marks an empty way.
type Key = u128;

/// One way of a set: a flow direction and what the chain does to its packets.
#[derive(Debug, Clone, Copy, Default)]
#[repr(C)]
struct Way {
    key: Key,
    /// The addresses and ports the chain gives the flow's packets, as on the wire.
    out: [u8; 12],
    /// Until when (in ticks) the entry may be used.
    deadline: u32,
}

/// Ways a set: four, in a 128-byte block. With two (one line), a set that three of the
/// flows in cycle hash to misses for all three: at a million flows in four million entries,
/// 9% of the flows thrashed so; with four, fewer than 2%. The second line costs little: it is
/// on the same page, and Intel's spatial prefetcher fetches lines in pairs.
const WAYS: usize = 4;

/// A set of [`WAYS`] ways.
#[derive(Debug, Clone, Copy, Default)]
#[repr(C, align(128))]
struct Set([Way; WAYS]);

const _: () = assert!(std::mem::size_of::<Set>() == 128);

/// A packet the chain runs on the cache's behalf: to learn from, or to forget its flow by.
struct Pending {
    /// Its position in the segment.
    item: usize,
    key: Key,
    at: Layout,
    /// A FIN or RST: forget both directions once the chain forwarded it.
    closing: bool,
    /// Its frame's length and first bytes as it came.
    len: usize,
    head: [u8; HEAD],
}

/// One worker's flow cache (see the module docs).
pub struct FlowCache {
    sets: Vec<Set>,
    mask: usize,
    seed: u64,
    /// `refresh`, and half of it, in ticks.
    refresh: u32,
    renew: u32,
    /// The keys of the segment being run, their sets and where their headers are, by position
    /// (`None`: the packet is not cacheable).
    keys: Vec<Option<(Key, usize, Layout)>>,
    pending: Vec<Pending>,
    /// Packets forwarded by the cache (not by the NFs).
    hits: u64,
}

impl std::fmt::Debug for FlowCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FlowCache")
            .field("capacity", &(self.sets.len() * WAYS))
            .field("refresh_ticks", &self.refresh)
            .field("hits", &self.hits)
            .finish()
    }
}

/// The tick of a runtime time.
fn tick(now_ns: u64) -> u32 {
    (now_ns >> TICK_SHIFT) as u32
}

/// Ticks from `now` until `deadline` (negative once past).
fn remaining(deadline: u32, now: u32) -> i32 {
    deadline.wrapping_sub(now) as i32
}

/// The 16-bit big-endian word at `at`.
fn word(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

/// The offsets of a packet's network and transport headers, and its protocol.
type Layout = (usize, usize, u8);

/// Where a cacheable packet's headers are: IPv4 without options or fragments, TCP or UDP,
/// within the first [`HEAD`] bytes.
fn layout(frame: &[u8], d: &Dissection) -> Option<Layout> {
    if d.network != Network::Ipv4 || d.fragment != Fragment::None {
        return None;
    }
    let (l3, l4) = (d.l3_offset, d.l4_offset?);
    let header = transport_len(d.protocol)?;
    (l4 == l3 + 20 && l4 + header <= frame.len().min(HEAD)).then_some((l3, l4, d.protocol))
}

/// Bytes of a cacheable transport's header without options (`None`: not TCP or UDP).
fn transport_len(protocol: u8) -> Option<usize> {
    match protocol {
        TCP => Some(20),
        UDP => Some(8),
        _ => None,
    }
}

/// The key of a flow direction from its addresses (source, destination) and ports as on the
/// wire.
fn key(dir: Direction, proto: u8, addrs: [u8; 8], ports: [u8; 4]) -> Key {
    let d: u8 = match dir {
        Direction::Outbound => 1,
        Direction::Inbound => 2,
    };
    u128::from(u64::from_le_bytes(addrs))
        | u128::from(u32::from_le_bytes(ports)) << 64
        | u128::from(proto) << 96
        | u128::from(d) << 104
}

fn bytes<const N: usize>(b: &[u8], at: usize) -> [u8; N] {
    let mut out = [0; N];
    out.copy_from_slice(&b[at..at + N]);
    out
}

/// The key of `frame` in direction `dir`, where its headers are, and its TCP flags (0 for
/// UDP), if it is cacheable.
fn key_of(frame: &[u8], d: &Dissection, dir: Direction) -> Option<(Key, Layout, u8)> {
    let at @ (l3, l4, proto) = layout(frame, d)?;
    let flags = if proto == TCP { frame[l4 + 13] } else { 0 };
    Some((
        key(dir, proto, bytes(frame, l3 + 12), bytes(frame, l4)),
        at,
        flags,
    ))
}

/// Where a checksum is in a transport header.
fn checksum_at(proto: u8) -> usize {
    if proto == TCP {
        16
    } else {
        6
    }
}

impl FlowCache {
    /// A cache of at least `capacity` entries (rounded up to a power of two, at least one
    /// set), whose entries live `refresh` (at least one tick).
    pub fn new(capacity: usize, refresh: Duration) -> FlowCache {
        let sets = capacity
            .clamp(MIN_CAPACITY, MAX_CAPACITY)
            .next_power_of_two()
            / WAYS;
        let refresh = ((refresh.as_nanos() >> TICK_SHIFT) as u32).clamp(2, 1 << 30);
        FlowCache {
            sets: flowstate_wire::mem::huge_vec(Set::default(), sets),
            mask: sets - 1,
            seed: std::hash::BuildHasher::hash_one(
                &std::collections::hash_map::RandomState::new(),
                0u8,
            ),
            refresh,
            renew: refresh / 2,
            keys: Vec::new(),
            pending: Vec::new(),
            hits: 0,
        }
    }

    /// Packets the cache forwarded past the NFs so far.
    pub fn hits(&self) -> u64 {
        self.hits
    }

    /// The set of `key`: the seeded 64-bit mix ([`flowstate_wire::hash::mix`]), every bit of
    /// which depends on every bit of the key, so keys that differ in one port alone (the
    /// answers through a NAT) spread over the sets.
    fn set_of(&self, key: Key) -> usize {
        flowstate_wire::hash::mix(key, self.seed) as usize & self.mask
    }

    /// Runs the cache over a segment of packets of direction `dir` (`items` of `batch`)
    /// before the chain does. Hits are rewritten in place and marked `fast`: they skip the
    /// NFs. The others are remembered, to learn from once the chain ran them
    /// ([`FlowCache::after`]).
    pub(super) fn before<F: Frames + ?Sized>(
        &mut self,
        batch: &mut F,
        items: &mut [Item],
        dir: Direction,
    ) {
        self.pending.clear();
        self.keys.clear();
        self.keys.resize(items.len(), None);
        for (i, it) in items.iter().enumerate() {
            let Some(data) = batch.frame(it.index).filter(|_| it.alive) else {
                continue;
            };
            let Some((k, at, flags)) = key_of(data, &it.dissection, dir) else {
                continue;
            };
            if flags & TCP_CONTROL != 0 {
                self.remember(i, k, at, true, data);
                continue;
            }
            let s = self.set_of(k);
            self.keys[i] = Some((k, s, at));
            prefetch_bytes(&self.sets[s], std::mem::size_of::<Set>());
        }
        for (i, it) in items.iter_mut().enumerate() {
            let Some((k, s, at)) = self.keys[i] else {
                continue;
            };
            let Some(data) = batch.frame_mut(it.index) else {
                continue;
            };
            match self.find(s, k, tick(it.now)) {
                Some(out) => {
                    rewrite(data, &mut it.dissection, &out);
                    it.fast = true;
                    self.hits += 1;
                }
                None => self.remember(i, k, at, false, data),
            }
        }
    }

    /// What the chain does to the packets of `k` (in set `s`), unless the entry is missing or
    /// due for renewal by the chain at tick `now`.
    fn find(&self, s: usize, k: Key, now: u32) -> Option<[u8; 12]> {
        let w = self.sets[s].0.iter().find(|w| w.key == k)?;
        (remaining(w.deadline, now) > self.renew as i32).then_some(w.out)
    }

    fn remember(&mut self, item: usize, key: Key, at: Layout, closing: bool, data: &[u8]) {
        let mut head = [0; HEAD];
        let n = data.len().min(HEAD);
        head[..n].copy_from_slice(&data[..n]);
        self.pending.push(Pending {
            item,
            key,
            at,
            closing,
            len: data.len(),
            head,
        });
    }

    /// After the chain ran the segment: learns from every remembered packet the chain
    /// forwarded, and forgets the flows of those it dropped or that closed.
    pub(super) fn after<F: Frames + ?Sized>(&mut self, batch: &F, items: &[Item], dir: Direction) {
        let pending = std::mem::take(&mut self.pending);
        for p in &pending {
            let it = &items[p.item];
            let out = batch
                .frame(it.index)
                .filter(|_| it.alive)
                .map(|data| (data, &it.dissection));
            if p.closing {
                self.forget(p.key);
                if let Some((k, _, _)) = out.and_then(|(data, d)| key_of(data, d, dir)) {
                    self.forget(reverse(k));
                }
                continue;
            }
            match out.and_then(|(data, d)| lesson(p, data, d)) {
                Some(out) => self.install(p.key, out, tick(it.now)),
                None => self.forget(p.key),
            }
        }
        self.pending = pending;
    }

    fn install(&mut self, k: Key, out: [u8; 12], now: u32) {
        let s = self.set_of(k);
        let ways = &mut self.sets[s].0;
        // The flow's own way, else an empty or expired one, else the one that expires first.
        let i = ways
            .iter()
            .position(|w| w.key == k)
            .or_else(|| {
                ways.iter()
                    .position(|w| w.key == 0 || remaining(w.deadline, now) <= 0)
            })
            .unwrap_or_else(|| {
                (0..WAYS)
                    .min_by_key(|&i| remaining(ways[i].deadline, now))
                    .unwrap_or(0)
            });
        ways[i] = Way {
            key: k,
            out,
            deadline: now.wrapping_add(self.refresh),
        };
    }

    fn forget(&mut self, k: Key) {
        let s = self.set_of(k);
        for w in &mut self.sets[s].0 {
            if w.key == k {
                *w = Way::default();
            }
        }
    }

    /// Forgets every flow (the chain's decisions may have changed).
    pub fn clear(&mut self) {
        self.sets.fill(Set::default());
    }
}

/// The key of the other direction of the flow whose packets leave the chain with key `k`'s
/// addresses and ports: source and destination swapped, the other direction.
fn reverse(k: Key) -> Key {
    let addrs = (k as u64).to_le_bytes();
    let ports = ((k >> 64) as u32).to_le_bytes();
    let proto = (k >> 96) as u8;
    let dir = if (k >> 104) as u8 == 1 {
        Direction::Inbound
    } else {
        Direction::Outbound
    };
    key(
        dir,
        proto,
        [
            addrs[4], addrs[5], addrs[6], addrs[7], addrs[0], addrs[1], addrs[2], addrs[3],
        ],
        [ports[2], ports[3], ports[0], ports[1]],
    )
}

/// Gives the packet in `data` the addresses and ports `out`, updating both checksums
/// (RFC 1624 eqn. 3; a UDP checksum of 0, "none", stays 0, and one that comes to 0 is
/// sent as 0xffff, RFC 768) and the dissection's flow key.
fn rewrite(data: &mut [u8], d: &mut Dissection, out: &[u8; 12]) {
    let Some((l3, l4, proto)) = layout(data, d) else {
        return;
    };
    // RFC 1624 eqn. 3 over the changed words: the addresses for the IPv4 header, addresses
    // (the pseudo-header) and ports for the transport's.
    let mut old = [0; 12];
    old[..8].copy_from_slice(&data[l3 + 12..l3 + 20]);
    old[8..].copy_from_slice(&data[l4..l4 + 4]);
    let ip_check = checksum::update(word(data, l3 + 10), &old[..8], &out[..8]);
    data[l3 + 10..l3 + 12].copy_from_slice(&ip_check.to_be_bytes());
    let c = l4 + checksum_at(proto);
    let check = word(data, c);
    if proto == TCP || check != 0 {
        let new = checksum::update(check, &old, out);
        let new = if proto == UDP && new == 0 {
            0xffff
        } else {
            new
        };
        data[c..c + 2].copy_from_slice(&new.to_be_bytes());
    }
    data[l3 + 12..l3 + 20].copy_from_slice(&out[..8]);
    data[l4..l4 + 4].copy_from_slice(&out[8..]);
    if let Some(f) = d.flow.as_mut() {
        let a = |i: usize| IpAddr::V4(Ipv4Addr::new(out[i], out[i + 1], out[i + 2], out[i + 3]));
        *f = FlowKey {
            src: a(0),
            dst: a(4),
            src_port: u16::from_be_bytes([out[8], out[9]]),
            dst_port: u16::from_be_bytes([out[10], out[11]]),
            ..*f
        };
    }
}

/// The addresses and ports to install for `p`, if the chain's output `data` differs from what
/// came only where the cache can repeat it, and the repeat is bit-exact.
fn lesson(p: &Pending, data: &[u8], d: &Dissection) -> Option<[u8; 12]> {
    let (l3, l4, proto) = p.at;
    if data.len() != p.len || layout(data, d)? != p.at {
        return None;
    }
    let c = checksum_at(proto);
    let end = l4 + transport_len(proto)?;
    let head = &p.head[..end];
    let same = |r: std::ops::Range<usize>| head[r.clone()] == data[r];
    // Everything but addresses, ports and checksums is as it came (TTL included).
    if !(same(0..l3 + 10) && same(l4 + 4..l4 + c) && same(l4 + c + 2..end)) {
        return None;
    }
    let mut out = [0; 12];
    out[..8].copy_from_slice(&data[l3 + 12..l3 + 20]);
    out[8..].copy_from_slice(&data[l4..l4 + 4]);
    let mut again = p.head;
    let mut d = *d;
    rewrite(&mut again[..p.len.min(HEAD)], &mut d, &out);
    (again[..end] == data[..end]).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    impl FlowCache {
        /// [`FlowCache::find`] in `k`'s own set.
        fn lookup(&self, k: Key, now: u32) -> Option<[u8; 12]> {
            self.find(self.set_of(k), k, now)
        }
    }

    fn k(i: u32) -> Key {
        key(
            Direction::Outbound,
            UDP,
            [10, 0, 0, 1, 198, 51, 100, 1],
            [0, 53, (i >> 8) as u8, i as u8],
        ) | u128::from(i) << 112
    }

    #[test]
    fn an_entry_is_used_until_half_its_refresh_then_the_chain_renews_it() {
        let mut c = FlowCache::new(64, Duration::from_nanos(100 << TICK_SHIFT));
        let out = [7; 12];
        assert_eq!(c.lookup(k(1), 1000), None);
        c.install(k(1), out, 1000);
        assert_eq!(c.lookup(k(1), 1000), Some(out));
        assert_eq!(c.lookup(k(1), 1049), Some(out));
        assert_eq!(c.lookup(k(1), 1050), None, "due for renewal");
        assert_eq!(c.lookup(k(1), 1200), None, "expired");
        c.install(k(1), out, 1050);
        assert_eq!(c.lookup(k(1), 1099), Some(out), "renewed");
        c.forget(k(1));
        assert_eq!(c.lookup(k(1), 1060), None);
        // Ticks wrap: an entry installed just before the wrap lives on after it.
        c.install(k(2), out, u32::MAX - 10);
        assert_eq!(c.lookup(k(2), 20), Some(out));
    }

    #[test]
    fn a_full_set_gives_a_new_flow_the_way_that_expires_first() {
        let mut c = FlowCache::new(8, Duration::from_nanos(100 << TICK_SHIFT));
        let set = c.set_of(k(0));
        let same: Vec<Key> = (0..)
            .map(k)
            .filter(|&x| c.set_of(x) == set)
            .take(WAYS + 1)
            .collect();
        // Deadlines 130, 110, 120, 140: the second expires first.
        for (i, t) in [30, 10, 20, 40].into_iter().enumerate() {
            c.install(same[i], [i as u8; 12], t);
        }
        c.install(same[WAYS], [9; 12], 45);
        assert_eq!(c.lookup(same[1], 45), None, "the earliest deadline went");
        for i in [0, 2, 3, WAYS] {
            assert!(c.lookup(same[i], 45).is_some(), "way {i} stays");
        }
        // An expired way (same[2]'s, at 120) is taken before live ones (130 and later).
        c.install(same[1], [4; 12], 125);
        let held = |c: &FlowCache, x| c.sets[set].0.iter().any(|w| w.key == x);
        assert!(held(&c, same[1]) && !held(&c, same[2]));
        assert!([0, 3, WAYS].iter().all(|&i| held(&c, same[i])));
    }

    #[test]
    fn keys_that_differ_in_one_port_alone_spread_over_the_sets_whatever_the_seed() {
        // Answers through a NAT: the same addresses and source port, every destination port.
        let keys: Vec<Key> = (0..=u16::MAX)
            .map(|port| {
                let [a, b] = port.to_be_bytes();
                let addrs = [198, 51, 100, 1, 203, 0, 113, 1];
                key(Direction::Inbound, UDP, addrs, [0, 53, a, b])
            })
            .collect();
        // Each cache draws its own seed.
        for _ in 0..32 {
            let c = FlowCache::new(1 << 16, Duration::from_secs(1));
            let sets = c.sets.len();
            let mut load = vec![0u32; sets];
            for &k in &keys {
                load[c.set_of(k)] += 1;
            }
            // 65,536 keys in 16,384 sets, 4 a set on average: a uniform hash leaves about 2%
            // of the sets empty and none with more than about 16.
            let empty = load.iter().filter(|&&n| n == 0).count();
            let most = load.iter().copied().max().unwrap_or(0);
            assert!(
                empty < sets / 20,
                "{empty} of {sets} sets empty, seed {}",
                c.seed
            );
            assert!(most <= 20, "a set of {most} keys, seed {}", c.seed);
        }
    }

    #[test]
    fn the_reverse_of_a_key_swaps_ends_and_direction() {
        let a = key(
            Direction::Outbound,
            TCP,
            [10, 0, 0, 1, 192, 0, 2, 9],
            [4, 0, 1, 187],
        );
        let b = key(
            Direction::Inbound,
            TCP,
            [192, 0, 2, 9, 10, 0, 0, 1],
            [1, 187, 4, 0],
        );
        assert_eq!(reverse(a), b);
        assert_eq!(reverse(b), a);
        assert_ne!(a, 0);
    }
}
