//! FlexState §V-B (Fig. 7): the Counter NF with synchronous updates (every packet updates the
//! store and waits) against asynchronous ones (`add_nowait`, one coalesced update per 1 ms
//! flush), on the in-process `local` store, one worker, the same 64-byte packet stream.

use crate::{Effort, Report};
use flowstate_nf::{counter, Context, Direction, NfFactory, Packet, Verdict, WorkerInfo};
use flowstate_state::local::LocalStore;
use flowstate_state::{merge, Connector, Partition, StateConfig};
use flowstate_wire::build::{EthernetSpec, FrameSpec, IpSpec, Ipv4Spec, L4Spec, Payload, UdpSpec};
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

/// Packets per second of virtual time: sets how many packets share one 1 ms flush.
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
    let (async_mpps, async_total) = measure(counter::Mode::Async, async_packets);
    let (sync_mpps, sync_total) = measure(counter::Mode::Sync, sync_packets);
    assert_eq!(
        async_total, async_packets as i64,
        "async counter lost updates"
    );
    assert_eq!(sync_total, sync_packets as i64, "sync counter lost updates");
    report.metric("async_counter_mpps", async_mpps);
    report.metric("sync_counter_mpps", sync_mpps);
    report.ratio("async_vs_sync_counter", async_mpps / sync_mpps);
    report
}

/// Runs `n` packets through one Counter NF; returns Mpps and the count the store ends with.
fn measure(mode: counter::Mode, n: u64) -> (f64, i64) {
    let store = LocalStore::new();
    let mut part = Partition::new(&store, StateConfig::default()).expect("local partition");
    let worker = WorkerInfo {
        index: 0,
        count: 1,
        instance: 0,
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
            worker: 0,
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
    let mut backend = store.connect().expect("local connection");
    let total = merge::counter_sum(backend.as_mut(), "counter", "packets").expect("merge");
    (n as f64 / elapsed.as_secs_f64() / 1e6, total)
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
}
