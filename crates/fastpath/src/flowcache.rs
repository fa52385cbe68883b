//! The XDP fast path: established flows forwarded by the kernel, in front of the box's chain
//! (HyperSFC §III: a fast path caching NF table entries in front of a slow path that holds
//! the full tables; here the cache sits in the XDP hook and the slow path is the chain).
//!
//! ```text
//!  port --XDP--> fast-path program --hit--> header rewrite --bpf_redirect--> other port
//!                       |
//!                       +--miss / SYN, FIN, RST / not IPv4 TCP, UDP / stale entry
//!                       v
//!                 XDP socket --> the chain (slow path) --> sent --> XdpFlowCache::observe
//!                                                                    (installs the entry)
//! ```
//!
//! The chain's output is the specification: after the slow path forwarded a packet,
//! [`XdpFlowCache::observe`] compares the frame that came in with the frame that went out. When
//! they differ only in the fields the program rewrites (Ethernet addresses, IPv4 addresses,
//! ports, TTL − 1, and the checksums), and applying the entry to the incoming frame reproduces
//! the outgoing one bit for bit, the entry is installed for that flow, direction and port.
//! Anything else (an NF that changed other bytes, a checksum that would differ) installs
//! nothing, and the flow stays on the slow path.
//!
//! Promises:
//! * **Bounded staleness.** Every entry carries a deadline, `refresh` after the slow path last
//!   forwarded a packet of its flow, and a renewal time halfway there. The first packet after
//!   the renewal time goes to the slow path (the others keep the fast path), and the slow
//!   path's output renews the entry; a packet that finds its entry past the deadline goes to
//!   the slow path too. So a fast-path packet is never more than `refresh` away from the
//!   chain's own decision for its flow, and every NF's idle timer is touched about every
//!   `refresh / 2` while the flow is active: with `refresh` shorter than the NFs' timeouts,
//!   no state expires under an active flow. An active flow leaves the fast path only if the
//!   slow path takes longer than `refresh / 2` to forward the renewing packet.
//! * **Control packets take the slow path**: TCP SYN, FIN and RST are never handled by the
//!   program (connection tracking in the NFs sees every one), and a FIN or RST the slow path
//!   forwards removes the flow's entries in both directions. So are IPv4 packets with options
//!   or fragments, TTL ≤ 1, non-IPv4, ARP, ICMP: everything but established TCP and UDP.
//! * Only chains whose every NF allows it use a fast path (`NfFactory::fast_path`): NFs
//!   that must see every packet (counters, detectors, IPS) keep all packets on the slow path.
//! * The table is an LRU hash of `capacity` entries: a full table forgets its least recently
//!   used flows, which then take the slow path again. Nothing is allocated per packet.
//!
//! The program is C, `crates/io/bpf/flowcache.bpf.c` (its tables' layout in `flowcache.h`,
//! mirrored here by [`FlowKey`] and the entry's `#[repr(C)]` form), compiled by the build
//! script of `flowstate-io` and loaded with [`aya`], as the table pipeline's program
//! ([`crate::xdp`]) is: a [`XdpFlowCache`] loads it once, with its tables, and
//! [`XdpFlowCache::attach`] attaches that one program to each port through its own BPF link
//! ([`XdpProgram::attach_loaded`]); the program's slow path is one XSKMAP for every port, each
//! port's queues in their own slots (up to [`MAX_SOCKETS`] in all), found by the ingress
//! interface.
//!
//! It is not a table of the pipeline ([`crate::table`]) on purpose: its entries are learned
//! from whatever the chain's NFs did to a flow (MAC addresses, both addresses and ports, TTL,
//! the output port, a renewal deadline), not written as rules, and its table is the kernel's
//! LRU hash rather than a cache mirrored from user space. The two share the loader, the
//! sockets and the kernel-run tests.
//!
//! Limits: IPv4 only; the program's checksum arithmetic is RFC 1624's incremental update with
//! the per-entry sum precomputed in user space (RFC 1071 §2(B): one's-complement sums work on
//! 16-bit words in either byte order, so the program adds words as it loads them). An entry
//! replaced while the program on another CPU reads it may be read half old, half new (BPF
//! hash maps give no read consistency without spin locks); replacement only happens when the
//! slow path renews an entry, and an entry's contents change only when the chain's decision
//! for the flow did.

use aya::maps::{HashMap, MapData, MapError, PerCpuArray, XskMap};
use aya::Ebpf;
use flowstate_io::afxdp::XdpProgram;
use flowstate_io::bpf;
use flowstate_io::{Error, Result};
use std::io;
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

const ETH: usize = 14;
const IP: usize = ETH;
const L4: usize = ETH + 20;
const TCP_FIN: u8 = 0x01;
const TCP_SYN: u8 = 0x02;
const TCP_RST: u8 = 0x04;
const PROTO_TCP: u8 = 6;
const PROTO_UDP: u8 = 17;

/// Bytes of a flow key (see [`FlowKey`]).
pub const KEY_SIZE: usize = std::mem::size_of::<FlowKey>();
/// Bytes of an entry as the program reads it (`struct flow_entry`).
pub const ENTRY_SIZE: usize = std::mem::size_of::<FlowEntry>();
/// Sockets (ports × queues) the program of one fast path can send its slow path to.
pub const MAX_SOCKETS: u32 = 64;

/// Largest `capacity`.
pub const MAX_CAPACITY: u32 = 1 << 24;
/// Longest `refresh`.
pub const MAX_REFRESH: Duration = Duration::from_secs(60);

/// A flow direction as the program sees it on a port: the lookup key, `struct flow_key` of
/// `crates/io/bpf/flowcache.h` (addresses and ports as on the wire).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FlowKey {
    /// The port the packet came in by.
    pub ifindex: u32,
    /// IPv4 source address.
    pub saddr: [u8; 4],
    /// IPv4 destination address.
    pub daddr: [u8; 4],
    /// TCP or UDP source port.
    pub sport: [u8; 2],
    /// TCP or UDP destination port.
    pub dport: [u8; 2],
    /// The IP protocol (TCP or UDP).
    pub proto: u32,
}

// SAFETY: plain integers and byte arrays, no padding (20 bytes: see the layout test).
unsafe impl aya::Pod for FlowKey {}

impl FlowKey {
    /// The key of the IPv4 TCP/UDP packet in `frame` received on `ifindex`.
    fn of(ifindex: u32, frame: &[u8]) -> Option<FlowKey> {
        Some(FlowKey {
            ifindex,
            saddr: bytes(frame, IP + 12)?,
            daddr: bytes(frame, IP + 16)?,
            sport: bytes(frame, L4)?,
            dport: bytes(frame, L4 + 2)?,
            proto: u32::from(*frame.get(IP + 9)?),
        })
    }

    /// The key of the reverse direction of the packet in `frame` sent from `ifindex`: its
    /// addresses and ports swapped, received on the port it left by.
    fn reverse_of(ifindex: u32, frame: &[u8]) -> Option<FlowKey> {
        let k = FlowKey::of(ifindex, frame)?;
        Some(FlowKey {
            saddr: k.daddr,
            daddr: k.saddr,
            sport: k.dport,
            dport: k.sport,
            ..k
        })
    }
}

/// What the program does to a flow's packets: the new headers and the checksum sums.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    /// Until when (CLOCK_MONOTONIC nanoseconds) the entry may be used.
    pub deadline_ns: u64,
    /// From when the next packet is sent to the slow path once, to renew the entry while
    /// the others still take the fast path.
    pub renew_ns: u64,
    /// Destination and source MAC addresses.
    pub macs: [u8; 12],
    /// Source and destination IPv4 addresses, as on the wire.
    pub addrs: [u8; 8],
    /// Source and destination ports, as on the wire.
    pub ports: [u8; 4],
    /// The port to send from.
    pub out_ifindex: u32,
    /// Added (one's complement, native words) to the IPv4 header checksum.
    pub ip_sum: u16,
    /// Added to the TCP or UDP checksum (a UDP checksum of 0, "none", stays 0).
    pub l4_sum: u16,
}

/// An entry as the program reads it: `struct flow_entry` of `crates/io/bpf/flowcache.h`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct FlowEntry {
    deadline_ns: u64,
    renew_ns: u64,
    dmac: [u8; 6],
    smac: [u8; 6],
    saddr: [u8; 4],
    daddr: [u8; 4],
    sport: [u8; 2],
    dport: [u8; 2],
    out_ifindex: u32,
    ip_sum: u32,
    l4_sum: u32,
    _pad: u32,
}

// SAFETY: plain integers and byte arrays, no implicit padding (56 bytes: see the layout test).
unsafe impl aya::Pod for FlowEntry {}

impl From<&Entry> for FlowEntry {
    fn from(e: &Entry) -> FlowEntry {
        let [dmac @ .., _, _, _, _, _, _] = e.macs;
        let [_, _, _, _, _, _, smac @ ..] = e.macs;
        FlowEntry {
            deadline_ns: e.deadline_ns,
            renew_ns: e.renew_ns,
            dmac,
            smac,
            saddr: [e.addrs[0], e.addrs[1], e.addrs[2], e.addrs[3]],
            daddr: [e.addrs[4], e.addrs[5], e.addrs[6], e.addrs[7]],
            sport: [e.ports[0], e.ports[1]],
            dport: [e.ports[2], e.ports[3]],
            out_ifindex: e.out_ifindex,
            ip_sum: u32::from(e.ip_sum),
            l4_sum: u32::from(e.l4_sum),
            _pad: 0,
        }
    }
}

impl From<&FlowEntry> for Entry {
    fn from(f: &FlowEntry) -> Entry {
        let mut e = Entry {
            deadline_ns: f.deadline_ns,
            renew_ns: f.renew_ns,
            macs: [0; 12],
            addrs: [0; 8],
            ports: [0; 4],
            out_ifindex: f.out_ifindex,
            ip_sum: f.ip_sum as u16,
            l4_sum: f.l4_sum as u16,
        };
        e.macs[..6].copy_from_slice(&f.dmac);
        e.macs[6..].copy_from_slice(&f.smac);
        e.addrs[..4].copy_from_slice(&f.saddr);
        e.addrs[4..].copy_from_slice(&f.daddr);
        e.ports[..2].copy_from_slice(&f.sport);
        e.ports[2..].copy_from_slice(&f.dport);
        e
    }
}

/// The counters of the program, per CPU: `struct flow_stats`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct FlowStats {
    packets: u64,
    bytes: u64,
}

// SAFETY: two u64, no padding.
unsafe impl aya::Pod for FlowStats {}

/// Where a port's sockets are in the program's XSKMAP: `struct port_sockets`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct PortSockets {
    first: u32,
    count: u32,
}

// SAFETY: two u32, no padding.
unsafe impl aya::Pod for PortSockets {}

/// What one forwarded packet teaches the fast path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lesson {
    /// Its flow may take the fast path in its direction, with this entry.
    Install(FlowKey, Entry),
    /// Its flow is opening or closing (SYN, FIN, RST): forget both directions.
    Forget([FlowKey; 2]),
    /// Nothing: not a packet the program handles, or the slow path did more than the program
    /// can repeat.
    Nothing,
}

/// The `N` bytes of `b` at `at`.
fn bytes<const N: usize>(b: &[u8], at: usize) -> Option<[u8; N]> {
    b.get(at..at + N)?.try_into().ok()
}

/// The 16-bit word at `at` as a native load reads it (RFC 1071 §2(B)).
fn word(b: &[u8], at: usize) -> u16 {
    u16::from_ne_bytes([b[at], b[at + 1]])
}

/// One's-complement sum, folded to 16 bits.
fn fold(mut s: u32) -> u16 {
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    s as u16
}

/// RFC 1624 eqn. 3, with the sum of `~m + m'` over the changed words given: `~(~HC + sum)`.
fn apply(check: u16, sum: u16) -> u16 {
    !fold(u32::from(!check) + u32::from(sum))
}

/// Sum over the words at `offsets` of `~in + out`.
fn delta(input: &[u8], output: &[u8], offsets: &[usize]) -> u16 {
    fold(
        offsets
            .iter()
            .map(|&o| u32::from(!word(input, o)) + u32::from(word(output, o)))
            .sum(),
    )
}

/// What forwarding `input` (received on `in_ifindex`) as `output` (sent from `out_ifindex`)
/// teaches the fast path, whose entries are renewed from `renew_ns` and live until
/// `deadline_ns` (see the module docs).
pub fn lesson(
    in_ifindex: u32,
    input: &[u8],
    out_ifindex: u32,
    output: &[u8],
    renew_ns: u64,
    deadline_ns: u64,
) -> Lesson {
    let handled = |f: &[u8]| {
        f.len() >= L4 + 8
            && f[12..14] == [0x08, 0x00]
            && f[IP] == 0x45
            && matches!(f[IP + 9], PROTO_TCP | PROTO_UDP)
            && (f[IP + 9] == PROTO_UDP || f.len() >= L4 + 20)
    };
    if !handled(input) || !handled(output) || input[IP + 9] != output[IP + 9] {
        return Lesson::Nothing;
    }
    let tcp = input[IP + 9] == PROTO_TCP;
    if tcp && input[L4 + 13] & (TCP_FIN | TCP_SYN | TCP_RST) != 0 {
        return match (
            FlowKey::of(in_ifindex, input),
            FlowKey::reverse_of(out_ifindex, output),
        ) {
            (Some(a), Some(b)) => Lesson::Forget([a, b]),
            _ => Lesson::Nothing,
        };
    }
    // The program does what the slow path did only if nothing else differs: the IPv4 header
    // but for TTL, checksum and addresses; the transport header but for ports and checksum;
    // the payload; the frame's length. Not a fragment ("don't fragment" may be set); the TTL
    // decremented by exactly one.
    let csum = if tcp { L4 + 16 } else { L4 + 6 };
    let same = |r: std::ops::Range<usize>| input.get(r.clone()) == output.get(r);
    let repeatable = input.len() == output.len()
        && same(IP..IP + 8)
        && input[IP + 6] & 0x3f == 0
        && input[IP + 7] == 0
        && input[IP + 8] > 1
        && output[IP + 8] == input[IP + 8] - 1
        && same(L4 + 4..csum)
        && same(csum + 2..input.len());
    if !repeatable {
        return Lesson::Nothing;
    }
    let ip_sum = delta(input, output, &[IP + 8, IP + 12, IP + 14, IP + 16, IP + 18]);
    let l4_sum = delta(
        input,
        output,
        &[IP + 12, IP + 14, IP + 16, IP + 18, L4, L4 + 2],
    );
    // The entry must reproduce the slow path's checksums exactly.
    if apply(word(input, IP + 10), ip_sum) != word(output, IP + 10) {
        return Lesson::Nothing;
    }
    let (c_in, c_out) = (word(input, csum), word(output, csum));
    let l4_ok = if !tcp && c_in == 0 {
        c_out == 0
    } else {
        let c = apply(c_in, l4_sum);
        let c = if !tcp && c == 0 { 0xffff } else { c };
        c == c_out
    };
    let (true, Some(key)) = (l4_ok, FlowKey::of(in_ifindex, input)) else {
        return Lesson::Nothing;
    };
    let mut e = Entry {
        deadline_ns,
        renew_ns,
        macs: [0; 12],
        addrs: [0; 8],
        ports: [0; 4],
        out_ifindex,
        ip_sum,
        l4_sum,
    };
    e.macs.copy_from_slice(&output[0..12]);
    e.addrs.copy_from_slice(&output[IP + 12..IP + 20]);
    e.ports.copy_from_slice(&output[L4..L4 + 4]);
    Lesson::Install(key, e)
}

/// Packets and bytes the program forwarded.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct XdpFlowCacheStats {
    /// Packets.
    pub packets: u64,
    /// Bytes (IPv4 total length plus the Ethernet header).
    pub bytes: u64,
}

/// The fast path: its program (`crates/io/bpf/flowcache.bpf.c`), loaded once and attached to
/// each of the box's ports, and its tables (the flow entries, the counters, the ports' sockets).
pub struct XdpFlowCache {
    ebpf: Mutex<Ebpf>,
    flows: Mutex<HashMap<MapData, FlowKey, FlowEntry>>,
    stats: PerCpuArray<MapData, FlowStats>,
    /// The ports attached, and the next free slot of `xsks`.
    ports: Mutex<(HashMap<MapData, u32, PortSockets>, u32)>,
    xsks: Arc<Mutex<XskMap<MapData>>>,
    refresh: Duration,
}

impl std::fmt::Debug for XdpFlowCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XdpFlowCache")
            .field("refresh", &self.refresh)
            .finish_non_exhaustive()
    }
}

impl XdpFlowCache {
    /// Tables for `capacity` flow directions whose entries live `refresh` past the slow
    /// path's last packet of the flow, and the program that reads them.
    pub fn new(capacity: u32, refresh: Duration) -> Result<XdpFlowCache> {
        if capacity == 0 || capacity > MAX_CAPACITY {
            return Err(Error::Option {
                name: "fast_path_capacity",
                reason: format!("{capacity} is not in 1..={MAX_CAPACITY}"),
            });
        }
        if refresh.is_zero() || refresh > MAX_REFRESH {
            return Err(Error::Option {
                name: "fast_path_refresh",
                reason: format!("{refresh:?} is not in (0, {MAX_REFRESH:?}]"),
            });
        }
        let mut ebpf = bpf::load_xdp(
            bpf::FLOWCACHE,
            "flowcache",
            &[
                ("flows", capacity),
                ("ports", MAX_SOCKETS),
                ("xsks", MAX_SOCKETS),
            ],
            "fast path",
            "loading the XDP fast-path program",
        )?;
        let what = "loading the XDP fast-path program";
        Ok(XdpFlowCache {
            flows: Mutex::new(bpf::take_map(&mut ebpf, "flows", "fast path", what)?),
            stats: bpf::take_map(&mut ebpf, "stats", "fast path", what)?,
            ports: Mutex::new((bpf::take_map(&mut ebpf, "ports", "fast path", what)?, 0)),
            xsks: Arc::new(Mutex::new(bpf::take_map(
                &mut ebpf,
                "xsks",
                "fast path",
                what,
            )?)),
            ebpf: Mutex::new(ebpf),
            refresh,
        })
    }

    /// Attaches the program to `ifname` (generic mode) with `queues` slots for the sockets
    /// of its slow path: open them with [`AfXdp::open`](flowstate_io::afxdp::AfXdp::open) on
    /// the program returned, which stays attached while it lives. A port the program has no
    /// socket for passes its frames on to the kernel (and its AF_PACKET taps).
    pub fn attach(&self, ifname: &str, queues: u32) -> Result<Arc<XdpProgram>> {
        let queues = queues.max(1);
        let mut ports = lock(&self.ports);
        let first = ports.1;
        if queues > MAX_SOCKETS - first {
            return Err(Error::Option {
                name: "queues",
                reason: format!(
                    "the fast path has room for {MAX_SOCKETS} sockets, {first} are taken"
                ),
            });
        }
        let program = XdpProgram::attach_loaded(
            &mut lock(&self.ebpf),
            "flowcache",
            ifname,
            Arc::clone(&self.xsks),
            first,
            queues,
        )?;
        let slots = PortSockets {
            first,
            count: queues,
        };
        ports
            .0
            .insert(program.ifindex(), slots, 0)
            .map_err(|e| bpf::aya_err(ifname, "registering the port with the fast path", &e))?;
        ports.1 += queues;
        Ok(program)
    }

    /// Teaches the fast path what the slow path did with one packet (see [`lesson`]):
    /// installs, renews or forgets its flow's entries, and returns the lesson.
    pub fn observe(
        &self,
        in_ifindex: u32,
        input: &[u8],
        out_ifindex: u32,
        output: &[u8],
    ) -> Result<Lesson> {
        let (now, refresh) = (monotonic_ns(), self.refresh.as_nanos() as u64);
        let (renew, deadline) = (now.saturating_add(refresh / 2), now.saturating_add(refresh));
        let l = lesson(in_ifindex, input, out_ifindex, output, renew, deadline);
        match &l {
            Lesson::Install(key, entry) => self.install(key, entry)?,
            Lesson::Forget(keys) => {
                for k in keys {
                    self.forget(k)?;
                }
            }
            Lesson::Nothing => {}
        }
        Ok(l)
    }

    /// Installs (or replaces) `key`'s entry.
    pub fn install(&self, key: &FlowKey, entry: &Entry) -> Result<()> {
        lock(&self.flows)
            .insert(key, FlowEntry::from(entry), 0)
            .map_err(|e| bpf::aya_err("fast path", "installing a flow entry", &e))
    }

    /// Removes `key`'s entry, if there is one.
    pub fn forget(&self, key: &FlowKey) -> Result<()> {
        match lock(&self.flows).remove(key) {
            Err(e) if os_error(&e) != Some(libc::ENOENT) => {
                Err(bpf::aya_err("fast path", "removing a flow entry", &e))
            }
            _ => Ok(()),
        }
    }

    /// The entry of `key`, if there is one.
    pub fn entry(&self, key: &FlowKey) -> Result<Option<Entry>> {
        match lock(&self.flows).get(key, 0) {
            Ok(e) => Ok(Some(Entry::from(&e))),
            Err(MapError::KeyNotFound) => Ok(None),
            Err(e) => Err(bpf::aya_err("fast path", "reading a flow entry", &e)),
        }
    }

    /// What the program forwarded so far, over every CPU.
    pub fn stats(&self) -> Result<XdpFlowCacheStats> {
        let values = self
            .stats
            .get(&0, 0)
            .map_err(|e| bpf::aya_err("fast path", "reading the counters", &e))?;
        Ok(values
            .iter()
            .fold(XdpFlowCacheStats::default(), |s, c| XdpFlowCacheStats {
                packets: s.packets + c.packets,
                bytes: s.bytes + c.bytes,
            }))
    }

    /// Runs the program once on `frame` as if received on `ingress_ifindex` (see
    /// [`test_run`]).
    pub fn test_run(&self, ingress_ifindex: u32, frame: &[u8]) -> io::Result<(u32, Vec<u8>)> {
        let mut ebpf = lock(&self.ebpf);
        let program = bpf::xdp(&mut ebpf, "flowcache").map_err(io::Error::other)?;
        let fd = program.fd().map_err(io::Error::other)?;
        test_run(fd.as_fd().as_raw_fd(), ingress_ifindex, frame)
    }
}

/// `m`'s value, even if a thread panicked holding it (every update is a single system call).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The system's error number in a map operation's error.
fn os_error(e: &MapError) -> Option<i32> {
    match e {
        MapError::SyscallError(s) => s.io_error.raw_os_error(),
        MapError::IoError(e) => e.raw_os_error(),
        _ => None,
    }
}

/// CLOCK_MONOTONIC in nanoseconds: the clock of `bpf_ktime_get_ns`.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec we pass.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Runs the XDP program `prog` once on `frame` with `BPF_PROG_TEST_RUN` (the kernel's own
/// interpreter or JIT, no interface needed): returns the XDP action and the frame as the
/// program left it.
pub fn test_run(prog: RawFd, ingress_ifindex: u32, frame: &[u8]) -> io::Result<(u32, Vec<u8>)> {
    bpf::test_run(prog, ingress_ifindex, frame)
}

#[cfg(test)]
mod tests {
    use super::*;
    use flowstate_wire::checksum::{checksum, combine, finish, pseudo_header_v4, sum};
    use proptest::prelude::*;

    /// A flow's headers, as a frame is built from them.
    #[derive(Debug, Clone)]
    struct Headers {
        macs: [u8; 12],
        src: [u8; 4],
        dst: [u8; 4],
        sport: u16,
        dport: u16,
        ttl: u8,
        tcp_flags: Option<u8>,
        udp_checksum: bool,
        payload: Vec<u8>,
    }

    /// The frame, every checksum computed from scratch (the oracle for the incremental ones).
    fn frame(h: &Headers) -> Vec<u8> {
        let l4_len = if h.tcp_flags.is_some() { 20 } else { 8 } + h.payload.len();
        let mut f = Vec::new();
        f.extend_from_slice(&h.macs);
        f.extend_from_slice(&[0x08, 0x00]);
        f.extend_from_slice(&[0x45, 0, 0, 0, 0x12, 0x34, 0x40, 0, h.ttl, 0, 0, 0]);
        let total = (20 + l4_len) as u16;
        f[IP + 2..IP + 4].copy_from_slice(&total.to_be_bytes());
        f[IP + 9] = if h.tcp_flags.is_some() {
            PROTO_TCP
        } else {
            PROTO_UDP
        };
        f.extend_from_slice(&h.src);
        f.extend_from_slice(&h.dst);
        let c = checksum(&f[IP..IP + 20]);
        f[IP + 10..IP + 12].copy_from_slice(&c.to_be_bytes());
        f.extend_from_slice(&h.sport.to_be_bytes());
        f.extend_from_slice(&h.dport.to_be_bytes());
        match h.tcp_flags {
            Some(flags) => {
                f.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 2, 0x50, flags, 0xff, 0xff]);
                f.extend_from_slice(&[0, 0, 0, 0]);
            }
            None => {
                f.extend_from_slice(&(l4_len as u16).to_be_bytes());
                f.extend_from_slice(&[0, 0]);
            }
        }
        f.extend_from_slice(&h.payload);
        let csum_at = if h.tcp_flags.is_some() {
            L4 + 16
        } else {
            L4 + 6
        };
        if h.tcp_flags.is_some() || h.udp_checksum {
            let pseudo = pseudo_header_v4(h.src, h.dst, f[IP + 9], l4_len as u16);
            let mut c = finish(combine(pseudo, sum(&f[L4..])));
            if h.tcp_flags.is_none() && c == 0 {
                c = 0xffff;
            }
            f[csum_at..csum_at + 2].copy_from_slice(&c.to_be_bytes());
        }
        f
    }

    fn outbound(tcp_flags: Option<u8>) -> Headers {
        Headers {
            macs: [2, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0, 2],
            src: [10, 0, 0, 2],
            dst: [198, 51, 100, 2],
            sport: 40_000,
            dport: 80,
            ttl: 64,
            tcp_flags,
            udp_checksum: true,
            payload: b"hello, fast path".to_vec(),
        }
    }

    /// What a NAT box does to `h`: new source address and port, next hop's MACs, TTL - 1.
    fn translated(h: &Headers) -> Headers {
        Headers {
            macs: [2, 0, 0, 0, 0, 9, 2, 0, 0, 0, 0, 8],
            src: [198, 51, 100, 1],
            sport: 1024,
            ttl: h.ttl - 1,
            ..h.clone()
        }
    }

    #[test]
    fn a_translated_packet_installs_its_flow_and_control_packets_forget_it() {
        const ACK: u8 = 0x10;
        let h = outbound(Some(ACK));
        let (input, output) = (frame(&h), frame(&translated(&h)));
        let Lesson::Install(key, e) = lesson(3, &input, 4, &output, 50, 99) else {
            panic!("expected an entry");
        };
        assert_eq!(key, FlowKey::of(3, &input).unwrap());
        assert_eq!(e.out_ifindex, 4);
        assert_eq!((e.renew_ns, e.deadline_ns), (50, 99));
        assert_eq!(&e.addrs[..4], &[198, 51, 100, 1]);
        assert_eq!(&e.ports[..2], &1024u16.to_be_bytes());
        for flags in [TCP_SYN, TCP_FIN | ACK, TCP_RST] {
            let h = outbound(Some(flags));
            let (input, output) = (frame(&h), frame(&translated(&h)));
            let reverse = FlowKey::reverse_of(4, &output).unwrap();
            assert_eq!(reverse.saddr, [198, 51, 100, 2]);
            assert_eq!(reverse.daddr, [198, 51, 100, 1]);
            assert_eq!((reverse.sport, reverse.dport), ([0, 80], [4, 0]));
            assert_eq!(
                lesson(3, &input, 4, &output, 50, 99),
                Lesson::Forget([FlowKey::of(3, &input).unwrap(), reverse])
            );
        }
    }

    #[test]
    fn what_the_program_cannot_repeat_installs_nothing() {
        let h = outbound(Some(0x10));
        let input = frame(&h);
        let t = translated(&h);
        let cases: Vec<(&str, Vec<u8>)> = vec![
            ("payload changed", {
                let mut t = t.clone();
                t.payload[0] ^= 1;
                frame(&t)
            }),
            (
                "TTL not decremented",
                frame(&Headers {
                    ttl: h.ttl,
                    ..t.clone()
                }),
            ),
            ("length changed", {
                let mut t = t.clone();
                t.payload.push(0);
                frame(&t)
            }),
            ("stale checksum", {
                let mut f = frame(&t);
                f[L4 + 16] ^= 0x40;
                f
            }),
            ("IP id changed", {
                let mut f = frame(&t);
                f[IP + 4] ^= 1;
                let c = checksum(&{
                    let mut ip = f[IP..IP + 20].to_vec();
                    ip[10] = 0;
                    ip[11] = 0;
                    ip
                });
                f[IP + 10..IP + 12].copy_from_slice(&c.to_be_bytes());
                f
            }),
        ];
        for (what, output) in cases {
            assert_eq!(
                lesson(3, &input, 4, &output, 1, 1),
                Lesson::Nothing,
                "{what}"
            );
        }
        let mut fragment = input.clone();
        fragment[IP + 6] |= 0x20; // more fragments
        assert_eq!(lesson(3, &fragment, 4, &fragment, 1, 1), Lesson::Nothing);
        let icmp = {
            let mut f = input.clone();
            f[IP + 9] = 1;
            f
        };
        assert_eq!(lesson(3, &icmp, 4, &icmp, 1, 1), Lesson::Nothing);
    }

    /// The Rust mirrors of `crates/io/bpf/flowcache.h` have its layout: every size and
    /// offset here is one the header's `_Static_assert`s fix (and the C build checks). The
    /// sizes are checked again against the object's map definitions when its maps are opened
    /// (`XdpFlowCache::new`, run by the kernel tests below).
    #[test]
    fn layout_matches_the_program() {
        use std::mem::{offset_of, size_of};
        let layout = [
            ("sizeof(struct flow_key)", size_of::<FlowKey>()),
            (
                "offsetof(struct flow_key, saddr)",
                offset_of!(FlowKey, saddr),
            ),
            (
                "offsetof(struct flow_key, daddr)",
                offset_of!(FlowKey, daddr),
            ),
            (
                "offsetof(struct flow_key, sport)",
                offset_of!(FlowKey, sport),
            ),
            (
                "offsetof(struct flow_key, dport)",
                offset_of!(FlowKey, dport),
            ),
            (
                "offsetof(struct flow_key, proto)",
                offset_of!(FlowKey, proto),
            ),
            ("sizeof(struct flow_entry)", size_of::<FlowEntry>()),
            (
                "offsetof(struct flow_entry, renew_ns)",
                offset_of!(FlowEntry, renew_ns),
            ),
            (
                "offsetof(struct flow_entry, dmac)",
                offset_of!(FlowEntry, dmac),
            ),
            (
                "offsetof(struct flow_entry, smac)",
                offset_of!(FlowEntry, smac),
            ),
            (
                "offsetof(struct flow_entry, saddr)",
                offset_of!(FlowEntry, saddr),
            ),
            (
                "offsetof(struct flow_entry, daddr)",
                offset_of!(FlowEntry, daddr),
            ),
            (
                "offsetof(struct flow_entry, sport)",
                offset_of!(FlowEntry, sport),
            ),
            (
                "offsetof(struct flow_entry, dport)",
                offset_of!(FlowEntry, dport),
            ),
            (
                "offsetof(struct flow_entry, out_ifindex)",
                offset_of!(FlowEntry, out_ifindex),
            ),
            (
                "offsetof(struct flow_entry, ip_sum)",
                offset_of!(FlowEntry, ip_sum),
            ),
            (
                "offsetof(struct flow_entry, l4_sum)",
                offset_of!(FlowEntry, l4_sum),
            ),
            ("sizeof(struct flow_stats)", size_of::<FlowStats>()),
            ("sizeof(struct port_sockets)", size_of::<PortSockets>()),
        ];
        let header = include_str!("../../io/bpf/flowcache.h");
        for (what, rust) in layout {
            let asserted = format!("{what} == {rust},");
            assert!(
                header.contains(&asserted),
                "flowcache.h does not assert `{asserted}`"
            );
        }
        assert_eq!((KEY_SIZE, ENTRY_SIZE), (20, 56));
        // An entry survives the trip through the program's layout.
        let e = Entry {
            deadline_ns: 1,
            renew_ns: 2,
            macs: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12],
            addrs: [13, 14, 15, 16, 17, 18, 19, 20],
            ports: [21, 22, 23, 24],
            out_ifindex: 25,
            ip_sum: 0xfffe,
            l4_sum: 27,
        };
        let f = FlowEntry::from(&e);
        assert_eq!(
            (f.dmac[0], f.smac[0], f.daddr[0], f.dport[0]),
            (1, 7, 17, 23)
        );
        assert_eq!(Entry::from(&f), e);
    }

    const XDP_PASS: u32 = 2;
    const XDP_REDIRECT: u32 = 4;
    const LO: u32 = 1;

    #[test]
    fn the_kernel_runs_the_program_as_the_slow_path_did() {
        if !flowstate_testkit::is_root() {
            eprintln!("skipped: loading XDP programs needs root");
            return;
        }
        let fast = XdpFlowCache::new(64, Duration::from_secs(5)).unwrap();
        let h = outbound(Some(0x18));
        let (input, output) = (frame(&h), frame(&translated(&h)));
        // Unknown flow: the slow path gets it, untouched.
        assert_eq!(
            fast.test_run(LO, &input).unwrap(),
            (XDP_PASS, input.clone())
        );
        fast.observe(LO, &input, 7, &output).unwrap();
        let (action, got) = fast.test_run(LO, &input).unwrap();
        assert_eq!(action, XDP_REDIRECT);
        assert_eq!(got, output);
        assert_eq!(
            fast.stats().unwrap(),
            XdpFlowCacheStats {
                packets: 1,
                bytes: input.len() as u64
            }
        );
        // A SYN of the same flow is not the program's; a FIN the slow path forwards forgets it.
        let syn = frame(&outbound(Some(TCP_SYN)));
        assert_eq!(fast.test_run(LO, &syn).unwrap().0, XDP_PASS);
        let fin = frame(&outbound(Some(TCP_FIN | 0x10)));
        fast.observe(
            LO,
            &fin,
            7,
            &frame(&translated(&outbound(Some(TCP_FIN | 0x10)))),
        )
        .unwrap();
        assert_eq!(fast.entry(&FlowKey::of(LO, &input).unwrap()).unwrap(), None);
        assert_eq!(fast.test_run(LO, &input).unwrap().0, XDP_PASS);
    }

    #[test]
    fn a_stale_entry_sends_the_packet_to_the_slow_path() {
        if !flowstate_testkit::is_root() {
            eprintln!("skipped: loading XDP programs needs root");
            return;
        }
        let fast = XdpFlowCache::new(64, Duration::from_millis(1)).unwrap();
        let h = outbound(None);
        let (input, output) = (frame(&h), frame(&translated(&h)));
        fast.observe(LO, &input, 7, &output).unwrap();
        std::thread::sleep(Duration::from_millis(5));
        assert_eq!(fast.test_run(LO, &input).unwrap(), (XDP_PASS, input));
    }

    #[test]
    fn a_due_entry_sends_one_packet_to_the_slow_path_and_keeps_the_others() {
        if !flowstate_testkit::is_root() {
            eprintln!("skipped: loading XDP programs needs root");
            return;
        }
        let fast = XdpFlowCache::new(64, Duration::from_secs(5)).unwrap();
        let h = outbound(None);
        let (input, output) = (frame(&h), frame(&translated(&h)));
        let now = monotonic_ns();
        let Lesson::Install(key, entry) = lesson(LO, &input, 7, &output, now, now + (1 << 40))
        else {
            panic!("expected an entry");
        };
        fast.install(&key, &entry).unwrap();
        let run = || fast.test_run(LO, &input).unwrap().0;
        assert_eq!(run(), XDP_PASS, "the renewing packet takes the slow path");
        assert_eq!(run(), XDP_REDIRECT, "the next ones keep the fast path");
        assert_eq!(run(), XDP_REDIRECT);
        // The slow path's output renews the entry: due again only later.
        fast.observe(LO, &input, 7, &output).unwrap();
        assert_eq!(run(), XDP_REDIRECT);
    }

    fn headers() -> impl Strategy<Value = (Headers, Headers)> {
        (
            any::<([u8; 12], [u8; 12])>(),
            any::<([u8; 4], [u8; 4], [u8; 4], [u8; 4])>(),
            any::<(u16, u16, u16, u16)>(),
            2u8..=255,
            prop_oneof![Just(None), Just(Some(0x10u8)), Just(Some(0x18u8))],
            any::<bool>(),
            proptest::collection::vec(any::<u8>(), 0..64),
        )
            .prop_map(
                |(macs, addrs, ports, ttl, tcp_flags, udp_checksum, payload)| {
                    let h = Headers {
                        macs: macs.0,
                        src: addrs.0,
                        dst: addrs.1,
                        sport: ports.0,
                        dport: ports.1,
                        ttl,
                        tcp_flags,
                        udp_checksum,
                        payload,
                    };
                    let out = Headers {
                        macs: macs.1,
                        src: addrs.2,
                        dst: addrs.3,
                        sport: ports.2,
                        dport: ports.3,
                        ttl: ttl - 1,
                        ..h.clone()
                    };
                    (h, out)
                },
            )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Any rewrite of addresses, ports and MACs (a NAT's, a load balancer's, in either
        /// direction): the entry reproduces the from-scratch checksums, in the kernel when root.
        #[test]
        fn every_rewrite_is_learned_and_repeated_exactly((h, t) in headers()) {
            let (input, output) = (frame(&h), frame(&t));
            let lesson = lesson(LO, &input, 7, &output, u64::MAX, u64::MAX);
            let Lesson::Install(key, entry) = lesson else {
                return Err(TestCaseError::fail(format!("not installed: {lesson:?}")));
            };
            if flowstate_testkit::is_root() {
                let fast = XdpFlowCache::new(4, Duration::from_secs(5)).unwrap();
                        fast.install(&key, &entry).unwrap();
                let (action, got) = fast.test_run(LO, &input).unwrap();
                prop_assert_eq!(action, XDP_REDIRECT);
                prop_assert_eq!(got, output);
            }
        }
    }
}
