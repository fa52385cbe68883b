//! The `scan` profile: exact counts, the ground truth, whole probes (SYN and the target's
//! answer), and scanners that never appear as normal clients.

mod synth_common;

use flowstate_io::synth::{scan_truth, truth_json, Profile, SynthConfig, Synthetic, CLIENT_MAC};
use flowstate_wire::build::tcp_flags::{ACK, RST, SYN};
use flowstate_wire::FlowKey;
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use synth_common::{generate, parse, Pkt};

fn config(flows: u64, packets: u64, seed: u64) -> SynthConfig {
    SynthConfig {
        flows,
        packets,
        seed,
        ..SynthConfig::new(Profile::Scan)
    }
}

#[test]
fn a_scan_trace_has_exact_counts_and_its_ground_truth() {
    let cfg = config(2_000, 60_000, 3);
    let truth = scan_truth(&cfg).unwrap();
    assert_eq!(truth, Synthetic::new(cfg.clone()).unwrap().scanners());
    assert_eq!(truth.len(), 4);
    // Auto: one probe per 5 flows, shared: 100 each.
    assert!(truth.iter().all(|t| t.probes == 100));
    assert_eq!(truth.iter().filter(|t| t.inside).count(), 2);
    assert_eq!(truth.iter().filter(|t| t.sequential).count(), 2);
    for t in &truth {
        assert_eq!(t.open + t.closed + t.unanswered, t.probes);
        // Most probes fail (10 % open).
        assert!(t.open * 4 < t.probes, "{t:?}");
    }
    let scanners: BTreeSet<IpAddr> = truth.iter().map(|t| t.addr).collect();

    let packets = generate(&cfg);
    assert_eq!(packets.len() as u64, cfg.packets);
    let mut flows: BTreeMap<FlowKey, Vec<Pkt>> = BTreeMap::new();
    for (bytes, _) in &packets {
        let p = parse(bytes);
        flows.entry(p.key.canonical()).or_default().push(p);
    }
    assert_eq!(flows.len() as u64, cfg.flows);

    let mut probes: BTreeMap<IpAddr, u64> = BTreeMap::new();
    let mut benign_failures = 0;
    for pkts in flows.values() {
        let first = &pkts[0];
        let from_scanner = scanners.contains(&first.key.src);
        let to_scanner = scanners.contains(&first.key.dst);
        assert!(
            !to_scanner,
            "a flow's first packet goes to a scanner: {:?}",
            first.key
        );
        if !from_scanner {
            // Normal clients' failed attempts: SYN answered by RST/ACK, from a port >= 61000.
            let flags: Vec<u8> = pkts
                .iter()
                .filter_map(|p| p.tcp.as_ref())
                .map(|t| t.flags)
                .collect();
            if flags == [SYN, RST | ACK] {
                assert!(first.key.src_port >= 61_000);
                assert_eq!(first.src_mac, CLIENT_MAC);
                benign_failures += 1;
            }
            continue;
        }
        // A probe: SYN, then nothing, RST/ACK, or SYN/ACK and the scanner's RST.
        let flags: Vec<u8> = pkts.iter().map(|p| p.tcp.as_ref().unwrap().flags).collect();
        assert!(
            flags == [SYN] || flags == [SYN, RST | ACK] || flags == [SYN, SYN | ACK, RST],
            "{flags:?}"
        );
        let syn = pkts[0].tcp.as_ref().unwrap();
        for p in &pkts[1..] {
            let t = p.tcp.as_ref().unwrap();
            if t.flags & ACK != 0 {
                assert_eq!(t.ack, syn.seq.wrapping_add(1));
            }
        }
        // Inside scanners' frames come from the client side.
        let t = truth.iter().find(|t| t.addr == first.key.src).unwrap();
        assert_eq!(first.src_mac == CLIENT_MAC, t.inside);
        *probes.entry(first.key.src).or_default() += 1;
    }
    for t in &truth {
        assert_eq!(probes.get(&t.addr).copied(), Some(t.probes), "{t:?}");
    }
    assert_eq!(benign_failures, 100);

    let json = truth_json(&cfg, &truth);
    assert!(json.starts_with("{\"profile\":\"scan\""), "{json}");
    for t in &truth {
        assert!(json.contains(&format!("\"addr\":\"{}\"", t.addr)));
    }
}

#[test]
fn scan_options_are_checked() {
    let mut cfg = config(100, 5_000, 1);
    cfg.scanners = 0;
    assert!(matches!(
        cfg.validate(),
        Err(flowstate_io::Error::Option {
            name: "scanners",
            ..
        })
    ));
    cfg.scanners = 4;
    cfg.scan_probes = 30; // 120 probe flows > 100
    assert!(matches!(
        cfg.validate(),
        Err(flowstate_io::Error::Option { name: "flows", .. })
    ));
    cfg.scan_probes = 500;
    assert!(matches!(
        cfg.validate(),
        Err(flowstate_io::Error::Option {
            name: "scan_probes",
            ..
        })
    ));
    cfg.scan_probes = 5;
    cfg.validate().unwrap();
    cfg.clients_v4 = "192.0.0.0/8".parse().unwrap();
    assert!(matches!(
        cfg.validate(),
        Err(flowstate_io::Error::Option {
            name: "clients_v4",
            ..
        })
    ));
    // Other profiles have no ground truth.
    assert!(scan_truth(&SynthConfig::new(Profile::Mixed))
        .unwrap()
        .is_empty());
}
