//! FlexState §V-B (Fig. 7): the Counter NF with synchronous updates (every packet updates the
//! store and waits) against asynchronous ones (`add_nowait`, one coalesced update per flush),
//! one worker, the same 64-byte packet stream.
//!
//! * `flexstate-counter`: on the in-process `local` store.
//! * `flexstate`: on every backend this machine has (FlexState's promise: changing the store is
//!   configuration only): `local`, our `store` (started in process), `redis` (127.0.0.1:6379),
//!   `redis-cluster` (127.0.0.1:7001-7003) and `cassandra` (127.0.0.1:9042); a backend that
//!   does not answer is skipped and named in `params.skipped` (`scripts/redis start`,
//!   `scripts/redis-cluster start`, `scripts/cassandra start` run them). It also measures how
//!   the flush interval (1, 10, 100 ms of virtual time) sets the traffic to the store, and the
//!   NAT's and the LB's throughput on established flows with each store (FlexState Fig. 8:
//!   with asynchronous flushing every 1 ms, the store should not matter), as
//!   `metrics.throughput_spread_pct` = (max − min) / max over the backends, in percent.
//!   Every store is measured twice there: on loopback, and remote (`<backend>_remote`: the
//!   same server started by the bench in a network namespace behind a veth pair, see
//!   [`crate::remote`]; Cassandra only in a full run). The NF runs one worker on a real-time
//!   clock, flushing every 1 ms, after a warm-up pass that establishes every flow in the store;
//!   the rate counts the packets while they flow (`<nf>_mpps_<backend>`, best of 5
//!   interleaved runs), and the final write-out is reported beside it
//!   (`<nf>_drain_ms_<backend>`, `<nf>_mpps_with_drain_<backend>`), with the flushes held back
//!   because the store was behind and those that failed. `metrics.store_spread_pct` is the
//!   spread over the stores outside the NF's process only (every backend but `local`, whose
//!   cache is the only copy and is never flushed), the comparison FlexState's Fig. 8 makes;
//!   `<nf>_mpps_per_cpu_<backend>` and `per_cpu_spread_pct` divide by the worker's CPU time instead, which a store server
//!   sharing this machine's cores does not change.
//!
//! **CPUs** (with two or more): the NF (the counter, the NAT's or LB's worker) runs alone on
//! the last CPU, as FlexState's NFs on their own DPDK cores; everything else the bench starts
//! (stores, the drivers' threads, the NF's state thread) runs on the others. Stores on
//! loopback run where they were started: `taskset -c 0 scripts/cassandra start` keeps the
//! JVM off the NF's CPU on a 2-CPU machine.
//!
//! Every run checks that the store ends with exactly one count per packet (measured as the
//! difference of the merged counter before and after, so earlier runs against a persistent
//! store do not matter).

use crate::remote::Candidate;
use crate::{Effort, Report};
use flowstate_nf::{counter, Context, Direction, NfFactory, Packet, Placement, Verdict};
use flowstate_state::local::LocalStore;
use flowstate_state::{merge, Connector, Partition, StateConfig};
use flowstate_wire::build::{EthernetSpec, FrameSpec, IpSpec, Ipv4Spec, L4Spec, Payload, UdpSpec};
use std::net::Ipv4Addr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Packets per second of virtual time: sets how many packets share one flush.
const VIRTUAL_PPS: u64 = 10_000_000;

pub(crate) fn run(effort: Effort) -> Report {
    let (async_packets, sync_packets) = match effort {
        Effort::Full => (20_000_000u64, 400_000u64),
        Effort::Quick => (200_000, 5_000),
    };
    let mut report = Report::new("flexstate-counter");
    report
        .param("backend", "local")
        .param("flush_interval_ms", 1)
        .param("packet_bytes", 60)
        .param("async_packets", async_packets)
        .param("sync_packets", sync_packets);
    let store = LocalStore::new();
    let one_ms = Duration::from_millis(1);
    let a = measure(&store, counter::Mode::Async, async_packets, one_ms);
    let s = measure(&store, counter::Mode::Sync, sync_packets, one_ms);
    report.metric("async_counter_mpps", a.mpps);
    report.metric("sync_counter_mpps", s.mpps);
    report.ratio("async_vs_sync_counter", a.mpps / s.mpps);
    report
}

/// Packets for the sync and async runs on one backend: a remote synchronous update is a round
/// trip (tens of µs on Redis, hundreds on Cassandra), so those runs are shorter.
fn packets(backend: &str, effort: Effort) -> (u64, u64) {
    let (a, s) = match backend {
        "local" => (20_000_000, 400_000),
        "cassandra" => (2_000_000, 4_000),
        _ => (5_000_000, 40_000),
    };
    match effort {
        Effort::Full => (a, s),
        Effort::Quick => (a / 50, s / 50),
    }
}

fn candidates() -> (Vec<Candidate>, Option<flowstate_store::Server>) {
    let mut out: Vec<Candidate> = vec![("local", Ok(Arc::new(LocalStore::new())))];
    let server = flowstate_store::Server::start(flowstate_store::Config {
        listen: "127.0.0.1:0".parse().expect("address"),
        ..flowstate_store::Config::default()
    });
    let server = match server {
        Ok(s) => {
            let c = flowstate_driver_store::StoreConnector::new(s.local_addr().to_string());
            out.push(("store", Ok(Arc::new(c))));
            Some(s)
        }
        Err(e) => {
            out.push(("store", Err(format!("the store did not start: {e}"))));
            None
        }
    };
    let answers = |c: Arc<dyn Connector>, how: &str| match c.connect() {
        Ok(_) => Ok(c),
        Err(e) => Err(format!("{e} ({how})")),
    };
    out.push((
        "redis",
        flowstate_driver_redis::RedisConnector::new("redis://127.0.0.1:6379")
            .map_err(|e| e.to_string())
            .and_then(|c| answers(Arc::new(c), "scripts/redis start")),
    ));
    let nodes = ["7001", "7002", "7003"].map(|p| format!("redis://127.0.0.1:{p}"));
    out.push((
        "redis-cluster",
        flowstate_driver_redis::RedisClusterConnector::new(&nodes)
            .map_err(|e| e.to_string())
            .and_then(|c| answers(Arc::new(c), "scripts/redis-cluster start")),
    ));
    out.push((
        "cassandra",
        flowstate_driver_cassandra::CassandraConnector::new(
            flowstate_driver_cassandra::CassandraConfig::default(),
        )
        .map_err(|e| format!("{e} (scripts/cassandra start)"))
        .map(|c| Arc::new(c) as Arc<dyn Connector>),
    ));
    (out, server)
}

pub(crate) fn run_all_backends(effort: Effort) -> Report {
    let mut report = Report::new("flexstate");
    report
        .param("packet_bytes", 60)
        .param("virtual_pps", VIRTUAL_PPS)
        .param("async_flush_interval_ms", 1);
    // The NF has a CPU to itself, as on FlexState's testbed (DPDK cores); the stores, their
    // drivers and the state threads share the others.
    let _off_nf_cpu = crate::remote::OffNfCpu::new();
    let (backends, _server) = candidates();
    let mut skipped = Vec::new();
    let mut measured = Vec::new();
    for (name, connector) in &backends {
        let connector = match connector {
            Ok(c) => c,
            Err(why) => {
                skipped.push(format!("{name}: {why}"));
                continue;
            }
        };
        let key = name.replace('-', "_");
        let (a_n, s_n) = packets(name, effort);
        let one_ms = Duration::from_millis(1);
        let a = measure(connector.as_ref(), counter::Mode::Async, a_n, one_ms);
        let s = measure(connector.as_ref(), counter::Mode::Sync, s_n, one_ms);
        report.metric(&format!("async_counter_mpps_{key}"), a.mpps);
        report.metric(&format!("sync_counter_mpps_{key}"), s.mpps);
        report.ratio(&format!("async_vs_sync_counter_{key}"), a.mpps / s.mpps);
        measured.push(*name);

        // Flush interval vs traffic to the store (FlexState §V-B): operations the state
        // thread sent per second of virtual time. The local store keeps owned state in the
        // worker's cache and sends nothing, so only remote stores are measured.
        if *name != "local" {
            let n = a_n.min(2_000_000);
            for ms in [1u64, 10, 100] {
                let r = measure(
                    connector.as_ref(),
                    counter::Mode::Async,
                    n,
                    Duration::from_millis(ms),
                );
                let virtual_s = n as f64 / VIRTUAL_PPS as f64;
                report.metric(
                    &format!("store_ops_per_s_{key}_flush_{ms}ms"),
                    r.ops_sent as f64 / virtual_s,
                );
                report.metric(&format!("async_counter_mpps_{key}_flush_{ms}ms"), r.mpps);
            }
        }
    }
    // NAT and LB on established flows with each store (FlexState Fig. 8), 1 worker, flush
    // every 1 ms. A fresh NF instance id per run keeps earlier runs' state in a persistent
    // store out of the way.
    let (flows, passes) = match effort {
        // About a second of packets per run at 1 Mpps: the final round trip to the store is
        // part of the work, and must not dominate.
        Effort::Full => (2_000, 500),
        Effort::Quick => (500, 40),
    };
    report.param("nf_flows", flows).param("nf_passes", passes);
    let keys = crate::nf_throughput::flow_keys(flows);
    let lb = crate::nf_throughput::chains()
        .into_iter()
        .find(|(n, _)| *n == "lb")
        .map(|(_, c)| c)
        .expect("the lb chain");
    let nat = [(
        "nat",
        "external = [\"203.0.113.1\"]\nports = \"10000-19999\"",
    )];
    // Runs are short and this machine may be shared: every backend runs `REPEATS` times,
    // interleaved, and its best run counts. A fresh NF instance id per run keeps earlier runs'
    // state in a persistent store out of the way.
    const REPEATS: u32 = 5;
    report.param("nf_repeats", REPEATS);
    let base = 1 + std::process::id() % 100_000 * 100;
    // The same stores once more, each in a namespace of its own behind a veth pair.
    let mut remote = crate::remote::RemoteStores::create();
    let remote_backends = match &mut remote {
        Ok(r) => r.start(effort == Effort::Full),
        Err(why) => vec![("remote", Err(why.clone()))],
    };
    let mut nf_backends: Vec<&Candidate> = backends.iter().collect();
    for c in &remote_backends {
        match c {
            (_, Ok(_)) => nf_backends.push(c),
            (name, Err(why)) => skipped.push(format!("{name}: {why}")),
        }
    }
    let (mut spread, mut spread_cpu, mut spread_stores): (f64, f64, f64) = (0.0, 0.0, 0.0);
    for (nf, chain) in [("nat", &nat[..]), ("lb", &lb[..])] {
        let mut best: Vec<Option<crate::nf_throughput::ChainRun>> =
            nf_backends.iter().map(|_| None).collect();
        for rep in 0..REPEATS {
            for (i, (_, connector)) in nf_backends.iter().enumerate() {
                let Ok(connector) = connector else { continue };
                let instance = base + rep * 10 + i as u32;
                let run = crate::nf_throughput::chain_run(
                    connector.as_ref(),
                    instance,
                    chain,
                    &keys,
                    1,
                    passes,
                );
                if best[i]
                    .as_ref()
                    .is_none_or(|b| run.mpps_forwarding > b.mpps_forwarding)
                {
                    best[i] = Some(run);
                }
            }
        }
        let (mut rates, mut per_cpu, mut store_rates) = (Vec::new(), Vec::new(), Vec::new());
        for ((name, _), run) in nf_backends.iter().zip(&best) {
            let Some(run) = run else { continue };
            let name = name.replace('-', "_");
            report.metric(&format!("{nf}_mpps_{name}"), run.mpps_forwarding);
            report.metric(&format!("{nf}_mpps_with_drain_{name}"), run.mpps);
            report.metric(
                &format!("{nf}_mpps_per_cpu_{name}"),
                run.mpps_per_cpu_forwarding,
            );
            report.metric(&format!("{nf}_drain_ms_{name}"), run.drain_secs * 1e3);
            report.metric(
                &format!("{nf}_held_back_flushes_{name}"),
                run.held_back as f64,
            );
            report.metric(&format!("{nf}_failed_flushes_{name}"), run.errors as f64);
            rates.push(run.mpps_forwarding);
            per_cpu.push(run.mpps_per_cpu_forwarding);
            if name != "local" {
                store_rates.push(run.mpps_forwarding);
            }
        }
        let (pct, pct_cpu) = (spread_pct(&rates), spread_pct(&per_cpu));
        report.metric(&format!("{nf}_throughput_spread_pct"), pct);
        report.metric(&format!("{nf}_per_cpu_spread_pct"), pct_cpu);
        spread = spread.max(pct);
        spread_cpu = spread_cpu.max(pct_cpu);
        spread_stores = spread_stores.max(spread_pct(&store_rates));
    }
    report.metric("throughput_spread_pct", spread);
    report.metric("per_cpu_spread_pct", spread_cpu);
    report.metric("store_spread_pct", spread_stores);
    let location = match &remote {
        Ok(r) => format!(
            "<backend>: this machine's loopback; <backend>_remote: {} in a network namespace \
             behind a veth pair, on CPUs {}; the NF worker on the last CPU",
            r.address(),
            crate::remote::store_cpus().map_or("shared with the NF".into(), |c| format!("{c:?}"))
        ),
        Err(_) => "this machine's loopback (no remote location)".into(),
    };
    report.param("location", location);
    drop(remote);
    report.param("backends", measured.join(", "));
    report.param("skipped", skipped.join("; "));
    report
}

/// (max − min) / max of `rates`, in percent (0 for none).
fn spread_pct(rates: &[f64]) -> f64 {
    let max = rates.iter().copied().fold(0.0, f64::max);
    let min = rates.iter().copied().fold(f64::INFINITY, f64::min);
    if max > 0.0 {
        (max - min) / max * 100.0
    } else {
        0.0
    }
}

/// What one run measured.
struct Run {
    mpps: f64,
    /// Operations the partition sent to the store (async ops plus sync calls).
    ops_sent: u64,
}

/// Runs `n` packets through one Counter NF on `store`, on the NF's CPU. Panics if the store
/// does not end with exactly `n` more counts: a benchmark of a counter that loses updates
/// measures nothing.
fn measure(store: &dyn Connector, mode: counter::Mode, n: u64, flush: Duration) -> Run {
    crate::remote::on_nf_cpu(|| measure_here(store, mode, n, flush))
}

fn measure_here(store: &dyn Connector, mode: counter::Mode, n: u64, flush: Duration) -> Run {
    let total = || {
        let mut backend = store.connect().expect("connect to the store");
        merge::counter_sum(backend.as_mut(), "counter", "packets").expect("merge")
    };
    let before = total();
    let config = StateConfig {
        flush_interval: flush,
        ..StateConfig::default()
    };
    let mut part = Partition::new(store, config).expect("partition");
    let worker = Placement {
        partition: 0,
        partitions: 1,
        stage: 0,
    };
    let mut nf = counter::Factory(counter::Config { mode })
        .build(&mut part.declare("counter"), worker)
        .expect("counter NF");
    let mut frame = [0u8; 64];
    let spec = FrameSpec {
        ethernet: EthernetSpec::new([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2]),
        ip: IpSpec::V4(Ipv4Spec::new(
            Ipv4Addr::new(10, 0, 0, 1),
            Ipv4Addr::new(198, 51, 100, 1),
        )),
        l4: L4Spec::Udp(UdpSpec {
            src_port: 40000,
            dst_port: 53,
        }),
        payload: Payload::Fill { len: 18, byte: 0 },
        min_len: 60,
    };
    let len = spec.write(&mut frame).expect("frame fits");
    let dissection = flowstate_wire::dissect(&frame[..len]).expect("valid frame");
    let step = 1_000_000_000 / VIRTUAL_PPS;
    let start = Instant::now();
    let mut now = 0;
    for i in 0..n {
        now = i * step;
        let cx = Context {
            now,
            clock: i,
            partition: 0,
        };
        let mut pkt = Packet {
            data: &mut frame[..len],
            dissection,
            direction: Direction::Outbound,
        };
        let v = nf.process(&mut pkt, &cx);
        debug_assert_eq!(v, Verdict::Forward);
        if i % 32 == 31 {
            part.maybe_flush(now);
        }
    }
    part.flush_all(now + 1).expect("final flush");
    let elapsed = start.elapsed().max(Duration::from_nanos(1));
    let stats = part.stats();
    let ops_sent =
        stats.async_ops.load(Ordering::Relaxed) + stats.sync_calls.load(Ordering::Relaxed);
    drop(nf);
    drop(part);
    let counted = total() - before;
    assert_eq!(
        counted,
        n as i64,
        "{mode:?} counter on {}: lost updates",
        store.name()
    );
    Run {
        mpps: n as f64 / elapsed.as_secs_f64() / 1e6,
        ops_sent,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_modes_count_every_packet() {
        let r = run(Effort::Quick);
        assert!(r.ratios["async_vs_sync_counter"] > 0.0);
        assert!(r.metrics["sync_counter_mpps"] > 0.0);
    }

    #[test]
    fn every_backend_is_measured_or_named_as_skipped() {
        let r = run_all_backends(Effort::Quick);
        // The local store and our own store are always there.
        for key in ["local", "store"] {
            assert!(r.ratios[&format!("async_vs_sync_counter_{key}")] > 0.0);
        }
        // A remote store's traffic falls with the flush interval (one coalesced add per
        // flush): 1 ms sends more than 100 ms.
        assert!(
            r.metrics["store_ops_per_s_store_flush_1ms"]
                > r.metrics["store_ops_per_s_store_flush_100ms"]
        );
        for key in [
            "nat_mpps_local",
            "nat_mpps_store",
            "lb_mpps_store",
            "throughput_spread_pct",
        ] {
            assert!(r.metrics.contains_key(key), "{key} missing");
        }
        let params = serde_json::to_string(&r.params).unwrap();
        for name in ["redis", "redis-cluster", "cassandra"] {
            let key = name.replace('-', "_");
            assert!(
                r.ratios
                    .contains_key(&format!("async_vs_sync_counter_{key}"))
                    || params.contains(&format!("{name}: ")),
                "{name} neither measured nor named as skipped: {params}"
            );
            // ... and so is each remote one (root can make the namespace; others are told
            // why not).
            assert!(
                r.metrics.contains_key(&format!("nat_mpps_{key}_remote"))
                    || params.contains(&format!("{name}-remote: "))
                    || params.contains("remote: "),
                "{name}-remote neither measured nor named as skipped: {params}"
            );
        }
        // No flush failed and every run was measured on each backend.
        for (k, v) in &r.metrics {
            if k.contains("failed_flushes") {
                assert_eq!(*v, 0.0, "{k}");
            }
        }
    }
}
