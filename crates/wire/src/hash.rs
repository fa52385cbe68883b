//! Flow hashing: CRC32C (the Castagnoli polynomial of SSE4.2's `crc32` instruction, used by
//! HashMVT §III-C for O(1) matching) and the Toeplitz hash of receive-side scaling (RSS).
//!
//! [`crc32c`] uses the SSE4.2 instruction when the CPU has it (detected at run time) and a
//! table-driven software fallback otherwise; both give identical results (tested). For short
//! keys hashed in a loop, [`Crc32cSteps`] gives fixed-width steps (1, 4, 8 bytes): [`Sse42`]
//! (a value proving the CPU has the instruction, detected once, so no step checks again;
//! inlined as one instruction into code compiled for SSE4.2) and [`SoftCrc`] (slicing tables).
//! [`crc32c_bytewise`] and [`ByteCrc`] are the one-lookup-per-byte software CRC, kept as the
//! baseline that benchmarks and HashMVT's `Hasher::Software` measure against; the
//! workspace's one set of CRC32C tables is this module's.
//! [`Toeplitz::symmetric`] uses the repeated-`0x6d5a` key, with which a flow's two directions
//! hash alike (Woo & Park, "Scalable TCP Session Monitoring with Symmetric Receive-side
//! Scaling", 2012), so both directions of a flow reach the same worker.

use crate::flow::{FlowKey, FLOW_KEY_MAX_BYTES};
use std::net::IpAddr;

/// Reflected CRC32C (Castagnoli) polynomial, RFC 3720 §12.1.
const POLY: u32 = 0x82f6_3b78;

/// Slicing-by-8 tables: `TABLES[0]` is the classic byte table; `TABLES[k][b]` advances the CRC
/// of byte `b` over `k` further zero bytes.
static TABLES: [[u32; 256]; 8] = make_tables();

const fn make_tables() -> [[u32; 256]; 8] {
    let mut t = [[0u32; 256]; 8];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 { (c >> 1) ^ POLY } else { c >> 1 };
            k += 1;
        }
        t[0][i] = c;
        i += 1;
    }
    let mut s = 1;
    while s < 8 {
        let mut i = 0;
        while i < 256 {
            let prev = t[s - 1][i];
            t[s][i] = (prev >> 8) ^ t[0][(prev & 0xff) as usize];
            i += 1;
        }
        s += 1;
    }
    t
}

/// CRC32C of `data` (initial value and final XOR `0xffff_ffff`, as iSCSI and SSE4.2 code use).
#[inline]
pub fn crc32c(data: &[u8]) -> u32 {
    crc32c_append(0, data)
}

/// Continues a CRC32C: `crc32c_append(crc32c(a), b) == crc32c(a ++ b)`.
#[inline]
pub fn crc32c_append(crc: u32, data: &[u8]) -> u32 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("sse4.2") {
        // SAFETY: the CPU supports SSE4.2, checked just above.
        return unsafe { hw::append(crc, data) };
    }
    crc32c_sw_append(crc, data)
}

/// Whether [`crc32c`] runs on the CPU's CRC32C instruction.
#[inline]
pub fn crc32c_hw_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        // std caches the CPUID answer: this is one load after the first call.
        std::arch::is_x86_feature_detected!("sse4.2")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// CRC32C on the CPU instruction, or `None` when the CPU lacks it.
#[inline]
pub fn crc32c_hw(data: &[u8]) -> Option<u32> {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("sse4.2") {
        // SAFETY: the CPU supports SSE4.2, checked just above.
        return Some(unsafe { hw::append(0, data) });
    }
    let _ = data;
    None
}

/// CRC32C in software (slicing-by-8), whatever the CPU.
#[inline]
pub fn crc32c_sw(data: &[u8]) -> u32 {
    crc32c_sw_append(0, data)
}

/// CRC32C one byte at a time through one 256-entry table, whatever the CPU: the classic
/// software CRC that HashMVT §VI-C measures as its baseline. Same values as [`crc32c`]; for
/// measuring against, as [`crc32c_sw`] (slicing-by-8) is faster.
#[inline]
pub fn crc32c_bytewise(data: &[u8]) -> u32 {
    !data.iter().fold(!0u32, |c, &b| ByteCrc.step_u8(c, b))
}

fn crc32c_sw_append(crc: u32, data: &[u8]) -> u32 {
    let mut c = !crc;
    let mut chunks = data.chunks_exact(8);
    for b in &mut chunks {
        let lo = c ^ u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        c = TABLES[7][(lo & 0xff) as usize]
            ^ TABLES[6][((lo >> 8) & 0xff) as usize]
            ^ TABLES[5][((lo >> 16) & 0xff) as usize]
            ^ TABLES[4][(lo >> 24) as usize]
            ^ TABLES[3][b[4] as usize]
            ^ TABLES[2][b[5] as usize]
            ^ TABLES[1][b[6] as usize]
            ^ TABLES[0][b[7] as usize];
    }
    for &b in chunks.remainder() {
        c = (c >> 8) ^ TABLES[0][((c ^ u32::from(b)) & 0xff) as usize];
    }
    !c
}

#[cfg(target_arch = "x86_64")]
mod hw {
    use std::arch::x86_64::{_mm_crc32_u16, _mm_crc32_u32, _mm_crc32_u64, _mm_crc32_u8};

    // One instruction each; `inline` so that SSE4.2 callers get the instruction itself.
    #[inline]
    #[target_feature(enable = "sse4.2")]
    pub(super) unsafe fn u8(crc: u32, v: u8) -> u32 {
        _mm_crc32_u8(crc, v)
    }

    #[inline]
    #[target_feature(enable = "sse4.2")]
    pub(super) unsafe fn u32(crc: u32, v: u32) -> u32 {
        _mm_crc32_u32(crc, v)
    }

    #[inline]
    #[target_feature(enable = "sse4.2")]
    pub(super) unsafe fn u64(crc: u32, v: u64) -> u32 {
        _mm_crc32_u64(u64::from(crc), v) as u32
    }

    // `inline`: callers compiled with SSE4.2 (HashMVT's probe loop) get the instructions
    // inlined instead of a call per hash.
    #[inline]
    #[target_feature(enable = "sse4.2")]
    pub(super) unsafe fn append(crc: u32, data: &[u8]) -> u32 {
        let mut c = u64::from(!crc);
        let mut chunks = data.chunks_exact(8);
        for b in &mut chunks {
            let w = u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]);
            c = _mm_crc32_u64(c, w);
        }
        // The tail in at most three steps (4, 2, 1 bytes): a 13-byte IPv4 5-tuple is 3 instructions.
        let mut c = c as u32;
        let mut rest = chunks.remainder();
        if let [a, b, c2, d, tail @ ..] = rest {
            c = _mm_crc32_u32(c, u32::from_le_bytes([*a, *b, *c2, *d]));
            rest = tail;
        }
        if let [a, b, tail @ ..] = rest {
            c = _mm_crc32_u16(c, u16::from_le_bytes([*a, *b]));
            rest = tail;
        }
        if let [a] = rest {
            c = _mm_crc32_u8(c, *a);
        }
        !c
    }
}

/// Fixed-width CRC32C steps on the raw register (no initial or final inversion: the caller
/// seeds and finishes), for hashing of short keys in a loop (HashMVT §III-C hashes one address
/// at several prefix lengths per lookup).
///
/// Three implementations give identical values (tested): [`Sse42`], the CPU's `crc32`
/// instruction, whose value proves the CPU has it (made once by [`Sse42::detect`], so no call
/// checks the CPU again); [`SoftCrc`], table-driven (slicing-by-4/8); and [`ByteCrc`], one
/// table lookup per byte (the software baseline). The steps are
/// `#[inline]`; [`Sse42`]'s inline as single instructions into code compiled with SSE4.2
/// (a `#[target_feature(enable = "sse4.2")]` function, or a build for such a CPU).
pub trait Crc32cSteps: Copy {
    /// Advances `crc` over one byte.
    fn step_u8(self, crc: u32, v: u8) -> u32;
    /// Advances `crc` over four bytes, `v` read little-endian (the instruction's order).
    fn step_u32(self, crc: u32, v: u32) -> u32;
    /// Advances `crc` over eight bytes, `v` read little-endian.
    fn step_u64(self, crc: u32, v: u64) -> u32;
}

/// The CPU's CRC32C instruction (SSE4.2). A value exists only on a CPU that has it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sse42(());

impl Sse42 {
    /// `Some` when the CPU has SSE4.2 (detected once per process, then a load).
    #[inline]
    pub fn detect() -> Option<Sse42> {
        crc32c_hw_available().then_some(Sse42(()))
    }
}

#[cfg(target_arch = "x86_64")]
impl Crc32cSteps for Sse42 {
    #[inline]
    fn step_u8(self, crc: u32, v: u8) -> u32 {
        // SAFETY: a `Sse42` exists only when the CPU has SSE4.2 (`Sse42::detect`).
        unsafe { hw::u8(crc, v) }
    }
    #[inline]
    fn step_u32(self, crc: u32, v: u32) -> u32 {
        // SAFETY: as above.
        unsafe { hw::u32(crc, v) }
    }
    #[inline]
    fn step_u64(self, crc: u32, v: u64) -> u32 {
        // SAFETY: as above.
        unsafe { hw::u64(crc, v) }
    }
}

#[cfg(not(target_arch = "x86_64"))]
impl Crc32cSteps for Sse42 {
    // Never constructed off x86_64 (`detect` gives `None`); the software steps keep it total.
    #[inline]
    fn step_u8(self, crc: u32, v: u8) -> u32 {
        SoftCrc.step_u8(crc, v)
    }
    #[inline]
    fn step_u32(self, crc: u32, v: u32) -> u32 {
        SoftCrc.step_u32(crc, v)
    }
    #[inline]
    fn step_u64(self, crc: u32, v: u64) -> u32 {
        SoftCrc.step_u64(crc, v)
    }
}

/// Table-driven CRC32C steps (slicing-by-4 and -8 over [`crc32c_sw`]'s tables), any CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SoftCrc;

impl Crc32cSteps for SoftCrc {
    #[inline]
    fn step_u8(self, crc: u32, v: u8) -> u32 {
        (crc >> 8) ^ TABLES[0][((crc ^ u32::from(v)) & 0xff) as usize]
    }
    #[inline]
    fn step_u32(self, crc: u32, v: u32) -> u32 {
        let x = crc ^ v;
        TABLES[3][(x & 0xff) as usize]
            ^ TABLES[2][((x >> 8) & 0xff) as usize]
            ^ TABLES[1][((x >> 16) & 0xff) as usize]
            ^ TABLES[0][(x >> 24) as usize]
    }
    #[inline]
    fn step_u64(self, crc: u32, v: u64) -> u32 {
        let lo = crc ^ v as u32;
        let hi = (v >> 32) as u32;
        TABLES[7][(lo & 0xff) as usize]
            ^ TABLES[6][((lo >> 8) & 0xff) as usize]
            ^ TABLES[5][((lo >> 16) & 0xff) as usize]
            ^ TABLES[4][(lo >> 24) as usize]
            ^ TABLES[3][(hi & 0xff) as usize]
            ^ TABLES[2][((hi >> 8) & 0xff) as usize]
            ^ TABLES[1][((hi >> 16) & 0xff) as usize]
            ^ TABLES[0][(hi >> 24) as usize]
    }
}

/// CRC32C steps one byte at a time through one 256-entry table (one lookup per byte, the
/// steps of [`crc32c_bytewise`]), any CPU: the software baseline, not for speed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ByteCrc;

impl Crc32cSteps for ByteCrc {
    #[inline(always)]
    fn step_u8(self, crc: u32, v: u8) -> u32 {
        (crc >> 8) ^ TABLES[0][((crc ^ u32::from(v)) & 0xff) as usize]
    }
    #[inline(always)]
    fn step_u32(self, crc: u32, v: u32) -> u32 {
        v.to_le_bytes().iter().fold(crc, |c, &b| self.step_u8(c, b))
    }
    #[inline(always)]
    fn step_u64(self, crc: u32, v: u64) -> u32 {
        v.to_le_bytes().iter().fold(crc, |c, &b| self.step_u8(c, b))
    }
}

/// CRC32C of a flow key's [`FlowKey::to_bytes`] encoding (direction-dependent).
#[inline]
pub fn crc32c_flow(key: &FlowKey) -> u32 {
    let mut buf = [0u8; FLOW_KEY_MAX_BYTES];
    crc32c(key.to_bytes(&mut buf))
}

/// Length of an RSS key: enough for the IPv6 4-tuple input (36 bytes) plus 4.
pub const TOEPLITZ_KEY_LEN: usize = 40;
/// Longest Toeplitz input this implementation takes (IPv6 addresses and ports).
pub const TOEPLITZ_MAX_INPUT: usize = TOEPLITZ_KEY_LEN - 4;

/// The Toeplitz hash of RSS with a 40-byte key, table-driven: for each input byte position a
/// 256-entry table of its contribution (36 KiB per hasher, built once).
#[derive(Clone)]
pub struct Toeplitz {
    key: [u8; TOEPLITZ_KEY_LEN],
    table: Box<[[u32; 256]; TOEPLITZ_MAX_INPUT]>,
}

impl core::fmt::Debug for Toeplitz {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Toeplitz")
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

impl Toeplitz {
    /// A hasher for `key`.
    pub fn new(key: [u8; TOEPLITZ_KEY_LEN]) -> Self {
        let mut table = Box::new([[0u32; 256]; TOEPLITZ_MAX_INPUT]);
        for (pos, row) in table.iter_mut().enumerate() {
            for (byte, slot) in row.iter_mut().enumerate() {
                let mut h = 0;
                for bit in 0..8 {
                    if byte & (0x80 >> bit) != 0 {
                        h ^= key_window(&key, pos * 8 + bit);
                    }
                }
                *slot = h;
            }
        }
        Toeplitz { key, table }
    }

    /// The symmetric key (`0x6d5a` repeated): `hash_flow(k) == hash_flow(k.reversed())`.
    pub fn symmetric() -> Self {
        let mut key = [0u8; TOEPLITZ_KEY_LEN];
        for pair in key.chunks_exact_mut(2) {
            pair.copy_from_slice(&[0x6d, 0x5a]);
        }
        Toeplitz::new(key)
    }

    /// The key this hasher uses.
    pub fn key(&self) -> &[u8; TOEPLITZ_KEY_LEN] {
        &self.key
    }

    /// Hash of `input`; bytes past [`TOEPLITZ_MAX_INPUT`] are ignored.
    #[inline]
    pub fn hash(&self, input: &[u8]) -> u32 {
        input
            .iter()
            .zip(self.table.iter())
            .fold(0, |h, (&b, row)| h ^ row[usize::from(b)])
    }

    /// RSS hash of a flow: source address, destination address, source port, destination
    /// port (the RSS "4-tuple" input; IPv4 inside IPv6 keys is hashed in its mapped form).
    #[inline]
    pub fn hash_flow(&self, key: &FlowKey) -> u32 {
        let mut buf = [0u8; TOEPLITZ_MAX_INPUT];
        let n = match (key.src, key.dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => {
                buf[0..4].copy_from_slice(&s.octets());
                buf[4..8].copy_from_slice(&d.octets());
                8
            }
            (s, d) => {
                buf[0..16].copy_from_slice(&mapped(s));
                buf[16..32].copy_from_slice(&mapped(d));
                32
            }
        };
        buf[n..n + 2].copy_from_slice(&key.src_port.to_be_bytes());
        buf[n + 2..n + 4].copy_from_slice(&key.dst_port.to_be_bytes());
        self.hash(&buf[..n + 4])
    }

    /// Bit-by-bit reference of [`hash`](Self::hash), as the RSS specification states it.
    pub fn hash_reference(&self, input: &[u8]) -> u32 {
        let mut h = 0;
        for (i, &b) in input.iter().take(TOEPLITZ_MAX_INPUT).enumerate() {
            for bit in 0..8 {
                if b & (0x80 >> bit) != 0 {
                    h ^= key_window(&self.key, i * 8 + bit);
                }
            }
        }
        h
    }
}

/// The 32 key bits starting at bit `start` (most significant first).
fn key_window(key: &[u8; TOEPLITZ_KEY_LEN], start: usize) -> u32 {
    let byte = start / 8;
    let shift = start % 8;
    let mut w = [0u8; 5];
    for (i, slot) in w.iter_mut().enumerate() {
        *slot = key.get(byte + i).copied().unwrap_or(0);
    }
    let wide = u64::from_be_bytes([0, 0, 0, w[0], w[1], w[2], w[3], w[4]]);
    (wide >> (8 - shift)) as u32
}

fn mapped(a: IpAddr) -> [u8; 16] {
    match a {
        IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
        IpAddr::V6(a) => a.octets(),
    }
}

/// Mixes `key` with `seed` into 64 well-spread bits: SplitMix64's finalizer over the key's
/// folded halves, every output bit depending on every key bit. Cheap enough for a switch stage
/// or an XDP program; it indexes the count-min sketch's rows, the Bloom filters' bits and the
/// backend choice of `flowstate_fastpath` (each row or use with its own seed) and the sets of
/// the stage engine's flow cache (`flowstate_nf::stage`). Not a map hasher: maps use foldhash.
#[inline]
pub fn mix(key: u128, seed: u64) -> u64 {
    let mut x = (key as u64) ^ ((key >> 64) as u64).rotate_left(29) ^ seed;
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flow::proto;
    use proptest::prelude::*;
    use std::net::{Ipv4Addr, Ipv6Addr};

    #[test]
    fn crc32c_check_value() {
        // The standard check value of CRC-32C (RFC 3720 B.4 uses the same polynomial).
        assert_eq!(crc32c_sw(b"123456789"), 0xe306_9283);
        assert_eq!(crc32c(b"123456789"), 0xe306_9283);
        assert_eq!(crc32c(b""), 0);
        assert_eq!(crc32c_bytewise(b"123456789"), 0xe306_9283);
        assert_eq!(crc32c_bytewise(b""), 0);
    }

    #[test]
    fn crc32c_rfc3720_vectors() {
        // RFC 3720 B.4: 32 bytes of zeros, of 0xff, and an incrementing sequence.
        assert_eq!(crc32c_sw(&[0u8; 32]), 0x8a91_36aa);
        assert_eq!(crc32c_sw(&[0xffu8; 32]), 0x62a8_ab43);
        let inc: Vec<u8> = (0u8..32).collect();
        assert_eq!(crc32c_sw(&inc), 0x46dd_794e);
    }

    /// Microsoft's RSS verification suite, first entry (documented default key).
    #[test]
    fn toeplitz_rss_vector() {
        let key = [
            0x6d, 0x5a, 0x56, 0xda, 0x25, 0x5b, 0x0e, 0xc2, 0x41, 0x67, 0x25, 0x3d, 0x43, 0xa3,
            0x8f, 0xb0, 0xd0, 0xca, 0x2b, 0xcb, 0xae, 0x7b, 0x30, 0xb4, 0x77, 0xcb, 0x2d, 0xa3,
            0x80, 0x30, 0xf2, 0x0c, 0x6a, 0x42, 0xb7, 0x3b, 0xbe, 0xac, 0x01, 0xfa,
        ];
        let t = Toeplitz::new(key);
        let k = FlowKey::new(
            IpAddr::V4(Ipv4Addr::new(66, 9, 149, 187)),
            IpAddr::V4(Ipv4Addr::new(161, 142, 100, 80)),
            2794,
            1766,
            proto::TCP,
        );
        assert_eq!(t.hash(&[66, 9, 149, 187, 161, 142, 100, 80]), 0x323e_8fc2);
        assert_eq!(t.hash_flow(&k), 0x51cc_c178);
    }

    fn any_key() -> impl Strategy<Value = FlowKey> {
        let v4 = (any::<[u8; 4]>(), any::<[u8; 4]>())
            .prop_map(|(a, b)| (IpAddr::from(a), IpAddr::from(b)));
        let v6 = (any::<[u8; 16]>(), any::<[u8; 16]>())
            .prop_map(|(a, b)| (IpAddr::V6(Ipv6Addr::from(a)), IpAddr::V6(Ipv6Addr::from(b))));
        (prop_oneof![v4, v6], any::<u16>(), any::<u16>(), any::<u8>())
            .prop_map(|((s, d), sp, dp, p)| FlowKey::new(s, d, sp, dp, p))
    }

    /// The fixed-width steps of `c` agree with the byte-slice CRC of the same bytes.
    fn steps_agree<C: Crc32cSteps + std::fmt::Debug>(c: C, data: &[u8; 15]) {
        let want = crc32c_sw(data);
        let w8 = u64::from_le_bytes(data[..8].try_into().unwrap());
        let w4 = u32::from_le_bytes(data[8..12].try_into().unwrap());
        let mut r = c.step_u64(!0, w8);
        r = c.step_u32(r, w4);
        for &b in &data[12..] {
            r = c.step_u8(r, b);
        }
        assert_eq!(!r, want, "{c:?}");
    }

    proptest! {
        #[test]
        fn fixed_width_steps_equal_bytewise(data in any::<[u8; 15]>()) {
            steps_agree(SoftCrc, &data);
            steps_agree(ByteCrc, &data);
            if let Some(hw) = Sse42::detect() {
                steps_agree(hw, &data);
            }
        }

        #[test]
        fn crc32c_hw_equals_sw(data in proptest::collection::vec(any::<u8>(), 0..300), split in 0usize..300) {
            let sw = crc32c_sw(&data);
            if let Some(hw) = crc32c_hw(&data) {
                prop_assert_eq!(hw, sw);
            }
            prop_assert_eq!(crc32c(&data), sw);
            prop_assert_eq!(crc32c_bytewise(&data), sw);
            let split = split.min(data.len());
            prop_assert_eq!(crc32c_append(crc32c(&data[..split]), &data[split..]), sw);
        }

        #[test]
        fn toeplitz_table_equals_reference(input in proptest::collection::vec(any::<u8>(), 0..=36), key in any::<[u8; 32]>()) {
            let mut k = [0u8; TOEPLITZ_KEY_LEN];
            k[..32].copy_from_slice(&key);
            let t = Toeplitz::new(k);
            prop_assert_eq!(t.hash(&input), t.hash_reference(&input));
        }

        #[test]
        fn symmetric_toeplitz_hashes_both_directions_alike(key in any_key()) {
            let t = Toeplitz::symmetric();
            prop_assert_eq!(t.hash_flow(&key), t.hash_flow(&key.reversed()));
        }
    }
}
