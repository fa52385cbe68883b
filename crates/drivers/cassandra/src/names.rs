//! Keyspace names for partitions (FlexState §IV-B: a key space per `nf@instance@core`).

/// The keyspace of partition `name` (`nf@instance@core`, or `nf` for shared objects):
/// `fs_<readable>_<hash>`, at most 48 characters of `[a-z0-9_]` as CQL requires. `readable`
/// is the first 12 characters of `name`, lower-cased, anything but `[a-z0-9]` turned into
/// `_`; `hash` is the 128-bit FNV-1a hash of all of `name` in hex, so different names get
/// different keyspaces (the registry table keeps the way back).
pub fn keyspace_name(name: &str) -> String {
    let readable: String = name
        .chars()
        .take(12)
        .map(|c| {
            let c = c.to_ascii_lowercase();
            if c.is_ascii_lowercase() || c.is_ascii_digit() {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("fs_{readable}_{:032x}", fnv1a_128(name.as_bytes()))
}

/// FNV-1a, 128 bits (stable across versions and platforms, unlike `std`'s hasher).
fn fnv1a_128(bytes: &[u8]) -> u128 {
    const OFFSET: u128 = 0x6c62_272e_07bb_0142_62b8_2175_6295_c58d;
    const PRIME: u128 = 0x0000_0000_0100_0000_0000_0000_0000_013b;
    bytes
        .iter()
        .fold(OFFSET, |h, b| (h ^ u128::from(*b)).wrapping_mul(PRIME))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_valid_cql_and_distinct() {
        let long = "conf-partitions-123456-12-987654321012@4294967295@4294967295";
        for n in ["nat@0@1", "nat", "NAT", "ü✓@1@2", "", long] {
            let k = keyspace_name(n);
            assert!(k.len() <= 48, "{k}");
            assert!(k
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'));
        }
        assert_eq!(keyspace_name("nat@0@1").len(), 3 + 7 + 1 + 32);
        assert!(keyspace_name("nat@0@1").starts_with("fs_nat_0_1_"));
        assert_ne!(keyspace_name("nat"), keyspace_name("NAT"));
        assert_ne!(keyspace_name("a@1@2"), keyspace_name("a_1_2"));
        // Stable: the name of a partition never changes between versions.
        assert_eq!(
            keyspace_name("nat@0@1"),
            format!("fs_nat_0_1_{:032x}", fnv1a_128(b"nat@0@1"))
        );
        assert_eq!(fnv1a_128(b""), 0x6c62_272e_07bb_0142_62b8_2175_6295_c58d);
    }
}
