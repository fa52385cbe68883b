//! Soak: the chain (firewall → NAT → load balancer) on the runtime for minutes of churning
//! flows, and whether the process's memory stays flat once the tables have reached their
//! steady size (issue #21 "Soak").
//!
//! Traffic ([`Churn`]): an endless stream of new flows from the inside (10.0.0.0/8), each
//! sending a few packets and then falling silent, so that old flows leave only through the
//! NFs' idle timeouts. Three flows in four are UDP (half to the load balancer's DNS VIP, half
//! to NTP servers beside it), one in four a TCP connection to the VIP's port 80 (SYN, data,
//! FIN, last ACK, with acknowledgment number 0: the source does not see the reflected ISN, so
//! a firewall checking windows strictly would drop them); the reflect stage answers every
//! request as the outside hosts would. At most [`ACTIVE`] flows talk at once, each one packet
//! in turn; when a flow has sent its packets, a new one takes its place. The NFs run with their default timeouts (NAT UDP 5 min,
//! TCP transitory 4 min; firewall UDP 2 min, TIME_WAIT 2 min; LB UDP 5 min, closed TCP
//! 2 min) on the packets' clock, which advances [`TICK_NS`] per outbound packet whatever
//! the machine's speed: a steady state of roughly 200k NAT sessions, reached after about
//! 5 minutes of packet time, and minutes of wall time cover hours of packet time.
//!
//! Measurement: the process's resident set (`/proc/self/statm`) is sampled by the source on
//! the dispatcher thread, while the workers run: once at the end of the warm-up (a third of
//! the run and [`WARM_PACKET_S`] of packet time, or two thirds of the run on a machine too
//! slow for that), then every [`SAMPLES`]th of the rest, the last sample at the end of the
//! input, before the workers drain. The NFs' table sizes are read from the runtime's
//! observer at the same moments. `ratios.rss_end_vs_start` is the last sample over the first
//! (the goal: at most 1.05).

use crate::{Effort, Report};
use flowstate_chain::observe::Observer;
use flowstate_chain::Summary;
use flowstate_chain::{Runtime, RuntimeOptions};
use flowstate_io::{PacketBatch, PacketMeta, Source};
use flowstate_nf::registry;
use flowstate_state::local::LocalStore;
use flowstate_wire::build::{
    tcp_flags, EthernetSpec, FrameSpec, IpSpec, Ipv4Spec, L4Spec, Payload, TcpOptions, TcpSpec,
    UdpSpec,
};
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Flows talking at once.
pub const ACTIVE: usize = 1024;
/// Packet-clock nanoseconds per outbound packet (4,000 outbound packets per second of packet
/// time).
pub const TICK_NS: u64 = 250_000;
/// Packet-clock seconds the warm-up lasts at least (three NAT UDP timeouts), unless it would
/// take more than two thirds of the run.
pub const WARM_PACKET_S: u64 = 900;
/// RSS samples after the warm-up (the first one included).
pub const SAMPLES: usize = 20;
/// The full run's length.
pub const DEFAULT_DURATION: Duration = Duration::from_secs(180);
/// The `--quick` run's length.
pub const QUICK_DURATION: Duration = Duration::from_secs(3);

/// Outbound packets of a UDP flow.
const UDP_PACKETS: u32 = 6;
/// Outbound packets of a TCP connection: SYN, data, FIN, ACK.
const TCP_PACKETS: u32 = 4;
/// The load balancer's VIP.
const VIP: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 10);

/// The chain, as `[[chain]]` tables.
fn chain() -> Vec<(&'static str, String)> {
    let external: Vec<String> = (1..=8).map(|i| format!("\"203.0.113.{i}\"")).collect();
    vec![
        ("firewall", String::new()),
        (
            "nat",
            format!(
                "external = [{}]\nports = \"1024-65535\"",
                external.join(", ")
            ),
        ),
        (
            "lb",
            format!(
                "vips = [{{ vip = \"{VIP}\", port = 53, proto = \"udp\", backends = [\"192.0.2.11\", \"192.0.2.12\", \"192.0.2.13\", \"192.0.2.14\"] }}, \
                 {{ vip = \"{VIP}\", port = 80, proto = \"tcp\", backends = [\"192.0.2.11\", \"192.0.2.12\", \"192.0.2.13\", \"192.0.2.14\"] }}]"
            ),
        ),
    ]
}

/// `flowstate bench soak`: [`DEFAULT_DURATION`], or [`QUICK_DURATION`] with `--quick`.
pub(crate) fn run(effort: Effort) -> Report {
    run_for(match effort {
        Effort::Full => DEFAULT_DURATION,
        Effort::Quick => QUICK_DURATION,
    })
}

/// The resident set of this process, bytes (`None` where `/proc/self/statm` is not there).
pub fn rss_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: sysconf only reads a constant of the system.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    Some(pages * u64::try_from(page).ok().filter(|&p| p > 0).unwrap_or(4096))
}

/// One sample: wall seconds since the start, packet-clock seconds, RSS bytes, the NFs'
/// reports then.
#[derive(Debug, Clone)]
struct Sample {
    wall_s: f64,
    packet_s: f64,
    rss: u64,
    summary: Option<Summary>,
}

/// The churning source: see the module documentation.
struct Churn {
    /// Per slot: the flow it carries and the packets that flow has sent.
    slots: Vec<(u64, u32)>,
    next_slot: usize,
    next_flow: u64,
    /// Outbound packets written.
    packets: u64,
    start: Instant,
    warm_up: Duration,
    duration: Duration,
    observer: Arc<Observer>,
    samples: Vec<Sample>,
    frame: [u8; 128],
}

impl Churn {
    fn new(duration: Duration, observer: Arc<Observer>) -> Self {
        Churn {
            slots: (0..ACTIVE as u64).map(|f| (f, 0)).collect(),
            next_slot: 0,
            next_flow: ACTIVE as u64,
            packets: 0,
            start: Instant::now(),
            warm_up: duration / 3,
            duration,
            observer,
            samples: Vec::with_capacity(SAMPLES + 1),
            frame: [0; 128],
        }
    }

    fn flows_created(&self) -> u64 {
        self.next_flow
    }

    fn sample(&mut self, elapsed: Duration) {
        self.samples.push(Sample {
            wall_s: elapsed.as_secs_f64(),
            packet_s: (self.packets * TICK_NS) as f64 * 1e-9,
            rss: rss_bytes().unwrap_or(0),
            summary: self.observer.summary(),
        });
    }

    /// Writes packet `n` of flow `flow` into `self.frame`; its length.
    fn write(&mut self, flow: u64, n: u32) -> usize {
        let src = Ipv4Addr::from(0x0a00_0001 + (flow % 0x00ff_fff0) as u32);
        let src_port = 1024 + ((flow / 0x00ff_fff0) % 60_000) as u16;
        let ethernet = EthernetSpec::new([2, 0, 0, 0, 0, 2], [2, 0, 0, 0, 0, 1]);
        let (dst, l4, payload) = match flow % 4 {
            // TCP to the VIP's port 80: SYN, data, FIN, the last ACK (the reflect stage
            // answers SYN+ACK, an ACK of the data, FIN+ACK).
            3 => {
                let isn = (flow as u32).wrapping_mul(0x9e37_79b9);
                let (seq, flags, len) = match n {
                    0 => (isn, tcp_flags::SYN, 0),
                    1 => (isn + 1, tcp_flags::ACK | tcp_flags::PSH, 64),
                    2 => (isn + 65, tcp_flags::FIN | tcp_flags::ACK, 0),
                    _ => (isn + 66, tcp_flags::ACK, 0),
                };
                let tcp = TcpSpec {
                    src_port,
                    dst_port: 80,
                    seq,
                    ack: 0,
                    flags,
                    window: 65_535,
                    urgent: 0,
                    options: if n == 0 {
                        TcpOptions {
                            mss: Some(1460),
                            ..TcpOptions::NONE
                        }
                    } else {
                        TcpOptions::NONE
                    },
                };
                (VIP, L4Spec::Tcp(tcp), len)
            }
            // UDP to the VIP's DNS.
            0 | 2 => (
                VIP,
                L4Spec::Udp(UdpSpec {
                    src_port,
                    dst_port: 53,
                }),
                32,
            ),
            // UDP to one of ten NTP servers beside it.
            _ => (
                Ipv4Addr::new(198, 51, 100, 20 + (flow / 4 % 10) as u8),
                L4Spec::Udp(UdpSpec {
                    src_port,
                    dst_port: 123,
                }),
                48,
            ),
        };
        let spec = FrameSpec {
            ethernet,
            ip: IpSpec::V4(Ipv4Spec::new(src, dst)),
            l4,
            payload: Payload::Fill {
                len: payload,
                byte: 0x5a,
            },
            min_len: 60,
        };
        spec.write(&mut self.frame).unwrap_or(0)
    }
}

impl Source for Churn {
    fn recv(&mut self, batch: &mut PacketBatch) -> flowstate_io::Result<usize> {
        batch.clear();
        let elapsed = self.start.elapsed();
        match self.samples.first() {
            None => {
                // Warm: a third of the run and three of the longest timeouts of packet time
                // (the tables at their steady size), or two thirds of the run at most.
                let packet_s = self.packets * TICK_NS / 1_000_000_000;
                if elapsed >= self.warm_up && packet_s >= WARM_PACKET_S
                    || elapsed >= self.duration * 2 / 3
                {
                    self.sample(elapsed);
                }
            }
            Some(first) => {
                let warm = Duration::from_secs_f64(first.wall_s);
                if elapsed >= self.duration {
                    self.sample(elapsed);
                    return Ok(0);
                }
                let every = self.duration.saturating_sub(warm) / SAMPLES as u32;
                if self.samples.len() < SAMPLES
                    && elapsed >= warm + every * self.samples.len() as u32
                {
                    self.sample(elapsed);
                }
            }
        }
        while !batch.is_full() {
            let slot = self.next_slot;
            self.next_slot = (slot + 1) % ACTIVE;
            let (flow, sent) = self.slots[slot];
            let len = self.write(flow, sent);
            let limit = if flow % 4 == 3 {
                TCP_PACKETS
            } else {
                UDP_PACKETS
            };
            self.slots[slot] = if sent + 1 == limit {
                self.next_flow += 1;
                (self.next_flow - 1, 0)
            } else {
                (flow, sent + 1)
            };
            self.packets += 1;
            let meta = PacketMeta {
                timestamp_ns: self.packets * TICK_NS,
                wire_len: len as u32,
                ..PacketMeta::default()
            };
            batch.push(&self.frame[..len], meta);
        }
        Ok(batch.len())
    }
}

/// A report entry of NF `nf` in a sample's summary (0 when absent).
fn entry(s: &Sample, nf: &str, key: &str) -> f64 {
    s.summary
        .as_ref()
        .and_then(|s| s.nfs.iter().find(|n| n.name == nf))
        .and_then(|n| n.report.get(key))
        .map_or(0.0, |&v| v as f64)
}

/// Runs the soak for `duration` (wall time) and reports it.
pub fn run_for(duration: Duration) -> Report {
    let mut report = Report::new("soak");
    let workers = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(2);
    report
        .param("duration_s", duration.as_secs_f64())
        .param("warm_up_min_s", (duration / 3).as_secs_f64())
        .param("warm_up_min_packet_clock_s", WARM_PACKET_S)
        .param("workers", workers)
        .param("active_flows", ACTIVE)
        .param("packet_clock_ns_per_outbound_packet", TICK_NS)
        .param("chain", "firewall -> nat -> lb (default timeouts), reflect")
        .param("backend", "local");
    let factories = chain()
        .into_iter()
        .map(|(name, table)| {
            let table: toml::Table = table.parse().expect("the soak's chain configuration");
            registry::factory(name, &table)
                .unwrap_or_else(|e| panic!("the soak's {name} configuration: {e}"))
        })
        .collect();
    let options = RuntimeOptions {
        workers,
        reflect: true,
        ..RuntimeOptions::default()
    };
    let observer = Observer::new();
    let runtime = Runtime::new(options, factories, Arc::new(LocalStore::new()))
        .with_observer(observer.clone());
    let mut source = Churn::new(duration, observer);
    let summary = match runtime.run(&mut source, None) {
        Ok(s) => s,
        Err(e) => {
            report.param("error", e.to_string());
            return report;
        }
    };
    let samples = &source.samples;
    let (Some(first), Some(last)) = (samples.first(), samples.last()) else {
        report.param("error", "the run ended before its warm-up");
        return report;
    };
    let mb = |b: u64| b as f64 / (1024.0 * 1024.0);
    let max = samples.iter().map(|s| s.rss).max().unwrap_or(0);
    report
        .param(
            "rss_samples_mb",
            samples
                .iter()
                .map(|s| (mb(s.rss) * 10.0).round() / 10.0)
                .collect::<Vec<_>>(),
        )
        .param(
            "sample_wall_s",
            samples
                .iter()
                .map(|s| (s.wall_s * 10.0).round() / 10.0)
                .collect::<Vec<_>>(),
        );
    report
        .metric("rss_mb_start", mb(first.rss))
        .metric("rss_mb_end", mb(last.rss))
        .metric("rss_mb_max", mb(max))
        .metric("wall_s_start", first.wall_s)
        .metric("wall_s_end", last.wall_s)
        .metric("packet_clock_s_start", first.packet_s)
        .metric("packet_clock_s_end", last.packet_s)
        .metric("flows_created", source.flows_created() as f64)
        .metric("packets_in", summary.packets_in as f64)
        .metric("reflected", summary.reflected as f64)
        .metric("dropped", summary.dropped_total as f64)
        .metric(
            "mpps",
            (summary.packets_in + summary.reflected) as f64 / summary.wall_s / 1e6,
        );
    for (nf, key, name) in [
        ("nat", "active_sessions", "nat_sessions"),
        ("nat", "active_mappings", "nat_mappings"),
        ("nat", "pool_free", "nat_pool_free"),
        ("firewall", "tracked", "firewall_tracked"),
        ("lb", "flows", "lb_flows"),
    ] {
        report
            .metric(&format!("{name}_start"), entry(first, nf, key))
            .metric(&format!("{name}_end"), entry(last, nf, key));
    }
    report
        .metric(
            "nat_expired_sessions",
            entry(last, "nat", "expired_sessions"),
        )
        .metric(
            "firewall_conns_opened",
            entry(last, "firewall", "conns_opened"),
        )
        .metric(
            "firewall_conns_expired",
            entry(last, "firewall", "conns_expired"),
        )
        // Every flow is one NAT session: the NAT's expiries are the flows' ends.
        .metric("flows_expired", entry(last, "nat", "expired_sessions"));
    if first.rss > 0 {
        report
            .ratio("rss_end_vs_start", last.rss as f64 / first.rss as f64)
            .ratio("rss_max_vs_start", max as f64 / first.rss as f64);
    }
    report
}
