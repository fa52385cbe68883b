//! The NAT's translation steps, written once over the table that holds its sessions
//! ([`NatTable`]): the state-API maps of [`super::Nat`] or the Match-Value Table of
//! [`super::mvt::MvtNat`]. Everything a packet sees (which packets are translated, filtered,
//! hairpinned or dropped, and how) is decided here; a table only finds, creates, renews and
//! ends entries.

use super::events::{Event, EventKind, WorkerEvents};
use super::rewrite::{is_icmp_error, quoted, rewrite, rewrite_quoted, tcp_flags};
use super::{
    in_key, out_key, tcp_established, tcp_step, Config, Endpoint, Filtering, Ipv6Policy, Refresh,
    DROP_REASONS, EXTERNAL_SOURCE, FILTERED, FRAGMENT, ICMP_ERROR, IPV6, MALFORMED, NF,
    NOT_EXTERNAL, NO_MAPPING, POOL_EXHAUSTED, SESSION_LIMIT, STATE_ERROR, UNSUPPORTED,
};
use crate::early_drop::Candidates;
use crate::listing::Row;
use crate::{
    BuildError, Context, Direction, NetworkFunction, Packet, Placement, ReloadConfig, Verdict,
};
use flowstate_state::{Access, Counter, CounterMap, Declare, Nanos, Scope};
use flowstate_wire::dissect::{Fragment, Network, Transport};
use flowstate_wire::flow::proto;
use flowstate_wire::icmp::v4::types as icmp_type;
use flowstate_wire::{icmp, ipv4, tcp, FlowKey};
use std::fmt;
use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

/// Which endpoint of a packet to rewrite.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Side {
    Src,
    Dst,
}

/// What the session logic needs to know about a packet's transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Tcp(tcp::Flags),
    Udp,
    Echo { request: bool },
}

impl Kind {
    /// The kind of a TCP, UDP or ICMP echo packet; `Err(kind)` for an ICMP error of type
    /// `kind`, `Ok(None)` for anything else.
    fn of(pkt: &Packet<'_>) -> Result<Option<Kind>, ()> {
        Ok(Some(match pkt.dissection.transport {
            Transport::Tcp => Kind::Tcp(tcp_flags(pkt)),
            Transport::Udp => Kind::Udp,
            Transport::Icmpv4 {
                kind: k @ (icmp_type::ECHO_REQUEST | icmp_type::ECHO_REPLY),
                ..
            } => Kind::Echo {
                request: k == icmp_type::ECHO_REQUEST,
            },
            Transport::Icmpv4 { kind, .. } if is_icmp_error(kind) => return Err(()),
            _ => return Ok(None),
        }))
    }

    /// Whether it is a TCP segment with FIN or RST: its session may become expendable.
    fn closes(self) -> bool {
        matches!(self, Kind::Tcp(f) if f.contains(tcp::Flags::FIN) || f.contains(tcp::Flags::RST))
    }

    fn flags(self) -> Option<tcp::Flags> {
        match self {
            Kind::Tcp(f) => Some(f),
            _ => None,
        }
    }
}

/// The idle timeouts of sessions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    tcp_established: Duration,
    tcp_transitory: Duration,
    udp: Duration,
    icmp: Duration,
}

impl Timeouts {
    fn new(config: &Config) -> Self {
        Timeouts {
            tcp_established: config.tcp_established,
            tcp_transitory: config.tcp_transitory,
            udp: config.udp,
            icmp: config.icmp,
        }
    }

    /// The timeout of a session of protocol `proto` in TCP state `tcp` (RFC 5382 REQ-5:
    /// established or transitory).
    #[inline]
    pub fn of(&self, proto: u8, tcp: u8) -> Duration {
        match proto {
            proto::TCP if tcp_established(tcp) => self.tcp_established,
            proto::TCP => self.tcp_transitory,
            proto::UDP => self.udp,
            _ => self.icmp,
        }
    }
}

/// A session found by an inbound packet.
#[derive(Debug, Clone, Copy)]
pub struct Found<S> {
    /// The inside endpoint the packet goes to.
    pub inside_ip: Ipv4Addr,
    /// Its port (ICMP: identifier).
    pub inside_port: u16,
    /// The session's TCP state after the packet.
    pub tcp: u8,
    /// The table's handle of the session.
    pub session: S,
}

/// A session a table ended: its external endpoint, and whether its mapping ended with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ended {
    /// The session's external endpoint.
    pub ext: (Ipv4Addr, u16),
    /// Whether it was its mapping's last session.
    pub mapping: bool,
}

/// The table a NAT keeps its sessions, mappings and free ports in. Errors are indices into
/// [`DROP_REASONS`].
///
/// A table keeps, besides sessions (an outbound entry keyed by the inside 5-tuple and a
/// reverse entry keyed by the reply's) and endpoint-independent mappings: the mapping of each
/// external endpoint back to its inside endpoint unless filtering is address- and
/// port-dependent, and the number of sessions each inside endpoint has with each remote
/// address when it is address-dependent.
pub trait NatTable {
    /// The handle of a session found by [`NatTable::find_in`].
    type Session: Copy;

    /// Prefetches the entry a packet of `flow` going `dir` looks up first.
    fn prefetch(&mut self, flow: &FlowKey, dir: Direction);

    /// The external endpoint of the session of outbound `flow`, whose TCP state (for a TCP
    /// segment with `flags`) is stepped and which is renewed; `None`: no session.
    fn find_out(
        &mut self,
        flow: &FlowKey,
        flags: Option<tcp::Flags>,
        timeouts: &Timeouts,
        now: Nanos,
    ) -> Result<Option<(Ipv4Addr, u16)>, u8>;

    /// Creates the session of outbound `flow` in TCP state `tcp`, renewed, with its inside
    /// endpoint's mapping, and returns its external endpoint and whether the mapping is new.
    /// A new mapping is `forwarded` (a port forwarding's external endpoint, never taken from
    /// or returned to a pool) or a port from the pool of the paired address.
    fn open(
        &mut self,
        flow: &FlowKey,
        tcp: u8,
        timeouts: &Timeouts,
        now: Nanos,
        forwarded: Option<(Ipv4Addr, u16)>,
    ) -> Result<((Ipv4Addr, u16), bool), u8>;

    /// The session inbound `flow` answers, its TCP state stepped for `flags` and, when `renew`
    /// gives the timeouts and the time now, the session renewed (its outbound entry: the
    /// reverse entry takes the session's time when its own timer fires, as after outbound
    /// packets).
    fn find_in(
        &mut self,
        flow: &FlowKey,
        flags: Option<tcp::Flags>,
        renew: Option<(&Timeouts, Nanos)>,
    ) -> Result<Option<Found<Self::Session>>, u8>;

    /// The external endpoint of the session of outbound `flow`, its TCP state as it is, the
    /// session renewed from `until` unless it runs out later already (for
    /// [`NetworkFunction::active_until`]); `None`: no session.
    fn extend_out(
        &mut self,
        flow: &FlowKey,
        timeouts: &Timeouts,
        until: Nanos,
    ) -> Result<Option<(Ipv4Addr, u16)>, u8>;

    /// The inside endpoint of the session inbound `flow` answers, its TCP state as it is and,
    /// when `extend` gives the timeouts and a time, the session renewed from that time unless
    /// it runs out later already; `None`: no session.
    fn extend_in(
        &mut self,
        flow: &FlowKey,
        extend: Option<(&Timeouts, Nanos)>,
    ) -> Result<Option<(Ipv4Addr, u16)>, u8>;

    /// The external endpoint of the session of outbound `flow`, without renewing it.
    fn peek_out(&self, flow: &FlowKey) -> Result<Option<(Ipv4Addr, u16)>, u8>;

    /// The inside endpoint of the session inbound `flow` answers, without renewing it.
    fn peek_in(&self, flow: &FlowKey) -> Result<Option<(Ipv4Addr, u16)>, u8>;

    /// The inside endpoint mapped to external endpoint `ext` (not kept under address- and
    /// port-dependent filtering).
    fn mapped(&self, ext: Endpoint) -> Result<Option<(Ipv4Addr, u16)>, u8>;

    /// Whether `inside` has a session with `remote` (kept under address-dependent filtering).
    fn talks_to(&self, inside: Endpoint, remote: Ipv4Addr) -> Result<bool, u8>;

    /// Ends the sessions whose time has come, telling `ended` of each (by its outbound key).
    fn expire(&mut self, now: Nanos, ended: &mut dyn FnMut(&FlowKey, Ended));

    /// The external endpoint `inside` is mapped to.
    fn mapping(&self, inside: Endpoint) -> Option<(Ipv4Addr, u16)>;

    /// Live sessions, mappings, free external endpoints (-1: the store cannot say).
    fn counts(&self) -> (i64, i64, i64);

    /// Live sessions at this worker (cheap: every new session asks).
    fn sessions(&self) -> usize;

    /// Ends the session of outbound `flow` if it is expendable (see `early_drop`) and, when
    /// `for_port`, it is the last session of its mapping (so its port goes back to the pool).
    fn early_drop(&mut self, flow: &FlowKey, for_port: bool) -> Option<Ended>;

    /// The rows of listing `table` (see [`super::TABLES`]).
    fn list(&self, table: &str, now: Nanos, out: &mut Vec<Row>);

    /// Takes the `forward` rules `forwards` in place of the running ones: the ports they
    /// reserve leave the pool (one a mapping holds does not go back when that ends), those
    /// they no longer reserve join it (when no mapping holds one; else when that ends).
    /// A published inside endpoint's mapping takes its forwarding's external endpoint (its
    /// sessions keep theirs); a pool port it held stays out of the pool until a restart.
    fn reforward(&mut self, forwards: &super::Forwards);
}

/// One worker's NAT over table `T`.
pub struct Translator<T> {
    pub(super) table: T,
    timeouts: Timeouts,
    filtering: Filtering,
    hairpinning: bool,
    inbound_refresh: bool,
    /// This worker's share of `max_sessions`.
    max_sessions: usize,
    /// Sessions that may be expendable (opened, or closing): early drop's candidates.
    candidates: Candidates<FlowKey>,
    ipv6: Ipv6Policy,
    /// The external addresses, sorted (for [`Translator::is_external`]).
    external: Vec<u32>,
    forwards: super::Forwards,
    /// The external addresses in configuration order (address pairing).
    pool_addrs: Vec<Ipv4Addr>,
    /// The session limit of the whole NAT (quota events).
    session_limit: u32,
    events: Option<WorkerEvents>,
    translations: Counter,
    packets_out: Counter,
    packets_in: Counter,
    hairpinned: Counter,
    early_dropped: Counter,
    expired: Counter,
    drops: CounterMap<u8>,
}

impl<T: fmt::Debug> fmt::Debug for Translator<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Nat")
            .field("filtering", &self.filtering)
            .field("table", &self.table)
            .finish()
    }
}

impl<T: NatTable> Translator<T> {
    /// Checks `config` and `worker`, builds the table with `table`, and declares the
    /// counters (the same ids whatever the table); events go to `events`.
    pub(super) fn build(
        config: &Config,
        state: &mut Declare<'_>,
        worker: Placement,
        events: Option<WorkerEvents>,
        table: impl FnOnce(&mut Declare<'_>) -> Result<T, BuildError>,
    ) -> Result<Self, BuildError> {
        config.validate()?;
        if worker.partitions == 0 || worker.partition >= worker.partitions {
            return Err(super::config_error(
                "workers",
                format!(
                    "worker {} of {} does not exist",
                    worker.partition, worker.partitions
                ),
            ));
        }
        if config.ports.len() < worker.partitions {
            return Err(super::config_error(
                "ports",
                format!(
                    "{} has {} ports, fewer than the {} workers that share it",
                    config.ports,
                    config.ports.len(),
                    worker.partitions
                ),
            ));
        }
        let table = table(state)?;
        let part = Scope::CrossFlow(&[]);
        let mut external: Vec<u32> = config.external.iter().map(|&a| u32::from(a)).collect();
        external.sort_unstable();
        Ok(Translator {
            table,
            timeouts: Timeouts::new(config),
            filtering: config.filtering,
            hairpinning: config.hairpinning,
            inbound_refresh: config.refresh == Refresh::Both,
            max_sessions: config.max_sessions.div_ceil(u64::from(worker.partitions)) as usize,
            candidates: Candidates::new(config.early_drop),
            ipv6: config.ipv6,
            external,
            forwards: config.forward.clone(),
            pool_addrs: config.external.clone(),
            session_limit: u32::try_from(config.max_sessions).unwrap_or(u32::MAX),
            events,
            translations: state.counter("translations", part, Access::WriteMostly)?,
            packets_out: state.counter("packets_out", part, Access::WriteMostly)?,
            packets_in: state.counter("packets_in", part, Access::WriteMostly)?,
            hairpinned: state.counter("hairpinned", part, Access::WriteMostly)?,
            early_dropped: state.counter("early_dropped", part, Access::WriteMostly)?,
            expired: state.counter("expired", part, Access::WriteMostly)?,
            drops: state.counter_map("drops", part, Access::WriteMostly)?,
        })
    }

    /// The external endpoint the inside endpoint `(address, port, protocol)` is mapped to, if
    /// it has a mapping at this worker.
    pub fn mapping(&self, inside: Endpoint) -> Option<(Ipv4Addr, u16)> {
        self.table.mapping(inside)
    }

    /// Free external ports at this worker, over all addresses (-1 if the store cannot say).
    pub fn pool_free(&self) -> i64 {
        self.table.counts().2
    }

    #[inline]
    fn drop_packet(&self, why: u8) -> Verdict {
        self.drops.add_to_nowait(&why, 1);
        Verdict::Drop(DROP_REASONS[usize::from(why)].0)
    }

    /// Whether `a` is one of the external addresses: outside their span at the cost of two
    /// comparisons (most packets), else by a binary search, not a scan of every address.
    #[inline]
    fn is_external(&self, a: IpAddr) -> bool {
        let IpAddr::V4(a) = a else { return false };
        let a = u32::from(a);
        match (self.external.first(), self.external.last()) {
            (Some(&lo), Some(&hi)) if (lo..=hi).contains(&a) => {
                self.external.binary_search(&a).is_ok()
            }
            _ => false,
        }
    }

    fn outbound(&mut self, pkt: &mut Packet<'_>, flow: FlowKey, now: Nanos) -> Verdict {
        let kind = match Kind::of(pkt) {
            Ok(Some(k)) => k,
            Ok(None) => return self.drop_packet(UNSUPPORTED),
            Err(()) => return self.icmp_error(pkt, Direction::Outbound),
        };
        let found = self
            .table
            .find_out(&flow, kind.flags(), &self.timeouts, now);
        let (ip, port) = match found {
            Err(why) => return self.drop_packet(why),
            Ok(Some(e)) => e,
            // An echo reply belongs to a session opened from outside: none are.
            Ok(None) if kind == (Kind::Echo { request: false }) => {
                return self.drop_packet(NO_MAPPING)
            }
            Ok(None) => {
                let tcp = kind
                    .flags()
                    .map_or(0, |f| tcp_step(0, f, Direction::Outbound));
                match self.open(&flow, tcp, now) {
                    Ok(e) => e,
                    Err(why) => return self.drop_packet(why),
                }
            }
        };
        if kind.closes() {
            self.candidate(flow);
        }
        if self.hairpinning && self.is_external(flow.dst) {
            return self.hairpin(pkt, &flow, kind, (ip, port), now);
        }
        if !rewrite(pkt, Side::Src, ip, port) {
            return self.drop_packet(MALFORMED);
        }
        self.packets_out.add_nowait(1);
        Verdict::Forward
    }

    /// Hairpinning (RFC 4787 REQ-9, RFC 5382 REQ-8): a packet from the inside to an external
    /// endpoint goes back in as if it had come from outside, from the mapping `ext` of its
    /// source (REQ-9b: "External source IP address and port"), filtered as such, and leaves
    /// inbound (the NFs before the NAT see it so). A packet dropped is left as it came.
    fn hairpin(
        &mut self,
        pkt: &mut Packet<'_>,
        flow: &FlowKey,
        kind: Kind,
        (ip, port): (Ipv4Addr, u16),
        now: Nanos,
    ) -> Verdict {
        // The packet as it goes back in: the reverse of the session's reply key.
        let session = super::OutSession {
            ext_ip: ip,
            ext_port: port,
            tcp: 0,
        };
        let back = in_key(flow, &session).reversed();
        let found = match self.find_in(&back, kind, now) {
            Ok(f) => f,
            Err(why) => return self.drop_packet(why),
        };
        if !rewrite(pkt, Side::Src, ip, port) {
            return self.drop_packet(MALFORMED);
        }
        self.packets_out.add_nowait(1);
        let v = self.deliver(pkt, &back, kind, &found);
        if v == Verdict::Forward {
            self.hairpinned.add_nowait(1);
            pkt.direction = Direction::Inbound;
        }
        v
    }

    fn inbound(&mut self, pkt: &mut Packet<'_>, flow: FlowKey, now: Nanos) -> Verdict {
        let kind = match Kind::of(pkt) {
            Ok(Some(kind)) => kind,
            Ok(None) => return self.drop_packet(NO_MAPPING),
            Err(()) => return self.icmp_error(pkt, Direction::Inbound),
        };
        match self.find_in(&flow, kind, now) {
            Ok(found) => self.deliver(pkt, &flow, kind, &found),
            Err(why) => self.drop_packet(why),
        }
    }

    /// The session inbound `flow` answers, or the one filtering lets it open; renewed unless
    /// only outbound packets refresh sessions.
    #[inline]
    fn find_in(&mut self, flow: &FlowKey, kind: Kind, now: Nanos) -> Result<Found<T::Session>, u8> {
        let renew = self.inbound_refresh.then_some((&self.timeouts, now));
        match self.table.find_in(flow, kind.flags(), renew)? {
            Some(f) => Ok(f),
            None => self.admit(flow, kind, now),
        }
    }

    /// Translates inbound `flow`'s destination to the inside endpoint of session `found`.
    #[inline]
    fn deliver(
        &mut self,
        pkt: &mut Packet<'_>,
        flow: &FlowKey,
        kind: Kind,
        found: &Found<T::Session>,
    ) -> Verdict {
        if !rewrite(pkt, Side::Dst, found.inside_ip, found.inside_port) {
            return self.drop_packet(MALFORMED);
        }
        if kind.closes() {
            let inside = super::InSession {
                inside_ip: found.inside_ip,
                inside_port: found.inside_port,
            };
            self.candidate(out_key(flow, &inside));
        }
        self.packets_in.add_nowait(1);
        Verdict::Forward
    }

    /// Filtering (RFC 4787 REQ-8, RFC 5382 REQ-3): whether inbound `flow`, which answers no
    /// session, may open one on the mapping of its destination. Only UDP and a TCP SYN open
    /// sessions from outside; under endpoint-independent filtering any remote may, under
    /// address-dependent filtering one the inside endpoint has a session with.
    /// A forwarded external endpoint (`forward`) admits any remote.
    fn admit(&mut self, flow: &FlowKey, kind: Kind, now: Nanos) -> Result<Found<T::Session>, u8> {
        let opens = match kind {
            Kind::Udp => true,
            Kind::Tcp(f) => f.contains(tcp::Flags::SYN) && !f.contains(tcp::Flags::ACK),
            Kind::Echo { .. } => false,
        };
        let (IpAddr::V4(ext), IpAddr::V4(remote)) = (flow.dst, flow.src) else {
            return Err(MALFORMED);
        };
        let forwarded = self.forwards.inside_of(ext, flow.dst_port, flow.proto);
        if !opens || forwarded.is_none() && self.filtering == Filtering::AddressAndPortDependent {
            return Err(NO_MAPPING);
        }
        let (ip, port) = match forwarded {
            Some(inside) => inside,
            None => self
                .table
                .mapped((ext, flow.dst_port, flow.proto))?
                .ok_or(NO_MAPPING)?,
        };
        if forwarded.is_none()
            && self.filtering == Filtering::AddressDependent
            && !self.table.talks_to((ip, port, flow.proto), remote)?
        {
            return Err(FILTERED);
        }
        let out = FlowKey::new(IpAddr::V4(ip), flow.src, port, flow.src_port, flow.proto);
        let tcp = kind
            .flags()
            .map_or(0, |f| tcp_step(0, f, Direction::Inbound));
        let opened = self.open(&out, tcp, now)?;
        if opened != (ext, flow.dst_port) {
            return Err(STATE_ERROR); // the endpoint's mapping moved under us
        }
        let renew = self.inbound_refresh.then_some((&self.timeouts, now));
        self.table.find_in(flow, None, renew)?.ok_or(STATE_ERROR)
    }

    /// Opens the session of outbound `flow` unless the worker holds its share of
    /// `max_sessions` already.
    fn open(&mut self, flow: &FlowKey, tcp: u8, now: Nanos) -> Result<(Ipv4Addr, u16), u8> {
        if self.table.sessions() >= self.max_sessions && !self.make_room(false, now) {
            self.resource_event(SESSION_LIMIT, flow, now);
            return Err(SESSION_LIMIT);
        }
        let forwarded = match flow.src {
            IpAddr::V4(a) => self.forwards.outside_of(a, flow.src_port, flow.proto),
            IpAddr::V6(_) => None,
        };
        let opened = match self.table.open(flow, tcp, &self.timeouts, now, forwarded) {
            Err(POOL_EXHAUSTED) if self.make_room(true, now) => {
                self.table.open(flow, tcp, &self.timeouts, now, forwarded)
            }
            r => r,
        };
        let (e, fresh) = match opened {
            Ok(o) => o,
            Err(why) => {
                self.resource_event(why, flow, now);
                return Err(why);
            }
        };
        self.translations.add_nowait(1);
        self.candidate(*flow);
        if let Some(ev) = self.events.as_mut() {
            ev.send(session_event(EventKind::SessionCreate, flow, e, now));
            if fresh {
                ev.send(session_event(EventKind::MappingCreate, flow, e, now));
            }
        }
        Ok(e)
    }

    /// The event of a new session refused for lack of a port or over the session limit (at
    /// most one per worker and second).
    #[cold]
    fn resource_event(&mut self, why: u8, flow: &FlowKey, now: Nanos) {
        let Some(ev) = self.events.as_mut() else {
            return;
        };
        let IpAddr::V4(inside) = flow.src else { return };
        let mut e = session_event(
            EventKind::QuotaExceeded,
            flow,
            (Ipv4Addr::UNSPECIFIED, 0),
            now,
        );
        match why {
            POOL_EXHAUSTED => {
                e.kind = EventKind::PortsExhausted;
                let i = super::paired(inside, self.pool_addrs.len());
                e.external.0 = self
                    .pool_addrs
                    .get(i)
                    .copied()
                    .unwrap_or(Ipv4Addr::UNSPECIFIED);
            }
            SESSION_LIMIT => e.limit = self.session_limit,
            _ => return,
        }
        ev.send_limited(e);
    }

    /// Remembers a session that is, or may become, expendable.
    #[inline]
    fn candidate(&mut self, flow: FlowKey) {
        self.candidates.remember(flow);
    }

    /// Early drop: ends the oldest expendable session among the next candidates (one whose
    /// mapping it is the last session of, when a port is `for_port`).
    fn make_room(&mut self, for_port: bool, now: Nanos) -> bool {
        let (table, events) = (&mut self.table, &mut self.events);
        let ended = self.candidates.make_room(|k| {
            let Some(end) = table.early_drop(&k, for_port) else {
                return false;
            };
            if let Some(ev) = events.as_mut() {
                ended_events(ev, &k, end, now);
            }
            true
        });
        if ended {
            self.early_dropped.add_nowait(1);
        }
        ended
    }

    /// Translates a later fragment, its datagram's ports known ([`Fragment::Tracked`]), as the
    /// session of its first fragment was (RFC 4787 REQ-14): the first fragment opened,
    /// renewed and filtered it; a fragment only finds it, and hairpins as its first fragment
    /// did.
    fn fragment(&mut self, pkt: &mut Packet<'_>, flow: FlowKey, dir: Direction) -> Verdict {
        let (side, found) = match dir {
            Direction::Outbound => (Side::Src, self.table.peek_out(&flow)),
            Direction::Inbound => (Side::Dst, self.table.peek_in(&flow)),
        };
        let (ip, port) = match found {
            Err(why) => return self.drop_packet(why),
            Ok(None) => return self.drop_packet(FRAGMENT),
            Ok(Some(e)) => e,
        };
        let hairpin = dir == Direction::Outbound && self.hairpinning && self.is_external(flow.dst);
        let inside = if hairpin {
            let session = super::OutSession {
                ext_ip: ip,
                ext_port: port,
                tcp: 0,
            };
            match self.table.peek_in(&in_key(&flow, &session).reversed()) {
                Err(why) => return self.drop_packet(why),
                Ok(None) => return self.drop_packet(FRAGMENT),
                Ok(Some(e)) => Some(e),
            }
        } else {
            None
        };
        if !rewrite(pkt, side, ip, port) {
            return self.drop_packet(MALFORMED);
        }
        match dir {
            Direction::Outbound => self.packets_out.add_nowait(1),
            Direction::Inbound => self.packets_in.add_nowait(1),
        }
        if let Some((ip, port)) = inside {
            if !rewrite(pkt, Side::Dst, ip, port) {
                return self.drop_packet(MALFORMED);
            }
            self.packets_in.add_nowait(1);
            self.hairpinned.add_nowait(1);
            pkt.direction = Direction::Inbound;
        }
        Verdict::Forward
    }

    /// Translates an ICMP error quoting a packet of a session (RFC 5508 REQ-3, REQ-4). The
    /// session is not refreshed.
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
        // The quoted packet went the other way: its reverse is the session's key.
        let key = inner.reversed();
        let (outer, found) = match dir {
            Direction::Outbound => (Side::Src, self.table.peek_out(&key)),
            Direction::Inbound => {
                // The quote is our translated packet: its source is the outer destination.
                if d.flow.map(|f| f.dst) != Some(inner.src) {
                    return self.drop_packet(ICMP_ERROR);
                }
                (Side::Dst, self.table.peek_in(&key))
            }
        };
        let (addr, port) = match found {
            Err(why) => return self.drop_packet(why),
            Ok(None) => return self.drop_packet(NO_MAPPING),
            Ok(Some(e)) => e,
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
        // The outer address is not covered by the ICMPv4 checksum; the quote is.
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
}

impl<T: NatTable> NetworkFunction for Translator<T> {
    fn name(&self) -> &str {
        NF
    }

    /// Takes a reloaded configuration's timeouts, `refresh`, `hairpinning` and `forward`
    /// ([`super::Factory::reloadable`]); every session and mapping stays.
    fn reconfigure(&mut self, config: &ReloadConfig) {
        let Some(c) = config.downcast_ref::<Config>() else {
            return;
        };
        self.timeouts = Timeouts::new(c);
        self.hairpinning = c.hairpinning;
        self.inbound_refresh = c.refresh == Refresh::Both;
        if c.forward != self.forwards {
            self.table.reforward(&c.forward);
            self.forwards = c.forward.clone();
        }
    }

    /// Prefetches the session `process` looks up first: the outbound entry of an outbound
    /// packet, the reverse entry of an inbound one (keyed by the packet's flow as it arrives).
    #[inline]
    fn prefetch(&mut self, pkt: &Packet<'_>) {
        if let (Network::Ipv4, Some(flow)) = (pkt.dissection.network, pkt.dissection.flow) {
            self.prefetch_flow(&flow, pkt.direction);
        }
    }

    #[inline]
    fn prefetch_flow(&mut self, flow: &FlowKey, direction: Direction) {
        self.table.prefetch(flow, direction);
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
                if self.is_external(flow.src) {
                    return self.drop_packet(EXTERNAL_SOURCE);
                }
                match pkt.dissection.fragment {
                    Fragment::None | Fragment::First => self.outbound(pkt, flow, cx.now),
                    Fragment::Tracked => self.fragment(pkt, flow, Direction::Outbound),
                    Fragment::Later => self.drop_packet(FRAGMENT),
                }
            }
            Direction::Inbound => {
                if !self.is_external(flow.dst) {
                    return self.drop_packet(NOT_EXTERNAL);
                }
                match pkt.dissection.fragment {
                    Fragment::None | Fragment::First => self.inbound(pkt, flow, cx.now),
                    Fragment::Tracked => self.fragment(pkt, flow, Direction::Inbound),
                    Fragment::Later => self.drop_packet(FRAGMENT),
                }
            }
        }
    }

    /// Outbound: the session of the inside flow, renewed; the source becomes the external
    /// endpoint. Inbound: the session the flow answers, renewed under `refresh = "both"`;
    /// the destination becomes the inside endpoint. A hairpinned flow, or one `process`
    /// would drop, is not the cache's (`false`). TCP and UDP only: what a flow cache holds.
    fn active_until(&mut self, flow: &mut FlowKey, direction: Direction, until: Nanos) -> bool {
        if !matches!(flow.proto, proto::TCP | proto::UDP)
            || !matches!((flow.src, flow.dst), (IpAddr::V4(_), IpAddr::V4(_)))
        {
            return false;
        }
        match direction {
            Direction::Outbound => {
                if self.is_external(flow.src) || (self.hairpinning && self.is_external(flow.dst)) {
                    return false;
                }
                match self.table.extend_out(flow, &self.timeouts, until) {
                    Ok(Some((ip, port))) => {
                        (flow.src, flow.src_port) = (IpAddr::V4(ip), port);
                        true
                    }
                    _ => false,
                }
            }
            Direction::Inbound => {
                if !self.is_external(flow.dst) {
                    return false;
                }
                let extend = self.inbound_refresh.then_some((&self.timeouts, until));
                match self.table.extend_in(flow, extend) {
                    Ok(Some((ip, port))) => {
                        (flow.dst, flow.dst_port) = (IpAddr::V4(ip), port);
                        true
                    }
                    _ => false,
                }
            }
        }
    }

    fn on_tick(&mut self, now: Nanos) {
        let mut ended = 0;
        let events = &mut self.events;
        self.table.expire(now, &mut |k, end| {
            ended += 1;
            if let Some(ev) = events.as_mut() {
                ended_events(ev, k, end, now);
            }
        });
        if ended > 0 {
            self.expired.add_nowait(ended);
        }
        if let Some(ev) = self.events.as_mut() {
            ev.flush();
        }
    }

    fn entries(&self) -> u64 {
        // Not `counts`: a pool's free ports may be a round trip to the store.
        self.table.sessions() as u64
    }

    /// `forwards`: every rule with the sessions this worker holds on it.
    fn list(&self, table: &str, now: Nanos, out: &mut Vec<Row>) {
        if table != "forwards" {
            return self.table.list(table, now, out);
        }
        let mut sessions = Vec::new();
        self.table.list("sessions", now, &mut sessions);
        out.extend(super::forward_rows(self.forwards.rules(), &sessions));
    }

    fn report(&self) -> Vec<(&'static str, i64)> {
        let (sessions, mappings, free) = self.table.counts();
        let mut r = vec![
            ("active_mappings", mappings),
            ("active_sessions", sessions),
            ("translations", self.translations.get().unwrap_or(-1)),
            ("packets_out", self.packets_out.get().unwrap_or(-1)),
            ("packets_in", self.packets_in.get().unwrap_or(-1)),
            ("hairpinned", self.hairpinned.get().unwrap_or(-1)),
            ("early_drops", self.early_dropped.get().unwrap_or(-1)),
            ("expired_sessions", self.expired.get().unwrap_or(-1)),
            ("pool_free", free),
            ("session_limit", self.max_sessions as i64),
        ];
        for (i, (_, name)) in DROP_REASONS.iter().enumerate() {
            r.push((name, self.drops.get(&(i as u8)).unwrap_or(-1)));
        }
        if let Some(ev) = self.events.as_ref().filter(|e| e.logs()) {
            r.push(("events_lost", ev.lost as i64));
        }
        r
    }

    fn gauges(&self) -> &'static [&'static str] {
        &[
            "active_mappings",
            "active_sessions",
            "pool_free",
            "session_limit",
        ]
    }
}

/// The event `kind` of the session of outbound `flow` on external endpoint `ext`.
#[inline]
fn session_event(kind: EventKind, flow: &FlowKey, ext: (Ipv4Addr, u16), now: Nanos) -> Event {
    let v4 = |a: IpAddr| match a {
        IpAddr::V4(a) => a,
        IpAddr::V6(_) => Ipv4Addr::UNSPECIFIED,
    };
    Event {
        kind,
        at: now,
        proto: flow.proto,
        inside: (v4(flow.src), flow.src_port),
        remote: (v4(flow.dst), flow.dst_port),
        external: ext,
        limit: 0,
    }
}

/// The events of a session that ended: its own, and its mapping's when that ended with it.
fn ended_events(ev: &mut WorkerEvents, k: &FlowKey, end: Ended, now: Nanos) {
    ev.send(session_event(EventKind::SessionDelete, k, end.ext, now));
    if end.mapping {
        ev.send(session_event(EventKind::MappingDelete, k, end.ext, now));
    }
}
