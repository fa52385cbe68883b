//! The hashes the fast path's structures use: a 64-bit mix (SplitMix64's finalizer) of the key
//! and a per-use seed, cheap enough for a switch stage or an XDP program.

/// Mixes `key` with `seed` into 64 well-spread bits.
#[inline]
pub(crate) fn mix(key: u128, seed: u64) -> u64 {
    let mut x = (key as u64) ^ ((key >> 64) as u64).rotate_left(29) ^ seed;
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// Hashes table keys for the caches' indexes: [`mix`] under a seed drawn at random per cache,
/// so that packets cannot be crafted to collide in the index (keys come from packets).
#[derive(Clone, Copy, Debug)]
pub(crate) struct SeededKeys(u64);

impl SeededKeys {
    /// A random seed (from the standard library's per-process random keys).
    pub(crate) fn random() -> SeededKeys {
        use std::hash::BuildHasher;
        SeededKeys(std::collections::hash_map::RandomState::new().hash_one(0x6b657973u64))
    }
}

impl std::hash::BuildHasher for SeededKeys {
    type Hasher = KeyHasher;
    fn build_hasher(&self) -> KeyHasher {
        KeyHasher(self.0)
    }
}

/// The hasher of [`SeededKeys`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct KeyHasher(u64);

impl std::hash::Hasher for KeyHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(16) {
            let mut b = [0u8; 16];
            b[..chunk.len()].copy_from_slice(chunk);
            self.0 = mix(u128::from_le_bytes(b), self.0);
        }
    }

    #[inline]
    fn write_u128(&mut self, k: u128) {
        self.0 = mix(k, self.0);
    }

    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }
}
