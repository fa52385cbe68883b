//! GENEVE headers (RFC 8926): the encapsulation a cluster's root and its instances exchange
//! frames in, carried over UDP port [`PORT`].
//!
//! ```text
//!  0                   1                   2                   3
//!  0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |Ver|  Opt Len  |O|C|    Rsvd.  |          Protocol Type        |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |        Virtual Network Identifier (VNI)       |    Reserved   |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |                    Variable-Length Options                    |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! ```
//!
//! Each option (§3.5) is a 4-byte header — class (16 bits), type (8 bits, the high bit marks
//! a critical option), 3 reserved bits and a 5-bit length in 4-byte words — followed by its
//! data. The payload follows the options; for [`PROTO_ETHERNET`] it is an Ethernet frame.

use crate::{Error, Layer, Result};

/// The IANA-assigned UDP destination port (RFC 8926 §3.3).
pub const PORT: u16 = 6081;
/// Length of the fixed header.
pub const HEADER_LEN: usize = 8;
/// Protocol type of an Ethernet payload (Transparent Ethernet Bridging, RFC 8926 §3.4).
pub const PROTO_ETHERNET: u16 = 0x6558;
/// Longest option area: 63 words (the 6-bit Opt Len).
pub const MAX_OPTIONS_LEN: usize = 63 * 4;
/// Longest option data: 31 words (the 5-bit option length).
pub const MAX_OPTION_DATA: usize = 31 * 4;

/// Byte positions of the fixed header.
mod field {
    use core::ops::Range;

    /// Version (2 bits) and Opt Len (6 bits).
    pub(super) const VER_OPT_LEN: usize = 0;
    /// O, C and reserved bits.
    pub(super) const FLAGS: usize = 1;
    /// Protocol type of the payload.
    pub(super) const PROTOCOL: Range<usize> = 2..4;
    /// Virtual network identifier (24 bits).
    pub(super) const VNI: Range<usize> = 4..7;
}

const FLAG_OAM: u8 = 0x80;
const FLAG_CRITICAL: u8 = 0x40;

/// A view of a GENEVE header with its options and payload (a UDP payload).
#[derive(Debug, Clone)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps `buffer` after checking that the header and its options fit and the version is
    /// 0 (RFC 8926 §3.4: "packets with an unknown version MUST be dropped").
    pub fn new_checked(buffer: T) -> Result<Self> {
        let b = buffer.as_ref();
        if b.len() < HEADER_LEN {
            return Err(Error::truncated(Layer::Geneve));
        }
        if b[field::VER_OPT_LEN] >> 6 != 0 {
            return Err(Error::new(Layer::Geneve, "unknown version"));
        }
        let p = Packet { buffer };
        if p.buffer.as_ref().len() < p.header_len() {
            return Err(Error::truncated(Layer::Geneve));
        }
        Ok(p)
    }

    /// Gives back the buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// Length of the options, bytes.
    #[inline]
    pub fn options_len(&self) -> usize {
        usize::from(self.buffer.as_ref()[field::VER_OPT_LEN] & 0x3f) * 4
    }

    /// Length of header and options: where the payload starts.
    #[inline]
    pub fn header_len(&self) -> usize {
        HEADER_LEN + self.options_len()
    }

    /// The O bit: a control (OAM) packet, not data (§3.4).
    #[inline]
    pub fn oam(&self) -> bool {
        self.buffer.as_ref()[field::FLAGS] & FLAG_OAM != 0
    }

    /// The C bit: critical options are present (§3.4).
    #[inline]
    pub fn critical(&self) -> bool {
        self.buffer.as_ref()[field::FLAGS] & FLAG_CRITICAL != 0
    }

    /// Protocol type of the payload.
    #[inline]
    pub fn protocol(&self) -> u16 {
        let b = &self.buffer.as_ref()[field::PROTOCOL];
        u16::from_be_bytes([b[0], b[1]])
    }

    /// Virtual network identifier.
    #[inline]
    pub fn vni(&self) -> u32 {
        let b = &self.buffer.as_ref()[field::VNI];
        u32::from_be_bytes([0, b[0], b[1], b[2]])
    }

    /// The options, in order. An option whose length runs past the option area ends the
    /// iteration (see [`Options::malformed`]).
    #[inline]
    pub fn options(&self) -> Options<'_> {
        Options {
            rest: &self.buffer.as_ref()[HEADER_LEN..self.header_len()],
            malformed: false,
        }
    }

    /// The data of the first option of `class` and `kind` (the type without its critical
    /// bit), if present.
    pub fn option(&self, class: u16, kind: u8) -> Option<&[u8]> {
        self.options()
            .find(|o| o.class == class && o.kind & 0x7f == kind & 0x7f)
            .map(|o| o.data)
    }

    /// The payload after the options.
    #[inline]
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[self.header_len()..]
    }
}

/// One option (§3.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Opt<'a> {
    /// Option class (namespace of the type).
    pub class: u16,
    /// Type; its high bit marks the option critical.
    pub kind: u8,
    /// Data (a multiple of 4 bytes).
    pub data: &'a [u8],
}

/// The options of a header, in order.
#[derive(Debug, Clone)]
pub struct Options<'a> {
    rest: &'a [u8],
    malformed: bool,
}

impl Options<'_> {
    /// Whether iteration stopped at an option that overruns the option area.
    pub fn malformed(&self) -> bool {
        self.malformed
    }
}

impl<'a> Iterator for Options<'a> {
    type Item = Opt<'a>;

    fn next(&mut self) -> Option<Opt<'a>> {
        if self.rest.len() < 4 {
            return None;
        }
        let r = self.rest;
        let len = 4 + usize::from(r[3] & 0x1f) * 4;
        let Some(data) = r.get(4..len) else {
            self.malformed = true;
            self.rest = &[];
            return None;
        };
        self.rest = &r[len..];
        Some(Opt {
            class: u16::from_be_bytes([r[0], r[1]]),
            kind: r[2],
            data,
        })
    }
}

/// Writes a GENEVE header with one option of `class`/`kind` holding `data` at the start of
/// `buf` and returns its length (where the payload goes); `None` when `buf` is too short or
/// `data` is not a multiple of 4 bytes or longer than [`MAX_OPTION_DATA`]. The C bit is set
/// when `kind`'s high bit is.
pub fn emit(
    buf: &mut [u8],
    oam: bool,
    protocol: u16,
    vni: u32,
    class: u16,
    kind: u8,
    data: &[u8],
) -> Option<usize> {
    if !data.len().is_multiple_of(4) || data.len() > MAX_OPTION_DATA {
        return None;
    }
    let len = HEADER_LEN + 4 + data.len();
    let b = buf.get_mut(..len)?;
    let words = (4 + data.len()) / 4;
    b[field::VER_OPT_LEN] = words as u8; // version 0
    b[field::FLAGS] =
        if oam { FLAG_OAM } else { 0 } | if kind & 0x80 != 0 { FLAG_CRITICAL } else { 0 };
    b[field::PROTOCOL].copy_from_slice(&protocol.to_be_bytes());
    b[field::VNI].copy_from_slice(&vni.to_be_bytes()[1..]);
    b[7] = 0;
    b[8..10].copy_from_slice(&class.to_be_bytes());
    b[10] = kind;
    b[11] = (data.len() / 4) as u8;
    b[12..len].copy_from_slice(data);
    Some(len)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn emit_then_view() {
        let mut buf = [0u8; 64];
        let n = emit(
            &mut buf,
            true,
            PROTO_ETHERNET,
            0x12_3456,
            0xfff0,
            0x81,
            &[7; 16],
        )
        .unwrap();
        assert_eq!(n, 28);
        buf[n..n + 4].copy_from_slice(b"data");
        let p = Packet::new_checked(&buf[..n + 4]).unwrap();
        assert!(p.oam() && p.critical());
        assert_eq!(
            (p.protocol(), p.vni(), p.header_len()),
            (0x6558, 0x12_3456, 28)
        );
        assert_eq!(p.option(0xfff0, 1), Some(&[7u8; 16][..]));
        assert_eq!(p.option(0xfff0, 2), None);
        assert_eq!(p.payload(), b"data");
        // RFC 8926 §3.4 bytes: Opt Len 5 words, O and C set, TEB.
        assert_eq!(
            &buf[..12],
            &[5, 0xc0, 0x65, 0x58, 0x12, 0x34, 0x56, 0, 0xff, 0xf0, 0x81, 4]
        );
        assert_eq!(emit(&mut buf, false, 0, 0, 0, 0, &[1, 2, 3]), None);
        assert_eq!(emit(&mut buf[..20], false, 0, 0, 0, 0, &[0; 16]), None);
    }

    #[test]
    fn bad_headers_are_errors() {
        assert!(Packet::new_checked(&[0u8; 7][..]).is_err());
        assert!(Packet::new_checked(&[0x40u8, 0, 0, 0, 0, 0, 0, 0][..]).is_err());
        // Opt Len says one word, none there.
        assert!(Packet::new_checked(&[1u8, 0, 0, 0, 0, 0, 0, 0][..]).is_err());
        // An option longer than the option area: iteration stops and says so.
        let b = [1u8, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xf0, 1, 2];
        let p = Packet::new_checked(&b[..]).unwrap();
        let mut o = p.options();
        assert_eq!(o.next(), None);
        assert!(o.malformed());
    }

    #[test]
    fn any_bytes_view_without_panic() {
        use proptest::prelude::*;
        proptest!(|(b in proptest::collection::vec(any::<u8>(), 0..300))| {
            if let Ok(p) = Packet::new_checked(&b[..]) {
                let _ = (p.vni(), p.protocol(), p.oam(), p.payload().len());
                prop_assert!(p.options().map(|o| o.data.len() + 4).sum::<usize>() <= p.options_len());
            }
        });
    }
}
