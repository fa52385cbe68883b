//! `flowstate gen`: deterministic synthetic traffic into a pcap file.

use anyhow::{Context, Result};
use clap::Args;
use flowstate_io::pcap::{PcapWriter, TsResolution, WriterOptions};
use flowstate_io::synth::{Profile, SizeDist, SynthConfig, Synthetic};
use flowstate_io::{PacketBatch, Sink, Source};
use std::path::PathBuf;

/// Options of `flowstate gen`; unset ones take the profile's defaults.
#[derive(Debug, Args)]
#[command(after_help = "Examples:\n  \
                        flowstate gen --profile mixed --flows 10000 --packets 1000000 -o trace.pcap\n  \
                        flowstate gen --profile scan --scanners 2 -o scan.pcap   (and scan.pcap.truth.json)\n  \
                        flowstate gen --profile long --ipv6-share 0.5 --size imix --seed 7 -o v6.pcap")]
pub(crate) struct GenArgs {
    /// Traffic profile: long, short, mixed, uniform, scan (also writes the ground truth, its
    /// scanners, to OUTPUT.truth.json) or trojan (CHC's trojan signature among normal hosts;
    /// `--flows` is then the number of inside hosts, and the infected ones are written to
    /// OUTPUT.truth.json).
    #[arg(long, default_value = "mixed")]
    profile: String,
    /// Number of flows (distinct 5-tuples).
    #[arg(long)]
    flows: Option<u64>,
    /// Number of packets (exactly this many are written).
    #[arg(long)]
    packets: Option<u64>,
    /// Seed: the same options and seed give the same file, byte for byte.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Share of flows over IPv6 (0 to 1).
    #[arg(long)]
    ipv6_share: Option<f64>,
    /// Share of flows over TCP, the rest UDP (0 to 1).
    #[arg(long)]
    tcp_share: Option<f64>,
    /// Zipf exponent of flow popularity (0 = no skew).
    #[arg(long)]
    zipf: Option<f64>,
    /// Frame sizes of data packets: a number (fixed), `MIN-MAX` (uniform) or `imix`.
    #[arg(long)]
    size: Option<String>,
    /// Packet rate for the timestamps, packets per second.
    #[arg(long)]
    rate: Option<f64>,
    /// About how many flows are active at once (0 = all from the start).
    #[arg(long)]
    concurrency: Option<u64>,
    /// Profile scan: number of scanners (default 4).
    #[arg(long)]
    scanners: Option<u64>,
    /// Profile scan: probes per scanner (default: one per 5 flows, shared).
    #[arg(long)]
    scan_probes: Option<u64>,
    /// Write nanosecond timestamps (default: microseconds).
    #[arg(long)]
    nanos: bool,
    /// The pcap file to write.
    #[arg(short, long)]
    output: PathBuf,
}

impl GenArgs {
    fn config(&self) -> Result<SynthConfig> {
        let profile: Profile = self.profile.parse()?;
        let mut c = SynthConfig::new(profile);
        c.seed = self.seed;
        if let Some(v) = self.flows {
            c.flows = v;
        }
        if let Some(v) = self.packets {
            c.packets = v;
        }
        if let Some(v) = self.ipv6_share {
            c.ipv6_share = v;
        }
        if let Some(v) = self.tcp_share {
            c.tcp_share = v;
        }
        if let Some(v) = self.zipf {
            c.zipf_s = v;
        }
        if let Some(v) = &self.size {
            c.packet_size = v.parse::<SizeDist>()?;
        }
        if let Some(v) = self.rate {
            c.rate_pps = v;
        }
        if let Some(v) = self.concurrency {
            c.concurrency = v;
        }
        if let Some(v) = self.scanners {
            c.scanners = v;
        }
        if let Some(v) = self.scan_probes {
            c.scan_probes = v;
        }
        c.validate()?;
        Ok(c)
    }
}

/// Generates the trace; returns the number of packets written.
pub(crate) fn run(args: &GenArgs) -> Result<u64> {
    let config = args.config()?;
    let mut source = Synthetic::new(config.clone())?;
    if config.profile == Profile::Scan {
        let path = truth_path(&args.output);
        let json = flowstate_io::synth::truth_json(&config, &source.scanners());
        std::fs::write(&path, json).with_context(|| format!("writing {}", path.display()))?;
    }
    let options = WriterOptions {
        resolution: if args.nanos {
            TsResolution::Nano
        } else {
            TsResolution::Micro
        },
        ..WriterOptions::default()
    };
    let mut sink = PcapWriter::create_with(&args.output, options)?;
    let bar = crate::progress(source.total_packets(), "gen");
    let mut batch = PacketBatch::new(256, 2048);
    let mut written = 0;
    loop {
        let n = source.recv(&mut batch)?;
        if n == 0 {
            break;
        }
        sink.send(&batch)?;
        written += n as u64;
        bar.inc(n as u64);
    }
    sink.finish()
        .with_context(|| format!("writing {}", args.output.display()))?;
    bar.finish_and_clear();
    let config = source.config();
    if config.profile == Profile::Trojan {
        let path = truth_path(&args.output);
        let hosts: Vec<String> = flowstate_io::synth::infected(config)
            .iter()
            .map(|h| format!("\"{h}\""))
            .collect();
        let json = format!(
            "{{\"profile\":\"trojan\",\"seed\":{},\"flows\":{},\"infected\":[{}]}}\n",
            config.seed,
            config.flows,
            hosts.join(",")
        );
        std::fs::write(&path, json).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(written)
}

/// Where `gen --profile scan|trojan -o FILE` writes the ground truth (the scanners, the
/// infected hosts): `FILE.truth.json`.
pub(crate) fn truth_path(output: &std::path::Path) -> PathBuf {
    let mut p = output.as_os_str().to_owned();
    p.push(".truth.json");
    PathBuf::from(p)
}
