//! The stable fuzz harness's mutator, shared by the owning crates' `fuzz_*` tests (each
//! includes this file with `#[path = "../../../fuzz/harness/mutate.rs"] mod mutate;`).
//!
//! Inputs are a committed seed corpus (`fuzz/corpus/TARGET/`, the same files `cargo fuzz`
//! starts from) mutated as libFuzzer's default mutators do: byte flips, interesting values,
//! inserted, erased, duplicated and spliced ranges, truncation. The strategy is proptest's, so
//! a failing input shrinks to fewer and smaller edits and is kept in the test's
//! `.proptest-regressions` file; the test prints it as hex for a regression test.
//!
//! `FLOWSTATE_FUZZ_CASES` sets the number of cases of every harness test (CI uses each test's
//! default, a few seconds); `scripts/fuzz` runs them longer.
#![allow(dead_code)]

use proptest::prelude::*;
use proptest::sample::Index;
use std::path::{Path, PathBuf};

/// Cases per harness test: `FLOWSTATE_FUZZ_CASES`, or `default`.
pub(crate) fn cases(default: u32) -> u32 {
    std::env::var("FLOWSTATE_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The repository's `fuzz/corpus/TARGET` directory, from a crate's manifest directory.
pub(crate) fn corpus_dir(manifest_dir: &str, target: &str) -> PathBuf {
    let mut dir = Path::new(manifest_dir).to_path_buf();
    while !dir.join("fuzz").join("corpus").is_dir() {
        assert!(dir.pop(), "no fuzz/corpus above {manifest_dir}");
    }
    dir.join("fuzz").join("corpus").join(target)
}

/// Every file of the seed corpus of `target`, sorted by name (at least one).
pub(crate) fn seeds(manifest_dir: &str, target: &str) -> Vec<(String, Vec<u8>)> {
    let dir = corpus_dir(manifest_dir, target);
    let mut out: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| {
            let p = e.expect("a corpus entry").path();
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            (name, std::fs::read(&p).expect("a corpus file"))
        })
        .collect();
    out.sort();
    assert!(!out.is_empty(), "{} is empty", dir.display());
    out
}

/// One edit of an input.
#[derive(Debug, Clone)]
pub(crate) enum Edit {
    /// Flip bit `bit` of the byte at the index.
    Flip(Index, u8),
    /// Overwrite the byte at the index.
    Set(Index, u8),
    /// Overwrite 1, 2 or 4 bytes at the index with an interesting value (0, 1, max, min,
    /// lengths near powers of two), in either byte order.
    Interesting(Index, u8, bool),
    /// Insert bytes at the index.
    Insert(Index, Vec<u8>),
    /// Erase up to `n` bytes at the index.
    Erase(Index, usize),
    /// Copy up to `n` bytes from the first index over the second one (or insert them there).
    Duplicate(Index, Index, usize, bool),
    /// Insert a range of another seed at the index.
    Splice(Index, Index, Index, usize),
    /// Keep the first bytes only.
    Truncate(Index),
}

/// Interesting 32-bit values (AFL's and libFuzzer's).
const INTERESTING: [u32; 16] = [
    0,
    1,
    0x7f,
    0x80,
    0xff,
    0x100,
    0x7fff,
    0x8000,
    0xffff,
    0x1_0000,
    0x7fff_ffff,
    0x8000_0000,
    0xffff_ffff,
    16,
    32,
    64,
];

/// Up to `max` edits.
pub(crate) fn edits(max: usize) -> impl Strategy<Value = Vec<Edit>> {
    let edit = prop_oneof![
        (any::<Index>(), 0u8..8).prop_map(|(i, b)| Edit::Flip(i, b)),
        (any::<Index>(), any::<u8>()).prop_map(|(i, v)| Edit::Set(i, v)),
        (any::<Index>(), any::<u8>(), any::<bool>())
            .prop_map(|(i, v, be)| Edit::Interesting(i, v, be)),
        (
            any::<Index>(),
            proptest::collection::vec(any::<u8>(), 1..16)
        )
            .prop_map(|(i, b)| Edit::Insert(i, b)),
        (any::<Index>(), 1usize..64).prop_map(|(i, n)| Edit::Erase(i, n)),
        (any::<Index>(), any::<Index>(), 1usize..64, any::<bool>())
            .prop_map(|(a, b, n, ins)| Edit::Duplicate(a, b, n, ins)),
        (any::<Index>(), any::<Index>(), any::<Index>(), 1usize..128)
            .prop_map(|(s, a, at, n)| Edit::Splice(s, a, at, n)),
        any::<Index>().prop_map(Edit::Truncate),
    ];
    proptest::collection::vec(edit, 0..=max)
}

/// `input` with `edits` applied; `others` are the seeds a splice takes from.
pub(crate) fn apply(input: &[u8], edits: &[Edit], others: &[(String, Vec<u8>)]) -> Vec<u8> {
    let mut b = input.to_vec();
    for e in edits {
        match e {
            Edit::Flip(i, bit) if !b.is_empty() => {
                let i = i.index(b.len());
                b[i] ^= 1 << bit;
            }
            Edit::Set(i, v) if !b.is_empty() => {
                let i = i.index(b.len());
                b[i] = *v;
            }
            Edit::Interesting(i, v, be) if !b.is_empty() => {
                let value = INTERESTING[usize::from(*v) % INTERESTING.len()];
                let width = [1usize, 2, 4][usize::from(*v / 16) % 3];
                let bytes = if *be {
                    value.to_be_bytes()
                } else {
                    value.to_le_bytes()
                };
                let bytes = if *be {
                    &bytes[4 - width..]
                } else {
                    &bytes[..width]
                };
                let at = i.index(b.len());
                for (k, x) in bytes.iter().enumerate() {
                    if let Some(slot) = b.get_mut(at + k) {
                        *slot = *x;
                    }
                }
            }
            Edit::Insert(i, bytes) => {
                let at = i.index(b.len() + 1);
                b.splice(at..at, bytes.iter().copied());
            }
            Edit::Erase(i, n) if !b.is_empty() => {
                let at = i.index(b.len());
                let end = (at + n).min(b.len());
                b.drain(at..end);
            }
            Edit::Duplicate(from, to, n, insert) if !b.is_empty() => {
                let from = from.index(b.len());
                let range: Vec<u8> = b[from..(from + n).min(b.len())].to_vec();
                let to = to.index(b.len() + 1);
                if *insert {
                    b.splice(to..to, range);
                } else {
                    for (k, x) in range.into_iter().enumerate() {
                        match b.get_mut(to + k) {
                            Some(slot) => *slot = x,
                            None => b.push(x),
                        }
                    }
                }
            }
            Edit::Splice(seed, from, at, n) if !others.is_empty() => {
                let other = &others[seed.index(others.len())].1;
                if !other.is_empty() {
                    let from = from.index(other.len());
                    let range = &other[from..(from + n).min(other.len())];
                    let at = at.index(b.len() + 1);
                    b.splice(at..at, range.iter().copied());
                }
            }
            Edit::Truncate(i) => {
                let keep = i.index(b.len() + 1);
                b.truncate(keep);
            }
            _ => {}
        }
    }
    b
}

/// Hex of `b`, for a regression test.
pub(crate) fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}
