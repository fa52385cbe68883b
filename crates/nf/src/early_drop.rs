//! Early drop, as conntrack's: when a table is full, a new entry ends an old one that is
//! expendable (never answered, or ended) rather than being refused. [`Candidates`] remembers
//! the keys of entries that are, or may become, expendable, oldest first; whether one still is
//! is checked when it is taken, so a key may be remembered twice or go stale at no cost.
//! [`Cap`] is one table's cap built on them, shared by every NF's per-flow tables.

use crate::{BuildError, Placement};
use flowstate_state::{Access, Counter, Declare, Scope, StateError};
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

/// Default cap of a per-flow table, shared by a stage's workers: 262,144 entries, Linux
/// conntrack's `nf_conntrack_max` on a machine this size (and the firewall's
/// `max_connections`).
pub(crate) const DEFAULT_MAX: u64 = 1 << 18;

pub(crate) fn default_max() -> u64 {
    DEFAULT_MAX
}

pub(crate) fn default_early_drop() -> bool {
    true
}

/// Checks a cap key (`max_flows`, `max_connections`): at least 1.
pub(crate) fn check_max(nf: &'static str, key: &str, max: u64, errors: &mut Vec<BuildError>) {
    if max == 0 {
        errors.push(BuildError::config(nf, key, "expected at least 1"));
    }
}

/// What a capped table holds, which names its counters and its cap's gauge.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Unit {
    /// Flows (`flows_early_dropped`, `flows_table_full`, `max_flows`).
    Flows,
    /// Connections (`conns_early_dropped`, `conns_table_full`, `max_connections`).
    Conns,
    /// TCP reassembly streams (`streams_early_dropped`, `streams_table_full`, `max_streams`).
    Streams,
    /// The trojan detector's partial lines (`lines_early_dropped`, `lines_table_full`,
    /// `max_lines`).
    Lines,
}

impl Unit {
    /// The early-drop counter's, the table-full counter's and the cap gauge's names.
    const fn names(self) -> [&'static str; 3] {
        match self {
            Unit::Flows => ["flows_early_dropped", "flows_table_full", "max_flows"],
            Unit::Conns => ["conns_early_dropped", "conns_table_full", "max_connections"],
            Unit::Streams => ["streams_early_dropped", "streams_table_full", "max_streams"],
            Unit::Lines => ["lines_early_dropped", "lines_table_full", "max_lines"],
        }
    }
}

/// The cap of one worker's per-flow table: at most its share of the configured maximum; a
/// new entry at the cap ends the oldest expendable one with early drop (as conntrack's
/// `early_drop`), else it is refused (as conntrack's "table full, dropping packet"). Both are
/// counted (state counters, so they add up over workers).
pub(crate) struct Cap<K> {
    limit: usize,
    candidates: Candidates<K>,
    early_dropped: Counter,
    full: Counter,
    unit: Unit,
}

impl<K> Cap<K> {
    /// Declares the counters of a table of `unit`s holding at most `max` over the workers,
    /// with early drop `early_drop`.
    pub(crate) fn declare(
        state: &mut Declare<'_>,
        unit: Unit,
        max: u64,
        early_drop: bool,
        worker: Placement,
    ) -> Result<Cap<K>, StateError> {
        let [dropped, full, _] = unit.names();
        Ok(Cap {
            limit: usize::try_from(max.div_ceil(u64::from(worker.partitions.max(1))))
                .unwrap_or(usize::MAX),
            candidates: Candidates::new(early_drop),
            early_dropped: state.counter(dropped, Scope::CrossFlow(&[]), Access::WriteMostly)?,
            full: state.counter(full, Scope::CrossFlow(&[]), Access::WriteMostly)?,
            unit,
        })
    }

    /// Remembers an entry just put in the table (or one that became expendable): early
    /// drop's candidates are taken oldest first.
    #[inline]
    pub(crate) fn remember(&mut self, key: K) {
        self.candidates.remember(key);
    }

    /// Whether a new entry may go into the table, which holds `len` entries: below the cap,
    /// or at it once `end` (which ends a candidate if it still is expendable, and says
    /// whether it did) made room. Counts the entries ended and the ones refused.
    #[inline]
    pub(crate) fn admit(&mut self, len: usize, end: impl FnMut(K) -> bool) -> bool {
        if len < self.limit {
            return true;
        }
        if self.candidates.make_room(end) {
            self.early_dropped.add_nowait(1);
            true
        } else {
            self.full.add_nowait(1);
            false
        }
    }

    /// Entries ended early, over the workers (-1: unreadable).
    pub(crate) fn early_dropped(&self) -> i64 {
        self.early_dropped.get().unwrap_or(-1)
    }

    /// New entries refused, over the workers (-1: unreadable).
    pub(crate) fn table_full(&self) -> i64 {
        self.full.get().unwrap_or(-1)
    }

    /// The counters and this worker's cap (a gauge), for
    /// [`crate::NetworkFunction::report`].
    pub(crate) fn report(&self, out: &mut Vec<(&'static str, i64)>) {
        let [dropped, full, max] = self.unit.names();
        out.push((dropped, self.early_dropped()));
        out.push((full, self.table_full()));
        out.push((max, self.limit as i64));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flowstate_state::local::LocalStore;
    use flowstate_state::{Partition, StateConfig};
    use std::collections::BTreeSet;

    fn worker(partitions: u32) -> Placement {
        Placement {
            stage: 0,
            partition: 0,
            partitions,
        }
    }

    /// A table of `u32` keys (even: expendable) under a cap of `max` over `partitions`.
    fn run(max: u64, partitions: u32, early_drop: bool, keys: &[u32]) -> (BTreeSet<u32>, [i64; 3]) {
        let mut part = Partition::new(&LocalStore::new(), StateConfig::default()).unwrap();
        let mut cap = Cap::declare(
            &mut part.declare("t"),
            Unit::Flows,
            max,
            early_drop,
            worker(partitions),
        )
        .unwrap();
        let mut table = BTreeSet::new();
        for &k in keys {
            if cap.admit(table.len(), |old| old % 2 == 0 && table.remove(&old)) {
                table.insert(k);
                cap.remember(k);
            }
            assert!(table.len() <= cap.limit);
        }
        let mut out = Vec::new();
        cap.report(&mut out);
        let get = |n: &str| out.iter().find(|(k, _)| *k == n).unwrap().1;
        (
            table,
            [
                get("flows_early_dropped"),
                get("flows_table_full"),
                get("max_flows"),
            ],
        )
    }

    #[test]
    fn a_cap_ends_the_oldest_expendable_entry_or_refuses() {
        // 1 and 3 are never expendable; 2, 4, 6, 8 are.
        let keys = [1, 2, 3, 4, 6, 8];
        let (table, counts) = run(3, 1, true, &keys);
        assert_eq!(table, BTreeSet::from([1, 3, 8]));
        assert_eq!(counts, [3, 0, 3]);
        let (table, counts) = run(3, 1, false, &keys);
        assert_eq!(table, BTreeSet::from([1, 2, 3]));
        assert_eq!(counts, [0, 3, 3]);
        // Nothing expendable: even early drop refuses.
        let (table, counts) = run(2, 1, true, &[1, 3, 5, 7]);
        assert_eq!(table, BTreeSet::from([1, 3]));
        assert_eq!(counts, [0, 2, 2]);
    }

    #[test]
    fn the_maximum_is_shared_by_the_workers() {
        assert_eq!(run(10, 4, true, &[]).1[2], 3);
        assert_eq!(run(1, 8, true, &[]).1[2], 1);
        assert_eq!(run(DEFAULT_MAX, 1, true, &[]).1[2], 262_144);
    }
}
