//! A count-min sketch of how often each cached key is used: the frequencies cache eviction
//! ranks by, in a few KB instead of a counter per entry (HyperSFC §III-C: "succinct data
//! structures such as sketches").

use flowstate_wire::hash::mix;
use std::sync::atomic::{AtomicU16, Ordering::Relaxed};
use std::sync::Arc;

/// Rows of a sketch (each with its own hash).
pub(crate) const ROWS: usize = 4;

/// Memory a sketch's counters can live in besides its own: e.g. a BPF array the XDP fast
/// path counts into while user space ranks evictions by it.
///
/// # Safety
/// `counters` must return the same memory on every call for as long as the value lives.
pub unsafe trait SharedCounters: Send + Sync + 'static {
    /// The counters.
    fn counters(&self) -> &[AtomicU16];
}

// SAFETY: a boxed slice never moves or changes length.
unsafe impl SharedCounters for Box<[AtomicU16]> {
    fn counters(&self) -> &[AtomicU16] {
        self
    }
}

/// A count-min sketch with periodic halving, so that old popularity fades: `ROWS` rows of
/// `width` 16-bit saturating counters, row after row (the layout the XDP program shares).
///
/// Counters are read and written with relaxed atomic loads and stores (plain moves), so that
/// the memory may be shared with a writer outside Rust (the kernel); an increment racing with
/// another is lost, which an estimate of use can afford.
pub struct CountMin {
    width_mask: usize,
    /// The first of `ROWS * width` counters in `memory`.
    base: *const AtomicU16,
    /// Keeps the counters alive.
    _memory: Arc<dyn SharedCounters>,
    seen: u64,
    halve_every: u64,
}

// SAFETY: `base` points into `memory`, which is Send + Sync and kept alive by the Arc; the
// counters are atomics.
unsafe impl Send for CountMin {}
unsafe impl Sync for CountMin {}

impl std::fmt::Debug for CountMin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CountMin")
            .field("width", &(self.width_mask + 1))
            .field("seen", &self.seen)
            .field("halve_every", &self.halve_every)
            .finish()
    }
}

impl CountMin {
    /// The width a sketch of `width` asks for gets: a power of two, at least 64.
    pub fn row_width(width: usize) -> usize {
        width.next_power_of_two().max(64)
    }

    /// A sketch of `width` counters per row (see [`row_width`](Self::row_width)) whose counts
    /// are halved every `halve_every` uses.
    pub fn new(width: usize, halve_every: u64) -> CountMin {
        let width = Self::row_width(width);
        let memory: Box<[AtomicU16]> = (0..ROWS * width).map(|_| AtomicU16::new(0)).collect();
        Self::shared(Arc::new(memory), 0, width, halve_every).expect("the sketch's own memory fits")
    }

    /// A sketch over `ROWS * width` counters of `memory` from `at` (`width` a power of two, at
    /// least 64), as they are; `None` if they do not fit.
    pub fn shared(
        memory: Arc<dyn SharedCounters>,
        at: usize,
        width: usize,
        halve_every: u64,
    ) -> Option<CountMin> {
        if width != Self::row_width(width)
            || at.checked_add(ROWS * width)? > memory.counters().len()
        {
            return None;
        }
        let base = memory.counters()[at..].as_ptr();
        Some(CountMin {
            width_mask: width - 1,
            base,
            _memory: memory,
            seen: 0,
            halve_every: halve_every.max(1),
        })
    }

    fn counters(&self) -> &[AtomicU16] {
        // SAFETY: `shared` checked that ROWS * width counters from `base` lie in `memory`,
        // which the Arc keeps alive and which returns the same memory on every call.
        unsafe { std::slice::from_raw_parts(self.base, ROWS * (self.width_mask + 1)) }
    }

    /// Counters per row.
    pub fn width(&self) -> usize {
        self.width_mask + 1
    }

    fn slot(&self, key: u128, row: usize) -> usize {
        row * (self.width_mask + 1) + (mix(key, row as u64 + 1) as usize & self.width_mask)
    }

    /// Counts one use of `key`.
    #[inline]
    pub fn touch(&mut self, key: u128) {
        let counters = self.counters();
        for row in 0..ROWS {
            let c = &counters[self.slot(key, row)];
            c.store(c.load(Relaxed).saturating_add(1), Relaxed);
        }
        self.seen += 1;
        if self.seen.is_multiple_of(self.halve_every) {
            self.halve();
        }
    }

    /// Takes note that uses were counted elsewhere (into shared memory) up to `seen` in all,
    /// and halves the counts once if a halving point was passed since the last note.
    pub fn seen_elsewhere(&mut self, seen: u64) {
        if seen / self.halve_every > self.seen / self.halve_every {
            self.halve();
        }
        self.seen = self.seen.max(seen);
    }

    fn halve(&self) {
        for c in self.counters() {
            c.store(c.load(Relaxed) >> 1, Relaxed);
        }
    }

    /// An estimate of `key`'s uses, never below the true (halved) count.
    pub fn estimate(&self, key: u128) -> u16 {
        let counters = self.counters();
        (0..ROWS)
            .map(|row| counters[self.slot(key, row)].load(Relaxed))
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

    #[test]
    fn a_shared_sketch_reads_what_was_counted_into_its_memory() {
        let memory: Arc<dyn SharedCounters> = Arc::new(
            (0..ROWS * 64 + 8)
                .map(|_| AtomicU16::new(0))
                .collect::<Box<[AtomicU16]>>(),
        );
        let mut writer = CountMin::shared(Arc::clone(&memory), 8, 64, u64::MAX).unwrap();
        let mut reader = CountMin::shared(Arc::clone(&memory), 8, 64, 10).unwrap();
        for _ in 0..7 {
            writer.touch(5);
        }
        assert_eq!(reader.estimate(5), 7);
        assert!(memory.counters()[..8].iter().all(|c| c.load(Relaxed) == 0));
        reader.seen_elsewhere(9);
        assert_eq!(reader.estimate(5), 7);
        reader.seen_elsewhere(10);
        assert_eq!(reader.estimate(5), 3, "halved once at the tenth use");
        assert!(CountMin::shared(Arc::clone(&memory), 9, 64, 1).is_none());
        assert!(CountMin::shared(memory, 0, 100, 1).is_none());
    }
}
