//! The portscan detector: Threshold Random Walk (TRW; Jung, Paxson, Berger, Balakrishnan,
//! "Fast Portscan Detection Using Sequential Hypothesis Testing", IEEE S&P 2004), the detector
//! CHC evaluates (CHC §6, Table 4: "likelihood of being malicious, per host", cross-flow;
//! "pending connection initiation requests with their timestamps", per flow).
//!
//! # What it does
//!
//! Per remote *source* (the host that initiates connection attempts), every **first-contact**
//! TCP connection attempt — a SYN to a (destination host, port) the source has not tried
//! before (TRW's first-contact connection requests: only those are observations) — is a
//! Bernoulli trial whose outcome the NF reads from the handshake it sees:
//!
//! * **success**: the SYN is answered by a SYN/ACK;
//! * **failure**: the SYN is answered by a RST, or by an ICMP destination-unreachable (ICMPv4
//!   type 3, ICMPv6 type 1) that quotes it and goes to the source, or is not answered within
//!   `attempt_timeout` (TRW counts a request that is never established as a failure; the
//!   timeout is our choice, the paper's analysis was offline).
//!
//! The likelihood ratio Λ of the source (TRW §3) starts at 1 and is multiplied by
//! θ1/θ0 on a success and by (1 − θ1)/(1 − θ0) on a failure (θ0 = Pr[success | benign],
//! θ1 = Pr[success | scanner]). When Λ ≥ η1 the source is a **scanner**: an alert is raised
//! (counted, and logged in Suricata's EVE shape, see [`eve_json`]) and, with `block = true`,
//! every packet *from* it is dropped for `block_time`. When Λ ≤ η0 the source is **benign**:
//! its walk ends and its state is freed (TRW §3: the test stops at either threshold); a later
//! first contact starts a new walk at Λ = 1, so an early benign verdict is not a licence to
//! scan.
//!
//! The thresholds come from the desired detection probability P_D and false-positive
//! probability P_F as TRW §3 derives them (Wald's bounds): η1 = P_D / P_F and
//! η0 = (1 − P_D) / (1 − P_F). With the paper's values (θ0 = 0.8, θ1 = 0.2, P_D = 0.99,
//! P_F = 0.01): η1 = 99, η0 ≈ 0.0101, a failure multiplies Λ by 4 and a success by 1/4, so
//! 4 failures in a row flag a source (4⁴ = 256 ≥ 99 > 4³) and 4 successes in a row clear it.
//! The arithmetic runs on ln Λ (sums instead of products; no overflow). See [`Trw`].
//!
//! # State (all through the state API)
//!
//! * `sources`: per source address, its walk (ln Λ, attempts, failures) or its scanner
//!   verdict with the block deadline — cross-flow, scoped by source address, read-write
//!   (CHC Table 4); expires `source_timeout` after its last change (a scanner's entry not
//!   before its block ends).
//! * `pending`: per attempt (the SYN's 5-tuple), the time it was made and the direction it came
//!   from — per flow, with a TTL of
//!   `attempt_timeout`; its expiry callback is the unanswered-attempt failure. At most
//!   `max_flows` attempts (default 262,144, conntrack's `nf_conntrack_max` on a machine this
//!   size, shared evenly by the workers) are pending: at the cap a new first contact ends the
//!   oldest pending attempt with `early_drop = true` (the default; every pending attempt is
//!   unanswered, which is what conntrack's early drop ends), else it is not observed (nor
//!   recorded as contacted). An attempt ended early is forgotten, not counted as a failure
//!   (its outcome is unknown, as when conntrack drops an entry early). Counted as
//!   `flows_early_dropped` and `flows_table_full`; the cap is the gauge `max_flows`.
//! * `contacted`: the (source, destination, port) triples already tried — cross-flow, scoped by
//!   source; each expires `source_timeout` after it was made, and at most `max_contacts` are
//!   kept per worker (first contacts beyond that are not observed, and counted), so the set is
//!   bounded. Once a source is a scanner its attempts are no longer recorded.
//!
//! # Which hosts are watched, and the partition
//!
//! `watch` picks the initiators: `inbound` (outside hosts scanning in), `outbound` (inside
//! hosts scanning out) or `both` (the default). The state of a source must live in one traffic
//! partition to be exact (CHC §4.1), but a packet cannot tell which end initiated its
//! connection, so the NF partitions by one end: by the **outside** address for `inbound`, by
//! the **inside** address for `outbound` and `both`. The watched initiators of those settings
//! are then exact on any number of partitions. With `both` and several partitions, an
//! outside scanner's attempts are split by their inside target, and each partition keeps its
//! own walk of it (partitioned cross-flow state, FlexState §III-B1): it is still detected, by
//! the first partition that sees enough failures, and blocked there. With one partition (one
//! worker) everything is exact.
//!
//! `fast_path()` is `false`: the detector must see every SYN, SYN/ACK and RST.

use crate::early_drop::{self, Cap, Unit};
use crate::{
    BuildError, Context, Direction, NetworkFunction, NfFactory, Packet, Placement, Verdict,
};
use flowstate_state::{
    Access, Codec, CodecError, Counter, CounterMap, Declare, Field, Map, Nanos, Scope,
};
use flowstate_wire::dissect::Transport;
use flowstate_wire::{icmp, tcp, FlowKey};
use serde::Deserialize;
use std::cell::RefCell;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

const NF: &str = "portscan";

/// What [`eve_json`] puts in `alert.signature`.
pub const SIGNATURE: &str = "portscan: TRW";
/// The `alert.signature_id` of a TRW alert.
pub const SIGNATURE_ID: u32 = 9_000_001;

// ------------------------------------------------------------------------------------------
// The walk

/// The TRW test (TRW §3): per-observation steps of ln Λ and the two thresholds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Trw {
    /// ln(θ1/θ0): added on a success (negative).
    pub success_step: f64,
    /// ln((1 − θ1)/(1 − θ0)): added on a failure (positive).
    pub failure_step: f64,
    /// ln η1 = ln(P_D / P_F): at or above, the source is a scanner.
    pub ln_eta1: f64,
    /// ln η0 = ln((1 − P_D)/(1 − P_F)): at or below, the source is benign.
    pub ln_eta0: f64,
}

/// Where a walk stands after an observation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Neither threshold reached: keep watching.
    Pending,
    /// Λ ≥ η1: H1, a scanner.
    Scanner,
    /// Λ ≤ η0: H0, benign.
    Benign,
}

impl Trw {
    /// The test for θ0 (success probability of a benign host), θ1 (of a scanner), P_D and
    /// P_F. Requires 0 < θ1 < θ0 < 1 and 0 < P_F < P_D < 1 (checked by the configuration).
    pub fn new(theta0: f64, theta1: f64, pd: f64, pf: f64) -> Trw {
        Trw {
            success_step: (theta1 / theta0).ln(),
            failure_step: ((1.0 - theta1) / (1.0 - theta0)).ln(),
            ln_eta1: (pd / pf).ln(),
            ln_eta0: ((1.0 - pd) / (1.0 - pf)).ln(),
        }
    }

    /// η1 = P_D / P_F.
    pub fn eta1(&self) -> f64 {
        self.ln_eta1.exp()
    }

    /// η0 = (1 − P_D) / (1 − P_F).
    pub fn eta0(&self) -> f64 {
        self.ln_eta0.exp()
    }

    /// ln Λ after one more observation.
    pub fn step(&self, ln_lambda: f64, success: bool) -> f64 {
        ln_lambda
            + if success {
                self.success_step
            } else {
                self.failure_step
            }
    }

    /// The decision at `ln_lambda`.
    pub fn decide(&self, ln_lambda: f64) -> Decision {
        if ln_lambda >= self.ln_eta1 {
            Decision::Scanner
        } else if ln_lambda <= self.ln_eta0 {
            Decision::Benign
        } else {
            Decision::Pending
        }
    }

    /// Failures in a row that flag a fresh source: the least n with n·ln((1−θ1)/(1−θ0)) ≥ ln η1.
    pub fn failures_to_detect(&self) -> u32 {
        self.walk_length(self.failure_step, self.ln_eta1, |x, t| x >= t)
    }

    /// Successes in a row that clear a fresh source.
    pub fn successes_to_clear(&self) -> u32 {
        self.walk_length(self.success_step, self.ln_eta0, |x, t| x <= t)
    }

    /// Steps of `step` from 0 until `reached(x, target)`; `u32::MAX` past a million.
    fn walk_length(&self, step: f64, target: f64, reached: impl Fn(f64, f64) -> bool) -> u32 {
        let mut x = 0.0;
        for n in 1..=1_000_000 {
            x += step;
            if reached(x, target) {
                return n;
            }
        }
        u32::MAX
    }
}

// ------------------------------------------------------------------------------------------
// Configuration

/// `[[chain]] nf = "portscan"` options (all optional).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// θ0: probability that a benign host's first-contact attempt succeeds (TRW §3: 0.8).
    pub theta0: f64,
    /// θ1: probability that a scanner's first-contact attempt succeeds (TRW §3: 0.2).
    pub theta1: f64,
    /// P_D: desired detection probability (TRW §3: 0.99).
    pub detection_probability: f64,
    /// P_F: desired false-positive probability (TRW §3: 0.01).
    pub false_positive_probability: f64,
    /// Time after which an unanswered attempt counts as a failure (3s).
    #[serde(deserialize_with = "flowstate_config::deserialize_duration")]
    pub attempt_timeout: Duration,
    /// How long a source's walk, and each of its recorded first contacts, lives after its
    /// last change (10m).
    #[serde(deserialize_with = "flowstate_config::deserialize_duration")]
    pub source_timeout: Duration,
    /// `inbound`, `outbound` or `both` (default): whose attempts are watched.
    pub watch: String,
    /// Drop the packets of a detected scanner (default false: alert only).
    pub block: bool,
    /// How long a scanner stays blocked (1h).
    #[serde(deserialize_with = "flowstate_config::deserialize_duration")]
    pub block_time: Duration,
    /// Most recorded first contacts per worker (1,000,000).
    pub max_contacts: i64,
    /// Most pending attempts, shared evenly by the workers (262,144).
    pub max_flows: u64,
    /// Whether a new first contact at `max_flows` ends the oldest pending attempt (true).
    pub early_drop: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            theta0: 0.8,
            theta1: 0.2,
            detection_probability: 0.99,
            false_positive_probability: 0.01,
            attempt_timeout: Duration::from_secs(3),
            source_timeout: Duration::from_secs(600),
            watch: "both".into(),
            block: false,
            block_time: Duration::from_secs(3600),
            max_contacts: 1_000_000,
            max_flows: early_drop::default_max(),
            early_drop: true,
        }
    }
}

fn config_err(key: &'static str, reason: impl Into<String>) -> BuildError {
    BuildError::config(NF, key, reason)
}

impl Config {
    /// Parses a `[[chain]]` table (without `nf`); every key that is wrong is reported, by
    /// name.
    pub fn from_table(table: &toml::Table) -> Result<Config, BuildError> {
        let c: Config = crate::read_config(NF, table)?;
        let mut errors = Vec::new();
        early_drop::check_max(NF, "max_flows", c.max_flows, &mut errors);
        BuildError::all(errors)?;
        Ok(c)
    }
}

/// Which initiators are watched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Watch {
    /// Outside hosts (their SYNs arrive inbound).
    Inbound,
    /// Inside hosts (their SYNs leave outbound).
    Outbound,
    /// Both.
    Both,
}

impl Watch {
    fn covers(self, d: Direction) -> bool {
        matches!(
            (self, d),
            (Watch::Both, _)
                | (Watch::Inbound, Direction::Inbound)
                | (Watch::Outbound, Direction::Outbound)
        )
    }
}

fn positive(key: &'static str, d: Duration) -> Result<Duration, BuildError> {
    let mut errors = Vec::new();
    crate::positive(NF, key, d, &mut errors);
    BuildError::all(errors).map(|()| d)
}

fn open_unit(key: &'static str, v: f64) -> Result<f64, BuildError> {
    if v.is_finite() && v > 0.0 && v < 1.0 {
        Ok(v)
    } else {
        Err(config_err(
            key,
            format!("{v} is not a probability strictly between 0 and 1"),
        ))
    }
}

// ------------------------------------------------------------------------------------------
// State values

/// A source's entry in `sources`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SourceState {
    /// ln Λ of the current walk.
    pub ln_lambda: f64,
    /// Observations in the current walk.
    pub attempts: u32,
    /// Failures among them.
    pub failures: u32,
    /// `Some(t)`: a scanner, blocked (when blocking is on) until time `t`, ns.
    pub scanner_until: Option<Nanos>,
}

impl Codec for SourceState {
    fn encode(&self, out: &mut Vec<u8>) {
        (
            self.ln_lambda.to_bits(),
            self.attempts,
            self.failures,
            self.scanner_until,
        )
            .encode(out);
    }

    fn decode(input: &mut &[u8]) -> Result<Self, CodecError> {
        let (bits, attempts, failures, scanner_until) =
            <(u64, u32, u32, Option<u64>)>::decode(input)?;
        let ln_lambda = f64::from_bits(bits);
        if !ln_lambda.is_finite() || failures > attempts {
            return Err(CodecError::Invalid("portscan source state"));
        }
        Ok(SourceState {
            ln_lambda,
            attempts,
            failures,
            scanner_until,
        })
    }
}

/// Why an alert was raised / a packet counted; the report's names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
enum Event {
    /// A first-contact attempt answered by SYN/ACK.
    Success = 1,
    /// Answered by RST.
    FailRst = 2,
    /// Answered by ICMP destination unreachable.
    FailIcmp = 3,
    /// Not answered within `attempt_timeout`.
    FailTimeout = 4,
    /// A source crossed η1 (an alert).
    Scanner = 5,
    /// A source crossed η0 (its walk ended).
    Benign = 6,
    /// A packet from a blocked scanner, dropped.
    Blocked = 7,
    /// A first contact not recorded: `max_contacts` reached.
    ContactsFull = 8,
    /// A TCP header that could not be read.
    Malformed = 9,
    /// State could not be read; the packet passed unobserved.
    StateUnavailable = 10,
    /// An alert for a source whose attempts came in from outside.
    ScannerInbound = 11,
    /// An alert for a source whose attempts went out from inside.
    ScannerOutbound = 12,
}

impl Event {
    const ALL: [Event; 12] = [
        Event::Success,
        Event::FailRst,
        Event::FailIcmp,
        Event::FailTimeout,
        Event::Scanner,
        Event::ScannerInbound,
        Event::ScannerOutbound,
        Event::Benign,
        Event::Blocked,
        Event::ContactsFull,
        Event::Malformed,
        Event::StateUnavailable,
    ];

    const fn report_name(self) -> &'static str {
        match self {
            Event::Success => "attempts_succeeded",
            Event::FailRst => "attempts_failed_rst",
            Event::FailIcmp => "attempts_failed_icmp",
            Event::FailTimeout => "attempts_failed_timeout",
            Event::Scanner => "alerts_scanner",
            Event::Benign => "sources_benign",
            Event::Blocked => "dropped_blocked",
            Event::ContactsFull => "contacts_not_recorded",
            Event::Malformed => "malformed",
            Event::StateUnavailable => "state_unavailable",
            Event::ScannerInbound => "alerts_scanner_inbound",
            Event::ScannerOutbound => "alerts_scanner_outbound",
        }
    }
}

// ------------------------------------------------------------------------------------------
// Factory

/// Builds portscan detectors; holds the checked configuration, shared by every worker.
#[derive(Debug, Clone)]
pub struct Factory(Arc<Compiled>);

#[derive(Debug)]
struct Compiled {
    trw: Trw,
    attempt_timeout: Duration,
    source_timeout: Duration,
    watch: Watch,
    block: bool,
    block_time: Duration,
    max_contacts: usize,
    max_flows: u64,
    early_drop: bool,
}

impl Factory {
    /// Checks `config`; errors name the key.
    pub fn new(config: &Config) -> Result<Factory, BuildError> {
        let theta0 = open_unit("theta0", config.theta0)?;
        let theta1 = open_unit("theta1", config.theta1)?;
        if theta1 >= theta0 {
            return Err(config_err(
                "theta1",
                format!(
                    "{theta1} must be below theta0 ({theta0}): a scanner's attempts succeed less \
                     often than a benign host's (TRW §3)"
                ),
            ));
        }
        let pd = open_unit("detection_probability", config.detection_probability)?;
        let pf = open_unit(
            "false_positive_probability",
            config.false_positive_probability,
        )?;
        if pf >= pd {
            return Err(config_err(
                "false_positive_probability",
                format!("{pf} must be below detection_probability ({pd})"),
            ));
        }
        let watch = match config.watch.to_ascii_lowercase().as_str() {
            "inbound" => Watch::Inbound,
            "outbound" => Watch::Outbound,
            "both" => Watch::Both,
            other => {
                return Err(config_err(
                    "watch",
                    format!("{other:?}: expected inbound, outbound or both"),
                ))
            }
        };
        let max_contacts = usize::try_from(config.max_contacts)
            .ok()
            .filter(|&n| n > 0)
            .ok_or_else(|| {
                config_err(
                    "max_contacts",
                    format!("{} is not a positive number", config.max_contacts),
                )
            })?;
        Ok(Factory(Arc::new(Compiled {
            trw: Trw::new(theta0, theta1, pd, pf),
            attempt_timeout: positive("attempt_timeout", config.attempt_timeout)?,
            source_timeout: positive("source_timeout", config.source_timeout)?,
            watch,
            block: config.block,
            block_time: positive("block_time", config.block_time)?,
            max_contacts,
            max_flows: config.max_flows,
            early_drop: config.early_drop,
        })))
    }

    /// The test the configuration gives.
    pub fn trw(&self) -> Trw {
        self.0.trw
    }

    /// Builds one worker's detector (what [`NfFactory::build`] boxes).
    pub fn build_portscan(
        &self,
        state: &mut Declare<'_>,
        worker: Placement,
    ) -> Result<Portscan, BuildError> {
        const BY_SRC: Scope = Scope::CrossFlow(&[Field::SrcIp]);
        Ok(Portscan {
            cap: RefCell::new(Cap::declare(
                state,
                Unit::Flows,
                self.0.max_flows,
                self.0.early_drop,
                worker,
            )?),
            cfg: Arc::clone(&self.0),
            sources: state.map("sources", BY_SRC, Access::ReadWrite)?,
            pending: state.map("pending", Scope::PerFlow, Access::ReadWrite)?,
            contacted: state.map("contacted", BY_SRC, Access::ReadWrite)?,
            events: state.counter_map("events", Scope::CrossFlow(&[]), Access::WriteMostly)?,
            alerts: state.counter("alerts", Scope::CrossFlow(&[]), Access::WriteMostly)?,
        })
    }
}

/// The factory for a `[[chain]]` table.
pub fn factory(table: &toml::Table) -> Result<Arc<dyn NfFactory>, BuildError> {
    Ok(Arc::new(Factory::new(&Config::from_table(table)?)?))
}

/// The address whose partition holds the state a packet needs (see the module docs): the
/// inside end (`outbound`, `both`) or the outside end (`inbound`) of the packet's flow, or of
/// the flow an ICMP error quotes.
fn partition_address(
    watch: Watch,
    flow: &FlowKey,
    quoted: Option<&FlowKey>,
    direction: Direction,
) -> IpAddr {
    let inside = watch != Watch::Inbound;
    match quoted {
        // The quoted packet went the other way than the error: an error travelling inbound
        // quotes a packet that left from inside, so its inside end is its source.
        Some(q) => {
            if (direction == Direction::Inbound) == inside {
                q.src
            } else {
                q.dst
            }
        }
        None => {
            if (direction == Direction::Outbound) == inside {
                flow.src
            } else {
                flow.dst
            }
        }
    }
}

impl NfFactory for Factory {
    fn name(&self) -> &'static str {
        NF
    }

    fn build(
        &self,
        state: &mut Declare<'_>,
        worker: Placement,
    ) -> Result<Box<dyn NetworkFunction>, BuildError> {
        Ok(Box::new(self.build_portscan(state, worker)?))
    }

    /// No: every SYN, SYN/ACK and RST is an observation.
    fn fast_path(&self) -> bool {
        false
    }

    fn partition(
        &self,
        flow: &FlowKey,
        quoted: Option<&FlowKey>,
        direction: Direction,
        partitions: u32,
    ) -> Option<u32> {
        let a = partition_address(self.0.watch, flow, quoted, direction);
        Some(crate::endpoint_partition(a, 0, 0, partitions))
    }
}

// ------------------------------------------------------------------------------------------
// The NF

/// One worker's portscan detector.
pub struct Portscan {
    cfg: Arc<Compiled>,
    /// Per source: its walk or its verdict.
    sources: Map<IpAddr, SourceState>,
    /// Per attempt (the SYN's 5-tuple): when it was made, and whether it came in from outside.
    pending: Map<FlowKey, (Nanos, bool)>,
    /// (source, destination, port) tried.
    contacted: Map<(IpAddr, IpAddr, u16), bool>,
    /// Counts by [`Event`] code.
    events: CounterMap<u8>,
    /// The cap of `pending`.
    cap: RefCell<Cap<FlowKey>>,
    /// Alerts raised.
    alerts: Counter,
}

/// An alert: a source found to be a scanner.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Alert {
    /// When, ns since the Unix epoch (the packet's time).
    pub time: Nanos,
    /// The scanner.
    pub src: IpAddr,
    /// The destination of the attempt that decided it.
    pub dst: IpAddr,
    /// Its destination port.
    pub dst_port: u16,
    /// Observations of the walk.
    pub attempts: u32,
    /// Failures among them.
    pub failures: u32,
    /// Λ when it crossed η1.
    pub likelihood: f64,
    /// Whether its packets are now dropped.
    pub blocked: bool,
    /// Where its attempts came from: `Inbound` for an outside host.
    pub direction: Direction,
}

impl Portscan {
    /// The state of `src` on this worker: its walk, its verdict, or `None` (not tracked).
    pub fn source(&self, src: &IpAddr) -> Option<SourceState> {
        self.sources.get(src).ok().flatten()
    }

    /// Whether `src` has been flagged as a scanner (and its entry has not expired).
    pub fn is_scanner(&self, src: &IpAddr) -> bool {
        self.source(src).is_some_and(|s| s.scanner_until.is_some())
    }

    /// Every source flagged on this worker whose entry is still held.
    pub fn scanners(&self) -> Vec<IpAddr> {
        let mut out = Vec::new();
        self.sources.for_each(|a, s| {
            if s.scanner_until.is_some() {
                out.push(*a);
            }
        });
        out.sort();
        out
    }

    /// Attempts waiting for an answer on this worker.
    pub fn pending_attempts(&self) -> usize {
        self.pending.cached_len()
    }

    /// First contacts recorded on this worker.
    pub fn contacts(&self) -> usize {
        self.contacted.cached_len()
    }

    fn count(&self, e: Event) {
        self.events.add_to_nowait(&(e as u8), 1);
    }

    fn counted(&self, e: Event) -> i64 {
        self.events.get(&(e as u8)).unwrap_or(0)
    }

    /// A SYN from an initiator: record a first contact as a pending attempt.
    fn syn(&self, flow: &FlowKey, direction: Direction, now: Nanos) -> Result<(), Event> {
        let src = self
            .sources
            .with(&flow.src, |s| s.copied())
            .map_err(|_| Event::StateUnavailable)?;
        if src.is_some_and(|s| s.scanner_until.is_some()) {
            return Ok(()); // decided: nothing more to learn
        }
        let triple = (flow.src, flow.dst, flow.dst_port);
        let seen = self
            .contacted
            .contains_key(&triple)
            .map_err(|_| Event::StateUnavailable)?;
        if seen {
            return Ok(()); // not a first contact (or a retransmitted SYN)
        }
        if self.contacted.cached_len() >= self.cfg.max_contacts {
            return Err(Event::ContactsFull);
        }
        let mut cap = self.cap.borrow_mut();
        let pending = &self.pending;
        if !cap.admit(pending.cached_len(), |k| {
            pending.remove_nowait(&k).is_some()
        }) {
            return Ok(()); // not observed: counted by the cap
        }
        cap.remember(*flow);
        self.contacted.insert_nowait(triple, true);
        self.contacted
            .expire_after(&triple, self.cfg.source_timeout, now);
        self.pending
            .insert_nowait(*flow, (now, direction == Direction::Inbound));
        self.pending
            .expire_after(flow, self.cfg.attempt_timeout, now);
        Ok(())
    }

    /// An answer (SYN/ACK, RST, ICMP error) to the attempt `attempt` (the SYN's 5-tuple).
    fn answer(&self, attempt: &FlowKey, outcome: Event, now: Nanos) -> Option<Alert> {
        let (_, inbound) = self.pending.remove_nowait(attempt)?;
        self.observe(attempt, inbound, outcome, now)
    }

    /// One observation of `attempt.src`'s walk.
    fn observe(
        &self,
        attempt: &FlowKey,
        inbound: bool,
        outcome: Event,
        now: Nanos,
    ) -> Option<Alert> {
        self.count(outcome);
        let src = attempt.src;
        let success = outcome == Event::Success;
        let cur = match self.sources.with(&src, |s| s.copied()) {
            Ok(s) => s.unwrap_or(SourceState {
                ln_lambda: 0.0,
                attempts: 0,
                failures: 0,
                scanner_until: None,
            }),
            Err(_) => {
                self.count(Event::StateUnavailable);
                return None;
            }
        };
        if cur.scanner_until.is_some() {
            return None;
        }
        let trw = &self.cfg.trw;
        let next = SourceState {
            ln_lambda: trw.step(cur.ln_lambda, success),
            attempts: cur.attempts.saturating_add(1),
            failures: cur.failures.saturating_add(u32::from(!success)),
            scanner_until: None,
        };
        match trw.decide(next.ln_lambda) {
            Decision::Pending => {
                self.sources.insert_nowait(src, next);
                self.sources
                    .expire_after(&src, self.cfg.source_timeout, now);
                None
            }
            Decision::Benign => {
                self.count(Event::Benign);
                self.sources.remove_nowait(&src);
                None
            }
            Decision::Scanner => {
                self.count(Event::Scanner);
                self.count(if inbound {
                    Event::ScannerInbound
                } else {
                    Event::ScannerOutbound
                });
                self.alerts.add_nowait(1);
                let until = now.saturating_add(self.cfg.block_time.as_nanos() as u64);
                self.sources.insert_nowait(
                    src,
                    SourceState {
                        scanner_until: Some(until),
                        ..next
                    },
                );
                let keep = if self.cfg.block {
                    self.cfg.block_time.max(self.cfg.source_timeout)
                } else {
                    self.cfg.source_timeout
                };
                self.sources.expire_after(&src, keep, now);
                let alert = Alert {
                    time: now,
                    src,
                    dst: attempt.dst,
                    dst_port: attempt.dst_port,
                    attempts: next.attempts,
                    failures: next.failures,
                    likelihood: next.ln_lambda.exp(),
                    blocked: self.cfg.block,
                    direction: if inbound {
                        Direction::Inbound
                    } else {
                        Direction::Outbound
                    },
                };
                tracing::warn!(target: crate::ALERT_TARGET, eve = %eve_json(&alert), "portscan: TRW");
                Some(alert)
            }
        }
    }

    /// Whether a packet from `src` is to be dropped (a blocked scanner).
    fn blocked(&self, src: &IpAddr, now: Nanos) -> bool {
        self.cfg.block
            && matches!(
                self.sources.with(src, |s| s.and_then(|s| s.scanner_until)),
                Ok(Some(until)) if now < until
            )
    }

    /// Processes one packet; the alert it raised, if any.
    fn inspect(&self, pkt: &Packet<'_>, now: Nanos) -> Option<Alert> {
        let flow = pkt.dissection.flow?;
        if pkt.dissection.fragment.is_later() {
            return None;
        }
        let watch = self.cfg.watch;
        match pkt.dissection.transport {
            Transport::Tcp => {
                let Some(seg) = l4(pkt).and_then(|b| tcp::Packet::new_checked(b).ok()) else {
                    self.count(Event::Malformed);
                    return None;
                };
                let f = seg.flags();
                let (syn, ack, rst) = (
                    f.contains(tcp::Flags::SYN),
                    f.contains(tcp::Flags::ACK),
                    f.contains(tcp::Flags::RST),
                );
                if syn && !ack && !rst {
                    if watch.covers(pkt.direction) {
                        if let Err(e) = self.syn(&flow, pkt.direction, now) {
                            self.count(e);
                        }
                    }
                    None
                } else if syn && ack && !rst {
                    self.answer(&flow.reversed(), Event::Success, now)
                } else if rst && !syn {
                    self.answer(&flow.reversed(), Event::FailRst, now)
                } else {
                    None
                }
            }
            Transport::Icmpv4 {
                kind: icmp::v4::types::DEST_UNREACHABLE,
                ..
            } => {
                let inner =
                    l4(pkt).and_then(|b| icmp::v4::Packet::new_checked(b).ok()?.inner_flow())?;
                self.unreachable(&flow, &inner, now)
            }
            Transport::Icmpv6 { kind: 1, .. } => {
                let inner =
                    l4(pkt).and_then(|b| icmp::v6::Packet::new_checked(b).ok()?.inner_flow())?;
                self.unreachable(&flow, &inner, now)
            }
            _ => None,
        }
    }

    /// An ICMP destination unreachable quoting `inner`: a failure of that attempt if it goes
    /// to the attempt's source.
    fn unreachable(&self, flow: &FlowKey, inner: &FlowKey, now: Nanos) -> Option<Alert> {
        if inner.proto != flowstate_wire::flow::proto::TCP || flow.dst != inner.src {
            return None;
        }
        self.answer(inner, Event::FailIcmp, now)
    }

    /// Handles one packet at `now` and returns the verdict and the alert it raised (the
    /// [`NetworkFunction::process`] of this NF, with the alert for callers that want it).
    pub fn process_alert(&mut self, pkt: &Packet<'_>, now: Nanos) -> (Verdict, Option<Alert>) {
        if let Some(flow) = pkt.dissection.flow {
            if self.blocked(&flow.src, now) {
                self.count(Event::Blocked);
                return (Verdict::Drop("portscan: blocked scanner"), None);
            }
        }
        let alert = self.inspect(pkt, now);
        (Verdict::Forward, alert)
    }
}

/// The transport header and what follows, up to the end of the IP packet.
fn l4<'p>(pkt: &'p Packet<'_>) -> Option<&'p [u8]> {
    let d = &pkt.dissection;
    pkt.data.get(d.l4_offset?..d.l3_end)
}

impl NetworkFunction for Portscan {
    fn name(&self) -> &str {
        NF
    }

    /// Prefetches what `process` looks up first: the source's entry when blocking, and the
    /// attempt a TCP answer would settle.
    #[inline]
    fn prefetch(&mut self, pkt: &Packet<'_>) {
        let Some(flow) = pkt.dissection.flow else {
            return;
        };
        if self.cfg.block {
            self.sources.prefetch(&flow.src);
        }
        if pkt.dissection.transport == Transport::Tcp {
            self.pending.prefetch(&flow.reversed());
        }
    }

    fn process(&mut self, pkt: &mut Packet<'_>, cx: &Context) -> Verdict {
        self.process_alert(pkt, cx.now).0
    }

    /// Unanswered attempts whose `attempt_timeout` has passed are failures.
    fn on_tick(&mut self, now: Nanos) {
        let this = &*self;
        let timeout = this.cfg.attempt_timeout.as_nanos() as u64;
        this.pending.expire(now, |k, (made, inbound)| {
            // The failure is dated when the attempt timed out, not when the tick ran.
            let at = made.saturating_add(timeout).min(now);
            this.observe(&k, inbound, Event::FailTimeout, at);
        });
        // Walks and contacts past `source_timeout` are simply forgotten.
        self.sources.expire(now, |_, _| {});
        self.contacted.expire(now, |_, _| {});
    }

    fn report(&self) -> Vec<(&'static str, i64)> {
        let mut out = vec![
            ("alerts", self.alerts.get().unwrap_or(-1)),
            ("sources_tracked", self.sources.cached_len() as i64),
            ("attempts_pending", self.pending.cached_len() as i64),
            ("contacts", self.contacted.cached_len() as i64),
        ];
        for e in Event::ALL {
            out.push((e.report_name(), self.counted(e)));
        }
        self.cap.borrow().report(&mut out);
        out
    }

    fn gauges(&self) -> &'static [&'static str] {
        &[
            "sources_tracked",
            "attempts_pending",
            "contacts",
            "max_flows",
        ]
    }
}

// ------------------------------------------------------------------------------------------
// EVE

/// The alert as one line of JSON in Suricata's EVE shape (`timestamp`, `event_type: "alert"`,
/// `src_ip`, `dest_ip`, `dest_port`, `proto`, `alert: {action, signature_id, rev, signature,
/// category, severity}`, and a `portscan` object with the walk: `direction` of its attempts,
/// `attempts`, `failures`, `likelihood`). The NF emits it as a
/// `tracing` event (target [`crate::ALERT_TARGET`], field `eve`) at WARN level: NFs are sans-IO, so
/// the line goes wherever the binary's log goes.
pub fn eve_json(a: &Alert) -> String {
    format!(
        concat!(
            "{{\"timestamp\":\"{}\",\"event_type\":\"alert\",\"src_ip\":\"{}\",",
            "\"dest_ip\":\"{}\",\"dest_port\":{},\"proto\":\"TCP\",",
            "\"alert\":{{\"action\":\"{}\",\"gid\":1,\"signature_id\":{},\"rev\":1,",
            "\"signature\":\"{}\",\"category\":\"Attempted Information Leak\",\"severity\":2}},",
            "\"portscan\":{{\"direction\":\"{}\",\"attempts\":{},\"failures\":{},",
            "\"likelihood\":{:.3}}}}}"
        ),
        crate::eve::timestamp(a.time),
        a.src,
        a.dst,
        a.dst_port,
        if a.blocked { "blocked" } else { "allowed" },
        SIGNATURE_ID,
        SIGNATURE,
        match a.direction {
            Direction::Inbound => "inbound",
            Direction::Outbound => "outbound",
        },
        a.attempts,
        a.failures,
        a.likelihood,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paper() -> Trw {
        Trw::new(0.8, 0.2, 0.99, 0.01)
    }

    #[test]
    fn thresholds_from_pd_and_pf() {
        let t = paper();
        assert!((t.eta1() - 99.0).abs() < 1e-9);
        assert!((t.eta0() - 0.01 / 0.99).abs() < 1e-12);
        assert!((t.failure_step - 4f64.ln()).abs() < 1e-12);
        assert!((t.success_step + 4f64.ln()).abs() < 1e-12);
    }

    #[test]
    fn four_failures_flag_and_four_successes_clear() {
        let t = paper();
        // 4^3 = 64 < 99 <= 4^4 = 256.
        assert_eq!(t.failures_to_detect(), 4);
        assert_eq!(t.successes_to_clear(), 4);
        let mut x = 0.0;
        for _ in 0..3 {
            x = t.step(x, false);
            assert_eq!(t.decide(x), Decision::Pending);
        }
        assert_eq!(t.decide(t.step(x, false)), Decision::Scanner);
        // A success undoes a failure: S F F F F F stays pending until the 5th failure.
        let mut x = t.step(0.0, true);
        for i in 0..5 {
            x = t.step(x, false);
            let want = if i == 4 {
                Decision::Scanner
            } else {
                Decision::Pending
            };
            assert_eq!(t.decide(x), want, "failure {}", i + 1);
        }
        // The benign exit.
        let mut x = 0.0;
        for _ in 0..3 {
            x = t.step(x, true);
            assert_eq!(t.decide(x), Decision::Pending);
        }
        assert_eq!(t.decide(t.step(x, true)), Decision::Benign);
    }

    #[test]
    fn other_parameters_change_the_walk() {
        // θ0 = 0.9, θ1 = 0.1: a failure multiplies by 9; P_D = 0.999, P_F = 0.001: η1 = 999.
        let t = Trw::new(0.9, 0.1, 0.999, 0.001);
        // 9^3 = 729 < 999 <= 9^4.
        assert_eq!(t.failures_to_detect(), 4);
        let t = Trw::new(0.8, 0.2, 0.9, 0.1); // η1 = 9: 4^2 = 16 >= 9
        assert_eq!(t.failures_to_detect(), 2);
    }

    #[test]
    fn source_state_round_trips_and_rejects_garbage() {
        let s = SourceState {
            ln_lambda: -1.25,
            attempts: 7,
            failures: 3,
            scanner_until: Some(42),
        };
        assert_eq!(SourceState::from_bytes(&s.to_bytes()).unwrap(), s);
        let bad = SourceState {
            ln_lambda: f64::NAN,
            ..s
        };
        assert!(SourceState::from_bytes(&bad.to_bytes()).is_err());
        assert!(SourceState::from_bytes(&[1, 2, 3]).is_err());
    }

    #[test]
    fn partition_address_picks_the_inside_or_outside_end() {
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "192.0.2.1".parse().unwrap();
        let out = FlowKey::new(a, b, 1000, 80, 6);
        let back = out.reversed();
        use Direction::*;
        for w in [Watch::Outbound, Watch::Both] {
            assert_eq!(partition_address(w, &out, None, Outbound), a);
            assert_eq!(partition_address(w, &back, None, Inbound), a);
            // An ICMP error about `out`, coming back in from a router.
            let icmp = FlowKey::new("192.0.2.254".parse().unwrap(), a, 0, 0, 1);
            assert_eq!(partition_address(w, &icmp, Some(&out), Inbound), a);
        }
        let w = Watch::Inbound;
        assert_eq!(partition_address(w, &out, None, Outbound), b);
        assert_eq!(partition_address(w, &back, None, Inbound), b);
        // An inbound attempt b -> a answered by an ICMP error from an inside router.
        let icmp = FlowKey::new("10.0.0.254".parse().unwrap(), b, 0, 0, 1);
        assert_eq!(partition_address(w, &icmp, Some(&back), Outbound), b);
    }
}
