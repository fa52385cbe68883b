//! The stateful firewall (StatelessNF Appendix Algorithm 4): connection tracking with Linux
//! conntrack's TCP states, UDP and ICMP echo pseudo-connections, a first-match rule list and the
//! default policy "inside may open, outside may only answer".
//!
//! Per packet (Algorithm 4): read the connection's entry (keyed by the canonical 5-tuple, so both
//! directions share it), compute the new state, write it back if it changed, and let the packet
//! through if the connection allows it. Rules are looked up only for packets that would start a
//! connection (and for packets that cannot be tracked, e.g. later fragments whose first
//! fragment the runtime has not seen); packets of a tracked connection pass on its state
//! alone, and so do later fragments whose datagram's ports the runtime's fragment tracker
//! found (they change nothing).
//!
//! * **TCP** follows conntrack's states and transitions (`nf_conntrack_tcp_packet` in
//!   `net/netfilter/nf_conntrack_proto_tcp.c`: NONE, SYN_SENT, SYN_SENT2, SYN_RECV, ESTABLISHED,
//!   FIN_WAIT, CLOSE_WAIT, LAST_ACK, TIME_WAIT, CLOSE) and tracks both directions' windows
//!   ([`window`]). Only a SYN starts a connection; a packet whose flags are not a valid
//!   combination (a bare FIN, SYN+FIN, no flags, ...), a non-SYN packet for no connection, and
//!   a packet that makes no sense in its connection's state are dropped with a reason; what
//!   conntrack *ignores* (a client's SYN in an established connection, a late SYN/ACK, an old
//!   retransmission) passes without changing the entry. With `liberal = false`, segments
//!   outside the window and RSTs not matching the expected sequence number are dropped as
//!   conntrack marks them INVALID (see [`Config::liberal`] and the README's firewall section,
//!   which lists where this differs from conntrack).
//! * **UDP** and other protocols are *unreplied* until the other side answers, then *replied*.
//! * **ICMP echo** (v4 and v6) requests open a pseudo-connection keyed by the identifier, which
//!   the replies answer. ICMP errors pass when the packet they quote belongs to a tracked
//!   connection (conntrack's RELATED); ICMPv6 neighbour discovery always passes (RFC 4890 §4.4.1).
//! * Each entry records which side opened the connection and from which [`Direction`]; a packet
//!   of the connection arriving from the wrong side is dropped (a spoofed inside address).
//! * Every packet renews its entry's timer with its state's timeout (Linux's defaults,
//!   configurable); [`NetworkFunction::on_tick`] expires entries.
//! * While someone follows the box's events (`flowstate state events`, like `conntrack -E`),
//!   each connection opened and ended is published at the next tick (`stream`).
//! * **A full table** (`max_connections`, default 262,144, shared by the workers) never loses
//!   an established or answered connection: a packet that would open one more ends the oldest
//!   expendable connection (a SYN unanswered, a half-open handshake, a UDP or ICMP flow never
//!   answered, an ended one) with `early_drop = true` (the default, as conntrack's early
//!   drop; `conns_early_dropped`), else it is dropped as `"table full"`
//!   (`denied_table_full`, `conns_table_full`). So a SYN flood from spoofed sources evicts
//!   only its own entries while established connections go on (tested in the lab). Every
//!   NF's per-flow table has the same cap (`early_drop.rs`).
//!
//! **Two maps, one lookup a packet** (issue #22). TCP connections are entries of `conns`
//! ([`TcpConn`]: the [`Conn`] and both directions' [`Window`]s inline, two 64-byte cache lines
//! in the state crate's map cache, as the single map of earlier versions had every entry);
//! UDP, ICMP echo and other connections are entries of `datagrams` (the 4-byte [`Conn`]: with
//! its key and timer words one cache line). A packet's protocol picks the map, so every
//! packet looks up one entry in one map, and a UDP packet loads one line instead of two.
//! Both maps are per-flow state of the same partition (flushed, moved and taken over from the
//! store alike); `max_connections`, early drop, the gauges, the `connections` table and the
//! report count both. `conns` keeps the earlier versions' encoding, so the TCP connections
//! they stored decode with their windows; their UDP and ICMP connections, stored in `conns`
//! too, are moved to `datagrams` when an answer from outside would otherwise be refused.

mod stream;
pub mod window;

use crate::early_drop::{self, Cap, Unit};
use crate::listing::{Cell, Row, StoreReader, TableInfo};
use crate::{
    BuildError, Context, Direction, NetworkFunction, NfFactory, Packet, Placement, ReloadConfig,
    Verdict,
};
use flowstate_config::{IpNet, PrefixMatch};
use flowstate_state::{
    Access, Codec, CodecError, Counter, CounterMap, Declare, Map, Nanos, Scope, StateError,
};
use flowstate_wire::dissect::{Fragment, Transport};
use flowstate_wire::flow::proto;
use flowstate_wire::{icmp, tcp, FlowKey};
use serde::Deserialize;
use std::cell::RefCell;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;
use window::{Check, Phase, Seen, Seg, Why, Window};

const NF: &str = "firewall";

// ------------------------------------------------------------------------------------------
// Configuration

/// What a rule or a default policy does with a packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    /// Let it through (and track the connection it starts).
    Allow,
    /// Drop it.
    Deny,
}

/// A port range: `80`, `"80"` or `"80-443"`.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum PortsConfig {
    /// One port.
    Number(i64),
    /// `"PORT"` or `"FIRST-LAST"`.
    Text(String),
}

/// A protocol: a name (`any`, `tcp`, `udp`, `icmp`, `icmpv6`) or an IP protocol number.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum ProtoConfig {
    /// An IP protocol number, 0–255.
    Number(i64),
    /// A name.
    Name(String),
}

/// One `rules = [{ .. }]` entry.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleConfig {
    /// `allow` or `deny`.
    pub action: Action,
    /// `any` (default), `tcp`, `udp`, `icmp` (ICMP and ICMPv6), `icmpv6`, or a number.
    #[serde(default)]
    pub proto: Option<ProtoConfig>,
    /// Source prefix (`"10.0.0.0/8"`, `"2001:db8::/32"`, or an address; no host bits set);
    /// any if absent.
    #[serde(default, deserialize_with = "flowstate_config::deserialize_opt_prefix")]
    pub src: Option<flowstate_config::IpNet>,
    /// Destination prefix; any if absent.
    #[serde(default, deserialize_with = "flowstate_config::deserialize_opt_prefix")]
    pub dst: Option<flowstate_config::IpNet>,
    /// Destination port range (TCP and UDP only); any if absent.
    #[serde(default)]
    pub dport: Option<PortsConfig>,
    /// `inbound`, `outbound` or `any` (default).
    #[serde(default)]
    pub direction: Option<String>,
}

/// Idle timeouts per state, durations (Linux conntrack's defaults).
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Timeouts {
    /// TCP SYN_SENT (2m).
    #[serde(deserialize_with = "flowstate_config::deserialize_duration")]
    pub syn_sent: Duration,
    /// TCP SYN_RECV (60s).
    #[serde(deserialize_with = "flowstate_config::deserialize_duration")]
    pub syn_recv: Duration,
    /// TCP ESTABLISHED (5d).
    #[serde(deserialize_with = "flowstate_config::deserialize_duration")]
    pub established: Duration,
    /// TCP FIN_WAIT (2m).
    #[serde(deserialize_with = "flowstate_config::deserialize_duration")]
    pub fin_wait: Duration,
    /// TCP CLOSE_WAIT (60s).
    #[serde(deserialize_with = "flowstate_config::deserialize_duration")]
    pub close_wait: Duration,
    /// TCP LAST_ACK (30s).
    #[serde(deserialize_with = "flowstate_config::deserialize_duration")]
    pub last_ack: Duration,
    /// TCP TIME_WAIT (2m).
    #[serde(deserialize_with = "flowstate_config::deserialize_duration")]
    pub time_wait: Duration,
    /// TCP CLOSE (10s).
    #[serde(deserialize_with = "flowstate_config::deserialize_duration")]
    pub close: Duration,
    /// UDP before the other side answered (30s).
    #[serde(deserialize_with = "flowstate_config::deserialize_duration")]
    pub udp_unreplied: Duration,
    /// UDP once answered (2m).
    #[serde(deserialize_with = "flowstate_config::deserialize_duration")]
    pub udp_replied: Duration,
    /// ICMP echo (30s).
    #[serde(deserialize_with = "flowstate_config::deserialize_duration")]
    pub icmp: Duration,
    /// Other protocols (10m).
    #[serde(deserialize_with = "flowstate_config::deserialize_duration")]
    pub generic: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            syn_sent: Duration::from_secs(120),
            syn_recv: Duration::from_secs(60),
            established: Duration::from_secs(432000),
            fin_wait: Duration::from_secs(120),
            close_wait: Duration::from_secs(60),
            last_ack: Duration::from_secs(30),
            time_wait: Duration::from_secs(120),
            close: Duration::from_secs(10),
            udp_unreplied: Duration::from_secs(30),
            udp_replied: Duration::from_secs(120),
            icmp: Duration::from_secs(30),
            generic: Duration::from_secs(600),
        }
    }
}

fn default_allow() -> Action {
    Action::Allow
}

fn default_deny() -> Action {
    Action::Deny
}

/// `[[chain]] nf = "firewall"` options.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Rules, first match wins, consulted for packets that start a connection.
    #[serde(default)]
    pub rules: Vec<RuleConfig>,
    /// What happens to an outbound connection no rule matches (default `allow`).
    #[serde(default = "default_allow")]
    pub default_outbound: Action,
    /// What happens to an inbound connection no rule matches (default `deny`).
    #[serde(default = "default_deny")]
    pub default_inbound: Action,
    /// Idle timeouts per state.
    #[serde(default)]
    pub timeouts: Timeouts,
    /// `false`: TCP sequence and ack numbers are checked against each direction's window, as
    /// Linux conntrack does, and out-of-window segments and RSTs are dropped. `true` (the
    /// default): states are tracked, windows are neither kept nor checked, nothing is dropped
    /// for its sequence numbers (conntrack's `nf_conntrack_tcp_be_liberal = 1`, which also
    /// checks RSTs). See [`window`].
    #[serde(default = "default_liberal")]
    pub liberal: bool,
    /// Connections tracked at most, shared evenly by the workers (default 262,144, as
    /// conntrack's `nf_conntrack_max` on a machine this size). At the limit a packet that
    /// would open a connection is dropped (`"table full"`) unless early drop makes room.
    #[serde(default = "early_drop::default_max")]
    pub max_connections: u64,
    /// Whether a new connection at the limit may end the oldest expendable one (conntrack's
    /// early drop): one not established (a SYN unanswered, a half-open handshake, a UDP or
    /// ICMP flow never answered) or one that ended (TIME_WAIT, CLOSE). Established and
    /// answered connections are never ended early (default `true`).
    #[serde(default = "default_liberal")]
    pub early_drop: bool,
}

fn default_liberal() -> bool {
    true
}

impl Default for Config {
    fn default() -> Self {
        Config {
            rules: Vec::new(),
            default_outbound: Action::Allow,
            default_inbound: Action::Deny,
            timeouts: Timeouts::default(),
            liberal: default_liberal(),
            max_connections: early_drop::default_max(),
            early_drop: true,
        }
    }
}

fn config_err(key: impl Into<String>, reason: impl Into<String>) -> BuildError {
    BuildError::config(NF, key, reason)
}

impl Config {
    /// Parses a `[[chain]]` table (without `nf`); every key that is wrong is reported, by
    /// its dotted name (`rules[2].src`, `timeouts.udp_replied`).
    pub fn from_table(table: &toml::Table) -> Result<Config, BuildError> {
        let config: Config = crate::read_config(NF, table)?;
        let mut errors = Vec::new();
        early_drop::check_max(NF, "max_connections", config.max_connections, &mut errors);
        BuildError::all(errors)?;
        Ok(config)
    }
}

/// Which protocols a rule matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ProtoMatch {
    Any,
    /// ICMP over either IP version.
    Icmp,
    Number(u8),
}

impl ProtoMatch {
    fn matches(self, p: u8) -> bool {
        match self {
            ProtoMatch::Any => true,
            ProtoMatch::Icmp => p == proto::ICMP || p == proto::ICMPV6,
            ProtoMatch::Number(n) => n == p,
        }
    }
}

/// A compiled rule.
#[derive(Debug, Clone)]
struct Rule {
    action: Action,
    proto: ProtoMatch,
    src: Option<IpNet>,
    dst: Option<IpNet>,
    dport: Option<(u16, u16)>,
    direction: Option<Direction>,
}

/// Parses a port range: `80`, `"80"`, `"80-443"`.
fn parse_ports(p: &PortsConfig) -> Result<(u16, u16), String> {
    let port = |n: i64| u16::try_from(n).map_err(|_| format!("port {n} is not 0 to 65535"));
    match p {
        PortsConfig::Number(n) => port(*n).map(|n| (n, n)),
        PortsConfig::Text(s) => {
            let num = |t: &str| {
                t.trim()
                    .parse::<i64>()
                    .map_err(|_| format!("{s:?} is not a port or a range FIRST-LAST"))
                    .and_then(port)
            };
            let (a, b) = match s.split_once('-') {
                Some((a, b)) => (num(a)?, num(b)?),
                None => {
                    let n = num(s)?;
                    (n, n)
                }
            };
            if a > b {
                return Err(format!("{s:?}: the range is empty"));
            }
            Ok((a, b))
        }
    }
}

impl Rule {
    fn compile(r: &RuleConfig, i: usize) -> Result<Rule, BuildError> {
        let at = |key: &str, e: String| config_err(format!("rules[{i}].{key}"), e);
        let proto = match &r.proto {
            None => ProtoMatch::Any,
            Some(ProtoConfig::Number(n)) => match u8::try_from(*n) {
                Ok(n) => ProtoMatch::Number(n),
                Err(_) => return Err(at("proto", format!("protocol {n} is not 0 to 255"))),
            },
            Some(ProtoConfig::Name(s)) => match s.to_ascii_lowercase().as_str() {
                "any" => ProtoMatch::Any,
                "tcp" => ProtoMatch::Number(proto::TCP),
                "udp" => ProtoMatch::Number(proto::UDP),
                "icmp" => ProtoMatch::Icmp,
                "icmpv6" => ProtoMatch::Number(proto::ICMPV6),
                _ => {
                    return Err(at(
                        "proto",
                        format!(
                        "unknown protocol {s:?}; expected any, tcp, udp, icmp, icmpv6 or a number"
                    ),
                    ))
                }
            },
        };
        let src = r.src.map(|n| n.trunc());
        let dst = r.dst.map(|n| n.trunc());
        let dport = r
            .dport
            .as_ref()
            .map(parse_ports)
            .transpose()
            .map_err(|e| at("dport", e))?;
        if dport.is_some()
            && !matches!(
                proto,
                ProtoMatch::Any | ProtoMatch::Number(proto::TCP) | ProtoMatch::Number(proto::UDP)
            )
        {
            return Err(at(
                "dport",
                "a port range needs proto tcp, udp or any".into(),
            ));
        }
        if let (Some(s), Some(d)) = (src, dst) {
            if s.addr().is_ipv4() != d.addr().is_ipv4() {
                return Err(at(
                    "dst",
                    "src and dst are of different address families".into(),
                ));
            }
        }
        let direction = match r
            .direction
            .as_deref()
            .map(str::to_ascii_lowercase)
            .as_deref()
        {
            None | Some("any") => None,
            Some("inbound") => Some(Direction::Inbound),
            Some("outbound") => Some(Direction::Outbound),
            Some(other) => {
                return Err(at(
                    "direction",
                    format!("{other:?}: expected inbound, outbound or any"),
                ))
            }
        };
        Ok(Rule {
            action: r.action,
            proto,
            src,
            dst,
            dport,
            direction,
        })
    }

    /// Whether the rule matches; `dport` is `None` for packets without ports (ICMP, later
    /// fragments, other protocols), which rules with a port range never match.
    #[inline]
    fn matches(&self, flow: &FlowKey, dport: Option<u16>, dir: Direction) -> bool {
        self.proto.matches(flow.proto)
            && self.direction.is_none_or(|d| d == dir)
            && self.src.is_none_or(|p| p.matches(&flow.src))
            && self.dst.is_none_or(|p| p.matches(&flow.dst))
            && match self.dport {
                None => true,
                Some((lo, hi)) => dport.is_some_and(|p| (lo..=hi).contains(&p)),
            }
    }
}

// ------------------------------------------------------------------------------------------
// Connection state

/// The state of a tracked connection (Linux conntrack's names; NONE is the absence of an entry).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum ConnState {
    /// TCP: the opening SYN was seen.
    SynSent = 1,
    /// TCP: the SYN/ACK answered it.
    SynRecv = 2,
    /// TCP: the handshake completed.
    Established = 3,
    /// TCP: one side sent a FIN.
    FinWait = 4,
    /// TCP: the other side acknowledged that FIN.
    CloseWait = 5,
    /// TCP: both sides sent a FIN; waiting for the last ACK.
    LastAck = 6,
    /// TCP: the last ACK was seen.
    TimeWait = 7,
    /// TCP: reset.
    Close = 8,
    /// UDP, ICMP echo, other protocols: only the opening side has sent.
    Unreplied = 9,
    /// UDP, ICMP echo, other protocols: the other side answered.
    Replied = 10,
    /// TCP: both sides sent a SYN (simultaneous open, RFC 9293 §3.5).
    SynSent2 = 11,
}

impl ConnState {
    /// Every state, in code order.
    pub const ALL: [ConnState; 11] = [
        ConnState::SynSent,
        ConnState::SynRecv,
        ConnState::Established,
        ConnState::FinWait,
        ConnState::CloseWait,
        ConnState::LastAck,
        ConnState::TimeWait,
        ConnState::Close,
        ConnState::Unreplied,
        ConnState::Replied,
        ConnState::SynSent2,
    ];

    fn from_code(c: u8) -> Option<ConnState> {
        ConnState::ALL.get(usize::from(c).wrapping_sub(1)).copied()
    }

    /// Conntrack's name (`"ESTABLISHED"`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            ConnState::SynSent => "SYN_SENT",
            ConnState::SynRecv => "SYN_RECV",
            ConnState::Established => "ESTABLISHED",
            ConnState::FinWait => "FIN_WAIT",
            ConnState::CloseWait => "CLOSE_WAIT",
            ConnState::LastAck => "LAST_ACK",
            ConnState::TimeWait => "TIME_WAIT",
            ConnState::Close => "CLOSE",
            ConnState::Unreplied => "UNREPLIED",
            ConnState::Replied => "REPLIED",
            ConnState::SynSent2 => "SYN_SENT2",
        }
    }

    const fn report_name(self) -> &'static str {
        match self {
            ConnState::SynSent => "conns_syn_sent",
            ConnState::SynRecv => "conns_syn_recv",
            ConnState::Established => "conns_established",
            ConnState::FinWait => "conns_fin_wait",
            ConnState::CloseWait => "conns_close_wait",
            ConnState::LastAck => "conns_last_ack",
            ConnState::TimeWait => "conns_time_wait",
            ConnState::Close => "conns_close",
            ConnState::Unreplied => "conns_unreplied",
            ConnState::Replied => "conns_replied",
            ConnState::SynSent2 => "conns_syn_sent2",
        }
    }

    /// Whether this is a TCP state (its entry carries a [`Window`]).
    const fn is_tcp(self) -> bool {
        !matches!(self, ConnState::Unreplied | ConnState::Replied)
    }

    /// The handshake phase [`Window::check`] needs.
    fn phase(self) -> Phase {
        match self {
            ConnState::SynSent | ConnState::SynSent2 => Phase::SynSent,
            ConnState::SynRecv => Phase::SynRecv,
            _ => Phase::Other,
        }
    }
}

/// One side of a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    /// The side that opened it.
    Orig,
    /// The other.
    Reply,
}

/// A connection's own facts, 4 bytes: the whole entry of a UDP, ICMP echo or other
/// connection (the `datagrams` map), and the head of a TCP connection's entry ([`TcpConn`],
/// the `conns` map).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Conn {
    /// Current state.
    pub state: ConnState,
    /// Whether the opening side is the `src` of the canonical flow key.
    pub opener_is_canonical_src: bool,
    /// Where the opening packet came from.
    pub opened_from: Direction,
    /// TCP: the side that sent the first FIN, `Some(true)` for the opener.
    pub first_fin_by_opener: Option<bool>,
}

/// A TCP connection: the value of the `conns` map, its windows inline, so that a segment
/// reads its connection in one lookup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcpConn {
    /// State, sides, first FIN.
    pub conn: Conn,
    /// Both directions' windows.
    pub tcp: Window,
}

// What a lookup loads (issue #22): the state crate's map cache keeps each entry (the 40-byte
// `FlowKey`, the value and two timer words) in slots aligned to 64-byte cache lines. A UDP,
// ICMP or other connection's entry is one line, as the NAT's sessions; a TCP connection's,
// its windows inline, is two (the windows alone are 57 bytes), as it was before the maps
// were split. A field more in `Conn` would make every UDP packet load two lines.
const _: () = assert!(flowstate_state::map_entry_lines::<FlowKey, Conn>() == 1);
const _: () = assert!(flowstate_state::map_entry_lines::<FlowKey, TcpConn>() == 2);

impl Conn {
    fn side_of(&self, flow: &FlowKey) -> Side {
        if is_canonical(flow) == self.opener_is_canonical_src {
            Side::Orig
        } else {
            Side::Reply
        }
    }

    fn expected_direction(&self, side: Side) -> Direction {
        match side {
            Side::Orig => self.opened_from,
            Side::Reply => self.opened_from.reversed(),
        }
    }

    fn closer(&self) -> Option<Side> {
        self.first_fin_by_opener
            .map(|o| if o { Side::Orig } else { Side::Reply })
    }
}

/// Two bytes: the state's code, then the flags (the opener's side, where it came from, who
/// sent the first FIN).
impl Codec for Conn {
    fn encode(&self, out: &mut Vec<u8>) {
        let flags = u8::from(self.opener_is_canonical_src)
            | u8::from(self.opened_from == Direction::Inbound) << 1
            | match self.first_fin_by_opener {
                None => 0,
                Some(true) => 0b100,
                Some(false) => 0b1000,
            };
        (self.state as u8, flags).encode(out);
    }

    fn decode(input: &mut &[u8]) -> Result<Self, CodecError> {
        let (state, flags) = <(u8, u8)>::decode(input)?;
        let state =
            ConnState::from_code(state).ok_or(CodecError::Invalid("firewall connection state"))?;
        if flags & !0b1111 != 0 || flags & 0b1100 == 0b1100 {
            return Err(CodecError::Invalid("firewall connection flags"));
        }
        Ok(Conn {
            state,
            opener_is_canonical_src: flags & 1 != 0,
            opened_from: if flags & 2 != 0 {
                Direction::Inbound
            } else {
                Direction::Outbound
            },
            first_fin_by_opener: match flags & 0b1100 {
                0b100 => Some(true),
                0b1000 => Some(false),
                _ => None,
            },
        })
    }
}

/// The [`Conn`], then the [`Window`]: the form of the single `conns` map of the versions
/// before the split, so the TCP connections they stored decode as they were. Those versions
/// kept every connection in `conns`: an entry in a UDP or other state decodes (the listing
/// shows it) with no window.
impl Codec for TcpConn {
    fn encode(&self, out: &mut Vec<u8>) {
        self.conn.encode(out);
        if self.conn.state.is_tcp() {
            self.tcp.encode(out);
        }
    }

    fn decode(input: &mut &[u8]) -> Result<Self, CodecError> {
        let conn = Conn::decode(input)?;
        // An entry written before window tracking has no window: the connection's windows are
        // then learnt from its next segments, as conntrack learns a connection picked up in
        // the middle (or one back from flowtable offload).
        let tcp = if conn.state.is_tcp() && !input.is_empty() {
            Window::decode(input)?
        } else {
            Window::default()
        };
        Ok(TcpConn { conn, tcp })
    }
}

/// A map's value: a [`Conn`], or one with more beside it.
trait Entry: Codec + Copy + PartialEq + 'static {
    fn conn(&self) -> &Conn;
}

impl Entry for Conn {
    #[inline]
    fn conn(&self) -> &Conn {
        self
    }
}

impl Entry for TcpConn {
    #[inline]
    fn conn(&self) -> &Conn {
        &self.conn
    }
}

/// What a TCP segment's flags make it (conntrack's packet classes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Segment {
    /// SYN alone.
    Syn = 1,
    /// SYN and ACK.
    SynAck = 2,
    /// FIN (with ACK).
    Fin = 3,
    /// ACK, with or without data.
    Ack = 4,
    /// RST (with or without ACK).
    Rst = 5,
}

impl Segment {
    /// The largest code.
    pub const MAX_CODE: u8 = 5;

    /// Its code in [`window::Last::seg`].
    pub const fn code(self) -> u8 {
        self as u8
    }
}

/// Classifies a segment; `None` for a combination no TCP sends (bare FIN, SYN+FIN, SYN+RST, no
/// flags, ...). PSH, URG, ECE and CWR do not matter.
fn classify(flags: tcp::Flags) -> Option<Segment> {
    const SYN: u8 = tcp::Flags::SYN.0;
    const ACK: u8 = tcp::Flags::ACK.0;
    const FIN: u8 = tcp::Flags::FIN.0;
    const RST: u8 = tcp::Flags::RST.0;
    match flags.bits() & (SYN | ACK | FIN | RST) {
        SYN => Some(Segment::Syn),
        x if x == SYN | ACK => Some(Segment::SynAck),
        x if x == FIN | ACK => Some(Segment::Fin),
        ACK => Some(Segment::Ack),
        x if x == RST || x == RST | ACK => Some(Segment::Rst),
        _ => None,
    }
}

/// The result of a segment in a state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    /// The connection moves to this state (possibly the same), if the segment is in window.
    To(ConnState),
    /// A SYN after the connection ended: a new connection on the same 5-tuple.
    Reopen,
    /// Conntrack's "ignored" (sIG): the firewall may be out of sync with the hosts, so the
    /// segment passes without changing the state or the windows; it is noted, and the answer
    /// it draws may resynchronise the entry.
    Ignore,
    /// The segment makes no sense here (sIV): dropped, the state is unchanged.
    Invalid,
}

/// The TCP state machine: conntrack's table (`tcp_conntracks` in
/// `net/netfilter/nf_conntrack_proto_tcp.c`), with the closing states refined by `closer`, the
/// side that sent the first FIN (conntrack moves FIN_WAIT to LAST_ACK on any FIN, a
/// retransmitted one too), and the ended connection reopened by a SYN from either side.
/// `simultaneous`: both sides sent a SYN, so the answering side's ACK completes the handshake.
fn tcp_step(
    state: ConnState,
    seg: Segment,
    side: Side,
    closer: Option<Side>,
    simultaneous: bool,
) -> Step {
    use ConnState::*;
    use Segment::*;
    let orig = side == Side::Orig;
    let from_closer = closer == Some(side);
    // A SYN from the opener / SYN+ACK from the other side where none is expected: maybe the
    // hosts know better than the firewall (ignored); the other way round, invalid.
    let ignore_if = |c: bool| if c { Step::Ignore } else { Step::Invalid };
    match (state, seg) {
        (Unreplied | Replied, _) => Step::Invalid,
        (_, Rst) => Step::To(Close),
        (SynSent, Syn) => Step::To(if orig { SynSent } else { SynSent2 }),
        (SynSent, SynAck) if !orig => Step::To(SynRecv),
        // An ACK from the server to a SYN: a host still in TIME_WAIT for an earlier
        // connection on this 5-tuple answers so (RFC 793 §3.9, RFC 5961 §4); the client's
        // RST then ends that TIME_WAIT and its next SYN gets a SYN/ACK: conntrack ignores it
        // (sIG) and lets the RST that answers it through.
        (SynSent | SynSent2, Ack) => ignore_if(!orig),
        (SynSent, _) => Step::Invalid,
        (SynSent2, Syn) => Step::To(SynSent2),
        (SynSent2, SynAck) => Step::To(SynRecv),
        (SynSent2, Fin) => Step::Invalid,
        (SynRecv, Syn) => ignore_if(orig),
        // A late SYN/ACK of a simultaneous open from the opener; a retransmitted one.
        (SynRecv, SynAck) => {
            if orig {
                Step::To(SynRecv)
            } else {
                Step::Ignore
            }
        }
        (SynRecv, Ack) => Step::To(if orig || simultaneous {
            Established
        } else {
            SynRecv
        }),
        (SynRecv | Established, Fin) => Step::To(FinWait),
        (Established, Ack) => Step::To(Established),
        (Established | FinWait | CloseWait | LastAck, Syn) => ignore_if(orig),
        (Established | FinWait | CloseWait | LastAck | TimeWait | Close, SynAck) => {
            ignore_if(!orig)
        }
        (FinWait, Ack) => Step::To(if from_closer { FinWait } else { CloseWait }),
        (FinWait, Fin) => Step::To(if from_closer { FinWait } else { LastAck }),
        (CloseWait, Ack) => Step::To(CloseWait),
        (CloseWait, Fin) => Step::To(if from_closer { CloseWait } else { LastAck }),
        (LastAck, Ack) => Step::To(if from_closer { TimeWait } else { LastAck }),
        (LastAck, Fin) => Step::To(LastAck),
        (TimeWait | Close, Syn) => Step::Reopen,
        (TimeWait, Ack | Fin) => Step::To(TimeWait),
        (Close, Ack | Fin) => Step::To(Close),
    }
}

// ------------------------------------------------------------------------------------------
// Verdict reasons

/// Why a packet was let through or dropped; counted per reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Reason {
    /// Allowed: it belongs to a tracked connection.
    Tracked = 1,
    /// Allowed by a rule.
    AllowRule = 2,
    /// Allowed by the default policy of its direction.
    AllowPolicy = 3,
    /// Allowed: an ICMP error about a tracked connection.
    Related = 4,
    /// Allowed: ICMPv6 neighbour discovery.
    NeighborDiscovery = 5,
    /// Allowed: not IP (ARP, ...).
    NotIp = 6,
    /// Allowed without changing its connection: a TCP segment conntrack ignores (a SYN in an
    /// established connection, an old retransmission, an overly delayed ack).
    TcpIgnored = 7,
    /// Dropped by a rule.
    DenyRule = 20,
    /// Dropped: an inbound packet that would open a connection, no rule allowing it.
    InboundPolicy = 21,
    /// Dropped: an outbound packet that would open a connection, `default_outbound = "deny"`.
    OutboundPolicy = 22,
    /// Dropped: TCP flags no TCP sends.
    TcpInvalidFlags = 23,
    /// Dropped: a TCP segment other than SYN for no connection.
    TcpNoConnection = 24,
    /// Dropped: a TCP segment that makes no sense in its connection's state.
    TcpInvalidState = 25,
    /// Dropped: a packet of a tracked connection from the wrong side.
    WrongDirection = 26,
    /// Dropped: an ICMP echo reply without its request.
    IcmpUnsolicitedReply = 27,
    /// Dropped: the transport header could not be read.
    Malformed = 28,
    /// Dropped: the connection table could not be read (fail closed).
    StateUnavailable = 29,
    /// Dropped: a TCP segment starting past the receiver's window (`liberal = false`).
    TcpSeqAboveWindow = 30,
    /// Dropped: a TCP segment acknowledging data never sent (`liberal = false`).
    TcpAckAboveData = 31,
    /// Dropped: a RST outside the window (`liberal = false`).
    TcpRstOutOfWindow = 32,
    /// Dropped: it would open a connection, the table is full and nothing could be ended
    /// early to make room.
    TableFull = 33,
}

impl Reason {
    /// Every reason.
    pub const ALL: [Reason; 21] = [
        Reason::Tracked,
        Reason::AllowRule,
        Reason::AllowPolicy,
        Reason::Related,
        Reason::NeighborDiscovery,
        Reason::NotIp,
        Reason::TcpIgnored,
        Reason::DenyRule,
        Reason::InboundPolicy,
        Reason::OutboundPolicy,
        Reason::TcpInvalidFlags,
        Reason::TcpNoConnection,
        Reason::TcpInvalidState,
        Reason::WrongDirection,
        Reason::IcmpUnsolicitedReply,
        Reason::Malformed,
        Reason::StateUnavailable,
        Reason::TcpSeqAboveWindow,
        Reason::TcpAckAboveData,
        Reason::TcpRstOutOfWindow,
        Reason::TableFull,
    ];

    /// Whether packets with this reason pass.
    pub const fn allows(self) -> bool {
        (self as u8) < 20
    }

    /// Whether the rules or the default policy refused the packet.
    const fn by_policy(self) -> bool {
        matches!(
            self,
            Reason::DenyRule | Reason::InboundPolicy | Reason::OutboundPolicy
        )
    }

    /// The text of the reason (the [`Verdict::Drop`] reason for a dropped packet).
    pub const fn text(self) -> &'static str {
        match self {
            Reason::Tracked => "tracked connection",
            Reason::AllowRule => "allowed by rule",
            Reason::AllowPolicy => "allowed by policy",
            Reason::Related => "icmp error for a tracked connection",
            Reason::NeighborDiscovery => "icmpv6 neighbor discovery",
            Reason::NotIp => "not ip",
            Reason::TcpIgnored => "tcp: ignored, connection unchanged",
            Reason::DenyRule => "denied by rule",
            Reason::InboundPolicy => "inbound: not opened from inside",
            Reason::OutboundPolicy => "outbound denied by policy",
            Reason::TcpInvalidFlags => "tcp: invalid flags",
            Reason::TcpNoConnection => "tcp: no connection",
            Reason::TcpInvalidState => "tcp: invalid in connection state",
            Reason::WrongDirection => "wrong direction for connection",
            Reason::IcmpUnsolicitedReply => "icmp: reply without request",
            Reason::Malformed => "malformed transport header",
            Reason::StateUnavailable => "connection state unavailable",
            Reason::TcpSeqAboveWindow => "tcp: seq above window",
            Reason::TcpAckAboveData => "tcp: ack above data seen",
            Reason::TcpRstOutOfWindow => "tcp: rst out of window",
            Reason::TableFull => "table full",
        }
    }

    const fn report_name(self) -> &'static str {
        match self {
            Reason::Tracked => "allowed_tracked",
            Reason::AllowRule => "allowed_rule",
            Reason::AllowPolicy => "allowed_policy",
            Reason::Related => "allowed_related",
            Reason::NeighborDiscovery => "allowed_neighbor_discovery",
            Reason::NotIp => "allowed_not_ip",
            Reason::TcpIgnored => "allowed_tcp_ignored",
            Reason::DenyRule => "denied_rule",
            Reason::InboundPolicy => "denied_inbound_policy",
            Reason::OutboundPolicy => "denied_outbound_policy",
            Reason::TcpInvalidFlags => "denied_tcp_invalid_flags",
            Reason::TcpNoConnection => "denied_tcp_no_connection",
            Reason::TcpInvalidState => "denied_tcp_invalid_state",
            Reason::WrongDirection => "denied_wrong_direction",
            Reason::IcmpUnsolicitedReply => "denied_icmp_unsolicited_reply",
            Reason::Malformed => "denied_malformed",
            Reason::StateUnavailable => "denied_state_unavailable",
            Reason::TcpSeqAboveWindow => "denied_tcp_seq_above_window",
            Reason::TcpAckAboveData => "denied_tcp_ack_above_data_seen",
            Reason::TcpRstOutOfWindow => "denied_tcp_rst_out_of_window",
            Reason::TableFull => "denied_table_full",
        }
    }
}

// ------------------------------------------------------------------------------------------
// Factory

/// Builds firewalls; holds the compiled configuration, shared by every worker.
#[derive(Debug, Clone)]
pub struct Factory(Arc<Compiled>);

#[derive(Debug)]
struct Compiled {
    rules: Vec<Rule>,
    default_outbound: Action,
    default_inbound: Action,
    /// Timeouts indexed by [`Timeout`].
    timeouts: [Duration; 12],
    /// [`Config::liberal`].
    liberal: bool,
    /// [`Config::max_connections`].
    max_connections: u64,
    /// [`Config::early_drop`].
    early_drop: bool,
}

/// Index of a timeout in [`Compiled::timeouts`].
#[derive(Clone, Copy)]
enum Timeout {
    SynSent,
    SynRecv,
    Established,
    FinWait,
    CloseWait,
    LastAck,
    TimeWait,
    Close,
    UdpUnreplied,
    UdpReplied,
    Icmp,
    Generic,
}

impl Factory {
    /// Compiles `config`; errors name the key.
    pub fn new(config: &Config) -> Result<Factory, BuildError> {
        let mut errors = Vec::new();
        let mut rules = Vec::with_capacity(config.rules.len());
        for (i, r) in config.rules.iter().enumerate() {
            match Rule::compile(r, i) {
                Ok(r) => rules.push(r),
                Err(e) => errors.push(e),
            }
        }
        let t = &config.timeouts;
        let timeouts = [
            ("syn_sent", t.syn_sent),
            ("syn_recv", t.syn_recv),
            ("established", t.established),
            ("fin_wait", t.fin_wait),
            ("close_wait", t.close_wait),
            ("last_ack", t.last_ack),
            ("time_wait", t.time_wait),
            ("close", t.close),
            ("udp_unreplied", t.udp_unreplied),
            ("udp_replied", t.udp_replied),
            ("icmp", t.icmp),
            ("generic", t.generic),
        ]
        .map(|(key, d)| {
            crate::positive(NF, &format!("timeouts.{key}"), d, &mut errors);
            d
        });
        BuildError::all(errors)?;
        Ok(Factory(Arc::new(Compiled {
            rules,
            default_outbound: config.default_outbound,
            default_inbound: config.default_inbound,
            timeouts,
            liberal: config.liberal,
            max_connections: config.max_connections,
            early_drop: config.early_drop,
        })))
    }

    /// Builds one worker's firewall (what [`NfFactory::build`] boxes).
    pub fn build_firewall(
        &self,
        state: &mut Declare<'_>,
        worker: Placement,
    ) -> Result<Firewall, BuildError> {
        Ok(Firewall {
            cap: RefCell::new(Cap::declare(
                state,
                Unit::Conns,
                self.0.max_connections,
                self.0.early_drop,
                worker,
            )?),
            cfg: Arc::clone(&self.0),
            conns: state.map("conns", Scope::PerFlow, Access::ReadWrite)?,
            datagrams: state.map("datagrams", Scope::PerFlow, Access::ReadWrite)?,
            allowed: state.counter_map("allowed", Scope::CrossFlow(&[]), Access::WriteMostly)?,
            denied: state.counter_map("denied", Scope::CrossFlow(&[]), Access::WriteMostly)?,
            by_state: state.counter_map(
                "conns_by_state",
                Scope::CrossFlow(&[]),
                Access::WriteMostly,
            )?,
            opened: state.counter("conns_opened", Scope::CrossFlow(&[]), Access::WriteMostly)?,
            expired: state.counter("conns_expired", Scope::CrossFlow(&[]), Access::WriteMostly)?,
            stream: RefCell::default(),
        })
    }
}

/// The factory for a `[[chain]]` table.
pub fn factory(table: &toml::Table) -> Result<Arc<dyn NfFactory>, BuildError> {
    Ok(Arc::new(Factory::new(&Config::from_table(table)?)?))
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
        Ok(Box::new(self.build_firewall(state, worker)?))
    }

    /// With `liberal = true` (the default): an established flow's packets without SYN, FIN
    /// or RST change nothing but its idle timer (windows are not kept), as Linux's flowtable
    /// offload bypasses conntrack for them. With `liberal = false` no: window tracking must
    /// see every segment.
    fn fast_path(&self) -> bool {
        self.0.liberal
    }

    /// The rules, default policies and timeouts change in place: tracked connections go on
    /// (as nftables' `ct state established accept` keeps them), new ones meet the new rules,
    /// and a connection's next packet sets its deadline with the new timeouts.
    fn reloadable(&self) -> &'static [&'static str] {
        &["rules", "default_outbound", "default_inbound", "timeouts"]
    }

    fn reload_config(&self, _: Option<&ReloadConfig>) -> Result<Option<ReloadConfig>, String> {
        Ok(Some(self.0.clone()))
    }

    fn tables(&self) -> &'static [TableInfo] {
        &[TableInfo {
            name: "connections",
            about: "a tracked connection, as conntrack -L shows it: the opener's endpoint, the \
                    endpoint it opened to, its state, the side it came from, time left",
            columns: &["proto", "src", "dst", "state", "from", "timeout"],
            summed: false,
        }]
    }

    fn stored_rows(
        &self,
        table: &str,
        store: &mut StoreReader<'_>,
        out: &mut Vec<Row>,
    ) -> Result<bool, StateError> {
        if table != "connections" {
            return Ok(false);
        }
        for (k, c) in store.map::<FlowKey, TcpConn>("conns")? {
            out.push(connection_row(&k, &c.conn, Cell::None));
        }
        for (k, c) in store.map::<FlowKey, Conn>("datagrams")? {
            out.push(connection_row(&k, &c, Cell::None));
        }
        Ok(true)
    }
}

/// A connection as `flowstate state list firewall.connections` shows it.
fn connection_row(k: &FlowKey, c: &Conn, left: Cell) -> Row {
    let (src, dst) = if c.opener_is_canonical_src {
        ((k.src, k.src_port), (k.dst, k.dst_port))
    } else {
        ((k.dst, k.dst_port), (k.src, k.src_port))
    };
    vec![
        Cell::Proto(k.proto),
        Cell::endpoint(src.0, src.1),
        Cell::endpoint(dst.0, dst.1),
        Cell::Text(c.state.name()),
        Cell::Text(match c.opened_from {
            Direction::Outbound => "inside",
            Direction::Inbound => "outside",
        }),
        left,
    ]
}

// ------------------------------------------------------------------------------------------
// The NF

/// One worker's firewall.
pub struct Firewall {
    cfg: Arc<Compiled>,
    /// TCP connections by canonical flow key, their windows inline.
    conns: Map<FlowKey, TcpConn>,
    /// UDP, ICMP echo and other protocols' connections by canonical flow key. Each packet
    /// looks its connection up in the map of its protocol only.
    datagrams: Map<FlowKey, Conn>,
    /// Packets let through, by [`Reason`] code.
    allowed: CounterMap<u8>,
    /// Packets dropped, by [`Reason`] code.
    denied: CounterMap<u8>,
    /// Tracked connections by [`ConnState`] code (a gauge).
    by_state: CounterMap<u8>,
    /// Connections opened.
    opened: Counter,
    /// Entries that timed out.
    expired: Counter,
    /// This worker's share of `max_connections`, with early drop's candidates (connections
    /// opened, or ended) and its counters.
    cap: RefCell<Cap<FlowKey>>,
    /// Connections opened and ended since the last tick, for the live stream.
    stream: RefCell<stream::Stream>,
}

impl ConnState {
    /// Whether a connection in this state may be ended early (conntrack's early drop takes
    /// entries not yet assured): not established, or ended.
    const fn expendable(self) -> bool {
        matches!(
            self,
            ConnState::SynSent
                | ConnState::SynSent2
                | ConnState::SynRecv
                | ConnState::Unreplied
                | ConnState::TimeWait
                | ConnState::Close
        )
    }
}

/// What [`Firewall::rst`] makes of a RST.
enum Rst {
    /// Dropped.
    Invalid,
    /// Closes the connection if in window.
    Close,
    /// Passes if in window; the state stays.
    KeepState,
    /// Closes the connection without a window check.
    Trusted,
}

/// What to do with a packet that would open a connection (or cannot be tracked).
enum Policy {
    Allow(Reason),
    Deny(Reason),
}

impl Firewall {
    /// The tracked connection `flow` (either direction) belongs to, if any.
    pub fn connection(&self, flow: &FlowKey) -> Option<Conn> {
        let key = canonical(flow);
        if key.proto == proto::TCP {
            self.conns.get(&key).ok().flatten().map(|c| c.conn)
        } else {
            self.datagrams.get(&key).ok().flatten()
        }
    }

    /// The windows of the TCP connection `flow` belongs to, if it is one.
    pub fn window(&self, flow: &FlowKey) -> Option<Window> {
        let key = canonical(flow);
        if key.proto != proto::TCP {
            return None;
        }
        self.conns.get(&key).ok().flatten().map(|c| c.tcp)
    }

    /// Number of tracked connections on this worker.
    pub fn tracked(&self) -> usize {
        self.conns.cached_len() + self.datagrams.cached_len()
    }

    /// Number of tracked TCP connections on this worker (the entries of `conns`; the others
    /// are in `datagrams`).
    pub fn tracked_tcp(&self) -> usize {
        self.conns.cached_len()
    }

    /// Packets counted for `reason` on this worker.
    pub fn count(&self, reason: Reason) -> i64 {
        let map = if reason.allows() {
            &self.allowed
        } else {
            &self.denied
        };
        map.get(&(reason as u8)).unwrap_or(0)
    }

    /// Connections in `state` on this worker.
    pub fn connections_in(&self, state: ConnState) -> i64 {
        self.by_state.get(&(state as u8)).unwrap_or(0)
    }

    fn timeout(&self, state: ConnState, proto: u8) -> Duration {
        let t = match state {
            ConnState::SynSent | ConnState::SynSent2 => Timeout::SynSent,
            ConnState::SynRecv => Timeout::SynRecv,
            ConnState::Established => Timeout::Established,
            ConnState::FinWait => Timeout::FinWait,
            ConnState::CloseWait => Timeout::CloseWait,
            ConnState::LastAck => Timeout::LastAck,
            ConnState::TimeWait => Timeout::TimeWait,
            ConnState::Close => Timeout::Close,
            ConnState::Unreplied | ConnState::Replied => match proto {
                proto::UDP if state == ConnState::Unreplied => Timeout::UdpUnreplied,
                proto::UDP => Timeout::UdpReplied,
                proto::ICMP | proto::ICMPV6 => Timeout::Icmp,
                _ => Timeout::Generic,
            },
        };
        self.cfg.timeouts[t as usize]
    }

    /// Rules, then the default policy of the packet's direction.
    fn policy(&self, flow: &FlowKey, dport: Option<u16>, dir: Direction) -> Policy {
        match self.cfg.rules.iter().find(|r| r.matches(flow, dport, dir)) {
            Some(r) if r.action == Action::Allow => Policy::Allow(Reason::AllowRule),
            Some(_) => Policy::Deny(Reason::DenyRule),
            None => {
                let (default, denied) = match dir {
                    Direction::Outbound => (self.cfg.default_outbound, Reason::OutboundPolicy),
                    Direction::Inbound => (self.cfg.default_inbound, Reason::InboundPolicy),
                };
                match default {
                    Action::Allow => Policy::Allow(Reason::AllowPolicy),
                    Action::Deny => Policy::Deny(denied),
                }
            }
        }
    }

    fn stateless(&self, flow: &FlowKey, dport: Option<u16>, dir: Direction) -> Reason {
        match self.policy(flow, dport, dir) {
            Policy::Allow(r) | Policy::Deny(r) => r,
        }
    }

    /// Remembers a connection that is, or may become, expendable.
    #[inline]
    fn candidate(&self, key: FlowKey) {
        self.cap.borrow_mut().remember(key);
    }

    /// Whether a new connection may be tracked: below the cap, or early drop ended the oldest
    /// expendable connection among the next candidates, TCP or not.
    fn admit(&self) -> bool {
        self.cap.borrow_mut().admit(self.tracked(), |k| {
            if k.proto == proto::TCP {
                self.end_early(&self.conns, &k)
            } else {
                self.end_early(&self.datagrams, &k)
            }
        })
    }

    /// Ends the connection `k` of `map` if it is expendable; whether it did.
    fn end_early<V: Entry>(&self, map: &Map<FlowKey, V>, k: &FlowKey) -> bool {
        let Ok(Some(state)) = map.with(k, |c| c.map(|c| c.conn().state)) else {
            return false;
        };
        if !state.expendable() {
            return false;
        }
        let Some(old) = map.remove_nowait(k) else {
            return false;
        };
        self.gauge(state, -1);
        self.stream.borrow_mut().note(k, old.conn(), "early-drop");
        true
    }

    fn gauge(&self, state: ConnState, delta: i64) {
        self.by_state.add_to_nowait(&(state as u8), delta);
    }

    /// Opens a connection in `state` for the packet `flow` from `dir`, if the policy allows;
    /// a TCP connection (`tcp`: its windows) in `conns`, another in `datagrams`.
    fn open(
        &self,
        key: FlowKey,
        flow: &FlowKey,
        dir: Direction,
        state: ConnState,
        now: Nanos,
        tcp: Option<Window>,
    ) -> Reason {
        let dport = matches!(flow.proto, proto::TCP | proto::UDP).then_some(flow.dst_port);
        match self.policy(flow, dport, dir) {
            Policy::Deny(r) => r,
            Policy::Allow(r) => {
                let conn = Conn {
                    state,
                    opener_is_canonical_src: is_canonical(flow),
                    opened_from: dir,
                    first_fin_by_opener: None,
                };
                let ttl = self.timeout(state, flow.proto);
                let opened = match tcp {
                    Some(tcp) => self.insert(&self.conns, key, TcpConn { conn, tcp }, ttl, now),
                    None => self.insert(&self.datagrams, key, conn, ttl, now),
                };
                if !opened {
                    return Reason::TableFull;
                }
                self.gauge(state, 1);
                self.opened.add_nowait(1);
                self.stream.borrow_mut().note(&key, &conn, "");
                r
            }
        }
    }

    /// Puts a new connection into `map`, in place of an ended one on the same tuple or, at
    /// the limit, of an expendable one; `false` if there was no room.
    fn insert<V: Entry>(
        &self,
        map: &Map<FlowKey, V>,
        key: FlowKey,
        value: V,
        ttl: Duration,
        now: Nanos,
    ) -> bool {
        // Replacing an ended connection (TIME_WAIT, CLOSE) takes it out of its state.
        if let Some(old) = map.remove_nowait(&key) {
            self.gauge(old.conn().state, -1);
            self.stream.borrow_mut().note(&key, old.conn(), "replaced");
        } else if !self.admit() {
            return false;
        }
        map.insert_nowait(key, value);
        self.candidate(key);
        map.expire_after(&key, ttl, now);
        true
    }

    /// Applies `next` to the entry `key` of `map` (whose current value is `cur`) and renews
    /// its timer, in one lookup.
    fn advance<V: Entry>(
        &self,
        map: &Map<FlowKey, V>,
        key: &FlowKey,
        cur: V,
        next: V,
        now: Nanos,
    ) -> Result<(), Reason> {
        let (old, new) = (cur.conn().state, next.conn().state);
        let ttl = self.timeout(new, key.proto);
        let changed = next != cur;
        let renewed = map.renew_with(key, now, |c| {
            // Unchanged, not written: a TCP entry's 64-byte value lies across its two cache
            // lines, and storing it again would dirty what the renewal may leave clean.
            if changed {
                *c = next;
            }
            (ttl, ())
        });
        if !changed {
            // Only the timer: a failed renewal leaves the entry to expire earlier.
            return Ok(());
        }
        if renewed.is_err() {
            return Err(Reason::StateUnavailable);
        }
        if new != old {
            self.gauge(old, -1);
            self.gauge(new, 1);
            if matches!(new, ConnState::TimeWait | ConnState::Close) {
                self.candidate(*key);
            }
        }
        Ok(())
    }

    fn decide(&self, pkt: &Packet<'_>, now: Nanos) -> Reason {
        let Some(flow) = pkt.dissection.flow else {
            return Reason::NotIp;
        };
        let dir = pkt.direction;
        if pkt.dissection.fragment == Fragment::Tracked {
            // A later fragment with its datagram's ports (the runtime's fragment tracker): it
            // belongs to the connection its first fragment was judged in, and passes from the
            // side that connection expects, changing nothing. Without one, policy decides.
            if let Some(c) = self.connection(&flow) {
                return if c.expected_direction(c.side_of(&flow)) == dir {
                    Reason::Tracked
                } else {
                    Reason::WrongDirection
                };
            }
        }
        if pkt.dissection.fragment.is_later() {
            // No ports to find the connection by: rules without port ranges and the default
            // policy decide, and nothing is tracked.
            return self.stateless(&flow, None, dir);
        }
        match pkt.dissection.transport {
            Transport::Tcp => self.tcp(pkt, &flow, now),
            Transport::Icmpv4 { kind, .. } => match kind {
                icmp::v4::types::ECHO_REQUEST => self.echo(&flow, dir, true, now),
                icmp::v4::types::ECHO_REPLY => self.echo(&flow, dir, false, now),
                icmp::v4::types::DEST_UNREACHABLE
                | icmp::v4::types::SOURCE_QUENCH
                | icmp::v4::types::REDIRECT
                | icmp::v4::types::TIME_EXCEEDED
                | icmp::v4::types::PARAM_PROBLEM => {
                    let inner =
                        l4(pkt).and_then(|b| icmp::v4::Packet::new_checked(b).ok()?.inner_flow());
                    self.icmp_error(&flow, inner, dir)
                }
                _ => self.stateless(&flow, None, dir),
            },
            Transport::Icmpv6 { kind, .. } => match kind {
                icmp::v6::types::ECHO_REQUEST => self.echo(&flow, dir, true, now),
                icmp::v6::types::ECHO_REPLY => self.echo(&flow, dir, false, now),
                1..=4 => {
                    let inner =
                        l4(pkt).and_then(|b| icmp::v6::Packet::new_checked(b).ok()?.inner_flow());
                    self.icmp_error(&flow, inner, dir)
                }
                // Router/neighbour solicitation and advertisement, redirect (RFC 4861).
                133..=137 => Reason::NeighborDiscovery,
                _ => self.stateless(&flow, None, dir),
            },
            // UDP and every other protocol: a pseudo-connection, unreplied until answered.
            _ => self.datagram(&flow, dir, now),
        }
    }

    /// Writes `tcp` into the entry `key` without touching its state or timer (what an
    /// ignored or invalid segment leaves behind, as conntrack's in-place updates do).
    fn note(&self, key: &FlowKey, entry: TcpConn, tcp: Window) {
        let tcp = self.unchecked(tcp);
        if tcp != entry.tcp {
            // A failed write leaves the older notes: the next segment is judged on those.
            let _ = self.conns.with_mut(key, |c| {
                if let Some(c) = c {
                    c.tcp = tcp;
                }
            });
        }
    }

    /// With `liberal = true` the windows are not kept (all zero, "not seen"): an established
    /// connection's segments then leave its entry as it is, so the entry is written only when
    /// its state changes, and a firewall restarted with `liberal = false` learns the windows
    /// from the next segments (conntrack's pick-up) rather than judging on stale ones.
    fn unchecked(&self, mut w: Window) -> Window {
        if self.cfg.liberal {
            w.seen = [Seen::default(); 2];
        }
        w
    }

    /// Opens a TCP connection with its SYN.
    fn open_tcp(
        &self,
        key: FlowKey,
        flow: &FlowKey,
        dir: Direction,
        seg: &Seg,
        now: Nanos,
    ) -> Reason {
        let mut w = Window::open(seg);
        // Conntrack runs the window check on the opening SYN too; it always passes.
        let _ = w.check(0, Segment::Syn, seg, Phase::Other, self.cfg.liberal);
        w.last.seg = Segment::Syn.code();
        w.last.dir = 0;
        let w = self.unchecked(w);
        self.open(key, flow, dir, ConnState::SynSent, now, Some(w))
    }

    /// TCP: conntrack's `nf_conntrack_tcp_packet`: the state machine ([`tcp_step`]), the RST
    /// checks and the window check ([`Window::check`]).
    fn tcp(&self, pkt: &Packet<'_>, flow: &FlowKey, now: Nanos) -> Reason {
        let Some(view) = l4(pkt).and_then(|b| tcp::Packet::new_checked(b).ok()) else {
            return Reason::Malformed;
        };
        let Some(class) = classify(view.flags()) else {
            return Reason::TcpInvalidFlags;
        };
        let seg = Seg::read(&view, !self.cfg.liberal);
        let key = canonical(flow);
        let Ok(entry) = self.conns.with(&key, |c| c.copied()) else {
            return Reason::StateUnavailable;
        };
        let Some(entry) = entry else {
            // NONE: only a SYN opens a connection.
            return match class {
                Segment::Syn => self.open_tcp(key, flow, pkt.direction, &seg, now),
                _ => Reason::TcpNoConnection,
            };
        };
        let conn = entry.conn;
        let side = conn.side_of(flow);
        if pkt.direction != conn.expected_direction(side) {
            // A SYN from the wrong side after the connection ended opens a new one.
            if class == Segment::Syn && matches!(conn.state, ConnState::TimeWait | ConnState::Close)
            {
                return self.open_tcp(key, flow, pkt.direction, &seg, now);
            }
            return Reason::WrongDirection;
        }
        let d = usize::from(side == Side::Reply);
        let liberal = self.cfg.liberal;
        let mut w = entry.tcp;
        let mut old = conn.state;
        let simultaneous = w.flags & window::SIMULTANEOUS != 0;
        let mut new = match tcp_step(conn.state, class, side, conn.closer(), simultaneous) {
            Step::Invalid => return Reason::TcpInvalidState,
            Step::Reopen => return self.open_tcp(key, flow, pkt.direction, &seg, now),
            Step::To(state) => state,
            Step::Ignore => {
                let last = w.last;
                if class == Segment::SynAck
                    && last.seg == Segment::Syn.code()
                    && usize::from(last.dir) != d
                    && seg.ack == last.end
                {
                    // This SYN/ACK answers a SYN we ignored: the hosts are in sync and the
                    // firewall is not; it takes the handshake from the noted SYN.
                    let ld = usize::from(last.dir);
                    w.seen[ld] = Seen {
                        end: last.end,
                        maxend: last.end,
                        maxwin: u32::from(last.win).max(1),
                        maxack: 0,
                        scale: last.wscale,
                        flags: last.flags & (window::WSCALE | window::SACK_PERM),
                    };
                    w.last.flags &= !window::CHALLENGE_ACK;
                    w.reset(d);
                    old = ConnState::SynSent;
                    ConnState::SynRecv
                } else {
                    w.last.seg = class.code();
                    w.last.dir = d as u8;
                    w.last.end = seg.end();
                    w.last.win = seg.win;
                    if class == Segment::Syn && d == 0 {
                        let (mut scale, mut flags) = (0, 0);
                        if let Some(s) = seg.wscale {
                            scale = s.min(window::MAX_SCALE);
                            flags |= window::WSCALE;
                        }
                        if seg.sack_perm {
                            flags |= window::SACK_PERM;
                        }
                        if conn.state == ConnState::LastAck {
                            flags |= window::CHALLENGE_ACK;
                        }
                        w.last.wscale = scale;
                        w.last.flags = flags;
                    }
                    if conn.state == ConnState::SynSent && class == Segment::Ack && d == 1 {
                        // A challenge ACK answering the SYN: the RST it draws has this seq.
                        w.last.ack = seg.ack;
                    }
                    self.note(&key, entry, w);
                    return Reason::TcpIgnored;
                }
            }
        };
        let mut skip_window = false;
        if class == Segment::Rst && !liberal {
            match self.rst(&w, old, d, &seg) {
                Rst::Invalid => return Reason::TcpRstOutOfWindow,
                Rst::Close => {}
                Rst::KeepState => new = old,
                Rst::Trusted => skip_window = true,
            }
        }
        if !skip_window && !liberal {
            match w.check(d, class, &seg, conn.state.phase(), liberal) {
                Check::Accept => {}
                Check::Ignore(_) => {
                    self.note(&key, entry, w);
                    return Reason::TcpIgnored;
                }
                Check::Invalid(why) => {
                    self.note(&key, entry, w);
                    return match (class, why) {
                        (Segment::Rst, _) => Reason::TcpRstOutOfWindow,
                        (_, Why::AckAboveData) => Reason::TcpAckAboveData,
                        _ => Reason::TcpSeqAboveWindow,
                    };
                }
            }
        }
        // In window from here on. Liberal, a run of ACKs notes only the first: the side of the
        // others serves nothing but the RST checks, and an entry rewritten on every segment
        // would cost a store write per connection and flush.
        if !(liberal && class == Segment::Ack && w.last.seg == Segment::Ack.code()) {
            w.last.seg = class.code();
            w.last.dir = d as u8;
        }
        if new == ConnState::SynSent2 {
            w.flags |= window::SIMULTANEOUS;
        }
        if matches!(old, ConnState::SynRecv | ConnState::Established)
            && new == ConnState::Established
            && w.flags & window::SEEN_REPLY != 0
        {
            w.flags |= window::ASSURED;
        }
        if d == 1 {
            w.flags |= window::SEEN_REPLY;
        }
        let mut next = Conn { state: new, ..conn };
        if class == Segment::Fin && conn.first_fin_by_opener.is_none() {
            next.first_fin_by_opener = Some(side == Side::Orig);
        }
        let next = TcpConn {
            conn: next,
            tcp: self.unchecked(w),
        };
        match self.advance(&self.conns, &key, entry, next, now) {
            Ok(()) => Reason::Tracked,
            Err(r) => r,
        }
    }

    /// Conntrack's checks of a RST (`nf_conntrack_tcp_packet`, case CLOSE) in state `old`
    /// from side `d`: the exact sequence number closes; one below the highest ack the other
    /// side sent is invalid; another one in an established connection passes without closing
    /// it, so the receiver answers with a challenge ACK and the sender's next RST, then
    /// exact, closes (RFC 5961 §3.2).
    fn rst(&self, w: &Window, old: ConnState, d: usize, seg: &Seg) -> Rst {
        use ConnState::*;
        // Closing: the tuple may already be reused, the notes are stale.
        if matches!(old, FinWait | CloseWait | LastAck | TimeWait | Close) {
            return Rst::Trusted;
        }
        let other = &w.seen[1 - d];
        let established = old == Established && w.flags & window::ASSURED != 0;
        let syn = Segment::Syn.code();
        let ack = Segment::Ack.code();
        let mut keep = false;
        if other.flags & window::MAXACK_SET != 0 && w.last.seg != syn {
            if seg.seq == 0 && !established {
                return Rst::Close;
            }
            if window::before(seg.seq, other.maxack) {
                return Rst::Invalid;
            }
            if !established || seg.seq == other.maxack {
                return Rst::Close;
            }
            if w.last.seg == ack && usize::from(w.last.dir) == d && seg.seq == w.last.end {
                // The RST right after this side's last segment.
                return Rst::Close;
            }
            keep = true;
        }
        // A RST answering a SYN or ACK let through unchecked: it may acknowledge what the
        // firewall never saw.
        if ((w.flags & window::SEEN_REPLY != 0 && w.last.seg == syn)
            || (w.flags & window::ASSURED == 0 && w.last.seg == ack))
            && seg.ack == w.last.end
        {
            return Rst::Trusted;
        }
        if old == SynSent && w.last.seg == ack && w.last.dir == 1 && seg.seq == w.last.ack {
            // The RST a challenge ACK asked for.
            return Rst::Trusted;
        }
        if keep {
            Rst::KeepState
        } else {
            Rst::Close
        }
    }

    /// A UDP, ICMP echo or other connection that the versions before the split stored in
    /// `conns` (one map for all), moved to `datagrams`. Looked for only where a packet of no
    /// connection would be refused (an answer from outside), so that opening a connection
    /// still costs one lookup (on a remote store, one read).
    #[cold]
    fn adopt(&self, key: &FlowKey, now: Nanos) -> Option<Conn> {
        let conn = self
            .conns
            .with(key, |c| c.map(|c| c.conn))
            .ok()
            .flatten()
            .filter(|c| !c.state.is_tcp())?;
        self.conns.remove_nowait(key);
        self.datagrams.insert_nowait(*key, conn);
        self.datagrams
            .expire_after(key, self.timeout(conn.state, key.proto), now);
        Some(conn)
    }

    /// UDP and other protocols.
    fn datagram(&self, flow: &FlowKey, dir: Direction, now: Nanos) -> Reason {
        // A TCP packet is dissected as TCP or not at all: its key never reaches `datagrams`.
        debug_assert_ne!(flow.proto, proto::TCP);
        let key = canonical(flow);
        let Ok(conn) = self.datagrams.with(&key, |c| c.copied()) else {
            return Reason::StateUnavailable;
        };
        let conn = match conn {
            Some(conn) => conn,
            None => {
                let r = self.open(key, flow, dir, ConnState::Unreplied, now, None);
                match r.by_policy().then(|| self.adopt(&key, now)).flatten() {
                    Some(conn) => conn,
                    None => return r,
                }
            }
        };
        let side = conn.side_of(flow);
        if dir != conn.expected_direction(side) {
            return Reason::WrongDirection;
        }
        let state = if side == Side::Reply {
            ConnState::Replied
        } else {
            conn.state
        };
        match self.advance(&self.datagrams, &key, conn, Conn { state, ..conn }, now) {
            Ok(()) => Reason::Tracked,
            Err(r) => r,
        }
    }

    /// ICMP echo: the request's sender opens, the replies answer.
    fn echo(&self, flow: &FlowKey, dir: Direction, request: bool, now: Nanos) -> Reason {
        let key = canonical(flow);
        let Ok(conn) = self.datagrams.with(&key, |c| c.copied()) else {
            return Reason::StateUnavailable;
        };
        let conn = match conn {
            Some(conn) => conn,
            None => {
                let r = if request {
                    self.open(key, flow, dir, ConnState::Unreplied, now, None)
                } else {
                    Reason::IcmpUnsolicitedReply
                };
                let refused = r.by_policy() || r == Reason::IcmpUnsolicitedReply;
                match refused.then(|| self.adopt(&key, now)).flatten() {
                    Some(conn) => conn,
                    None => return r,
                }
            }
        };
        let side = conn.side_of(flow);
        match (request, side) {
            (true, Side::Orig) | (false, Side::Reply) => {
                if dir != conn.expected_direction(side) {
                    return Reason::WrongDirection;
                }
                let state = if request {
                    conn.state
                } else {
                    ConnState::Replied
                };
                match self.advance(&self.datagrams, &key, conn, Conn { state, ..conn }, now) {
                    Ok(()) => Reason::Tracked,
                    Err(r) => r,
                }
            }
            // The answering side pings back with the same identifier: judged on its own,
            // without touching the entry.
            (true, Side::Reply) => self.stateless(flow, None, dir),
            (false, Side::Orig) => Reason::IcmpUnsolicitedReply,
        }
    }

    /// An ICMP error passes if it quotes a packet of a tracked connection and goes to one of
    /// that connection's ends; otherwise the rules and the default policy decide.
    fn icmp_error(&self, flow: &FlowKey, inner: Option<FlowKey>, dir: Direction) -> Reason {
        if let Some(inner) = inner {
            let to_an_end = flow.dst == inner.src || flow.dst == inner.dst;
            let tracked = |key: FlowKey| {
                if key.proto == proto::TCP {
                    self.conns.contains_key(&key)
                } else {
                    self.datagrams.contains_key(&key)
                }
            };
            if to_an_end && matches!(tracked(canonical(&inner)), Ok(true)) {
                return Reason::Related;
            }
        }
        self.stateless(flow, None, dir)
    }
}

/// The transport header and what follows, up to the end of the IP packet.
fn l4<'p>(pkt: &'p Packet<'_>) -> Option<&'p [u8]> {
    let d = &pkt.dissection;
    pkt.data.get(d.l4_offset?..d.l3_end)
}

/// [`FlowKey::is_canonical`], with IPv4 addresses compared as the numbers they are ordered
/// as (the generic tuple comparison of `IpAddr`s cost ~80 instructions, twice per packet).
#[inline]
fn is_canonical(flow: &FlowKey) -> bool {
    match (flow.src, flow.dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            (u32::from(s), flow.src_port) <= (u32::from(d), flow.dst_port)
        }
        _ => flow.is_canonical(),
    }
}

/// [`FlowKey::canonical`], by [`is_canonical`].
#[inline]
fn canonical(flow: &FlowKey) -> FlowKey {
    if is_canonical(flow) {
        *flow
    } else {
        flow.reversed()
    }
}

impl NetworkFunction for Firewall {
    fn name(&self) -> &str {
        NF
    }

    fn reconfigure(&mut self, config: &ReloadConfig) {
        if let Ok(c) = Arc::clone(config).downcast::<Compiled>() {
            self.cfg = c;
        }
    }

    /// Prefetches the connection `process` looks up: the canonical form of the packet's flow
    /// (not for later fragments without their datagram's ports), in the map of its protocol.
    #[inline]
    fn prefetch(&mut self, pkt: &Packet<'_>) {
        let Some(flow) = pkt.dissection.flow else {
            return;
        };
        if pkt.dissection.fragment != Fragment::Later {
            self.prefetch_flow(&flow, pkt.direction);
        }
    }

    #[inline]
    fn prefetch_flow(&mut self, flow: &FlowKey, _: Direction) {
        let key = canonical(flow);
        if key.proto == proto::TCP {
            self.conns.prefetch(&key);
        } else {
            self.datagrams.prefetch(&key);
        }
    }

    #[inline]
    fn process(&mut self, pkt: &mut Packet<'_>, cx: &Context) -> Verdict {
        let reason = self.decide(pkt, cx.now);
        if reason.allows() {
            self.allowed.add_to_nowait(&(reason as u8), 1);
            Verdict::Forward
        } else {
            self.denied.add_to_nowait(&(reason as u8), 1);
            Verdict::Drop(reason.text())
        }
    }

    /// The connection, renewed with its state's timeout, if the flow's packets come from the
    /// side it expects; nothing rewritten. Only with `liberal = true` (the cache's condition,
    /// [`Factory::fast_path`]): else every segment's window must be checked.
    fn active_until(&mut self, flow: &mut FlowKey, direction: Direction, until: Nanos) -> bool {
        if !self.cfg.liberal {
            return false;
        }
        // A packet from the side the connection does not expect would be dropped.
        match self.connection(flow) {
            Some(c) if c.expected_direction(c.side_of(flow)) == direction => {}
            _ => return false,
        }
        let key = canonical(flow);
        let renewed = if key.proto == proto::TCP {
            self.conns
                .extend_with(&key, until, |c| (self.timeout(c.conn.state, key.proto), ()))
        } else {
            self.datagrams
                .extend_with(&key, until, |c| (self.timeout(c.state, key.proto), ()))
        };
        matches!(renewed, Ok(Some(())))
    }

    fn on_tick(&mut self, now: Nanos) {
        let (by_state, expired, stream) = (&self.by_state, &self.expired, &self.stream);
        let gone = |k: &FlowKey, c: &Conn| {
            by_state.add_to_nowait(&(c.state as u8), -1);
            expired.add_nowait(1);
            stream.borrow_mut().note(k, c, "expired");
        };
        self.conns.expire(now, |k, c| gone(&k, &c.conn));
        self.datagrams.expire(now, |k, c| gone(&k, &c));
        self.stream.borrow_mut().publish(now);
    }

    fn entries(&self) -> u64 {
        self.tracked() as u64
    }

    fn list(&self, table: &str, now: Nanos, out: &mut Vec<Row>) {
        if table == "connections" {
            self.conns.for_each_timed(|k, c, deadline| {
                out.push(connection_row(k, &c.conn, Cell::timeout(deadline, now)));
            });
            self.datagrams.for_each_timed(|k, c, deadline| {
                out.push(connection_row(k, c, Cell::timeout(deadline, now)));
            });
        }
    }

    fn report(&self) -> Vec<(&'static str, i64)> {
        let mut out = vec![("tracked", self.tracked() as i64)];
        let (mut allowed, mut denied) = (0, 0);
        let mut reasons = Vec::new();
        for r in Reason::ALL {
            let n = self.count(r);
            if r.allows() {
                allowed += n;
            } else {
                denied += n;
            }
            if n != 0 {
                reasons.push((r.report_name(), n));
            }
        }
        out.push(("allowed", allowed));
        out.push(("denied", denied));
        out.extend(reasons);
        for s in ConnState::ALL {
            out.push((s.report_name(), self.connections_in(s)));
        }
        out.push(("conns_opened", self.opened.get().unwrap_or(-1)));
        out.push(("conns_expired", self.expired.get().unwrap_or(-1)));
        self.cap.borrow().report(&mut out);
        out
    }

    fn gauges(&self) -> &'static [&'static str] {
        &[
            "tracked",
            "max_connections",
            "conns_syn_sent",
            "conns_syn_recv",
            "conns_established",
            "conns_fin_wait",
            "conns_close_wait",
            "conns_last_ack",
            "conns_time_wait",
            "conns_close",
            "conns_unreplied",
            "conns_replied",
            "conns_syn_sent2",
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A TCP entry encodes its windows; one from before window tracking (two bytes) decodes
    /// with none, to be learnt again; a cut window is an error. Other connections' entries
    /// are two bytes; in `conns` (the single map of earlier versions) they decode too.
    #[test]
    fn tcp_entries_carry_their_windows() {
        let seg = Seg {
            seq: 7,
            win: 100,
            syn: true,
            wscale: Some(3),
            ..Seg::default()
        };
        let conn = Conn {
            state: ConnState::SynSent,
            opener_is_canonical_src: true,
            opened_from: Direction::Outbound,
            first_fin_by_opener: Some(false),
        };
        let entry = TcpConn {
            conn,
            tcp: Window::open(&seg),
        };
        let out = entry.to_bytes();
        assert_eq!(out.len(), 2 + Window::ENCODED_LEN);
        assert_eq!(TcpConn::from_bytes(&out).unwrap(), entry);
        assert_eq!(&conn.to_bytes()[..], &out[..2]);
        let old = TcpConn::from_bytes(&[3u8, 1]).unwrap();
        assert_eq!(
            (old.conn.state, old.tcp),
            (ConnState::Established, Window::default())
        );
        assert_eq!(TcpConn::from_bytes(&out[..20]), Err(CodecError::Truncated));
        // UDP entries are two bytes, in either map.
        let udp = Conn {
            state: ConnState::Replied,
            first_fin_by_opener: None,
            ..conn
        };
        assert_eq!(udp.to_bytes().len(), 2);
        assert_eq!(Conn::from_bytes(&udp.to_bytes()).unwrap(), udp);
        let stored = TcpConn::from_bytes(&udp.to_bytes()).unwrap();
        assert_eq!((stored.conn, stored.tcp), (udp, Window::default()));
        assert!(Conn::from_bytes(&out).is_err(), "a UDP entry is two bytes");
    }

    /// The IPv4 shortcut orders keys as `FlowKey::is_canonical` does.
    #[test]
    fn canonical_matches_the_flow_key() {
        use proptest::prelude::*;
        proptest!(|(s: u32, d: u32, sp: u16, dp: u16, same_addr: bool, same_port: bool)| {
            let d = if same_addr { s } else { d };
            let dp = if same_port { sp } else { dp };
            let k = FlowKey::new(IpAddr::V4(s.into()), IpAddr::V4(d.into()), sp, dp, 17);
            prop_assert_eq!(is_canonical(&k), k.is_canonical());
            prop_assert_eq!(canonical(&k), k.canonical());
        });
    }
}
