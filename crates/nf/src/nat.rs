//! NAT44: network address and port translation (NAPT, RFC 3022) with endpoint-independent
//! mapping (RFC 4787 REQ-1) for TCP, UDP and ICMP echo, in both directions.
//!
//! ```toml
//! [[chain]]
//! nf = "nat"
//! external = ["203.0.113.1", "203.0.113.2"]   # required: the NAT's public IPv4 addresses
//! ports = "1024-65535"                        # external ports (and ICMP identifiers) to hand out
//! tcp_established = "2h4m"                    # RFC 5382 REQ-5: at least 2 h 4 min
//! tcp_transitory = "4m"                       # RFC 5382: 4 min
//! udp = "5m"                                  # RFC 4787 REQ-5: at least 2 min
//! icmp = "60s"                                # RFC 5508 REQ-1
//! ipv6 = "forward"                            # or "drop"; NAT44 leaves IPv6 alone
//! ```
//!
//! # Behaviour
//!
//! * **Outbound** packets (from the inside) get their source address and port (the echo
//!   identifier for ICMP) replaced by an external address and port. All sessions of one inside
//!   endpoint `(address, port, protocol)` share one external `(address, port)`: endpoint-
//!   independent mapping (RFC 4787 REQ-1). An inside host always gets the same external address
//!   ("paired" pooling, RFC 4787 REQ-2): the address is chosen by a hash of the inside address,
//!   so every worker and every instance agrees without sharing state. When that address has no
//!   free port in the worker's chunk the packet is dropped (`"nat: pool exhausted"`) rather than
//!   breaking the pairing.
//! * **Inbound** packets (from the outside) addressed to an external address are forwarded only
//!   when they belong to a session the inside opened, matched on the full 5-tuple: address- and
//!   port-dependent filtering (RFC 4787 REQ-8). Their destination is translated back. Anything
//!   else addressed to an external address is dropped (`"nat: no mapping"`); inbound packets to
//!   addresses that are not external are dropped too (`"nat: not an external address"`): the
//!   NAT answers for its external addresses only, and letting other traffic through would
//!   route the outside into the inside untranslated.
//! * **Checksums** are updated incrementally (RFC 1624) by the `flowstate-wire` setters: the
//!   IPv4 header checksum, the TCP/UDP checksum (port and pseudo-header address), the ICMP
//!   checksum (identifier). The NAT never verifies checksums: a correct checksum stays correct
//!   and a wrong one stays wrong, so the receiver still discards a corrupted packet. A UDP
//!   checksum of zero ("none") stays zero.
//! * **ICMP errors** (destination unreachable, source quench, redirect, time exceeded,
//!   parameter problem) that quote a translated packet are translated in both directions
//!   (RFC 5508 REQ-3 and REQ-4): the outer address, and the embedded packet's address, port or
//!   identifier, embedded IPv4 header checksum and embedded transport checksum (when the quote
//!   holds it), with the ICMP checksum updated for every changed byte. An error whose quote does
//!   not parse, or that quotes a later fragment or a protocol without ports, is dropped
//!   (`"nat: untranslatable icmp error"`); one that quotes no known session is dropped
//!   (`"nat: no mapping"`). ICMP errors do not refresh sessions. Other ICMP messages (timestamp,
//!   ...) are not translated: dropped outbound (`"nat: unsupported protocol"`) and inbound
//!   (`"nat: no mapping"`).
//! * **Fragments** are dropped (`"nat: fragment"`): later fragments carry no ports to look a
//!   session up by, and the data path does not reassemble. (RFC 4787 REQ-14 asks for fragment
//!   support; this is a known limitation.)
//! * Other IP protocols (GRE, ESP, SCTP, ...) are dropped outbound (`"nat: unsupported
//!   protocol"`) and find no mapping inbound. Non-IP frames (ARP, ...) pass untouched; IPv6
//!   passes or is dropped (`"nat: ipv6"`) as configured.
//! * Hairpinning (RFC 4787 REQ-9) is not done: an inside packet to an external address is
//!   translated like any other and sent outward. An outbound packet *from* an external address
//!   is dropped (`"nat: outbound from an external address"`): no inside host owns one, and a
//!   session for it would translate inbound packets back to the NAT's own address.
//!
//! # Sessions and timeouts
//!
//! A session is created by the first outbound TCP or UDP packet of a 5-tuple, or an outbound
//! ICMP echo request. Every translated packet, in either direction, refreshes it (RFC 4787
//! REQ-6 allows inbound refresh). Timeouts: UDP `udp`; ICMP echo `icmp`; TCP `tcp_established`
//! while established, `tcp_transitory` otherwise. A TCP session is established once each side
//! has sent a SYN or an ACK (so a handshake, or a connection picked up mid-stream, both count;
//! RFC 7857 §2.2 establishes on SYNs in both directions) and neither has sent a FIN or RST;
//! before that and after a FIN or RST it is transitory (RFC 5382 REQ-5). A bare SYN on a
//! closing session starts the tuple afresh (port reuse after TIME-WAIT).
//!
//! [`NetworkFunction::on_tick`] expires sessions. Each EIM mapping counts its sessions; when
//! the last one ends the mapping is removed and its external port goes back to the end of the
//! pool (FIFO, so a port rests as long as possible before it is reused).
//!
//! # State (all through the state API, declared in [`Nat::new`])
//!
//! | id | type | scope | access | what |
//! |---|---|---|---|---|
//! | `out` | `Map<FlowKey, OutSession>` | per-flow | read-mostly | inside 5-tuple → external endpoint, TCP state |
//! | `in` | `Map<FlowKey, InSession>` | per-flow | read-mostly | reply 5-tuple (remote → external) → inside endpoint |
//! | `eim` | `Map<(Ipv4Addr, u16, u8), Mapping>` | cross-flow (src ip, src port, proto) | read-write | inside endpoint → external endpoint, session count |
//! | `pool.<address>` | `List<u16>` | cross-flow `[]` (per worker) | read-write | free ports of this worker's chunk, one list per external address |
//! | `pool_init` | `Value<u32>` | cross-flow `[]` (per worker) | read-write | fingerprint of the configuration the pools were filled for |
//! | `translations` | `Counter` | cross-flow `[]` | write-mostly | sessions created |
//! | `packets_out`, `packets_in` | `Counter` | cross-flow `[]` | write-mostly | packets translated per direction |
//! | `expired` | `Counter` | cross-flow `[]` | write-mostly | sessions ended by timeout |
//! | `drops` | `CounterMap<u8>` | cross-flow `[]` | write-mostly | drops by reason (index into [`DROP_REASONS`]) |
//!
//! The two session entries of a pair are created together and refreshed together with the same
//! timeout (StatelessNF Algorithm 5; HashMVT §III-D "reverse entry"); the `out` entry drives the
//! pair's end.
//!
//! # Ports per worker
//!
//! The range `ports` is split among the `count` workers of an instance (FlexState §V-A4): port
//! `p` belongs to worker [`port_owner`]`(p, lo, count)` `= (p - lo) % count`, for every external
//! address. A worker only hands out its own ports, so a dispatcher steers an inbound packet to
//! the worker that translated its flow by its destination port alone. Instances do not split
//! the range among themselves: give each instance its own `external` addresses or `ports`.
//!
//! The pools are filled when a worker is built, unless the store already holds pools filled for
//! the same configuration (a restarted worker on a persistent store keeps its sessions and its
//! pools); pools from a different configuration are an error rather than a silent mix.

use crate::listing::{Cell, Row, StoreReader, TableInfo};
use crate::{
    BuildError, Context, Direction, NetworkFunction, NfFactory, Packet, Verdict, WorkerInfo,
};
use flowstate_state::{
    Access, Codec, CodecError, Counter, CounterMap, Declare, Field, List, Map, Nanos, Scope,
    StateError, Value,
};
use flowstate_wire::dissect::{Fragment, Network, Transport};
use flowstate_wire::flow::proto;
use flowstate_wire::icmp::v4::types as icmp_type;
use flowstate_wire::{checksum, hash, icmp, ipv4, tcp, udp, FlowKey};
use serde::{Deserialize, Deserializer};
use std::fmt;
use std::net::{IpAddr, Ipv4Addr};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

const NF: &str = "nat";

pub mod mvt; // the same NAT on a Match-Value Table (`table = "mvt"`)

// ------------------------------------------------------------------------------------------
// Configuration

/// An inclusive range of ports, written `"lo-hi"` (or `"p"` for one port) in the configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortRange {
    /// First port.
    pub lo: u16,
    /// Last port (inclusive).
    pub hi: u16,
}

impl PortRange {
    /// Number of ports in the range.
    pub fn len(&self) -> u32 {
        u32::from(self.hi) - u32::from(self.lo) + 1
    }

    /// Whether the range holds no port (never true for a parsed range).
    pub fn is_empty(&self) -> bool {
        self.hi < self.lo
    }

    /// Whether `port` is in the range.
    pub fn contains(&self, port: u16) -> bool {
        (self.lo..=self.hi).contains(&port)
    }
}

impl Default for PortRange {
    /// `1024-65535`: every port above the well-known ones.
    fn default() -> Self {
        PortRange {
            lo: 1024,
            hi: 65535,
        }
    }
}

impl FromStr for PortRange {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let expected = || format!("expected \"LO-HI\" with 1 <= LO <= HI <= 65535, got {s:?}");
        let port = |p: &str| p.trim().parse::<u16>().map_err(|_| expected());
        let (lo, hi) = match s.split_once('-') {
            Some((lo, hi)) => (port(lo)?, port(hi)?),
            None => {
                let p = port(s)?;
                (p, p)
            }
        };
        if lo == 0 || lo > hi {
            return Err(expected());
        }
        Ok(PortRange { lo, hi })
    }
}

impl fmt::Display for PortRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.lo, self.hi)
    }
}

impl<'de> Deserialize<'de> for PortRange {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// What the NAT does with IPv6 packets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Ipv6Policy {
    /// Pass them untouched (default): NAT44 does not translate IPv6.
    #[default]
    Forward,
    /// Drop them (`"nat: ipv6"`).
    Drop,
}

/// `[[chain]] nf = "nat"` options. Timeouts are durations (`"300s"`, `"2h4m"`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// External IPv4 addresses (required, at least one, no duplicates).
    pub external: Vec<Ipv4Addr>,
    /// External ports, and ICMP echo identifiers, to hand out (default `1024-65535`).
    #[serde(default)]
    pub ports: PortRange,
    /// Idle timeout of an established TCP session (default 2h4m, RFC 5382 REQ-5).
    #[serde(
        default = "default_tcp_established",
        deserialize_with = "flowstate_config::deserialize_duration"
    )]
    pub tcp_established: Duration,
    /// Idle timeout of a TCP session being opened or closed (default 4m, RFC 5382).
    #[serde(
        default = "default_tcp_transitory",
        deserialize_with = "flowstate_config::deserialize_duration"
    )]
    pub tcp_transitory: Duration,
    /// Idle timeout of a UDP session (default 5m, RFC 4787 REQ-5).
    #[serde(
        default = "default_udp",
        deserialize_with = "flowstate_config::deserialize_duration"
    )]
    pub udp: Duration,
    /// Idle timeout of an ICMP echo session (default 60s, RFC 5508 REQ-1).
    #[serde(
        default = "default_icmp",
        deserialize_with = "flowstate_config::deserialize_duration"
    )]
    pub icmp: Duration,
    /// What to do with IPv6 (default `forward`).
    #[serde(default)]
    pub ipv6: Ipv6Policy,
}

fn default_tcp_established() -> Duration {
    Duration::from_secs(7440)
}
fn default_tcp_transitory() -> Duration {
    Duration::from_secs(240)
}
fn default_udp() -> Duration {
    Duration::from_secs(300)
}
fn default_icmp() -> Duration {
    Duration::from_secs(60)
}

/// The configuration keys, in the order the documentation gives them.
pub const CONFIG_KEYS: &[&str] = &[
    "external",
    "ports",
    "tcp_established",
    "tcp_transitory",
    "udp",
    "icmp",
    "ipv6",
];

fn config_error(key: &'static str, reason: impl Into<String>) -> BuildError {
    BuildError::config(NF, key, reason)
}

fn config_error_at(key: String, reason: String) -> BuildError {
    BuildError::config(NF, key, reason)
}

impl Config {
    /// The defaults, with these external addresses.
    pub fn new(external: Vec<Ipv4Addr>) -> Self {
        Config {
            external,
            ports: PortRange::default(),
            tcp_established: default_tcp_established(),
            tcp_transitory: default_tcp_transitory(),
            udp: default_udp(),
            icmp: default_icmp(),
            ipv6: Ipv6Policy::default(),
        }
    }

    /// Parses a `[[chain]]` table (without `nf`). Every key that is wrong is reported, by
    /// name.
    pub fn from_table(table: &toml::Table) -> Result<Self, BuildError> {
        let config: Config = crate::read_config(NF, table).map_err(|e| {
            if table.contains_key("external") {
                return e;
            }
            // Said the way a user fixes it.
            let mut errors: Vec<BuildError> = e
                .config_errors()
                .into_iter()
                .filter(|(k, _)| k != "external")
                .map(|(k, r)| config_error_at(k, r))
                .collect();
            errors.push(config_error(
                "external",
                "missing; expected the external IPv4 addresses, e.g. external = [\"203.0.113.1\"]",
            ));
            BuildError::all(errors)
                .err()
                .unwrap_or(BuildError::Configs(Vec::new()))
        })?;
        config.validate()?;
        Ok(config)
    }

    /// Checks values that parse but make no sense; every one is reported.
    pub fn validate(&self) -> Result<(), BuildError> {
        let mut errors = Vec::new();
        if self.external.is_empty() {
            errors.push(config_error(
                "external",
                "expected at least one IPv4 address",
            ));
        }
        for (i, a) in self.external.iter().enumerate() {
            if self.external[..i].contains(a) {
                errors.push(config_error("external", format!("{a} is listed twice")));
            }
        }
        if self.ports.is_empty() || self.ports.lo == 0 {
            errors.push(config_error(
                "ports",
                format!("empty or invalid range {}", self.ports),
            ));
        }
        for (key, d) in [
            ("tcp_established", self.tcp_established),
            ("tcp_transitory", self.tcp_transitory),
            ("udp", self.udp),
            ("icmp", self.icmp),
        ] {
            crate::positive(NF, key, d, &mut errors);
        }
        BuildError::all(errors)
    }
}

/// The worker that owns external `port` when the range starting at `lo` is split among `count`
/// workers (FlexState §V-A4): `(port - lo) % count`. A dispatcher uses it to steer an inbound
/// packet, by its destination port, to the worker that handed the port out. Meaningless for a
/// port below `lo` (gives 0); `count` 0 counts as 1.
#[inline]
pub fn port_owner(port: u16, lo: u16, count: u32) -> u32 {
    u32::from(port.saturating_sub(lo)) % count.max(1)
}

// ------------------------------------------------------------------------------------------
// Drop reasons

/// Why the NAT drops packets: `(reason, name in report())`. The index is the key of the
/// `drops` counter map.
pub const DROP_REASONS: [(&str, &str); 10] = [
    ("nat: no mapping", "drop_no_mapping"),
    ("nat: pool exhausted", "drop_pool_exhausted"),
    ("nat: not an external address", "drop_not_external"),
    ("nat: fragment", "drop_fragment"),
    ("nat: unsupported protocol", "drop_unsupported"),
    ("nat: untranslatable icmp error", "drop_icmp_error"),
    ("nat: ipv6", "drop_ipv6"),
    ("nat: malformed", "drop_malformed"),
    ("nat: state error", "drop_state_error"),
    (
        "nat: outbound from an external address",
        "drop_external_source",
    ),
];

const NO_MAPPING: u8 = 0;
const POOL_EXHAUSTED: u8 = 1;
const NOT_EXTERNAL: u8 = 2;
const FRAGMENT: u8 = 3;
const UNSUPPORTED: u8 = 4;
const ICMP_ERROR: u8 = 5;
const IPV6: u8 = 6;
const MALFORMED: u8 = 7;
const STATE_ERROR: u8 = 8;
const EXTERNAL_SOURCE: u8 = 9;

// ------------------------------------------------------------------------------------------
// State values

/// The outbound entry of a session, keyed by the inside 5-tuple.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutSession {
    /// External address the inside endpoint is mapped to.
    pub ext_ip: Ipv4Addr,
    /// External port (ICMP: identifier).
    pub ext_port: u16,
    /// TCP state bits (0 for UDP and ICMP): which sides opened, closed, reset.
    pub tcp: u8,
}

impl Codec for OutSession {
    fn encode(&self, out: &mut Vec<u8>) {
        (self.ext_ip, self.ext_port, self.tcp).encode(out);
    }
    fn decode(input: &mut &[u8]) -> Result<Self, CodecError> {
        let (ext_ip, ext_port, tcp) = <(Ipv4Addr, u16, u8)>::decode(input)?;
        Ok(OutSession {
            ext_ip,
            ext_port,
            tcp,
        })
    }
}

/// The inbound entry of a session, keyed by the reply 5-tuple (remote → external).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InSession {
    /// The inside endpoint's address.
    pub inside_ip: Ipv4Addr,
    /// The inside endpoint's port (ICMP: identifier).
    pub inside_port: u16,
}

impl Codec for InSession {
    fn encode(&self, out: &mut Vec<u8>) {
        (self.inside_ip, self.inside_port).encode(out);
    }
    fn decode(input: &mut &[u8]) -> Result<Self, CodecError> {
        let (inside_ip, inside_port) = <(Ipv4Addr, u16)>::decode(input)?;
        Ok(InSession {
            inside_ip,
            inside_port,
        })
    }
}

/// An endpoint-independent mapping, keyed by the inside `(address, port, protocol)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mapping {
    /// External address.
    pub ext_ip: Ipv4Addr,
    /// External port (ICMP: identifier).
    pub ext_port: u16,
    /// Sessions using the mapping; the port returns to the pool when it reaches 0.
    pub sessions: u32,
}

impl Codec for Mapping {
    fn encode(&self, out: &mut Vec<u8>) {
        (self.ext_ip, self.ext_port, self.sessions).encode(out);
    }
    fn decode(input: &mut &[u8]) -> Result<Self, CodecError> {
        let (ext_ip, ext_port, sessions) = <(Ipv4Addr, u16, u32)>::decode(input)?;
        Ok(Mapping {
            ext_ip,
            ext_port,
            sessions,
        })
    }
}

/// An inside endpoint: address, port (ICMP: identifier), protocol.
pub type Endpoint = (Ipv4Addr, u16, u8);

// TCP state bits of an [`OutSession`].
const TCP_OUT_OPEN: u8 = 1;
const TCP_IN_OPEN: u8 = 2;
const TCP_OUT_FIN: u8 = 4;
const TCP_IN_FIN: u8 = 8;
const TCP_RST: u8 = 16;
const TCP_CLOSING: u8 = TCP_OUT_FIN | TCP_IN_FIN | TCP_RST;

/// The TCP state after a segment with `flags` went in direction `dir`.
fn tcp_step(mut s: u8, flags: tcp::Flags, dir: Direction) -> u8 {
    let (open, fin) = match dir {
        Direction::Outbound => (TCP_OUT_OPEN, TCP_OUT_FIN),
        Direction::Inbound => (TCP_IN_OPEN, TCP_IN_FIN),
    };
    let syn = flags.contains(tcp::Flags::SYN);
    let ack = flags.contains(tcp::Flags::ACK);
    if syn && !ack && s & TCP_CLOSING != 0 {
        s = 0; // a new connection on the tuple of a closing one
    }
    if flags.contains(tcp::Flags::RST) {
        s |= TCP_RST;
    } else if syn || ack {
        s |= open;
    }
    if flags.contains(tcp::Flags::FIN) {
        s |= fin;
    }
    s
}

/// Whether a TCP session is established (RFC 5382 REQ-5): both sides opened, none closing.
const fn tcp_established(s: u8) -> bool {
    s & (TCP_OUT_OPEN | TCP_IN_OPEN) == TCP_OUT_OPEN | TCP_IN_OPEN && s & TCP_CLOSING == 0
}

/// The `in` key of a session: the reply of the translated outbound flow.
fn in_key(out_key: &FlowKey, s: &OutSession) -> FlowKey {
    let icmp = out_key.proto == proto::ICMP;
    FlowKey::new(
        out_key.dst,
        IpAddr::V4(s.ext_ip),
        if icmp { s.ext_port } else { out_key.dst_port },
        s.ext_port,
        out_key.proto,
    )
}

/// The `out` key of a session from its `in` key and entry.
fn out_key(in_key: &FlowKey, s: &InSession) -> FlowKey {
    let icmp = in_key.proto == proto::ICMP;
    FlowKey::new(
        IpAddr::V4(s.inside_ip),
        in_key.src,
        s.inside_port,
        if icmp { s.inside_port } else { in_key.src_port },
        in_key.proto,
    )
}

// ------------------------------------------------------------------------------------------
// Factory

/// Builds NATs.
#[derive(Debug, Clone)]
pub struct Factory(pub Config);

/// The factory for a `[[chain]]` table.
pub fn factory(table: &toml::Table) -> Result<Arc<dyn NfFactory>, BuildError> {
    Ok(Arc::new(Factory(Config::from_table(table)?)))
}

impl NfFactory for Factory {
    fn name(&self) -> &'static str {
        NF
    }

    fn build(
        &self,
        state: &mut Declare<'_>,
        worker: WorkerInfo,
    ) -> Result<Box<dyn NetworkFunction>, BuildError> {
        Ok(Box::new(Nat::new(&self.0, state, worker)?))
    }

    /// Yes: an established flow's packets without SYN, FIN or RST change nothing but its
    /// idle timer (see the module documentation).
    fn fast_path(&self) -> bool {
        true
    }

    fn partition(
        &self,
        flow: &FlowKey,
        quoted: Option<&FlowKey>,
        direction: Direction,
        partitions: u32,
    ) -> Option<u32> {
        self.0.partition(flow, quoted, direction, partitions)
    }

    fn tables(&self) -> &'static [TableInfo] {
        TABLES
    }

    fn stored_rows(
        &self,
        table: &str,
        store: &mut StoreReader<'_>,
        out: &mut Vec<Row>,
    ) -> Result<bool, StateError> {
        match table {
            "sessions" => {
                for (k, s) in store.map::<FlowKey, OutSession>("out")? {
                    out.push(session_row(&k, s.ext_ip, s.ext_port, s.tcp, Cell::None));
                }
            }
            "mappings" => {
                for (e, m) in store.map::<Endpoint, Mapping>("eim")? {
                    out.push(mapping_row(e, &m));
                }
            }
            _ => return Ok(false),
        }
        Ok(true)
    }
}

/// The NAT's tables (both NAT tables list the same).
pub(crate) const TABLES: &[TableInfo] = &[
    TableInfo {
        name: "sessions",
        about: "a translated flow: inside endpoint, remote endpoint, the external endpoint it \
                goes out as, TCP state, time left",
        columns: &["proto", "inside", "remote", "external", "state", "timeout"],
        summed: false,
    },
    TableInfo {
        name: "mappings",
        about: "an endpoint-independent mapping (RFC 4787 REQ-1): inside endpoint, external \
                endpoint, sessions using it",
        columns: &["proto", "inside", "external", "sessions"],
        summed: false,
    },
];

/// A session as `flowstate state list nat.sessions` shows it.
pub(crate) fn session_row(
    k: &FlowKey,
    ext_ip: Ipv4Addr,
    ext_port: u16,
    tcp: u8,
    left: Cell,
) -> Row {
    vec![
        Cell::Proto(k.proto),
        Cell::endpoint(k.src, k.src_port),
        Cell::endpoint(k.dst, k.dst_port),
        Cell::endpoint(ext_ip, ext_port),
        Cell::Text(session_state(k.proto, tcp)),
        left,
    ]
}

/// A mapping as `flowstate state list nat.mappings` shows it.
pub(crate) fn mapping_row((ip, port, p): Endpoint, m: &Mapping) -> Row {
    vec![
        Cell::Proto(p),
        Cell::endpoint(ip, port),
        Cell::endpoint(m.ext_ip, m.ext_port),
        Cell::Int(i64::from(m.sessions)),
    ]
}

/// A session's state in words: TCP from its state bits (RFC 5382's established versus
/// transitory), `active` for the others.
fn session_state(p: u8, tcp: u8) -> &'static str {
    if p != proto::TCP {
        "active"
    } else if tcp & TCP_RST != 0 {
        "reset"
    } else if tcp & (TCP_OUT_FIN | TCP_IN_FIN) == TCP_OUT_FIN | TCP_IN_FIN {
        "closing"
    } else if tcp & (TCP_OUT_FIN | TCP_IN_FIN) != 0 {
        "half-closed"
    } else if tcp_established(tcp) {
        "established"
    } else {
        "opening"
    }
}

impl Config {
    /// The partition that holds a packet's NAT state (see [`NfFactory::partition`]):
    /// * inbound to an external address: the owner of its destination port
    ///   ([`port_owner`]); an ICMP error quoting a translated packet: the owner of the quoted
    ///   source port;
    /// * outbound IPv4 TCP, UDP or ICMP echo: the partition of its inside endpoint (address,
    ///   port, protocol), the scope of the `eim` mapping, so every flow of one endpoint meets
    ///   its one mapping (RFC 4787 REQ-1, endpoint-independent mapping, holds across
    ///   partitions; CHC §4.1 partitions by the coarsest scope);
    /// * anything else: the flow hash.
    pub fn partition(
        &self,
        flow: &FlowKey,
        quoted: Option<&FlowKey>,
        direction: Direction,
        partitions: u32,
    ) -> Option<u32> {
        let external = |ip: IpAddr| matches!(ip, IpAddr::V4(a) if self.external.contains(&a));
        if let Some(q) = quoted {
            return external(q.src).then(|| port_owner(q.src_port, self.ports.lo, partitions));
        }
        if external(flow.dst) {
            return Some(port_owner(flow.dst_port, self.ports.lo, partitions));
        }
        let translated = matches!(flow.proto, proto::TCP | proto::UDP | proto::ICMP);
        (direction == Direction::Outbound && flow.src.is_ipv4() && translated)
            .then(|| crate::endpoint_partition(flow.src, flow.src_port, flow.proto, partitions))
    }
}

// ------------------------------------------------------------------------------------------
// The NF

/// One worker's NAT.
pub struct Nat {
    ports: PortRange,
    tcp_established: Duration,
    tcp_transitory: Duration,
    udp: Duration,
    icmp: Duration,
    ipv6: Ipv6Policy,
    out: Map<FlowKey, OutSession>,
    inb: Map<FlowKey, InSession>,
    eim: Map<Endpoint, Mapping>,
    /// One free-port list per external address, in configuration order.
    pools: Vec<(Ipv4Addr, List<u16>)>,
    /// The external addresses, sorted (for [`Nat::is_external`]).
    external: Vec<u32>,
    translations: Counter,
    packets_out: Counter,
    packets_in: Counter,
    expired: Counter,
    drops: CounterMap<u8>,
}

impl fmt::Debug for Nat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Nat")
            .field("ports", &self.ports)
            .field(
                "external",
                &self.pools.iter().map(|(a, _)| *a).collect::<Vec<_>>(),
            )
            .field("sessions", &self.out.cached_len())
            .finish()
    }
}

/// Which endpoint of a packet to rewrite.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Src,
    Dst,
}

/// What the session logic needs to know about a packet's transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Tcp(tcp::Flags),
    Udp,
    Echo { request: bool },
}

impl Nat {
    /// Declares the NAT's state for `worker` and fills its port pools (see the module docs).
    pub fn new(
        config: &Config,
        state: &mut Declare<'_>,
        worker: WorkerInfo,
    ) -> Result<Nat, BuildError> {
        config.validate()?;
        if worker.count == 0 || worker.index >= worker.count {
            return Err(config_error(
                "workers",
                format!("worker {} of {} does not exist", worker.index, worker.count),
            ));
        }
        if config.ports.len() < worker.count {
            return Err(config_error(
                "ports",
                format!(
                    "{} has {} ports, fewer than the {} workers that share it",
                    config.ports,
                    config.ports.len(),
                    worker.count
                ),
            ));
        }
        let part = Scope::CrossFlow(&[]);
        let mut pools = Vec::with_capacity(config.external.len());
        for a in &config.external {
            pools.push((
                *a,
                state.list::<u16>(&format!("pool.{a}"), part, Access::ReadWrite)?,
            ));
        }
        let nat = Nat {
            ports: config.ports,
            tcp_established: config.tcp_established,
            tcp_transitory: config.tcp_transitory,
            udp: config.udp,
            icmp: config.icmp,
            ipv6: config.ipv6,
            out: state.map("out", Scope::PerFlow, Access::ReadMostly)?,
            inb: state.map("in", Scope::PerFlow, Access::ReadMostly)?,
            eim: state.map(
                "eim",
                Scope::CrossFlow(&[Field::SrcIp, Field::SrcPort, Field::Proto]),
                Access::ReadWrite,
            )?,
            external: {
                let mut e: Vec<u32> = config.external.iter().map(|&a| u32::from(a)).collect();
                e.sort_unstable();
                e
            },
            pools,
            translations: state.counter("translations", part, Access::WriteMostly)?,
            packets_out: state.counter("packets_out", part, Access::WriteMostly)?,
            packets_in: state.counter("packets_in", part, Access::WriteMostly)?,
            expired: state.counter("expired", part, Access::WriteMostly)?,
            drops: state.counter_map("drops", part, Access::WriteMostly)?,
        };
        let init: Value<u32> = state.value("pool_init", part, Access::ReadWrite)?;
        let print = pool_fingerprint(config, worker);
        match init.get()? {
            None => {
                for (_, pool) in &nat.pools {
                    let first = u32::from(config.ports.lo) + worker.index;
                    for p in (first..=u32::from(config.ports.hi)).step_by(worker.count as usize) {
                        pool.push_nowait(p as u16);
                    }
                }
                init.set_nowait(print);
            }
            Some(p) if p == print => {} // a restarted worker: the store holds its pools
            Some(_) => {
                return Err(config_error(
                    "ports",
                    "the store holds port pools of this worker built for other external \
                     addresses, ports or worker count; clear the NAT's state first",
                ))
            }
        }
        Ok(nat)
    }

    /// The external endpoint the inside endpoint `(address, port, protocol)` is mapped to, if
    /// it has a mapping at this worker.
    pub fn mapping(&self, inside: Endpoint) -> Option<(Ipv4Addr, u16)> {
        self.eim
            .get(&inside)
            .ok()
            .flatten()
            .map(|m| (m.ext_ip, m.ext_port))
    }

    /// Free external ports at this worker, over all addresses (-1 if the store cannot say).
    pub fn pool_free(&self) -> i64 {
        let mut n = 0;
        for (_, p) in &self.pools {
            match p.len() {
                Ok(l) => n += l as i64,
                Err(_) => return -1,
            }
        }
        n
    }

    #[inline]
    fn drop_packet(&self, why: u8) -> Verdict {
        self.drops.add_to_nowait(&why, 1);
        Verdict::Drop(DROP_REASONS[usize::from(why)].0)
    }

    /// Whether `a` is one of the external addresses: outside their span at the cost of two
    /// comparisons (most packets), else by a binary search, not a scan of every address.
    #[inline]
    fn is_external(&self, a: Ipv4Addr) -> bool {
        let a = u32::from(a);
        match (self.external.first(), self.external.last()) {
            (Some(&lo), Some(&hi)) if (lo..=hi).contains(&a) => {
                self.external.binary_search(&a).is_ok()
            }
            _ => false,
        }
    }

    /// The pool of the external address paired with `inside` (RFC 4787 REQ-2).
    #[inline]
    fn paired(&self, inside: Ipv4Addr) -> &(Ipv4Addr, List<u16>) {
        let i = hash::crc32c(&inside.octets()) as usize % self.pools.len();
        &self.pools[i]
    }

    fn timeout(&self, proto: u8, tcp: u8) -> Duration {
        match proto {
            proto::TCP if tcp_established(tcp) => self.tcp_established,
            proto::TCP => self.tcp_transitory,
            proto::UDP => self.udp,
            _ => self.icmp,
        }
    }

    /// Refreshes both entries of a session with the same timeout.
    #[inline]
    fn refresh(&self, out: &FlowKey, inb: &FlowKey, ttl: Duration, now: Nanos) {
        self.out.expire_after(out, ttl, now);
        self.inb.expire_after(inb, ttl, now);
    }

    fn outbound(&self, pkt: &mut Packet<'_>, flow: FlowKey, now: Nanos) -> Verdict {
        let kind = match pkt.dissection.transport {
            Transport::Tcp => Kind::Tcp(tcp_flags(pkt)),
            Transport::Udp => Kind::Udp,
            Transport::Icmpv4 {
                kind: k @ (icmp_type::ECHO_REQUEST | icmp_type::ECHO_REPLY),
                ..
            } => Kind::Echo {
                request: k == icmp_type::ECHO_REQUEST,
            },
            Transport::Icmpv4 { kind, .. } if is_icmp_error(kind) => {
                return self.icmp_error(pkt, Direction::Outbound)
            }
            _ => return self.drop_packet(UNSUPPORTED),
        };
        // One lookup finds the session, steps its TCP state and renews it.
        let found = self.out.renew_with(&flow, now, |s| {
            if let Kind::Tcp(f) = kind {
                s.tcp = tcp_step(s.tcp, f, Direction::Outbound);
            }
            (self.timeout(flow.proto, s.tcp), *s)
        });
        let session = match found {
            Err(_) => return self.drop_packet(STATE_ERROR),
            // The reverse entry is not renewed here: that would be a second, unprefetchable
            // lookup per packet. It is renewed lazily when its timer fires (`on_tick`).
            Ok(Some(s)) => s,
            Ok(None) => match self.open(&flow, kind) {
                Ok(s) => {
                    let ttl = self.timeout(flow.proto, s.tcp);
                    self.refresh(&flow, &in_key(&flow, &s), ttl, now);
                    s
                }
                Err(why) => return self.drop_packet(why),
            },
        };
        if !rewrite(pkt, Side::Src, session.ext_ip, session.ext_port) {
            return self.drop_packet(MALFORMED);
        }
        self.packets_out.add_nowait(1);
        Verdict::Forward
    }

    /// Creates a session for the outbound `flow`, with its EIM mapping if the endpoint has none.
    fn open(&self, flow: &FlowKey, kind: Kind) -> Result<OutSession, u8> {
        if kind == (Kind::Echo { request: false }) {
            return Err(NO_MAPPING); // an echo reply belongs to a session opened from outside
        }
        let IpAddr::V4(inside) = flow.src else {
            return Err(MALFORMED);
        };
        let ep: Endpoint = (inside, flow.src_port, flow.proto);
        let known = self.eim.with_mut(&ep, |m| {
            m.map(|m| {
                m.sessions = m.sessions.saturating_add(1);
                (m.ext_ip, m.ext_port)
            })
        });
        let (ext_ip, ext_port) = match known {
            Err(_) => return Err(STATE_ERROR),
            Ok(Some(e)) => e,
            Ok(None) => {
                let (ip, pool) = self.paired(inside);
                let port = pool.pop().map_err(|_| STATE_ERROR)?.ok_or(POOL_EXHAUSTED)?;
                self.eim.insert_nowait(
                    ep,
                    Mapping {
                        ext_ip: *ip,
                        ext_port: port,
                        sessions: 1,
                    },
                );
                (*ip, port)
            }
        };
        let tcp = match kind {
            Kind::Tcp(f) => tcp_step(0, f, Direction::Outbound),
            _ => 0,
        };
        let s = OutSession {
            ext_ip,
            ext_port,
            tcp,
        };
        self.inb.insert_nowait(
            in_key(flow, &s),
            InSession {
                inside_ip: inside,
                inside_port: flow.src_port,
            },
        );
        self.out.insert_nowait(*flow, s);
        self.translations.add_nowait(1);
        Ok(s)
    }

    fn inbound(&self, pkt: &mut Packet<'_>, flow: FlowKey, now: Nanos) -> Verdict {
        let kind = match pkt.dissection.transport {
            Transport::Tcp => Kind::Tcp(tcp_flags(pkt)),
            Transport::Udp => Kind::Udp,
            Transport::Icmpv4 {
                kind: k @ (icmp_type::ECHO_REQUEST | icmp_type::ECHO_REPLY),
                ..
            } => Kind::Echo {
                request: k == icmp_type::ECHO_REQUEST,
            },
            Transport::Icmpv4 { kind, .. } if is_icmp_error(kind) => {
                return self.icmp_error(pkt, Direction::Inbound)
            }
            _ => return self.drop_packet(NO_MAPPING),
        };
        let s = match self.inb.get(&flow) {
            Err(_) => return self.drop_packet(STATE_ERROR),
            Ok(None) => return self.drop_packet(NO_MAPPING),
            Ok(Some(s)) => s,
        };
        let ok = out_key(&flow, &s);
        let mut tcp = match self.out.get(&ok) {
            Err(_) => return self.drop_packet(STATE_ERROR),
            Ok(None) => return self.drop_packet(NO_MAPPING),
            Ok(Some(o)) => o.tcp,
        };
        if let Kind::Tcp(f) = kind {
            let t = tcp_step(tcp, f, Direction::Inbound);
            if t != tcp {
                tcp = t;
                if self.out.with_mut(&ok, |e| e.map(|e| e.tcp = t)).is_err() {
                    return self.drop_packet(STATE_ERROR);
                }
            }
        }
        if !rewrite(pkt, Side::Dst, s.inside_ip, s.inside_port) {
            return self.drop_packet(MALFORMED);
        }
        self.refresh(&ok, &flow, self.timeout(flow.proto, tcp), now);
        self.packets_in.add_nowait(1);
        Verdict::Forward
    }

    /// Translates an ICMP error quoting a packet of a session (RFC 5508 REQ-3, REQ-4). The
    /// session is not refreshed.
    fn icmp_error(&self, pkt: &mut Packet<'_>, dir: Direction) -> Verdict {
        let d = pkt.dissection;
        let Some(msg) = d.l4_offset.and_then(|o| pkt.data.get(o..d.l3_end)) else {
            return self.drop_packet(MALFORMED);
        };
        let Ok(m) = icmp::v4::Packet::new_checked(msg) else {
            return self.drop_packet(MALFORMED);
        };
        let (Some(inner), Some(layout)) = (m.inner_flow(), quoted(msg)) else {
            return self.drop_packet(ICMP_ERROR);
        };
        // The quoted packet went the other way: its reverse is the session's key.
        let key = inner.reversed();
        let (outer, addr, port) = match dir {
            Direction::Outbound => match self.out.get(&key) {
                Err(_) => return self.drop_packet(STATE_ERROR),
                Ok(None) => return self.drop_packet(NO_MAPPING),
                Ok(Some(s)) => (Side::Src, s.ext_ip, s.ext_port),
            },
            Direction::Inbound => {
                // The quote is our translated packet: its source is the outer destination.
                if d.flow.map(|f| f.dst) != Some(inner.src) {
                    return self.drop_packet(ICMP_ERROR);
                }
                match self.inb.get(&key) {
                    Err(_) => return self.drop_packet(STATE_ERROR),
                    Ok(None) => return self.drop_packet(NO_MAPPING),
                    Ok(Some(s)) => (Side::Dst, s.inside_ip, s.inside_port),
                }
            }
        };
        let Some(l3) = pkt.data.get_mut(d.l3_offset..d.l3_end) else {
            return self.drop_packet(MALFORMED);
        };
        let Ok(mut ip) = ipv4::Packet::new_checked(l3) else {
            return self.drop_packet(MALFORMED);
        };
        match outer {
            Side::Src => ip.set_src_addr(addr),
            Side::Dst => ip.set_dst_addr(addr),
        }
        // The outer address is not covered by the ICMPv4 checksum; the quote is.
        let inner_side = match outer {
            Side::Src => Side::Dst,
            Side::Dst => Side::Src,
        };
        rewrite_quoted(ip.payload_mut(), layout, inner_side, addr, port);
        if let Some(f) = pkt.dissection.flow.as_mut() {
            match outer {
                Side::Src => f.src = IpAddr::V4(addr),
                Side::Dst => f.dst = IpAddr::V4(addr),
            }
        }
        match dir {
            Direction::Outbound => self.packets_out.add_nowait(1),
            Direction::Inbound => self.packets_in.add_nowait(1),
        }
        Verdict::Forward
    }

    /// Ends a session: removes its `in` entry and releases its mapping, returning the port to
    /// the pool when it was the mapping's last session.
    fn release(&self, out_key: &FlowKey, s: &OutSession) {
        self.inb.remove_nowait(&in_key(out_key, s));
        self.expired.add_nowait(1);
        let IpAddr::V4(inside) = out_key.src else {
            return;
        };
        let ep: Endpoint = (inside, out_key.src_port, out_key.proto);
        let last = self.eim.with_mut(&ep, |m| match m {
            Some(m) => {
                m.sessions = m.sessions.saturating_sub(1);
                m.sessions == 0
            }
            None => false,
        });
        if let Ok(true) = last {
            self.eim.remove_nowait(&ep);
            if let Some((_, pool)) = self.pools.iter().find(|(a, _)| *a == s.ext_ip) {
                pool.push_nowait(s.ext_port);
            }
        }
    }
}

impl NetworkFunction for Nat {
    fn name(&self) -> &str {
        NF
    }

    /// Prefetches the session `process` looks up first: the `out` entry of an outbound
    /// packet, the `in` entry of an inbound one (keyed by the packet's flow as it arrives).
    #[inline]
    fn prefetch(&mut self, pkt: &Packet<'_>) {
        let (Network::Ipv4, Some(flow)) = (pkt.dissection.network, pkt.dissection.flow) else {
            return;
        };
        match pkt.direction {
            Direction::Outbound => self.out.prefetch(&flow),
            Direction::Inbound => self.inb.prefetch(&flow),
        }
    }

    fn process(&mut self, pkt: &mut Packet<'_>, cx: &Context) -> Verdict {
        match pkt.dissection.network {
            Network::Ipv4 => {}
            Network::Ipv6 => {
                return match self.ipv6 {
                    Ipv6Policy::Forward => Verdict::Forward,
                    Ipv6Policy::Drop => self.drop_packet(IPV6),
                }
            }
            Network::Arp | Network::Other(_) => return Verdict::Forward,
        }
        let Some(flow) = pkt.dissection.flow else {
            return self.drop_packet(MALFORMED);
        };
        match pkt.direction {
            Direction::Outbound => {
                if matches!(flow.src, IpAddr::V4(a) if self.is_external(a)) {
                    return self.drop_packet(EXTERNAL_SOURCE);
                }
                if pkt.dissection.fragment != Fragment::None {
                    return self.drop_packet(FRAGMENT);
                }
                self.outbound(pkt, flow, cx.now)
            }
            Direction::Inbound => {
                if !matches!(flow.dst, IpAddr::V4(a) if self.is_external(a)) {
                    return self.drop_packet(NOT_EXTERNAL);
                }
                if pkt.dissection.fragment != Fragment::None {
                    return self.drop_packet(FRAGMENT);
                }
                self.inbound(pkt, flow, cx.now)
            }
        }
    }

    fn on_tick(&mut self, now: Nanos) {
        self.out.expire(now, |k, s| self.release(&k, &s));
        // Outbound packets renew only the `out` entry, so an `in` entry can come due while its
        // session lives on: it then takes the `out` entry's time again. Otherwise its session
        // ended above (release removed it) or its `out` entry went some other way: end it.
        self.inb.expire(now, |k, s| {
            let ok = out_key(&k, &s);
            match self.out.deadline(&ok) {
                Some(until) if until > now => {
                    self.inb.insert_nowait(k, s);
                    self.inb
                        .expire_after(&k, Duration::from_nanos(until - now), now);
                }
                _ => {
                    if let Some(o) = self.out.remove_nowait(&ok) {
                        self.release(&ok, &o);
                    }
                }
            }
        });
    }

    fn entries(&self) -> u64 {
        self.out.cached_len() as u64
    }

    fn list(&self, table: &str, now: Nanos, out: &mut Vec<Row>) {
        match table {
            "sessions" => self.out.for_each_timed(|k, s, deadline| {
                let left = Cell::timeout(deadline, now);
                out.push(session_row(k, s.ext_ip, s.ext_port, s.tcp, left));
            }),
            "mappings" => self.eim.for_each(|e, m| out.push(mapping_row(*e, m))),
            _ => {}
        }
    }

    fn report(&self) -> Vec<(&'static str, i64)> {
        let mut r = vec![
            ("active_mappings", self.eim.cached_len() as i64),
            ("active_sessions", self.out.cached_len() as i64),
            ("translations", self.translations.get().unwrap_or(-1)),
            ("packets_out", self.packets_out.get().unwrap_or(-1)),
            ("packets_in", self.packets_in.get().unwrap_or(-1)),
            ("expired_sessions", self.expired.get().unwrap_or(-1)),
            ("pool_free", self.pool_free()),
        ];
        for (i, (_, name)) in DROP_REASONS.iter().enumerate() {
            r.push((name, self.drops.get(&(i as u8)).unwrap_or(-1)));
        }
        r
    }

    fn gauges(&self) -> &'static [&'static str] {
        &["active_mappings", "active_sessions", "pool_free"]
    }
}

// ------------------------------------------------------------------------------------------
// Packet rewriting

/// Whether an ICMPv4 type carries an invoking packet (RFC 792).
const fn is_icmp_error(kind: u8) -> bool {
    matches!(
        kind,
        icmp_type::DEST_UNREACHABLE
            | icmp_type::SOURCE_QUENCH
            | icmp_type::REDIRECT
            | icmp_type::TIME_EXCEEDED
            | icmp_type::PARAM_PROBLEM
    )
}

/// The TCP flags of a packet the dissection found TCP in.
fn tcp_flags(pkt: &Packet<'_>) -> tcp::Flags {
    let at = pkt.dissection.l4_offset.map(|o| o + 13);
    tcp::Flags(at.and_then(|a| pkt.data.get(a)).copied().unwrap_or(0))
}

/// RFC 1624 eqn. 3 over `N` bytes (a whole number of 16-bit words at an even offset): the
/// checksum after `old` was replaced by `new`. Bit for bit what [`checksum::update`] computes,
/// without its loops over slices (this runs for every translated packet).
#[inline(always)]
pub(crate) fn checksum_update<const N: usize>(check: u16, old: [u8; N], new: [u8; N]) -> u16 {
    #[inline(always)]
    fn fold(acc: u32) -> u32 {
        // Two folds bring any 32-bit sum to 16 bits: the first leaves at most 0x1fffe.
        let acc = (acc & 0xffff) + (acc >> 16);
        (acc & 0xffff) + (acc >> 16)
    }
    let (mut sum_old, mut sum_new) = (0u32, 0u32);
    for w in 0..N / 2 {
        sum_old += u32::from(u16::from_be_bytes([old[2 * w], old[2 * w + 1]]));
        sum_new += u32::from(u16::from_be_bytes([new[2 * w], new[2 * w + 1]]));
    }
    let not_old = u32::from(!(fold(sum_old) as u16));
    !(fold(u32::from(!check) + not_old + fold(sum_new)) as u16)
}

/// The big-endian 16-bit word at `at`.
#[inline(always)]
pub(crate) fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

/// Rewrites the `side` endpoint of an unfragmented IPv4 TCP, UDP or ICMP echo packet to
/// `addr`/`port` (the identifier for ICMP), with incremental checksum updates (RFC 1624), and
/// the dissection's flow key with it. Returns `false`, the packet untouched, if its headers do
/// not parse.
///
/// The per-packet path: it checks what `ipv4::Packet::new_checked` and the transport's
/// `new_checked` check, and updates the checksums as their setters do, bit for bit, on the
/// bytes directly.
#[inline]
fn rewrite(pkt: &mut Packet<'_>, side: Side, addr: Ipv4Addr, port: u16) -> bool {
    let d = pkt.dissection;
    let Some(l3) = pkt.data.get_mut(d.l3_offset..d.l3_end) else {
        return false;
    };
    // ipv4::Packet::check: the fixed header fits, version 4, IHL >= 5, the header fits,
    // header length <= total length <= buffer length.
    if l3.len() < ipv4::HEADER_LEN || l3[0] >> 4 != 4 {
        return false;
    }
    let hl = usize::from(l3[0] & 0x0f) * 4;
    let tl = usize::from(be16(l3, 2));
    if hl < ipv4::HEADER_LEN || l3.len() < hl || tl < hl || l3.len() < tl {
        return false;
    }
    let (ip, l4) = l3[..tl].split_at_mut(hl);
    // The transport's check, on the IP payload.
    let valid = match d.transport {
        Transport::Tcp => {
            l4.len() >= tcp::HEADER_LEN && {
                let thl = usize::from(l4[12] >> 4) * 4;
                thl >= tcp::HEADER_LEN && l4.len() >= thl
            }
        }
        Transport::Udp => {
            l4.len() >= udp::HEADER_LEN && {
                let ul = usize::from(be16(l4, 4));
                ul >= udp::HEADER_LEN && l4.len() >= ul
            }
        }
        Transport::Icmpv4 { .. } => l4.len() >= icmp::HEADER_LEN,
        _ => false,
    };
    if !valid {
        return false;
    }
    // IPv4 source at 12, destination at 16, header checksum at 10.
    let at = match side {
        Side::Src => 12,
        Side::Dst => 16,
    };
    let old: [u8; 4] = [ip[at], ip[at + 1], ip[at + 2], ip[at + 3]];
    let new = addr.octets();
    let c = checksum_update(be16(ip, 10), old, new);
    ip[at..at + 4].copy_from_slice(&new);
    ip[10..12].copy_from_slice(&c.to_be_bytes());
    // TCP and UDP: source port at 0, destination port at 2; TCP checksum at 16, UDP at 6.
    let port_at = match side {
        Side::Src => 0,
        Side::Dst => 2,
    };
    let icmp = match d.transport {
        Transport::Tcp => {
            // tcp::Packet::set_{src,dst}_port, then update_checksum_for_addr.
            let c = checksum_update(
                be16(l4, 16),
                be16(l4, port_at).to_be_bytes(),
                port.to_be_bytes(),
            );
            l4[port_at..port_at + 2].copy_from_slice(&port.to_be_bytes());
            let c = checksum_update(c, old, new);
            l4[16..18].copy_from_slice(&c.to_be_bytes());
            false
        }
        Transport::Udp => {
            // udp::Packet: the same two updates, but a zero checksum ("none") stays zero and
            // a computed zero is sent as 0xffff (RFC 768), after each update.
            let old_port = be16(l4, port_at);
            l4[port_at..port_at + 2].copy_from_slice(&port.to_be_bytes());
            let c = be16(l4, 6);
            if c != 0 {
                let nonzero = |c: u16| if c == 0 { 0xffff } else { c };
                let c = nonzero(checksum_update(
                    c,
                    old_port.to_be_bytes(),
                    port.to_be_bytes(),
                ));
                let c = nonzero(checksum_update(c, old, new));
                l4[6..8].copy_from_slice(&c.to_be_bytes());
            }
            false
        }
        _ => {
            // The ICMPv4 checksum (at 2) has no pseudo-header: only the identifier (at 4)
            // counts.
            let c = checksum_update(be16(l4, 2), be16(l4, 4).to_be_bytes(), port.to_be_bytes());
            l4[4..6].copy_from_slice(&port.to_be_bytes());
            l4[2..4].copy_from_slice(&c.to_be_bytes());
            true
        }
    };
    if let Some(f) = pkt.dissection.flow.as_mut() {
        match side {
            Side::Src => {
                f.src = IpAddr::V4(addr);
                f.src_port = port;
                if icmp {
                    f.dst_port = port;
                }
            }
            Side::Dst => {
                f.dst = IpAddr::V4(addr);
                f.dst_port = port;
                if icmp {
                    f.src_port = port;
                }
            }
        }
    }
    true
}

/// Where the packet quoted in an ICMP error keeps what the NAT rewrites.
#[derive(Debug, Clone, Copy)]
struct Quoted {
    /// Offset of the quoted transport header within the ICMP message.
    l4: usize,
    /// Its protocol: TCP, UDP, or ICMP (an echo).
    proto: u8,
}

/// Offset of the quoted IPv4 header in an ICMP error message.
const QUOTE: usize = icmp::HEADER_LEN;

/// The layout of the packet quoted in ICMP error `msg`, if it is an IPv4 packet whose ports
/// (TCP, UDP) or identifier (ICMP echo) are within the quote; `None` otherwise (including a
/// quoted later fragment).
fn quoted(msg: &[u8]) -> Option<Quoted> {
    let ip = msg.get(QUOTE..)?;
    let h = ip.get(..ipv4::HEADER_LEN)?;
    if h[0] >> 4 != 4 {
        return None;
    }
    let hl = usize::from(h[0] & 0x0f) * 4;
    if hl < ipv4::HEADER_LEN || ip.len() < hl || u16::from_be_bytes([h[6], h[7]]) & 0x1fff != 0 {
        return None;
    }
    let proto = h[9];
    let l4 = QUOTE + hl;
    let need = match proto {
        proto::TCP | proto::UDP => 4,
        proto::ICMP => {
            let t = *msg.get(l4)?;
            if t != icmp_type::ECHO_REQUEST && t != icmp_type::ECHO_REPLY {
                return None;
            }
            6
        }
        _ => return None,
    };
    (msg.len() >= l4 + need).then_some(Quoted { l4, proto })
}

fn read16(b: &[u8], at: usize) -> Option<u16> {
    b.get(at..at + 2).map(|b| u16::from_be_bytes([b[0], b[1]]))
}

/// Replaces the bytes at `at` (an even offset) of ICMP message `msg` with `new` (2 or 4 bytes)
/// and folds the change into the message checksum `sum` (RFC 1624 eqn. 3).
fn patch(msg: &mut [u8], sum: &mut u16, at: usize, new: &[u8]) {
    let Some(field) = msg.get_mut(at..at + new.len()) else {
        return;
    };
    let mut old = [0u8; 4];
    let old = &mut old[..new.len()];
    old.copy_from_slice(field);
    field.copy_from_slice(new);
    *sum = checksum::update(*sum, old, new);
}

/// Rewrites the `side` endpoint of the packet quoted in ICMP error `msg` (laid out as `q`) to
/// `addr`/`port`: the address, the quoted IPv4 header checksum, the port or echo identifier,
/// and the quoted transport checksum when the quote holds it (a UDP checksum of 0 stays 0);
/// the ICMP checksum follows every change (RFC 5508 REQ-3, RFC 1624).
fn rewrite_quoted(msg: &mut [u8], q: Quoted, side: Side, addr: Ipv4Addr, port: u16) {
    let Some(mut sum) = read16(msg, 2) else {
        return;
    };
    let addr_at = QUOTE + if side == Side::Src { 12 } else { 16 };
    let Some(old_addr) = msg
        .get(addr_at..addr_at + 4)
        .map(|b| [b[0], b[1], b[2], b[3]])
    else {
        return;
    };
    let new_addr = addr.octets();
    if let Some(c) = read16(msg, QUOTE + 10) {
        let c = checksum::update(c, &old_addr, &new_addr);
        patch(msg, &mut sum, QUOTE + 10, &c.to_be_bytes());
    }
    patch(msg, &mut sum, addr_at, &new_addr);
    let (port_at, check_at) = match (q.proto, side) {
        (proto::ICMP, _) => (q.l4 + 4, q.l4 + 2),
        (proto::TCP, Side::Src) => (q.l4, q.l4 + 16),
        (proto::TCP, Side::Dst) => (q.l4 + 2, q.l4 + 16),
        (_, Side::Src) => (q.l4, q.l4 + 6),
        (_, Side::Dst) => (q.l4 + 2, q.l4 + 6),
    };
    let Some(old_port) = read16(msg, port_at) else {
        return;
    };
    patch(msg, &mut sum, port_at, &port.to_be_bytes());
    if let Some(c) = read16(msg, check_at) {
        let updated = match q.proto {
            proto::ICMP => Some(checksum::update_u16(c, old_port, port)),
            proto::UDP if c == 0 => None,
            p => {
                let c = checksum::update_u16(c, old_port, port);
                let c = checksum::update(c, &old_addr, &new_addr);
                Some(if p == proto::UDP && c == 0 { 0xffff } else { c })
            }
        };
        if let Some(c) = updated {
            patch(msg, &mut sum, check_at, &c.to_be_bytes());
        }
    }
    if let Some(f) = msg.get_mut(2..4) {
        f.copy_from_slice(&sum.to_be_bytes());
    }
}

/// A fingerprint of what a worker's pools are filled from.
fn pool_fingerprint(config: &Config, worker: WorkerInfo) -> u32 {
    let mut crc = hash::crc32c(&worker.index.to_be_bytes());
    crc = hash::crc32c_append(crc, &worker.count.to_be_bytes());
    crc = hash::crc32c_append(crc, &config.ports.lo.to_be_bytes());
    crc = hash::crc32c_append(crc, &config.ports.hi.to_be_bytes());
    for a in &config.external {
        crc = hash::crc32c_append(crc, &a.octets());
    }
    crc
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The per-packet checksum update agrees with `checksum::update` bit for bit.
    #[test]
    fn checksum_update_matches_wire() {
        use proptest::prelude::*;
        proptest!(|(check: u16, old: [u8; 4], new: [u8; 4])| {
            prop_assert_eq!(
                super::checksum_update(check, old, new),
                checksum::update(check, &old, &new)
            );
            let (o2, n2) = ([old[0], old[1]], [new[0], new[1]]);
            prop_assert_eq!(
                super::checksum_update(check, o2, n2),
                checksum::update(check, &o2, &n2)
            );
        });
        for check in [0u16, 1, 0xfffe, 0xffff] {
            for (old, new) in [
                ([0u8; 4], [0xffu8; 4]),
                ([0xff; 4], [0; 4]),
                ([0; 4], [0; 4]),
            ] {
                assert_eq!(
                    super::checksum_update(check, old, new),
                    checksum::update(check, &old, &new)
                );
            }
        }
    }

    #[test]
    fn port_ranges_parse() {
        assert_eq!(
            "1024-65535".parse(),
            Ok(PortRange {
                lo: 1024,
                hi: 65535
            })
        );
        assert_eq!("5000".parse(), Ok(PortRange { lo: 5000, hi: 5000 }));
        assert_eq!(" 10 - 20 ".parse(), Ok(PortRange { lo: 10, hi: 20 }));
        for bad in ["", "0-10", "20-10", "1-65536", "a-b", "1-2-3"] {
            assert!(bad.parse::<PortRange>().is_err(), "{bad:?} parsed");
        }
        assert_eq!(PortRange { lo: 1024, hi: 1027 }.len(), 4);
    }

    #[test]
    fn port_owner_splits_round_robin() {
        assert_eq!(port_owner(1024, 1024, 2), 0);
        assert_eq!(port_owner(1025, 1024, 2), 1);
        assert_eq!(port_owner(1026, 1024, 2), 0);
        assert_eq!(port_owner(7, 1024, 2), 0);
        assert_eq!(port_owner(2000, 1024, 0), 0);
    }

    #[test]
    fn tcp_states() {
        use tcp::Flags as F;
        let syn = tcp_step(0, F::SYN, Direction::Outbound);
        assert!(!tcp_established(syn));
        let syn_ack = tcp_step(syn, F::SYN | F::ACK, Direction::Inbound);
        assert!(tcp_established(syn_ack));
        let fin = tcp_step(syn_ack, F::FIN | F::ACK, Direction::Inbound);
        assert!(!tcp_established(fin));
        let reopened = tcp_step(fin, F::SYN, Direction::Outbound);
        assert_eq!(reopened, syn);
        let rst = tcp_step(syn_ack, F::RST, Direction::Outbound);
        assert!(!tcp_established(rst));
        // Picked up mid-stream: ACKs both ways.
        let mid = tcp_step(
            tcp_step(0, F::ACK, Direction::Outbound),
            F::ACK,
            Direction::Inbound,
        );
        assert!(tcp_established(mid));
    }

    #[test]
    fn codecs_round_trip() {
        let o = OutSession {
            ext_ip: Ipv4Addr::new(203, 0, 113, 1),
            ext_port: 4242,
            tcp: 3,
        };
        assert_eq!(OutSession::from_bytes(&o.to_bytes()), Ok(o));
        let i = InSession {
            inside_ip: Ipv4Addr::new(10, 0, 0, 1),
            inside_port: 1,
        };
        assert_eq!(InSession::from_bytes(&i.to_bytes()), Ok(i));
        let m = Mapping {
            ext_ip: Ipv4Addr::new(203, 0, 113, 1),
            ext_port: 9,
            sessions: 7,
        };
        assert_eq!(Mapping::from_bytes(&m.to_bytes()), Ok(m));
        assert!(Mapping::from_bytes(&m.to_bytes()[..5]).is_err());
    }

    #[test]
    fn keys_are_inverse() {
        let flow = FlowKey::new(
            IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)),
            IpAddr::V4(Ipv4Addr::new(198, 51, 100, 7)),
            40000,
            80,
            proto::TCP,
        );
        let s = OutSession {
            ext_ip: Ipv4Addr::new(203, 0, 113, 1),
            ext_port: 1030,
            tcp: 0,
        };
        let k = in_key(&flow, &s);
        assert_eq!(k.dst_port, 1030);
        let i = InSession {
            inside_ip: Ipv4Addr::new(10, 0, 0, 1),
            inside_port: 40000,
        };
        assert_eq!(out_key(&k, &i), flow);
        let echo = FlowKey {
            proto: proto::ICMP,
            src_port: 7,
            dst_port: 7,
            ..flow
        };
        let k = in_key(&echo, &s);
        assert_eq!((k.src_port, k.dst_port), (1030, 1030));
        assert_eq!(
            out_key(
                &k,
                &InSession {
                    inside_port: 7,
                    ..i
                }
            ),
            echo
        );
    }
}
