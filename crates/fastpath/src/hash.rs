//! The hash the fast path's structures use: a 64-bit mix (SplitMix64's finalizer) of the key
//! and a per-use seed, cheap enough for a switch stage or an XDP program. It indexes the
//! count-min sketch's rows, the Bloom filter's bits and the backend choice, where each row or
//! use needs its own seed, and the sets of the chain runtime's flow cache
//! (`flowstate_chain::flowcache`); the caches' key index is a `HashMap` with foldhash, the
//! workspace's map hasher.

/// Mixes `key` with `seed` into 64 well-spread bits.
#[inline]
pub fn mix(key: u128, seed: u64) -> u64 {
    let mut x = (key as u64) ^ ((key >> 64) as u64).rotate_left(29) ^ seed;
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}
