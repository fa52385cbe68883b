//! The neighbour side of a two-port IPv4 and IPv6 box: its ports' addressing, ARP and
//! neighbour discovery, ICMP and ICMPv6 errors and routing between the ports, over
//! [`flowstate_io::Port`]s. The live box
//! (`flowstate_chain::live`) and a cluster's root (`flowstate_cluster::root`) both stand on it.
//!
//! The box is a router with two ports and no kernel addresses:
//! * It answers ARP requests for its own address on each port, so ordinary hosts use it as
//!   their gateway, and it learns its neighbours' MAC addresses from the ARP and IPv4 frames
//!   they send (last one wins).
//! * IPv4 frames addressed to a port's MAC go through the chain; every other frame (other
//!   hosts' unicast, IPv6, LLDP, broadcasts that are not ARP) is counted and dropped.
//! * IPv6 alike on a port with an IPv6 address ([`PortAddr::address6`]): neighbour
//!   solicitations for it are answered and unknown next hops solicited (RFC 4861, `nd`),
//!   the hop limit is decremented, and what cannot be forwarded gets ICMPv6 time exceeded or
//!   packet too big (RFC 4443) from that address. Without one, IPv6 is not for the box.
//! * A frame with one VLAN tag (IEEE 802.1Q or 802.1ad) is handled as an untagged one, and
//!   what the box sends for it (an ARP answer or request, an ICMP error, the forwarded
//!   frame) carries the same tag: tags are kept end to end.
//! * A forwarded packet leaves by the inside port when its (translated) destination is in the
//!   `inside` prefixes, by the outside port otherwise, towards the port's gateway if it has one,
//!   else towards the destination itself. Its Ethernet addresses are rewritten, its TTL is
//!   decremented (RFC 1812 §5.3.1; the header checksum is updated incrementally, RFC 1624).
//! * What the box cannot forward it answers as a router does, before the chain sees it (so
//!   the error goes to the sender as it sent, untranslated): a packet whose TTL runs out gets
//!   ICMP time exceeded (RFC 1812 §5.3.1), and a packet larger than the MTU of the port it
//!   would leave by gets ICMP fragmentation needed with that MTU when it has DF set (RFC 1191
//!   path MTU discovery; the box does not fragment, so a DF-less one is dropped). The error
//!   comes from the box's address on the receiving port, quotes as much of the packet as fits
//!   in 576 bytes (RFC 1812 §4.3.2.3), is never sent about an ICMP error, a later fragment
//!   or a non-unicast source (RFC 1122 §3.2.2), and at most 1000 a second (RFC 1812
//!   §4.3.2.8). The ports' MTUs are read from their interfaces at start. A destination whose MAC is not known yet is asked
//!   for with an ARP request (at most once every 200 ms per address) and the packet dropped;
//!   the sender's retransmission finds it.
//!
//! The neighbour table is written by the receiving side only and read by the sending side
//! (another thread with several workers) through a per-entry sequence lock: no lock, no
//! allocation after start.

use flowstate_config::{IpNet, PrefixMatch};
use flowstate_fastpath::flowcache::XdpFlowCache;
use flowstate_io::afxdp::XdpProgram;
use flowstate_io::{PacketBatch, Port, Sink, Source};
use flowstate_wire::ethernet::{EtherType, MacAddr};
use flowstate_wire::{arp, ethernet, icmp, ipv4};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod nd;
mod port;
pub use port::{Driver, FastPathConfig, LivePort};

/// The inside port's number (in [`flowstate_io::PacketMeta::port`]).
pub const INSIDE: u16 = 0;
/// The outside port's number.
pub const OUTSIDE: u16 = 1;

const ETH_HLEN: usize = 14;
const ETHERTYPE_IPV4: u16 = 0x0800;
const ETHERTYPE_ARP: u16 = 0x0806;
const BROADCAST: [u8; 6] = [0xff; 6];
/// Neighbour entries per port (a power of two).
const NEIGHBOURS: usize = 256;
/// How often one address is asked for at most.
const ASK_EVERY: Duration = Duration::from_millis(200);

/// A port's addressing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortAddr {
    /// The box's address on the port (answered in ARP; the source of its ARP requests).
    pub address: Ipv4Addr,
    /// Where packets leaving by this port go (`None`: the destination is on the link).
    pub gateway: Option<Ipv4Addr>,
    /// The box's IPv6 address on the port (answered in neighbour discovery; the source of
    /// its solicitations and ICMPv6 errors). `None`: IPv6 is not routed by this port.
    pub address6: Option<Ipv6Addr>,
    /// Where IPv6 packets leaving by this port go (`None`: the destination is on the link).
    pub gateway6: Option<Ipv6Addr>,
    /// The largest IPv4 packet the port sends (its interface's MTU; see [`interface_mtu`]).
    pub mtu: u16,
}

/// The MTU of network interface `name` (from sysfs), or 65535 (no limit the box enforces)
/// when it cannot be read.
pub fn interface_mtu(name: &str) -> u16 {
    std::fs::read_to_string(format!("/sys/class/net/{name}/mtu"))
        .ok()
        .and_then(|m| m.trim().parse::<u32>().ok())
        .map_or(u16::MAX, |m| m.min(u32::from(u16::MAX)) as u16)
}

/// Asks the box to stop: the source then reports the end of its input.
#[derive(Debug, Clone, Default)]
pub struct Stop(Arc<AtomicBool>);

impl Stop {
    /// A flag not raised yet.
    pub fn new() -> Self {
        Stop::default()
    }

    /// Raises the flag.
    pub fn stop(&self) {
        self.0.store(true, Ordering::SeqCst);
    }

    /// Whether the flag is raised (or, once [`Stop::on_signals`] ran, SIGINT/SIGTERM came).
    pub fn stopped(&self) -> bool {
        self.0.load(Ordering::Relaxed) || SIGNALLED.load(Ordering::Relaxed)
    }

    /// Makes SIGINT and SIGTERM stop every box of the process (the first signal only: a second
    /// one ends the process as usual).
    pub fn on_signals() -> std::io::Result<()> {
        extern "C" fn handler(_: libc::c_int) {
            SIGNALLED.store(true, Ordering::SeqCst);
        }
        for sig in [libc::SIGINT, libc::SIGTERM] {
            // SAFETY: installs an async-signal-safe handler (one atomic store); SA_RESETHAND
            // restores the default so a second signal kills.
            unsafe {
                let mut sa: libc::sigaction = std::mem::zeroed();
                sa.sa_sigaction = handler as extern "C" fn(libc::c_int) as usize;
                sa.sa_flags = libc::SA_RESETHAND;
                libc::sigemptyset(&mut sa.sa_mask);
                if libc::sigaction(sig, &sa, std::ptr::null_mut()) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
        }
        Ok(())
    }
}

static SIGNALLED: AtomicBool = AtomicBool::new(false);

/// What the box did besides forwarding.
#[derive(Debug, Default)]
pub struct BoxStats {
    /// ARP requests for a box address answered.
    pub arp_answered: AtomicU64,
    /// ARP requests the box sent for unknown neighbours.
    pub arp_asked: AtomicU64,
    /// IPv6 neighbour solicitations for a box address answered.
    pub nd_answered: AtomicU64,
    /// IPv6 neighbour solicitations the box sent for unknown neighbours.
    pub nd_asked: AtomicU64,
    /// Frames dropped on receive: not IPv4 or ARP, not addressed to the port, too short.
    pub not_for_us: AtomicU64,
    /// Forwarded packets dropped because the next hop's MAC was unknown.
    pub unresolved: AtomicU64,
    /// Packets dropped because their TTL ran out (answered with ICMP time exceeded).
    pub ttl_expired: AtomicU64,
    /// Packets dropped because they were larger than the MTU of the port they would leave
    /// by (answered with ICMP fragmentation needed when they had DF set; the box does not
    /// fragment).
    pub too_big: AtomicU64,
    /// ICMP errors the box sent (time exceeded, fragmentation needed), within its rate.
    pub icmp_errors_sent: AtomicU64,
    /// Frames the devices refused to send.
    pub send_dropped: AtomicU64,
    /// Packets the XDP fast path forwarded (read when the box stops).
    pub fast_path_packets: AtomicU64,
    /// Their bytes.
    pub fast_path_bytes: AtomicU64,
    /// Fast-path entries that could not be written (the flows stayed on the slow path).
    pub fast_path_errors: AtomicU64,
    /// IPv4 frames for the box received, per port (inside, outside); added once per batch.
    pub rx_packets: [AtomicU64; 2],
    /// Frames the devices took to send, per port (forwarded packets and the box's ARP
    /// requests); added once per batch.
    pub tx_packets: [AtomicU64; 2],
}

impl BoxStats {
    /// `(name, value)` of every counter, for reports.
    pub fn snapshot(&self) -> Vec<(&'static str, u64)> {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        vec![
            ("arp_answered", l(&self.arp_answered)),
            ("arp_asked", l(&self.arp_asked)),
            ("nd_answered", l(&self.nd_answered)),
            ("nd_asked", l(&self.nd_asked)),
            ("not_for_us", l(&self.not_for_us)),
            ("unresolved", l(&self.unresolved)),
            ("ttl_expired", l(&self.ttl_expired)),
            ("too_big", l(&self.too_big)),
            ("icmp_errors_sent", l(&self.icmp_errors_sent)),
            ("send_dropped", l(&self.send_dropped)),
            ("fast_path_packets", l(&self.fast_path_packets)),
            ("fast_path_bytes", l(&self.fast_path_bytes)),
            ("fast_path_errors", l(&self.fast_path_errors)),
            ("inside_rx_packets", l(&self.rx_packets[0])),
            ("outside_rx_packets", l(&self.rx_packets[1])),
            ("inside_tx_packets", l(&self.tx_packets[0])),
            ("outside_tx_packets", l(&self.tx_packets[1])),
        ]
    }
}

#[derive(Default)]
struct Slot {
    seq: AtomicU32,
    /// The address ([`key`]), high and low halves.
    hi: AtomicU64,
    lo: AtomicU64,
    /// MAC in the low 48 bits; bit 63 set when valid.
    mac: AtomicU64,
    /// When this address was last asked for (ms since the table's start), sender side.
    asked: AtomicU64,
}

/// One port's neighbours: IPv4 or IPv6 address → MAC. One writer (the receiving thread).
pub struct Neighbours {
    slots: Box<[Slot]>,
    start: Instant,
}

impl std::fmt::Debug for Neighbours {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Neighbours").finish_non_exhaustive()
    }
}

impl Default for Neighbours {
    fn default() -> Self {
        Neighbours {
            slots: (0..NEIGHBOURS).map(|_| Slot::default()).collect(),
            start: Instant::now(),
        }
    }
}

const VALID: u64 = 1 << 63;

fn mac_u64(m: [u8; 6]) -> u64 {
    m.iter().fold(0u64, |a, &b| (a << 8) | u64::from(b)) | VALID
}

/// An address as 128 bits (IPv4 as IPv4-mapped IPv6).
#[inline]
fn key(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(a) => u128::from(a.to_ipv6_mapped()),
        IpAddr::V6(a) => u128::from(a),
    }
}

impl Neighbours {
    #[inline]
    fn slot(&self, k: u128) -> &Slot {
        let folded = (k as u32) ^ ((k >> 32) as u32) ^ ((k >> 64) as u32) ^ ((k >> 96) as u32);
        &self.slots[(folded.wrapping_mul(0x9e37_79b1) >> 24) as usize % NEIGHBOURS]
    }

    /// Records that `ip` is at `mac` (the receiving thread only).
    #[inline]
    pub fn learn(&self, ip: impl Into<IpAddr>, mac: [u8; 6]) {
        let k = key(ip.into());
        let (hi, lo) = ((k >> 64) as u64, k as u64);
        let m = mac_u64(mac);
        let s = self.slot(k);
        if s.hi.load(Ordering::Relaxed) == hi
            && s.lo.load(Ordering::Relaxed) == lo
            && s.mac.load(Ordering::Relaxed) == m
        {
            return;
        }
        let seq = s.seq.load(Ordering::Relaxed);
        s.seq.store(seq.wrapping_add(1), Ordering::Relaxed);
        fence(Ordering::Release);
        s.hi.store(hi, Ordering::Relaxed);
        s.lo.store(lo, Ordering::Relaxed);
        s.mac.store(m, Ordering::Relaxed);
        s.seq.store(seq.wrapping_add(2), Ordering::Release);
    }

    /// The MAC of `ip`, if known.
    #[inline]
    pub fn lookup(&self, ip: impl Into<IpAddr>) -> Option<[u8; 6]> {
        let k = key(ip.into());
        let s = self.slot(k);
        for _ in 0..4 {
            let a = s.seq.load(Ordering::Acquire);
            if a & 1 == 1 {
                std::hint::spin_loop();
                continue;
            }
            let (hi, lo) = (s.hi.load(Ordering::Relaxed), s.lo.load(Ordering::Relaxed));
            let m = s.mac.load(Ordering::Relaxed);
            fence(Ordering::Acquire);
            if s.seq.load(Ordering::Relaxed) != a {
                continue;
            }
            if (u128::from(hi) << 64 | u128::from(lo)) != k || m & VALID == 0 {
                return None;
            }
            let b = m.to_be_bytes();
            return Some([b[2], b[3], b[4], b[5], b[6], b[7]]);
        }
        None
    }

    /// Whether to ask for `ip` now (an ARP request, a neighbour solicitation; the sending
    /// thread only): not more than once per [`ASK_EVERY`] for an address (or for addresses
    /// sharing its entry).
    fn should_ask(&self, ip: impl Into<IpAddr>) -> bool {
        let s = self.slot(key(ip.into()));
        let now = self.start.elapsed().as_millis() as u64 + ASK_EVERY.as_millis() as u64;
        let last = s.asked.load(Ordering::Relaxed);
        if now.saturating_sub(last) < ASK_EVERY.as_millis() as u64 {
            return false;
        }
        s.asked.store(now, Ordering::Relaxed);
        true
    }
}

/// What the source and the sink share.
#[derive(Debug, Default)]
pub struct Shared {
    /// Per port.
    pub neighbours: [Neighbours; 2],
    /// Counters.
    pub stats: BoxStats,
}

#[inline]
fn be16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*b.get(at)?, *b.get(at + 1)?]))
}

#[inline]
fn ip4(b: &[u8], at: usize) -> Option<Ipv4Addr> {
    let s = b.get(at..at + 4)?;
    Some(Ipv4Addr::new(s[0], s[1], s[2], s[3]))
}

#[inline]
fn mac(b: &[u8], at: usize) -> Option<[u8; 6]> {
    let s = b.get(at..at + 6)?;
    Some([s[0], s[1], s[2], s[3], s[4], s[5]])
}

/// An Ethernet frame's link header: its VLAN tag (IEEE 802.1Q §9: TPID and TCI) if it has
/// one, the EtherType after it, and where the network header starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Link {
    tag: Option<[u8; 4]>,
    ethertype: u16,
    l3: usize,
}

const ETHERTYPE_VLAN: u16 = 0x8100;
const ETHERTYPE_QINQ: u16 = 0x88a8;

/// The link header of `f`; a second tag (802.1ad Q-in-Q) is not looked into: its
/// EtherType is then the inner TPID, which is neither IPv4 nor ARP.
#[inline]
fn link(f: &[u8]) -> Option<Link> {
    match be16(f, 12)? {
        ETHERTYPE_VLAN | ETHERTYPE_QINQ => Some(Link {
            tag: Some(f.get(12..16)?.try_into().ok()?),
            ethertype: be16(f, 16)?,
            l3: ETH_HLEN + 4,
        }),
        ethertype => Some(Link {
            tag: None,
            ethertype,
            l3: ETH_HLEN,
        }),
    }
}

/// Writes with `write` an untagged frame into `buf`, then gives it `tag` (after the MAC
/// addresses); returns its length (0: `write` wrote nothing, or `buf` is too small).
fn tagged(buf: &mut [u8], tag: Option<[u8; 4]>, write: impl FnOnce(&mut [u8]) -> usize) -> usize {
    let Some(tag) = tag else {
        return write(buf);
    };
    let Some(room) = buf.get_mut(4..) else {
        return 0;
    };
    let n = write(room);
    if n < 12 {
        return 0;
    }
    buf.copy_within(4..16, 0);
    buf[12..16].copy_from_slice(&tag);
    n + 4
}

/// Writes an ARP packet in an Ethernet frame into `buf`; returns its length (42), or 0 when
/// `buf` is too small.
fn write_arp(
    buf: &mut [u8],
    op: u16,
    eth_dst: [u8; 6],
    sha: [u8; 6],
    spa: Ipv4Addr,
    tha: [u8; 6],
    tpa: Ipv4Addr,
) -> usize {
    const LEN: usize = ETH_HLEN + arp::PACKET_LEN;
    let Some(b) = buf.get_mut(..LEN) else {
        return 0;
    };
    let (eth, rest) = b.split_at_mut(ETH_HLEN);
    ethernet::Frame::new_unchecked(eth).emit(MacAddr(eth_dst), MacAddr(sha), EtherType::ARP);
    let mut a = arp::Packet::new_unchecked(rest);
    a.set_ethernet_ipv4();
    a.set_operation(op);
    a.set_sender_hardware_addr(MacAddr(sha));
    a.set_sender_protocol_addr(spa);
    a.set_target_hardware_addr(MacAddr(tha));
    a.set_target_protocol_addr(tpa);
    LEN
}

/// Why the box cannot forward a packet it received, and answers with an ICMP error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Undeliverable {
    /// Its TTL ran out (RFC 1812 §5.3.1): ICMP time exceeded in transit.
    TtlExpired,
    /// Larger than `mtu`, the next port's: ICMP fragmentation needed (RFC 1191) when `df`.
    TooBig { mtu: u16, df: bool },
}

impl Undeliverable {
    /// Whether the sender gets an ICMP error: not for a DF-less packet too big (the box does
    /// not fragment; nothing would help the sender).
    fn answered(self) -> bool {
        !matches!(self, Undeliverable::TooBig { df: false, .. })
    }
}

/// Whether IPv4 `frame` (received for forwarding; its IPv4 header at `l3`) cannot be
/// forwarded: its TTL is 1 or 0 (the box decrements it), or it is larger than `next_mtu`.
#[inline]
fn undeliverable(frame: &[u8], l3: usize, next_mtu: u16) -> Option<Undeliverable> {
    let ip = frame.get(l3..l3 + 20)?;
    if ip[8] <= 1 {
        return Some(Undeliverable::TtlExpired);
    }
    let len = u16::from_be_bytes([ip[2], ip[3]]);
    (len > next_mtu).then_some(Undeliverable::TooBig {
        mtu: next_mtu,
        df: ip[6] & 0x40 != 0,
    })
}

/// The largest ICMP error frame the box writes: Ethernet, then at most 576 bytes of IPv4
/// (RFC 1812 §4.3.2.3).
const ICMP_ERROR_MAX: usize = ETH_HLEN + 576;

/// Whether IPv4 `frame` (its IPv4 header at `l3`) may be answered with an ICMP error (RFC 1122 §3.2.2, RFC 1812
/// §4.3.2.7): not an ICMP error itself, not a later fragment, from a unicast source, with a
/// header that parses.
fn answerable(frame: &[u8], l3: usize) -> bool {
    let Some(ip) = frame.get(l3..l3 + 20) else {
        return false;
    };
    let hl = usize::from(ip[0] & 0x0f) * 4;
    let total = usize::from(u16::from_be_bytes([ip[2], ip[3]]));
    let src = Ipv4Addr::new(ip[12], ip[13], ip[14], ip[15]);
    let later_fragment = u16::from_be_bytes([ip[6], ip[7]]) & 0x1fff != 0;
    let icmp_error = ip[9] == 1
        && frame
            .get(l3 + hl)
            .is_some_and(|&t| matches!(t, 3 | 4 | 5 | 11 | 12));
    ip[0] >> 4 == 4
        && hl >= 20
        && total >= hl
        && frame.len() >= l3 + hl
        && !later_fragment
        && !icmp_error
        && !(src.is_broadcast() || src.is_multicast() || src.is_unspecified() || src.is_loopback())
}

/// Writes into `buf` the ICMP error answering IPv4 `frame`, which [`answerable`] accepted
/// (received from the port with `my_mac` and `my_ip`): from `my_ip` to the frame's source,
/// quoting as much of the packet as fits in 576 bytes (RFC 1812 §4.3.2.3). Returns its length
/// (0 when `buf` is too small).
fn write_icmp_error(
    buf: &mut [u8],
    frame: &[u8],
    l3: usize,
    my_mac: [u8; 6],
    my_ip: Ipv4Addr,
    why: Undeliverable,
) -> usize {
    let (Some(ip), Some(src_mac)) = (frame.get(l3..), mac(frame, 6)) else {
        return 0;
    };
    if ip.len() < 20 {
        return 0;
    }
    let total = usize::from(u16::from_be_bytes([ip[2], ip[3]])).min(ip.len());
    let src = Ipv4Addr::new(ip[12], ip[13], ip[14], ip[15]);
    let quote = total.min(576 - 20 - 8);
    let len = ETH_HLEN + 20 + 8 + quote;
    let Some(b) = buf.get_mut(..len) else {
        return 0;
    };
    let (eth, rest) = b.split_at_mut(ETH_HLEN);
    ethernet::Frame::new_unchecked(eth).emit(MacAddr(src_mac), MacAddr(my_mac), EtherType::IPV4);
    let (hdr, rest) = rest.split_at_mut(20);
    let mut h = ipv4::Packet::new_unchecked(hdr);
    h.emit(
        (20 + 8 + quote) as u16,
        64,
        flowstate_wire::flow::proto::ICMP,
        my_ip,
        src,
    );
    // DSCP CS6, as routers mark their own control traffic (RFC 4594 §3.2).
    h.set_dscp_ecn(48, 0);
    h.fill_checksum();
    let (kind, code, mtu) = match why {
        Undeliverable::TtlExpired => (icmp::v4::types::TIME_EXCEEDED, 0, 0),
        // Code 4, fragmentation needed and DF set, with the next hop's MTU (RFC 1191 §4).
        Undeliverable::TooBig { mtu, .. } => (icmp::v4::types::DEST_UNREACHABLE, 4, mtu),
    };
    rest[..8].copy_from_slice(&[kind, code, 0, 0, 0, 0, 0, 0]);
    rest[6..8].copy_from_slice(&mtu.to_be_bytes());
    rest[8..8 + quote].copy_from_slice(&ip[..quote]);
    let mut m = icmp::v4::Packet::new_unchecked(&mut rest[..8 + quote]);
    m.fill_checksum();
    len
}

/// A token bucket for the box's ICMP errors: [`ICMP_ERRORS_PER_S`] a second, as bursts.
#[derive(Debug)]
struct IcmpBudget {
    left: u32,
    since: Instant,
}

/// ICMP errors the box sends a second at most (RFC 1812 §4.3.2.8: routers SHOULD limit them).
const ICMP_ERRORS_PER_S: u32 = 1000;

impl Default for IcmpBudget {
    fn default() -> Self {
        IcmpBudget {
            left: ICMP_ERRORS_PER_S,
            since: Instant::now(),
        }
    }
}

impl IcmpBudget {
    /// Takes one token if there is one (the clock is read only here: errors are rare).
    fn take(&mut self) -> bool {
        if self.left == 0 && self.since.elapsed() >= Duration::from_secs(1) {
            *self = IcmpBudget::default();
        }
        if self.left == 0 {
            return false;
        }
        self.left -= 1;
        true
    }
}

/// The receiving side of the box: a [`Source`] over the two ports.
pub struct LiveSource<P: Port> {
    ports: [P; 2],
    addrs: [PortAddr; 2],
    macs: [[u8; 6]; 2],
    shared: Arc<Shared>,
    stop: Stop,
    /// ARP replies and ICMP errors waiting to be sent, per port.
    arp_out: [PacketBatch; 2],
    /// ICMP errors the box may still send in the current second (RFC 1812 §4.3.2.8).
    icmp_budget: IcmpBudget,
    /// How long one wait for packets lasts before the stop flag is looked at again.
    pub poll: Duration,
    /// The last `recv` found nothing within [`IDLE_TICK`] (and the box is not stopping).
    idle: bool,
    /// The ports' interfaces, checked every second while the box waits ([`LiveSource::watch`]),
    /// and when next.
    watched: Option<([String; 2], Instant)>,
}

impl<P: Port> std::fmt::Debug for LiveSource<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LiveSource")
            .field("addrs", &self.addrs)
            .finish_non_exhaustive()
    }
}

impl<P: Port> LiveSource<P> {
    /// The source over `ports` (inside, outside) with their addressing.
    pub fn new(ports: [P; 2], addrs: [PortAddr; 2], shared: Arc<Shared>, stop: Stop) -> Self {
        let macs = [ports[0].mac(), ports[1].mac()];
        LiveSource {
            ports,
            addrs,
            macs,
            shared,
            stop,
            arp_out: [
                PacketBatch::new(16, ICMP_ERROR_MAX),
                PacketBatch::new(16, ICMP_ERROR_MAX),
            ],
            icmp_budget: IcmpBudget::default(),
            poll: Duration::from_millis(50),
            idle: false,
            watched: None,
        }
    }

    /// Ends the box with an error naming the interface when one of `interfaces` (inside,
    /// outside) is gone (its link deleted, the namespace at its other end removed), looked at
    /// every second while the box waits for packets, rather than running on unreachable.
    #[cfg(target_os = "linux")]
    pub fn watch(mut self, interfaces: [String; 2]) -> Self {
        self.watched = Some((interfaces, Instant::now()));
        self
    }

    /// [`LiveSource::watch`]'s check, when due.
    fn check_interfaces(&mut self) -> flowstate_io::Result<()> {
        let Some((names, next)) = &mut self.watched else {
            return Ok(());
        };
        if Instant::now() < *next {
            return Ok(());
        }
        *next = Instant::now() + Duration::from_secs(1);
        #[cfg(target_os = "linux")]
        if let Some(gone) = names
            .iter()
            .find(|n| !flowstate_io::afpacket::interface_exists(n))
        {
            return Err(flowstate_io::Error::Device {
                device: gone.clone(),
                what: "the interface is gone: stopping".into(),
                source: std::io::Error::from_raw_os_error(libc::ENODEV),
            });
        }
        Ok(())
    }

    fn receive(&mut self, batch: &mut PacketBatch) -> flowstate_io::Result<()> {
        for p in 0..2 {
            let my_mac = self.macs[p];
            let (my_ip, my_ip6) = (self.addrs[p].address, self.addrs[p].address6);
            let neigh = &self.shared.neighbours[p];
            let stats = &self.shared.stats;
            let arp_out = &mut self.arp_out[p];
            let budget = &mut self.icmp_budget;
            // Packets forwarded from this port leave by the other one (a hairpinned one by
            // this one, whose MTU the box then does not check).
            let next_mtu = self.addrs[1 - p].mtu;
            let mut keep = |f: &[u8]| -> bool {
                let (Some(dst), Some(src), Some(link)) = (mac(f, 0), mac(f, 6), link(f)) else {
                    stats.not_for_us.fetch_add(1, Ordering::Relaxed);
                    return false;
                };
                let l3 = link.l3;
                let not_for_us = || {
                    stats.not_for_us.fetch_add(1, Ordering::Relaxed);
                    false
                };
                // What the box cannot forward, and whether the packet is IPv6.
                let (error, v6) = match link.ethertype {
                    ETHERTYPE_IPV4 if dst == my_mac => {
                        let Some(s) = ip4(f, l3 + 12) else {
                            return not_for_us();
                        };
                        neigh.learn(s, src);
                        (undeliverable(f, l3, next_mtu), false)
                    }
                    nd::ETHERTYPE_IPV6 if my_ip6.is_some() => {
                        match nd::receive(f, l3, src, my_ip6) {
                            nd::Received::Solicited { from, mac } => {
                                neigh.learn(from, mac);
                                let (Some(mine), false) = (my_ip6, arp_out.is_full()) else {
                                    return false;
                                };
                                let pushed = arp_out.push_with(|buf, _| {
                                    tagged(buf, link.tag, |b| {
                                        nd::write_advertisement(b, my_mac, mine, from, mac)
                                    })
                                });
                                if pushed {
                                    stats.nd_answered.fetch_add(1, Ordering::Relaxed);
                                }
                                return false;
                            }
                            nd::Received::Neighbour(ip, mac) => {
                                neigh.learn(ip, mac);
                                return false;
                            }
                            nd::Received::Packet { src: s } if dst == my_mac => {
                                neigh.learn(s, src);
                                (nd::undeliverable(f, l3, next_mtu), true)
                            }
                            _ => return not_for_us(),
                        }
                    }
                    ETHERTYPE_ARP if dst == my_mac || dst == BROADCAST => {
                        if let (Some(op), Some(sha), Some(spa), Some(tpa)) = (
                            be16(f, l3 + 6),
                            mac(f, l3 + 8),
                            ip4(f, l3 + 14),
                            ip4(f, l3 + 24),
                        ) {
                            if !spa.is_unspecified() {
                                neigh.learn(spa, sha);
                            }
                            if op == 1 && tpa == my_ip {
                                let pushed = arp_out.push_with(|buf, _| {
                                    tagged(buf, link.tag, |b| {
                                        write_arp(b, 2, sha, my_mac, my_ip, sha, spa)
                                    })
                                });
                                if pushed {
                                    stats.arp_answered.fetch_add(1, Ordering::Relaxed);
                                }
                            }
                        }
                        return false;
                    }
                    _ => return not_for_us(),
                };
                let Some(error) = error else {
                    return true;
                };
                match error {
                    Undeliverable::TtlExpired => &stats.ttl_expired,
                    Undeliverable::TooBig { .. } => &stats.too_big,
                }
                .fetch_add(1, Ordering::Relaxed);
                let may = if v6 {
                    nd::answerable(f, l3)
                } else {
                    answerable(f, l3)
                };
                if error.answered() && may && !arp_out.is_full() && budget.take() {
                    let sent = arp_out.push_with(|buf, _| {
                        tagged(buf, link.tag, |b| match my_ip6.filter(|_| v6) {
                            Some(mine) => nd::write_error(b, f, l3, my_mac, mine, error),
                            None => write_icmp_error(b, f, l3, my_mac, my_ip, error),
                        })
                    });
                    if sent {
                        stats.icmp_errors_sent.fetch_add(1, Ordering::Relaxed);
                    }
                }
                false
            };
            let got = self.ports[p].recv_ready(batch, p as u16, &mut keep)?;
            if got > 0 {
                self.shared.stats.rx_packets[p].fetch_add(got as u64, Ordering::Relaxed);
            }
            if !self.arp_out[p].is_empty() {
                let (ports, arp_out) = (&mut self.ports, &mut self.arp_out);
                {
                    let mut frames = arp_out[p].iter().map(|(d, _)| d);
                    ports[p].send(&mut frames)?;
                }
                arp_out[p].clear();
            }
        }
        Ok(())
    }
}

impl<P: Port> LiveSource<P> {
    /// Appends the IPv4 frames for the box that are ready now (answering ARP on the way),
    /// without blocking: for a caller that waits on [`LiveSource::fds`] with descriptors of
    /// its own (the cluster's root).
    pub fn recv_ready(&mut self, batch: &mut PacketBatch) -> flowstate_io::Result<usize> {
        let before = batch.len();
        self.receive(batch)?;
        Ok(batch.len() - before)
    }

    /// The ports' addressing (inside, outside).
    pub fn addrs(&self) -> &[PortAddr; 2] {
        &self.addrs
    }

    /// The ports' descriptors that poll readable when frames may be ready.
    pub fn fds(&self) -> impl Iterator<Item = std::os::fd::RawFd> + '_ {
        self.ports.iter().filter_map(|p| p.raw_fd())
    }
}

impl<P: Port> LiveSource<P> {
    /// What is ready within `within` (up to a batch): 0 when nothing came by then, or the
    /// box is stopped.
    pub fn recv_within(
        &mut self,
        batch: &mut PacketBatch,
        within: Duration,
    ) -> flowstate_io::Result<usize> {
        let deadline = Instant::now() + within;
        self.recv_until(batch, Some(deadline))
    }

    fn recv_until(
        &mut self,
        batch: &mut PacketBatch,
        deadline: Option<Instant>,
    ) -> flowstate_io::Result<usize> {
        batch.clear();
        loop {
            if self.stop.stopped() || deadline.is_some_and(|d| Instant::now() >= d) {
                return Ok(0);
            }
            self.receive(batch)?;
            if !batch.is_empty() {
                return Ok(batch.len());
            }
            self.check_interfaces()?;
            let mut raw = [0; 2];
            let mut n = 0;
            for p in &self.ports {
                if let Some(fd) = p.raw_fd() {
                    raw[n] = fd;
                    n += 1;
                }
            }
            let wait = deadline.map_or(self.poll, |d| {
                self.poll.min(d.saturating_duration_since(Instant::now()))
            });
            if n == 0 {
                std::thread::sleep(wait.min(Duration::from_millis(1)));
            } else {
                flowstate_io::afpacket::wait_readable(&raw[..n], wait)?;
            }
        }
    }
}

impl<P: Port> Source for LiveSource<P> {
    /// What is ready (up to a batch) within [`IDLE_TICK`]; 0 when nothing came by then (the
    /// box is idle: [`Source::idle_now`] says so) or the box is stopped (the end).
    fn recv(&mut self, batch: &mut PacketBatch) -> flowstate_io::Result<usize> {
        let n = self.recv_within(batch, IDLE_TICK)?;
        self.idle = n == 0 && !self.stop.stopped();
        Ok(n)
    }

    fn idle_now(&mut self) -> Option<u64> {
        std::mem::take(&mut self.idle).then(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64)
        })
    }
}

/// The sending side of the box: a [`Sink`] over the two ports.
pub struct LiveSink<P: Port> {
    ports: [P; 2],
    addrs: [PortAddr; 2],
    macs: [[u8; 6]; 2],
    inside: Vec<IpNet>,
    shared: Arc<Shared>,
    out: [PacketBatch; 2],
}

impl<P: Port> std::fmt::Debug for LiveSink<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LiveSink")
            .field("addrs", &self.addrs)
            .finish_non_exhaustive()
    }
}

impl<P: Port> LiveSink<P> {
    /// The sink over `ports` (inside, outside); `inside` decides the egress port;
    /// `batch`/`max_frame` size its buffers.
    pub fn new(
        ports: [P; 2],
        addrs: [PortAddr; 2],
        inside: Vec<IpNet>,
        shared: Arc<Shared>,
        batch: usize,
        max_frame: usize,
    ) -> Self {
        let macs = [ports[0].mac(), ports[1].mac()];
        LiveSink {
            ports,
            addrs,
            macs,
            inside,
            shared,
            out: [
                PacketBatch::new(batch.max(1), max_frame),
                PacketBatch::new(batch.max(1), max_frame),
            ],
        }
    }

    fn drain(&mut self, p: usize) -> flowstate_io::Result<()> {
        if self.out[p].is_empty() {
            return Ok(());
        }
        let n = self.out[p].len();
        let sent = {
            let mut frames = self.out[p].iter().map(|(d, _)| d);
            self.ports[p].send(&mut frames)?
        };
        self.shared.stats.tx_packets[p].fetch_add(sent as u64, Ordering::Relaxed);
        if sent < n {
            self.shared
                .stats
                .send_dropped
                .fetch_add((n - sent) as u64, Ordering::Relaxed);
        }
        self.out[p].clear();
        Ok(())
    }

    /// Routes `frame` into its port's out batch (sent by [`LiveSink::flush`] or when the batch
    /// fills): returns that port and the frame as it will leave (next hop's MAC, TTL − 1), or
    /// `None` when it was dropped (counted).
    pub fn forward(&mut self, frame: &[u8]) -> flowstate_io::Result<Option<(usize, &[u8])>> {
        let Some(p) = self.route(frame)? else {
            return Ok(None);
        };
        let out = &self.out[p];
        Ok(out
            .len()
            .checked_sub(1)
            .and_then(|last| out.get(last))
            .map(|(f, _)| (p, f)))
    }

    /// What the sink shares with its source.
    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// Sends what is queued on both ports.
    pub fn flush(&mut self) -> flowstate_io::Result<()> {
        self.drain(0)?;
        self.drain(1)
    }

    /// Routes one frame into its port's out batch; returns that port, or `None` when the frame
    /// was dropped.
    fn route(&mut self, frame: &[u8]) -> flowstate_io::Result<Option<usize>> {
        let stats = &self.shared.stats;
        let Some(Link { tag, ethertype, l3 }) = link(frame) else {
            stats.not_for_us.fetch_add(1, Ordering::Relaxed);
            return Ok(None);
        };
        // The destination, and where the TTL (IPv4) or hop limit (IPv6) is.
        let (dst, ttl_at) = match ethertype {
            ETHERTYPE_IPV4 => (ip4(frame, l3 + 16).map(IpAddr::V4), l3 + 8),
            nd::ETHERTYPE_IPV6 => (nd::ip6(frame, l3 + 24).map(IpAddr::V6), l3 + 7),
            _ => (None, 0),
        };
        let (Some(dst), Some(&ttl)) = (dst, frame.get(ttl_at)) else {
            stats.not_for_us.fetch_add(1, Ordering::Relaxed);
            return Ok(None);
        };
        if ttl <= 1 {
            stats.ttl_expired.fetch_add(1, Ordering::Relaxed);
            return Ok(None);
        }
        let p = if self.inside.iter().any(|i| i.matches(&dst)) {
            usize::from(INSIDE)
        } else {
            usize::from(OUTSIDE)
        };
        let a = self.addrs[p];
        let hop = match dst {
            IpAddr::V4(d) => IpAddr::V4(a.gateway.unwrap_or(d)),
            IpAddr::V6(d) => IpAddr::V6(a.gateway6.unwrap_or(d)),
        };
        let Some(hop_mac) = self.shared.neighbours[p].lookup(hop) else {
            stats.unresolved.fetch_add(1, Ordering::Relaxed);
            if self.shared.neighbours[p].should_ask(hop) {
                if self.out[p].is_full() {
                    self.drain(p)?;
                }
                let (m, a, a6) = (self.macs[p], a.address, a.address6);
                // An ARP request, or a neighbour solicitation from the port's IPv6 address.
                let ask = |b: &mut [u8]| match (hop, a6) {
                    (IpAddr::V4(h), _) => write_arp(b, 1, BROADCAST, m, a, [0; 6], h),
                    (IpAddr::V6(h), Some(mine)) => nd::write_solicitation(b, m, mine, h),
                    (IpAddr::V6(_), None) => 0,
                };
                if self.out[p].push_with(|buf, _| tagged(buf, tag, ask)) {
                    let asked = if hop.is_ipv4() {
                        &self.shared.stats.arp_asked
                    } else {
                        &self.shared.stats.nd_asked
                    };
                    asked.fetch_add(1, Ordering::Relaxed);
                }
            }
            return Ok(None);
        };
        if self.out[p].is_full() {
            self.drain(p)?;
        }
        let my_mac = self.macs[p];
        self.out[p].push_with(|buf, _| {
            let n = frame.len().min(buf.len());
            buf[..n].copy_from_slice(&frame[..n]);
            if n < l3 + 20 {
                return n;
            }
            let mut eth = ethernet::Frame::new_unchecked(&mut buf[..n]);
            eth.set_dst_addr(MacAddr(hop_mac));
            eth.set_src_addr(MacAddr(my_mac));
            // TTL − 1 (RFC 1812 §5.3.1), the checksum updated incrementally (RFC 1624); the
            // hop limit − 1 (RFC 8200 §3: no checksum). A tagged frame keeps its tag.
            if dst.is_ipv4() {
                ipv4::Packet::new_unchecked(&mut buf[l3..n]).set_ttl(ttl - 1);
            } else {
                buf[ttl_at] = ttl - 1;
            }
            n
        });
        Ok(Some(p))
    }
}

/// How long a live box waits for packets before it lets the NFs' timers run anyway
/// ([`Source::idle_now`]).
pub const IDLE_TICK: Duration = Duration::from_millis(100);

impl<P: Port> Sink for LiveSink<P> {
    fn send(&mut self, batch: &PacketBatch) -> flowstate_io::Result<()> {
        for (frame, _) in batch.iter() {
            self.route(frame)?;
        }
        self.flush()
    }
}

/// A fast path and its program on each port (inside, outside).
pub type LoadedFastPath = (Arc<XdpFlowCache>, [Arc<XdpProgram>; 2]);

/// The fast path configured on `inside` (`[input] fast_path`), attached to both ports, unless
/// `why_not` says why it cannot be used (logged). When it cannot be had (no BPF, another
/// XDP program on a port, a build without XDP programs), a fast path asked for with
/// `fast_path = true` is an error; the default one is a warning and the caller runs without.
pub fn attach_fast_path(
    inside: &LivePort,
    outside: &LivePort,
    why_not: Option<&str>,
) -> Result<Option<LoadedFastPath>, flowstate_io::Error> {
    let Some(c) = inside.fast_path else {
        return Ok(None);
    };
    if let Some(why) = why_not {
        tracing::info!("XDP fast path off: {why}");
        return Ok(None);
    }
    let load = || -> Result<_, flowstate_io::Error> {
        let f = Arc::new(XdpFlowCache::new(c.capacity, c.refresh)?);
        let programs = [
            f.attach(&inside.interface, 1)?,
            f.attach(&outside.interface, 1)?,
        ];
        Ok((f, programs))
    };
    match load() {
        Ok(loaded) => {
            tracing::info!(refresh = ?c.refresh, capacity = c.capacity, "XDP fast path on");
            Ok(Some(loaded))
        }
        Err(e) if !c.required => {
            tracing::warn!(error = %e, "XDP fast path off: it could not be loaded or attached");
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;
    use std::sync::Mutex;

    /// A port fed from a queue; what it sends is recorded.
    struct FakePort {
        mac: [u8; 6],
        rx: VecDeque<Vec<u8>>,
        tx: Arc<Mutex<Vec<Vec<u8>>>>,
    }

    impl Port for FakePort {
        fn mac(&self) -> [u8; 6] {
            self.mac
        }
        fn recv_ready(
            &mut self,
            batch: &mut PacketBatch,
            port: u16,
            keep: &mut dyn FnMut(&[u8]) -> bool,
        ) -> flowstate_io::Result<usize> {
            let mut n = 0;
            while !batch.is_full() {
                let Some(f) = self.rx.pop_front() else { break };
                if keep(&f) {
                    batch.push(
                        &f,
                        flowstate_io::PacketMeta {
                            port,
                            ..Default::default()
                        },
                    );
                    n += 1;
                }
            }
            Ok(n)
        }
        fn send(&mut self, frames: &mut dyn Iterator<Item = &[u8]>) -> flowstate_io::Result<usize> {
            let mut t = self.tx.lock().unwrap();
            let mut n = 0;
            for f in frames {
                t.push(f.to_vec());
                n += 1;
            }
            Ok(n)
        }
        fn raw_fd(&self) -> Option<std::os::fd::RawFd> {
            None
        }
    }

    const BOX_IN: [u8; 6] = [2, 0, 0, 0, 0, 1];
    const BOX_OUT: [u8; 6] = [2, 0, 0, 0, 0, 2];
    const CLIENT: [u8; 6] = [2, 0, 0, 0, 0, 0xc];
    const SERVER: [u8; 6] = [2, 0, 0, 0, 0, 0x5];

    fn addrs() -> [PortAddr; 2] {
        [
            PortAddr {
                address: "10.0.0.1".parse().unwrap(),
                gateway: None,
                address6: None,
                gateway6: None,
                mtu: 1500,
            },
            PortAddr {
                address: "198.51.100.1".parse().unwrap(),
                gateway: None,
                address6: None,
                gateway6: None,
                mtu: 1500,
            },
        ]
    }

    fn arp_request(sha: [u8; 6], spa: &str, tpa: &str) -> Vec<u8> {
        let mut b = vec![0; 60];
        let n = write_arp(
            &mut b,
            1,
            BROADCAST,
            sha,
            spa.parse().unwrap(),
            [0; 6],
            tpa.parse().unwrap(),
        );
        b.truncate(n.max(60));
        b
    }

    fn ipv4(dst_mac: [u8; 6], src_mac: [u8; 6], src: &str, dst: &str, ttl: u8) -> Vec<u8> {
        let mut f = vec![0u8; ETH_HLEN + 28];
        f[0..6].copy_from_slice(&dst_mac);
        f[6..12].copy_from_slice(&src_mac);
        f[12..14].copy_from_slice(&ETHERTYPE_IPV4.to_be_bytes());
        let ip = &mut f[ETH_HLEN..];
        ip[0] = 0x45;
        ip[2..4].copy_from_slice(&28u16.to_be_bytes());
        ip[8] = ttl;
        ip[9] = 17;
        ip[12..16].copy_from_slice(&src.parse::<Ipv4Addr>().unwrap().octets());
        ip[16..20].copy_from_slice(&dst.parse::<Ipv4Addr>().unwrap().octets());
        let c = flowstate_wire::checksum::checksum(&ip[..20]);
        ip[10..12].copy_from_slice(&c.to_be_bytes());
        f
    }

    type Sent = Arc<Mutex<Vec<Vec<u8>>>>;

    fn ports(rx_in: Vec<Vec<u8>>, rx_out: Vec<Vec<u8>>) -> ([FakePort; 2], [Sent; 2]) {
        let t = [Arc::default(), Arc::default()];
        (
            [
                FakePort {
                    mac: BOX_IN,
                    rx: rx_in.into(),
                    tx: Arc::clone(&t[0]),
                },
                FakePort {
                    mac: BOX_OUT,
                    rx: rx_out.into(),
                    tx: Arc::clone(&t[1]),
                },
            ],
            t,
        )
    }

    #[test]
    fn answers_arp_for_its_addresses_only_and_learns_neighbours() {
        let (p, tx) = ports(
            vec![
                arp_request(CLIENT, "10.0.0.2", "10.0.0.1"),
                arp_request(CLIENT, "10.0.0.2", "10.0.0.77"),
            ],
            vec![ipv4(BOX_OUT, SERVER, "198.51.100.2", "198.51.100.1", 64)],
        );
        let shared = Arc::new(Shared::default());
        let stop = Stop::new();
        let mut src = LiveSource::new(p, addrs(), Arc::clone(&shared), stop.clone());
        let mut b = PacketBatch::new(32, 2048);
        assert_eq!(src.recv(&mut b).unwrap(), 1, "the IPv4 frame goes on");
        assert_eq!(b.get(0).unwrap().1.port, OUTSIDE);
        let replies = tx[0].lock().unwrap().clone();
        assert_eq!(replies.len(), 1, "one request was for the box");
        let r = &replies[0];
        assert_eq!(&r[0..6], &CLIENT);
        assert_eq!(be16(r, ETH_HLEN + 6), Some(2));
        assert_eq!(mac(r, ETH_HLEN + 8), Some(BOX_IN));
        assert_eq!(ip4(r, ETH_HLEN + 14), Some("10.0.0.1".parse().unwrap()));
        assert_eq!(ip4(r, ETH_HLEN + 24), Some("10.0.0.2".parse().unwrap()));
        assert_eq!(
            shared.neighbours[0].lookup("10.0.0.2".parse::<Ipv4Addr>().unwrap()),
            Some(CLIENT)
        );
        assert_eq!(
            shared.neighbours[1].lookup("198.51.100.2".parse::<Ipv4Addr>().unwrap()),
            Some(SERVER)
        );
        assert_eq!(
            shared.neighbours[1].lookup("10.0.0.2".parse::<Ipv4Addr>().unwrap()),
            None
        );
        stop.stop();
        assert_eq!(src.recv(&mut b).unwrap(), 0, "stopped: end of input");
    }

    /// An IPv6 UDP frame.
    fn ipv6(dst_mac: [u8; 6], src_mac: [u8; 6], src: &str, dst: &str, hop: u8) -> Vec<u8> {
        let mut f = vec![0u8; ETH_HLEN + 48];
        f[0..6].copy_from_slice(&dst_mac);
        f[6..12].copy_from_slice(&src_mac);
        f[12..14].copy_from_slice(&nd::ETHERTYPE_IPV6.to_be_bytes());
        let ip = &mut f[ETH_HLEN..];
        ip[0] = 0x60;
        ip[5] = 8;
        ip[6] = 17;
        ip[7] = hop;
        ip[8..24].copy_from_slice(&src.parse::<Ipv6Addr>().unwrap().octets());
        ip[24..40].copy_from_slice(&dst.parse::<Ipv6Addr>().unwrap().octets());
        f
    }

    /// IPv6 (RFC 4861, RFC 4443): the box answers neighbour solicitations for its address,
    /// learns its neighbours, answers an expiring packet with time exceeded, routes by the
    /// inside prefixes with the hop limit decremented, and solicits an unknown next hop.
    #[test]
    fn ipv6_is_answered_routed_and_solicited() {
        let mut a = addrs();
        a[0].address6 = Some("fd00:1::1".parse().unwrap());
        a[1].address6 = Some("fd00:2::1".parse().unwrap());
        let mut ns = [0u8; 128];
        let n = nd::write_solicitation(
            &mut ns,
            CLIENT,
            "fd00:1::2".parse().unwrap(),
            "fd00:1::1".parse().unwrap(),
        );
        let (p, tx) = ports(
            vec![
                ns[..n].to_vec(),
                ipv6(BOX_IN, CLIENT, "fd00:1::2", "fd00:2::2", 1),
                ipv6(BOX_IN, CLIENT, "fd00:1::2", "fd00:2::2", 64),
            ],
            vec![],
        );
        let shared = Arc::new(Shared::default());
        let mut src = LiveSource::new(p, a, Arc::clone(&shared), Stop::new());
        let mut b = PacketBatch::new(32, 2048);
        assert_eq!(src.recv(&mut b).unwrap(), 1, "the live IPv6 frame goes on");
        let answers = tx[0].lock().unwrap().clone();
        assert_eq!(answers.len(), 2, "{answers:?}");
        assert_eq!(answers[0][ETH_HLEN + 40], 136, "a neighbour advertisement");
        assert_eq!(answers[1][ETH_HLEN + 40], icmp::v6::types::TIME_EXCEEDED);
        let client: Ipv6Addr = "fd00:1::2".parse().unwrap();
        assert_eq!(shared.neighbours[0].lookup(client), Some(CLIENT));

        let (p, tx) = ports(vec![], vec![]);
        let inside = vec!["fd00:1::/64".parse().unwrap()];
        let mut sink = LiveSink::new(p, a, inside, Arc::clone(&shared), 32, 2048);
        let fwd = b.get(0).unwrap().0.to_vec();
        b.clear();
        b.push(&fwd, Default::default());
        sink.send(&b).unwrap();
        let asked = tx[1].lock().unwrap().clone();
        assert_eq!(asked.len(), 1, "a solicitation instead");
        assert_eq!(&asked[0][0..6], &[0x33, 0x33, 0xff, 0, 0, 2]);
        assert_eq!(shared.stats.nd_asked.load(Ordering::Relaxed), 1);
        shared.neighbours[1].learn("fd00:2::2".parse::<Ipv6Addr>().unwrap(), SERVER);
        b.clear();
        b.push(&fwd, Default::default());
        b.push(
            &ipv6(BOX_OUT, SERVER, "fd00:2::2", "fd00:1::2", 64),
            Default::default(),
        );
        sink.send(&b).unwrap();
        let o = tx[1].lock().unwrap()[1].clone();
        assert_eq!((&o[0..6], &o[6..12]), (&SERVER[..], &BOX_OUT[..]));
        assert_eq!(o[ETH_HLEN + 7], 63, "hop limit decremented");
        let i = tx[0].lock().unwrap().clone();
        assert_eq!(i.len(), 1, "back inside by the prefix");
        assert_eq!(&i[0][0..6], &CLIENT);
    }

    /// `f` with 802.1Q tag `tci` after its MAC addresses.
    fn tag(f: &[u8], tci: u16) -> Vec<u8> {
        let mut t = f[..12].to_vec();
        t.extend_from_slice(&ETHERTYPE_VLAN.to_be_bytes());
        t.extend_from_slice(&tci.to_be_bytes());
        t.extend_from_slice(&f[12..]);
        t
    }

    /// Tagged frames (IEEE 802.1Q): ARP is answered in the requester's VLAN, an expired packet
    /// with a time exceeded in its VLAN, and a routed packet leaves with its tag, its TTL
    /// decremented in the header after the tag.
    #[test]
    fn tagged_frames_are_answered_and_routed_in_their_vlan() {
        let (p, tx) = ports(
            vec![
                tag(&arp_request(CLIENT, "10.0.0.2", "10.0.0.1"), 100),
                tag(&ipv4(BOX_IN, CLIENT, "10.0.0.2", "198.51.100.2", 1), 100),
                tag(&ipv4(BOX_IN, CLIENT, "10.0.0.2", "198.51.100.2", 64), 100),
            ],
            vec![],
        );
        let shared = Arc::new(Shared::default());
        let mut src = LiveSource::new(p, addrs(), Arc::clone(&shared), Stop::new());
        let mut b = PacketBatch::new(32, 2048);
        assert_eq!(src.recv(&mut b).unwrap(), 1, "the live IPv4 frame goes on");
        let answers = tx[0].lock().unwrap().clone();
        assert_eq!(answers.len(), 2, "{answers:?}");
        for a in &answers {
            assert_eq!(&a[0..6], &CLIENT);
            assert_eq!(be16(a, 12), Some(ETHERTYPE_VLAN));
            assert_eq!(be16(a, 14), Some(100));
        }
        let (arp, icmp) = (&answers[0], &answers[1]);
        assert_eq!(be16(arp, 16), Some(ETHERTYPE_ARP));
        assert_eq!(be16(arp, 18 + 6), Some(2));
        assert_eq!(ip4(arp, 18 + 14), Some("10.0.0.1".parse().unwrap()));
        assert_eq!(be16(icmp, 16), Some(ETHERTYPE_IPV4));
        assert_eq!(icmp[18 + 20], icmp::v4::types::TIME_EXCEEDED);
        assert_eq!(ip4(icmp, 18 + 16), Some("10.0.0.2".parse().unwrap()));

        let (p, tx) = ports(vec![], vec![]);
        let mut sink = LiveSink::new(p, addrs(), vec![], Arc::clone(&shared), 32, 2048);
        shared.neighbours[1].learn("198.51.100.2".parse::<Ipv4Addr>().unwrap(), SERVER);
        let fwd = b.get(0).unwrap().0.to_vec();
        b.clear();
        b.push(&fwd, Default::default());
        // And one to an unknown neighbour: the ARP request goes in the frame's VLAN.
        b.push(
            &tag(&ipv4(BOX_IN, CLIENT, "10.0.0.2", "198.51.100.9", 64), 7),
            Default::default(),
        );
        sink.send(&b).unwrap();
        let out = tx[1].lock().unwrap().clone();
        assert_eq!(out.len(), 2, "{out:?}");
        let o = &out[0];
        assert_eq!((&o[0..6], &o[6..12]), (&SERVER[..], &BOX_OUT[..]));
        assert_eq!(
            (be16(o, 12), be16(o, 14)),
            (Some(ETHERTYPE_VLAN), Some(100))
        );
        assert_eq!(o[18 + 8], 63, "TTL decremented");
        assert_eq!(flowstate_wire::checksum::checksum(&o[18..38]), 0);
        let ask = &out[1];
        assert_eq!(&ask[0..6], &BROADCAST);
        assert_eq!(
            (be16(ask, 14), be16(ask, 16)),
            (Some(7), Some(ETHERTYPE_ARP))
        );
        assert_eq!(ip4(ask, 18 + 24), Some("198.51.100.9".parse().unwrap()));
    }

    /// The box answers what it cannot forward (RFC 1812 §5.3.1, RFC 1191): time exceeded for
    /// a TTL of 1, fragmentation needed (with the next port's MTU) for a DF packet too big,
    /// from its own address on the receiving port, quoting the packet; never an ICMP error
    /// about an ICMP error, and nothing for a DF-less packet too big (dropped, counted).
    #[test]
    fn answers_expired_and_too_big_packets_with_icmp_errors() {
        let big = |df: bool| {
            let mut f = ipv4(BOX_IN, CLIENT, "10.0.0.2", "198.51.100.2", 64);
            f.resize(ETH_HLEN + 1400, 0xab);
            let ip = &mut f[ETH_HLEN..];
            ip[2..4].copy_from_slice(&1400u16.to_be_bytes());
            ip[6] = if df { 0x40 } else { 0 };
            ip[10..12].copy_from_slice(&[0, 0]);
            let c = flowstate_wire::checksum::checksum(&ip[..20]);
            ip[10..12].copy_from_slice(&c.to_be_bytes());
            f
        };
        let expired = ipv4(BOX_IN, CLIENT, "10.0.0.2", "198.51.100.2", 1);
        let mut icmp_error = ipv4(BOX_IN, CLIENT, "10.0.0.2", "198.51.100.2", 1);
        icmp_error[ETH_HLEN + 9] = 1; // ICMP ...
        icmp_error[ETH_HLEN + 20] = 3; // ... destination unreachable
        let fine = ipv4(BOX_IN, CLIENT, "10.0.0.2", "198.51.100.2", 64);
        let (p, tx) = ports(
            vec![expired.clone(), big(true), big(false), icmp_error, fine],
            vec![],
        );
        let shared = Arc::new(Shared::default());
        let mut a = addrs();
        a[1].mtu = 1280;
        let mut src = LiveSource::new(p, a, Arc::clone(&shared), Stop::new());
        let mut b = PacketBatch::new(32, 2048);
        assert_eq!(src.recv(&mut b).unwrap(), 1, "only the last one goes on");
        let stats = &shared.stats;
        assert_eq!(stats.ttl_expired.load(Ordering::Relaxed), 2);
        assert_eq!(stats.too_big.load(Ordering::Relaxed), 2);
        assert_eq!(stats.icmp_errors_sent.load(Ordering::Relaxed), 2);
        let sent = tx[0].lock().unwrap().clone();
        assert_eq!(sent.len(), 2, "two errors, back out of the inside port");
        for (e, (kind, code, quoted)) in sent.iter().zip([(11, 0, &expired), (3, 4, &big(true))]) {
            assert_eq!((&e[0..6], &e[6..12]), (&CLIENT[..], &BOX_IN[..]));
            let ip = &e[ETH_HLEN..];
            assert_eq!(
                flowstate_wire::checksum::checksum(&ip[..20]),
                0,
                "IPv4 checksum"
            );
            assert_eq!(ip4(e, ETH_HLEN + 12), Some("10.0.0.1".parse().unwrap()));
            assert_eq!(ip4(e, ETH_HLEN + 16), Some("10.0.0.2".parse().unwrap()));
            assert_eq!(usize::from(u16::from_be_bytes([ip[2], ip[3]])), ip.len());
            let icmp = &ip[20..];
            assert_eq!(flowstate_wire::checksum::checksum(icmp), 0, "ICMP checksum");
            assert_eq!((icmp[0], icmp[1]), (kind, code));
            let q = &quoted[ETH_HLEN..];
            let n = q.len().min(548);
            assert_eq!(&icmp[8..], &q[..n], "the packet, up to 576 bytes in all");
            if kind == 3 {
                assert_eq!(u16::from_be_bytes([icmp[6], icmp[7]]), 1280, "next-hop MTU");
            }
        }
    }

    #[test]
    fn drops_frames_not_for_the_box() {
        let (p, _tx) = ports(
            vec![
                ipv4(SERVER, CLIENT, "10.0.0.2", "198.51.100.2", 64), // another host's MAC
                vec![1, 2, 3],                                        // runt
                {
                    let mut f = ipv4(BOX_IN, CLIENT, "10.0.0.2", "198.51.100.2", 64);
                    f[12..14].copy_from_slice(&0x86ddu16.to_be_bytes()); // IPv6
                    f
                },
                ipv4(BOX_IN, CLIENT, "10.0.0.2", "198.51.100.2", 64),
            ],
            vec![],
        );
        let shared = Arc::new(Shared::default());
        let mut src = LiveSource::new(p, addrs(), Arc::clone(&shared), Stop::new());
        let mut b = PacketBatch::new(32, 2048);
        assert_eq!(src.recv(&mut b).unwrap(), 1);
        assert_eq!(shared.stats.not_for_us.load(Ordering::Relaxed), 3);
    }

    #[test]
    fn routes_rewrites_and_asks_for_unknown_neighbours() {
        let (p, tx) = ports(vec![], vec![]);
        let shared = Arc::new(Shared::default());
        let mut sink = LiveSink::new(
            p,
            addrs(),
            vec!["10.0.0.0/24".parse().unwrap()],
            Arc::clone(&shared),
            32,
            2048,
        );
        let mut b = PacketBatch::new(8, 2048);
        let out = ipv4(BOX_IN, CLIENT, "198.51.100.1", "198.51.100.2", 64);
        b.push(&out, Default::default());
        sink.send(&b).unwrap();
        // Unknown server: an ARP request instead, the packet dropped.
        let sent = tx[1].lock().unwrap().clone();
        assert_eq!(sent.len(), 1);
        assert_eq!(&sent[0][0..6], &BROADCAST);
        assert_eq!(
            ip4(&sent[0], ETH_HLEN + 24),
            Some("198.51.100.2".parse().unwrap())
        );
        assert_eq!(shared.stats.unresolved.load(Ordering::Relaxed), 1);
        // Asked once: the next miss does not ask again right away.
        sink.send(&b).unwrap();
        assert_eq!(tx[1].lock().unwrap().len(), 1);

        shared.neighbours[1].learn("198.51.100.2".parse::<Ipv4Addr>().unwrap(), SERVER);
        shared.neighbours[0].learn("10.0.0.2".parse::<Ipv4Addr>().unwrap(), CLIENT);
        b.clear();
        b.push(&out, Default::default());
        b.push(
            &ipv4(BOX_OUT, SERVER, "198.51.100.2", "10.0.0.2", 64),
            Default::default(),
        );
        b.push(
            &ipv4(BOX_OUT, SERVER, "198.51.100.2", "10.0.0.2", 1),
            Default::default(),
        );
        sink.send(&b).unwrap();
        let o = tx[1].lock().unwrap()[1].clone();
        assert_eq!((&o[0..6], &o[6..12]), (&SERVER[..], &BOX_OUT[..]));
        assert_eq!(o[ETH_HLEN + 8], 63, "TTL decremented");
        assert_eq!(
            flowstate_wire::checksum::checksum(&o[ETH_HLEN..ETH_HLEN + 20]),
            0,
            "header checksum still right"
        );
        let i = tx[0].lock().unwrap().clone();
        assert_eq!(i.len(), 1, "inbound to the client; the TTL-1 one dropped");
        assert_eq!((&i[0][0..6], &i[0][6..12]), (&CLIENT[..], &BOX_IN[..]));
        assert_eq!(shared.stats.ttl_expired.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn a_gateway_is_the_next_hop() {
        let (p, tx) = ports(vec![], vec![]);
        let shared = Arc::new(Shared::default());
        let mut a = addrs();
        a[1].gateway = Some("198.51.100.254".parse().unwrap());
        shared.neighbours[1].learn("198.51.100.254".parse::<Ipv4Addr>().unwrap(), SERVER);
        let mut sink = LiveSink::new(p, a, vec![], Arc::clone(&shared), 32, 2048);
        let mut b = PacketBatch::new(8, 2048);
        b.push(
            &ipv4(BOX_IN, CLIENT, "10.0.0.2", "192.0.2.9", 64),
            Default::default(),
        );
        sink.send(&b).unwrap();
        assert_eq!(&tx[1].lock().unwrap()[0][0..6], &SERVER);
    }
}
