//! Packet rewriting: a translated packet's endpoint and an ICMP error's quote, with
//! incremental checksum updates (RFC 1624).

use super::translate::Side;
use crate::Packet;
use flowstate_wire::dissect::{Fragment, Transport};
use flowstate_wire::flow::proto;
use flowstate_wire::icmp::v4::types as icmp_type;
use flowstate_wire::{checksum, icmp, ipv4, tcp, udp};
use std::net::{IpAddr, Ipv4Addr};

/// Whether an ICMPv4 type carries an invoking packet (RFC 792).
pub(super) const fn is_icmp_error(kind: u8) -> bool {
    matches!(
        kind,
        icmp_type::DEST_UNREACHABLE
            | icmp_type::SOURCE_QUENCH
            | icmp_type::REDIRECT
            | icmp_type::TIME_EXCEEDED
            | icmp_type::PARAM_PROBLEM
    )
}

/// The TCP flags of a packet the dissection found TCP in.
pub(super) fn tcp_flags(pkt: &Packet<'_>) -> tcp::Flags {
    let at = pkt.dissection.l4_offset.map(|o| o + 13);
    tcp::Flags(at.and_then(|a| pkt.data.get(a)).copied().unwrap_or(0))
}

/// RFC 1624 eqn. 3 over `N` bytes (a whole number of 16-bit words at an even offset): the
/// checksum after `old` was replaced by `new`. Bit for bit what [`checksum::update`] computes,
/// without its loops over slices (this runs for every translated packet).
#[inline(always)]
pub(crate) fn checksum_update<const N: usize>(check: u16, old: [u8; N], new: [u8; N]) -> u16 {
    #[inline(always)]
    fn fold(acc: u32) -> u32 {
        // Two folds bring any 32-bit sum to 16 bits: the first leaves at most 0x1fffe.
        let acc = (acc & 0xffff) + (acc >> 16);
        (acc & 0xffff) + (acc >> 16)
    }
    let (mut sum_old, mut sum_new) = (0u32, 0u32);
    for w in 0..N / 2 {
        sum_old += u32::from(u16::from_be_bytes([old[2 * w], old[2 * w + 1]]));
        sum_new += u32::from(u16::from_be_bytes([new[2 * w], new[2 * w + 1]]));
    }
    let not_old = u32::from(!(fold(sum_old) as u16));
    !(fold(u32::from(!check) + not_old + fold(sum_new)) as u16)
}

/// The big-endian 16-bit word at `at`.
#[inline(always)]
pub(crate) fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

/// Rewrites the `side` endpoint of an IPv4 TCP, UDP or ICMP echo packet to `addr`/`port`
/// (the identifier for ICMP), with incremental checksum updates (RFC 1624), and the
/// dissection's flow key with it. Returns `false`, the packet untouched, if its headers do not
/// parse.
///
/// Fragments (RFC 4787 REQ-14): a first fragment is rewritten as a whole packet (its
/// transport checksum covers the whole datagram, so the incremental update is right; its UDP
/// length counts the whole datagram). A tracked later fragment ([`Fragment::Tracked`]) has
/// no transport header: only its address is rewritten, and its flow key as a whole.
///
/// The per-packet path: it checks what `ipv4::Packet::new_checked` and the transport's
/// `new_checked` check, and updates the checksums as their setters do, bit for bit, on the
/// bytes directly.
#[inline]
pub(super) fn rewrite(pkt: &mut Packet<'_>, side: Side, addr: Ipv4Addr, port: u16) -> bool {
    let d = pkt.dissection;
    let Some(l3) = pkt.data.get_mut(d.l3_offset..d.l3_end) else {
        return false;
    };
    // ipv4::Packet::check: the fixed header fits, version 4, IHL >= 5, the header fits,
    // header length <= total length <= buffer length.
    if l3.len() < ipv4::HEADER_LEN || l3[0] >> 4 != 4 {
        return false;
    }
    let hl = usize::from(l3[0] & 0x0f) * 4;
    let tl = usize::from(be16(l3, 2));
    if hl < ipv4::HEADER_LEN || l3.len() < hl || tl < hl || l3.len() < tl {
        return false;
    }
    let (ip, l4) = l3[..tl].split_at_mut(hl);
    let tracked = d.fragment == Fragment::Tracked;
    // The transport's check, on the IP payload.
    let valid = tracked
        || match d.transport {
            Transport::Tcp => {
                l4.len() >= tcp::HEADER_LEN && {
                    let thl = usize::from(l4[12] >> 4) * 4;
                    thl >= tcp::HEADER_LEN && l4.len() >= thl
                }
            }
            Transport::Udp => {
                l4.len() >= udp::HEADER_LEN && {
                    let ul = usize::from(be16(l4, 4));
                    ul >= udp::HEADER_LEN && (l4.len() >= ul || d.fragment == Fragment::First)
                }
            }
            Transport::Icmpv4 { .. } => l4.len() >= icmp::HEADER_LEN,
            _ => false,
        };
    if !valid {
        return false;
    }
    // IPv4 source at 12, destination at 16, header checksum at 10.
    let at = match side {
        Side::Src => 12,
        Side::Dst => 16,
    };
    let old: [u8; 4] = [ip[at], ip[at + 1], ip[at + 2], ip[at + 3]];
    let new = addr.octets();
    let c = checksum_update(be16(ip, 10), old, new);
    ip[at..at + 4].copy_from_slice(&new);
    ip[10..12].copy_from_slice(&c.to_be_bytes());
    // TCP and UDP: source port at 0, destination port at 2; TCP checksum at 16, UDP at 6.
    let port_at = match side {
        Side::Src => 0,
        Side::Dst => 2,
    };
    let icmp = match d.transport {
        _ if tracked => d.protocol == proto::ICMP,
        Transport::Tcp => {
            // tcp::Packet::set_{src,dst}_port, then update_checksum_for_addr.
            let c = checksum_update(
                be16(l4, 16),
                be16(l4, port_at).to_be_bytes(),
                port.to_be_bytes(),
            );
            l4[port_at..port_at + 2].copy_from_slice(&port.to_be_bytes());
            let c = checksum_update(c, old, new);
            l4[16..18].copy_from_slice(&c.to_be_bytes());
            false
        }
        Transport::Udp => {
            // udp::Packet: the same two updates, but a zero checksum ("none") stays zero and
            // a computed zero is sent as 0xffff (RFC 768), after each update.
            let old_port = be16(l4, port_at);
            l4[port_at..port_at + 2].copy_from_slice(&port.to_be_bytes());
            let c = be16(l4, 6);
            if c != 0 {
                let nonzero = |c: u16| if c == 0 { 0xffff } else { c };
                let c = nonzero(checksum_update(
                    c,
                    old_port.to_be_bytes(),
                    port.to_be_bytes(),
                ));
                let c = nonzero(checksum_update(c, old, new));
                l4[6..8].copy_from_slice(&c.to_be_bytes());
            }
            false
        }
        _ => {
            // The ICMPv4 checksum (at 2) has no pseudo-header: only the identifier (at 4)
            // counts.
            let c = checksum_update(be16(l4, 2), be16(l4, 4).to_be_bytes(), port.to_be_bytes());
            l4[4..6].copy_from_slice(&port.to_be_bytes());
            l4[2..4].copy_from_slice(&c.to_be_bytes());
            true
        }
    };
    if let Some(f) = pkt.dissection.flow.as_mut() {
        match side {
            Side::Src => {
                f.src = IpAddr::V4(addr);
                f.src_port = port;
                if icmp {
                    f.dst_port = port;
                }
            }
            Side::Dst => {
                f.dst = IpAddr::V4(addr);
                f.dst_port = port;
                if icmp {
                    f.src_port = port;
                }
            }
        }
    }
    true
}

/// Where the packet quoted in an ICMP error keeps what the NAT rewrites.
#[derive(Debug, Clone, Copy)]
pub(super) struct Quoted {
    /// Offset of the quoted transport header within the ICMP message.
    l4: usize,
    /// Its protocol: TCP, UDP, or ICMP (an echo).
    proto: u8,
}

/// Offset of the quoted IPv4 header in an ICMP error message.
const QUOTE: usize = icmp::HEADER_LEN;

/// The layout of the packet quoted in ICMP error `msg`, if it is an IPv4 packet whose ports
/// (TCP, UDP) or identifier (ICMP echo) are within the quote; `None` otherwise (including a
/// quoted later fragment).
pub(super) fn quoted(msg: &[u8]) -> Option<Quoted> {
    let ip = msg.get(QUOTE..)?;
    let h = ip.get(..ipv4::HEADER_LEN)?;
    if h[0] >> 4 != 4 {
        return None;
    }
    let hl = usize::from(h[0] & 0x0f) * 4;
    if hl < ipv4::HEADER_LEN || ip.len() < hl || u16::from_be_bytes([h[6], h[7]]) & 0x1fff != 0 {
        return None;
    }
    let proto = h[9];
    let l4 = QUOTE + hl;
    let need = match proto {
        proto::TCP | proto::UDP => 4,
        proto::ICMP => {
            let t = *msg.get(l4)?;
            if t != icmp_type::ECHO_REQUEST && t != icmp_type::ECHO_REPLY {
                return None;
            }
            6
        }
        _ => return None,
    };
    (msg.len() >= l4 + need).then_some(Quoted { l4, proto })
}

fn read16(b: &[u8], at: usize) -> Option<u16> {
    b.get(at..at + 2).map(|b| u16::from_be_bytes([b[0], b[1]]))
}

/// Replaces the bytes at `at` (an even offset) of ICMP message `msg` with `new` (2 or 4 bytes)
/// and folds the change into the message checksum `sum` (RFC 1624 eqn. 3).
fn patch(msg: &mut [u8], sum: &mut u16, at: usize, new: &[u8]) {
    let Some(field) = msg.get_mut(at..at + new.len()) else {
        return;
    };
    let mut old = [0u8; 4];
    let old = &mut old[..new.len()];
    old.copy_from_slice(field);
    field.copy_from_slice(new);
    *sum = checksum::update(*sum, old, new);
}

/// Rewrites the `side` endpoint of the packet quoted in ICMP error `msg` (laid out as `q`) to
/// `addr`/`port`: the address, the quoted IPv4 header checksum, the port or echo identifier,
/// and the quoted transport checksum when the quote holds it (a UDP checksum of 0 stays 0);
/// the ICMP checksum follows every change (RFC 5508 REQ-3, RFC 1624).
pub(super) fn rewrite_quoted(msg: &mut [u8], q: Quoted, side: Side, addr: Ipv4Addr, port: u16) {
    let Some(mut sum) = read16(msg, 2) else {
        return;
    };
    let addr_at = QUOTE + if side == Side::Src { 12 } else { 16 };
    let Some(old_addr) = msg
        .get(addr_at..addr_at + 4)
        .map(|b| [b[0], b[1], b[2], b[3]])
    else {
        return;
    };
    let new_addr = addr.octets();
    if let Some(c) = read16(msg, QUOTE + 10) {
        let c = checksum::update(c, &old_addr, &new_addr);
        patch(msg, &mut sum, QUOTE + 10, &c.to_be_bytes());
    }
    patch(msg, &mut sum, addr_at, &new_addr);
    let (port_at, check_at) = match (q.proto, side) {
        (proto::ICMP, _) => (q.l4 + 4, q.l4 + 2),
        (proto::TCP, Side::Src) => (q.l4, q.l4 + 16),
        (proto::TCP, Side::Dst) => (q.l4 + 2, q.l4 + 16),
        (_, Side::Src) => (q.l4, q.l4 + 6),
        (_, Side::Dst) => (q.l4 + 2, q.l4 + 6),
    };
    let Some(old_port) = read16(msg, port_at) else {
        return;
    };
    patch(msg, &mut sum, port_at, &port.to_be_bytes());
    if let Some(c) = read16(msg, check_at) {
        let updated = match q.proto {
            proto::ICMP => Some(checksum::update_u16(c, old_port, port)),
            proto::UDP if c == 0 => None,
            p => {
                let c = checksum::update_u16(c, old_port, port);
                let c = checksum::update(c, &old_addr, &new_addr);
                Some(if p == proto::UDP && c == 0 { 0xffff } else { c })
            }
        };
        if let Some(c) = updated {
            patch(msg, &mut sum, check_at, &c.to_be_bytes());
        }
    }
    if let Some(f) = msg.get_mut(2..4) {
        f.copy_from_slice(&sum.to_be_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The per-packet checksum update agrees with `checksum::update` bit for bit.
    #[test]
    fn checksum_update_matches_wire() {
        use proptest::prelude::*;
        proptest!(|(check: u16, old: [u8; 4], new: [u8; 4])| {
            prop_assert_eq!(
                super::checksum_update(check, old, new),
                checksum::update(check, &old, &new)
            );
            let (o2, n2) = ([old[0], old[1]], [new[0], new[1]]);
            prop_assert_eq!(
                super::checksum_update(check, o2, n2),
                checksum::update(check, &o2, &n2)
            );
        });
        for check in [0u16, 1, 0xfffe, 0xffff] {
            for (old, new) in [
                ([0u8; 4], [0xffu8; 4]),
                ([0xff; 4], [0; 4]),
                ([0; 4], [0; 4]),
            ] {
                assert_eq!(
                    super::checksum_update(check, old, new),
                    checksum::update(check, &old, &new)
                );
            }
        }
    }
}
