//! Firewall property tests: no packet makes it panic, and its bookkeeping stays consistent.

mod common_fwlb;

use common_fwlb::*;
use flowstate_nf::firewall::ConnState;
use flowstate_nf::{Context, Direction, NetworkFunction, Packet};
use flowstate_wire::dissect;
use proptest::prelude::*;

const CONFIG: &str = r#"
rules = [
    { action = "allow", proto = "tcp", dst = "10.0.0.0/30", dport = "80-81", direction = "inbound" },
    { action = "deny", proto = "udp", dport = 9 },
    { action = "allow", proto = "icmp", src = "2001:db8::/126", direction = "inbound" },
]
timeouts = { established = "30s", udp_replied = "20s" }
"#;

fn dir(inbound: bool) -> Direction {
    if inbound {
        Direction::Inbound
    } else {
        Direction::Outbound
    }
}

/// Sum of the per-state gauges equals the number of entries; the connections in a TCP state
/// are as many as the entries of the TCP map (each connection is in the map of its protocol).
fn consistent(rig: &Rig<flowstate_nf::firewall::Firewall>) {
    let by_state: i64 = ConnState::ALL
        .iter()
        .map(|&s| rig.nf.connections_in(s))
        .sum();
    assert_eq!(by_state, rig.nf.tracked() as i64);
    let tcp = by_state
        - rig.nf.connections_in(ConnState::Unreplied)
        - rig.nf.connections_in(ConnState::Replied);
    assert_eq!(rig.nf.tracked_tcp() as i64, tcp);
    for s in ConnState::ALL {
        assert!(rig.nf.connections_in(s) >= 0, "{s:?}");
    }
}

/// A packet among few endpoints so that connections form: (kind, host a, host b, ports,
/// flags, v6).
fn packet() -> impl Strategy<Value = Vec<u8>> {
    (
        0u8..4,
        0u8..4,
        0u8..4,
        79u16..82,
        79u16..82,
        any::<u8>(),
        any::<bool>(),
    )
        .prop_map(|(kind, a, b, pa, pb, flags, v6)| {
            let host = |h: u8| {
                if v6 {
                    format!("[2001:db8::{h}]")
                } else {
                    format!("10.0.0.{h}")
                }
            };
            let (sa, sb) = (format!("{}:{pa}", host(a)), format!("{}:{pb}", host(b)));
            let ip = |h: u8| {
                if v6 {
                    format!("2001:db8::{h}")
                } else {
                    format!("10.0.0.{h}")
                }
            };
            match kind {
                0 | 1 => tcp(&sa, &sb, flags),
                2 => udp(&sa, &sb),
                _ => echo(&ip(a), &ip(b), pa, flags & 1 == 1),
            }
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn random_bytes_never_panic(
        frames in proptest::collection::vec(
            (proptest::collection::vec(any::<u8>(), 0..200), any::<bool>(), 0u64..100),
            1..40,
        ),
    ) {
        let mut rig = firewall(CONFIG);
        for (mut frame, inbound, dt) in frames {
            // Make most of them IPv4 or IPv6 so that they get past the Ethernet header.
            if frame.len() > 14 && frame[0] & 1 == 0 {
                frame[12] = if frame[1] & 1 == 0 { 0x08 } else { 0x86 };
                frame[13] = if frame[1] & 1 == 0 { 0x00 } else { 0xdd };
            }
            rig.now += dt * SEC;
            if let Ok(d) = dissect(&frame) {
                let mut pkt = Packet { data: &mut frame, dissection: d, direction: dir(inbound) };
                let cx = Context { now: rig.now, clock: 0, partition: 0 };
                let _ = rig.nf.process(&mut pkt, &cx);
            }
            rig.nf.on_tick(rig.now);
        }
        consistent(&rig);
    }

    #[test]
    fn mutated_frames_never_panic(
        frames in proptest::collection::vec(
            (packet(), proptest::collection::vec((any::<usize>(), any::<u8>()), 0..6), any::<bool>()),
            1..60,
        ),
    ) {
        let mut rig = firewall(CONFIG);
        let mut processed = 0;
        for (mut frame, flips, inbound) in frames {
            for (at, byte) in flips {
                // Keep the Ethernet header: the interesting bytes are IP and transport.
                let i = 14 + at % (frame.len() - 14);
                frame[i] = byte;
            }
            if let Ok(d) = dissect(&frame) {
                processed += 1;
                let mut pkt = Packet { data: &mut frame, dissection: d, direction: dir(inbound) };
                let cx = Context { now: rig.now, clock: 0, partition: 0 };
                let _ = rig.nf.process(&mut pkt, &cx);
            }
            rig.now += SEC;
            rig.nf.on_tick(rig.now);
            consistent(&rig);
        }
        prop_assume!(processed > 0);
    }

    #[test]
    fn random_conversations_keep_the_books(
        steps in proptest::collection::vec((packet(), any::<bool>(), 0u64..15), 1..120),
    ) {
        let mut rig = firewall(CONFIG);
        for (frame, inbound, dt) in steps {
            let _ = rig.pass(&frame, dir(inbound));
            consistent(&rig);
            rig.advance(dt);
            consistent(&rig);
        }
        // Everything times out eventually.
        rig.advance(432_001);
        assert_eq!(rig.nf.tracked(), 0);
        consistent(&rig);
        let _ = rig.nf.report();
    }
}
