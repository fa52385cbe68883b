//! The root's packet log (CHC §5 "logical clocks, logging"; §5.3, §5.4), sans-IO.
//!
//! Every packet the root takes from a port is logged under its logical clock, with the frame
//! as the stage it is at receives it and where it was sent (stage, partition, epoch), until
//! the chain is done with it: its output left the last stage (the root sends it out), or an
//! instance's delete request ([`crate::meta::Kind::Done`]) says an NF dropped it after its
//! state changes were committed. So, at any time, the log holds exactly the packets some
//! instance is still working on, and:
//!
//! * **Output commit at the root.** An instance sends a batch's outputs before it commits
//!   the batch's state, and the batch's clocks ([`crate::meta::Kind::Committed`]) once the
//!   store acknowledged it; the root keeps each output in the packet's entry until then
//!   ([`PacketLog::output`], [`PacketLog::committed`]). An instance that fails between its
//!   commit and its notice leaves its outputs here: the partition's next owner finds the
//!   batch's clocks in the store and sends the notice in its place, so no output is lost
//!   and no packet's state changes are made twice.
//!   An owner commits its partition's packets in clock order, so a notice also covers the
//!   partition's earlier outputs whose notices were lost on the way: they go first.
//! * **Replay.** When a partition gets a new owner because the old one failed (or lost
//!   packets to a move), the root sends the new owner the logged packets that were sent to an
//!   earlier owner and never finished, in clock order, before any newer packet
//!   ([`PacketLog::replay`]). One older than a packet of its partition that was answered was
//!   lost on the way (owners answer in order): sent now, it would leave after newer packets of
//!   its partition, so it is given up, as a network would lose it.
//! * **Duplicate suppression.** Each packet's output is taken once per stage, from the owner
//!   (epoch) the packet was last sent to: an output from a stage the packet has already left,
//!   or from an earlier owner (a replayed packet's first owner was only slow, a straggler) is
//!   dropped, so no packet enters a stage or leaves the chain twice.
//!
//! Memory is fixed: the log is a ring of `capacity` entries indexed by clock (the root's
//! clocks are consecutive), each keeping its frame buffer for the next packet. A packet still
//! in the chain when its entry is needed again, `capacity` packets later, is **evicted**:
//! counted, its output still accepted, but it can no longer be replayed. `capacity` must
//! therefore cover the packets that arrive while a failure is detected (rate × heartbeat ×
//! missed): 65,536 covers 200 kpps for a 300 ms detection.

use flowstate_nf::Direction;
use serde::Serialize;

/// The epoch of a logged packet the steering table holds (not sent yet).
pub(crate) const HELD: u32 = u32::MAX;

/// How long a packet waits at its owner, unanswered, before a watermark covering it gives it
/// up ([`PacketLog::through`]), ns.
pub(crate) const WATERMARK_GRACE: u64 = 1_000_000_000;

/// One logged packet.
#[derive(Debug)]
struct Entry {
    /// Its clock; 0: never used.
    clock: u64,
    /// The clock of the packet this entry last evicted (its output is still passed on).
    evicted: u64,
    /// Still in the chain.
    live: bool,
    /// The stage it was sent to last, and that stage's partition, numbered across stages.
    stage: u32,
    slot: u32,
    /// The epoch it was sent with, [`HELD`] while held.
    epoch: u32,
    /// When it was sent there, ns.
    sent_ns: u64,
    direction: Direction,
    /// Its frame as that stage receives it.
    frame: Vec<u8>,
    /// That stage's output, kept until its commit ([`PacketLog::committed`]).
    output: Vec<u8>,
    has_output: bool,
}

/// Counters of the log.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct LogStats {
    /// Packets logged.
    pub log_packets: u64,
    /// Packets finished by their output leaving the chain.
    pub log_finished: u64,
    /// Packets finished by a delete request (an NF dropped them).
    pub log_deleted: u64,
    /// Packets the root gave up on (dropped at the root: no owner, a full hold).
    pub log_abandoned: u64,
    /// Packets still in the chain when their entry was needed: no replay for them.
    pub log_evicted: u64,
    /// Packets in the chain now.
    pub log_live: u64,
    /// Packets sent again to a partition's new owner.
    pub replayed: u64,
    /// Outputs and delete requests for a packet that had already left their stage: dropped.
    pub duplicates_suppressed: u64,
    /// Outputs for a clock the log no longer holds (evicted, or the log is off): passed on.
    pub unlogged_outputs: u64,
    /// Commit notices for a packet whose output never reached the root (lost on the way):
    /// the packet is given up.
    pub outputs_missing: u64,
    /// Outputs released by a later commit notice of their partition's owner, their own
    /// notice lost on the way.
    pub notices_lost: u64,
    /// Packets a replay left out: unanswered though a newer packet of their partition was,
    /// so lost on the way to or from their owner (see [`PacketLog::replay`]).
    pub lost_on_the_way: u64,
}

/// What to do with an output of a stage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Output {
    /// Kept in the packet's entry until the stage's commit notice.
    Kept,
    /// The packet has left this stage already, or went to another owner since: drop it.
    Duplicate,
    /// The log does not know the clock: pass it on now (no duplicate check was possible).
    Unlogged,
}

/// A packet whose output a commit notice releases.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Released {
    /// Where it entered the chain.
    pub direction: Direction,
    /// The stage's partition it was at (numbered across stages).
    pub slot: u32,
}

/// The packet log. See the module documentation.
#[derive(Debug)]
pub(crate) struct PacketLog {
    entries: Vec<Entry>,
    mask: u64,
    /// The oldest clock that may still be live (the replay scan starts there).
    tail: u64,
    /// The newest clock logged.
    head: u64,
    /// The first clock logged (an older one is another root's).
    first: u64,
    /// The time now, ns ([`PacketLog::set_now`]).
    now: u64,
    /// Per partition (numbered across stages): the longest a packet waited for its stage's
    /// answer since the last [`PacketLog::waits`], and the newest clock answered.
    waited: Vec<(u64, u64)>,
    /// Per partition: the clocks whose outputs were kept, oldest first (see
    /// [`PacketLog::committed`]).
    kept: Vec<std::collections::VecDeque<u64>>,
    stats: LogStats,
}

impl PacketLog {
    /// A log of `capacity` packets (rounded up to a power of two) sent to `slots` partitions
    /// (of every stage); 0: no log (no replay, no duplicate suppression).
    pub(crate) fn new(capacity: usize, slots: u32) -> PacketLog {
        let n = if capacity == 0 {
            0
        } else {
            capacity.next_power_of_two()
        };
        PacketLog {
            entries: (0..n)
                .map(|_| Entry {
                    clock: 0,
                    evicted: 0,
                    live: false,
                    stage: 0,
                    slot: 0,
                    epoch: HELD,
                    sent_ns: 0,
                    direction: Direction::Outbound,
                    frame: Vec::new(),
                    output: Vec::new(),
                    has_output: false,
                })
                .collect(),
            mask: (n as u64).wrapping_sub(1),
            tail: 0,
            head: 0,
            first: 0,
            now: 0,
            waited: vec![(0, 0); slots as usize],
            kept: (0..slots).map(|_| Default::default()).collect(),
            stats: LogStats::default(),
        }
    }

    /// Whether packets are logged.
    pub(crate) fn enabled(&self) -> bool {
        !self.entries.is_empty()
    }

    /// The counters.
    pub(crate) fn stats(&self) -> LogStats {
        self.stats
    }

    /// Sets the time now, ns: when the packets sent from now on leave, and answers come.
    pub(crate) fn set_now(&mut self, now: u64) {
        self.now = now;
    }

    /// Notes that the packet in `e` got its stage's answer now.
    fn answered(waited: &mut [(u64, u64)], now: u64, e: &Entry) {
        if let Some((w, newest)) = waited.get_mut(e.slot as usize) {
            *w = (*w).max(now.saturating_sub(e.sent_ns));
            *newest = (*newest).max(e.clock);
        }
    }

    /// Calls `f(slot, ns)` for every partition with the longest any of its packets waited
    /// for its stage's answer since the last call, or has been waiting so far (CHC §5.3: the
    /// root's view of stragglers), and starts a new interval. A packet still unanswered after
    /// a newer one of its partition was answered is not waiting but lost on the way (an
    /// instance answers a partition's packets in order): it does not count, so one lost
    /// datagram never makes its instance a straggler.
    pub(crate) fn waits(&mut self, mut f: impl FnMut(u32, u64)) {
        for clock in self.live_window() {
            let e = &self.entries[(clock & self.mask) as usize];
            if e.clock == clock && e.live && e.epoch != HELD {
                if let Some((w, newest)) = self.waited.get_mut(e.slot as usize) {
                    if e.clock > *newest {
                        *w = (*w).max(self.now.saturating_sub(e.sent_ns));
                    }
                }
            }
        }
        for (slot, (w, _)) in self.waited.iter_mut().enumerate() {
            f(slot as u32, *w);
            *w = 0;
        }
    }

    fn at(&mut self, clock: u64) -> Option<&mut Entry> {
        let i = (clock & self.mask) as usize;
        self.entries.get_mut(i).filter(|e| e.clock == clock)
    }

    /// Logs the packet of `clock` (the root's next clock) from a port, entering the chain from
    /// `direction`. Evicts the packet `capacity` clocks older if it is still live.
    pub(crate) fn log(&mut self, clock: u64, direction: Direction) {
        let i = (clock & self.mask) as usize;
        let Some(e) = self.entries.get_mut(i) else {
            return;
        };
        if e.live {
            self.stats.log_evicted += 1;
            self.stats.log_live -= 1;
            e.evicted = e.clock;
        }
        e.clock = clock;
        e.live = true;
        e.direction = direction;
        e.epoch = HELD;
        e.has_output = false;
        self.stats.log_packets += 1;
        self.stats.log_live += 1;
        if self.first == 0 {
            (self.first, self.tail) = (clock, clock);
        }
        self.head = clock;
    }

    /// The packet of `clock`, `frame` as it is now, goes to `slot` (a partition of `stage`)
    /// with `epoch` ([`HELD`]: held until the partition's move ends).
    pub(crate) fn sent(&mut self, clock: u64, stage: u32, slot: u32, epoch: u32, frame: &[u8]) {
        let now = self.now;
        if let Some(e) = self.at(clock).filter(|e| e.live) {
            e.stage = stage;
            e.slot = slot;
            e.epoch = epoch;
            e.sent_ns = now;
            e.has_output = false;
            e.frame.clear();
            e.frame.extend_from_slice(frame);
        }
    }

    /// A held packet of `clock` was sent with `epoch`.
    pub(crate) fn released(&mut self, clock: u64, epoch: u32) {
        let now = self.now;
        if let Some(e) = self.at(clock).filter(|e| e.live) {
            e.epoch = epoch;
            e.sent_ns = now;
        }
    }

    /// The output `payload` of `stage`'s owner at `epoch` for the packet of `clock`: kept
    /// until the stage's commit notice ([`Output::Kept`]; a later output of the same owner
    /// replaces it), dropped, or to pass on now.
    pub(crate) fn output(&mut self, clock: u64, stage: u32, epoch: u32, payload: &[u8]) -> Output {
        let (first, capacity) = (self.first, self.entries.len());
        let v = match self.entries.get_mut((clock & self.mask) as usize) {
            Some(e) if e.clock == clock => {
                if e.live && e.stage == stage && e.epoch == epoch {
                    e.output.clear();
                    e.output.extend_from_slice(payload);
                    if !e.has_output {
                        if let Some(q) = self.kept.get_mut(e.slot as usize) {
                            if q.len() == capacity {
                                q.pop_front();
                            }
                            q.push_back(clock);
                        }
                    }
                    e.has_output = true;
                    Output::Kept
                } else {
                    Output::Duplicate
                }
            }
            // Its entry went to a newer packet: the packet finished (this output is a
            // duplicate) unless that newer packet evicted it.
            Some(e) if clock >= first && e.clock > clock && e.evicted != clock => Output::Duplicate,
            // Evicted, never logged (another root's clock), or no log.
            _ => Output::Unlogged,
        };
        match v {
            Output::Duplicate => self.stats.duplicates_suppressed += 1,
            Output::Unlogged => self.stats.unlogged_outputs += 1,
            Output::Kept => {}
        }
        v
    }

    /// `stage`'s owner at `epoch` committed the packet of `clock`: the next output this
    /// notice releases, moved into `output` (whose old buffer the entry keeps), with its clock,
    /// for the caller to send to the next stage ([`PacketLog::sent`]) or out of the chain
    /// ([`PacketLog::finish`]); call again until it returns `clock` itself or `None`.
    ///
    /// An owner processes and commits its partition's packets in clock order, so this notice
    /// also covers every earlier output of the partition it sent and the root still keeps:
    /// their own notices were lost on the way. Those are released first, oldest first, so a
    /// partition's outputs leave in order. `None`: nothing (more) to send (a notice for a
    /// packet that moved on, or another owner's; or one whose output never came, which is
    /// given up and counted).
    pub(crate) fn committed(
        &mut self,
        clock: u64,
        stage: u32,
        epoch: u32,
        output: &mut Vec<u8>,
    ) -> Option<(u64, Released)> {
        let i = (clock & self.mask) as usize;
        let e = self.entries.get(i).filter(|e| e.clock == clock)?;
        if !e.live || e.stage != stage || e.epoch != epoch {
            return None;
        }
        let slot = e.slot as usize;
        if let Some(r) = self.kept_through(slot, clock - 1, stage, epoch, output) {
            return Some(r);
        }
        if let Some(q) = self
            .kept
            .get_mut(slot)
            .filter(|q| q.front() == Some(&clock))
        {
            q.pop_front();
        }
        let e = &mut self.entries[i];
        if !e.has_output {
            Self::answered(&mut self.waited, self.now, e);
            e.live = false;
            self.stats.log_live -= 1;
            self.stats.outputs_missing += 1;
            return None;
        }
        // Answered there.
        self.take_output(clock, stage, epoch, output)
            .map(|r| (clock, r))
    }

    /// The oldest output `slot` keeps from `stage`'s owner at `epoch` for a packet up to
    /// `clock`, moved into `output`: its notice was lost on the way (counted). `None` when
    /// none is left.
    fn kept_through(
        &mut self,
        slot: usize,
        clock: u64,
        stage: u32,
        epoch: u32,
        output: &mut Vec<u8>,
    ) -> Option<(u64, Released)> {
        while let Some(&front) = self.kept.get(slot).and_then(|q| q.front()) {
            if front > clock {
                break;
            }
            // Another owner's to release (a stale notice or watermark): left in place.
            let e = &self.entries[(front & self.mask) as usize];
            if e.clock == front && e.live && e.has_output && (e.stage, e.epoch) != (stage, epoch) {
                break;
            }
            self.kept[slot].pop_front();
            // Skipped if it moved on since (released, finished).
            if let Some(r) = self.take_output(front, stage, epoch, output) {
                self.stats.notices_lost += 1;
                return Some((front, r));
            }
        }
        None
    }

    /// `stage`'s owner at `epoch` of `slot` says it committed every packet of the slot it
    /// took up to `clock` ([`crate::meta::Kind::Through`]: it repeats this for a while once
    /// the slot is quiet, so the last notices of a burst lost on the way do not hold their
    /// packets forever). The next output this releases, as [`PacketLog::committed`] does
    /// (call again until `None`); then the slot's packets up to `clock` sent to that owner
    /// more than [`WATERMARK_GRACE`] ago without an output are given up: their owner took
    /// them and answered a newer one (the delete request lost), or never got them (lost on
    /// the way, as in [`PacketLog::replay`]). The grace covers a packet of a later stage
    /// that reaches its owner after newer ones (outputs of the stage before leave in the
    /// order their commits end, not in clock order).
    pub(crate) fn through(
        &mut self,
        stage: u32,
        slot: u32,
        epoch: u32,
        clock: u64,
        output: &mut Vec<u8>,
    ) -> Option<(u64, Released)> {
        // Another root's clock (a restarted one's), or none logged.
        if !(self.first..=self.head).contains(&clock) || self.first == 0 {
            return None;
        }
        let released = self.kept_through(slot as usize, clock, stage, epoch, output);
        if released.is_some() {
            return released;
        }
        for c in self.live_window() {
            if c > clock {
                break;
            }
            let e = &mut self.entries[(c & self.mask) as usize];
            if e.clock == c
                && e.live
                && e.stage == stage
                && e.slot == slot
                && e.epoch == epoch
                && !e.has_output
                && self.now.saturating_sub(e.sent_ns) > WATERMARK_GRACE
            {
                e.live = false;
                self.stats.log_live -= 1;
                self.stats.lost_on_the_way += 1;
            }
        }
        None
    }

    /// The kept output of the live packet of `clock` at `stage`'s owner at `epoch`, moved into
    /// `output`.
    fn take_output(
        &mut self,
        clock: u64,
        stage: u32,
        epoch: u32,
        output: &mut Vec<u8>,
    ) -> Option<Released> {
        let i = (clock & self.mask) as usize;
        let e = self.entries.get_mut(i).filter(|e| e.clock == clock)?;
        if !e.live || e.stage != stage || e.epoch != epoch || !e.has_output {
            return None;
        }
        Self::answered(&mut self.waited, self.now, e);
        e.has_output = false;
        std::mem::swap(&mut e.output, output);
        Some(Released {
            direction: e.direction,
            slot: e.slot,
        })
    }

    /// The packet of `clock` left the chain (its output was sent out).
    pub(crate) fn finish(&mut self, clock: u64) {
        if self.end(clock) {
            self.stats.log_finished += 1;
        }
    }

    /// The root dropped the packet of `clock` (no owner, a full hold).
    pub(crate) fn abandon(&mut self, clock: u64) {
        if self.end(clock) {
            self.stats.log_abandoned += 1;
        }
    }

    /// A delete request of `stage`'s owner at `epoch` for the packet of `clock`: an NF
    /// dropped it. Whether it was live at that stage and sent to that owner (anything else is
    /// a duplicate, counted).
    pub(crate) fn delete(&mut self, clock: u64, stage: u32, epoch: u32) -> bool {
        let (waited, now) = (&mut self.waited, self.now);
        let i = (clock & self.mask) as usize;
        let fresh = self.entries.get(i).is_some_and(|e| {
            e.clock == clock && e.live && e.stage == stage && e.epoch == epoch && {
                Self::answered(waited, now, e);
                true
            }
        });
        if fresh {
            self.end(clock);
            self.stats.log_deleted += 1;
        } else {
            self.stats.duplicates_suppressed += 1;
        }
        fresh
    }

    fn end(&mut self, clock: u64) -> bool {
        match self.at(clock) {
            Some(e) if e.live => {
                e.live = false;
                self.stats.log_live -= 1;
                true
            }
            _ => false,
        }
    }

    /// Calls `send(clock, direction, frame)`, in clock order, for every live packet at `slot`
    /// of `stage` that went to an owner before `epoch`'s (not the held ones: the steering
    /// table sends those), and notes them sent with `epoch`. A packet older than the newest
    /// one its partition's owners answered was lost on the way (owners answer in order): it
    /// is given up and counted, not sent after newer packets of its partition.
    pub(crate) fn replay(
        &mut self,
        stage: u32,
        slot: u32,
        epoch: u32,
        mut send: impl FnMut(u64, Direction, &[u8]),
    ) {
        let newest = self.waited.get(slot as usize).map_or(0, |w| w.1);
        for clock in self.live_window() {
            let i = (clock & self.mask) as usize;
            let e = &mut self.entries[i];
            if e.clock == clock
                && e.live
                && e.stage == stage
                && e.slot == slot
                && e.epoch != HELD
                && e.epoch != epoch
            {
                if clock < newest {
                    // Never answered though a newer packet of its partition was (an owner
                    // answers in order): lost on the way to or from its owner. Sent again, it
                    // would leave after newer packets of its partition; it stays lost.
                    e.live = false;
                    self.stats.log_live -= 1;
                    self.stats.lost_on_the_way += 1;
                    continue;
                }
                e.epoch = epoch;
                e.sent_ns = self.now;
                self.stats.replayed += 1;
                send(clock, e.direction, &e.frame);
            }
        }
    }

    /// The clocks that may still be live: from the oldest live one (the tail, moved past
    /// the finished packets first) to the newest logged; empty without a log.
    fn live_window(&mut self) -> std::ops::Range<u64> {
        if !self.enabled() || self.head == 0 {
            return 0..0;
        }
        self.tail = self.tail.max(self.head.saturating_sub(self.mask));
        while self.tail < self.head {
            let e = &self.entries[(self.tail & self.mask) as usize];
            if e.clock == self.tail && e.live {
                break;
            }
            self.tail += 1;
        }
        self.tail..self.head + 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const IN: Direction = Direction::Outbound;

    fn replayed(log: &mut PacketLog, stage: u32, slot: u32, epoch: u32) -> Vec<(u64, Vec<u8>)> {
        let mut out = Vec::new();
        log.replay(stage, slot, epoch, |c, _, f| out.push((c, f.to_vec())));
        out
    }

    /// Logs clocks `1..=n`, each sent to `slot` of stage 0 at epoch 1 as the frame `[clock]`.
    fn logged(log: &mut PacketLog, n: u64, slot: u32) {
        for c in 1..=n {
            log.log(c, IN);
            log.sent(c, 0, slot, 1, &[c as u8]);
        }
    }

    /// The output of `stage`'s owner at `epoch`, kept and released by its commit notice.
    fn committed(log: &mut PacketLog, clock: u64, stage: u32, epoch: u32, out: &[u8]) -> Vec<u8> {
        assert_eq!(log.output(clock, stage, epoch, out), Output::Kept);
        let mut buf = Vec::new();
        log.committed(clock, stage, epoch, &mut buf).unwrap();
        buf
    }

    #[test]
    fn a_packet_lives_until_its_output_leaves_the_last_stage() {
        let mut log = PacketLog::new(8, 8);
        log.log(1, IN);
        log.sent(1, 0, 3, 1, b"a");
        // Kept until the commit notice; a notice from another owner releases nothing.
        assert_eq!(log.output(1, 0, 1, b"a'"), Output::Kept);
        let mut buf = Vec::new();
        assert_eq!(log.committed(1, 0, 2, &mut buf), None);
        assert_eq!(
            log.committed(1, 0, 1, &mut buf),
            Some((
                1,
                Released {
                    direction: IN,
                    slot: 3
                }
            ))
        );
        assert_eq!(buf, b"a'");
        log.sent(1, 1, 9, 1, &buf);
        // Stage 0 sends its output again (a clone): a duplicate.
        assert_eq!(log.output(1, 0, 1, b"a'"), Output::Duplicate);
        assert_eq!(committed(&mut log, 1, 1, 1, b"a''"), b"a''");
        log.finish(1);
        assert_eq!(log.output(1, 1, 1, b"a''"), Output::Duplicate);
        let s = log.stats();
        assert_eq!(
            (
                s.log_packets,
                s.log_finished,
                s.log_live,
                s.duplicates_suppressed
            ),
            (1, 1, 0, 2)
        );
    }

    #[test]
    fn outputs_left_by_a_failed_owner_are_released_by_its_successor_s_notice() {
        let mut log = PacketLog::new(8, 8);
        for c in [1, 2] {
            log.log(c, IN);
            log.sent(c, 0, 5, 1, &[c as u8]);
            // Owner 1 sent both outputs, then failed before its commit notice.
            assert_eq!(log.output(c, 0, 1, &[c as u8, 0xaa]), Output::Kept);
        }
        // Both are replayed to the successor (epoch 2), which finds 1 committed in the store
        // and processes 2 again.
        assert_eq!(replayed(&mut log, 0, 5, 2).len(), 2);
        assert_eq!(
            log.output(2, 0, 1, &[2, 0xaa]),
            Output::Duplicate,
            "the old owner's"
        );
        assert_eq!(log.output(2, 0, 2, &[2, 0xbb]), Output::Kept);
        let mut buf = Vec::new();
        assert!(log.committed(1, 0, 2, &mut buf).is_some());
        assert_eq!(
            buf,
            [1, 0xaa],
            "the failed owner's output of a committed packet"
        );
        assert!(log.committed(2, 0, 2, &mut buf).is_some());
        assert_eq!(buf, [2, 0xbb]);
        // A notice for a packet whose output never came gives it up.
        log.log(3, IN);
        log.sent(3, 0, 5, 2, &[3]);
        assert!(log.committed(3, 0, 2, &mut buf).is_none());
        assert_eq!((log.stats().outputs_missing, log.stats().log_live), (1, 2));
    }

    /// An owner commits its partition's packets in order, so a notice covers the earlier
    /// outputs whose own notices were lost: they leave first, oldest first, and a partition's
    /// outputs stay in clock order (before, they waited for the next move's replay and left
    /// after newer ones).
    #[test]
    fn a_notice_releases_the_earlier_outputs_whose_notices_were_lost() {
        let mut log = PacketLog::new(16, 8);
        for c in 1..=5 {
            log.log(c, IN);
            // Partition 3 gets 1, 2, 4, 5; partition 4 gets 3.
            log.sent(c, 0, if c == 3 { 4 } else { 3 }, 1, &[c as u8]);
            assert_eq!(log.output(c, 0, 1, &[c as u8, 0xaa]), Output::Kept);
        }
        // The notices of 1 and 2 were lost; 4's comes.
        let mut buf = Vec::new();
        let mut released = Vec::new();
        while let Some((c, r)) = log.committed(4, 0, 1, &mut buf) {
            assert_eq!(buf, [c as u8, 0xaa]);
            released.push((c, r.slot));
            log.finish(c); // the root sends it out
            if c == 4 {
                break;
            }
        }
        assert_eq!(
            released,
            [(1, 3), (2, 3), (4, 3)],
            "oldest first, its own last"
        );
        // Partition 4's output waits for its own notice; 5's notice releases 5 alone.
        assert_eq!(
            log.committed(5, 0, 1, &mut buf),
            Some((
                5,
                Released {
                    direction: IN,
                    slot: 3
                }
            ))
        );
        assert_eq!(log.committed(3, 0, 1, &mut buf).map(|(c, _)| c), Some(3));
        // A late notice of 1 releases nothing more.
        assert_eq!(log.committed(1, 0, 1, &mut buf), None);
        let s = log.stats();
        assert_eq!(
            (s.notices_lost, s.outputs_missing, s.duplicates_suppressed),
            (2, 0, 0)
        );
    }

    /// The last notices of a burst were lost and the partition went quiet: its owner's
    /// watermark releases the kept outputs in clock order and gives up the packets it
    /// answered without an output that came (a lost delete request, a lost output or packet);
    /// newer packets, another partition's and another owner's stay.
    #[test]
    fn a_watermark_ends_what_lost_notices_left_of_a_quiet_partition() {
        let mut log = PacketLog::new(16, 8);
        for c in 1..=7 {
            log.log(c, IN);
            log.sent(c, 0, if c == 6 { 4 } else { 3 }, 1, &[c as u8]);
        }
        for c in [1, 2, 4, 6, 7] {
            assert_eq!(log.output(c, 0, 1, &[c as u8, 0xaa]), Output::Kept);
        }
        let mut buf = Vec::new();
        log.set_now(WATERMARK_GRACE);
        assert_eq!(log.through(0, 3, 2, 5, &mut buf), None, "another epoch's");
        assert_eq!(log.stats().log_live, 7);
        let mut released = Vec::new();
        while let Some((c, r)) = log.through(0, 3, 1, 5, &mut buf) {
            assert_eq!(buf, [c as u8, 0xaa]);
            released.push((c, r.slot));
            log.finish(c);
        }
        assert_eq!(released, [(1, 3), (2, 3), (4, 3)]);
        assert_eq!(
            log.stats().log_live,
            4,
            "within the grace: 3 and 5 may still come"
        );
        log.set_now(WATERMARK_GRACE + 1);
        assert_eq!(log.through(0, 3, 1, 5, &mut buf), None);
        let s = log.stats();
        assert_eq!(
            (
                s.log_finished,
                s.lost_on_the_way,
                s.notices_lost,
                s.log_live
            ),
            (3, 2, 3, 2),
            "3 and 5 given up; 6 (partition 4) and 7 (after the watermark) live"
        );
        // Another root's clocks: nothing.
        assert_eq!(log.through(0, 4, 1, 1 << 48, &mut buf), None);
        assert_eq!(log.stats().log_live, 2);
        // Repeated: nothing more.
        assert_eq!(log.through(0, 3, 1, 5, &mut buf), None);
        assert_eq!(log.stats().log_live, 2);
        assert_eq!(log.committed(7, 0, 1, &mut buf).map(|(c, _)| c), Some(7));
    }

    /// Packet 2 never reached its owner, which answered 1 and 3: a replay (the owner failed)
    /// sends 4, still in flight, and leaves 2 out rather than send it after 3.
    #[test]
    fn a_replay_leaves_out_what_was_lost_before_a_newer_answer() {
        let mut log = PacketLog::new(16, 8);
        logged(&mut log, 4, 3);
        let mut buf = Vec::new();
        for c in [1, 3] {
            assert_eq!(log.output(c, 0, 1, &[c as u8]), Output::Kept);
            assert_eq!(log.committed(c, 0, 1, &mut buf).map(|(c, _)| c), Some(c));
            log.finish(c);
        }
        assert_eq!(replayed(&mut log, 0, 3, 2), vec![(4, vec![4])]);
        let s = log.stats();
        assert_eq!((s.lost_on_the_way, s.replayed, s.log_live), (1, 1, 1));
    }

    #[test]
    fn replay_sends_what_an_earlier_owner_left_in_clock_order_and_once() {
        let mut log = PacketLog::new(16, 8);
        for c in 1..=6 {
            log.log(c, IN);
            // Odd clocks to partition 2, even ones to partition 3, all at epoch 1.
            log.sent(c, 0, 2 + (c as u32 + 1) % 2, 1, &[c as u8]);
        }
        // 1 and 3 came back; 5 was dropped by an NF (a delete request).
        for c in [1, 3] {
            committed(&mut log, c, 0, 1, b"out");
            log.finish(c);
        }
        assert!(!log.delete(5, 0, 2), "another owner's");
        assert!(log.delete(5, 0, 1));
        assert!(
            !log.delete(5, 0, 1),
            "a second delete request is a duplicate"
        );
        // Clock 7 is held for partition 2 while it moves.
        log.log(7, IN);
        log.sent(7, 0, 2, HELD, &[7]);
        // Partition 2's new owner (epoch 2): nothing left to replay there.
        assert_eq!(replayed(&mut log, 0, 2, 2), vec![]);
        // Partition 3's: 2, 4 and 6 in order, once; not the held 7, not another stage's.
        assert_eq!(
            replayed(&mut log, 0, 3, 2),
            vec![(2, vec![2]), (4, vec![4]), (6, vec![6])]
        );
        assert_eq!(replayed(&mut log, 0, 3, 2), vec![]);
        assert_eq!(replayed(&mut log, 1, 3, 3), vec![]);
        // The first owner's late output is not taken; the new owner's is.
        assert_eq!(log.output(4, 0, 1, b"old"), Output::Duplicate);
        committed(&mut log, 4, 0, 2, b"new");
        log.finish(4);
        assert_eq!(log.output(4, 0, 2, b"new"), Output::Duplicate);
        assert_eq!(
            log.output(7, 0, 2, b"7"),
            Output::Duplicate,
            "held, not sent yet"
        );
        log.released(7, 2);
        committed(&mut log, 7, 0, 2, b"7");
        assert_eq!(log.stats().replayed, 3);
    }

    #[test]
    fn a_full_log_evicts_the_oldest_live_packet_and_counts_it() {
        let mut log = PacketLog::new(4, 8);
        logged(&mut log, 4, 0);
        log.log(5, IN); // takes clock 1's entry
        log.sent(5, 0, 0, 1, &[5]);
        assert_eq!(log.stats().log_evicted, 1);
        assert_eq!(log.stats().log_live, 4);
        // Clock 1's output is passed on unchecked; clock 2's, once it finished and its entry
        // went to clock 6, is a duplicate.
        assert_eq!(log.output(1, 0, 1, b"1"), Output::Unlogged);
        committed(&mut log, 2, 0, 1, b"2");
        log.finish(2);
        log.log(6, IN);
        assert_eq!(log.output(2, 0, 1, b"2"), Output::Duplicate);
        assert_eq!(log.stats().unlogged_outputs, 1);
        // Clocks of an earlier root are not this log's.
        let mut log = PacketLog::new(4, 8);
        log.log(100, IN);
        assert_eq!(log.output(3, 0, 1, b"3"), Output::Unlogged);
        assert_eq!(
            replayed(&mut log, 0, 0, 2),
            vec![],
            "a packet never sent is not replayed"
        );
    }

    #[test]
    fn waits_are_the_longest_answer_or_the_oldest_unanswered_packet() {
        let mut log = PacketLog::new(8, 3);
        log.set_now(100);
        for c in 1..=3 {
            log.log(c, IN);
            log.sent(c, 0, c as u32 - 1, 1, b"x");
        }
        log.set_now(130);
        committed(&mut log, 1, 0, 1, b"y"); // answered after 30, and sent out
        log.finish(1);
        assert!(log.delete(2, 0, 1)); // after 30 too
        log.set_now(400); // 3 still waiting since 100
        let mut w = Vec::new();
        log.waits(|slot, ns| w.push((slot, ns)));
        assert_eq!(w, [(0, 30), (1, 30), (2, 300)]);
        w.clear();
        log.waits(|slot, ns| w.push((slot, ns)));
        assert_eq!(w, [(0, 0), (1, 0), (2, 300)], "a new interval");
        // Clock 4 to partition 2 is answered: 3 was lost on the way, not waiting.
        log.log(4, IN);
        log.sent(4, 0, 2, 1, b"x");
        assert!(log.delete(4, 0, 1));
        w.clear();
        log.waits(|slot, ns| w.push((slot, ns)));
        assert_eq!(w, [(0, 0), (1, 0), (2, 0)]);
    }

    #[test]
    fn without_a_log_everything_passes() {
        let mut log = PacketLog::new(0, 8);
        log.log(1, IN);
        log.sent(1, 0, 0, 1, b"x");
        assert_eq!(log.output(1, 0, 1, b"y"), Output::Unlogged);
        assert_eq!(log.committed(1, 0, 1, &mut Vec::new()), None);
        log.finish(1);
        assert!(!log.delete(1, 0, 1));
        assert_eq!(replayed(&mut log, 0, 0, 2), vec![]);
    }
}
