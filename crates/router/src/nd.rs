//! IPv6 on the box's ports: neighbour discovery (RFC 4861) answered for the box's address and
//! asked for next hops, as ARP is for IPv4, and the ICMPv6 errors a router sends (RFC 4443:
//! time exceeded, packet too big). Frames are read at their IPv6 header (`l3`, after any VLAN
//! tag) and written untagged (the caller tags them).

use super::{mac, Undeliverable, ETH_HLEN};
use flowstate_wire::icmp;
use std::net::Ipv6Addr;

/// The EtherType of IPv6.
pub(crate) const ETHERTYPE_IPV6: u16 = 0x86dd;
const ICMPV6: u8 = 58;
const NEIGHBOUR_SOLICITATION: u8 = 135;
const NEIGHBOUR_ADVERTISEMENT: u8 = 136;
/// Source and target link-layer address options (RFC 4861 §4.6.1).
const SOURCE_LL: u8 = 1;
const TARGET_LL: u8 = 2;
/// The hop limit neighbour discovery uses and checks (RFC 4861 §7.1.1).
const ND_HOP_LIMIT: u8 = 255;
/// The minimum IPv6 MTU: an ICMPv6 error fits in it (RFC 4443 §2.4 (c)).
const MIN_MTU: usize = 1280;

/// What an IPv6 frame received by the box is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Received {
    /// A neighbour solicitation for the box's address, from `from` at `mac`: answer it.
    Solicited { from: Ipv6Addr, mac: [u8; 6] },
    /// A neighbour at a MAC (another solicitation's source, an advertisement's target).
    Neighbour(Ipv6Addr, [u8; 6]),
    /// Any other IPv6 packet, from `src`.
    Packet { src: Ipv6Addr },
    /// Too short to be IPv6.
    Malformed,
}

/// A 16-byte address at `at`.
#[inline]
pub(crate) fn ip6(b: &[u8], at: usize) -> Option<Ipv6Addr> {
    let a: [u8; 16] = b.get(at..at + 16)?.try_into().ok()?;
    Some(Ipv6Addr::from(a))
}

/// What IPv6 frame `f` (its header at `l3`, its Ethernet source `eth_src`) is to a box whose
/// address on the port is `mine`.
pub(crate) fn receive(f: &[u8], l3: usize, eth_src: [u8; 6], mine: Option<Ipv6Addr>) -> Received {
    let (Some(src), Some(&next), Some(&hop)) = (ip6(f, l3 + 8), f.get(l3 + 6), f.get(l3 + 7))
    else {
        return Received::Malformed;
    };
    let icmp = l3 + 40;
    let kind = f.get(icmp).copied();
    let nd = next == ICMPV6
        && hop == ND_HOP_LIMIT
        && matches!(kind, Some(NEIGHBOUR_SOLICITATION | NEIGHBOUR_ADVERTISEMENT));
    if !nd {
        return Received::Packet { src };
    }
    let Some(target) = ip6(f, icmp + 8) else {
        return Received::Malformed;
    };
    // The link-layer address option, when there is one; else the frame's source.
    let option = if kind == Some(NEIGHBOUR_SOLICITATION) {
        SOURCE_LL
    } else {
        TARGET_LL
    };
    let mut at = icmp + 24;
    let mut ll = None;
    while let (Some(&t), Some(&len)) = (f.get(at), f.get(at + 1)) {
        if len == 0 {
            break; // RFC 4861 §4.6: a zero-length option is invalid
        }
        if t == option {
            ll = mac(f, at + 2);
        }
        at += usize::from(len) * 8;
    }
    let ll = ll.unwrap_or(eth_src);
    if kind == Some(NEIGHBOUR_SOLICITATION) {
        if src.is_unspecified() {
            return Received::Packet { src }; // duplicate address detection: not ours to answer
        }
        if Some(target) == mine {
            return Received::Solicited { from: src, mac: ll };
        }
        return Received::Neighbour(src, ll);
    }
    Received::Neighbour(target, ll)
}

/// Writes an IPv6 packet carrying the ICMPv6 message `message` writes (`len` bytes, its
/// checksum filled here) in an Ethernet frame into `buf`; its length, or 0 when `buf` is
/// too small.
#[allow(clippy::too_many_arguments)]
fn write_icmp6(
    buf: &mut [u8],
    eth_dst: [u8; 6],
    eth_src: [u8; 6],
    src: Ipv6Addr,
    dst: Ipv6Addr,
    hop: u8,
    len: usize,
    message: impl FnOnce(&mut [u8]),
) -> usize {
    let total = ETH_HLEN + 40 + len;
    let Some(b) = buf.get_mut(..total) else {
        return 0;
    };
    b[..6].copy_from_slice(&eth_dst);
    b[6..12].copy_from_slice(&eth_src);
    b[12..14].copy_from_slice(&ETHERTYPE_IPV6.to_be_bytes());
    let ip = &mut b[ETH_HLEN..];
    ip[..4].copy_from_slice(&[0x60, 0, 0, 0]);
    ip[4..6].copy_from_slice(&(len as u16).to_be_bytes());
    ip[6] = ICMPV6;
    ip[7] = hop;
    ip[8..24].copy_from_slice(&src.octets());
    ip[24..40].copy_from_slice(&dst.octets());
    let m = &mut ip[40..40 + len];
    m.fill(0);
    message(m);
    icmp::v6::Packet::new_unchecked(m).fill_checksum(&src, &dst);
    total
}

/// The neighbour advertisement answering a solicitation from `to` at `to_mac` (RFC 4861
/// §7.2.4: solicited, override, with the target link-layer address).
pub(crate) fn write_advertisement(
    buf: &mut [u8],
    my_mac: [u8; 6],
    mine: Ipv6Addr,
    to: Ipv6Addr,
    to_mac: [u8; 6],
) -> usize {
    write_icmp6(buf, to_mac, my_mac, mine, to, ND_HOP_LIMIT, 32, |m| {
        m[0] = NEIGHBOUR_ADVERTISEMENT;
        m[4] = 0x60; // solicited, override
        m[8..24].copy_from_slice(&mine.octets());
        m[24] = TARGET_LL;
        m[25] = 1;
        m[26..32].copy_from_slice(&my_mac);
    })
}

/// The neighbour solicitation asking for `target`'s MAC, to its solicited-node multicast
/// address (RFC 4861 §7.2.2, RFC 4291 §2.7.1).
pub(crate) fn write_solicitation(
    buf: &mut [u8],
    my_mac: [u8; 6],
    mine: Ipv6Addr,
    target: Ipv6Addr,
) -> usize {
    let t = target.octets();
    let group = Ipv6Addr::new(
        0xff02,
        0,
        0,
        0,
        0,
        1,
        0xff00 | u16::from(t[13]),
        u16::from_be_bytes([t[14], t[15]]),
    );
    let eth = [0x33, 0x33, 0xff, t[13], t[14], t[15]];
    write_icmp6(buf, eth, my_mac, mine, group, ND_HOP_LIMIT, 32, |m| {
        m[0] = NEIGHBOUR_SOLICITATION;
        m[8..24].copy_from_slice(&t);
        m[24] = SOURCE_LL;
        m[25] = 1;
        m[26..32].copy_from_slice(&my_mac);
    })
}

/// Whether IPv6 `frame` (received for forwarding) cannot be forwarded: its hop limit is 1
/// or 0, or it is larger than `next_mtu` (an IPv6 router never fragments, RFC 8200 §5).
pub(crate) fn undeliverable(frame: &[u8], l3: usize, next_mtu: u16) -> Option<Undeliverable> {
    let ip = frame.get(l3..l3 + 40)?;
    if ip[7] <= 1 {
        return Some(Undeliverable::TtlExpired);
    }
    let len = 40 + usize::from(u16::from_be_bytes([ip[4], ip[5]]));
    (len > usize::from(next_mtu)).then_some(Undeliverable::TooBig {
        mtu: next_mtu,
        df: true,
    })
}

/// Whether IPv6 `frame` may be answered with an ICMPv6 error (RFC 4443 §2.4 (e)): not an
/// ICMPv6 error itself, from a unicast source.
pub(crate) fn answerable(frame: &[u8], l3: usize) -> bool {
    let (Some(src), Some(&next)) = (ip6(frame, l3 + 8), frame.get(l3 + 6)) else {
        return false;
    };
    let error = next == ICMPV6 && frame.get(l3 + 40).is_some_and(|&t| t < 128);
    frame[l3] >> 4 == 6 && !error && !src.is_multicast() && !src.is_unspecified()
}

/// Writes the ICMPv6 error answering IPv6 `frame` (its header at `l3`), from `mine` to the
/// frame's source, quoting as much of the packet as fits in the minimum MTU.
pub(crate) fn write_error(
    buf: &mut [u8],
    frame: &[u8],
    l3: usize,
    my_mac: [u8; 6],
    mine: Ipv6Addr,
    why: Undeliverable,
) -> usize {
    let (Some(src), Some(src_mac), Some(packet)) =
        (ip6(frame, l3 + 8), mac(frame, 6), frame.get(l3..))
    else {
        return 0;
    };
    let quote = packet.len().min(MIN_MTU - 40 - 8);
    let (kind, value) = match why {
        Undeliverable::TtlExpired => (icmp::v6::types::TIME_EXCEEDED, 0),
        Undeliverable::TooBig { mtu, .. } => (icmp::v6::types::PACKET_TOO_BIG, u32::from(mtu)),
    };
    write_icmp6(buf, src_mac, my_mac, mine, src, 64, 8 + quote, |m| {
        m[0] = kind;
        m[4..8].copy_from_slice(&value.to_be_bytes());
        m[8..].copy_from_slice(&packet[..quote]);
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const BOX: [u8; 6] = [2, 0, 0, 0, 0, 1];
    const HOST: [u8; 6] = [2, 0, 0, 0, 0, 2];

    fn a(s: &str) -> Ipv6Addr {
        s.parse().unwrap()
    }

    /// A solicitation written by the box is read back as one, and its answer as the
    /// neighbour it names; checksums verify.
    #[test]
    fn solicitations_and_advertisements_round_trip() {
        let mut buf = [0u8; 128];
        let n = write_solicitation(&mut buf, HOST, a("fd00:1::2"), a("fd00:1::1"));
        let ns = &buf[..n];
        assert_eq!(&ns[..6], &[0x33, 0x33, 0xff, 0, 0, 1]);
        let m = icmp::v6::Packet::new_unchecked(&ns[54..]);
        assert!(m.verify_checksum(&a("fd00:1::2"), &a("ff02::1:ff00:1")));
        assert_eq!(
            receive(ns, ETH_HLEN, HOST, Some(a("fd00:1::1"))),
            Received::Solicited {
                from: a("fd00:1::2"),
                mac: HOST
            }
        );
        assert_eq!(
            receive(ns, ETH_HLEN, HOST, Some(a("fd00:1::9"))),
            Received::Neighbour(a("fd00:1::2"), HOST)
        );
        let mut buf = [0u8; 128];
        let n = write_advertisement(&mut buf, BOX, a("fd00:1::1"), a("fd00:1::2"), HOST);
        let na = &buf[..n];
        assert_eq!((&na[..6], &na[6..12]), (&HOST[..], &BOX[..]));
        let m = icmp::v6::Packet::new_unchecked(&na[54..]);
        assert!(m.verify_checksum(&a("fd00:1::1"), &a("fd00:1::2")));
        assert_eq!(
            receive(na, ETH_HLEN, [9; 6], None),
            Received::Neighbour(a("fd00:1::1"), BOX)
        );
    }

    #[test]
    fn an_expiring_packet_is_answered_with_time_exceeded_quoting_it() {
        let mut f = vec![0u8; ETH_HLEN + 48];
        f[6..12].copy_from_slice(&HOST);
        f[ETH_HLEN] = 0x60;
        f[ETH_HLEN + 5] = 8;
        f[ETH_HLEN + 6] = 17;
        f[ETH_HLEN + 7] = 1;
        f[ETH_HLEN + 8..ETH_HLEN + 24].copy_from_slice(&a("fd00:1::2").octets());
        f[ETH_HLEN + 24..ETH_HLEN + 40].copy_from_slice(&a("fd00:2::2").octets());
        let why = undeliverable(&f, ETH_HLEN, 1500).unwrap();
        assert_eq!(why, Undeliverable::TtlExpired);
        assert!(answerable(&f, ETH_HLEN));
        let mut buf = [0u8; 256];
        let n = write_error(&mut buf, &f, ETH_HLEN, BOX, a("fd00:1::1"), why);
        let e = &buf[..n];
        assert_eq!(ip6(e, ETH_HLEN + 24), Some(a("fd00:1::2")));
        assert_eq!(e[54], icmp::v6::types::TIME_EXCEEDED);
        assert_eq!(&e[62..], &f[ETH_HLEN..]);
        let m = icmp::v6::Packet::new_unchecked(&e[54..]);
        assert!(m.verify_checksum(&a("fd00:1::1"), &a("fd00:1::2")));
        // An ICMPv6 error is never answered.
        assert!(!answerable(e, ETH_HLEN));
    }
}
