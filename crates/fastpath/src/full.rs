//! The slow path's full tables, kept through the state API (HyperSFC's agent kept them in
//! Redis; here any store the configuration names), with the indexes an LPM table needs.
//!
//! Each table is one shared map `fastpath@Map@<table>` from key to [`Rule`] (an LPM table's
//! key is [`Prefix::key`]). Reads go to the store on every lookup (shared, read-write, not
//! cached: the full table is the store's), so several slow-path threads and processes see one
//! table. An LPM table also keeps, in memory, the set of its prefixes: longest-prefix match
//! and "every longer prefix under this one" are not operations a key-value store offers. LPM
//! tables are loaded from configuration and do not change while running; exact tables grow
//! when a balancing table admits a new flow.

use crate::bloom::Bloom2d;
use crate::cache::{mask, Prefix};
use crate::headers::{Headers, Rule};
use crate::table::{Kind, Pipeline};
use flowstate_state::{Access, Connector, Map, Partition, Scope, StateConfig, StateError};
use std::collections::{BTreeSet, HashSet};
use std::sync::Arc;

/// The state API's NF name for the full tables.
pub const STATE_NF: &str = "fastpath";

/// An LPM table's prefixes.
#[derive(Debug, Default)]
pub struct PrefixIndex {
    set: HashSet<Prefix>,
    sorted: BTreeSet<Prefix>,
    lengths: u64,
}

impl PrefixIndex {
    /// Adds `p`.
    pub fn insert(&mut self, p: Prefix) {
        self.set.insert(p);
        self.sorted.insert(p);
        self.lengths |= 1 << p.len;
    }

    /// The longest prefix containing `addr`.
    pub fn lpm(&self, addr: u32) -> Option<Prefix> {
        let mut lengths = self.lengths;
        while lengths != 0 {
            let len = 63 - lengths.leading_zeros() as u8;
            lengths &= !(1 << len);
            let p = Prefix::of(addr, len);
            if self.set.contains(&p) {
                return Some(p);
            }
        }
        None
    }

    /// The shortest prefix containing `addr` that holds no prefix of the index, when no prefix
    /// contains `addr` (a negative cache entry: every address in it has no match).
    pub fn widest_empty(&self, addr: u32) -> Option<Prefix> {
        if self.lpm(addr).is_some() {
            return None;
        }
        // No prefix contains `addr`, so a prefix of the index inside the range of
        // `Prefix::of(addr, len)` lies inside that prefix (a coarser one would contain `addr`).
        (0..=32).map(|len| Prefix::of(addr, len)).find(|q| {
            let last = Prefix {
                addr: q.last(),
                len: 32,
            };
            self.sorted.range(*q..=last).next().is_none()
        })
    }

    /// The prefixes strictly inside `p` (its dependents, HyperSFC §III-C).
    pub fn descendants(&self, p: Prefix) -> impl Iterator<Item = Prefix> + '_ {
        let last = Prefix {
            addr: p.last(),
            len: 32,
        };
        self.sorted
            .range(p..=last)
            .filter(move |q| q.len > p.len && p.covers(q))
            .copied()
    }

    /// Number of prefixes.
    pub fn len(&self) -> usize {
        self.set.len()
    }

    /// Whether the index is empty.
    pub fn is_empty(&self) -> bool {
        self.set.is_empty()
    }
}

/// What the fast path needs from the full tables at start: each LPM table's prefix index and
/// each branching table's Bloom filters, built as the rules are loaded.
#[derive(Debug)]
pub struct Loaded {
    /// Per table: its prefix index (LPM tables).
    pub prefixes: Vec<Option<Arc<PrefixIndex>>>,
    /// Per table: its 2D Bloom filters (tables with a `bloom` selector).
    pub blooms: Vec<Option<Bloom2d>>,
    /// Rules loaded per table.
    pub rules: Vec<usize>,
}

/// Why the slow path failed.
#[derive(Debug, thiserror::Error)]
pub enum SlowError {
    /// The store failed.
    #[error("full table {table:?}: {source}")]
    State {
        /// The table.
        table: String,
        /// The store's error.
        source: StateError,
    },
    /// The slow path's thread is gone.
    #[error("the slow path stopped")]
    Stopped,
    /// A rule does not fit its table.
    #[error("table {table:?}: {reason}")]
    Rule {
        /// The table.
        table: String,
        /// What is wrong.
        reason: String,
    },
}

/// Writes `rules` (per table, key and rule) into the store and builds the indexes and Bloom
/// filters. An LPM rule's key is the prefix's [`Prefix::key`]; host bits must be zero.
pub fn load(
    connector: &dyn Connector,
    pipeline: &Pipeline,
    rules: &[crate::config::TableRules],
) -> Result<Loaded, SlowError> {
    let mut tables = FullTables::open(connector, pipeline, Vec::new())?;
    let mut prefixes = Vec::new();
    let mut blooms = Vec::new();
    let mut counts = Vec::new();
    for (t, table) in pipeline.tables.iter().enumerate() {
        let err = |reason: String| SlowError::Rule {
            table: table.name.clone(),
            reason,
        };
        let mut index = (table.kind == Kind::Lpm).then(PrefixIndex::default);
        let mut bloom = match &table.bloom {
            Some(p) => Some(Bloom2d::new(*p, table.branches.len(), t as u64 + 1).map_err(&err)?),
            None => None,
        };
        let empty = Vec::new();
        let table_rules = rules.get(t).unwrap_or(&empty);
        for (key, rule) in table_rules {
            if !table.writes.contains(rule.written()) {
                return Err(err(format!(
                    "a rule writes a field outside the table's `writes`: {rule:?}"
                )));
            }
            if usize::from(rule.branch) >= table.branches.len().max(1) {
                return Err(err(format!(
                    "a rule's branch {} does not exist",
                    rule.branch
                )));
            }
            if let Some(index) = &mut index {
                let p = Prefix::from_key(*key);
                if p.len > 32 || p.addr & !mask(p.len) != 0 || key >> 40 != 0 {
                    return Err(err(format!("{p}: not a prefix (host bits set?)")));
                }
                index.insert(p);
            }
            if let Some(b) = &mut bloom {
                b.insert(*key, rule.branch);
            }
            tables.maps[t].insert_nowait(*key, *rule);
        }
        counts.push(table_rules.len());
        prefixes.push(index.map(Arc::new));
        blooms.push(bloom);
    }
    tables
        .partition
        .flush_all(0)
        .map_err(|source| SlowError::State {
            table: "*".into(),
            source,
        })?;
    Ok(Loaded {
        prefixes,
        blooms,
        rules: counts,
    })
}

/// What a full-table search found, and what to install in the fast path.
#[derive(Clone, Debug, PartialEq)]
pub struct Found {
    /// The entry's rule (`None`: no entry, the table's default applies).
    pub rule: Option<Rule>,
    /// Cache entries: the entry itself (exact) or the prefix with its dependents (LPM); for
    /// an absent key, a negative entry with the table's default: the key itself (exact) or
    /// the widest prefix around the address that holds no prefix of the table (LPM), so a
    /// flow whose key no table entry matches circulates once, not on every packet.
    pub install: Vec<(u128, Rule)>,
}

impl Found {
    /// A hit on the exact entry `key`.
    pub fn entry(key: u128, rule: Rule) -> Found {
        Found {
            rule: Some(rule),
            install: vec![(key, rule)],
        }
    }

    /// What the packet carries back.
    pub fn answer(&self) -> crate::fast::Answer {
        match self.rule {
            Some(r) => crate::fast::Answer::Hit(r),
            None => crate::fast::Answer::Absent,
        }
    }
}

/// One slow-path thread's handles on the full tables.
pub struct FullTables {
    pipeline: Arc<Pipeline>,
    partition: Partition,
    maps: Vec<Map<u128, Rule>>,
    prefixes: Vec<Option<Arc<PrefixIndex>>>,
    /// Store reads done.
    pub reads: u64,
}

impl FullTables {
    /// Opens the tables of `pipeline` in the store `connector` names, with the prefix indexes
    /// [`load`] built.
    pub fn open(
        connector: &dyn Connector,
        pipeline: &Pipeline,
        prefixes: Vec<Option<Arc<PrefixIndex>>>,
    ) -> Result<FullTables, SlowError> {
        let state_err = |source| SlowError::State {
            table: "*".into(),
            source,
        };
        let mut partition = Partition::new(connector, StateConfig::default()).map_err(state_err)?;
        let mut maps = Vec::new();
        {
            let mut nf = partition.declare(STATE_NF);
            for t in &pipeline.tables {
                maps.push(
                    nf.map::<u128, Rule>(&t.name, Scope::Shared, Access::ReadWrite)
                        .map_err(|source| SlowError::State {
                            table: t.name.clone(),
                            source,
                        })?,
                );
            }
        }
        Ok(FullTables {
            pipeline: Arc::new(pipeline.clone()),
            partition,
            maps,
            prefixes,
            reads: 0,
        })
    }

    fn get(&mut self, t: usize, key: u128) -> Result<Option<Rule>, SlowError> {
        self.reads += 1;
        self.maps[t].get(&key).map_err(|source| SlowError::State {
            table: self.pipeline.tables[t].name.clone(),
            source,
        })
    }

    /// The full table's rule for `key` in table `t`, without side effects (an LPM key is the
    /// address).
    pub fn rule(&mut self, t: usize, key: u128) -> Result<Option<Rule>, SlowError> {
        match self.pipeline.tables[t].kind {
            Kind::Exact => self.get(t, key),
            Kind::Lpm => match self.lpm(t, key as u32) {
                Some(p) => self.get(t, p.key()),
                None => Ok(None),
            },
        }
    }

    fn lpm(&self, t: usize, addr: u32) -> Option<Prefix> {
        self.prefixes
            .get(t)
            .and_then(|i| i.as_ref())
            .and_then(|i| i.lpm(addr))
    }

    /// A full-table search for the fast path (HyperSFC §III-A): the rule, and the entries to
    /// install. A balancing table admits an absent key as a new flow.
    pub fn search(&mut self, t: usize, key: u128) -> Result<Found, SlowError> {
        let pipeline = Arc::clone(&self.pipeline);
        let table = &pipeline.tables[t];
        match table.kind {
            Kind::Exact => match self.get(t, key)? {
                Some(r) => Ok(Found::entry(key, r)),
                None => match table.balance(key) {
                    Some(r) => {
                        self.maps[t]
                            .insert(key, r)
                            .map_err(|source| SlowError::State {
                                table: table.name.clone(),
                                source,
                            })?;
                        Ok(Found::entry(key, r))
                    }
                    None => Ok(Found {
                        rule: None,
                        install: vec![(key, table.default)],
                    }),
                },
            },
            Kind::Lpm => {
                let index = self.prefixes[t].clone().expect("an lpm table has an index");
                let addr = key as u32;
                let absent = |index: &PrefixIndex| Found {
                    rule: None,
                    install: index
                        .widest_empty(addr)
                        .map(|q| (q.key(), table.default))
                        .into_iter()
                        .collect(),
                };
                let Some(p) = index.lpm(addr) else {
                    return Ok(absent(&index));
                };
                let Some(rule) = self.get(t, p.key())? else {
                    return Ok(Found {
                        rule: None,
                        install: Vec::new(),
                    });
                };
                let mut install = vec![(p.key(), rule)];
                for d in index.descendants(p) {
                    if let Some(r) = self.get(t, d.key())? {
                        install.push((d.key(), r));
                    }
                }
                Ok(Found {
                    rule: Some(rule),
                    install,
                })
            }
        }
    }

    /// The whole pipeline run on the full tables: the verdict every fast-path mode must give
    /// (the oracle of the differential tests, and the software NF of the benchmarks). A
    /// balancing table's new flow gets the rule [`search`](Self::search) would create,
    /// without creating it.
    pub fn reference(&mut self, mut h: Headers) -> Result<Outcome, SlowError> {
        let pipeline = Arc::clone(&self.pipeline);
        let mut t = 0;
        while let Some(table) = pipeline.tables.get(t) {
            let key = table.key_of(&h);
            let rule = match self.rule(t, key)? {
                Some(r) => r,
                None => table.balance(key).unwrap_or(table.default),
            };
            rule.apply(&mut h);
            if rule.drop {
                return Ok(Outcome {
                    headers: h,
                    dropped: true,
                });
            }
            t = pipeline.next(t, &rule);
        }
        Ok(Outcome {
            headers: h,
            dropped: false,
        })
    }
}

/// A packet's verdict: its headers after the pipeline, or a drop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Outcome {
    /// The headers as the last table left them (the egress port among them).
    pub headers: Headers,
    /// Whether a table dropped it.
    pub dropped: bool,
}
