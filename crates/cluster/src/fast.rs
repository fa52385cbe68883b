//! The root's XDP fast path: established flows forwarded by the kernel at the root, the
//! instances' output as the specification (HyperSFC §III; the live box's
//! [`flowstate_fastpath::flowcache`], taught here across the cluster hop).
//!
//! ```text
//!  port --XDP: entry? --hit--> rewrite --bpf_redirect--> other port
//!               | miss, SYN/FIN/RST, renewal
//!               v
//!  root: keep the frame by clock ==GENEVE==> owner ==output, same clock==> root: send it out,
//!        compare it with the kept frame --> install, renew or forget the flow's entry
//! ```
//!
//! The root keeps each TCP/UDP frame it sends to an instance in a ring indexed by the frame's
//! logical clock; when the instance's output comes back with that clock, the two frames teach
//! the fast path exactly as the box's worker does ([`XdpFlowCache::observe`]: an entry only when it
//! reproduces the output bit for bit). The instance's output is sent only after the state it
//! changed is in the store (output commit), so an entry never runs ahead of the store.
//!
//! Promises, beyond the box's (bounded staleness, control packets on the slow path):
//! * **Moves stay order-preserving.** When a partition starts a planned move (the root sends
//!   its old owner a release), the entries the root learned from the partition's flows are
//!   removed first: from then on its every packet takes the slow path and is held in order
//!   with the others, and entries are learned again from the new owner's output. A chain cut
//!   into stages has a partition in every stage: the root records the (stage, partition,
//!   epoch) each frame was sent to, learns only when every one of them is still steady at
//!   that epoch, and files the entry under each, so a move in any stage takes it out.
//! * **Failover keeps the entries.** A dead owner's decisions were committed before its output
//!   left, so the flows it served go on through the fast path while its partitions are taken
//!   over; only their slow-path packets wait for the new owner.
//! * Bounded: the ring holds [`RING`] frames in flight. The root tracks each installed key
//!   with its deadline, per partition; a move removes only the entries still in use (one
//!   past its deadline sends its packets to the slow path anyway), so it costs a system call
//!   per active flow, not per flow ever seen. At twice the table's capacity the tracking
//!   forgets entries past their deadline; if that is not enough, every entry is removed at
//!   once (and counted) rather than the tracking growing without end.

use flowstate_fastpath::flowcache::{monotonic_ns, FlowKey, Lesson, XdpFlowCache};
use flowstate_router::LoadedFastPath;
use std::collections::HashMap;
use std::sync::Arc;

/// Frames in flight the root can learn from (the newest ones; an older frame whose output comes
/// back after [`RING`] newer frames teaches nothing).
pub(crate) const RING: usize = 4096;
/// Stages a frame's route through the chain is recorded for (a longer chain is not learned).
pub(crate) const MAX_STAGES: usize = 8;

/// Counters of the root's fast path.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct FastStats {
    /// Packets the XDP program forwarded.
    pub fast_path_packets: u64,
    /// Their bytes.
    pub fast_path_bytes: u64,
    /// Entries installed or renewed from instances' output.
    pub fast_path_learned: u64,
    /// Entries removed because their partition began a move.
    pub fast_path_moved_out: u64,
    /// Times every entry was removed because the tracking was full.
    pub fast_path_resets: u64,
    /// Table operations the kernel refused (the flow stays on the slow path).
    pub fast_path_errors: u64,
}

/// The root's fast path: the kernel's table and programs, the frames in flight, and which
/// partitions each installed key belongs to. Partitions are numbered across the stages
/// (`slot`: stage `k`'s partition `p` is the partitions of stages before `k`, plus `p`).
pub(crate) struct RootFastPath {
    path: Arc<XdpFlowCache>,
    _programs: [Arc<flowstate_io::afxdp::XdpProgram>; 2],
    ifindex: [u32; 2],
    ring: Ring,
    /// Installed keys and their deadlines (CLOCK_MONOTONIC ns), per slot.
    keys: Vec<HashMap<FlowKey, u64>>,
    tracked: usize,
    limit: usize,
    stats: FastStats,
}

impl std::fmt::Debug for RootFastPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RootFastPath")
            .field("ifindex", &self.ifindex)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl RootFastPath {
    /// The fast path `loaded` on the root's ports for `slots` partitions (of every stage),
    /// tracking at most `2 * capacity` keys.
    pub(crate) fn new(loaded: LoadedFastPath, slots: u32, capacity: u32, max_frame: usize) -> Self {
        let (path, programs) = loaded;
        let ifindex = [programs[0].ifindex(), programs[1].ifindex()];
        RootFastPath {
            path,
            _programs: programs,
            ifindex,
            ring: Ring::new(RING, max_frame),
            keys: (0..slots).map(|_| HashMap::new()).collect(),
            tracked: 0,
            limit: 2 * capacity as usize,
            stats: FastStats::default(),
        }
    }

    /// Keeps `frame`, received on `port` and sent to an instance with `clock`, until its output
    /// comes back.
    pub(crate) fn sent(&mut self, clock: u64, port: u16, frame: &[u8]) {
        self.ring.keep(clock, port, frame);
    }

    /// The frame of `clock` was sent to the owner of `slot` at `epoch`.
    pub(crate) fn routed(&mut self, clock: u64, slot: u32, epoch: u32) {
        self.ring.route(clock, slot, epoch);
    }

    /// The chain's output for the frame of `clock` left by `out_port` as `output`: teaches
    /// the fast path, if `steady` says yes to every (slot, epoch) the frame was sent to.
    pub(crate) fn returned(
        &mut self,
        clock: u64,
        out_port: usize,
        output: &[u8],
        steady: impl Fn(u32, u32) -> bool,
    ) {
        let Some((in_port, input, route)) = self.ring.get(clock) else {
            return;
        };
        if route.is_empty() || !route.iter().all(|&(slot, epoch)| steady(slot, epoch)) {
            return;
        }
        let mut slots = [0u32; MAX_STAGES];
        for (s, (slot, _)) in slots.iter_mut().zip(route) {
            *s = *slot;
        }
        let slots = &slots[..route.len()];
        let (Some(&in_if), Some(&out_if)) = (
            self.ifindex.get(usize::from(in_port)),
            self.ifindex.get(out_port),
        ) else {
            return;
        };
        match self.path.observe(in_if, input, out_if, output) {
            Ok(Lesson::Install(key, entry)) => {
                self.stats.fast_path_learned += 1;
                for &slot in slots {
                    let Some(keys) = self.keys.get_mut(slot as usize) else {
                        continue;
                    };
                    if keys.insert(key, entry.deadline_ns).is_none() {
                        self.tracked += 1;
                    }
                }
                if self.tracked > self.limit {
                    self.prune();
                }
            }
            Ok(Lesson::Forget(forgotten)) => {
                for &slot in slots {
                    if let Some(keys) = self.keys.get_mut(slot as usize) {
                        for k in &forgotten {
                            if keys.remove(k).is_some() {
                                self.tracked -= 1;
                            }
                        }
                    }
                }
            }
            Ok(Lesson::Nothing) => {}
            Err(e) => self.error(&e),
        }
    }

    /// The partition of `slot` begins a planned move: its flows leave the fast path.
    pub(crate) fn moving(&mut self, slot: u32) {
        let Some(keys) = self.keys.get_mut(slot as usize) else {
            return;
        };
        let now = monotonic_ns();
        let live: Vec<FlowKey> = keys
            .drain()
            .filter_map(|(k, deadline)| (deadline > now).then_some(k))
            .collect();
        self.tracked = self.keys.iter().map(HashMap::len).sum();
        for k in &live {
            match self.path.forget(k) {
                Ok(()) => self.stats.fast_path_moved_out += 1,
                Err(e) => self.error(&e),
            }
        }
    }

    /// The tracking is full: forgets entries past their deadline, else removes every entry.
    fn prune(&mut self) {
        let now = monotonic_ns();
        for keys in &mut self.keys {
            keys.retain(|_, deadline| *deadline > now);
        }
        self.tracked = self.keys.iter().map(HashMap::len).sum();
        if self.tracked <= self.limit / 2 {
            return;
        }
        self.stats.fast_path_resets += 1;
        tracing::warn!(
            keys = self.tracked,
            "the root's fast path has more live flows than its capacity: every entry removed"
        );
        for p in 0..self.keys.len() {
            for (k, _) in std::mem::take(&mut self.keys[p]) {
                if let Err(e) = self.path.forget(&k) {
                    self.error(&e);
                }
            }
        }
        self.tracked = 0;
    }

    fn error(&mut self, e: &flowstate_io::Error) {
        if self.stats.fast_path_errors == 0 {
            tracing::warn!(error = %e, "the root's fast path refused a table operation; its flow stays on the slow path");
        }
        self.stats.fast_path_errors += 1;
    }

    /// The counters (the program's read from the kernel).
    pub(crate) fn stats(&self) -> FastStats {
        let mut s = self.stats;
        if let Ok(f) = self.path.stats() {
            s.fast_path_packets = f.packets;
            s.fast_path_bytes = f.bytes;
        }
        s
    }
}

/// A kept frame: the port it came in by, its bytes, the (slot, epoch) of each stage it was
/// sent to.
type Kept<'a> = (u16, &'a [u8], &'a [(u32, u32)]);

/// Frames by logical clock in a ring of fixed slots (no allocation after start).
struct Ring {
    clocks: Vec<u64>,
    ports: Vec<u16>,
    lens: Vec<usize>,
    bytes: Vec<u8>,
    slot: usize,
    /// Per frame, the (slot, epoch) of each stage it was sent to.
    routes: Vec<[(u32, u32); MAX_STAGES]>,
    hops: Vec<u8>,
}

impl Ring {
    fn new(slots: usize, slot: usize) -> Ring {
        Ring {
            clocks: vec![0; slots],
            ports: vec![0; slots],
            lens: vec![0; slots],
            bytes: vec![0; slots * slot],
            slot,
            routes: vec![[(0, 0); MAX_STAGES]; slots],
            hops: vec![0; slots],
        }
    }

    /// Keeps `frame` if it is IPv4 TCP or UDP (the only frames the fast path learns from) and
    /// fits a slot.
    fn keep(&mut self, clock: u64, port: u16, frame: &[u8]) {
        let learnable = frame.len() <= self.slot
            && frame.get(12..14) == Some(&[0x08, 0x00])
            && matches!(frame.get(14 + 9), Some(6 | 17));
        if !learnable {
            return;
        }
        let i = (clock % self.clocks.len() as u64) as usize;
        self.clocks[i] = clock;
        self.ports[i] = port;
        self.lens[i] = frame.len();
        self.hops[i] = 0;
        self.bytes[i * self.slot..i * self.slot + frame.len()].copy_from_slice(frame);
    }

    /// The frame of `clock` (if kept) was sent to `slot` at `epoch`. A route longer than
    /// [`MAX_STAGES`] is marked unlearnable.
    fn route(&mut self, clock: u64, slot: u32, epoch: u32) {
        let i = (clock % self.clocks.len() as u64) as usize;
        if clock == 0 || self.clocks[i] != clock {
            return;
        }
        match self.routes[i].get_mut(usize::from(self.hops[i])) {
            Some(r) => {
                *r = (slot, epoch);
                self.hops[i] += 1;
            }
            None => self.clocks[i] = 0,
        }
    }

    fn get(&self, clock: u64) -> Option<Kept<'_>> {
        let i = (clock % self.clocks.len() as u64) as usize;
        (clock != 0 && self.clocks[i] == clock).then(|| {
            (
                self.ports[i],
                &self.bytes[i * self.slot..i * self.slot + self.lens[i]],
                &self.routes[i][..usize::from(self.hops[i])],
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn udp(tag: u8) -> Vec<u8> {
        let mut f = vec![0u8; 42];
        f[12..14].copy_from_slice(&[0x08, 0x00]);
        f[14] = 0x45;
        f[14 + 9] = 17;
        f[41] = tag;
        f
    }

    #[test]
    fn the_ring_gives_back_a_frame_by_clock_until_it_is_overwritten() {
        let mut r = Ring::new(4, 64);
        r.keep(1, 0, &udp(1));
        r.keep(2, 1, &udp(2));
        r.route(1, 3, 7);
        r.route(1, 20, 1);
        r.route(3, 5, 5); // never kept: nothing recorded
        assert_eq!(r.get(1), Some((0, &udp(1)[..], &[(3, 7), (20, 1)][..])));
        assert_eq!(r.get(2), Some((1, &udp(2)[..], &[][..])));
        assert_eq!(r.get(3), None, "never kept");
        r.keep(5, 1, &udp(5)); // the slot of clock 1
        assert_eq!(r.get(1), None, "overwritten by a newer clock");
        assert_eq!(
            r.get(5),
            Some((1, &udp(5)[..], &[][..])),
            "a new frame, no route"
        );
        for s in 0..MAX_STAGES as u32 {
            r.route(5, s, 0);
        }
        assert_eq!(r.get(5).unwrap().2.len(), MAX_STAGES);
        r.route(5, 99, 0);
        assert_eq!(
            r.get(5),
            None,
            "a route longer than recorded is not learned"
        );
    }

    #[test]
    fn the_ring_keeps_only_what_the_fast_path_can_learn_from() {
        let mut r = Ring::new(4, 64);
        let mut icmp = udp(1);
        icmp[14 + 9] = 1;
        r.keep(1, 0, &icmp);
        assert_eq!(r.get(1), None, "ICMP");
        let mut arp = udp(2);
        arp[12..14].copy_from_slice(&[0x08, 0x06]);
        r.keep(2, 0, &arp);
        assert_eq!(r.get(2), None, "not IPv4");
        let big = {
            let mut f = udp(3);
            f.resize(65, 0);
            f
        };
        r.keep(3, 0, &big);
        assert_eq!(r.get(3), None, "larger than a slot");
        r.keep(0, 0, &udp(4));
        assert_eq!(r.get(0), None, "clock 0 is no packet's");
    }
}
