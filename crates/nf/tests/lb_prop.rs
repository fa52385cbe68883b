//! Load-balancer property tests: no packet makes it panic, rewrites keep checksums, and the
//! active counts always add up to the open flows.

mod common_fwlb;

use common_fwlb::*;
use flowstate_nf::{Context, Direction, NetworkFunction, Packet, Verdict};
use flowstate_wire::dissect;
use proptest::prelude::*;

const CONFIG: &str = r#"
vips = [
    { vip = "10.0.0.1", port = 80, backends = ["10.0.1.1", "10.0.1.2:81"] },
    { vip = "10.0.0.2", port = 80, proto = "udp", backends = ["10.0.1.1:80", "10.0.1.3"], method = "maglev", table_size = 251 },
    { vip = "2001:db8::1", port = 80, backends = ["[2001:db8::11]:80", "[2001:db8::12]:81"], method = "maglev" },
]
timeouts = { tcp = "30s", tcp_fin = "5s", udp = "10s" }
"#;

fn dir(inbound: bool) -> Direction {
    if inbound {
        Direction::Inbound
    } else {
        Direction::Outbound
    }
}

fn consistent(rig: &Rig<flowstate_nf::lb::LoadBalancer>) {
    let stats = rig.nf.backend_stats();
    let active: i64 = stats.iter().map(|s| s.active).sum();
    assert_eq!(active, rig.nf.open_flows() as i64, "{stats:?}");
    for s in &stats {
        assert!(s.active >= 0 && s.active <= s.connections, "{s:?}");
    }
}

/// Packets between a few clients and the VIPs and backends, with any flags.
fn packet() -> impl Strategy<Value = Vec<u8>> {
    let endpoint = prop_oneof![
        Just("10.0.0.1:80"),
        Just("10.0.0.2:80"),
        Just("10.0.1.1:80"),
        Just("10.0.1.2:81"),
        Just("10.0.1.3:80"),
        Just("192.0.2.1:1000"),
        Just("192.0.2.2:1001"),
        Just("10.0.0.1:81"),
    ];
    let endpoint6 = prop_oneof![
        Just("[2001:db8::1]:80"),
        Just("[2001:db8::11]:80"),
        Just("[2001:db8::12]:81"),
        Just("[2001:db8::99]:1000"),
    ];
    prop_oneof![
        (
            endpoint.clone(),
            endpoint.clone(),
            any::<u8>(),
            any::<bool>()
        )
            .prop_map(|(a, b, flags, is_udp)| {
                if is_udp {
                    udp(a, b)
                } else {
                    tcp(a, b, flags)
                }
            }),
        (endpoint6.clone(), endpoint6, any::<u8>()).prop_map(|(a, b, flags)| tcp(a, b, flags)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn random_conversations_keep_the_books(
        steps in proptest::collection::vec((packet(), any::<bool>(), 0u64..8), 1..150),
    ) {
        let mut rig = lb(CONFIG);
        for (frame, inbound, dt) in steps {
            // The rig checks the dissection and checksums of every forwarded frame.
            let (v, out) = rig.pass(&frame, dir(inbound));
            if v == Verdict::Forward && out != frame {
                prop_assert!(checksums_ok(&out));
            }
            consistent(&rig);
            rig.advance(dt);
            consistent(&rig);
        }
        rig.advance(31);
        prop_assert_eq!(rig.nf.flows(), 0);
        prop_assert!(rig.nf.backend_stats().iter().all(|s| s.active == 0));
        let _ = rig.nf.report();
    }

    #[test]
    fn mutated_frames_never_panic(
        frames in proptest::collection::vec(
            (packet(), proptest::collection::vec((any::<usize>(), any::<u8>()), 0..6), any::<bool>()),
            1..60,
        ),
    ) {
        let mut rig = lb(CONFIG);
        for (mut frame, flips, inbound) in frames {
            for (at, byte) in flips {
                let i = 14 + at % (frame.len() - 14);
                frame[i] = byte;
            }
            if let Ok(d) = dissect(&frame) {
                let mut pkt = Packet { data: &mut frame, dissection: d, direction: dir(inbound) };
                let cx = Context { now: rig.now, clock: 0, partition: 0 };
                let _ = rig.nf.process(&mut pkt, &cx);
            }
            rig.now += SEC;
            rig.nf.on_tick(rig.now);
            consistent(&rig);
        }
    }

    #[test]
    fn random_bytes_never_panic(
        frames in proptest::collection::vec((proptest::collection::vec(any::<u8>(), 0..200), any::<bool>()), 1..40),
    ) {
        let mut rig = lb(CONFIG);
        for (mut frame, inbound) in frames {
            if let Ok(d) = dissect(&frame) {
                let mut pkt = Packet { data: &mut frame, dissection: d, direction: dir(inbound) };
                let cx = Context { now: rig.now, clock: 0, partition: 0 };
                let _ = rig.nf.process(&mut pkt, &cx);
            }
        }
    }
}
