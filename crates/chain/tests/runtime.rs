//! The runtime over synthetic traces with test NFs.

mod common;

use common::*;
use flowstate_chain::{synthetic_share, RunError};
use flowstate_io::synth::{Profile, SynthConfig, Synthetic};
use flowstate_io::PacketMeta;
use flowstate_nf::steer::Steering;
use flowstate_nf::{Direction, NfFactory};
use flowstate_wire::{dissect, FlowKey};
use std::collections::HashMap;
use std::sync::Arc;

/// A mixed trace where every 10th IPv4 packet has TTL 1 and every 97th is cut short.
fn damaged_trace() -> (Vec<(Vec<u8>, PacketMeta)>, usize, usize) {
    let mut t = trace(Profile::Mixed, 300, 12_000, 7);
    let (mut ttl1, mut cut) = (0, 0);
    for (i, (frame, _)) in t.iter_mut().enumerate() {
        if i % 97 == 5 {
            frame.truncate(14 + 10);
            cut += 1;
        } else if i % 10 == 3 && set_ttl(frame, 1) {
            ttl1 += 1;
        }
    }
    (t, ttl1, cut)
}

/// Per canonical flow, the frames in order.
fn by_flow<'a>(frames: impl Iterator<Item = &'a [u8]>) -> HashMap<FlowKey, Vec<Vec<u8>>> {
    let mut m: HashMap<FlowKey, Vec<Vec<u8>>> = HashMap::new();
    for f in frames {
        let key = dissect(f).unwrap().flow.unwrap().canonical();
        m.entry(key).or_default().push(f.to_vec());
    }
    m
}

fn run_probe(
    workers: usize,
    t: &[(Vec<u8>, PacketMeta)],
) -> (flowstate_chain::Summary, VecSink, Probe) {
    let probe = Arc::new(Probe::new("probe"));
    let rt = runtime(options(workers), vec![probe.clone() as Arc<dyn NfFactory>]);
    let mut sink = VecSink::default();
    let summary = rt
        .run(&mut VecSource::new(t.to_vec()), Some(&mut sink))
        .unwrap();
    drop(rt);
    let probe = Arc::try_unwrap(probe).ok().unwrap();
    (summary, sink, probe)
}

#[test]
fn counts_order_workers_and_determinism() {
    let (t, ttl1, cut) = damaged_trace();
    let (one, sink1, _) = run_probe(1, &t);
    let (three, sink3, probe3) = run_probe(3, &t);

    for s in [&one, &three] {
        assert_eq!(s.packets_in, t.len() as u64);
        assert_eq!(s.malformed_total(), cut as u64);
        assert_eq!(
            s.dropped.get("probe.ttl_expired").copied(),
            Some(ttl1 as u64)
        );
        assert_eq!(s.packets_out + s.dropped_total, s.packets_in);
        assert!(s.balanced());
        assert_eq!(s.nfs.len(), 1);
        assert_eq!(s.nfs[0].packets_in, (t.len() - cut) as u64);
        assert_eq!(s.nfs[0].report["seen"], (t.len() - cut) as i64);
        // The state counter got every increment by the end (final flush).
        assert_eq!(s.nfs[0].report["counter"], (t.len() - cut) as i64);
        assert_eq!(
            s.per_worker.iter().map(|w| w.packets).sum::<u64>(),
            (t.len() - cut) as u64
        );
    }
    assert_eq!(three.per_worker.len(), 3);
    assert!(
        three.per_worker.iter().all(|w| w.packets > 0),
        "300 flows spread over 3 workers"
    );
    assert!(
        three
            .malformed
            .keys()
            .all(|k| k == "ipv4.truncated" || k == "ipv6.truncated"),
        "{:?}",
        three.malformed
    );

    // Output: per flow, exactly the input's forwarded packets in input order.
    let expected = by_flow(
        t.iter()
            .map(|(f, _)| f.as_slice())
            .filter(|f| match dissect(f) {
                Ok(d) => {
                    !(d.network == flowstate_wire::dissect::Network::Ipv4
                        && f[d.l3_offset + 8] == 1)
                }
                Err(_) => false,
            }),
    );
    for sink in [&sink1, &sink3] {
        assert_eq!(sink.packets.len() as u64, one.packets_out);
        assert_eq!(by_flow(sink.packets.iter().map(|p| p.as_slice())), expected);
    }

    // Same multiset with 1, 2 and 3 workers.
    let (_, sink2, _) = run_probe(2, &t);
    let sorted = |s: &VecSink| {
        let mut v = s.packets.clone();
        v.sort();
        v
    };
    assert_eq!(sorted(&sink1), sorted(&sink2));
    assert_eq!(sorted(&sink1), sorted(&sink3));

    // Both directions of every flow on one worker, the one the steering picks.
    let steering = Steering::new(Vec::new(), 3);
    let seen = probe3.seen.lock().unwrap();
    assert_eq!(seen.workers.len(), 300);
    for (flow, workers) in &seen.workers {
        assert_eq!(workers.len(), 1, "{flow}");
        assert_eq!(workers[0] as usize, steering.worker_of_flow(flow));
        assert_eq!(
            steering.worker_of_flow(flow),
            steering.worker_of_flow(&flow.reversed())
        );
    }
}

#[test]
fn runs_are_deterministic_per_flow() {
    let (t, _, _) = damaged_trace();
    let (a, sa, _) = run_probe(2, &t);
    let (b, sb, _) = run_probe(2, &t);
    assert_eq!(a.packets_out, b.packets_out);
    assert_eq!(a.dropped, b.dropped);
    assert_eq!(
        a.per_worker.iter().map(|w| w.packets).collect::<Vec<_>>(),
        b.per_worker.iter().map(|w| w.packets).collect::<Vec<_>>()
    );
    assert_eq!(
        by_flow(sa.packets.iter().map(|p| p.as_slice())),
        by_flow(sb.packets.iter().map(|p| p.as_slice()))
    );
}

#[test]
fn outbound_in_chain_order_inbound_in_reverse() {
    let t = trace(Profile::Mixed, 20, 600, 3);
    let mut a = Probe::new("a");
    a.log = true;
    let mut b = Probe::new("b");
    b.log = true;
    b.seen = Arc::clone(&a.seen);
    let seen = Arc::clone(&a.seen);
    let rt = runtime(
        options(1),
        vec![Arc::new(a) as Arc<dyn NfFactory>, Arc::new(b)],
    );
    let s = rt.run(&mut VecSource::new(t.clone()), None).unwrap();
    assert_eq!(s.packets_out, 600);
    let log = &seen.lock().unwrap().log;
    assert_eq!(log.len(), 1200);
    // Each packet (by its bytes, in the order it came) met the probes in its direction's
    // order; the worker may run a batch NF by NF, so one packet's calls need not be adjacent.
    let mut calls: HashMap<&[u8], Vec<(&str, Direction)>> = HashMap::new();
    for (name, dir, frame) in log {
        calls
            .entry(frame.as_slice())
            .or_default()
            .push((name, *dir));
    }
    let mut outbound = 0;
    for (frame, _) in &t {
        let d = dissect(frame).unwrap();
        let from_inside = match d.flow.unwrap().src {
            std::net::IpAddr::V4(a) => a.octets()[0] == 10,
            std::net::IpAddr::V6(a) => a.octets()[0] == 0xfd,
        };
        // This packet's two calls: the first two left of its bytes (a copy of the same
        // packet is of the same flow, so it runs after it).
        let all = calls
            .get_mut(frame.as_slice())
            .expect("every packet was seen");
        let run: Vec<(&str, Direction)> = all.drain(..2).collect();
        if from_inside {
            outbound += 1;
            assert_eq!(
                run,
                [("a", Direction::Outbound), ("b", Direction::Outbound)]
            );
        } else {
            assert_eq!(run, [("b", Direction::Inbound), ("a", Direction::Inbound)]);
        }
    }
    assert!(outbound > 100 && outbound < 500);
}

#[test]
fn outbound_only_skips_inbound_input() {
    let t = trace(Profile::Mixed, 20, 600, 3);
    let probe = Arc::new(Probe::new("probe"));
    let mut o = options(2);
    o.outbound_only = true;
    let rt = runtime(o, vec![probe as Arc<dyn NfFactory>]);
    let s = rt.run(&mut VecSource::new(t), None).unwrap();
    assert!(s.skipped > 0);
    assert_eq!(s.packets_out + s.skipped, 600);
    assert!(s.balanced());
}

#[test]
fn empty_chain_and_empty_input() {
    let rt = runtime(options(2), Vec::new());
    let s = rt.run(&mut VecSource::new(Vec::new()), None).unwrap();
    assert_eq!((s.packets_in, s.packets_out), (0, 0));
    let t = trace(Profile::Uniform, 50, 50, 1);
    let mut sink = VecSink::default();
    let s = rt
        .run(&mut VecSource::new(t.clone()), Some(&mut sink))
        .unwrap();
    assert_eq!(s.packets_out, 50);
    assert_eq!(sink.packets.len(), 50);
}

#[test]
fn generated_mode_each_worker_its_share() {
    let mut c = SynthConfig::new(Profile::Mixed);
    c.flows = 101;
    c.packets = 5_003;
    c.seed = 9;
    let probe = Arc::new(Probe::new("probe"));
    let rt = runtime(options(3), vec![probe.clone() as Arc<dyn NfFactory>]);
    let mut sink = VecSink::default();
    let s = rt
        .run_generated(
            |w| Synthetic::new(synthetic_share(&c, w).expect("a share")),
            Some(&mut sink),
        )
        .unwrap();
    assert_eq!(s.packets_in, 5_003);
    assert_eq!(s.packets_out, 5_003);
    assert_eq!(sink.packets.len(), 5_003);
    assert!(s.balanced());
    // Each worker processed exactly its share; flows are disjoint between workers.
    for w in &s.per_worker {
        let info = flowstate_nf::Placement {
            partition: w.index as u32,
            partitions: 3,
            stage: 0,
        };
        assert_eq!(w.packets, synthetic_share(&c, info).unwrap().packets);
    }
    let seen = probe.seen.lock().unwrap();
    assert_eq!(seen.workers.len(), 101);
    assert!(seen.workers.values().all(|w| w.len() == 1));
}

#[test]
fn synthetic_shares_add_up() {
    let mut c = SynthConfig::new(Profile::Short);
    c.flows = 10;
    c.packets = 1_000;
    for count in 1..=12u32 {
        let shares: Vec<_> = (0..count)
            .filter_map(|index| {
                synthetic_share(
                    &c,
                    flowstate_nf::Placement {
                        partition: index,
                        partitions: count,
                        stage: 0,
                    },
                )
            })
            .collect();
        assert_eq!(shares.iter().map(|s| s.flows).sum::<u64>(), 10);
        assert_eq!(shares.iter().map(|s| s.packets).sum::<u64>(), 1_000);
        for s in &shares {
            s.validate().unwrap();
        }
    }
}

#[test]
fn a_worker_that_cannot_build_fails_the_run() {
    let mut p = Probe::new("probe");
    p.fail_on_worker = Some(1);
    let rt = runtime(options(3), vec![Arc::new(p) as Arc<dyn NfFactory>]);
    let t = trace(Profile::Mixed, 20, 600, 3);
    let e = rt.run(&mut VecSource::new(t), None).unwrap_err();
    assert!(
        matches!(
            e,
            RunError::Build {
                worker: 1,
                nf: "probe",
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("asked to fail"));
}

#[test]
fn a_panicking_nf_is_an_error_not_a_panic() {
    let mut p = Probe::new("probe");
    p.panic_at = Some(10);
    let rt = runtime(options(2), vec![Arc::new(p) as Arc<dyn NfFactory>]);
    let t = trace(Profile::Mixed, 50, 5_000, 3);
    let mut sink = VecSink::default();
    let e = rt.run(&mut VecSource::new(t), Some(&mut sink)).unwrap_err();
    assert!(matches!(e, RunError::Panicked { .. }), "{e}");
    assert!(e.to_string().contains("worker 0"), "{e}");
}

#[test]
fn input_and_output_failures_are_errors() {
    let t = trace(Profile::Mixed, 50, 5_000, 3);
    let rt = runtime(
        options(2),
        vec![Arc::new(Probe::new("p")) as Arc<dyn NfFactory>],
    );
    let mut src = VecSource::new(t.clone());
    src.fail_after = Some(1_000);
    let e = rt.run(&mut src, None).unwrap_err();
    assert!(matches!(e, RunError::Input(_)), "{e}");
    assert!(e.to_string().contains("damaged on purpose"));

    let mut sink = VecSink {
        fail_after: Some(3),
        ..VecSink::default()
    };
    let e = rt.run(&mut VecSource::new(t), Some(&mut sink)).unwrap_err();
    assert!(matches!(e, RunError::Output(_)), "{e}");
    assert!(e.to_string().contains("disk full"));
}

#[test]
fn summary_json_shape() {
    let (t, _, _) = damaged_trace();
    let (s, _, _) = run_probe(2, &t);
    let v = serde_json::to_value(&s).unwrap();
    for key in [
        "packets_in",
        "packets_out",
        "dropped",
        "malformed",
        "mpps",
        "per_worker",
        "nfs",
        "reflected",
        "dropped_total",
    ] {
        assert!(v.get(key).is_some(), "{key}");
    }
    assert!(v["dropped"]["probe.ttl_expired"].as_u64().unwrap() > 0);
    assert_eq!(v["per_worker"].as_array().unwrap().len(), 2);
    assert_eq!(v["nfs"][0]["name"], "probe");
    let text = s.to_string();
    assert!(text.contains("packets in"));
    assert!(
        text.contains("probe.ttl_expired"),
        "the text names it as the JSON does: {text}"
    );
}

fn from_inside(frame: &[u8]) -> bool {
    match dissect(frame).unwrap().flow.unwrap().src {
        std::net::IpAddr::V4(a) => a.octets()[0] == 10,
        std::net::IpAddr::V6(a) => a.octets()[0] == 0xfd,
    }
}

#[test]
fn reflect_answers_outbound_through_the_chain_in_reverse() {
    let t = trace(Profile::Mixed, 200, 8_000, 11);
    let outbound: Vec<_> = t.iter().filter(|(f, _)| from_inside(f)).collect();
    let mut buf = [0u8; 2048];
    let answerable = outbound
        .iter()
        .filter(|(f, m)| flowstate_chain::reflect::reflect(f, m.timestamp_ns, &mut buf).is_some())
        .count() as u64;
    assert!(answerable > 1_000);

    for workers in [1, 2] {
        let mut o = options(workers);
        o.reflect = true;
        o.outbound_only = true;
        let probe = Arc::new(Probe::new("probe"));
        let rt = runtime(
            o,
            vec![
                Arc::new(MiniFirewall) as Arc<dyn NfFactory>,
                probe as Arc<dyn NfFactory>,
            ],
        );
        let mut sink = VecSink::default();
        let s = rt
            .run(&mut VecSource::new(t.clone()), Some(&mut sink))
            .unwrap();
        assert_eq!(s.packets_in, 8_000);
        assert_eq!(s.skipped, 8_000 - outbound.len() as u64);
        assert_eq!(s.reflected, answerable);
        assert!(s.dropped.is_empty(), "{:?}", s.dropped);
        assert_eq!(s.packets_out, outbound.len() as u64 + answerable);
        assert!(s.balanced());
        assert_eq!(sink.packets.len() as u64, s.packets_out);
        // Every reply right after its request.
        for (i, p) in sink.packets.iter().enumerate() {
            if !from_inside(p) {
                let req = dissect(&sink.packets[i - 1]).unwrap().flow.unwrap();
                assert_eq!(dissect(p).unwrap().flow.unwrap(), req.reversed());
            }
        }
        // Both NFs saw requests and replies: minifw 2x(outbound) and the replies.
        assert_eq!(s.nfs[0].packets_in, outbound.len() as u64 + answerable);
    }
}

#[test]
fn unsolicited_inbound_is_dropped_by_a_stateful_nf() {
    let mut t = trace(Profile::Mixed, 50, 2_000, 5);
    // Inbound packets of flows nobody opened: the synthetic trace's server side of other
    // flows, alone.
    let strangers: Vec<_> = trace(Profile::Mixed, 30, 600, 99)
        .into_iter()
        .filter(|(f, _)| !from_inside(f))
        .collect();
    let n = strangers.len() as u64;
    t.extend(strangers);
    let rt = runtime(
        options(2),
        vec![Arc::new(MiniFirewall) as Arc<dyn NfFactory>],
    );
    let s = rt.run(&mut VecSource::new(t), None).unwrap();
    assert_eq!(s.dropped.get("minifw.no_state").copied(), Some(n));
    assert_eq!(s.packets_out, 2_000);
}
