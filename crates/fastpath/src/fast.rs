//! The fast path: the pipeline's tables as caches, and how a packet that misses gets to the
//! slow path and back (HyperSFC §III-A busy submit, §III-B table bypass, §IV lazy submit).
//!
//! A packet carries its circulation header ([`Packet`]): where to resume (the ingress bypass:
//! tables before it are not searched again), the (table, key) pairs the slow path must search,
//! and the slow path's answers.
//!
//! * **Busy submit**: the first miss ends the pass (the egress bypass: no later table is
//!   searched) and the packet goes to the slow path with that one (table, key).
//! * **Lazy submit**: a miss is pushed on the packet's stack and the pass goes on to the end,
//!   so one circulation resolves every miss on the way. Past a missed table, the pass goes on
//!   only while its searches can be right: a later table whose key reads a field a missed
//!   table may write ends the pass (its key would be a guess); a missed table with branches
//!   continues on the branch its 2D Bloom filters select (§IV-A), or ends the pass when they
//!   detect a false positive; and a drop after a miss ends it too.
//! * **Returned packets** resume at the first table that missed, with the headers it had
//!   there, and take the slow path's answer for each (table, key) it searched: the entry found
//!   (carried in the return, so a packet never waits for an install and an entry evicted in
//!   the meantime costs nothing) or "absent", which applies the table's default. A Bloom
//!   branch guessed wrong is corrected here by the entry itself.
//!
//! Deviation from HyperSFC, on purpose: the slow path returns the entry, not one found bit,
//! and the second pass runs the tables from the first miss in order rather than jumping to the
//! missed ones. Both keep the verdict exactly the full tables' (actions apply in table order,
//! keys see the headers the earlier tables wrote) and bound the circulations of a packet by
//! the number of tables. Every miss still costs what HyperSFC's does: one circulation in busy
//! mode, one per pass in lazy mode.
//!
//! Promise (tested against [`FullTables::reference`](crate::full::FullTables::reference)):
//! whatever the caches hold, in either mode, a packet's outcome is the full tables' outcome.

use crate::bloom::{Bloom2d, Select};
use crate::cache::{CacheStats, ExactCache, LpmCache, Prefix};
use crate::full::Found;
use crate::headers::{Fields, Headers, Rule};
use crate::table::{Kind, Pipeline, MAX_TABLES};

/// How misses reach the slow path.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mode {
    /// At the first miss (§III-A).
    Busy,
    /// At the end of the pipeline, with every miss (§IV); the slow path searches them in turn.
    Lazy,
    /// As `Lazy`, the slow path searching the tables in parallel (§IV, "lazy-p").
    LazyParallel,
}

impl Mode {
    /// The name in configuration and results.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Busy => "busy",
            Mode::Lazy => "lazy",
            Mode::LazyParallel => "lazy-p",
        }
    }

    /// The mode named `s`.
    pub fn parse(s: &str) -> Option<Mode> {
        [Mode::Busy, Mode::Lazy, Mode::LazyParallel]
            .into_iter()
            .find(|m| m.name() == s)
    }

    fn lazy(self) -> bool {
        self != Mode::Busy
    }
}

/// What the slow path knows about one (table, key).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    /// To be searched.
    Pending,
    /// The entry.
    Hit(Rule),
    /// No entry: the table's default.
    Absent,
}

/// One (table, key) of a packet's circulation header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Search {
    /// The table.
    pub table: u8,
    /// The key (for LPM, the address).
    pub key: u128,
    /// The answer.
    pub answer: Answer,
}

/// Searches a packet can carry: every table of a pass can miss, plus the answers of earlier
/// circulations.
pub const MAX_SEARCHES: usize = 2 * MAX_TABLES;

/// Bytes of a circulation header entry on the way to the slow path: table id and key
/// (HyperSFC's "table ID and search key").
pub const SUBMIT_ENTRY_BYTES: u64 = 1 + 16;
/// Bytes of an answer on the way back: table id, found, and the 12-byte rule.
pub const ANSWER_ENTRY_BYTES: u64 = 1 + 1 + 12;
/// Bytes of the circulation header itself: type and count.
pub const HEADER_BYTES: u64 = 2;

/// A packet in the fast path, with its circulation header.
#[derive(Clone, Debug)]
pub struct Packet {
    /// The caller's id.
    pub id: u64,
    /// Length on the wire, for the bandwidth counters.
    pub len: u16,
    /// Headers (at `resume`, while circulating).
    pub headers: Headers,
    /// When it entered (the caller's clock).
    pub born_ns: u64,
    /// The table to resume at.
    resume: u8,
    /// The circulation header's (table, key) stack: empty, and unallocated, until a miss.
    searches: Vec<Search>,
    /// Times sent to the slow path.
    pub circulations: u8,
}

impl Packet {
    /// A new packet.
    pub fn new(id: u64, headers: Headers, len: u16, born_ns: u64) -> Packet {
        Packet {
            id,
            len,
            headers,
            born_ns,
            resume: 0,
            searches: Vec::new(),
            circulations: 0,
        }
    }

    /// The searches carried.
    pub fn searches(&self) -> &[Search] {
        &self.searches
    }

    /// The searches carried, to answer.
    pub fn searches_mut(&mut self) -> &mut [Search] {
        &mut self.searches
    }

    /// The searches the slow path still has to do.
    pub fn pending(&self) -> impl Iterator<Item = &Search> {
        self.searches()
            .iter()
            .filter(|s| s.answer == Answer::Pending)
    }

    fn answer(&self, table: usize, key: u128) -> Option<Answer> {
        self.searches()
            .iter()
            .find(|s| usize::from(s.table) == table && s.key == key)
            .map(|s| s.answer)
    }

    /// Bytes on the link to the slow path for this circulation.
    pub fn submit_bytes(&self) -> u64 {
        u64::from(self.len) + HEADER_BYTES + SUBMIT_ENTRY_BYTES * self.pending().count() as u64
    }

    /// Bytes on the link back.
    pub fn return_bytes(&self, answered: usize) -> u64 {
        u64::from(self.len) + HEADER_BYTES + ANSWER_ENTRY_BYTES * answered as u64
    }
}

/// The result of one pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// The pipeline is done: the packet's headers are final.
    Done {
        /// Whether a table dropped it.
        dropped: bool,
    },
    /// Send the packet to the slow path.
    Submit,
}

/// Counters of the fast path.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FastStats {
    /// Passes through the pipeline.
    pub passes: u64,
    /// Packets finished.
    pub done: u64,
    /// Circulations to the slow path.
    pub submits: u64,
    /// Lazy passes ended early by a key depending on a missed table.
    pub dependency_stops: u64,
    /// Lazy passes ended early by a detected Bloom false positive.
    pub bloom_unsure: u64,
    /// Branches taken from the Bloom filters.
    pub bloom_guesses: u64,
    /// Misses settled by the Bloom filters as absent (no circulation needed).
    pub bloom_absent: u64,
    /// Lazy passes ended early by a drop after a miss.
    pub drop_stops: u64,
}

enum Cache {
    Exact(ExactCache),
    Lpm(LpmCache),
}

/// The fast path: one cache per table, and the Bloom selectors.
pub struct FastPath {
    pipeline: Pipeline,
    mode: Mode,
    caches: Vec<Cache>,
    blooms: Vec<Option<Bloom2d>>,
    reads: Vec<Fields>,
    stats: FastStats,
}

impl FastPath {
    /// Empty caches for `pipeline` (checked by the caller), and its Bloom selectors.
    pub fn new(pipeline: &Pipeline, mode: Mode, blooms: Vec<Option<Bloom2d>>) -> FastPath {
        let caches = pipeline
            .tables
            .iter()
            .map(|t| match t.kind {
                Kind::Exact => Cache::Exact(ExactCache::new(t.cache)),
                Kind::Lpm => Cache::Lpm(LpmCache::new(t.cache)),
            })
            .collect();
        let mut blooms = blooms;
        blooms.resize_with(pipeline.tables.len(), || None);
        FastPath {
            reads: pipeline.tables.iter().map(|t| t.reads()).collect(),
            pipeline: pipeline.clone(),
            mode,
            caches,
            blooms,
            stats: FastStats::default(),
        }
    }

    /// The submit mode.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// Counters.
    pub fn stats(&self) -> FastStats {
        self.stats
    }

    /// Each table's cache counters.
    pub fn cache_stats(&self) -> Vec<CacheStats> {
        self.caches
            .iter()
            .map(|c| match c {
                Cache::Exact(c) => c.stats(),
                Cache::Lpm(c) => c.stats(),
            })
            .collect()
    }

    /// Entries cached per table.
    pub fn cached(&self) -> Vec<usize> {
        self.caches
            .iter()
            .map(|c| match c {
                Cache::Exact(c) => c.len(),
                Cache::Lpm(c) => c.len(),
            })
            .collect()
    }

    /// Installs what a slow-path search found into table `t`'s cache (HyperSFC: "the matched
    /// rules will be installed to the data plane").
    pub fn install(&mut self, t: usize, found: &Found) {
        let entries = &found.install;
        match &mut self.caches[t] {
            Cache::Exact(c) => {
                for (k, r) in entries {
                    c.install(*k, *r);
                }
            }
            Cache::Lpm(c) => {
                let group: Vec<(Prefix, Rule)> = entries
                    .iter()
                    .map(|(k, r)| (Prefix::from_key(*k), *r))
                    .collect();
                c.install(&group);
            }
        }
    }

    /// One pass of `p` through the pipeline, from where it resumes. On [`Step::Submit`] the
    /// packet holds the headers and table to resume at and the searches to do; on
    /// [`Step::Done`] its final headers.
    pub fn pass(&mut self, p: &mut Packet) -> Step {
        self.stats.passes += 1;
        // Keep the answers of earlier circulations; what is pending is searched again.
        p.searches.retain(|s| s.answer != Answer::Pending);
        let lazy = self.mode.lazy();
        let mut t = usize::from(p.resume);
        let mut h = p.headers;
        let mut first_miss: Option<(usize, Headers)> = None;
        let mut unknown = Fields::default();
        while let Some(table) = self.pipeline.tables.get(t) {
            if first_miss.is_some() && self.reads[t].overlaps(unknown) {
                self.stats.dependency_stops += 1;
                break;
            }
            let key = table.key_of(&h);
            let cached = match &mut self.caches[t] {
                Cache::Exact(c) => c.lookup(key),
                Cache::Lpm(c) => c.lookup(key as u32).map(|(_, r)| r),
            };
            let rule = match cached.map(Answer::Hit).or_else(|| p.answer(t, key)) {
                Some(Answer::Hit(r)) => r,
                Some(Answer::Absent) => table.default,
                Some(Answer::Pending) | None => {
                    let bloom = if lazy {
                        self.blooms[t].as_ref().map(|b| b.select(key))
                    } else {
                        None
                    };
                    if bloom == Some(Select::Absent) {
                        // Not in the full table (Bloom filters have no false negatives): its
                        // default is known here, no circulation needed.
                        self.stats.bloom_absent += 1;
                        table.default
                    } else {
                        // A miss: on the packet's stack.
                        if p.searches.len() == MAX_SEARCHES {
                            if first_miss.is_some() {
                                break;
                            }
                            p.searches.clear(); // forget old answers rather than lose the miss
                        }
                        p.searches.push(Search {
                            table: t as u8,
                            key,
                            answer: Answer::Pending,
                        });
                        first_miss.get_or_insert((t, h));
                        if !lazy {
                            break; // busy submit, egress bypass
                        }
                        unknown = unknown.union(table.writes);
                        match bloom {
                            // One way on: the next table does not depend on the entry.
                            None if table.branches.len() <= 1 => {
                                t = self.pipeline.next(t, &Rule::default())
                            }
                            Some(Select::Branch(b)) => {
                                self.stats.bloom_guesses += 1;
                                t = self.pipeline.next(t, &Rule::default().to_branch(b));
                            }
                            Some(Select::Unsure) => {
                                self.stats.bloom_unsure += 1;
                                break;
                            }
                            _ => break, // branches without a selector
                        }
                        continue;
                    }
                }
            };
            rule.apply(&mut h);
            if rule.drop {
                if first_miss.is_some() {
                    self.stats.drop_stops += 1;
                    break;
                }
                p.headers = h;
                self.stats.done += 1;
                return Step::Done { dropped: true };
            }
            t = self.pipeline.next(t, &rule);
        }
        match first_miss {
            Some((t0, h0)) => {
                p.resume = t0 as u8;
                p.headers = h0;
                p.circulations = p.circulations.saturating_add(1);
                self.stats.submits += 1;
                Step::Submit
            }
            None => {
                p.headers = h;
                self.stats.done += 1;
                Step::Done { dropped: false }
            }
        }
    }
}
