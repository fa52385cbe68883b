//! Ethernet II frames (IEEE 802.3 clause 3.2.6, "Ethernet II" / DIX framing) with up to two
//! VLAN tags: IEEE 802.1Q customer tags (TPID 0x8100) and IEEE 802.1ad service tags (TPID
//! 0x88a8, and the pre-standard 0x9100) for QinQ.
//!
//! ```text
//!  0      6      12        14 / 18 / 22
//! +------+------+-[TPID|TCI]{0,2}-+-----------+---------
//! | dst  | src  |  VLAN tags      | EtherType | payload
//! +------+------+-----------------+-----------+---------
//! ```
//!
//! The frame check sequence is not part of the buffer (capture files and sockets strip it).

use crate::{Error, Layer, Result};
use core::fmt;

/// Byte ranges of the fixed Ethernet header (IEEE 802.3 §3.2).
mod field {
    use core::ops::Range;

    /// Destination MAC address.
    pub(super) const DST: Range<usize> = 0..6;
    /// Source MAC address.
    pub(super) const SRC: Range<usize> = 6..12;
    /// EtherType, or the TPID of the first VLAN tag.
    pub(super) const ETHERTYPE: Range<usize> = 12..14;
    /// Length of the untagged header.
    pub(super) const HEADER_LEN: usize = 14;
    /// Length of one VLAN tag (TPID + TCI, IEEE 802.1Q §9.6).
    pub(super) const TAG_LEN: usize = 4;
}

/// Length of an untagged Ethernet II header.
pub const HEADER_LEN: usize = field::HEADER_LEN;

/// Most VLAN tags a [`Frame`] parses; a third tag's TPID is reported as the EtherType.
pub const MAX_VLAN_TAGS: usize = 2;

/// A 48-bit IEEE 802 MAC address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct MacAddr(pub [u8; 6]);

impl MacAddr {
    /// The broadcast address ff:ff:ff:ff:ff:ff.
    pub const BROADCAST: MacAddr = MacAddr([0xff; 6]);

    /// The address's six bytes.
    #[inline]
    pub const fn octets(&self) -> [u8; 6] {
        self.0
    }

    /// Whether this is the broadcast address.
    #[inline]
    pub fn is_broadcast(&self) -> bool {
        *self == Self::BROADCAST
    }

    /// Whether the group bit (I/G, least significant bit of the first octet) is set:
    /// multicast or broadcast (IEEE 802 §8.2).
    #[inline]
    pub const fn is_multicast(&self) -> bool {
        self.0[0] & 0x01 != 0
    }
}

impl From<[u8; 6]> for MacAddr {
    fn from(b: [u8; 6]) -> Self {
        MacAddr(b)
    }
}

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            b[0], b[1], b[2], b[3], b[4], b[5]
        )
    }
}

/// An EtherType (IEEE Registration Authority "EtherType" registry).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EtherType(pub u16);

impl EtherType {
    /// IPv4 (RFC 894).
    pub const IPV4: EtherType = EtherType(0x0800);
    /// ARP (RFC 826).
    pub const ARP: EtherType = EtherType(0x0806);
    /// IPv6 (RFC 2464).
    pub const IPV6: EtherType = EtherType(0x86dd);
    /// IEEE 802.1Q customer VLAN tag.
    pub const VLAN: EtherType = EtherType(0x8100);
    /// IEEE 802.1ad service VLAN tag (QinQ outer tag).
    pub const QINQ: EtherType = EtherType(0x88a8);
    /// Pre-standard QinQ outer tag used by some vendors.
    pub const QINQ_OLD: EtherType = EtherType(0x9100);

    /// The raw 16-bit value.
    #[inline]
    pub const fn value(self) -> u16 {
        self.0
    }

    /// Whether this value is a VLAN tag protocol identifier this module parses.
    #[inline]
    pub const fn is_vlan_tpid(self) -> bool {
        matches!(self.0, 0x8100 | 0x88a8 | 0x9100)
    }
}

impl From<u16> for EtherType {
    fn from(v: u16) -> Self {
        EtherType(v)
    }
}

impl From<EtherType> for u16 {
    fn from(v: EtherType) -> Self {
        v.0
    }
}

impl PartialEq<u16> for EtherType {
    fn eq(&self, other: &u16) -> bool {
        self.0 == *other
    }
}

impl fmt::Display for EtherType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "0x{:04x}", self.0)
    }
}

/// One VLAN tag: its TPID and the fields of its tag control information (IEEE 802.1Q §9.6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct VlanTag {
    /// Tag protocol identifier (0x8100, 0x88a8 or 0x9100).
    pub tpid: u16,
    /// Priority code point (3 bits).
    pub pcp: u8,
    /// Drop eligible indicator (1 bit).
    pub dei: bool,
    /// VLAN identifier (12 bits).
    pub vid: u16,
}

/// A read/write view of an Ethernet II frame with up to [`MAX_VLAN_TAGS`] VLAN tags.
#[derive(Debug, Clone)]
pub struct Frame<T: AsRef<[u8]>> {
    buffer: T,
}

#[inline]
fn is_tpid(data: &[u8], at: usize) -> bool {
    match data.get(at..at + 2) {
        Some(b) => EtherType(u16::from_be_bytes([b[0], b[1]])).is_vlan_tpid(),
        None => false,
    }
}

impl<T: AsRef<[u8]>> Frame<T> {
    /// Wraps `buffer` without checking anything; getters may panic on a short buffer.
    #[inline]
    pub const fn new_unchecked(buffer: T) -> Self {
        Frame { buffer }
    }

    /// Wraps `buffer` after [`check_len`](Self::check_len): afterwards no getter panics.
    #[inline]
    pub fn new_checked(buffer: T) -> Result<Self> {
        let f = Self::new_unchecked(buffer);
        f.check_len()?;
        Ok(f)
    }

    /// Checks that the untagged header and every VLAN tag it announces fit the buffer.
    #[inline]
    pub fn check_len(&self) -> Result<()> {
        let len = self.buffer.as_ref().len();
        if len < field::HEADER_LEN || len < self.header_len() {
            return Err(Error::truncated(Layer::Ethernet));
        }
        Ok(())
    }

    /// Gives back the buffer.
    #[inline]
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// The whole buffer.
    #[inline]
    pub fn as_bytes(&self) -> &[u8] {
        self.buffer.as_ref()
    }

    /// Destination MAC address.
    #[inline]
    pub fn dst_addr(&self) -> MacAddr {
        let mut a = [0; 6];
        a.copy_from_slice(&self.buffer.as_ref()[field::DST]);
        MacAddr(a)
    }

    /// Source MAC address.
    #[inline]
    pub fn src_addr(&self) -> MacAddr {
        let mut a = [0; 6];
        a.copy_from_slice(&self.buffer.as_ref()[field::SRC]);
        MacAddr(a)
    }

    /// Number of VLAN tags before the EtherType (0, 1 or 2). A tag counts when its TPID is
    /// 0x8100, 0x88a8 or 0x9100 (IEEE 802.1Q §9.5, IEEE 802.1ad).
    #[inline]
    pub fn vlan_count(&self) -> usize {
        let data = self.buffer.as_ref();
        if !is_tpid(data, field::ETHERTYPE.start) {
            0
        } else if !is_tpid(data, field::ETHERTYPE.start + field::TAG_LEN) {
            1
        } else {
            2
        }
    }

    /// The `index`-th VLAN tag, outermost first; `None` past [`vlan_count`](Self::vlan_count).
    #[inline]
    pub fn vlan(&self, index: usize) -> Option<VlanTag> {
        if index >= self.vlan_count() {
            return None;
        }
        let at = field::ETHERTYPE.start + index * field::TAG_LEN;
        let b = self.buffer.as_ref().get(at..at + field::TAG_LEN)?;
        let tci = u16::from_be_bytes([b[2], b[3]]);
        Some(VlanTag {
            tpid: u16::from_be_bytes([b[0], b[1]]),
            pcp: (tci >> 13) as u8,
            dei: tci & 0x1000 != 0,
            vid: tci & 0x0fff,
        })
    }

    /// VLAN id of the `index`-th tag, outermost first.
    #[inline]
    pub fn vlan_id(&self, index: usize) -> Option<u16> {
        self.vlan(index).map(|t| t.vid)
    }

    /// Priority code point of the `index`-th tag, outermost first.
    #[inline]
    pub fn vlan_pcp(&self, index: usize) -> Option<u8> {
        self.vlan(index).map(|t| t.pcp)
    }

    /// Length of the header including VLAN tags: the offset of the payload.
    #[inline]
    pub fn header_len(&self) -> usize {
        field::HEADER_LEN + self.vlan_count() * field::TAG_LEN
    }

    /// The EtherType after any VLAN tags.
    #[inline]
    pub fn ethertype(&self) -> EtherType {
        let end = self.header_len();
        match self.buffer.as_ref().get(end - 2..end) {
            Some(b) => EtherType(u16::from_be_bytes([b[0], b[1]])),
            None => EtherType(0),
        }
    }

    /// The bytes after the header and tags (up to the end of the buffer: may include padding).
    #[inline]
    pub fn payload(&self) -> &[u8] {
        self.buffer.as_ref().get(self.header_len()..).unwrap_or(&[])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Frame<T> {
    /// Writes an untagged header (IEEE 802.3 §3.1.1): destination, source, EtherType.
    #[inline]
    pub fn emit(&mut self, dst: MacAddr, src: MacAddr, ethertype: EtherType) {
        let b = self.buffer.as_mut();
        b[field::DST].copy_from_slice(&dst.0);
        b[field::SRC].copy_from_slice(&src.0);
        b[field::ETHERTYPE].copy_from_slice(&ethertype.0.to_be_bytes());
    }

    /// Sets the destination MAC address.
    #[inline]
    pub fn set_dst_addr(&mut self, addr: MacAddr) {
        self.buffer.as_mut()[field::DST].copy_from_slice(&addr.0);
    }

    /// Sets the source MAC address.
    #[inline]
    pub fn set_src_addr(&mut self, addr: MacAddr) {
        self.buffer.as_mut()[field::SRC].copy_from_slice(&addr.0);
    }

    /// Sets the EtherType after any VLAN tags. Setting a VLAN TPID here changes the tag count.
    #[inline]
    pub fn set_ethertype(&mut self, ethertype: EtherType) {
        let end = self.header_len();
        if let Some(b) = self.buffer.as_mut().get_mut(end - 2..end) {
            b.copy_from_slice(&ethertype.0.to_be_bytes());
        }
    }

    /// Sets the VLAN id of the `index`-th tag, keeping PCP and DEI; returns whether the tag
    /// exists. Only the low 12 bits of `vid` are used.
    #[inline]
    pub fn set_vlan_id(&mut self, index: usize, vid: u16) -> bool {
        self.modify_tci(index, |tci| (tci & 0xf000) | (vid & 0x0fff))
    }

    /// Sets the priority code point of the `index`-th tag; returns whether the tag exists.
    /// Only the low 3 bits of `pcp` are used.
    #[inline]
    pub fn set_vlan_pcp(&mut self, index: usize, pcp: u8) -> bool {
        self.modify_tci(index, |tci| (tci & 0x1fff) | (u16::from(pcp & 0x7) << 13))
    }

    fn modify_tci(&mut self, index: usize, f: impl FnOnce(u16) -> u16) -> bool {
        if index >= self.vlan_count() {
            return false;
        }
        let at = field::ETHERTYPE.start + index * field::TAG_LEN + 2;
        match self.buffer.as_mut().get_mut(at..at + 2) {
            Some(b) => {
                let tci = f(u16::from_be_bytes([b[0], b[1]]));
                b.copy_from_slice(&tci.to_be_bytes());
                true
            }
            None => false,
        }
    }

    /// The bytes after the header and tags, mutable.
    #[inline]
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let at = self.header_len();
        self.buffer.as_mut().get_mut(at..).unwrap_or(&mut [])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A QinQ frame: outer 802.1ad tag (PCP 3, VID 100), inner 802.1Q tag (PCP 0, VID 200),
    /// then IPv4.
    const QINQ: [u8; 26] = [
        0x00, 0x11, 0x22, 0x33, 0x44, 0x55, // dst
        0x66, 0x77, 0x88, 0x99, 0xaa, 0xbb, // src
        0x88, 0xa8, 0x60, 0x64, // S-tag: PCP 3, DEI 0, VID 100
        0x81, 0x00, 0x10, 0xc8, // C-tag: PCP 0, DEI 1, VID 200
        0x08, 0x00, // IPv4
        0x45, 0x00, 0x00, 0x14,
    ];

    #[test]
    fn qinq_tags() {
        let f = Frame::new_checked(&QINQ[..]).unwrap();
        assert_eq!(f.dst_addr().to_string(), "00:11:22:33:44:55");
        assert_eq!(f.src_addr(), MacAddr([0x66, 0x77, 0x88, 0x99, 0xaa, 0xbb]));
        assert_eq!(f.vlan_count(), 2);
        assert_eq!(
            f.vlan(0),
            Some(VlanTag {
                tpid: 0x88a8,
                pcp: 3,
                dei: false,
                vid: 100
            })
        );
        assert_eq!(
            f.vlan(1),
            Some(VlanTag {
                tpid: 0x8100,
                pcp: 0,
                dei: true,
                vid: 200
            })
        );
        assert_eq!(f.vlan(2), None);
        assert_eq!(f.ethertype(), EtherType::IPV4);
        assert_eq!(f.header_len(), 22);
        assert_eq!(f.payload(), &[0x45, 0x00, 0x00, 0x14]);
    }

    #[test]
    fn untagged_and_truncated() {
        let f = Frame::new_checked(&QINQ[..14]).unwrap_err();
        assert_eq!(f, Error::truncated(Layer::Ethernet));
        // The outer tag fits, the inner one does not.
        assert!(Frame::new_checked(&QINQ[..21]).is_err());
        assert!(Frame::new_checked(&QINQ[..13]).is_err());
        let mut plain = [0u8; 14];
        plain[12] = 0x86;
        plain[13] = 0xdd;
        let f = Frame::new_checked(&plain[..]).unwrap();
        assert_eq!(f.vlan_count(), 0);
        assert_eq!(f.ethertype(), EtherType::IPV6);
        assert!(f.payload().is_empty());
    }

    #[test]
    fn third_tag_is_reported_as_ethertype() {
        let mut b = QINQ;
        b[20] = 0x91;
        b[21] = 0x00;
        let f = Frame::new_checked(&b[..]).unwrap();
        assert_eq!(f.vlan_count(), 2);
        assert_eq!(f.ethertype(), EtherType::QINQ_OLD);
    }

    #[test]
    fn setters() {
        let mut b = QINQ;
        let mut f = Frame::new_checked(&mut b[..]).unwrap();
        f.set_dst_addr(MacAddr::BROADCAST);
        f.set_src_addr(MacAddr([2, 0, 0, 0, 0, 1]));
        assert!(f.set_vlan_id(1, 0xabc));
        assert!(f.set_vlan_pcp(0, 7));
        assert!(!f.set_vlan_id(2, 1));
        f.set_ethertype(EtherType::IPV6);
        assert!(f.dst_addr().is_broadcast());
        assert!(f.dst_addr().is_multicast());
        assert!(!f.src_addr().is_multicast());
        assert_eq!(f.vlan_id(1), Some(0xabc));
        assert!(f.vlan(1).unwrap().dei);
        assert_eq!(f.vlan_pcp(0), Some(7));
        assert_eq!(f.vlan_id(0), Some(100));
        assert_eq!(f.ethertype(), 0x86dd);
        f.payload_mut()[0] = 0x60;
        assert_eq!(b[22], 0x60);
    }
}
