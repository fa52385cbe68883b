//! The flow cache ([`flowstate_nf::stage::FlowCache`]) against the chain it fronts, on the real
//! runtime: the `nf-throughput` traffic (UDP flows from clients to the LB's VIP, 64-byte
//! frames, a fixed random flow order) through firewall → NAT → LB on one worker that reads
//! its own input (`Runtime::run_generated`: no dispatcher thread), with and without
//! `[runtime] flow_cache`, alternating in one bench run.
//!
//! Each flow sends one packet a pass; packets are stamped at [`RATE`] packets a second of
//! runtime time, so at a million flows a flow's packets are 0.1 s apart. The timed passes
//! span two of the cache's default refresh (1 s) of runtime time, so every flow's entry is
//! renewed by the chain as in a steady state: at a million flows, one packet in five. The
//! first pass opens every flow (through the chain either way) and is not timed.

use crate::cluster_lab::median;
use crate::nf_throughput::{chains, flow_keys, frame, FRAME};
use crate::Report;
use flowstate_chain::{Runtime, RuntimeOptions};
use flowstate_io::{PacketBatch, Source};
use flowstate_nf::stage::{FlowCacheOptions, DEFAULT_CAPACITY, DEFAULT_REFRESH};
use flowstate_nf::NfFactory;
use flowstate_state::local::LocalStore;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Packets a second of runtime time the replayed traffic is stamped at.
pub(crate) const RATE: u64 = 10_000_000;

/// The frames of every flow, `passes` times over, stamped at [`RATE`]. The worker reads it
/// between batches, so the time it is first asked for a packet past the first pass and the time it
/// says "no more" bracket the steady passes (`steady`).
struct Replay<'a> {
    frames: &'a [[u8; FRAME]],
    passes: usize,
    next: usize,
    steady: &'a Mutex<(Option<Instant>, Option<Instant>)>,
}

impl Source for Replay<'_> {
    fn recv(&mut self, batch: &mut PacketBatch) -> flowstate_io::Result<usize> {
        batch.clear();
        let total = self.frames.len() * self.passes;
        let mut steady = self.steady.lock().unwrap_or_else(|e| e.into_inner());
        if self.next >= self.frames.len() {
            steady.0.get_or_insert_with(Instant::now);
        }
        if self.next == total {
            steady.1.get_or_insert_with(Instant::now);
        }
        while self.next < total && !batch.is_full() {
            let f = &self.frames[self.next % self.frames.len()];
            let ts = self.next as u64 * 1_000_000_000 / RATE;
            batch.push_with(|buf, m| {
                buf[..FRAME].copy_from_slice(f);
                m.timestamp_ns = ts;
                m.wire_len = FRAME as u32;
                FRAME
            });
            self.next += 1;
        }
        Ok(batch.len())
    }
}

/// Adds `flow_cache_*` metrics and `ratios.flow_cache_vs_chain_{label}` for each flow set:
/// `rounds` rounds of the chain without, then with, the cache (medians), each over at least
/// `packets` timed packets and `trace` of runtime time.
pub(crate) fn measure(
    report: &mut Report,
    flow_sets: &[(usize, &str)],
    packets: usize,
    trace: Duration,
    rounds: usize,
) {
    let packets = packets.max((trace.as_nanos() * u128::from(RATE) / 1_000_000_000) as usize);
    report
        .param("flow_cache_stamped_pps", RATE)
        .param("flow_cache_timed_packets_min", packets)
        .param("flow_cache_refresh_ms", DEFAULT_REFRESH.as_millis() as u64);
    let chain = chains()
        .into_iter()
        .find(|(name, _)| *name == "chain")
        .expect("the chain")
        .1;
    let factories: Vec<Arc<dyn NfFactory>> = chain
        .iter()
        .map(|(name, table)| {
            let table: toml::Table = table.parse().expect("bench config");
            flowstate_nf::registry::factory(name, &table).expect("bench NF")
        })
        .collect();
    for &(flows, label) in flow_sets {
        let passes = 1 + packets.div_ceil(flows).max(1);
        let keys = flow_keys(flows);
        let order = crate::nf_throughput::visit_order(keys.len());
        let frames: Vec<[u8; FRAME]> = order.iter().map(|&i| frame(&keys[i])).collect();
        let (mut plain, mut cached, mut hits) = (Vec::new(), Vec::new(), 0.0);
        // Four entries a flow: a set of four ways then rarely has a fifth flow to evict for.
        let cache = FlowCacheOptions {
            capacity: DEFAULT_CAPACITY.max(4 * flows),
            refresh: DEFAULT_REFRESH,
        };
        for _ in 0..rounds {
            for cache in [None, Some(cache)] {
                let options = RuntimeOptions {
                    workers: 1,
                    flow_cache: cache,
                    ..RuntimeOptions::default()
                };
                let rt = Runtime::new(options, factories.clone(), Arc::new(LocalStore::new()));
                let steady = Mutex::new((None, None));
                let s = rt
                    .run_generated(
                        |_| {
                            Ok(Replay {
                                frames: &frames,
                                passes,
                                next: 0,
                                steady: &steady,
                            })
                        },
                        None,
                    )
                    .expect("the chain runs");
                assert_eq!(
                    s.packets_out,
                    (flows * passes) as u64,
                    "every packet forwarded"
                );
                let (Some(from), Some(to)) = steady.into_inner().unwrap_or_else(|e| e.into_inner())
                else {
                    panic!("the replay marks its steady passes");
                };
                // Timed from the first batch that starts past the first pass.
                let timed =
                    flows * passes - flows.next_multiple_of(RuntimeOptions::default().batch);
                let mpps = timed as f64 / (to - from).as_secs_f64() / 1e6;
                match cache {
                    None => plain.push(mpps),
                    Some(_) => {
                        cached.push(mpps);
                        // The first pass cannot hit: every hit is a timed packet's.
                        hits = s.flow_cache as f64 / timed as f64;
                    }
                }
            }
        }
        let (p, c) = (median(&plain), median(&cached));
        report.metric(&format!("flow_cache_off_mpps_{label}"), p);
        report.metric(&format!("flow_cache_on_mpps_{label}"), c);
        report.metric(&format!("flow_cache_hit_share_{label}"), hits);
        report.ratio(&format!("flow_cache_vs_chain_{label}"), c / p);
    }
}
