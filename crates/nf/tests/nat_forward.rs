//! NAT port forwarding (`forward`): published inside servers reached from outside and, by
//! hairpinning, from inside; their ports kept out of the pools; steering of both directions to
//! one partition; listing; configuration errors. On both tables.

mod nat_support;

use flowstate_nf::listing::{Cell, StoreReader};
use flowstate_nf::nat::{self, Config};
use flowstate_nf::{Direction::*, Verdict};
use flowstate_state::local::LocalStore;
use flowstate_state::Connector;
use flowstate_wire::build::tcp_flags::*;
use flowstate_wire::flow::proto;
use nat_support::*;
use std::net::{IpAddr, Ipv4Addr};

/// The published web server and DNS servers.
const WEB: Ipv4Addr = IN2;
const DNS: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 3);

fn configs(extra: &str) -> [String; 2] {
    let base = format!(
        r#"external = ["203.0.113.1", "203.0.113.2"]
ports = "5000-5019"
early_drop = false
{extra}
forward = [
  {{ proto = "tcp", external = "203.0.113.1:80", internal = "10.0.0.2:8080" }},
  {{ proto = "udp", external = "203.0.113.1:5000-5004", internal = "10.0.0.3:6000" }},
]"#
    );
    [base.clone(), format!("{base}\ntable = \"mvt\"")]
}

#[test]
fn an_outside_client_reaches_a_forwarded_server_under_the_strictest_filtering() {
    for config in configs("filtering = \"address-and-port-dependent\"") {
        let mut rig = Rig::new(&config);
        let mut syn = tcp((SRV1, 40000), (EXT, 80), SYN);
        assert_eq!(rig.send(&mut syn, Inbound), Verdict::Forward, "{config}");
        assert_eq!(syn, tcp((SRV1, 40000), (WEB, 8080), SYN), "{config}");
        // The reply leaves from the published endpoint, byte for byte.
        let mut reply = tcp((WEB, 8080), (SRV1, 40000), SYN | ACK);
        assert_eq!(rig.send(&mut reply, Outbound), Verdict::Forward);
        assert_eq!(reply, tcp((EXT, 80), (SRV1, 40000), SYN | ACK), "{config}");
        let mut ack = tcp((SRV1, 40000), (EXT, 80), ACK);
        assert_eq!(rig.send(&mut ack, Inbound), Verdict::Forward);
        assert_eq!(ack, tcp((SRV1, 40000), (WEB, 8080), ACK));
        // The server's own connections go out from its published endpoint (RFC 4787 REQ-1).
        let mut own = tcp((WEB, 8080), (SRV2, 443), SYN);
        assert_eq!(rig.send(&mut own, Outbound), Verdict::Forward);
        assert_eq!(src_of(&own), (IpAddr::V4(EXT), 80), "{config}");
        // A range: port lo + k goes to internal port + k; UDP from anywhere.
        let mut q = udp((SRV2, 53000), (EXT, 5003));
        assert_eq!(rig.send(&mut q, Inbound), Verdict::Forward);
        assert_eq!(q, udp((SRV2, 53000), (DNS, 6003)), "{config}");
        let mut a = udp((DNS, 6003), (SRV2, 53000));
        assert_eq!(rig.send(&mut a, Outbound), Verdict::Forward);
        assert_eq!(a, udp((EXT, 5003), (SRV2, 53000)), "{config}");
        // What a forwarding does not publish stays closed: an ACK without a session, UDP to
        // the TCP port, TCP to the other address, the next port after the range.
        for (mut f, why) in [
            (tcp((SRV1, 40001), (EXT, 80), ACK), "nat: no mapping"),
            (udp((SRV1, 40001), (EXT, 80)), "nat: no mapping"),
            (tcp((SRV1, 40001), (EXT2, 80), SYN), "nat: no mapping"),
            (udp((SRV1, 40001), (EXT, 5005)), "nat: no mapping"),
        ] {
            assert_eq!(rig.send(&mut f, Inbound), Verdict::Drop(why), "{config}");
        }
        assert_eq!(rig.report("active_sessions"), 3, "{config}");
        // Both published mappings, plus none from the pool.
        assert_eq!(rig.report("active_mappings"), 2, "{config}");
    }
}

#[test]
fn an_inside_client_reaches_a_forwarded_server_through_the_external_address() {
    for config in configs("") {
        let mut rig = Rig::new(&config);
        let mut syn = tcp((IN1, 40000), (EXT, 80), SYN);
        assert_eq!(rig.send(&mut syn, Outbound), Verdict::Forward, "{config}");
        // The server sees the client's external endpoint (RFC 4787 REQ-9b).
        let (src, dst) = (src_of(&syn), dst_of(&syn));
        assert_eq!(dst, (IpAddr::V4(WEB), 8080), "{config}");
        let IpAddr::V4(client_ext) = src.0 else {
            panic!("{src:?}")
        };
        assert!([EXT, EXT2].contains(&client_ext), "{src:?}");
        let mut reply = tcp((WEB, 8080), (client_ext, src.1), SYN | ACK);
        assert_eq!(rig.send(&mut reply, Outbound), Verdict::Forward, "{config}");
        assert_eq!(reply, tcp((EXT, 80), (IN1, 40000), SYN | ACK), "{config}");
        assert_eq!(rig.report("hairpinned"), 2, "{config}");
    }
}

#[test]
fn forwarded_ports_never_enter_the_pool_and_stay_published_after_their_sessions() {
    for config in configs("udp = \"30s\"") {
        let mut rig = Rig::new(&config);
        // 203.0.113.1 has 15 pool ports (5005-5019), 203.0.113.2 all 20.
        assert_eq!(rig.report("pool_free"), 35, "{config}");
        let mut q = udp((SRV2, 53000), (EXT, 5000));
        assert_eq!(rig.send(&mut q, Inbound), Verdict::Forward);
        assert_eq!(rig.report("pool_free"), 35, "{config}");
        // Dynamic mappings on the forwarded address get only pool ports.
        let mut seen = Vec::new();
        for p in 0..200u16 {
            let mut f = udp(
                (Ipv4Addr::new(10, 0, 1, (p % 250) as u8), 1000 + p),
                (SRV1, 53),
            );
            if rig.send(&mut f, Outbound) == Verdict::Forward {
                seen.push(src_of(&f));
            }
        }
        assert_eq!(seen.len(), 35, "{config}");
        for (a, p) in &seen {
            assert!(*a != IpAddr::V4(EXT) || *p >= 5005, "{a}:{p} is forwarded");
        }
        assert_eq!(rig.report("pool_free"), 0, "{config}");
        // Every session ends; the pool gets back its ports and nothing more.
        rig.advance(31);
        assert_eq!(rig.report("active_sessions"), 0, "{config}");
        assert_eq!(rig.report("active_mappings"), 0, "{config}");
        assert_eq!(rig.report("pool_free"), 35, "{config}");
        // The forwarding still stands.
        let mut q = udp((SRV1, 1), (EXT, 5004));
        assert_eq!(rig.send(&mut q, Inbound), Verdict::Forward);
        assert_eq!(dst_of(&q), (IpAddr::V4(DNS), 6004), "{config}");
    }
}

#[test]
fn both_directions_of_a_forwarded_session_go_to_one_partition() {
    let [config, _] = configs("");
    let c = Config::from_table(&table(&config)).unwrap();
    let flow = |s: (Ipv4Addr, u16), d: (Ipv4Addr, u16), p| {
        flowstate_wire::FlowKey::new(IpAddr::V4(s.0), IpAddr::V4(d.0), s.1, d.1, p)
    };
    for parts in [2, 3, 16, 64] {
        for client in 1000..1100u16 {
            let inbound = flow((SRV1, client), (EXT, 80), proto::TCP);
            let outbound = flow((WEB, 8080), (SRV1, client), proto::TCP);
            let inb = c.partition(&inbound, None, Inbound, parts);
            assert!(inb.is_some());
            assert_eq!(inb, c.partition(&outbound, None, Outbound, parts));
            // An inside client's hairpinned SYN too.
            let hairpin = flow((IN1, client), (EXT, 80), proto::TCP);
            assert_eq!(inb, c.partition(&hairpin, None, Outbound, parts));
            // An ICMP error quoting the translated reply.
            let quoted = flow((EXT, 80), (SRV1, client), proto::TCP);
            let outer = flow((SRV1, 0), (EXT, 0), proto::ICMP);
            assert_eq!(inb, c.partition(&outer, Some(&quoted), Inbound, parts));
        }
    }
}

/// Four workers on one store, each packet on the worker steering picks: a forwarded server is
/// reached by outside clients, its replies found where its session is.
#[test]
fn forwarded_sessions_work_across_workers() {
    let [config, _] = configs("");
    let c = Config::from_table(&table(&config)).unwrap();
    let store = LocalStore::new();
    let mut rigs: Vec<Rig> = (0..4).map(|w| Rig::worker(&store, &config, w, 4)).collect();
    for client in 2000..2040u16 {
        let mut syn = tcp((SRV1, client), (EXT, 80), SYN);
        let w = c.partition(&flow(&syn), None, Inbound, 4).unwrap() as usize;
        assert_eq!(rigs[w].send(&mut syn, Inbound), Verdict::Forward);
        let mut reply = tcp((WEB, 8080), (SRV1, client), SYN | ACK);
        let w = c.partition(&flow(&reply), None, Outbound, 4).unwrap() as usize;
        assert_eq!(rigs[w].send(&mut reply, Outbound), Verdict::Forward);
        assert_eq!(reply, tcp((EXT, 80), (SRV1, client), SYN | ACK));
    }
    let sessions: i64 = rigs.iter().map(|r| r.report("active_sessions")).sum();
    assert_eq!(sessions, 40);
}

#[test]
fn a_running_nat_lists_its_forwards_with_their_sessions() {
    for config in configs("") {
        let mut rig = Rig::new(&config);
        for client in [40000, 40001] {
            let mut syn = tcp((SRV1, client), (EXT, 80), SYN);
            assert_eq!(rig.send(&mut syn, Inbound), Verdict::Forward);
        }
        let mut rows = Vec::new();
        rig.nat.list("forwards", rig.now, &mut rows);
        let text = serde_json::to_string(&rows).unwrap();
        assert_eq!(
            text,
            r#"[["tcp","203.0.113.1:80","10.0.0.2:8080",2],["udp","203.0.113.1:5000-5004","10.0.0.3:6000-6004",0]]"#,
            "{config}"
        );
        assert_eq!(rows[0][3], Cell::Int(2));
    }
    // A store holds the same (the state table; the MVT is worker-private).
    let [config, _] = configs("");
    let store = LocalStore::new();
    let mut rig = Rig::worker(&Remote(store.clone()), &config, 0, 1);
    let mut syn = tcp((SRV1, 40000), (EXT, 80), SYN);
    assert_eq!(rig.send(&mut syn, Inbound), Verdict::Forward);
    rig.part.flush_all(rig.now).unwrap();
    let mut live = Vec::new();
    rig.nat.list("forwards", rig.now, &mut live);
    let factory = nat::factory(&table(&config)).unwrap();
    let mut backend = store.connect().unwrap();
    let mut stored = Vec::new();
    let mut reader = StoreReader::new(&mut *backend, "nat");
    assert!(factory
        .stored_rows("forwards", &mut reader, &mut stored)
        .unwrap());
    assert_eq!(stored, live);
    assert_eq!(live[0][3], Cell::Int(1));
}

#[test]
fn bad_forwards_are_refused_naming_each_rule() {
    let t = table(
        r#"external = ["203.0.113.1"]
forward = [
  { proto = "tcp", external = "203.0.113.1:80", internal = "10.0.0.2:8080" },
  { proto = "tcp", external = "203.0.113.1:80", internal = "10.0.0.4:80" },
  { proto = "tcp", external = "203.0.113.7:80", internal = "10.0.0.5:80" },
]"#,
    );
    let errors = nat::factory(&t).err().expect("refused").config_errors();
    let keys: Vec<&str> = errors.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(keys, ["forward[1]", "forward[2]"], "{errors:?}");
    for bad in [
        r#"forward = [{ proto = "icmp", external = "203.0.113.1:1", internal = "10.0.0.1:1" }]"#,
        r#"forward = [{ proto = "tcp", external = "203.0.113.1", internal = "10.0.0.1:1" }]"#,
        r#"forward = [{ proto = "tcp", external = "203.0.113.1:1", internal = "10.0.0.1" }]"#,
        r#"forward = [{ proto = "tcp", external = "203.0.113.1:1", internal = "10.0.0.1:1", x = 1 }]"#,
    ] {
        let t = table(&format!("external = [\"203.0.113.1\"]\n{bad}"));
        let e = nat::factory(&t).err().map(|e| e.to_string());
        assert!(
            e.as_ref().is_some_and(|e| e.contains("forward")),
            "{bad}: {e:?}"
        );
    }
}
