//! The root's steering table and its side of the move protocol (CHC §5.1), sans-IO: the
//! assignment, control frames and the time go in; routes and control frames come out.
//!
//! A partition is **steady** (its packets go to its owner, stamped with the owner's epoch) or
//! **moving**. A move from a live old owner goes in three steps, each a control frame on the
//! same path as the data:
//! 1. *Release*: the root stops sending the partition to the old owner and sends it
//!    [`Kind::Release`] behind the partition's last packet; from now on it holds the
//!    partition's packets, in arrival order.
//! 2. *Claim*: when the old owner answers [`Kind::Released`] (it has processed every packet
//!    before the release, sent their output, and its state is in the store), the root sends
//!    the new owner [`Kind::Claim`] with the new epoch.
//! 3. *Ready*: the new owner took the partition's ownership record in the store; the root
//!    sends it the held packets in order and the partition is steady again.
//!
//! No packet is lost (held packets wait, up to `hold` per partition) and none is reordered
//! (the old owner's output precedes its `Released` on the same path; the held packets go
//! before any newer one). When the old owner is dead (failover, StatelessNF §4.2) or does not
//! answer within `move_timeout`, the root claims at once: what the old owner had not
//! processed is lost as it would be in any crash, and counted.

use crate::config::Fresh;
use crate::meta::Kind;
use flowstate_control::cluster::Assignment;
use flowstate_nf::Direction;
use flowstate_state::Nanos;
use std::collections::VecDeque;
use std::net::SocketAddrV4;

/// Settings of the steering table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SteerConfig {
    /// How long the root waits for a `Released` or a `Ready` before it gives up on the old
    /// owner or asks the new one again.
    pub move_timeout: Nanos,
    /// Packets held per moving partition; beyond, new ones are dropped (and counted).
    pub hold: usize,
}

impl Default for SteerConfig {
    fn default() -> Self {
        SteerConfig {
            move_timeout: 500_000_000,
            hold: 4096,
        }
    }
}

/// A packet held while its partition moves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Held {
    /// The Ethernet frame.
    pub frame: Vec<u8>,
    /// Where it entered.
    pub direction: Direction,
    /// Its logical clock.
    pub clock: u64,
}

/// Where a packet goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Route {
    /// To this instance, stamped with this epoch.
    Send {
        /// The owner's data address.
        to: SocketAddrV4,
        /// The owner's epoch.
        epoch: u32,
    },
    /// Held: the partition is moving.
    Hold,
    /// Nobody owns the partition (no instance is live): dropped.
    NoOwner,
}

/// A control frame for the caller to send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Control {
    /// The instance's data address.
    pub to: SocketAddrV4,
    /// Release or Claim.
    pub kind: Kind,
    /// The partition.
    pub partition: u16,
    /// The epoch it is about.
    pub epoch: u32,
}

/// Counters of the steering table.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct SteerStats {
    /// Moves started (owner changes; a partition's first claim is none).
    pub moves: u64,
    /// Moves finished (the new owner is ready).
    pub moves_done: u64,
    /// Moves whose old owner did not answer in time.
    pub release_timeouts: u64,
    /// Packets held during moves.
    pub held: u64,
    /// Held packets sent on to the new owner.
    pub released: u64,
    /// Packets dropped because a moving partition's hold was full.
    pub hold_dropped: u64,
    /// Packets dropped because nobody owned their partition.
    pub no_owner: u64,
}

impl std::ops::AddAssign for SteerStats {
    fn add_assign(&mut self, o: SteerStats) {
        self.moves += o.moves;
        self.moves_done += o.moves_done;
        self.release_timeouts += o.release_timeouts;
        self.held += o.held;
        self.released += o.released;
        self.hold_dropped += o.hold_dropped;
        self.no_owner += o.no_owner;
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Steady,
    Releasing { from: u32, from_epoch: u32 },
    Claiming,
}

#[derive(Debug)]
struct Slot {
    owner: Option<u32>,
    epoch: u32,
    phase: Phase,
    /// When the current step began.
    since: Nanos,
    /// When the move began.
    started: Nanos,
    /// Whether the owner changes (not a first claim).
    is_move: bool,
    held: VecDeque<Held>,
}

#[derive(Debug, Clone, Copy)]
struct Member {
    id: u32,
    addr: SocketAddrV4,
    live: bool,
}

/// The root's steering table. See the module documentation.
#[derive(Debug)]
pub(crate) struct Steer {
    config: SteerConfig,
    slots: Vec<Slot>,
    members: Vec<Member>,
    version: u64,
    /// The term of the controller whose assignment was applied last.
    term: u64,
    stats: SteerStats,
    /// Durations of finished moves, ns (the newest 4096).
    move_times: VecDeque<Nanos>,
    /// Frame buffers of released packets, to hold later ones without allocating.
    spare: Vec<Vec<u8>>,
}

impl Steer {
    /// A table of `partitions` partitions, none owned yet.
    pub(crate) fn new(partitions: u32, config: SteerConfig) -> Steer {
        Steer {
            config,
            slots: (0..partitions)
                .map(|_| Slot {
                    owner: None,
                    epoch: 0,
                    phase: Phase::Steady,
                    since: 0,
                    started: 0,
                    is_move: false,
                    held: VecDeque::new(),
                })
                .collect(),
            members: Vec::new(),
            version: 0,
            term: 0,
            stats: SteerStats::default(),
            move_times: VecDeque::new(),
            spare: Vec::new(),
        }
    }

    /// The newest assignment version applied.
    pub(crate) fn version(&self) -> u64 {
        self.version
    }

    /// The term of the controller that published it.
    pub(crate) fn term(&self) -> u64 {
        self.term
    }

    /// The counters.
    pub(crate) fn stats(&self) -> SteerStats {
        self.stats
    }

    /// Durations of the finished moves (the newest 4096), ns.
    pub(crate) fn move_times(&self) -> impl Iterator<Item = Nanos> + '_ {
        self.move_times.iter().copied()
    }

    /// Partitions moving now.
    pub(crate) fn moving(&self) -> usize {
        self.slots
            .iter()
            .filter(|s| s.phase != Phase::Steady)
            .count()
    }

    /// The partitions of the stage.
    pub(crate) fn partitions(&self) -> u32 {
        self.slots.len() as u32
    }

    /// The owner and epoch of partition `p`.
    pub(crate) fn owner(&self, p: u32) -> Option<(u32, u32)> {
        let s = self.slots.get(p as usize)?;
        s.owner.map(|o| (o, s.epoch))
    }

    fn addr(&self, id: u32) -> Option<SocketAddrV4> {
        self.members.iter().find(|m| m.id == id).map(|m| m.addr)
    }

    fn live(&self, id: u32) -> bool {
        self.members.iter().any(|m| m.id == id && m.live)
    }

    /// Whether instance `id` is listed by the assignment applied (live, draining or dead: a
    /// dead member's late output is still the log's to judge by epoch).
    pub(crate) fn is_member(&self, id: u32) -> bool {
        self.members.iter().any(|m| m.id == id)
    }

    /// The member whose published address is `addr`.
    pub(crate) fn member_at(&self, addr: SocketAddrV4) -> Option<u32> {
        self.members.iter().find(|m| m.addr == addr).map(|m| m.id)
    }

    /// Applies a newer assignment (an older or equal version is ignored): starts a move for
    /// every partition whose owner changed.
    pub(crate) fn apply(&mut self, a: &Assignment, now: Nanos, out: &mut Vec<Control>) {
        match crate::config::freshness(self.term, self.version, a) {
            Fresh::Newer => {}
            Fresh::Old => return,
            Fresh::FarAhead => {
                tracing::warn!(
                    have = self.version,
                    got = a.version,
                    term = a.term,
                    "an assignment far ahead of the one applied is refused, not adopted"
                );
                return;
            }
        }
        self.version = a.version;
        self.term = a.term;
        self.members = a
            .members
            .iter()
            .map(|m| Member {
                id: m.id,
                addr: m.addr,
                live: m.live,
            })
            .collect();
        for (p, new) in a.slots.iter().enumerate().take(self.slots.len()) {
            let (owner, epoch, phase) = {
                let s = &self.slots[p];
                (s.owner, s.epoch, s.phase)
            };
            if new.epoch < epoch || (new.epoch == epoch && new.owner == owner) {
                // Nothing new; but a release waiting on an owner now known dead is over.
                if let Phase::Releasing { from, .. } = phase {
                    if !self.live(from) {
                        self.claim(p, now, out);
                    }
                }
                continue;
            }
            let Some(to) = new.owner else {
                let s = &mut self.slots[p];
                s.owner = None;
                s.epoch = new.epoch;
                s.phase = Phase::Steady;
                self.stats.no_owner += s.held.len() as u64;
                s.held.clear();
                continue;
            };
            {
                let s = &mut self.slots[p];
                s.owner = Some(to);
                s.epoch = new.epoch;
            }
            match phase {
                Phase::Steady => {
                    self.stats.moves += u64::from(owner.is_some());
                    self.slots[p].started = now;
                    self.slots[p].is_move = owner.is_some();
                    match owner {
                        Some(from) if from != to && self.live(from) => {
                            if let Some(addr) = self.addr(from) {
                                let s = &mut self.slots[p];
                                s.phase = Phase::Releasing {
                                    from,
                                    from_epoch: epoch,
                                };
                                s.since = now;
                                out.push(Control {
                                    to: addr,
                                    kind: Kind::Release,
                                    partition: p as u16,
                                    epoch,
                                });
                                continue;
                            }
                            self.claim(p, now, out);
                        }
                        _ => self.claim(p, now, out),
                    }
                }
                Phase::Releasing { from, .. } if self.live(from) => {} // the claim follows the release
                Phase::Releasing { .. } | Phase::Claiming => self.claim(p, now, out),
            }
        }
    }

    /// Sends partition `p`'s claim to its owner.
    fn claim(&mut self, p: usize, now: Nanos, out: &mut Vec<Control>) {
        let s = &mut self.slots[p];
        s.phase = Phase::Claiming;
        s.since = now;
        let (owner, epoch) = (s.owner, s.epoch);
        if let Some(to) = owner.and_then(|o| self.addr(o)) {
            out.push(Control {
                to,
                kind: Kind::Claim,
                partition: p as u16,
                epoch,
            });
        }
    }

    /// Where a packet of partition `p` goes now. Before the first assignment (a root that
    /// just started, or replaced a failed one: CHC §5.4) packets are held until their
    /// partition's owner is known and ready.
    #[inline]
    pub(crate) fn route(&self, p: u32) -> Route {
        let Some(s) = self.slots.get(p as usize) else {
            return Route::NoOwner;
        };
        if self.version == 0 {
            return Route::Hold;
        }
        match (s.phase, s.owner) {
            (Phase::Steady, Some(o)) => match self.addr(o) {
                Some(to) => Route::Send { to, epoch: s.epoch },
                None => Route::NoOwner,
            },
            (Phase::Steady, None) => Route::NoOwner,
            _ => Route::Hold,
        }
    }

    /// Holds a packet of moving partition `p`; false (and counted) when its hold is full.
    pub(crate) fn hold(&mut self, p: u32, frame: &[u8], direction: Direction, clock: u64) -> bool {
        let Some(s) = self.slots.get_mut(p as usize) else {
            return false;
        };
        if s.held.len() >= self.config.hold {
            self.stats.hold_dropped += 1;
            return false;
        }
        let mut buf = self.spare.pop().unwrap_or_default();
        buf.clear();
        buf.extend_from_slice(frame);
        s.held.push_back(Held {
            frame: buf,
            direction,
            clock,
        });
        self.stats.held += 1;
        true
    }

    /// Counts a packet dropped for want of an owner.
    pub(crate) fn count_no_owner(&mut self) {
        self.stats.no_owner += 1;
    }

    /// A control frame from instance `from`. When a partition becomes steady again, returns
    /// its new owner's address and epoch with the held packets, to send in this order (give
    /// the buffers back with [`Steer::recycle`]).
    pub(crate) fn on_control(
        &mut self,
        from: u32,
        kind: Kind,
        partition: u16,
        epoch: u32,
        now: Nanos,
        out: &mut Vec<Control>,
    ) -> Option<(SocketAddrV4, u32, VecDeque<Held>)> {
        let p = usize::from(partition);
        let s = self.slots.get_mut(p)?;
        match (kind, s.phase) {
            (
                Kind::Released,
                Phase::Releasing {
                    from: f,
                    from_epoch,
                },
            ) if f == from && from_epoch == epoch => {
                self.claim(p, now, out);
                None
            }
            (Kind::Ready, Phase::Claiming) if s.owner == Some(from) && s.epoch == epoch => {
                s.phase = Phase::Steady;
                let held = std::mem::take(&mut s.held);
                self.stats.released += held.len() as u64;
                if s.is_move {
                    self.stats.moves_done += 1;
                    if self.move_times.len() == 4096 {
                        self.move_times.pop_front();
                    }
                    self.move_times.push_back(now.saturating_sub(s.started));
                    tracing::debug!(
                        partition,
                        epoch,
                        move_us = now.saturating_sub(s.started) / 1000,
                        claim_us = now.saturating_sub(s.since) / 1000,
                        held = held.len(),
                        "moved"
                    );
                }
                let to = self.addr(from)?;
                Some((to, epoch, held))
            }
            (Kind::Refused, _) => {
                tracing::warn!(
                    partition,
                    epoch,
                    from,
                    "claim refused: waiting for a newer assignment"
                );
                None
            }
            _ => None, // late or duplicate: the move went on without it
        }
    }

    /// Gives back the buffers of sent held packets.
    pub(crate) fn recycle(&mut self, held: VecDeque<Held>) {
        for h in held {
            if self.spare.len() < self.config.hold {
                self.spare.push(h.frame);
            }
        }
    }

    /// Times out moves: an old owner that did not release within `move_timeout` is passed
    /// over; a claim not answered is sent again.
    pub(crate) fn tick(&mut self, now: Nanos, out: &mut Vec<Control>) {
        for p in 0..self.slots.len() {
            let s = &self.slots[p];
            if s.phase == Phase::Steady || now.saturating_sub(s.since) < self.config.move_timeout {
                continue;
            }
            if let Phase::Releasing { from, .. } = s.phase {
                tracing::warn!(partition = p, from, "old owner did not release in time");
                self.stats.release_timeouts += 1;
            }
            self.claim(p, now, out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flowstate_control::cluster::{MemberAddr, Slot as ASlot};
    use std::net::Ipv4Addr;

    fn addr(id: u32) -> SocketAddrV4 {
        SocketAddrV4::new(Ipv4Addr::new(192, 0, 2, 10 + id as u8), 6081)
    }

    fn assignment(version: u64, owners: &[(u32, u32)], live: &[u32], dead: &[u32]) -> Assignment {
        let mut members: Vec<MemberAddr> = live
            .iter()
            .map(|&id| MemberAddr {
                id,
                addr: addr(id),
                live: true,
                draining: false,
            })
            .collect();
        members.extend(dead.iter().map(|&id| MemberAddr {
            id,
            addr: addr(id),
            live: false,
            draining: false,
        }));
        Assignment {
            version,
            term: 0,
            stage: 0,
            slots: owners
                .iter()
                .map(|&(o, e)| ASlot {
                    owner: Some(o),
                    epoch: e,
                })
                .collect(),
            members,
        }
    }

    const MS: Nanos = 1_000_000;

    #[test]
    fn first_assignment_claims_then_steady() {
        let mut st = Steer::new(2, SteerConfig::default());
        let mut out = Vec::new();
        // Before any assignment (a root that just started), packets wait for one.
        assert_eq!(st.route(0), Route::Hold);
        assert!(st.hold(0, b"early", Direction::Outbound, 1));
        st.apply(&assignment(1, &[(1, 1), (2, 1)], &[1, 2], &[]), 0, &mut out);
        assert_eq!(out.len(), 2);
        assert!(out.iter().all(|c| c.kind == Kind::Claim && c.epoch == 1));
        assert_eq!(st.route(0), Route::Hold);
        assert!(st.hold(0, b"first", Direction::Outbound, 2));
        let (to, epoch, held) = st.on_control(1, Kind::Ready, 0, 1, MS, &mut out).unwrap();
        assert_eq!((to, epoch, held.len()), (addr(1), 1, 2));
        assert_eq!(held[0].frame, b"early");
        assert_eq!(
            st.route(0),
            Route::Send {
                to: addr(1),
                epoch: 1
            }
        );
        // A Ready from someone else or for another epoch changes nothing.
        assert!(st.on_control(1, Kind::Ready, 1, 1, MS, &mut out).is_none());
        assert!(st.on_control(2, Kind::Ready, 1, 0, MS, &mut out).is_none());
        assert_eq!(st.route(1), Route::Hold);
    }

    fn steady(st: &mut Steer, owners: &[(u32, u32)], live: &[u32]) {
        let mut out = Vec::new();
        st.apply(&assignment(1, owners, live, &[]), 0, &mut out);
        for c in out {
            let id = live.iter().copied().find(|&i| addr(i) == c.to).unwrap();
            st.on_control(id, Kind::Ready, c.partition, c.epoch, 0, &mut Vec::new());
        }
    }

    /// An assignment whose version is far beyond the one applied (a buggy or hostile key
    /// holder) is refused: nothing moves, and the real next one still applies.
    #[test]
    fn an_assignment_far_ahead_is_refused_not_adopted() {
        let mut st = Steer::new(1, SteerConfig::default());
        steady(&mut st, &[(1, 1)], &[1, 2]);
        let mut out = Vec::new();
        st.apply(&assignment(1 << 62, &[(2, 2)], &[1, 2], &[]), MS, &mut out);
        assert!(out.is_empty());
        assert_eq!(st.version(), 1);
        st.apply(&assignment(2, &[(2, 2)], &[1, 2], &[]), 2 * MS, &mut out);
        assert_eq!(st.version(), 2);
        assert_eq!(out.len(), 1);
    }

    #[test]
    fn a_move_releases_claims_and_sends_the_held_packets_in_order() {
        let mut st = Steer::new(1, SteerConfig::default());
        steady(&mut st, &[(1, 1)], &[1, 2]);
        let mut out = Vec::new();
        st.apply(&assignment(2, &[(2, 2)], &[1, 2], &[]), 10 * MS, &mut out);
        assert_eq!(
            out,
            vec![Control {
                to: addr(1),
                kind: Kind::Release,
                partition: 0,
                epoch: 1
            }]
        );
        for c in 0..5u64 {
            assert_eq!(st.route(0), Route::Hold);
            assert!(st.hold(0, &c.to_be_bytes(), Direction::Inbound, c));
        }
        out.clear();
        // A Released for the wrong epoch or from the wrong instance is ignored.
        assert!(st
            .on_control(2, Kind::Released, 0, 1, 11 * MS, &mut out)
            .is_none());
        assert!(st
            .on_control(1, Kind::Released, 0, 2, 11 * MS, &mut out)
            .is_none());
        assert!(out.is_empty());
        assert!(st
            .on_control(1, Kind::Released, 0, 1, 11 * MS, &mut out)
            .is_none());
        assert_eq!(
            out,
            vec![Control {
                to: addr(2),
                kind: Kind::Claim,
                partition: 0,
                epoch: 2
            }]
        );
        let (to, epoch, held) = st
            .on_control(2, Kind::Ready, 0, 2, 13 * MS, &mut out)
            .unwrap();
        assert_eq!((to, epoch), (addr(2), 2));
        let clocks: Vec<u64> = held.iter().map(|h| h.clock).collect();
        assert_eq!(clocks, vec![0, 1, 2, 3, 4]);
        assert_eq!(st.move_times().collect::<Vec<_>>(), vec![3 * MS]);
        let s = st.stats();
        assert_eq!(
            (s.held, s.released, s.hold_dropped, s.moves, s.moves_done),
            (5, 5, 0, 1, 1)
        );
        st.recycle(held);
        assert_eq!(
            st.route(0),
            Route::Send {
                to: addr(2),
                epoch: 2
            }
        );
    }

    #[test]
    fn failover_claims_at_once_and_a_silent_owner_is_passed_over() {
        let mut st = Steer::new(
            2,
            SteerConfig {
                move_timeout: 100 * MS,
                hold: 2,
            },
        );
        steady(&mut st, &[(1, 1), (2, 1)], &[1, 2]);
        let mut out = Vec::new();
        // Instance 1 died: its partition goes to 2 without waiting for a release.
        st.apply(&assignment(2, &[(2, 2), (2, 1)], &[2], &[1]), 0, &mut out);
        assert_eq!(
            out,
            vec![Control {
                to: addr(2),
                kind: Kind::Claim,
                partition: 0,
                epoch: 2
            }]
        );
        // The hold is bounded.
        assert!(st.hold(0, b"a", Direction::Outbound, 1));
        assert!(st.hold(0, b"b", Direction::Outbound, 2));
        assert!(!st.hold(0, b"c", Direction::Outbound, 3));
        assert_eq!(st.stats().hold_dropped, 1);
        // A claim not answered is sent again after the timeout.
        out.clear();
        st.tick(50 * MS, &mut out);
        assert!(out.is_empty());
        st.tick(100 * MS, &mut out);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].kind, Kind::Claim);
        // A live old owner that never releases is passed over after the timeout.
        out.clear();
        st.apply(
            &assignment(3, &[(2, 2), (3, 2)], &[2, 3], &[1]),
            200 * MS,
            &mut out,
        );
        assert_eq!(out[0].kind, Kind::Release);
        out.clear();
        st.tick(300 * MS, &mut out);
        assert!(out
            .iter()
            .any(|c| c.kind == Kind::Claim && c.partition == 1 && c.to == addr(3)));
        assert_eq!(st.stats().release_timeouts, 1);
        // An old assignment is ignored.
        out.clear();
        st.apply(
            &assignment(2, &[(1, 9), (1, 9)], &[1], &[]),
            400 * MS,
            &mut out,
        );
        assert!(out.is_empty());
        assert_eq!(st.owner(1), Some((3, 2)));
    }

    #[test]
    fn an_owner_that_dies_while_releasing_is_not_waited_for() {
        let mut st = Steer::new(1, SteerConfig::default());
        steady(&mut st, &[(1, 1)], &[1, 2]);
        let mut out = Vec::new();
        st.apply(&assignment(2, &[(2, 2)], &[1, 2], &[]), 0, &mut out);
        assert_eq!(out[0].kind, Kind::Release);
        out.clear();
        st.apply(&assignment(3, &[(2, 2)], &[2], &[1]), MS, &mut out);
        assert_eq!(
            out,
            vec![Control {
                to: addr(2),
                kind: Kind::Claim,
                partition: 0,
                epoch: 2
            }]
        );
    }
}
