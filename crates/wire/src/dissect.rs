//! One-pass dissection of an Ethernet frame down to the transport header.
//!
//! [`dissect`] walks Ethernet (with up to two 802.1Q/802.1ad tags), ARP, IPv4 (options,
//! fragments), IPv6 (a bounded chain of extension headers) and the transport header, and
//! returns where each layer starts and the packet's [`FlowKey`]. It never allocates or panics;
//! a malformed packet is an [`Error`] naming the layer and the reason.

use crate::ethernet::{EtherType, Frame};
use crate::flow::proto;
use crate::tcp::PseudoHeader;
use crate::{arp, icmp, ipv4, ipv6, tcp, udp};
use crate::{Error, FlowKey, Layer, Result};
use std::net::IpAddr;

/// The network layer of a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Network {
    /// IPv4 at `l3_offset`.
    Ipv4,
    /// IPv6 at `l3_offset`.
    Ipv6,
    /// ARP at `l3_offset`.
    Arp,
    /// Another EtherType, not parsed further.
    Other(u16),
}

/// Where an IPv4 packet or IPv6 fragment header places this packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fragment {
    /// Not fragmented.
    None,
    /// First fragment (offset 0, more fragments follow): carries the transport header.
    First,
    /// A later fragment: no transport header, ports unknown.
    Later,
    /// A later fragment whose flow ports were filled in from its datagram's first fragment
    /// (the runtime's fragment tracker, `flowstate_chain::fragments`): still no transport
    /// header, but the flow key is the datagram's. [`dissect`] never returns it.
    Tracked,
}

impl Fragment {
    /// Whether the packet is a later fragment (tracked or not): it has no transport header.
    #[inline]
    pub fn is_later(self) -> bool {
        matches!(self, Fragment::Later | Fragment::Tracked)
    }
}

/// The transport layer of an IP packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// No transport header: not IP, or a later fragment.
    None,
    /// TCP at `l4_offset`.
    Tcp,
    /// UDP at `l4_offset`.
    Udp,
    /// ICMPv4 at `l4_offset` with its type and code.
    Icmpv4 {
        /// ICMP type.
        kind: u8,
        /// ICMP code.
        code: u8,
    },
    /// ICMPv6 at `l4_offset` with its type and code.
    Icmpv6 {
        /// ICMPv6 type.
        kind: u8,
        /// ICMPv6 code.
        code: u8,
    },
    /// Another IP protocol (`protocol` tells which), not parsed.
    Other,
}

/// What [`dissect`] found in a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dissection {
    /// Number of VLAN tags (0, 1 or 2).
    pub vlan_count: u8,
    /// VLAN ids, outermost first; only the first `vlan_count` are meaningful.
    pub vlan_ids: [u16; 2],
    /// EtherType after any tags.
    pub ethertype: u16,
    /// Offset of the network header.
    pub l3_offset: usize,
    /// The network layer.
    pub network: Network,
    /// IP protocol number of the transport (after IPv6 extension headers); 0 when not IP.
    pub protocol: u8,
    /// Fragment position (IPv4 flags/offset, or the IPv6 fragment header).
    pub fragment: Fragment,
    /// Offset of the transport header, when the packet carries one.
    pub l4_offset: Option<usize>,
    /// The transport layer.
    pub transport: Transport,
    /// Offset of the transport payload, when the packet carries a TCP/UDP/ICMP header.
    pub payload_offset: Option<usize>,
    /// The IP packet's end within the frame (Ethernet padding excluded).
    pub l3_end: usize,
    /// The flow key, for IP packets.
    pub flow: Option<FlowKey>,
}

impl Dissection {
    /// A later fragment's dissection as the runtime's fragment tracker hands it on: its
    /// datagram's `ports` (from the first fragment) in its flow key, [`Fragment::Tracked`].
    pub fn tracked(mut self, (src_port, dst_port): (u16, u16)) -> Self {
        self.fragment = Fragment::Tracked;
        if let Some(f) = self.flow.as_mut() {
            (f.src_port, f.dst_port) = (src_port, dst_port);
        }
        self
    }

    /// What [`dissect`] gives for the same bytes: a [`Fragment::Tracked`] fragment becomes
    /// [`Fragment::Later`] again, its ports (its datagram's, not in its bytes) zero.
    pub fn untracked(mut self) -> Self {
        if self.fragment == Fragment::Tracked {
            self.fragment = Fragment::Later;
            if let Some(f) = self.flow.as_mut() {
                (f.src_port, f.dst_port) = (0, 0);
            }
        }
        self
    }
}

/// Dissects an Ethernet II frame.
///
/// Rules:
/// * A non-IP EtherType is not an error: [`Network::Other`] (or [`Network::Arp`], whose length is
///   checked) with `flow: None`, `protocol: 0`, `l3_end` the frame's (ARP: the ARP packet's) end.
/// * An IPv4 packet's payload ends at its total length, an IPv6 packet's at its payload length
///   (`l3_end`); bytes after that are Ethernet padding.
/// * A later fragment (IPv4 offset > 0, or an IPv6 fragment header with offset > 0) has no
///   transport: `transport: None`, `l4_offset: None`, flow ports 0. A first fragment is parsed
///   like an unfragmented packet, so a transport header cut by fragmentation is an error
///   (except that a UDP length, which counts the whole datagram, need not fit).
/// * ICMP echo request/reply: both flow ports are the identifier; other ICMP messages and other
///   protocols: ports 0 ([`Transport::Other`] still gives `l4_offset`, except for IPv6 No Next
///   Header).
/// * Errors: a header that does not fit (`truncated`) or has impossible fields, at its layer.
pub fn dissect(frame: &[u8]) -> Result<Dissection> {
    let eth = Frame::new_checked(frame)?;
    let vlan_count = eth.vlan_count();
    let mut vlan_ids = [0u16; 2];
    for (i, id) in vlan_ids.iter_mut().enumerate().take(vlan_count) {
        *id = eth.vlan_id(i).unwrap_or(0);
    }
    let ethertype = eth.ethertype();
    let l3_offset = eth.header_len();
    let l3 = eth.payload();
    let mut d = Dissection {
        vlan_count: vlan_count as u8,
        vlan_ids,
        ethertype: ethertype.0,
        l3_offset,
        network: Network::Other(ethertype.0),
        protocol: 0,
        fragment: Fragment::None,
        l4_offset: None,
        transport: Transport::None,
        payload_offset: None,
        l3_end: frame.len(),
        flow: None,
    };
    match ethertype {
        EtherType::IPV4 => dissect_ipv4(l3, &mut d)?,
        EtherType::IPV6 => dissect_ipv6(l3, &mut d)?,
        EtherType::ARP => {
            let p = arp::Packet::new_unchecked(l3);
            p.check_len()?;
            d.network = Network::Arp;
            d.l3_end = l3_offset + p.packet_len();
        }
        _ => {}
    }
    Ok(d)
}

#[inline]
fn dissect_ipv4(l3: &[u8], d: &mut Dissection) -> Result<()> {
    let ip = ipv4::Packet::new_checked(l3)?;
    let hl = ip.header_len();
    d.network = Network::Ipv4;
    d.protocol = ip.protocol();
    d.l3_end = d.l3_offset + usize::from(ip.total_len());
    d.fragment = if ip.is_later_fragment() {
        Fragment::Later
    } else if ip.is_first_fragment() {
        Fragment::First
    } else {
        Fragment::None
    };
    let src = IpAddr::V4(ip.src_addr());
    let dst = IpAddr::V4(ip.dst_addr());
    let (sp, dp) = if d.fragment == Fragment::Later {
        (0, 0)
    } else {
        transport(ip.payload(), d.l3_offset + hl, d.protocol, false, d)?
    };
    d.flow = Some(FlowKey::new(src, dst, sp, dp, d.protocol));
    Ok(())
}

#[inline]
fn dissect_ipv6(l3: &[u8], d: &mut Dissection) -> Result<()> {
    let ip = ipv6::Packet::new_checked(l3)?;
    d.network = Network::Ipv6;
    d.l3_end = d.l3_offset + ip.total_len();
    let payload = ip.payload();
    let up = ip.upper_layer()?;
    d.protocol = up.protocol;
    d.fragment = match up.fragment {
        Some(f) if f.is_later() => Fragment::Later,
        Some(f) if f.is_first() => Fragment::First,
        _ => Fragment::None,
    };
    let src = IpAddr::V6(ip.src_addr());
    let dst = IpAddr::V6(ip.dst_addr());
    let (sp, dp) = if !up.has_header() {
        (0, 0)
    } else {
        let l4 = payload.get(up.offset..).unwrap_or(&[]);
        let l4_offset = d.l3_offset + ipv6::HEADER_LEN + up.offset;
        transport(l4, l4_offset, up.protocol, true, d)?
    };
    d.flow = Some(FlowKey::new(src, dst, sp, dp, d.protocol));
    Ok(())
}

/// Parses the transport header in `l4` (which ends where the IP payload ends), fills the
/// transport fields of `d` and returns the flow ports.
#[inline]
fn transport(
    l4: &[u8],
    l4_offset: usize,
    protocol: u8,
    v6: bool,
    d: &mut Dissection,
) -> Result<(u16, u16)> {
    d.l4_offset = Some(l4_offset);
    let (transport, header_len, ports) = match protocol {
        proto::TCP => {
            let t = tcp::Packet::new_checked(l4)?;
            (Transport::Tcp, t.header_len(), (t.src_port(), t.dst_port()))
        }
        proto::UDP => {
            // In a first fragment the UDP length is the reassembled datagram's: only the header
            // has to fit (RFC 791 §3.2, RFC 8200 §4.5).
            let u = if d.fragment == Fragment::First {
                if l4.len() < udp::HEADER_LEN {
                    return Err(Error::truncated(Layer::Udp));
                }
                udp::Packet::new_unchecked(l4)
            } else {
                udp::Packet::new_checked(l4)?
            };
            (
                Transport::Udp,
                udp::HEADER_LEN,
                (u.src_port(), u.dst_port()),
            )
        }
        proto::ICMP if !v6 => {
            let m = icmp::v4::Packet::new_checked(l4)?;
            let ports = if m.is_echo() {
                (m.echo_ident(), m.echo_ident())
            } else {
                (0, 0)
            };
            let t = Transport::Icmpv4 {
                kind: m.msg_type(),
                code: m.msg_code(),
            };
            (t, icmp::HEADER_LEN, ports)
        }
        proto::ICMPV6 if v6 => {
            let m = icmp::v6::Packet::new_checked(l4)?;
            let ports = if m.is_echo() {
                (m.echo_ident(), m.echo_ident())
            } else {
                (0, 0)
            };
            let t = Transport::Icmpv6 {
                kind: m.msg_type(),
                code: m.msg_code(),
            };
            (t, icmp::HEADER_LEN, ports)
        }
        _ => {
            d.transport = Transport::Other;
            return Ok((0, 0));
        }
    };
    d.transport = transport;
    d.payload_offset = Some(l4_offset + header_len);
    Ok(ports)
}

/// Which checksums of a frame are correct; `None` where a checksum does not apply or cannot be
/// verified.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ChecksumStatus {
    /// The IPv4 header checksum; `None` for IPv6 (which has none) and non-IP frames.
    pub ip: Option<bool>,
    /// The TCP, UDP, ICMP or ICMPv6 checksum; `None` for fragments (the checksum covers the
    /// reassembled packet), UDP over IPv4 with checksum 0 (not computed), other protocols and
    /// non-IP frames.
    pub transport: Option<bool>,
}

/// Verifies the checksums of `frame` as [`dissect`] found it in `d`. Never panics, even for a
/// `d` that does not belong to `frame` (offsets that do not fit give `None`).
///
/// The IPv6 pseudo-header uses the destination of the fixed header; with a Routing header the
/// final destination would be needed (RFC 8200 §8.1), which this does not look for.
pub fn verify_checksums(frame: &[u8], d: &Dissection) -> ChecksumStatus {
    let mut st = ChecksumStatus::default();
    let Some(l3) = frame.get(d.l3_offset..d.l3_end) else {
        return st;
    };
    let pseudo = match d.network {
        Network::Ipv4 => {
            let Ok(ip) = ipv4::Packet::new_checked(l3) else {
                return st;
            };
            st.ip = Some(ip.verify_checksum());
            PseudoHeader::from(&ip)
        }
        Network::Ipv6 => {
            let Ok(ip) = ipv6::Packet::new_checked(l3) else {
                return st;
            };
            PseudoHeader::from(&ip)
        }
        Network::Arp | Network::Other(_) => return st,
    };
    if d.fragment != Fragment::None {
        return st;
    }
    let Some(l4) = d.l4_offset.and_then(|o| frame.get(o..d.l3_end)) else {
        return st;
    };
    st.transport = match (d.transport, pseudo) {
        (Transport::Tcp, _) => tcp::Packet::new_checked(l4)
            .ok()
            .map(|t| t.verify_checksum(&pseudo)),
        (Transport::Udp, _) => udp::Packet::new_checked(l4)
            .ok()
            .and_then(|u| u.verify_checksum(&pseudo)),
        (Transport::Icmpv4 { .. }, PseudoHeader::V4 { .. }) => icmp::v4::Packet::new_checked(l4)
            .ok()
            .map(|m| m.verify_checksum()),
        (Transport::Icmpv6 { .. }, PseudoHeader::V6 { src, dst }) => {
            icmp::v6::Packet::new_checked(l4)
                .ok()
                .map(|m| m.verify_checksum(&src, &dst))
        }
        _ => None,
    };
    st
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Layer;

    /// Ethernet + IPv4 (20-byte header, checksum not filled) + `l4`.
    fn v4(protocol: u8, flags_off: u16, l4: &[u8]) -> Vec<u8> {
        let mut f = vec![0u8; 12];
        f.extend_from_slice(&[0x08, 0x00, 0x45, 0]);
        f.extend_from_slice(&(20 + l4.len() as u16).to_be_bytes());
        f.extend_from_slice(&[0, 1]);
        f.extend_from_slice(&flags_off.to_be_bytes());
        f.extend_from_slice(&[64, protocol, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2]);
        f.extend_from_slice(l4);
        f
    }

    /// Ethernet + IPv6 with next header `nh` + `rest`.
    fn v6(nh: u8, rest: &[u8]) -> Vec<u8> {
        let mut f = vec![0u8; 12];
        f.extend_from_slice(&[0x86, 0xdd, 0x60, 0, 0, 0]);
        f.extend_from_slice(&(rest.len() as u16).to_be_bytes());
        f.extend_from_slice(&[nh, 64]);
        f.extend_from_slice(&[0; 32]);
        f.extend_from_slice(rest);
        f
    }

    #[test]
    fn errors_name_their_layer() {
        let e = |f: &[u8]| dissect(f).unwrap_err();
        assert_eq!(e(&[]), Error::truncated(Layer::Ethernet));
        let mut f = v4(6, 0, &[0; 20]);
        f[14] = 0x65;
        assert_eq!(e(&f), Error::new(Layer::Ipv4, "version is not 4"));
        assert_eq!(e(&v4(6, 0, &[0; 19])), Error::truncated(Layer::Tcp));
        assert_eq!(e(&v4(17, 0, &[0; 7])), Error::truncated(Layer::Udp));
        assert_eq!(e(&v4(1, 0, &[8, 0, 0, 0])), Error::truncated(Layer::Icmpv4));
        assert_eq!(e(&v6(58, &[128, 0, 0, 0])), Error::truncated(Layer::Icmpv6));
        assert_eq!(e(&v6(0, &[6, 0, 0])), Error::truncated(Layer::Ipv6));
        // A UDP length past the IP payload is truncated, unless this is a first fragment.
        let udp = [0, 1, 0, 2, 0, 200, 0, 0];
        assert_eq!(e(&v4(17, 0, &udp)), Error::truncated(Layer::Udp));
        let d = dissect(&v4(17, 0x2000, &udp)).unwrap();
        assert_eq!((d.fragment, d.transport), (Fragment::First, Transport::Udp));
        assert_eq!(d.flow.unwrap().dst_port, 2);
    }

    #[test]
    fn later_fragment_skips_transport() {
        // Offset 8: whatever the bytes, they are not a transport header.
        let d = dissect(&v4(6, 1, &[0; 3])).unwrap();
        assert_eq!(d.fragment, Fragment::Later);
        assert_eq!(
            (d.transport, d.l4_offset, d.payload_offset),
            (Transport::None, None, None)
        );
        let flow = d.flow.unwrap();
        assert_eq!(
            (flow.src_port, flow.dst_port, flow.proto),
            (0, 0, proto::TCP)
        );
    }

    #[test]
    fn other_protocols() {
        // ICMPv6 over IPv4 and ICMPv4 over IPv6 are not parsed as ICMP.
        let d = dissect(&v4(proto::ICMPV6, 0, &[128, 0, 0, 0])).unwrap();
        assert_eq!((d.transport, d.l4_offset), (Transport::Other, Some(34)));
        let d = dissect(&v6(proto::ICMP, &[8, 0])).unwrap();
        assert_eq!((d.transport, d.l4_offset), (Transport::Other, Some(54)));
        // ESP stops the walk and is "other"; No Next Header has nothing at all.
        let d = dissect(&v6(60, &[50, 0, 0, 0, 0, 0, 0, 0, 0xaa])).unwrap();
        assert_eq!(
            (d.protocol, d.transport, d.l4_offset),
            (50, Transport::Other, Some(62))
        );
        let d = dissect(&v6(59, &[1, 2, 3])).unwrap();
        assert_eq!(
            (d.protocol, d.transport, d.l4_offset),
            (59, Transport::None, None)
        );
        assert_eq!(d.flow.unwrap().src_port, 0);
        assert_eq!(d.l3_end, 14 + 40 + 3);
        // ICMP that is not an echo has ports 0.
        let d = dissect(&v4(proto::ICMP, 0, &[11, 0, 0, 0, 0, 0, 0, 0])).unwrap();
        assert_eq!(d.transport, Transport::Icmpv4 { kind: 11, code: 0 });
        assert_eq!(d.flow.unwrap().src_port, 0);
        let d = dissect(&v6(proto::ICMPV6, &[129, 0, 0, 0, 0x12, 0x34, 0, 1])).unwrap();
        assert_eq!(d.transport, Transport::Icmpv6 { kind: 129, code: 0 });
        assert_eq!(d.flow.unwrap().src_port, 0x1234);
        assert_eq!(d.flow.unwrap().dst_port, 0x1234);
    }
}
