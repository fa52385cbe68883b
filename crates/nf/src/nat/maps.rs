//! The NAT's table on the state API (`table = "state"`, the default): maps and lists a store
//! holds, so sessions survive a worker's restart and move with their partition.

use super::pool::Share;
use super::translate::{Ended, Found, NatTable, Timeouts};
use super::{
    expendable, in_key, mapping_row, out_key, session_row, step_in, tcp_step, Config, Endpoint,
    Filtering, Forwards, InSession, Mapping, OutSession, MALFORMED, NF, POOL_EXHAUSTED,
    STATE_ERROR,
};
use crate::listing::{Cell, Row};
use crate::{BuildError, Direction, Placement};
use flowstate_state::{Access, Declare, Field, List, Map, Nanos, Scope, Value};
use flowstate_wire::flow::proto;
use flowstate_wire::{tcp, FlowKey};
use std::fmt;
use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

/// An inside endpoint and a remote address it has sessions with (address-dependent
/// filtering).
type Peer = (Ipv4Addr, u16, u8, Ipv4Addr);

/// One worker's NAT table on the state API (see the state table in [`super`]'s docs).
pub struct FlowTables {
    filtering: Filtering,
    out: Map<FlowKey, OutSession>,
    inb: Map<FlowKey, InSession>,
    eim: Map<Endpoint, Mapping>,
    /// External endpoint → inside endpoint of every pool port's mapping.
    ext: Map<Endpoint, (Ipv4Addr, u16)>,
    /// Sessions per inside endpoint and remote address (kept under address-dependent
    /// filtering only).
    peers: Map<Peer, u32>,
    /// Free-port lists per external address, in configuration order: even and odd ports
    /// with `port_parity`, else all in the first.
    pools: Vec<(Ipv4Addr, [List<u16>; 2])>,
    /// What the pools may hold.
    share: Share,
    /// The fingerprint of the share the pools were filled for.
    pool_init: Value<u32>,
}

impl fmt::Debug for FlowTables {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FlowTables")
            .field(
                "external",
                &self.pools.iter().map(|(a, _)| *a).collect::<Vec<_>>(),
            )
            .field("sessions", &self.out.cached_len())
            .finish()
    }
}

impl FlowTables {
    /// Declares the table's state for `worker` and fills its port pools, unless the store
    /// holds pools filled for the same configuration.
    pub(super) fn new(
        config: &Config,
        state: &mut Declare<'_>,
        worker: Placement,
    ) -> Result<FlowTables, BuildError> {
        let part = Scope::CrossFlow(&[]);
        let mut pools = Vec::with_capacity(config.external.len());
        for a in &config.external {
            pools.push((
                *a,
                [
                    state.list::<u16>(&format!("pool.{a}"), part, Access::ReadWrite)?,
                    state.list::<u16>(&format!("pool.{a}.odd"), part, Access::ReadWrite)?,
                ],
            ));
        }
        let by_endpoint = Scope::CrossFlow(&[Field::SrcIp, Field::SrcPort, Field::Proto]);
        let t = FlowTables {
            filtering: config.filtering,
            out: state.map("out", Scope::PerFlow, Access::ReadMostly)?,
            inb: state.map("in", Scope::PerFlow, Access::ReadMostly)?,
            eim: state.map("eim", by_endpoint, Access::ReadWrite)?,
            ext: state.map(
                "ext",
                Scope::CrossFlow(&[Field::DstIp, Field::DstPort, Field::Proto]),
                Access::ReadMostly,
            )?,
            peers: state.map("peers", by_endpoint, Access::ReadWrite)?,
            pools,
            share: Share::new(config, worker),
            pool_init: state.value("pool_init", part, Access::ReadWrite)?,
        };
        let print = t.share.fingerprint();
        match t.pool_init.get()? {
            None => {
                for (a, p) in t.share.endpoints() {
                    if let Some((_, pools)) = t.pools.iter().find(|(x, _)| *x == a) {
                        pools[t.share.list_of(p)].push_nowait(p);
                    }
                }
                t.pool_init.set_nowait(print);
            }
            Some(p) if p == print => {} // a restarted worker: the store holds its pools
            Some(_) => {
                return Err(super::config_error(
                    "ports",
                    "the store holds port pools of this worker built for other external \
                     addresses, ports or worker count; clear the NAT's state first",
                ))
            }
        }
        Ok(t)
    }

    /// The pools of the external address paired with `inside` (RFC 4787 REQ-2).
    #[inline]
    fn paired(&self, inside: Ipv4Addr) -> &(Ipv4Addr, [List<u16>; 2]) {
        let i = super::paired(inside, self.pools.len());
        &self.pools[i]
    }

    /// The pool list of external `(a, p)`.
    fn pool_of(&self, a: Ipv4Addr, p: u16) -> Option<&List<u16>> {
        let (_, lists) = self.pools.iter().find(|(x, _)| *x == a)?;
        Some(&lists[self.share.list_of(p)])
    }

    /// Whether a mapping holds external `(a, p)`: a forwarding's of `old`, or a pool port's
    /// (of any protocol: a pool port is free for all). A store that cannot say holds it.
    fn held(&self, old: &Forwards, a: Ipv4Addr, p: u16) -> bool {
        let forwarded = [proto::TCP, proto::UDP].into_iter().any(|x| {
            old.inside_of(a, p, x)
                .is_some_and(|(i, ip)| match self.eim.get(&(i, ip, x)) {
                    Ok(Some(m)) => (m.ext_ip, m.ext_port) == (a, p),
                    Ok(None) => false,
                    Err(_) => true,
                })
        });
        forwarded
            || [proto::TCP, proto::UDP, proto::ICMP]
                .into_iter()
                .any(|x| !matches!(self.ext.get(&(a, p, x)), Ok(None)))
    }

    /// A free port of the paired address for inside port `port`: of its parity first.
    fn take(&self, inside: Ipv4Addr, port: u16) -> Result<(Ipv4Addr, u16), u8> {
        let (ip, pools) = self.paired(inside);
        let want = self.share.list_of(port);
        for l in [want, 1 - want] {
            if let Some(p) = pools[l].pop().map_err(|_| STATE_ERROR)? {
                return Ok((*ip, p));
            }
        }
        Err(POOL_EXHAUSTED)
    }

    /// Refreshes both entries of a session with the same timeout.
    #[inline]
    fn refresh(&self, out: &FlowKey, inb: &FlowKey, ttl: Duration, now: Nanos) {
        self.out.expire_after(out, ttl, now);
        self.inb.expire_after(inb, ttl, now);
    }

    fn peer(out: &FlowKey) -> Option<Peer> {
        match (out.src, out.dst) {
            (IpAddr::V4(i), IpAddr::V4(r)) => Some((i, out.src_port, out.proto, r)),
            _ => None,
        }
    }

    /// Ends a session: removes its `in` entry and releases its mapping, returning the port to
    /// the pool when it was the mapping's last session.
    fn release(&self, out_key: &FlowKey, s: &OutSession) -> Ended {
        let ended = |mapping| Ended {
            ext: (s.ext_ip, s.ext_port),
            mapping,
        };
        self.inb.remove_nowait(&in_key(out_key, s));
        if self.filtering == Filtering::AddressDependent {
            if let Some(p) = Self::peer(out_key) {
                let last = self.peers.with_mut(&p, |n| match n {
                    Some(n) => {
                        *n = n.saturating_sub(1);
                        *n == 0
                    }
                    None => false,
                });
                if let Ok(true) = last {
                    self.peers.remove_nowait(&p);
                }
            }
        }
        let IpAddr::V4(inside) = out_key.src else {
            return ended(false);
        };
        let ep: Endpoint = (inside, out_key.src_port, out_key.proto);
        // Whether it was the last session of its mapping, and the mapping a forwarding's.
        let last = self.eim.with_mut(&ep, |m| match m {
            Some(m) if m.forwarded || (m.ext_ip, m.ext_port) == (s.ext_ip, s.ext_port) => {
                m.sessions = m.sessions.saturating_sub(1);
                (m.sessions == 0).then_some(m.forwarded)
            }
            _ => None,
        });
        let Ok(Some(forwarded)) = last else {
            return ended(false);
        };
        self.eim.remove_nowait(&ep);
        if !forwarded {
            self.ext
                .remove_nowait(&(s.ext_ip, s.ext_port, out_key.proto));
        }
        if let Some(l) = self
            .pool_of(s.ext_ip, s.ext_port)
            .filter(|_| self.share.holds(s.ext_ip, s.ext_port))
        {
            l.push_nowait(s.ext_port);
        }
        ended(true)
    }
}

impl NatTable for FlowTables {
    type Session = ();

    #[inline]
    fn prefetch(&mut self, flow: &FlowKey, dir: Direction) {
        match dir {
            Direction::Outbound => self.out.prefetch(flow),
            Direction::Inbound => self.inb.prefetch(flow),
        }
    }

    #[inline]
    fn find_out(
        &mut self,
        flow: &FlowKey,
        flags: Option<tcp::Flags>,
        timeouts: &Timeouts,
        now: Nanos,
    ) -> Result<Option<(Ipv4Addr, u16)>, u8> {
        // One lookup finds the session, steps its TCP state and renews it. The reverse entry
        // is not renewed here: that would be a second, unprefetchable lookup per packet. It
        // is renewed lazily when its timer fires (`expire`).
        self.out
            .renew_with(flow, now, |s| {
                if let Some(f) = flags {
                    s.tcp = tcp_step(s.tcp, f, Direction::Outbound);
                }
                (timeouts.of(flow.proto, s.tcp), (s.ext_ip, s.ext_port))
            })
            .map_err(|_| STATE_ERROR)
    }

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
        let ep: Endpoint = (inside, flow.src_port, flow.proto);
        let known = self.eim.with_mut(&ep, |m| {
            m.map(|m| {
                m.sessions = m.sessions.saturating_add(1);
                (m.ext_ip, m.ext_port)
            })
        });
        let fresh = matches!(known, Ok(None));
        let (ext_ip, ext_port) = match known {
            Err(_) => return Err(STATE_ERROR),
            Ok(Some(e)) => e,
            Ok(None) => {
                let (ip, port) = match forwarded {
                    Some(e) => e,
                    None => self.take(inside, flow.src_port)?,
                };
                self.eim.insert_nowait(
                    ep,
                    Mapping {
                        ext_ip: ip,
                        ext_port: port,
                        sessions: 1,
                        forwarded: forwarded.is_some(),
                    },
                );
                if forwarded.is_none() {
                    self.ext
                        .insert_nowait((ip, port, flow.proto), (inside, flow.src_port));
                }
                (ip, port)
            }
        };
        if self.filtering == Filtering::AddressDependent {
            if let Some(p) = Self::peer(flow) {
                let known = self
                    .peers
                    .with_mut(&p, |n| n.map(|n| *n = n.saturating_add(1)).is_some());
                if !known.map_err(|_| STATE_ERROR)? {
                    self.peers.insert_nowait(p, 1);
                }
            }
        }
        let s = OutSession {
            ext_ip,
            ext_port,
            tcp,
        };
        let reverse = in_key(flow, &s);
        self.inb.insert_nowait(
            reverse,
            InSession {
                inside_ip: inside,
                inside_port: flow.src_port,
            },
        );
        self.out.insert_nowait(*flow, s);
        self.refresh(flow, &reverse, timeouts.of(flow.proto, tcp), now);
        Ok(((ext_ip, ext_port), fresh))
    }

    fn find_in(
        &mut self,
        flow: &FlowKey,
        flags: Option<tcp::Flags>,
        renew: Option<(&Timeouts, Nanos)>,
    ) -> Result<Option<Found<()>>, u8> {
        let s = match self.inb.get(flow) {
            Err(_) => return Err(STATE_ERROR),
            Ok(None) => return Ok(None),
            Ok(Some(s)) => s,
        };
        let ok = out_key(flow, &s);
        // One lookup of the session steps its TCP state and, asked to, renews it.
        let tcp = match renew {
            Some((timeouts, now)) => self.out.renew_with(&ok, now, |o| {
                o.tcp = step_in(o.tcp, flags);
                (timeouts.of(ok.proto, o.tcp), o.tcp)
            }),
            // A change only: on a remote store every changed entry is written out.
            None => self.out.with(&ok, |o| o.map(|o| o.tcp)).and_then(|tcp| {
                let Some(tcp) = tcp else { return Ok(None) };
                let t = step_in(tcp, flags);
                if t != tcp {
                    self.out.with_mut(&ok, |e| e.map(|e| e.tcp = t))?;
                }
                Ok(Some(t))
            }),
        };
        match tcp {
            Err(_) => Err(STATE_ERROR),
            Ok(None) => Ok(None),
            Ok(Some(tcp)) => Ok(Some(Found {
                inside_ip: s.inside_ip,
                inside_port: s.inside_port,
                tcp,
                session: (),
            })),
        }
    }

    fn extend_out(
        &mut self,
        flow: &FlowKey,
        timeouts: &Timeouts,
        until: Nanos,
    ) -> Result<Option<(Ipv4Addr, u16)>, u8> {
        self.out
            .extend_with(flow, until, |s| {
                (timeouts.of(flow.proto, s.tcp), (s.ext_ip, s.ext_port))
            })
            .map_err(|_| STATE_ERROR)
    }

    fn extend_in(
        &mut self,
        flow: &FlowKey,
        extend: Option<(&Timeouts, Nanos)>,
    ) -> Result<Option<(Ipv4Addr, u16)>, u8> {
        let Some(s) = self.inb.get(flow).map_err(|_| STATE_ERROR)? else {
            return Ok(None);
        };
        let ok = out_key(flow, &s);
        let found = match extend {
            Some((timeouts, until)) => self
                .out
                .extend_with(&ok, until, |o| (timeouts.of(ok.proto, o.tcp), ())),
            None => self.out.with(&ok, |o| o.map(|_| ())),
        };
        match found {
            Err(_) => Err(STATE_ERROR),
            Ok(None) => Ok(None),
            Ok(Some(())) => Ok(Some((s.inside_ip, s.inside_port))),
        }
    }

    fn peek_out(&self, flow: &FlowKey) -> Result<Option<(Ipv4Addr, u16)>, u8> {
        self.out
            .get(flow)
            .map(|s| s.map(|s| (s.ext_ip, s.ext_port)))
            .map_err(|_| STATE_ERROR)
    }

    fn peek_in(&self, flow: &FlowKey) -> Result<Option<(Ipv4Addr, u16)>, u8> {
        self.inb
            .get(flow)
            .map(|s| s.map(|s| (s.inside_ip, s.inside_port)))
            .map_err(|_| STATE_ERROR)
    }

    fn mapped(&self, ext: Endpoint) -> Result<Option<(Ipv4Addr, u16)>, u8> {
        self.ext.get(&ext).map_err(|_| STATE_ERROR)
    }

    fn talks_to(&self, (ip, port, proto): Endpoint, remote: Ipv4Addr) -> Result<bool, u8> {
        self.peers
            .get(&(ip, port, proto, remote))
            .map(|n| n.is_some_and(|n| n > 0))
            .map_err(|_| STATE_ERROR)
    }

    fn expire(&mut self, now: Nanos, ended: &mut dyn FnMut(&FlowKey, Ended)) {
        self.out.expire(now, |k, s| {
            ended(&k, self.release(&k, &s));
        });
        // Outbound packets renew only the `out` entry, so an `in` entry can come due while its
        // session lives on: it then takes the `out` entry's time again. Otherwise its session
        // ended above (release removed it) or its `out` entry went some other way: end it.
        self.inb.expire(now, |k, s| {
            let ok = out_key(&k, &s);
            match self.out.deadline(&ok) {
                Some(until) if until > now => {
                    self.inb.insert_nowait(k, s);
                    self.inb
                        .expire_after(&k, Duration::from_nanos(until - now), now);
                }
                _ => {
                    if let Some(o) = self.out.remove_nowait(&ok) {
                        ended(&ok, self.release(&ok, &o));
                    }
                }
            }
        });
    }

    fn reforward(&mut self, forwards: &Forwards) {
        let r = self.share.reforward(forwards);
        for (a, lists) in &self.pools {
            if !r.reserved.iter().any(|(x, _)| x == a) {
                continue;
            }
            for l in lists {
                // The list again, in its order, without the newly reserved ports.
                let mut kept = Vec::new();
                loop {
                    match l.pop() {
                        Ok(Some(p)) if r.reserved.contains(&(*a, p)) => {}
                        Ok(Some(p)) => kept.push(p),
                        Ok(None) => break,
                        Err(e) => {
                            tracing::warn!(nf = NF, "reload: a port pool was left as it was: {e}");
                            break;
                        }
                    }
                }
                for p in kept {
                    l.push_nowait(p);
                }
            }
        }
        for &(a, p) in &r.freed {
            if !self.held(&r.old, a, p) {
                if let Some(l) = self.pool_of(a, p) {
                    l.push_nowait(p);
                }
            }
        }
        self.pool_init.set_nowait(self.share.fingerprint());
        for (inside, ext) in forwards.endpoints() {
            let was = self.eim.with_mut(&inside, |m| match m {
                Some(m) if (m.ext_ip, m.ext_port) != ext => {
                    let was = (m.ext_ip, m.ext_port, m.forwarded);
                    (m.ext_ip, m.ext_port, m.forwarded) = (ext.0, ext.1, true);
                    Some(was)
                }
                _ => None,
            });
            if let Ok(Some((ip, port, false))) = was {
                self.ext.remove_nowait(&(ip, port, inside.2));
            }
        }
    }

    fn mapping(&self, inside: Endpoint) -> Option<(Ipv4Addr, u16)> {
        self.eim
            .get(&inside)
            .ok()
            .flatten()
            .map(|m| (m.ext_ip, m.ext_port))
    }

    fn counts(&self) -> (i64, i64, i64) {
        let mut free = 0;
        for p in self.pools.iter().flat_map(|(_, p)| p) {
            match p.len() {
                Ok(l) => free += l as i64,
                Err(_) => {
                    free = -1;
                    break;
                }
            }
        }
        (
            self.out.cached_len() as i64,
            self.eim.cached_len() as i64,
            free,
        )
    }

    fn sessions(&self) -> usize {
        self.out.cached_len()
    }

    fn early_drop(&mut self, flow: &FlowKey, for_port: bool) -> Option<Ended> {
        let s = self.out.get(flow).ok()??;
        if !expendable(s.tcp) {
            return None;
        }
        if for_port {
            let IpAddr::V4(inside) = flow.src else {
                return None;
            };
            let last = self.eim.get(&(inside, flow.src_port, flow.proto));
            if !matches!(last, Ok(Some(m)) if m.sessions <= 1) {
                return None;
            }
        }
        self.out.remove_nowait(flow)?;
        Some(self.release(flow, &s))
    }

    fn list(&self, table: &str, now: Nanos, out: &mut Vec<Row>) {
        match table {
            "sessions" => self.out.for_each_timed(|k, s, deadline| {
                let left = Cell::timeout(deadline, now);
                out.push(session_row(k, s.ext_ip, s.ext_port, s.tcp, left));
            }),
            "mappings" => self.eim.for_each(|e, m| out.push(mapping_row(*e, m))),
            _ => {}
        }
    }
}
