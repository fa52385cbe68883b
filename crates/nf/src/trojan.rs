//! The trojan detector of CHC (§2.1 R4, Fig. 2; §6 "Trojan detector"): per inside host, an
//! **SSH connection**, then an **FTP download of an HTML, ZIP or EXE file**, then **IRC
//! activity**, in that order, raise one alert.
//!
//! # Events
//!
//! Each TCP packet that involves an inside host (the source of an outbound packet, the
//! destination of an inbound one) may be one or more events of that host:
//!
//! * **SSH**: a connection opened to an SSH port (a SYN without ACK to one of `ssh_ports`,
//!   default 22), or a stream (either direction) whose first line starts with `SSH-2.0-` or
//!   `SSH-1.99-` (RFC 4253 §4.2), on any port.
//! * **FTP download**: on a connection to an FTP control port (`ftp_ports`, default 21), a
//!   command line sent to that port, `RETR <name>` (RFC 959 §4.1.3) whose name ends in one of
//!   `extensions` (default `.html`, `.htm`, `.zip`, `.exe`, case-insensitive), counted whether
//!   or not the transfer succeeds; **or** a data connection announced on the control
//!   connection (`227`/`229` replies, `PORT`/`EPRT` commands; between the inside host and that
//!   FTP server, within 60 s) whose first segment from the server starts with the magic
//!   bytes of an EXE (`MZ`), a ZIP (`PK\x03\x04`) or an HTML page (`<html`,
//!   `<!DOCTYPE html`, case-insensitive), whatever the file's name. The magic bytes must be in
//!   the first segment of the data stream the NF sees (a sender's first segment is MSS-sized
//!   in practice; a data connection reordered so that a later segment arrives before its SYN
//!   and first segment is picked up midstream, and its magic bytes are missed). A
//!   file whose first bytes arrive before its announcement (reordering) is remembered for
//!   60 s and counts, at its own clock, when the announcement comes.
//! * **IRC**: a connection opened to an IRC port (`irc_ports`, default 6660–6669 and 6697), or
//!   on any connection that is not FTP a line `NICK <nick>`, `JOIN <channel>` or
//!   `USER <user> <mode> <unused> :<realname>` (RFC 2812 §3.1, with an optional `:prefix`)
//!   sent by the likely client (the end with the higher port, as Wireshark guesses) within the
//!   first 1024 bytes of its stream, where registration and the first joins are: a web page or
//!   an upload whose lines happen to read `JOIN ...` does not count. `USER` needs its four
//!   parameters, so FTP's and POP3's `USER name` never match.
//!
//! Lines are read from each direction's byte stream as TCP reassembly
//! ([`crate::reassembly::TcpStreams`]) gives it, in order, so a command split over several
//! segments (or sent out of order) counts once, when its line is complete. Each direction is
//! read on its own and told apart by ports, not by which end the reassembly guessed is the
//! client (a reordered server packet may arrive before the SYN). Lines end at LF
//! (a CR before it is dropped); a line longer than 512 bytes (IRC's limit, RFC 2812 §2.3) is
//! skipped, and so is the line a reassembly gap falls in.
//!
//! # Order (CHC §5.2, R4)
//!
//! An event's time is the packet's logical clock ([`Context::clock`]) when the chain assigns
//! one, else its arrival number at this host (a per-host count kept in the host's state). The
//! rule: **alert when the host has an SSH event `s`, an FTP event `f` and an IRC event `i` with
//! `s < f < i`**, all three seen within `window` (default 1 hour) of each other's arrival, in
//! whatever order they arrive. An FTP event that arrives after the IRC event but carries a
//! smaller clock completes the sequence as well as one that arrives in order; an FTP event
//! with a clock after the IRC event's does not, wherever it arrives.
//!
//! Per host the state is CHC Table 1's "arrival time of IRC, FTP and SSH flows for each host"
//! (cross-flow, read/write often): the latest IRC clock, and the SSH and FTP events as *runs*,
//! the clock range `[first, last]` of consecutive events of one kind in clock order (up to 8
//! runs). Only the earliest SSH and the earliest FTP after it matter for `s < f < i`, so
//! collapsing a run loses nothing as long as events arrive in clock order. Limits:
//!
//! * An event arriving late *inside* a run of the other kind splits the run into its first
//!   and last event (its middle ones are not kept); a sequence that needs one of those middle
//!   events is missed.
//! * With more than 8 runs in the window (a host alternating SSH and FTP many times), the run
//!   seen least recently is forgotten.
//! * A run is as fresh as its most recent event: under reordering, a run whose first event is
//!   older than the window but whose last is not still orders from its first clock.
//!
//! After an alert the host's events up to the alert's IRC clock are consumed: events with a
//! clock at or before it are ignored, so the same sequence (the rest of its SSH session, a
//! straggler of its download) never alerts twice, while a new SSH → FTP → IRC after it does.
//! A host's state expires `window` after its latest event ([`Map::expire_after`]).
//!
//! # Alerts
//!
//! Counted (`alerts` in [`NetworkFunction::report`], per host in [`HostState::alerts`]) and
//! written as one JSON line in Suricata's EVE shape (`timestamp`, `event_type: "alert"`,
//! `src_ip`, `src_port`, `dest_ip`, `dest_port`, `proto`, `alert.signature` =
//! `"trojan: ssh, ftp download, irc"`, and a `trojan` object with the host and the three
//! events' clocks) as a `tracing` event at WARN level, target `flowstate::alert`, field `eve`:
//! NFs are sans-IO, so the binary's log is where alerts go. The packet that completed the
//! sequence gives the addresses. The detector never drops a packet (CHC runs it off-path).
//!
//! # State and partitioning
//!
//! Host state is cross-flow, keyed by the inside host's address; the NF's traffic partition
//! ([`NfFactory::partition`]) is the inside host's, so all of a host's flows, in both
//! directions, reach the worker (or cluster partition) that owns its state. Reassembly and the
//! partial command lines are per flow. No fast path: the detector must see every packet.
//!
//! # Caps
//!
//! The per-flow tables hold at most `max_flows` entries each (default 262,144, conntrack's
//! `nf_conntrack_max` on a machine this size), shared evenly by the workers: the reassembly's
//! streams (`tcp_streams`: at the cap a new connection ends the oldest one never answered, or
//! ended, with `early_drop = true`, the default, as conntrack's early drop; else its bytes are
//! not read; `streams_early_dropped`, `streams_table_full`, gauge `max_streams`) and the
//! partial lines (`lines`: at the cap a new partial line ends the oldest one whose stream is
//! gone, never answered or ended, with early drop; else it is not kept and the command it
//! began is missed; `lines_early_dropped`, `lines_table_full`, gauge `max_lines`). Packets are forwarded either way; the SYN events
//! (SSH and IRC ports) do not need the tables.

use crate::early_drop::{self, Cap, Unit};
use crate::reassembly::{Event, Fed, TableConfig, TcpStreams};
use crate::{
    BuildError, Context, Direction, NetworkFunction, NfFactory, Packet, Placement, Verdict,
};
use flowstate_state::{
    Access, Codec, CodecError, Counter, Declare, Field, Map, Nanos, Scope, StateError,
};
use flowstate_wire::dissect::Transport;
use flowstate_wire::{tcp, FlowKey};
use serde::Deserialize;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

const NF: &str = "trojan";

/// The alert's signature.
pub const SIGNATURE: &str = "trojan: ssh, ftp download, irc";
/// The `alert.signature_id` of a trojan alert (portscan's is 9000001).
pub const SIGNATURE_ID: u32 = 9_000_002;

/// Longest command line kept while it is incomplete (IRC's limit, RFC 2812 §2.3).
const MAX_LINE: usize = 512;

/// Most runs of SSH/FTP events kept per host.
const MAX_RUNS: usize = 8;

/// Idle time after which a partial command line is forgotten.
const LINE_TTL: Duration = Duration::from_secs(600);

/// How long an announced FTP data connection is waited for.
const EXPECT_TTL: Duration = Duration::from_secs(60);

// ------------------------------------------------------------------------------------------
// Configuration

/// `[[chain]] nf = "trojan"` options.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Time within which the three events must fall; a host's older events are forgotten
    /// (default 1h).
    #[serde(deserialize_with = "flowstate_config::deserialize_duration")]
    pub window: Duration,
    /// Ports whose connections are SSH (default `[22]`).
    pub ssh_ports: Vec<u16>,
    /// FTP control ports (default `[21]`).
    pub ftp_ports: Vec<u16>,
    /// Ports whose connections are IRC (default 6660–6669 and 6697).
    pub irc_ports: Vec<u16>,
    /// File name endings of a qualifying download, without the dot (default `html`, `htm`,
    /// `zip`, `exe`; compared case-insensitively).
    pub extensions: Vec<String>,
    /// TCP reassembly options (see [`TableConfig`]).
    pub reassembly: TableConfig,
    /// Streams reassembled at most, and partial lines kept at most, shared evenly by the
    /// workers (default 262,144).
    pub max_flows: u64,
    /// Whether a new stream at the cap ends the oldest one never answered or ended, and a
    /// new partial line the oldest one of such a stream (default `true`).
    pub early_drop: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            window: Duration::from_secs(3600),
            ssh_ports: vec![22],
            ftp_ports: vec![21],
            irc_ports: (6660..=6669).chain([6697]).collect(),
            extensions: ["html", "htm", "zip", "exe"].map(String::from).to_vec(),
            reassembly: TableConfig::default(),
            max_flows: early_drop::default_max(),
            early_drop: true,
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
        c.validate()?;
        Ok(c)
    }

    /// Checks the values; the error names the key.
    pub fn validate(&self) -> Result<(), BuildError> {
        if self.max_flows == 0 {
            return Err(config_err("max_flows", "expected at least 1"));
        }
        if self.window.is_zero() {
            return Err(config_err(
                "window",
                "expected a duration above zero, like \"1h\"",
            ));
        }
        if self
            .extensions
            .iter()
            .any(|e| e.is_empty() || e.starts_with('.') || !e.bytes().all(|b| b.is_ascii_graphic()))
        {
            return Err(config_err(
                "extensions",
                "expected file name endings without the dot, like \"zip\"",
            ));
        }
        self.reassembly
            .validate()
            .map_err(|(k, r)| config_err(format!("reassembly.{k}"), r))
    }
}

// ------------------------------------------------------------------------------------------
// Per-host state and the ordering rule

/// An event kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// An SSH connection.
    Ssh,
    /// A qualifying FTP download.
    Ftp,
    /// IRC activity.
    Irc,
}

impl Kind {
    const fn bit(self) -> u8 {
        match self {
            Kind::Ssh => 1,
            Kind::Ftp => 2,
            Kind::Irc => 4,
        }
    }
}

/// Consecutive events of one kind in clock order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Run {
    ssh: bool,
    first: u64,
    last: u64,
    /// Arrival time of its most recent event, ns.
    seen: Nanos,
}

/// What the detector keeps per inside host (CHC Table 1: the clocks of its SSH, FTP and IRC
/// events).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct HostState {
    /// SSH and FTP runs, sorted by clock, adjacent runs of different kinds.
    runs: Vec<Run>,
    /// The latest IRC event: (clock, arrival ns).
    irc: Option<(u64, Nanos)>,
    /// Events at or before this clock are consumed by an alert.
    done: u64,
    /// Events of this host, for arrival order when packets carry no clock.
    arrivals: u64,
    /// Alerts raised for this host.
    alerts: u32,
}

/// The three events' clocks of an alert.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sequence {
    /// The SSH event.
    pub ssh: u64,
    /// The FTP download after it.
    pub ftp: u64,
    /// The IRC event after that.
    pub irc: u64,
}

impl HostState {
    /// Alerts raised for this host (while its state lives).
    pub fn alerts(&self) -> u32 {
        self.alerts
    }

    /// Records the events `kinds` (a set of [`Kind`] bits) of one packet with logical clock
    /// `clock` (0: none, use arrival order) arriving at `now`; returns the sequence it
    /// completes, if any (see the module documentation for the rule).
    fn record(&mut self, kinds: u8, clock: u64, now: Nanos, window: Nanos) -> Option<Sequence> {
        self.arrivals += 1;
        let clock = if clock != 0 { clock } else { self.arrivals };
        let fresh = |seen: Nanos| seen.saturating_add(window) >= now;
        self.runs.retain(|r| fresh(r.seen));
        if self.irc.is_some_and(|(_, seen)| !fresh(seen)) {
            self.irc = None;
        }
        self.normalize();
        if clock <= self.done {
            return None;
        }
        if kinds & Kind::Ssh.bit() != 0 {
            self.insert(true, clock, now);
        }
        if kinds & Kind::Ftp.bit() != 0 {
            self.insert(false, clock, now);
        }
        if kinds & Kind::Irc.bit() != 0 && self.irc.is_none_or(|(c, _)| clock >= c) {
            self.irc = Some((clock, now));
        }
        // The earliest SSH, the earliest FTP after it (the next run: runs alternate), the
        // latest IRC.
        let s = self.runs.iter().position(|r| r.ssh)?;
        let f = self.runs.get(s + 1)?.first;
        let (i, _) = self.irc?;
        if i <= f {
            return None;
        }
        let seq = Sequence {
            ssh: self.runs[s].first,
            ftp: f,
            irc: i,
        };
        self.done = i;
        self.irc = None;
        self.runs.retain(|r| r.first > i);
        self.alerts = self.alerts.saturating_add(1);
        Some(seq)
    }

    /// Adds one SSH (`ssh`) or FTP event at `clock`.
    fn insert(&mut self, ssh: bool, clock: u64, now: Nanos) {
        let i = self.runs.partition_point(|r| r.first <= clock);
        let one = Run {
            ssh,
            first: clock,
            last: clock,
            seen: now,
        };
        if i > 0 {
            let prev = &mut self.runs[i - 1];
            if prev.ssh == ssh {
                prev.last = prev.last.max(clock);
                prev.seen = prev.seen.max(now);
            } else if clock < prev.last && prev.first < clock {
                // Inside a run of the other kind: split it at its ends (its middle events are
                // not kept).
                let tail = Run {
                    first: prev.last,
                    ..*prev
                };
                prev.last = prev.first;
                self.runs.insert(i, tail);
                self.runs.insert(i, one);
            } else {
                match self.runs.get_mut(i) {
                    Some(next) if next.ssh == ssh => {
                        next.first = clock;
                        next.seen = next.seen.max(now);
                    }
                    _ => self.runs.insert(i, one),
                }
            }
        } else {
            match self.runs.first_mut() {
                Some(next) if next.ssh == ssh => {
                    next.first = clock;
                    next.seen = next.seen.max(now);
                }
                _ => self.runs.insert(0, one),
            }
        }
        while self.runs.len() > MAX_RUNS {
            let (oldest, _) = self
                .runs
                .iter()
                .enumerate()
                .min_by_key(|(_, r)| r.seen)
                .unwrap_or((0, &one));
            self.runs.remove(oldest);
            self.normalize();
        }
    }

    /// Joins adjacent runs of one kind (after a removal).
    fn normalize(&mut self) {
        let mut k = 1;
        while k < self.runs.len() {
            if self.runs[k].ssh == self.runs[k - 1].ssh {
                let r = self.runs.remove(k);
                let p = &mut self.runs[k - 1];
                p.last = p.last.max(r.last);
                p.seen = p.seen.max(r.seen);
            } else {
                k += 1;
            }
        }
    }
}

impl Codec for HostState {
    fn encode(&self, out: &mut Vec<u8>) {
        (self.done, self.arrivals, self.alerts, self.irc).encode(out);
        (self.runs.len() as u8).encode(out);
        for r in &self.runs {
            (r.ssh, r.first, r.last, r.seen).encode(out);
        }
    }
    fn decode(input: &mut &[u8]) -> Result<Self, CodecError> {
        let (done, arrivals, alerts, irc) = <(u64, u64, u32, Option<(u64, u64)>)>::decode(input)?;
        let n = u8::decode(input)?;
        if usize::from(n) > MAX_RUNS {
            return Err(CodecError::Invalid("trojan runs"));
        }
        let mut runs = Vec::with_capacity(usize::from(n));
        for _ in 0..n {
            let (ssh, first, last, seen) = <(bool, u64, u64, u64)>::decode(input)?;
            runs.push(Run {
                ssh,
                first,
                last,
                seen,
            });
        }
        Ok(HostState {
            runs,
            irc,
            done,
            arrivals,
            alerts,
        })
    }
}

// ------------------------------------------------------------------------------------------
// Command lines

/// A client stream's incomplete command line.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
struct Line {
    /// Stream offset of the next byte expected.
    next: u64,
    /// Stream offset where the current line starts.
    start: u64,
    /// The line so far (no LF).
    buf: Vec<u8>,
    /// Skipping to the next LF (the line is too long or a gap fell in it).
    skipping: bool,
}

impl Codec for Line {
    fn encode(&self, out: &mut Vec<u8>) {
        (self.next, self.start, self.skipping, self.buf.clone()).encode(out);
    }
    fn decode(input: &mut &[u8]) -> Result<Self, CodecError> {
        let (next, start, skipping, buf) = <(u64, u64, bool, Vec<u8>)>::decode(input)?;
        Ok(Line {
            next,
            start,
            buf,
            skipping,
        })
    }
}

impl Line {
    /// Takes `bytes` at stream offset `offset`, calling `line` with each complete line
    /// (without CR LF) and the stream offset it starts at.
    fn feed(&mut self, offset: u64, bytes: &[u8], mut line: impl FnMut(&[u8], u64)) {
        if offset != self.next {
            // Not where this line left off: what came between is unknown.
            self.buf.clear();
            self.skipping = true;
        }
        let mut rest = bytes;
        let mut at = offset;
        while !rest.is_empty() {
            match rest.iter().position(|&b| b == b'\n') {
                Some(n) => {
                    if !self.skipping && self.buf.len() + n <= MAX_LINE {
                        let whole: &[u8] = if self.buf.is_empty() {
                            &rest[..n]
                        } else {
                            self.buf.extend_from_slice(&rest[..n]);
                            &self.buf
                        };
                        let whole = whole.strip_suffix(b"\r").unwrap_or(whole);
                        line(whole, self.start);
                    }
                    self.buf.clear();
                    self.skipping = false;
                    at += n as u64 + 1;
                    self.start = at;
                    rest = &rest[n + 1..];
                }
                None => {
                    if !self.skipping {
                        if self.buf.len() + rest.len() <= MAX_LINE {
                            self.buf.extend_from_slice(rest);
                        } else {
                            self.buf.clear();
                            self.skipping = true;
                        }
                    }
                    at += rest.len() as u64;
                    rest = &[];
                }
            }
        }
        self.next = at;
    }

    /// Whether nothing needs keeping (no partial line, not skipping).
    fn idle(&self) -> bool {
        self.buf.is_empty() && !self.skipping
    }
}

/// What a line's connection and direction are.
#[derive(Debug, Clone, Copy, Default)]
struct Where {
    /// The connection is FTP control.
    ftp: bool,
    /// The line was sent to the FTP server.
    to_ftp: bool,
    /// The sender is the likely client (its port is the higher one, Wireshark's guess).
    from_client: bool,
}

/// Lines that start within this many bytes of their stream may be IRC registration or joins.
const IRC_HEAD: u64 = 1024;

/// The events one line, starting at stream offset `start`, is.
fn classify(line: &[u8], start: u64, at: Where, extensions: &[String]) -> u8 {
    let (ftp, to_ftp) = (at.ftp, at.to_ftp);
    let mut kinds = 0;
    if start == 0 && (line.starts_with(b"SSH-2.0-") || line.starts_with(b"SSH-1.99-")) {
        kinds |= Kind::Ssh.bit();
    }
    let mut words = line
        .split(|&b| b == b' ' || b == b'\t')
        .filter(|w| !w.is_empty());
    let Some(mut cmd) = words.next() else {
        return kinds;
    };
    if ftp {
        if to_ftp && cmd.eq_ignore_ascii_case(b"RETR") {
            // The name is the rest of the line (it may hold spaces).
            let name = line.get(4..).map(|n| n.trim_ascii()).unwrap_or_default();
            let qualifies = extensions.iter().any(|e| {
                let e = e.as_bytes();
                name.len() > e.len()
                    && name[name.len() - e.len() - 1] == b'.'
                    && name[name.len() - e.len()..].eq_ignore_ascii_case(e)
            });
            if qualifies {
                kinds |= Kind::Ftp.bit();
            }
        }
        return kinds;
    }
    if !at.from_client || start >= IRC_HEAD {
        return kinds;
    }
    if cmd.first() == Some(&b':') {
        // A message prefix (RFC 2812 §2.3.1).
        match words.next() {
            Some(c) => cmd = c,
            None => return kinds,
        }
    }
    let params: Vec<&[u8]> = words.take(4).collect();
    let irc = if cmd.eq_ignore_ascii_case(b"NICK") || cmd.eq_ignore_ascii_case(b"JOIN") {
        !params.is_empty()
    } else if cmd.eq_ignore_ascii_case(b"USER") {
        params.len() == 4 && params[3].first() == Some(&b':')
    } else {
        false
    };
    if irc {
        kinds |= Kind::Irc.bit();
    }
    kinds
}

/// The data port an FTP line announces: a server's `227 ... (h1,h2,h3,h4,p1,p2)` (RFC 959
/// §4.2) or `229 ... (|||port|)` (RFC 2428 §3), a client's `PORT h1,h2,h3,h4,p1,p2` (RFC 959
/// §4.1.2) or `EPRT |1|addr|port|` (RFC 2428 §2).
fn ftp_data_port(line: &[u8], to_ftp: bool) -> Option<u16> {
    let text = std::str::from_utf8(line).ok()?;
    let (cmd, rest) = text.split_once(' ').unwrap_or((text, ""));
    let six = |s: &str| -> Option<u16> {
        let nums: Vec<u16> = s
            .split(',')
            .map(|n| n.trim().parse::<u16>().ok().filter(|&v| v < 256))
            .collect::<Option<_>>()?;
        (nums.len() == 6).then(|| nums[4] << 8 | nums[5])
    };
    let port = if to_ftp {
        if cmd.eq_ignore_ascii_case("PORT") {
            six(rest)?
        } else if cmd.eq_ignore_ascii_case("EPRT") {
            let d = rest.trim().chars().next()?;
            rest.trim().split(d).nth(3)?.parse().ok()?
        } else {
            return None;
        }
    } else if cmd == "227" {
        let open = rest.find('(')?;
        let close = rest[open..].find(')')? + open;
        six(&rest[open + 1..close])?
    } else if cmd == "229" {
        let open = rest.find('(')?;
        let close = rest[open..].find(')')? + open;
        let inner = &rest[open + 1..close];
        let d = inner.chars().next()?;
        inner.split(d).nth(3)?.parse().ok()?
    } else {
        return None;
    };
    (port != 0).then_some(port)
}

/// Whether a file's first bytes are those of an EXE (`MZ`), a ZIP (`PK\x03\x04`) or an HTML
/// page (`<html` or `<!DOCTYPE html`, case-insensitive, after an optional UTF-8 byte-order
/// mark and leading whitespace, as browsers read one).
pub fn qualifying_magic(head: &[u8]) -> bool {
    let text = head.strip_prefix(b"\xef\xbb\xbf").unwrap_or(head);
    let text = &text[text.iter().take_while(|b| b.is_ascii_whitespace()).count()..];
    let starts = |p: &[u8]| text.len() >= p.len() && text[..p.len()].eq_ignore_ascii_case(p);
    head.starts_with(b"MZ")
        || head.starts_with(b"PK\x03\x04")
        || starts(b"<html")
        || starts(b"<!doctype html")
}

// ------------------------------------------------------------------------------------------
// EVE output

/// The EVE alert line for `seq` of `host`, completed by a packet of `flow` at `now`.
pub fn eve_alert(now: Nanos, flow: &FlowKey, host: IpAddr, seq: &Sequence) -> String {
    let proto = crate::eve::proto(flow.proto);
    format!(
        concat!(
            "{{\"timestamp\":\"{}\",\"event_type\":\"alert\",\"src_ip\":\"{}\",",
            "\"src_port\":{},\"dest_ip\":\"{}\",\"dest_port\":{},\"proto\":\"{}\",",
            "\"alert\":{{\"action\":\"allowed\",\"gid\":1,\"signature_id\":{},\"rev\":1,",
            "\"signature\":\"{}\",\"category\":\"A Network Trojan was detected\",",
            "\"severity\":1}},",
            "\"trojan\":{{\"host\":\"{}\",\"ssh_clock\":{},\"ftp_clock\":{},\"irc_clock\":{}}}}}"
        ),
        crate::eve::timestamp(now),
        flow.src,
        flow.src_port,
        flow.dst,
        flow.dst_port,
        proto,
        SIGNATURE_ID,
        SIGNATURE,
        host,
        seq.ssh,
        seq.ftp,
        seq.irc
    )
}

// ------------------------------------------------------------------------------------------
// Factory

/// Builds trojan detectors.
#[derive(Debug, Clone)]
pub struct Factory(pub Config);

/// The factory for a `[[chain]]` table.
pub fn factory(table: &toml::Table) -> Result<Arc<dyn NfFactory>, BuildError> {
    Ok(Arc::new(Factory(Config::from_table(table)?)))
}

/// The inside host of a packet of `flow` from `direction`.
fn inside_host(flow: &FlowKey, direction: Direction) -> IpAddr {
    match direction {
        Direction::Outbound => flow.src,
        Direction::Inbound => flow.dst,
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
        Ok(Box::new(Trojan::declare_on(&self.0, state, worker)?))
    }

    /// The inside host's partition: its state is keyed by its address (CHC §4.1), and all
    /// its flows, both directions, must reach it.
    fn partition(
        &self,
        flow: &FlowKey,
        _quoted: Option<&FlowKey>,
        direction: Direction,
        partitions: u32,
    ) -> Option<u32> {
        Some(crate::endpoint_partition(
            inside_host(flow, direction),
            0,
            0,
            partitions,
        ))
    }
}

// ------------------------------------------------------------------------------------------
// The NF

/// One worker's trojan detector.
pub struct Trojan {
    window: Duration,
    ssh_ports: Vec<u16>,
    ftp_ports: Vec<u16>,
    irc_ports: Vec<u16>,
    extensions: Vec<String>,
    streams: TcpStreams,
    /// Incomplete lines, per direction (by the sender's flow key).
    lines: Map<FlowKey, Line>,
    /// The cap of `lines`.
    lines_cap: Cap<FlowKey>,
    /// Per inside host.
    hosts: Map<IpAddr, HostState>,
    /// Announced FTP data connections: (inside host, FTP server, listening port).
    expected: Map<(IpAddr, IpAddr, u16), bool>,
    /// Streams from a server to an inside host that began with a qualifying file's magic
    /// bytes before any announcement of them arrived (reordering): (inside host, server,
    /// either port) to the clock of their first bytes.
    unannounced: Map<(IpAddr, IpAddr, u16), u64>,
    alerts: Counter,
    ssh_events: Counter,
    ftp_events: Counter,
    irc_events: Counter,
    state_errors: i64,
    malformed: i64,
}

impl Trojan {
    /// Declares the detector's state (`hosts`, `lines`, `alerts`, event counters and the
    /// reassembly's) for the only worker.
    pub fn declare(cfg: &Config, state: &mut Declare<'_>) -> Result<Trojan, StateError> {
        let one = Placement {
            stage: 0,
            partition: 0,
            partitions: 1,
        };
        Trojan::declare_on(cfg, state, one)
    }

    /// [`Trojan::declare`] for `worker`, which holds its share of `max_flows`.
    pub fn declare_on(
        cfg: &Config,
        state: &mut Declare<'_>,
        worker: Placement,
    ) -> Result<Trojan, StateError> {
        // Keyed by the inside host: the source address of its outbound packets.
        let host_scope = Scope::CrossFlow(&[Field::SrcIp]);
        let total = || Scope::CrossFlow(&[]);
        Ok(Trojan {
            window: cfg.window,
            ssh_ports: cfg.ssh_ports.clone(),
            ftp_ports: cfg.ftp_ports.clone(),
            irc_ports: cfg.irc_ports.clone(),
            extensions: cfg.extensions.clone(),
            streams: TcpStreams::declare_capped(
                state,
                &cfg.reassembly,
                cfg.max_flows,
                cfg.early_drop,
                worker,
            )?,
            lines: state.map("lines", Scope::PerFlow, Access::ReadWrite)?,
            lines_cap: Cap::declare(state, Unit::Lines, cfg.max_flows, cfg.early_drop, worker)?,
            hosts: state.map("hosts", host_scope, Access::ReadWrite)?,
            expected: state.map("ftp_data", host_scope, Access::ReadWrite)?,
            unannounced: state.map("ftp_data_early", host_scope, Access::ReadWrite)?,
            alerts: state.counter("alerts", total(), Access::WriteMostly)?,
            ssh_events: state.counter("ssh_events", total(), Access::WriteMostly)?,
            ftp_events: state.counter("ftp_events", total(), Access::WriteMostly)?,
            irc_events: state.counter("irc_events", total(), Access::WriteMostly)?,
            state_errors: 0,
            malformed: 0,
        })
    }

    /// The state of inside host `host`, if it has any.
    pub fn host(&self, host: &IpAddr) -> Option<HostState> {
        self.hosts.get(host).ok().flatten()
    }

    /// Every host with at least one alert (in this worker's cache).
    pub fn alerted_hosts(&self) -> Vec<IpAddr> {
        let mut v = Vec::new();
        self.hosts.for_each(|h, s| {
            if s.alerts > 0 {
                v.push(*h);
            }
        });
        v.sort();
        v
    }

    /// Counts and logs an alert.
    fn alert(&self, flow: &FlowKey, host: IpAddr, seq: &Sequence, cx: &Context) {
        self.alerts.add_nowait(1);
        tracing::warn!(
            target: crate::ALERT_TARGET,
            nf = NF,
            eve = %eve_alert(cx.now, flow, host, seq),
            "{SIGNATURE}"
        );
    }

    /// Records `kinds` for `host` at logical clock `clock` (0: arrival order); returns the
    /// sequence completed, if any.
    fn record(&mut self, host: IpAddr, kinds: u8, clock: u64, cx: &Context) -> Option<Sequence> {
        let window = self.window.as_nanos().min(u128::from(u64::MAX)) as u64;
        let ttl = self.window;
        let now = cx.now;
        let run = |h: &mut HostState| (ttl, h.record(kinds, clock, now, window));
        match self.hosts.renew_with(&host, now, run) {
            Ok(Some(seq)) => seq,
            Ok(None) => {
                let mut h = HostState::default();
                let (_, seq) = run(&mut h);
                self.hosts.insert_nowait(host, h);
                self.hosts.expire_after(&host, ttl, now);
                seq
            }
            Err(_) => {
                self.state_errors += 1;
                None
            }
        }
    }
}

impl NetworkFunction for Trojan {
    fn name(&self) -> &str {
        NF
    }

    #[inline]
    fn prefetch(&mut self, pkt: &Packet<'_>) {
        self.streams.prefetch(pkt);
        if let Some(flow) = pkt.dissection.flow {
            self.hosts.prefetch(&inside_host(&flow, pkt.direction));
        }
    }

    fn process(&mut self, pkt: &mut Packet<'_>, cx: &Context) -> Verdict {
        let d = &pkt.dissection;
        let (Some(flow), Transport::Tcp, Some(l4)) = (d.flow, d.transport, d.l4_offset) else {
            return Verdict::Forward;
        };
        let Some(flags) = pkt
            .data
            .get(l4..d.l3_end)
            .and_then(|b| tcp::Packet::new_checked(b).ok())
            .map(|t| t.flags())
        else {
            self.malformed += 1;
            return Verdict::Forward;
        };
        let mut kinds = 0u8;
        if flags.contains(tcp::Flags::SYN) && !flags.contains(tcp::Flags::ACK) {
            if self.ssh_ports.contains(&flow.dst_port) {
                kinds |= Kind::Ssh.bit();
            }
            if self.irc_ports.contains(&flow.dst_port) {
                kinds |= Kind::Irc.bit();
            }
        }
        // Lines are read from both directions, each on its own (keyed by the packet's flow
        // key, which names its direction): which end is the client is not trusted to the
        // reassembly's guess, since a reordered server packet may arrive before the SYN.
        let ftp_conn =
            self.ftp_ports.contains(&flow.dst_port) || self.ftp_ports.contains(&flow.src_port);
        let at = Where {
            ftp: ftp_conn,
            to_ftp: self.ftp_ports.contains(&flow.dst_port),
            from_client: flow.src_port > flow.dst_port,
        };
        let (lines, extensions) = (&self.lines, &self.extensions);
        // A line begun by this packet: put in `lines` after the feed, if there is room.
        let mut begun: Option<Line> = None;
        let mut errors = 0;
        let now = cx.now;
        let mut announced = None;
        let mut magic = None;
        let fed = self.streams.feed(pkt, now, |_, e| {
            if let Event::Data { offset: 0, bytes } = e {
                magic = Some(qualifying_magic(bytes));
            }
            let mut run = |l: &mut Line| match e {
                Event::Data { offset, bytes } => l.feed(offset, bytes, |line, start| {
                    kinds |= classify(line, start, at, extensions);
                    if ftp_conn {
                        announced = ftp_data_port(line, at.to_ftp).or(announced);
                    }
                }),
                Event::Gap { offset, len } => {
                    l.buf.clear();
                    l.skipping = true;
                    l.next = offset.saturating_add(len);
                }
                Event::End { .. } => {
                    l.buf.clear();
                    l.skipping = false;
                }
            };
            if let Some(l) = &mut begun {
                run(l);
                return;
            }
            match lines.with_mut(&flow, |l| l.map(|l| (run(l), l.idle()).1)) {
                Ok(Some(true)) => {
                    lines.remove_nowait(&flow);
                }
                Ok(Some(false)) => {
                    lines.expire_after(&flow, LINE_TTL, now);
                }
                Ok(None) => {
                    let mut l = Line::default();
                    if let Event::Data { offset, .. } = e {
                        // A stream picked up here starts its first line here.
                        l.next = offset;
                        l.start = offset;
                    }
                    run(&mut l);
                    begun = Some(l);
                }
                Err(_) => errors += 1,
            }
        });
        self.state_errors += errors;
        if let Some(l) = begun.filter(|l| !l.idle()) {
            // A line whose stream is gone, never answered or ended may be ended early.
            let (streams, lines) = (&self.streams, &self.lines);
            let room = self.lines_cap.admit(lines.cached_len(), |k| {
                streams.expendable(&k) && lines.remove_nowait(&k).is_some()
            });
            if room {
                lines.insert_nowait(flow, l);
                lines.expire_after(&flow, LINE_TTL, now);
                self.lines_cap.remember(flow);
            }
        }
        match fed {
            Fed::Malformed => self.malformed += 1,
            Fed::Unavailable => self.state_errors += 1,
            // Full: the stream is not read (counted as `streams_table_full`); the packet's
            // other events still count.
            Fed::NotTcp | Fed::Tcp(_) | Fed::Full => {}
        }
        let host = inside_host(&flow, pkt.direction);
        let (remote, host_port, remote_port) = if host == flow.src {
            (flow.dst, flow.src_port, flow.dst_port)
        } else {
            (flow.src, flow.dst_port, flow.src_port)
        };
        // (Clock, kinds) of an event older than this packet, found by it.
        let mut earlier = None;
        if let Some(port) = announced {
            // The data connection goes between the inside host and this FTP server.
            let key = (host, remote, port);
            match self.unannounced.remove_nowait(&key) {
                // Its file came before the announcement (reordered): the file's clock.
                Some(clock) => earlier = Some(clock),
                None => {
                    self.expected.insert_nowait(key, true);
                    self.expected.expire_after(&key, EXPECT_TTL, now);
                }
            }
        }
        if let Some(qualifies) = magic {
            // A stream's first bytes: on an announced data connection, sent by the server
            // (a download), they are the file's.
            if host != flow.src {
                let mut found = false;
                for port in [remote_port, host_port] {
                    let key = (host, remote, port);
                    match self.expected.contains_key(&key) {
                        Ok(true) => {
                            self.expected.remove_nowait(&key);
                            found = true;
                            if qualifies {
                                kinds |= Kind::Ftp.bit();
                            }
                            break;
                        }
                        Ok(false) => {}
                        Err(_) => self.state_errors += 1,
                    }
                }
                if qualifies && !found {
                    // Maybe its announcement is late: remember the file's clock for a while
                    // (0 without clocks: it then counts when the announcement arrives).
                    for port in [remote_port, host_port] {
                        let key = (host, remote, port);
                        self.unannounced.insert_nowait(key, cx.clock);
                        self.unannounced.expire_after(&key, EXPECT_TTL, now);
                    }
                }
            }
        }
        if let Some(clock) = earlier {
            self.ftp_events.add_nowait(1);
            if let Some(seq) = self.record(host, Kind::Ftp.bit(), clock, cx) {
                self.alert(&flow, host, &seq, cx);
            }
        }
        if kinds == 0 {
            return Verdict::Forward;
        }
        for (k, c) in [
            (Kind::Ssh, &self.ssh_events),
            (Kind::Ftp, &self.ftp_events),
            (Kind::Irc, &self.irc_events),
        ] {
            if kinds & k.bit() != 0 {
                c.add_nowait(1);
            }
        }
        if let Some(seq) = self.record(host, kinds, cx.clock, cx) {
            self.alert(&flow, host, &seq, cx);
        }
        Verdict::Forward
    }

    fn on_tick(&mut self, now: Nanos) {
        self.streams.on_tick(now);
        self.lines.expire(now, |_, _| {});
        self.expected.expire(now, |_, _| {});
        self.unannounced.expire(now, |_, _| {});
        self.hosts.expire(now, |_, _| {});
    }

    fn report(&self) -> Vec<(&'static str, i64)> {
        let get = |c: &Counter| c.get().unwrap_or(-1);
        let mut out = vec![
            ("alerts", get(&self.alerts)),
            ("ssh_events", get(&self.ssh_events)),
            ("ftp_events", get(&self.ftp_events)),
            ("irc_events", get(&self.irc_events)),
            ("hosts", self.hosts.cached_len() as i64),
            ("tcp_connections", self.streams.connections() as i64),
            ("malformed", self.malformed),
            ("state_errors", self.state_errors),
            ("lines", self.lines.cached_len() as i64),
        ];
        self.streams.report_cap(&mut out);
        self.lines_cap.report(&mut out);
        out
    }

    fn gauges(&self) -> &'static [&'static str] {
        &[
            "hosts",
            "tcp_connections",
            "lines",
            "max_streams",
            "max_lines",
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const W: Nanos = 3_600_000_000_000;

    fn ev(h: &mut HostState, k: Kind, clock: u64) -> Option<Sequence> {
        h.record(k.bit(), clock, 1, W)
    }

    #[test]
    fn in_order_alerts_once() {
        let mut h = HostState::default();
        assert_eq!(ev(&mut h, Kind::Ssh, 1), None);
        assert_eq!(ev(&mut h, Kind::Ftp, 2), None);
        assert_eq!(
            ev(&mut h, Kind::Irc, 3),
            Some(Sequence {
                ssh: 1,
                ftp: 2,
                irc: 3
            })
        );
        assert_eq!(ev(&mut h, Kind::Irc, 4), None);
        assert_eq!(ev(&mut h, Kind::Ssh, 2), None, "consumed");
        assert_eq!(h.alerts(), 1);
    }

    #[test]
    fn late_ftp_with_an_earlier_clock_completes() {
        let mut h = HostState::default();
        assert_eq!(ev(&mut h, Kind::Ssh, 10), None);
        assert_eq!(ev(&mut h, Kind::Irc, 30), None);
        assert!(ev(&mut h, Kind::Ftp, 20).is_some());
        let mut h = HostState::default();
        ev(&mut h, Kind::Irc, 30);
        ev(&mut h, Kind::Ftp, 20);
        assert_eq!(ev(&mut h, Kind::Ftp, 40), None);
        assert!(ev(&mut h, Kind::Ssh, 5).is_some(), "late ssh");
    }

    #[test]
    fn wrong_orders_do_not_alert() {
        for order in [
            [Kind::Ftp, Kind::Ssh, Kind::Irc],
            [Kind::Irc, Kind::Ssh, Kind::Ftp],
            [Kind::Ssh, Kind::Irc, Kind::Ftp],
            [Kind::Irc, Kind::Ftp, Kind::Ssh],
            [Kind::Ftp, Kind::Irc, Kind::Ssh],
        ] {
            // Every arrival order of events with these clocks.
            let mut h = HostState::default();
            for (c, k) in order.iter().enumerate().rev() {
                assert_eq!(ev(&mut h, *k, c as u64 + 1), None, "{order:?}");
            }
            let mut h = HostState::default();
            for (c, k) in order.iter().enumerate() {
                assert_eq!(ev(&mut h, *k, c as u64 + 1), None, "{order:?}");
            }
        }
    }

    #[test]
    fn runs_split_and_stay_bounded() {
        let mut h = HostState::default();
        ev(&mut h, Kind::Ftp, 10);
        ev(&mut h, Kind::Ftp, 30);
        // An SSH at 20 splits the FTP run: 10 < 20 < 30.
        ev(&mut h, Kind::Ssh, 20);
        assert!(ev(&mut h, Kind::Irc, 40).is_some());
        let mut h = HostState::default();
        for c in 0..100 {
            let k = if c % 2 == 0 { Kind::Ftp } else { Kind::Ssh };
            ev(&mut h, k, 1000 - c);
            assert!(h.runs.len() <= MAX_RUNS);
            assert!(h.runs.windows(2).all(|w| w[0].ssh != w[1].ssh));
        }
        let b = h.to_bytes();
        assert_eq!(HostState::from_bytes(&b).unwrap(), h);
    }

    #[test]
    fn lines_across_chunks() {
        let mut l = Line::default();
        let mut got = Vec::new();
        l.feed(0, b"USER x\r\nRE", |s, f| got.push((s.to_vec(), f)));
        l.feed(10, b"TR a.zip\r", |s, f| got.push((s.to_vec(), f)));
        l.feed(19, b"\n", |s, f| got.push((s.to_vec(), f)));
        assert_eq!(got, [(b"USER x".to_vec(), 0), (b"RETR a.zip".to_vec(), 8)]);
        assert!(l.idle());
        // A jump in offsets skips the line it falls in.
        l.feed(30, b"RETR b.zip\nRETR c.exe\n", |s, f| {
            got.push((s.to_vec(), f))
        });
        assert_eq!(got.last().unwrap().0, b"RETR c.exe");
        assert_eq!(got.len(), 3);
    }

    #[test]
    fn classify_commands() {
        let ext = Config::default().extensions;
        let c = |l: &[u8], ftp| {
            let at = Where {
                ftp,
                to_ftp: ftp,
                from_client: true,
            };
            classify(l, 1, at, &ext)
        };
        let client = Where {
            from_client: true,
            ..Where::default()
        };
        assert_eq!(c(b"RETR pub/x.ZIP", true), Kind::Ftp.bit());
        assert_eq!(c(b"retr setup.exe ", true), Kind::Ftp.bit());
        assert_eq!(c(b"RETR index.htm", true), Kind::Ftp.bit());
        assert_eq!(c(b"RETR notes.txt", true), 0);
        assert_eq!(c(b"RETR zip", true), 0);
        assert_eq!(c(b"STOR a.zip", true), 0);
        assert_eq!(c(b"RETR a.zip", false), 0);
        assert_eq!(c(b"USER anonymous", true), 0);
        assert_eq!(c(b"USER anonymous", false), 0);
        assert_eq!(c(b"USER bot 0 * :A bot", false), Kind::Irc.bit());
        assert_eq!(c(b"NICK bot", false), Kind::Irc.bit());
        assert_eq!(c(b":me JOIN #c", false), Kind::Irc.bit());
        assert_eq!(c(b"NICK bot", true), 0);
        assert_eq!(c(b"GET / HTTP/1.1", false), 0);
        assert_eq!(classify(b"SSH-2.0-OpenSSH_9.2", 0, client, &ext), 1);
        assert_eq!(classify(b"SSH-2.0-OpenSSH_9.2", 5, client, &ext), 0);
        let server = Where::default();
        assert_eq!(classify(b"SSH-2.0-OpenSSH_9.2", 0, server, &ext), 1);
        let from_ftp = Where {
            ftp: true,
            ..server
        };
        assert_eq!(
            classify(b"RETR a.zip", 9, from_ftp, &ext),
            0,
            "from the server"
        );
        // IRC lines: from the client side, near the stream's start.
        assert_eq!(classify(b"JOIN #c", 9, server, &ext), 0, "a server's body");
        assert_eq!(
            classify(b"JOIN #c", IRC_HEAD, client, &ext),
            0,
            "deep in a stream"
        );
        assert_eq!(classify(b"JOIN #c", IRC_HEAD - 1, client, &ext), 4);
    }

    #[test]
    fn ftp_data_ports_and_magic() {
        assert_eq!(
            ftp_data_port(b"227 Entering Passive Mode (198,51,100,21,156,64).", false),
            Some(156 * 256 + 64)
        );
        assert_eq!(
            ftp_data_port(b"229 Entering Extended Passive Mode (|||40123|)", false),
            Some(40123)
        );
        assert_eq!(
            ftp_data_port(b"PORT 10,0,0,7,200,10", true),
            Some(200 * 256 + 10)
        );
        assert_eq!(ftp_data_port(b"EPRT |1|10.0.0.7|51234|", true), Some(51234));
        assert_eq!(ftp_data_port(b"PORT 10,0,0,7,200,10", false), None);
        assert_eq!(ftp_data_port(b"227 (1,2,3,4,5)", false), None);
        assert_eq!(ftp_data_port(b"227 (1,2,3,4,999,1)", false), None);
        assert_eq!(ftp_data_port(b"229 (|||x|)", false), None);
        assert_eq!(ftp_data_port(b"227 )(", false), None);
        assert!(qualifying_magic(b"MZ\x90\x00"));
        assert!(qualifying_magic(b"PK\x03\x04\x14"));
        assert!(qualifying_magic(b"<!DOCTYPE HTML>"));
        assert!(qualifying_magic(b"<HTML><body>"));
        assert!(!qualifying_magic(b"PK\x05\x06"));
        assert!(!qualifying_magic(b"plain text"));
        assert!(!qualifying_magic(b"M"));
        assert!(
            qualifying_magic(b"\xef\xbb\xbf<!doctype html>"),
            "a BOM first"
        );
        assert!(qualifying_magic(b"\r\n  <html>"), "whitespace first");
        assert!(
            !qualifying_magic(b"  MZ"),
            "an EXE starts at its first byte"
        );
    }
}
