//! The pipeline: NF tables in order, each with a key, a fast-path cache capacity, what an
//! absent key does, and optionally branches (HyperSFC §IV-A: "the selection of the next table
//! depends on the search result of the current table").

use crate::bloom::BloomParams;
use crate::headers::{Field, Fields, Headers, Rule};

/// Most tables in a pipeline (the packet's miss stack is sized by it).
pub const MAX_TABLES: usize = 16;

/// How a table matches.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Kind {
    /// All key fields equal.
    Exact,
    /// Longest prefix of one 32-bit field (an IPv4 address).
    Lpm,
}

/// Where a branch goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// This table, by index.
    Table(usize),
    /// The end of the pipeline.
    End,
}

/// What the slow path does for a key its full table lacks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OnMiss {
    /// The table's `default` rule applies; nothing is installed.
    Default,
    /// A load balancer's new flow: the slow path picks a backend by a hash of the key, adds
    /// the entry (rewrite the destination to it) to the full table and installs it, as an L4
    /// load balancer's connection table does on a flow's first packet.
    Balance {
        /// Backends: IPv4 address and port.
        backends: Vec<(u32, u16)>,
    },
}

/// One NF table.
#[derive(Clone, Debug)]
pub struct Table {
    /// Name, unique in the pipeline.
    pub name: String,
    /// Exact or LPM.
    pub kind: Kind,
    /// Key fields (one 32-bit field for LPM).
    pub key: Vec<Field>,
    /// Entries the fast path caches (0: none, every lookup goes to the slow path).
    pub cache: usize,
    /// The rule for a key the full table lacks (HyperSFC: "the default action will be
    /// executed (e.g., packet drop)").
    pub default: Rule,
    /// Where each rule's `branch` leads; empty: to the next table in order.
    pub branches: Vec<Next>,
    /// 2D Bloom filters selecting the branch in the fast path (exact tables with branches).
    pub bloom: Option<BloomParams>,
    /// What the slow path does for an absent key.
    pub on_miss: OnMiss,
    /// Fields any of the table's rules may write (declared: the lazy-submit dependency check
    /// reads it; the slow path refuses rules writing others).
    pub writes: Fields,
}

impl Table {
    /// A table with no default action, no branches and no Bloom selector, whose rules may
    /// write `writes`.
    pub fn new(name: &str, kind: Kind, key: &[Field], writes: &[Field], cache: usize) -> Table {
        Table {
            name: name.into(),
            kind,
            key: key.to_vec(),
            cache,
            default: Rule::default(),
            branches: Vec::new(),
            bloom: None,
            on_miss: OnMiss::Default,
            writes: writes.iter().fold(Fields::default(), |s, f| s.with(*f)),
        }
    }

    /// The fields the key reads.
    pub fn reads(&self) -> Fields {
        self.key.iter().fold(Fields::default(), |s, f| s.with(*f))
    }

    /// The key of `h` in this table: the key fields packed, first field highest (for LPM, the
    /// address).
    #[inline]
    pub fn key_of(&self, h: &Headers) -> u128 {
        let mut k = 0u128;
        for f in &self.key {
            k = k << f.bits() | u128::from(f.get(h));
        }
        k
    }

    /// The rule a balancing table gives a new flow with `key`.
    pub fn balance(&self, key: u128) -> Option<Rule> {
        match &self.on_miss {
            OnMiss::Balance { backends } if !backends.is_empty() => {
                let i = flowstate_wire::hash::mix(key, 0x4c42) as usize % backends.len();
                let (ip, port) = backends[i];
                Some(Rule {
                    writes: [
                        Some((Field::DstIp, ip)),
                        Some((Field::DstPort, u32::from(port))),
                    ],
                    drop: false,
                    branch: 0,
                })
            }
            _ => None,
        }
    }
}

/// The tables, in pipeline order.
#[derive(Clone, Debug, Default)]
pub struct Pipeline {
    /// The tables.
    pub tables: Vec<Table>,
}

/// Why a pipeline cannot run.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("table {table:?}: {reason}")]
pub struct PipelineError {
    /// The table (its name).
    pub table: String,
    /// What is wrong.
    pub reason: String,
}

impl Pipeline {
    /// Checks that the pipeline can run and every branch goes forward.
    pub fn check(&self) -> Result<(), PipelineError> {
        let err = |t: &Table, reason: String| PipelineError {
            table: t.name.clone(),
            reason,
        };
        if self.tables.len() > MAX_TABLES {
            return Err(PipelineError {
                table: self.tables[MAX_TABLES].name.clone(),
                reason: format!("at most {MAX_TABLES} tables"),
            });
        }
        for (i, t) in self.tables.iter().enumerate() {
            if self.tables[..i].iter().any(|o| o.name == t.name) {
                return Err(err(t, "a second table of this name".into()));
            }
            if t.key.is_empty() {
                return Err(err(t, "the key names no field".into()));
            }
            let bits: u32 = t.key.iter().map(|f| f.bits()).sum();
            if bits > 128 {
                return Err(err(t, format!("the key is {bits} bits; at most 128")));
            }
            if t.kind == Kind::Lpm && (t.key.len() != 1 || t.key[0].bits() != 32) {
                return Err(err(
                    t,
                    "an lpm table's key is one 32-bit field (src_ip, dst_ip or mark)".into(),
                ));
            }
            for b in &t.branches {
                if let Next::Table(j) = b {
                    if *j <= i || *j >= self.tables.len() {
                        return Err(err(t, format!("branch to table #{j}: branches go forward")));
                    }
                }
            }
            if t.branches.len() > 256 {
                return Err(err(t, "at most 256 branches".into()));
            }
            if let Some(p) = &t.bloom {
                if t.branches.is_empty() {
                    return Err(err(t, "a bloom selector needs branches".into()));
                }
                if t.kind != Kind::Exact {
                    return Err(err(t, "a bloom selector needs an exact table".into()));
                }
                p.check(t.branches.len())
                    .map_err(|r| err(t, format!("bloom: {r}")))?;
            }
            if usize::from(t.default.branch) >= t.branches.len().max(1) {
                return Err(err(t, "the default rule's branch does not exist".into()));
            }
            if !t.writes.contains(t.default.written()) {
                return Err(err(
                    t,
                    "the default rule writes a field outside `writes`".into(),
                ));
            }
            if let OnMiss::Balance { backends } = &t.on_miss {
                if backends.is_empty() {
                    return Err(err(t, "a balancing table needs backends".into()));
                }
                if !t
                    .writes
                    .contains(Fields::default().with(Field::DstIp).with(Field::DstPort))
                {
                    return Err(err(
                        t,
                        "a balancing table writes dst_ip and dst_port".into(),
                    ));
                }
            }
        }
        Ok(())
    }

    /// The table after `t` when its rule is `r`: [`MAX_TABLES`] or more means the end.
    #[inline]
    pub fn next(&self, t: usize, r: &Rule) -> usize {
        let table = &self.tables[t];
        if table.branches.is_empty() {
            return t + 1;
        }
        match table.branches.get(usize::from(r.branch)) {
            Some(Next::Table(j)) => *j,
            Some(Next::End) | None => usize::MAX,
        }
    }
}
