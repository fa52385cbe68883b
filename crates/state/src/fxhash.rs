//! A fast, non-cryptographic hasher for the typed caches (keys are not attacker-chosen
//! hash-flooding targets at this layer: flows are spread over workers by the symmetric RSS
//! hash first). Multiply-rotate over 64-bit words, as rustc's FxHasher does.

use std::hash::{BuildHasherDefault, Hasher};

/// [`FxHasher`] as a `BuildHasher` for maps and sets.
pub type FxBuildHasher = BuildHasherDefault<FxHasher>;

/// The hasher.
#[derive(Default, Clone, Copy)]
pub struct FxHasher(u64);

const SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;

impl FxHasher {
    #[inline]
    fn add(&mut self, w: u64) {
        self.0 = (self.0.rotate_left(5) ^ w).wrapping_mul(SEED);
    }
}

impl Hasher for FxHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        // Up to 8 bytes (an IPv4 address, a port): one word, zero-padded as below, without
        // the chunk loop.
        if bytes.len() <= 8 {
            let mut b = [0u8; 8];
            b[..bytes.len()].copy_from_slice(bytes);
            if !bytes.is_empty() {
                self.add(u64::from_le_bytes(b));
            }
            return;
        }
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            self.add(u64::from_le_bytes([
                c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7],
            ]));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut b = [0u8; 8];
            b[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(b));
        }
    }
    #[inline]
    fn write_u8(&mut self, i: u8) {
        self.add(u64::from(i));
    }
    #[inline]
    fn write_u16(&mut self, i: u16) {
        self.add(u64::from(i));
    }
    #[inline]
    fn write_u32(&mut self, i: u32) {
        self.add(u64::from(i));
    }
    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.add(i);
    }
    #[inline]
    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }
    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }
}

/// `HashMap` with [`FxHasher`].
pub type FxHashMap<K, V> = std::collections::HashMap<K, V, BuildHasherDefault<FxHasher>>;
/// `HashSet` with [`FxHasher`].
pub type FxHashSet<T> = std::collections::HashSet<T, BuildHasherDefault<FxHasher>>;
