//! 2D Bloom filters: which branch a key's table entry takes, kept in the fast path so that lazy
//! submit can go on past a missed branching table (HyperSFC §IV-A, Algorithm 1).
//!
//! `f` Bloom filters of `bits` bits each, `h` hash functions per filter. Each branch is given
//! an `f`-bit code with exactly `weight` ones (fixed-weight codes); a key is inserted into the
//! filters its branch's code has ones for (Generator). Selecting tests the key in all `f`
//! filters (Selector):
//! * fewer than `weight` filters answer yes: the key is in none of the table's entries
//!   ([`Select::Absent`]; Bloom filters have no false negatives);
//! * more than `weight`: a false positive, detected ([`Select::Unsure`]: ask the slow path);
//! * exactly `weight`: the branch whose code that is ([`Select::Branch`]), or `Unsure` when the
//!   pattern is no branch's code.
//!
//! Promise: a key that is in the table is never given a wrong branch: its own code's filters
//! all answer yes, so any false positive adds a one and makes the weight too high. A key that
//! is *not* in the table can, with probability about the false-positive rate to the power
//! `weight`, hit exactly one code's filters; the fast path treats a branch as a guess to be
//! confirmed by the entry itself (see `crate::fast`), so that costs a circulation, never a
//! wrong verdict.

use flowstate_wire::hash::mix;

/// How a [`Bloom2d`] is sized.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BloomParams {
    /// Number of filters `f` (at most 32).
    pub filters: u8,
    /// Ones per code `n` (1..=filters).
    pub weight: u8,
    /// Bits per filter (a power of two, at least 64).
    pub bits: usize,
    /// Hash functions per filter.
    pub hashes: u8,
}

/// The answer of [`Bloom2d::select`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Select {
    /// The key's entry takes this branch (or, for a key not in the table, a rare guess).
    Branch(u8),
    /// The key is in no entry of the table.
    Absent,
    /// A false positive was detected: only the full table can tell.
    Unsure,
}

/// One table's 2D Bloom filters.
#[derive(Clone, Debug)]
pub struct Bloom2d {
    p: BloomParams,
    seed: u64,
    /// `filters` bit vectors of `bits` bits, one after another.
    words: Vec<u64>,
    /// Branch index to code.
    codes: Vec<u32>,
}

/// Number of `n`-subsets of `f` elements.
pub fn choose(f: u32, n: u32) -> u64 {
    (0..u64::from(n)).fold(1u64, |acc, i| acc * (u64::from(f) - i) / (i + 1))
}

impl BloomParams {
    /// Checks the parameters for `branches` branches; the error says what is wrong.
    pub fn check(&self, branches: usize) -> Result<(), String> {
        if self.filters == 0 || self.filters > 32 {
            return Err(format!("filters = {}: must be 1..=32", self.filters));
        }
        if self.weight == 0 || self.weight > self.filters {
            return Err(format!(
                "weight = {}: must be 1..=filters ({})",
                self.weight, self.filters
            ));
        }
        if !self.bits.is_power_of_two() || self.bits < 64 {
            return Err(format!(
                "bits = {}: must be a power of two, at least 64",
                self.bits
            ));
        }
        if self.hashes == 0 || self.hashes > 16 {
            return Err(format!("hashes = {}: must be 1..=16", self.hashes));
        }
        let codes = choose(u32::from(self.filters), u32::from(self.weight));
        if (codes as usize) < branches {
            return Err(format!(
                "{} filters of weight {} give {codes} codes, fewer than the {branches} branches",
                self.filters, self.weight
            ));
        }
        Ok(())
    }

    /// The smallest parameters of weight 2 that code `branches` branches with a false-positive
    /// rate per filter of about `fp` for `keys` keys (the classic `m = -k n ln p / ln² 2`
    /// sizing, with `k` = 3 hashes). Each key sits in `weight` of the filters, so a filter
    /// holds about `keys * weight / filters` keys.
    pub fn sized(branches: usize, keys: usize, fp: f64) -> BloomParams {
        let weight = 2u8;
        let mut filters = 2u8;
        while (choose(u32::from(filters), 2) as usize) < branches.max(1) {
            filters += 1;
        }
        let per_filter = (keys * usize::from(weight))
            .div_ceil(usize::from(filters))
            .max(1);
        let hashes = 3u8;
        let ln2 = std::f64::consts::LN_2;
        let m = -(f64::from(hashes) * per_filter as f64) / (1.0 - fp.powf(1.0 / 3.0)).ln();
        let m = m.max(-(per_filter as f64) * fp.ln() / (ln2 * ln2));
        BloomParams {
            filters,
            weight,
            bits: (m.ceil() as usize).next_power_of_two().max(64),
            hashes,
        }
    }
}

impl Bloom2d {
    /// Empty filters for `branches` branches; `seed` makes one table's hashes differ from
    /// another's.
    pub fn new(p: BloomParams, branches: usize, seed: u64) -> Result<Bloom2d, String> {
        p.check(branches)?;
        // The first `branches` codes of weight `n`, in increasing order.
        let mut codes = Vec::with_capacity(branches);
        let mut c: u32 = (1u32 << p.weight) - 1;
        while codes.len() < branches {
            codes.push(c);
            // Next number with the same popcount (Gosper's hack).
            let t = c | (c - 1);
            c = (t + 1) | (((!t & (!t).wrapping_neg()) - 1) >> (c.trailing_zeros() + 1));
        }
        Ok(Bloom2d {
            p,
            seed,
            words: vec![0; usize::from(p.filters) * p.bits / 64],
            codes,
        })
    }

    /// The parameters.
    pub fn params(&self) -> BloomParams {
        self.p
    }

    /// The seed of the hashes.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// The filters' bits: filter `f`'s bit `b` is bit `(f * bits + b) % 64` of word
    /// `(f * bits + b) / 64`.
    pub fn words(&self) -> &[u64] {
        &self.words
    }

    /// Each branch's code: bit `f` set iff the branch's keys are in filter `f`.
    pub fn codes(&self) -> &[u32] {
        &self.codes
    }

    /// Bytes of filter memory (what a switch or a BPF array would hold).
    pub fn memory_bytes(&self) -> usize {
        self.words.len() * 8
    }

    fn positions(&self, key: u128, filter: u8) -> impl Iterator<Item = usize> + '_ {
        // Double hashing (Kirsch–Mitzenmacher): h_i = h1 + i * h2.
        let h = mix(
            key,
            self.seed ^ u64::from(filter).wrapping_mul(0x9e37_79b9_7f4a_7c15),
        );
        let (h1, h2) = (h as u32 as usize, (h >> 32) as usize | 1);
        let base = usize::from(filter) * self.p.bits;
        let mask = self.p.bits - 1;
        (0..usize::from(self.p.hashes)).map(move |i| base + (h1.wrapping_add(i * h2) & mask))
    }

    /// Generator: records that `key`'s entry takes `branch`.
    pub fn insert(&mut self, key: u128, branch: u8) {
        let Some(&code) = self.codes.get(usize::from(branch)) else {
            return;
        };
        for filter in 0..self.p.filters {
            if code >> filter & 1 == 1 {
                let mut at = [0usize; 16];
                let n = usize::from(self.p.hashes);
                for (slot, b) in at.iter_mut().zip(self.positions(key, filter)) {
                    *slot = b;
                }
                for b in &at[..n] {
                    self.words[b / 64] |= 1 << (b % 64);
                }
            }
        }
    }

    /// Selector: which branch `key`'s entry takes, as far as the filters can tell.
    pub fn select(&self, key: u128) -> Select {
        let mut code = 0u32;
        for filter in 0..self.p.filters {
            if self
                .positions(key, filter)
                .all(|b| self.words[b / 64] >> (b % 64) & 1 == 1)
            {
                code |= 1 << filter;
            }
        }
        match code.count_ones().cmp(&u32::from(self.p.weight)) {
            std::cmp::Ordering::Less => Select::Absent,
            std::cmp::Ordering::Greater => Select::Unsure,
            std::cmp::Ordering::Equal => match self.codes.binary_search(&code) {
                Ok(i) => Select::Branch(i as u8),
                Err(_) => Select::Unsure,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn codes_have_fixed_weight_and_are_distinct() {
        let p = BloomParams {
            filters: 5,
            weight: 2,
            bits: 64,
            hashes: 2,
        };
        let b = Bloom2d::new(p, 10, 1).unwrap();
        assert_eq!(b.codes.len(), 10);
        assert!(b.codes.iter().all(|c| c.count_ones() == 2 && *c < 32));
        assert!(b.codes.windows(2).all(|w| w[0] < w[1]));
        assert!(Bloom2d::new(p, 11, 1).unwrap_err().contains("10 codes"));
        assert_eq!(choose(5, 2), 10);
    }

    #[test]
    fn bad_parameters_are_named() {
        let ok = BloomParams {
            filters: 4,
            weight: 2,
            bits: 128,
            hashes: 3,
        };
        assert!(BloomParams { bits: 100, ..ok }
            .check(2)
            .unwrap_err()
            .contains("bits"));
        assert!(BloomParams { weight: 5, ..ok }
            .check(2)
            .unwrap_err()
            .contains("weight"));
        assert!(BloomParams { filters: 0, ..ok }
            .check(2)
            .unwrap_err()
            .contains("filters"));
        assert!(BloomParams { hashes: 0, ..ok }
            .check(2)
            .unwrap_err()
            .contains("hashes"));
    }

    #[test]
    fn tiny_filters_detect_their_false_positives() {
        // 64 bits per filter for 2,000 keys: nearly every bit set, so most absent keys
        // collide; the weight check must turn that into Unsure, never into a wrong branch for
        // a key that is present.
        let p = BloomParams {
            filters: 6,
            weight: 3,
            bits: 64,
            hashes: 2,
        };
        let mut b = Bloom2d::new(p, 4, 7).unwrap();
        for k in 0..2000u128 {
            b.insert(k, (k % 4) as u8);
        }
        let mut unsure = 0;
        for k in 0..2000u128 {
            match b.select(k) {
                Select::Branch(x) => assert_eq!(u128::from(x), k % 4),
                Select::Unsure => unsure += 1,
                Select::Absent => panic!("a present key is never absent"),
            }
        }
        assert!(
            unsure > 0,
            "saturated filters must produce detected false positives"
        );
    }

    #[test]
    fn sized_filters_meet_their_rate() {
        let p = BloomParams::sized(4, 10_000, 0.01);
        let mut b = Bloom2d::new(p, 4, 3).unwrap();
        for k in 0..10_000u128 {
            b.insert(k, (k % 4) as u8);
        }
        let wrong = (1_000_000..1_020_000u128)
            .filter(|k| b.select(*k) != Select::Absent)
            .count();
        // An absent key is misread when at least `weight` filters say yes: far rarer than
        // the per-filter rate.
        assert!(
            wrong < 200,
            "{wrong} of 20,000 absent keys misread, params {p:?}"
        );
    }

    proptest! {
        #[test]
        fn a_present_key_never_gets_a_wrong_branch(
            entries in proptest::collection::hash_map(any::<u128>(), 0u8..6, 1..400),
            bits in prop_oneof![Just(64usize), Just(256), Just(4096)],
        ) {
            let p = BloomParams { filters: 5, weight: 2, bits, hashes: 3 };
            let mut b = Bloom2d::new(p, 6, 11).unwrap();
            for (k, br) in &entries {
                b.insert(*k, *br);
            }
            for (k, br) in &entries {
                let s = b.select(*k);
                prop_assert!(s == Select::Branch(*br) || s == Select::Unsure, "{s:?} for branch {br}");
            }
        }
    }
}
