//! Keys (a packet's field) and matches (an entry's matching field M(e), HashMVT §III-A).

use flowstate_wire::flow::FLOW_KEY_MAX_BYTES;
use flowstate_wire::FlowKey;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Bytes a key or a match can hold: a tagged 5-tuple (1 + 37 bytes) fits.
pub const KEY_BYTES: usize = 40;

/// Bits a key or a match can hold.
pub const KEY_BITS: u16 = (KEY_BYTES * 8) as u16;

/// The packet field a table matches on (HashMVT §III-A: "a configurable packet field").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Field {
    /// The IPv4 source address (32 bits); IPv6 packets have no key.
    SrcV4,
    /// The IPv4 destination address (32 bits).
    DstV4,
    /// The IPv6 source address (128 bits); IPv4 packets have no key.
    SrcV6,
    /// The IPv6 destination address (128 bits).
    DstV6,
    /// The exact 5-tuple, in [`FlowKey::to_bytes`] order, zero-padded to 37 bytes.
    FiveTuple,
    /// Nothing: every packet has the same empty key, so only `*` entries match.
    Any,
    /// Keys the owner builds itself ([`Key::from_bytes`]), `n` bits wide.
    Raw(u16),
}

impl Field {
    /// Width of the field's keys in bits.
    pub const fn width(self) -> u16 {
        match self {
            Field::SrcV4 | Field::DstV4 => 32,
            Field::SrcV6 | Field::DstV6 => 128,
            Field::FiveTuple => (FLOW_KEY_MAX_BYTES * 8) as u16,
            Field::Any => 0,
            Field::Raw(n) => {
                if n > KEY_BITS {
                    KEY_BITS
                } else {
                    n
                }
            }
        }
    }

    /// The key of a packet with flow `flow` for this field; `None` when the packet does not
    /// have the field (an IPv6 packet in an IPv4 table) or the field is [`Field::Raw`].
    #[inline]
    pub fn key_of(self, flow: &FlowKey) -> Option<Key> {
        match (self, flow.src, flow.dst) {
            (Field::SrcV4, IpAddr::V4(a), _) | (Field::DstV4, _, IpAddr::V4(a)) => Some(Key::v4(a)),
            (Field::SrcV6, IpAddr::V6(a), _) | (Field::DstV6, _, IpAddr::V6(a)) => Some(Key::v6(a)),
            (Field::FiveTuple, _, _) => Some(Key::flow(flow)),
            (Field::Any, _, _) => Some(Key::EMPTY),
            _ => None,
        }
    }
}

/// A packet's field value: up to [`KEY_BITS`] bits, big-endian, bits past `bits` zero.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Key {
    bytes: [u8; KEY_BYTES],
    bits: u16,
}

impl Key {
    /// The empty key (of [`Field::Any`]).
    pub const EMPTY: Key = Key {
        bytes: [0; KEY_BYTES],
        bits: 0,
    };

    /// An IPv4 address.
    #[inline]
    pub fn v4(a: Ipv4Addr) -> Key {
        let mut k = Key::EMPTY;
        k.bytes[..4].copy_from_slice(&a.octets());
        k.bits = 32;
        k
    }

    /// An IPv4 address given as a number.
    #[inline]
    pub fn v4_u32(a: u32) -> Key {
        let mut k = Key::EMPTY;
        k.bytes[..4].copy_from_slice(&a.to_be_bytes());
        k.bits = 32;
        k
    }

    /// An IPv6 address.
    #[inline]
    pub fn v6(a: Ipv6Addr) -> Key {
        let mut k = Key::EMPTY;
        k.bytes[..16].copy_from_slice(&a.octets());
        k.bits = 128;
        k
    }

    /// A 5-tuple ([`Field::FiveTuple`]).
    #[inline]
    pub fn flow(f: &FlowKey) -> Key {
        let mut k = Key::EMPTY;
        f.to_bytes(k.flow_bytes(0));
        k.bits = (FLOW_KEY_MAX_BYTES * 8) as u16;
        k
    }

    /// A one-byte `tag` and the 5-tuple's bytes: the key of a table that keeps several kinds
    /// of entries (the NAT's sessions and reverse entries), as wide as the flow's bytes.
    #[inline]
    pub fn tagged_flow(tag: u8, f: &FlowKey) -> Key {
        let mut k = Key::EMPTY;
        k.bytes[0] = tag;
        let n = f.to_bytes(k.flow_bytes(1)).len();
        k.bits = ((1 + n) * 8) as u16;
        k
    }

    /// The room for a flow key's bytes from byte `at` (fixed-size, so that writing them
    /// copies no variable length).
    #[inline]
    fn flow_bytes(&mut self, at: usize) -> &mut [u8; FLOW_KEY_MAX_BYTES] {
        const {
            assert!(
                FLOW_KEY_MAX_BYTES < KEY_BYTES,
                "room for a tag and a flow key"
            )
        };
        (&mut self.bytes[at..at + FLOW_KEY_MAX_BYTES])
            .try_into()
            .expect("a key holds a tag and a flow key")
    }

    /// A key of whole bytes (at most [`KEY_BYTES`]; longer input is cut).
    #[inline]
    pub fn from_bytes(b: &[u8]) -> Key {
        let n = b.len().min(KEY_BYTES);
        let mut k = Key::EMPTY;
        k.bytes[..n].copy_from_slice(&b[..n]);
        k.bits = (n * 8) as u16;
        k
    }

    /// Width in bits.
    #[inline]
    pub const fn bits(&self) -> u16 {
        self.bits
    }

    /// The key's bytes (whole bytes covering `bits`).
    #[inline]
    pub fn bytes(&self) -> &[u8] {
        &self.bytes[..usize::from(self.bits).div_ceil(8)]
    }

    /// All [`KEY_BYTES`] bytes (zero past `bits`).
    #[inline]
    pub fn raw(&self) -> &[u8; KEY_BYTES] {
        &self.bytes
    }

    /// Bit `i` (0 = most significant of the first byte); 0 past the end.
    #[inline]
    pub fn bit(&self, i: u16) -> bool {
        let i = usize::from(i);
        i < KEY_BITS as usize && self.bytes[i / 8] & (0x80 >> (i % 8)) != 0
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Key(")?;
        for b in self.bytes() {
            write!(f, "{b:02x}")?;
        }
        write!(f, "/{})", self.bits)
    }
}

/// A matching field M(e): the first `len` bits of a value (HashMVT §III-C). `len` 0 is `*`;
/// `len` equal to the key width is an exact match.
#[derive(Clone, Copy, Eq)]
pub struct Match {
    bytes: [u8; KEY_BYTES],
    len: u16,
}

// Bits past `len` are always zero, so equal matches have equal bytes: comparing the bytes
// word by word (no call to `memcmp`) is the derived equality, and hashing them is consistent.
impl PartialEq for Match {
    #[inline]
    fn eq(&self, other: &Match) -> bool {
        self.len == other.len && prefix_eq(&self.bytes, &other.bytes, KEY_BITS)
    }
}

impl std::hash::Hash for Match {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.bytes.hash(state);
        self.len.hash(state);
    }
}

impl Match {
    /// `*`: matches every key.
    pub const ANY: Match = Match {
        bytes: [0; KEY_BYTES],
        len: 0,
    };

    /// The first `len` bits of `key` ("insertion derives the matching bits from the rule",
    /// §III-C); bits past `len` are cleared. `len` is capped at the key's width.
    #[inline]
    pub fn prefix(key: &Key, len: u16) -> Match {
        let len = len.min(key.bits);
        let mut m = Match {
            bytes: key.bytes,
            len,
        };
        m.clear_tail();
        m
    }

    /// An exact match of `key`.
    #[inline]
    pub fn exact(key: &Key) -> Match {
        // A key's bits past its width are zero already: nothing to clear.
        Match {
            bytes: key.bytes,
            len: key.bits,
        }
    }

    /// The IPv4 prefix `a/len`.
    pub fn v4(a: Ipv4Addr, len: u8) -> Match {
        Match::prefix(&Key::v4(a), u16::from(len))
    }

    /// The IPv6 prefix `a/len`.
    pub fn v6(a: Ipv6Addr, len: u8) -> Match {
        Match::prefix(&Key::v6(a), u16::from(len))
    }

    fn clear_tail(&mut self) {
        let len = usize::from(self.len);
        let full = len / 8;
        if full < KEY_BYTES {
            let rem = len % 8;
            self.bytes[full] &= if rem == 0 { 0 } else { 0xffu8 << (8 - rem) };
            for b in &mut self.bytes[full + 1..] {
                *b = 0;
            }
        }
    }

    /// Number of matching bits.
    #[inline]
    pub const fn len(&self) -> u16 {
        self.len
    }

    /// Whether this is `*`.
    #[inline]
    pub const fn is_any(&self) -> bool {
        self.len == 0
    }

    /// Whether the match has no bits (is `*`; a match is never empty of keys).
    #[inline]
    pub const fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The prefix bits as a key of `len` bits (bytes past `len` zero).
    #[inline]
    pub fn as_key(&self) -> Key {
        Key {
            bytes: self.bytes,
            bits: self.len,
        }
    }

    /// The bytes covering the prefix, bits past `len` zero.
    #[inline]
    pub fn bytes(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len).div_ceil(8)]
    }

    /// Whether `key` lies in this match: it is at least `len` bits wide and its first `len`
    /// bits are the match's.
    #[inline]
    pub fn matches(&self, key: &Key) -> bool {
        if key.bits < self.len {
            return false;
        }
        prefix_eq(&self.bytes, &key.bytes, self.len)
    }

    /// Whether every key this match matches is matched by `other` too.
    pub fn within(&self, other: &Match) -> bool {
        other.len <= self.len && prefix_eq(&self.bytes, &other.bytes, other.len)
    }

    /// Whether some key of at least `max(len)` bits lies in both.
    pub fn overlaps(&self, other: &Match) -> bool {
        self.within(other) || other.within(self)
    }

    /// Bit `i` of the prefix (0 past `len`).
    #[inline]
    pub fn bit(&self, i: u16) -> bool {
        i < self.len && self.as_key().bit(i)
    }

    /// The two halves `len + 1` bits long (bit `len` 0, then 1), or `None` at `width`.
    pub fn halves(&self, width: u16) -> Option<(Match, Match)> {
        if self.len >= width.min(KEY_BITS) {
            return None;
        }
        let lo = Match {
            bytes: self.bytes,
            len: self.len + 1,
        };
        let mut hi = lo;
        let i = usize::from(self.len);
        hi.bytes[i / 8] |= 0x80 >> (i % 8);
        Some((lo, hi))
    }

    /// The match one bit shorter (`None` for `*`).
    pub fn parent(&self) -> Option<Match> {
        let len = self.len.checked_sub(1)?;
        let mut m = Match {
            bytes: self.bytes,
            len,
        };
        m.clear_tail();
        Some(m)
    }

    /// An IPv4 prefix as `(address, length)`, if the match is at most 32 bits long.
    pub fn to_v4(&self) -> Option<(Ipv4Addr, u8)> {
        (self.len <= 32).then(|| {
            (
                Ipv4Addr::new(self.bytes[0], self.bytes[1], self.bytes[2], self.bytes[3]),
                self.len as u8,
            )
        })
    }
}

impl fmt::Debug for Match {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.len == 0 {
            return write!(f, "*");
        }
        if let Some((a, l)) = self.to_v4() {
            return write!(f, "{a}/{l}");
        }
        for b in self.bytes() {
            write!(f, "{b:02x}")?;
        }
        write!(f, "/{}", self.len)
    }
}

/// Whether the first `bits` bits of `a` and `b` are equal (eight bytes at a time, inline:
/// row probes compare a key with every candidate).
#[inline]
pub(crate) fn prefix_eq(a: &[u8; KEY_BYTES], b: &[u8; KEY_BYTES], bits: u16) -> bool {
    let bits = usize::from(bits).min(KEY_BYTES * 8);
    let word = |x: &[u8; KEY_BYTES], at: usize| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&x[at..at + 8]);
        u64::from_be_bytes(w)
    };
    let mut at = 0;
    while (at + 8) * 8 <= bits {
        if word(a, at) != word(b, at) {
            return false;
        }
        at += 8;
    }
    let rest = bits - at * 8;
    // `at` ≤ KEY_BYTES - 8 here whenever `rest` > 0, as KEY_BYTES is a multiple of 8.
    rest == 0 || (word(a, at) ^ word(b, at)) >> (64 - rest) == 0
}

/// Parses `a.b.c.d/len` into an IPv4 match.
pub fn parse_v4_prefix(s: &str) -> Option<Match> {
    let (a, l) = s.trim().split_once('/')?;
    let a: Ipv4Addr = a.parse().ok()?;
    let l: u8 = l.parse().ok()?;
    (l <= 32).then(|| Match::v4(a, l))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_match_their_keys() {
        let m = Match::v4(Ipv4Addr::new(10, 1, 2, 3), 12);
        assert_eq!(m.to_v4(), Some((Ipv4Addr::new(10, 0, 0, 0), 12)));
        assert!(m.matches(&Key::v4(Ipv4Addr::new(10, 15, 255, 1))));
        assert!(!m.matches(&Key::v4(Ipv4Addr::new(10, 16, 0, 0))));
        assert!(Match::ANY.matches(&Key::v4(Ipv4Addr::new(1, 2, 3, 4))));
        let (lo, hi) = m.halves(32).unwrap();
        assert_eq!(lo.to_v4(), Some((Ipv4Addr::new(10, 0, 0, 0), 13)));
        assert_eq!(hi.to_v4(), Some((Ipv4Addr::new(10, 8, 0, 0), 13)));
        assert_eq!(hi.parent(), Some(m));
        assert!(lo.within(&m) && !m.within(&lo) && lo.overlaps(&m) && !lo.overlaps(&hi));
        assert_eq!(Match::v4(Ipv4Addr::new(1, 1, 1, 1), 32).halves(32), None);
        assert_eq!(
            parse_v4_prefix("1.0.2.0/23"),
            Some(Match::v4(Ipv4Addr::new(1, 0, 2, 0), 23))
        );
        assert_eq!(parse_v4_prefix("1.0.2.0/33"), None);
    }

    #[test]
    fn fields_extract_keys() {
        let f = FlowKey::new(
            IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)),
            IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1)),
            1,
            2,
            6,
        );
        assert_eq!(
            Field::SrcV4.key_of(&f),
            Some(Key::v4(Ipv4Addr::new(10, 0, 0, 1)))
        );
        assert_eq!(
            Field::DstV4.key_of(&f),
            Some(Key::v4(Ipv4Addr::new(192, 0, 2, 1)))
        );
        assert_eq!(Field::SrcV6.key_of(&f), None);
        assert_eq!(Field::FiveTuple.key_of(&f).map(|k| k.bits()), Some(296));
        assert_eq!(Field::Any.key_of(&f), Some(Key::EMPTY));
    }
}
