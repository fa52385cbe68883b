//! NF tables as an operator reads them (`flowstate state list`, `/api/v1/tables`): the NAT's
//! sessions and mappings, the firewall's connections, the LB's flows and backends, like
//! `conntrack -L` or VPP's `show nat44 sessions`.
//!
//! An NF names its tables ([`NfFactory::tables`](crate::NfFactory::tables)) and turns each
//! entry into a [`Row`] of typed [`Cell`]s in one function per table, used by both sources:
//! * a running instance lists what its worker holds, with the time each entry has left
//!   ([`NetworkFunction::list`](crate::NetworkFunction::list));
//! * a store is read through a [`StoreReader`] and decoded with the NF's own codecs
//!   ([`NfFactory::stored_rows`](crate::NfFactory::stored_rows)); stores do not hand out
//!   field deadlines, so those rows have no timeout.
//!
//! Rows of several workers (or store partitions) are concatenated, except in a table whose
//! [`TableInfo::summed`] is set (per-backend counters), where rows with equal text cells are
//! merged by adding their numbers ([`merge_summed`]).

use flowstate_state::{Backend, Codec, Kind, Object, ObjectKey, Op, Reply, StateError};
use flowstate_wire::flow::proto;
use serde::ser::{Serialize, Serializer};
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

/// A table an NF can list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TableInfo {
    /// Its name (`sessions`, `connections`, ...).
    pub name: &'static str,
    /// What one row is.
    pub about: &'static str,
    /// Column names, in the order of each row's cells.
    pub columns: &'static [&'static str],
    /// Whether rows of several workers or partitions are summed (rows with equal non-number
    /// cells become one) rather than concatenated.
    pub summed: bool,
}

/// One cell of a row.
#[derive(Debug, Clone, PartialEq)]
pub enum Cell {
    /// An IP protocol (`tcp`, `udp`, `icmp`, else its number).
    Proto(u8),
    /// An address and port (ICMP echo: identifier).
    Endpoint(SocketAddr),
    /// An address and the ports from its port to the second (inclusive).
    Ports(SocketAddr, u16),
    /// An address.
    Addr(IpAddr),
    /// A count.
    Int(i64),
    /// Time left before the entry expires.
    Timeout(Duration),
    /// A name (a TCP state, a flag).
    Text(&'static str),
    /// Nothing known (a store does not say how long an entry has left).
    None,
}

impl Cell {
    /// An endpoint cell.
    pub fn endpoint(addr: impl Into<IpAddr>, port: u16) -> Cell {
        Cell::Endpoint(SocketAddr::new(addr.into(), port))
    }

    /// A timeout cell: the time from `now` to `deadline` (ns; `None`: unknown).
    pub fn timeout(deadline: Option<u64>, now: u64) -> Cell {
        match deadline {
            Some(d) => Cell::Timeout(Duration::from_nanos(d.saturating_sub(now))),
            None => Cell::None,
        }
    }
}

/// A protocol's name as conntrack prints it.
pub fn proto_name(p: u8) -> Option<&'static str> {
    match p {
        proto::TCP => Some("tcp"),
        proto::UDP => Some("udp"),
        proto::ICMP => Some("icmp"),
        proto::ICMPV6 => Some("icmpv6"),
        _ => None,
    }
}

/// Cells serialize as plain JSON values: protocols, endpoints, addresses and names as strings,
/// counts as numbers, timeouts as seconds (a number), unknown as `null`.
impl Serialize for Cell {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Cell::Proto(p) => match proto_name(*p) {
                Some(n) => s.serialize_str(n),
                None => s.serialize_u8(*p),
            },
            Cell::Endpoint(e) => s.collect_str(e),
            Cell::Ports(e, hi) if *hi == e.port() => s.collect_str(e),
            Cell::Ports(e, hi) => s.collect_str(&format_args!("{e}-{hi}")),
            Cell::Addr(a) => s.collect_str(a),
            Cell::Int(n) => s.serialize_i64(*n),
            Cell::Timeout(d) => s.serialize_f64((d.as_secs_f64() * 1e3).round() / 1e3),
            Cell::Text(t) => s.serialize_str(t),
            Cell::None => s.serialize_none(),
        }
    }
}

/// One entry of a table, its cells in the order of [`TableInfo::columns`].
pub type Row = Vec<Cell>;

/// Merges rows whose non-number cells are equal by adding their [`Cell::Int`]s (for a
/// [`TableInfo::summed`] table), keeping the first occurrence's order.
pub fn merge_summed(rows: Vec<Row>) -> Vec<Row> {
    let mut out: Vec<Row> = Vec::with_capacity(rows.len());
    'rows: for row in rows {
        for seen in &mut out {
            let same = seen.len() == row.len()
                && seen
                    .iter()
                    .zip(&row)
                    .all(|(a, b)| matches!((a, b), (Cell::Int(_), Cell::Int(_))) || a == b);
            if same {
                for (a, b) in seen.iter_mut().zip(&row) {
                    if let (Cell::Int(a), Cell::Int(b)) = (a, b) {
                        *a += b;
                    }
                }
                continue 'rows;
            }
        }
        out.push(row);
    }
    out
}

/// Reads one NF's objects from a store, every partition of each (what `flowstate state list`
/// does when pointed at a store instead of a running box).
pub struct StoreReader<'a> {
    backend: &'a mut dyn Backend,
    nf: &'a str,
    instance: Option<u32>,
}

impl std::fmt::Debug for StoreReader<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreReader").field("nf", &self.nf).finish()
    }
}

impl<'a> StoreReader<'a> {
    /// A reader of NF `nf`'s objects in `backend`, of every instance.
    pub fn new(backend: &'a mut dyn Backend, nf: &'a str) -> Self {
        StoreReader {
            backend,
            nf,
            instance: None,
        }
    }

    /// Reads only the partitions of NF instance `instance` (`[state] nf_instance`; shared
    /// objects are every instance's).
    pub fn instance(mut self, instance: u32) -> Self {
        self.instance = Some(instance);
        self
    }

    /// Every partition of object `id` (of `kind`), as the store holds it.
    fn objects(&mut self, kind: Kind, id: &str) -> Result<Vec<Object>, StateError> {
        let mut keys = self.backend.partitions(self.nf, kind, id)?;
        if let Some(i) = self.instance {
            keys.retain(|k| {
                k.parse()
                    .is_some_and(|p| p.partition.is_none_or(|(instance, _)| instance == i))
            });
        }
        let ops: Vec<Op> = keys
            .iter()
            .map(|key: &ObjectKey| Op::ReadAll {
                key: key.clone(),
                kind,
            })
            .collect();
        let mut replies = Vec::with_capacity(ops.len());
        self.backend.execute(&ops, &mut replies)?;
        let mut out = Vec::with_capacity(replies.len());
        for r in replies {
            match r {
                Reply::Object(Some(o)) => out.push(o),
                Reply::Object(None) => {}
                Reply::Error(e) => return Err(e.into()),
                _ => return Err(StateError::Unexpected("ReadAll answered without an object")),
            }
        }
        Ok(out)
    }

    /// Every field of map `id`, over all partitions, decoded.
    pub fn map<K: Codec, V: Codec>(&mut self, id: &str) -> Result<Vec<(K, V)>, StateError> {
        let mut out = Vec::new();
        for o in self.objects(Kind::Map, id)? {
            if let Object::Map(fields) = o {
                for (k, v) in fields {
                    out.push((K::from_bytes(&k)?, V::from_bytes(&v)?));
                }
            }
        }
        Ok(out)
    }

    /// Every field of counter map `id`, over all partitions, decoded (one entry per
    /// partition: merge them with [`merge_summed`]).
    pub fn counter_map<K: Codec>(&mut self, id: &str) -> Result<Vec<(K, i64)>, StateError> {
        let mut out = Vec::new();
        for o in self.objects(Kind::CounterMap, id)? {
            if let Object::CounterMap(fields) = o {
                for (k, n) in fields {
                    out.push((K::from_bytes(&k)?, n));
                }
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    #[test]
    fn summed_rows_add_their_numbers_per_key() {
        let a = Cell::endpoint(Ipv4Addr::new(10, 0, 0, 1), 80);
        let b = Cell::endpoint(Ipv4Addr::new(10, 0, 0, 2), 80);
        let rows = vec![
            vec![a.clone(), Cell::Int(1), Cell::Int(10)],
            vec![b.clone(), Cell::Int(2), Cell::Int(20)],
            vec![a.clone(), Cell::Int(3), Cell::Int(30)],
        ];
        assert_eq!(
            merge_summed(rows),
            vec![
                vec![a, Cell::Int(4), Cell::Int(40)],
                vec![b, Cell::Int(2), Cell::Int(20)]
            ]
        );
    }

    #[test]
    fn cells_are_plain_json() {
        let row = vec![
            Cell::Proto(6),
            Cell::Proto(47),
            Cell::endpoint(Ipv4Addr::new(10, 0, 0, 1), 80),
            Cell::Int(-1),
            Cell::Timeout(Duration::from_millis(1500)),
            Cell::Text("established"),
            Cell::None,
        ];
        assert_eq!(
            serde_json::to_string(&row).unwrap(),
            r#"["tcp",47,"10.0.0.1:80",-1,1.5,"established",null]"#
        );
        assert_eq!(Cell::timeout(Some(5), 7), Cell::Timeout(Duration::ZERO));
        assert_eq!(Cell::timeout(None, 7), Cell::None);
    }
}
