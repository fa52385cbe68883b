//! IPv6 headers (RFC 8200 §3) and a bounded walk over the extension-header chain (RFC 8200 §4)
//! to the upper-layer header.
//!
//! ```text
//!  0                   1                   2                   3
//!  0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |Version| Traffic Class |           Flow Label                  |
//! |         Payload Length        |  Next Header  |   Hop Limit   |
//! |                  Source Address (128 bits)                    |
//! |               Destination Address (128 bits)                  |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! ```

use crate::{Error, Layer, Result};
use std::net::Ipv6Addr;

/// Byte ranges of the IPv6 header (RFC 8200 §3).
mod field {
    use core::ops::Range;

    /// Version (4 bits), traffic class (8 bits), flow label (20 bits).
    pub(super) const VER_TC_FLOW: Range<usize> = 0..4;
    /// Payload length: bytes after this header, extension headers included.
    pub(super) const PAYLOAD_LEN: Range<usize> = 4..6;
    /// Next header.
    pub(super) const NEXT_HEADER: usize = 6;
    /// Hop limit.
    pub(super) const HOP_LIMIT: usize = 7;
    /// Source address.
    pub(super) const SRC: Range<usize> = 8..24;
    /// Destination address.
    pub(super) const DST: Range<usize> = 24..40;
}

/// Length of the fixed IPv6 header.
pub const HEADER_LEN: usize = 40;

/// Most extension headers [`walk_extension_headers`] skips before giving up with an error
/// (RFC 8200 §4.1 recommends each appear at most once or twice; 8 covers every legal chain).
pub const MAX_EXTENSION_HEADERS: usize = 8;

/// Next-header values this module knows (IANA "Assigned Internet Protocol Numbers").
pub mod next_header {
    /// Hop-by-Hop Options (RFC 8200 §4.3).
    pub const HOP_BY_HOP: u8 = 0;
    /// Routing (RFC 8200 §4.4).
    pub const ROUTING: u8 = 43;
    /// Fragment (RFC 8200 §4.5).
    pub const FRAGMENT: u8 = 44;
    /// Encapsulating Security Payload (RFC 4303).
    pub const ESP: u8 = 50;
    /// Authentication Header (RFC 4302).
    pub const AH: u8 = 51;
    /// No Next Header (RFC 8200 §4.7).
    pub const NO_NEXT_HEADER: u8 = 59;
    /// Destination Options (RFC 8200 §4.6).
    pub const DESTINATION_OPTIONS: u8 = 60;
}

/// The fields of an IPv6 Fragment header (RFC 8200 §4.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FragmentInfo {
    /// Offset of the fragment's data in the original packet, in bytes.
    pub offset: u16,
    /// M flag: more fragments follow.
    pub more: bool,
    /// Identification.
    pub ident: u32,
}

impl FragmentInfo {
    /// Whether this is the first fragment (offset 0) of a really fragmented packet (M set).
    /// An "atomic fragment" (offset 0, M clear; RFC 6946) is not.
    #[inline]
    pub const fn is_first(&self) -> bool {
        self.offset == 0 && self.more
    }

    /// Whether this is a non-first fragment: it carries no upper-layer header.
    #[inline]
    pub const fn is_later(&self) -> bool {
        self.offset != 0
    }
}

/// Where the extension-header chain ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct UpperLayer {
    /// The next-header value that ended the walk: the upper-layer protocol (6, 17, 58, ...),
    /// or AH (51), ESP (50), No Next Header (59), which stop the walk; for a later fragment,
    /// the protocol the fragment header names.
    pub protocol: u8,
    /// Offset, from the start of the bytes walked, of that header (for a later fragment: of
    /// the fragment's data).
    pub offset: usize,
    /// The fragment header, if one was crossed.
    pub fragment: Option<FragmentInfo>,
    /// Number of extension headers skipped.
    pub ext_headers: u8,
}

impl UpperLayer {
    /// Whether the bytes at [`offset`](Self::offset) start an upper-layer header: false for a
    /// later fragment and for No Next Header.
    #[inline]
    pub const fn has_header(&self) -> bool {
        let later = match self.fragment {
            Some(f) => f.is_later(),
            None => false,
        };
        !later && self.protocol != next_header::NO_NEXT_HEADER
    }
}

/// Walks the extension headers in `data` (the bytes after the fixed IPv6 header, up to the end
/// of the payload) starting with next-header value `first`. Skips Hop-by-Hop (0), Routing (43),
/// Fragment (44) and Destination Options (60) headers (RFC 8200 §4.2 order is not enforced);
/// stops at any other value, and after a fragment header with a non-zero offset (RFC 8200
/// §4.5: later fragments carry no upper-layer header). Errors: a header that does not fit
/// `data` (truncated), or more than [`MAX_EXTENSION_HEADERS`] headers.
#[inline]
pub fn walk_extension_headers(first: u8, data: &[u8]) -> Result<UpperLayer> {
    let mut nh = first;
    let mut off = 0usize;
    let mut fragment = None;
    let mut count = 0u8;
    // Bounded: one iteration per extension header, at most MAX_EXTENSION_HEADERS + 1.
    loop {
        let hdr_len = match nh {
            next_header::HOP_BY_HOP | next_header::ROUTING | next_header::DESTINATION_OPTIONS => {
                // RFC 8200 §4.3/§4.4/§4.6: Hdr Ext Len in 8-octet units, not counting the first 8.
                let len_byte = *data.get(off + 1).ok_or(Error::truncated(Layer::Ipv6))?;
                (usize::from(len_byte) + 1) * 8
            }
            next_header::FRAGMENT => 8,
            _ => break,
        };
        if usize::from(count) >= MAX_EXTENSION_HEADERS {
            return Err(Error::new(Layer::Ipv6, "too many extension headers"));
        }
        let hdr = data
            .get(off..off + hdr_len)
            .ok_or(Error::truncated(Layer::Ipv6))?;
        let this = nh;
        nh = hdr[0];
        off += hdr_len;
        count += 1;
        if this == next_header::FRAGMENT {
            // RFC 8200 §4.5: offset (13 bits, 8-octet units), 2 reserved bits, M flag.
            let word = u16::from_be_bytes([hdr[2], hdr[3]]);
            let info = FragmentInfo {
                offset: word & 0xfff8,
                more: word & 1 != 0,
                ident: u32::from_be_bytes([hdr[4], hdr[5], hdr[6], hdr[7]]),
            };
            fragment = Some(info);
            if info.is_later() {
                break;
            }
        }
    }
    Ok(UpperLayer {
        protocol: nh,
        offset: off,
        fragment,
        ext_headers: count,
    })
}

/// A view of an IPv6 packet. The buffer may extend past the payload length (Ethernet padding).
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

    /// Checks that the fixed header fits, the version is 6, and the payload length fits.
    #[inline]
    pub fn check(&self) -> Result<()> {
        let data = self.buffer.as_ref();
        if data.len() < HEADER_LEN {
            return Err(Error::truncated(Layer::Ipv6));
        }
        if self.version() != 6 {
            return Err(Error::new(Layer::Ipv6, "version is not 6"));
        }
        if data.len() < self.total_len() {
            return Err(Error::truncated(Layer::Ipv6));
        }
        Ok(())
    }

    /// Gives back the buffer.
    #[inline]
    pub fn into_inner(self) -> T {
        self.buffer
    }

    #[inline]
    fn word0(&self) -> u32 {
        let b = &self.buffer.as_ref()[field::VER_TC_FLOW];
        u32::from_be_bytes([b[0], b[1], b[2], b[3]])
    }

    /// IP version (6 after `new_checked`).
    #[inline]
    pub fn version(&self) -> u8 {
        self.buffer.as_ref()[0] >> 4
    }

    /// Traffic class (RFC 8200 §7: DSCP and ECN).
    #[inline]
    pub fn traffic_class(&self) -> u8 {
        (self.word0() >> 20) as u8
    }

    /// Flow label (20 bits; RFC 6437).
    #[inline]
    pub fn flow_label(&self) -> u32 {
        self.word0() & 0x000f_ffff
    }

    /// Payload length: bytes after the fixed header, extension headers included.
    #[inline]
    pub fn payload_len(&self) -> u16 {
        let b = &self.buffer.as_ref()[field::PAYLOAD_LEN];
        u16::from_be_bytes([b[0], b[1]])
    }

    /// Fixed header plus payload length.
    #[inline]
    pub fn total_len(&self) -> usize {
        HEADER_LEN + usize::from(self.payload_len())
    }

    /// Next header of the fixed header (the first extension header or the upper layer).
    #[inline]
    pub fn next_header(&self) -> u8 {
        self.buffer.as_ref()[field::NEXT_HEADER]
    }

    /// Hop limit.
    #[inline]
    pub fn hop_limit(&self) -> u8 {
        self.buffer.as_ref()[field::HOP_LIMIT]
    }

    /// Source address.
    #[inline]
    pub fn src_addr(&self) -> Ipv6Addr {
        Ipv6Addr::from(self.src_octets())
    }

    /// Destination address.
    #[inline]
    pub fn dst_addr(&self) -> Ipv6Addr {
        Ipv6Addr::from(self.dst_octets())
    }

    /// Source address bytes.
    #[inline]
    pub fn src_octets(&self) -> [u8; 16] {
        let mut a = [0; 16];
        a.copy_from_slice(&self.buffer.as_ref()[field::SRC]);
        a
    }

    /// Destination address bytes.
    #[inline]
    pub fn dst_octets(&self) -> [u8; 16] {
        let mut a = [0; 16];
        a.copy_from_slice(&self.buffer.as_ref()[field::DST]);
        a
    }

    /// The payload: extension headers and upper layer, up to the payload length.
    #[inline]
    pub fn payload(&self) -> &[u8] {
        self.buffer
            .as_ref()
            .get(HEADER_LEN..self.total_len())
            .unwrap_or(&[])
    }

    /// Walks the extension headers of the payload ([`walk_extension_headers`]). The returned
    /// offset is relative to the payload; add [`HEADER_LEN`] for the offset in this packet.
    #[inline]
    pub fn upper_layer(&self) -> Result<UpperLayer> {
        walk_extension_headers(self.next_header(), self.payload())
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    #[inline]
    fn set_word0(&mut self, w: u32) {
        self.buffer.as_mut()[field::VER_TC_FLOW].copy_from_slice(&w.to_be_bytes());
    }

    /// Sets the traffic class.
    #[inline]
    pub fn set_traffic_class(&mut self, tc: u8) {
        let w = (self.word0() & 0xf00f_ffff) | (u32::from(tc) << 20);
        self.set_word0(w);
    }

    /// Sets the flow label (low 20 bits of `label`).
    #[inline]
    pub fn set_flow_label(&mut self, label: u32) {
        let w = (self.word0() & 0xfff0_0000) | (label & 0x000f_ffff);
        self.set_word0(w);
    }

    /// Sets the payload length. A length past the buffer makes `payload()` empty.
    #[inline]
    pub fn set_payload_len(&mut self, len: u16) {
        self.buffer.as_mut()[field::PAYLOAD_LEN].copy_from_slice(&len.to_be_bytes());
    }

    /// Sets the next header of the fixed header.
    #[inline]
    pub fn set_next_header(&mut self, nh: u8) {
        self.buffer.as_mut()[field::NEXT_HEADER] = nh;
    }

    /// Sets the hop limit.
    #[inline]
    pub fn set_hop_limit(&mut self, hl: u8) {
        self.buffer.as_mut()[field::HOP_LIMIT] = hl;
    }

    /// Sets the source address. IPv6 has no header checksum; the transport checksum covers the
    /// address in its pseudo-header and is the caller's to update.
    #[inline]
    pub fn set_src_addr(&mut self, addr: Ipv6Addr) {
        self.buffer.as_mut()[field::SRC].copy_from_slice(&addr.octets());
    }

    /// Sets the destination address (see [`set_src_addr`](Self::set_src_addr)).
    #[inline]
    pub fn set_dst_addr(&mut self, addr: Ipv6Addr) {
        self.buffer.as_mut()[field::DST].copy_from_slice(&addr.octets());
    }

    /// The payload, mutable.
    #[inline]
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let end = self.total_len();
        self.buffer
            .as_mut()
            .get_mut(HEADER_LEN..end)
            .unwrap_or(&mut [])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(next: u8, payload: &[u8]) -> Vec<u8> {
        let mut b = vec![
            0x6b, 0x81, 0x23, 0x45, // version 6, TC 0xb8, flow label 0x12345
            0, 0, next, 64,
        ];
        b[4..6].copy_from_slice(&(payload.len() as u16).to_be_bytes());
        b.extend_from_slice(&Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1).octets());
        b.extend_from_slice(&Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 2).octets());
        b.extend_from_slice(payload);
        b
    }

    #[test]
    fn fixed_fields() {
        let b = header(59, &[]);
        let p = Packet::new_checked(&b[..]).unwrap();
        assert_eq!(p.version(), 6);
        assert_eq!(p.traffic_class(), 0xb8);
        assert_eq!(p.flow_label(), 0x12345);
        assert_eq!(p.payload_len(), 0);
        assert_eq!(p.hop_limit(), 64);
        assert_eq!(p.src_addr().to_string(), "2001:db8::1");
        assert_eq!(p.dst_addr().to_string(), "2001:db8::2");
        let u = p.upper_layer().unwrap();
        assert_eq!(u.protocol, 59);
        assert!(!u.has_header());
    }

    #[test]
    fn setters() {
        let mut b = header(6, &[0; 20]);
        let mut p = Packet::new_checked(&mut b[..]).unwrap();
        p.set_traffic_class(0x01);
        p.set_flow_label(0xfffff);
        p.set_hop_limit(1);
        p.set_next_header(17);
        p.set_src_addr(Ipv6Addr::LOCALHOST);
        p.set_dst_addr(Ipv6Addr::UNSPECIFIED);
        p.payload_mut()[0] = 9;
        assert_eq!(p.version(), 6);
        assert_eq!(p.traffic_class(), 0x01);
        assert_eq!(p.flow_label(), 0xfffff);
        assert_eq!(p.hop_limit(), 1);
        assert_eq!(p.next_header(), 17);
        assert_eq!(p.src_addr(), Ipv6Addr::LOCALHOST);
        assert_eq!(p.dst_addr(), Ipv6Addr::UNSPECIFIED);
        p.set_payload_len(4);
        assert_eq!(p.payload(), &[9, 0, 0, 0]);
        p.set_payload_len(400);
        assert!(p.payload().is_empty());
    }

    #[test]
    fn truncated_and_version() {
        let b = header(6, &[0; 20]);
        assert_eq!(
            Packet::new_checked(&b[..59]).unwrap_err(),
            Error::truncated(Layer::Ipv6)
        );
        assert!(Packet::new_checked(&b[..39]).is_err());
        let mut b = b;
        b[0] = 0x45;
        assert_eq!(
            Packet::new_checked(&b[..]).unwrap_err().reason,
            "version is not 6"
        );
    }

    #[test]
    fn walk_chain() {
        // Hop-by-Hop (8 bytes, PadN), Routing type 0 with 0 segments left (8 bytes),
        // Destination Options (16 bytes), then TCP.
        let mut chain = vec![43, 0, 1, 4, 0, 0, 0, 0];
        chain.extend_from_slice(&[60, 0, 0, 0, 0, 0, 0, 0]);
        chain.extend_from_slice(&[6, 1, 1, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        let u = walk_extension_headers(0, &chain).unwrap();
        assert_eq!(u.protocol, 6);
        assert_eq!(u.offset, 32);
        assert_eq!(u.ext_headers, 3);
        assert_eq!(u.fragment, None);
        assert!(u.has_header());
        // Any cut inside the chain is truncated.
        for cut in 0..chain.len() {
            assert_eq!(
                walk_extension_headers(0, &chain[..cut]).unwrap_err(),
                Error::truncated(Layer::Ipv6),
                "cut at {cut}"
            );
        }
    }

    #[test]
    fn walk_fragments() {
        // Fragment header: next UDP, offset 0, M set, ident 0xdeadbeef.
        let first = [17, 0, 0x00, 0x01, 0xde, 0xad, 0xbe, 0xef];
        let u = walk_extension_headers(44, &first).unwrap();
        assert_eq!(u.protocol, 17);
        assert_eq!(u.offset, 8);
        let f = u.fragment.unwrap();
        assert!(f.is_first() && f.more && f.ident == 0xdeadbeef);
        assert!(u.has_header());
        // Later fragment: offset 1448 (181 * 8), M clear; a Destination Options header after
        // the fragment header would be in the fragmentable part, so the walk stops here.
        let later = [60, 0, 0x05, 0xa8, 0, 0, 0, 1];
        let u = walk_extension_headers(44, &later).unwrap();
        assert_eq!(u.protocol, 60);
        assert_eq!(u.offset, 8);
        let f = u.fragment.unwrap();
        assert_eq!(f.offset, 1448);
        assert!(!f.more && f.is_later() && !f.is_first());
        assert!(!u.has_header());
        // Atomic fragment (RFC 6946).
        let atomic = [6, 0, 0, 0, 0, 0, 0, 1];
        let f = walk_extension_headers(44, &atomic)
            .unwrap()
            .fragment
            .unwrap();
        assert!(!f.is_first() && !f.is_later());
    }

    #[test]
    fn walk_bounded() {
        // Nine destination-options headers in a row: one too many.
        let mut chain = Vec::new();
        for _ in 0..9 {
            chain.extend_from_slice(&[60, 0, 1, 4, 0, 0, 0, 0]);
        }
        chain.extend_from_slice(&[0; 8]);
        assert_eq!(
            walk_extension_headers(60, &chain).unwrap_err().reason,
            "too many extension headers"
        );
        // Eight are fine: make the eighth point to TCP.
        chain[7 * 8] = 6;
        let u = walk_extension_headers(60, &chain).unwrap();
        assert_eq!((u.protocol, u.offset, u.ext_headers), (6, 64, 8));
        // AH and ESP stop the walk.
        for stop in [50, 51] {
            let u = walk_extension_headers(stop, &[]).unwrap();
            assert_eq!((u.protocol, u.offset), (stop, 0));
            assert!(u.has_header());
        }
    }
}
