//! Writing complete, checksum-correct Ethernet II frames into caller-owned buffers.
//!
//! A [`FrameSpec`] names every layer of one frame: [`EthernetSpec`] (MACs, an optional 802.1Q
//! tag), [`IpSpec`] (IPv4 or IPv6), [`L4Spec`] (TCP with options, UDP, or an ICMP/ICMPv6 echo)
//! and a [`Payload`]. [`FrameSpec::write`] writes it into a `&mut [u8]` and returns the frame's
//! length, or a [`BuildError`] when the buffer is too small or the packet too long for its
//! length fields. It never panics and never allocates.
//!
//! Checksums are computed as the packet is written: the IPv4 header checksum (RFC 791), the TCP
//! and UDP checksums over the pseudo-header (RFC 9293 §3.1, RFC 768; RFC 8200 §8.1 for IPv6),
//! and the ICMP (RFC 792) and ICMPv6 (RFC 4443 §2.3) checksums. A UDP checksum that computes
//! to zero is sent as `0xffff` (RFC 768).
//!
//! The bytes are written at fixed offsets with [`crate::checksum`]; this module does not use the
//! parsing views, so the two can be tested against each other.
//!
//! ```
//! use flowstate_wire::build::*;
//! use std::net::Ipv4Addr;
//!
//! let spec = FrameSpec {
//!     ethernet: EthernetSpec::new([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2]),
//!     ip: IpSpec::V4(Ipv4Spec::new(Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(198, 51, 100, 1))),
//!     l4: L4Spec::Udp(UdpSpec { src_port: 40000, dst_port: 53 }),
//!     payload: Payload::Fill { len: 20, byte: 0 },
//!     min_len: ETHERNET_MIN_LEN,
//! };
//! let mut buf = [0u8; 128];
//! assert_eq!(spec.write(&mut buf), Ok(14 + 20 + 8 + 20));
//! ```

use crate::checksum;
use crate::flow::{proto, FlowKey};
use core::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// EtherType of IPv4.
pub const ETHERTYPE_IPV4: u16 = 0x0800;
/// EtherType of IPv6.
pub const ETHERTYPE_IPV6: u16 = 0x86dd;
/// Tag protocol identifier of an IEEE 802.1Q VLAN tag.
pub const ETHERTYPE_VLAN: u16 = 0x8100;
/// Shortest Ethernet frame without its 4-byte FCS (64 bytes on the wire, IEEE 802.3 §4.4.2).
pub const ETHERNET_MIN_LEN: usize = 60;
/// Length of an untagged Ethernet II header.
pub const ETHERNET_HEADER_LEN: usize = 14;
/// Length of an IPv4 header without options.
pub const IPV4_HEADER_LEN: usize = 20;
/// Length of the fixed IPv6 header.
pub const IPV6_HEADER_LEN: usize = 40;
/// Length of a TCP header without options.
pub const TCP_HEADER_LEN: usize = 20;
/// Length of a UDP header.
pub const UDP_HEADER_LEN: usize = 8;
/// Length of an ICMP/ICMPv6 echo header (type, code, checksum, identifier, sequence).
pub const ECHO_HEADER_LEN: usize = 8;

/// TCP header flag bits (RFC 9293 §3.1, RFC 3168 for ECE/CWR), for [`TcpSpec::flags`].
pub mod tcp_flags {
    /// No more data from sender.
    pub const FIN: u8 = 0x01;
    /// Synchronize sequence numbers.
    pub const SYN: u8 = 0x02;
    /// Reset the connection.
    pub const RST: u8 = 0x04;
    /// Push function.
    pub const PSH: u8 = 0x08;
    /// The acknowledgment field is significant.
    pub const ACK: u8 = 0x10;
    /// The urgent pointer field is significant.
    pub const URG: u8 = 0x20;
    /// ECN-Echo.
    pub const ECE: u8 = 0x40;
    /// Congestion window reduced.
    pub const CWR: u8 = 0x80;
}

/// Why a frame could not be written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BuildError {
    /// The buffer is shorter than the frame; nothing meaningful was written.
    BufferTooSmall {
        /// Bytes the frame needs.
        needed: usize,
        /// Bytes the buffer has.
        available: usize,
    },
    /// The IP packet would be longer than its 16-bit length field allows (IPv4 total length,
    /// IPv6 payload length or UDP length above 65535).
    TooLong {
        /// The length that did not fit.
        len: usize,
    },
}

impl fmt::Display for BuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BuildError::BufferTooSmall { needed, available } => {
                write!(f, "frame needs {needed} bytes, buffer has {available}")
            }
            BuildError::TooLong { len } => {
                write!(f, "IP length {len} does not fit its 16-bit field")
            }
        }
    }
}

impl std::error::Error for BuildError {}

/// The Ethernet II header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EthernetSpec {
    /// Source MAC address.
    pub src: [u8; 6],
    /// Destination MAC address.
    pub dst: [u8; 6],
    /// An 802.1Q tag's Tag Control Information (priority in the top 3 bits, DEI, then the VLAN
    /// id in the low 12 bits); `None` for an untagged frame.
    pub vlan: Option<u16>,
}

impl EthernetSpec {
    /// An untagged header from `src` to `dst`.
    pub const fn new(src: [u8; 6], dst: [u8; 6]) -> Self {
        EthernetSpec {
            src,
            dst,
            vlan: None,
        }
    }

    /// Header length: 14, or 18 with a VLAN tag.
    pub const fn header_len(&self) -> usize {
        if self.vlan.is_some() {
            ETHERNET_HEADER_LEN + 4
        } else {
            ETHERNET_HEADER_LEN
        }
    }
}

/// An IPv4 header without options (RFC 791). The total length, protocol and header checksum
/// are filled in by [`FrameSpec::write`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ipv4Spec {
    /// Source address.
    pub src: Ipv4Addr,
    /// Destination address.
    pub dst: Ipv4Addr,
    /// Time to live.
    pub ttl: u8,
    /// Identification.
    pub id: u16,
    /// The Don't Fragment flag.
    pub dont_fragment: bool,
    /// The former type-of-service byte: DSCP (top 6 bits) and ECN (low 2 bits).
    pub tos: u8,
}

impl Ipv4Spec {
    /// A header from `src` to `dst` with TTL 64, identification 0, DF set and TOS 0.
    pub const fn new(src: Ipv4Addr, dst: Ipv4Addr) -> Self {
        Ipv4Spec {
            src,
            dst,
            ttl: 64,
            id: 0,
            dont_fragment: true,
            tos: 0,
        }
    }
}

/// The fixed IPv6 header, with no extension headers (RFC 8200 §3). The payload length and next
/// header are filled in by [`FrameSpec::write`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ipv6Spec {
    /// Source address.
    pub src: Ipv6Addr,
    /// Destination address.
    pub dst: Ipv6Addr,
    /// Hop limit.
    pub hop_limit: u8,
    /// Flow label (RFC 6437); only the low 20 bits are used.
    pub flow_label: u32,
    /// Traffic class: DSCP and ECN.
    pub traffic_class: u8,
}

impl Ipv6Spec {
    /// A header from `src` to `dst` with hop limit 64, flow label 0 and traffic class 0.
    pub const fn new(src: Ipv6Addr, dst: Ipv6Addr) -> Self {
        Ipv6Spec {
            src,
            dst,
            hop_limit: 64,
            flow_label: 0,
            traffic_class: 0,
        }
    }
}

/// The network layer of a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IpSpec {
    /// IPv4.
    V4(Ipv4Spec),
    /// IPv6.
    V6(Ipv6Spec),
}

impl IpSpec {
    /// Header length: 20 for IPv4, 40 for IPv6.
    pub const fn header_len(&self) -> usize {
        match self {
            IpSpec::V4(_) => IPV4_HEADER_LEN,
            IpSpec::V6(_) => IPV6_HEADER_LEN,
        }
    }

    /// Source address.
    pub fn src(&self) -> IpAddr {
        match self {
            IpSpec::V4(h) => IpAddr::V4(h.src),
            IpSpec::V6(h) => IpAddr::V6(h.src),
        }
    }

    /// Destination address.
    pub fn dst(&self) -> IpAddr {
        match self {
            IpSpec::V4(h) => IpAddr::V4(h.dst),
            IpSpec::V6(h) => IpAddr::V6(h.dst),
        }
    }
}

/// The TCP options this builder writes, in the order and with the padding Linux uses in a SYN
/// (MSS, SACK-permitted, timestamps, NOP, window scale; RFC 9293 §3.2, RFC 2018, RFC 7323).
/// Every combination is a multiple of 4 bytes, so no end-of-list padding is needed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TcpOptions {
    /// Maximum segment size (kind 2), sent in SYN segments.
    pub mss: Option<u16>,
    /// Window scale shift count (kind 3), sent in SYN segments.
    pub window_scale: Option<u8>,
    /// SACK permitted (kind 4), sent in SYN segments.
    pub sack_permitted: bool,
    /// Timestamps (kind 8): `(TSval, TSecr)`. Once negotiated, sent in every segment.
    pub timestamps: Option<(u32, u32)>,
}

impl TcpOptions {
    /// No options.
    pub const NONE: TcpOptions = TcpOptions {
        mss: None,
        window_scale: None,
        sack_permitted: false,
        timestamps: None,
    };

    /// Bytes the options take (0 to 20, a multiple of 4).
    pub const fn len(&self) -> usize {
        let mut n = 0;
        if self.mss.is_some() {
            n += 4;
        }
        if self.timestamps.is_some() {
            // NOP NOP TS, or SACK-permitted in place of the two NOPs.
            n += 12;
        } else if self.sack_permitted {
            n += 4;
        }
        if self.window_scale.is_some() {
            n += 4;
        }
        n
    }

    /// Whether no option is set.
    pub const fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Writes the options into `out`, which must be exactly [`len`](Self::len) bytes.
    fn write(&self, out: &mut [u8]) {
        let mut i = 0;
        if let Some(mss) = self.mss {
            out[i..i + 4].copy_from_slice(&[2, 4, (mss >> 8) as u8, mss as u8]);
            i += 4;
        }
        match (self.sack_permitted, self.timestamps) {
            (sack, Some((val, ecr))) => {
                let head = if sack { [4, 2] } else { [1, 1] };
                out[i..i + 2].copy_from_slice(&head);
                out[i + 2] = 8;
                out[i + 3] = 10;
                out[i + 4..i + 8].copy_from_slice(&val.to_be_bytes());
                out[i + 8..i + 12].copy_from_slice(&ecr.to_be_bytes());
                i += 12;
            }
            (true, None) => {
                out[i..i + 4].copy_from_slice(&[1, 1, 4, 2]);
                i += 4;
            }
            (false, None) => {}
        }
        if let Some(shift) = self.window_scale {
            out[i..i + 4].copy_from_slice(&[1, 3, 3, shift]);
        }
    }
}

/// A TCP header (RFC 9293 §3.1). The data offset and checksum are filled in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcpSpec {
    /// Source port.
    pub src_port: u16,
    /// Destination port.
    pub dst_port: u16,
    /// Sequence number.
    pub seq: u32,
    /// Acknowledgment number.
    pub ack: u32,
    /// Flags, an OR of [`tcp_flags`].
    pub flags: u8,
    /// Receive window (scaled by the negotiated shift, except in SYN segments).
    pub window: u16,
    /// Urgent pointer.
    pub urgent: u16,
    /// Options.
    pub options: TcpOptions,
}

/// A UDP header (RFC 768). Length and checksum are filled in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdpSpec {
    /// Source port.
    pub src_port: u16,
    /// Destination port.
    pub dst_port: u16,
}

/// An ICMP echo request or reply (RFC 792), or ICMPv6 echo (RFC 4443 §4) when the network
/// layer is IPv6.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EchoSpec {
    /// A reply (type 0 / 129) rather than a request (type 8 / 128).
    pub reply: bool,
    /// Identifier.
    pub id: u16,
    /// Sequence number.
    pub seq: u16,
}

impl EchoSpec {
    /// The ICMP type this echo has over IPv4 (`v6 == false`) or IPv6.
    pub const fn icmp_type(&self, v6: bool) -> u8 {
        match (v6, self.reply) {
            (false, false) => 8,
            (false, true) => 0,
            (true, false) => 128,
            (true, true) => 129,
        }
    }
}

/// The transport layer of a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum L4Spec {
    /// TCP.
    Tcp(TcpSpec),
    /// UDP.
    Udp(UdpSpec),
    /// ICMP echo (ICMPv6 echo over IPv6).
    Echo(EchoSpec),
}

impl L4Spec {
    /// Header length, TCP options included.
    pub const fn header_len(&self) -> usize {
        match self {
            L4Spec::Tcp(t) => TCP_HEADER_LEN + t.options.len(),
            L4Spec::Udp(_) => UDP_HEADER_LEN,
            L4Spec::Echo(_) => ECHO_HEADER_LEN,
        }
    }
}

/// The bytes after the transport header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Payload<'a> {
    /// These bytes.
    Bytes(&'a [u8]),
    /// `len` copies of `byte`.
    Fill {
        /// Number of bytes.
        len: usize,
        /// The byte.
        byte: u8,
    },
    /// `len` bytes counting up from `start`, wrapping at 256: byte `i` is `start + i` (mod 256).
    Counter {
        /// Number of bytes.
        len: usize,
        /// The first byte.
        start: u8,
    },
}

impl Payload<'_> {
    /// No payload.
    pub const EMPTY: Payload<'static> = Payload::Bytes(&[]);

    /// Number of payload bytes.
    pub const fn len(&self) -> usize {
        match self {
            Payload::Bytes(b) => b.len(),
            Payload::Fill { len, .. } | Payload::Counter { len, .. } => *len,
        }
    }

    /// Whether the payload is empty.
    pub const fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Writes the payload into `out`, which must be exactly [`len`](Self::len) bytes.
    fn write(&self, out: &mut [u8]) {
        match *self {
            Payload::Bytes(b) => out.copy_from_slice(b),
            Payload::Fill { byte, .. } => out.fill(byte),
            Payload::Counter { start, .. } => {
                let mut b = start;
                for o in out {
                    *o = b;
                    b = b.wrapping_add(1);
                }
            }
        }
    }
}

/// One complete frame: every header and the payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameSpec<'a> {
    /// The Ethernet header.
    pub ethernet: EthernetSpec,
    /// The IP header.
    pub ip: IpSpec,
    /// The transport header.
    pub l4: L4Spec,
    /// The transport payload.
    pub payload: Payload<'a>,
    /// Zero bytes are appended after the IP packet until the frame is this long, as a NIC pads
    /// short frames: [`ETHERNET_MIN_LEN`] for frames as they arrive from the wire, 0 for none.
    /// The padding is not part of the IP packet (its length fields exclude it).
    pub min_len: usize,
}

impl FrameSpec<'_> {
    /// Length of every header: Ethernet, IP and transport (with TCP options).
    pub const fn header_len(&self) -> usize {
        self.ethernet.header_len() + self.ip.header_len() + self.l4.header_len()
    }

    /// Length of the frame [`write`](Self::write) produces, padding included.
    pub const fn frame_len(&self) -> usize {
        let n = self.header_len() + self.payload.len();
        if n < self.min_len {
            self.min_len
        } else {
            n
        }
    }

    /// The frame's flow key, in its direction. For an echo both ports are the identifier (see
    /// [`FlowKey`]).
    pub fn flow_key(&self) -> FlowKey {
        let v6 = matches!(self.ip, IpSpec::V6(_));
        let (src_port, dst_port, protocol) = match self.l4 {
            L4Spec::Tcp(t) => (t.src_port, t.dst_port, proto::TCP),
            L4Spec::Udp(u) => (u.src_port, u.dst_port, proto::UDP),
            L4Spec::Echo(e) => (e.id, e.id, if v6 { proto::ICMPV6 } else { proto::ICMP }),
        };
        FlowKey::new(self.ip.src(), self.ip.dst(), src_port, dst_port, protocol)
    }

    /// Writes the frame at the start of `buf` and returns its length
    /// ([`frame_len`](Self::frame_len)). Bytes of `buf` after the frame are not touched.
    pub fn write(&self, buf: &mut [u8]) -> Result<usize, BuildError> {
        let l3 = self.ethernet.header_len();
        let l4 = l3 + self.ip.header_len();
        let l4_len = self.l4.header_len() + self.payload.len();
        let ip_len = self.ip.header_len() + l4_len;
        // IPv4 total length counts the IP header; IPv6 payload length and UDP length do not.
        let limited = match self.ip {
            IpSpec::V4(_) => ip_len,
            IpSpec::V6(_) => l4_len,
        };
        if limited > usize::from(u16::MAX) {
            return Err(BuildError::TooLong { len: limited });
        }
        let end = l4 + l4_len;
        let total = end.max(self.min_len);
        if buf.len() < total {
            return Err(BuildError::BufferTooSmall {
                needed: total,
                available: buf.len(),
            });
        }
        let buf = &mut buf[..total];

        // Ethernet II (IEEE 802.3 §3.2.6) with an optional 802.1Q tag (IEEE 802.1Q §9).
        buf[0..6].copy_from_slice(&self.ethernet.dst);
        buf[6..12].copy_from_slice(&self.ethernet.src);
        if let Some(tci) = self.ethernet.vlan {
            buf[12..14].copy_from_slice(&ETHERTYPE_VLAN.to_be_bytes());
            buf[14..16].copy_from_slice(&tci.to_be_bytes());
        }
        let ethertype = match self.ip {
            IpSpec::V4(_) => ETHERTYPE_IPV4,
            IpSpec::V6(_) => ETHERTYPE_IPV6,
        };
        buf[l3 - 2..l3].copy_from_slice(&ethertype.to_be_bytes());

        let v6 = matches!(self.ip, IpSpec::V6(_));
        let protocol = match self.l4 {
            L4Spec::Tcp(_) => proto::TCP,
            L4Spec::Udp(_) => proto::UDP,
            L4Spec::Echo(_) if v6 => proto::ICMPV6,
            L4Spec::Echo(_) => proto::ICMP,
        };

        // Transport header and payload first; the checksum follows once the bytes are there.
        let payload_at = l4 + self.l4.header_len();
        self.payload.write(&mut buf[payload_at..end]);
        let seg = &mut buf[l4..end];
        let check_at = match self.l4 {
            L4Spec::Tcp(t) => {
                seg[0..2].copy_from_slice(&t.src_port.to_be_bytes());
                seg[2..4].copy_from_slice(&t.dst_port.to_be_bytes());
                seg[4..8].copy_from_slice(&t.seq.to_be_bytes());
                seg[8..12].copy_from_slice(&t.ack.to_be_bytes());
                let header_len = TCP_HEADER_LEN + t.options.len();
                seg[12] = ((header_len / 4) as u8) << 4;
                seg[13] = t.flags;
                seg[14..16].copy_from_slice(&t.window.to_be_bytes());
                seg[16..18].fill(0);
                seg[18..20].copy_from_slice(&t.urgent.to_be_bytes());
                t.options.write(&mut seg[TCP_HEADER_LEN..header_len]);
                16
            }
            L4Spec::Udp(u) => {
                seg[0..2].copy_from_slice(&u.src_port.to_be_bytes());
                seg[2..4].copy_from_slice(&u.dst_port.to_be_bytes());
                seg[4..6].copy_from_slice(&(l4_len as u16).to_be_bytes());
                seg[6..8].fill(0);
                6
            }
            L4Spec::Echo(e) => {
                seg[0] = e.icmp_type(v6);
                seg[1] = 0;
                seg[2..4].fill(0);
                seg[4..6].copy_from_slice(&e.id.to_be_bytes());
                seg[6..8].copy_from_slice(&e.seq.to_be_bytes());
                2
            }
        };
        // ICMPv4 alone has no pseudo-header (RFC 792); the others do.
        let pseudo = match self.ip {
            IpSpec::V4(_) if protocol == proto::ICMP => 0,
            IpSpec::V4(h) => {
                checksum::pseudo_header_v4(h.src.octets(), h.dst.octets(), protocol, l4_len as u16)
            }
            IpSpec::V6(h) => checksum::pseudo_header_v6(
                &h.src.octets(),
                &h.dst.octets(),
                protocol,
                l4_len as u32,
            ),
        };
        let mut check = checksum::finish(checksum::combine(pseudo, checksum::sum(seg)));
        if check == 0 && protocol == proto::UDP {
            check = 0xffff;
        }
        seg[check_at..check_at + 2].copy_from_slice(&check.to_be_bytes());

        // The IP header.
        let ip = &mut buf[l3..l4];
        match self.ip {
            IpSpec::V4(h) => {
                ip[0] = 0x45;
                ip[1] = h.tos;
                ip[2..4].copy_from_slice(&(ip_len as u16).to_be_bytes());
                ip[4..6].copy_from_slice(&h.id.to_be_bytes());
                ip[6..8]
                    .copy_from_slice(&(if h.dont_fragment { 0x4000u16 } else { 0 }).to_be_bytes());
                ip[8] = h.ttl;
                ip[9] = protocol;
                ip[10..12].fill(0);
                ip[12..16].copy_from_slice(&h.src.octets());
                ip[16..20].copy_from_slice(&h.dst.octets());
                let check = checksum::checksum(ip);
                ip[10..12].copy_from_slice(&check.to_be_bytes());
            }
            IpSpec::V6(h) => {
                let word = (6u32 << 28)
                    | (u32::from(h.traffic_class) << 20)
                    | (h.flow_label & 0x000f_ffff);
                ip[0..4].copy_from_slice(&word.to_be_bytes());
                ip[4..6].copy_from_slice(&(l4_len as u16).to_be_bytes());
                ip[6] = protocol;
                ip[7] = h.hop_limit;
                ip[8..24].copy_from_slice(&h.src.octets());
                ip[24..40].copy_from_slice(&h.dst.octets());
            }
        }

        buf[end..].fill(0);
        Ok(total)
    }
}

/// Splits an untagged Ethernet frame carrying an unfragmented IPv4 packet (without options)
/// into fragments whose IP payloads are at most `max_payload` bytes (rounded down to a
/// multiple of 8, at least 8), as a router does (RFC 791 §3.2): each fragment has the
/// original header with its own total length, flags (more fragments on all but the last,
/// don't fragment cleared) and offset, and a recomputed header checksum. Returns the frame
/// itself, alone, when it is not such a packet or already fits.
pub fn fragment_ipv4(frame: &[u8], max_payload: usize) -> Vec<Vec<u8>> {
    const L3: usize = ETHERNET_HEADER_LEN;
    let ip = match frame.get(L3..L3 + IPV4_HEADER_LEN) {
        Some(ip) if ip[0] == 0x45 && u16::from_be_bytes([ip[6], ip[7]]) & 0x3fff == 0 => ip,
        _ => return vec![frame.to_vec()],
    };
    let total = usize::from(u16::from_be_bytes([ip[2], ip[3]]));
    let Some(payload) = frame.get(L3 + IPV4_HEADER_LEN..L3 + total.max(IPV4_HEADER_LEN)) else {
        return vec![frame.to_vec()];
    };
    let step = (max_payload / 8 * 8).max(8);
    if payload.len() <= step {
        return vec![frame.to_vec()];
    }
    payload
        .chunks(step)
        .enumerate()
        .map(|(k, chunk)| {
            let mut f = frame[..L3 + IPV4_HEADER_LEN].to_vec();
            f.extend_from_slice(chunk);
            let h = &mut f[L3..L3 + IPV4_HEADER_LEN];
            let len = (IPV4_HEADER_LEN + chunk.len()) as u16;
            h[2..4].copy_from_slice(&len.to_be_bytes());
            let more = if (k + 1) * step < payload.len() {
                0x2000
            } else {
                0
            };
            let flags_offset = more | ((k * step / 8) as u16 & 0x1fff);
            h[6..8].copy_from_slice(&flags_offset.to_be_bytes());
            h[10..12].copy_from_slice(&[0, 0]);
            let c = checksum::checksum(h);
            h[10..12].copy_from_slice(&c.to_be_bytes());
            f
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn udp4(payload: Payload<'_>, min_len: usize) -> FrameSpec<'_> {
        FrameSpec {
            ethernet: EthernetSpec::new([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2]),
            ip: IpSpec::V4(Ipv4Spec::new(
                Ipv4Addr::new(10, 0, 0, 1),
                Ipv4Addr::new(10, 0, 0, 2),
            )),
            l4: L4Spec::Udp(UdpSpec {
                src_port: 1,
                dst_port: 2,
            }),
            payload,
            min_len,
        }
    }

    #[test]
    fn fragments_carry_the_datagram_in_order_with_valid_headers() {
        let payload: Vec<u8> = (0..3000u32).map(|i| (i * 7) as u8).collect();
        let mut buf = vec![0u8; 4000];
        let n = udp4(Payload::Bytes(&payload), 0).write(&mut buf).unwrap();
        let frame = &buf[..n];
        let parts = fragment_ipv4(frame, 1477); // rounded down to 1472
        assert_eq!(parts.len(), 3);
        let mut joined = Vec::new();
        for (k, p) in parts.iter().enumerate() {
            let ip = crate::ipv4::Packet::new_checked(&p[14..]).expect("a valid header");
            assert!(ip.verify_checksum());
            assert_eq!(usize::from(ip.total_len()), p.len() - 14);
            assert_eq!(usize::from(ip.frag_offset()), joined.len());
            assert_eq!(ip.more_frags(), k < 2);
            assert!(!ip.dont_frag());
            joined.extend_from_slice(ip.payload());
        }
        assert_eq!(joined, &frame[34..]);
        let d: Vec<_> = parts
            .iter()
            .map(|p| crate::dissect::dissect(p).unwrap().fragment)
            .collect();
        use crate::dissect::Fragment::*;
        assert_eq!(d, [First, Later, Later]);
        // Small enough already, or not IPv4: the frame alone.
        assert_eq!(fragment_ipv4(frame, 3008), vec![frame.to_vec()]);
        assert_eq!(fragment_ipv4(&frame[..10], 8), vec![frame[..10].to_vec()]);
    }

    #[test]
    fn too_small_and_too_long_are_errors() {
        let spec = udp4(Payload::Fill { len: 10, byte: 1 }, 0);
        let mut buf = [0u8; 51];
        assert_eq!(
            spec.write(&mut buf),
            Err(BuildError::BufferTooSmall {
                needed: 52,
                available: 51
            })
        );
        assert_eq!(spec.write(&mut [0u8; 52]), Ok(52));
        let big = udp4(
            Payload::Fill {
                len: 70_000,
                byte: 1,
            },
            0,
        );
        assert_eq!(
            big.write(&mut [0u8; 16]),
            Err(BuildError::TooLong { len: 70_028 })
        );
        // 65535 - 20 - 8 payload bytes is the largest IPv4 UDP datagram.
        let max = udp4(
            Payload::Fill {
                len: 65_507,
                byte: 1,
            },
            0,
        );
        let mut large = vec![0u8; 65_535 + 14];
        assert_eq!(max.write(&mut large), Ok(65_549));
        assert_eq!(&large[16..18], &[0xff, 0xff]);
    }

    #[test]
    fn pads_to_min_len_without_counting_padding() {
        let spec = udp4(Payload::Fill { len: 2, byte: 7 }, ETHERNET_MIN_LEN);
        let mut buf = [0xaau8; 64];
        assert_eq!(spec.frame_len(), 60);
        assert_eq!(spec.write(&mut buf), Ok(60));
        assert_eq!(&buf[16..18], &[0, 30], "IPv4 total length excludes padding");
        assert_eq!(&buf[44..60], &[0; 16]);
        assert_eq!(&buf[60..], &[0xaa; 4], "bytes after the frame untouched");
    }

    #[test]
    fn options_lengths() {
        let all = TcpOptions {
            mss: Some(1460),
            window_scale: Some(7),
            sack_permitted: true,
            timestamps: Some((1, 2)),
        };
        assert_eq!(all.len(), 20);
        assert_eq!(TcpOptions::NONE.len(), 0);
        assert!(TcpOptions::NONE.is_empty());
        let sack_only = TcpOptions {
            sack_permitted: true,
            ..TcpOptions::NONE
        };
        let mut out = [0u8; 4];
        sack_only.write(&mut out);
        assert_eq!(out, [1, 1, 4, 2]);
    }
}
