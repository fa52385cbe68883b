//! A count-min sketch of how often each cached key is used: the frequencies cache eviction
//! ranks by, in a few KB instead of a counter per entry (HyperSFC §III-C: "succinct data
//! structures such as sketches").

use crate::hash::mix;

const ROWS: usize = 4;

/// A count-min sketch with periodic halving, so that old popularity fades.
#[derive(Clone, Debug)]
pub struct CountMin {
    width_mask: usize,
    counters: Vec<u16>,
    seen: u64,
    halve_every: u64,
}

impl CountMin {
    /// A sketch of `width` counters per row (rounded up to a power of two) whose counts are
    /// halved every `halve_every` increments.
    pub fn new(width: usize, halve_every: u64) -> CountMin {
        let width = width.next_power_of_two().max(64);
        CountMin {
            width_mask: width - 1,
            counters: vec![0; ROWS * width],
            seen: 0,
            halve_every: halve_every.max(1),
        }
    }

    fn slot(&self, key: u128, row: usize) -> usize {
        row * (self.width_mask + 1) + (mix(key, row as u64 + 1) as usize & self.width_mask)
    }

    /// Counts one use of `key`.
    pub fn touch(&mut self, key: u128) {
        for row in 0..ROWS {
            let i = self.slot(key, row);
            self.counters[i] = self.counters[i].saturating_add(1);
        }
        self.seen += 1;
        if self.seen % self.halve_every == 0 {
            for c in &mut self.counters {
                *c >>= 1;
            }
        }
    }

    /// An estimate of `key`'s uses, never below the true (halved) count.
    pub fn estimate(&self, key: u128) -> u16 {
        (0..ROWS)
            .map(|row| self.counters[self.slot(key, row)])
            .min()
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn estimates_never_undercount_and_separate_hot_from_cold() {
        let mut s = CountMin::new(1024, u64::MAX);
        for k in 0..500u128 {
            for _ in 0..(if k < 10 { 50 } else { 1 }) {
                s.touch(k);
            }
        }
        for k in 0..10u128 {
            assert!(s.estimate(k) >= 50);
        }
        let cold_max = (10..500u128).map(|k| s.estimate(k)).max().unwrap();
        assert!(cold_max < 50, "a cold key estimated at {cold_max}");
    }

    #[test]
    fn counts_fade() {
        let mut s = CountMin::new(64, 100);
        for _ in 0..99 {
            s.touch(1);
        }
        assert_eq!(s.estimate(1), 99);
        s.touch(2);
        assert_eq!(s.estimate(1), 49);
    }
}
