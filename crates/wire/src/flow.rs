//! The 5-tuple that names a flow.

use core::fmt;
use std::net::IpAddr;

/// IP protocol numbers used across flowstate (IANA "Assigned Internet Protocol Numbers").
pub mod proto {
    /// ICMP for IPv4 (RFC 792).
    pub const ICMP: u8 = 1;
    /// TCP (RFC 9293).
    pub const TCP: u8 = 6;
    /// UDP (RFC 768).
    pub const UDP: u8 = 17;
    /// ICMPv6 (RFC 4443).
    pub const ICMPV6: u8 = 58;
}

/// A flow's 5-tuple, IPv4 or IPv6, in the direction of the packet it was read from.
///
/// For TCP and UDP the ports are the transport ports. For ICMP/ICMPv6 echo request and reply
/// both ports carry the echo identifier (as Linux conntrack does), so a request and its reply
/// have reversed keys. For anything else (including non-first IPv4 fragments) both ports are 0.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
pub struct FlowKey {
    /// Source address.
    pub src: IpAddr,
    /// Destination address.
    pub dst: IpAddr,
    /// Source port (or echo identifier).
    pub src_port: u16,
    /// Destination port (or echo identifier).
    pub dst_port: u16,
    /// IP protocol number (see [`proto`]).
    pub proto: u8,
}

/// Hashed as few integers as the key allows, for the per-packet table lookups: an IPv4 key is
/// one `u128`, which foldhash (the workspace's hasher) takes in one multiplication; the derived
/// impl wrote seven integers (each address's family and bits, each port, the protocol), which
/// took foldhash 2.5 times as long. Equal keys write the same integers, as `Eq` requires.
impl core::hash::Hash for FlowKey {
    #[inline]
    fn hash<H: core::hash::Hasher>(&self, state: &mut H) {
        let rest =
            u64::from(self.src_port) << 24 | u64::from(self.dst_port) << 8 | u64::from(self.proto);
        match (self.src, self.dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => state.write_u128(
                u128::from(u32::from_ne_bytes(s.octets())) << 96
                    | u128::from(u32::from_ne_bytes(d.octets())) << 64
                    | u128::from(rest),
            ),
            (s, d) => {
                s.hash(state);
                d.hash(state);
                state.write_u64(rest | 1 << 63);
            }
        }
    }
}

/// Bytes of the longest [`FlowKey::to_bytes`] encoding (IPv6).
pub const FLOW_KEY_MAX_BYTES: usize = 37;

impl FlowKey {
    /// A key from its five fields.
    pub const fn new(src: IpAddr, dst: IpAddr, src_port: u16, dst_port: u16, proto: u8) -> Self {
        FlowKey {
            src,
            dst,
            src_port,
            dst_port,
            proto,
        }
    }

    /// The key of the opposite direction: addresses and ports swapped.
    #[inline]
    pub const fn reversed(&self) -> Self {
        FlowKey {
            src: self.dst,
            dst: self.src,
            src_port: self.dst_port,
            dst_port: self.src_port,
            proto: self.proto,
        }
    }

    /// Whether this key is in canonical order: the (address, port) of the source is not greater
    /// than that of the destination.
    #[inline]
    pub fn is_canonical(&self) -> bool {
        (self.src, self.src_port) <= (self.dst, self.dst_port)
    }

    /// The direction-independent form: a key and its [`reversed`](Self::reversed) key have the
    /// same canonical form.
    #[inline]
    pub fn canonical(&self) -> Self {
        if self.is_canonical() {
            *self
        } else {
            self.reversed()
        }
    }

    /// Whether both addresses are IPv6.
    #[inline]
    pub const fn is_ipv6(&self) -> bool {
        matches!(self.src, IpAddr::V6(_))
    }

    /// Writes the key as bytes for hashing, in network order: source address, destination
    /// address, source port, destination port, protocol (13 bytes for IPv4, 37 for IPv6; mixed
    /// families use 16-byte mapped forms). Returns the written prefix of `buf`.
    #[inline]
    pub fn to_bytes<'a>(&self, buf: &'a mut [u8; FLOW_KEY_MAX_BYTES]) -> &'a [u8] {
        // Each arm writes at fixed offsets (a lookup writes a key per packet: no stores at
        // offsets known only at run time).
        match (self.src, self.dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => {
                buf[0..4].copy_from_slice(&s.octets());
                buf[4..8].copy_from_slice(&d.octets());
                self.ports_and_proto(buf, 8)
            }
            (s, d) => {
                buf[0..16].copy_from_slice(&v6_octets(s));
                buf[16..32].copy_from_slice(&v6_octets(d));
                self.ports_and_proto(buf, 32)
            }
        }
    }

    #[inline(always)]
    fn ports_and_proto<'a>(&self, buf: &'a mut [u8; FLOW_KEY_MAX_BYTES], n: usize) -> &'a [u8] {
        buf[n..n + 2].copy_from_slice(&self.src_port.to_be_bytes());
        buf[n + 2..n + 4].copy_from_slice(&self.dst_port.to_be_bytes());
        buf[n + 4] = self.proto;
        &buf[..n + 5]
    }
}

fn v6_octets(a: IpAddr) -> [u8; 16] {
    match a {
        IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
        IpAddr::V6(a) => a.octets(),
    }
}

impl fmt::Display for FlowKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self.proto {
            proto::TCP => "tcp",
            proto::UDP => "udp",
            proto::ICMP => "icmp",
            proto::ICMPV6 => "icmpv6",
            _ => "ip",
        };
        match (self.src, self.dst) {
            (IpAddr::V6(s), IpAddr::V6(d)) => {
                write!(
                    f,
                    "{name} [{s}]:{} -> [{d}]:{}",
                    self.src_port, self.dst_port
                )
            }
            (s, d) => write!(f, "{name} {s}:{} -> {d}:{}", self.src_port, self.dst_port),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, Ipv6Addr};

    fn v4(a: [u8; 4]) -> IpAddr {
        IpAddr::V4(Ipv4Addr::from(a))
    }

    #[test]
    fn reversed_twice_is_identity_and_canonical_is_shared() {
        let k = FlowKey::new(v4([10, 0, 0, 9]), v4([10, 0, 0, 1]), 40000, 80, proto::TCP);
        assert_eq!(k.reversed().reversed(), k);
        assert_ne!(k.reversed(), k);
        assert_eq!(k.canonical(), k.reversed().canonical());
        assert!(k.canonical().is_canonical());
        assert_eq!(k.canonical().src, v4([10, 0, 0, 1]));
    }

    #[test]
    fn same_address_orders_by_port() {
        let k = FlowKey::new(v4([1, 1, 1, 1]), v4([1, 1, 1, 1]), 9, 5, proto::UDP);
        assert_eq!(k.canonical().src_port, 5);
        assert_eq!(k.canonical(), k.reversed().canonical());
    }

    #[test]
    fn byte_encoding() {
        let mut buf = [0; FLOW_KEY_MAX_BYTES];
        let k = FlowKey::new(
            v4([1, 2, 3, 4]),
            v4([5, 6, 7, 8]),
            0x0102,
            0x0304,
            proto::UDP,
        );
        assert_eq!(
            k.to_bytes(&mut buf),
            &[1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3, 4, 17]
        );
        let k6 = FlowKey::new(
            IpAddr::V6(Ipv6Addr::LOCALHOST),
            IpAddr::V6(Ipv6Addr::UNSPECIFIED),
            1,
            2,
            proto::TCP,
        );
        let b = k6.to_bytes(&mut buf);
        assert_eq!(b.len(), 37);
        assert_eq!(b[15], 1);
        assert_eq!(&b[32..], &[0, 1, 0, 2, 6]);
        assert_eq!(k6.to_string(), "tcp [::1]:1 -> [::]:2");
    }
}
