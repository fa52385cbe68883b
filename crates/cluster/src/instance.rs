//! An NF instance of a cluster: runs the chain (one stage of it) for the traffic partitions
//! it owns, with every partition's state in the shared store (StatelessNF §3, CHC §4).
//!
//! Promises:
//! * **State is the partition's, not the process's.** Partition `p` of stage `s` keeps its
//!   objects under `nf@s@p@…` (the key's instance and core parts name the stage and the
//!   partition), and its NFs are built as worker `p` of `partitions`, so any instance that
//!   claims `p` finds its NAT pools, sessions, firewall connections and LB choices in the
//!   store. A NAT's ports are split among partitions ([`flowstate_nf::nat::port_owner`]), so
//!   the pool moves with the partition: one table, no migration (HashMVT §III-D, §IV-D2).
//! * **Exactly one owner.** An instance serves a partition only after it took the
//!   partition's ownership record (`cluster@<stage>@<p>@Value@owner`: instance and epoch) by
//!   compare-and-set, and only packets stamped with the epoch it claimed. A newer epoch in the
//!   record or in the controller's assignment ends its ownership at once.
//! * **Fenced commits.** On a store that fences ([`flowstate_state::Connector::fences`]: our
//!   own, Redis and Redis Cluster; not Cassandra), every write of a partition carries the
//!   ownership record as the instance took it, and the store refuses the whole write,
//!   atomically, once the record says otherwise: an
//!   instance cut off from the others (its link down, its process alive) cannot change a
//!   partition that has moved, whatever the network does. A refused commit is counted
//!   (`fenced_commits`), its outputs never leave (no notice), and the partition is dropped.
//! * **Output commit.** [`Instance::commit`] waits until every change the batch made is in the
//!   store; the batch's packets leave the cluster only then (sent to the root after the
//!   commit, or, with the root's packet log, before it and passed on by the root when the
//!   commit's notice comes, see below). A packet that left the cluster
//!   never depends on state that a crash could lose, so a survivor that takes the partition
//!   over continues every connection (StatelessNF's guarantee, at one store round trip per
//!   batch rather than per packet).
//! * **Replay without double counting** (CHC §5.4). The root logs every packet until the
//!   chain is done with it ([`crate::log`]) and replays to a partition's new owner what a
//!   failed owner left unfinished. Each commit also writes the clocks of the partition's
//!   packets it covers (`cluster@<stage>@<p>@Value@committed`, the last write of the commit):
//!   a new owner reads it at its claim and does not process again a replayed packet whose
//!   state changes are already in the store (counted in `replay_committed`). On a
//!   store that applies a commit whole, also across its own crash (our own: one batch frame,
//!   over every shard; Redis: one script with the fence), no replayed packet counts twice or
//!   is lost. On Redis Cluster the writes of shared objects
//!   (`nf@Type@id`, another hash slot) follow the partition's script, so a failure between
//!   the two applies the partition's part alone: the rest is sent again until it lands, once
//!   (`BackendError::Partial`, the batches' marks), also after the partition moved; on
//!   Cassandra a failure in the middle of a commit's writes can apply part of it.
//!   An instance sends a batch's outputs to the root before it commits, and, once the commit
//!   is acknowledged, notices of the packets it finished ([`Instance::notices`]): the root
//!   passes the outputs on only then ([`crate::log`]). When an owner fails after its commit
//!   and before its notice, its successor sends the notice for the replayed packets it finds
//!   committed, and their outputs, kept at the root, go on: nothing is lost. Notices lost on
//!   the way are covered by the partition's watermark ([`Instance::watermarks`]).
//! * A pause longer than the failure-detection time (a hung process, a stopped VM) makes the
//!   instance re-read its ownership records before it touches any partition again.

use crate::meta::{Kind, Meta, Notice};
use crate::ClusterError;
use flowstate_control::cluster::Assignment;
use flowstate_nf::stage::{Item, NfCounters, Stage};
use flowstate_nf::{NfFactory, Placement};
use flowstate_state::{
    Access, Backend, BackendError, Connector, Fence, FencedBackend, Kind as ObjKind, Nanos, Object,
    ObjectKey, Op, Owner, Partition, Reply, Scope, StateConfig, Value,
};
use std::sync::Arc;
use std::time::Duration;

/// Settings of an instance.
#[derive(Debug, Clone)]
pub struct InstanceConfig {
    /// This instance's id (1-based).
    pub id: u32,
    /// The chain stage it runs.
    pub stage: u32,
    /// Traffic partitions of the stage.
    pub partitions: u32,
    /// How often a partition's queued changes go to the store between commits (timers).
    pub flush_interval: Duration,
    /// Operations of failed flushes kept to send again.
    pub retain_ops: usize,
    /// Copy a partition's whole state on every move (the OpenNF-style baseline of CHC §7.3
    /// R2) instead of moving its ownership alone.
    pub copy_on_move: bool,
    /// Run on a store that cannot fence commits (`[cluster] unfenced_store`); refused otherwise.
    pub unfenced_store: bool,
}

/// Counters of an instance.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct InstanceStats {
    /// Data packets received.
    pub packets: u64,
    /// Packets the chain forwarded.
    pub forwarded: u64,
    /// Packets an NF dropped.
    pub dropped: u64,
    /// Packets that do not parse.
    pub malformed: u64,
    /// Packets for a partition (or epoch) this instance does not own: lost to a move.
    pub misdirected: u64,
    /// Partitions claimed.
    pub claims: u64,
    /// Claims refused (a newer owner in the record).
    pub refused: u64,
    /// Partitions released to a new owner.
    pub releases: u64,
    /// Partitions dropped because someone else owns them now.
    pub fenced: u64,
    /// Commits the store failed (the batch's packets are then dropped).
    pub commit_errors: u64,
    /// Partitions' commits the store refused because their ownership record had moved on
    /// (fenced): nothing of them was applied, their outputs never leave, the partition is
    /// dropped.
    pub fenced_commits: u64,
    /// Packets processed in partitions dropped before their changes were committed (a
    /// refused commit, a lost partition): the root replays them to the next owner, which
    /// processes them again.
    pub uncommitted: u64,
    /// Bytes of state copied by moves (`copy_on_move`).
    pub copied_bytes: u64,
    /// Packets the root replayed to this instance (their first owner failed).
    pub replayed: u64,
    /// Replayed packets whose state changes the failed owner had committed: not processed
    /// again (their outputs, sent to the root before that commit, go on with this
    /// instance's notice).
    pub replay_committed: u64,
}

struct Owned {
    epoch: u32,
    state: Partition,
    stage: Stage,
    dirty: bool,
    /// Since when the assignment gives the partition to another instance: its packets still
    /// in flight are processed until the root's release, its timers no longer run.
    leaving: Option<Nanos>,
    /// The clocks of the packets the next commit covers, and where the commit records them.
    batch: Vec<u64>,
    committed: Value<Vec<u8>>,
    /// The clocks the previous owner's last commit covered (read at the claim).
    skip: Vec<u64>,
    /// Per root (its clock epoch): the newest clock committed, for [`Kind::Through`].
    through: Vec<u64>,
    /// [`Instance::watermarks`] calls since `through` last moved.
    quiet: u8,
}

impl Owned {
    /// The packet of `clock` is committed.
    fn committed_through(&mut self, clock: u64) {
        let root = |c: u64| c >> crate::root::CLOCK_BITS;
        if let Some(c) = self.through.iter_mut().find(|c| root(**c) == root(clock)) {
            if *c >= clock {
                return;
            }
            *c = clock;
        } else if self.through.len() < MAX_ROOTS {
            self.through.push(clock);
        } else {
            // A root restarted many times: its oldest epoch goes.
            self.through.sort_unstable();
            self.through[0] = clock;
        }
        self.quiet = 0;
    }
}

/// Roots (clock epochs) a partition's watermarks are kept for.
const MAX_ROOTS: usize = 16;

/// How many times [`Instance::watermarks`] repeats a partition's watermark after it last
/// moved: at the instance's pace (every 200 ms), past the root's grace
/// ([`crate::log::WATERMARK_GRACE`]).
const WATERMARK_REPEATS: u8 = 10;

/// Notices for the root, each with its partition (a fenced partition's are taken back).
#[derive(Default)]
struct Notices {
    list: Vec<Notice>,
    partitions: Vec<u16>,
}

impl Notices {
    fn push(&mut self, n: Notice, partition: u16) {
        self.list.push(n);
        self.partitions.push(partition);
    }

    /// Forgets partition `p`'s notices.
    fn drop_partition(&mut self, p: u16) {
        let mut keep = self.partitions.iter().map(|&q| q != p);
        self.list.retain(|_| keep.next().unwrap_or(true));
        self.partitions.retain(|&q| q != p);
    }

    fn clear(&mut self) {
        self.list.clear();
        self.partitions.clear();
    }
}

/// Connections an instance keeps open for its next claims (see [`Instance::tick`]).
const SPARE_CONNECTIONS: usize = 8;

/// An NF instance. See the module documentation.
pub struct Instance {
    config: InstanceConfig,
    chain: Vec<Arc<dyn NfFactory>>,
    connector: Arc<dyn Connector>,
    records: Box<dyn Backend>,
    owned: Vec<Option<Owned>>,
    /// Each partition's epoch in the newest assignment applied. A claim at an older epoch
    /// was superseded before it arrived (the root sent it before the assignment moved the
    /// partition on, and will send no release for it): it is refused.
    assigned: Vec<u32>,
    stats: InstanceStats,
    /// Connections opened ahead of the claims that will use them.
    spare: Vec<Box<dyn Backend>>,
    /// What the NFs of partitions no longer served counted.
    retired: Vec<NfCounters>,
    replies: Vec<Reply>,
    /// The packets (clock, epoch) the next commit finishes: those the chain dropped, and
    /// those whose outputs went to the root ahead of the commit (see [`Instance::commit`]).
    done: Notices,
    released: Notices,
}

impl std::fmt::Debug for Instance {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Instance")
            .field("config", &self.config)
            .field("owned", &self.owned_partitions())
            .finish_non_exhaustive()
    }
}

/// The key of partition `p`'s ownership record, `cluster@STAGE@P@Value@owner`: a key of the
/// partition, placed with its objects, so the store checks a commit's fence on it atomically
/// with the commit ([`flowstate_state::FencedBackend`]).
pub(crate) fn record_key(stage: u32, p: u32) -> ObjectKey {
    ObjectKey::partitioned(&Owner::new("cluster", stage, p), ObjKind::Value, "owner")
}

fn record(id: u32, epoch: u32) -> Vec<u8> {
    let mut b = id.to_be_bytes().to_vec();
    b.extend_from_slice(&epoch.to_be_bytes());
    b
}

fn parse_record(b: &[u8]) -> Option<(u32, u32)> {
    let b: &[u8; 8] = b.try_into().ok()?;
    Some((
        u32::from_be_bytes([b[0], b[1], b[2], b[3]]),
        u32::from_be_bytes([b[4], b[5], b[6], b[7]]),
    ))
}

impl Instance {
    /// An instance owning nothing yet, on the store `connector` opens.
    pub fn new(
        config: InstanceConfig,
        chain: Vec<Arc<dyn NfFactory>>,
        connector: Arc<dyn Connector>,
    ) -> Result<Instance, ClusterError> {
        if connector.in_process() {
            return Err(ClusterError::Config(
                "state.backend: a cluster's instances share their state: choose a store they all reach (store, redis, redis-cluster, cassandra), not \"local\"".into(),
            ));
        }
        let records = connector
            .connect()
            .map_err(|e| ClusterError::Store(e.to_string()))?;
        if !connector.fences() {
            if !config.unfenced_store {
                return Err(ClusterError::Config(format!(
                    "state.backend: {} cannot fence commits, so an instance cut off from the \
                     others could still write a partition that moved; choose store, redis or \
                     redis-cluster, or set [cluster] unfenced_store = true to run anyway",
                    connector.name()
                )));
            }
            tracing::warn!(
                backend = connector.name(),
                "unfenced_store: this store cannot fence commits: an instance cut off from the \
                 others could still write a partition that has moved"
            );
        }
        let mut inst = Instance {
            owned: (0..config.partitions).map(|_| None).collect(),
            assigned: vec![0; config.partitions as usize],
            config,
            chain,
            connector,
            records,
            stats: InstanceStats::default(),
            retired: Vec::new(),
            replies: Vec::new(),
            spare: Vec::new(),
            done: Notices::default(),
            released: Notices::default(),
        };
        while inst.spare.len() < inst.spare_target() {
            inst.warm()?;
        }
        Ok(inst)
    }

    /// Connections kept ready for claims: enough for a scale-out step's share of partitions.
    fn spare_target(&self) -> usize {
        (self.config.partitions as usize).min(SPARE_CONNECTIONS)
    }

    /// Opens one more ready connection.
    fn warm(&mut self) -> Result<(), ClusterError> {
        let c = self
            .connector
            .connect()
            .map_err(|e| ClusterError::Store(e.to_string()))?;
        self.spare.push(c);
        Ok(())
    }

    /// The counters.
    pub fn stats(&self) -> InstanceStats {
        self.stats
    }

    /// Packets the NFs dropped, by reason (`"firewall: ..."`, `"nat: ..."`).
    pub fn drop_reasons(&self) -> std::collections::BTreeMap<flowstate_nf::DropReason, u64> {
        let mut reasons = std::collections::BTreeMap::new();
        for (_, c) in self.nf_counters() {
            for &(why, k) in &c.dropped {
                *reasons.entry(why).or_default() += k;
            }
        }
        reasons
    }

    /// What the stage engine counted of each NF, in chain order, over every partition this
    /// instance served (as a box's workers report theirs).
    pub fn nf_counters(&self) -> Vec<(&'static str, NfCounters)> {
        let mut all: Vec<_> = self
            .chain
            .iter()
            .map(|f| (f.name(), NfCounters::default()))
            .collect();
        let live = self.owned.iter().flatten().map(|o| o.stage.counters());
        for counters in live.chain([self.retired.as_slice()]) {
            for ((_, sum), c) in all.iter_mut().zip(counters) {
                sum.merge(c);
            }
        }
        all
    }

    /// Per-flow table entries the NFs of its partitions hold now.
    pub fn entries(&self) -> u64 {
        self.owned.iter().flatten().map(|o| o.stage.entries()).sum()
    }

    /// The partitions served now.
    pub fn owned_partitions(&self) -> Vec<u32> {
        (0..self.owned.len() as u32)
            .filter(|&p| self.owned[p as usize].is_some())
            .collect()
    }

    /// Runs a data packet of `meta`'s partition through the chain; whether to send it on.
    pub fn process(&mut self, meta: &Meta, frame: &mut [u8], now: Nanos) -> bool {
        self.stats.packets += 1;
        if meta.stage != self.config.stage {
            self.stats.misdirected += 1;
            return false;
        }
        let Some(Some(o)) = self.owned.get_mut(usize::from(meta.partition)) else {
            self.stats.misdirected += 1;
            return false;
        };
        if o.epoch != meta.epoch {
            self.stats.misdirected += 1;
            return false;
        }
        if meta.replay {
            self.stats.replayed += 1;
            if o.skip.contains(&meta.clock) {
                // Its output (if any) is at the root already: the notice releases it.
                self.stats.replay_committed += 1;
                self.released.push((meta.clock, meta.epoch), meta.partition);
                return false;
            }
        }
        let Ok(d) = flowstate_wire::dissect(frame) else {
            self.stats.malformed += 1;
            self.done.push((meta.clock, meta.epoch), meta.partition);
            return false;
        };
        o.dirty = true;
        o.batch.push(meta.clock);
        let mut item = [Item {
            clock: meta.clock,
            ..Item::new(0, d, now)
        }];
        o.stage.run(frame, &mut item, meta.direction);
        if !item[0].alive {
            self.stats.dropped += 1;
            self.done.push((meta.clock, meta.epoch), meta.partition);
            return false;
        }
        self.stats.forwarded += 1;
        self.released.push((meta.clock, meta.epoch), meta.partition);
        true
    }

    /// Makes every change since the last commit durable (output commit, see the module
    /// documentation). The caller may send the batch's outputs to the root before: the root
    /// keeps them until the notices of [`Instance::notices`], sent after a successful
    /// commit. On an error the notices are dropped: the root keeps the packets logged (a
    /// next owner processes them again), and their state is as the store has it.
    pub fn commit(&mut self, now: Nanos) -> Result<(), ClusterError> {
        // Every partition's writes go at once (each has its own connection), then the answers.
        let mut result = Ok(());
        let mut fenced = Vec::new();
        let dirty = |o: &Option<Owned>| o.as_ref().is_some_and(|o| o.dirty);
        for (p, slot) in self.owned.iter_mut().enumerate().filter(|(_, o)| dirty(o)) {
            let Some(o) = slot else { continue };
            // Declared last, so written last: in the store only with everything before it.
            o.committed.set_nowait(encode_clocks(&o.batch));
            match o.state.begin_flush_all(now) {
                Err(e) if is_fenced(&e) => fenced.push(p),
                Err(e) => result = Err(ClusterError::Store(e.to_string())),
                Ok(()) => {}
            }
        }
        for (p, slot) in self.owned.iter_mut().enumerate().filter(|(_, o)| dirty(o)) {
            let Some(o) = slot else { continue };
            match o.state.end_flush_all() {
                Ok(()) if result.is_ok() => {
                    o.dirty = false;
                    for i in 0..o.batch.len() {
                        o.committed_through(o.batch[i]);
                    }
                    o.batch.clear();
                }
                Ok(()) => {}
                Err(e) if is_fenced(&e) => {
                    if !fenced.contains(&p) {
                        fenced.push(p);
                    }
                }
                Err(e) => result = Err(ClusterError::Store(e.to_string())),
            }
        }
        // The store refused these partitions' commits: another instance owns them now. Nothing
        // of theirs was applied; their outputs never leave (no notice), and they are dropped.
        for p in fenced {
            tracing::warn!(
                partition = p,
                "commit refused by the store (fenced): the partition has another owner; dropped"
            );
            self.drop_owned(p);
            self.stats.fenced_commits += 1;
            self.stats.fenced += 1;
        }
        if result.is_err() {
            // Not durable yet. The engine sends the failed writes again ahead of the next
            // ones, so the next commit covers this batch too: its partitions stay dirty, their
            // clocks stay in the record, and its notices wait for that commit.
            self.stats.commit_errors += 1;
        }
        result
    }

    /// Whether a partition holds changes no commit made durable (between batches: the last
    /// commit failed).
    pub fn uncommitted(&self) -> bool {
        self.owned.iter().flatten().any(|o| o.dirty)
    }

    /// What the commits so far finished, for the root: the packets whose outputs it may send
    /// on ([`Kind::Committed`]) and those the chain dropped ([`Kind::Done`]), as (clock,
    /// epoch), until [`Instance::clear_notices`]; valid after a successful commit.
    pub fn notices(&self) -> (&[Notice], &[Notice]) {
        (&self.released.list, &self.done.list)
    }

    /// Calls `f(partition, epoch, clock)` with each partition's newest committed clock of
    /// each root, for [`Kind::Through`]: while a partition commits, and a few calls more
    /// once it is quiet (its last notices may have been lost on the way: then nothing else
    /// would end its packets at the root).
    pub fn watermarks(&mut self, mut f: impl FnMut(u16, u32, u64)) {
        for (p, o) in self.owned.iter_mut().enumerate() {
            let Some(o) = o.as_mut().filter(|o| o.quiet < WATERMARK_REPEATS) else {
                continue;
            };
            o.quiet += 1;
            for &clock in &o.through {
                f(p as u16, o.epoch, clock);
            }
        }
    }

    /// Forgets the notices sent.
    pub fn clear_notices(&mut self) {
        self.released.clear();
        self.done.clear();
    }

    /// Runs the NFs' timers and flushes what they changed (every few milliseconds), and opens
    /// a ready connection if claims used one.
    pub fn tick(&mut self, now: Nanos) {
        if self.spare.len() < self.spare_target() {
            if let Err(e) = self.warm() {
                tracing::warn!("cannot open a connection ahead of claims: {e}");
            }
        }
        for o in self
            .owned
            .iter_mut()
            .flatten()
            .filter(|o| o.leaving.is_none())
        {
            o.stage.tick(now);
            o.state.maybe_flush(now);
        }
    }

    fn read_record(&mut self, p: u32) -> Result<Option<Vec<u8>>, ClusterError> {
        self.replies.clear();
        let op = Op::Get {
            key: record_key(self.config.stage, p),
        };
        self.records
            .execute(std::slice::from_ref(&op), &mut self.replies)
            .map_err(|e| ClusterError::Store(e.to_string()))?;
        match self.replies.pop() {
            Some(Reply::Value(v)) => Ok(v),
            other => Err(ClusterError::Store(format!(
                "ownership record of partition {p}: unexpected reply {other:?}"
            ))),
        }
    }

    /// Reads every object of `declared` whole (for a copy); counts the bytes.
    fn read_objects(
        &mut self,
        declared: &[(ObjectKey, ObjKind)],
    ) -> Result<Vec<(ObjectKey, Object)>, ClusterError> {
        let ops: Vec<Op> = declared
            .iter()
            .map(|(key, kind)| Op::ReadAll {
                key: key.clone(),
                kind: *kind,
            })
            .collect();
        self.replies.clear();
        self.records
            .execute(&ops, &mut self.replies)
            .map_err(|e| ClusterError::Store(e.to_string()))?;
        let mut out = Vec::new();
        for ((key, _), r) in declared.iter().zip(self.replies.drain(..)) {
            if let Reply::Object(Some(o)) = r {
                self.stats.copied_bytes += object_bytes(&o);
                out.push((key.clone(), o));
            }
        }
        Ok(out)
    }

    /// Takes partition `p` at `epoch`: the ownership record by compare-and-set, then the
    /// partition's state, found in the store. Answers [`Kind::Ready`] or [`Kind::Refused`].
    pub fn claim(&mut self, p: u32, epoch: u32, now: Nanos) -> Result<Kind, ClusterError> {
        let mut answer = Ok(Kind::Refused);
        self.claim_many(&[(p, epoch)], now, |_, a| answer = a);
        answer
    }

    /// Takes several partitions (`(partition, epoch)`; a scale-out's claims arrive together):
    /// their ownership records read in one round trip and set by compare-and-set in another
    /// (three rounds for records that changed meanwhile), then each partition built. Calls
    /// `answer(i, ...)` for claim `i` as [`Instance::claim`] would answer it, as soon as it is
    /// decided (a partition is ready to serve while the next one is built).
    pub fn claim_many(
        &mut self,
        claims: &[(u32, u32)],
        now: Nanos,
        mut answer: impl FnMut(usize, Result<Kind, ClusterError>),
    ) {
        let started = std::time::Instant::now();
        let me = self.config.id;
        let mut answers: Vec<Option<Result<Kind, ClusterError>>> = claims
            .iter()
            .map(|&(p, epoch)| match self.owned.get(p as usize) {
                None => Some(Ok(Kind::Refused)),
                // A repeated claim.
                Some(Some(o)) if o.epoch == epoch => Some(Ok(Kind::Ready)),
                Some(_) if epoch < self.assigned[p as usize] => {
                    self.stats.refused += 1;
                    Some(Ok(Kind::Refused))
                }
                // An epoch far ahead of any the assignments gave is refused, not written into
                // the ownership record (where it would refuse every real claim after it).
                Some(_)
                    if !crate::config::within_step(
                        self.assigned[p as usize].into(),
                        epoch.into(),
                    ) =>
                {
                    self.stats.refused += 1;
                    Some(Ok(Kind::Refused))
                }
                Some(_) => None,
            })
            .collect();
        let mut granted = vec![false; claims.len()];
        for _ in 0..3 {
            let open: Vec<usize> = (0..claims.len())
                .filter(|&i| answers[i].is_none() && !granted[i])
                .collect();
            if open.is_empty() {
                break;
            }
            let reads: Vec<Op> = open
                .iter()
                .map(|&i| Op::Get {
                    key: record_key(self.config.stage, claims[i].0),
                })
                .collect();
            let current = match self.execute_records(&reads) {
                Ok(r) => r,
                Err(e) => {
                    for &i in &open {
                        answers[i] = Some(Err(ClusterError::Store(e.to_string())));
                    }
                    break;
                }
            };
            // A record with a newer epoch: refused; the others are set if unchanged.
            let mut sets = Vec::new();
            let mut tried = Vec::new();
            for (&i, reply) in open.iter().zip(current) {
                let (p, epoch) = claims[i];
                let Reply::Value(rec) = reply else {
                    answers[i] = Some(Err(ClusterError::Store(format!(
                        "ownership record of partition {p}: unexpected reply {reply:?}"
                    ))));
                    continue;
                };
                if rec
                    .as_deref()
                    .and_then(parse_record)
                    .is_some_and(|(_, e)| e > epoch)
                {
                    self.stats.refused += 1;
                    self.drop_owned(p as usize);
                    answers[i] = Some(Ok(Kind::Refused));
                    continue;
                }
                sets.push(Op::CompareAndSet {
                    key: record_key(self.config.stage, p),
                    expected: rec,
                    new: Some(record(me, epoch)),
                });
                tried.push(i);
            }
            match self.execute_records(&sets) {
                Ok(r) => {
                    for (&i, reply) in tried.iter().zip(r) {
                        granted[i] = matches!(reply, Reply::Bool(true));
                    }
                }
                Err(e) => {
                    for &i in &tried {
                        answers[i] = Some(Err(ClusterError::Store(e.to_string())));
                    }
                }
            }
        }
        let recorded = started.elapsed();
        for (i, &(p, epoch)) in claims.iter().enumerate() {
            let a = match answers[i].take() {
                Some(a) => a,
                None if granted[i] => self.take(p, epoch, now),
                None => {
                    self.stats.refused += 1;
                    self.drop_owned(p as usize);
                    Ok(Kind::Refused)
                }
            };
            answer(i, a);
        }
        tracing::debug!(
            claims = claims.len(),
            record_us = recorded.as_micros() as u64,
            total_us = started.elapsed().as_micros() as u64,
            "claimed"
        );
    }

    /// Runs `ops` on the connection for ownership records; their replies, one per op.
    fn execute_records(&mut self, ops: &[Op]) -> Result<Vec<Reply>, ClusterError> {
        let mut replies = Vec::with_capacity(ops.len());
        if !ops.is_empty() {
            self.records
                .execute(ops, &mut replies)
                .map_err(|e| ClusterError::Store(e.to_string()))?;
        }
        if replies.len() != ops.len() {
            return Err(ClusterError::Store(format!(
                "{} replies to {} ownership record operations",
                replies.len(),
                ops.len()
            )));
        }
        Ok(replies)
    }

    /// Partition `p`, whose record names this instance at `epoch` now: its state built (and,
    /// with `copy_on_move`, copied) before it is served.
    fn take(&mut self, p: u32, epoch: u32, now: Nanos) -> Result<Kind, ClusterError> {
        let owned = self.build(p, epoch, now)?;
        if self.config.copy_on_move {
            // Import: the whole state read and written again before the partition is ready.
            let objects = self.read_objects(owned.state.declared())?;
            let mut ops = Vec::new();
            for (key, obj) in objects {
                import_ops(key, obj, &mut ops);
            }
            self.replies.clear();
            self.records
                .execute(&ops, &mut self.replies)
                .map_err(|e| ClusterError::Store(e.to_string()))?;
        }
        // A partition claimed again at a newer epoch: what the old one counted is kept.
        self.drop_owned(p as usize);
        self.owned[p as usize] = Some(owned);
        self.stats.claims += 1;
        Ok(Kind::Ready)
    }

    fn build(&mut self, p: u32, epoch: u32, now: Nanos) -> Result<Owned, ClusterError> {
        let mut backend = match self.spare.pop() {
            Some(b) => b,
            None => self
                .connector
                .connect()
                .map_err(|e| ClusterError::Store(e.to_string()))?,
        };
        if self.connector.fences() {
            // Every write of the partition carries its ownership record as it is now: the
            // store refuses them once the record names another owner or epoch.
            let fence = Fence {
                key: record_key(self.config.stage, p),
                value: record(self.config.id, epoch),
                batch: 0,
            };
            backend = Box::new(FencedBackend::new(backend, fence));
        }
        let mut state = Partition::with_backend(
            backend,
            self.connector.as_ref(),
            StateConfig {
                stage: self.config.stage,
                partition: p,
                flush_interval: self.config.flush_interval,
                retain_ops: self.config.retain_ops,
                ..StateConfig::default()
            },
        )
        .map_err(|e| ClusterError::Store(e.to_string()))?;
        let at = Placement {
            stage: self.config.stage,
            partition: p,
            partitions: self.config.partitions,
        };
        let t0 = std::time::Instant::now();
        let stage = Stage::build(&self.chain, &mut state, at, None)
            .map_err(|e| ClusterError::Build(e.error.to_string()))?;
        let t1 = std::time::Instant::now();
        // After the NFs' objects: written last in every commit.
        let committed = state
            .declare("cluster")
            .value::<Vec<u8>>("committed", Scope::PerFlow, Access::ReadWrite)
            .map_err(|e| ClusterError::Store(e.to_string()))?;
        // What building wrote (a NAT's first pools) is durable before the first packet.
        state
            .flush_all(now)
            .map_err(|e| ClusterError::Store(e.to_string()))?;
        let t2 = std::time::Instant::now();
        let skip = committed
            .get()
            .map_err(|e| ClusterError::Store(e.to_string()))?
            .map(|b| decode_clocks(&b))
            .unwrap_or_default();
        tracing::debug!(
            partition = p,
            build_us = (t1 - t0).as_micros() as u64,
            flush_us = (t2 - t1).as_micros() as u64,
            get_us = t2.elapsed().as_micros() as u64,
            "built"
        );
        Ok(Owned {
            epoch,
            state,
            stage,
            dirty: false,
            leaving: None,
            batch: Vec::new(),
            committed,
            skip,
            through: Vec::new(),
            quiet: WATERMARK_REPEATS,
        })
    }

    /// Lets partition `p` go (a move): every change is in the store after the last commit;
    /// this one makes sure, and forgets the partition. Answers [`Kind::Released`].
    pub fn release(&mut self, p: u32, epoch: u32, now: Nanos) -> Result<Kind, ClusterError> {
        if let Some(slot) = self.owned.get_mut(p as usize) {
            if slot.as_ref().is_some_and(|o| o.epoch == epoch) {
                // Flushed below, not dropped: not counted as uncommitted.
                let mut flushed = 0;
                if let Some(mut o) = retire(&mut self.retired, &mut flushed, slot) {
                    let started = std::time::Instant::now();
                    o.state
                        .flush_all(now)
                        .map_err(|e| ClusterError::Store(e.to_string()))?;
                    tracing::debug!(
                        partition = p,
                        epoch,
                        flush_us = started.elapsed().as_micros() as u64,
                        "released"
                    );
                    if self.config.copy_on_move {
                        // Export: the whole state read out for the new owner.
                        self.read_objects(o.state.declared())?;
                    }
                    self.stats.releases += 1;
                }
            }
        }
        Ok(Kind::Released)
    }

    /// Applies the controller's assignment at `now`. An assignment that lists this instance
    /// as dead ends every ownership at once (the others have taken over). A partition given
    /// to another instance is *leaving*: the root sends its last packets and then a release
    /// ([`Instance::release`]), so it keeps processing them, but runs no timers (their
    /// writes would race the new owner); one not released within `grace` is dropped. A claim
    /// at an epoch older than the assignment's arrives late: it is refused.
    pub fn apply(&mut self, a: &Assignment, now: Nanos) {
        let me = self.config.id;
        let dead = !a.members.iter().any(|m| m.id == me && m.live);
        for (known, s) in self.assigned.iter_mut().zip(&a.slots) {
            *known = (*known).max(s.epoch);
        }
        for p in 0..self.owned.len() {
            if dead && self.drop_owned(p).is_some() {
                self.stats.fenced += 1;
            }
            let Some(o) = &mut self.owned[p] else {
                continue;
            };
            let mine = a
                .slots
                .get(p)
                .is_some_and(|s| s.owner == Some(me) || s.epoch <= o.epoch);
            if !mine && o.leaving.is_none() {
                o.leaving = Some(now);
            }
        }
    }

    /// Drops leaving partitions the root did not release within `grace` (a lost release).
    pub fn expire_leaving(&mut self, now: Nanos, grace: Nanos) {
        for p in 0..self.owned.len() {
            if self.owned[p]
                .as_ref()
                .and_then(|o| o.leaving)
                .is_some_and(|t| now.saturating_sub(t) > grace)
            {
                self.drop_owned(p);
                self.stats.fenced += 1;
            }
        }
    }

    /// Stops serving partition `p` without a commit: what it changed since its last commit
    /// is lost (counted), and so are the notices waiting for that commit.
    fn drop_owned(&mut self, p: usize) -> Option<Owned> {
        let o = retire(
            &mut self.retired,
            &mut self.stats.uncommitted,
            self.owned.get_mut(p)?,
        )?;
        self.released.drop_partition(p as u16);
        self.done.drop_partition(p as u16);
        Some(o)
    }

    /// After a pause: drops every partition whose ownership record names another owner or a
    /// newer epoch (see the module documentation).
    pub fn revalidate(&mut self) -> Result<(), ClusterError> {
        for p in self.owned_partitions() {
            let rec = self.read_record(p)?;
            let mine = self.owned[p as usize]
                .as_ref()
                .map(|o| (self.config.id, o.epoch));
            if rec.as_deref().and_then(parse_record) != mine {
                self.drop_owned(p as usize);
                self.stats.fenced += 1;
            }
        }
        Ok(())
    }
}

/// Whether the store refused a fenced batch ([`BackendError::Fenced`]).
fn is_fenced(e: &flowstate_state::StateError) -> bool {
    matches!(
        e,
        flowstate_state::StateError::Backend(BackendError::Fenced { .. })
    )
}

/// Takes a partition's state away from `slot`, adding what its NFs counted to `retired`.
fn retire(
    retired: &mut Vec<NfCounters>,
    uncommitted: &mut u64,
    slot: &mut Option<Owned>,
) -> Option<Owned> {
    let o = slot.take()?;
    if o.dirty {
        *uncommitted += o.batch.len() as u64;
    }
    let counters = o.stage.counters();
    if retired.len() < counters.len() {
        retired.resize(counters.len(), NfCounters::default());
    }
    for (r, c) in retired.iter_mut().zip(counters) {
        r.merge(c);
    }
    Some(o)
}

/// The clocks of a commit record: 8 bytes each, big-endian.
fn encode_clocks(clocks: &[u64]) -> Vec<u8> {
    clocks.iter().flat_map(|c| c.to_be_bytes()).collect()
}

fn decode_clocks(b: &[u8]) -> Vec<u64> {
    b.chunks_exact(8)
        .map(|c| u64::from_be_bytes(c.try_into().unwrap_or_default()))
        .collect()
}

fn object_bytes(o: &Object) -> u64 {
    let n: usize = match o {
        Object::Value(v) => v.len(),
        Object::Counter(_) => 8,
        Object::List(v) | Object::Set(v) => v.iter().map(Vec::len).sum(),
        Object::Map(m) => m.iter().map(|(k, v)| k.len() + v.len()).sum(),
        Object::CounterMap(m) => m.iter().map(|(k, _)| k.len() + 8).sum(),
    };
    n as u64
}

/// The writes that put `obj` into the store under `key` (the import side of a copy).
fn import_ops(key: ObjectKey, obj: Object, ops: &mut Vec<Op>) {
    match obj {
        Object::Value(value) => ops.push(Op::Set { key, value }),
        Object::Counter(value) => ops.push(Op::SetCounter { key, value }),
        Object::List(items) => {
            ops.push(Op::Delete { key: key.clone() });
            ops.extend(items.into_iter().map(|item| Op::Push {
                key: key.clone(),
                item,
            }));
        }
        Object::Set(members) => ops.extend(members.into_iter().map(|member| Op::Insert {
            key: key.clone(),
            member,
        })),
        Object::Map(fields) => ops.extend(fields.into_iter().map(|(field, value)| Op::MapSet {
            key: key.clone(),
            field,
            value,
        })),
        Object::CounterMap(fields) => {
            for (field, count) in fields {
                ops.push(Op::MapDelete {
                    key: key.clone(),
                    field: field.clone(),
                });
                ops.push(Op::MapAdd {
                    key: key.clone(),
                    field,
                    delta: count,
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flowstate_control::cluster::{MemberAddr, Slot};
    use flowstate_nf::Direction;
    use flowstate_state::local::LocalStore;

    /// The local store shared by several instances, as a remote store would be: every
    /// partition flushes to it instead of owning its objects in its cache.
    struct Shared(LocalStore);
    impl Connector for Shared {
        fn name(&self) -> &'static str {
            "shared-local"
        }
        fn connect(&self) -> Result<Box<dyn Backend>, flowstate_state::BackendError> {
            self.0.connect()
        }
        fn fences(&self) -> bool {
            true
        }
    }

    fn nat_chain() -> Vec<Arc<dyn NfFactory>> {
        let t: toml::Table =
            toml::from_str("external = [\"198.51.100.1\"]\nports = \"1024-1087\"").unwrap();
        vec![flowstate_nf::registry::factory("nat", &t).unwrap()]
    }

    fn instance(id: u32, store: &Arc<Shared>) -> Instance {
        instance_with(id, store, false)
    }

    /// Instance `id` of stage 0, 4 partitions, flushing every millisecond.
    fn config(id: u32) -> InstanceConfig {
        InstanceConfig {
            id,
            stage: 0,
            partitions: 4,
            flush_interval: Duration::from_millis(1),
            retain_ops: 1000,
            copy_on_move: false,
            unfenced_store: false,
        }
    }

    fn instance_with(id: u32, store: &Arc<Shared>, copy_on_move: bool) -> Instance {
        let config = InstanceConfig {
            copy_on_move,
            ..config(id)
        };
        Instance::new(config, nat_chain(), Arc::clone(store) as Arc<dyn Connector>).unwrap()
    }

    fn udp(src_port: u16) -> Vec<u8> {
        use flowstate_wire::build::*;
        let spec = FrameSpec {
            ethernet: EthernetSpec::new([2; 6], [4; 6]),
            ip: IpSpec::V4(Ipv4Spec::new(
                "10.0.0.2".parse().unwrap(),
                "198.51.100.2".parse().unwrap(),
            )),
            l4: L4Spec::Udp(UdpSpec {
                src_port,
                dst_port: 53,
            }),
            payload: Payload::Fill { len: 5, byte: 7 },
            min_len: ETHERNET_MIN_LEN,
        };
        let mut buf = vec![0u8; 128];
        let n = spec.write(&mut buf).unwrap();
        buf.truncate(n);
        buf
    }

    fn meta(p: u16, epoch: u32) -> Meta {
        data(p, epoch, 1, false)
    }

    fn data(p: u16, epoch: u32, clock: u64, replay: bool) -> Meta {
        Meta {
            kind: Kind::Data,
            stage: 0,
            partition: p,
            epoch,
            direction: Direction::Outbound,
            clock,
            replay,
        }
    }

    /// The packets the counter NF counted, as the store has them.
    fn counted(store: &dyn Connector) -> i64 {
        let mut conn = store.connect().unwrap();
        let mut replies = Vec::new();
        conn.execute(
            &[Op::GetCounter {
                key: ObjectKey::shared("counter", ObjKind::Counter, "packets"),
            }],
            &mut replies,
        )
        .unwrap();
        match replies.pop() {
            Some(Reply::Int(n)) => n,
            other => panic!("the counter: {other:?}"),
        }
    }

    /// A store and two instances (1 and 2) of counter → NAT on it.
    fn counting_pair() -> (Arc<Shared>, Instance, Instance) {
        let store = Arc::new(Shared(LocalStore::new()));
        let mut chain =
            vec![flowstate_nf::registry::factory("counter", &toml::Table::new()).unwrap()];
        chain.extend(nat_chain());
        let connector = Arc::clone(&store) as Arc<dyn Connector>;
        let a = Instance::new(config(1), chain.clone(), Arc::clone(&connector)).unwrap();
        let b = Instance::new(config(2), chain, connector).unwrap();
        (store, a, b)
    }

    #[test]
    fn a_replayed_packet_whose_changes_were_committed_is_not_counted_twice() {
        let (store, mut a, mut b) = counting_pair();
        a.claim(2, 1, 0).unwrap();
        // Clocks 1 and 2: committed, output sent. 3 and 4: committed, then `a` fails before
        // their output leaves. 5: processed, never committed.
        for c in 1..=4 {
            assert!(a.process(&data(2, 1, c, false), &mut udp(5000), c));
            if c % 2 == 0 {
                a.commit(c).unwrap();
            }
        }
        let mut f = udp(5000);
        assert!(a.process(&data(2, 1, 5, false), &mut f, 5));
        let port = translated_port(&f);
        drop(a);
        // The root replays 3, 4 and 5 to the new owner, then sends 6.
        assert_eq!(b.claim(2, 2, 10).unwrap(), Kind::Ready);
        let mut out = Vec::new();
        for (c, replay) in [(3, true), (4, true), (5, true), (6, false)] {
            let mut g = udp(5000);
            if b.process(&data(2, 2, c, replay), &mut g, 10 + c) {
                out.push((c, translated_port(&g)));
            }
        }
        b.commit(20).unwrap();
        assert_eq!(
            out,
            vec![(5, port), (6, port)],
            "5 and 6 processed, 3 and 4 not again"
        );
        // 3 and 4's outputs, sent by `a` before its commit, are released by b's notice.
        let released: &[Notice] = &[(3, 2), (4, 2), (5, 2), (6, 2)];
        assert_eq!(b.notices(), (released, &[][..]));
        let st = b.stats();
        assert_eq!((st.replayed, st.replay_committed), (3, 2));
        // Six packets, each counted once.
        assert_eq!(counted(store.as_ref()), 6);
    }

    /// An instance cut off from the others (it never hears that its partition moved) keeps
    /// processing and committing: the store refuses its commit once another instance has
    /// claimed the partition; none of its changes lands, none of its outputs is released, and
    /// it drops the partition. Its other partitions go on.
    #[test]
    fn a_cut_off_instance_s_commit_is_refused_by_the_store() {
        let (store, mut a, mut b) = counting_pair();
        assert_eq!(a.claim(2, 1, 0).unwrap(), Kind::Ready);
        assert_eq!(a.claim(3, 1, 0).unwrap(), Kind::Ready);
        assert!(a.process(&data(2, 1, 1, false), &mut udp(5000), 1));
        a.commit(1).unwrap();
        a.clear_notices();
        // Partition 2 moves to `b` (epoch 2) while `a` is cut off.
        assert_eq!(b.claim(2, 2, 2).unwrap(), Kind::Ready);
        // (A flow it knows: a new one would need the store, which refuses it already.)
        assert!(a.process(&data(2, 1, 2, false), &mut udp(5000), 3));
        assert!(a.process(&data(3, 1, 3, false), &mut udp(5002), 3));
        a.commit(3).unwrap();
        let st = a.stats();
        assert_eq!((st.fenced_commits, st.fenced), (1, 1), "{st:?}");
        assert!(
            st.uncommitted > 0,
            "its processed packets count as uncommitted: {st:?}"
        );
        assert_eq!(a.owned_partitions(), vec![3]);
        // Only partition 3's packet is released; partition 2's output never leaves.
        assert_eq!(a.notices(), (&[(3, 1)][..], &[][..]));
        // In the store: one packet of partition 2 (the first) and the one of partition 3.
        assert_eq!(counted(store.as_ref()), 2);
        // Later packets of the lost partition are not its any more.
        assert!(!a.process(&data(2, 1, 4, false), &mut udp(5003), 4));
        assert_eq!(a.stats().misdirected, 1);
    }

    fn translated_port(frame: &[u8]) -> u16 {
        flowstate_wire::dissect(frame)
            .unwrap()
            .flow
            .unwrap()
            .src_port
    }

    #[test]
    fn a_partition_taken_over_keeps_its_nat_mappings() {
        let store = Arc::new(Shared(LocalStore::new()));
        let (mut a, mut b) = (instance(1, &store), instance(2, &store));
        assert_eq!(a.claim(2, 1, 0).unwrap(), Kind::Ready);
        let mut f = udp(5000);
        assert!(a.process(&meta(2, 1), &mut f, 1));
        a.commit(1).unwrap();
        let port = translated_port(&f);
        assert_eq!(flowstate_nf::nat::port_owner(port, 1024, 4), 2);
        // a dies without releasing (a crash): b takes the partition at the next epoch.
        assert_eq!(b.claim(2, 2, 10).unwrap(), Kind::Ready);
        let mut g = udp(5000);
        assert!(b.process(&meta(2, 2), &mut g, 11));
        assert_eq!(
            translated_port(&g),
            port,
            "the mapping survived the failover"
        );
        // A new flow at b gets a port a never handed out (the pool moved with the partition).
        let mut h = udp(5001);
        assert!(b.process(&meta(2, 2), &mut h, 12));
        assert_ne!(translated_port(&h), port);
        // A frame for another stage's partition 2 is not b's, whatever its epoch.
        let misdirected = b.stats().misdirected;
        let other_stage = Meta {
            stage: 1,
            ..meta(2, 2)
        };
        assert!(!b.process(&other_stage, &mut udp(5002), 12));
        assert_eq!(b.stats().misdirected, misdirected + 1);
        // a's stale epoch: its record is gone, its packets are refused.
        a.revalidate().unwrap();
        assert_eq!(a.owned_partitions(), Vec::<u32>::new());
        assert!(!a.process(&meta(2, 1), &mut udp(5000), 13));
        assert_eq!(a.stats().misdirected, 1);
        // An older epoch cannot take the record back.
        assert_eq!(a.claim(2, 1, 14).unwrap(), Kind::Refused);
    }

    #[test]
    fn the_engine_s_counters_outlive_the_partitions_that_counted_them() {
        let store = Arc::new(Shared(LocalStore::new()));
        let mut a = instance(1, &store);
        assert_eq!(a.claim(1, 1, 0).unwrap(), Kind::Ready);
        assert_eq!(a.claim(3, 1, 0).unwrap(), Kind::Ready);
        for (p, port) in [(1, 6000), (1, 6001), (3, 6002)] {
            assert!(a.process(&meta(p, 1), &mut udp(port), 1));
        }
        let packets_in = |a: &Instance| -> Vec<(&str, u64)> {
            a.nf_counters()
                .iter()
                .map(|(nf, c)| (*nf, c.packets_in))
                .collect()
        };
        assert_eq!(packets_in(&a), [("nat", 3)]);
        a.commit(1).unwrap();
        assert_eq!(a.release(1, 1, 2).unwrap(), Kind::Released);
        assert_eq!(a.owned_partitions(), [3]);
        assert_eq!(
            packets_in(&a),
            [("nat", 3)],
            "partition 1's packets still count"
        );
        assert!(a.drop_reasons().is_empty());
    }

    #[test]
    fn release_then_claim_and_assignment_fencing() {
        let store = Arc::new(Shared(LocalStore::new()));
        let (mut a, mut b) = (instance(1, &store), instance(2, &store));
        a.claim(1, 1, 0).unwrap();
        let mut f = udp(6000);
        assert!(a.process(&meta(1, 1), &mut f, 1));
        a.commit(1).unwrap();
        assert_eq!(a.release(1, 1, 2).unwrap(), Kind::Released);
        assert!(a.owned_partitions().is_empty());
        assert_eq!(b.claim(1, 2, 3).unwrap(), Kind::Ready);
        let mut g = udp(6000);
        assert!(b.process(&meta(1, 2), &mut g, 4));
        assert_eq!(translated_port(&g), translated_port(&f));
        // Wrong epoch on the data path.
        assert!(!b.process(&meta(1, 1), &mut udp(6000), 5));
        // The controller gives partition 1 to someone else: b keeps serving what is in
        // flight until the release, or drops it when none comes in time.
        let member = |id, live| MemberAddr {
            id,
            addr: format!("192.0.2.1{id}:6081").parse().unwrap(),
            live,
            draining: false,
        };
        let a3 = Assignment {
            version: 9,
            term: 0,
            stage: 0,
            slots: (0..4)
                .map(|_| Slot {
                    owner: Some(3),
                    epoch: 3,
                })
                .collect(),
            members: vec![member(2, true), member(3, true)],
        };
        b.apply(&a3, 10);
        assert_eq!(b.owned_partitions(), vec![1]);
        assert!(b.process(&meta(1, 2), &mut udp(6000), 11));
        b.expire_leaving(100, 1000);
        assert_eq!(b.owned_partitions(), vec![1]);
        b.expire_leaving(1011, 1000);
        assert!(b.owned_partitions().is_empty());
        // Declared dead: everything goes at once.
        assert_eq!(b.claim(0, 4, 20).unwrap(), Kind::Ready);
        b.apply(
            &Assignment {
                version: 10,
                term: 0,
                members: vec![member(2, false)],
                ..a3
            },
            21,
        );
        assert!(b.owned_partitions().is_empty());
        assert_eq!(b.stats().fenced, 2);
    }

    /// The controller moved partition 1 on (version 2) while the root's claim of version 1
    /// was still on its way: the control socket is read first, so the assignment comes
    /// before the claim, and the root, claiming at the new owner directly, will send no
    /// release. Taken, the partition would stay owned here for good, its timers racing the
    /// new owner's.
    /// A claim with an epoch far beyond any assignment (2^32 − 1, from a buggy or hostile
    /// key holder) is refused and leaves the ownership record alone: the real claim after it
    /// is granted.
    #[test]
    fn a_claim_far_ahead_of_the_assignments_is_refused_not_recorded() {
        let store = Arc::new(Shared(LocalStore::new()));
        let mut a = instance(1, &store);
        assert_eq!(a.claim(1, u32::MAX, 0).unwrap(), Kind::Refused);
        assert_eq!(a.stats().refused, 1);
        assert!(a.owned_partitions().is_empty());
        let mut b = instance(2, &store);
        assert_eq!(b.claim(1, 1, 1).unwrap(), Kind::Ready);
    }

    #[test]
    fn a_claim_the_assignment_superseded_is_refused() {
        let store = Arc::new(Shared(LocalStore::new()));
        let mut a = instance(1, &store);
        let member = |id| MemberAddr {
            id,
            addr: format!("192.0.2.1{id}:6081").parse().unwrap(),
            live: true,
            draining: false,
        };
        let slot = |owner, epoch| Slot {
            owner: Some(owner),
            epoch,
        };
        a.apply(
            &Assignment {
                version: 2,
                term: 0,
                stage: 0,
                slots: vec![slot(1, 1), slot(3, 2), slot(1, 1), slot(1, 1)],
                members: vec![member(1), member(3)],
            },
            0,
        );
        assert_eq!(a.claim(1, 1, 1).unwrap(), Kind::Refused);
        assert_eq!(a.claim(0, 1, 1).unwrap(), Kind::Ready);
        assert_eq!(a.owned_partitions(), vec![0]);
        assert_eq!(a.stats().refused, 1);
        // A later assignment giving it back, at a newer epoch, is claimed as usual.
        assert_eq!(a.claim(1, 3, 2).unwrap(), Kind::Ready);
    }

    #[test]
    fn after_a_pause_partitions_claimed_by_others_are_dropped() {
        let store = Arc::new(Shared(LocalStore::new()));
        let (mut a, mut b) = (instance(1, &store), instance(2, &store));
        a.claim(0, 1, 0).unwrap();
        a.claim(1, 1, 0).unwrap();
        // While `a` was paused, `b` took partition 1 over (failover: no release).
        assert_eq!(b.claim(1, 2, 1).unwrap(), Kind::Ready);
        a.revalidate().unwrap();
        assert_eq!(a.owned_partitions(), vec![0], "partition 1 is b's now");
        assert_eq!(a.stats().fenced, 1);
        assert!(
            !a.process(&meta(1, 1), &mut udp(6000), 2),
            "not served any more"
        );
    }

    #[test]
    fn claims_taken_together_are_answered_each_as_alone() {
        let store = Arc::new(Shared(LocalStore::new()));
        let (mut a, mut b) = (instance(1, &store), instance(2, &store));
        // Partition 2's record is at epoch 5 already (a newer owner).
        assert_eq!(a.claim(2, 5, 0).unwrap(), Kind::Ready);
        a.claim(1, 1, 0).unwrap();
        let mut f = udp(6000);
        assert!(a.process(&meta(1, 1), &mut f, 1));
        a.commit(1).unwrap();
        a.release(1, 1, 2).unwrap();
        let mut answers = Vec::new();
        b.claim_many(&[(0, 3), (1, 3), (2, 3), (9, 3)], 3, |i, r| {
            answers.push((i, r.unwrap()))
        });
        assert_eq!(
            answers,
            vec![
                (0, Kind::Ready),
                (1, Kind::Ready),
                (2, Kind::Refused),
                (3, Kind::Refused)
            ],
            "answered in order; a newer epoch and a partition out of range refused"
        );
        assert_eq!(b.owned_partitions(), vec![0, 1]);
        assert_eq!(b.stats().refused, 1);
        // The partition taken over has its state, and a repeated claim changes nothing.
        let mut g = udp(6000);
        assert!(b.process(&meta(1, 3), &mut g, 4));
        assert_eq!(translated_port(&g), translated_port(&f));
        assert_eq!(b.claim(1, 3, 5).unwrap(), Kind::Ready);
        assert_eq!(b.stats().claims, 2);
    }

    #[test]
    fn a_copy_move_reads_and_writes_the_whole_state_and_keeps_the_mappings() {
        let store = Arc::new(Shared(LocalStore::new()));
        let (mut a, mut b) = (
            instance_with(1, &store, true),
            instance_with(2, &store, true),
        );
        a.claim(3, 1, 0).unwrap();
        let imported = a.stats().copied_bytes;
        assert!(
            imported > 0,
            "a partition's first claim copies its fresh pools"
        );
        let ports: Vec<u16> = (0..10)
            .map(|i| {
                let mut f = udp(7000 + i);
                assert!(a.process(&meta(3, 1), &mut f, 1));
                translated_port(&f)
            })
            .collect();
        a.commit(1).unwrap();
        a.release(3, 1, 2).unwrap();
        let exported = a.stats().copied_bytes - imported;
        assert!(
            exported > imported,
            "the old owner exported pools and sessions"
        );
        b.claim(3, 2, 3).unwrap();
        assert_eq!(
            b.stats().copied_bytes,
            exported,
            "the new owner imported it all"
        );
        for (i, port) in ports.into_iter().enumerate() {
            let mut f = udp(7000 + i as u16);
            assert!(b.process(&meta(3, 2), &mut f, 4));
            assert_eq!(translated_port(&f), port);
        }
    }

    #[test]
    fn a_local_store_is_refused() {
        let c: Arc<dyn Connector> = Arc::new(LocalStore::new());
        let e = Instance::new(config(1), nat_chain(), c).unwrap_err();
        assert!(e.to_string().contains("state.backend"), "{e}");
    }

    /// A shared store that cannot fence (as cassandra).
    struct Unfenced(Shared);

    impl Connector for Unfenced {
        fn name(&self) -> &'static str {
            "unfenced"
        }
        fn connect(&self) -> Result<Box<dyn Backend>, flowstate_state::BackendError> {
            self.0.connect()
        }
    }

    #[test]
    fn a_store_that_cannot_fence_is_refused_unless_the_deployment_accepts_it() {
        let c: Arc<dyn Connector> = Arc::new(Unfenced(Shared(LocalStore::new())));
        let config = |unfenced_store| InstanceConfig {
            unfenced_store,
            ..config(1)
        };
        let e = Instance::new(config(false), nat_chain(), Arc::clone(&c)).unwrap_err();
        let e = e.to_string();
        assert!(e.contains("state.backend: unfenced cannot fence"), "{e}");
        assert!(e.contains("unfenced_store = true"), "{e}");
        assert!(Instance::new(config(true), nat_chain(), c).is_ok());
    }

    /// The shared local store behind a switch: while `down`, every batch fails as an
    /// unreachable store's would (a killed Cassandra node, a Redis master failing over).
    struct Outage {
        store: LocalStore,
        down: Arc<std::sync::atomic::AtomicBool>,
    }

    struct OutageBackend {
        inner: Box<dyn Backend>,
        down: Arc<std::sync::atomic::AtomicBool>,
    }

    impl OutageBackend {
        fn up(&self) -> Result<(), flowstate_state::BackendError> {
            match self.down.load(std::sync::atomic::Ordering::SeqCst) {
                true => Err(flowstate_state::BackendError::Unreachable {
                    backend: "outage",
                    reason: "down".into(),
                }),
                false => Ok(()),
            }
        }
    }

    impl Backend for OutageBackend {
        fn name(&self) -> &'static str {
            "outage"
        }
        fn execute(
            &mut self,
            ops: &[Op],
            replies: &mut Vec<Reply>,
        ) -> Result<(), flowstate_state::BackendError> {
            self.up()?;
            self.inner.execute(ops, replies)
        }
        fn execute_fenced(
            &mut self,
            fence: &flowstate_state::Fence,
            ops: &[Op],
            replies: &mut Vec<Reply>,
        ) -> Result<(), flowstate_state::BackendError> {
            self.up()?;
            self.inner.execute_fenced(fence, ops, replies)
        }
        fn partitions(
            &mut self,
            nf: &str,
            kind: ObjKind,
            id: &str,
        ) -> Result<Vec<ObjectKey>, flowstate_state::BackendError> {
            self.inner.partitions(nf, kind, id)
        }
    }

    impl Connector for Outage {
        fn name(&self) -> &'static str {
            "outage"
        }
        fn connect(&self) -> Result<Box<dyn Backend>, flowstate_state::BackendError> {
            Ok(Box::new(OutageBackend {
                inner: self.store.connect()?,
                down: Arc::clone(&self.down),
            }))
        }
        fn fences(&self) -> bool {
            true
        }
    }

    #[test]
    fn a_failed_commit_stays_uncommitted_with_its_notices_until_one_goes_through() {
        let down = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let store = Arc::new(Outage {
            store: LocalStore::new(),
            down: Arc::clone(&down),
        });
        let chain = vec![flowstate_nf::registry::factory("counter", &toml::Table::new()).unwrap()];
        let mut a =
            Instance::new(config(1), chain, Arc::clone(&store) as Arc<dyn Connector>).unwrap();
        a.claim(2, 1, 0).unwrap();
        assert!(!a.uncommitted());
        assert!(a.process(&data(2, 1, 7, false), &mut udp(5000), 1));
        assert!(a.uncommitted(), "processed, not yet committed");
        down.store(true, std::sync::atomic::Ordering::SeqCst);
        assert!(a.commit(2).is_err());
        assert!(
            a.uncommitted(),
            "a failed commit leaves its partition to commit"
        );
        assert_eq!(a.stats().commit_errors, 1);
        down.store(false, std::sync::atomic::Ordering::SeqCst);
        a.commit(3).unwrap();
        assert!(!a.uncommitted());
        // The packet's notice went out with the commit that made it durable, and it counted once.
        assert_eq!(a.notices().0, &[(7, 1)]);
        assert_eq!(counted(store.as_ref()), 1);
    }
}
