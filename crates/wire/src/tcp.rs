//! TCP headers and options (RFC 9293 §3.1), with the checksum over the IPv4 (RFC 9293 §3.1)
//! or IPv6 (RFC 8200 §8.1) pseudo-header and incremental updates (RFC 1624).
//!
//! ```text
//!  0                   1                   2                   3
//!  0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |          Source Port          |       Destination Port        |
//! |                        Sequence Number                        |
//! |                    Acknowledgment Number                      |
//! |  Data |       |C|E|U|A|P|R|S|F|                               |
//! | Offset| Rsrvd |W|C|R|C|S|S|Y|I|            Window             |
//! |           Checksum            |         Urgent Pointer        |
//! |                           [Options]                           |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! ```
//!
//! A view must cover exactly the TCP segment (header and data up to the end of the IP
//! payload): the checksum covers the whole buffer and the pseudo-header length is its length.

use crate::checksum;
use crate::flow::proto;
use crate::{Error, Layer, Result};
use core::ops::{BitOr, Range};
use std::net::{Ipv4Addr, Ipv6Addr};

/// Byte ranges of the TCP header (RFC 9293 §3.1).
mod field {
    use core::ops::Range;

    /// Source port.
    pub(super) const SRC_PORT: Range<usize> = 0..2;
    /// Destination port.
    pub(super) const DST_PORT: Range<usize> = 2..4;
    /// Sequence number.
    pub(super) const SEQ: Range<usize> = 4..8;
    /// Acknowledgment number.
    pub(super) const ACK: Range<usize> = 8..12;
    /// Data offset (high nibble, in 32-bit words).
    pub(super) const DATA_OFF: usize = 12;
    /// Control bits CWR..FIN.
    pub(super) const FLAGS: usize = 13;
    /// Window.
    pub(super) const WINDOW: Range<usize> = 14..16;
    /// Checksum.
    pub(super) const CHECKSUM: Range<usize> = 16..18;
    /// Urgent pointer.
    pub(super) const URGENT: Range<usize> = 18..20;
}

/// Length of a header without options.
pub const HEADER_LEN: usize = 20;

/// Longest header: data offset 15.
pub const MAX_HEADER_LEN: usize = 60;

/// The IP addresses of a transport checksum's pseudo-header (RFC 9293 §3.1 for IPv4, RFC 8200
/// §8.1 for IPv6). The protocol and length are filled in by the view that uses it. Shared by
/// [`crate::udp`] and [`crate::icmp`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PseudoHeader {
    /// IPv4 source and destination.
    V4 {
        /// Source address.
        src: Ipv4Addr,
        /// Destination address.
        dst: Ipv4Addr,
    },
    /// IPv6 source and destination (the final destination when a Routing header is present).
    V6 {
        /// Source address.
        src: Ipv6Addr,
        /// Destination address.
        dst: Ipv6Addr,
    },
}

impl PseudoHeader {
    /// The pseudo-header's partial sum for `protocol` and upper-layer `length`.
    #[inline]
    pub fn sum(&self, protocol: u8, length: usize) -> u32 {
        match self {
            PseudoHeader::V4 { src, dst } => {
                checksum::pseudo_header_v4(src.octets(), dst.octets(), protocol, length as u16)
            }
            PseudoHeader::V6 { src, dst } => {
                checksum::pseudo_header_v6(&src.octets(), &dst.octets(), protocol, length as u32)
            }
        }
    }

    /// Whether the addresses are IPv4.
    #[inline]
    pub const fn is_ipv4(&self) -> bool {
        matches!(self, PseudoHeader::V4 { .. })
    }
}

impl<T: AsRef<[u8]>> From<&crate::ipv4::Packet<T>> for PseudoHeader {
    fn from(p: &crate::ipv4::Packet<T>) -> Self {
        PseudoHeader::V4 {
            src: p.src_addr(),
            dst: p.dst_addr(),
        }
    }
}

impl<T: AsRef<[u8]>> From<&crate::ipv6::Packet<T>> for PseudoHeader {
    fn from(p: &crate::ipv6::Packet<T>) -> Self {
        PseudoHeader::V6 {
            src: p.src_addr(),
            dst: p.dst_addr(),
        }
    }
}

/// The eight TCP control bits (RFC 9293 §3.1, RFC 3168 §6.1 for ECE and CWR).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Flags(pub u8);

impl Flags {
    /// No more data from sender.
    pub const FIN: Flags = Flags(0x01);
    /// Synchronize sequence numbers.
    pub const SYN: Flags = Flags(0x02);
    /// Reset the connection.
    pub const RST: Flags = Flags(0x04);
    /// Push function.
    pub const PSH: Flags = Flags(0x08);
    /// Acknowledgment field is significant.
    pub const ACK: Flags = Flags(0x10);
    /// Urgent pointer field is significant.
    pub const URG: Flags = Flags(0x20);
    /// ECN-Echo (RFC 3168).
    pub const ECE: Flags = Flags(0x40);
    /// Congestion Window Reduced (RFC 3168).
    pub const CWR: Flags = Flags(0x80);

    /// Whether every bit of `other` is set.
    #[inline]
    pub const fn contains(self, other: Flags) -> bool {
        self.0 & other.0 == other.0
    }

    /// The raw bits.
    #[inline]
    pub const fn bits(self) -> u8 {
        self.0
    }
}

impl BitOr for Flags {
    type Output = Flags;
    fn bitor(self, rhs: Flags) -> Flags {
        Flags(self.0 | rhs.0)
    }
}

/// SACK blocks of a SACK option (RFC 2018 §3): pairs of (left edge, right edge).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SackBlocks<'a>(&'a [u8]);

impl<'a> SackBlocks<'a> {
    /// Number of blocks.
    #[inline]
    pub fn len(&self) -> usize {
        self.0.len() / 8
    }

    /// Whether there is no block (never true for a block list the iterator yields).
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The `i`-th block.
    #[inline]
    pub fn get(&self, i: usize) -> Option<(u32, u32)> {
        let b = self.0.get(i * 8..i * 8 + 8)?;
        Some((
            u32::from_be_bytes([b[0], b[1], b[2], b[3]]),
            u32::from_be_bytes([b[4], b[5], b[6], b[7]]),
        ))
    }

    /// The blocks in order.
    #[inline]
    pub fn iter(&self) -> impl Iterator<Item = (u32, u32)> + 'a {
        let s = *self;
        (0..s.len()).filter_map(move |i| s.get(i))
    }
}

/// One TCP option (RFC 9293 §3.2; IANA "TCP Option Kind Numbers").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TcpOption<'a> {
    /// End of option list (kind 0); the iterator stops after it.
    EndOfList,
    /// No-operation (kind 1).
    NoOp,
    /// Maximum segment size (kind 2, RFC 9293 §3.7.1).
    Mss(u16),
    /// Window scale shift count (kind 3, RFC 7323 §2).
    WindowScale(u8),
    /// SACK permitted (kind 4, RFC 2018 §2).
    SackPermitted,
    /// SACK blocks (kind 5, RFC 2018 §3).
    Sack(SackBlocks<'a>),
    /// Timestamps (kind 8, RFC 7323 §3).
    Timestamps {
        /// TSval.
        tsval: u32,
        /// TSecr.
        tsecr: u32,
    },
    /// Another kind with a well-formed length; `data` excludes kind and length bytes.
    Unknown {
        /// Option kind.
        kind: u8,
        /// Option data.
        data: &'a [u8],
    },
    /// A malformed option: a length byte that is missing, below 2 or past the header, or a
    /// known kind with the wrong length. `data` is what follows the kind byte (up to the end of
    /// the options when the length is unusable, then the iterator stops).
    Malformed {
        /// Option kind.
        kind: u8,
        /// The remaining bytes.
        data: &'a [u8],
    },
}

/// Iterator over the options of a TCP header. Each step consumes at least one byte, so it ends
/// after at most 40 items; it never panics, whatever the bytes.
#[derive(Debug, Clone)]
pub struct Options<'a> {
    rest: &'a [u8],
}

impl<'a> Options<'a> {
    /// Iterates over the raw option bytes `data` (the header past byte 20).
    #[inline]
    pub const fn new(data: &'a [u8]) -> Self {
        Options { rest: data }
    }
}

impl<'a> Iterator for Options<'a> {
    type Item = TcpOption<'a>;

    fn next(&mut self) -> Option<TcpOption<'a>> {
        let (&kind, after_kind) = self.rest.split_first()?;
        match kind {
            0 => {
                self.rest = &[];
                return Some(TcpOption::EndOfList);
            }
            1 => {
                self.rest = after_kind;
                return Some(TcpOption::NoOp);
            }
            _ => {}
        }
        let len = match after_kind.first() {
            Some(&l) if l >= 2 && usize::from(l) <= self.rest.len() => usize::from(l),
            _ => {
                self.rest = &[];
                return Some(TcpOption::Malformed {
                    kind,
                    data: after_kind,
                });
            }
        };
        let data = &self.rest[2..len];
        self.rest = &self.rest[len..];
        let be16 = |d: &[u8]| u16::from_be_bytes([d[0], d[1]]);
        let be32 = |d: &[u8]| u32::from_be_bytes([d[0], d[1], d[2], d[3]]);
        Some(match (kind, data.len()) {
            (2, 2) => TcpOption::Mss(be16(data)),
            (3, 1) => TcpOption::WindowScale(data[0]),
            (4, 0) => TcpOption::SackPermitted,
            // 1 to 4 blocks: 40 bytes of options hold at most four (RFC 2018 §3).
            (5, n) if n > 0 && n % 8 == 0 && n <= 32 => TcpOption::Sack(SackBlocks(data)),
            (8, 8) => TcpOption::Timestamps {
                tsval: be32(&data[0..4]),
                tsecr: be32(&data[4..8]),
            },
            (2 | 3 | 4 | 5 | 8, _) => TcpOption::Malformed { kind, data },
            _ => TcpOption::Unknown { kind, data },
        })
    }
}

/// A view of a TCP segment.
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

    /// Checks that the fixed header fits, the data offset is at least 5 and the header with
    /// options fits.
    #[inline]
    pub fn check(&self) -> Result<()> {
        let len = self.buffer.as_ref().len();
        if len < HEADER_LEN {
            return Err(Error::truncated(Layer::Tcp));
        }
        let hl = self.header_len();
        if hl < HEADER_LEN {
            return Err(Error::new(Layer::Tcp, "data offset below 5"));
        }
        if len < hl {
            return Err(Error::truncated(Layer::Tcp));
        }
        Ok(())
    }

    /// Gives back the buffer.
    #[inline]
    pub fn into_inner(self) -> T {
        self.buffer
    }

    #[inline]
    fn u16_at(&self, r: Range<usize>) -> u16 {
        let b = &self.buffer.as_ref()[r];
        u16::from_be_bytes([b[0], b[1]])
    }

    #[inline]
    fn u32_at(&self, r: Range<usize>) -> u32 {
        let b = &self.buffer.as_ref()[r];
        u32::from_be_bytes([b[0], b[1], b[2], b[3]])
    }

    /// Source port.
    #[inline]
    pub fn src_port(&self) -> u16 {
        self.u16_at(field::SRC_PORT)
    }

    /// Destination port.
    #[inline]
    pub fn dst_port(&self) -> u16 {
        self.u16_at(field::DST_PORT)
    }

    /// Sequence number.
    #[inline]
    pub fn seq_number(&self) -> u32 {
        self.u32_at(field::SEQ)
    }

    /// Acknowledgment number.
    #[inline]
    pub fn ack_number(&self) -> u32 {
        self.u32_at(field::ACK)
    }

    /// Header length in bytes (data offset * 4), options included.
    #[inline]
    pub fn header_len(&self) -> usize {
        usize::from(self.buffer.as_ref()[field::DATA_OFF] >> 4) * 4
    }

    /// The control bits.
    #[inline]
    pub fn flags(&self) -> Flags {
        Flags(self.buffer.as_ref()[field::FLAGS])
    }

    /// FIN flag.
    #[inline]
    pub fn fin(&self) -> bool {
        self.flags().contains(Flags::FIN)
    }

    /// SYN flag.
    #[inline]
    pub fn syn(&self) -> bool {
        self.flags().contains(Flags::SYN)
    }

    /// RST flag.
    #[inline]
    pub fn rst(&self) -> bool {
        self.flags().contains(Flags::RST)
    }

    /// PSH flag.
    #[inline]
    pub fn psh(&self) -> bool {
        self.flags().contains(Flags::PSH)
    }

    /// ACK flag.
    #[inline]
    pub fn ack(&self) -> bool {
        self.flags().contains(Flags::ACK)
    }

    /// URG flag.
    #[inline]
    pub fn urg(&self) -> bool {
        self.flags().contains(Flags::URG)
    }

    /// ECE flag.
    #[inline]
    pub fn ece(&self) -> bool {
        self.flags().contains(Flags::ECE)
    }

    /// CWR flag.
    #[inline]
    pub fn cwr(&self) -> bool {
        self.flags().contains(Flags::CWR)
    }

    /// Window (unscaled).
    #[inline]
    pub fn window_len(&self) -> u16 {
        self.u16_at(field::WINDOW)
    }

    /// Checksum as stored.
    #[inline]
    pub fn checksum(&self) -> u16 {
        self.u16_at(field::CHECKSUM)
    }

    /// Urgent pointer.
    #[inline]
    pub fn urgent_at(&self) -> u16 {
        self.u16_at(field::URGENT)
    }

    /// The option bytes (bytes 20 to the header length).
    #[inline]
    pub fn options_bytes(&self) -> &[u8] {
        self.buffer
            .as_ref()
            .get(HEADER_LEN..self.header_len())
            .unwrap_or(&[])
    }

    /// Iterator over the options.
    #[inline]
    pub fn options(&self) -> Options<'_> {
        Options::new(self.options_bytes())
    }

    /// The MSS option's value.
    pub fn mss(&self) -> Option<u16> {
        self.options().find_map(|o| match o {
            TcpOption::Mss(v) => Some(v),
            _ => None,
        })
    }

    /// The window scale option's shift count.
    pub fn window_scale(&self) -> Option<u8> {
        self.options().find_map(|o| match o {
            TcpOption::WindowScale(v) => Some(v),
            _ => None,
        })
    }

    /// Whether the SACK-permitted option is present.
    pub fn sack_permitted(&self) -> bool {
        self.options().any(|o| o == TcpOption::SackPermitted)
    }

    /// The timestamps option as (TSval, TSecr).
    pub fn timestamps(&self) -> Option<(u32, u32)> {
        self.options().find_map(|o| match o {
            TcpOption::Timestamps { tsval, tsecr } => Some((tsval, tsecr)),
            _ => None,
        })
    }

    /// The segment data after the header.
    #[inline]
    pub fn payload(&self) -> &[u8] {
        self.buffer.as_ref().get(self.header_len()..).unwrap_or(&[])
    }

    /// The checksum the segment should carry for `pseudo` (the checksum field taken as zero).
    #[inline]
    pub fn compute_checksum(&self, pseudo: &PseudoHeader) -> u16 {
        let data = self.buffer.as_ref();
        let s = checksum::combine(
            pseudo.sum(proto::TCP, data.len()),
            checksum::combine(
                checksum::sum(data.get(..field::CHECKSUM.start).unwrap_or(&[])),
                checksum::sum(data.get(field::CHECKSUM.end..).unwrap_or(&[])),
            ),
        );
        checksum::finish(s)
    }

    /// Whether the checksum is correct for `pseudo`.
    #[inline]
    pub fn verify_checksum(&self, pseudo: &PseudoHeader) -> bool {
        let data = self.buffer.as_ref();
        let s = checksum::combine(pseudo.sum(proto::TCP, data.len()), checksum::sum(data));
        checksum::finish(s) == 0
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    #[inline]
    fn set_u16(&mut self, r: Range<usize>, v: u16) {
        self.buffer.as_mut()[r].copy_from_slice(&v.to_be_bytes());
    }

    #[inline]
    fn set_u32(&mut self, r: Range<usize>, v: u32) {
        self.buffer.as_mut()[r].copy_from_slice(&v.to_be_bytes());
    }

    /// Sets the stored checksum.
    #[inline]
    pub fn set_checksum(&mut self, v: u16) {
        self.set_u16(field::CHECKSUM, v);
    }

    /// Recomputes and stores the checksum for `pseudo`.
    #[inline]
    pub fn fill_checksum(&mut self, pseudo: &PseudoHeader) {
        let c = self.compute_checksum(pseudo);
        self.set_checksum(c);
    }

    /// Sets the source port and updates the checksum incrementally (RFC 1624 §3).
    #[inline]
    pub fn set_src_port(&mut self, port: u16) {
        let c = checksum::update_u16(self.checksum(), self.src_port(), port);
        self.set_u16(field::SRC_PORT, port);
        self.set_checksum(c);
    }

    /// Sets the destination port and updates the checksum incrementally (RFC 1624 §3).
    #[inline]
    pub fn set_dst_port(&mut self, port: u16) {
        let c = checksum::update_u16(self.checksum(), self.dst_port(), port);
        self.set_u16(field::DST_PORT, port);
        self.set_checksum(c);
    }

    /// Updates the checksum after an address of the pseudo-header changed from `old` to `new`
    /// (both 4 bytes for IPv4 or both 16 for IPv6; RFC 1624 §3). Call it once per changed
    /// address, e.g. after `ipv4::Packet::set_src_addr`.
    #[inline]
    pub fn update_checksum_for_addr(&mut self, old: &[u8], new: &[u8]) {
        let c = checksum::update(self.checksum(), old, new);
        self.set_checksum(c);
    }

    /// Sets the sequence number (does not update the checksum).
    #[inline]
    pub fn set_seq_number(&mut self, v: u32) {
        self.set_u32(field::SEQ, v);
    }

    /// Sets the acknowledgment number (does not update the checksum).
    #[inline]
    pub fn set_ack_number(&mut self, v: u32) {
        self.set_u32(field::ACK, v);
    }

    /// Sets the control bits (does not update the checksum).
    #[inline]
    pub fn set_flags(&mut self, f: Flags) {
        self.buffer.as_mut()[field::FLAGS] = f.0;
    }

    /// Sets the window (does not update the checksum).
    #[inline]
    pub fn set_window_len(&mut self, v: u16) {
        self.set_u16(field::WINDOW, v);
    }

    /// The segment data, mutable.
    #[inline]
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let at = self.header_len();
        self.buffer.as_mut().get_mut(at..).unwrap_or(&mut [])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_iterator_edge_cases() {
        let all: Vec<_> = Options::new(&[1, 1, 2, 4, 0x05, 0xb4, 3, 3, 7, 0, 9, 9]).collect();
        assert_eq!(
            all,
            [
                TcpOption::NoOp,
                TcpOption::NoOp,
                TcpOption::Mss(1460),
                TcpOption::WindowScale(7),
                TcpOption::EndOfList
            ]
        );
        // A length of 0 or 1 would loop forever in a naive parser.
        for bad in [0u8, 1] {
            let raw = [30, bad, 1, 1];
            let v: Vec<_> = Options::new(&raw).collect();
            assert_eq!(
                v,
                [TcpOption::Malformed {
                    kind: 30,
                    data: &raw[1..]
                }]
            );
        }
        // Length past the end; kind with no length byte.
        let v: Vec<_> = Options::new(&[1, 8, 10, 0, 0]).collect();
        assert_eq!(v.len(), 2);
        assert!(matches!(v[1], TcpOption::Malformed { kind: 8, .. }));
        let v: Vec<_> = Options::new(&[2]).collect();
        assert_eq!(v, [TcpOption::Malformed { kind: 2, data: &[] }]);
        // Known kind, wrong length: reported, iteration goes on.
        let v: Vec<_> = Options::new(&[2, 3, 0, 1, 254, 4, 0xf9, 0x89]).collect();
        assert_eq!(
            v,
            [
                TcpOption::Malformed {
                    kind: 2,
                    data: &[0]
                },
                TcpOption::NoOp,
                TcpOption::Unknown {
                    kind: 254,
                    data: &[0xf9, 0x89]
                }
            ]
        );
        // SACK with two blocks, and an empty SACK.
        let mut sack = vec![5, 18];
        for v in [1u32, 2, 3, 4] {
            sack.extend_from_slice(&v.to_be_bytes());
        }
        match Options::new(&sack).next() {
            Some(TcpOption::Sack(b)) => {
                assert_eq!(b.len(), 2);
                assert_eq!(b.iter().collect::<Vec<_>>(), [(1, 2), (3, 4)]);
                assert_eq!(b.get(2), None);
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            Options::new(&[5, 2]).next(),
            Some(TcpOption::Malformed { kind: 5, .. })
        ));
    }

    #[test]
    fn header_checks() {
        let mut h = [0u8; 24];
        h[12] = 0x40; // data offset 4
        assert_eq!(
            Packet::new_checked(&h[..]).unwrap_err().reason,
            "data offset below 5"
        );
        h[12] = 0x70; // 28 bytes
        assert_eq!(
            Packet::new_checked(&h[..]).unwrap_err(),
            Error::truncated(Layer::Tcp)
        );
        h[12] = 0x60;
        let p = Packet::new_checked(&h[..]).unwrap();
        assert_eq!(p.options_bytes(), &[0, 0, 0, 0]);
        assert_eq!(p.options().count(), 1);
        assert!(p.payload().is_empty());
        assert!(Packet::new_checked(&h[..19]).is_err());
    }

    #[test]
    fn flags() {
        let f = Flags::SYN | Flags::ACK;
        assert!(f.contains(Flags::SYN) && f.contains(Flags::ACK) && !f.contains(Flags::FIN));
        assert_eq!(f.bits(), 0x12);
        let mut h = [0u8; 20];
        h[12] = 0x50;
        let mut p = Packet::new_checked(&mut h[..]).unwrap();
        p.set_flags(Flags(0xff));
        assert!(p.fin() && p.syn() && p.rst() && p.psh() && p.ack() && p.urg());
        assert!(p.ece() && p.cwr());
        p.set_flags(Flags::RST);
        assert!(p.rst() && !p.fin() && !p.syn() && !p.ack());
    }
}
