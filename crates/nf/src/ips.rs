//! The IPS (StatelessNF §3, Algorithm 2; issue #17): signature rules in a subset of Suricata's
//! language ([`crate::rules`]) matched against each packet's payload and against each TCP
//! direction's reassembled byte stream ([`crate::reassembly`]), with alerts in Suricata's EVE
//! shape and `drop` rules that block their flow.
//!
//! ```toml
//! [[chain]]
//! nf = "ips"
//! rules = ["examples/ips.rules"]     # .rules files, read once at start
//! skip_unsupported = false           # true: rules with an unsupported keyword are skipped
//! vars = { HOME_NET = "[10.0.0.0/8]" }   # $VARS over suricata.yaml's defaults
//! depth = 1048576                    # stream bytes inspected per direction (Suricata's
//!                                    # stream.reassembly.depth)
//! memcap = 268435456                 # stream bytes one worker buffers over all flows
//! udp_timeout = "5m"                 # idle time before a UDP (or other) flow is forgotten
//! reassembly = { policy = "first" }  # TCP reassembly (crate::reassembly::TableConfig)
//! max_flows = 262144                 # flows (and TCP streams) kept at most, shared by the workers
//! early_drop = true                  # at the cap, a new flow ends the oldest unestablished one
//! exception_policy = "drop"          # state unavailable or table full: "drop" or "pass" the packet
//! ```
//!
//! # Matching
//!
//! * **Prefilter** (Suricata's MPM): each rule's fast pattern — its `fast_pattern` content, else
//!   its longest content that is not negated — goes into one Aho-Corasick automaton (the
//!   `aho-corasick` crate, case-insensitive, overlapping matches). A rule is checked only when
//!   its fast pattern occurs in the bytes at hand; rules without one are checked on every
//!   packet of their protocol.
//! * **Buffers**: a rule matches a packet when its header, its `flow` conditions and its
//!   contents ([`Rule::payload_matches`]) hold for the packet's payload **or**, for TCP, for
//!   the sender's stream as reassembled so far (from its first byte, up to `depth`), as
//!   Suricata inspects both a packet and its stream. Offsets in a stream count from the
//!   stream's first byte. New stream bytes are searched together with the
//!   longest-pattern-minus-one bytes before them, so a pattern split across segments, or sent
//!   out of order, is found once the bytes between are in order; overlapping segments count as
//!   the reassembly's policy says (`first` by default). A stream stops being inspected at
//!   `depth`, at a gap, or when the worker's `memcap` is used (each counted); packets still are.
//! * **Flow**: `to_server` is a packet from the side that opened the connection (the SYN's
//!   sender; for UDP, the first packet's). `established`, as Suricata's: for TCP from the
//!   packet in which a side that has sent answers the other side (the handshake's ACK), so
//!   a SYN and its SYN/ACK alone are not established; for UDP from the first packet of the
//!   second side.
//! * **Once per flow**: a rule alerts at most once per flow (Suricata alerts on every matching
//!   packet, at most 15 a packet; `threshold` rules are how its operators get once per flow),
//!   and at most 255 rules alert per flow (further matches are counted as
//!   `alerts_suppressed`). Alerts are counted per sid (the state object `alerts_by_sid`) and
//!   in [`NetworkFunction::report`].
//! * **Drop**: a matching `drop` rule drops the packet and every later packet of the flow, in
//!   both directions (Suricata's IPS mode drops the flow).
//!
//! Alerts are one EVE JSON line each (`timestamp`, `flow_id`, `event_type: "alert"`, `src_ip`,
//! `src_port`, `dest_ip`, `dest_port`, `proto`, `direction`, `alert.{action, gid,
//! signature_id, rev, signature, category, severity}`), emitted as `tracing` events on
//! [`crate::ALERT_TARGET`] (`flowstate run --eve FILE` writes them).
//!
//! # State
//!
//! Per flow (the canonical flow key), through the state API: who opened it, which sides have
//! sent, whether it is blocked, the sids that alerted, and each TCP direction's inspection
//! buffer; plus the reassembly's own per-flow state. So a flow moved to another instance keeps
//! its partial matches, its alerts-once and its block. On an external store the buffers are
//! written with the flow's other state: `depth` is what each flush may carry per direction.
//!
//! # Limits and failures
//!
//! * **Caps.** The flow table (`flows`) and the reassembly's (`tcp_streams`) each hold at most
//!   `max_flows` entries (default 262,144, conntrack's `nf_conntrack_max` on a machine this
//!   size), shared evenly by the workers. At the cap a new flow ends the oldest expendable one
//!   with `early_drop = true` (the default, as conntrack's early drop): a flow not established
//!   and not blocked (a blocked flow is never forgotten, or it would be let through); a
//!   stream not started both ways, or ended. Else the new flow is refused. Counted as
//!   `flows_early_dropped`, `flows_table_full`, `streams_early_dropped`,
//!   `streams_table_full`; the caps are the gauges `max_flows` and `max_streams`.
//! * **Exception policy** (Suricata's `exception-policy`, applied as to its
//!   `flow.memcap-policy` and `stream.memcap-policy`): when a packet's state cannot be read
//!   (`state_unavailable`) or its flow was refused for a full table, `exception_policy`
//!   says what happens to it: `drop` (the default; Suricata's `drop-packet`: the IPS fails
//!   closed, as the firewall and the load balancer do) or `pass` (Suricata's `pass-packet`:
//!   forwarded uninspected). Counted as `exception_dropped` and `exception_passed`.

use crate::early_drop::{self, Cap, Unit};
use crate::reassembly::{Event, Fed, Origin, TableConfig, TcpStreams};
use crate::rules::{Action, Options, Rule, RuleSet, Vars};
use crate::{
    BuildError, Context, NetworkFunction, NfFactory, Packet, Placement, ReloadConfig, Verdict,
};
use aho_corasick::{AhoCorasick, AhoCorasickBuilder, AhoCorasickKind, MatchKind};
use flowstate_state::{Access, Codec, CodecError, Counter, CounterMap, Declare, Map, Nanos, Scope};
use flowstate_wire::dissect::Transport;
use flowstate_wire::{tcp, FlowKey};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

const NF: &str = "ips";

/// The bit of [`FlowState::seen`] for an established flow.
const ESTABLISHED: u8 = 4;

/// Most rules that alert per flow; matches of further rules are counted
/// (`alerts_suppressed`), not alerted (their `drop` still drops).
const MAX_FIRED: usize = 255;

// ------------------------------------------------------------------------------------------
// Configuration

/// `[[chain]] nf = "ips"` options.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Rule files, in order (required).
    pub rules: Vec<PathBuf>,
    /// Skip (and count) rules with an unsupported keyword instead of refusing the file.
    pub skip_unsupported: bool,
    /// Address and port variables, over `suricata.yaml`'s defaults.
    pub vars: BTreeMap<String, String>,
    /// Stream bytes inspected per direction (default 1 MiB, Suricata's default depth).
    pub depth: u32,
    /// Stream bytes one worker buffers over all its flows (default 256 MiB).
    pub memcap: u64,
    /// Idle time after which a UDP or other non-TCP flow is forgotten (default 5m,
    /// Suricata's `flow-timeouts.udp.established`); TCP flows follow `reassembly.timeout*`.
    #[serde(deserialize_with = "flowstate_config::deserialize_duration")]
    pub udp_timeout: Duration,
    /// TCP reassembly.
    pub reassembly: TableConfig,
    /// Flows kept at most, and TCP streams reassembled at most, shared evenly by the workers
    /// (default 262,144).
    pub max_flows: u64,
    /// Whether a new flow at the cap ends the oldest flow not established (default `true`).
    pub early_drop: bool,
    /// What happens to a packet whose state is unavailable or whose flow found the table
    /// full (default `drop`).
    pub exception_policy: ExceptionPolicy,
}

/// What the IPS does with a packet it cannot inspect for want of state (Suricata's
/// `exception-policy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ExceptionPolicy {
    /// Drop the packet (Suricata's `drop-packet`): fail closed.
    #[default]
    Drop,
    /// Forward it uninspected (Suricata's `pass-packet`): fail open.
    Pass,
}

/// Drop reasons.
pub mod reason {
    /// A `drop` rule matched this packet.
    pub const DROP_RULE: &str = "ips: drop rule";
    /// A `drop` rule matched the flow earlier.
    pub const BLOCKED: &str = "ips: blocked flow";
    /// The flow's state could not be read (`exception_policy = "drop"`).
    pub const STATE: &str = "ips: state unavailable";
    /// The flow found its table full (`exception_policy = "drop"`).
    pub const TABLE_FULL: &str = "ips: table full";
}

impl Default for Config {
    fn default() -> Self {
        Config {
            rules: Vec::new(),
            skip_unsupported: false,
            vars: BTreeMap::new(),
            depth: 1 << 20,
            memcap: 256 << 20,
            udp_timeout: Duration::from_secs(300),
            reassembly: TableConfig::default(),
            max_flows: early_drop::default_max(),
            early_drop: true,
            exception_policy: ExceptionPolicy::Drop,
        }
    }
}

fn config_err(key: impl Into<String>, reason: impl Into<String>) -> BuildError {
    BuildError::config(NF, key, reason)
}

impl Config {
    /// Parses a `[[chain]]` table (without `nf`); every key that is wrong is reported, by
    /// name.
    pub fn from_table(table: &toml::Table) -> Result<Config, BuildError> {
        let c: Config = crate::read_config(NF, table)?;
        let mut errors = Vec::new();
        if c.rules.is_empty() {
            errors.push(config_err(
                "rules",
                "missing: name one or more .rules files, like rules = [\"examples/ips.rules\"]",
            ));
        }
        crate::positive(NF, "udp_timeout", c.udp_timeout, &mut errors);
        early_drop::check_max(NF, "max_flows", c.max_flows, &mut errors);
        if let Err((k, r)) = c.reassembly.validate() {
            errors.push(config_err(format!("reassembly.{k}"), r));
        }
        BuildError::all(errors)?;
        Ok(c)
    }

    /// Reads and parses the rule files.
    pub fn load_rules(&self) -> Result<RuleSet, BuildError> {
        let mut vars = Vars::default();
        for (k, v) in &self.vars {
            vars.set(k, v);
        }
        let o = Options {
            vars,
            skip_unsupported: self.skip_unsupported,
        };
        let mut all = RuleSet::default();
        for path in &self.rules {
            let text = flowstate_config::read_text(path)
                .map_err(|e| config_err("rules", format!("cannot read {}: {e}", path.display())))?;
            let set = crate::rules::parse(&path.to_string_lossy(), &text, &o)
                .map_err(|e| config_err("rules", e.to_string()))?;
            all.rules.extend(set.rules);
            all.skipped.extend(set.skipped);
        }
        let mut sids: Vec<u32> = all.rules.iter().map(|r| r.sid).collect();
        sids.sort_unstable();
        if let Some(w) = sids.windows(2).find(|w| w[0] == w[1]) {
            return Err(config_err(
                "rules",
                format!("sid {} is used by more than one rule", w[0]),
            ));
        }
        Ok(all)
    }
}

// ------------------------------------------------------------------------------------------
// The rule engine (shared by every worker)

/// The rules and their prefilter, built once.
#[derive(Debug)]
pub struct Engine {
    rules: Vec<Rule>,
    /// Rules skipped for an unsupported keyword.
    skipped: usize,
    /// The fast patterns (deduplicated, case-folded), `None` without any.
    prefilter: Option<AhoCorasick>,
    /// For each fast pattern, the rules that have it.
    by_pattern: Vec<Vec<u32>>,
    /// Rules without a fast pattern: checked on every packet.
    always: Vec<u32>,
    /// Longest fast pattern.
    longest: usize,
}

/// A rule's fast pattern: its `fast_pattern` content, else its longest content that is not
/// negated.
fn fast_pattern(r: &Rule) -> Option<&[u8]> {
    let positive = r.contents.iter().filter(|c| !c.negated);
    positive
        .clone()
        .find(|c| c.fast_pattern)
        .or_else(|| positive.max_by_key(|c| c.pattern.len()))
        .map(|c| c.pattern.as_slice())
        .filter(|p| !p.is_empty())
}

impl Engine {
    /// The engine of `set`'s rules.
    pub fn new(set: RuleSet) -> Result<Engine, String> {
        let mut patterns: Vec<Vec<u8>> = Vec::new();
        let mut index: std::collections::HashMap<Vec<u8>, usize> = Default::default();
        let mut by_pattern: Vec<Vec<u32>> = Vec::new();
        let mut always = Vec::new();
        for (i, r) in set.rules.iter().enumerate() {
            match fast_pattern(r) {
                Some(p) => {
                    let p = p.to_ascii_lowercase();
                    let k = *index.entry(p.clone()).or_insert_with(|| {
                        patterns.push(p);
                        by_pattern.push(Vec::new());
                        patterns.len() - 1
                    });
                    by_pattern[k].push(i as u32);
                }
                None => always.push(i as u32),
            }
        }
        let longest = patterns.iter().map(Vec::len).max().unwrap_or(0);
        let prefilter = if patterns.is_empty() {
            None
        } else {
            Some(
                AhoCorasickBuilder::new()
                    .ascii_case_insensitive(true)
                    .match_kind(MatchKind::Standard)
                    .kind(Some(AhoCorasickKind::DFA))
                    .build(&patterns)
                    .map_err(|e| format!("building the prefilter: {e}"))?,
            )
        };
        Ok(Engine {
            rules: set.rules,
            skipped: set.skipped.len(),
            prefilter,
            by_pattern,
            always,
            longest,
        })
    }

    /// The rules.
    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }

    /// Adds to `c` every rule whose fast pattern occurs in `hay`.
    fn prefilter(&self, hay: &[u8], c: &mut Candidates) {
        let Some(ac) = &self.prefilter else { return };
        for m in ac.find_overlapping_iter(hay) {
            for &r in &self.by_pattern[m.pattern().as_usize()] {
                c.add(r);
            }
        }
    }
}

/// The rules to check for one packet, each once (no allocation once grown).
#[derive(Debug, Default)]
struct Candidates {
    /// Per rule, the packet number it was last added for.
    stamp: Vec<u32>,
    now: u32,
    list: Vec<u32>,
}

impl Candidates {
    fn new(rules: usize) -> Candidates {
        Candidates {
            stamp: vec![0; rules],
            now: 0,
            list: Vec::new(),
        }
    }

    fn clear(&mut self) {
        self.list.clear();
        self.now = self.now.wrapping_add(1);
        if self.now == 0 {
            self.stamp.fill(0);
            self.now = 1;
        }
    }

    fn add(&mut self, r: u32) {
        let s = &mut self.stamp[r as usize];
        if *s != self.now {
            *s = self.now;
            self.list.push(r);
        }
    }
}

// ------------------------------------------------------------------------------------------
// Per-flow state

/// What the IPS keeps per flow (canonical key).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FlowState {
    /// The side (0: the canonical source) that opened the flow.
    client: u8,
    /// Sides that have sent (bit 0, bit 1), and [`ESTABLISHED`].
    seen: u8,
    /// A `drop` rule matched: every packet is dropped.
    blocked: bool,
    /// Per stream (client's, server's): no longer inspected (depth, gap, memcap).
    closed: [bool; 2],
    /// When the entry's time to live was last renewed.
    renewed: Nanos,
    /// Sids that alerted on this flow.
    fired: Vec<u32>,
    /// The client's and the server's stream from its first byte, up to `depth`.
    streams: [Vec<u8>; 2],
}

impl FlowState {
    /// Whether `sid` alerted on this flow.
    pub fn fired(&self, sid: u32) -> bool {
        self.fired.contains(&sid)
    }

    /// Whether the flow is blocked.
    pub fn blocked(&self) -> bool {
        self.blocked
    }

    /// Whether the flow may be ended early to make room: not established (conntrack's early
    /// drop takes entries not assured) and not blocked.
    fn expendable(&self) -> bool {
        self.seen & ESTABLISHED == 0 && !self.blocked
    }
}

impl Codec for FlowState {
    fn encode(&self, out: &mut Vec<u8>) {
        let flags =
            u8::from(self.blocked) | u8::from(self.closed[0]) << 1 | u8::from(self.closed[1]) << 2;
        (self.client, self.seen, flags, self.renewed).encode(out);
        (self.fired.len() as u8).encode(out);
        for s in &self.fired {
            s.encode(out);
        }
        self.streams[0].encode(out);
        self.streams[1].encode(out);
    }

    fn decode(input: &mut &[u8]) -> Result<Self, CodecError> {
        let (client, seen, flags, renewed) = <(u8, u8, u8, u64)>::decode(input)?;
        if client > 1 || seen > 7 || flags > 7 {
            return Err(CodecError::Invalid("ips flow"));
        }
        let n = u8::decode(input)?;
        if usize::from(n) > MAX_FIRED {
            return Err(CodecError::Invalid("ips fired sids"));
        }
        let fired = (0..n)
            .map(|_| u32::decode(input))
            .collect::<Result<_, _>>()?;
        Ok(FlowState {
            client,
            seen,
            blocked: flags & 1 != 0,
            closed: [flags & 2 != 0, flags & 4 != 0],
            renewed,
            fired,
            streams: [Vec::<u8>::decode(input)?, Vec::<u8>::decode(input)?],
        })
    }
}

// ------------------------------------------------------------------------------------------
// EVE

/// Suricata's `flow_id` for a flow: the same for both directions, 51 bits (JSON-safe).
pub fn flow_id(flow: &FlowKey) -> u64 {
    let c = flow.canonical();
    let mut b = Vec::with_capacity(37);
    c.encode(&mut b);
    let hi = flowstate_wire::hash::crc32c(&b);
    let lo = flowstate_wire::hash::crc32c_append(hi ^ 0x5bd1_e995, &b);
    (u64::from(hi) << 32 | u64::from(lo)) & ((1 << 51) - 1)
}

/// The EVE alert line of `rule` matching a packet of `flow` (the packet's direction) at `now`.
pub fn eve_alert(now: Nanos, flow: &FlowKey, to_server: bool, rule: &Rule) -> String {
    let proto = crate::eve::proto(flow.proto);
    let text = |s: &str| serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into());
    format!(
        concat!(
            "{{\"timestamp\":\"{}\",\"flow_id\":{},\"event_type\":\"alert\",",
            "\"src_ip\":\"{}\",\"src_port\":{},\"dest_ip\":\"{}\",\"dest_port\":{},",
            "\"proto\":\"{}\",\"direction\":\"{}\",",
            "\"alert\":{{\"action\":\"{}\",\"gid\":1,\"signature_id\":{},\"rev\":{},",
            "\"signature\":{},\"category\":{},\"severity\":{}}}}}"
        ),
        crate::eve::timestamp(now),
        flow_id(flow),
        flow.src,
        flow.src_port,
        flow.dst,
        flow.dst_port,
        proto,
        if to_server { "to_server" } else { "to_client" },
        if rule.action == Action::Drop {
            "blocked"
        } else {
            "allowed"
        },
        rule.sid,
        rule.rev,
        text(&rule.msg),
        text(rule.classtype.as_deref().unwrap_or("")),
        rule.priority.unwrap_or(3),
    )
}

// ------------------------------------------------------------------------------------------
// Factory

/// Builds IPS instances; the rules are read and compiled once, shared by every worker.
#[derive(Debug, Clone)]
pub struct Factory {
    config: Config,
    engine: Arc<Engine>,
}

impl Factory {
    /// The factory of `config`, reading its rule files.
    pub fn new(config: Config) -> Result<Factory, BuildError> {
        let set = config.load_rules()?;
        for e in &set.skipped {
            tracing::warn!("ips: rule skipped: {e}");
        }
        let engine = Engine::new(set).map_err(|e| config_err("rules", e))?;
        tracing::info!(
            rules = engine.rules.len(),
            skipped = engine.skipped,
            fast_patterns = engine.by_pattern.len(),
            "ips: rules loaded"
        );
        Ok(Factory {
            config,
            engine: Arc::new(engine),
        })
    }

    /// The compiled rules.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// The IPS of `worker`, its state declared through `state`.
    pub fn build_ips(&self, state: &mut Declare<'_>, worker: Placement) -> Result<Ips, BuildError> {
        Ips::declare(&self.config, Arc::clone(&self.engine), state, worker)
    }
}

/// The factory for a `[[chain]]` table.
pub fn factory(table: &toml::Table) -> Result<Arc<dyn NfFactory>, BuildError> {
    Ok(Arc::new(Factory::new(Config::from_table(table)?)?))
}

impl NfFactory for Factory {
    fn name(&self) -> &'static str {
        NF
    }

    /// The rules change in place, as Suricata's rule reload does: each flow's next bytes meet
    /// the new rules; a flow a `drop` rule blocked stays blocked, alerts already raised stay.
    fn reloadable(&self) -> &'static [&'static str] {
        &["rules", "skip_unsupported", "vars"]
    }

    /// The rule files are read again at every reload (`suricata-update` rewrites them in
    /// place).
    fn reload_rereads(&self) -> bool {
        true
    }

    fn reload_config(
        &self,
        running: Option<&ReloadConfig>,
    ) -> Result<Option<ReloadConfig>, String> {
        let same = running
            .and_then(|r| r.downcast_ref::<Engine>())
            .is_some_and(|r| r.rules == self.engine.rules);
        Ok((!same).then(|| Arc::clone(&self.engine) as ReloadConfig))
    }

    fn build(
        &self,
        state: &mut Declare<'_>,
        worker: Placement,
    ) -> Result<Box<dyn NetworkFunction>, BuildError> {
        Ok(Box::new(self.build_ips(state, worker)?))
    }
}

// ------------------------------------------------------------------------------------------
// The NF

/// How a packet ended a stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum StreamEnd {
    /// It did not.
    #[default]
    No,
    /// A reassembly gap: bytes are missing, the stream is no longer inspected.
    Gap,
    /// FIN or RST: no more bytes will come; its buffer is freed.
    End,
}

/// Counters of one worker.
#[derive(Debug, Clone, Copy, Default)]
struct Stats {
    alerts: u64,
    suppressed: u64,
    dropped: u64,
    checked: u64,
    depth_reached: u64,
    gaps: u64,
    memcap_reached: u64,
    unavailable: u64,
    malformed: u64,
    exception_dropped: u64,
    exception_passed: u64,
}

/// One worker's IPS.
pub struct Ips {
    engine: Arc<Engine>,
    streams: TcpStreams,
    flows: Map<FlowKey, FlowState>,
    by_sid: CounterMap<u32>,
    alerts: Counter,
    depth: usize,
    memcap: u64,
    /// Stream bytes this worker buffered.
    used: u64,
    tcp_timeout: Duration,
    udp_timeout: Duration,
    cands: Candidates,
    /// The reassembled bytes of the packet at hand, by stream (scratch, reused).
    fresh: [Vec<u8>; 2],
    /// What else the packet at hand did to each stream.
    ends: [StreamEnd; 2],
    stats: Stats,
    /// The cap of `flows`.
    cap: Cap<FlowKey>,
    exception: ExceptionPolicy,
}

impl Ips {
    /// Declares the state of the IPS of `worker`.
    pub fn declare(
        cfg: &Config,
        engine: Arc<Engine>,
        state: &mut Declare<'_>,
        worker: Placement,
    ) -> Result<Ips, BuildError> {
        let rules = engine.rules.len();
        Ok(Ips {
            streams: TcpStreams::declare_capped(
                state,
                &cfg.reassembly,
                cfg.max_flows,
                cfg.early_drop,
                worker,
            )?,
            cap: Cap::declare(state, Unit::Flows, cfg.max_flows, cfg.early_drop, worker)?,
            exception: cfg.exception_policy,
            flows: state.map("flows", Scope::PerFlow, Access::ReadWrite)?,
            by_sid: state.counter_map(
                "alerts_by_sid",
                Scope::CrossFlow(&[]),
                Access::WriteMostly,
            )?,
            alerts: state.counter("alerts", Scope::CrossFlow(&[]), Access::WriteMostly)?,
            depth: cfg.depth as usize,
            memcap: cfg.memcap,
            used: 0,
            tcp_timeout: cfg.reassembly.timeout,
            udp_timeout: cfg.udp_timeout,
            cands: Candidates::new(rules),
            fresh: [Vec::new(), Vec::new()],
            ends: [StreamEnd::No; 2],
            stats: Stats::default(),
            engine,
        })
    }

    /// A copy of the IPS's state of the flow `flow` belongs to.
    pub fn flow(&self, flow: &FlowKey) -> Option<FlowState> {
        self.flows.get(&flow.canonical()).ok().flatten()
    }

    /// Flows this worker holds.
    pub fn flows(&self) -> usize {
        self.flows.cached_len()
    }

    /// TCP streams this worker reassembles.
    pub fn streams(&self) -> usize {
        self.streams.connections()
    }

    /// A packet that cannot be inspected for want of state (`why`): the exception policy.
    fn exception(&mut self, why: &'static str) -> Verdict {
        match self.exception {
            ExceptionPolicy::Drop => {
                self.stats.exception_dropped += 1;
                Verdict::Drop(why)
            }
            ExceptionPolicy::Pass => {
                self.stats.exception_passed += 1;
                Verdict::Forward
            }
        }
    }
}

/// Whether `rule`'s header and flow conditions hold for a packet of `flow`.
fn header_and_flow(rule: &Rule, flow: &FlowKey, to_server: bool, established: bool) -> bool {
    let f = &rule.flow;
    let flow_ok = f.stateless
        || ((!f.to_server || to_server)
            && (!f.to_client || !to_server)
            && (!f.established || established)
            && (!f.not_established || !established));
    flow_ok && rule.header_matches(flow.proto, flow.src, flow.src_port, flow.dst, flow.dst_port)
}

impl NetworkFunction for Ips {
    fn name(&self) -> &str {
        NF
    }

    fn reconfigure(&mut self, config: &ReloadConfig) {
        if let Ok(engine) = Arc::clone(config).downcast::<Engine>() {
            self.cands = Candidates::new(engine.rules.len());
            self.engine = engine;
        }
    }

    fn prefetch(&mut self, pkt: &Packet<'_>) {
        self.streams.prefetch(pkt);
        if let Some(flow) = pkt.dissection.flow {
            self.flows.prefetch(&flow.canonical());
        }
    }

    fn process(&mut self, pkt: &mut Packet<'_>, cx: &Context) -> Verdict {
        let d = pkt.dissection;
        let Some(flow) = d.flow else {
            return Verdict::Forward;
        };
        let key = flow.canonical();
        let side = u8::from(!flow.is_canonical());
        let tcp = d.transport == Transport::Tcp;
        // TCP: reassemble first; the packet's in-order bytes land in `fresh`.
        let mut origin = None;
        if tcp {
            for (f, e) in self.fresh.iter_mut().zip(&mut self.ends) {
                f.clear();
                *e = StreamEnd::No;
            }
            let (fresh, ends) = (&mut self.fresh, &mut self.ends);
            let fed = self.streams.feed(pkt, cx.now, |o, e| {
                let s = usize::from(o == Origin::Server);
                match e {
                    Event::Data { bytes, .. } => fresh[s].extend_from_slice(bytes),
                    Event::Gap { .. } => ends[s] = StreamEnd::Gap,
                    Event::End { .. } => ends[s] = StreamEnd::End,
                }
            });
            match fed {
                Fed::Tcp(o) => origin = Some(o),
                Fed::Malformed => self.stats.malformed += 1,
                Fed::Unavailable => {
                    self.stats.unavailable += 1;
                    return self.exception(reason::STATE);
                }
                Fed::Full => return self.exception(reason::TABLE_FULL),
                Fed::NotTcp => {}
            }
        }
        // An ACK without SYN or RST: what completes a handshake.
        let handshake_ack = tcp
            && d.l4_offset
                .and_then(|o| pkt.data.get(o..d.l3_end))
                .and_then(|b| tcp::Packet::new_checked(b).ok())
                .is_some_and(|t| {
                    let f = t.flags();
                    f.contains(tcp::Flags::ACK)
                        && !f.contains(tcp::Flags::SYN)
                        && !f.contains(tcp::Flags::RST)
                });
        let payload = d
            .payload_offset
            .and_then(|o| pkt.data.get(o..d.l3_end))
            .unwrap_or(&[]);
        let now = cx.now;
        let ttl = if tcp {
            self.tcp_timeout
        } else {
            self.udp_timeout
        };
        let Ips {
            engine,
            flows,
            by_sid,
            alerts,
            depth,
            memcap,
            used,
            cands,
            fresh,
            ends,
            stats,
            cap,
            streams,
            ..
        } = self;
        let mut inspect = |f: &mut FlowState| {
            let renew = now.saturating_sub(f.renewed) > ttl.as_nanos() as u64 / 4;
            if renew {
                f.renewed = now;
            }
            if f.blocked {
                return (Verdict::Drop(reason::BLOCKED), renew);
            }
            let before = f.seen;
            f.seen |= 1 << side;
            // TCP: a side that sent before acknowledges the other side, without SYN or RST
            // (the handshake's ACK), as Suricata's `established`; UDP: both sides have sent.
            let answered = before & (1 << (1 - side)) != 0;
            if (!tcp || before & (1 << side) != 0 && handshake_ack) && answered {
                f.seen |= ESTABLISHED;
            }
            let established = f.seen & ESTABLISHED != 0;
            let to_server = match origin {
                Some(o) => o == Origin::Client,
                None => side == f.client,
            };
            cands.clear();
            // The stream's new bytes (with the tail before them), appended to its buffer.
            let mut scanned_payload = false;
            let mut stream_of_packet = None;
            if tcp {
                for s in 0..2 {
                    let new = &fresh[s];
                    let before = f.streams[s].len();
                    if !f.closed[s] && !new.is_empty() {
                        let room = depth.saturating_sub(before).min(new.len());
                        let allowed = if *used + room as u64 > *memcap {
                            stats.memcap_reached += 1;
                            0
                        } else {
                            room
                        };
                        f.streams[s].extend_from_slice(&new[..allowed]);
                        *used += allowed as u64;
                        if allowed < new.len() {
                            f.closed[s] = true;
                            if allowed == room {
                                stats.depth_reached += 1;
                            }
                        }
                        let from = before.saturating_sub(engine.longest.saturating_sub(1));
                        engine.prefilter(&f.streams[s][from..], cands);
                        // The packet's payload went into the stream whole, in order: its
                        // fast patterns were just found there.
                        scanned_payload |= new.as_slice() == payload && allowed == new.len();
                    }
                    if ends[s] == StreamEnd::Gap && !f.closed[s] {
                        stats.gaps += 1;
                    }
                    if ends[s] != StreamEnd::No {
                        f.closed[s] = true;
                    }
                }
                stream_of_packet = origin.map(|o| usize::from(o == Origin::Server));
            }
            if !scanned_payload && !payload.is_empty() {
                engine.prefilter(payload, cands);
            }
            for &r in &engine.always {
                cands.add(r);
            }
            let stream = stream_of_packet.map(|s| f.streams[s].as_slice());
            let mut verdict = Verdict::Forward;
            for &r in &cands.list {
                let rule = &engine.rules[r as usize];
                stats.checked += 1;
                if f.fired.contains(&rule.sid)
                    || !header_and_flow(rule, &flow, to_server, established)
                {
                    continue;
                }
                let hit = rule.payload_matches(payload)
                    || stream.is_some_and(|s| !s.is_empty() && rule.payload_matches(s));
                if !hit {
                    continue;
                }
                if rule.action == Action::Drop {
                    f.blocked = true;
                    verdict = Verdict::Drop(reason::DROP_RULE);
                }
                if f.fired.len() >= MAX_FIRED {
                    stats.suppressed += 1;
                    continue;
                }
                f.fired.push(rule.sid);
                stats.alerts += 1;
                alerts.add_nowait(1);
                by_sid.add_to_nowait(&rule.sid, 1);
                tracing::warn!(
                    target: crate::ALERT_TARGET,
                    eve = %eve_alert(now, &flow, to_server, rule),
                    "ips: {}",
                    rule.msg
                );
            }
            // An ended stream's bytes are of no more use.
            for (stream, end) in f.streams.iter_mut().zip(ends.iter()) {
                if *end == StreamEnd::End && !stream.is_empty() {
                    *used = used.saturating_sub(stream.len() as u64);
                    *stream = Vec::new();
                }
            }
            (verdict, renew)
        };
        // One lookup for a known flow; a new one is inserted first, if there is room.
        let mut outcome = flows.with_mut(&key, |f| f.map(&mut inspect));
        let (mut full, mut freed) = (false, 0u64);
        if let Ok(None) = outcome {
            let room = cap.admit(flows.cached_len(), |k| {
                let Ok(Some(true)) = flows.with(&k, |f| f.map(FlowState::expendable)) else {
                    return false;
                };
                let Some(f) = flows.remove_nowait(&k) else {
                    return false;
                };
                freed += f.streams.iter().map(|s| s.len() as u64).sum::<u64>();
                streams.forget(&k);
                true
            });
            if room {
                let f = FlowState {
                    client: side,
                    renewed: now,
                    ..FlowState::default()
                };
                flows.insert_nowait(key, f);
                flows.expire_after(&key, ttl, now);
                cap.remember(key);
                outcome = flows.with_mut(&key, |f| f.map(&mut inspect));
            } else {
                full = true;
            }
        }
        self.used = self.used.saturating_sub(freed);
        let (verdict, renew) = match outcome {
            Ok(Some(v)) => v,
            Ok(None) if full => return self.exception(reason::TABLE_FULL),
            Ok(None) | Err(_) => {
                self.stats.unavailable += 1;
                return self.exception(reason::STATE);
            }
        };
        if renew {
            self.flows.expire_after(&key, ttl, now);
        }
        if matches!(verdict, Verdict::Drop(_)) {
            self.stats.dropped += 1;
        }
        verdict
    }

    fn on_tick(&mut self, now: Nanos) {
        self.streams.on_tick(now);
        let used = &mut self.used;
        self.flows.expire(now, |_, f| {
            let bytes = f.streams.iter().map(|s| s.len() as u64).sum::<u64>();
            *used = used.saturating_sub(bytes);
        });
    }

    fn report(&self) -> Vec<(&'static str, i64)> {
        let s = &self.stats;
        let mut out = vec![
            ("alerts", s.alerts as i64),
            ("alerts_suppressed", s.suppressed as i64),
            ("blocked_packets", s.dropped as i64),
            ("rules_checked", s.checked as i64),
            ("stream_depth_reached", s.depth_reached as i64),
            ("stream_gaps", s.gaps as i64),
            ("stream_memcap_reached", s.memcap_reached as i64),
            ("stream_bytes_buffered", self.used as i64),
            ("state_unavailable", s.unavailable as i64),
            ("exception_dropped", s.exception_dropped as i64),
            ("exception_passed", s.exception_passed as i64),
            ("malformed_tcp", s.malformed as i64),
        ];
        self.cap.report(&mut out);
        out.extend(self.streams.report());
        out
    }

    fn gauges(&self) -> &'static [&'static str] {
        &[
            "stream_bytes_buffered",
            "buffered_bytes",
            "connections",
            "max_flows",
            "max_streams",
        ]
    }

    fn entries(&self) -> u64 {
        self.flows.cached_len() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn engine(text: &str) -> Engine {
        Engine::new(crate::rules::parse("t.rules", text, &Options::default()).unwrap()).unwrap()
    }

    #[test]
    fn fast_patterns_are_the_marked_or_longest_positive_content() {
        let e = engine(concat!(
            "alert tcp any any -> any any (content:\"ab\"; content:\"abcdef\"; sid:1;)\n",
            "alert tcp any any -> any any (content:\"ab\"; fast_pattern; content:\"abcdef\"; sid:2;)\n",
            "alert tcp any any -> any any (content:!\"zzzzzz\"; sid:3;)\n",
            "alert tcp any any -> any any (msg:\"header only\"; sid:4;)\n",
            "alert tcp any any -> any any (content:\"ABCDEF\"; nocase; sid:5;)\n",
        ));
        assert_eq!(e.always, [2, 3]);
        assert_eq!(e.longest, 6);
        let mut c = Candidates::new(e.rules.len());
        c.clear();
        e.prefilter(b"xxabcdefxx", &mut c);
        let mut got = c.list.clone();
        got.sort_unstable();
        assert_eq!(got, [0, 1, 4], "one automaton pattern for rules 1 and 5");
        c.clear();
        e.prefilter(b"xxabxx", &mut c);
        assert_eq!(c.list, [1]);
    }

    #[test]
    fn flow_state_round_trips_and_refuses_garbage() {
        let f = FlowState {
            client: 1,
            seen: 3,
            blocked: true,
            closed: [false, true],
            renewed: 77,
            fired: vec![1, 2_000_000],
            streams: [b"GET /".to_vec(), Vec::new()],
        };
        let mut b = Vec::new();
        f.encode(&mut b);
        assert_eq!(FlowState::decode(&mut b.as_slice()).unwrap(), f);
        for cut in 0..b.len() {
            assert!(FlowState::decode(&mut &b[..cut]).is_err(), "cut at {cut}");
        }
        let mut bad = b.clone();
        bad[0] = 2;
        assert!(FlowState::decode(&mut bad.as_slice()).is_err());
    }

    #[test]
    fn eve_lines_are_json_with_escaped_text() {
        let e = engine(
            "drop udp any any -> any 53 (msg:\"a \\\"quoted\\\" \\\\ msg\"; classtype:trojan-activity; priority:1; sid:7; rev:3;)\n",
        );
        let flow = FlowKey::new(
            "10.0.0.2".parse().unwrap(),
            "192.0.2.9".parse().unwrap(),
            5353,
            53,
            17,
        );
        let line = eve_alert(1_700_000_000_000_000_000, &flow, true, &e.rules[0]);
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["alert"]["signature"], "a \"quoted\" \\ msg");
        assert_eq!(v["alert"]["action"], "blocked");
        assert_eq!(
            (
                v["alert"]["signature_id"].as_u64(),
                v["alert"]["rev"].as_u64()
            ),
            (Some(7), Some(3))
        );
        assert_eq!(v["alert"]["severity"], 1);
        assert_eq!(v["proto"], "UDP");
        assert_eq!(v["flow_id"], flow_id(&flow.reversed()));
        assert!(v["flow_id"].as_u64().unwrap() < 1 << 51);
    }
}
