//! `flowstate inspect`: what a capture holds.

use anyhow::Result;
use flowstate_io::{pcap::PcapReader, PacketBatch, Source};
use flowstate_wire::dissect::{verify_checksums, Network, Transport};
use flowstate_wire::{dissect, FlowKey};
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
use std::path::Path;

/// Everything `inspect` reports.
#[derive(Debug, Default, Serialize)]
pub(crate) struct Summary {
    pub(crate) file: String,
    pub(crate) packets: u64,
    pub(crate) bytes: u64,
    pub(crate) first_ns: Option<u64>,
    pub(crate) last_ns: Option<u64>,
    /// Packets per protocol name (`ipv4`, `ipv6`, `arp`, `tcp`, `udp`, `icmp`, `icmpv6`,
    /// `vlan`, `fragment`, `other-l3`, `other-l4`).
    pub(crate) protocols: BTreeMap<&'static str, u64>,
    /// Distinct direction-independent flows.
    pub(crate) flows: u64,
    pub(crate) malformed: u64,
    /// Malformed packets by `layer: reason`.
    pub(crate) malformed_reasons: BTreeMap<String, u64>,
    pub(crate) bad_ip_checksums: u64,
    pub(crate) bad_transport_checksums: u64,
    pub(crate) top_flows: Vec<FlowCount>,
    /// Set when the file is damaged part-way: what was read before stays in the summary.
    pub(crate) error: Option<String>,
}

/// One flow in the top list.
#[derive(Debug, Serialize)]
pub(crate) struct FlowCount {
    pub(crate) flow: String,
    pub(crate) packets: u64,
    pub(crate) bytes: u64,
}

pub(crate) fn inspect(
    path: &Path,
    top: usize,
    progress: &indicatif::ProgressBar,
) -> Result<Summary> {
    let mut reader = PcapReader::open(path)?;
    let mut batch = PacketBatch::new(256, 65536);
    let mut s = Summary {
        file: path.display().to_string(),
        ..Summary::default()
    };
    let mut flows: HashMap<FlowKey, (u64, u64)> = HashMap::new();
    loop {
        let n = match reader.recv(&mut batch) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) => {
                s.error = Some(e.to_string());
                break;
            }
        };
        progress.inc(n as u64);
        for (frame, meta) in batch.iter() {
            s.packets += 1;
            s.bytes += u64::from(meta.wire_len.max(frame.len() as u32));
            s.first_ns = Some(
                s.first_ns
                    .map_or(meta.timestamp_ns, |f| f.min(meta.timestamp_ns)),
            );
            s.last_ns = Some(
                s.last_ns
                    .map_or(meta.timestamp_ns, |l| l.max(meta.timestamp_ns)),
            );
            let d = match dissect(frame) {
                Ok(d) => d,
                Err(e) => {
                    s.malformed += 1;
                    *s.malformed_reasons.entry(e.to_string()).or_default() += 1;
                    continue;
                }
            };
            let mut count = |name| *s.protocols.entry(name).or_default() += 1;
            if d.vlan_count > 0 {
                count("vlan");
            }
            count(match d.network {
                Network::Ipv4 => "ipv4",
                Network::Ipv6 => "ipv6",
                Network::Arp => "arp",
                Network::Other(_) => "other-l3",
            });
            if d.fragment != flowstate_wire::dissect::Fragment::None {
                count("fragment");
            }
            match d.transport {
                Transport::Tcp => count("tcp"),
                Transport::Udp => count("udp"),
                Transport::Icmpv4 { .. } => count("icmp"),
                Transport::Icmpv6 { .. } => count("icmpv6"),
                Transport::Other => count("other-l4"),
                Transport::None => {}
            }
            let sums = verify_checksums(frame, &d);
            s.bad_ip_checksums += u64::from(sums.ip == Some(false));
            s.bad_transport_checksums += u64::from(sums.transport == Some(false));
            if let Some(flow) = d.flow {
                let e = flows.entry(flow.canonical()).or_default();
                e.0 += 1;
                e.1 += u64::from(meta.wire_len);
            }
        }
    }
    s.flows = flows.len() as u64;
    let mut ranked: Vec<_> = flows.into_iter().collect();
    ranked.sort_by(|a, b| {
        b.1 .0
            .cmp(&a.1 .0)
            .then(b.1 .1.cmp(&a.1 .1))
            .then(a.0.cmp(&b.0))
    });
    s.top_flows = ranked
        .into_iter()
        .take(top)
        .map(|(k, (packets, bytes))| FlowCount {
            flow: k.to_string(),
            packets,
            bytes,
        })
        .collect();
    Ok(s)
}

impl Summary {
    pub(crate) fn print(&self) {
        println!("file        {}", self.file);
        println!("packets     {}", self.packets);
        println!("bytes       {}", self.bytes);
        if let (Some(a), Some(b)) = (self.first_ns, self.last_ns) {
            let secs = (b - a) as f64 / 1e9;
            println!("duration    {secs:.6} s");
        }
        println!("flows       {} (direction-independent)", self.flows);
        let protos: Vec<String> = self
            .protocols
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        println!("protocols   {}", protos.join(", "));
        println!("malformed   {}", self.malformed);
        for (reason, n) in &self.malformed_reasons {
            println!("  {n:>10}  {reason}");
        }
        println!(
            "checksums   {} bad ip, {} bad transport",
            self.bad_ip_checksums, self.bad_transport_checksums
        );
        if !self.top_flows.is_empty() {
            println!("top flows   packets      bytes  flow");
            for f in &self.top_flows {
                println!("          {:>9} {:>10}  {}", f.packets, f.bytes, f.flow);
            }
        }
        if let Some(e) = &self.error {
            println!("error       {e} (the counts above cover the packets before it)");
        }
    }
}
