//! TCP stream reassembly: in-order byte streams, per direction of a connection, from
//! out-of-order, retransmitted and overlapping segments (StatelessNF Appendix, Algorithm 3).
//!
//! Two layers:
//! * A sans-IO core: a [`Stream`] is one direction's state (plain data), a [`Reassembler`] is a
//!   worker's engine (configuration, memory budget, counters). [`Reassembler::segment`] takes a
//!   segment (`seq`, flags, payload) and emits, in stream order, the bytes that became in order
//!   ([`Event::Data`]), the holes it gave up on ([`Event::Gap`]) and the end of the stream
//!   ([`Event::End`]), each at its stream offset (bytes since the first byte after the SYN).
//! * [`TcpStreams`]: the same per flow through the state API, so a flow's reassembly state is
//!   flushed to the store, survives failover and moves like any other per-flow state.
//!
//! Promises:
//! * **In order, exactly once.** Every offset of a stream is reported once, in increasing order,
//!   either as data or inside a gap. A byte once reported is final: data that arrives later for
//!   it (a retransmission, an overlap, under either policy) is ignored and counted.
//! * **Sequence numbers modulo 2^32** (RFC 793 §3.3): a segment's position is its sequence
//!   number's signed distance from the next expected one, so streams cross 2^32 (and run past
//!   4 GiB) unaffected. The SYN's sequence number is the ISN; data starts at ISN + 1
//!   (RFC 793 §3.3). Without a SYN a stream is picked up at its first segment
//!   ([`Config::midstream`], default on, as tshark does; Suricata's `midstream` is off by
//!   default).
//! * **Overlap policy** ([`OverlapPolicy`]) decides, among data not yet reported, whether the
//!   first or the last data received for a byte wins (Suricata's target-based `first` and `last`
//!   policies; see the type). Overlaps whose bytes differ are counted.
//! * **Bounded memory.** Out-of-order data is buffered up to [`Config::max_buffered`] bytes and
//!   [`Config::max_islands`] separate ranges per direction, and up to the engine's total budget
//!   (its *memcap*, passed in by the owner) over all streams. After every call the limits hold
//!   (a connection read from the store, e.g. after a failover, is charged when first used and
//!   brought within the budget by its next data segment).
//! * **Gaps are reported, never guessed.** When a limit would be exceeded, the stream skips
//!   ahead to its lowest buffered range and says so: [`Event::Gap`] `{ offset, len }`, then the
//!   data after it; the stream goes on from there. (Suricata likewise hands its parsers a gap,
//!   never invented bytes.) The bytes of a gap are counted as given up for memory. The lowest
//!   hole, the one waited for longest, is given up first.
//! * **FIN and RST.** A FIN ends its direction once every byte before it was reported; data past
//!   a FIN is dropped. An RST at the sender's next expected sequence number (RFC 5961 §3.2;
//!   see [`Reassembler::segment`]) ends both directions at once, discarding what was buffered
//!   (counted); other resets are ignored, so a forged in-window RST does not blind a consumer
//!   while the endpoints carry on. A SYN on an ended stream starts a new one at offset 0 (a new
//!   connection on the same 5-tuple); on an open stream a SYN changes nothing.
//! * **No panics on network input, no allocation on the in-order path.** A segment that lands
//!   where the stream expects it, with nothing buffered, is reported straight from the packet.
//!   Only out-of-order data is copied.
//!
//! ```
//! use flowstate_nf::reassembly::{Config, Event, Reassembler, Segment, Stream};
//! use flowstate_wire::tcp::Flags;
//!
//! let mut engine = Reassembler::new(Config::default(), 64 << 20); // 64 MiB over all streams
//! let mut client = Stream::default(); // one direction; an NF keeps it in a state map
//! let mut seen = Vec::new();
//! let mut emit = |e: Event<'_>| {
//!     if let Event::Data { offset, bytes } = e {
//!         seen.push((offset, bytes.to_vec()));
//!     }
//! };
//! let seg = |seq, flags, payload| Segment { seq, flags, payload };
//! engine.segment(&mut client, seg(u32::MAX, Flags::SYN, b""), &mut emit); // ISN 2^32 - 1
//! engine.segment(&mut client, seg(6, Flags::ACK, b"TTACK"), &mut emit); // early: buffered
//! engine.segment(&mut client, seg(0, Flags::ACK, b"EVIL A"), &mut emit); // fills the hole
//! // A matcher keeps its state from one chunk to the next: "ATTACK" spans the two.
//! assert_eq!(seen, [(0, b"EVIL A".to_vec()), (6, b"TTACK".to_vec())]);
//! ```
//!
//! Not done here: checks against the receiver's advertised window or ACKs (Suricata uses them to
//! validate segments and to find gaps sooner), and conflicts with data already reported are not
//! detected (its bytes are not kept).

use crate::early_drop::{self, Cap, Unit};
use crate::{Packet, Placement};
use flowstate_state::{
    Access, Codec, CodecError, CounterMap, Declare, Map, Nanos, Scope, StateError,
};
use flowstate_wire::dissect::Transport;
use flowstate_wire::{tcp, FlowKey};
use serde::Deserialize;
use std::collections::VecDeque;
use std::time::Duration;

// ------------------------------------------------------------------------------------------
// Configuration

/// Which data wins where segments overlap with different bytes, among data not yet reported.
///
/// Suricata's target-based policies (`stream.reassembly` / `host-os-policy`, implemented in its
/// `stream-tcp-list.c`): `First` is Suricata's `first` (also what its `vista` policy does): the
/// data received first for a byte wins. `Last` is Suricata's `last`: the newest data wins.
/// Suricata's default, `bsd`, is `first` except that a segment starting *before* an earlier
/// one's start wins over it; that policy is not offered here.
///
/// Bytes already reported are final under both policies: a consumer cannot unsee them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OverlapPolicy {
    /// Old data wins (Suricata `first`).
    #[default]
    First,
    /// New data wins (Suricata `last`).
    Last,
}

/// How a [`Reassembler`] treats every stream it handles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    /// Overlap policy.
    pub policy: OverlapPolicy,
    /// Most out-of-order bytes buffered per direction.
    pub max_buffered: u32,
    /// Most separate out-of-order ranges buffered per direction (each costs an allocation).
    pub max_islands: u16,
    /// A segment starting more than this many bytes after the next expected byte, or ending
    /// more than this many bytes before it, is outside the window: dropped and counted.
    /// Default 2^30, the largest window TCP can advertise (RFC 7323 §2.3).
    pub max_window: u32,
    /// Whether a direction seen without its SYN is picked up at its first segment.
    pub midstream: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            policy: OverlapPolicy::First,
            max_buffered: 256 * 1024,
            max_islands: 64,
            max_window: 1 << 30,
            midstream: true,
        }
    }
}

// ------------------------------------------------------------------------------------------
// Events and counters

/// Why a stream ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EndReason {
    /// Every byte up to the FIN was reported.
    Fin,
    /// A reset.
    Rst,
}

/// What a segment made known about its stream, in stream order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event<'a> {
    /// `bytes` are the stream's bytes from `offset` on.
    Data {
        /// Stream offset of `bytes[0]` (0 is the byte after the SYN).
        offset: u64,
        /// The bytes, borrowed from the packet or from the stream's buffer.
        bytes: &'a [u8],
    },
    /// The `len` bytes from `offset` on were given up: never seen, skipped for memory.
    Gap {
        /// Stream offset of the first missing byte.
        offset: u64,
        /// Number of missing bytes.
        len: u64,
    },
    /// The stream ended at `offset` (its length, gaps included).
    End {
        /// The offset after the last byte.
        offset: u64,
        /// FIN or RST.
        reason: EndReason,
    },
}

/// What a [`Reassembler`] did, summed over its streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Counters {
    /// Segments handled.
    pub segments: u64,
    /// Bytes reported as data.
    pub delivered_bytes: u64,
    /// Bytes of segments that had been reported already (retransmissions, overlaps).
    pub retransmitted_bytes: u64,
    /// Gaps reported (memory forced a skip).
    pub gaps: u64,
    /// Bytes inside gaps: given up for memory.
    pub gap_bytes: u64,
    /// Segments dropped for lying outside the window (or past a FIN, or after the end), and
    /// resets not at the expected sequence number (ignored).
    pub out_of_window: u64,
    /// Segments that overlapped buffered data with different bytes.
    pub conflicting_overlaps: u64,
    /// Buffered bytes thrown away (RST, a stream forgotten or expired, data past a FIN).
    pub discarded_bytes: u64,
    /// Streams picked up without their SYN.
    pub midstream_pickups: u64,
    /// Segments ignored because their direction has no SYN and `midstream` is off.
    pub unsynced: u64,
}

impl Counters {
    /// The counters by name, for reports.
    pub fn named(&self) -> [(&'static str, u64); 10] {
        [
            ("segments", self.segments),
            ("delivered_bytes", self.delivered_bytes),
            ("retransmitted_bytes", self.retransmitted_bytes),
            ("gaps", self.gaps),
            ("gap_bytes", self.gap_bytes),
            ("out_of_window", self.out_of_window),
            ("conflicting_overlaps", self.conflicting_overlaps),
            ("discarded_bytes", self.discarded_bytes),
            ("midstream_pickups", self.midstream_pickups),
            ("unsynced", self.unsynced),
        ]
    }
}

// ------------------------------------------------------------------------------------------
// One direction

/// Where a stream is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum Phase {
    /// No SYN (and no data picked up) yet.
    #[default]
    Unsynced,
    /// Reassembling.
    Open,
    /// Ended.
    Closed(EndReason),
}

/// A buffered out-of-order range. Islands are sorted, never overlap nor touch, and all start
/// after the stream's next expected offset. A deque, so that joining two ranges moves the
/// smaller one's bytes (to the front or the back of the larger): data arriving backwards byte
/// by byte before a large range costs O(1) a byte, not a copy of the range.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Island {
    start: u64,
    data: VecDeque<u8>,
}

impl Island {
    fn end(&self) -> u64 {
        self.start + self.data.len() as u64
    }
}

/// One direction of a TCP connection: what it expects next and what it buffers.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Stream {
    phase: Phase,
    /// Sequence number of the next byte to report.
    next_seq: u32,
    /// Stream offset of that byte.
    offset: u64,
    /// Stream offset of the FIN, once seen.
    fin: Option<u64>,
    islands: Vec<Island>,
    /// Bytes in `islands`.
    buffered: u32,
}

impl Stream {
    /// The offset of the next byte to report (bytes reported plus gaps).
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// The sequence number of the next byte to report (meaningless before the SYN).
    pub fn next_seq(&self) -> u32 {
        self.next_seq
    }

    /// Bytes buffered out of order.
    pub fn buffered_bytes(&self) -> u32 {
        self.buffered
    }

    /// Separate out-of-order ranges buffered.
    pub fn buffered_ranges(&self) -> usize {
        self.islands.len()
    }

    /// Whether the stream ended, and how.
    pub fn ended(&self) -> Option<EndReason> {
        match self.phase {
            Phase::Closed(r) => Some(r),
            _ => None,
        }
    }

    /// Whether the stream has started (a SYN, or data picked up midstream).
    pub fn started(&self) -> bool {
        self.phase != Phase::Unsynced
    }

    /// Whether a SYN with sequence number `seq` is the one this stream started with (its data
    /// started at `seq + 1`; offsets count from there, modulo 2^32).
    fn is_own_syn(&self, seq: u32) -> bool {
        self.phase != Phase::Unsynced
            && seq.wrapping_add(1) == self.next_seq.wrapping_sub(self.offset as u32)
    }

    fn open_at(&mut self, seq: u32) {
        *self = Stream {
            phase: Phase::Open,
            next_seq: seq,
            ..Stream::default()
        };
    }

    fn advance(&mut self, n: u64) {
        self.offset += n;
        // Truncation is the point: sequence numbers are modulo 2^32.
        self.next_seq = self.next_seq.wrapping_add(n as u32);
    }
}

/// A TCP segment as the reassembler needs it.
#[derive(Debug, Clone, Copy)]
pub struct Segment<'a> {
    /// Sequence number.
    pub seq: u32,
    /// Flags (only SYN, FIN and RST matter).
    pub flags: tcp::Flags,
    /// Payload (the TCP data, without Ethernet padding).
    pub payload: &'a [u8],
}

impl<'a> Segment<'a> {
    /// The segment a parsed TCP header carries.
    pub fn from_tcp(t: &'a tcp::Packet<&'a [u8]>) -> Segment<'a> {
        Segment {
            seq: t.seq_number(),
            flags: t.flags(),
            payload: t.payload(),
        }
    }
}

/// A worker's reassembly engine: the configuration, the memory budget shared by the streams it
/// handles, and counters. Streams are passed in, so they can live anywhere (in a state map).
#[derive(Debug, Clone)]
pub struct Reassembler {
    cfg: Config,
    memcap: u64,
    used: u64,
    counters: Counters,
}

impl Reassembler {
    /// An engine buffering at most `memcap` out-of-order bytes over all its streams.
    pub fn new(cfg: Config, memcap: u64) -> Self {
        Reassembler {
            cfg,
            memcap,
            used: 0,
            counters: Counters::default(),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// Counters so far.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// Out-of-order bytes buffered over all streams (as charged to this engine).
    pub fn used(&self) -> u64 {
        self.used
    }

    /// The total budget.
    pub fn memcap(&self) -> u64 {
        self.memcap
    }

    /// Handles one segment of `s`'s direction, calling `emit` with what became known, in
    /// stream order. Returns whether the segment was an accepted RST: one at the next expected
    /// sequence number, at the end of the data seen so far, or just after the FIN (or any, before
    /// the stream started). It ends `s` here; [`Connection::segment`] ends both directions.
    pub fn segment(
        &mut self,
        s: &mut Stream,
        seg: Segment<'_>,
        emit: &mut impl FnMut(Event<'_>),
    ) -> bool {
        self.counters.segments += 1;
        let f = seg.flags;
        if f.contains(tcp::Flags::RST) {
            return self.rst(s, seg.seq, emit);
        }
        let fin = f.contains(tcp::Flags::FIN);
        let data_seq = if f.contains(tcp::Flags::SYN) {
            let isn_next = seg.seq.wrapping_add(1);
            match s.phase {
                Phase::Unsynced => s.open_at(isn_next),
                // The ended stream's own SYN again (a duplicate): nothing to do, its data
                // included (it was the ended stream's).
                Phase::Closed(_) if s.is_own_syn(seg.seq) => return false,
                Phase::Closed(_) => {
                    // A new connection on the same 5-tuple (RFC 793 §3.5, TIME-WAIT reuse).
                    self.forget(s);
                    s.open_at(isn_next);
                }
                // A retransmitted SYN; with another ISN it is not this stream's (RFC 793 §3.4:
                // a SYN in the window is an error, not a new start), so its data is judged by
                // the stream's own sequence numbers.
                Phase::Open => {}
            }
            isn_next
        } else {
            if seg.payload.is_empty() && !fin {
                return false; // a bare ACK: nothing to do
            }
            match s.phase {
                Phase::Open => {}
                Phase::Unsynced if self.cfg.midstream => {
                    self.counters.midstream_pickups += 1;
                    s.open_at(seg.seq);
                }
                Phase::Unsynced => {
                    self.counters.unsynced += 1;
                    return false;
                }
                Phase::Closed(_) => {
                    self.counters.out_of_window += 1;
                    return false;
                }
            }
            seg.seq
        };
        if seg.payload.is_empty() && !fin {
            return false;
        }
        self.data(s, data_seq, seg.payload, fin, emit);
        false
    }

    /// Ends `s` by a reset (of its own or of the other direction): discards what it buffered.
    pub fn reset(&mut self, s: &mut Stream, emit: &mut impl FnMut(Event<'_>)) {
        if let Phase::Closed(_) = s.phase {
            return;
        }
        self.discard_islands(s);
        s.phase = Phase::Closed(EndReason::Rst);
        emit(Event::End {
            offset: s.offset,
            reason: EndReason::Rst,
        });
    }

    /// Forgets what `s` buffered (the stream is dropped or expired), returning its memory to
    /// the budget. Counted as discarded.
    pub fn forget(&mut self, s: &mut Stream) {
        self.discard_islands(s);
    }

    fn rst(&mut self, s: &mut Stream, seq: u32, emit: &mut impl FnMut(Event<'_>)) -> bool {
        // The sequence number of stream offset `at`.
        let seq_at = |at: u64| s.next_seq.wrapping_add(at.wrapping_sub(s.offset) as u32);
        let valid = match s.phase {
            Phase::Unsynced => true, // nothing to check it against
            Phase::Closed(EndReason::Rst) => return false,
            // RFC 5961 §3.2: a reset counts only at the next expected sequence number (an
            // in-window one gets a challenge ACK, not a reset). Also taken: where the data seen
            // so far ends (the sender's SND.NXT when segments are missing) and after its FIN.
            Phase::Open | Phase::Closed(EndReason::Fin) => {
                seq == s.next_seq
                    || s.islands.last().is_some_and(|i| seq == seq_at(i.end()))
                    || s.fin.is_some_and(|f| seq == seq_at(f + 1))
            }
        };
        if !valid {
            self.counters.out_of_window += 1;
            return false;
        }
        if s.phase == Phase::Open || s.phase == Phase::Unsynced {
            self.reset(s, emit);
        }
        true // ends the other direction too
    }

    fn discard_islands(&mut self, s: &mut Stream) {
        let n = u64::from(s.buffered);
        self.counters.discarded_bytes += n;
        self.used = self.used.saturating_sub(n);
        s.islands.clear();
        s.buffered = 0;
    }

    /// The data (and FIN) of an open stream's segment whose data starts at `seq`.
    fn data(
        &mut self,
        s: &mut Stream,
        seq: u32,
        payload: &[u8],
        fin: bool,
        emit: &mut impl FnMut(Event<'_>),
    ) {
        let win = i64::from(self.cfg.max_window);
        // RFC 793 §3.3: compare sequence numbers by their signed distance, modulo 2^32.
        let rel = i64::from(seq.wrapping_sub(s.next_seq) as i32);
        let len = payload.len() as i64;
        let end_rel = rel + len;
        if rel > win || end_rel < -win {
            self.counters.out_of_window += 1;
            return;
        }
        if fin && end_rel >= 0 && s.fin.is_none() {
            let at = s.offset + end_rel as u64;
            s.fin = Some(at);
            self.drop_past(s, at);
        }
        let mut data = payload;
        let mut start_rel = rel;
        if rel < 0 {
            let old = (-rel).min(len) as usize;
            self.counters.retransmitted_bytes += old as u64;
            data = data.get(old..).unwrap_or(&[]);
            start_rel = 0;
        }
        if let Some(f) = s.fin {
            let room = f.saturating_sub(s.offset);
            let keep = room.saturating_sub(start_rel as u64).min(data.len() as u64) as usize;
            if keep < data.len() {
                self.counters.out_of_window += 1;
                data = data.get(..keep).unwrap_or(&[]);
            }
        }
        if !data.is_empty() {
            let mut start = s.offset + start_rel as u64;
            if start == s.offset {
                // In order: report straight from the packet, up to the first buffered range.
                let room = s
                    .islands
                    .first()
                    .map_or(u64::MAX, |i| i.start.saturating_sub(s.offset));
                let direct = (data.len() as u64).min(room) as usize;
                let (now, rest) = data.split_at(direct);
                self.deliver(s, now, emit);
                data = rest;
                start += direct as u64;
            }
            if !data.is_empty() {
                self.insert(s, start, data);
            }
            self.drain(s, emit);
            self.enforce(s, emit);
        }
        if s.fin == Some(s.offset) && s.phase == Phase::Open {
            self.discard_islands(s);
            s.phase = Phase::Closed(EndReason::Fin);
            emit(Event::End {
                offset: s.offset,
                reason: EndReason::Fin,
            });
        }
    }

    fn deliver(&mut self, s: &mut Stream, bytes: &[u8], emit: &mut impl FnMut(Event<'_>)) {
        if bytes.is_empty() {
            return;
        }
        emit(Event::Data {
            offset: s.offset,
            bytes,
        });
        self.counters.delivered_bytes += bytes.len() as u64;
        s.advance(bytes.len() as u64);
    }

    /// Buffers `data` at `start` (after the next expected offset) by the overlap policy.
    fn insert(&mut self, s: &mut Stream, start: u64, data: &[u8]) {
        let end = start + data.len() as u64;
        let mut i = s.islands.partition_point(|isl| isl.end() <= start);
        let mut pos = start;
        let mut conflict = false;
        while pos < end {
            let at = |p: u64| (p - start) as usize;
            match s.islands.get_mut(i) {
                Some(isl) if isl.start <= pos => {
                    let stop = end.min(isl.end());
                    let (a, b) = ((pos - isl.start) as usize, (stop - isl.start) as usize);
                    let new = &data[at(pos)..at(stop)];
                    if b <= isl.data.len() && !isl.data.range(a..b).eq(new) {
                        conflict = true;
                        if self.cfg.policy == OverlapPolicy::Last {
                            isl.data.range_mut(a..b).zip(new).for_each(|(o, n)| *o = *n);
                        }
                    }
                    pos = stop;
                    i += 1;
                }
                next => {
                    let stop = next.map_or(end, |isl| end.min(isl.start));
                    let piece = &data[at(pos)..at(stop)];
                    s.islands.insert(
                        i,
                        Island {
                            start: pos,
                            data: piece.to_vec().into(),
                        },
                    );
                    s.buffered = s.buffered.saturating_add(piece.len() as u32);
                    self.used += piece.len() as u64;
                    pos = stop;
                    i += 1;
                }
            }
        }
        if conflict {
            self.counters.conflicting_overlaps += 1;
        }
        // Merge ranges that touch, so a run of small segments costs one buffer.
        let mut j = 1;
        while j < s.islands.len() {
            if s.islands[j - 1].end() == s.islands[j].start {
                let mut next = s.islands.remove(j).data;
                let prev = &mut s.islands[j - 1].data;
                if prev.len() >= next.len() {
                    prev.extend(next);
                } else {
                    prev.iter().rev().for_each(|b| next.push_front(*b));
                    *prev = next;
                }
            } else {
                j += 1;
            }
        }
    }

    /// Reports buffered ranges that became in order.
    fn drain(&mut self, s: &mut Stream, emit: &mut impl FnMut(Event<'_>)) {
        while s.islands.first().is_some_and(|i| i.start == s.offset) {
            let mut isl = s.islands.remove(0);
            self.unbuffer(s, isl.data.len());
            self.deliver(s, isl.data.make_contiguous(), emit);
        }
    }

    fn unbuffer(&mut self, s: &mut Stream, n: usize) {
        s.buffered = s.buffered.saturating_sub(n as u32);
        self.used = self.used.saturating_sub(n as u64);
    }

    /// Skips ahead, gap by gap, until the stream and the budget are within their limits.
    fn enforce(&mut self, s: &mut Stream, emit: &mut impl FnMut(Event<'_>)) {
        while !s.islands.is_empty()
            && (s.buffered > self.cfg.max_buffered
                || s.islands.len() > usize::from(self.cfg.max_islands)
                || self.used > self.memcap)
        {
            let mut isl = s.islands.remove(0);
            let len = isl.start - s.offset;
            emit(Event::Gap {
                offset: s.offset,
                len,
            });
            self.counters.gaps += 1;
            self.counters.gap_bytes += len;
            s.advance(len);
            self.unbuffer(s, isl.data.len());
            self.deliver(s, isl.data.make_contiguous(), emit);
            self.drain(s, emit);
        }
    }

    /// Drops buffered data at or past offset `at` (a FIN's).
    fn drop_past(&mut self, s: &mut Stream, at: u64) {
        let mut dropped = 0;
        s.islands.retain_mut(|isl| {
            if isl.start >= at {
                dropped += isl.data.len();
                false
            } else {
                if isl.end() > at {
                    dropped += (isl.end() - at) as usize;
                    isl.data.truncate((at - isl.start) as usize);
                }
                true
            }
        });
        if dropped > 0 {
            self.counters.discarded_bytes += dropped as u64;
            self.unbuffer(s, dropped);
        }
    }
}

// ------------------------------------------------------------------------------------------
// Both directions

/// Which end of a connection sent a segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Origin {
    /// The side that opened the connection (sent the SYN; or, seen midstream, the first
    /// segment).
    Client,
    /// The other side.
    Server,
}

/// Both directions of a TCP connection, indexed by whether the sender is the source of the
/// canonical flow key ([`FlowKey::canonical`]): 0 if it is, 1 if not.
#[derive(Debug, Clone, Eq)]
pub struct Connection {
    /// Index of the client's stream, once known.
    client: Option<u8>,
    streams: [Stream; 2],
    /// Whether its buffered bytes are charged to this worker's engine. Not stored: a
    /// connection read from the store (after a failover or move) is charged when it is first
    /// used here, so the budget counts what this worker holds.
    charged: bool,
}

impl Default for Connection {
    fn default() -> Self {
        Connection {
            client: None,
            streams: Default::default(),
            charged: true,
        }
    }
}

impl PartialEq for Connection {
    /// The state, not where it is charged.
    fn eq(&self, other: &Self) -> bool {
        self.client == other.client && self.streams == other.streams
    }
}

impl Connection {
    /// The stream whose sender is `origin` (`None` before the connection's first segment).
    pub fn stream(&self, origin: Origin) -> Option<&Stream> {
        let c = usize::from(self.client?);
        Some(&self.streams[if origin == Origin::Client { c } else { 1 - c }])
    }

    /// Whether both directions ended.
    pub fn ended(&self) -> bool {
        self.streams.iter().all(|s| s.ended().is_some())
    }

    /// Whether the connection may be ended early to make room (conntrack's early drop takes
    /// entries not assured): one side has not started (a SYN never answered), or it ended.
    pub fn expendable(&self) -> bool {
        !self.streams.iter().all(Stream::started) || self.ended()
    }

    /// Handles a segment sent by the side with index `side` (0: the canonical source), calling
    /// `emit` with the events of its direction (and, for an RST, the other's end). Returns who
    /// sent it.
    pub fn segment(
        &mut self,
        engine: &mut Reassembler,
        side: usize,
        seg: Segment<'_>,
        emit: &mut impl FnMut(Origin, Event<'_>),
    ) -> Origin {
        let side = side.min(1);
        self.adopt(engine);
        let client = *self.client.get_or_insert_with(|| {
            // A SYN/ACK's sender is the server; any other first segment's is the client.
            let synack = seg.flags.contains(tcp::Flags::SYN) && seg.flags.contains(tcp::Flags::ACK);
            (if synack { 1 - side } else { side }) as u8
        });
        if seg.flags.contains(tcp::Flags::SYN)
            && !seg.flags.contains(tcp::Flags::ACK)
            && self.ended()
            && !self.streams[side].is_own_syn(seg.seq)
        {
            // A new connection on the same 5-tuple: the SYN's sender is its client.
            self.client = Some(side as u8);
        }
        let origin_of = |i: usize, client: u8| {
            if i == usize::from(client) {
                Origin::Client
            } else {
                Origin::Server
            }
        };
        let client = self.client.unwrap_or(client);
        let me = origin_of(side, client);
        let [a, b] = &mut self.streams;
        let (mine, other) = if side == 0 { (a, b) } else { (b, a) };
        let reset = engine.segment(mine, seg, &mut |e| emit(me, e));
        if reset {
            let them = origin_of(1 - side, client);
            engine.reset(other, &mut |e| emit(them, e));
        }
        me
    }

    /// Forgets both directions' buffers (the connection is dropped), returning their memory.
    pub fn forget(&mut self, engine: &mut Reassembler) {
        self.adopt(engine);
        for s in &mut self.streams {
            engine.forget(s);
        }
    }

    /// Charges the buffers of a connection read from the store to `engine` (once).
    fn adopt(&mut self, engine: &mut Reassembler) {
        if !self.charged {
            self.charged = true;
            engine.used += self
                .streams
                .iter()
                .map(|s| u64::from(s.buffered))
                .sum::<u64>();
        }
    }
}

// ------------------------------------------------------------------------------------------
// Encoding (how a connection reaches the store)

impl Codec for Stream {
    fn encode(&self, out: &mut Vec<u8>) {
        let phase: u8 = match self.phase {
            Phase::Unsynced => 0,
            Phase::Open => 1,
            Phase::Closed(EndReason::Fin) => 2,
            Phase::Closed(EndReason::Rst) => 3,
        };
        (phase, self.next_seq, self.offset, self.fin).encode(out);
        (self.islands.len() as u32).encode(out);
        for i in &self.islands {
            (i.start, i.data.len() as u32).encode(out);
            let (a, b) = i.data.as_slices();
            out.extend_from_slice(a);
            out.extend_from_slice(b);
        }
    }

    fn decode(input: &mut &[u8]) -> Result<Self, CodecError> {
        let (phase, next_seq, offset, fin) = <(u8, u32, u64, Option<u64>)>::decode(input)?;
        let phase = match phase {
            0 => Phase::Unsynced,
            1 => Phase::Open,
            2 => Phase::Closed(EndReason::Fin),
            3 => Phase::Closed(EndReason::Rst),
            _ => return Err(CodecError::Invalid("reassembly phase")),
        };
        let n = u32::decode(input)?;
        let mut islands: Vec<Island> = Vec::new();
        let mut buffered: u64 = 0;
        let mut after = offset;
        for _ in 0..n {
            let (start, len) = <(u64, u32)>::decode(input)?;
            let len = len as usize;
            if input.len() < len {
                return Err(CodecError::Truncated);
            }
            let (bytes, rest) = input.split_at(len);
            *input = rest;
            let data = VecDeque::from(bytes.to_vec());
            // Sorted, apart, after the next expected offset, before the FIN, not empty.
            let end = start.checked_add(data.len() as u64);
            let ok = start > after
                && !data.is_empty()
                && end.is_some_and(|e| fin.is_none_or(|f| e <= f));
            if !ok {
                return Err(CodecError::Invalid("reassembly buffer"));
            }
            after = end.unwrap_or(u64::MAX);
            buffered += data.len() as u64;
            islands.push(Island { start, data });
        }
        let buffered =
            u32::try_from(buffered).map_err(|_| CodecError::Invalid("reassembly buffer"))?;
        if fin.is_some_and(|f| f < offset) {
            return Err(CodecError::Invalid("reassembly fin"));
        }
        Ok(Stream {
            phase,
            next_seq,
            offset,
            fin,
            islands,
            buffered,
        })
    }
}

impl Codec for Connection {
    fn encode(&self, out: &mut Vec<u8>) {
        self.client.encode(out);
        self.streams[0].encode(out);
        self.streams[1].encode(out);
    }

    fn decode(input: &mut &[u8]) -> Result<Self, CodecError> {
        let client = Option::<u8>::decode(input)?;
        if client.is_some_and(|c| c > 1) {
            return Err(CodecError::Invalid("reassembly client"));
        }
        Ok(Connection {
            client,
            streams: [Stream::decode(input)?, Stream::decode(input)?],
            charged: false,
        })
    }
}

// ------------------------------------------------------------------------------------------
// Per flow, through the state API

/// `[reassembly]` options of an NF that reassembles TCP streams.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TableConfig {
    /// `first` (default) or `last`.
    pub policy: OverlapPolicy,
    /// Most out-of-order bytes buffered per direction (default 262144).
    pub max_buffered: u32,
    /// Most separate out-of-order ranges per direction (default 64).
    pub max_islands: u16,
    /// Window, bytes (default 2^30).
    pub max_window: u32,
    /// Out-of-order bytes per worker over all flows (default 64 MiB).
    pub memcap: u64,
    /// Pick up streams seen without their SYN (default true).
    pub midstream: bool,
    /// Idle timeout of a connection with both directions started (default 10m, Suricata's
    /// `flow-timeouts.tcp.established`).
    #[serde(deserialize_with = "flowstate_config::deserialize_duration")]
    pub timeout: Duration,
    /// Idle timeout of a connection only one side of which has sent (a SYN without an answer,
    /// a flood of them) (default 60s, Suricata's `flow-timeouts.tcp.new`).
    #[serde(deserialize_with = "flowstate_config::deserialize_duration")]
    pub timeout_new: Duration,
    /// Idle timeout of a connection whose both directions ended (default 60s).
    #[serde(deserialize_with = "flowstate_config::deserialize_duration")]
    pub timeout_closed: Duration,
}

impl Default for TableConfig {
    fn default() -> Self {
        let c = Config::default();
        TableConfig {
            policy: c.policy,
            max_buffered: c.max_buffered,
            max_islands: c.max_islands,
            max_window: c.max_window,
            memcap: 64 << 20,
            midstream: c.midstream,
            timeout: Duration::from_secs(600),
            timeout_new: Duration::from_secs(60),
            timeout_closed: Duration::from_secs(60),
        }
    }
}

impl TableConfig {
    /// The core's configuration.
    pub fn core(&self) -> Config {
        Config {
            policy: self.policy,
            max_buffered: self.max_buffered,
            max_islands: self.max_islands,
            max_window: self.max_window,
            midstream: self.midstream,
        }
    }

    /// Checks the values; the error names the key.
    pub fn validate(&self) -> Result<(), (&'static str, String)> {
        for (k, d) in [
            ("timeout", self.timeout),
            ("timeout_new", self.timeout_new),
            ("timeout_closed", self.timeout_closed),
        ] {
            if d.is_zero() {
                return Err((k, "expected a duration above zero, like \"60s\"".into()));
            }
        }
        if self.max_window == 0 || self.max_window > 1 << 30 {
            return Err(("max_window", "expected 1 to 2^30 bytes".into()));
        }
        if self.max_islands == 0 {
            return Err(("max_islands", "expected at least 1".into()));
        }
        Ok(())
    }
}

/// What [`TcpStreams::feed`] made of a packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fed {
    /// Not a TCP segment with ports (not IP, not TCP, a later fragment).
    NotTcp,
    /// The TCP header could not be read.
    Malformed,
    /// The connection's state could not be read from the store.
    Unavailable,
    /// A new connection found the table at its cap with nothing to end early: not tracked.
    Full,
    /// Handled; sent by this end.
    Tcp(Origin),
}

/// Reassembly per flow through the state API: each connection's [`Connection`] lives in a
/// per-flow map (keyed by the canonical flow key, expiring when idle), so it is flushed to the
/// store, and a worker that takes the flow over (failover, a move) continues where this one
/// stopped.
///
/// The map is capped ([`TcpStreams::declare_capped`]; `max_streams`, counted as
/// `streams_early_dropped` and `streams_table_full`): at the cap a new connection ends the
/// oldest one that is expendable — not both directions started (a SYN never answered), or
/// both ended — with early drop (as conntrack's), else it is not tracked ([`Fed::Full`]).
pub struct TcpStreams {
    engine: Reassembler,
    conns: Map<FlowKey, Connection>,
    cap: Cap<FlowKey>,
    stats: CounterMap<u8>,
    published: Counters,
    timeout: Duration,
    timeout_new: Duration,
    timeout_closed: Duration,
}

impl TcpStreams {
    /// Declares the state (`tcp_streams`, per flow; `tcp_reassembly`, counters) in the NF's
    /// namespace, with the default cap (262,144 connections) and early drop.
    pub fn declare(state: &mut Declare<'_>, cfg: &TableConfig) -> Result<TcpStreams, StateError> {
        let one = Placement {
            stage: 0,
            partition: 0,
            partitions: 1,
        };
        TcpStreams::declare_capped(state, cfg, early_drop::DEFAULT_MAX, true, one)
    }

    /// [`TcpStreams::declare`] for `worker`, holding at most its share of `max` connections,
    /// with early drop `early_drop`.
    pub fn declare_capped(
        state: &mut Declare<'_>,
        cfg: &TableConfig,
        max: u64,
        early_drop: bool,
        worker: Placement,
    ) -> Result<TcpStreams, StateError> {
        Ok(TcpStreams {
            engine: Reassembler::new(cfg.core(), cfg.memcap),
            conns: state.map("tcp_streams", Scope::PerFlow, Access::ReadWrite)?,
            cap: Cap::declare(state, Unit::Streams, max, early_drop, worker)?,
            stats: state.counter_map(
                "tcp_reassembly",
                Scope::CrossFlow(&[]),
                Access::WriteMostly,
            )?,
            published: Counters::default(),
            timeout: cfg.timeout,
            timeout_new: cfg.timeout_new,
            timeout_closed: cfg.timeout_closed,
        })
    }

    /// The engine (counters, memory in use).
    pub fn engine(&self) -> &Reassembler {
        &self.engine
    }

    /// Connections this worker holds.
    pub fn connections(&self) -> usize {
        self.conns.cached_len()
    }

    /// A copy of the state of the connection `flow` (either direction) belongs to.
    pub fn connection(&self, flow: &FlowKey) -> Option<Connection> {
        self.conns.get(&flow.canonical()).ok().flatten()
    }

    /// Hints that `pkt` will be fed soon: starts loading its connection's entry (see
    /// [`NetworkFunction::prefetch`](crate::NetworkFunction::prefetch)).
    #[inline]
    pub fn prefetch(&self, pkt: &Packet<'_>) {
        if let (Some(flow), Transport::Tcp) = (pkt.dissection.flow, pkt.dissection.transport) {
            self.conns.prefetch(&flow.canonical());
        }
    }

    /// Feeds a packet: if it is a TCP segment, calls `emit` with the events of its direction
    /// (see [`Connection::segment`]) and returns who sent it. `emit` must not use this table.
    pub fn feed(
        &mut self,
        pkt: &Packet<'_>,
        now: Nanos,
        mut emit: impl FnMut(Origin, Event<'_>),
    ) -> Fed {
        let d = &pkt.dissection;
        let (Some(flow), Transport::Tcp, Some(l4)) = (d.flow, d.transport, d.l4_offset) else {
            return Fed::NotTcp;
        };
        let Some(t) = pkt
            .data
            .get(l4..d.l3_end)
            .and_then(|b| tcp::Packet::new_checked(b).ok())
        else {
            return Fed::Malformed;
        };
        let seg = Segment::from_tcp(&t);
        let side = usize::from(!flow.is_canonical());
        let key = flow.canonical();
        let engine = &mut self.engine;
        let (open, new, closed) = (self.timeout, self.timeout_new, self.timeout_closed);
        let mut run = |engine: &mut Reassembler, c: &mut Connection| {
            let o = c.segment(engine, side, seg, &mut emit);
            let ttl = if c.ended() {
                closed
            } else if c.streams.iter().all(Stream::started) {
                open
            } else {
                new
            };
            (ttl, o)
        };
        let conns = &self.conns;
        match conns.renew_with(&key, now, |c| run(engine, c)) {
            Ok(Some(o)) => Fed::Tcp(o),
            Ok(None) => {
                let room = self.cap.admit(conns.cached_len(), |k| {
                    let Ok(Some(true)) = conns.with(&k, |c| c.map(Connection::expendable)) else {
                        return false;
                    };
                    conns
                        .remove_nowait(&k)
                        .map(|mut c| c.forget(engine))
                        .is_some()
                });
                if !room {
                    return Fed::Full;
                }
                let mut c = Connection::default();
                let (ttl, o) = run(engine, &mut c);
                conns.insert_nowait(key, c);
                conns.expire_after(&key, ttl, now);
                self.cap.remember(key);
                Fed::Tcp(o)
            }
            Err(_) => Fed::Unavailable,
        }
    }

    /// Whether the connection `flow` (either direction) belongs to is not tracked, or may be
    /// ended early ([`Connection::expendable`]); `false` when its state cannot be read.
    pub fn expendable(&self, flow: &FlowKey) -> bool {
        self.conns
            .with(&flow.canonical(), |c| c.is_none_or(Connection::expendable))
            .unwrap_or(false)
    }

    /// Forgets the connection `flow` (either direction) belongs to, returning its buffers to
    /// the budget (its flow was ended early by the NF).
    pub fn forget(&mut self, flow: &FlowKey) {
        if let Some(mut c) = self.conns.remove_nowait(&flow.canonical()) {
            c.forget(&mut self.engine);
        }
    }

    /// Expires idle connections (returning their buffers to the budget) and publishes the
    /// counters to the state API. Call from [`NetworkFunction::on_tick`](crate::NetworkFunction::on_tick).
    pub fn on_tick(&mut self, now: Nanos) {
        let engine = &mut self.engine;
        self.conns.expire(now, |_, mut c| c.forget(engine));
        let now_c = self.engine.counters.named();
        let before = self.published.named();
        for (i, ((_, n), (_, b))) in now_c.iter().zip(before.iter()).enumerate() {
            if n != b {
                self.stats
                    .add_to_nowait(&(i as u8), n.wrapping_sub(*b) as i64);
            }
        }
        self.published = self.engine.counters;
    }

    /// The cap's counters and this worker's cap (`streams_early_dropped`,
    /// `streams_table_full`, `max_streams`).
    pub(crate) fn report_cap(&self, out: &mut Vec<(&'static str, i64)>) {
        self.cap.report(out);
    }

    /// Counters worth showing an operator.
    pub fn report(&self) -> Vec<(&'static str, i64)> {
        let mut out: Vec<(&'static str, i64)> = self
            .engine
            .counters
            .named()
            .iter()
            .map(|(k, v)| (*k, *v as i64))
            .collect();
        out.push(("buffered_bytes", self.engine.used as i64));
        out.push(("connections", self.conns.cached_len() as i64));
        self.cap.report(&mut out);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SYN: u8 = 0x02;
    const FIN: u8 = 0x01;
    const RST: u8 = 0x04;
    const ACK: u8 = 0x10;

    /// What a stream reported, flattened: data bytes with gaps as `?` runs, and the end.
    #[derive(Debug, Default)]
    struct Seen {
        bytes: Vec<u8>,
        events: Vec<String>,
        next: u64,
        end: Option<EndReason>,
    }

    impl Seen {
        fn push(&mut self, e: Event<'_>) {
            match e {
                Event::Data { offset, bytes } => {
                    assert_eq!(offset, self.next, "data in order");
                    assert!(!bytes.is_empty());
                    self.bytes.extend_from_slice(bytes);
                    self.next += bytes.len() as u64;
                    self.events.push(format!("data {offset} {}", bytes.len()));
                }
                Event::Gap { offset, len } => {
                    assert_eq!(offset, self.next, "gap in order");
                    assert!(len > 0);
                    self.bytes.extend(std::iter::repeat_n(b'?', len as usize));
                    self.next += len;
                    self.events.push(format!("gap {offset} {len}"));
                }
                Event::End { offset, reason } => {
                    assert_eq!(offset, self.next);
                    assert!(self.end.is_none(), "one end");
                    self.end = Some(reason);
                    self.events.push(format!("end {offset} {reason:?}"));
                }
            }
        }
    }

    struct H {
        eng: Reassembler,
        s: Stream,
        seen: Seen,
        isn: u32,
    }

    impl H {
        fn new(cfg: Config, isn: u32) -> H {
            let mut h = H {
                eng: Reassembler::new(cfg, u64::MAX),
                s: Stream::default(),
                seen: Seen::default(),
                isn,
            };
            h.raw(isn, SYN, b"");
            h
        }

        fn policy(p: OverlapPolicy) -> H {
            H::new(
                Config {
                    policy: p,
                    ..Config::default()
                },
                1000,
            )
        }

        fn raw(&mut self, seq: u32, flags: u8, data: &[u8]) -> bool {
            let seg = Segment {
                seq,
                flags: tcp::Flags(flags),
                payload: data,
            };
            let seen = &mut self.seen;
            self.eng.segment(&mut self.s, seg, &mut |e| seen.push(e))
        }

        /// Data at stream offset `off`.
        fn at(&mut self, off: u32, data: &[u8]) {
            self.raw(self.isn.wrapping_add(1).wrapping_add(off), ACK, data);
        }

        fn fin_at(&mut self, off: u32, data: &[u8]) {
            self.raw(self.isn.wrapping_add(1).wrapping_add(off), ACK | FIN, data);
        }

        fn text(&self) -> String {
            String::from_utf8_lossy(&self.seen.bytes).into_owned()
        }
    }

    #[test]
    fn in_order_is_reported_from_the_packet() {
        let mut h = H::policy(OverlapPolicy::First);
        h.at(0, b"hello ");
        h.at(6, b"world");
        assert_eq!(h.text(), "hello world");
        assert_eq!(h.seen.events, ["data 0 6", "data 6 5"]);
        assert_eq!(h.s.buffered_bytes(), 0);
        assert_eq!(h.eng.counters().delivered_bytes, 11);
    }

    #[test]
    fn out_of_order_waits_for_the_hole() {
        let mut h = H::policy(OverlapPolicy::First);
        h.at(10, b"KLMNO");
        h.at(5, b"FGHIJ");
        assert!(h.seen.events.is_empty());
        assert_eq!((h.s.buffered_bytes(), h.s.buffered_ranges()), (10, 1));
        h.at(0, b"ABCDE");
        assert_eq!(h.text(), "ABCDEFGHIJKLMNO");
        assert_eq!(h.seen.events, ["data 0 5", "data 5 10"]);
        assert_eq!(h.eng.used(), 0);
    }

    #[test]
    fn retransmissions_are_reported_once() {
        let mut h = H::policy(OverlapPolicy::Last);
        h.at(0, b"abc");
        h.at(0, b"abc");
        h.at(0, b"XYZdef"); // partly old: only "def" is new, and "abc" stays (reported)
        h.at(5, b"fgh");
        assert_eq!(h.text(), "abcdefgh");
        assert_eq!(h.eng.counters().retransmitted_bytes, 3 + 3 + 1);
    }

    #[test]
    fn conflicting_overlap_first_keeps_old_data() {
        let mut h = H::policy(OverlapPolicy::First);
        h.at(5, b"AAAAA");
        h.at(7, b"BBBBB");
        h.at(0, b"xxxxx");
        assert_eq!(h.text(), "xxxxxAAAAABB");
        assert_eq!(h.eng.counters().conflicting_overlaps, 1);
    }

    #[test]
    fn conflicting_overlap_last_takes_new_data() {
        let mut h = H::policy(OverlapPolicy::Last);
        h.at(5, b"AAAAA");
        h.at(7, b"BBBBB");
        h.at(3, b"CCC"); // starts before, ends inside
        h.at(0, b"xxxxxxxxxxxxx"); // covers everything: newest, but 0..3 only is a hole
        assert_eq!(h.text(), "xxxxxxxxxxxxx");
        let mut h = H::policy(OverlapPolicy::Last);
        h.at(5, b"AAAAA");
        h.at(7, b"BBBBB");
        h.at(3, b"CCC");
        h.at(0, b"xxx");
        assert_eq!(h.text(), "xxxCCCABBBBB");
        assert_eq!(h.eng.counters().conflicting_overlaps, 2);
    }

    #[test]
    fn in_order_packet_over_buffered_data_follows_the_policy() {
        for (p, want) in [
            (OverlapPolicy::First, "xxxAAAxx"),
            (OverlapPolicy::Last, "xxxxxxxx"),
        ] {
            let mut h = H::policy(p);
            h.at(3, b"AAA");
            h.at(0, b"xxxxxxxx");
            assert_eq!(h.text(), want, "{p:?}");
            assert_eq!(h.seen.events, ["data 0 3", "data 3 5"]);
        }
    }

    #[test]
    fn reported_bytes_are_final_under_both_policies() {
        for p in [OverlapPolicy::First, OverlapPolicy::Last] {
            let mut h = H::policy(p);
            h.at(0, b"abcd");
            h.at(2, b"XXYY");
            assert_eq!(h.text(), "abcdYY");
        }
    }

    #[test]
    fn tiny_segments_in_reverse_coalesce() {
        let mut h = H::policy(OverlapPolicy::First);
        let msg = b"0123456789abcdefghij";
        for i in (1..msg.len()).rev() {
            h.at(i as u32, &msg[i..=i]);
            assert_eq!(h.s.buffered_ranges(), 1);
        }
        h.at(0, b"0");
        assert_eq!(h.seen.bytes, msg);
    }

    /// Joining ranges moves the smaller one: bytes arriving backwards before a large buffered
    /// range cost O(1) each (copying the range each time would be ~4 GB here).
    #[test]
    fn backwards_bytes_before_a_large_range() {
        let mut h = H::policy(OverlapPolicy::First);
        let big = vec![b'b'; 200_000];
        h.at(20_000, &big);
        for off in (1..20_000u32).rev() {
            h.at(off, b"a");
        }
        assert_eq!(h.s.buffered_ranges(), 1);
        h.at(0, b"a");
        assert_eq!(h.seen.bytes.len(), 220_000);
        assert!(h.seen.bytes[..20_000].iter().all(|b| *b == b'a'));
        assert!(h.seen.bytes[20_000..].iter().all(|b| *b == b'b'));
        assert_eq!(h.seen.events, ["data 0 1", "data 1 219999"]);
    }

    #[test]
    fn sequence_numbers_wrap() {
        let isn = u32::MAX - 3;
        let mut h = H::new(Config::default(), isn);
        // Offsets 0..4 are seq 2^32-2 .. 1: across the wrap, out of order.
        h.at(6, b"ghij");
        h.at(2, b"cdef");
        h.at(0, b"ab");
        assert_eq!(h.text(), "abcdefghij");
        assert_eq!(h.s.next_seq(), isn.wrapping_add(11));
        // A retransmission from before the wrap is old, not far ahead.
        h.at(0, b"ab");
        assert_eq!(h.text(), "abcdefghij");
        assert_eq!(h.eng.counters().out_of_window, 0);
    }

    #[test]
    fn a_long_stream_runs_past_4_gib() {
        let mut eng = Reassembler::new(Config::default(), 1 << 20);
        let mut s = Stream::default();
        let syn = |seq| Segment {
            seq,
            flags: tcp::Flags(SYN),
            payload: &[],
        };
        eng.segment(&mut s, syn(7), &mut |_| {});
        let chunk = vec![b'z'; 60_000];
        let (mut off, mut next) = (0u64, 0u64);
        while off < (1u64 << 32) + 200_000 {
            let seg = Segment {
                seq: 8u32.wrapping_add(off as u32),
                flags: tcp::Flags(ACK),
                payload: &chunk,
            };
            eng.segment(&mut s, seg, &mut |e| match e {
                Event::Data { offset, bytes } => {
                    assert_eq!(offset, next);
                    next += bytes.len() as u64;
                }
                other => panic!("{other:?}"),
            });
            off += chunk.len() as u64;
        }
        assert_eq!((s.offset(), next), (off, off));
    }

    #[test]
    fn memory_limit_forces_a_reported_gap() {
        let mut h = H::new(
            Config {
                max_buffered: 10,
                ..Config::default()
            },
            1000,
        );
        h.at(5, b"FGHIJ");
        h.at(12, b"MNOPQ");
        assert!(h.seen.events.is_empty());
        h.at(20, b"U"); // 11 bytes buffered: skip ahead to the first range
        assert_eq!(h.seen.events, ["gap 0 5", "data 5 5"]);
        assert_eq!(h.s.buffered_bytes(), 6);
        h.at(10, b"KL");
        h.at(17, b"RST");
        assert_eq!(h.text(), "?????FGHIJKLMNOPQRSTU");
        assert_eq!(h.eng.counters().gaps, 1);
        assert_eq!(h.eng.counters().gap_bytes, 5);
        // The data of the gap arrives late: old, ignored.
        h.at(0, b"ABCDE");
        assert_eq!(h.text(), "?????FGHIJKLMNOPQRSTU");
    }

    #[test]
    fn a_segment_larger_than_the_limit_jumps_ahead() {
        let mut h = H::new(
            Config {
                max_buffered: 4,
                ..Config::default()
            },
            1000,
        );
        h.at(3, b"defgh");
        assert_eq!(h.seen.events, ["gap 0 3", "data 3 5"]);
        assert_eq!(h.eng.used(), 0);
    }

    #[test]
    fn too_many_ranges_force_a_gap() {
        let mut h = H::new(
            Config {
                max_islands: 3,
                ..Config::default()
            },
            1000,
        );
        for off in [2, 4, 6, 8] {
            h.at(off, b"x");
        }
        assert_eq!(h.s.buffered_ranges(), 3);
        assert_eq!(h.seen.events, ["gap 0 2", "data 2 1"]);
    }

    #[test]
    fn the_budget_is_shared_by_streams() {
        let mut eng = Reassembler::new(Config::default(), 8);
        let (mut a, mut b) = (Stream::default(), Stream::default());
        let mut ev = Vec::new();
        let seg = |seq, payload| Segment {
            seq,
            flags: tcp::Flags(ACK),
            payload,
        };
        let syn = Segment {
            seq: 0,
            flags: tcp::Flags(SYN),
            payload: &[],
        };
        eng.segment(&mut a, syn, &mut |_| {});
        eng.segment(&mut b, syn, &mut |_| {});
        eng.segment(&mut a, seg(10, b"aaaaaa"), &mut |_| {});
        assert_eq!(eng.used(), 6);
        // b needs 6 more: over budget; b has nothing of its own to skip but its new data.
        eng.segment(&mut b, seg(20, b"bbbbbb"), &mut |e| {
            ev.push(format!("{e:?}"))
        });
        assert_eq!(ev.len(), 2, "{ev:?}");
        assert!(ev[0].starts_with("Gap { offset: 0, len: 19 }"));
        assert_eq!(eng.used(), 6);
        assert!(eng.used() <= eng.memcap());
        let mut c = Connection::default();
        c.streams[0] = a;
        c.forget(&mut eng);
        assert_eq!(eng.used(), 0);
        assert_eq!(eng.counters().discarded_bytes, 6);
    }

    #[test]
    fn fin_ends_after_the_last_byte() {
        let mut h = H::policy(OverlapPolicy::First);
        h.fin_at(5, b"world");
        h.at(10, b"junk"); // past the FIN
        assert_eq!(h.seen.end, None);
        h.at(0, b"hello");
        assert_eq!(h.text(), "helloworld");
        assert_eq!(h.seen.end, Some(EndReason::Fin));
        assert_eq!(h.s.ended(), Some(EndReason::Fin));
        assert_eq!(h.eng.used(), 0);
        h.at(10, b"more");
        assert_eq!(h.text(), "helloworld");
        assert!(h.eng.counters().out_of_window >= 2);
    }

    #[test]
    fn a_fin_drops_buffered_data_past_it() {
        let mut h = H::policy(OverlapPolicy::First);
        h.at(8, b"89abc");
        h.fin_at(5, b"567");
        assert_eq!(h.s.buffered_bytes(), 3);
        h.at(0, b"01234");
        assert_eq!(h.text(), "01234567");
        assert_eq!(h.seen.end, Some(EndReason::Fin));
        assert_eq!(h.eng.counters().discarded_bytes, 5);
    }

    #[test]
    fn rst_ends_and_discards() {
        let mut h = H::policy(OverlapPolicy::First);
        h.at(0, b"ab");
        h.at(5, b"xyz");
        assert!(
            !h.raw(h.isn.wrapping_add(0x8000_0000), RST, b""),
            "outside the window"
        );
        assert!(
            !h.raw(h.isn.wrapping_add(5), RST, b""),
            "in the window, not exact"
        );
        assert_eq!(h.seen.end, None);
        assert_eq!(h.eng.counters().out_of_window, 2);
        assert!(h.raw(h.isn.wrapping_add(3), RST | ACK, b""));
        assert_eq!(h.seen.events.last().unwrap(), "end 2 Rst");
        assert_eq!(h.eng.used(), 0);
        assert_eq!(h.eng.counters().discarded_bytes, 3);
        h.at(2, b"cd");
        assert_eq!(h.text(), "ab");
    }

    #[test]
    fn rst_ends_both_directions_of_a_connection() {
        let mut eng = Reassembler::new(Config::default(), 1 << 20);
        let mut c = Connection::default();
        let mut ev = Vec::new();
        let mut feed = |c: &mut Connection, side, seq, flags, payload: &[u8]| {
            let seg = Segment {
                seq,
                flags: tcp::Flags(flags),
                payload,
            };
            c.segment(&mut eng, side, seg, &mut |o, e| {
                ev.push(format!("{o:?} {e:?}"))
            })
        };
        assert_eq!(feed(&mut c, 1, 100, SYN, b""), Origin::Client);
        assert_eq!(feed(&mut c, 0, 500, SYN | ACK, b""), Origin::Server);
        feed(&mut c, 1, 101, ACK, b"GET");
        feed(&mut c, 0, 501, ACK, b"200");
        feed(&mut c, 0, 504, RST, b"");
        assert!(c.ended());
        assert_eq!(c.stream(Origin::Client).unwrap().offset(), 3);
        // The old SYN again changes nothing; a new SYN on the 5-tuple starts over, its sender
        // the client.
        feed(&mut c, 1, 100, SYN, b"");
        assert!(c.ended());
        feed(&mut c, 0, 9000, SYN, b"");
        assert!(!c.ended());
        assert_eq!(c.stream(Origin::Client).unwrap().offset(), 0);
        assert_eq!(
            ev[2..],
            [
                "Server End { offset: 3, reason: Rst }",
                "Client End { offset: 3, reason: Rst }"
            ]
        );
    }

    #[test]
    fn midstream_pickup_is_configurable() {
        let mut eng = Reassembler::new(Config::default(), 1 << 20);
        let mut s = Stream::default();
        let mut got = Vec::new();
        let seg = Segment {
            seq: 77,
            flags: tcp::Flags(ACK),
            payload: b"mid",
        };
        eng.segment(&mut s, seg, &mut |e| got.push(format!("{e:?}")));
        assert_eq!(got, ["Data { offset: 0, bytes: [109, 105, 100] }"]);
        let mut eng = Reassembler::new(
            Config {
                midstream: false,
                ..Config::default()
            },
            1 << 20,
        );
        let mut s = Stream::default();
        eng.segment(&mut s, seg, &mut |_| panic!("nothing is reported"));
        assert_eq!(eng.counters().unsynced, 1);
    }

    #[test]
    fn out_of_window_is_dropped() {
        let mut h = H::new(
            Config {
                max_window: 1000,
                ..Config::default()
            },
            1000,
        );
        h.at(5000, b"far");
        assert_eq!(h.eng.counters().out_of_window, 1);
        assert_eq!(h.s.buffered_bytes(), 0);
    }

    #[test]
    fn syn_data_and_syns_on_an_open_stream() {
        let mut h = H::policy(OverlapPolicy::First);
        h.raw(5000, SYN, b""); // another ISN: not this stream's
        h.raw(5001, ACK, b"forged"); // far ahead of the stream: buffered, not reported
        h.at(0, b"ok");
        assert_eq!(h.text(), "ok");
        let mut h = H::new(Config::default(), 10);
        h.raw(10, SYN, b"tfo"); // a retransmitted SYN with data (TCP Fast Open)
        assert_eq!(h.text(), "tfo");
    }

    #[test]
    fn a_reset_after_the_fin_or_past_a_hole_counts() {
        let mut h = H::policy(OverlapPolicy::First);
        h.fin_at(0, b"bye");
        assert_eq!(h.seen.end, Some(EndReason::Fin));
        assert!(
            h.raw(h.isn.wrapping_add(1 + 3 + 1), RST, b""),
            "after the FIN"
        );
        assert_eq!(h.seen.events.last().unwrap(), "end 3 Fin", "ended once");
        let mut h = H::policy(OverlapPolicy::First);
        h.at(4, b"late");
        assert!(
            h.raw(h.isn.wrapping_add(1 + 8), RST, b""),
            "at the data's end"
        );
        assert_eq!(h.seen.end, Some(EndReason::Rst));
        let mut eng = Reassembler::new(Config::default(), 1 << 20);
        let mut s = Stream::default();
        let rst = Segment {
            seq: 99,
            flags: tcp::Flags(RST | ACK),
            payload: &[],
        };
        assert!(eng.segment(&mut s, rst, &mut |_| {}), "unsynced: taken");
        assert_eq!(s.ended(), Some(EndReason::Rst));
    }

    #[test]
    fn table_config_parses_and_names_bad_keys() {
        let t: toml::Table = "policy = \"last\"\nmax_buffered = 4096\nmemcap = 1048576"
            .parse()
            .unwrap();
        let c = TableConfig::deserialize(toml::Value::Table(t)).unwrap();
        assert_eq!(c.policy, OverlapPolicy::Last);
        assert_eq!(
            (c.max_buffered, c.memcap, c.max_islands),
            (4096, 1 << 20, 64)
        );
        assert!(c.validate().is_ok());
        let bad: toml::Table = "policy = \"bsd\"".parse().unwrap();
        assert!(TableConfig::deserialize(toml::Value::Table(bad)).is_err());
        let bad: toml::Table = "max_bufered = 1".parse().unwrap();
        assert!(TableConfig::deserialize(toml::Value::Table(bad)).is_err());
        let c = TableConfig {
            timeout: Duration::ZERO,
            ..TableConfig::default()
        };
        assert_eq!(c.validate().unwrap_err().0, "timeout");
        let bad: toml::Table = "timeout_new = 60".parse().unwrap();
        let e = TableConfig::deserialize(toml::Value::Table(bad)).unwrap_err();
        assert!(e.message().contains("\"60s\""), "{e}");
    }

    #[test]
    fn streams_round_trip_through_the_codec() {
        let mut h = H::policy(OverlapPolicy::First);
        h.at(0, b"ab");
        h.at(5, b"xyz");
        h.at(10, b"q");
        h.fin_at(12, b"");
        let c = Connection {
            client: Some(1),
            streams: [h.s.clone(), Stream::default()],
            charged: true,
        };
        let b = c.to_bytes();
        assert_eq!(Connection::from_bytes(&b).unwrap(), c);
        for cut in 0..b.len() {
            assert!(Connection::from_bytes(&b[..cut]).is_err());
        }
        // Overlapping ranges do not decode.
        let mut bad = h.s.clone();
        bad.islands[1].start = 6;
        assert!(Stream::from_bytes(&bad.to_bytes()).is_err());
    }
}
