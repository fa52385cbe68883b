//! The flow cache: a fast path in front of the chain, in the worker itself, for every driver
//! (HyperSFC §III: a fast path caching NF table entries in front of a slow path that holds
//! the full tables; the live box's XDP fast path, `flowstate_fastpath::flowcache`, is the same
//! idea in the kernel, which keeps the NFs' timers by sending a flow's packet through the
//! chain every half refresh instead).
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
//! * **No chain re-entry for time**: an entry lives until its flow and direction has been idle
//!   for `refresh` (each hit extends it), so an established flow's packets run the chain
//!   only when its entry is missing. The NFs' idle timers are kept by the cache instead, as
//!   Linux's flowtable keeps conntrack's (`net/netfilter/nf_flow_table_core.c` extends the
//!   timeouts of offloaded connections and restores them on teardown): at a flow's first
//!   hit in each `refresh`-long window of its own (offset by hash bits, so flows do not all
//!   renew in one tick) the stage tells the NFs of it
//!   ([`crate::NetworkFunction::active_until`], with the hit's time), and once its entry
//!   ends (found by a sweep that visits every set once per `refresh`, or taken by a new
//!   flow) the stage hands it back once with its last hit's time (to the tick). An NF never
//!   moves a timer earlier for it. So with `refresh` below a third of every NF's idle
//!   timeout no state expires under a cached flow, and the NFs' timers of a flow that left
//!   end as if they had seen every packet.
//! * **Bounded staleness**: the NFs hear of an active flow at least once per `refresh` plus
//!   one gap between its packets; an NF that no longer holds the flow or would treat its
//!   packets otherwise (a session gone, a rewrite changed) makes the entry go, and the next
//!   packet runs the chain. So a changed decision reaches an active flow within about
//!   `refresh`.
//! * **Bounded memory, nothing allocated per packet**: `capacity` entries in four-way sets of
//!   two adjacent cache lines (one 128-byte block, one page); a new flow takes an empty or
//!   ended way, else the least recently hit one (handed back). The flows for the NFs queue in
//!   a kept buffer, at most one per packet of a batch or four per set swept; the stage
//!   passes them on, 32 at a time with their state prefetched, once a batch leaves 32
//!   waiting, and at every tick (before the NFs' timers run).
//! * Per-flow order is the chain's: a batch's packets leave in the order they came, whichever
//!   path they took.
//!
//! Time is the runtime's (packet timestamps for captures and synthetic traffic), in ticks of
//! 2^20 ns (about a millisecond), wrapping every 52 days: comparisons are of differences. The
//! sweep runs from [`super::Stage::tick`], which the runtime calls every few milliseconds.

use super::{Frames, Item};
use crate::Direction;
use flowstate_state::Nanos;
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
    /// Until when (in ticks) the entry may be used: its last hit (or install) plus `refresh`.
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
    /// `refresh` in ticks, and the magic number that divides by it ([`window`]).
    refresh: u32,
    magic: u64,
    /// The keys of the segment being run, their sets, their windows' offsets and where their
    /// headers are, by position (`None`: the packet is not cacheable).
    keys: Vec<Option<(Key, usize, u32, Layout)>>,
    pending: Vec<Pending>,
    /// The flows to tell the NFs of ([`FlowCache::take_told`]).
    told: Vec<Told>,
    /// How far the sweep went: sets since time 0, `None` before the first sweep.
    swept: Option<u64>,
    /// Packets forwarded by the cache (not by the NFs).
    hits: u64,
    /// Flows told to the NFs while cached, and handed back.
    renewals: u64,
    handbacks: u64,
}

/// A flow the NFs must hear of ([`crate::NetworkFunction::active_until`]): the cache
/// forwarded its packets past them, the last at `until`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Told {
    pub(super) key: Key,
    pub(super) until: Nanos,
}

impl std::fmt::Debug for FlowCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FlowCache")
            .field("capacity", &(self.sets.len() * WAYS))
            .field("refresh_ticks", &self.refresh)
            .field("hits", &self.hits)
            .field("renewals", &self.renewals)
            .field("handbacks", &self.handbacks)
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

/// Which `refresh`-long window tick `t` is in, for a flow whose windows are offset by
/// `offset`: `(t + offset) / refresh`, by a multiplication with `magic = 2^64 / refresh`
/// rounded up (Lemire, Kaser and Kurz, "Faster remainder by direct computation", 2019: exact
/// for every 32-bit dividend).
fn window(magic: u64, t: u32, offset: u32) -> u32 {
    ((u128::from(magic) * u128::from(t.wrapping_add(offset))) >> 64) as u32
}

/// The runtime time at which tick `t` began, `t` being a tick near that of `now_ns` (within
/// 2^31 ticks either way).
fn time_of(t: u32, now_ns: Nanos) -> Nanos {
    let back = i64::from(tick(now_ns).wrapping_sub(t) as i32);
    (((now_ns >> TICK_SHIFT) as i64).saturating_sub(back).max(0) as u64) << TICK_SHIFT
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
            magic: u64::MAX / u64::from(refresh) + 1,
            keys: Vec::new(),
            pending: Vec::new(),
            told: Vec::new(),
            swept: None,
            hits: 0,
            renewals: 0,
            handbacks: 0,
        }
    }

    /// Packets the cache forwarded past the NFs so far.
    pub fn hits(&self) -> u64 {
        self.hits
    }

    /// Times the NFs were told of a flow the cache held (once per `refresh` of its activity).
    pub fn renewals(&self) -> u64 {
        self.renewals
    }

    /// Flows handed back to the NFs as their entries ended.
    pub fn handbacks(&self) -> u64 {
        self.handbacks
    }

    /// The set of `key`: the seeded 64-bit mix ([`flowstate_wire::hash::mix`]), every bit of
    /// which depends on every bit of the key, so keys that differ in one port alone (the
    /// answers through a NAT) spread over the sets.
    fn set_of(&self, key: Key) -> usize {
        self.place(key).0
    }

    /// The set of `key` ([`FlowCache::set_of`]), and the offset of its renewal windows (the
    /// mix's high bits: flows renew at different ticks, not all at once).
    fn place(&self, key: Key) -> (usize, u32) {
        let h = flowstate_wire::hash::mix(key, self.seed);
        (h as usize & self.mask, (h >> 32) as u32)
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
            let (s, offset) = self.place(k);
            self.keys[i] = Some((k, s, offset, at));
            prefetch_bytes(&self.sets[s], std::mem::size_of::<Set>());
        }
        for (i, it) in items.iter_mut().enumerate() {
            let Some((k, s, offset, at)) = self.keys[i] else {
                continue;
            };
            let Some(data) = batch.frame_mut(it.index) else {
                continue;
            };
            match self.hit(s, k, offset, tick(it.now)) {
                Some((out, tell)) => {
                    rewrite(data, &mut it.dissection, &out);
                    it.fast = true;
                    self.hits += 1;
                    if tell {
                        self.renewals += 1;
                        self.told.push(Told {
                            key: k,
                            until: it.now,
                        });
                    }
                }
                None => self.remember(i, k, at, false, data),
            }
        }
    }

    /// What the chain does to the packets of `k` (in set `s`, its windows offset by `offset`),
    /// unless the entry is missing or ended by tick `now`; and whether this is the flow's
    /// first hit in a window of its own, so the NFs must hear of it. A hit extends the entry
    /// to `now + refresh`: its last hit is always `deadline - refresh`.
    fn hit(&mut self, s: usize, k: Key, offset: u32, now: u32) -> Option<([u8; 12], bool)> {
        let (refresh, magic) = (self.refresh, self.magic);
        let w = self.sets[s].0.iter_mut().find(|w| w.key == k)?;
        if remaining(w.deadline, now) <= 0 {
            return None;
        }
        let last = w.deadline.wrapping_sub(refresh);
        w.deadline = now.wrapping_add(refresh);
        Some((
            w.out,
            window(magic, now, offset) != window(magic, last, offset),
        ))
    }

    /// What the chain does to the packets of `k` (for tests: a lookup that changes nothing).
    #[cfg(test)]
    fn find(&self, k: Key, now: u32) -> Option<[u8; 12]> {
        let w = self.sets[self.set_of(k)].0.iter().find(|w| w.key == k)?;
        (remaining(w.deadline, now) > 0).then_some(w.out)
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
            // A hairpinned flow is not cached: the NFs before the NAT saw it the other way.
            let out = batch
                .frame(it.index)
                .filter(|_| it.alive && !it.hairpinned)
                .map(|data| (data, &it.dissection));
            if p.closing {
                self.forget(p.key);
                if let Some((k, _, _)) = out.and_then(|(data, d)| key_of(data, d, dir)) {
                    self.forget(reverse(k));
                }
                continue;
            }
            match out.and_then(|(data, d)| lesson(p, data, d)) {
                Some(out) => self.install(p.key, out, tick(it.now), it.now),
                None => self.forget(p.key),
            }
        }
        self.pending = pending;
    }

    /// Installs `k`'s entry at tick `now` (of runtime time `now_ns`). A way of another flow it
    /// takes, live or ended but not yet swept, is handed back.
    fn install(&mut self, k: Key, out: [u8; 12], now: u32, now_ns: Nanos) {
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
        let old = ways[i];
        ways[i] = Way {
            key: k,
            out,
            deadline: now.wrapping_add(self.refresh),
        };
        if old.key != 0 && old.key != k {
            self.hand_back(old, now_ns);
        }
    }

    /// Queues `w`'s flow for the NFs as its entry ends: its last hit is `deadline - refresh`.
    fn hand_back(&mut self, w: Way, now_ns: Nanos) {
        self.handbacks += 1;
        self.told.push(Told {
            key: w.key,
            until: time_of(w.deadline.wrapping_sub(self.refresh), now_ns),
        });
    }

    /// Sweeps the sets due by `now` (every set once per `refresh`, in order, at most
    /// `max_sets` a call): each entry whose flow has been idle for `refresh` is handed back
    /// and cleared. Whether sets are still due (call again after taking what was told).
    pub(super) fn sweep(&mut self, now_ns: Nanos, max_sets: usize) -> bool {
        let sets = self.sets.len() as u64;
        let due =
            (u128::from(now_ns >> TICK_SHIFT) * u128::from(sets) / u128::from(self.refresh)) as u64;
        let mut from = *self.swept.get_or_insert(due);
        if due < from {
            // The clock went back: sweep from here.
            self.swept = Some(due);
            return false;
        }
        from = from.max(due.saturating_sub(sets));
        let n = (due - from).min(max_sets as u64);
        let now = tick(now_ns);
        for i in from..from + n {
            let s = i as usize & self.mask;
            for j in 0..WAYS {
                let w = self.sets[s].0[j];
                if w.key != 0 && remaining(w.deadline, now) <= 0 {
                    self.sets[s].0[j] = Way::default();
                    self.hand_back(w, now_ns);
                }
            }
        }
        self.swept = Some(from + n);
        from + n < due
    }

    /// Flows told of that the NFs have not heard of yet.
    pub(super) fn waiting(&self) -> usize {
        self.told.len()
    }

    /// The flows to tell the NFs of since the last call (into `out`, which is cleared first;
    /// the buffers trade places, so nothing is allocated once both have grown).
    pub(super) fn take_told(&mut self, out: &mut Vec<Told>) {
        out.clear();
        std::mem::swap(out, &mut self.told);
    }

    /// What the NFs said of a flow told them: `None`, one would not forward its packets
    /// unchanged (the entry goes); `Some(flow)`, the flow as they leave it, which must be
    /// what the entry gives its packets (else the entry goes: the chain decides anew).
    pub(super) fn settle(&mut self, k: Key, flow: Option<&FlowKey>) {
        let s = self.set_of(k);
        let Some(w) = self.sets[s].0.iter_mut().find(|w| w.key == k) else {
            return;
        };
        if flow.and_then(out_of).is_none_or(|out| out != w.out) {
            *w = Way::default();
        }
    }

    pub(super) fn forget(&mut self, k: Key) {
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

/// The flow of key `k` (as the packets came to the stage) and the direction they went.
pub(super) fn flow_of(k: Key) -> (FlowKey, Direction) {
    let a = (k as u64).to_le_bytes();
    let p = ((k >> 64) as u32).to_le_bytes();
    let dir = if (k >> 104) as u8 == 1 {
        Direction::Outbound
    } else {
        Direction::Inbound
    };
    let flow = FlowKey::new(
        IpAddr::V4(Ipv4Addr::new(a[0], a[1], a[2], a[3])),
        IpAddr::V4(Ipv4Addr::new(a[4], a[5], a[6], a[7])),
        u16::from_be_bytes([p[0], p[1]]),
        u16::from_be_bytes([p[2], p[3]]),
        (k >> 96) as u8,
    );
    (flow, dir)
}

/// The addresses and ports of an IPv4 `flow` as on the wire (a way's `out`).
fn out_of(flow: &FlowKey) -> Option<[u8; 12]> {
    let (IpAddr::V4(src), IpAddr::V4(dst)) = (flow.src, flow.dst) else {
        return None;
    };
    let mut out = [0; 12];
    out[..4].copy_from_slice(&src.octets());
    out[4..8].copy_from_slice(&dst.octets());
    out[8..10].copy_from_slice(&flow.src_port.to_be_bytes());
    out[10..].copy_from_slice(&flow.dst_port.to_be_bytes());
    Some(out)
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
        /// [`FlowCache::find`].
        fn lookup(&self, k: Key, now: u32) -> Option<[u8; 12]> {
            self.find(k, now)
        }

        /// A hit of `k` at tick `now`: what the cache does to its packet, and whether the
        /// NFs must hear of the flow.
        fn hit_at(&mut self, k: Key, now: u32) -> Option<([u8; 12], bool)> {
            let (s, offset) = self.place(k);
            self.hit(s, k, offset, now)
        }

        /// [`FlowCache::install`] at tick `t`.
        fn put(&mut self, k: Key, out: [u8; 12], t: u32) {
            self.install(k, out, t, ns(t));
        }

        fn told(&mut self) -> Vec<Told> {
            let mut out = Vec::new();
            self.take_told(&mut out);
            out
        }
    }

    /// The runtime time of tick `t`.
    fn ns(t: u32) -> Nanos {
        u64::from(t) << TICK_SHIFT
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
    fn an_entry_lives_refresh_after_its_last_hit() {
        let mut c = FlowCache::new(64, Duration::from_nanos(100 << TICK_SHIFT));
        let out = [7; 12];
        assert_eq!(c.lookup(k(1), 1000), None);
        c.put(k(1), out, 1000);
        assert_eq!(c.lookup(k(1), 1099), Some(out));
        assert_eq!(c.lookup(k(1), 1100), None, "idle for refresh: ended");
        assert_eq!(c.hit_at(k(1), 1100), None);
        assert_eq!(c.hit_at(k(1), 1099).map(|h| h.0), Some(out));
        assert_eq!(c.lookup(k(1), 1198), Some(out), "extended by the hit");
        assert_eq!(c.lookup(k(1), 1199), None);
        c.forget(k(1));
        assert_eq!(c.lookup(k(1), 1150), None);
        // Ticks wrap: an entry installed just before the wrap lives on after it.
        c.put(k(2), out, u32::MAX - 10);
        assert_eq!(c.hit_at(k(2), 20).map(|h| h.0), Some(out));
        assert_eq!(c.lookup(k(2), 110), Some(out));
        assert!(
            c.told().is_empty(),
            "nothing to tell without sweeps or evictions"
        );
    }

    #[test]
    fn the_nfs_hear_of_a_busy_flow_once_per_refresh_at_a_tick_of_its_own() {
        let refresh = 100;
        let mut c = FlowCache::new(1 << 12, Duration::from_nanos(refresh << TICK_SHIFT));
        let mut first_tells = Vec::new();
        for i in 0..16 {
            c.put(k(i), [1; 12], 1000);
            // A hit every tick for 10 refreshes.
            let tells: Vec<u32> = (1001..2001)
                .filter(|&t| c.hit_at(k(i), t).is_some_and(|(_, tell)| tell))
                .collect();
            assert_eq!(tells.len(), 10, "flow {i}: {tells:?}");
            assert!(
                tells.windows(2).all(|w| w[1] - w[0] == refresh as u32),
                "flow {i}: {tells:?}"
            );
            first_tells.push(tells[0]);
        }
        first_tells.sort_unstable();
        first_tells.dedup();
        assert!(first_tells.len() > 8, "staggered: {first_tells:?}");
    }

    #[test]
    fn the_sweep_hands_an_idle_entry_back_once_with_its_last_hit() {
        let mut c = FlowCache::new(1 << 10, Duration::from_nanos(100 << TICK_SHIFT));
        c.sweep(ns(900), usize::MAX);
        c.put(k(1), [1; 12], 1000);
        c.put(k(2), [2; 12], 1000);
        assert!(c.hit_at(k(1), 1040).is_some());
        let mut told = Vec::new();
        // Ticks of a few ms, as the runtime's.
        for t in (901..1400).step_by(3) {
            while c.sweep(ns(t), 16) {
                told.extend(c.told());
            }
            told.extend(c.told());
            if t < 1100 {
                assert!(told.is_empty(), "tick {t}: {told:?}");
            }
        }
        told.sort_by_key(|t| t.key);
        let want = [
            Told {
                key: k(1),
                until: ns(1040),
            },
            Told {
                key: k(2),
                until: ns(1000),
            },
        ];
        let mut want = want.to_vec();
        want.sort_by_key(|t| t.key);
        assert_eq!(told, want);
        assert_eq!(c.handbacks(), 2);
        assert_eq!(c.lookup(k(1), 1100), None, "cleared");
        // A whole round in one call at most, however long the clock was away.
        c.put(k(3), [3; 12], 5000);
        assert!(!c.sweep(ns(900_000), usize::MAX));
        assert_eq!(c.told().len(), 1);
    }

    #[test]
    fn the_time_of_a_tick_is_where_it_began_across_the_wrap() {
        assert_eq!(time_of(1040, ns(1100) + 5), ns(1040));
        let now = (1u64 << (32 + TICK_SHIFT)) + ns(5);
        assert_eq!(time_of(u32::MAX - 2, now), now - ns(5) - ns(3));
        assert_eq!(time_of(1, ns(0)), ns(1));
    }

    #[test]
    fn a_full_set_gives_a_new_flow_the_way_that_expires_first_and_hands_it_back() {
        let mut c = FlowCache::new(8, Duration::from_nanos(100 << TICK_SHIFT));
        let set = c.set_of(k(0));
        let same: Vec<Key> = (0..)
            .map(k)
            .filter(|&x| c.set_of(x) == set)
            .take(WAYS + 1)
            .collect();
        // Deadlines 130, 110, 120, 140: the second expires first.
        for (i, t) in [30, 10, 20, 40].into_iter().enumerate() {
            c.put(same[i], [i as u8; 12], t);
        }
        c.put(same[WAYS], [9; 12], 45);
        assert_eq!(c.lookup(same[1], 45), None, "the earliest deadline went");
        for i in [0, 2, 3, WAYS] {
            assert!(c.lookup(same[i], 45).is_some(), "way {i} stays");
        }
        assert_eq!(
            c.told(),
            vec![Told {
                key: same[1],
                until: ns(10)
            }]
        );
        // An expired way (same[2]'s, at 120) is taken before live ones (130 and later), and
        // handed back too: the sweep has not reached it yet.
        c.put(same[1], [4; 12], 125);
        let held = |c: &FlowCache, x| c.sets[set].0.iter().any(|w| w.key == x);
        assert!(held(&c, same[1]) && !held(&c, same[2]));
        assert!([0, 3, WAYS].iter().all(|&i| held(&c, same[i])));
        assert_eq!(
            c.told(),
            vec![Told {
                key: same[2],
                until: ns(20)
            }]
        );
        // The flow's own way is no hand-back.
        c.put(same[1], [5; 12], 126);
        assert!(c.told().is_empty());
    }

    #[test]
    fn settling_keeps_an_entry_only_if_the_nfs_give_its_rewrite() {
        let mut c = FlowCache::new(64, Duration::from_secs(1));
        let k = key(
            Direction::Outbound,
            TCP,
            [10, 0, 0, 1, 192, 0, 2, 9],
            [4, 0, 1, 187],
        );
        let (flow, dir) = flow_of(k);
        assert_eq!(dir, Direction::Outbound);
        assert_eq!(flow.proto, TCP);
        assert_eq!(
            out_of(&flow),
            Some([10, 0, 0, 1, 192, 0, 2, 9, 4, 0, 1, 187])
        );
        let nat = |port: u16| FlowKey {
            src: IpAddr::V4(Ipv4Addr::new(203, 0, 113, 1)),
            src_port: port,
            ..flow
        };
        let out = out_of(&nat(5000)).unwrap_or_default();
        c.put(k, out, 10);
        c.settle(k, Some(&nat(5000)));
        assert_eq!(c.lookup(k, 11), Some(out), "the same rewrite: kept");
        c.settle(k, Some(&nat(5001)));
        assert_eq!(c.lookup(k, 11), None, "another rewrite: gone");
        c.put(k, out, 10);
        c.settle(k, None);
        assert_eq!(c.lookup(k, 11), None, "refused: gone");
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
