//! `flowstate run` on a configuration with a `[fastpath]` section: HyperSFC's table pipeline
//! (`flowstate_fastpath`) on the configured input, the full tables in the configured store.
//!
//! Each IPv4 TCP/UDP packet is matched against the tables: its fast-path caches first, the
//! slow path on a miss, in the configured submit mode; the rules' writes (addresses, ports)
//! are applied to the frame with the checksums updated, and dropped packets are not written.
//! Packets the tables cannot match (not IPv4 TCP/UDP, later fragments, malformed) go out
//! unchanged, counted in `unmatched`. Input is processed in chunks of [`CHUNK`] packets, the
//! caches kept from one chunk to the next.

use crate::config::{Config, Input, Output};
use crate::{ConfigError, Error};
use flowstate_fastpath::config::{FastpathConfig, TableRules};
use flowstate_fastpath::fast::FastStats;
use flowstate_fastpath::full;
use flowstate_fastpath::threaded::{self, Offer};
use flowstate_fastpath::{FastPath, Headers};
use flowstate_io::pcap::{PcapWriter, WriterOptions};
use flowstate_io::synth::Synthetic;
use flowstate_io::{PacketBatch, PacketMeta, Sink, Source};
use flowstate_state::Connector;
use flowstate_wire::dissect::Transport;
use flowstate_wire::{ipv4, tcp, udp, Dissection};
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::Instant;

/// Packets read and run through the pipeline at a time.
pub const CHUNK: usize = 8192;
/// Packets in flight between fast and slow path at most.
const WINDOW: usize = 256;

/// One table's line in the summary.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct TableSummary {
    /// The table's name.
    pub name: String,
    /// Rules in its full table at start.
    pub rules: u64,
    /// Entries in its fast-path cache at the end (a gauge).
    pub cached: u64,
    /// Fast-path lookups that found an entry.
    pub hits: u64,
    /// Fast-path lookups that found none.
    pub misses: u64,
    /// Entries installed by the slow path.
    pub installed: u64,
    /// Entries evicted to make room.
    pub evicted: u64,
    /// Installs refused (a dependency group larger than the cache).
    pub uncacheable: u64,
}

/// What a pipeline run did. Serializes to one JSON object with the same names.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct PipelineSummary {
    /// The submit mode.
    pub mode: String,
    /// The store holding the full tables.
    pub backend: String,
    /// Packets read from the input.
    pub packets_in: u64,
    /// Packets written to the output (forwarded and unmatched).
    pub packets_out: u64,
    /// Packets a table dropped.
    pub dropped: u64,
    /// Packets the tables cannot match, forwarded unchanged.
    pub unmatched: u64,
    /// Packets that took the fast path only (no circulation).
    pub fast_path_only: u64,
    /// Circulations to the slow path.
    pub circulations: u64,
    /// Full-table searches.
    pub searches: u64,
    /// Bytes between fast and slow path, both ways.
    pub link_bytes: u64,
    /// Median and 99th-percentile time through the pipeline, microseconds.
    pub latency_p50_us: f64,
    /// 99th percentile.
    pub latency_p99_us: f64,
    /// Forwarded packets by egress port (0: none chosen).
    pub egress: BTreeMap<u16, u64>,
    /// Per table.
    pub tables: Vec<TableSummary>,
    /// The fast path's counters (Bloom selections, lazy passes ended early, ...).
    pub bloom_guesses: u64,
    /// Misses the Bloom filters settled as absent.
    pub bloom_absent: u64,
    /// Detected Bloom false positives.
    pub bloom_unsure: u64,
    /// Lazy passes ended by a key depending on a missed table.
    pub dependency_stops: u64,
    /// Wall-clock time, seconds (loading the full tables excluded).
    pub seconds: f64,
    /// On a live box (the XDP fast path), what the offline run has no use for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub live: Option<LiveCounters>,
}

impl PipelineSummary {
    /// Takes the fast path's Bloom and lazy-pass counters.
    pub(crate) fn fast_stats(&mut self, s: &FastStats) {
        self.bloom_guesses = s.bloom_guesses;
        self.bloom_absent = s.bloom_absent;
        self.bloom_unsure = s.bloom_unsure;
        self.dependency_stops = s.dependency_stops;
    }
}

/// A live box's counters of the way between its XDP program and its slow path.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct LiveCounters {
    /// Frames the slow path answered and sent back through the recirculation port.
    pub answered: u64,
    /// Of those, the packets' first circulations.
    pub first_circulations: u64,
    /// Frames from the program's sockets without a valid circulation header (dropped).
    pub malformed: u64,
    /// Frames on the recirculation port without a valid circulation header (dropped).
    pub forged: u64,
    /// Misses dropped for want of headroom for the circulation header.
    pub no_room: u64,
    /// Misses dropped for want of a slow-path socket on their port and queue.
    pub no_socket: u64,
}

/// `config`'s `[fastpath]` section and every table's rules (its prefix files read).
pub(crate) fn section(config: &Config) -> Result<(&FastpathConfig, Vec<TableRules>), Error> {
    let fp = config.fastpath.as_ref().ok_or_else(|| {
        ConfigError::new(&config.file, "fastpath", "missing: no [fastpath] section")
    })?;
    let rules = fp
        .load_rules()
        .map_err(|(key, reason)| ConfigError::new(&config.file, key, reason))?;
    Ok((fp, rules))
}

/// Runs `config`'s `[fastpath]` pipeline over its input.
pub fn run_pipeline(
    config: &Config,
    connector: Arc<dyn Connector>,
    progress: Option<crate::Progress<'_>>,
) -> Result<PipelineSummary, Error> {
    // The rules' files before the output: a missing one must not truncate an output file.
    let (fp, rules) = section(config)?;
    let pipeline = &fp.pipeline;
    let mut source: Box<dyn Source> = match &config.input {
        Input::Pcap(path) => Box::new(crate::open_pcap(config, path)?),
        Input::Synthetic(s) => Box::new(Synthetic::new(s.config.clone())?),
        Input::Interface(_) => return Err(crate::live_mismatch(config, "input")),
    };
    let mut writer = match &config.output {
        Output::Pcap(path) => Some(PcapWriter::create_with(path, WriterOptions::nanos())?),
        Output::Discard => None,
        Output::Interface(_) => return Err(crate::live_mismatch(config, "output")),
    };
    let loaded = full::load(&*connector, pipeline, &rules).map_err(Error::Fastpath)?;
    let mut fast = FastPath::new(pipeline, fp.mode, loaded.blooms.clone());
    let mut summary = PipelineSummary {
        mode: fp.mode.name().into(),
        backend: connector.name().into(),
        ..PipelineSummary::default()
    };
    let mut latencies = Vec::new();
    let mut batch = PacketBatch::new(CHUNK, 2048);
    let mut out = PacketBatch::new(CHUNK, 2048);
    let mut packets: Vec<(Headers, u16)> = Vec::with_capacity(CHUNK);
    // Per matched packet: its place in the batch and where its layers are.
    let mut index: Vec<(usize, Dissection)> = Vec::with_capacity(CHUNK);
    let start = Instant::now();
    loop {
        if source.recv(&mut batch)? == 0 {
            break;
        }
        summary.packets_in += batch.len() as u64;
        packets.clear();
        index.clear();
        for (i, (frame, _)) in batch.iter().enumerate() {
            if let Some((h, d)) = headers_of(frame) {
                packets.push((h, frame.len().min(usize::from(u16::MAX)) as u16));
                index.push((i, d));
            }
        }
        let report = threaded::run(
            &mut fast,
            pipeline,
            &loaded.prefixes,
            Arc::clone(&connector),
            fp.threads,
            &packets,
            Offer {
                window: WINDOW,
                rate_pps: None,
            },
        )
        .map_err(Error::Fastpath)?;
        summary.searches += report.searches;
        summary.link_bytes += report.bytes_up + report.bytes_down;
        latencies.extend_from_slice(&report.latency_ns);
        out.clear();
        let mut next = 0;
        for i in 0..batch.len() {
            let Some((frame, _)) = batch.get_mut(i) else {
                continue;
            };
            let Some(&(_, d)) = index.get(next).filter(|(at, _)| *at == i) else {
                summary.unmatched += 1;
                out.push(frame, PacketMeta::default());
                continue;
            };
            let o = report.outcomes[next];
            let (before, _) = packets[next];
            summary.circulations += u64::from(report.circulations[next]);
            summary.fast_path_only += u64::from(report.circulations[next] == 0);
            next += 1;
            if o.dropped {
                summary.dropped += 1;
                continue;
            }
            rewrite(frame, &d, &before, &o.headers);
            *summary.egress.entry(o.headers.egress).or_default() += 1;
            out.push(frame, PacketMeta::default());
        }
        summary.packets_out += out.len() as u64;
        if let Some(w) = writer.as_mut() {
            w.send(&out)?;
        }
        if let Some(p) = progress {
            p(batch.len() as u64);
        }
    }
    summary.seconds = start.elapsed().as_secs_f64();
    if let Some(w) = writer {
        w.finish()?;
    }
    latencies.sort_unstable();
    let pct = |q: usize| {
        latencies
            .get(latencies.len().saturating_sub(1) * q / 100)
            .map_or(0.0, |ns| *ns as f64 / 1e3)
    };
    summary.latency_p50_us = pct(50);
    summary.latency_p99_us = pct(99);
    summary.fast_stats(&fast.stats());
    let cached = fast.cached();
    for (t, s) in fast.cache_stats().into_iter().enumerate() {
        summary.tables.push(TableSummary {
            name: pipeline.tables[t].name.clone(),
            rules: loaded.rules[t] as u64,
            cached: cached[t] as u64,
            hits: s.hits,
            misses: s.misses,
            installed: s.installed,
            evicted: s.evicted,
            uncacheable: s.uncacheable,
        });
    }
    Ok(summary)
}

/// The headers of an IPv4 TCP or UDP frame (a first fragment or an unfragmented packet), and
/// where its layers are.
fn headers_of(frame: &[u8]) -> Option<(Headers, Dissection)> {
    let d = flowstate_wire::dissect(frame).ok()?;
    if !matches!(d.transport, Transport::Tcp | Transport::Udp) {
        return None;
    }
    let f = d.flow?;
    let (IpAddr::V4(src), IpAddr::V4(dst)) = (f.src, f.dst) else {
        return None;
    };
    let h = Headers {
        src_ip: u32::from(src),
        dst_ip: u32::from(dst),
        src_port: f.src_port,
        dst_port: f.dst_port,
        proto: f.proto,
        mark: 0,
        egress: 0,
    };
    Some((h, d))
}

/// Writes the address and port changes from `before` to `after` into `frame`, updating the
/// IPv4 header checksum and the TCP/UDP checksum incrementally (RFC 1624; a UDP checksum of
/// 0, "none", stays 0). `d` is the frame's dissection.
fn rewrite(frame: &mut [u8], d: &Dissection, before: &Headers, after: &Headers) {
    let changed = before.src_ip != after.src_ip
        || before.dst_ip != after.dst_ip
        || before.src_port != after.src_port
        || before.dst_port != after.dst_port;
    if !changed {
        return;
    }
    let (Some(l4), l3, end) = (d.l4_offset, d.l3_offset, d.l3_end) else {
        return;
    };
    let Ok(mut ip) = ipv4::Packet::new_checked(&mut frame[l3..end]) else {
        return;
    };
    let (old_src, old_dst) = (ip.src_addr().octets(), ip.dst_addr().octets());
    let (new_src, new_dst) = (
        Ipv4Addr::from(after.src_ip).octets(),
        Ipv4Addr::from(after.dst_ip).octets(),
    );
    ip.set_src_addr(Ipv4Addr::from(new_src));
    ip.set_dst_addr(Ipv4Addr::from(new_dst));
    let l4_bytes = &mut frame[l4..end];
    match d.transport {
        Transport::Tcp => {
            let Ok(mut t) = tcp::Packet::new_checked(&mut l4_bytes[..]) else {
                return;
            };
            t.update_checksum_for_addr(&old_src, &new_src);
            t.update_checksum_for_addr(&old_dst, &new_dst);
            t.set_src_port(after.src_port);
            t.set_dst_port(after.dst_port);
        }
        Transport::Udp => {
            let Ok(mut u) = udp::Packet::new_checked(&mut l4_bytes[..]) else {
                return;
            };
            u.update_checksum_for_addr(&old_src, &new_src);
            u.update_checksum_for_addr(&old_dst, &new_dst);
            u.set_src_port(after.src_port);
            u.set_dst_port(after.dst_port);
        }
        _ => {}
    }
}

impl fmt::Display for PipelineSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "table pipeline ({} submit, full tables in {}): {} packets in {:.2} s",
            self.mode, self.backend, self.packets_in, self.seconds
        )?;
        writeln!(
            f,
            "  out {}  dropped {}  unmatched (not IPv4 TCP/UDP, forwarded unchanged) {}",
            self.packets_out, self.dropped, self.unmatched
        )?;
        writeln!(
            f,
            "  fast path only {}  circulations {}  searches {}  fast<->slow bytes {}",
            self.fast_path_only, self.circulations, self.searches, self.link_bytes
        )?;
        match &self.live {
            None => write!(
                f,
                "  latency p50 {:.1} us  p99 {:.1} us ",
                self.latency_p50_us, self.latency_p99_us
            )?,
            Some(l) => write!(
                f,
                "  answered {}  malformed {}  forged {}  no headroom {}  no socket {} ",
                l.answered, l.malformed, l.forged, l.no_room, l.no_socket
            )?,
        }
        writeln!(
            f,
            " bloom: guesses {} absent {} false positives {}  dependency stops {}",
            self.bloom_guesses, self.bloom_absent, self.bloom_unsure, self.dependency_stops
        )?;
        writeln!(
            f,
            "  {:<14} {:>9} {:>8} {:>10} {:>9} {:>9} {:>8} {:>11}",
            "table", "rules", "cached", "hits", "misses", "installed", "evicted", "uncacheable"
        )?;
        for t in &self.tables {
            writeln!(
                f,
                "  {:<14} {:>9} {:>8} {:>10} {:>9} {:>9} {:>8} {:>11}",
                t.name, t.rules, t.cached, t.hits, t.misses, t.installed, t.evicted, t.uncacheable
            )?;
        }
        let egress: Vec<String> = self
            .egress
            .iter()
            .map(|(p, n)| format!("{p}:{n}"))
            .collect();
        writeln!(f, "  egress port:packets {}", egress.join(" "))
    }
}
