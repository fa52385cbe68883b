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
//! Exactly the default NAT's ([`super`]): the same translations, endpoint-independent
//! mappings, paired address pooling, filtering, checksum updates, ICMP error translation,
//! timeouts, drop reasons, counters and report, and the same order in which ports are handed
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
//!
//! At start the table is a pure pool: one entry per external `(address, port)` this worker
//! owns (ports split among workers by [`super::port_owner`], so the instance's table is
//! *sharded* across workers and no pool is shared). Allocation takes the first free entry of
//! the paired address and changes its matching field to the inside endpoint ("set"), and a
//! session creates its reverse entry with the same timestamp and timeout. Packets renew both
//! ("renew"). When a session's time comes it is timed out ("timeout") and removed with its
//! reverse entry; when a resource's last session goes, its matching field returns to the pool
//! match, at the end of the pool. Timers fire in deadline order (ties by 5-tuple), as the state
//! API's do, so ports come back in the same order as in the default NAT.
//!
//! The table is this worker's partition, not state-API state (see `flowstate_mvt`'s crate docs
//! for how the two relate): it is not flushed to a store, so a restarted worker starts with an
//! empty table. Counters still go through the state API (same ids as the default NAT).

use super::{
    config_error, in_key, is_icmp_error, out_key, quoted, rewrite, rewrite_quoted, tcp_established,
    tcp_flags, tcp_step, Config, Ipv6Policy, Kind, PortRange, Side, DROP_REASONS, EXTERNAL_SOURCE,
    FRAGMENT, ICMP_ERROR, IPV6, MALFORMED, NF, NOT_EXTERNAL, NO_MAPPING, POOL_EXHAUSTED,
    STATE_ERROR, UNSUPPORTED,
};
use crate::listing::{Cell, Row, TableInfo};
use crate::{
    BuildError, Context, Direction, NetworkFunction, NfFactory, Packet, Verdict, WorkerInfo,
};
use flowstate_mvt::{Entry, EntryId, Hasher, Key, Match, Mvt, KEY_BITS, NEVER};
use flowstate_state::{Access, Counter, CounterMap, Declare, Nanos, Scope};
use flowstate_wire::dissect::{Fragment, Network, Transport};
use flowstate_wire::flow::FLOW_KEY_MAX_BYTES;
use flowstate_wire::icmp::v4::types as icmp_type;
use flowstate_wire::{hash, icmp, ipv4, FlowKey};
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
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
    Ok(Arc::new(Factory(Config::from_table(table)?)))
}

/// Builds MVT NATs.
#[derive(Debug, Clone)]
pub struct Factory(pub Config);

impl NfFactory for Factory {
    fn name(&self) -> &'static str {
        NF
    }

    fn build(
        &self,
        state: &mut Declare<'_>,
        worker: WorkerInfo,
    ) -> Result<Box<dyn NetworkFunction>, BuildError> {
        Ok(Box::new(MvtNat::new(&self.0, state, worker)?))
    }

    fn partition(
        &self,
        flow: &flowstate_wire::FlowKey,
        quoted: Option<&flowstate_wire::FlowKey>,
        direction: Direction,
        partitions: u32,
    ) -> Option<u32> {
        self.0.partition(flow, quoted, direction, partitions)
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

/// The value field of the NAT's entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NatValue {
    /// An external `(address, port)`: free in the pool, or allocated to an inside endpoint.
    Resource {
        /// External address.
        ext_ip: Ipv4Addr,
        /// External port (ICMP: identifier).
        ext_port: u16,
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
}

fn pool_match(ext: Ipv4Addr) -> Match {
    let o = ext.octets();
    Match::exact(&Key::from_bytes(&[POOL, o[0], o[1], o[2], o[3]]))
}

fn eim_match(inside: Ipv4Addr, port: u16, proto: u8) -> Match {
    let o = inside.octets();
    let p = port.to_be_bytes();
    Match::exact(&Key::from_bytes(&[
        EIM, o[0], o[1], o[2], o[3], p[0], p[1], proto,
    ]))
}

fn flow_match(tag: u8, f: &FlowKey) -> Match {
    let mut buf = [0u8; FLOW_KEY_MAX_BYTES];
    let b = f.to_bytes(&mut buf);
    let mut k = [0u8; FLOW_KEY_MAX_BYTES + 1];
    k[0] = tag;
    k[1..=b.len()].copy_from_slice(b);
    Match::exact(&Key::from_bytes(&k[..=b.len()]))
}

/// One worker's NAT on an MVT.
pub struct MvtNat {
    ports: PortRange,
    tcp_established: Duration,
    tcp_transitory: Duration,
    udp: Duration,
    icmp: Duration,
    ipv6: Ipv6Policy,
    external: Vec<Ipv4Addr>,
    table: Mvt<NatValue>,
    /// Session timers: (deadline, inside 5-tuple, session entry), earliest first.
    timers: BinaryHeap<Reverse<(Nanos, FlowKey, EntryId)>>,
    sessions: usize,
    mappings: usize,
    free: usize,
    translations: Counter,
    packets_out: Counter,
    packets_in: Counter,
    expired: Counter,
    drops: CounterMap<u8>,
}

impl fmt::Debug for MvtNat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MvtNat")
            .field("ports", &self.ports)
            .field("external", &self.external)
            .field("sessions", &self.sessions)
            .finish()
    }
}

impl MvtNat {
    /// Builds `worker`'s NAT: declares its counters and fills its table with the worker's
    /// share of the pool.
    pub fn new(
        config: &Config,
        state: &mut Declare<'_>,
        worker: WorkerInfo,
    ) -> Result<MvtNat, BuildError> {
        config.validate()?;
        if worker.count == 0 || worker.index >= worker.count {
            return Err(config_error(
                "workers",
                format!("worker {} of {} does not exist", worker.index, worker.count),
            ));
        }
        if config.ports.len() < worker.count {
            return Err(config_error(
                "ports",
                format!(
                    "{} has {} ports, fewer than the {} workers that share it",
                    config.ports,
                    config.ports.len(),
                    worker.count
                ),
            ));
        }
        let share = config.ports.len().div_ceil(worker.count) as usize * config.external.len();
        let mut table = Mvt::with_options(KEY_BITS, share * 3, 0, Hasher::Hardware);
        for a in &config.external {
            let first = u32::from(config.ports.lo) + worker.index;
            for p in (first..=u32::from(config.ports.hi)).step_by(worker.count as usize) {
                let v = NatValue::Resource {
                    ext_ip: *a,
                    ext_port: p as u16,
                };
                table
                    .insert(Entry::new(pool_match(*a), v, 0, NEVER, 0))
                    .map_err(|e| config_error("ports", e.to_string()))?;
            }
        }
        let part = Scope::CrossFlow(&[]);
        Ok(MvtNat {
            ports: config.ports,
            tcp_established: config.tcp_established,
            tcp_transitory: config.tcp_transitory,
            udp: config.udp,
            icmp: config.icmp,
            ipv6: config.ipv6,
            external: config.external.clone(),
            free: table.len(),
            table,
            timers: BinaryHeap::with_capacity(share),
            sessions: 0,
            mappings: 0,
            translations: state.counter("translations", part, Access::WriteMostly)?,
            packets_out: state.counter("packets_out", part, Access::WriteMostly)?,
            packets_in: state.counter("packets_in", part, Access::WriteMostly)?,
            expired: state.counter("expired", part, Access::WriteMostly)?,
            drops: state.counter_map("drops", part, Access::WriteMostly)?,
        })
    }

    /// The table (this worker's partition).
    pub fn table(&self) -> &Mvt<NatValue> {
        &self.table
    }

    /// The external endpoint the inside endpoint `(address, port, protocol)` is mapped to.
    pub fn mapping(&self, inside: super::Endpoint) -> Option<(Ipv4Addr, u16)> {
        let id = self.table.find(&eim_match(inside.0, inside.1, inside.2))?;
        match self.table.get(id) {
            Some(NatValue::Resource { ext_ip, ext_port }) => Some((*ext_ip, *ext_port)),
            _ => None,
        }
    }

    #[inline]
    fn drop_packet(&self, why: u8) -> Verdict {
        self.drops.add_to_nowait(&why, 1);
        Verdict::Drop(DROP_REASONS[usize::from(why)].0)
    }

    #[inline]
    fn is_external(&self, a: Ipv4Addr) -> bool {
        self.external.contains(&a)
    }

    fn timeout(&self, proto: u8, tcp: u8) -> Duration {
        match proto {
            flowstate_wire::flow::proto::TCP if tcp_established(tcp) => self.tcp_established,
            flowstate_wire::flow::proto::TCP => self.tcp_transitory,
            flowstate_wire::flow::proto::UDP => self.udp,
            _ => self.icmp,
        }
    }

    /// "renew" of a session and its reverse entry with one timeout; arms the session's timer
    /// (one timer node per session, re-armed lazily, like the state API's TTLs).
    fn renew(&mut self, out: EntryId, key: &FlowKey, ttl: Duration, now: Nanos) {
        let ttl = ttl.as_nanos().min(u128::from(u64::MAX)) as u64;
        let deadline = now.saturating_add(ttl).max(1);
        let rev = match self.table.get(out) {
            Some(NatValue::Out { rev, .. }) => *rev,
            _ => return,
        };
        let _ = self.table.renew(rev, now, deadline - now);
        let _ = self.table.renew(out, now, deadline - now);
        if let Some(e) = self.table.entry_mut(out) {
            if e.aux == 0 || deadline < e.aux {
                e.aux = deadline;
                self.timers.push(Reverse((deadline, *key, out)));
            }
        }
    }

    fn outbound(&mut self, pkt: &mut Packet<'_>, flow: FlowKey, now: Nanos) -> Verdict {
        let kind = match pkt.dissection.transport {
            Transport::Tcp => Kind::Tcp(tcp_flags(pkt)),
            Transport::Udp => Kind::Udp,
            Transport::Icmpv4 {
                kind: k @ (icmp_type::ECHO_REQUEST | icmp_type::ECHO_REPLY),
                ..
            } => Kind::Echo {
                request: k == icmp_type::ECHO_REQUEST,
            },
            Transport::Icmpv4 { kind, .. } if is_icmp_error(kind) => {
                return self.icmp_error(pkt, Direction::Outbound)
            }
            _ => return self.drop_packet(UNSUPPORTED),
        };
        let (id, ext_ip, ext_port, tcp) = match self.table.find(&flow_match(OUT, &flow)) {
            Some(id) => {
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
                    return self.drop_packet(STATE_ERROR);
                };
                if let Kind::Tcp(f) = kind {
                    *tcp = tcp_step(*tcp, f, Direction::Outbound);
                }
                (id, *ext_ip, *ext_port, *tcp)
            }
            None => match self.open(&flow, kind) {
                Ok(x) => x,
                Err(why) => return self.drop_packet(why),
            },
        };
        let ttl = self.timeout(flow.proto, tcp);
        self.renew(id, &flow, ttl, now);
        if !rewrite(pkt, Side::Src, ext_ip, ext_port) {
            return self.drop_packet(MALFORMED);
        }
        self.packets_out.add_nowait(1);
        Verdict::Forward
    }

    /// Creates a session for the outbound `flow`, allocating a resource from the pool of the
    /// paired address unless the inside endpoint holds one.
    fn open(&mut self, flow: &FlowKey, kind: Kind) -> Result<(EntryId, Ipv4Addr, u16, u8), u8> {
        if kind == (Kind::Echo { request: false }) {
            return Err(NO_MAPPING);
        }
        let IpAddr::V4(inside) = flow.src else {
            return Err(MALFORMED);
        };
        let eim = eim_match(inside, flow.src_port, flow.proto);
        let res = match self.table.find(&eim) {
            Some(id) => id,
            None => {
                // Paired pooling (RFC 4787 REQ-2), as in the default NAT.
                let i = hash::crc32c(&inside.octets()) as usize % self.external.len();
                let id = self
                    .table
                    .find(&pool_match(self.external[i]))
                    .ok_or(POOL_EXHAUSTED)?;
                self.table.rematch(id, eim).map_err(|_| STATE_ERROR)?;
                self.mappings += 1;
                self.free -= 1;
                id
            }
        };
        let (ext_ip, ext_port) = match self.table.entry_mut(res) {
            Some(Entry {
                value: NatValue::Resource { ext_ip, ext_port },
                aux,
                ..
            }) => {
                *aux = aux.saturating_add(1);
                (*ext_ip, *ext_port)
            }
            _ => return Err(STATE_ERROR),
        };
        let tcp = match kind {
            Kind::Tcp(f) => tcp_step(0, f, Direction::Outbound),
            _ => 0,
        };
        let s = super::OutSession {
            ext_ip,
            ext_port,
            tcp,
        };
        let rev_key = in_key(flow, &s);
        let placeholder = NatValue::In {
            inside_ip: inside,
            inside_port: flow.src_port,
            out: res,
        };
        let rev = self
            .table
            .insert(Entry::new(flow_match(IN, &rev_key), placeholder, 0, 0, 0))
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
        self.translations.add_nowait(1);
        Ok((id, ext_ip, ext_port, tcp))
    }

    fn inbound(&mut self, pkt: &mut Packet<'_>, flow: FlowKey, now: Nanos) -> Verdict {
        let kind = match pkt.dissection.transport {
            Transport::Tcp => Kind::Tcp(tcp_flags(pkt)),
            Transport::Udp => Kind::Udp,
            Transport::Icmpv4 {
                kind: k @ (icmp_type::ECHO_REQUEST | icmp_type::ECHO_REPLY),
                ..
            } => Kind::Echo {
                request: k == icmp_type::ECHO_REQUEST,
            },
            Transport::Icmpv4 { kind, .. } if is_icmp_error(kind) => {
                return self.icmp_error(pkt, Direction::Inbound)
            }
            _ => return self.drop_packet(NO_MAPPING),
        };
        let Some(rid) = self.table.find(&flow_match(IN, &flow)) else {
            return self.drop_packet(NO_MAPPING);
        };
        let Some(NatValue::In {
            inside_ip,
            inside_port,
            out,
        }) = self.table.get(rid).copied()
        else {
            return self.drop_packet(STATE_ERROR);
        };
        let Some(Entry {
            value: NatValue::Out { tcp, .. },
            ..
        }) = self.table.entry_mut(out)
        else {
            return self.drop_packet(NO_MAPPING);
        };
        if let Kind::Tcp(f) = kind {
            *tcp = tcp_step(*tcp, f, Direction::Inbound);
        }
        let tcp = *tcp;
        if !rewrite(pkt, Side::Dst, inside_ip, inside_port) {
            return self.drop_packet(MALFORMED);
        }
        let ok = out_key(
            &flow,
            &super::InSession {
                inside_ip,
                inside_port,
            },
        );
        let ttl = self.timeout(flow.proto, tcp);
        self.renew(out, &ok, ttl, now);
        self.packets_in.add_nowait(1);
        Verdict::Forward
    }

    /// Translates an ICMP error quoting a packet of a session (RFC 5508 REQ-3, REQ-4), as the
    /// default NAT does. The session is not refreshed.
    fn icmp_error(&mut self, pkt: &mut Packet<'_>, dir: Direction) -> Verdict {
        let d = pkt.dissection;
        let Some(msg) = d.l4_offset.and_then(|o| pkt.data.get(o..d.l3_end)) else {
            return self.drop_packet(MALFORMED);
        };
        let Ok(m) = icmp::v4::Packet::new_checked(msg) else {
            return self.drop_packet(MALFORMED);
        };
        let (Some(inner), Some(layout)) = (m.inner_flow(), quoted(msg)) else {
            return self.drop_packet(ICMP_ERROR);
        };
        let key = inner.reversed();
        let (outer, addr, port) = match dir {
            Direction::Outbound => match self.lookup(OUT, &key) {
                Some(NatValue::Out {
                    ext_ip, ext_port, ..
                }) => (Side::Src, ext_ip, ext_port),
                _ => return self.drop_packet(NO_MAPPING),
            },
            Direction::Inbound => {
                if d.flow.map(|f| f.dst) != Some(inner.src) {
                    return self.drop_packet(ICMP_ERROR);
                }
                match self.lookup(IN, &key) {
                    Some(NatValue::In {
                        inside_ip,
                        inside_port,
                        ..
                    }) => (Side::Dst, inside_ip, inside_port),
                    _ => return self.drop_packet(NO_MAPPING),
                }
            }
        };
        let Some(l3) = pkt.data.get_mut(d.l3_offset..d.l3_end) else {
            return self.drop_packet(MALFORMED);
        };
        let Ok(mut ip) = ipv4::Packet::new_checked(l3) else {
            return self.drop_packet(MALFORMED);
        };
        match outer {
            Side::Src => ip.set_src_addr(addr),
            Side::Dst => ip.set_dst_addr(addr),
        }
        let inner_side = match outer {
            Side::Src => Side::Dst,
            Side::Dst => Side::Src,
        };
        rewrite_quoted(ip.payload_mut(), layout, inner_side, addr, port);
        if let Some(f) = pkt.dissection.flow.as_mut() {
            match outer {
                Side::Src => f.src = IpAddr::V4(addr),
                Side::Dst => f.dst = IpAddr::V4(addr),
            }
        }
        match dir {
            Direction::Outbound => self.packets_out.add_nowait(1),
            Direction::Inbound => self.packets_in.add_nowait(1),
        }
        Verdict::Forward
    }

    fn lookup(&self, tag: u8, key: &FlowKey) -> Option<NatValue> {
        let id = self.table.find(&flow_match(tag, key))?;
        self.table.get(id).copied()
    }

    /// Ends a session: "timeout", removal of it and its reverse entry, and the return of its
    /// resource to the end of the pool when it was the resource's last session.
    fn release(&mut self, id: EntryId) {
        self.table.invalidate(id);
        let Some(e) = self.table.remove(id) else {
            return;
        };
        let NatValue::Out { res, rev, .. } = e.value else {
            return;
        };
        self.table.remove(rev);
        self.sessions -= 1;
        self.expired.add_nowait(1);
        let back = match self.table.entry_mut(res) {
            Some(Entry {
                value: NatValue::Resource { ext_ip, .. },
                aux,
                ..
            }) => {
                *aux = aux.saturating_sub(1);
                (*aux == 0).then_some(*ext_ip)
            }
            _ => None,
        };
        if let Some(ip) = back {
            if self.table.rematch(res, pool_match(ip)).is_ok() {
                self.mappings -= 1;
                self.free += 1;
            }
        }
    }
}

impl NetworkFunction for MvtNat {
    fn name(&self) -> &str {
        NF
    }

    #[inline]
    fn prefetch(&mut self, pkt: &Packet<'_>) {
        let (Network::Ipv4, Some(flow)) = (pkt.dissection.network, pkt.dissection.flow) else {
            return;
        };
        let tag = match pkt.direction {
            Direction::Outbound => OUT,
            Direction::Inbound => IN,
        };
        self.table.prefetch_find(&flow_match(tag, &flow));
    }

    fn process(&mut self, pkt: &mut Packet<'_>, cx: &Context) -> Verdict {
        match pkt.dissection.network {
            Network::Ipv4 => {}
            Network::Ipv6 => {
                return match self.ipv6 {
                    Ipv6Policy::Forward => Verdict::Forward,
                    Ipv6Policy::Drop => self.drop_packet(IPV6),
                }
            }
            Network::Arp | Network::Other(_) => return Verdict::Forward,
        }
        let Some(flow) = pkt.dissection.flow else {
            return self.drop_packet(MALFORMED);
        };
        match pkt.direction {
            Direction::Outbound => {
                if matches!(flow.src, IpAddr::V4(a) if self.is_external(a)) {
                    return self.drop_packet(EXTERNAL_SOURCE);
                }
                if pkt.dissection.fragment != Fragment::None {
                    return self.drop_packet(FRAGMENT);
                }
                self.outbound(pkt, flow, cx.now)
            }
            Direction::Inbound => {
                if !matches!(flow.dst, IpAddr::V4(a) if self.is_external(a)) {
                    return self.drop_packet(NOT_EXTERNAL);
                }
                if pkt.dissection.fragment != Fragment::None {
                    return self.drop_packet(FRAGMENT);
                }
                self.inbound(pkt, flow, cx.now)
            }
        }
    }

    fn on_tick(&mut self, now: Nanos) {
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
            if deadline > now {
                e.aux = deadline; // renewed: wait for the new time
                self.timers.push(Reverse((deadline, key, id)));
                continue;
            }
            self.release(id);
        }
    }

    fn entries(&self) -> u64 {
        self.sessions as u64
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
                    ..
                } => Some((key, ext_ip, ext_port, tcp, e.deadline())),
                _ => None,
            }
        });
        match table {
            "sessions" => {
                for (k, ip, port, tcp, deadline) in sessions {
                    let left = Cell::timeout(Some(deadline), now);
                    out.push(super::session_row(k, ip, port, tcp, left));
                }
            }
            "mappings" => {
                let mut by_inside: BTreeMap<super::Endpoint, super::Mapping> = BTreeMap::new();
                for (k, ext_ip, ext_port, ..) in sessions {
                    let IpAddr::V4(ip) = k.src else { continue };
                    by_inside
                        .entry((ip, k.src_port, k.proto))
                        .or_insert(super::Mapping {
                            ext_ip,
                            ext_port,
                            sessions: 0,
                        })
                        .sessions += 1;
                }
                out.extend(by_inside.iter().map(|(e, m)| super::mapping_row(*e, m)));
            }
            _ => {}
        }
    }

    fn report(&self) -> Vec<(&'static str, i64)> {
        let mut r = vec![
            ("active_mappings", self.mappings as i64),
            ("active_sessions", self.sessions as i64),
            ("translations", self.translations.get().unwrap_or(-1)),
            ("packets_out", self.packets_out.get().unwrap_or(-1)),
            ("packets_in", self.packets_in.get().unwrap_or(-1)),
            ("expired_sessions", self.expired.get().unwrap_or(-1)),
            ("pool_free", self.free as i64),
        ];
        for (i, (_, name)) in DROP_REASONS.iter().enumerate() {
            r.push((name, self.drops.get(&(i as u8)).unwrap_or(-1)));
        }
        r
    }

    fn gauges(&self) -> &'static [&'static str] {
        &["active_mappings", "active_sessions", "pool_free"]
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
        assert!(!pool_match(Ipv4Addr::new(10, 0, 0, 1)).overlaps(&flow_match(OUT, &f)));
        assert!(!eim_match(Ipv4Addr::new(10, 0, 0, 1), 1, 6).overlaps(&flow_match(OUT, &f)));
    }
}
