//! NAT session lifetimes under a virtual clock, the port pool, and ports per worker.

mod nat_support;

use flowstate_nf::nat::port_owner;
use flowstate_nf::{Direction::*, Verdict};
use flowstate_state::local::LocalStore;
use flowstate_wire::build::tcp_flags::*;
use nat_support::*;
use std::collections::HashSet;
use std::net::Ipv4Addr;

const CONFIG: &str = r#"external = ["203.0.113.1"]"#;
const POOL: i64 = 65535 - 1024 + 1;

fn is_drop(v: Verdict, reason: &str) -> bool {
    v == Verdict::Drop(match reason {
        "no mapping" => "nat: no mapping",
        "pool exhausted" => "nat: pool exhausted",
        other => panic!("unknown reason {other}"),
    })
}

#[test]
fn nat_udp_session_expires_after_silence_and_its_port_returns() {
    let mut rig = Rig::new(CONFIG);
    assert_eq!(rig.report("pool_free"), POOL);
    let mut out = udp((IN1, 5000), (SRV1, 53));
    rig.send(&mut out, Outbound);
    let port = ext_port(&out, EXT);
    assert_eq!(rig.report("pool_free"), POOL - 1);
    rig.advance(299);
    assert_eq!(rig.report("active_sessions"), 1);
    rig.advance(1);
    assert_eq!(rig.report("active_sessions"), 0);
    assert_eq!(rig.report("active_mappings"), 0);
    assert_eq!(rig.report("expired_sessions"), 1);
    assert_eq!(rig.report("pool_free"), POOL);
    let mut late = udp((SRV1, 53), (EXT, port));
    assert!(is_drop(rig.send(&mut late, Inbound), "no mapping"));
}

#[test]
fn nat_a_refreshed_session_does_not_expire() {
    let mut rig = Rig::new(CONFIG);
    let mut out = udp((IN1, 5000), (SRV1, 53));
    rig.send(&mut out, Outbound);
    let port = ext_port(&out, EXT);
    // Outbound refreshes, and so do replies (RFC 4787 REQ-6 allows inbound refresh).
    for i in 0..10 {
        rig.advance(200);
        let mut f = if i % 2 == 0 {
            udp((IN1, 5000), (SRV1, 53))
        } else {
            udp((SRV1, 53), (EXT, port))
        };
        let dir = if i % 2 == 0 { Outbound } else { Inbound };
        assert_eq!(
            rig.send(&mut f, dir),
            Verdict::Forward,
            "refresh {i} at {}s",
            rig.now / SEC
        );
    }
    assert_eq!(rig.report("active_sessions"), 1);
    let mut again = udp((IN1, 5000), (SRV1, 53));
    rig.send(&mut again, Outbound);
    assert_eq!(ext_port(&again, EXT), port, "the mapping lived on");
    rig.advance(300);
    assert_eq!(rig.report("active_sessions"), 0);
}

/// Replies alone keep a session alive under `refresh = "both"` (they renew the session; its
/// reverse entry takes the session's time when its own timer fires), not under `"outbound"`.
#[test]
fn nat_replies_alone_keep_a_session_alive_unless_refresh_is_outbound() {
    let cases = [("both", true), ("outbound", false)];
    for ((refresh, alive), table) in cases.into_iter().flat_map(|c| [(c, "state"), (c, "mvt")]) {
        let mut rig = Rig::new(&format!(
            "{CONFIG}\nrefresh = \"{refresh}\"\ntable = \"{table}\""
        ));
        let mut out = udp((IN1, 5000), (SRV1, 53));
        rig.send(&mut out, Outbound);
        let port = ext_port(&out, EXT);
        for i in 0..10 {
            rig.advance(200);
            let mut reply = udp((SRV1, 53), (EXT, port));
            let v = rig.send(&mut reply, Inbound);
            if alive || i == 0 {
                assert_eq!(v, Verdict::Forward, "{table} {refresh}: reply {i}");
            } else {
                assert!(is_drop(v, "no mapping"), "{table} {refresh}: {i}: {v:?}");
            }
        }
        if alive {
            // One timeout after the last reply, not before.
            rig.advance(299);
            assert_eq!(rig.report("active_sessions"), 1, "{table} {refresh}");
            rig.advance(1);
        }
        assert_eq!(rig.report("active_sessions"), 0, "{table} {refresh}");
    }
}

/// Outbound packets renew only the outbound entry; the reverse entry is renewed lazily when its
/// own timer fires, so replies keep working long after its first deadline.
#[test]
fn nat_a_session_kept_alive_by_outbound_packets_alone_still_answers() {
    let mut rig = Rig::new(CONFIG);
    let mut out = udp((IN1, 5000), (SRV1, 53));
    rig.send(&mut out, Outbound);
    let port = ext_port(&out, EXT);
    for _ in 0..10 {
        rig.advance(200);
        let mut f = udp((IN1, 5000), (SRV1, 53));
        assert_eq!(rig.send(&mut f, Outbound), Verdict::Forward);
    }
    assert_eq!(rig.report("active_sessions"), 1);
    let mut reply = udp((SRV1, 53), (EXT, port));
    assert_eq!(
        rig.send(&mut reply, Inbound),
        Verdict::Forward,
        "2000 s in, the reply passes"
    );
    // Silence: the whole session ends one timeout after the last packet, not before.
    rig.advance(299);
    let mut reply = udp((SRV1, 53), (EXT, port));
    assert_eq!(rig.send(&mut reply, Inbound), Verdict::Forward);
    rig.advance(301);
    let mut late = udp((SRV1, 53), (EXT, port));
    assert!(is_drop(rig.send(&mut late, Inbound), "no mapping"));
    assert_eq!(rig.report("active_sessions"), 0);
}

#[test]
fn nat_icmp_echo_session_uses_the_icmp_timeout() {
    let mut rig = Rig::new("external = [\"203.0.113.1\"]\nicmp = \"30s\"");
    let mut req = echo(IN1, SRV1, 77, false);
    rig.send(&mut req, Outbound);
    let id = flow(&req).src_port;
    rig.advance(29);
    let mut reply = echo(SRV1, EXT, id, true);
    assert_eq!(rig.send(&mut reply, Inbound), Verdict::Forward);
    rig.advance(30);
    let mut reply = echo(SRV1, EXT, id, true);
    assert!(is_drop(rig.send(&mut reply, Inbound), "no mapping"));
}

/// Opens a TCP connection from `inside` to SRV1:80 with a full handshake; returns the external
/// port.
fn handshake(rig: &mut Rig, inside: (Ipv4Addr, u16)) -> u16 {
    let mut syn = tcp(inside, (SRV1, 80), SYN);
    assert_eq!(rig.send(&mut syn, Outbound), Verdict::Forward);
    let port = ext_port(&syn, EXT);
    let mut syn_ack = tcp((SRV1, 80), (EXT, port), SYN | ACK);
    assert_eq!(rig.send(&mut syn_ack, Inbound), Verdict::Forward);
    let mut ack = tcp(inside, (SRV1, 80), ACK);
    assert_eq!(rig.send(&mut ack, Outbound), Verdict::Forward);
    port
}

fn alive(rig: &mut Rig, port: u16) -> bool {
    let mut probe = tcp((SRV1, 80), (EXT, port), ACK);
    rig.send(&mut probe, Inbound) == Verdict::Forward
}

#[test]
fn nat_tcp_established_outlives_transitory() {
    let mut rig = Rig::new(CONFIG);
    let established = handshake(&mut rig, (IN1, 40000));
    let mut syn = tcp((IN2, 40000), (SRV1, 80), SYN);
    rig.send(&mut syn, Outbound);
    assert_eq!(rig.report("active_sessions"), 2);
    rig.advance(240);
    // The half-open connection is gone after the transitory timeout ...
    assert_eq!(rig.report("active_sessions"), 1);
    // ... the established one is not (each probe refreshes it).
    rig.advance(3000);
    assert!(alive(&mut rig, established));
    rig.advance(7439);
    assert!(alive(&mut rig, established));
    rig.advance(7440);
    assert_eq!(rig.report("active_sessions"), 0);
    assert!(!alive(&mut rig, established));
    assert_eq!(rig.report("pool_free"), POOL);
}

#[test]
fn nat_tcp_after_fin_or_rst_is_transitory() {
    let mut rig = Rig::new(CONFIG);
    let a = handshake(&mut rig, (IN1, 40000));
    let b = handshake(&mut rig, (IN1, 40001));
    let mut fin = tcp((IN1, 40000), (SRV1, 80), FIN | ACK);
    rig.send(&mut fin, Outbound);
    let mut fin_back = tcp((SRV1, 80), (EXT, a), FIN | ACK);
    assert_eq!(rig.send(&mut fin_back, Inbound), Verdict::Forward);
    let mut rst = tcp((SRV1, 80), (EXT, b), RST);
    assert_eq!(rig.send(&mut rst, Inbound), Verdict::Forward);
    rig.advance(239);
    assert_eq!(rig.report("active_sessions"), 2);
    rig.advance(1);
    assert_eq!(rig.report("active_sessions"), 0);
    assert_eq!(rig.report("active_mappings"), 0);
    // A new SYN on the tuple of a closing connection starts afresh (transitory, then
    // established after the handshake).
    let c = handshake(&mut rig, (IN1, 40000));
    let mut fin = tcp((IN1, 40000), (SRV1, 80), FIN | ACK);
    rig.send(&mut fin, Outbound);
    let mut syn = tcp((IN1, 40000), (SRV1, 80), SYN);
    rig.send(&mut syn, Outbound);
    let mut syn_ack = tcp((SRV1, 80), (EXT, c), SYN | ACK);
    rig.send(&mut syn_ack, Inbound);
    rig.advance(1000);
    assert!(alive(&mut rig, c), "reopened connection is established");
}

#[test]
fn nat_the_mapping_lives_while_any_of_its_sessions_does() {
    let mut rig = Rig::new(CONFIG);
    let mut a = udp((IN1, 5000), (SRV1, 53));
    rig.send(&mut a, Outbound);
    let port = ext_port(&a, EXT);
    rig.advance(200);
    let mut b = udp((IN1, 5000), (SRV2, 53));
    rig.send(&mut b, Outbound);
    assert_eq!(ext_port(&b, EXT), port);
    rig.advance(100);
    assert_eq!(rig.report("active_sessions"), 1);
    assert_eq!(rig.report("active_mappings"), 1);
    assert_eq!(rig.report("pool_free"), POOL - 1);
    let mut c = udp((IN1, 5000), (SRV1, 53));
    rig.send(&mut c, Outbound);
    assert_eq!(
        ext_port(&c, EXT),
        port,
        "a new session reuses the live mapping"
    );
    rig.advance(300);
    assert_eq!(rig.report("active_mappings"), 0);
    assert_eq!(rig.report("pool_free"), POOL);
    assert_eq!(rig.report("expired_sessions"), 3);
}

#[test]
fn nat_pool_exhaustion_drops_and_counts() {
    // Without early drop: these sessions are never answered, so it would end them.
    let mut rig =
        Rig::new("external = [\"203.0.113.1\"]\nports = \"1024-1027\"\nearly_drop = false");
    assert_eq!(rig.report("pool_free"), 4);
    let mut ports = HashSet::new();
    for host in 1..=4u8 {
        let mut f = udp((Ipv4Addr::new(10, 0, 0, host), 5000), (SRV1, 53));
        assert_eq!(rig.send(&mut f, Outbound), Verdict::Forward);
        ports.insert(ext_port(&f, EXT));
    }
    assert_eq!(ports, (1024..=1027).collect());
    let mut fifth = udp((Ipv4Addr::new(10, 0, 0, 5), 5000), (SRV1, 53));
    assert!(is_drop(rig.send(&mut fifth, Outbound), "pool exhausted"));
    assert_eq!(rig.report("drop_pool_exhausted"), 1);
    assert_eq!(rig.report("pool_free"), 0);
    // Endpoints that hold a mapping still open sessions.
    let mut more = udp((Ipv4Addr::new(10, 0, 0, 1), 5000), (SRV2, 53));
    assert_eq!(rig.send(&mut more, Outbound), Verdict::Forward);
    // Once the mappings expire, the fifth host gets a port.
    rig.advance(300);
    assert_eq!(rig.report("pool_free"), 4);
    let mut fifth = udp((Ipv4Addr::new(10, 0, 0, 5), 5000), (SRV1, 53));
    assert_eq!(rig.send(&mut fifth, Outbound), Verdict::Forward);
    assert!(ports.contains(&ext_port(&fifth, EXT)));
}

#[test]
fn nat_two_workers_never_hand_out_the_same_port() {
    let store = LocalStore::new();
    let config = "external = [\"203.0.113.1\"]\nports = \"1024-1100\"\nearly_drop = false";
    let mut workers = [
        Rig::worker(&store, config, 0, 2),
        Rig::worker(&store, config, 1, 2),
    ];
    assert_eq!(workers[0].report("pool_free"), 39);
    assert_eq!(workers[1].report("pool_free"), 38);
    let mut seen: [HashSet<u16>; 2] = Default::default();
    for (w, rig) in workers.iter_mut().enumerate() {
        for host in 0..60u16 {
            // The same inside endpoints on both workers.
            let inside = Ipv4Addr::new(10, 1, (host >> 8) as u8, host as u8);
            let mut f = udp((inside, 4000), (SRV1, 53));
            if rig.send(&mut f, Outbound) == Verdict::Forward {
                let p = ext_port(&f, EXT);
                assert_eq!(
                    port_owner(p, 1024, 2),
                    w as u32,
                    "port {p} is not worker {w}'s"
                );
                assert!(seen[w].insert(p), "worker {w} gave out {p} twice");
            }
        }
    }
    assert_eq!(seen[0].len(), 39);
    assert_eq!(seen[1].len(), 38);
    assert!(seen[0].is_disjoint(&seen[1]));
    assert_eq!(
        seen[0].len() + seen[1].len(),
        77,
        "the chunks cover the range"
    );
}

#[test]
fn nat_a_store_backed_worker_keeps_sessions_and_pools_across_a_restart() {
    let remote = Remote(LocalStore::new());
    let config = "external = [\"203.0.113.1\"]\nports = \"1024-1031\"";
    let mut rig = Rig::worker(&remote, config, 0, 1);
    let mut out = udp((IN1, 5000), (SRV1, 53));
    assert_eq!(rig.send(&mut out, Outbound), Verdict::Forward);
    let port = ext_port(&out, EXT);
    assert_eq!(rig.report("pool_free"), 7);
    rig.part.flush_all(rig.now).unwrap();
    drop(rig);

    // The worker comes back: the pool is not filled again, the session is still there.
    let mut rig = Rig::worker(&remote, config, 0, 1);
    assert_eq!(rig.report("pool_free"), 7);
    let mut back = udp((SRV1, 53), (EXT, port));
    assert_eq!(rig.send(&mut back, Inbound), Verdict::Forward);
    assert_eq!(back, udp((SRV1, 53), (IN1, 5000)));
    let mut other = udp((IN2, 5000), (SRV1, 53));
    rig.send(&mut other, Outbound);
    assert_ne!(ext_port(&other, EXT), port);
    assert_eq!(rig.report("pool_free"), 6);
    rig.part.flush_all(rig.now).unwrap();
    drop(rig);

    // Other ports for the same worker: refused rather than mixed with the stored pool.
    let factory = flowstate_nf::nat::factory(&table(
        "external = [\"203.0.113.1\"]\nports = \"1024-2000\"",
    ))
    .unwrap();
    let mut part = flowstate_state::Partition::new(&remote, Default::default()).unwrap();
    let mut d = part.declare("nat");
    let worker = flowstate_nf::Placement {
        partition: 0,
        partitions: 1,
        stage: 0,
    };
    assert!(matches!(
        factory.build(&mut d, worker),
        Err(flowstate_nf::BuildError::Config { key, .. }) if key == "ports"
    ));
}
