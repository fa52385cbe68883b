//! UDP headers (RFC 768), with the checksum over the IPv4 (RFC 768) or IPv6 (RFC 8200 §8.1)
//! pseudo-header and incremental updates (RFC 1624).
//!
//! ```text
//!  0      7 8     15 16    23 24    31
//! +--------+--------+--------+--------+
//! |   Source Port   |   Dest. Port    |
//! |     Length      |    Checksum     |
//! +--------+--------+--------+--------+
//! ```
//!
//! Over IPv4 a checksum of 0 means "not computed" (RFC 768); a computed 0 is sent as 0xffff.
//! Over IPv6 the checksum is mandatory (RFC 8200 §8.1), so a stored 0 does not verify.

use crate::checksum;
use crate::flow::proto;
use crate::{Error, Layer, Result};
use core::ops::Range;

pub use crate::tcp::PseudoHeader;

/// Byte ranges of the UDP header (RFC 768 "Format").
mod field {
    use core::ops::Range;

    /// Source port.
    pub(super) const SRC_PORT: Range<usize> = 0..2;
    /// Destination port.
    pub(super) const DST_PORT: Range<usize> = 2..4;
    /// Length of header and data.
    pub(super) const LENGTH: Range<usize> = 4..6;
    /// Checksum.
    pub(super) const CHECKSUM: Range<usize> = 6..8;
}

/// Length of the UDP header.
pub const HEADER_LEN: usize = 8;

/// A view of a UDP datagram. The buffer may extend past the UDP length (the datagram ends
/// there; RFC 768 "Length").
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

    /// Checks that the header fits and `8 <= length <= buffer length`.
    #[inline]
    pub fn check(&self) -> Result<()> {
        let len = self.buffer.as_ref().len();
        if len < HEADER_LEN {
            return Err(Error::truncated(Layer::Udp));
        }
        let l = usize::from(self.len());
        if l < HEADER_LEN {
            return Err(Error::new(Layer::Udp, "length below 8"));
        }
        if len < l {
            return Err(Error::truncated(Layer::Udp));
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

    /// Length of header and data, as stored.
    #[allow(clippy::len_without_is_empty)]
    #[inline]
    pub fn len(&self) -> u16 {
        self.u16_at(field::LENGTH)
    }

    /// Checksum as stored.
    #[inline]
    pub fn checksum(&self) -> u16 {
        self.u16_at(field::CHECKSUM)
    }

    /// The datagram: header and data up to the UDP length.
    #[inline]
    fn datagram(&self) -> &[u8] {
        let data = self.buffer.as_ref();
        data.get(..usize::from(self.len())).unwrap_or(data)
    }

    /// The data after the header, up to the UDP length.
    #[inline]
    pub fn payload(&self) -> &[u8] {
        self.buffer
            .as_ref()
            .get(HEADER_LEN..usize::from(self.len()))
            .unwrap_or(&[])
    }

    /// The checksum the datagram should carry for `pseudo` (0xffff where the sum gives 0).
    #[inline]
    pub fn compute_checksum(&self, pseudo: &PseudoHeader) -> u16 {
        let d = self.datagram();
        let s = checksum::combine(
            pseudo.sum(proto::UDP, d.len()),
            checksum::combine(
                checksum::sum(d.get(..field::CHECKSUM.start).unwrap_or(&[])),
                checksum::sum(d.get(field::CHECKSUM.end..).unwrap_or(&[])),
            ),
        );
        match checksum::finish(s) {
            0 => 0xffff,
            c => c,
        }
    }

    /// Whether the checksum is correct for `pseudo`: `None` when the checksum is 0 over IPv4
    /// (not computed), `Some(false)` when it is 0 over IPv6.
    #[inline]
    pub fn verify_checksum(&self, pseudo: &PseudoHeader) -> Option<bool> {
        if self.checksum() == 0 {
            return if pseudo.is_ipv4() { None } else { Some(false) };
        }
        let d = self.datagram();
        let s = checksum::combine(pseudo.sum(proto::UDP, d.len()), checksum::sum(d));
        Some(checksum::finish(s) == 0)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    #[inline]
    fn set_u16(&mut self, r: Range<usize>, v: u16) {
        self.buffer.as_mut()[r].copy_from_slice(&v.to_be_bytes());
    }

    /// Sets the stored checksum (0 means "none" over IPv4).
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

    /// Applies an RFC 1624 update to the checksum, keeping 0 ("none") as 0 and sending a
    /// result of 0 as 0xffff (RFC 768).
    #[inline]
    fn update_checksum(&mut self, old: &[u8], new: &[u8]) {
        let c = self.checksum();
        if c == 0 {
            return;
        }
        let c = match checksum::update(c, old, new) {
            0 => 0xffff,
            c => c,
        };
        self.set_checksum(c);
    }

    /// Sets the source port and updates the checksum incrementally (a 0 checksum stays 0).
    #[inline]
    pub fn set_src_port(&mut self, port: u16) {
        let old = self.src_port();
        self.set_u16(field::SRC_PORT, port);
        self.update_checksum(&old.to_be_bytes(), &port.to_be_bytes());
    }

    /// Sets the destination port and updates the checksum incrementally (a 0 checksum stays 0).
    #[inline]
    pub fn set_dst_port(&mut self, port: u16) {
        let old = self.dst_port();
        self.set_u16(field::DST_PORT, port);
        self.update_checksum(&old.to_be_bytes(), &port.to_be_bytes());
    }

    /// Updates the checksum after an address of the pseudo-header changed from `old` to `new`
    /// (both 4 or both 16 bytes; RFC 1624 §3). A 0 checksum stays 0.
    #[inline]
    pub fn update_checksum_for_addr(&mut self, old: &[u8], new: &[u8]) {
        self.update_checksum(old, new);
    }

    /// Sets the length field (does not update the checksum). A length past the buffer makes
    /// `payload()` empty.
    #[inline]
    pub fn set_len(&mut self, len: u16) {
        self.set_u16(field::LENGTH, len);
    }

    /// The data after the header, up to the UDP length, mutable.
    #[inline]
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let end = usize::from(self.len());
        self.buffer
            .as_mut()
            .get_mut(HEADER_LEN..end)
            .unwrap_or(&mut [])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, Ipv6Addr};

    const V4: PseudoHeader = PseudoHeader::V4 {
        src: Ipv4Addr::new(10, 0, 0, 1),
        dst: Ipv4Addr::new(10, 0, 0, 2),
    };

    #[test]
    fn checks() {
        let mut b = [
            0x30, 0x39, 0x00, 0x35, 0x00, 0x0a, 0x00, 0x00, 0xaa, 0xbb, 0xcc,
        ];
        let p = Packet::new_checked(&b[..]).unwrap();
        assert_eq!((p.src_port(), p.dst_port(), p.len()), (12345, 53, 10));
        assert_eq!(p.payload(), &[0xaa, 0xbb]);
        assert_eq!(p.verify_checksum(&V4), None);
        let v6 = PseudoHeader::V6 {
            src: Ipv6Addr::LOCALHOST,
            dst: Ipv6Addr::LOCALHOST,
        };
        assert_eq!(p.verify_checksum(&v6), Some(false));
        assert_eq!(
            Packet::new_checked(&b[..9]).unwrap_err(),
            Error::truncated(Layer::Udp)
        );
        assert!(Packet::new_checked(&b[..7]).is_err());
        b[5] = 7;
        assert_eq!(
            Packet::new_checked(&b[..]).unwrap_err().reason,
            "length below 8"
        );
    }

    #[test]
    fn zero_checksum_stays_zero() {
        let mut b = [0x30, 0x39, 0x00, 0x35, 0x00, 0x0a, 0x00, 0x00, 0xaa, 0xbb];
        let mut p = Packet::new_checked(&mut b[..]).unwrap();
        p.set_src_port(1);
        p.set_dst_port(2);
        p.update_checksum_for_addr(&[10, 0, 0, 1], &[192, 0, 2, 1]);
        assert_eq!(p.checksum(), 0);
        p.fill_checksum(&V4);
        assert_ne!(p.checksum(), 0);
        assert_eq!(p.verify_checksum(&V4), Some(true));
        p.set_len(9);
        assert_eq!(p.payload_mut(), &mut [0xaa]);
    }
}
