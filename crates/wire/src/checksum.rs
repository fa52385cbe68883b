//! The Internet checksum (RFC 1071) with IPv4/IPv6 pseudo-headers (RFC 768, RFC 793, RFC 8200
//! §8.1) and its incremental update (RFC 1624).
//!
//! A checksum is built from partial sums: [`sum`] over byte ranges, [`pseudo_header_v4`] or
//! [`pseudo_header_v6`] for transport protocols, added with [`combine`] and closed with
//! [`finish`]. A buffer whose checksum field is included verifies when `finish(sum) == 0`.

/// The 32-bit partial one's-complement sum of `data` as big-endian 16-bit words; an odd final
/// byte is padded with zero (RFC 1071 §4.1). Fold with [`finish`].
#[inline]
pub fn sum(data: &[u8]) -> u32 {
    let mut acc: u64 = 0;
    let mut chunks = data.chunks_exact(8);
    for c in &mut chunks {
        // Two 32-bit big-endian halves; carries accumulate in the upper bits of `acc`.
        acc += u64::from(u32::from_be_bytes([c[0], c[1], c[2], c[3]]));
        acc += u64::from(u32::from_be_bytes([c[4], c[5], c[6], c[7]]));
    }
    let mut rest = chunks.remainder();
    while rest.len() >= 2 {
        acc += u64::from(u16::from_be_bytes([rest[0], rest[1]]));
        rest = &rest[2..];
    }
    if let [last] = rest {
        acc += u64::from(*last) << 8;
    }
    fold64(acc)
}

/// Folds a 64-bit accumulator to a 16-bit one's-complement sum (returned in a `u32`).
#[inline]
fn fold64(mut acc: u64) -> u32 {
    while acc >> 16 != 0 {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    acc as u32
}

/// One's-complement addition of two partial sums.
#[inline]
pub fn combine(a: u32, b: u32) -> u32 {
    fold64(u64::from(a) + u64::from(b))
}

/// Folds a partial sum and complements it: the value to store in a checksum field.
#[inline]
pub fn finish(partial: u32) -> u16 {
    !(fold64(u64::from(partial)) as u16)
}

/// The checksum of `data` alone (e.g. an IPv4 header with its checksum field zeroed).
#[inline]
pub fn checksum(data: &[u8]) -> u16 {
    finish(sum(data))
}

/// Partial sum of the IPv4 pseudo-header: source, destination, zero, protocol, and the
/// transport length (RFC 793 §3.1, RFC 768).
#[inline]
pub fn pseudo_header_v4(src: [u8; 4], dst: [u8; 4], protocol: u8, length: u16) -> u32 {
    let acc = u64::from(u16::from_be_bytes([src[0], src[1]]))
        + u64::from(u16::from_be_bytes([src[2], src[3]]))
        + u64::from(u16::from_be_bytes([dst[0], dst[1]]))
        + u64::from(u16::from_be_bytes([dst[2], dst[3]]))
        + u64::from(protocol)
        + u64::from(length);
    fold64(acc)
}

/// Partial sum of the IPv6 pseudo-header: source, destination, 32-bit upper-layer length and
/// next header (RFC 8200 §8.1).
#[inline]
pub fn pseudo_header_v6(src: &[u8; 16], dst: &[u8; 16], next_header: u8, length: u32) -> u32 {
    let acc = u64::from(sum(src))
        + u64::from(sum(dst))
        + u64::from(length >> 16)
        + u64::from(length & 0xffff)
        + u64::from(next_header);
    fold64(acc)
}

/// RFC 1624 eqn. 3: the new checksum after the bytes `old` were replaced by `new` in the
/// covered data: `HC' = ~(~HC + ~m + m')`. `old` and `new` must have the same, even length and
/// start at an even offset of the covered data (true of every address and port field).
#[inline]
pub fn update(check: u16, old: &[u8], new: &[u8]) -> u16 {
    debug_assert_eq!(old.len(), new.len());
    debug_assert_eq!(old.len() % 2, 0);
    // ~m summed word by word equals the complement of the sum of m in one's-complement arithmetic.
    let not_old = u32::from(!(fold64(u64::from(sum(old))) as u16));
    let acc = u64::from(!check) + u64::from(not_old) + u64::from(sum(new));
    !(fold64(acc) as u16)
}

/// [`update`] for one 16-bit word (a port, an ICMP identifier).
#[inline]
pub fn update_u16(check: u16, old: u16, new: u16) -> u16 {
    update(check, &old.to_be_bytes(), &new.to_be_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 1071 §3 example: words 0001 f203 f4f5 f6f7 sum to ddf2.
    #[test]
    fn rfc1071_example() {
        let data = [0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7];
        assert_eq!(sum(&data), 0xddf2);
        assert_eq!(checksum(&data), !0xddf2);
    }

    /// A captured IPv4 header whose checksum (0xb861) is known to be correct.
    #[test]
    fn ipv4_header_checksum() {
        let mut hdr = [
            0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0xb8, 0x61, 0xc0, 0xa8,
            0x00, 0x01, 0xc0, 0xa8, 0x00, 0xc7,
        ];
        assert_eq!(finish(sum(&hdr)), 0, "verifies with its checksum in place");
        hdr[10] = 0;
        hdr[11] = 0;
        assert_eq!(checksum(&hdr), 0xb861);
    }

    #[test]
    fn odd_length_pads_with_zero() {
        assert_eq!(sum(&[0x12, 0x34, 0x56]), 0x1234 + 0x5600);
    }

    /// RFC 1071's definition, word by word with the end-around carry at each step.
    fn naive_sum(data: &[u8]) -> u32 {
        let mut acc = 0u32;
        for pair in data.chunks(2) {
            acc += u32::from(pair[0]) << 8 | u32::from(pair.get(1).copied().unwrap_or(0));
            acc = (acc & 0xffff) + (acc >> 16);
        }
        acc
    }

    proptest::proptest! {
        #[test]
        fn sum_is_rfc1071s_word_by_word_sum(
            data in proptest::collection::vec(proptest::num::u8::ANY, 0..1600),
            skip in 0usize..4,
        ) {
            let data = &data[skip.min(data.len())..];
            proptest::prop_assert_eq!(sum(data), naive_sum(data));
        }
    }

    #[test]
    fn all_ones_and_zeros_keep_their_representation() {
        assert_eq!(sum(&[0; 9]), 0);
        assert_eq!(sum(&[0xff; 8]), 0xffff);
        assert_eq!(sum(&[0xff, 0xff, 0, 0, 0]), 0xffff);
        assert_eq!(naive_sum(&[0xff; 8]), 0xffff);
    }

    #[test]
    fn incremental_equals_full_recompute() {
        let mut data: Vec<u8> = (0u8..40)
            .map(|i| i.wrapping_mul(37).wrapping_add(11))
            .collect();
        let before = checksum(&data);
        let old = [data[12], data[13], data[14], data[15]];
        let new = [203, 0, 113, 7];
        data[12..16].copy_from_slice(&new);
        assert_eq!(update(before, &old, &new), checksum(&data));
    }
}
