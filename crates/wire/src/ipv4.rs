//! IPv4 headers (RFC 791 §3.1), with the header checksum (RFC 791 §3.1 "Header Checksum",
//! RFC 1071) kept correct by incremental updates (RFC 1624) in the address and TTL setters.
//!
//! ```text
//!  0                   1                   2                   3
//!  0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |Version|  IHL  |   DSCP    |ECN|          Total Length         |
//! |         Identification        |Flags|      Fragment Offset    |
//! |  Time to Live |    Protocol   |         Header Checksum       |
//! |                       Source Address                          |
//! |                    Destination Address                        |
//! |                    Options                    |    Padding    |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! ```

use crate::checksum;
use crate::{Error, Layer, Result};
use std::net::Ipv4Addr;

/// Byte ranges of the IPv4 header (RFC 791 §3.1).
mod field {
    use core::ops::Range;

    /// Version (high nibble) and IHL (low nibble, in 32-bit words).
    pub(super) const VER_IHL: usize = 0;
    /// DSCP (high six bits, RFC 2474) and ECN (low two bits, RFC 3168).
    pub(super) const DSCP_ECN: usize = 1;
    /// Total length of the datagram in bytes.
    pub(super) const LENGTH: Range<usize> = 2..4;
    /// Identification.
    pub(super) const IDENT: Range<usize> = 4..6;
    /// Flags (reserved, DF, MF) and fragment offset in 8-byte units.
    pub(super) const FLG_OFF: Range<usize> = 6..8;
    /// Time to live.
    pub(super) const TTL: usize = 8;
    /// Protocol of the payload.
    pub(super) const PROTOCOL: usize = 9;
    /// Header checksum.
    pub(super) const CHECKSUM: Range<usize> = 10..12;
    /// Source address.
    pub(super) const SRC: Range<usize> = 12..16;
    /// Destination address.
    pub(super) const DST: Range<usize> = 16..20;
}

/// Length of a header without options.
pub const HEADER_LEN: usize = 20;

/// Longest header: IHL 15 (RFC 791 §3.1, "Internet Header Length").
pub const MAX_HEADER_LEN: usize = 60;

/// "Don't Fragment" flag within the flags/offset word.
const FLAG_DF: u16 = 0x4000;
/// "More Fragments" flag within the flags/offset word.
const FLAG_MF: u16 = 0x2000;
/// Fragment offset mask (13 bits, in 8-byte units).
const OFFSET_MASK: u16 = 0x1fff;

/// A view of an IPv4 packet.
///
/// The buffer may extend past the packet's total length (Ethernet padding); the payload ends at
/// the total length.
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

    /// Checks, in this order, that the fixed header fits, the version is 4, the IHL is at least
    /// 5, the header with options fits, and `header length <= total length <= buffer length`.
    #[inline]
    pub fn check(&self) -> Result<()> {
        let data = self.buffer.as_ref();
        if data.len() < HEADER_LEN {
            return Err(Error::truncated(Layer::Ipv4));
        }
        if self.version() != 4 {
            return Err(Error::new(Layer::Ipv4, "version is not 4"));
        }
        let hl = self.header_len();
        if hl < HEADER_LEN {
            return Err(Error::new(Layer::Ipv4, "header length below 20"));
        }
        if data.len() < hl {
            return Err(Error::truncated(Layer::Ipv4));
        }
        let tl = usize::from(self.total_len());
        if tl < hl {
            return Err(Error::new(Layer::Ipv4, "total length below header length"));
        }
        if data.len() < tl {
            return Err(Error::truncated(Layer::Ipv4));
        }
        Ok(())
    }

    /// Gives back the buffer.
    #[inline]
    pub fn into_inner(self) -> T {
        self.buffer
    }

    #[inline]
    fn u16_at(&self, r: core::ops::Range<usize>) -> u16 {
        let b = &self.buffer.as_ref()[r];
        u16::from_be_bytes([b[0], b[1]])
    }

    /// IP version (4 after `new_checked`).
    #[inline]
    pub fn version(&self) -> u8 {
        self.buffer.as_ref()[field::VER_IHL] >> 4
    }

    /// Header length in bytes (IHL * 4), options included.
    #[inline]
    pub fn header_len(&self) -> usize {
        usize::from(self.buffer.as_ref()[field::VER_IHL] & 0x0f) * 4
    }

    /// Differentiated services code point (RFC 2474 §3).
    #[inline]
    pub fn dscp(&self) -> u8 {
        self.buffer.as_ref()[field::DSCP_ECN] >> 2
    }

    /// Explicit congestion notification (RFC 3168 §5).
    #[inline]
    pub fn ecn(&self) -> u8 {
        self.buffer.as_ref()[field::DSCP_ECN] & 0x03
    }

    /// Total length of the datagram (header and payload) in bytes.
    #[inline]
    pub fn total_len(&self) -> u16 {
        self.u16_at(field::LENGTH)
    }

    /// Identification.
    #[inline]
    pub fn ident(&self) -> u16 {
        self.u16_at(field::IDENT)
    }

    /// "Don't Fragment" flag.
    #[inline]
    pub fn dont_frag(&self) -> bool {
        self.u16_at(field::FLG_OFF) & FLAG_DF != 0
    }

    /// "More Fragments" flag.
    #[inline]
    pub fn more_frags(&self) -> bool {
        self.u16_at(field::FLG_OFF) & FLAG_MF != 0
    }

    /// Fragment offset in bytes (the header field is in 8-byte units).
    #[inline]
    pub fn frag_offset(&self) -> u16 {
        (self.u16_at(field::FLG_OFF) & OFFSET_MASK) << 3
    }

    /// Whether this packet is a fragment: MF set or a non-zero offset (RFC 791 §2.3).
    #[inline]
    pub fn is_fragment(&self) -> bool {
        self.u16_at(field::FLG_OFF) & (FLAG_MF | OFFSET_MASK) != 0
    }

    /// Whether this packet is the first fragment of a fragmented datagram: offset 0 and MF
    /// set. It carries the transport header.
    #[inline]
    pub fn is_first_fragment(&self) -> bool {
        self.u16_at(field::FLG_OFF) & (FLAG_MF | OFFSET_MASK) == FLAG_MF
    }

    /// Whether this packet is a non-first fragment (offset > 0): it carries no transport header.
    #[inline]
    pub fn is_later_fragment(&self) -> bool {
        self.u16_at(field::FLG_OFF) & OFFSET_MASK != 0
    }

    /// Time to live.
    #[inline]
    pub fn ttl(&self) -> u8 {
        self.buffer.as_ref()[field::TTL]
    }

    /// Protocol of the payload (see [`crate::flow::proto`]).
    #[inline]
    pub fn protocol(&self) -> u8 {
        self.buffer.as_ref()[field::PROTOCOL]
    }

    /// Header checksum as stored.
    #[inline]
    pub fn checksum(&self) -> u16 {
        self.u16_at(field::CHECKSUM)
    }

    /// Source address.
    #[inline]
    pub fn src_addr(&self) -> Ipv4Addr {
        let b = &self.buffer.as_ref()[field::SRC];
        Ipv4Addr::new(b[0], b[1], b[2], b[3])
    }

    /// Destination address.
    #[inline]
    pub fn dst_addr(&self) -> Ipv4Addr {
        let b = &self.buffer.as_ref()[field::DST];
        Ipv4Addr::new(b[0], b[1], b[2], b[3])
    }

    /// The header bytes, options included.
    #[inline]
    pub fn header(&self) -> &[u8] {
        let data = self.buffer.as_ref();
        data.get(..self.header_len()).unwrap_or(data)
    }

    /// The option bytes (between the fixed header and the payload; RFC 791 §3.1 "Options").
    #[inline]
    pub fn options(&self) -> &[u8] {
        self.buffer
            .as_ref()
            .get(HEADER_LEN..self.header_len())
            .unwrap_or(&[])
    }

    /// The payload: from the end of the header to the total length (Ethernet padding excluded).
    #[inline]
    pub fn payload(&self) -> &[u8] {
        self.buffer
            .as_ref()
            .get(self.header_len()..usize::from(self.total_len()))
            .unwrap_or(&[])
    }

    /// The checksum the header should carry: RFC 1071 over the header with the checksum field
    /// taken as zero.
    #[inline]
    pub fn compute_checksum(&self) -> u16 {
        let h = self.header();
        // The checksum field sits at an even offset, so summing around it keeps word alignment.
        let s = checksum::combine(
            checksum::sum(h.get(..field::CHECKSUM.start).unwrap_or(&[])),
            checksum::sum(h.get(field::CHECKSUM.end..).unwrap_or(&[])),
        );
        checksum::finish(s)
    }

    /// Whether the header checksum is correct: the header sums to 0xffff (RFC 1071 §1).
    #[inline]
    pub fn verify_checksum(&self) -> bool {
        checksum::finish(checksum::sum(self.header())) == 0
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    #[inline]
    fn set_u16(&mut self, r: core::ops::Range<usize>, v: u16) {
        self.buffer.as_mut()[r].copy_from_slice(&v.to_be_bytes());
    }

    /// Writes a header without options for a datagram of `total_len` bytes (RFC 791 §3.1):
    /// version 4, IHL 5, DSCP/ECN 0, identification 0, not fragmented, and its checksum.
    pub fn emit(&mut self, total_len: u16, ttl: u8, protocol: u8, src: Ipv4Addr, dst: Ipv4Addr) {
        let b = self.buffer.as_mut();
        b[field::VER_IHL] = 0x45;
        b[field::DSCP_ECN] = 0;
        b[field::LENGTH].copy_from_slice(&total_len.to_be_bytes());
        b[field::IDENT].fill(0);
        b[field::FLG_OFF].fill(0);
        b[field::TTL] = ttl;
        b[field::PROTOCOL] = protocol;
        b[field::SRC].copy_from_slice(&src.octets());
        b[field::DST].copy_from_slice(&dst.octets());
        self.fill_checksum();
    }

    /// Sets the stored header checksum.
    #[inline]
    pub fn set_checksum(&mut self, v: u16) {
        self.set_u16(field::CHECKSUM, v);
    }

    /// Recomputes and stores the header checksum.
    #[inline]
    pub fn fill_checksum(&mut self) {
        let c = self.compute_checksum();
        self.set_checksum(c);
    }

    /// Sets the source address and updates the header checksum incrementally (RFC 1624 §3).
    /// The transport checksum, which covers the address in its pseudo-header, is the caller's
    /// to update (e.g. `tcp::Packet::update_checksum_for_addr`).
    #[inline]
    pub fn set_src_addr(&mut self, addr: Ipv4Addr) {
        let old = self.src_addr().octets();
        let new = addr.octets();
        let c = checksum::update(self.checksum(), &old, &new);
        self.buffer.as_mut()[field::SRC].copy_from_slice(&new);
        self.set_checksum(c);
    }

    /// Sets the destination address and updates the header checksum incrementally (RFC 1624).
    #[inline]
    pub fn set_dst_addr(&mut self, addr: Ipv4Addr) {
        let old = self.dst_addr().octets();
        let new = addr.octets();
        let c = checksum::update(self.checksum(), &old, &new);
        self.buffer.as_mut()[field::DST].copy_from_slice(&new);
        self.set_checksum(c);
    }

    /// Sets the TTL and updates the header checksum incrementally (RFC 1624; the TTL is the high
    /// byte of the TTL/protocol word).
    #[inline]
    pub fn set_ttl(&mut self, ttl: u8) {
        let proto = self.protocol();
        let old = u16::from_be_bytes([self.ttl(), proto]);
        let new = u16::from_be_bytes([ttl, proto]);
        let c = checksum::update_u16(self.checksum(), old, new);
        self.buffer.as_mut()[field::TTL] = ttl;
        self.set_checksum(c);
    }

    /// Sets the identification (does not update the checksum; see [`fill_checksum`](Self::fill_checksum)).
    #[inline]
    pub fn set_ident(&mut self, v: u16) {
        self.set_u16(field::IDENT, v);
    }

    /// Sets DSCP and ECN (does not update the checksum).
    #[inline]
    pub fn set_dscp_ecn(&mut self, dscp: u8, ecn: u8) {
        self.buffer.as_mut()[field::DSCP_ECN] = (dscp << 2) | (ecn & 0x03);
    }

    /// The payload (up to the total length), mutable.
    #[inline]
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let (start, end) = (self.header_len(), usize::from(self.total_len()));
        self.buffer.as_mut().get_mut(start..end).unwrap_or(&mut [])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An IPv4/UDP header with the Router Alert option (RFC 2113: 94 04 00 00), IHL 6.
    /// Checksum 0xe87d (computed with an independent RFC 1071 implementation).
    const WITH_OPTIONS: [u8; 32] = [
        0x46, 0x00, 0x00, 0x20, 0x12, 0x34, 0x40, 0x00, 0x01, 0x11, 0xe8, 0x7d, 0x0a, 0x00, 0x00,
        0x01, 0xe0, 0x00, 0x00, 0x16, // fixed header
        0x94, 0x04, 0x00, 0x00, // router alert
        0x30, 0x39, 0x00, 0x35, 0x00, 0x08, 0x00, 0x00, // UDP header, no checksum
    ];

    #[test]
    fn options_and_fields() {
        let p = Packet::new_checked(&WITH_OPTIONS[..]).unwrap();
        assert_eq!(p.version(), 4);
        assert_eq!(p.header_len(), 24);
        assert_eq!(p.options(), &[0x94, 0x04, 0x00, 0x00]);
        assert_eq!(p.total_len(), 32);
        assert_eq!(p.ident(), 0x1234);
        assert!(p.dont_frag());
        assert!(!p.more_frags());
        assert!(!p.is_fragment());
        assert_eq!(p.ttl(), 1);
        assert_eq!(p.protocol(), 17);
        assert_eq!(p.src_addr(), Ipv4Addr::new(10, 0, 0, 1));
        assert_eq!(p.dst_addr(), Ipv4Addr::new(224, 0, 0, 22));
        assert_eq!(p.payload().len(), 8);
        assert_eq!(p.checksum(), 0xe87d);
        assert!(p.verify_checksum());
        assert_eq!(p.compute_checksum(), 0xe87d);
    }

    #[test]
    fn padding_is_not_payload() {
        let mut b = [0u8; 46];
        b[..32].copy_from_slice(&WITH_OPTIONS);
        let p = Packet::new_checked(&b[..]).unwrap();
        assert_eq!(p.payload().len(), 8);
        assert!(p.verify_checksum());
    }

    #[test]
    fn rejects() {
        let e = |b: &[u8]| Packet::new_checked(b).unwrap_err();
        assert_eq!(e(&WITH_OPTIONS[..19]), Error::truncated(Layer::Ipv4));
        assert_eq!(e(&WITH_OPTIONS[..31]), Error::truncated(Layer::Ipv4));
        let mut b = WITH_OPTIONS;
        b[0] = 0x44;
        assert_eq!(e(&b).reason, "header length below 20");
        b[0] = 0x65;
        assert_eq!(e(&b).reason, "version is not 4");
        b[0] = 0x4f; // 60-byte header in a 32-byte buffer
        assert_eq!(e(&b), Error::truncated(Layer::Ipv4));
        let mut b = WITH_OPTIONS;
        b[3] = 23;
        assert_eq!(e(&b).reason, "total length below header length");
    }

    #[test]
    fn fragments() {
        let mut b = WITH_OPTIONS;
        b[6] = 0x20; // MF, offset 0
        b[7] = 0x00;
        let p = Packet::new_checked(&b[..]).unwrap();
        assert!(p.is_fragment() && p.is_first_fragment() && !p.is_later_fragment());
        b[6] = 0x00; // last fragment, offset 185 * 8
        b[7] = 0xb9;
        let p = Packet::new_checked(&b[..]).unwrap();
        assert!(p.is_fragment() && !p.is_first_fragment() && p.is_later_fragment());
        assert_eq!(p.frag_offset(), 1480);
        assert!(!p.more_frags());
    }

    #[test]
    fn incremental_setters() {
        let mut b = WITH_OPTIONS;
        let mut p = Packet::new_checked(&mut b[..]).unwrap();
        p.set_src_addr(Ipv4Addr::new(203, 0, 113, 9));
        assert!(p.verify_checksum());
        p.set_dst_addr(Ipv4Addr::new(198, 51, 100, 200));
        p.set_ttl(64);
        assert!(p.verify_checksum());
        let c = p.checksum();
        p.fill_checksum();
        assert_eq!(p.checksum(), c);
        assert_eq!(p.ttl(), 64);
        assert_eq!(p.src_addr(), Ipv4Addr::new(203, 0, 113, 9));
        p.set_ident(7);
        assert!(!p.verify_checksum());
        p.fill_checksum();
        assert!(p.verify_checksum());
        p.set_dscp_ecn(46, 1);
        assert_eq!((p.dscp(), p.ecn()), (46, 1));
        p.payload_mut()[0] = 0xff;
        assert_eq!(b[24], 0xff);
    }
}
