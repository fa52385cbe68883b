//! IPv4 fragments through the chain: the ports of a datagram's first fragment, given to its
//! later fragments (a shallow virtual reassembly, as VPP's NAT does it).
//!
//! Only the first fragment of a datagram carries its transport header, but the NFs find a
//! flow's state by its ports, and RFC 4787 REQ-14 asks a NAT to translate every fragment, in
//! order or not. The tracker remembers each datagram's ports, keyed by source, destination,
//! protocol and identification (what makes a datagram, RFC 791 §3.2), from its first fragment,
//! and fills them into the flow key of its later fragments ([`Fragment::Tracked`]). They are
//! then steered to the flow's worker and handled with the flow's state (the NAT rewrites
//! their addresses as it did the first fragment's). Nothing is reassembled: fragments leave
//! as they came, each when its turn comes.
//!
//! * A later fragment that comes before its first fragment is copied and held until the
//!   first fragment comes; then it goes through right after it.
//! * A datagram is forgotten once its fragments have covered its length (the last fragment
//!   gives the length), or `timeout` after the first of its fragments came (checked every quarter
//!   `timeout`, when fragments come); fragments still held then are dropped as
//!   `fragments.first_missing`, and so are those held when the input ends.
//! * Bounded: at most `datagrams` datagrams tracked and `held` fragments held (each a
//!   `max_frame` buffer, allocated when the first fragment arrives, never per packet). A
//!   fragment beyond either bound is dropped and counted (`fragments.too_many_datagrams`,
//!   `fragments.too_many_held`). A first fragment always goes through.
//! * A TCP fragment at offset 8 is dropped (`fragments.overlapping_header`): its only use is
//!   to overwrite the first fragment's TCP flags at reassembly (RFC 1858 §3.2, RFC 3128).
//! * IPv6 fragments are not tracked (they stay [`Fragment::Later`]): no NF translates IPv6.

use flowstate_io::PacketMeta;
use flowstate_wire::dissect::{Fragment, Network};
use flowstate_wire::flow::proto;
use flowstate_wire::Dissection;
use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::time::Duration;

/// Bounds of a [`FragmentTracker`] (`[runtime] fragment_timeout`, `fragment_datagrams`,
/// `fragments_held`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FragmentLimits {
    /// How long a datagram is tracked after its first fragment seen.
    pub timeout: Duration,
    /// Datagrams tracked at once.
    pub datagrams: usize,
    /// Later fragments held while their first fragment has not come.
    pub held: usize,
}

/// Default [`FragmentLimits::timeout`]: Linux's `ipfrag_time`.
pub(crate) const DEFAULT_FRAGMENT_TIMEOUT: Duration = Duration::from_secs(30);
/// Default [`FragmentLimits::datagrams`].
pub(crate) const DEFAULT_FRAGMENT_DATAGRAMS: usize = 16_384;
/// Default [`FragmentLimits::held`].
pub(crate) const DEFAULT_FRAGMENTS_HELD: usize = 256;

impl Default for FragmentLimits {
    fn default() -> Self {
        FragmentLimits {
            timeout: DEFAULT_FRAGMENT_TIMEOUT,
            datagrams: DEFAULT_FRAGMENT_DATAGRAMS,
            held: DEFAULT_FRAGMENTS_HELD,
        }
    }
}

/// Why a fragment was dropped (the summary's `fragments.*` drop keys).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FragmentDrop {
    /// Held, and its first fragment did not come in time (or before the input ended).
    FirstMissing,
    /// No room to track one more datagram.
    TooManyDatagrams,
    /// No room to hold one more fragment.
    TooManyHeld,
    /// A TCP fragment at offset 8 (RFC 1858 §3.2).
    OverlappingHeader,
}

impl FragmentDrop {
    /// Every reason, in [`FragmentCounts::dropped`] order.
    pub(crate) const ALL: [FragmentDrop; 4] = [
        FragmentDrop::FirstMissing,
        FragmentDrop::TooManyDatagrams,
        FragmentDrop::TooManyHeld,
        FragmentDrop::OverlappingHeader,
    ];

    /// The summary key (`fragments.<name>`).
    pub(crate) fn name(self) -> &'static str {
        match self {
            FragmentDrop::FirstMissing => "first_missing",
            FragmentDrop::TooManyDatagrams => "too_many_datagrams",
            FragmentDrop::TooManyHeld => "too_many_held",
            FragmentDrop::OverlappingHeader => "overlapping_header",
        }
    }
}

/// What a tracker did, for the run's summary.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct FragmentCounts {
    /// Datagrams whose fragments were seen.
    pub datagrams: u64,
    /// Later fragments given their datagram's ports.
    pub tracked: u64,
    /// Later fragments held for their first fragment.
    pub held: u64,
    /// Held fragments that went on after their first fragment.
    pub released: u64,
    /// Fragments dropped, by [`FragmentDrop::ALL`] index.
    pub dropped: [u64; 4],
}

impl FragmentCounts {
    /// Adds `other`'s counts.
    pub(crate) fn merge(&mut self, other: &FragmentCounts) {
        self.datagrams += other.datagrams;
        self.tracked += other.tracked;
        self.held += other.held;
        self.released += other.released;
        for (a, b) in self.dropped.iter_mut().zip(other.dropped) {
            *a += b;
        }
    }
}

/// What to do with a fragment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Admit {
    /// Goes on (a later fragment: its dissection now has the datagram's ports).
    Pass,
    /// Held until its first fragment comes ([`FragmentTracker::pop_released`]).
    Held,
    /// Dropped (counted).
    Drop(FragmentDrop),
}

/// What makes a datagram (RFC 791 §3.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct DatagramKey {
    src: u32,
    dst: u32,
    id: u16,
    proto: u8,
}

#[derive(Debug, Clone, Copy)]
struct Datagram {
    /// The first fragment's ports, once it came.
    ports: Option<(u16, u16)>,
    deadline: u64,
    /// Payload bytes seen (duplicates count again: a datagram may be forgotten early, and
    /// a late duplicate is then held until it times out).
    seen: u32,
    /// The datagram's length, once its last fragment came (0 before).
    total: u32,
    /// Fragments held for it.
    held: u32,
}

/// A slot for a held fragment; its buffer is allocated once.
#[derive(Debug)]
struct Slot {
    state: SlotState,
    meta: PacketMeta,
    dissection: Option<Dissection>,
    len: usize,
    buf: Box<[u8]>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SlotState {
    Free,
    /// Waits for the first fragment of this datagram.
    Held(DatagramKey),
    /// Its first fragment came: its dissection has the ports; waits to be taken.
    Released,
}

/// The fragment tracker of one dispatcher or worker (see the module documentation).
#[derive(Debug)]
pub(crate) struct FragmentTracker {
    limits: FragmentLimits,
    max_frame: usize,
    datagrams: HashMap<DatagramKey, Datagram>,
    /// `limits.held` slots, allocated on the first fragment.
    slots: Vec<Slot>,
    /// Indices of free slots.
    free: Vec<usize>,
    /// Indices of released slots, in order.
    released: VecDeque<usize>,
    next_sweep: u64,
    counts: FragmentCounts,
}

impl FragmentTracker {
    /// A tracker with `limits` whose held fragments are at most `max_frame` bytes. Allocates
    /// nothing until the first fragment.
    pub(crate) fn new(limits: FragmentLimits, max_frame: usize) -> Self {
        FragmentTracker {
            limits,
            max_frame: max_frame.max(1),
            datagrams: HashMap::new(),
            slots: Vec::new(),
            free: Vec::new(),
            released: VecDeque::new(),
            next_sweep: 0,
            counts: FragmentCounts::default(),
        }
    }

    /// What it did so far.
    pub(crate) fn counts(&self) -> &FragmentCounts {
        &self.counts
    }

    /// Takes fragment `frame` (dissected as `d`, `d.fragment` not `None`), which arrived at
    /// `meta.timestamp_ns`: fills a later fragment's ports into `d`, or holds it, or drops
    /// it. A first fragment always passes, and releases the fragments held for it.
    pub(crate) fn admit(&mut self, frame: &[u8], meta: &PacketMeta, d: &mut Dissection) -> Admit {
        let (Network::Ipv4, Some(flow)) = (d.network, d.flow) else {
            return Admit::Pass;
        };
        let (IpAddr::V4(src), IpAddr::V4(dst)) = (flow.src, flow.dst) else {
            return Admit::Pass;
        };
        let Some(ip) = frame.get(d.l3_offset..d.l3_end) else {
            return Admit::Pass;
        };
        let header = usize::from(ip.first().map_or(0, |b| b & 0x0f)) * 4;
        if header < 20 || ip.len() < header {
            return Admit::Pass;
        }
        let key = DatagramKey {
            src: src.into(),
            dst: dst.into(),
            id: u16::from_be_bytes([ip[4], ip[5]]),
            proto: d.protocol,
        };
        let flags_offset = u16::from_be_bytes([ip[6], ip[7]]);
        let offset = u32::from(flags_offset & 0x1fff) * 8;
        let more = flags_offset & 0x2000 != 0;
        let payload = (ip.len() - header) as u32;
        let now = meta.timestamp_ns;
        if d.protocol == proto::TCP && offset == 8 {
            return self.drop(FragmentDrop::OverlappingHeader);
        }
        if self.slots.is_empty() {
            self.allocate();
        }
        if now >= self.next_sweep {
            self.sweep(now);
        }
        let first = d.fragment == Fragment::First;
        if !self.datagrams.contains_key(&key) {
            if self.datagrams.len() >= self.limits.datagrams {
                self.sweep(now);
            }
            if self.datagrams.len() >= self.limits.datagrams {
                return if first {
                    Admit::Pass
                } else {
                    self.drop(FragmentDrop::TooManyDatagrams)
                };
            }
            self.counts.datagrams += 1;
            let deadline = now.saturating_add(self.limits.timeout.as_nanos() as u64);
            self.datagrams.insert(
                key,
                Datagram {
                    ports: None,
                    deadline,
                    seen: 0,
                    total: 0,
                    held: 0,
                },
            );
        }
        let Some(dg) = self.datagrams.get_mut(&key) else {
            return Admit::Pass;
        };
        // A later fragment before its first one waits in a slot.
        let slot = if !first && dg.ports.is_none() {
            let Some(i) = self.free.pop() else {
                return self.drop(FragmentDrop::TooManyHeld);
            };
            Some(i)
        } else {
            None
        };
        dg.seen = dg.seen.saturating_add(payload);
        if !more {
            dg.total = offset + payload;
        }
        if let Some(i) = slot {
            dg.held += 1;
            let s = &mut self.slots[i];
            let len = frame.len().min(s.buf.len());
            s.buf[..len].copy_from_slice(&frame[..len]);
            (s.state, s.meta, s.dissection, s.len) = (SlotState::Held(key), *meta, Some(*d), len);
            self.counts.held += 1;
            return Admit::Held;
        }
        if first {
            let ports = (flow.src_port, flow.dst_port);
            dg.ports = Some(ports);
            if dg.held > 0 {
                dg.held = 0;
                for (i, s) in self.slots.iter_mut().enumerate() {
                    if s.state == SlotState::Held(key) {
                        s.state = SlotState::Released;
                        s.dissection = s.dissection.map(|d| d.tracked(ports));
                        self.released.push_back(i);
                    }
                }
            }
        } else if let Some(ports) = dg.ports {
            *d = d.tracked(ports);
            self.counts.tracked += 1;
        }
        if dg.total > 0 && dg.seen >= dg.total {
            // Every byte came (held fragments counted when they came, and released now).
            self.datagrams.remove(&key);
        }
        Admit::Pass
    }

    /// Whether released fragments wait to be taken with [`FragmentTracker::pop_released`].
    #[inline]
    pub(crate) fn has_released(&self) -> bool {
        !self.released.is_empty()
    }

    /// Hands the oldest released fragment and its dissection ([`Fragment::Tracked`]) to `f`,
    /// and frees its slot; `false` when none is left.
    pub(crate) fn pop_released(&mut self, f: impl FnOnce(&[u8], &PacketMeta, Dissection)) -> bool {
        let Some(i) = self.released.pop_front() else {
            return false;
        };
        let s = &mut self.slots[i];
        s.state = SlotState::Free;
        self.free.push(i);
        self.counts.released += 1;
        self.counts.tracked += 1;
        if let Some(d) = s.dissection.take() {
            f(&s.buf[..s.len], &s.meta, d);
        }
        true
    }

    /// Drops every fragment still held (the input ended); released ones stay to be taken.
    pub(crate) fn drop_held(&mut self) {
        Self::drop_held_where(&mut self.slots, &mut self.free, &mut self.counts, |_| true);
        self.datagrams.clear();
    }

    fn drop(&mut self, why: FragmentDrop) -> Admit {
        self.counts.dropped[why as usize] += 1;
        Admit::Drop(why)
    }

    fn allocate(&mut self) {
        let held = self.limits.held.max(1);
        self.datagrams.reserve(self.limits.datagrams.max(1));
        self.slots = (0..held)
            .map(|_| Slot {
                state: SlotState::Free,
                meta: PacketMeta::default(),
                dissection: None,
                len: 0,
                buf: vec![0u8; self.max_frame].into_boxed_slice(),
            })
            .collect();
        self.free = (0..held).rev().collect();
        self.released.reserve(held);
    }

    /// Frees the held slots whose datagram `gone` says is forgotten, counting them dropped.
    fn drop_held_where(
        slots: &mut [Slot],
        free: &mut Vec<usize>,
        counts: &mut FragmentCounts,
        gone: impl Fn(&DatagramKey) -> bool,
    ) {
        for (i, s) in slots.iter_mut().enumerate() {
            if matches!(s.state, SlotState::Held(k) if gone(&k)) {
                s.state = SlotState::Free;
                free.push(i);
                counts.dropped[FragmentDrop::FirstMissing as usize] += 1;
            }
        }
    }

    /// Forgets the datagrams whose time ran out, dropping the fragments held for them.
    fn sweep(&mut self, now: u64) {
        let timeout = self.limits.timeout.as_nanos() as u64;
        self.next_sweep = now.saturating_add((timeout / 4).max(1_000_000));
        let mut expired_held = false;
        self.datagrams.retain(|_, dg| {
            let keep = dg.deadline > now;
            expired_held |= !keep && dg.held > 0;
            keep
        });
        if expired_held {
            let datagrams = &self.datagrams;
            Self::drop_held_where(&mut self.slots, &mut self.free, &mut self.counts, |k| {
                !datagrams.contains_key(k)
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flowstate_wire::build::*;
    use flowstate_wire::dissect::dissect;
    use proptest::prelude::*;
    use std::net::Ipv4Addr;

    /// The fragments (IP payloads of at most 16 bytes) of a UDP datagram with `len` payload
    /// bytes from port `sport`, identification `id`.
    fn datagram(sport: u16, id: u16, len: usize) -> Vec<Vec<u8>> {
        let mut ip = Ipv4Spec::new(Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(192, 0, 2, 1));
        ip.id = id;
        let frame = flowstate_testkit::write(&FrameSpec {
            ethernet: flowstate_testkit::ethernet(),
            ip: IpSpec::V4(ip),
            l4: L4Spec::Udp(UdpSpec {
                src_port: sport,
                dst_port: 53,
            }),
            payload: Payload::Fill { len, byte: 7 },
            min_len: 0,
        });
        fragment_ipv4(&frame, 16)
    }

    fn at(ns: u64) -> PacketMeta {
        PacketMeta {
            timestamp_ns: ns,
            ..PacketMeta::default()
        }
    }

    /// Admits `frame` at `ns`: the verdict and the dissection after it.
    fn admit(t: &mut FragmentTracker, frame: &[u8], ns: u64) -> (Admit, Dissection) {
        let mut d = dissect(frame).unwrap();
        assert_ne!(d.fragment, Fragment::None);
        let a = t.admit(frame, &at(ns), &mut d);
        (a, d)
    }

    fn ports(d: &Dissection) -> (Fragment, u16, u16) {
        let f = d.flow.unwrap();
        (d.fragment, f.src_port, f.dst_port)
    }

    fn released(t: &mut FragmentTracker) -> Vec<(Vec<u8>, Dissection)> {
        let mut out = Vec::new();
        while t.pop_released(|b, _, d| out.push((b.to_vec(), d))) {}
        out
    }

    #[test]
    fn in_order_fragments_get_the_first_ones_ports_and_are_forgotten() {
        let mut t = FragmentTracker::new(FragmentLimits::default(), 2048);
        let parts = datagram(4000, 1, 30); // 8 + 30 bytes: 3 fragments
        assert_eq!(parts.len(), 3);
        let (a, d) = admit(&mut t, &parts[0], 0);
        assert_eq!((a, ports(&d)), (Admit::Pass, (Fragment::First, 4000, 53)));
        for p in &parts[1..] {
            let (a, d) = admit(&mut t, p, 1);
            assert_eq!((a, ports(&d)), (Admit::Pass, (Fragment::Tracked, 4000, 53)));
        }
        assert!(t.datagrams.is_empty(), "every byte came: forgotten");
        assert_eq!((t.counts.datagrams, t.counts.tracked), (1, 2));
    }

    #[test]
    fn later_fragments_wait_for_their_first_and_follow_it_in_arrival_order() {
        let mut t = FragmentTracker::new(FragmentLimits::default(), 2048);
        let parts = datagram(4000, 1, 30);
        assert_eq!(admit(&mut t, &parts[2], 0).0, Admit::Held);
        assert_eq!(admit(&mut t, &parts[1], 1).0, Admit::Held);
        assert!(!t.has_released());
        // Another datagram's first fragment releases nothing.
        assert_eq!(admit(&mut t, &datagram(4001, 2, 30)[0], 2).0, Admit::Pass);
        assert!(!t.has_released());
        assert_eq!(admit(&mut t, &parts[0], 3).0, Admit::Pass);
        let out = released(&mut t);
        assert_eq!(out.len(), 2);
        assert_eq!(out[0].0, parts[2]);
        assert_eq!(out[1].0, parts[1]);
        for (_, d) in &out {
            assert_eq!(ports(d), (Fragment::Tracked, 4000, 53));
        }
        assert_eq!(t.counts.released, 2);
        assert_eq!(t.datagrams.len(), 1, "only the other datagram is left");
    }

    #[test]
    fn held_fragments_whose_first_never_comes_are_dropped_after_the_timeout() {
        let limits = FragmentLimits {
            timeout: Duration::from_secs(1),
            ..FragmentLimits::default()
        };
        let mut t = FragmentTracker::new(limits, 2048);
        let parts = datagram(4000, 1, 30);
        assert_eq!(admit(&mut t, &parts[1], 0).0, Admit::Held);
        // Before the timeout nothing is dropped; within a quarter of it after, the next
        // fragment sweeps.
        admit(&mut t, &datagram(4001, 2, 30)[0], 900_000_000);
        assert_eq!(t.counts.dropped, [0; 4]);
        admit(&mut t, &datagram(4002, 3, 30)[0], 1_250_000_000);
        assert_eq!(t.counts.dropped, [1, 0, 0, 0]);
        // The late first fragment releases nothing; its later ones are tracked again.
        assert_eq!(admit(&mut t, &parts[0], 1_300_000_000).0, Admit::Pass);
        assert!(!t.has_released());
        let (a, d) = admit(&mut t, &parts[2], 1_300_000_001);
        assert_eq!((a, ports(&d)), (Admit::Pass, (Fragment::Tracked, 4000, 53)));
        // The input ends with a fragment held: dropped too.
        assert_eq!(
            admit(&mut t, &datagram(4003, 4, 30)[1], 1_400_000_000).0,
            Admit::Held
        );
        t.drop_held();
        assert_eq!(t.counts.dropped, [2, 0, 0, 0]);
        assert_eq!(t.free.len(), DEFAULT_FRAGMENTS_HELD);
    }

    #[test]
    fn limits_drop_and_count_and_a_first_fragment_always_passes() {
        let limits = FragmentLimits {
            datagrams: 1,
            held: 1,
            ..FragmentLimits::default()
        };
        let mut t = FragmentTracker::new(limits, 2048);
        let (a, b) = (datagram(4000, 1, 30), datagram(4001, 2, 30));
        assert_eq!(admit(&mut t, &a[1], 0).0, Admit::Held);
        assert_eq!(
            admit(&mut t, &a[2], 0).0,
            Admit::Drop(FragmentDrop::TooManyHeld)
        );
        assert_eq!(
            admit(&mut t, &b[1], 0).0,
            Admit::Drop(FragmentDrop::TooManyDatagrams)
        );
        assert_eq!(admit(&mut t, &b[0], 0).0, Admit::Pass);
        assert_eq!(t.counts.dropped, [0, 1, 1, 0]);
    }

    #[test]
    fn a_tcp_fragment_at_offset_8_is_dropped() {
        let mut t = FragmentTracker::new(FragmentLimits::default(), 2048);
        let frame = flowstate_testkit::write(&FrameSpec {
            ethernet: flowstate_testkit::ethernet(),
            ip: IpSpec::V4(Ipv4Spec::new(
                Ipv4Addr::new(10, 0, 0, 1),
                Ipv4Addr::new(192, 0, 2, 1),
            )),
            l4: L4Spec::Tcp(TcpSpec {
                src_port: 1000,
                dst_port: 80,
                seq: 1,
                ack: 0,
                flags: tcp_flags::ACK,
                window: 100,
                urgent: 0,
                options: TcpOptions::NONE,
            }),
            payload: Payload::Fill { len: 40, byte: 1 },
            min_len: 0,
        });
        let parts = fragment_ipv4(&frame, 8);
        assert_eq!(
            admit(&mut t, &parts[1], 0).0,
            Admit::Drop(FragmentDrop::OverlappingHeader)
        );
        assert_eq!(
            t.counts.dropped[FragmentDrop::OverlappingHeader as usize],
            1
        );
    }

    proptest! {
        /// Any interleaving of several datagrams' fragments, in any order: each fragment goes
        /// on exactly once (at once or released), later ones with their own datagram's ports,
        /// and none before its datagram's first fragment.
        #[test]
        fn every_fragment_goes_on_once_with_its_datagrams_ports(
            sizes in proptest::collection::vec(9usize..100, 1..6),
            order in any::<proptest::sample::Index>(),
            seed in any::<u64>(),
        ) {
            let mut all: Vec<(usize, Vec<u8>)> = Vec::new();
            for (k, &len) in sizes.iter().enumerate() {
                for p in datagram(5000 + k as u16, k as u16, len) {
                    all.push((k, p));
                }
            }
            // A seeded shuffle, then one fragment moved to the front.
            let mut x = seed | 1;
            for i in (1..all.len()).rev() {
                x ^= x << 13; x ^= x >> 7; x ^= x << 17;
                all.swap(i, (x % (i as u64 + 1)) as usize);
            }
            let i = order.index(all.len());
            let moved = all.remove(i);
            all.insert(0, moved);
            let mut t = FragmentTracker::new(FragmentLimits::default(), 2048);
            let mut first_seen = vec![false; sizes.len()];
            let mut out: Vec<(usize, Vec<u8>)> = Vec::new();
            let owner = |frame: &[u8]| all.iter().find(|(_, f)| f == frame).map(|(k, _)| *k);
            for (n, (k, frame)) in all.iter().enumerate() {
                let (a, d) = admit(&mut t, frame, n as u64);
                match a {
                    Admit::Pass => {
                        if d.fragment == Fragment::First {
                            first_seen[*k] = true;
                        } else {
                            prop_assert!(first_seen[*k]);
                        }
                        prop_assert_eq!(d.flow.unwrap().src_port, 5000 + *k as u16);
                        out.push((*k, frame.clone()));
                    }
                    Admit::Held => prop_assert!(!first_seen[*k]),
                    Admit::Drop(why) => prop_assert!(false, "dropped: {:?}", why),
                }
                for (frame, d) in released(&mut t) {
                    let k = owner(&frame).unwrap();
                    prop_assert!(first_seen[k]);
                    prop_assert_eq!(ports(&d), (Fragment::Tracked, 5000 + k as u16, 53));
                    out.push((k, frame));
                }
            }
            let mut want = all.clone();
            want.sort();
            out.sort();
            prop_assert_eq!(out, want);
            prop_assert!(t.datagrams.is_empty(), "all complete: all forgotten");
        }
    }
}
