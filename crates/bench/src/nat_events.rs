//! The cost of NAT event logging (issue #39): a NAT opening a session for every packet of 1M
//! new UDP flows (a session and a mapping created per packet), then ending them all by
//! timeout, with `events` off and with IPFIX to a collector on loopback, in the same run,
//! rounds alternating. Every packet makes two events and every session two more: logging's
//! worst case. `ratios.nat_ipfix_on_vs_off` is sessions per second (created and ended) with
//! logging over without (median of the rounds); `events_lost` says whether the exporter kept up
//! (events the queue refused are not logged, so a ratio with losses flatters).

use crate::nf_throughput::{
    flow_keys, frame, now_since, run_passes, thread_cpu_seconds, visit_order, FRAME,
};
use crate::{Effort, Report};
use flowstate_nf::stage::Stage;
use flowstate_nf::{registry, NfFactory, Placement};
use flowstate_state::local::LocalStore;
use flowstate_state::{Partition, StateConfig};
use std::net::UdpSocket;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Room for a million mappings: 24 addresses of 64,512 ports.
const NAT: &str = "external = [\"203.0.113.1\", \"203.0.113.2\", \"203.0.113.3\", \"203.0.113.4\", \"203.0.113.5\", \"203.0.113.6\", \"203.0.113.7\", \"203.0.113.8\", \"203.0.113.9\", \"203.0.113.10\", \"203.0.113.11\", \"203.0.113.12\", \"203.0.113.13\", \"203.0.113.14\", \"203.0.113.15\", \"203.0.113.16\", \"203.0.113.17\", \"203.0.113.18\", \"203.0.113.19\", \"203.0.113.20\", \"203.0.113.21\", \"203.0.113.22\", \"203.0.113.23\", \"203.0.113.24\"]\nports = \"1024-65535\"";

/// One round: seconds creating, seconds ending, CPU seconds of the worker, events lost.
struct Round {
    create: f64,
    expire: f64,
    cpu: f64,
    lost: i64,
}

pub(crate) fn run(effort: Effort) -> Report {
    let (flows, rounds) = match effort {
        Effort::Full => (1_000_000, 3),
        Effort::Quick => (20_000, 1),
    };
    let mut report = Report::new("nat-ipfix");
    report
        .param("flows", flows)
        .param("rounds", rounds)
        .param("frame_bytes", FRAME + 4);
    // The collector: a socket that takes every datagram, as a collector's would.
    let collector = UdpSocket::bind("127.0.0.1:0").expect("collector socket");
    collector
        .set_read_timeout(Some(Duration::from_millis(50)))
        .expect("timeout");
    let addr = collector.local_addr().expect("collector address");
    let stop = Arc::new(AtomicBool::new(false));
    let received = Arc::new(AtomicU64::new(0));
    let drain = {
        let (stop, received) = (stop.clone(), received.clone());
        std::thread::spawn(move || {
            let mut buf = [0u8; 65_536];
            while !stop.load(Ordering::Relaxed) {
                if collector.recv(&mut buf).is_ok() {
                    received.fetch_add(1, Ordering::Relaxed);
                }
            }
        })
    };
    let keys = flow_keys(flows);
    let order = visit_order(keys.len());
    let frames: Vec<[u8; FRAME]> = order.iter().map(|&i| frame(&keys[i])).collect();
    let with_events = format!("{NAT}\nevents = {{ ipfix = \"{addr}\" }}");
    let (mut off, mut on) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        off.push(round(NAT, &frames));
        on.push(round(&with_events, &frames));
    }
    stop.store(true, Ordering::Relaxed);
    let _ = drain.join();
    let rate = |r: &Round| flows as f64 / (r.create + r.expire);
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let mut ratios: Vec<f64> = off
        .iter()
        .zip(&on)
        .map(|(a, b)| rate(b) / rate(a))
        .collect();
    for (name, rs) in [("off", &off), ("on", &on)] {
        let mut r: Vec<f64> = rs.iter().map(rate).collect();
        report.metric(&format!("sessions_per_sec_ipfix_{name}"), median(&mut r));
        let mut c: Vec<f64> = rs.iter().map(|r| flows as f64 / r.create).collect();
        report.metric(&format!("creates_per_sec_ipfix_{name}"), median(&mut c));
        let mut e: Vec<f64> = rs.iter().map(|r| flows as f64 / r.expire).collect();
        report.metric(&format!("expiries_per_sec_ipfix_{name}"), median(&mut e));
        let mut cpu: Vec<f64> = rs.iter().map(|r| flows as f64 / r.cpu).collect();
        report.metric(
            &format!("sessions_per_cpu_second_ipfix_{name}"),
            median(&mut cpu),
        );
    }
    report.metric("events_lost", on.iter().map(|r| r.lost).sum::<i64>() as f64);
    report.metric(
        "ipfix_messages_received",
        received.load(Ordering::Relaxed) as f64,
    );
    report.ratio("nat_ipfix_on_vs_off", median(&mut ratios));
    report
}

/// Builds a NAT with `config`, opens a session per frame, ends them all by timeout, and drops
/// it (with logging, the exporter has then drained and flushed).
fn round(config: &str, frames: &[[u8; FRAME]]) -> Round {
    let table: toml::Table = config.parse().expect("bench config");
    let factory: Arc<dyn NfFactory> = registry::factory("nat", &table).expect("nat config");
    let store = LocalStore::new();
    let mut part = Partition::new(
        &store,
        StateConfig {
            exclusive: true,
            ..StateConfig::default()
        },
    )
    .expect("state partition");
    let info = Placement {
        partition: 0,
        partitions: 1,
        stage: 0,
    };
    let mut stage = Stage::build(&[factory], &mut part, info, None).expect("nat");
    let origin = Instant::now();
    let cpu = thread_cpu_seconds();
    let start = Instant::now();
    let forwarded = run_passes(&mut stage, &mut part, frames, 1, origin);
    assert_eq!(forwarded, frames.len(), "every flow opens a session");
    let create = start.elapsed().as_secs_f64();
    let start = Instant::now();
    // Past every UDP timeout (5 min): each session ends.
    stage.tick(now_since(origin) + 3_600_000_000_000);
    let expire = start.elapsed().as_secs_f64();
    let cpu = thread_cpu_seconds() - cpu;
    let report = stage.nfs()[0].report();
    let get = |k: &str| report.iter().find(|(n, _)| *n == k).map_or(0, |(_, v)| *v);
    assert_eq!(get("active_sessions"), 0, "every session ended");
    Round {
        create,
        expire,
        cpu,
        lost: get("events_lost"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quick_run_logs_every_event_and_reports_the_ratio() {
        let r = run(Effort::Quick);
        assert!(r.ratios["nat_ipfix_on_vs_off"] > 0.0);
        assert_eq!(r.metrics["events_lost"], 0.0);
        // 20,000 sessions, four events each, 35 session records to a 1,400-byte message.
        assert!(
            r.metrics["ipfix_messages_received"] > 1_000.0,
            "{:?}",
            r.metrics
        );
    }
}
