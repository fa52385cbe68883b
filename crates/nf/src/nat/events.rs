//! NAT event logging: who had which external endpoint when, as carrier-grade NATs must keep it
//! (RFC 8158 over IPFIX, RFC 7011, to a UDP collector; and/or JSON lines to a file).
//!
//! ```toml
//! events = { ipfix = "192.0.2.50:4739", json = "/var/log/flowstate/nat.jsonl" }
//! # queue = 65536              events waiting between a worker and the exporter, at most
//! # template_interval = "60s"  IPFIX templates sent again this often (RFC 7011 §10.3.6)
//! # observation_domain = 1
//! # path_mtu = 1400            IPFIX message size, at most
//! ```
//!
//! Events: session create and delete, mapping (BIB) create and delete, ports exhausted (the
//! paired address has no free port; at most one per worker and second), quota exceeded (the
//! session limit; the same). A worker gathers events in buffers of 256 and hands each full
//! buffer (and at every tick what it has) to the exporter without waiting; when the exporter
//! is `queue` events behind, events are lost and counted (`events_lost`), so logging never
//! slows or blocks the data path. One exporter thread per NAT drains the queue every 10 ms,
//! packs IPFIX messages up to `path_mtu`, writes JSON lines, and flushes both at least every
//! 100 ms and when the NAT stops. The JSON file is appended to; rotate it with logrotate's
//! `copytruncate`. Without `events`, the same events feed the live stream
//! ([`crate::event_stream`], `flowstate state events`) while it has readers.

use super::ipfix::Encoder;
use super::NF;
use crate::event_stream;
use flowstate_state::Nanos;
use serde::Deserialize;
use std::fmt::Write as _;
use std::io::Write as _;
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::path::PathBuf;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TryRecvError, TrySendError};
use std::sync::{Arc, Mutex, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// `events = { ... }` of a NAT.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventsConfig {
    /// The IPFIX collector (UDP).
    #[serde(default)]
    pub ipfix: Option<SocketAddr>,
    /// A file to append JSON lines to.
    #[serde(default)]
    pub json: Option<PathBuf>,
    /// Events waiting for the exporter, at most, per worker (default 65,536).
    #[serde(default = "default_queue")]
    pub queue: usize,
    /// How often IPFIX templates are sent again (default 60 s).
    #[serde(
        default = "default_template_interval",
        deserialize_with = "flowstate_config::deserialize_duration"
    )]
    pub template_interval: Duration,
    /// The IPFIX observation domain (default 1).
    #[serde(default = "default_domain")]
    pub observation_domain: u32,
    /// IPFIX message size, at most (default 1,400 bytes).
    #[serde(default = "default_path_mtu")]
    pub path_mtu: u16,
}

fn default_queue() -> usize {
    65_536
}
fn default_template_interval() -> Duration {
    Duration::from_secs(60)
}
fn default_domain() -> u32 {
    1
}
fn default_path_mtu() -> u16 {
    1400
}

impl EventsConfig {
    /// No log, only the live stream (`flowstate state events`) when someone reads it.
    pub(super) fn stream_only() -> EventsConfig {
        EventsConfig {
            ipfix: None,
            json: None,
            // The stream's readers hold their own 4,096 lines.
            queue: 4096,
            template_interval: default_template_interval(),
            observation_domain: default_domain(),
            path_mtu: default_path_mtu(),
        }
    }

    /// Whether events are logged (not only streamed).
    fn logs(&self) -> bool {
        self.ipfix.is_some() || self.json.is_some()
    }

    /// What is wrong with it: `(key under events, reason)`.
    pub fn problems(&self) -> Vec<(&'static str, String)> {
        let mut out = Vec::new();
        if self.ipfix.is_none() && self.json.is_none() {
            out.push((
                "ipfix",
                "expected a collector (ipfix = \"host:port\") or a file (json = \"path\")".into(),
            ));
        }
        if !(1..=1 << 24).contains(&self.queue) {
            out.push(("queue", "expected 1 to 16,777,216 events".into()));
        }
        if !(128..=65_000).contains(&self.path_mtu) {
            out.push(("path_mtu", "expected 128 to 65,000 bytes".into()));
        }
        if self.template_interval.is_zero() {
            out.push(("template_interval", "expected a duration above zero".into()));
        }
        out
    }
}

/// What happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    /// A session was created.
    SessionCreate,
    /// A session ended (timed out, or ended early to make room).
    SessionDelete,
    /// An inside endpoint got its external endpoint.
    MappingCreate,
    /// An inside endpoint's mapping ended with its last session.
    MappingDelete,
    /// A new mapping found no free port of its paired address.
    PortsExhausted,
    /// A new session found the session limit reached.
    QuotaExceeded,
}

impl EventKind {
    /// Its name in JSON lines.
    pub fn name(self) -> &'static str {
        match self {
            EventKind::SessionCreate => "session-create",
            EventKind::SessionDelete => "session-delete",
            EventKind::MappingCreate => "mapping-create",
            EventKind::MappingDelete => "mapping-delete",
            EventKind::PortsExhausted => "ports-exhausted",
            EventKind::QuotaExceeded => "quota-exceeded",
        }
    }
}

/// One NAT event. Fields an event kind has no use for are zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event {
    /// What happened.
    pub kind: EventKind,
    /// When (the NAT's clock: ns since the Unix epoch on a live box).
    pub at: Nanos,
    /// IP protocol.
    pub proto: u8,
    /// The inside endpoint.
    pub inside: (Ipv4Addr, u16),
    /// The remote endpoint (sessions).
    pub remote: (Ipv4Addr, u16),
    /// The external endpoint (ports exhausted: the address).
    pub external: (Ipv4Addr, u16),
    /// The session limit (quota exceeded).
    pub limit: u32,
}

/// Events a worker gathers before it hands them to the exporter at once (one exchange between
/// the cores per batch, not per event).
const EVENT_BATCH: usize = 256;

/// Events on their way to the exporter, and where their buffer goes back to.
struct Batch {
    events: Vec<Event>,
    back: SyncSender<Vec<Event>>,
}

impl std::fmt::Debug for Batch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batch")
            .field("events", &self.events.len())
            .finish()
    }
}

/// A worker's side: gathers events in a buffer of its own and hands full buffers (and, at each
/// tick, what it has) to the exporter without waiting. Buffers circulate between the two, so
/// nothing is allocated after start; when none is free (the exporter is behind) or the
/// exporter's queue is full, events are lost and counted.
#[derive(Debug)]
pub(super) struct WorkerEvents {
    tx: SyncSender<Batch>,
    back: SyncSender<Vec<Event>>,
    spare: Receiver<Vec<Event>>,
    buf: Vec<Event>,
    /// Whether events are logged; else they are made only while the stream has readers.
    logs: bool,
    /// Events lost because no buffer had room.
    pub(super) lost: u64,
    last_exhausted: Option<Nanos>,
    last_quota: Option<Nanos>,
    /// Declared after `tx`, so dropped after it: the last worker to go waits for the
    /// exporter to drain and flush.
    _exporter: Arc<Exporter>,
}

/// Ports exhausted and quota exceeded are sent at most this often per worker.
const RESOURCE_EVENT_GAP: Nanos = 1_000_000_000;

impl WorkerEvents {
    /// A worker's handle on `tx`, with room for about `queue` events in flight.
    fn new(tx: SyncSender<Batch>, queue: usize, logs: bool, exporter: Arc<Exporter>) -> Self {
        let buffers = (queue / EVENT_BATCH).max(2);
        let (back, spare) = sync_channel(buffers);
        for _ in 1..buffers {
            let _ = back.try_send(Vec::with_capacity(EVENT_BATCH));
        }
        WorkerEvents {
            tx,
            back,
            spare,
            buf: Vec::with_capacity(EVENT_BATCH),
            logs,
            lost: 0,
            last_exhausted: None,
            last_quota: None,
            _exporter: exporter,
        }
    }

    /// Takes `e` (lost and counted when no buffer has room).
    #[inline]
    pub(super) fn send(&mut self, e: Event) {
        if !self.logs && !event_stream::hub().active() {
            return;
        }
        if self.buf.len() == EVENT_BATCH {
            self.flush();
        }
        if self.buf.len() < EVENT_BATCH {
            self.buf.push(e); // within its capacity: no allocation
        } else {
            self.lost += 1;
        }
    }

    /// Hands the events gathered so far to the exporter.
    pub(super) fn flush(&mut self) {
        if self.buf.is_empty() {
            return;
        }
        let Ok(next) = self.spare.try_recv() else {
            self.lost += self.buf.len() as u64;
            self.buf.clear();
            return;
        };
        let events = std::mem::replace(&mut self.buf, next);
        let batch = Batch {
            events,
            back: self.back.clone(),
        };
        if let Err(TrySendError::Full(b) | TrySendError::Disconnected(b)) = self.tx.try_send(batch)
        {
            let mut events = b.events;
            self.lost += events.len() as u64;
            events.clear();
            let _ = self.back.try_send(events);
        }
    }

    /// Whether events are logged (`events` configured), not only streamed.
    pub(super) fn logs(&self) -> bool {
        self.logs
    }

    /// Takes `e` unless one of its kind went within the last second (a flood of new flows
    /// against a full table is one fact, not one per packet).
    pub(super) fn send_limited(&mut self, e: Event) {
        let last = match e.kind {
            EventKind::PortsExhausted => &mut self.last_exhausted,
            _ => &mut self.last_quota,
        };
        if last.is_some_and(|t| e.at < t.saturating_add(RESOURCE_EVENT_GAP)) {
            return;
        }
        *last = Some(e.at);
        self.send(e);
    }
}

impl Drop for WorkerEvents {
    /// What is gathered goes to the exporter before the worker does.
    fn drop(&mut self) {
        self.flush();
    }
}

/// A NAT's event log: the exporter thread, started by the first worker built and stopped
/// (drained and flushed) when the last worker goes.
#[derive(Debug)]
pub(super) struct EventLog {
    config: EventsConfig,
    exporter: Mutex<Weak<Exporter>>,
}

/// The running exporter, shared by the workers' handles.
#[derive(Debug)]
struct Exporter {
    tx: Option<SyncSender<Batch>>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for Exporter {
    /// Every worker's sender is gone: with this one, the exporter drains, flushes and ends.
    fn drop(&mut self) {
        drop(self.tx.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl EventLog {
    /// The log `config` asks for; nothing starts until [`EventLog::worker`].
    pub(super) fn new(config: EventsConfig) -> EventLog {
        EventLog {
            config,
            exporter: Mutex::new(Weak::new()),
        }
    }

    /// A worker's handle, starting the exporter (its socket, its file) unless one runs.
    /// Errors name the key (`json`, `ipfix`) and say why.
    pub(super) fn worker(&self) -> Result<WorkerEvents, (&'static str, String)> {
        let mut running = self.exporter.lock().unwrap_or_else(|e| e.into_inner());
        let exporter = match running.upgrade() {
            Some(e) => e,
            None => {
                let out = Outputs::open(&self.config)?;
                // Room for every worker's buffers (16 workers' worth).
                let (tx, rx) = sync_channel((self.config.queue / EVENT_BATCH).max(2) * 16);
                let config = self.config.clone();
                let thread = std::thread::Builder::new()
                    .name("nat-events".into())
                    .spawn(move || export(rx, out, &config))
                    .map_err(|e| ("ipfix", format!("cannot start the exporter: {e}")))?;
                let e = Arc::new(Exporter {
                    tx: Some(tx),
                    thread: Some(thread),
                });
                *running = Arc::downgrade(&e);
                e
            }
        };
        let tx = exporter
            .tx
            .clone()
            .ok_or(("ipfix", "the exporter stopped".to_string()))?;
        Ok(WorkerEvents::new(
            tx,
            self.config.queue,
            self.config.logs(),
            exporter,
        ))
    }
}

/// Where events go.
struct Outputs {
    /// A socket not connected to the collector (a connected one would refuse the next message
    /// after the ICMP error of one the collector missed), and the collector.
    ipfix: Option<(UdpSocket, SocketAddr)>,
    json: Option<std::io::BufWriter<std::fs::File>>,
}

impl Outputs {
    fn open(config: &EventsConfig) -> Result<Outputs, (&'static str, String)> {
        let ipfix = match config.ipfix {
            None => None,
            Some(collector) => {
                let any: SocketAddr = if collector.is_ipv4() {
                    (Ipv4Addr::UNSPECIFIED, 0).into()
                } else {
                    (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
                };
                let s = UdpSocket::bind(any)
                    .map_err(|e| ("ipfix", format!("cannot send to {collector}: {e}")))?;
                Some((s, collector))
            }
        };
        let json = match &config.json {
            None => None,
            Some(path) => Some(std::io::BufWriter::new(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)
                    .map_err(|e| ("json", format!("cannot open {}: {e}", path.display())))?,
            )),
        };
        Ok(Outputs { ipfix, json })
    }
}

fn unix_secs() -> u32 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as u32)
}

/// The exporter: drains `rx` until every sender is gone, then flushes and returns.
fn export(rx: Receiver<Batch>, mut out: Outputs, config: &EventsConfig) {
    let mut enc = Encoder::new(config.observation_domain, usize::from(config.path_mtu));
    let mut next_templates = Instant::now();
    let mut last_flush = Instant::now();
    let mut line = String::with_capacity(256);
    let mut send = |m: &[u8]| {
        if let Some((s, to)) = &out.ipfix {
            // Events are not held for a collector that is down.
            let _ = s.send_to(m, to);
        }
    };
    loop {
        if out.ipfix.is_some() && Instant::now() >= next_templates {
            send(&enc.templates(unix_secs()));
            next_templates = Instant::now() + config.template_interval;
        }
        let mut done = false;
        let mut got = 0;
        while got < 64 {
            match rx.try_recv() {
                Ok(Batch { mut events, back }) => {
                    got += 1;
                    let secs = unix_secs();
                    let hub = event_stream::hub();
                    for e in &events {
                        if out.ipfix.is_some() {
                            enc.push(e, secs, &mut send);
                        }
                        if out.json.is_some() || hub.active() {
                            line.clear();
                            json_line(e, &mut line);
                        }
                        if let Some(j) = out.json.as_mut() {
                            let _ = j.write_all(line.as_bytes());
                        }
                        if hub.active() {
                            hub.publish(NF, line.trim_end());
                        }
                    }
                    events.clear();
                    let _ = back.try_send(events);
                }
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => {
                    done = true;
                    break;
                }
            }
        }
        if done || last_flush.elapsed() >= Duration::from_millis(100) {
            enc.finish(&mut send);
            if let Some(j) = out.json.as_mut() {
                let _ = j.flush();
            }
            last_flush = Instant::now();
        }
        if done {
            return;
        }
        if got == 0 {
            // Polled, not woken: a sender never pays for waking this thread.
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// `e` as one JSON line.
pub(super) fn json_line(e: &Event, out: &mut String) {
    let proto = crate::listing::proto_name(e.proto).unwrap_or("other");
    let _ = write!(
        out,
        "{{\"time_ms\":{},\"nf\":\"{NF}\",\"event\":\"{}\"",
        e.at / 1_000_000,
        e.kind.name()
    );
    match e.kind {
        EventKind::PortsExhausted => {
            let _ = write!(out, ",\"external\":\"{}\"", e.external.0);
        }
        EventKind::QuotaExceeded => {
            let _ = write!(out, ",\"max_sessions\":{}", e.limit);
        }
        kind => {
            let _ = write!(
                out,
                ",\"proto\":\"{proto}\",\"inside\":\"{}:{}\",\"external\":\"{}:{}\"",
                e.inside.0, e.inside.1, e.external.0, e.external.1
            );
            if matches!(kind, EventKind::SessionCreate | EventKind::SessionDelete) {
                let _ = write!(out, ",\"remote\":\"{}:{}\"", e.remote.0, e.remote.1);
            }
        }
    }
    out.push_str("}\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_lines_say_what_happened() {
        let e = Event {
            kind: EventKind::SessionCreate,
            at: 1_700_000_000_123_456_789,
            proto: 17,
            inside: (Ipv4Addr::new(10, 0, 0, 2), 5353),
            remote: (Ipv4Addr::new(198, 51, 100, 2), 53),
            external: (Ipv4Addr::new(203, 0, 113, 1), 20001),
            limit: 0,
        };
        let mut s = String::new();
        json_line(&e, &mut s);
        let v: serde_json::Value = serde_json::from_str(&s).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"time_ms": 1_700_000_000_123u64, "nf": "nat", "event": "session-create",
                "proto": "udp", "inside": "10.0.0.2:5353", "external": "203.0.113.1:20001",
                "remote": "198.51.100.2:53"})
        );
        s.clear();
        json_line(
            &Event {
                kind: EventKind::QuotaExceeded,
                limit: 9,
                ..e
            },
            &mut s,
        );
        assert!(s.ends_with("\"max_sessions\":9}\n"), "{s}");
    }

    #[test]
    fn an_exporter_behind_costs_events_and_counts_them() {
        let dir = tempfile::tempdir().unwrap();
        let config = EventsConfig {
            ipfix: None,
            json: Some(dir.path().join("e.jsonl")),
            queue: 4,
            template_interval: Duration::from_secs(60),
            observation_domain: 1,
            path_mtu: 1400,
        };
        assert!(config.problems().is_empty());
        let log = EventLog::new(config);
        let mut w = log.worker().unwrap();
        let e = Event {
            kind: EventKind::SessionCreate,
            at: 0,
            proto: 6,
            inside: (Ipv4Addr::LOCALHOST, 1),
            remote: (Ipv4Addr::LOCALHOST, 2),
            external: (Ipv4Addr::LOCALHOST, 3),
            limit: 0,
        };
        for _ in 0..100_000 {
            w.send(e);
        }
        w.flush();
        let lost = w.lost;
        assert!(lost > 0, "a queue of 4 never filled");
        drop(log);
        drop(w); // the last worker: the exporter drains and flushes
        let written = std::fs::read_to_string(dir.path().join("e.jsonl")).unwrap();
        assert_eq!(written.lines().count() as u64 + lost, 100_000);
    }

    #[test]
    fn resource_events_go_at_most_once_a_second() {
        let (tx, rx) = sync_channel(16);
        let exporter = Arc::new(Exporter {
            tx: None,
            thread: None,
        });
        let mut w = WorkerEvents::new(tx, 1024, true, exporter);
        let e = |kind, at| Event {
            kind,
            at,
            proto: 0,
            inside: (Ipv4Addr::UNSPECIFIED, 0),
            remote: (Ipv4Addr::UNSPECIFIED, 0),
            external: (Ipv4Addr::UNSPECIFIED, 0),
            limit: 0,
        };
        for ms in [0, 10, 999, 1000, 1500, 2100] {
            w.send_limited(e(EventKind::PortsExhausted, ms * 1_000_000));
        }
        w.send_limited(e(EventKind::QuotaExceeded, 5));
        w.flush();
        let got: Vec<(EventKind, u64)> = rx
            .try_iter()
            .flat_map(|b| b.events)
            .map(|e| (e.kind, e.at / 1_000_000))
            .collect();
        assert_eq!(
            got,
            [
                (EventKind::PortsExhausted, 0),
                (EventKind::PortsExhausted, 1000),
                (EventKind::PortsExhausted, 2100),
                (EventKind::QuotaExceeded, 0)
            ]
        );
    }
}
