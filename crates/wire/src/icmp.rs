//! ICMP for IPv4 (RFC 792) in [`v4`] and ICMPv6 (RFC 4443) in [`v6`].
//!
//! Both share the layout of the first 8 bytes (RFC 792 "Echo or Echo Reply Message", RFC 4443
//! §2.1):
//!
//! ```text
//!  0                   1                   2                   3
//!  0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |     Type      |     Code      |          Checksum             |
//! |  Identifier (echo) / unused, pointer, MTU (errors) ...        |
//! |  Data (echo) / as much of the invoking packet as fits (errors)|
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! ```
//!
//! A view must cover exactly the ICMP message (to the end of the IP payload): the checksum
//! covers the whole buffer. Error messages embed the invoking packet's IP header and at least
//! the first 8 bytes of its transport header (RFC 792; RFC 4443 §2.4 (c) includes as much as
//! fits); [`v4::Packet::inner_flow`] and [`v6::Packet::inner_flow`] read its [`FlowKey`](crate::FlowKey).

use crate::flow::proto;

/// Byte ranges of the common ICMP header (RFC 792, RFC 4443 §2.1).
mod field {
    use core::ops::Range;

    /// Message type.
    pub(super) const TYPE: usize = 0;
    /// Message code.
    pub(super) const CODE: usize = 1;
    /// Checksum.
    pub(super) const CHECKSUM: Range<usize> = 2..4;
    /// Type-specific word: echo identifier and sequence, or unused/pointer/MTU for errors.
    pub(super) const REST: Range<usize> = 4..8;
    /// Echo identifier (RFC 792 "Echo or Echo Reply Message", RFC 4443 §4.1).
    pub(super) const ECHO_IDENT: Range<usize> = 4..6;
    /// Echo sequence number.
    pub(super) const ECHO_SEQNO: Range<usize> = 6..8;
    /// Length of the header up to the message body.
    pub(super) const HEADER_LEN: usize = 8;
}

/// Length of the ICMP header (type, code, checksum and the 4-byte type-specific word).
pub const HEADER_LEN: usize = field::HEADER_LEN;

#[inline]
fn be16(b: &[u8]) -> u16 {
    u16::from_be_bytes([b[0], b[1]])
}

/// The ports of a transport header `l4` for a flow key: TCP/UDP ports, both = the identifier
/// for an echo request/reply of `icmp_proto`, 0 for anything else. `None` when `l4` is too short
/// to tell.
fn inner_ports(protocol: u8, l4: &[u8], icmp_proto: u8, echo: [u8; 2]) -> Option<(u16, u16)> {
    match protocol {
        proto::TCP | proto::UDP => {
            let b = l4.get(0..4)?;
            Some((be16(&b[0..2]), be16(&b[2..4])))
        }
        p if p == icmp_proto => {
            let t = *l4.first()?;
            if t == echo[0] || t == echo[1] {
                let id = be16(l4.get(field::ECHO_IDENT)?);
                Some((id, id))
            } else {
                Some((0, 0))
            }
        }
        _ => Some((0, 0)),
    }
}

macro_rules! common_view {
    ($layer:expr, $doc:literal) => {
        #[doc = $doc]
        #[derive(Debug, Clone)]
        pub struct Packet<T: AsRef<[u8]>> {
            buffer: T,
        }

        impl<T: AsRef<[u8]>> Packet<T> {
            /// Wraps `buffer` without checking anything; getters may panic on a short buffer.
            #[inline]
            pub const fn new_unchecked(buffer: T) -> Self {
                Packet { buffer }
            }

            /// Wraps `buffer` after [`check`](Self::check): afterwards no getter panics.
            #[inline]
            pub fn new_checked(buffer: T) -> Result<Self> {
                let p = Self::new_unchecked(buffer);
                p.check()?;
                Ok(p)
            }

            /// Checks that the 8-byte header fits.
            #[inline]
            pub fn check(&self) -> Result<()> {
                if self.buffer.as_ref().len() < field::HEADER_LEN {
                    return Err(Error::truncated($layer));
                }
                Ok(())
            }

            /// Gives back the buffer.
            #[inline]
            pub fn into_inner(self) -> T {
                self.buffer
            }

            /// Message type.
            #[inline]
            pub fn msg_type(&self) -> u8 {
                self.buffer.as_ref()[field::TYPE]
            }

            /// Message code.
            #[inline]
            pub fn msg_code(&self) -> u8 {
                self.buffer.as_ref()[field::CODE]
            }

            /// Checksum as stored.
            #[inline]
            pub fn checksum(&self) -> u16 {
                be16(&self.buffer.as_ref()[field::CHECKSUM])
            }

            /// The type-specific 32-bit word after the checksum (unused, pointer, MTU, or
            /// identifier and sequence number).
            #[inline]
            pub fn rest_of_header(&self) -> u32 {
                let b = &self.buffer.as_ref()[field::REST];
                u32::from_be_bytes([b[0], b[1], b[2], b[3]])
            }

            /// Whether this is an echo request or reply.
            #[inline]
            pub fn is_echo(&self) -> bool {
                let t = self.msg_type();
                t == types::ECHO_REQUEST || t == types::ECHO_REPLY
            }

            /// Echo identifier (meaningful for echo request/reply).
            #[inline]
            pub fn echo_ident(&self) -> u16 {
                be16(&self.buffer.as_ref()[field::ECHO_IDENT])
            }

            /// Echo sequence number (meaningful for echo request/reply).
            #[inline]
            pub fn echo_seq_no(&self) -> u16 {
                be16(&self.buffer.as_ref()[field::ECHO_SEQNO])
            }

            /// The message body after the 8-byte header.
            #[inline]
            pub fn payload(&self) -> &[u8] {
                self.buffer.as_ref().get(field::HEADER_LEN..).unwrap_or(&[])
            }

            /// For an error message, the embedded invoking packet (its IP header and the start
            /// of its payload); `None` for other types.
            #[inline]
            pub fn inner(&self) -> Option<&[u8]> {
                if self.is_error() {
                    Some(self.payload())
                } else {
                    None
                }
            }

            /// Sum of the message with the checksum field taken as zero.
            #[inline]
            fn sum_without_checksum(&self) -> u32 {
                let d = self.buffer.as_ref();
                checksum::combine(
                    checksum::sum(d.get(..field::CHECKSUM.start).unwrap_or(&[])),
                    checksum::sum(d.get(field::CHECKSUM.end..).unwrap_or(&[])),
                )
            }
        }

        impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
            #[inline]
            fn set_u16(&mut self, r: core::ops::Range<usize>, v: u16) {
                self.buffer.as_mut()[r].copy_from_slice(&v.to_be_bytes());
            }

            /// Sets the stored checksum.
            #[inline]
            pub fn set_checksum(&mut self, v: u16) {
                self.set_u16(field::CHECKSUM, v);
            }

            /// Sets the message type (does not update the checksum).
            #[inline]
            pub fn set_msg_type(&mut self, t: u8) {
                self.buffer.as_mut()[field::TYPE] = t;
            }

            /// Sets the message code (does not update the checksum).
            #[inline]
            pub fn set_msg_code(&mut self, c: u8) {
                self.buffer.as_mut()[field::CODE] = c;
            }

            /// Sets the echo identifier and updates the checksum incrementally (RFC 1624 §3).
            #[inline]
            pub fn set_echo_ident(&mut self, ident: u16) {
                let c = checksum::update_u16(self.checksum(), self.echo_ident(), ident);
                self.set_u16(field::ECHO_IDENT, ident);
                self.set_checksum(c);
            }

            /// Sets the echo sequence number and updates the checksum incrementally.
            #[inline]
            pub fn set_echo_seq_no(&mut self, seq: u16) {
                let c = checksum::update_u16(self.checksum(), self.echo_seq_no(), seq);
                self.set_u16(field::ECHO_SEQNO, seq);
                self.set_checksum(c);
            }

            /// The message body after the header, mutable (for an error message: the invoking
            /// packet, which a NAT rewrites). Changing it does not update the checksum.
            #[inline]
            pub fn payload_mut(&mut self) -> &mut [u8] {
                self.buffer
                    .as_mut()
                    .get_mut(field::HEADER_LEN..)
                    .unwrap_or(&mut [])
            }
        }
    };
}

/// ICMP for IPv4 (RFC 792).
pub mod v4 {
    use super::{be16, field, inner_ports};
    use crate::flow::proto;
    use crate::{checksum, Error, FlowKey, Layer, Result};
    use std::net::{IpAddr, Ipv4Addr};

    /// ICMPv4 message types (RFC 792; IANA "ICMP Type Numbers").
    pub mod types {
        /// Echo reply.
        pub const ECHO_REPLY: u8 = 0;
        /// Destination unreachable (error).
        pub const DEST_UNREACHABLE: u8 = 3;
        /// Source quench (error, deprecated by RFC 6633).
        pub const SOURCE_QUENCH: u8 = 4;
        /// Redirect (error-like: carries the invoking packet).
        pub const REDIRECT: u8 = 5;
        /// Echo request.
        pub const ECHO_REQUEST: u8 = 8;
        /// Time exceeded (error).
        pub const TIME_EXCEEDED: u8 = 11;
        /// Parameter problem (error).
        pub const PARAM_PROBLEM: u8 = 12;
    }

    common_view!(
        Layer::Icmpv4,
        "A view of an ICMPv4 message (RFC 792): the IPv4 payload, whole."
    );

    impl<T: AsRef<[u8]>> Packet<T> {
        /// Whether the message carries an invoking packet: types 3, 4, 5, 11, 12 (RFC 792).
        #[inline]
        pub fn is_error(&self) -> bool {
            matches!(
                self.msg_type(),
                types::DEST_UNREACHABLE
                    | types::SOURCE_QUENCH
                    | types::REDIRECT
                    | types::TIME_EXCEEDED
                    | types::PARAM_PROBLEM
            )
        }

        /// The checksum the message should carry (RFC 792: over the ICMP message alone).
        #[inline]
        pub fn compute_checksum(&self) -> u16 {
            checksum::finish(self.sum_without_checksum())
        }

        /// Whether the checksum is correct.
        #[inline]
        pub fn verify_checksum(&self) -> bool {
            checksum::checksum(self.buffer.as_ref()) == 0
        }

        /// The flow key of the invoking packet embedded in an error message, in that packet's
        /// direction (so usually the reverse of this message's own flow). `None` when this is
        /// not an error message, the embedded IPv4 header is incomplete, or its ports are cut.
        /// A non-first fragment, or a protocol without ports, gives ports 0.
        pub fn inner_flow(&self) -> Option<FlowKey> {
            inner_flow(self.inner()?)
        }
    }

    /// Parses an embedded IPv4 header and the start of its transport header into a key.
    fn inner_flow(ip: &[u8]) -> Option<FlowKey> {
        let h = ip.get(..20)?;
        if h[0] >> 4 != 4 {
            return None;
        }
        let hl = usize::from(h[0] & 0x0f) * 4;
        if hl < 20 || ip.len() < hl {
            return None;
        }
        let protocol = h[9];
        let src = Ipv4Addr::new(h[12], h[13], h[14], h[15]);
        let dst = Ipv4Addr::new(h[16], h[17], h[18], h[19]);
        let later_fragment = be16(&h[6..8]) & 0x1fff != 0;
        let (sp, dp) = if later_fragment {
            (0, 0)
        } else {
            inner_ports(
                protocol,
                &ip[hl..],
                proto::ICMP,
                [types::ECHO_REQUEST, types::ECHO_REPLY],
            )?
        };
        Some(FlowKey::new(
            IpAddr::V4(src),
            IpAddr::V4(dst),
            sp,
            dp,
            protocol,
        ))
    }

    impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
        /// Recomputes and stores the checksum.
        #[inline]
        pub fn fill_checksum(&mut self) {
            let c = self.compute_checksum();
            self.set_checksum(c);
        }
    }
}

/// ICMPv6 (RFC 4443).
pub mod v6 {
    use super::{be16, field, inner_ports};
    use crate::flow::proto;
    use crate::ipv6;
    use crate::{checksum, Error, FlowKey, Layer, Result};
    use std::net::{IpAddr, Ipv6Addr};

    /// ICMPv6 message types (RFC 4443 §2.1; IANA "ICMPv6 Type Numbers").
    pub mod types {
        /// Destination unreachable (error).
        pub const DEST_UNREACHABLE: u8 = 1;
        /// Packet too big (error).
        pub const PACKET_TOO_BIG: u8 = 2;
        /// Time exceeded (error).
        pub const TIME_EXCEEDED: u8 = 3;
        /// Parameter problem (error).
        pub const PARAM_PROBLEM: u8 = 4;
        /// Echo request.
        pub const ECHO_REQUEST: u8 = 128;
        /// Echo reply.
        pub const ECHO_REPLY: u8 = 129;
    }

    common_view!(
        Layer::Icmpv6,
        "A view of an ICMPv6 message (RFC 4443): the upper-layer bytes, whole."
    );

    impl<T: AsRef<[u8]>> Packet<T> {
        /// Whether the message is an error carrying an invoking packet: types 1 to 4
        /// (RFC 4443 §2.1: error messages have types 0..=127; 1..=4 are defined).
        #[inline]
        pub fn is_error(&self) -> bool {
            matches!(
                self.msg_type(),
                types::DEST_UNREACHABLE
                    | types::PACKET_TOO_BIG
                    | types::TIME_EXCEEDED
                    | types::PARAM_PROBLEM
            )
        }

        /// The checksum the message should carry: over the IPv6 pseudo-header (RFC 4443 §2.3,
        /// RFC 8200 §8.1) with next header 58 and the message length.
        #[inline]
        pub fn compute_checksum(&self, src: &Ipv6Addr, dst: &Ipv6Addr) -> u16 {
            checksum::finish(checksum::combine(
                self.pseudo_sum(src, dst),
                self.sum_without_checksum(),
            ))
        }

        /// Whether the checksum is correct for these addresses.
        #[inline]
        pub fn verify_checksum(&self, src: &Ipv6Addr, dst: &Ipv6Addr) -> bool {
            let s = checksum::combine(
                self.pseudo_sum(src, dst),
                checksum::sum(self.buffer.as_ref()),
            );
            checksum::finish(s) == 0
        }

        #[inline]
        fn pseudo_sum(&self, src: &Ipv6Addr, dst: &Ipv6Addr) -> u32 {
            checksum::pseudo_header_v6(
                &src.octets(),
                &dst.octets(),
                proto::ICMPV6,
                self.buffer.as_ref().len() as u32,
            )
        }

        /// The flow key of the invoking packet embedded in an error message, in that packet's
        /// direction. Walks the embedded extension headers as far as they were included.
        /// `None` when this is not an error message, the embedded IPv6 header or extension
        /// chain is incomplete, or its ports are cut. A later fragment, or a protocol without
        /// ports, gives ports 0.
        pub fn inner_flow(&self) -> Option<FlowKey> {
            inner_flow(self.inner()?)
        }
    }

    /// Parses an embedded IPv6 header, its extension headers and the start of its transport
    /// header into a key.
    fn inner_flow(ip: &[u8]) -> Option<FlowKey> {
        let h = ip.get(..ipv6::HEADER_LEN)?;
        if h[0] >> 4 != 6 {
            return None;
        }
        let mut src = [0; 16];
        src.copy_from_slice(&h[8..24]);
        let mut dst = [0; 16];
        dst.copy_from_slice(&h[24..40]);
        let rest = &ip[ipv6::HEADER_LEN..];
        let up = ipv6::walk_extension_headers(h[6], rest).ok()?;
        let (sp, dp) = if up.has_header() {
            inner_ports(
                up.protocol,
                rest.get(up.offset..)?,
                proto::ICMPV6,
                [types::ECHO_REQUEST, types::ECHO_REPLY],
            )?
        } else {
            (0, 0)
        };
        Some(FlowKey::new(
            IpAddr::V6(Ipv6Addr::from(src)),
            IpAddr::V6(Ipv6Addr::from(dst)),
            sp,
            dp,
            up.protocol,
        ))
    }

    impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
        /// Recomputes and stores the checksum for these addresses.
        #[inline]
        pub fn fill_checksum(&mut self, src: &Ipv6Addr, dst: &Ipv6Addr) {
            let c = self.compute_checksum(src, dst);
            self.set_checksum(c);
        }

        /// Updates the checksum after an address of the pseudo-header changed from `old` to
        /// `new` (RFC 1624 §3).
        #[inline]
        pub fn update_checksum_for_addr(&mut self, old: &Ipv6Addr, new: &Ipv6Addr) {
            let c = checksum::update(self.checksum(), &old.octets(), &new.octets());
            self.set_checksum(c);
        }
    }
}

/// The ports of an ICMP message for a [`FlowKey`](crate::FlowKey): both ports carry the identifier of
/// an echo request or reply (as Linux conntrack does), 0 otherwise.
#[inline]
pub fn echo_ports(icmp_proto: u8, msg: &[u8]) -> (u16, u16) {
    let echo = if icmp_proto == proto::ICMPV6 {
        [v6::types::ECHO_REQUEST, v6::types::ECHO_REPLY]
    } else {
        [v4::types::ECHO_REQUEST, v4::types::ECHO_REPLY]
    };
    inner_ports(icmp_proto, msg, icmp_proto, echo).unwrap_or((0, 0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checksum;

    #[test]
    fn echo_ident_update_keeps_checksum() {
        // Echo reply id 0x0001 seq 7 with 4 bytes of data; checksum filled below.
        let mut b = [0, 0, 0, 0, 0x00, 0x01, 0x00, 0x07, 1, 2, 3, 4];
        let mut m = v4::Packet::new_checked(&mut b[..]).unwrap();
        m.fill_checksum();
        assert!(m.verify_checksum());
        m.set_echo_ident(0xbeef);
        assert_eq!(m.checksum(), m.compute_checksum());
        m.set_echo_seq_no(0x8000);
        assert_eq!(m.checksum(), m.compute_checksum());
        assert_eq!(checksum::checksum(&b), 0);
        assert_eq!(echo_ports(proto::ICMP, &b), (0xbeef, 0xbeef));
        assert_eq!(echo_ports(proto::ICMPV6, &b), (0, 0));
    }

    #[test]
    fn inner_flow_of_quoted_echo_and_fragment() {
        // Time exceeded quoting an ICMP echo request (id 0x4242) from 10.0.0.1 to 10.0.0.9.
        let mut msg = vec![11, 0, 0, 0, 0, 0, 0, 0];
        msg.extend_from_slice(&[0x45, 0, 0, 28, 0, 0, 0, 0, 1, 1, 0, 0]);
        msg.extend_from_slice(&[10, 0, 0, 1, 10, 0, 0, 9]);
        msg.extend_from_slice(&[8, 0, 0, 0, 0x42, 0x42, 0, 1]);
        let m = v4::Packet::new_checked(&msg[..]).unwrap();
        let k = m.inner_flow().unwrap();
        assert_eq!(
            (k.src_port, k.dst_port, k.proto),
            (0x4242, 0x4242, proto::ICMP)
        );
        assert_eq!(k.dst.to_string(), "10.0.0.9");
        // Quoting a later fragment: ports 0 even with bytes present.
        msg[8 + 7] = 1;
        let k = v4::Packet::new_checked(&msg[..])
            .unwrap()
            .inner_flow()
            .unwrap();
        assert_eq!((k.src_port, k.dst_port), (0, 0));
        // Not an error message: no inner packet.
        msg[0] = 8;
        let m = v4::Packet::new_checked(&msg[..]).unwrap();
        assert_eq!((m.inner(), m.inner_flow()), (None, None));
        // A too-short header is refused.
        assert!(v4::Packet::new_checked(&msg[..7]).is_err());
        assert!(v6::Packet::new_checked(&msg[..7]).is_err());
    }
}
