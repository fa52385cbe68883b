//! IPv4 fragments through a NAT chain (RFC 4787 REQ-14): in order and out of order, through
//! the dispatcher (one and two workers) and through a worker reading its own input, with
//! batches small enough that released fragments wait for the next batch.

mod common;

use common::*;
use flowstate_chain::RuntimeOptions;
use flowstate_io::PacketMeta;
use flowstate_nf::NfFactory;
use flowstate_wire::build::*;
use flowstate_wire::dissect::{dissect, verify_checksums, Transport};
use std::collections::{BTreeMap, HashSet};
use std::net::Ipv4Addr;
use std::sync::Arc;

const EXT: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 1);
const SERVER: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 7);
const DATAGRAMS: u16 = 40;

/// The payload of datagram `k`.
fn payload(k: u16) -> Vec<u8> {
    (0..3000u32).map(|i| (i as u8) ^ (k as u8)).collect()
}

/// Datagram `k` (from `10.0.0.x`, port 4000 + k, IP id 100 + k) in four fragments.
fn fragments(k: u16) -> Vec<Vec<u8>> {
    let mut ip = Ipv4Spec::new(Ipv4Addr::new(10, 0, 0, 1 + (k % 5) as u8), SERVER);
    ip.id = 100 + k;
    let frame = flowstate_testkit::write(&FrameSpec {
        ethernet: flowstate_testkit::ethernet(),
        ip: IpSpec::V4(ip),
        l4: L4Spec::Udp(UdpSpec {
            src_port: 4000 + k,
            dst_port: 53,
        }),
        payload: Payload::Bytes(&payload(k)),
        min_len: 0,
    });
    let parts = fragment_ipv4(&frame, 1000);
    assert_eq!(parts.len(), 4);
    parts
}

/// Every datagram's fragments, round-robin between datagrams; even datagrams last fragment
/// first (three held each), odd ones in order; and two later fragments whose first fragment
/// never comes.
fn trace() -> Vec<(Vec<u8>, PacketMeta)> {
    let all: Vec<Vec<Vec<u8>>> = (0..DATAGRAMS)
        .map(|k| {
            let mut f = fragments(k);
            if k % 2 == 0 {
                f.reverse();
            }
            f
        })
        .collect();
    let mut out = Vec::new();
    for i in 0..4 {
        for f in &all {
            out.push(f[i].clone());
        }
    }
    out.push(fragments(500)[1].clone());
    out.push(fragments(501)[3].clone());
    out.into_iter()
        .enumerate()
        .map(|(i, f)| {
            let meta = PacketMeta {
                timestamp_ns: 1_000 * i as u64,
                wire_len: f.len() as u32,
                ..PacketMeta::default()
            };
            (f, meta)
        })
        .collect()
}

/// The frames put back together by (source, identification): each datagram's full frame.
fn reassemble(frames: &[Vec<u8>]) -> Vec<Vec<u8>> {
    let mut by: BTreeMap<([u8; 4], u16), Vec<&Vec<u8>>> = BTreeMap::new();
    for f in frames {
        let src: [u8; 4] = f[26..30].try_into().unwrap();
        by.entry((src, u16::from_be_bytes([f[18], f[19]])))
            .or_default()
            .push(f);
    }
    by.into_values()
        .map(|parts| {
            let mut payload = Vec::new();
            let mut head = None;
            for p in &parts {
                let ip = flowstate_wire::ipv4::Packet::new_checked(&p[14..]).unwrap();
                assert!(ip.verify_checksum());
                let at = usize::from(ip.frag_offset());
                payload.resize(payload.len().max(at + ip.payload().len()), 0);
                payload[at..at + ip.payload().len()].copy_from_slice(ip.payload());
                if at == 0 {
                    head = Some(p[..34].to_vec());
                }
            }
            let mut f = head.expect("the first fragment came out");
            f.extend_from_slice(&payload);
            let total = (f.len() - 14) as u16;
            f[16..18].copy_from_slice(&total.to_be_bytes());
            f[20..22].copy_from_slice(&[0, 0]);
            f[24..26].copy_from_slice(&[0, 0]);
            let c = flowstate_wire::checksum::checksum(&f[14..34]);
            f[24..26].copy_from_slice(&c.to_be_bytes());
            f
        })
        .collect()
}

fn nat() -> Arc<dyn NfFactory> {
    let config: toml::Table = format!("external = [\"{EXT}\"]").parse().unwrap();
    flowstate_nf::registry::factory("nat", &config).unwrap()
}

/// Checks a run's summary and output: every datagram translated whole, each from its own
/// external port, and the counts.
fn check(summary: &flowstate_chain::Summary, out: &[Vec<u8>], how: &str) {
    assert!(summary.balanced(), "{how}: {summary:?}");
    let n = u64::from(DATAGRAMS);
    assert_eq!(
        summary.dropped.get("fragments.first_missing"),
        Some(&2),
        "{how}"
    );
    assert_eq!(summary.dropped_total, 2, "{how}: {:?}", summary.dropped);
    let count = |k: &str| summary.fragments.get(k).copied();
    assert_eq!(count("datagrams"), Some(n + 2), "{how}");
    assert_eq!(count("held"), Some(n / 2 * 3 + 2), "{how}");
    assert_eq!(count("released"), Some(n / 2 * 3), "{how}");
    assert_eq!(count("tracked"), Some(n * 3), "{how}");
    assert_eq!(out.len() as u64, n * 4, "{how}");
    let whole = reassemble(out);
    assert_eq!(whole.len() as u64, n, "{how}");
    let mut ports = HashSet::new();
    for f in &whole {
        let d = dissect(f).unwrap();
        assert_eq!(d.transport, Transport::Udp);
        assert_eq!(verify_checksums(f, &d).transport, Some(true), "{how}");
        let flow = d.flow.unwrap();
        assert_eq!(flow.src, std::net::IpAddr::V4(EXT), "{how}");
        assert!(
            ports.insert(flow.src_port),
            "{how}: one port per inside endpoint"
        );
        let id = u16::from_be_bytes([f[18], f[19]]);
        assert_eq!(&f[42..], &payload(id - 100)[..], "{how}");
    }
}

#[test]
fn fragments_in_any_order_leave_translated_through_the_dispatcher() {
    for workers in [1, 2] {
        let rt = runtime(
            RuntimeOptions {
                workers,
                batch: 4,
                ..RuntimeOptions::default()
            },
            vec![nat()],
        );
        let mut sink = VecSink::default();
        let s = rt
            .run(&mut VecSource::new(trace()), Some(&mut sink))
            .unwrap();
        check(&s, &sink.packets, &format!("{workers} worker(s)"));
    }
}

#[test]
fn fragments_in_any_order_leave_translated_from_a_worker_reading_its_own_input() {
    let rt = runtime(
        RuntimeOptions {
            workers: 1,
            batch: 4,
            ..RuntimeOptions::default()
        },
        vec![nat()],
    );
    let mut sink = VecSink::default();
    let s = rt
        .run_generated(|_| Ok(VecSource::new(trace())), Some(&mut sink))
        .unwrap();
    check(&s, &sink.packets, "generated");
}
