//! What the lab tests (`live.rs`, `cluster.rs`) share.

/// Whether the tests run as root (the lab needs it).
pub(crate) fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .map(|s| {
            s.lines()
                .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false)
}

/// Deterministic pseudo-random bytes (xorshift), so content errors cannot hide in zeros.
pub(crate) fn content(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}
