//! The XDP fast path: established flows forwarded by the kernel, in front of the box's chain
//! (HyperSFC §III: a fast path caching NF table entries in front of a slow path that holds
//! the full tables; here the cache sits in the XDP hook and the slow path is the chain).
//!
//! ```text
//!  port --XDP--> fast-path program --hit--> header rewrite --bpf_redirect--> other port
//!                       |
//!                       +--miss / SYN, FIN, RST / not IPv4 TCP, UDP / stale entry
//!                       v
//!                 XDP socket --> the chain (slow path) --> sent --> FastPath::observe
//!                                                                    (installs the entry)
//! ```
//!
//! The chain's output is the specification: after the slow path forwarded a packet,
//! [`FastPath::observe`] compares the frame that came in with the frame that went out. When
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
//! Limits: IPv4 only; the program's checksum arithmetic is RFC 1624's incremental update with
//! the per-entry sum precomputed in user space (RFC 1071 §2(B): one's-complement sums work on
//! 16-bit words in either byte order, so the program adds words as it loads them). An entry
//! replaced while the program on another CPU reads it may be read half old, half new (BPF
//! hash maps give no read consistency without spin locks); replacement only happens when the
//! slow path renews an entry, and an entry's contents change only when the chain's decision
//! for the flow did.

use crate::afxdp::{bpf, dev_err, insn, owned, put_u32, put_u64};
use crate::{Error, Result};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::time::Duration;

const BPF_MAP_LOOKUP_ELEM: libc::c_long = 1;
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_MAP_DELETE_ELEM: libc::c_long = 3;
const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_MAP_TYPE_PERCPU_ARRAY: u32 = 6;
const BPF_MAP_TYPE_LRU_HASH: u32 = 9;

const ETH: usize = 14;
const IP: usize = ETH;
const L4: usize = ETH + 20;
const TCP_FIN: u8 = 0x01;
const TCP_SYN: u8 = 0x02;
const TCP_RST: u8 = 0x04;
const PROTO_TCP: u8 = 6;
const PROTO_UDP: u8 = 17;

/// Bytes of a flow key: ingress ifindex, source, destination, ports, protocol (u32 each).
pub const KEY_SIZE: usize = 20;
/// Bytes of an entry (see [`Entry`]).
pub const ENTRY_SIZE: usize = 56;

// Entry layout, shared by `Entry::encode` and the program.
const E_DEADLINE: i16 = 0; // u64, CLOCK_MONOTONIC ns
const E_RENEW: i16 = 8; // u64, CLOCK_MONOTONIC ns
const E_MACS: i16 = 16; // destination MAC, source MAC (12 bytes)
const E_ADDRS: i16 = 28; // source, destination (8 bytes, as on the wire)
const E_PORTS: i16 = 36; // source port, destination port (4 bytes, as on the wire)
const E_IFINDEX: i16 = 40; // u32, the port to send from
const E_IP_SUM: i16 = 44; // u32, one's-complement sum to add to the IPv4 header checksum
const E_L4_SUM: i16 = 48; // u32, the same for the TCP or UDP checksum

/// Largest `capacity`.
pub const MAX_CAPACITY: u32 = 1 << 24;
/// Longest `refresh`.
pub const MAX_REFRESH: Duration = Duration::from_secs(60);

/// A flow direction as the program sees it on a port: the lookup key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FlowKey(pub [u8; KEY_SIZE]);

impl FlowKey {
    /// The key of the IPv4 TCP/UDP packet in `frame` received on `ifindex`.
    fn of(ifindex: u32, frame: &[u8]) -> Option<FlowKey> {
        let mut k = [0u8; KEY_SIZE];
        k[0..4].copy_from_slice(&ifindex.to_ne_bytes());
        k[4..16].copy_from_slice(frame.get(IP + 12..L4 + 4)?);
        k[16..20].copy_from_slice(&u32::from(*frame.get(IP + 9)?).to_ne_bytes());
        Some(FlowKey(k))
    }

    /// The key of the reverse direction of the packet in `frame` sent from `ifindex`: its
    /// addresses and ports swapped, received on the port it left by.
    fn reverse_of(ifindex: u32, frame: &[u8]) -> Option<FlowKey> {
        let FlowKey(mut k) = FlowKey::of(ifindex, frame)?;
        let (s, d) = ([k[4], k[5], k[6], k[7]], [k[8], k[9], k[10], k[11]]);
        k[4..8].copy_from_slice(&d);
        k[8..12].copy_from_slice(&s);
        let (sp, dp) = ([k[12], k[13]], [k[14], k[15]]);
        k[12..14].copy_from_slice(&dp);
        k[14..16].copy_from_slice(&sp);
        Some(FlowKey(k))
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

impl Entry {
    fn encode(&self) -> [u8; ENTRY_SIZE] {
        let mut v = [0u8; ENTRY_SIZE];
        let at = |o: i16| o as usize;
        v[at(E_DEADLINE)..at(E_DEADLINE) + 8].copy_from_slice(&self.deadline_ns.to_ne_bytes());
        v[at(E_RENEW)..at(E_RENEW) + 8].copy_from_slice(&self.renew_ns.to_ne_bytes());
        v[at(E_MACS)..at(E_MACS) + 12].copy_from_slice(&self.macs);
        v[at(E_ADDRS)..at(E_ADDRS) + 8].copy_from_slice(&self.addrs);
        v[at(E_PORTS)..at(E_PORTS) + 4].copy_from_slice(&self.ports);
        v[at(E_IFINDEX)..at(E_IFINDEX) + 4].copy_from_slice(&self.out_ifindex.to_ne_bytes());
        v[at(E_IP_SUM)..at(E_IP_SUM) + 4].copy_from_slice(&u32::from(self.ip_sum).to_ne_bytes());
        v[at(E_L4_SUM)..at(E_L4_SUM) + 4].copy_from_slice(&u32::from(self.l4_sum).to_ne_bytes());
        v
    }
}

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
pub struct FastPathStats {
    /// Packets.
    pub packets: u64,
    /// Bytes (IPv4 total length plus the Ethernet header).
    pub bytes: u64,
}

/// The fast path's tables: the flow entries and the counters, shared by the programs of the
/// box's ports.
#[derive(Debug)]
pub struct FastPath {
    flows: OwnedFd,
    stats: OwnedFd,
    refresh: Duration,
    cpus: usize,
}

impl FastPath {
    /// Tables for `capacity` flow directions whose entries live `refresh` past the slow
    /// path's last packet of the flow.
    pub fn new(capacity: u32, refresh: Duration) -> Result<FastPath> {
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
        let create = |kind, key: usize, value: usize, entries: u32, what: &str| {
            let mut a = [0u64; 16];
            put_u32(&mut a, 0, kind);
            put_u32(&mut a, 4, key as u32);
            put_u32(&mut a, 8, value as u32);
            put_u32(&mut a, 12, entries);
            bpf(BPF_MAP_CREATE, &mut a)
                .map(owned)
                .map_err(|e| dev_err("fast path", what, e))
        };
        let flows = create(
            BPF_MAP_TYPE_LRU_HASH,
            KEY_SIZE,
            ENTRY_SIZE,
            capacity,
            "creating the flow table",
        )?;
        let stats = create(BPF_MAP_TYPE_PERCPU_ARRAY, 4, 16, 1, "creating the counters")?;
        Ok(FastPath {
            flows,
            stats,
            refresh,
            cpus: possible_cpus(),
        })
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
        let value = entry.encode();
        let mut a = [0u64; 16];
        put_u32(&mut a, 0, self.flows.as_raw_fd() as u32);
        put_u64(&mut a, 8, key.0.as_ptr() as u64);
        put_u64(&mut a, 16, value.as_ptr() as u64);
        bpf(BPF_MAP_UPDATE_ELEM, &mut a)
            .map(drop)
            .map_err(|e| dev_err("fast path", "installing a flow entry", e))
    }

    /// Removes `key`'s entry, if there is one.
    pub fn forget(&self, key: &FlowKey) -> Result<()> {
        let mut a = [0u64; 16];
        put_u32(&mut a, 0, self.flows.as_raw_fd() as u32);
        put_u64(&mut a, 8, key.0.as_ptr() as u64);
        match bpf(BPF_MAP_DELETE_ELEM, &mut a) {
            Err(e) if e.raw_os_error() != Some(libc::ENOENT) => {
                Err(dev_err("fast path", "removing a flow entry", e))
            }
            _ => Ok(()),
        }
    }

    /// The entry of `key`, if there is one.
    pub fn entry(&self, key: &FlowKey) -> Result<Option<[u8; ENTRY_SIZE]>> {
        let mut value = [0u8; ENTRY_SIZE];
        let mut a = [0u64; 16];
        put_u32(&mut a, 0, self.flows.as_raw_fd() as u32);
        put_u64(&mut a, 8, key.0.as_ptr() as u64);
        put_u64(&mut a, 16, value.as_mut_ptr() as u64);
        match bpf(BPF_MAP_LOOKUP_ELEM, &mut a) {
            Ok(_) => Ok(Some(value)),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(None),
            Err(e) => Err(dev_err("fast path", "reading a flow entry", e)),
        }
    }

    /// What the programs forwarded so far, over every CPU.
    pub fn stats(&self) -> Result<FastPathStats> {
        let mut values = vec![0u64; 2 * self.cpus];
        let key = 0u32;
        let mut a = [0u64; 16];
        put_u32(&mut a, 0, self.stats.as_raw_fd() as u32);
        put_u64(&mut a, 8, &key as *const u32 as u64);
        put_u64(&mut a, 16, values.as_mut_ptr() as u64);
        bpf(BPF_MAP_LOOKUP_ELEM, &mut a)
            .map_err(|e| dev_err("fast path", "reading the counters", e))?;
        Ok(values
            .chunks(2)
            .fold(FastPathStats::default(), |s, c| FastPathStats {
                packets: s.packets + c[0],
                bytes: s.bytes + c[1],
            }))
    }

    /// The program for a port whose slow path is the XDP sockets in `xsks`.
    pub(crate) fn program(&self, xsks: RawFd) -> Vec<u64> {
        program(self.flows.as_raw_fd(), self.stats.as_raw_fd(), xsks)
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

/// The number of possible CPUs (per-CPU map values come one per possible CPU).
fn possible_cpus() -> usize {
    // "0-3" or "0,2-5": the highest number plus one.
    std::fs::read_to_string("/sys/devices/system/cpu/possible")
        .ok()
        .and_then(|s| {
            s.trim()
                .split([',', '-'])
                .filter_map(|n| n.parse::<usize>().ok())
                .max()
        })
        .map_or(1, |m| m + 1)
}

// ---------------------------------------------------------------------------------------------
// The program, assembled here (see `crate::afxdp` for why no BPF toolchain).

const R0: u8 = 0;
const R1: u8 = 1;
const R2: u8 = 2;
const R3: u8 = 3;
const R4: u8 = 4;
const R6: u8 = 6;
const R7: u8 = 7;
const R8: u8 = 8;
const R9: u8 = 9;
const R10: u8 = 10;

const LDXW: u8 = 0x61;
const LDXH: u8 = 0x69;
const LDXB: u8 = 0x71;
const LDXDW: u8 = 0x79;
const STXW: u8 = 0x63;
const STXH: u8 = 0x6b;
const STXB: u8 = 0x73;
const STXDW: u8 = 0x7b;
const STW: u8 = 0x62;
const ADD_K: u8 = 0x07;
const ADD_X: u8 = 0x0f;
const SUB_K: u8 = 0x17;
const AND_K: u8 = 0x57;
const RSH_K: u8 = 0x77;
const XOR_K: u8 = 0xa7;
const MOV_K: u8 = 0xb7;
const MOV_X: u8 = 0xbf;
const TO_BE: u8 = 0xdc;
const JA: u8 = 0x05;
const JEQ_K: u8 = 0x15;
const JNE_K: u8 = 0x55;
const JLE_K: u8 = 0xb5;
const JGT_X: u8 = 0x2d;
const JGE_X: u8 = 0x3d;
const CALL: u8 = 0x85;
const EXIT: u8 = 0x95;

const MAP_LOOKUP: u32 = 1;
const KTIME_GET_NS: u32 = 5;
const REDIRECT: u32 = 23;
const REDIRECT_MAP: u32 = 51;
const XDP_PASS: u32 = 2;

/// A program under construction, with forward jumps to labels patched at the end.
#[derive(Default)]
struct Asm {
    insns: Vec<u64>,
    jumps: Vec<(usize, usize)>,
    labels: Vec<Option<usize>>,
}

impl Asm {
    fn op(&mut self, code: u8, dst: u8, src: u8, off: i16, imm: i32) {
        self.insns.push(insn(code, dst, src, off, imm as u32));
    }

    fn label(&mut self) -> usize {
        self.labels.push(None);
        self.labels.len() - 1
    }

    fn here(&mut self, l: usize) {
        self.labels[l] = Some(self.insns.len());
    }

    fn jump(&mut self, code: u8, dst: u8, src: u8, imm: i32, to: usize) {
        self.jumps.push((self.insns.len(), to));
        self.op(code, dst, src, 0, imm);
    }

    /// `dst = map fd` (a 16-byte load the kernel turns into the map's address).
    fn load_map(&mut self, dst: u8, fd: RawFd) {
        self.insns.push(insn(0x18, dst, 1, 0, fd as u32));
        self.insns.push(0);
    }

    /// `dst = ~(~dst + sum)` on 16 bits, clobbering `R3`: RFC 1624 eqn. 3.
    fn csum_add(&mut self, dst: u8, sum: u8) {
        self.op(XOR_K, dst, 0, 0, 0xffff);
        self.op(ADD_X, dst, sum, 0, 0);
        self.op(MOV_X, R3, dst, 0, 0);
        self.op(RSH_K, R3, 0, 0, 16);
        self.op(AND_K, dst, 0, 0, 0xffff);
        self.op(ADD_X, dst, R3, 0, 0);
        self.op(XOR_K, dst, 0, 0, 0xffff);
    }

    fn finish(mut self) -> Vec<u64> {
        for &(at, l) in &self.jumps {
            let target = self.labels[l].expect("every label is placed");
            let off = (target as i64 - at as i64 - 1) as i16;
            self.insns[at] = (self.insns[at] & !(0xffff << 16)) | (u64::from(off as u16) << 16);
        }
        self.insns
    }
}

/// The fast-path program: see the module documentation. Registers: R6 the context, R7 the
/// frame's start, R8 its end, R9 the protocol and then the entry.
fn program(flows: RawFd, stats: RawFd, xsks: RawFd) -> Vec<u64> {
    let raw16 = |b: [u8; 2]| i32::from(u16::from_ne_bytes(b));
    let mut a = Asm::default();
    let (punt, renew, key, udp, l4, store, rewrite, redirect) = (
        a.label(),
        a.label(),
        a.label(),
        a.label(),
        a.label(),
        a.label(),
        a.label(),
        a.label(),
    );
    a.op(MOV_X, R6, R1, 0, 0);
    a.op(LDXW, R7, R6, 0, 0); // xdp_md.data
    a.op(LDXW, R8, R6, 4, 0); // xdp_md.data_end
    a.op(MOV_X, R2, R7, 0, 0);
    a.op(ADD_K, R2, 0, 0, (L4 + 8) as i32);
    a.jump(JGT_X, R2, R8, 0, punt);
    a.op(LDXH, R2, R7, 12, 0);
    a.jump(JNE_K, R2, 0, raw16([0x08, 0x00]), punt); // IPv4
    a.op(LDXB, R2, R7, IP as i16, 0);
    a.jump(JNE_K, R2, 0, 0x45, punt); // version 4, no options
    a.op(LDXH, R2, R7, (IP + 6) as i16, 0);
    a.op(AND_K, R2, 0, 0, raw16([0x3f, 0xff]));
    a.jump(JNE_K, R2, 0, 0, punt); // not a fragment
    a.op(LDXB, R2, R7, (IP + 8) as i16, 0);
    a.jump(JLE_K, R2, 0, 1, punt); // TTL left to decrement
    a.op(LDXB, R9, R7, (IP + 9) as i16, 0);
    a.jump(JEQ_K, R9, 0, i32::from(PROTO_UDP), key);
    a.jump(JNE_K, R9, 0, i32::from(PROTO_TCP), punt);
    a.op(MOV_X, R2, R7, 0, 0);
    a.op(ADD_K, R2, 0, 0, (L4 + 20) as i32);
    a.jump(JGT_X, R2, R8, 0, punt);
    a.op(LDXB, R2, R7, (L4 + 13) as i16, 0);
    a.op(AND_K, R2, 0, 0, i32::from(TCP_FIN | TCP_SYN | TCP_RST));
    a.jump(JNE_K, R2, 0, 0, punt);

    // The key on the stack at R10-24: ifindex, addresses, ports, protocol.
    a.here(key);
    a.op(LDXW, R2, R6, 12, 0); // xdp_md.ingress_ifindex
    a.op(STXW, R10, R2, -24, 0);
    for (i, at) in [IP + 12, IP + 16, L4].into_iter().enumerate() {
        a.op(LDXW, R2, R7, at as i16, 0);
        a.op(STXW, R10, R2, -20 + 4 * i as i16, 0);
    }
    a.op(STXW, R10, R9, -8, 0);
    a.load_map(R1, flows);
    a.op(MOV_X, R2, R10, 0, 0);
    a.op(ADD_K, R2, 0, 0, -24);
    a.op(CALL, 0, 0, 0, MAP_LOOKUP as i32);
    a.jump(JEQ_K, R0, 0, 0, punt);
    a.op(MOV_X, R9, R0, 0, 0);
    a.op(CALL, 0, 0, 0, KTIME_GET_NS as i32);
    a.op(LDXDW, R1, R9, E_DEADLINE, 0);
    a.jump(JGE_X, R0, R1, 0, punt); // stale: the slow path renews it
    a.op(LDXDW, R1, R9, E_RENEW, 0);
    a.jump(JGE_X, R0, R1, 0, renew); // due: one packet to the slow path

    // Bounds for the transport checksum (checked again: nothing is written before this).
    a.op(LDXW, R2, R10, -8, 0);
    a.jump(JEQ_K, R2, 0, i32::from(PROTO_UDP), udp);
    a.op(MOV_X, R3, R7, 0, 0);
    a.op(ADD_K, R3, 0, 0, (L4 + 20) as i32);
    a.jump(JGT_X, R3, R8, 0, punt);
    a.op(MOV_X, R4, R7, 0, 0);
    a.op(ADD_K, R4, 0, 0, (L4 + 16) as i32);
    a.jump(JA, 0, 0, 0, l4);
    a.here(udp);
    a.op(MOV_X, R3, R7, 0, 0);
    a.op(ADD_K, R3, 0, 0, (L4 + 8) as i32);
    a.jump(JGT_X, R3, R8, 0, punt);
    a.op(MOV_X, R4, R7, 0, 0);
    a.op(ADD_K, R4, 0, 0, (L4 + 6) as i32);
    a.op(LDXH, R2, R4, 0, 0);
    a.jump(JEQ_K, R2, 0, 0, rewrite); // no UDP checksum: none to update
    a.here(l4);
    a.op(LDXH, R2, R4, 0, 0);
    a.op(LDXW, R1, R9, E_L4_SUM, 0);
    a.csum_add(R2, R1);
    a.op(LDXW, R3, R10, -8, 0);
    a.jump(JNE_K, R3, 0, i32::from(PROTO_UDP), store);
    a.jump(JNE_K, R2, 0, 0, store);
    a.op(MOV_K, R2, 0, 0, 0xffff); // RFC 768: a computed 0 is sent as all ones
    a.here(store);
    a.op(STXH, R4, R2, 0, 0);

    // Ethernet addresses, IPv4 addresses, ports, TTL, header checksum.
    a.here(rewrite);
    for (from, to) in [
        (E_MACS, 0),
        (E_MACS + 4, 4),
        (E_MACS + 8, 8),
        (E_ADDRS, (IP + 12) as i16),
        (E_ADDRS + 4, (IP + 16) as i16),
        (E_PORTS, L4 as i16),
    ] {
        a.op(LDXW, R2, R9, from, 0);
        a.op(STXW, R7, R2, to, 0);
    }
    a.op(LDXB, R2, R7, (IP + 8) as i16, 0);
    a.op(SUB_K, R2, 0, 0, 1);
    a.op(STXB, R7, R2, (IP + 8) as i16, 0);
    a.op(LDXH, R2, R7, (IP + 10) as i16, 0);
    a.op(LDXW, R1, R9, E_IP_SUM, 0);
    a.csum_add(R2, R1);
    a.op(STXH, R7, R2, (IP + 10) as i16, 0);

    // Counters: packets, and bytes (the IPv4 total length plus the Ethernet header).
    a.op(LDXH, R2, R7, (IP + 2) as i16, 0);
    a.op(TO_BE, R2, 0, 0, 16);
    a.op(ADD_K, R2, 0, 0, ETH as i32);
    a.op(STXDW, R10, R2, -32, 0);
    a.op(STW, R10, 0, -36, 0);
    a.load_map(R1, stats);
    a.op(MOV_X, R2, R10, 0, 0);
    a.op(ADD_K, R2, 0, 0, -36);
    a.op(CALL, 0, 0, 0, MAP_LOOKUP as i32);
    a.jump(JEQ_K, R0, 0, 0, redirect);
    a.op(LDXDW, R2, R0, 0, 0);
    a.op(ADD_K, R2, 0, 0, 1);
    a.op(STXDW, R0, R2, 0, 0);
    a.op(LDXDW, R2, R0, 8, 0);
    a.op(LDXDW, R3, R10, -32, 0);
    a.op(ADD_X, R2, R3, 0, 0);
    a.op(STXDW, R0, R2, 8, 0);
    a.here(redirect);
    a.op(LDXW, R1, R9, E_IFINDEX, 0);
    a.op(MOV_K, R2, 0, 0, 0);
    a.op(CALL, 0, 0, 0, REDIRECT as i32);
    a.op(EXIT, 0, 0, 0, 0);

    // Renewal: no other packet is sent for it until the deadline (a race between CPUs sends
    // two, which is harmless); this one goes to the slow path, whose output renews the entry.
    a.here(renew);
    a.op(LDXDW, R1, R9, E_DEADLINE, 0);
    a.op(STXDW, R9, R1, E_RENEW, 0);

    // The slow path: the port's XDP socket for this queue, else the kernel stack.
    a.here(punt);
    a.op(LDXW, R2, R6, 16, 0); // xdp_md.rx_queue_index
    a.load_map(R1, xsks);
    a.op(MOV_K, R3, 0, 0, XDP_PASS as i32);
    a.op(CALL, 0, 0, 0, REDIRECT_MAP as i32);
    a.op(EXIT, 0, 0, 0, 0);
    a.finish()
}

/// Runs `prog` once on `frame` with `BPF_PROG_TEST_RUN` (the kernel's own interpreter or JIT,
/// no interface needed): returns the XDP action and the frame as the program left it.
pub fn test_run(prog: RawFd, ingress_ifindex: u32, frame: &[u8]) -> io::Result<(u32, Vec<u8>)> {
    const BPF_PROG_TEST_RUN: libc::c_long = 10;
    let mut out = vec![0u8; frame.len() + 256];
    // struct xdp_md: data, data_end, data_meta, ingress_ifindex, rx_queue_index, egress_ifindex
    let ctx: [u32; 6] = [0, frame.len() as u32, 0, ingress_ifindex, 0, 0];
    let mut a = [0u64; 16];
    put_u32(&mut a, 0, prog as u32);
    put_u32(&mut a, 8, frame.len() as u32);
    put_u32(&mut a, 12, out.len() as u32);
    put_u64(&mut a, 16, frame.as_ptr() as u64);
    put_u64(&mut a, 24, out.as_mut_ptr() as u64);
    put_u32(&mut a, 32, 1);
    put_u32(&mut a, 40, std::mem::size_of_val(&ctx) as u32);
    put_u64(&mut a, 48, ctx.as_ptr() as u64);
    bpf(BPF_PROG_TEST_RUN, &mut a)?;
    // SAFETY: reading back retval and data_size_out from the attr the kernel filled.
    let (retval, size) = unsafe {
        let p = a.as_ptr().cast::<u8>();
        (
            p.add(4).cast::<u32>().read_unaligned(),
            p.add(12).cast::<u32>().read_unaligned(),
        )
    };
    out.truncate(size as usize);
    Ok((retval, out))
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
            assert_eq!(&reverse.0[4..8], &[198, 51, 100, 2]);
            assert_eq!(&reverse.0[8..12], &[198, 51, 100, 1]);
            assert_eq!(&reverse.0[12..16], &[0, 80, 4, 0]);
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

    fn is_root() -> bool {
        // SAFETY: geteuid has no preconditions.
        unsafe { libc::geteuid() == 0 }
    }

    /// The program of a fast path, with an empty XSKMAP behind it (a punt is `XDP_PASS`).
    fn loaded(fast: &FastPath) -> (OwnedFd, OwnedFd) {
        let mut a = [0u64; 16];
        put_u32(&mut a, 0, 17); // BPF_MAP_TYPE_XSKMAP
        put_u32(&mut a, 4, 4);
        put_u32(&mut a, 8, 4);
        put_u32(&mut a, 12, 1);
        let xsks = owned(bpf(BPF_MAP_CREATE, &mut a).expect("XSKMAP"));
        let prog = crate::afxdp::load_xdp(&fast.program(xsks.as_raw_fd())).expect("verified");
        (prog, xsks)
    }

    const XDP_REDIRECT: u32 = 4;
    const LO: u32 = 1;

    #[test]
    fn the_kernel_runs_the_program_as_the_slow_path_did() {
        if !is_root() {
            eprintln!("skipped: loading XDP programs needs root");
            return;
        }
        let fast = FastPath::new(64, Duration::from_secs(5)).unwrap();
        let (prog, _xsks) = loaded(&fast);
        let h = outbound(Some(0x18));
        let (input, output) = (frame(&h), frame(&translated(&h)));
        // Unknown flow: the slow path gets it, untouched.
        assert_eq!(
            test_run(prog.as_raw_fd(), LO, &input).unwrap(),
            (XDP_PASS, input.clone())
        );
        fast.observe(LO, &input, 7, &output).unwrap();
        let (action, got) = test_run(prog.as_raw_fd(), LO, &input).unwrap();
        assert_eq!(action, XDP_REDIRECT);
        assert_eq!(got, output);
        assert_eq!(
            fast.stats().unwrap(),
            FastPathStats {
                packets: 1,
                bytes: input.len() as u64
            }
        );
        // A SYN of the same flow is not the program's; a FIN the slow path forwards forgets it.
        let syn = frame(&outbound(Some(TCP_SYN)));
        assert_eq!(test_run(prog.as_raw_fd(), LO, &syn).unwrap().0, XDP_PASS);
        let fin = frame(&outbound(Some(TCP_FIN | 0x10)));
        fast.observe(
            LO,
            &fin,
            7,
            &frame(&translated(&outbound(Some(TCP_FIN | 0x10)))),
        )
        .unwrap();
        assert_eq!(fast.entry(&FlowKey::of(LO, &input).unwrap()).unwrap(), None);
        assert_eq!(test_run(prog.as_raw_fd(), LO, &input).unwrap().0, XDP_PASS);
    }

    #[test]
    fn a_stale_entry_sends_the_packet_to_the_slow_path() {
        if !is_root() {
            eprintln!("skipped: loading XDP programs needs root");
            return;
        }
        let fast = FastPath::new(64, Duration::from_millis(1)).unwrap();
        let (prog, _xsks) = loaded(&fast);
        let h = outbound(None);
        let (input, output) = (frame(&h), frame(&translated(&h)));
        fast.observe(LO, &input, 7, &output).unwrap();
        std::thread::sleep(Duration::from_millis(5));
        assert_eq!(
            test_run(prog.as_raw_fd(), LO, &input).unwrap(),
            (XDP_PASS, input)
        );
    }

    #[test]
    fn a_due_entry_sends_one_packet_to_the_slow_path_and_keeps_the_others() {
        if !is_root() {
            eprintln!("skipped: loading XDP programs needs root");
            return;
        }
        let fast = FastPath::new(64, Duration::from_secs(5)).unwrap();
        let (prog, _xsks) = loaded(&fast);
        let h = outbound(None);
        let (input, output) = (frame(&h), frame(&translated(&h)));
        let now = monotonic_ns();
        let Lesson::Install(key, entry) = lesson(LO, &input, 7, &output, now, now + (1 << 40))
        else {
            panic!("expected an entry");
        };
        fast.install(&key, &entry).unwrap();
        let run = || test_run(prog.as_raw_fd(), LO, &input).unwrap().0;
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
            if is_root() {
                let fast = FastPath::new(4, Duration::from_secs(5)).unwrap();
                let (prog, _xsks) = loaded(&fast);
                fast.install(&key, &entry).unwrap();
                let (action, got) = test_run(prog.as_raw_fd(), LO, &input).unwrap();
                prop_assert_eq!(action, XDP_REDIRECT);
                prop_assert_eq!(got, output);
            }
        }
    }
}
