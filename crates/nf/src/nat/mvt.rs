//! The NAT on a Match-Value Table (HashMVT §III-D): one table per worker holds both the
//! translations and the pool of external `(address, port)` resources.
//!
//! ```toml
//! [[chain]]
//! nf = "nat"
//! table = "mvt"            # "state" (default): the NAT of `nat.rs` on the state API
//! external = ["203.0.113.1"]
//! ports = "1024-65535"     # every other key as for the default NAT
//! ```
//!
//! # Behaviour
//!
//! Exactly the default NAT's ([`super`]), as the translation steps are the same code
//! ([`super::translate`]): the same translations, endpoint-independent mappings, paired address
//! pooling, filtering, hairpinning, checksum updates, ICMP error translation, timeouts, drop
//! reasons, counters and report, and the same order in which ports are handed
//! out and come back, so the two NATs turn the same input into the same output packets
//! (tested side by side). Only where the state lives differs.
//!
//! # The table (§III-D)
//!
//! Keys are raw ([`flowstate_mvt::Field::Raw`]): a tag byte, then the fields of the tag.
//!
//! | entry | M(e) | value | aux |
//! |---|---|---|---|
//! | free resource | `POOL·address` (a `*` within the external address) | `(address, port)` | 0 |
//! | allocated resource (an EIM mapping) | `EIM·inside address·port·protocol` | `(address, port)` | sessions using it |
//! | session | `OUT·inside 5-tuple` | external endpoint, TCP state, its resource and reverse entry | armed timer |
//! | reverse entry | `IN·reply 5-tuple` | inside endpoint, its session | 0 |
//! | way back of a resource | `EXT·external address·port·protocol` | inside endpoint | 0 |
//! | peer count | `PEER·inside address·port·protocol·remote address` | — | sessions with the remote |
//!
//! At start the table is a pure pool: one entry per external `(address, port)` this worker
//! owns (ports split among workers by [`super::port_owner`], so the instance's table is
//! *sharded* across workers and no pool is shared). Allocation takes the first free entry of
//! the paired address and changes its matching field to the inside endpoint ("set"), and a
//! session creates its reverse entry with the same timestamp and timeout. Packets renew the
//! session ("renew"); its reverse entry takes the session's time when the session's timer
//! fires and finds it renewed (lazily, as the default NAT renews its reverse entries). When a
//! session's time comes it is timed out ("timeout") and removed with its reverse entry; when a resource's last session goes, its matching field returns to the pool
//! match, at the end of the pool. Timers fire in deadline order (ties by 5-tuple), as the state
//! API's do, so ports come back in the same order as in the default NAT.
//!
//! The table is this worker's partition, not state-API state (see `flowstate_mvt`'s crate docs
//! for how the two relate): it is not flushed to a store, so a restarted worker starts with an
//! empty table. Counters still go through the state API (same ids as the default NAT).

use super::pool::{Reforward, Share};
use super::translate::{Ended, Found, NatTable, Timeouts, Translator};
use super::{
    config_error, expendable, in_key, mapping_row, out_key, session_row, step_in, tcp_step, Config,
    Endpoint, Filtering, Forwards, InSession, Mapping, OutSession, MALFORMED, NF, POOL_EXHAUSTED,
    STATE_ERROR,
};
use crate::listing::{Cell, Row, TableInfo};
use crate::{BuildError, Direction, NetworkFunction, NfFactory, Placement};
use flowstate_mvt::{
    Entry, EntryHint, EntryId, FindHint, Hasher, Key, Match, Mvt, KEY_BITS, NEVER,
};
use flowstate_state::{Declare, Nanos};
use flowstate_wire::{tcp, FlowKey};
use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};
use std::fmt;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::Duration;

/// Which NAT a `[[chain]] nf = "nat"` table asks for (`table = "state"`, the default, or
/// `"mvt"`), built from the rest of the table.
pub fn select_factory(table: &toml::Table) -> Result<Arc<dyn NfFactory>, BuildError> {
    let mut rest = table.clone();
    match rest.remove("table") {
        None => super::factory(table),
        Some(toml::Value::String(s)) if s == "state" => super::factory(&rest),
        Some(toml::Value::String(s)) if s == "mvt" => factory(&rest),
        Some(v) => Err(config_error(
            "table",
            format!("expected \"state\" or \"mvt\", got {v}"),
        )),
    }
}

/// The factory of the MVT NAT for a `[[chain]]` table (without `table`).
pub fn factory(table: &toml::Table) -> Result<Arc<dyn NfFactory>, BuildError> {
    Ok(Arc::new(Factory(super::Factory::new(Config::from_table(
        table,
    )?))))
}

/// Builds MVT NATs (the default NAT's factory, another table).
#[derive(Debug)]
pub struct Factory(pub super::Factory);

impl NfFactory for Factory {
    fn name(&self) -> &'static str {
        NF
    }

    fn build(
        &self,
        state: &mut Declare<'_>,
        worker: Placement,
    ) -> Result<Box<dyn NetworkFunction>, BuildError> {
        let config = &self.0.config;
        let events = self.0.worker_events()?;
        Ok(Box::new(Translator::build(
            config,
            state,
            worker,
            events,
            |_| MvtTable::new(config, worker),
        )?))
    }

    fn partition(
        &self,
        flow: &flowstate_wire::FlowKey,
        quoted: Option<&flowstate_wire::FlowKey>,
        direction: Direction,
        partitions: u32,
    ) -> Option<u32> {
        self.0.config.partition(flow, quoted, direction, partitions)
    }

    fn reloadable(&self) -> &'static [&'static str] {
        self.0.reloadable()
    }

    fn reload_config(
        &self,
        running: Option<&crate::ReloadConfig>,
    ) -> Result<Option<crate::ReloadConfig>, String> {
        self.0.reload_config(running)
    }

    fn steering(&self, config: &crate::ReloadConfig) -> Option<Arc<dyn NfFactory>> {
        self.0.steering(config)
    }

    /// Its Match-Value Table lives in the worker, not in the store (see the module docs).
    fn private_state(&self) -> Option<(&'static str, &'static str)> {
        Some((
            "table",
            "the Match-Value Table is worker-private (not in the store): a partition that moves to another instance would lose its mappings; use table = \"state\" in a cluster",
        ))
    }

    /// The default NAT's tables; the MVT is worker-private, so only a running box lists them.
    fn tables(&self) -> &'static [TableInfo] {
        super::TABLES
    }
}

// Tags: the first byte of every key.
const POOL: u8 = 1;
const EIM: u8 = 2;
const OUT: u8 = 3;
const IN: u8 = 4;
const EXT: u8 = 5;
const PEER: u8 = 6;

/// The value field of the NAT's entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NatValue {
    /// An external `(address, port)`: free in the pool, or allocated to an inside endpoint.
    Resource {
        /// External address.
        ext_ip: Ipv4Addr,
        /// External port (ICMP: identifier).
        ext_port: u16,
        /// Whether it is a port forwarding's: made for its first session and removed after
        /// its last, never in the pool.
        forwarded: bool,
    },
    /// A session, keyed by the inside 5-tuple.
    Out {
        /// External address.
        ext_ip: Ipv4Addr,
        /// External port.
        ext_port: u16,
        /// TCP state bits (see the default NAT).
        tcp: u8,
        /// Its resource entry.
        res: EntryId,
        /// Its reverse entry.
        rev: EntryId,
    },
    /// The reverse entry of a session, keyed by the reply 5-tuple.
    In {
        /// Inside address.
        inside_ip: Ipv4Addr,
        /// Inside port.
        inside_port: u16,
        /// Its session entry.
        out: EntryId,
    },
    /// An allocated resource's way back, keyed by the external endpoint and protocol (not
    /// kept under address- and port-dependent filtering).
    Ext {
        /// Inside address.
        inside_ip: Ipv4Addr,
        /// Inside port.
        inside_port: u16,
    },
    /// An inside endpoint's sessions with one remote address (`aux`), keyed by both (kept
    /// under address-dependent filtering only).
    Peer,
}

/// The pool of `ext`'s ports kept in list `list` (0, or 1 for odd ports with `port_parity`).
fn pool_match(ext: Ipv4Addr, list: u8) -> Match {
    let o = ext.octets();
    Match::exact(&Key::from_bytes(&[POOL, o[0], o[1], o[2], o[3], list]))
}

fn eim_match(inside: Ipv4Addr, port: u16, proto: u8) -> Match {
    let o = inside.octets();
    let p = port.to_be_bytes();
    Match::exact(&Key::from_bytes(&[
        EIM, o[0], o[1], o[2], o[3], p[0], p[1], proto,
    ]))
}

fn ext_match((ip, port, proto): Endpoint) -> Match {
    let o = ip.octets();
    let p = port.to_be_bytes();
    Match::exact(&Key::from_bytes(&[
        EXT, o[0], o[1], o[2], o[3], p[0], p[1], proto,
    ]))
}

fn peer_match(out: &FlowKey) -> Option<Match> {
    let (IpAddr::V4(i), IpAddr::V4(r)) = (out.src, out.dst) else {
        return None;
    };
    let (i, r, p) = (i.octets(), r.octets(), out.src_port.to_be_bytes());
    Some(Match::exact(&Key::from_bytes(&[
        PEER, i[0], i[1], i[2], i[3], p[0], p[1], out.proto, r[0], r[1], r[2], r[3],
    ])))
}

fn flow_match(tag: u8, f: &FlowKey) -> Match {
    Match::exact(&Key::tagged_flow(tag, f))
}

/// One worker's NAT on an MVT.
pub type MvtNat = Translator<MvtTable>;

impl MvtNat {
    /// Builds `worker`'s NAT: declares its counters and fills its table with the worker's
    /// share of the pool.
    pub fn new(
        config: &Config,
        state: &mut Declare<'_>,
        worker: Placement,
    ) -> Result<MvtNat, BuildError> {
        Translator::build(config, state, worker, None, |_| {
            MvtTable::new(config, worker)
        })
    }

    /// The table (this worker's partition).
    pub fn table(&self) -> &Mvt<NatValue> {
        &self.table.table
    }
}

/// One worker's NAT table: a Match-Value Table and the timers of its sessions.
pub struct MvtTable {
    filtering: Filtering,
    /// What the pool may hold.
    share: Share,
    external: Vec<Ipv4Addr>,
    table: Mvt<NatValue>,
    /// Session timers: (deadline, inside 5-tuple, session entry), earliest first.
    timers: BinaryHeap<Reverse<(Nanos, FlowKey, EntryId)>>,
    sessions: usize,
    mappings: usize,
    free: usize,
    /// The prefetch pipeline over a batch: rows hinted, then entries prefetched, by turn.
    hints: [Option<FindHint>; PIPE],
    prefetched: [Option<EntryHint>; PIPE],
    turn: usize,
}

/// Depth of the prefetch pipeline, and how many prefetches later a step follows the last:
/// a row hinted at packet `j` is read at `j + LAG` (to prefetch its first entry) and that
/// entry at `j + 2·LAG` (to prefetch the session of a reverse entry), so the batch's misses
/// overlap instead of following one another.
const PIPE: usize = 32;
const LAG: usize = 16;

impl fmt::Debug for MvtTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MvtTable")
            .field("external", &self.external)
            .field("sessions", &self.sessions)
            .finish()
    }
}

impl MvtTable {
    /// A table holding `worker`'s share of the pool.
    fn new(config: &Config, worker: Placement) -> Result<MvtTable, BuildError> {
        let share = config.ports.len().div_ceil(worker.partitions) as usize * config.external.len();
        // The pool, and per session its entry and reverse entry: room for one session per
        // resource before the table grows.
        let mut table = Mvt::with_options(KEY_BITS, share * 3, 0, Hasher::Hardware);
        let pool = Share::new(config, worker);
        for (a, p) in pool.endpoints() {
            table
                .insert(Self::free_entry(&pool, a, p))
                .map_err(|e| config_error("ports", e.to_string()))?;
        }
        Ok(MvtTable {
            filtering: config.filtering,
            share: pool,
            external: config.external.clone(),
            free: table.len(),
            table,
            timers: BinaryHeap::with_capacity(share),
            sessions: 0,
            mappings: 0,
            hints: [None; PIPE],
            prefetched: [None; PIPE],
            turn: 0,
        })
    }

    /// The reverse entry inbound `flow` answers: the inside endpoint and its session.
    fn answered(&self, flow: &FlowKey) -> Result<Option<(Ipv4Addr, u16, EntryId)>, u8> {
        let Some(rid) = self.table.find(&flow_match(IN, flow)) else {
            return Ok(None);
        };
        match self.table.get(rid).copied() {
            Some(NatValue::In {
                inside_ip,
                inside_port,
                out,
            }) => Ok(Some((inside_ip, inside_port, out))),
            _ => Err(STATE_ERROR),
        }
    }

    /// "renew" of a session with one timeout; arms the session's timer (one timer node per
    /// session, re-armed lazily, like the state API's TTLs). The reverse entry gets the same
    /// timestamp and timeout when the session is made (`both`) and, after that, when the
    /// session's timer fires and finds it renewed: as the default NAT does, so that a packet
    /// costs one entry, not two (nothing reads the reverse entry's time in between).
    fn renew(&mut self, out: EntryId, key: &FlowKey, ttl: Duration, now: Nanos, both: bool) {
        let ttl = ttl.as_nanos().min(u128::from(u64::MAX)) as u64;
        let deadline = now.saturating_add(ttl).max(1);
        if both {
            if let Some(NatValue::Out { rev, .. }) = self.table.get(out).copied() {
                let _ = self.table.renew(rev, now, deadline - now);
            }
        }
        let _ = self.table.renew(out, now, deadline - now);
        if let Some(e) = self.table.entry_mut(out) {
            if e.aux == 0 || deadline < e.aux {
                e.aux = deadline;
                self.timers.push(Reverse((deadline, *key, out)));
            }
        }
    }

    /// [`MvtTable::renew`] of session `out` from `until`, unless it runs out later already.
    fn extend(&mut self, out: EntryId, key: &FlowKey, ttl: Duration, until: Nanos) {
        let ttl_ns = ttl.as_nanos().min(u128::from(u64::MAX)) as u64;
        let later = self
            .table
            .entry(out)
            .is_some_and(|e| until.saturating_add(ttl_ns).max(1) > e.deadline());
        if later {
            self.renew(out, key, ttl, until, false);
        }
    }

    /// One turn of the prefetch pipeline: the row hinted `LAG` turns ago has arrived, so its
    /// first entry is prefetched; the entry prefetched `LAG` turns ago has arrived, so its
    /// partner is. `hint` (a new row) enters; the finds of a batch turn it on with none, so
    /// that the batch's last packets get their steps too.
    #[inline]
    fn advance(&mut self, hint: Option<FindHint>) {
        let (now, back) = (self.turn % PIPE, (self.turn + PIPE - LAG) % PIPE);
        self.turn = self.turn.wrapping_add(1);
        let earlier = self.hints[back].and_then(|h| self.table.prefetch_entry(h));
        self.hints[back] = None;
        self.hints[now] = hint;
        // Only a reverse entry leads on (to its session); a session's packet touches nothing
        // else.
        let partner = match self.prefetched[back].and_then(|h| self.table.hinted_entry(h)) {
            Some(Entry {
                value: NatValue::In { out, .. },
                ..
            }) => Some(*out),
            _ => None,
        };
        self.prefetched[back] = None;
        if let Some(p) = partner {
            self.table.prefetch_id(p);
        }
        self.prefetched[now] = earlier;
    }

    fn lookup(&self, tag: u8, key: &FlowKey) -> Option<NatValue> {
        let id = self.table.find(&flow_match(tag, key))?;
        self.table.get(id).copied()
    }

    /// Counts one more (`up`) or one less session of the peer entry `m`, created at one and
    /// removed at zero.
    fn count_peer(&mut self, m: Match, up: bool) -> Result<(), u8> {
        match self.table.find(&m) {
            Some(id) => {
                let Some(e) = self.table.entry_mut(id) else {
                    return Err(STATE_ERROR);
                };
                e.aux = if up {
                    e.aux.saturating_add(1)
                } else {
                    e.aux.saturating_sub(1)
                };
                if e.aux == 0 {
                    self.table.remove(id);
                }
            }
            None if up => {
                self.table
                    .insert(Entry::new(m, NatValue::Peer, 0, NEVER, 1))
                    .map_err(|_| STATE_ERROR)?;
            }
            None => {}
        }
        Ok(())
    }

    /// Ends a session: "timeout", removal of it and its reverse entry, and the return of its
    /// resource to the end of the pool when it was the resource's last session. The session's
    /// external endpoint and whether its mapping ended.
    fn release(&mut self, id: EntryId, key: &FlowKey) -> Option<Ended> {
        self.table.invalidate(id);
        let e = self.table.remove(id)?;
        let NatValue::Out {
            res,
            rev,
            ext_ip,
            ext_port,
            ..
        } = e.value
        else {
            return None;
        };
        self.table.remove(rev);
        self.sessions -= 1;
        if self.filtering == Filtering::AddressDependent {
            if let Some(m) = peer_match(key) {
                let _ = self.count_peer(m, false);
            }
        }
        let back = match self.table.entry_mut(res) {
            Some(Entry {
                value:
                    NatValue::Resource {
                        ext_ip,
                        ext_port,
                        forwarded,
                    },
                aux,
                ..
            }) => {
                *aux = aux.saturating_sub(1);
                (*aux == 0).then_some((*ext_ip, *ext_port, *forwarded))
            }
            _ => None,
        };
        let ended = back.is_some();
        if let Some((ip, port, forwarded)) = back {
            if !forwarded && self.filtering != Filtering::AddressAndPortDependent {
                if let Some(x) = self.table.find(&ext_match((ip, port, key.proto))) {
                    self.table.remove(x);
                }
            }
            if !self.share.holds(ip, port) {
                self.table.remove(res);
                self.mappings -= 1;
            } else if self.table.rematch(res, self.pool_of(ip, port)).is_ok() {
                self.mappings -= 1;
                self.free += 1;
            }
        }
        Some(Ended {
            ext: (ext_ip, ext_port),
            mapping: ended,
        })
    }
    /// The pool entry of free external `(a, p)`.
    fn free_entry(share: &Share, a: Ipv4Addr, p: u16) -> Entry<NatValue> {
        let v = NatValue::Resource {
            ext_ip: a,
            ext_port: p,
            forwarded: false,
        };
        Entry::new(pool_match(a, share.list_of(p) as u8), v, 0, NEVER, 0)
    }

    /// Takes the pool entries of the ports `r` reserves out of the table, and puts in those
    /// of the ports it frees that no resource holds (one pass over the table).
    fn repool(&mut self, r: &Reforward) {
        let mut taken = Vec::new();
        let mut held = BTreeSet::new();
        for (id, e) in self.table.iter() {
            let NatValue::Resource {
                ext_ip, ext_port, ..
            } = e.value
            else {
                continue;
            };
            let free = e.matching().bytes().first() == Some(&POOL);
            if free && r.reserved.contains(&(ext_ip, ext_port)) {
                taken.push(id);
            } else if !free {
                held.insert((ext_ip, ext_port));
            }
        }
        for id in taken {
            if self.table.remove(id).is_some() {
                self.free -= 1;
            }
        }
        for &(a, p) in r.freed.difference(&held) {
            if self
                .table
                .insert(Self::free_entry(&self.share, a, p))
                .is_ok()
            {
                self.free += 1;
            }
        }
    }

    /// The pool list external `(a, p)` belongs to.
    fn pool_of(&self, a: Ipv4Addr, p: u16) -> Match {
        pool_match(a, self.share.list_of(p) as u8)
    }
}

impl NatTable for MvtTable {
    type Session = EntryId;

    #[inline]
    fn prefetch(&mut self, flow: &FlowKey, dir: Direction) {
        let tag = match dir {
            Direction::Outbound => OUT,
            Direction::Inbound => IN,
        };
        let hint = self.table.prefetch_find(&flow_match(tag, flow));
        self.advance(Some(hint));
    }
    fn find_out(
        &mut self,
        flow: &FlowKey,
        flags: Option<tcp::Flags>,
        timeouts: &Timeouts,
        now: Nanos,
    ) -> Result<Option<(Ipv4Addr, u16)>, u8> {
        self.advance(None);
        let Some(id) = self.table.find(&flow_match(OUT, flow)) else {
            return Ok(None);
        };
        let Some(Entry {
            value:
                NatValue::Out {
                    ext_ip,
                    ext_port,
                    tcp,
                    ..
                },
            ..
        }) = self.table.entry_mut(id)
        else {
            return Err(STATE_ERROR);
        };
        if let Some(f) = flags {
            *tcp = tcp_step(*tcp, f, Direction::Outbound);
        }
        let (ip, port, tcp) = (*ext_ip, *ext_port, *tcp);
        self.renew(id, flow, timeouts.of(flow.proto, tcp), now, false);
        Ok(Some((ip, port)))
    }

    /// Allocates a resource from the pool of the paired address unless the inside endpoint
    /// holds one.
    fn open(
        &mut self,
        flow: &FlowKey,
        tcp: u8,
        timeouts: &Timeouts,
        now: Nanos,
        forwarded: Option<(Ipv4Addr, u16)>,
    ) -> Result<((Ipv4Addr, u16), bool), u8> {
        let IpAddr::V4(inside) = flow.src else {
            return Err(MALFORMED);
        };
        let eim = eim_match(inside, flow.src_port, flow.proto);
        // The resource, whether it is new, and whether it came from the pool.
        let (res, fresh, pooled) = match (self.table.find(&eim), forwarded) {
            (Some(id), _) => (id, false, false),
            (None, Some((ext_ip, ext_port))) => {
                let v = NatValue::Resource {
                    ext_ip,
                    ext_port,
                    forwarded: true,
                };
                let id = self
                    .table
                    .insert(Entry::new(eim, v, 0, NEVER, 0))
                    .map_err(|_| STATE_ERROR)?;
                self.mappings += 1;
                (id, true, false)
            }
            (None, None) => {
                // Paired pooling (RFC 4787 REQ-2), as in the default NAT.
                let i = super::paired(inside, self.external.len());
                let want = self.share.list_of(flow.src_port) as u8;
                let id = [want, 1 - want]
                    .into_iter()
                    .find_map(|l| self.table.find(&pool_match(self.external[i], l)))
                    .ok_or(POOL_EXHAUSTED)?;
                self.table.rematch(id, eim).map_err(|_| STATE_ERROR)?;
                self.mappings += 1;
                self.free -= 1;
                (id, true, true)
            }
        };
        let (ext_ip, ext_port) = match self.table.entry_mut(res) {
            Some(Entry {
                value:
                    NatValue::Resource {
                        ext_ip, ext_port, ..
                    },
                aux,
                ..
            }) => {
                *aux = aux.saturating_add(1);
                (*ext_ip, *ext_port)
            }
            _ => return Err(STATE_ERROR),
        };
        if pooled && self.filtering != Filtering::AddressAndPortDependent {
            let back = NatValue::Ext {
                inside_ip: inside,
                inside_port: flow.src_port,
            };
            self.table
                .insert(Entry::new(
                    ext_match((ext_ip, ext_port, flow.proto)),
                    back,
                    0,
                    NEVER,
                    0,
                ))
                .map_err(|_| STATE_ERROR)?;
        }
        if self.filtering == Filtering::AddressDependent {
            if let Some(m) = peer_match(flow) {
                self.count_peer(m, true)?;
            }
        }
        let s = OutSession {
            ext_ip,
            ext_port,
            tcp,
        };
        let placeholder = NatValue::In {
            inside_ip: inside,
            inside_port: flow.src_port,
            out: res,
        };
        let rev = self
            .table
            .insert(Entry::new(
                flow_match(IN, &in_key(flow, &s)),
                placeholder,
                0,
                0,
                0,
            ))
            .map_err(|_| STATE_ERROR)?;
        let out = NatValue::Out {
            ext_ip,
            ext_port,
            tcp,
            res,
            rev,
        };
        let Ok(id) = self
            .table
            .insert(Entry::new(flow_match(OUT, flow), out, 0, 0, 0))
        else {
            self.table.remove(rev);
            return Err(STATE_ERROR);
        };
        if let Some(NatValue::In { out, .. }) = self.table.entry_mut(rev).map(|e| &mut e.value) {
            *out = id;
        }
        self.sessions += 1;
        self.renew(id, flow, timeouts.of(flow.proto, tcp), now, true);
        Ok(((ext_ip, ext_port), fresh))
    }

    fn find_in(
        &mut self,
        flow: &FlowKey,
        flags: Option<tcp::Flags>,
        renew: Option<(&Timeouts, Nanos)>,
    ) -> Result<Option<Found<EntryId>>, u8> {
        self.advance(None);
        let Some((inside_ip, inside_port, out)) = self.answered(flow)? else {
            return Ok(None);
        };
        let Some(Entry {
            value: NatValue::Out { tcp, .. },
            ..
        }) = self.table.entry_mut(out)
        else {
            return Ok(None);
        };
        *tcp = step_in(*tcp, flags);
        let tcp = *tcp;
        if let Some((timeouts, now)) = renew {
            let s = InSession {
                inside_ip,
                inside_port,
            };
            let ttl = timeouts.of(flow.proto, tcp);
            self.renew(out, &out_key(flow, &s), ttl, now, false);
        }
        Ok(Some(Found {
            inside_ip,
            inside_port,
            tcp,
            session: out,
        }))
    }

    fn extend_out(
        &mut self,
        flow: &FlowKey,
        timeouts: &Timeouts,
        until: Nanos,
    ) -> Result<Option<(Ipv4Addr, u16)>, u8> {
        let Some(id) = self.table.find(&flow_match(OUT, flow)) else {
            return Ok(None);
        };
        let Some(NatValue::Out {
            ext_ip,
            ext_port,
            tcp,
            ..
        }) = self.table.get(id).copied()
        else {
            return Err(STATE_ERROR);
        };
        self.extend(id, flow, timeouts.of(flow.proto, tcp), until);
        Ok(Some((ext_ip, ext_port)))
    }

    fn extend_in(
        &mut self,
        flow: &FlowKey,
        extend: Option<(&Timeouts, Nanos)>,
    ) -> Result<Option<(Ipv4Addr, u16)>, u8> {
        let Some((inside_ip, inside_port, out)) = self.answered(flow)? else {
            return Ok(None);
        };
        let Some(NatValue::Out { tcp, .. }) = self.table.get(out).copied() else {
            return Ok(None);
        };
        if let Some((timeouts, until)) = extend {
            let s = InSession {
                inside_ip,
                inside_port,
            };
            let ttl = timeouts.of(flow.proto, tcp);
            self.extend(out, &out_key(flow, &s), ttl, until);
        }
        Ok(Some((inside_ip, inside_port)))
    }

    fn peek_out(&self, flow: &FlowKey) -> Result<Option<(Ipv4Addr, u16)>, u8> {
        Ok(match self.lookup(OUT, flow) {
            Some(NatValue::Out {
                ext_ip, ext_port, ..
            }) => Some((ext_ip, ext_port)),
            _ => None,
        })
    }

    fn peek_in(&self, flow: &FlowKey) -> Result<Option<(Ipv4Addr, u16)>, u8> {
        Ok(match self.lookup(IN, flow) {
            Some(NatValue::In {
                inside_ip,
                inside_port,
                ..
            }) => Some((inside_ip, inside_port)),
            _ => None,
        })
    }

    fn mapped(&self, ext: Endpoint) -> Result<Option<(Ipv4Addr, u16)>, u8> {
        let id = self.table.find(&ext_match(ext));
        Ok(match id.and_then(|id| self.table.get(id)) {
            Some(NatValue::Ext {
                inside_ip,
                inside_port,
            }) => Some((*inside_ip, *inside_port)),
            _ => None,
        })
    }

    fn talks_to(&self, (ip, port, proto): Endpoint, remote: Ipv4Addr) -> Result<bool, u8> {
        let key = FlowKey::new(IpAddr::V4(ip), IpAddr::V4(remote), port, 0, proto);
        Ok(peer_match(&key).is_some_and(|m| self.table.find(&m).is_some()))
    }

    fn expire(&mut self, now: Nanos, ended: &mut dyn FnMut(&FlowKey, Ended)) {
        while let Some(Reverse((at, key, id))) = self.timers.peek().copied() {
            if at > now {
                break;
            }
            self.timers.pop();
            let Some(e) = self.table.entry_mut(id) else {
                continue; // the session ended some other way
            };
            if e.aux != at {
                continue; // a stale node: the session has a timer of its own
            }
            let deadline = e.deadline();
            if deadline != at {
                // Renewed: wait for the new time (which may have come too: a session ends at
                // its own deadline's turn, so sessions end in deadline order). Its reverse
                // entry takes the session's time now, as the default NAT's does.
                e.aux = deadline;
                let (ts, timeout) = (e.timestamp, e.timeout);
                let rev = match e.value {
                    NatValue::Out { rev, .. } => Some(rev),
                    _ => None,
                };
                self.timers.push(Reverse((deadline, key, id)));
                if let Some(rev) = rev {
                    let _ = self.table.renew(rev, ts, timeout);
                }
                continue;
            }
            if let Some(end) = self.release(id, &key) {
                ended(&key, end);
            }
        }
    }

    fn mapping(&self, inside: Endpoint) -> Option<(Ipv4Addr, u16)> {
        let id = self.table.find(&eim_match(inside.0, inside.1, inside.2))?;
        match self.table.get(id) {
            Some(NatValue::Resource {
                ext_ip, ext_port, ..
            }) => Some((*ext_ip, *ext_port)),
            _ => None,
        }
    }

    fn counts(&self) -> (i64, i64, i64) {
        (self.sessions as i64, self.mappings as i64, self.free as i64)
    }

    fn sessions(&self) -> usize {
        self.sessions
    }

    fn early_drop(&mut self, flow: &FlowKey, for_port: bool) -> Option<Ended> {
        let id = self.table.find(&flow_match(OUT, flow))?;
        let Some(NatValue::Out { tcp, res, .. }) = self.table.get(id).copied() else {
            return None;
        };
        if !expendable(tcp) || (for_port && self.table.entry(res).is_none_or(|e| e.aux > 1)) {
            return None;
        }
        self.release(id, flow)
    }

    /// Sessions are found through their timers (each live session has exactly one node whose
    /// deadline its entry's `aux` holds); mappings are the sessions grouped by inside endpoint.
    fn list(&self, table: &str, now: Nanos, out: &mut Vec<Row>) {
        let sessions = self.timers.iter().filter_map(|Reverse((at, key, id))| {
            let e = self.table.entry(*id).filter(|e| e.aux == *at)?;
            match e.value {
                NatValue::Out {
                    ext_ip,
                    ext_port,
                    tcp,
                    res,
                    ..
                } => Some((key, ext_ip, ext_port, tcp, e.deadline(), res)),
                _ => None,
            }
        });
        match table {
            "sessions" => {
                for (k, ip, port, tcp, deadline, _) in sessions {
                    let left = Cell::timeout(Some(deadline), now);
                    out.push(session_row(k, ip, port, tcp, left));
                }
            }
            "mappings" => {
                let mut by_inside: BTreeMap<Endpoint, Mapping> = BTreeMap::new();
                for (k, ext_ip, ext_port, _, _, res) in sessions {
                    let IpAddr::V4(ip) = k.src else { continue };
                    let forwarded = matches!(
                        self.table.get(res),
                        Some(NatValue::Resource {
                            forwarded: true,
                            ..
                        })
                    );
                    by_inside
                        .entry((ip, k.src_port, k.proto))
                        .or_insert(Mapping {
                            ext_ip,
                            ext_port,
                            sessions: 0,
                            forwarded,
                        })
                        .sessions += 1;
                }
                out.extend(by_inside.iter().map(|(e, m)| mapping_row(*e, m)));
            }
            _ => {}
        }
    }

    fn reforward(&mut self, forwards: &Forwards) {
        let r = self.share.reforward(forwards);
        if !r.reserved.is_empty() || !r.freed.is_empty() {
            self.repool(&r);
        }
        for ((ip, port, proto), want) in forwards.endpoints() {
            let Some(id) = self.table.find(&eim_match(ip, port, proto)) else {
                continue;
            };
            let was = match self.table.entry_mut(id) {
                Some(Entry {
                    value:
                        NatValue::Resource {
                            ext_ip,
                            ext_port,
                            forwarded,
                        },
                    ..
                }) if (*ext_ip, *ext_port) != want => {
                    let was = (*ext_ip, *ext_port, *forwarded);
                    (*ext_ip, *ext_port, *forwarded) = (want.0, want.1, true);
                    Some(was)
                }
                _ => None,
            };
            if let Some((a, p, false)) = was {
                if let Some(x) = self.table.find(&ext_match((a, p, proto))) {
                    self.table.remove(x);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_selection() {
        let t = |s: &str| s.parse::<toml::Table>().unwrap();
        assert!(select_factory(&t("external = [\"203.0.113.1\"]")).is_ok());
        assert!(select_factory(&t("external = [\"203.0.113.1\"]\ntable = \"state\"")).is_ok());
        assert!(select_factory(&t("external = [\"203.0.113.1\"]\ntable = \"mvt\"")).is_ok());
        let e = select_factory(&t("external = [\"203.0.113.1\"]\ntable = \"trie\""))
            .err()
            .map(|e| e.to_string());
        assert!(e.is_some_and(|e| e.contains("table")));
    }

    #[test]
    fn keys_of_different_tags_never_meet() {
        let f = FlowKey::new(
            IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)),
            IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1)),
            1,
            2,
            6,
        );
        assert_ne!(flow_match(OUT, &f), flow_match(IN, &f));
        assert!(!pool_match(Ipv4Addr::new(10, 0, 0, 1), 0).overlaps(&flow_match(OUT, &f)));
        assert!(!eim_match(Ipv4Addr::new(10, 0, 0, 1), 1, 6).overlaps(&flow_match(OUT, &f)));
    }
}
