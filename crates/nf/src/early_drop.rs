//! Early drop, as conntrack's: when a table is full, a new entry ends an old one that is
//! expendable (never answered, or ended) rather than being refused. [`Candidates`] remembers
//! the keys of entries that are, or may become, expendable, oldest first; whether one still is
//! is checked when it is taken, so a key may be remembered twice or go stale at no cost.

use std::collections::VecDeque;

/// Keys remembered per table, at most (the oldest is forgotten beyond).
const CANDIDATES: usize = 1 << 16;
/// Keys offered for one new entry, at most.
const SCAN: usize = 64;

/// The early-drop candidates of one worker's table.
#[derive(Debug)]
pub(crate) struct Candidates<K> {
    queue: VecDeque<K>,
    on: bool,
}

impl<K> Candidates<K> {
    /// Candidates of a table with early drop `on` (off: nothing is remembered or ended).
    pub(crate) fn new(on: bool) -> Self {
        Candidates {
            queue: VecDeque::with_capacity(if on { CANDIDATES } else { 0 }),
            on,
        }
    }

    /// Remembers an entry that is, or may become, expendable.
    #[inline]
    pub(crate) fn remember(&mut self, key: K) {
        if self.on {
            if self.queue.len() == CANDIDATES {
                self.queue.pop_front();
            }
            self.queue.push_back(key);
        }
    }

    /// Offers the oldest candidates, at most [`SCAN`] of them, to `end`, which ends one if it
    /// still is expendable and says whether it did; whether one was ended.
    pub(crate) fn make_room(&mut self, mut end: impl FnMut(K) -> bool) -> bool {
        if !self.on {
            return false;
        }
        for _ in 0..SCAN {
            let Some(k) = self.queue.pop_front() else {
                return false;
            };
            if end(k) {
                return true;
            }
        }
        false
    }
}
