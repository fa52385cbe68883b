//! Synthetic traffic: whole flows, deterministic from a seed, streamed without materialising
//! the trace.
//!
//! [`Synthetic`] is a [`Source`] that writes exactly [`SynthConfig::packets`] packets in exactly
//! [`SynthConfig::flows`] flows (distinct direction-independent 5-tuples). The same
//! configuration gives byte-identical output on every run and platform: the generator uses its
//! own PRNGs (SplitMix64, xoshiro256\*\*), its own `ln`/`exp` built from IEEE-754 basic
//! operations only, integer arithmetic for ordering, and no hash-map iteration.
//!
//! # Profiles
//!
//! | profile | flow sizes (shape) | defaults | source |
//! |---|---|---|---|
//! | `long` | ~10,000 packets (×0.8–1.2) | 100 flows, 1M packets, all concurrent | StatelessNF §7.2.1 "3,000 large TCP flows of 10K packets each" |
//! | `short` | ~100 packets (×0.8–1.2) | 10,000 flows, 1M packets, 1,000 concurrent | StatelessNF §7.2.1 "100,000 TCP flows of 100 packets each" |
//! | `mixed` | bounded Pareto (α = 1) on 10–1,000 | 17,000 flows, 800k packets, 1,000 concurrent, 80 % TCP | StatelessNF §7.2.1 enterprise trace "17,000 flows that range in size from 10 to 1,000 packets" |
//! | `uniform` | equal | 50,000 flows, 50,000 packets, 60-byte UDP, all concurrent | FlexState §V-A.2 (random 5-tuples, 64-byte frames, 50K flows), HashMVT §VI-D (64 B) |
//! | `scan` | `mixed`, plus 1–3-packet SYN probes | as `mixed`; 4 scanners | TRW (Jung et al., IEEE S&P 2004) §2: scanners' first contacts mostly fail |
//! | `trojan` | scripted sessions | 50 inside hosts, one in ten infected | CHC §2.1 R4, Fig. 2 (see [`infected`]) |
//!
//! `trojan` is a scenario, not a shape: `flows` is its number of inside hosts and its packet
//! count follows from their sessions (HTTP, SSH, FTP with its data connection, IRC, with real
//! payloads); [`infected`] is its ground truth. The rest of this page is about the shapes.
//!
//! The profile gives the *shape* of the per-flow packet counts; `flows` and `packets` fix their
//! number and mean. Counts are `max(minimum, ⌊λ·wᵢ⌋)` with `λ` found by bisection so that they
//! sum to exactly `packets` (the few packets left over go one each to flows in a seeded random
//! order). `wᵢ` is the flow's draw from the shape times its Zipf popularity `rankᵢ^-zipf_s`,
//! where ranks are a seeded permutation of the flows (`zipf_s = 0`: no skew).
//!
//! # Flows
//!
//! * **TCP** (RFC 9293): SYN, SYN-ACK, ACK with MSS (1460 / 1440 for IPv6), SACK-permitted,
//!   timestamps and window scale 7 (Linux's layout); then request/response exchanges: the
//!   client sends a request segment, the server answers with a burst of segments and the client
//!   acknowledges every second one (delayed ACK, RFC 9293 §3.8.6.3); then FIN/ACK, ACK, FIN/ACK,
//!   ACK. Every segment carries timestamps (RFC 7323 §3.2) and acknowledges everything the peer
//!   sent, so sequence and acknowledgment numbers are exact. ISNs and timestamp clocks are random
//!   per side. A flow has at least 7 packets; with `n` packets, `n − 7` are data or ACKs in the
//!   exchange phase. Exchange `i` is the client's message `i` (its request segment) and the
//!   server's message `i` (its burst); the burst's segment lengths are drawn when the request
//!   is made (from a per-flow stream of their own), so the response's length is known before
//!   its first byte, and every burst ends before the teardown, so responses are whole.
//! * **UDP**: request from the client, response from the server, alternating; at least 2.
//!   When `packets` is too small for every TCP flow to have 7 packets, TCP flows (highest index
//!   first) become UDP flows until the minimums fit, so [`SynthConfig::min_packets`] is 2 per
//!   flow.
//! * **uniform**: one 5-tuple per flow, each packet in a random direction, no handshake (UDP, or
//!   TCP PSH/ACK segments without options when `tcp_share > 0`); a flow may have 1 packet.
//!
//! What the data is depends on the server port (tshark dissects all of it without a malformed
//! packet or an error; `synth_tshark.rs` checks):
//!
//! | port | payload |
//! |---|---|
//! | TCP 80, 8080 | HTTP/1.1 (RFC 9112): each request `GET /path HTTP/1.1` with Host, User-Agent, Accept, Connection (padded to its length by a `Cookie` header, or a query of a few bytes); each response `HTTP/1.1 200 OK` whose `Content-Length` is exactly the text body that follows across its burst |
//! | TCP 443, 993 | TLS 1.3 (RFC 8446): the client's first message a ClientHello record (SNI `www.hostN.example.com`, x25519 key share, a padding extension (RFC 7685) to its length), the server's first a ServerHello and ChangeCipherSpec record; then application_data records (type 23, 0x0303, random-looking ciphertext, up to 2¹⁴ bytes, spanning segments) that tile every later message |
//! | TCP 22 | SSH (RFC 4253): banners, KEXINIT, ECDH init/reply (RFC 5656; an Ed25519 host key and signature, RFC 8709), then SSH_MSG_IGNORE packets (§11.2) of random bytes, up to 1 KiB each, filling every message: binary packets with exact packet_length/padding_length framing to the end. There is no NEWKEYS, so nothing turns encrypted: after NEWKEYS tshark 4.0 "decrypts" with keys it does not have and, a few times in a million packets, reads a length from the garbage and reports a malformed packet. tshark warns (not an error) "Decoded 19 bytes, but packet length is 83 bytes" on each host signature: it decodes only `ssh-rsa` and `ssh-dss` signatures |
//! | TCP 25 | SMTP (RFC 5321): EHLO, then MAIL FROM, RCPT TO, DATA, the message (RFC 5322 headers, text lines, `.`), over and over; the server's greeting and EHLO reply, `250`/`354` replies, padded with continuation lines (`250-...`) |
//! | UDP 53 | DNS (RFC 1035): a query with RD for `www.hostN.example.com`, A or AAAA, and its answer (same ID, QR, the question, 1–4 records); an OPT record (RFC 6891) with the Padding option (RFC 7830) fills to the drawn length |
//! | UDP 123 | NTPv4 (RFC 5905): 48-byte client (mode 3) and server (mode 4) packets; the server's origin timestamp is the client's transmit timestamp |
//! | UDP 3478 | STUN (RFC 8489): Binding request and success response (magic cookie, transaction ID, XOR-MAPPED-ADDRESS of the client, SOFTWARE), padded by a PADDING attribute (RFC 5780) |
//! | UDP 514 | syslog (RFC 5424) lines, both ways |
//! | UDP 443 | QUIC short-header packets (RFC 9000 §17.3: fixed bit, an 8-byte connection ID, protected payload); tshark shows them as data, since a short header names no version |
//! | TCP 3306, 5432 (and `uniform`) | counter bytes: at TCP stream sequence number `s`, `s mod 256` (tshark does not dissect them as MySQL or PostgreSQL, so nothing is malformed) |
//!
//! Each message is a function of the flow's seed, its index and its length; a server message
//! is written a segment at a time from its offset, so neither needs a buffer of its own.
//!
//! Packet sizes from [`SizeDist`] are Ethernet frame lengths as stored (no FCS; 60 = the
//! 64-byte minimum frame on the wire), 60 to 1514. They apply to packets that carry data; a
//! data packet carries at least one byte, so its frame may exceed the drawn size by its
//! headers (with IMIX, the small class gives TCP data segments of 1 byte: TCP headers with
//! timestamps already take 66 bytes). Handshake, ACK and FIN segments are as long as their
//! headers, padded to 60 bytes as a NIC pads them.
//!
//! Application data follows the drawn sizes except where a message cannot be that short (or,
//! for a few protocols, that long):
//! * a TCP request shorter than its message's shortest form is that long (an HTTP request
//!   ~135 bytes, a ClientHello ~195, SSH's banner and KEXINIT ~405, the ECDH init
//!   ~50, an application_data record 22, an SSH IGNORE packet 14); a response whose burst
//!   drew fewer bytes than its shortest form (an HTTP head ~140, the ServerHello with
//!   ChangeCipherSpec and a record ~155, SSH's banner and KEXINIT ~425 or its key exchange
//!   ~190, an SMTP reply) gets the difference in its first segment;
//! * SMTP commands (EHLO, MAIL, RCPT, DATA) are as long as the command;
//! * a DNS message is at least its question (and answers), and falls short of a longer drawn
//!   size by up to 10 bytes when the gap is too small for an OPT record (or up to 3 for the
//!   Padding option); an NTP packet is always 48 bytes; a STUN message is rounded down to a
//!   multiple of 4; a syslog line or QUIC packet is at least its header.
//!
//! With IMIX, whose small class leaves TCP 1 byte and UDP 18, about a quarter of a `mixed`
//! trace's data frames are not of their class's size: mostly longer (DNS messages, small TCP
//! requests and records), NTP always 48 bytes; counter-byte flows keep their drawn sizes.
//!
//! # Addresses
//!
//! Clients are in [`SynthConfig::clients_v4`] (10.0.0.0/8) and [`SynthConfig::clients_v6`]
//! (fd00::/8), servers in [`SynthConfig::servers_v4`] (198.51.100.0/24, TEST-NET-2;
//! 203.0.113.0/24 stays free for NAT external addresses) and [`SynthConfig::servers_v6`]
//! (2001:db8::/32). Flow `i` uses client host `i mod H` and the `⌊i / H⌋`-th port of that
//! host (from a random offset in 32768–60999, Linux's ephemeral range; 1024–65535 for
//! `uniform`), where `H` is about one host per 4 flows (one per flow for `uniform`), and host
//! numbers go through a seeded permutation of the subnet's hosts. Client (address, port) pairs
//! are therefore distinct by construction, and since client and server subnets may not overlap,
//! so are the flows' 5-tuples in either direction. Servers are up to 256 hosts of the server
//! subnet (every host for `uniform`; all 254 of the default /24) on common ports (TCP 443, 80, ...; UDP 53, 443, 123, ...;
//! random for `uniform`). Frames from clients go from MAC 02:00:00:00:00:01 to
//! 02:00:00:00:00:02, replies the other way.
//!
//! # Scans
//!
//! The `scan` profile is a `mixed` trace with [`SynthConfig::scanners`] scanners among its
//! hosts, each sending [`SynthConfig::scan_probes`] SYN probes to distinct (host, port) pairs
//! (ports 1–1024), as `nmap -sS` does: scanner 0, 4, ... are inside hosts (unused addresses of
//! `clients_v4`) scanning the servers' subnet; scanners 1, 5, ... are outside hosts
//! (192.0.2.10 and up, TEST-NET-1) scanning the clients' hosts; scanners 0, 1, 4, 5, ... scan
//! sequentially (ports 1, 2, ... of the first host, then the next host), the others in a seeded
//! random order. Each probe is its own flow, answered as a seeded draw decides: 10 % open
//! (SYN/ACK, then the scanner's RST: 3 packets), 60 % closed (RST/ACK: 2 packets), 30 %
//! filtered (no answer: 1 packet). Normal clients fail too: after every fourth probe, a random
//! normal client tries a random port 1–1024 of a server and gets a RST (from a client port
//! above 61000), so a detector's false positives are measured against hosts that sometimes
//! fail. Probes are IPv4, go round robin over the scanners, and their packets are spread
//! evenly over the trace. `flows` and `packets` count the whole trace: the
//! probes take their share and the `mixed` traffic the rest (still exactly `flows` flows and
//! `packets` packets). The ground truth is [`Synthetic::scanners`] or [`scan_truth`]
//! (without generating), as JSON by [`truth_json`].
//!
//! # Interleaving and time
//!
//! Flows start in index order, spread so that about [`SynthConfig::concurrency`] are active at
//! once. Each flow spreads its packets over a duration of the same order for every flow, so its
//! rate is proportional to its size: large (popular) flows are the elephants of their time. The
//! next packet is the earliest among active flows on this virtual timeline (integer ticks, ties
//! broken by flow index), taken from a calendar queue in O(1) amortised time. Packet `k` of the
//! trace is stamped `start_ns + k·10⁹/rate_pps`.
//!
//! Memory is O(flows) for the per-flow counts (9 bytes a flow), about 120 bytes per active flow
//! and a calendar of at most 4 MiB; generating a packet writes straight into the batch buffer
//! and does not allocate. Throughput is a few million packets a second on one core (release
//! build), less when millions of flows are active at once and their state leaves the cache.

use crate::{Error, PacketBatch, PacketMeta, Result, Source};

mod app;
pub mod trojan;
use app::Proto;
/// The subnets of a [`SynthConfig`]: the configuration's prefix types.
pub use flowstate_config::{Ipv4Net, Ipv6Net};
use flowstate_wire::build::{
    tcp_flags, EthernetSpec, FrameSpec, IpSpec, Ipv4Spec, Ipv6Spec, L4Spec, Payload, TcpOptions,
    TcpSpec, UdpSpec, ETHERNET_MIN_LEN,
};
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::str::FromStr;
pub use trojan::infected;

/// MAC address of the client side (locally administered).
pub const CLIENT_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x01];
/// MAC address of the server side (locally administered).
pub const SERVER_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x02];
/// Fewest packets of a TCP flow: three-way handshake and four-packet teardown.
pub const TCP_MIN_PACKETS: u64 = 7;
/// Fewest packets of a UDP flow: a request and its response.
pub const UDP_MIN_PACKETS: u64 = 2;

// ---------------------------------------------------------------------------------------------
// Profiles and options

/// A traffic profile: the shape of the per-flow packet counts and the defaults that go with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Profile {
    /// Few flows of ~10,000 packets (StatelessNF §7.2.1).
    Long,
    /// Many flows of ~100 packets (StatelessNF §7.2.1).
    Short,
    /// Heavy-tailed 10–1,000 packets per flow, like an enterprise trace (StatelessNF §7.2.1).
    Mixed,
    /// N random 5-tuples with equal shares and a fixed packet size, no handshakes: the 64-byte
    /// worst case of FlexState §V-A.2 and HashMVT §VI-D.
    Uniform,
    /// `mixed` traffic with a few port scanners among it, their SYN probes and the scanned
    /// hosts' answers (see [Scans](self#scans)); the scanners are the ground truth
    /// ([`Synthetic::scanners`], [`scan_truth`]).
    Scan,
    /// A scenario rather than a shape: CHC's trojan signature (SSH, then an FTP download,
    /// then IRC; CHC §2.1) on a few inside hosts among normal ones, with real payloads;
    /// `flows` is the number of hosts (see [`infected`] and the [`trojan`] module).
    Trojan,
}

impl Profile {
    /// Every flow-shape profile (exactly `flows` flows of `packets` packets); the scenario
    /// profiles are in [`SCENARIOS`](Self::SCENARIOS).
    pub const ALL: [Profile; 5] = [
        Profile::Long,
        Profile::Short,
        Profile::Mixed,
        Profile::Uniform,
        Profile::Scan,
    ];

    /// Scenario profiles: scripted sessions whose size follows from `flows` (see each).
    pub const SCENARIOS: [Profile; 1] = [Profile::Trojan];

    /// The profile's name as [`FromStr`] accepts it.
    pub const fn name(self) -> &'static str {
        match self {
            Profile::Long => "long",
            Profile::Short => "short",
            Profile::Mixed => "mixed",
            Profile::Uniform => "uniform",
            Profile::Scan => "scan",
            Profile::Trojan => "trojan",
        }
    }

    /// Typical packets per flow (the mean of the shape): lets a caller that knows only the number
    /// of flows pick a number of packets.
    pub const fn typical_packets_per_flow(self) -> u64 {
        match self {
            Profile::Long => 10_000,
            Profile::Short => 100,
            // Bounded Pareto, α = 1, on [10, 1000]: mean = 10·1000/990 · ln 100 ≈ 46.5.
            Profile::Mixed | Profile::Scan => 47,
            Profile::Uniform => 1,
            Profile::Trojan => 60,
        }
    }
}

impl fmt::Display for Profile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Profile {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        Profile::ALL
            .into_iter()
            .chain(Profile::SCENARIOS)
            .find(|p| p.name().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| Error::Option {
                name: "profile",
                reason: format!(
                    "unknown profile {s:?}; expected one of long, short, mixed, uniform, scan, trojan"
                ),
            })
    }
}

/// Distribution of the frame sizes of packets that carry data (Ethernet header to payload
/// end, without FCS).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SizeDist {
    /// Every frame this long.
    Fixed(u16),
    /// Uniform on `min..=max`.
    Uniform {
        /// Shortest frame.
        min: u16,
        /// Longest frame.
        max: u16,
    },
    /// Simple IMIX: 7 : 4 : 1 of 40-, 576- and 1500-byte IP packets, i.e. 60- (padded), 590-
    /// and 1514-byte frames.
    Imix,
}

impl SizeDist {
    /// Shortest frame size accepted (64 bytes on the wire with the FCS).
    pub const MIN_FRAME: u16 = 60;
    /// Longest frame size accepted: a 1500-byte IP packet in an untagged frame.
    pub const MAX_FRAME: u16 = 1514;

    fn sample(&self, rng: &mut impl Rng) -> usize {
        match *self {
            SizeDist::Fixed(n) => usize::from(n),
            SizeDist::Uniform { min, max } => {
                usize::from(min) + rng.below(u64::from(max - min) + 1) as usize
            }
            SizeDist::Imix => match rng.below(12) {
                0..=6 => 60,
                7..=10 => 590,
                _ => 1514,
            },
        }
    }

    fn validate(&self) -> Result<()> {
        let (min, max) = match *self {
            SizeDist::Fixed(n) => (n, n),
            SizeDist::Uniform { min, max } => (min, max),
            SizeDist::Imix => return Ok(()),
        };
        if min > max {
            return Err(Error::Option {
                name: "packet_size",
                reason: format!("range {min}-{max} is empty"),
            });
        }
        if min < Self::MIN_FRAME || max > Self::MAX_FRAME {
            return Err(Error::Option {
                name: "packet_size",
                reason: format!(
                    "{self} is outside {}-{} (frame bytes without the 4-byte FCS)",
                    Self::MIN_FRAME,
                    Self::MAX_FRAME
                ),
            });
        }
        Ok(())
    }
}

impl fmt::Display for SizeDist {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SizeDist::Fixed(n) => write!(f, "{n}"),
            SizeDist::Uniform { min, max } => write!(f, "{min}-{max}"),
            SizeDist::Imix => f.write_str("imix"),
        }
    }
}

impl FromStr for SizeDist {
    type Err = Error;

    /// `imix`, a size (`60`), or a range (`60-1514`).
    fn from_str(s: &str) -> Result<Self> {
        let bad = || Error::Option {
            name: "packet_size",
            reason: format!("{s:?} is not a size (\"60\"), a range (\"60-1514\") or \"imix\""),
        };
        let s = s.trim();
        let dist = if s.eq_ignore_ascii_case("imix") {
            SizeDist::Imix
        } else if let Some((a, b)) = s.split_once('-') {
            SizeDist::Uniform {
                min: a.trim().parse().map_err(|_| bad())?,
                max: b.trim().parse().map_err(|_| bad())?,
            }
        } else {
            SizeDist::Fixed(s.parse().map_err(|_| bad())?)
        };
        dist.validate()?;
        Ok(dist)
    }
}

/// Everything that determines a synthetic trace.
#[derive(Debug, Clone, PartialEq)]
pub struct SynthConfig {
    /// The profile.
    pub profile: Profile,
    /// Number of flows (distinct 5-tuples), 1 to 2³² − 1.
    pub flows: u64,
    /// Number of packets in the trace.
    pub packets: u64,
    /// Seed: the same configuration and seed give the same bytes.
    pub seed: u64,
    /// Share of flows over IPv6, 0 to 1.
    pub ipv6_share: f64,
    /// Share of flows over TCP (the rest is UDP), 0 to 1.
    pub tcp_share: f64,
    /// Zipf exponent of flow popularity: a flow of popularity rank `r` gets a share of packets
    /// proportional to `r^-zipf_s` times its draw from the profile. 0 = no skew.
    pub zipf_s: f64,
    /// Frame sizes of packets that carry data.
    pub packet_size: SizeDist,
    /// Packet rate for timestamps: packets are `10⁹ / rate_pps` ns apart.
    pub rate_pps: f64,
    /// Timestamp of the first packet, ns.
    pub start_ns: u64,
    /// About how many flows are active at once; 0 = all flows start at the beginning.
    pub concurrency: u64,
    /// IPv4 clients' subnet.
    pub clients_v4: Ipv4Net,
    /// IPv4 servers' subnet.
    pub servers_v4: Ipv4Net,
    /// IPv6 clients' subnet.
    pub clients_v6: Ipv6Net,
    /// IPv6 servers' subnet.
    pub servers_v6: Ipv6Net,
    /// `scan` only: number of scanners, 1 to 200 (default 4).
    pub scanners: u64,
    /// `scan` only: first-contact probes per scanner; 0 (the default) = one per 5 flows of
    /// the trace shared among the scanners, 1 to 200 each.
    pub scan_probes: u64,
    /// Emit only the clients' packets (default `false`): the servers' packets are drawn as in
    /// the whole trace, so the clients' packets are the same bytes, but they are neither
    /// written nor emitted. `packets` still counts the whole trace (the progress counts
    /// both). For a chain whose outside is played by the reflect stage (`flowstate demo`).
    /// Not for the `scan` and `trojan` profiles.
    pub clients_only: bool,
}

impl Default for SynthConfig {
    /// The `mixed` profile's defaults.
    fn default() -> Self {
        SynthConfig::new(Profile::Mixed)
    }
}

impl SynthConfig {
    /// The defaults of `profile` (see the module documentation), seed 0, 1 Mpps from time 0.
    pub fn new(profile: Profile) -> Self {
        let (flows, packets, concurrency) = match profile {
            Profile::Long => (100, 1_000_000, 0),
            Profile::Short => (10_000, 1_000_000, 1_000),
            Profile::Mixed | Profile::Scan => (17_000, 800_000, 1_000),
            Profile::Uniform => (50_000, 50_000, 0),
            Profile::Trojan => (50, 3_000, 0),
        };
        let uniform = profile == Profile::Uniform;
        SynthConfig {
            profile,
            flows,
            packets,
            seed: 0,
            ipv6_share: if uniform { 0.0 } else { 0.1 },
            tcp_share: match profile {
                Profile::Long | Profile::Short => 1.0,
                Profile::Mixed | Profile::Scan => 0.8,
                Profile::Uniform => 0.0,
                Profile::Trojan => 1.0,
            },
            zipf_s: 0.0,
            packet_size: if uniform {
                SizeDist::Fixed(60)
            } else {
                SizeDist::Imix
            },
            rate_pps: 1_000_000.0,
            start_ns: 0,
            concurrency,
            clients_v4: Ipv4Net::new_assert(Ipv4Addr::new(10, 0, 0, 0), 8),
            servers_v4: Ipv4Net::new_assert(Ipv4Addr::new(198, 51, 100, 0), 24),
            clients_v6: Ipv6Net::new_assert(Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 0), 8),
            servers_v6: Ipv6Net::new_assert(Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0), 32),
            scanners: 4,
            scan_probes: 0,
            clients_only: false,
        }
    }

    /// The fewest packets `flows` whole flows need: 2 per flow (a UDP request and response;
    /// TCP flows, which need 7, turn into UDP flows when packets are short), 1 per flow for
    /// `uniform`.
    pub fn min_packets(&self) -> u64 {
        let per_flow = if self.profile == Profile::Uniform {
            1
        } else {
            UDP_MIN_PACKETS
        };
        self.flows.saturating_mul(per_flow)
    }

    /// Checks every option; the error names the option and what was expected.
    pub fn validate(&self) -> Result<()> {
        if self.clients_only && matches!(self.profile, Profile::Scan | Profile::Trojan) {
            return Err(Error::Option {
                name: "clients_only",
                reason: format!("not for the {} profile", self.profile),
            });
        }
        if self.profile == Profile::Scan {
            return ScanPart::plan(self).map(|_| ());
        }
        if self.profile == Profile::Trojan {
            return trojan::validate(self);
        }
        self.plan().map(|_| ())
    }

    /// Validates and works out the address plan.
    fn plan(&self) -> Result<AddressPlan> {
        let opt = |name: &'static str, reason: String| Err(Error::Option { name, reason });
        if self.flows == 0 {
            return opt("flows", "must be at least 1".into());
        }
        if self.flows > u64::from(u32::MAX) {
            return opt("flows", format!("must be at most {}", u32::MAX));
        }
        if self.packets < self.min_packets() {
            let why = if self.profile == Profile::Uniform {
                "one per flow"
            } else {
                "a request and a response per flow"
            };
            return opt(
                "packets",
                format!(
                    "profile {} with {} flows needs at least {} packets ({why}), got {}",
                    self.profile,
                    self.flows,
                    self.min_packets(),
                    self.packets
                ),
            );
        }
        for (name, v) in [
            ("ipv6_share", self.ipv6_share),
            ("tcp_share", self.tcp_share),
        ] {
            if !(0.0..=1.0).contains(&v) {
                return opt(name, format!("must be between 0 and 1, got {v}"));
            }
        }
        if !(self.zipf_s.is_finite() && self.zipf_s >= 0.0) {
            return opt(
                "zipf_s",
                format!("must be a finite number >= 0, got {}", self.zipf_s),
            );
        }
        if !(self.rate_pps.is_finite() && self.rate_pps > 0.0) {
            return opt(
                "rate_pps",
                format!("must be a finite number > 0, got {}", self.rate_pps),
            );
        }
        self.packet_size.validate()?;
        let v4 = Net::v4(self.clients_v4);
        let v4s = Net::v4(self.servers_v4);
        let v6 = Net::v6(self.clients_v6);
        let v6s = Net::v6(self.servers_v6);
        if v4.overlaps(&v4s) {
            return opt(
                "clients_v4",
                format!(
                    "{} overlaps the servers' {}",
                    self.clients_v4, self.servers_v4
                ),
            );
        }
        if v6.overlaps(&v6s) {
            return opt(
                "clients_v6",
                format!(
                    "{} overlaps the servers' {}",
                    self.clients_v6, self.servers_v6
                ),
            );
        }
        let uniform = self.profile == Profile::Uniform;
        let (port_lo, port_range) = if uniform {
            (1024, 64_512)
        } else {
            (32_768, 28_232)
        };
        // Families that may appear: both subnets of a family must offer hosts.
        let use_v4 = self.ipv6_share < 1.0;
        let use_v6 = self.ipv6_share > 0.0;
        let mut host_cap = u64::MAX;
        if use_v4 {
            host_cap = host_cap.min(v4.usable());
        }
        if use_v6 {
            host_cap = host_cap.min(v6.usable());
        }
        let per_host = if uniform { 1 } else { 4 };
        let hosts = host_cap.min(self.flows.div_ceil(per_host));
        if self.flows > hosts.saturating_mul(port_range) {
            return opt(
                "flows",
                format!(
                    "{} flows need more client (address, port) pairs than the client subnets \
                     offer ({} hosts x {port_range} ports)",
                    self.flows, hosts
                ),
            );
        }
        let server_cap = |n: &Net| {
            if uniform {
                n.usable().min(1 << 32)
            } else {
                n.usable().min(256)
            }
        };
        Ok(AddressPlan {
            hosts,
            port_lo,
            port_range,
            servers_v4: server_cap(&v4s),
            servers_v6: server_cap(&v6s),
            clients: [v4, v6],
            servers: [v4s, v6s],
        })
    }
}

// ---------------------------------------------------------------------------------------------
// Deterministic randomness

/// SplitMix64's output function (Steele, Lea, Flood 2014): a bijective 64-bit mixer.
#[inline]
fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A keyed hash of two words, for per-flow constants.
#[inline]
fn hash2(key: u64, a: u64, b: u64) -> u64 {
    mix64(key ^ mix64(a.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ mix64(b)))
}

/// Random numbers from a 64-bit generator.
trait Rng {
    fn next_u64(&mut self) -> u64;

    /// Uniform on `0..n` (n ≥ 1), by the multiply-high method.
    #[inline]
    fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// Uniform on [0, 1) with 53 bits.
    #[inline]
    fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// True with probability `p`.
    #[inline]
    fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }
}

/// SplitMix64: 8 bytes of state, one per active flow.
#[derive(Debug, Clone)]
struct SplitMix64(u64);

impl Rng for SplitMix64 {
    #[inline]
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        mix64(self.0)
    }
}

/// xoshiro256** (Blackman, Vigna 2018), seeded through SplitMix64: the sequential streams.
#[derive(Debug, Clone)]
struct Xoshiro256 {
    s: [u64; 4],
}

impl Xoshiro256 {
    fn new(seed: u64) -> Self {
        let mut sm = SplitMix64(seed);
        Xoshiro256 {
            s: [sm.next_u64(), sm.next_u64(), sm.next_u64(), sm.next_u64()],
        }
    }
}

impl Rng for Xoshiro256 {
    #[inline]
    fn next_u64(&mut self) -> u64 {
        let s = &mut self.s;
        let result = s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }
}

/// A keyed bijection on `k`-bit integers (`x < 2^k`, `k ≤ 64`): rounds of add, multiply by an
/// odd constant and xor-shift, each invertible modulo `2^k`.
fn permute_bits(mut x: u64, k: u32, key: u64) -> u64 {
    if k == 0 {
        return 0;
    }
    let mask = if k == 64 { u64::MAX } else { (1u64 << k) - 1 };
    let shift = k.div_ceil(2);
    for round in 0..3u64 {
        let r = mix64(key ^ round);
        x = x.wrapping_add(r) & mask;
        x = x.wrapping_mul(r | 1) & mask;
        x ^= x >> shift;
    }
    x
}

/// A keyed bijection on `lo..=hi` (within `k` bits) by cycle walking.
fn permute_range(x: u64, lo: u64, hi: u64, k: u32, key: u64) -> u64 {
    let mut y = permute_bits(x, k, key);
    while y < lo || y > hi {
        y = permute_bits(y, k, key);
    }
    y
}

/// Bits needed to hold `n - 1` (n ≥ 1).
fn bits_for(n: u64) -> u32 {
    64 - (n.saturating_sub(1)).leading_zeros()
}

/// A keyed permutation of `0..n`.
fn permute_index(i: u64, n: u64, key: u64) -> u64 {
    permute_range(i, 0, n - 1, bits_for(n), key)
}

/// Natural logarithm from basic IEEE-754 operations only (so every platform rounds alike):
/// `x = m·2^e` with `m` in [√½, √2), then `ln m = 2 atanh((m−1)/(m+1))` by its series.
fn ln(x: f64) -> f64 {
    debug_assert!(x.is_finite() && x >= f64::MIN_POSITIVE);
    let bits = x.to_bits();
    let mut e = ((bits >> 52) & 0x7ff) as i64 - 1023;
    let mut m = f64::from_bits((bits & ((1u64 << 52) - 1)) | (1023u64 << 52));
    if m > core::f64::consts::SQRT_2 {
        m *= 0.5;
        e += 1;
    }
    let t = (m - 1.0) / (m + 1.0);
    let t2 = t * t;
    let mut term = t;
    let mut acc = 0.0;
    let mut k = 1.0;
    for _ in 0..16 {
        acc += term / k;
        term *= t2;
        k += 2.0;
    }
    e as f64 * core::f64::consts::LN_2 + 2.0 * acc
}

/// `e^x` from basic operations: `x = n·ln 2 + r`, Taylor series for `e^r`, times `2^n`.
fn exp(x: f64) -> f64 {
    if x < -745.0 {
        return 0.0;
    }
    if x > 709.0 {
        return f64::INFINITY;
    }
    let n = (x * core::f64::consts::LOG2_E + 0.5).floor();
    let r = x - n * core::f64::consts::LN_2;
    let mut term = 1.0;
    let mut acc = 1.0;
    for i in 1..=20 {
        term *= r / f64::from(i);
        acc += term;
    }
    // Scale by 2^n in steps that stay in the normal range.
    let mut n = n as i64;
    while n > 0 {
        let step = n.min(1000);
        acc *= f64::from_bits(((step + 1023) as u64) << 52);
        n -= step;
    }
    while n < 0 {
        let step = (-n).min(1000);
        acc *= f64::from_bits(((1023 - step) as u64) << 52);
        n += step;
    }
    acc
}

// ---------------------------------------------------------------------------------------------
// Addresses

/// A subnet as a 32- or 128-bit integer, for host numbering.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Net {
    /// Network bits (host bits cleared).
    base: u128,
    /// Address width: 32 or 128.
    width: u32,
    prefix: u32,
}

impl Net {
    fn v4(n: Ipv4Net) -> Self {
        Net::new(
            u128::from(u32::from(n.addr())),
            32,
            u32::from(n.prefix_len()),
        )
    }

    fn v6(n: Ipv6Net) -> Self {
        Net::new(u128::from(n.addr()), 128, u32::from(n.prefix_len()))
    }

    fn new(addr: u128, width: u32, prefix: u32) -> Self {
        let host = width - prefix;
        let mask = if host >= 128 {
            0
        } else {
            !((1u128 << host) - 1)
        };
        let full = if width == 128 {
            u128::MAX
        } else {
            (1u128 << width) - 1
        };
        Net {
            base: addr & mask & full,
            width,
            prefix,
        }
    }

    fn overlaps(&self, other: &Net) -> bool {
        let p = self.prefix.min(other.prefix);
        let host = self.width - p;
        let mask = if host >= 128 {
            0
        } else {
            !((1u128 << host) - 1)
        };
        self.base & mask == other.base & mask
    }

    /// Host bits that are numbered (at most 64; above that the rest are a seeded constant).
    fn host_bits(&self) -> u32 {
        (self.width - self.prefix).min(64)
    }

    /// Host numbers in use: all but the all-zeros and all-ones host when there are ≥ 4.
    fn usable(&self) -> u64 {
        match self.host_bits() {
            0 => 1,
            1 => 2,
            64 => u64::MAX - 1,
            k => (1u64 << k) - 2,
        }
    }

    /// The `h`-th host (`h < usable()`) under the permutation `key`.
    fn host(&self, h: u64, key: u64) -> u128 {
        let k = self.host_bits();
        let (lo, hi) = match k {
            0 | 1 => (0, if k == 0 { 0 } else { 1 }),
            64 => (1, u64::MAX - 1),
            _ => (1, (1u64 << k) - 2),
        };
        let low = permute_range(h + lo, lo, hi, k, key);
        // Host bits beyond the numbered 64 (IPv6 prefixes shorter than /64): a seeded constant,
        // like the random global ID of an RFC 4193 address.
        let total = self.width - self.prefix;
        let mid = if total > 64 {
            let extra = total - 64;
            let m = u128::from(mix64(key ^ 0x5eed)) & ((1u128 << extra) - 1);
            m << 64
        } else {
            0
        };
        self.base | mid | u128::from(low)
    }
}

/// How flows map to addresses and ports (see the module documentation).
#[derive(Debug, Clone)]
struct AddressPlan {
    hosts: u64,
    port_lo: u16,
    port_range: u64,
    servers_v4: u64,
    servers_v6: u64,
    /// [IPv4, IPv6].
    clients: [Net; 2],
    servers: [Net; 2],
}

/// Weighted server ports: (port, weight out of 100).
const TCP_PORTS: [(u16, u64); 8] = [
    (443, 55),
    (80, 25),
    (8080, 5),
    (22, 5),
    (25, 3),
    (993, 3),
    (3306, 2),
    (5432, 2),
];
const UDP_PORTS: [(u16, u64); 5] = [(53, 60), (443, 20), (123, 10), (3478, 5), (514, 5)];

fn weighted_port(table: &[(u16, u64)], r: u64) -> u16 {
    let mut x = r % 100;
    for &(port, w) in table {
        if x < w {
            return port;
        }
        x -= w;
    }
    table[0].0
}

/// Both ends of a flow.
#[derive(Debug, Clone, Copy)]
struct Endpoints {
    v6: bool,
    client: u128,
    server: u128,
    client_port: u16,
    server_port: u16,
}

// ---------------------------------------------------------------------------------------------
// The generator

/// Flow kind bits in [`Synthetic::kinds`].
const KIND_V6: u8 = 1;
const KIND_TCP: u8 = 2;

/// Purposes of keyed hashes and streams.
const K_SETUP: u64 = 0x5e70;
const K_ARRIVAL: u64 = 0xa441;
const K_RANK: u64 = 0x4a4b;
const K_REMAINDER: u64 = 0x4e3d;
const K_FLOW: u64 = 0xf10e;
const K_CLIENT: u64 = 0xc11e;
const K_SERVER: u64 = 0x5e4e;
const K_CLIENT6: u64 = 0xc116;
const K_SERVER6: u64 = 0x5e46;
const K_PORT: u64 = 0x9047;
const K_SIZES: u64 = 0x512e;
const K_APP: u64 = 0xa990;

/// Virtual ticks a flow lasts (before its ±25 % jitter).
const FLOW_TICKS: u64 = 1 << 40;

/// Where a TCP flow is in its exchange phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// The client sends a request next.
    Request,
    /// The server is sending a response burst.
    Response,
}

/// State of an active flow (104 bytes).
#[derive(Debug, Clone)]
struct FlowState {
    kind: u8,
    /// The flow's addresses and ports, and its per-flow seeds (header fields, application
    /// payloads): drawn once when it starts, not for each packet.
    ep: Endpoints,
    per_flow: u64,
    app_seed: u64,
    rng: SplitMix64,
    start: u64,
    ticks: u64,
    count: u64,
    sent: u64,
    /// Next sequence number to send, [client, server].
    nxt: [u32; 2],
    /// Timestamp clock offsets and the last TSval each side sent.
    ts_off: [u32; 2],
    ts_last: [u32; 2],
    phase: Phase,
    /// Server segments left in the current response.
    burst: u64,
    /// Server segments the client has not acknowledged yet.
    unacked: u8,
    /// Data lengths of TCP segments: a stream of its own, so that a response's segment
    /// lengths can be drawn ahead (a clone) when its request is made.
    sizes: SplitMix64,
    /// The exchange (client message and server response) in progress.
    msg: u32,
    /// Length of the server's response in progress, and how much of it was sent.
    resp_len: u32,
    resp_off: u32,
    /// Bytes the response needs beyond its segments' drawn lengths: the first segment
    /// carries them.
    extra: u32,
}

/// When a slot's next packet is due: kept apart from [`FlowState`] so that walking a calendar
/// bucket touches 16 bytes a flow.
#[derive(Debug, Clone, Copy)]
struct Due {
    /// Virtual time of the flow's next packet.
    time: u64,
    flow: u32,
    /// Next slot in the same calendar bucket ([`NONE`] ends the list).
    next: u32,
}

/// No slot.
const NONE: u32 = u32::MAX;

impl FlowState {
    /// Virtual time of packet `k`: `start + ticks·(k + jitter)/count`, non-decreasing in `k`.
    fn time_of(&mut self, k: u64) -> u64 {
        let j = self.rng.below(1 << 16);
        let num = u128::from(self.ticks) * (u128::from(k) << 16 | u128::from(j));
        let den = u128::from(self.count) << 16;
        // The same quotient by a 64-bit division when both fit (a 128-bit one is a call).
        let q = match (u64::try_from(num), u64::try_from(den)) {
            (Ok(n), Ok(d)) => n / d,
            _ => (num / den) as u64,
        };
        self.start.saturating_add(q)
    }
}

/// A deterministic synthetic traffic [`Source`] (see the module documentation).
pub struct Synthetic {
    config: SynthConfig,
    plan: AddressPlan,
    key: u64,
    /// Packets of each flow.
    counts: Vec<u64>,
    /// [`KIND_V6`] | [`KIND_TCP`] per flow.
    kinds: Vec<u8>,
    arrival_rng: Xoshiro256,
    arrival_span: u64,
    next_flow: u64,
    next_start: Option<u64>,
    slots: Vec<FlowState>,
    /// Per slot, beside `slots`.
    due: Vec<Due>,
    free: Vec<u32>,
    /// Pending packets, one per active flow, in a calendar queue (R. Brown, CACM 1988): buckets
    /// of `1 << width_shift` virtual ticks (a power of two, so that a packet's bucket is a
    /// shift), each a list of slots; the bucket being drained is a heap of (time, flow, slot),
    /// so packets leave in (time, flow) order, at O(1) amortised cost however many flows are
    /// active.
    width_shift: u32,
    buckets: Vec<u32>,
    /// The bucket being drained (`None` before the first).
    bucket: Option<usize>,
    heap: BinaryHeap<Reverse<(u64, u32, u32)>>,
    emitted: u64,
    period_ns: f64,
    scratch: Box<[u8; 2048]>,
    /// A packet's application payload, written here first.
    app_buf: Box<[u8; 2048]>,
    /// `scan`: the probes mixed into this generator's (normal) traffic.
    scan: Option<Box<ScanPart>>,
    /// A scenario profile's frames (time, bytes), sent instead of the flows'.
    scripted: Vec<trojan::Frame>,
}

impl fmt::Debug for Synthetic {
    /// The configuration and progress (not the per-flow tables).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Synthetic")
            .field("config", &self.config)
            .field("emitted", &self.emitted)
            .field("started_flows", &self.next_flow)
            .field("active_flows", &(self.slots.len() - self.free.len()))
            .finish_non_exhaustive()
    }
}

impl Synthetic {
    /// A generator for `config`, after [`SynthConfig::validate`]. Works out every flow's
    /// packet count (O(flows) time and memory); packets are made as they are received.
    pub fn new(config: SynthConfig) -> Result<Self> {
        if config.profile == Profile::Scan {
            let (normal, part) = ScanPart::plan(&config)?;
            let mut s = Synthetic::new(normal)?;
            s.scan = Some(Box::new(part));
            return Ok(s);
        }
        if config.profile == Profile::Trojan {
            trojan::validate(&config)?;
            let frames = trojan::frames(&config);
            // The flow machinery idles; the scripted frames are sent instead.
            let mut s = Synthetic::new(SynthConfig {
                profile: Profile::Short,
                flows: 1,
                packets: TCP_MIN_PACKETS,
                ..SynthConfig::new(Profile::Short)
            })?;
            s.config = SynthConfig {
                packets: frames.len() as u64,
                ..config
            };
            s.scripted = frames;
            return Ok(s);
        }
        let plan = config.plan()?;
        let key = mix64(config.seed ^ 0x666c_6f77_7374_6174);
        let n = config.flows;
        let uniform = config.profile == Profile::Uniform;

        // Kinds and shape weights, in flow order from one stream.
        let mut rng = Xoshiro256::new(key ^ K_SETUP);
        let mut kinds = Vec::with_capacity(n as usize);
        let mut weights = Vec::with_capacity(n as usize);
        let skew = config.zipf_s > 0.0;
        for i in 0..n {
            let mut kind = 0;
            if rng.chance(config.ipv6_share) {
                kind |= KIND_V6;
            }
            if rng.chance(config.tcp_share) {
                kind |= KIND_TCP;
            }
            kinds.push(kind);
            let u = rng.unit();
            let base = match config.profile {
                Profile::Long => 10_000.0 * (0.8 + 0.4 * u),
                Profile::Short => 100.0 * (0.8 + 0.4 * u),
                // Bounded Pareto with α = 1 on [10, 1000] by inversion:
                // x = L / (1 − u(1 − L/H)).
                Profile::Mixed | Profile::Scan => 10.0 / (1.0 - u * (1.0 - 10.0 / 1000.0)),
                Profile::Uniform | Profile::Trojan => 1.0,
            };
            let w = if skew {
                let rank = permute_index(i, n, key ^ K_RANK) + 1;
                base * exp(-config.zipf_s * ln(rank as f64))
            } else {
                base
            };
            weights.push(w);
        }

        // Minimums; turn TCP flows into UDP flows (last first) while they do not fit.
        let min_of = |kind: u8| {
            if uniform {
                1
            } else if kind & KIND_TCP != 0 {
                TCP_MIN_PACKETS
            } else {
                UDP_MIN_PACKETS
            }
        };
        let mut min_sum: u64 = kinds.iter().map(|&k| min_of(k)).sum();
        let mut i = kinds.len();
        while min_sum > config.packets && i > 0 {
            i -= 1;
            if kinds[i] & KIND_TCP != 0 {
                kinds[i] &= !KIND_TCP;
                min_sum -= TCP_MIN_PACKETS - UDP_MIN_PACKETS;
            }
        }
        let counts = allocate(&weights, &kinds, &min_of, config.packets, key);
        drop(weights);

        let concurrency = if config.concurrency == 0 {
            n
        } else {
            config.concurrency.min(n)
        };
        let arrival_span = if concurrency >= n {
            FLOW_TICKS / 16
        } else {
            let span = u128::from(FLOW_TICKS) * u128::from(n) / u128::from(concurrency);
            span.min(1 << 62) as u64
        };
        let reserve = (concurrency.saturating_mul(2).saturating_add(64)).min(n) as usize;
        // Every packet is due before the last flow's start plus the longest duration.
        let horizon = arrival_span + FLOW_TICKS / 4 * 5 + 1;
        let nbuckets = (config.packets / 32).clamp(1, 1 << 20);
        // A power of two (at most the even width), so that a packet's bucket is a shift.
        let width_shift = (horizon / nbuckets + 1).ilog2();
        let nbuckets = (horizon >> width_shift) + 1;
        Ok(Synthetic {
            period_ns: 1e9 / config.rate_pps,
            config,
            plan,
            key,
            counts,
            kinds,
            arrival_rng: Xoshiro256::new(key ^ K_ARRIVAL),
            arrival_span,
            next_flow: 0,
            next_start: None,
            slots: Vec::with_capacity(reserve),
            due: Vec::with_capacity(reserve),
            free: Vec::with_capacity(reserve),
            width_shift,
            buckets: vec![NONE; nbuckets as usize],
            bucket: None,
            heap: BinaryHeap::with_capacity(reserve),
            emitted: 0,
            scratch: Box::new([0u8; 2048]),
            app_buf: Box::new([0u8; 2048]),
            scan: None,
            scripted: Vec::new(),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &SynthConfig {
        match &self.scan {
            Some(s) => &s.config,
            None => &self.config,
        }
    }

    /// Packets the whole trace has: [`SynthConfig::packets`].
    pub fn total_packets(&self) -> u64 {
        self.config().packets
    }

    /// Packets generated so far (for a progress bar up to [`total_packets`](Self::total_packets)).
    pub fn progress(&self) -> u64 {
        self.emitted + self.scan.as_ref().map_or(0, |s| s.emitted)
    }

    /// The scanners of a `scan` trace (the ground truth), empty for other profiles.
    pub fn scanners(&self) -> Vec<ScannerTruth> {
        self.scan.as_ref().map_or_else(Vec::new, |s| s.truth())
    }

    /// Packets of flow `i` (flows are numbered in the order they start), if it exists.
    pub fn flow_packets(&self, i: u64) -> Option<u64> {
        self.counts.get(usize::try_from(i).ok()?).copied()
    }

    /// Writes the next packet into `buf` (or, when it is too short, a truncated copy) and sets
    /// `meta`; returns the stored length, `None` for a server's packet left out
    /// ([`SynthConfig::clients_only`]). The trace must not be exhausted.
    fn emit(&mut self, buf: &mut [u8], meta: &mut PacketMeta) -> Option<usize> {
        let slot = self.pop_due();
        let index = self.progress();
        let ts_ns = self
            .config
            .start_ns
            .saturating_add((index as f64 * self.period_ns) as u64);
        self.emitted += 1;
        let written = self.write_packet(slot as usize, ts_ns, buf);
        let state = &mut self.slots[slot as usize];
        state.sent += 1;
        if state.sent < state.count {
            let t = state.time_of(state.sent);
            self.schedule(slot, t);
        } else {
            self.free.push(slot);
        }
        let (len, wire_len) = written?;
        *meta = PacketMeta {
            timestamp_ns: ts_ns,
            wire_len: wire_len as u32,
            ..PacketMeta::default()
        };
        Some(len)
    }

    /// The slot of the flow whose packet is due next: the least (time, flow).
    fn pop_due(&mut self) -> u32 {
        loop {
            if let Some(Reverse((_, _, slot))) = self.heap.pop() {
                return slot;
            }
            // Enter the next bucket: its list goes into the heap, then every flow that starts
            // before the bucket ends is activated (its packets are due no earlier than its start).
            let b = self.bucket.map_or(0, |b| b + 1);
            assert!(b < self.buckets.len(), "packets remain, so some are due");
            self.bucket = Some(b);
            let mut slot = std::mem::replace(&mut self.buckets[b], NONE);
            while slot != NONE {
                let d = self.due[slot as usize];
                self.heap.push(Reverse((d.time, d.flow, slot)));
                slot = d.next;
            }
            let last = b + 1 == self.buckets.len();
            let end = (b as u64 + 1).saturating_mul(1 << self.width_shift);
            while self.next_flow < self.config.flows {
                let start = self.next_start();
                if start >= end && !last {
                    break;
                }
                self.next_start = None;
                let flow = self.next_flow as u32;
                self.next_flow += 1;
                self.activate(flow, start);
            }
        }
    }

    /// Queues the slot's next packet, due at `time`.
    fn schedule(&mut self, slot: u32, time: u64) {
        let d = &mut self.due[slot as usize];
        d.time = time;
        let b = ((time >> self.width_shift) as usize).min(self.buckets.len() - 1);
        match self.bucket {
            Some(cur) if b <= cur => self.heap.push(Reverse((time, d.flow, slot))),
            _ => {
                d.next = self.buckets[b];
                self.buckets[b] = slot;
            }
        }
    }

    /// Start time of flow `next_flow`: flows start in order, spread over the arrival span.
    fn next_start(&mut self) -> u64 {
        if let Some(s) = self.next_start {
            return s;
        }
        let n = self.config.flows;
        let u = self.arrival_rng.below(1 << 16);
        let pos = u128::from(self.next_flow) << 16 | u128::from(u);
        let s = (pos * u128::from(self.arrival_span) / (u128::from(n) << 16)) as u64;
        self.next_start = Some(s);
        s
    }

    fn activate(&mut self, flow: u32, start: u64) {
        let i = flow as usize;
        let mut rng = SplitMix64(hash2(self.key, K_FLOW, u64::from(flow)));
        let ticks = if self.config.profile == Profile::Uniform {
            FLOW_TICKS
        } else {
            FLOW_TICKS / 4 * 3 + rng.below(FLOW_TICKS / 2)
        };
        let isn = rng.next_u64();
        let ts = rng.next_u64();
        let kind = self.kinds[i];
        let mut state = FlowState {
            kind,
            ep: self.endpoints(flow, kind),
            per_flow: hash2(self.key, K_FLOW ^ 1, u64::from(flow)),
            app_seed: hash2(self.key, K_APP, u64::from(flow)),
            rng,
            start,
            ticks,
            count: self.counts[i],
            sent: 0,
            nxt: [isn as u32, (isn >> 32) as u32],
            ts_off: [ts as u32, (ts >> 32) as u32],
            ts_last: [0; 2],
            phase: Phase::Request,
            burst: 0,
            unacked: 0,
            sizes: SplitMix64(hash2(self.key, K_SIZES, u64::from(flow))),
            msg: 0,
            resp_len: 0,
            resp_off: 0,
            extra: 0,
        };
        let t = state.time_of(0);
        let due = Due {
            time: t,
            flow,
            next: NONE,
        };
        let slot = match self.free.pop() {
            Some(s) => {
                self.slots[s as usize] = state;
                self.due[s as usize] = due;
                s
            }
            None => {
                self.slots.push(state);
                self.due.push(due);
                (self.slots.len() - 1) as u32
            }
        };
        self.schedule(slot, t);
    }

    /// Addresses and ports of flow `flow`.
    fn endpoints(&self, flow: u32, kind: u8) -> Endpoints {
        let p = &self.plan;
        let i = u64::from(flow);
        let host = i % p.hosts;
        let slot = i / p.hosts;
        let offset = hash2(self.key, K_PORT, host) % p.port_range;
        let client_port = p.port_lo + ((slot + offset) % p.port_range) as u16;
        let v6 = kind & KIND_V6 != 0;
        let fam = usize::from(v6);
        let (ck, sk, nservers) = if v6 {
            (K_CLIENT6, K_SERVER6, p.servers_v6)
        } else {
            (K_CLIENT, K_SERVER, p.servers_v4)
        };
        let client = p.clients[fam].host(host, self.key ^ ck);
        let r = hash2(self.key, K_SERVER, i);
        let server = p.servers[fam].host((r >> 32) % nservers, self.key ^ sk);
        let server_port = if self.config.profile == Profile::Uniform {
            1 + (r % 65_535) as u16
        } else if kind & KIND_TCP != 0 {
            weighted_port(&TCP_PORTS, r)
        } else {
            weighted_port(&UDP_PORTS, r)
        };
        Endpoints {
            v6,
            client,
            server,
            client_port,
            server_port,
        }
    }

    /// Writes packet `sent` of the flow in `slot`; returns (stored, wire) lengths.
    fn write_packet(&mut self, slot: usize, ts_ns: u64, buf: &mut [u8]) -> Option<(usize, usize)> {
        let clients_only = self.config.clients_only;
        let profile = self.config.profile;
        let sizes = self.config.packet_size;
        let st = &mut self.slots[slot];
        let (kind, ep, per_flow, app_seed) = (st.kind, st.ep, st.per_flow, st.app_seed);
        let k = st.sent;
        let app_buf = &mut *self.app_buf;

        // (from client?, transport, payload)
        let (from_client, l4, payload) = if profile == Profile::Uniform {
            let from_client = st.rng.below(2) == 0;
            let side = usize::from(!from_client);
            let hdr = header_len(ep.v6, kind & KIND_TCP != 0, 0);
            let len = sizes.sample(&mut st.rng).saturating_sub(hdr);
            let (sp, dp) = ports(&ep, from_client);
            if kind & KIND_TCP != 0 {
                let seq = st.nxt[side];
                st.nxt[side] = seq.wrapping_add(len as u32);
                let tcp = TcpSpec {
                    src_port: sp,
                    dst_port: dp,
                    seq,
                    ack: st.nxt[1 - side],
                    flags: tcp_flags::PSH | tcp_flags::ACK,
                    window: 502,
                    urgent: 0,
                    options: TcpOptions::NONE,
                };
                let payload = Payload::Counter {
                    len,
                    start: seq as u8,
                };
                (from_client, L4Spec::Tcp(tcp), payload)
            } else {
                let udp = UdpSpec {
                    src_port: sp,
                    dst_port: dp,
                };
                let payload = Payload::Counter {
                    len,
                    start: k as u8,
                };
                (from_client, L4Spec::Udp(udp), payload)
            }
        } else if kind & KIND_TCP != 0 {
            let proto = Proto::of(true, ep.server_port);
            tcp_segment(
                st,
                &ep,
                sizes,
                ts_ns,
                proto,
                app_seed,
                app_buf,
                clients_only,
            )
        } else {
            let from_client = k.is_multiple_of(2);
            let hdr = header_len(ep.v6, false, 0);
            let len = sizes.sample(&mut st.rng).saturating_sub(hdr).max(1);
            let (sp, dp) = ports(&ep, from_client);
            let udp = UdpSpec {
                src_port: sp,
                dst_port: dp,
            };
            let proto = Proto::of(false, ep.server_port);
            let payload = if proto == Proto::Counter || (clients_only && !from_client) {
                Payload::Counter {
                    len,
                    start: (per_flow as u8).wrapping_add(k as u8),
                }
            } else {
                let client = app::Client {
                    v6: ep.v6,
                    addr: ep.client,
                    port: ep.client_port,
                };
                let n = app::udp_write(proto, k, len, app_seed, client, &mut app_buf[..]);
                Payload::Bytes(&app_buf[..n])
            };
            (from_client, L4Spec::Udp(udp), payload)
        };
        if clients_only && !from_client {
            return None;
        }

        // Network layer: per-side TTL / hop limit, IPv4 id counting per flow, RFC 6437 labels.
        let hops = 1 + (per_flow >> 8) as u8 % 20;
        let ttl = if from_client { 64 } else { 64 - hops };
        let ip = if ep.v6 {
            let (c, s) = (Ipv6Addr::from(ep.client), Ipv6Addr::from(ep.server));
            let (src, dst) = if from_client { (c, s) } else { (s, c) };
            let label = (per_flow >> if from_client { 16 } else { 36 }) as u32 & 0xf_ffff;
            IpSpec::V6(Ipv6Spec {
                hop_limit: ttl,
                flow_label: label,
                ..Ipv6Spec::new(src, dst)
            })
        } else {
            let (c, s) = (
                Ipv4Addr::from(ep.client as u32),
                Ipv4Addr::from(ep.server as u32),
            );
            let (src, dst) = if from_client { (c, s) } else { (s, c) };
            IpSpec::V4(Ipv4Spec {
                ttl,
                id: ((per_flow >> 40) as u16).wrapping_add(k as u16),
                ..Ipv4Spec::new(src, dst)
            })
        };
        let ethernet = if from_client {
            EthernetSpec::new(CLIENT_MAC, SERVER_MAC)
        } else {
            EthernetSpec::new(SERVER_MAC, CLIENT_MAC)
        };
        let spec = FrameSpec {
            ethernet,
            ip,
            l4,
            payload,
            min_len: ETHERNET_MIN_LEN,
        };
        let wire = spec.frame_len();
        Some(if buf.len() >= wire {
            let n = spec.write(buf).unwrap_or(0);
            (n, n)
        } else {
            // A buffer shorter than the frame keeps its first bytes, as a capture with a snap
            // length would; `wire_len` tells the full length.
            let n = spec.write(&mut self.scratch[..]).unwrap_or(0);
            let stored = n.min(buf.len());
            buf[..stored].copy_from_slice(&self.scratch[..stored]);
            (stored, n)
        })
    }
}

/// (source, destination) ports of a packet in the given direction.
fn ports(ep: &Endpoints, from_client: bool) -> (u16, u16) {
    if from_client {
        (ep.client_port, ep.server_port)
    } else {
        (ep.server_port, ep.client_port)
    }
}

/// Ethernet + IP + transport header bytes (TCP with `tcp_options` option bytes).
fn header_len(v6: bool, tcp: bool, tcp_options: usize) -> usize {
    14 + if v6 { 40 } else { 20 } + if tcp { 20 + tcp_options } else { 8 }
}

/// The next segment of a whole TCP flow (see the module documentation).
#[allow(clippy::too_many_arguments)]
fn tcp_segment<'a>(
    st: &mut FlowState,
    ep: &Endpoints,
    sizes: SizeDist,
    ts_ns: u64,
    proto: Proto,
    seed: u64,
    out: &'a mut [u8; 2048],
    clients_only: bool,
) -> (bool, L4Spec, Payload<'a>) {
    use tcp_flags::{ACK, FIN, PSH, SYN};
    let k = st.sent;
    let c = st.count;
    let ms = (ts_ns / 1_000_000) as u32;
    let data_hdr = header_len(ep.v6, true, 12);
    let mss: u16 = if ep.v6 { 1440 } else { 1460 };

    // (from client, flags, payload length, SYN options?)
    let (from_client, flags, len, syn) = if k == 0 {
        (true, SYN, 0, true)
    } else if k == 1 {
        (false, SYN | ACK, 0, true)
    } else if k == 2 {
        (true, ACK, 0, false)
    } else if k + 4 >= c {
        match c - k {
            4 => (true, FIN | ACK, 0, false),
            3 => (false, ACK, 0, false),
            2 => (false, FIN | ACK, 0, false),
            _ => (true, ACK, 0, false),
        }
    } else if st.phase == Phase::Request {
        let drawn = sizes.sample(&mut st.sizes).saturating_sub(data_hdr).max(1);
        let msg = u64::from(st.msg);
        let len = app::client_len(proto, msg, drawn, seed);
        app::client_write(proto, msg, len, seed, &mut out[..]);
        // Data packets left after this request, of which about two thirds can be server
        // segments (the client acknowledges every second one): b segments and ⌊(b − 1)/2⌋
        // ACKs fit, so every response is whole.
        let left = c - 4 - k - 1;
        if left > 0 {
            st.burst = 1 + st.rng.below((2 * left / 3).max(1));
            st.phase = Phase::Response;
            st.unacked = 0;
            if proto != Proto::Counter {
                // The response's length is known now: its segments' lengths, drawn ahead.
                let mut ahead = st.sizes.clone();
                let drawn: usize = (0..st.burst)
                    .map(|_| sizes.sample(&mut ahead).saturating_sub(data_hdr).max(1))
                    .sum();
                let total = app::server_len(proto, msg, drawn, seed);
                st.resp_len = total as u32;
                st.resp_off = 0;
                st.extra = (total - drawn) as u32;
            }
        } else {
            st.msg += 1;
        }
        (true, PSH | ACK, len, false)
    } else if st.unacked >= 2 {
        st.unacked = 0;
        (true, ACK, 0, false)
    } else {
        let drawn = sizes.sample(&mut st.sizes).saturating_sub(data_hdr).max(1);
        let len = drawn + std::mem::take(&mut st.extra) as usize;
        if proto != Proto::Counter && !clients_only {
            let (msg, total, off) = (u64::from(st.msg), st.resp_len as usize, st.resp_off);
            app::server_write(proto, msg, total, seed, off as usize, &mut out[..len]);
            st.resp_off += len as u32;
        }
        st.burst -= 1;
        st.unacked += 1;
        let last = st.burst == 0;
        if last {
            st.phase = Phase::Request;
            st.msg += 1;
        }
        (false, if last { PSH | ACK } else { ACK }, len, false)
    };

    let side = usize::from(!from_client);
    let tsval = st.ts_off[side].wrapping_add(ms);
    let tsecr = if k == 0 { 0 } else { st.ts_last[1 - side] };
    st.ts_last[side] = tsval;
    let seq = st.nxt[side];
    let ack = if flags & ACK != 0 {
        st.nxt[1 - side]
    } else {
        0
    };
    let advance = len as u32 + u32::from(flags & (SYN | FIN) != 0);
    st.nxt[side] = seq.wrapping_add(advance);
    let options = if syn {
        TcpOptions {
            mss: Some(mss),
            window_scale: Some(7),
            sack_permitted: true,
            timestamps: Some((tsval, tsecr)),
        }
    } else {
        TcpOptions {
            timestamps: Some((tsval, tsecr)),
            ..TcpOptions::NONE
        }
    };
    let window = match (syn, from_client) {
        (true, true) => 64_240,
        (true, false) => 65_160,
        (false, true) => 502,
        (false, false) => 509,
    };
    let (src_port, dst_port) = ports(ep, from_client);
    let tcp = TcpSpec {
        src_port,
        dst_port,
        seq,
        ack,
        flags,
        window,
        urgent: 0,
        options,
    };
    // Counter: the first payload byte is at sequence number `seq`, byte s of the stream is
    // s mod 256.
    let payload = if proto == Proto::Counter {
        Payload::Counter {
            len,
            start: seq as u8,
        }
    } else {
        let out: &'a [u8] = out;
        Payload::Bytes(&out[..len])
    };
    (from_client, L4Spec::Tcp(tcp), payload)
}

/// Per-flow packet counts: `max(min, ⌊λ·w⌋)` summing to exactly `total` (see the module docs).
fn allocate(
    weights: &[f64],
    kinds: &[u8],
    min_of: &dyn Fn(u8) -> u64,
    total: u64,
    key: u64,
) -> Vec<u64> {
    let count =
        |lambda: f64, i: usize| -> u64 { min_of(kinds[i]).max((lambda * weights[i]) as u64) };
    let sum = |lambda: f64| -> u64 {
        (0..weights.len()).fold(0u64, |acc, i| acc.saturating_add(count(lambda, i)))
    };
    let max_w = weights.iter().copied().fold(0.0f64, f64::max);
    let mut lo = 0.0f64;
    let mut hi = if max_w > 0.0 {
        (total as f64 + 1.0) / max_w * 1.000_001
    } else {
        0.0
    };
    // S(lo) <= total <= S(hi) (S(hi) may stay below only if every weight is 0).
    if sum(lo) < total && max_w > 0.0 {
        for _ in 0..200 {
            let mid = lo + (hi - lo) / 2.0;
            if mid <= lo || mid >= hi {
                break;
            }
            let s = sum(mid);
            if s <= total {
                lo = mid;
                if s == total {
                    break;
                }
            } else {
                hi = mid;
            }
        }
    }
    let mut counts: Vec<u64> = (0..weights.len()).map(|i| count(lo, i)).collect();
    let mut left = total - counts.iter().sum::<u64>();
    // Hand out what is left in a seeded order: first to flows that would grow at `hi`, then
    // (only if every weight is zero) one by one round the flows.
    let n = weights.len() as u64;
    for j in 0..n {
        if left == 0 {
            break;
        }
        let i = permute_index(j, n, key ^ K_REMAINDER) as usize;
        let extra = count(hi, i).saturating_sub(counts[i]).min(left);
        counts[i] += extra;
        left -= extra;
    }
    while left > 0 {
        for j in 0..n {
            if left == 0 {
                break;
            }
            let i = permute_index(j, n, key ^ K_REMAINDER) as usize;
            counts[i] += 1;
            left -= 1;
        }
    }
    counts
}

// ---------------------------------------------------------------------------------------------
// Scans

/// Outside scanners' subnet: 192.0.2.0/24 (TEST-NET-1, RFC 5737), hosts .10 up.
const OUTSIDE_SCANNERS: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 0);
/// Ports a scanner probes: 1..=SCAN_PORTS.
const SCAN_PORTS: u64 = 1024;
const K_SCAN: u64 = 0x5ca9;
const K_SCAN_OUTCOME: u64 = 0x5ca0;

/// One scanner of a `scan` trace: the ground truth a detector is checked against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScannerTruth {
    /// Its address.
    pub addr: std::net::IpAddr,
    /// Whether it is an inside host (in `clients_v4`, scanning the servers' subnet outward);
    /// otherwise an outside host (192.0.2.0/24) scanning the clients' subnet.
    pub inside: bool,
    /// Sequential (hosts in order, ports 1, 2, ... on each) or random (host, port) order.
    pub sequential: bool,
    /// First-contact probes it sends.
    pub probes: u64,
    /// Probes answered by SYN/ACK (open ports).
    pub open: u64,
    /// Probes answered by RST (closed ports).
    pub closed: u64,
    /// Probes never answered (filtered).
    pub unanswered: u64,
}

/// The ground truth of a `scan` configuration (empty for other profiles), without
/// generating the trace.
pub fn scan_truth(config: &SynthConfig) -> Result<Vec<ScannerTruth>> {
    if config.profile != Profile::Scan {
        return Ok(Vec::new());
    }
    Ok(ScanPart::plan(config)?.1.truth())
}

/// The ground truth as JSON (what `flowstate gen` writes beside a `scan` capture as
/// `FILE.truth.json`): `{"profile": "scan", "seed": S, "scanners": [{"addr", "inside",
/// "sequential", "probes", "open", "closed", "unanswered"}, ...]}`.
pub fn truth_json(config: &SynthConfig, scanners: &[ScannerTruth]) -> String {
    let mut out = format!(
        "{{\"profile\":\"{}\",\"seed\":{},\"flows\":{},\"packets\":{},\"scanners\":[",
        config.profile, config.seed, config.flows, config.packets
    );
    for (i, t) in scanners.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(&format!(
            "{{\"addr\":\"{}\",\"inside\":{},\"sequential\":{},\"probes\":{},\"open\":{},\
             \"closed\":{},\"unanswered\":{}}}",
            t.addr, t.inside, t.sequential, t.probes, t.open, t.closed, t.unanswered
        ));
    }
    out.push_str("]}\n");
    out
}

/// What a probe's target answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum Outcome {
    /// SYN/ACK, then the scanner's RST (a half-open SYN scan): 3 packets.
    Open = 3,
    /// RST/ACK: 2 packets.
    Closed = 2,
    /// Nothing: 1 packet.
    Filtered = 1,
}

/// One probe: scanner `scanner` to `target:port`.
#[derive(Debug, Clone, Copy)]
struct Probe {
    source: u32,
    target: u32,
    sport: u16,
    port: u16,
    /// The scanner's index, or [`BENIGN`].
    scanner: u8,
    outcome: Outcome,
}

/// [`Probe::scanner`] of a normal client's failed attempt.
const BENIGN: u8 = u8::MAX;
/// Client ports of normal clients' failed attempts: above the normal flows' ephemeral range.
const BENIGN_PORT_LO: u16 = 61_000;
const K_BENIGN: u64 = 0xbe11;

/// The scanners and their probes, mixed into a normal (`mixed`) trace.
#[derive(Debug)]
struct ScanPart {
    /// The whole trace's configuration (profile `scan`).
    config: SynthConfig,
    /// Scanner addresses (IPv4), and whether each is inside.
    scanners: Vec<(u32, bool)>,
    /// Probes in trace order (round robin over the scanners).
    probes: Vec<Probe>,
    /// Packets of all probes.
    packets: u64,
    /// Probe packets emitted.
    emitted: u64,
    /// The probe being sent and how many of its packets went.
    next: usize,
    step: u8,
}

impl ScanPart {
    /// Splits `config` into the normal traffic's configuration and the scan part.
    fn plan(config: &SynthConfig) -> Result<(SynthConfig, ScanPart)> {
        let opt = |name: &'static str, reason: String| Err(Error::Option { name, reason });
        let s = config.scanners;
        if !(1..=200).contains(&s) {
            return opt("scanners", format!("must be 1 to 200, got {s}"));
        }
        let per = if config.scan_probes == 0 {
            (config.flows / 5 / s).clamp(1, 200)
        } else {
            config.scan_probes
        };
        if !(1..=200).contains(&per) {
            return opt(
                "scan_probes",
                format!("must be 1 to 200 per scanner, got {per}"),
            );
        }
        let probe_flows = s * per;
        // Normal clients' failed attempts (a closed port: RST), one per 4 probes.
        let benign = (probe_flows / 4).min(4_500);
        if probe_flows + benign >= config.flows {
            return opt(
                "flows",
                format!(
                    "profile scan with {s} scanners of {per} probes needs more than {} flows, \
                     got {}",
                    probe_flows + benign,
                    config.flows
                ),
            );
        }
        let outside = Net::v4(Ipv4Net::new_assert(OUTSIDE_SCANNERS, 24));
        for (name, n) in [
            ("clients_v4", config.clients_v4),
            ("servers_v4", config.servers_v4),
        ] {
            if Net::v4(n).overlaps(&outside) {
                return opt(
                    name,
                    format!("{n} overlaps the outside scanners' 192.0.2.0/24 (profile scan)"),
                );
            }
        }
        let key = mix64(config.seed ^ 0x666c_6f77_7374_6174);
        // Probe outcomes first: they fix the packet count, which the normal part gets the
        // rest of.
        let mut outcomes = Vec::with_capacity(probe_flows as usize);
        let mut packets = benign * Outcome::Closed as u64;
        for q in 0..probe_flows {
            let o = match hash2(key, K_SCAN_OUTCOME, q) % 100 {
                0..=9 => Outcome::Open,
                10..=69 => Outcome::Closed,
                _ => Outcome::Filtered,
            };
            packets += o as u64;
            outcomes.push(o);
        }
        let normal = SynthConfig {
            profile: Profile::Mixed,
            flows: config.flows - probe_flows - benign,
            packets: config.packets.saturating_sub(packets),
            ..config.clone()
        };
        let plan = normal.plan().map_err(|e| match e {
            Error::Option { name, reason } => Error::Option {
                name,
                reason: format!(
                    "{reason} (profile scan: {} of the flows and {packets} of the packets are \
                     the scanners' and failed attempts')",
                    probe_flows + benign
                ),
            },
            other => other,
        })?;
        let clients = Net::v4(config.clients_v4);
        let servers = Net::v4(config.servers_v4);
        if clients.usable() < plan.hosts.saturating_add(s) {
            return opt(
                "clients_v4",
                format!(
                    "{} has too few hosts for the clients and {s} inside scanners",
                    config.clients_v4
                ),
            );
        }
        let scanners: Vec<(u32, bool)> = (0..s)
            .map(|i| {
                if i % 2 == 0 {
                    (clients.host(plan.hosts + i, key ^ K_CLIENT) as u32, true)
                } else {
                    (u32::from(OUTSIDE_SCANNERS) + 10 + i as u32, false)
                }
            })
            .collect();
        // Inside scanners probe the servers' subnet, outside ones the clients' hosts.
        let server_hosts = servers.usable().min(256);
        let client_hosts = plan.hosts.min(clients.usable());
        let mut probes = Vec::with_capacity((probe_flows + benign) as usize);
        let mut benign_made = 0;
        for (q, outcome) in outcomes.into_iter().enumerate() {
            let q = q as u64;
            let (i, j) = (q % s, q / s);
            let (inside, sequential) = (i % 2 == 0, (i / 2) % 2 == 0);
            let hosts = if inside { server_hosts } else { client_hosts };
            let space = hosts * SCAN_PORTS;
            let t = if sequential {
                j % space
            } else {
                permute_index(j % space, space, key ^ K_SCAN ^ i)
            };
            let (h, port) = (t / SCAN_PORTS, 1 + t % SCAN_PORTS);
            let target = if inside {
                servers.host(h, key ^ K_SERVER)
            } else {
                clients.host(h, key ^ K_CLIENT)
            } as u32;
            probes.push(Probe {
                source: scanners[i as usize].0,
                target,
                sport: 40_000 + i as u16,
                port: port as u16,
                scanner: i as u8,
                outcome,
            });
            if q % 4 == 3 && benign_made < benign {
                // A normal client tries a closed port of a server.
                let r = hash2(key, K_BENIGN, benign_made);
                probes.push(Probe {
                    source: clients.host((r >> 8) % client_hosts, key ^ K_CLIENT) as u32,
                    target: servers.host((r >> 40) % server_hosts, key ^ K_SERVER) as u32,
                    sport: BENIGN_PORT_LO + (benign_made % 4_500) as u16,
                    port: 1 + (r % SCAN_PORTS) as u16,
                    scanner: BENIGN,
                    outcome: Outcome::Closed,
                });
                benign_made += 1;
            }
        }
        Ok((
            normal,
            ScanPart {
                config: config.clone(),
                scanners,
                probes,
                packets,
                emitted: 0,
                next: 0,
                step: 0,
            },
        ))
    }

    fn truth(&self) -> Vec<ScannerTruth> {
        let mut out: Vec<ScannerTruth> = self
            .scanners
            .iter()
            .enumerate()
            .map(|(i, &(a, inside))| ScannerTruth {
                addr: Ipv4Addr::from(a).into(),
                inside,
                sequential: (i / 2) % 2 == 0,
                probes: 0,
                open: 0,
                closed: 0,
                unanswered: 0,
            })
            .collect();
        for p in self.probes.iter().filter(|p| p.scanner != BENIGN) {
            let t = &mut out[usize::from(p.scanner)];
            t.probes += 1;
            match p.outcome {
                Outcome::Open => t.open += 1,
                Outcome::Closed => t.closed += 1,
                Outcome::Filtered => t.unanswered += 1,
            }
        }
        out
    }

    /// Whether the packet at trace position `k` (of `total`) is a probe packet: probe packets
    /// are spread evenly over the trace.
    fn due(&self, k: u64, total: u64) -> bool {
        self.emitted < self.packets
            && (u128::from(k) + 1) * u128::from(self.packets)
                > u128::from(self.emitted) * u128::from(total.max(1))
    }

    /// Writes the next probe packet; returns (stored, wire) lengths.
    fn write(&mut self, buf: &mut [u8], scratch: &mut [u8; 2048]) -> (usize, usize) {
        use tcp_flags::{ACK, RST, SYN};
        let p = self.probes[self.next];
        let (scanner, sport) = (p.source, p.sport);
        let inside = self
            .scanners
            .get(usize::from(p.scanner))
            .is_none_or(|s| s.1);
        let isn = hash2(
            K_SCAN,
            u64::from(scanner),
            u64::from(p.target) << 16 | u64::from(p.port),
        ) as u32;
        let step = self.step;
        // (from the scanner?, flags, seq, ack, MSS option?)
        let (from_scanner, flags, seq, ack, mss) = match (step, p.outcome) {
            (0, _) => (true, SYN, isn, 0, true),
            (1, Outcome::Open) => (false, SYN | ACK, !isn, isn.wrapping_add(1), true),
            (1, _) => (false, RST | ACK, 0, isn.wrapping_add(1), false),
            _ => (true, RST, isn.wrapping_add(1), 0, false),
        };
        self.step += 1;
        if self.step >= p.outcome as u8 {
            self.step = 0;
            self.next += 1;
        }
        self.emitted += 1;
        let (s, t) = (Ipv4Addr::from(scanner), Ipv4Addr::from(p.target));
        let (src, dst, sp, dp) = if from_scanner {
            (s, t, sport, p.port)
        } else {
            (t, s, p.port, sport)
        };
        let tcp = TcpSpec {
            src_port: sp,
            dst_port: dp,
            seq,
            ack,
            flags,
            window: if from_scanner { 1024 } else { 65_160 },
            urgent: 0,
            options: if mss {
                TcpOptions {
                    mss: Some(1460),
                    ..TcpOptions::NONE
                }
            } else {
                TcpOptions::NONE
            },
        };
        // The inside side's frames go from CLIENT_MAC, the outside's from SERVER_MAC.
        let from_inside = from_scanner == inside;
        let ethernet = if from_inside {
            EthernetSpec::new(CLIENT_MAC, SERVER_MAC)
        } else {
            EthernetSpec::new(SERVER_MAC, CLIENT_MAC)
        };
        let spec = FrameSpec {
            ethernet,
            ip: IpSpec::V4(Ipv4Spec {
                ttl: if from_scanner { 48 } else { 64 },
                id: (isn >> 16) as u16 ^ u16::from(step),
                ..Ipv4Spec::new(src, dst)
            }),
            l4: L4Spec::Tcp(tcp),
            payload: Payload::Counter { len: 0, start: 0 },
            min_len: ETHERNET_MIN_LEN,
        };
        let wire = spec.frame_len();
        if buf.len() >= wire {
            let n = spec.write(buf).unwrap_or(0);
            (n, n)
        } else {
            let n = spec.write(&mut scratch[..]).unwrap_or(0);
            let stored = n.min(buf.len());
            buf[..stored].copy_from_slice(&scratch[..stored]);
            (stored, n)
        }
    }
}

impl Synthetic {
    /// `scan`: the next packet of the mixed trace, a probe's or the normal traffic's.
    fn emit_mixed(&mut self, buf: &mut [u8], meta: &mut PacketMeta) -> usize {
        let k = self.progress();
        let total = self.total_packets();
        let probe = self.scan.as_ref().is_some_and(|s| s.due(k, total))
            || self.emitted >= self.config.packets;
        if !probe {
            // Every packet is written: `clients_only` is refused for this profile.
            return self.emit(buf, meta).unwrap_or(0);
        }
        let ts_ns = self
            .config
            .start_ns
            .saturating_add((k as f64 * self.period_ns) as u64);
        let Some(scan) = self.scan.as_mut() else {
            return 0;
        };
        let (len, wire_len) = scan.write(buf, &mut self.scratch);
        *meta = PacketMeta {
            timestamp_ns: ts_ns,
            wire_len: wire_len as u32,
            ..PacketMeta::default()
        };
        len
    }
}

impl Source for Synthetic {
    /// Packets of the trace generated, those left out included.
    fn progress(&self) -> Option<u64> {
        Some(Synthetic::progress(self))
    }

    fn recv(&mut self, batch: &mut PacketBatch) -> Result<usize> {
        batch.clear();
        if self.scan.is_some() {
            while self.progress() < self.total_packets() && !batch.is_full() {
                batch.push_with(|buf, meta| self.emit_mixed(buf, meta));
            }
            return Ok(batch.len());
        }
        if !self.scripted.is_empty() {
            while let Some((t, f)) = self.scripted.get(self.emitted as usize) {
                if batch.is_full() {
                    break;
                }
                batch.push_with(|buf, meta| {
                    let n = f.len().min(buf.len());
                    buf[..n].copy_from_slice(&f[..n]);
                    *meta = PacketMeta {
                        timestamp_ns: *t,
                        wire_len: f.len() as u32,
                        ..PacketMeta::default()
                    };
                    n
                });
                self.emitted += 1;
            }
            return Ok(batch.len());
        }
        while self.emitted < self.config.packets && !batch.is_full() {
            let n = batch.len();
            let mut left_out = false;
            batch.push_with(|buf, meta| {
                self.emit(buf, meta).unwrap_or_else(|| {
                    left_out = true;
                    0
                })
            });
            if left_out {
                batch.truncate(n); // a server's packet ([`SynthConfig::clients_only`])
            }
        }
        Ok(batch.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xoshiro_reference_and_splitmix_reference() {
        // SplitMix64 from seed 0: first output (Vigna's reference implementation).
        let mut sm = SplitMix64(0);
        assert_eq!(sm.next_u64(), 0xe220_a839_7b1d_cdaf);
        // xoshiro256** with state [1, 2, 3, 4]: reference outputs 11520, 0, 1509978240.
        let mut x = Xoshiro256 { s: [1, 2, 3, 4] };
        assert_eq!(x.next_u64(), 11_520);
        assert_eq!(x.next_u64(), 0);
        assert_eq!(x.next_u64(), 1_509_978_240);
    }

    #[test]
    fn ln_and_exp_are_accurate() {
        for &x in &[1.0, 2.0, 3.5, 10.0, 1e6, 4_294_967_295.0, 0.001] {
            let l = ln(x);
            assert!(
                (l - f64::ln(x)).abs() < 1e-13 * f64::ln(x).abs().max(1.0),
                "{x}"
            );
            assert!((exp(l) - x).abs() < 1e-12 * x, "{x}");
        }
        assert_eq!(ln(1.0), 0.0);
        assert_eq!(exp(0.0), 1.0);
        assert!((exp(-700.0) - f64::exp(-700.0)).abs() < 1e-12 * f64::exp(-700.0));
        assert_eq!(exp(-800.0), 0.0);
    }

    #[test]
    fn permutations_are_bijections() {
        for n in [1u64, 2, 3, 7, 64, 100, 1000] {
            let mut seen = vec![false; n as usize];
            for i in 0..n {
                let p = permute_index(i, n, 42) as usize;
                assert!(!seen[p], "n = {n}");
                seen[p] = true;
            }
        }
        for bits in [0u32, 1, 2, 3, 8] {
            let net = Net::new(0, 32, 32 - bits);
            let mut hosts: Vec<u128> = (0..net.usable()).map(|h| net.host(h, 7)).collect();
            hosts.sort_unstable();
            hosts.dedup();
            assert_eq!(hosts.len() as u64, net.usable());
            if bits >= 2 {
                assert!(hosts.iter().all(|&h| h != 0 && h != (1 << bits) - 1));
            }
        }
    }

    #[test]
    fn allocation_sums_exactly_and_respects_minimums() {
        let weights = [1.0, 1.0, 1.0, 5.0, 0.0, 1e-300];
        let kinds = [KIND_TCP, 0, 0, KIND_TCP, 0, 0];
        let min_of = |k: u8| if k & KIND_TCP != 0 { 7 } else { 2 };
        for total in [26, 27, 30, 31, 100, 1001] {
            let c = allocate(&weights, &kinds, &min_of, total, 1);
            assert_eq!(c.iter().sum::<u64>(), total);
            for (i, &n) in c.iter().enumerate() {
                assert!(n >= min_of(kinds[i]));
            }
        }
        let c = allocate(&weights, &kinds, &min_of, 1_000_000, 1);
        assert!(c[3] > 4 * c[0] && c[3] < 6 * c[0], "{c:?}");
    }

    #[test]
    fn flow_state_stays_small() {
        // 104 bytes of the flow's progress and 72 of what it draws once when it starts (its
        // endpoints and seeds), so that no packet draws them again.
        assert_eq!(std::mem::size_of::<FlowState>(), 176);
    }

    #[test]
    fn endpoints_are_distinct_for_a_small_client_subnet() {
        let mut cfg = SynthConfig::new(Profile::Short);
        cfg.clients_v4 = "10.1.2.0/30".parse().unwrap();
        cfg.ipv6_share = 0.0;
        cfg.flows = 2 * 28_232;
        cfg.packets = cfg.flows * 2;
        let s = Synthetic::new(cfg.clone()).unwrap();
        let mut pairs: Vec<(u128, u16)> = (0..cfg.flows as u32)
            .map(|i| {
                let e = s.endpoints(i, 0);
                (e.client, e.client_port)
            })
            .collect();
        pairs.sort_unstable();
        pairs.dedup();
        assert_eq!(pairs.len() as u64, cfg.flows);
        cfg.flows += 1;
        cfg.packets += 2;
        assert!(matches!(
            cfg.validate(),
            Err(Error::Option { name: "flows", .. })
        ));
    }
}
