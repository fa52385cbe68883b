//! Test-only NFs, sources and sinks.
#![allow(dead_code, unreachable_pub, missing_docs)]

use flowstate_chain::{Runtime, RuntimeOptions};
use flowstate_io::synth::{Profile, SynthConfig, Synthetic};
use flowstate_io::{PacketBatch, PacketMeta, Sink, Source};
use flowstate_nf::{
    BuildError, Context, Direction, NetworkFunction, NfFactory, Packet, Placement, Verdict,
};
use flowstate_state::{Access, Counter, Declare, Scope};
use flowstate_wire::dissect::Network;
use flowstate_wire::FlowKey;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// What probes saw: for each canonical flow, the workers that processed it; and, in order,
/// (probe name, direction, the packet's bytes) of every call.
#[derive(Default)]
pub struct Seen {
    pub workers: HashMap<FlowKey, Vec<u32>>,
    pub log: Vec<(&'static str, Direction, Vec<u8>)>,
}

/// A test NF: counts packets in a state counter, records which worker saw which flow, drops
/// IPv4 packets with TTL 1 ("ttl expired"), forwards the rest.
pub struct Probe {
    pub name: &'static str,
    pub seen: Arc<Mutex<Seen>>,
    pub log: bool,
    /// Panic on the packet with this many packets seen (per worker 0), to test failures.
    pub panic_at: Option<u64>,
    /// Fail building on this worker.
    pub fail_on_worker: Option<u32>,
}

impl Probe {
    pub fn new(name: &'static str) -> Self {
        Probe {
            name,
            seen: Arc::default(),
            log: false,
            panic_at: None,
            fail_on_worker: None,
        }
    }
}

struct ProbeNf {
    name: &'static str,
    worker: u32,
    seen: Arc<Mutex<Seen>>,
    log: bool,
    panic_at: Option<u64>,
    packets: Counter,
    count: u64,
    ticks: u64,
}

impl NfFactory for Probe {
    fn name(&self) -> &'static str {
        self.name
    }

    fn build(
        &self,
        state: &mut Declare<'_>,
        worker: Placement,
    ) -> Result<Box<dyn NetworkFunction>, BuildError> {
        if self.fail_on_worker == Some(worker.partition) {
            return Err(BuildError::Config {
                nf: "probe",
                key: "fail_on_worker".into(),
                reason: "asked to fail".into(),
            });
        }
        Ok(Box::new(ProbeNf {
            name: self.name,
            worker: worker.partition,
            seen: Arc::clone(&self.seen),
            log: self.log,
            panic_at: self.panic_at.filter(|_| worker.partition == 0),
            packets: state.counter("packets", Scope::CrossFlow(&[]), Access::WriteMostly)?,
            count: 0,
            ticks: 0,
        }))
    }
}

impl NetworkFunction for ProbeNf {
    fn name(&self) -> &str {
        self.name
    }

    fn process(&mut self, pkt: &mut Packet<'_>, cx: &Context) -> Verdict {
        assert_eq!(cx.partition, self.worker);
        self.count += 1;
        if Some(self.count) == self.panic_at {
            panic!("probe asked to panic");
        }
        self.packets.add_nowait(1);
        {
            let mut seen = self.seen.lock().unwrap();
            if let Some(flow) = pkt.dissection.flow {
                let w = seen.workers.entry(flow.canonical()).or_default();
                if !w.contains(&self.worker) {
                    w.push(self.worker);
                }
            }
            if self.log {
                seen.log.push((self.name, pkt.direction, pkt.data.to_vec()));
            }
        }
        if pkt.dissection.network == Network::Ipv4 && pkt.data[pkt.dissection.l3_offset + 8] == 1 {
            return Verdict::Drop("ttl expired");
        }
        Verdict::Forward
    }

    fn on_tick(&mut self, _now: u64) {
        self.ticks += 1;
    }

    fn report(&self) -> Vec<(&'static str, i64)> {
        vec![
            ("seen", self.count as i64),
            ("counter", self.packets.get().unwrap_or(-1)),
        ]
    }
}

/// An in-memory trace.
pub struct VecSource {
    pub packets: Vec<(Vec<u8>, PacketMeta)>,
    pub next: usize,
    /// Fail with an error after this many packets.
    pub fail_after: Option<usize>,
}

impl VecSource {
    pub fn new(packets: Vec<(Vec<u8>, PacketMeta)>) -> Self {
        VecSource {
            packets,
            next: 0,
            fail_after: None,
        }
    }
}

impl Source for VecSource {
    fn recv(&mut self, batch: &mut PacketBatch) -> flowstate_io::Result<usize> {
        batch.clear();
        if let Some(limit) = self.fail_after {
            if self.next >= limit {
                return Err(flowstate_io::Error::Format {
                    path: "test.pcap".into(),
                    offset: 1234,
                    reason: "damaged on purpose".into(),
                });
            }
        }
        while self.next < self.packets.len() && !batch.is_full() {
            let (d, m) = &self.packets[self.next];
            batch.push(d, *m);
            self.next += 1;
        }
        Ok(batch.len())
    }
}

/// Collects what it is sent.
#[derive(Default)]
pub struct VecSink {
    pub packets: Vec<Vec<u8>>,
    /// Fail after this many batches.
    pub fail_after: Option<usize>,
    pub batches: usize,
}

impl Sink for VecSink {
    fn send(&mut self, batch: &PacketBatch) -> flowstate_io::Result<()> {
        if Some(self.batches) == self.fail_after {
            return Err(flowstate_io::Error::Io {
                path: "out.pcap".into(),
                source: std::io::Error::other("disk full on purpose"),
            });
        }
        self.batches += 1;
        self.packets.extend(batch.iter().map(|(d, _)| d.to_vec()));
        Ok(())
    }
}

/// A synthetic trace in memory.
pub fn trace(profile: Profile, flows: u64, packets: u64, seed: u64) -> Vec<(Vec<u8>, PacketMeta)> {
    let mut c = SynthConfig::new(profile);
    c.flows = flows;
    c.packets = packets;
    c.seed = seed;
    synthetic(c)
}

/// The packets `c` generates.
pub fn synthetic(c: SynthConfig) -> Vec<(Vec<u8>, PacketMeta)> {
    let mut g = Synthetic::new(c).unwrap();
    let mut b = PacketBatch::new(64, 2048);
    let mut out = Vec::new();
    while g.recv(&mut b).unwrap() > 0 {
        out.extend(b.iter().map(|(d, m)| (d.to_vec(), *m)));
    }
    out
}

/// Options for tests: `workers` workers, batches of 32, default inside prefixes.
pub fn options(workers: usize) -> RuntimeOptions {
    RuntimeOptions {
        workers,
        ..RuntimeOptions::default()
    }
}

pub fn runtime(options: RuntimeOptions, chain: Vec<Arc<dyn NfFactory>>) -> Runtime {
    Runtime::new(
        options,
        chain,
        Arc::new(flowstate_state::local::LocalStore::new()),
    )
}

/// Sets the IPv4 TTL of a frame (no checksum fix: the runtime does not verify it).
pub fn set_ttl(frame: &mut [u8], ttl: u8) -> bool {
    match flowstate_wire::dissect(frame) {
        Ok(d) if d.network == Network::Ipv4 => {
            frame[d.l3_offset + 8] = ttl;
            true
        }
        _ => false,
    }
}

/// A minimal stateful firewall: outbound packets open their flow (per-flow state), inbound
/// packets pass only on an open flow.
pub struct MiniFirewall;

struct MiniFirewallNf {
    flows: flowstate_state::Map<FlowKey, bool>,
}

impl NfFactory for MiniFirewall {
    fn name(&self) -> &'static str {
        "minifw"
    }

    fn build(
        &self,
        state: &mut Declare<'_>,
        _worker: Placement,
    ) -> Result<Box<dyn NetworkFunction>, BuildError> {
        Ok(Box::new(MiniFirewallNf {
            flows: state.map("flows", Scope::PerFlow, Access::ReadWrite)?,
        }))
    }
}

impl NetworkFunction for MiniFirewallNf {
    fn name(&self) -> &str {
        "minifw"
    }

    fn process(&mut self, pkt: &mut Packet<'_>, _cx: &Context) -> Verdict {
        let Some(flow) = pkt.dissection.flow else {
            return Verdict::Drop("not ip");
        };
        match pkt.direction {
            Direction::Outbound => {
                self.flows.insert_nowait(flow.canonical(), true);
                Verdict::Forward
            }
            Direction::Inbound => match self.flows.contains_key(&flow.canonical()) {
                Ok(true) => Verdict::Forward,
                _ => Verdict::Drop("minifw: no state"), // names itself: not prefixed twice,
            },
        }
    }

    fn report(&self) -> Vec<(&'static str, i64)> {
        vec![("flows", self.flows.cached_len() as i64)]
    }
}
