//! The cluster controller's decision core (StatelessNF §4.2, HashMVT §IV-D): instances report
//! every interval, the controller decides who owns each traffic partition, when an instance is
//! dead, and which instances to start, drain and stop.
//!
//! Promises:
//! * Sans-IO: reports, commands and the time are passed in; [`Controller::tick`] returns
//!   [`Decision`]s (publish an [`Assignment`], start, stop, failed), so every rule is tested under
//!   a virtual clock. The caller persists each published assignment in the store before it sends
//!   it to the root and the instances.
//! * Every published assignment gives each partition exactly one owner, an instance that is
//!   live or draining; none only while no instance is live. An owner change bumps that slot's
//!   epoch (the fencing token of the ownership record), and every publish has a strictly
//!   greater version, also across a controller restart ([`Controller::new`] with the stored
//!   assignment).
//! * Stability: partitions move only when membership changes (a join, a death, a drain), and
//!   then the fewest: a joining instance takes partitions one at a time from the largest holder
//!   until counts differ by at most one; a dead or drained instance's partitions go to the
//!   instances with the fewest. The same input publishes nothing.
//! * Failure detection (StatelessNF §4.2, HashMVT §IV-D1): an instance not heard from for
//!   `missed × interval` is dead; its partitions are reassigned in the same tick (failing over is
//!   cheap when state lives in the store, so detection can be fast and speculative). An instance
//!   started but not heard from within `start_timeout` is failed too.
//! * Stragglers (CHC §5.3): the root measures how long each instance's packets wait
//!   ([`Lag`]); an instance whose packets waited `straggler` or longer in `missed` consecutive
//!   root reports, while another live instance of its stage kept up, is failed over like a
//!   dead one ([`Decision::Straggler`]): its partitions go to the others, the root replays
//!   what it had not finished, and its late outputs are dropped by epoch.
//! * Scaling (StatelessNF §4.2, HashMVT §IV-D2): the controller drives the number of starting
//!   and live instances to a target, set by [`Controller::scale`], lowered by
//!   [`Controller::drain`], or moved one step at a time on load thresholds (η, Eq. 1) when
//!   `auto_scale` is on. Scale-in drains: an instance is stopped only after it reports it serves
//!   nothing under the assignment that took its last partition away.
//! * The [`Assignment`] and [`Report`] wire formats are versioned and binary; decoding checks
//!   every length and never panics.

use flowstate_mvt::Nanos;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet};
use std::net::{Ipv4Addr, SocketAddrV4};

/// An instance's id, 1-based (instance `k` runs in lab namespace `i{k}`).
pub type InstanceId = u32;

/// The wire value of "no owner" (ids are 1-based, so no instance has it).
pub const NO_OWNER: InstanceId = 0;

const ASSIGNMENT_MAGIC: &[u8; 4] = b"FSAS";
const REPORT_MAGIC: &[u8; 4] = b"FSRP";
const LAG_MAGIC: &[u8; 4] = b"FSLG";
/// The format version of [`Assignment`] and [`Lag`] this code writes and reads.
pub const FORMAT_VERSION: u8 = 3;
/// The format version of [`Report`] this code writes (it reads 3 too: no `store_trouble`).
pub const REPORT_FORMAT: u8 = 4;

/// One traffic partition's owner and ownership epoch (incremented every time the owner changes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slot {
    /// The instance that owns the partition, `None` while no instance is live.
    pub owner: Option<InstanceId>,
    /// The ownership epoch: incremented every time `owner` changes, never decreases.
    pub epoch: u32,
}

/// An instance as the assignment publishes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemberAddr {
    /// The instance.
    pub id: InstanceId,
    /// Where it receives traffic (the address of its reports).
    pub addr: SocketAddrV4,
    /// Running: live or draining. A dead instance stays listed with `live == false`, so the
    /// root does not wait for it to hand its old partitions over.
    pub live: bool,
    /// Being drained: it owns nothing, or nothing once it hands over, and is stopped once it
    /// reports so. Persisted, so a restarted controller finishes the drain.
    pub draining: bool,
}

/// The controller's published decision: who owns each partition. Persisted in the store by the
/// caller and sent to the root and every instance.
///
/// ```text
/// magic "FSAS" | format u8 (3) | version u64 | term u64 | stage u32
/// | slot count u32 | count × (owner u32 (0 = none), epoch u32)
/// | member count u32 | count × (id u32, ipv4 [4], port u16, flags u8 (1 live, 2 draining))
/// ```
///
/// All integers big-endian. Format 2 (written before controllers had terms) has no term and
/// reads as term 0.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assignment {
    /// Strictly increasing per publish; 0 is the empty assignment nothing was published for.
    pub version: u64,
    /// The term of the leading controller that published it (its lease's fencing number):
    /// receivers refuse an assignment of a lower term than one they applied.
    pub term: u64,
    /// The chain stage whose partitions these are (each stage has its own pool of instances
    /// and its own controller core).
    pub stage: u32,
    /// One slot per partition, indexed by partition.
    pub slots: Vec<Slot>,
    /// The instances, by id: every owner, and the dead ones.
    pub members: Vec<MemberAddr>,
}

/// What an instance reports every heartbeat interval (UDP).
///
/// ```text
/// magic "FSRP" | format u8 (3) | stage u32 | id u32 | ipv4 [4] | port u16 | pid u32 | seq u64
/// | load f64 (IEEE 754 bits) | packets u64 | drops u64 | entries u64
/// | assignment_version u64 | partition count u32 | count × u32
/// ```
///
/// All integers big-endian. A load outside 0..=1 (or NaN) does not decode.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    /// The stage the instance runs.
    pub stage: u32,
    /// The reporting instance.
    pub id: InstanceId,
    /// Where it receives traffic.
    pub addr: SocketAddrV4,
    /// Its process id.
    pub pid: u32,
    /// Increases per report (older or repeated ones are ignored).
    pub seq: u64,
    /// η = busy / total time of the last interval (HashMVT Eq. 1), 0..=1.
    pub load: f64,
    /// The partitions it serves now.
    pub partitions: Vec<u32>,
    /// Packets processed so far.
    pub packets: u64,
    /// Packets dropped so far.
    pub drops: u64,
    /// State entries it holds.
    pub entries: u64,
    /// The newest assignment version it has applied.
    pub assignment_version: u64,
    /// Commits the store failed, or held longer than a report interval, so far: its packets
    /// wait for the store meanwhile, which does not make it a straggler.
    pub store_trouble: u64,
}

/// Why bytes are not an [`Assignment`] or a [`Report`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// Too short for what it says it holds.
    #[error("truncated message")]
    Truncated,
    /// Not this kind of message.
    #[error("bad magic")]
    Magic,
    /// A format version this code does not read.
    #[error("unsupported format version {0}")]
    Version(u8),
    /// A field holds a value it cannot have.
    #[error("invalid {0}")]
    Invalid(&'static str),
    /// Bytes after the end.
    #[error("trailing bytes")]
    Trailing,
}

impl Assignment {
    /// The empty assignment of stage `stage`'s `partitions` partitions (version 0, no owner).
    pub fn empty(stage: u32, partitions: u32) -> Assignment {
        Assignment {
            version: 0,
            term: 0,
            stage,
            slots: vec![
                Slot {
                    owner: None,
                    epoch: 0
                };
                partitions as usize
            ],
            members: Vec::new(),
        }
    }

    /// The partitions `id` owns, ascending.
    pub fn owned_by(&self, id: InstanceId) -> Vec<u32> {
        (0u32..)
            .zip(&self.slots)
            .filter(|(_, s)| s.owner == Some(id))
            .map(|(p, _)| p)
            .collect()
    }

    /// The published address and liveness of `id`.
    pub fn member(&self, id: InstanceId) -> Option<&MemberAddr> {
        self.members.iter().find(|m| m.id == id)
    }

    /// The encoded assignment. An owner or member id of 0 ([`NO_OWNER`]) is not an instance:
    /// an owner `Some(0)` reads back as none, a member 0 does not decode.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(21 + 8 * self.slots.len() + 11 * self.members.len());
        out.extend_from_slice(ASSIGNMENT_MAGIC);
        out.push(FORMAT_VERSION);
        out.extend_from_slice(&self.version.to_be_bytes());
        out.extend_from_slice(&self.term.to_be_bytes());
        out.extend_from_slice(&self.stage.to_be_bytes());
        out.extend_from_slice(&(self.slots.len() as u32).to_be_bytes());
        for s in &self.slots {
            out.extend_from_slice(&s.owner.unwrap_or(NO_OWNER).to_be_bytes());
            out.extend_from_slice(&s.epoch.to_be_bytes());
        }
        out.extend_from_slice(&(self.members.len() as u32).to_be_bytes());
        for m in &self.members {
            out.extend_from_slice(&m.id.to_be_bytes());
            put_addr(&mut out, m.addr);
            out.push(u8::from(m.live) | u8::from(m.draining) << 1);
        }
        out
    }

    /// Decodes `b`; never panics.
    pub fn decode(b: &[u8]) -> Result<Assignment, DecodeError> {
        let (mut r, format) = Reader::open_any(b, ASSIGNMENT_MAGIC, &[2, FORMAT_VERSION])?;
        let version = r.u64()?;
        let term = if format == 2 { 0 } else { r.u64()? };
        let stage = r.u32()?;
        let n = r.count(8)?;
        let mut slots = Vec::with_capacity(n);
        for _ in 0..n {
            let owner = r.u32()?;
            slots.push(Slot {
                owner: (owner != NO_OWNER).then_some(owner),
                epoch: r.u32()?,
            });
        }
        let n = r.count(11)?;
        let mut members = Vec::with_capacity(n);
        for _ in 0..n {
            let id = r.u32()?;
            if id == NO_OWNER {
                return Err(DecodeError::Invalid("member id 0"));
            }
            let addr = r.addr()?;
            let flags = r.u8()?;
            if flags > 3 {
                return Err(DecodeError::Invalid("member flags"));
            }
            members.push(MemberAddr {
                id,
                addr,
                live: flags & 1 != 0,
                draining: flags & 2 != 0,
            });
        }
        r.finish()?;
        Ok(Assignment {
            version,
            term,
            stage,
            slots,
            members,
        })
    }
}

impl Report {
    /// The encoded report.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(79 + 4 * self.partitions.len());
        out.extend_from_slice(REPORT_MAGIC);
        out.push(REPORT_FORMAT);
        out.extend_from_slice(&self.stage.to_be_bytes());
        out.extend_from_slice(&self.id.to_be_bytes());
        put_addr(&mut out, self.addr);
        out.extend_from_slice(&self.pid.to_be_bytes());
        for v in [
            self.seq,
            self.load.to_bits(),
            self.packets,
            self.drops,
            self.entries,
            self.assignment_version,
            self.store_trouble,
        ] {
            out.extend_from_slice(&v.to_be_bytes());
        }
        out.extend_from_slice(&(self.partitions.len() as u32).to_be_bytes());
        for p in &self.partitions {
            out.extend_from_slice(&p.to_be_bytes());
        }
        out
    }

    /// Decodes `b`; never panics.
    pub fn decode(b: &[u8]) -> Result<Report, DecodeError> {
        let (mut r, format) = Reader::open_any(b, REPORT_MAGIC, &[3, REPORT_FORMAT])?;
        let stage = r.u32()?;
        let id = r.u32()?;
        if id == NO_OWNER {
            return Err(DecodeError::Invalid("instance id 0"));
        }
        let addr = r.addr()?;
        let pid = r.u32()?;
        let seq = r.u64()?;
        let load = f64::from_bits(r.u64()?);
        if !(0.0..=1.0).contains(&load) {
            return Err(DecodeError::Invalid("load"));
        }
        let (packets, drops, entries, assignment_version) =
            (r.u64()?, r.u64()?, r.u64()?, r.u64()?);
        let store_trouble = if format >= 4 { r.u64()? } else { 0 };
        let n = r.count(4)?;
        let mut partitions = Vec::with_capacity(n);
        for _ in 0..n {
            partitions.push(r.u32()?);
        }
        r.finish()?;
        Ok(Report {
            stage,
            id,
            addr,
            pid,
            seq,
            load,
            partitions,
            packets,
            drops,
            entries,
            assignment_version,
            store_trouble,
        })
    }
}

fn put_addr(out: &mut Vec<u8>, a: SocketAddrV4) {
    out.extend_from_slice(&a.ip().octets());
    out.extend_from_slice(&a.port().to_be_bytes());
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn open(b: &'a [u8], magic: &[u8; 4]) -> Result<Self, DecodeError> {
        Ok(Reader::open_any(b, magic, &[FORMAT_VERSION])?.0)
    }
    /// Opens `b` in one of the `formats`; which.
    fn open_any(b: &'a [u8], magic: &[u8; 4], formats: &[u8]) -> Result<(Self, u8), DecodeError> {
        let mut r = Reader(b);
        if r.take(4)? != magic {
            return Err(DecodeError::Magic);
        }
        match r.u8()? {
            v if formats.contains(&v) => Ok((r, v)),
            v => Err(DecodeError::Version(v)),
        }
    }
    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if self.0.len() < n {
            return Err(DecodeError::Truncated);
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }
    fn array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }
    fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.array::<1>()?[0])
    }
    fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_be_bytes(self.array()?))
    }
    fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_be_bytes(self.array()?))
    }
    fn addr(&mut self) -> Result<SocketAddrV4, DecodeError> {
        let ip = Ipv4Addr::from(self.array::<4>()?);
        Ok(SocketAddrV4::new(ip, u16::from_be_bytes(self.array()?)))
    }
    /// A count of items of at least `size` bytes each: one larger than the rest is a lie (so
    /// nothing is allocated for it).
    fn count(&mut self, size: usize) -> Result<usize, DecodeError> {
        let n = self.u32()? as usize;
        if n > self.0.len() / size {
            return Err(DecodeError::Truncated);
        }
        Ok(n)
    }
    fn finish(self) -> Result<(), DecodeError> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(DecodeError::Trailing)
        }
    }
}

/// Controller settings.
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterConfig {
    /// The chain stage this controller core assigns (default 0).
    pub stage: u32,
    /// Traffic partitions (default 16). A restored assignment's count wins: state is
    /// partitioned by it, so it cannot change under a running cluster.
    pub partitions: u32,
    /// Heartbeat interval, ns (default 50 ms).
    pub interval: Nanos,
    /// Intervals without a report before an instance is dead (default 3).
    pub missed: u32,
    /// A started instance not heard from by then is failed, ns (default 10 s).
    pub start_timeout: Nanos,
    /// Instances at least (default 1; 0 counts as 1).
    pub min_instances: u32,
    /// Instances at most (default 16).
    pub max_instances: u32,
    /// Warm standby instances kept running beyond the target, owning no partition (default
    /// 0). A failed instance's partitions go to a standby at once, so that no process starts
    /// while a failover runs (StatelessNF §4.2 starts a replacement); a new standby is then
    /// started in its place.
    pub standby: u32,
    /// Scale on load thresholds (default false: scale on command only).
    pub auto_scale: bool,
    /// Mean η of the live instances above which the target grows by one (default 0.8).
    pub scale_out_load: f64,
    /// Mean η of the live instances below which the target shrinks by one (default 0.2).
    pub scale_in_load: f64,
    /// Consecutive intervals above / below a threshold before acting (default 5).
    pub scale_periods: u32,
    /// How long an instance's packets may wait before it is a straggler, ns (default 250 ms;
    /// 0: never).
    pub straggler: Nanos,
    /// How far ahead of this controller's clock a report's `seq` may be (instances number
    /// their reports from their wall clock, ns); one further ahead is refused, not adopted.
    pub clock_skew: Nanos,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            stage: 0,
            partitions: 16,
            interval: 50_000_000,
            missed: 3,
            start_timeout: 10_000_000_000,
            min_instances: 1,
            max_instances: 16,
            standby: 0,
            auto_scale: false,
            scale_out_load: 0.8,
            scale_in_load: 0.2,
            scale_periods: 5,
            straggler: 250_000_000,
            clock_skew: 60_000_000_000,
        }
    }
}

/// Where an instance is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemberState {
    /// Started ([`Decision::Start`]), not heard from yet.
    Starting,
    /// Reporting; may own partitions.
    Live,
    /// Reporting, owning nothing, beyond the target: promoted to live when a live instance
    /// fails or the target grows ([`ClusterConfig::standby`]).
    Standby,
    /// Reporting; its partitions go (or went) to others, then it is stopped.
    Draining,
    /// Missed its reports (or never started); its id is free.
    Dead,
}

/// One instance as [`Controller::status`] shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct MemberStatus {
    /// The instance.
    pub id: InstanceId,
    /// Its process id, as last reported (0 before a report).
    pub pid: u32,
    /// Where it receives traffic, once known.
    pub addr: Option<SocketAddrV4>,
    /// Its state.
    pub state: MemberState,
    /// Its last reported load η (0 before a report).
    pub load: f64,
    /// The partitions it last reported serving.
    pub partitions: Vec<u32>,
    /// Packets it last reported processed.
    pub packets: u64,
    /// Packets it last reported dropped.
    pub drops: u64,
    /// State entries it last reported holding.
    pub entries: u64,
    /// How long ago its last report was accepted; `None` before one.
    pub last_heard_ns_ago: Option<Nanos>,
}

/// What the controller decided; [`Controller::tick`] returns them in this order of kinds.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// The instance is declared dead (missed reports, or never started); reported once. Make
    /// sure its process is gone: its partitions already have new owners, and a
    /// [`Decision::Start`] of the same id may follow.
    Failed {
        /// The instance.
        id: InstanceId,
    },
    /// A new assignment version: persist it, then send it to the root and the instances.
    Publish(Assignment),
    /// Stop this instance's process: it was drained and serves nothing any more (or it was
    /// starting and is no longer wanted). The controller has forgotten it.
    Stop {
        /// The instance.
        id: InstanceId,
    },
    /// Start an instance process with this id.
    Start {
        /// The instance.
        id: InstanceId,
    },
    /// The instance is a straggler (CHC §5.3): alive, but its packets waited `lag_ns` at
    /// the last root report. It is failed over as [`Decision::Failed`] is (make sure its
    /// process is gone); reported once, in the same place.
    Straggler {
        /// The instance.
        id: InstanceId,
        /// How long its oldest packet had waited, ns.
        lag_ns: Nanos,
    },
}

/// The root's measure of how long each instance's packets wait (CHC §5.3): per instance of a
/// stage, the longest time a packet sent to it waited for its answer in the last interval,
/// or has been waiting so far.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lag {
    /// The stage.
    pub stage: u32,
    /// (instance, longest wait in ns).
    pub lags: Vec<(InstanceId, Nanos)>,
}

impl Lag {
    /// The encoded report.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(13 + 12 * self.lags.len());
        out.extend_from_slice(LAG_MAGIC);
        out.push(FORMAT_VERSION);
        out.extend_from_slice(&self.stage.to_be_bytes());
        out.extend_from_slice(&(self.lags.len() as u32).to_be_bytes());
        for (id, ns) in &self.lags {
            out.extend_from_slice(&id.to_be_bytes());
            out.extend_from_slice(&ns.to_be_bytes());
        }
        out
    }

    /// Decodes `b`; never panics.
    pub fn decode(b: &[u8]) -> Result<Lag, DecodeError> {
        let mut r = Reader::open(b, LAG_MAGIC)?;
        let stage = r.u32()?;
        let n = r.count(12)?;
        let mut lags = Vec::with_capacity(n);
        for _ in 0..n {
            lags.push((r.u32()?, r.u64()?));
        }
        r.finish()?;
        Ok(Lag { stage, lags })
    }
}

/// Why a command was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ControlError {
    /// No such instance.
    #[error("instance {0} is unknown")]
    Unknown(InstanceId),
    /// Only a live instance can be drained.
    #[error("instance {id} is {state:?}: only a live instance can be drained")]
    NotLive {
        /// The instance.
        id: InstanceId,
        /// Its state.
        state: MemberState,
    },
    /// Below `min_instances`.
    #[error("cannot scale to {n} instances: the minimum is {min}")]
    BelowMin {
        /// The target asked for.
        n: u32,
        /// The minimum.
        min: u32,
    },
    /// Above `max_instances`.
    #[error("cannot scale to {n} instances: the maximum is {max}")]
    AboveMax {
        /// The target asked for.
        n: u32,
        /// The maximum.
        max: u32,
    },
    /// Draining it would leave no live instance.
    #[error("instance {0} is the last live instance: draining it would leave none")]
    LastInstance(InstanceId),
}

#[derive(Debug, Clone)]
struct Member {
    state: MemberState,
    addr: Option<SocketAddrV4>,
    /// The last sign of life: a report, the restore, or the start. Deadlines count from it.
    seen: Nanos,
    /// When its last report was accepted.
    heard: Option<Nanos>,
    report: Option<Report>,
    /// Draining and owning nothing since this assignment version.
    drained_at: Option<u64>,
    /// Consecutive reports of each root (by its index) in which its packets waited
    /// `straggler` or longer (roots measure apart: each its own packets), and the last wait
    /// reported.
    slow: BTreeMap<u32, u32>,
    lag: Nanos,
    /// When its reports last showed more failed commits: its packets wait for the store.
    store_trouble: Option<Nanos>,
}

impl Member {
    fn new(state: MemberState, addr: Option<SocketAddrV4>, now: Nanos) -> Member {
        Member {
            state,
            addr,
            seen: now,
            heard: None,
            report: None,
            drained_at: None,
            slow: BTreeMap::new(),
            lag: 0,
            store_trouble: None,
        }
    }

    fn serving(&self) -> bool {
        matches!(
            self.state,
            MemberState::Live | MemberState::Standby | MemberState::Draining
        )
    }
}

/// The controller: a state machine over reports, commands and time.
#[derive(Debug, Clone)]
pub struct Controller {
    config: ClusterConfig,
    assignment: Assignment,
    members: BTreeMap<InstanceId, Member>,
    target: u32,
    /// Stopped instances, with the pid of their process when known: its late reports (in
    /// flight, or sent while it exits) are not a join. Cleared when the id is started again.
    stopped: BTreeMap<InstanceId, Option<u32>>,
    /// An instance joined: balance at the next tick.
    rebalance: bool,
    above: u32,
    below: u32,
    next_scale_check: Nanos,
    /// Ids other pools (the chain's other stages) use: never started here.
    taken: BTreeSet<InstanceId>,
}

impl Controller {
    /// A controller at `now`. `restored`: the assignment found in the store. A restarted
    /// controller resumes it: its live members are live (draining ones draining) as if just
    /// heard from, so none is declared dead before `missed × interval` from now; live members
    /// owning no partition are standbys again (up to [`ClusterConfig::standby`]); the target is
    /// the number of live, non-draining members (within the bounds); the next publish
    /// continues its version; nothing is published until something changes. Without one, the
    /// target is `min_instances` and the first instance to report gets every partition.
    pub fn new(config: ClusterConfig, restored: Option<Assignment>, now: Nanos) -> Controller {
        let mut c = Controller {
            assignment: Assignment::empty(config.stage, config.partitions),
            taken: BTreeSet::new(),
            members: BTreeMap::new(),
            target: 0,
            stopped: BTreeMap::new(),
            rebalance: false,
            above: 0,
            below: 0,
            next_scale_check: now.saturating_add(config.interval),
            config,
        };
        let (min, max) = c.bounds();
        c.target = min;
        if let Some(a) = restored {
            let mut standbys = 0;
            for m in &a.members {
                let owns = a.slots.iter().any(|s| s.owner == Some(m.id));
                let state = match (m.live, m.draining) {
                    (false, _) => MemberState::Dead,
                    (true, false) if !owns && standbys < c.config.standby => {
                        standbys += 1;
                        MemberState::Standby
                    }
                    (true, false) => MemberState::Live,
                    (true, true) => MemberState::Draining,
                };
                c.members
                    .insert(m.id, Member::new(state, Some(m.addr), now));
            }
            c.target = c.count(MemberState::Live).clamp(min, max);
            c.assignment = a;
        }
        c
    }

    /// Takes an instance's report. A report from an instance that is not live, standby or
    /// draining (starting, dead, unknown) is a join: it becomes live and gets partitions by
    /// rebalancing at the next tick (a dead one's old partitions are not given back), or a
    /// standby when the target is met and standbys are missing. One that was not a standby and
    /// not
    /// started by this controller raises the target to count it (up to `max_instances`).
    /// Reports not newer (by `seq`) than the last accepted one of a live member are ignored, and
    /// so are those of a stopped instance's process (the same pid; any pid if it was stopped
    /// before it reported) until its id is started again, and those numbered more than
    /// `clock_skew` ahead of `now` (which would make the member's real reports look old).
    pub fn on_report(&mut self, r: &Report, now: Nanos) {
        if r.seq > now.saturating_add(self.config.clock_skew) {
            return;
        }
        if r.id == NO_OWNER
            || !self.members.contains_key(&r.id)
                && self
                    .stopped
                    .get(&r.id)
                    .is_some_and(|pid| pid.is_none_or(|p| p == r.pid))
        {
            return;
        }
        let prior = self.members.get(&r.id).map(|m| m.state);
        match self.members.get_mut(&r.id) {
            Some(m) if m.serving() => {
                if m.report.as_ref().is_some_and(|l| r.seq <= l.seq) {
                    return; // UDP reordering or a duplicate
                }
                m.addr = Some(r.addr);
                m.seen = now;
                m.heard = Some(now);
                if m.report
                    .as_ref()
                    .is_some_and(|l| r.store_trouble > l.store_trouble)
                {
                    m.store_trouble = Some(now);
                }
                m.report = Some(r.clone());
            }
            _ => {
                let started = prior == Some(MemberState::Starting);
                let spare = self.count(MemberState::Live) >= self.target
                    && self.count(MemberState::Standby) < self.config.standby;
                let state = if spare {
                    MemberState::Standby
                } else {
                    MemberState::Live
                };
                let mut m = Member::new(state, Some(r.addr), now);
                m.heard = Some(now);
                m.report = Some(r.clone());
                self.members.insert(r.id, m);
                self.rebalance |= !spare;
                if !started && !spare {
                    let have = self.count(MemberState::Live) + self.count(MemberState::Starting);
                    self.target = self.target.max(have.min(self.bounds().1));
                }
            }
        }
    }

    /// Takes root `root`'s [`Lag`] report of this controller's stage at `now`. An instance whose
    /// store was in trouble (commits failed or held) while its oldest waiting packet waited,
    /// or within two straggler thresholds (or failure deadlines) before, is not slow: its
    /// packets wait for the store (a master failing over, then the backlog), and another
    /// instance would wait as long.
    pub fn on_lag(&mut self, root: u32, lag: &Lag, now: Nanos) {
        let threshold = self.config.straggler;
        let deadline = self
            .config
            .interval
            .saturating_mul(u64::from(self.config.missed));
        let recent = threshold.max(deadline).saturating_mul(2);
        for &(id, ns) in &lag.lags {
            if let Some(m) = self
                .members
                .get_mut(&id)
                .filter(|m| m.state == MemberState::Live)
            {
                m.lag = ns;
                let store = m
                    .store_trouble
                    .is_some_and(|t| now.saturating_sub(t) <= ns.saturating_add(recent));
                if threshold > 0 && ns >= threshold && !store {
                    let k = m.slow.entry(root).or_default();
                    *k = k.saturating_add(1);
                } else {
                    m.slow.remove(&root);
                }
            }
        }
    }

    /// Decides at `now`; call it every interval (or more often). Emits, in this order: the
    /// instances declared dead, the new assignment if it changed, the instances to stop, the
    /// instances to start.
    pub fn tick(&mut self, now: Nanos) -> Vec<Decision> {
        let mut failed = Vec::new();
        let mut stops = Vec::new();
        let mut starts = Vec::new();

        // Failure detection (HashMVT §IV-D1): a missed deadline is death, decided at once
        // (StatelessNF §4.2: failing over is cheap, so detection need not wait long).
        let deadline = self
            .config
            .interval
            .saturating_mul(u64::from(self.config.missed));
        for (id, m) in &mut self.members {
            let limit = match m.state {
                MemberState::Live | MemberState::Standby | MemberState::Draining => deadline,
                MemberState::Starting => self.config.start_timeout,
                MemberState::Dead => continue,
            };
            if now.saturating_sub(m.seen) > limit {
                m.state = MemberState::Dead;
                m.drained_at = None;
                failed.push(Decision::Failed { id: *id });
            }
        }
        // Stragglers (CHC §5.3): slow for `missed` reports of one root while another live
        // instance keeps up (a stage that is slow as a whole needs more instances, not fewer).
        let keeps_up = self
            .members
            .values()
            .any(|m| m.state == MemberState::Live && m.slow.is_empty());
        if keeps_up {
            for (id, m) in &mut self.members {
                let slow = m.slow.values().copied().max().unwrap_or(0);
                if m.state == MemberState::Live && slow >= self.config.missed.max(1) {
                    m.state = MemberState::Dead;
                    m.slow.clear();
                    failed.push(Decision::Straggler {
                        id: *id,
                        lag_ns: m.lag,
                    });
                }
            }
        }

        // A drained instance that reports serving nothing under the assignment that took its
        // last partition away is stopped and forgotten.
        self.members.retain(|id, m| {
            let done = m.state == MemberState::Draining
                && m.drained_at.is_some_and(|v| {
                    m.report
                        .as_ref()
                        .is_some_and(|r| r.partitions.is_empty() && r.assignment_version >= v)
                });
            if done {
                stops.push(Decision::Stop { id: *id });
                self.stopped.insert(*id, m.report.as_ref().map(|r| r.pid));
            }
            !done
        });

        self.auto_scale(now);

        // Standbys fill the target first (a failed instance's partitions go to one below),
        // then processes start for what is missing (StatelessNF §4.2: launch or kill):
        // starting instances become live while the target is not met, then standbys.
        let ids: Vec<InstanceId> = self.members.keys().copied().collect();
        let mut live = self.count(MemberState::Live);
        for id in &ids {
            if live >= self.target {
                break;
            }
            if let Some(m) = self.members.get_mut(id) {
                if m.state == MemberState::Standby {
                    m.state = MemberState::Live;
                    live += 1;
                    self.rebalance = true;
                }
            }
        }
        let standby = self.count(MemberState::Standby);
        let starting = self.count(MemberState::Starting);
        let wanted = self.target.saturating_sub(live) + self.config.standby.saturating_sub(standby);
        for _ in starting..wanted {
            let id = self.free_id();
            let addr = self.members.get(&id).and_then(|m| m.addr);
            self.members
                .insert(id, Member::new(MemberState::Starting, addr, now));
            self.stopped.remove(&id);
            starts.push(Decision::Start { id });
        }
        // Too many: instances not started yet go first (they serve nothing), then standbys
        // beyond their count, then the highest live ones drain.
        let mut surplus = [
            (MemberState::Starting, starting.saturating_sub(wanted)),
            (
                MemberState::Standby,
                standby.saturating_sub(self.config.standby),
            ),
            (MemberState::Live, live.saturating_sub(self.target)),
        ];
        for (state, excess) in &mut surplus {
            for id in ids.iter().rev() {
                if *excess == 0 || self.members.get(id).map(|m| m.state) != Some(*state) {
                    continue;
                }
                *excess -= 1;
                if *state == MemberState::Live {
                    self.start_drain(*id);
                } else {
                    let pid = self
                        .members
                        .remove(id)
                        .and_then(|m| m.report.map(|r| r.pid));
                    self.stopped.insert(*id, pid);
                    stops.push(Decision::Stop { id: *id });
                }
            }
        }

        let mut out = failed;
        if let Some(a) = self.reassign() {
            out.push(Decision::Publish(a));
        }
        for (id, m) in &mut self.members {
            if m.state == MemberState::Draining {
                if self.assignment.slots.iter().any(|s| s.owner == Some(*id)) {
                    m.drained_at = None;
                } else if m.drained_at.is_none() {
                    m.drained_at = Some(self.assignment.version);
                }
            }
        }
        out.extend(stops);
        out.extend(starts);
        out
    }

    /// Sets the target instance count; [`Controller::tick`] then starts or drains instances.
    /// Scaling out starts the lowest free ids (no member, or a dead one); scaling in stops
    /// instances not started yet, then drains the highest-id live ones.
    pub fn scale(&mut self, n: u32, now: Nanos) -> Result<(), ControlError> {
        let (min, max) = self.bounds();
        if n < min {
            return Err(ControlError::BelowMin { n, min });
        }
        if n > max {
            return Err(ControlError::AboveMax { n, max });
        }
        self.target = n;
        self.reset_streaks(now);
        Ok(())
    }

    /// Drains live instance `id`: at the next tick its partitions go to the others (all at
    /// once, to those with the fewest); once it reports serving none, it is stopped. The target
    /// goes down by one (not below `min_instances`: then a replacement starts). A drained
    /// standby is stopped and another started in its place. Draining a draining instance does
    /// nothing.
    pub fn drain(&mut self, id: InstanceId, now: Nanos) -> Result<(), ControlError> {
        let state = self
            .members
            .get(&id)
            .ok_or(ControlError::Unknown(id))?
            .state;
        match state {
            MemberState::Draining => return Ok(()),
            MemberState::Standby => {
                self.start_drain(id);
                return Ok(());
            }
            MemberState::Live => {}
            state => return Err(ControlError::NotLive { id, state }),
        }
        if self.count(MemberState::Live) <= 1 {
            return Err(ControlError::LastInstance(id));
        }
        self.start_drain(id);
        self.target = self.target.saturating_sub(1).max(self.bounds().0);
        self.reset_streaks(now);
        Ok(())
    }

    /// The instance count the controller drives to (starting and live, not draining).
    pub fn target(&self) -> u32 {
        self.target
    }

    /// The ids this controller knows (any state): what the other stages' pools must not take.
    pub fn ids(&self) -> impl Iterator<Item = InstanceId> + '_ {
        self.members.keys().copied()
    }

    /// The ids other pools use (instances of the chain's other stages share one id space,
    /// which names their namespaces and addresses): [`Controller::tick`] starts none of them.
    pub fn set_taken(&mut self, ids: impl IntoIterator<Item = InstanceId>) {
        self.taken.clear();
        self.taken.extend(ids);
    }

    /// The assignment last published (or restored; version 0 before any).
    pub fn assignment(&self) -> &Assignment {
        &self.assignment
    }

    /// Starts leading in `term` (a controller that took the leader's lease): the current
    /// assignment, owners and epochs unchanged, published again as a new version of that term,
    /// so that receivers take this controller's assignments and refuse the previous leader's.
    /// (Before any assignment was published, nothing is: the first one carries the term.)
    pub fn lead(&mut self, term: u64) -> Option<Assignment> {
        self.assignment.term = term;
        if self.assignment.version == 0 {
            return None;
        }
        self.assignment.version = self.assignment.version.saturating_add(1);
        Some(self.assignment.clone())
    }

    /// Every known instance, by id.
    pub fn status(&self, now: Nanos) -> Vec<MemberStatus> {
        self.members
            .iter()
            .map(|(id, m)| {
                let r = m.report.as_ref();
                MemberStatus {
                    id: *id,
                    pid: r.map_or(0, |r| r.pid),
                    addr: m.addr,
                    state: m.state,
                    load: r.map_or(0.0, |r| r.load),
                    partitions: r.map(|r| r.partitions.clone()).unwrap_or_default(),
                    packets: r.map_or(0, |r| r.packets),
                    drops: r.map_or(0, |r| r.drops),
                    entries: r.map_or(0, |r| r.entries),
                    last_heard_ns_ago: m.heard.map(|h| now.saturating_sub(h)),
                }
            })
            .collect()
    }

    /// (min, max) instances, min at least 1.
    fn bounds(&self) -> (u32, u32) {
        let min = self.config.min_instances.max(1);
        (min, self.config.max_instances.max(min))
    }

    fn count(&self, state: MemberState) -> u32 {
        self.members.values().filter(|m| m.state == state).count() as u32
    }

    /// The lowest id with no member or a dead one.
    fn free_id(&self) -> InstanceId {
        (1..)
            .find(|id| {
                !self.taken.contains(id)
                    && self
                        .members
                        .get(id)
                        .is_none_or(|m| m.state == MemberState::Dead)
            })
            .unwrap_or(InstanceId::MAX)
    }

    fn start_drain(&mut self, id: InstanceId) {
        if let Some(m) = self.members.get_mut(&id) {
            m.state = MemberState::Draining;
            m.drained_at = None;
        }
    }

    fn reset_streaks(&mut self, now: Nanos) {
        self.above = 0;
        self.below = 0;
        self.next_scale_check = now.saturating_add(self.config.interval);
    }

    /// Once per interval: the mean η of the live instances (HashMVT §IV-C, Eq. 1) against the
    /// thresholds (§IV-D2); `scale_periods` in a row move the target by one. Streaks hold at
    /// zero while instances start or drain (the cluster is still changing).
    fn auto_scale(&mut self, now: Nanos) {
        if !self.config.auto_scale || now < self.next_scale_check {
            return;
        }
        let interval = self.config.interval.max(1);
        self.next_scale_check = if now >= self.next_scale_check.saturating_add(interval) {
            now.saturating_add(interval)
        } else {
            self.next_scale_check.saturating_add(interval)
        };
        let changing = self
            .members
            .values()
            .any(|m| matches!(m.state, MemberState::Starting | MemberState::Draining));
        let loads: Vec<f64> = self
            .members
            .values()
            .filter(|m| m.state == MemberState::Live)
            .filter_map(|m| m.report.as_ref().map(|r| r.load.clamp(0.0, 1.0)))
            .collect();
        if changing || loads.is_empty() {
            self.above = 0;
            self.below = 0;
            return;
        }
        let mean = loads.iter().sum::<f64>() / loads.len() as f64;
        (self.above, self.below) = if mean > self.config.scale_out_load {
            (self.above + 1, 0)
        } else if mean < self.config.scale_in_load {
            (0, self.below + 1)
        } else {
            (0, 0)
        };
        let (min, max) = self.bounds();
        let periods = self.config.scale_periods.max(1);
        if self.above >= periods {
            self.target = (self.target + 1).min(max);
            self.above = 0;
        } else if self.below >= periods {
            self.target = self.target.saturating_sub(1).max(min);
            self.below = 0;
        }
    }

    /// The owners and members now; published (a new version, changed slots' epochs bumped)
    /// when they differ from the current assignment.
    fn reassign(&mut self) -> Option<Assignment> {
        let ids = |state| -> Vec<InstanceId> {
            self.members
                .iter()
                .filter(|(_, m)| m.state == state)
                .map(|(id, _)| *id)
                .collect()
        };
        let (live, draining) = (ids(MemberState::Live), ids(MemberState::Draining));
        // Draining instances keep partitions only while no live one can take them.
        let pool = if live.is_empty() { &draining } else { &live };
        let mut count: BTreeMap<InstanceId, usize> = pool.iter().map(|id| (*id, 0)).collect();
        let mut owners: Vec<Option<InstanceId>> =
            self.assignment.slots.iter().map(|s| s.owner).collect();
        let mut orphans = Vec::new();
        for (p, o) in owners.iter_mut().enumerate() {
            match o.and_then(|id| count.get_mut(&id)) {
                Some(n) => *n += 1,
                None => orphans.push(p),
            }
        }
        // A dead or drained instance's partitions go to those with the fewest (ties: lowest
        // id), one at a time: round robin from scratch, the even split on failover.
        for p in orphans {
            owners[p] = count
                .iter()
                .min_by_key(|(id, n)| (**n, **id))
                .map(|(id, _)| *id);
            if let Some(id) = owners[p] {
                *count.entry(id).or_default() += 1;
            }
        }
        // A join: move one partition at a time from the largest holder (ties: lowest id; its
        // highest partition) to the smallest, until counts differ by at most one. Only then:
        // partitions never move between running instances for no reason.
        if std::mem::take(&mut self.rebalance) && !live.is_empty() {
            loop {
                let most = count.iter().max_by_key(|(id, n)| (**n, Reverse(**id)));
                let fewest = count.iter().min_by_key(|(id, n)| (**n, **id));
                let (Some((&from, &most)), Some((&to, &fewest))) = (most, fewest) else {
                    break;
                };
                if most <= fewest + 1 {
                    break;
                }
                let Some(p) = owners.iter().rposition(|o| *o == Some(from)) else {
                    break;
                };
                owners[p] = Some(to);
                count.insert(from, most - 1);
                count.insert(to, fewest + 1);
            }
        }
        let members: Vec<MemberAddr> = self
            .members
            .iter()
            .filter_map(|(id, m)| {
                Some(MemberAddr {
                    id: *id,
                    addr: m.addr?,
                    live: m.serving(),
                    draining: m.state == MemberState::Draining,
                })
            })
            .collect();
        let a = &self.assignment;
        if members == a.members && owners.iter().zip(&a.slots).all(|(o, s)| *o == s.owner) {
            return None;
        }
        let slots = owners
            .iter()
            .zip(&a.slots)
            .map(|(o, s)| Slot {
                owner: *o,
                epoch: if *o == s.owner {
                    s.epoch
                } else {
                    s.epoch.saturating_add(1)
                },
            })
            .collect();
        self.assignment = Assignment {
            version: a.version.saturating_add(1),
            term: a.term,
            stage: a.stage,
            slots,
            members,
        };
        Some(self.assignment.clone())
    }
}

#[cfg(test)]
mod tests;
