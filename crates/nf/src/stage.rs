//! The stage engine: the NFs of one stage of a chain, built for one traffic partition, run
//! over a batch of packets. A host's worker (`flowstate_chain`'s runtime) and a cluster's
//! instance (one engine per partition it owns) both hold one, so a packet meets the same
//! loop, the same counters and the same flow cache wherever it runs.
//!
//! Promises:
//! * **NF by NF over the batch** ([`Stage::run`]): each NF prefetches the state of every
//!   packet still going, as the NFs before it left the packet, then processes them in order
//!   (the chain's order when Outbound, last NF first when Inbound). A packet an NF drops stops
//!   there. A packet an NF turns back inside ([`Packet::direction`] set to Inbound: a NAT's
//!   hairpinning) meets the NFs before that one at once, inbound, and none after it (in this
//!   stage: a cluster's later stages see it as before). So an NF after a NAT prefetches the
//!   entries it will look up, and each NF sees a flow's packets in the order they came, as
//!   long as the caller gives a batch of one direction whose packets are of distinct flows
//!   (or in flow order).
//! * **Counted once, named once**: every NF's packets in, forwarded and dropped by reason
//!   ([`NfCounters`]), its own report, gauges and labelled counts ([`StageReport`]), read the
//!   same way on a box and in a cluster.
//! * **The flow cache** ([`FlowCache`], HyperSFC's fast path) runs in front of the NFs when
//!   asked for, and only for a chain whose every NF allows it ([`NfFactory::fast_path`]).
//! * Nothing is allocated per packet: the counters' reasons are a short list grown once per
//!   new reason, the cache's buffers are kept.

mod flowcache;

use flowcache::Told;

pub use flowcache::{
    FlowCache, DEFAULT_CAPACITY, DEFAULT_REFRESH, MAX_CAPACITY, MAX_REFRESH, MIN_CAPACITY,
};

use crate::{
    BuildError, Context, Direction, Labelled, NetworkFunction, NfFactory, Packet, Placement,
    Verdict,
};
use flowstate_state::{Nanos, Partition};
use flowstate_wire::{Dissection, FlowKey};
use std::sync::Arc;
use std::time::Duration;

/// The frames of a batch, by index: what the engine reads and rewrites.
pub trait Frames {
    /// The frame at `index`, if there is one.
    fn frame(&self, index: usize) -> Option<&[u8]>;
    /// The frame at `index`, to rewrite.
    fn frame_mut(&mut self, index: usize) -> Option<&mut [u8]>;
}

/// One frame alone, at index 0.
impl Frames for [u8] {
    fn frame(&self, index: usize) -> Option<&[u8]> {
        (index == 0).then_some(self)
    }

    fn frame_mut(&mut self, index: usize) -> Option<&mut [u8]> {
        (index == 0).then_some(self)
    }
}

/// A packet of a batch on its way through the stage NF by NF.
#[derive(Debug, Clone, Copy)]
pub struct Item {
    /// Its frame's index in the batch ([`Frames`]).
    pub index: usize,
    /// Its dissection as the NFs before left it.
    pub dissection: Dissection,
    /// The time the NFs see for it.
    pub now: Nanos,
    /// Its logical clock (CHC §5.1; 0 where nothing stamps packets).
    pub clock: u64,
    /// Every NF so far forwarded it.
    pub alive: bool,
    /// The flow cache forwarded it: the NFs skip it.
    pub fast: bool,
    /// An NF turned it back inside (a NAT's hairpinning): the NFs before that one saw it
    /// inbound, the NFs after it never see it.
    pub hairpinned: bool,
    /// The caller's: what it pairs the item with (a reflected answer's request, ...).
    pub tag: usize,
}

impl Item {
    /// A packet that no NF has seen yet.
    pub fn new(index: usize, dissection: Dissection, now: Nanos) -> Item {
        Item {
            index,
            dissection,
            now,
            clock: 0,
            alive: true,
            fast: false,
            hairpinned: false,
            tag: index,
        }
    }
}

/// One NF's counters in one stage.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NfCounters {
    /// Packets the NF processed.
    pub packets_in: u64,
    /// Packets it forwarded.
    pub forwarded: u64,
    /// Packets it dropped, by reason (few distinct reasons: a short list).
    pub dropped: Vec<(crate::DropReason, u64)>,
}

impl NfCounters {
    #[inline]
    fn drop(&mut self, reason: crate::DropReason) {
        self.add_dropped(reason, 1);
    }

    fn add_dropped(&mut self, reason: crate::DropReason, k: u64) {
        match self.dropped.iter_mut().find(|(r, _)| *r == reason) {
            Some((_, n)) => *n += k,
            None => self.dropped.push((reason, k)),
        }
    }

    /// Adds `other`'s counts.
    pub fn merge(&mut self, other: &NfCounters) {
        self.packets_in += other.packets_in;
        self.forwarded += other.forwarded;
        for &(reason, k) in &other.dropped {
            self.add_dropped(reason, k);
        }
    }

    /// Packets dropped, for every reason.
    pub fn dropped_total(&self) -> u64 {
        self.dropped.iter().map(|(_, k)| k).sum()
    }
}

/// What a stage's NFs counted, NF by NF in chain order.
#[derive(Debug, Clone, Default)]
pub struct StageReport {
    /// The engine's counters of each NF.
    pub counters: Vec<NfCounters>,
    /// Each NF's own report ([`NetworkFunction::report`]).
    pub reports: Vec<Vec<(&'static str, i64)>>,
    /// Which of each NF's report keys are gauges ([`NetworkFunction::gauges`]).
    pub gauges: Vec<&'static [&'static str]>,
    /// Each NF's labelled counts ([`NetworkFunction::report_labelled`]).
    pub labelled: Vec<Vec<Labelled>>,
    /// Packets the flow cache forwarded past the NFs.
    pub flow_cache: u64,
    /// Times the flow cache told the NFs of a flow it held ([`FlowCache::renewals`]).
    pub flow_cache_renewals: u64,
    /// Flows the flow cache handed back to the NFs ([`FlowCache::handbacks`]).
    pub flow_cache_handbacks: u64,
}

/// The size and refresh of a stage's flow cache ([`FlowCache`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlowCacheOptions {
    /// Entries (rounded up to a power of two).
    pub capacity: usize,
    /// How long an entry lives after its flow's last packet; the NFs hear of a cached flow
    /// at least this often ([`FlowCache`]).
    pub refresh: Duration,
}

/// An NF of the chain failed to build.
#[derive(Debug, thiserror::Error)]
#[error("{nf}: {error}")]
pub struct StageError {
    /// The NF.
    pub nf: &'static str,
    /// Why.
    pub error: BuildError,
}

/// The NFs of a stage, built for one partition. See the module documentation.
pub struct Stage {
    nfs: Vec<Box<dyn NetworkFunction>>,
    counters: Vec<NfCounters>,
    flow_cache: Option<FlowCache>,
    /// The flows the cache told of, being passed to the NFs (kept: nothing allocated).
    told: Vec<Told>,
    /// Each of a batch of them as the NFs so far left it, its direction, and whether every
    /// NF so far held it.
    telling: Vec<(FlowKey, Direction, bool)>,
    partition: u32,
}

/// `pkt` through `nf`, counted in `c`: whether it goes on.
#[inline]
fn process(
    nf: &mut dyn NetworkFunction,
    c: &mut NfCounters,
    pkt: &mut Packet<'_>,
    cx: &Context,
) -> bool {
    c.packets_in += 1;
    match nf.process(pkt, cx) {
        Verdict::Forward => {
            c.forwarded += 1;
            true
        }
        Verdict::Drop(reason) => {
            c.drop(reason);
            false
        }
    }
}

/// Sets the flow cache sweeps before the NFs hear of what it found: what a tick hands the
/// NFs at once stays bounded (four flows a set) whatever the cache's size or the time since.
const SWEEP_SETS: usize = 1024;

/// Flows the NFs hear of together, NF by NF with their state prefetched (as a batch of
/// packets); a run passes them on once this many wait, a tick whatever waits.
const TELL_BATCH: usize = 32;

impl std::fmt::Debug for Stage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stage")
            .field(
                "nfs",
                &self.nfs.iter().map(|nf| nf.name()).collect::<Vec<_>>(),
            )
            .field("partition", &self.partition)
            .field("flow_cache", &self.flow_cache)
            .finish_non_exhaustive()
    }
}

impl Stage {
    /// Builds `chain`'s NFs for the partition `at`, each declaring its objects in `state`,
    /// with a flow cache in front when `flow_cache` asks for one (refused, naming
    /// `runtime.flow_cache`, when an NF must see every packet).
    pub fn build(
        chain: &[Arc<dyn NfFactory>],
        state: &mut Partition,
        at: Placement,
        flow_cache: Option<FlowCacheOptions>,
    ) -> Result<Stage, StageError> {
        let mut nfs = Vec::with_capacity(chain.len());
        for f in chain {
            if flow_cache.is_some() && !f.fast_path() {
                return Err(StageError {
                    nf: f.name(),
                    error: BuildError::config(
                        f.name(),
                        "runtime.flow_cache",
                        "this NF must see every packet of a flow: turn the flow cache off",
                    ),
                });
            }
            let nf = f
                .build(&mut state.declare(f.name()), at)
                .map_err(|error| StageError {
                    nf: f.name(),
                    error,
                })?;
            nfs.push(nf);
        }
        Ok(Stage {
            counters: vec![NfCounters::default(); nfs.len()],
            nfs,
            flow_cache: flow_cache.map(|c| FlowCache::new(c.capacity, c.refresh)),
            told: Vec::new(),
            telling: Vec::new(),
            partition: at.partition,
        })
    }

    /// Runs `items` of `frames`, all going `direction`, through the NFs (see the module
    /// documentation). Items an NF drops stop there (`alive` false); items the flow cache
    /// forwarded are marked `fast`.
    pub fn run<F: Frames + ?Sized>(
        &mut self,
        frames: &mut F,
        items: &mut [Item],
        direction: Direction,
    ) {
        if let Some(cache) = self.flow_cache.as_mut() {
            cache.before(frames, items, direction);
        }
        let n = self.nfs.len();
        for k in 0..n {
            let j = match direction {
                Direction::Outbound => k,
                Direction::Inbound => n - 1 - k,
            };
            let going = |it: &Item| it.alive && !it.fast && !it.hairpinned;
            let (before, rest) = self.nfs.split_at_mut(j);
            let nf = &mut rest[0];
            for it in items.iter().filter(|it| going(it)) {
                if let Some(data) = frames.frame_mut(it.index) {
                    nf.prefetch(&Packet {
                        data,
                        dissection: it.dissection,
                        direction,
                    });
                }
            }
            let (counters_before, counters_rest) = self.counters.split_at_mut(j);
            for it in items.iter_mut().filter(|it| going(it)) {
                let Some(data) = frames.frame_mut(it.index) else {
                    it.alive = false;
                    continue;
                };
                let cx = Context {
                    now: it.now,
                    clock: it.clock,
                    partition: self.partition,
                };
                let mut pkt = Packet {
                    data,
                    dissection: it.dissection,
                    direction,
                };
                if !process(nf.as_mut(), &mut counters_rest[0], &mut pkt, &cx) {
                    it.alive = false;
                    continue;
                }
                it.dissection = pkt.dissection;
                if pkt.direction == Direction::Inbound && direction == Direction::Outbound {
                    // Turned back inside: it meets the NFs before this one as an inbound
                    // packet, as one from outside would (nftables' forward chain sees a
                    // hairpinned packet after its DNAT), and never those after it.
                    it.hairpinned = true;
                    for (nf, c) in before.iter_mut().zip(counters_before.iter_mut()).rev() {
                        if !process(nf.as_mut(), c, &mut pkt, &cx) {
                            it.alive = false;
                            break;
                        }
                    }
                    it.dissection = pkt.dissection;
                }
            }
        }
        if let Some(cache) = self.flow_cache.as_mut() {
            cache.after(frames, items, direction);
            if cache.waiting() >= TELL_BATCH {
                self.tell_nfs();
            }
        }
    }

    /// Hands each NF its reloaded configuration (`None`: unchanged), in chain order.
    pub fn reconfigure(&mut self, configs: &[Option<crate::ReloadConfig>]) {
        for (nf, c) in self.nfs.iter_mut().zip(configs) {
            if let Some(c) = c {
                nf.reconfigure(c);
            }
        }
    }

    /// Runs every NF's timers up to `now`, after the flow cache handed back the flows whose
    /// entries ended by then (so the NFs' timers count from their last packets).
    pub fn tick(&mut self, now: Nanos) {
        while let Some(cache) = self.flow_cache.as_mut() {
            let more = cache.sweep(now, SWEEP_SETS);
            self.tell_nfs();
            if !more {
                break;
            }
        }
        for nf in &mut self.nfs {
            nf.on_tick(now);
        }
    }

    /// Passes the flows the cache told of to the NFs ([`NetworkFunction::active_until`]) in
    /// batches of [`TELL_BATCH`]: NF by NF in each flow's direction's order (last NF first
    /// when Inbound, as [`Stage::run`]), the batch's state prefetched before any is told,
    /// each NF's rewrite of a flow's key given to the next. A flow an NF refuses, or whose
    /// rewrite is no longer the entry's, leaves the cache.
    fn tell_nfs(&mut self) {
        let Stage {
            nfs,
            flow_cache,
            told,
            telling,
            ..
        } = self;
        let Some(cache) = flow_cache.as_mut() else {
            return;
        };
        cache.take_told(told);
        let n = nfs.len();
        let at = |k: usize, direction| match direction {
            Direction::Outbound => k,
            Direction::Inbound => n - 1 - k,
        };
        for batch in told.chunks(TELL_BATCH) {
            telling.clear();
            telling.extend(batch.iter().map(|t| {
                let (flow, direction) = flowcache::flow_of(t.key);
                (flow, direction, true)
            }));
            for k in 0..n {
                for (flow, direction, _) in telling.iter().filter(|f| f.2) {
                    nfs[at(k, *direction)].prefetch_flow(flow, *direction);
                }
                for (t, (flow, direction, held)) in batch.iter().zip(telling.iter_mut()) {
                    if *held {
                        *held = nfs[at(k, *direction)].active_until(flow, *direction, t.until);
                    }
                }
            }
            for (t, (flow, _, held)) in batch.iter().zip(telling.iter()) {
                cache.settle(t.key, held.then_some(flow));
            }
        }
        told.clear();
    }

    /// The NFs, in chain order (for listings).
    pub fn nfs(&self) -> &[Box<dyn NetworkFunction>] {
        &self.nfs
    }

    /// The engine's counters of each NF, in chain order.
    pub fn counters(&self) -> &[NfCounters] {
        &self.counters
    }

    /// Per-flow table entries the NFs hold now.
    pub fn entries(&self) -> u64 {
        self.nfs.iter().map(|nf| nf.entries()).sum()
    }

    /// Packets the flow cache forwarded past the NFs.
    pub fn flow_cache_hits(&self) -> u64 {
        self.flow_cache.as_ref().map_or(0, FlowCache::hits)
    }

    /// Times the flow cache told the NFs of a flow it held.
    pub fn flow_cache_renewals(&self) -> u64 {
        self.flow_cache.as_ref().map_or(0, FlowCache::renewals)
    }

    /// Flows the flow cache handed back to the NFs as their entries ended.
    pub fn flow_cache_handbacks(&self) -> u64 {
        self.flow_cache.as_ref().map_or(0, FlowCache::handbacks)
    }

    /// Everything the stage counted, as it is now.
    pub fn report(&self) -> StageReport {
        StageReport {
            counters: self.counters.clone(),
            reports: self.nfs.iter().map(|nf| nf.report()).collect(),
            gauges: self.nfs.iter().map(|nf| nf.gauges()).collect(),
            labelled: self.nfs.iter().map(|nf| nf.report_labelled()).collect(),
            flow_cache: self.flow_cache_hits(),
            flow_cache_renewals: self.flow_cache_renewals(),
            flow_cache_handbacks: self.flow_cache_handbacks(),
        }
    }
}
