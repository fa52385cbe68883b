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
//! filtering = "address-dependent"             # or "endpoint-independent", "address-and-port-dependent"
//! hairpinning = true                          # inside hosts reach each other's external endpoints
//! refresh = "both"                            # or "outbound": which packets keep a session alive
//! max_sessions = 2097152                      # at most, shared by the workers; new ones dropped beyond
//! early_drop = true                           # out of ports or sessions: end the oldest unanswered or closed one
//! port_parity = false                         # true: even inside ports get even external ports, odd odd
//! events = { ipfix = "192.0.2.50:4739" }       # NAT event logging (RFC 8158), or json = "file"
//! forward = [                                 # port forwarding: publish inside servers
//!   { proto = "tcp", external = "203.0.113.1:80", internal = "10.0.0.10:8080" },
//!   { proto = "udp", external = "203.0.113.1:5000-5009", internal = "10.0.0.11:6000" },
//! ]
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
//! * **Inbound** packets (from the outside) addressed to an external address are forwarded when
//!   they belong to a session, matched on the full 5-tuple, and their destination is translated
//!   back. A UDP packet or TCP SYN that answers no session may open one on the mapping of its
//!   destination, as `filtering` says (RFC 4787 REQ-8, RFC 5382 REQ-3): from any remote
//!   (`endpoint-independent`), from a remote address the inside endpoint has a session with
//!   (`address-dependent`, the default; else dropped `"nat: filtered"`), or never
//!   (`address-and-port-dependent`). Anything else addressed to an external address is dropped
//!   (`"nat: no mapping"`); inbound packets to addresses that are not external are dropped too
//!   (`"nat: not an external address"`): the NAT answers for its external addresses only, and
//!   letting other traffic through would route the outside into the inside untranslated.
//! * **Port forwarding** (`forward`, static mappings: VPP's `nat44 add static mapping`, an
//!   nftables `dnat`): an inside endpoint published at an external endpoint (a range maps
//!   port `lo + k` to internal port `internal + k`). It is the inside endpoint's mapping from
//!   the start: a UDP packet or TCP SYN from anywhere to the external endpoint opens a
//!   session whatever `filtering` says, and the inside endpoint's own flows go out from the
//!   external endpoint. Forwarded ports never enter the pools. Inside clients reach a
//!   forwarded server through the external address by hairpinning, and it sees their
//!   external endpoints. In a cluster (or over workers) both directions of a forwarded
//!   session go to the partition of the inside endpoint.
//! * **Hairpinning** (RFC 4787 REQ-9, RFC 5382 REQ-8; `hairpinning = true`, the default): an
//!   inside packet to an external endpoint is translated outbound, then goes back in as an
//!   inbound packet from its new source, filtered as one: the other inside host sees the
//!   sender's external endpoint ("external source IP address and port", REQ-9b). The packet
//!   leaves by the inside port (the box routes by the translated destination), and inbound:
//!   the NFs before the NAT in its stage see it as a packet from outside (a firewall in front
//!   filters it by its inbound rules and tracks the connection the inside server answers, as
//!   nftables' forward chain does after a DNAT), the NFs after it never see it. A hairpinned
//!   packet the inbound half drops is left as it came, its outbound session kept (so a host
//!   behind a stricter filter can punch first). With several workers, a hairpinned packet is
//!   steered by its destination mapping's port, and its source gets a mapping at that worker:
//!   inside peers may then see another external port than outside hosts do.
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
//! * **Fragments** (RFC 4787 REQ-14), in order and out of order: a first fragment is
//!   translated as a whole packet (it opens, renews and is filtered like one). A later
//!   fragment carries no ports; the runtime's fragment tracker
//!   (`flowstate_chain::fragments`) gives it those of its datagram's first fragment, holding
//!   it until that comes, and the NAT then rewrites its address by the session the first
//!   fragment found, hairpinning included (a fragment neither opens nor renews a session). A
//!   later fragment with no ports (run without the runtime) or whose datagram has no session
//!   (its first fragment was dropped) is dropped (`"nat: fragment"`). Nothing is reassembled:
//!   the tracker's memory is bounded (`[runtime] fragment_*`).
//! * Other IP protocols (GRE, ESP, SCTP, ...) are dropped outbound (`"nat: unsupported
//!   protocol"`) and find no mapping inbound. Non-IP frames (ARP, ...) pass untouched; IPv6
//!   passes or is dropped (`"nat: ipv6"`) as configured.
//! * An outbound packet *from* an external address is dropped (`"nat: outbound from an external address"`): no inside host owns one, and a
//!   session for it would translate inbound packets back to the NAT's own address.
//!
//! * **Events** (`events`, [`events`] has the details): session and mapping create and
//!   delete, ports exhausted, session limit reached, as IPFIX to a collector and/or JSON
//!   lines, never blocking a worker (`events_lost` counts what a full queue refused).
//!
//! # Sessions and timeouts
//!
//! A session is created by the first outbound TCP or UDP packet of a 5-tuple, or an outbound
//! ICMP echo request, or by an inbound packet filtering lets in. Every translated packet
//! refreshes it; with `refresh = "outbound"` only outbound ones do (RFC 4787 REQ-6: outbound
//! refresh MUST, inbound MAY). Timeouts: UDP `udp`; ICMP echo `icmp`; TCP `tcp_established`
//! while established, `tcp_transitory` otherwise. A TCP session is established once each side
//! has sent a SYN or an ACK (so a handshake, or a connection picked up mid-stream, both count;
//! RFC 7857 §2.2 establishes on SYNs in both directions) and neither has sent a FIN or RST;
//! before that and after a FIN or RST it is transitory (RFC 5382 REQ-5). A bare SYN on a
//! closing session starts the tuple afresh (port reuse after TIME-WAIT).
//!
//! **Limits.** A worker holds at most its share of `max_sessions`; a port is free for a new
//! mapping only when its mapping's last session ended. A new session that finds the limit
//! reached or the paired address's pool empty is dropped (`"nat: session limit"`, `"nat: pool
//! exhausted"`) unless early drop (`early_drop = true`, the default, as conntrack's) can end an
//! expendable session for it: the oldest (by when it opened or closed, among the next 64
//! remembered) that nothing came in on, or that is closed (reset, or FIN both ways), and that
//! frees a port when a port is what is missing. Established and answered sessions are never
//! ended early, so a flood of new flows from spoofed or churning sources evicts only its own
//! kind. Ended sessions count as `early_drops`.
//!
//! [`NetworkFunction::on_tick`] expires sessions. Each EIM mapping counts its sessions; when
//! the last one ends the mapping is removed and its external port goes back to the end of the
//! pool (FIFO, so a port rests as long as possible before it is reused).
//!
//! # State
//!
//! The translation steps are written once ([`translate::Translator`]) over a [`NatTable`]: the
//! state API's maps below (`table = "state"`, [`Nat`]) or one Match-Value Table per worker
//! (`table = "mvt"`, [`mvt::MvtNat`]). On the state API (declared in [`Nat::new`]):
//!
//! | id | type | scope | access | what |
//! |---|---|---|---|---|
//! | `out` | `Map<FlowKey, OutSession>` | per-flow | read-mostly | inside 5-tuple → external endpoint, TCP state |
//! | `in` | `Map<FlowKey, InSession>` | per-flow | read-mostly | reply 5-tuple (remote → external) → inside endpoint |
//! | `eim` | `Map<(Ipv4Addr, u16, u8), Mapping>` | cross-flow (src ip, src port, proto) | read-write | inside endpoint → external endpoint, session count |
//! | `ext` | `Map<(Ipv4Addr, u16, u8), (Ipv4Addr, u16)>` | cross-flow (dst ip, dst port, proto) | read-mostly | external endpoint of a pool port's mapping → inside endpoint |
//! | `peers` | `Map<(Ipv4Addr, u16, u8, Ipv4Addr), u32>` | cross-flow (src ip, src port, proto) | read-write | sessions of an inside endpoint with a remote address (address-dependent filtering only) |
//! | `pool.<address>` | `List<u16>` | cross-flow `[]` (per worker) | read-write | free ports of this worker's chunk, one list per external address |
//! | `pool_init` | `Value<u32>` | cross-flow `[]` (per worker) | read-write | fingerprint of the configuration the pools were filled for |
//! | `translations` | `Counter` | cross-flow `[]` | write-mostly | sessions created |
//! | `packets_out`, `packets_in` | `Counter` | cross-flow `[]` | write-mostly | packets translated per direction |
//! | `hairpinned` | `Counter` | cross-flow `[]` | write-mostly | packets hairpinned (also counted in both directions) |
//! | `expired` | `Counter` | cross-flow `[]` | write-mostly | sessions ended by timeout |
//! | `drops` | `CounterMap<u8>` | cross-flow `[]` | write-mostly | drops by reason (index into [`DROP_REASONS`]) |
//!
//! The two session entries of a pair are created together with the same timeout (StatelessNF
//! Algorithm 5; HashMVT §III-D "reverse entry"). A packet renews the `out` entry (an inbound
//! one under `refresh = "both"`), which drives the pair's end; the reverse entry takes the
//! `out` entry's time when its own timer fires, so a packet touches one timer, not two.
//!
//! # RFC requirements
//!
//! What each requirement of the NAT behavioural RFCs asks and how this NAT meets it (✔), meets
//! it in part (◐), or does not (✘). Both tables behave the same (tested side by side).
//!
//! | requirement | what it asks | here |
//! |---|---|---|
//! | RFC 4787 REQ-1, RFC 5382 REQ-1 | endpoint-independent mapping | ✔ one external endpoint per inside `(address, port, protocol)` |
//! | RFC 4787 REQ-2 | "paired" IP address pooling (RECOMMENDED) | ✔ the external address is a hash of the inside address; a full address drops (`pool exhausted`) rather than unpair |
//! | RFC 4787 REQ-3, RFC 5382 REQ-7 | no port overloading (MUST NOT) | ✔ an external port belongs to one mapping at a time |
//! | RFC 4787 REQ-3a/b | ports 0–1023 and 1024–65535 mapped within their range (RECOMMENDED) | ◐ ports come from `ports` (default 1024–65535): high ports stay high; low ports are mapped high |
//! | RFC 4787 REQ-4 | port parity preservation (RECOMMENDED) | ✔ with `port_parity = true` (even and odd ports pooled apart; the other parity only when one runs out); off by default |
//! | RFC 4787 REQ-5 | UDP mapping timeout ≥ 2 min, 5 min RECOMMENDED | ✔ `udp = "5m"` by default; shorter values are the operator's choice |
//! | RFC 4787 REQ-6 | outbound refresh MUST, inbound refresh MAY | ✔ `refresh = "both"` (default) or `"outbound"` |
//! | RFC 4787 REQ-7 | internal and external address conflicts handled | — external addresses are static configuration; inbound packets to anything else are dropped |
//! | RFC 4787 REQ-8, RFC 5382 REQ-3 | endpoint-independent filtering for transparency, address-dependent for stringency; MAY be configurable | ✔ `filtering`, default `address-dependent`; one setting for UDP and TCP |
//! | RFC 4787 REQ-9, RFC 5382 REQ-8 | hairpinning MUST, with the external source address and port | ✔ `hairpinning = true` by default (UDP and TCP; ICMP echo to an external address is not hairpinned and finds no mapping) |
//! | RFC 4787 REQ-10, RFC 5382 REQ-6 | ALGs off by default | ✔ there are none |
//! | RFC 4787 REQ-11 | deterministic behaviour | ✔ the same input gives the same output; no fallbacks between behaviours |
//! | RFC 4787 REQ-12, RFC 5382 REQ-10 | an ICMP message never ends a mapping or session | ✔ ICMP errors neither end nor refresh sessions |
//! | RFC 4787 REQ-13 | "fragmentation needed" sent for a DF packet too big for the outside | ✔ the live box sends it, with the outside port's MTU, before translating (`flowstate_chain::live`) |
//! | RFC 4787 REQ-14 | fragments, in and out of order (MUST) | ✔ translated without reassembly: later fragments get their ports from their first fragment, and wait for it when they come first (`flowstate_chain::fragments`, bounded by `[runtime] fragment_timeout`, `fragment_datagrams`, `fragments_held`); IPv4 only |
//! | RFC 5382 REQ-2 | every valid TCP sequence, simultaneous open included | ✔ TCP state only chooses the timeout; a simultaneous open through hairpinning or filtering works (tested) |
//! | RFC 5382 REQ-4 | an unsolicited SYN is not answered for 6 s, and is forwarded if an outbound SYN follows | ◐ it is dropped silently (never answered); it is not held, so the peer's retransmission completes a simultaneous open |
//! | RFC 5382 REQ-5 | established TCP timeout ≥ 2 h 4 min, transitory ≥ 4 min | ✔ the defaults (`tcp_established = "2h4m"`, `tcp_transitory = "4m"`) |
//! | RFC 5382 REQ-9, RFC 5508 REQ-3/REQ-4 | ICMP errors translated, embedded packet included | ✔ both directions, every checksum, for TCP, UDP and echo sessions |
//! | RFC 5508 REQ-1 | ICMP echo from the inside with its replies; query timeout ≥ 60 s, configurable | ✔ identifiers mapped like ports; `icmp = "60s"` |
//! | RFC 5508 (errors the NAT originates) | TTL exceeded and the like sent by the NAT itself | ✔ time exceeded and fragmentation needed, from the box's port address to the sender as it sent (no host unreachable yet) |
//! | RFC 7857 §2.2 | TCP established on SYNs in both directions | ✔ established once each side sent a SYN or an ACK |
//! | RFC 6146, RFC 6052, RFC 7915 | stateful NAT64: IPv6-only clients reach IPv4 servers through `64:ff9b::/96` | ✘ not yet: this NAT translates IPv4 to IPv4 only (`ipv6` passes or drops IPv6) |
//! | RFC 8158 §4.1, RFC 7011 | NAT events over IPFIX | ◐ NAT44 session and BIB create and delete, NAT ports exhausted, quota exceeded (maximum session entries), templates resent on schedule over UDP; no address-exhausted, threshold or port-block events (nothing here allocates addresses or port blocks) |
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
//!
//! A reload ([`RELOADABLE`]) changes the forwardings in place: the ports a new one reserves
//! leave the worker's pool, those no rule reserves any more join it once no mapping holds
//! them, and a mapping that ends gives its port back only if the pool may hold it then
//! (`pool::Share`), so no port is ever handed out twice.

use crate::listing::{Cell, Row, StoreReader, TableInfo};
use crate::{BuildError, Direction, NetworkFunction, NfFactory, Placement, ReloadConfig};
use flowstate_state::{Codec, CodecError, Declare, StateError};
use flowstate_wire::flow::proto;
use flowstate_wire::{tcp, FlowKey};
use serde::{Deserialize, Deserializer};
use std::fmt;
use std::net::{IpAddr, Ipv4Addr};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

const NF: &str = "nat";

mod events;
mod forward;
mod ipfix;
mod maps;
pub mod mvt; // the same NAT on a Match-Value Table (`table = "mvt"`)
mod pool;
mod rewrite;
pub mod translate;

pub use events::{Event, EventKind, EventsConfig};
pub use forward::{Forward, Forwards, Ports};
pub use maps::FlowTables;
pub(crate) use rewrite::{be16, checksum_update};
pub use translate::{NatTable, Translator};

/// One worker's NAT on the state API (`table = "state"`, the default).
pub type Nat = Translator<FlowTables>;

impl Nat {
    /// Declares the NAT's state for `worker` and fills its port pools (see the module docs);
    /// no event log.
    pub fn new(
        config: &Config,
        state: &mut Declare<'_>,
        worker: Placement,
    ) -> Result<Nat, BuildError> {
        Translator::build(config, state, worker, None, |state| {
            FlowTables::new(config, state, worker)
        })
    }
}

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

/// Which inbound packets open a session on an existing mapping (RFC 4787 §5 REQ-8, RFC 5382
/// REQ-3): packets that answer a session are always let in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Filtering {
    /// From any remote endpoint (REQ-8's choice "if application transparency is most
    /// important").
    EndpointIndependent,
    /// From a remote address the inside endpoint has a session with, any port (REQ-8's
    /// choice "if a more stringent filtering behavior is most important"; the default).
    #[default]
    AddressDependent,
    /// None: only the exact remote endpoints of the inside endpoint's sessions get in.
    AddressAndPortDependent,
}

/// Which packets renew a session's timer (RFC 4787 REQ-6: outbound always; inbound MAY).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Refresh {
    /// Packets in both directions (the default).
    #[default]
    Both,
    /// Outbound packets only: an outside host cannot keep a mapping alive on its own.
    Outbound,
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
    /// Which inbound packets open sessions on a mapping (default `address-dependent`).
    #[serde(default)]
    pub filtering: Filtering,
    /// Whether inside hosts reach each other through their external endpoints (default
    /// `true`, RFC 4787 REQ-9: MUST).
    #[serde(default = "yes")]
    pub hairpinning: bool,
    /// Which packets renew a session (default `both`).
    #[serde(default)]
    pub refresh: Refresh,
    /// Sessions the NAT holds at most, shared evenly by the workers (default 2,097,152). At
    /// the limit a packet that would open a session is dropped (`"nat: session limit"`); no
    /// session is ever evicted to make room.
    #[serde(default = "default_max_sessions")]
    pub max_sessions: u64,
    /// Whether a new session that finds no free port, or the session limit reached, may end
    /// the oldest expendable session to make room: one nothing came in on, or a closed TCP one
    /// (reset, or FIN both ways), as conntrack's early drop (default `true`). Established
    /// sessions are never ended early.
    #[serde(default = "yes")]
    pub early_drop: bool,
    /// Whether an inside port is mapped to an external port of the same parity (RFC 4787
    /// REQ-4, RECOMMENDED for RTP/RTCP pairs; default `false`): even and odd ports are then
    /// pooled apart, and the other parity is used only when one runs out.
    #[serde(default)]
    pub port_parity: bool,
    /// Port forwarding rules (default none; see the module docs).
    #[serde(default)]
    pub forward: Forwards,
    /// Event logging (default off; see [`events`]).
    #[serde(default)]
    pub events: Option<EventsConfig>,
}

fn default_max_sessions() -> u64 {
    1 << 21
}

fn yes() -> bool {
    true
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
    "filtering",
    "hairpinning",
    "refresh",
    "max_sessions",
    "early_drop",
    "port_parity",
    "forward",
    "events",
];

/// The keys a reload changes in place, in both tables: every session and mapping stays; a
/// session's next packet renews it with the new timeouts. A forwarding added on a port a
/// mapping holds takes new connections at once while that mapping's sessions go on; a
/// forwarding removed takes no new connection, its sessions go on, and its ports join the
/// pool when they end.
pub const RELOADABLE: &[&str] = &[
    "tcp_established",
    "tcp_transitory",
    "udp",
    "icmp",
    "refresh",
    "hairpinning",
    "forward",
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
            filtering: Filtering::default(),
            hairpinning: true,
            refresh: Refresh::default(),
            max_sessions: default_max_sessions(),
            early_drop: true,
            port_parity: false,
            forward: Forwards::default(),
            events: None,
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
        if self.max_sessions == 0 {
            errors.push(config_error("max_sessions", "expected at least 1"));
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
        for (i, why) in self.forward.problems(&self.external) {
            errors.push(config_error_at(format!("forward[{i}]"), why));
        }
        for (key, why) in self.events.iter().flat_map(EventsConfig::problems) {
            errors.push(config_error_at(format!("events.{key}"), why));
        }
        BuildError::all(errors)
    }
}

/// The index of the external address (of `n`, in configuration order) paired with inside
/// address `inside` (RFC 4787 REQ-2): a hash, so every worker and instance agrees.
#[inline]
fn paired(inside: Ipv4Addr, n: usize) -> usize {
    flowstate_wire::hash::crc32c(&inside.octets()) as usize % n.max(1)
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
pub const DROP_REASONS: [(&str, &str); 12] = [
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
    ("nat: filtered", "drop_filtered"),
    ("nat: session limit", "drop_session_limit"),
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
const FILTERED: u8 = 10;
const SESSION_LIMIT: u8 = 11;

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
    /// Whether it is a port forwarding's (never taken from or returned to a pool).
    pub forwarded: bool,
}

impl Codec for Mapping {
    fn encode(&self, out: &mut Vec<u8>) {
        (self.ext_ip, self.ext_port, self.sessions, self.forwarded).encode(out);
    }
    fn decode(input: &mut &[u8]) -> Result<Self, CodecError> {
        let (ext_ip, ext_port, sessions, forwarded) = <(Ipv4Addr, u16, u32, bool)>::decode(input)?;
        Ok(Mapping {
            ext_ip,
            ext_port,
            sessions,
            forwarded,
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

/// The state bits after a packet came in: a TCP segment steps them by its `flags`; any other
/// packet marks the session answered.
fn step_in(s: u8, flags: Option<tcp::Flags>) -> u8 {
    match flags {
        Some(f) => tcp_step(s, f, Direction::Inbound),
        None => s | TCP_IN_OPEN,
    }
}

/// Whether a session may be ended early to make room (`early_drop`): nothing came in on it,
/// or it is closed (reset, or a FIN from both sides). An established session never is.
const fn expendable(s: u8) -> bool {
    s & TCP_IN_OPEN == 0
        || s & TCP_RST != 0
        || s & (TCP_OUT_FIN | TCP_IN_FIN) == TCP_OUT_FIN | TCP_IN_FIN
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

/// Builds NATs: the configuration, and the event log (or live stream) its workers share.
#[derive(Debug)]
pub struct Factory {
    /// The configuration.
    pub config: Config,
    events: events::EventLog,
}

impl Factory {
    /// The factory of `config` (its event exporter starts with the first worker built).
    pub fn new(config: Config) -> Factory {
        let events = config
            .events
            .clone()
            .unwrap_or_else(EventsConfig::stream_only);
        Factory {
            config,
            events: events::EventLog::new(events),
        }
    }

    /// A worker's event handle (the first starts the exporter).
    fn worker_events(&self) -> Result<Option<events::WorkerEvents>, BuildError> {
        self.events
            .worker()
            .map(Some)
            .map_err(|(key, why)| config_error_at(format!("events.{key}"), why))
    }
}

/// The factory for a `[[chain]]` table.
pub fn factory(table: &toml::Table) -> Result<Arc<dyn NfFactory>, BuildError> {
    Ok(Arc::new(Factory::new(Config::from_table(table)?)))
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
        let events = self.worker_events()?;
        Ok(Box::new(Translator::build(
            &self.config,
            state,
            worker,
            events,
            |state| FlowTables::new(&self.config, state, worker),
        )?))
    }

    /// Yes: an established flow's packets without SYN, FIN or RST change nothing but its
    /// idle timer (see the module documentation).
    fn fast_path(&self) -> bool {
        true
    }

    fn reloadable(&self) -> &'static [&'static str] {
        RELOADABLE
    }

    fn reload_config(&self, _: Option<&ReloadConfig>) -> Result<Option<ReloadConfig>, String> {
        Ok(Some(Arc::new(self.config.clone())))
    }

    /// A reloaded `forward` moves the partition of the published endpoints.
    fn steering(&self, config: &ReloadConfig) -> Option<Arc<dyn NfFactory>> {
        let c = config.downcast_ref::<Config>()?;
        Some(Arc::new(Factory::new(c.clone())))
    }

    fn partition(
        &self,
        flow: &FlowKey,
        quoted: Option<&FlowKey>,
        direction: Direction,
        partitions: u32,
    ) -> Option<u32> {
        self.config.partition(flow, quoted, direction, partitions)
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
            "forwards" => {
                let sessions: Vec<Row> = store
                    .map::<FlowKey, OutSession>("out")?
                    .into_iter()
                    .map(|(k, s)| session_row(&k, s.ext_ip, s.ext_port, s.tcp, Cell::None))
                    .collect();
                out.extend(forward_rows(self.config.forward.rules(), &sessions));
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
    TableInfo {
        name: "forwards",
        about: "a port forwarding (`forward`): protocol, external endpoint, the inside endpoint \
                it is published for, sessions on it",
        columns: &["proto", "external", "internal", "sessions"],
        summed: true,
    },
];

/// The rows of `forwards`, each with the sessions of `sessions` (rows of the `sessions`
/// table) that go out from its external endpoints.
pub(crate) fn forward_rows(rules: &[Forward], sessions: &[Row]) -> Vec<Row> {
    rules
        .iter()
        .map(|f| {
            let on = sessions
                .iter()
                .filter(|r| {
                    matches!((&r[0], &r[3]), (Cell::Proto(p), Cell::Endpoint(e))
                        if *p == f.proto
                            && e.ip() == IpAddr::V4(f.external.addr)
                            && f.external.ports.contains(e.port()))
                })
                .count();
            let (lo, hi) = f.internal_ports();
            vec![
                Cell::Proto(f.proto),
                Cell::Ports(
                    (f.external.addr, f.external.ports.lo).into(),
                    f.external.ports.hi,
                ),
                Cell::Ports((*f.internal.ip(), lo).into(), hi as u16),
                Cell::Int(on as i64),
            ]
        })
        .collect()
}

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
    ///   source port; to (or quoting) a forwarded external endpoint: the partition of its
    ///   inside endpoint, where the inside endpoint's own packets go;
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
        let owner = |ip: IpAddr, port: u16, p: u8| {
            let IpAddr::V4(a) = ip else { return None };
            if !self.external.contains(&a) {
                return None;
            }
            Some(match self.forward.inside_of(a, port, p) {
                Some((i, ip)) => crate::endpoint_partition(IpAddr::V4(i), ip, p, partitions),
                None => port_owner(port, self.ports.lo, partitions),
            })
        };
        if let Some(q) = quoted {
            return owner(q.src, q.src_port, q.proto);
        }
        if let Some(w) = owner(flow.dst, flow.dst_port, flow.proto) {
            return Some(w);
        }
        let translated = matches!(flow.proto, proto::TCP | proto::UDP | proto::ICMP);
        (direction == Direction::Outbound && flow.src.is_ipv4() && translated)
            .then(|| crate::endpoint_partition(flow.src, flow.src_port, flow.proto, partitions))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
            forwarded: true,
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
