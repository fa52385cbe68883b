//! ARP for IPv4 over Ethernet (RFC 826).
//!
//! ```text
//!  0      2      4    5    6      8     14    18     24    28
//! +------+------+----+----+------+-----+-----+------+-----+
//! | htype| ptype|hlen|plen| oper | sha | spa | tha  | tpa |
//! +------+------+----+----+------+-----+-----+------+-----+
//! ```

use crate::ethernet::MacAddr;
use crate::{Error, Layer, Result};
use std::net::Ipv4Addr;

/// Byte ranges of the ARP packet for Ethernet/IPv4 (RFC 826 "Packet format").
mod field {
    use core::ops::Range;

    /// Hardware address space (ar$hrd).
    pub(super) const HTYPE: Range<usize> = 0..2;
    /// Protocol address space (ar$pro).
    pub(super) const PTYPE: Range<usize> = 2..4;
    /// Hardware address length (ar$hln).
    pub(super) const HLEN: usize = 4;
    /// Protocol address length (ar$pln).
    pub(super) const PLEN: usize = 5;
    /// Opcode (ar$op).
    pub(super) const OPER: Range<usize> = 6..8;
    /// Sender hardware address (ar$sha).
    pub(super) const SHA: Range<usize> = 8..14;
    /// Sender protocol address (ar$spa).
    pub(super) const SPA: Range<usize> = 14..18;
    /// Target hardware address (ar$tha).
    pub(super) const THA: Range<usize> = 18..24;
    /// Target protocol address (ar$tpa).
    pub(super) const TPA: Range<usize> = 24..28;
    /// Fixed part common to every ARP packet.
    pub(super) const FIXED_LEN: usize = 8;
}

/// Length of an Ethernet/IPv4 ARP packet.
pub const PACKET_LEN: usize = 28;

/// Hardware type of Ethernet (RFC 826; IANA "Hardware Types").
pub const HTYPE_ETHERNET: u16 = 1;

/// ARP operation codes (RFC 826).
pub mod operation {
    /// Request (ares_op$REQUEST).
    pub const REQUEST: u16 = 1;
    /// Reply (ares_op$REPLY).
    pub const REPLY: u16 = 2;
}

/// A view of an ARP packet. [`new_checked`](Self::new_checked) accepts only Ethernet/IPv4 ARP.
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

    /// Wraps `buffer` after [`check_len`](Self::check_len) and a check that the packet maps
    /// IPv4 addresses to Ethernet addresses (htype 1, ptype 0x0800, hlen 6, plen 4).
    #[inline]
    pub fn new_checked(buffer: T) -> Result<Self> {
        let p = Self::new_unchecked(buffer);
        p.check_len()?;
        if p.hardware_type() != HTYPE_ETHERNET {
            return Err(Error::new(Layer::Arp, "hardware type is not Ethernet"));
        }
        if p.protocol_type() != 0x0800 {
            return Err(Error::new(Layer::Arp, "protocol type is not IPv4"));
        }
        if p.hardware_len() != 6 || p.protocol_len() != 4 {
            return Err(Error::new(Layer::Arp, "address lengths are not 6 and 4"));
        }
        Ok(p)
    }

    /// Checks the length of any ARP packet: the fixed 8 bytes and the four addresses whose
    /// lengths it declares fit the buffer. This alone does not make the address getters safe
    /// (they assume Ethernet/IPv4 lengths); use [`new_checked`](Self::new_checked) for that.
    #[inline]
    pub fn check_len(&self) -> Result<()> {
        let data = self.buffer.as_ref();
        if data.len() < field::FIXED_LEN || data.len() < self.packet_len() {
            return Err(Error::truncated(Layer::Arp));
        }
        Ok(())
    }

    /// Length the packet declares: 8 + 2 * (hlen + plen). 8 when the buffer is shorter than 8.
    #[inline]
    pub fn packet_len(&self) -> usize {
        let data = self.buffer.as_ref();
        match (data.get(field::HLEN), data.get(field::PLEN)) {
            (Some(&h), Some(&p)) => field::FIXED_LEN + 2 * (usize::from(h) + usize::from(p)),
            _ => field::FIXED_LEN,
        }
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

    #[inline]
    fn ipv4_at(&self, r: core::ops::Range<usize>) -> Ipv4Addr {
        let b = &self.buffer.as_ref()[r];
        Ipv4Addr::new(b[0], b[1], b[2], b[3])
    }

    #[inline]
    fn mac_at(&self, r: core::ops::Range<usize>) -> MacAddr {
        let mut a = [0; 6];
        a.copy_from_slice(&self.buffer.as_ref()[r]);
        MacAddr(a)
    }

    /// Hardware type (1 = Ethernet).
    #[inline]
    pub fn hardware_type(&self) -> u16 {
        self.u16_at(field::HTYPE)
    }

    /// Protocol type (an EtherType; 0x0800 = IPv4).
    #[inline]
    pub fn protocol_type(&self) -> u16 {
        self.u16_at(field::PTYPE)
    }

    /// Hardware address length in bytes.
    #[inline]
    pub fn hardware_len(&self) -> u8 {
        self.buffer.as_ref()[field::HLEN]
    }

    /// Protocol address length in bytes.
    #[inline]
    pub fn protocol_len(&self) -> u8 {
        self.buffer.as_ref()[field::PLEN]
    }

    /// Operation (see [`operation`]).
    #[inline]
    pub fn operation(&self) -> u16 {
        self.u16_at(field::OPER)
    }

    /// Sender hardware address.
    #[inline]
    pub fn sender_hardware_addr(&self) -> MacAddr {
        self.mac_at(field::SHA)
    }

    /// Sender protocol address.
    #[inline]
    pub fn sender_protocol_addr(&self) -> Ipv4Addr {
        self.ipv4_at(field::SPA)
    }

    /// Target hardware address.
    #[inline]
    pub fn target_hardware_addr(&self) -> MacAddr {
        self.mac_at(field::THA)
    }

    /// Target protocol address.
    #[inline]
    pub fn target_protocol_addr(&self) -> Ipv4Addr {
        self.ipv4_at(field::TPA)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Writes the fixed part of an Ethernet/IPv4 ARP packet (RFC 826: hardware space
    /// Ethernet, protocol space IPv4, address lengths 6 and 4), so the rest can be set.
    #[inline]
    pub fn set_ethernet_ipv4(&mut self) {
        let b = self.buffer.as_mut();
        b[field::HTYPE].copy_from_slice(&HTYPE_ETHERNET.to_be_bytes());
        b[field::PTYPE].copy_from_slice(&0x0800u16.to_be_bytes());
        b[field::HLEN] = 6;
        b[field::PLEN] = 4;
    }

    /// Sets the operation.
    #[inline]
    pub fn set_operation(&mut self, op: u16) {
        self.buffer.as_mut()[field::OPER].copy_from_slice(&op.to_be_bytes());
    }

    /// Sets the sender hardware address.
    #[inline]
    pub fn set_sender_hardware_addr(&mut self, a: MacAddr) {
        self.buffer.as_mut()[field::SHA].copy_from_slice(&a.0);
    }

    /// Sets the sender protocol address.
    #[inline]
    pub fn set_sender_protocol_addr(&mut self, a: Ipv4Addr) {
        self.buffer.as_mut()[field::SPA].copy_from_slice(&a.octets());
    }

    /// Sets the target hardware address.
    #[inline]
    pub fn set_target_hardware_addr(&mut self, a: MacAddr) {
        self.buffer.as_mut()[field::THA].copy_from_slice(&a.0);
    }

    /// Sets the target protocol address.
    #[inline]
    pub fn set_target_protocol_addr(&mut self, a: Ipv4Addr) {
        self.buffer.as_mut()[field::TPA].copy_from_slice(&a.octets());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// "Who has 192.168.1.1? Tell 192.168.1.100" from 00:1b:21:3a:4f:5e.
    const REQUEST: [u8; 28] = [
        0x00, 0x01, 0x08, 0x00, 0x06, 0x04, 0x00, 0x01, // Ethernet/IPv4, request
        0x00, 0x1b, 0x21, 0x3a, 0x4f, 0x5e, 0xc0, 0xa8, 0x01, 0x64, // sender
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xc0, 0xa8, 0x01, 0x01, // target
    ];

    #[test]
    fn request() {
        let p = Packet::new_checked(&REQUEST[..]).unwrap();
        assert_eq!(p.operation(), operation::REQUEST);
        assert_eq!(
            p.sender_hardware_addr(),
            MacAddr([0x00, 0x1b, 0x21, 0x3a, 0x4f, 0x5e])
        );
        assert_eq!(p.sender_protocol_addr(), Ipv4Addr::new(192, 168, 1, 100));
        assert_eq!(p.target_hardware_addr(), MacAddr([0; 6]));
        assert_eq!(p.target_protocol_addr(), Ipv4Addr::new(192, 168, 1, 1));
        assert_eq!(p.packet_len(), PACKET_LEN);
    }

    #[test]
    fn rejects() {
        assert_eq!(
            Packet::new_checked(&REQUEST[..27]).unwrap_err(),
            Error::truncated(Layer::Arp)
        );
        assert!(Packet::new_checked(&REQUEST[..5]).is_err());
        let mut b = REQUEST;
        b[1] = 6; // IEEE 802 networks
        assert_eq!(
            Packet::new_checked(&b[..]).unwrap_err().reason,
            "hardware type is not Ethernet"
        );
        let mut b = REQUEST;
        b[2] = 0x86;
        b[3] = 0xdd;
        assert!(Packet::new_checked(&b[..]).is_err());
        let mut b = REQUEST;
        b[5] = 16;
        // Declares 8 + 2 * (6 + 16) = 52 bytes.
        assert_eq!(
            Packet::new_checked(&b[..]).unwrap_err(),
            Error::truncated(Layer::Arp)
        );
        let mut long = [0u8; 52];
        long[..28].copy_from_slice(&b);
        let p = Packet::new_unchecked(&long[..]);
        assert!(p.check_len().is_ok());
        assert!(Packet::new_checked(&long[..]).is_err());
    }

    #[test]
    fn reply_setters() {
        let mut b = REQUEST;
        let mut p = Packet::new_checked(&mut b[..]).unwrap();
        p.set_operation(operation::REPLY);
        p.set_target_hardware_addr(MacAddr([0x00, 0x1b, 0x21, 0x3a, 0x4f, 0x5e]));
        p.set_target_protocol_addr(Ipv4Addr::new(192, 168, 1, 100));
        p.set_sender_hardware_addr(MacAddr([2, 0, 0, 0, 0, 9]));
        p.set_sender_protocol_addr(Ipv4Addr::new(192, 168, 1, 1));
        assert_eq!(p.operation(), 2);
        assert_eq!(p.sender_protocol_addr(), Ipv4Addr::new(192, 168, 1, 1));
        assert_eq!(p.target_protocol_addr(), Ipv4Addr::new(192, 168, 1, 100));
        assert_eq!(p.sender_hardware_addr().0[5], 9);
        assert_eq!(&b[18..24], &[0x00, 0x1b, 0x21, 0x3a, 0x4f, 0x5e]);
    }
}
