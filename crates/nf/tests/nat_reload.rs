//! NAT reloaded in place (`flowstate reload`): port forwardings come and go and timeouts
//! change while every session goes on; a port is never handed out twice. On both tables, and
//! on the state API through the store.

mod nat_support;

use flowstate_nf::nat;
use flowstate_nf::{Direction::*, Verdict};
use flowstate_state::local::LocalStore;
use flowstate_wire::build::tcp_flags::*;
use nat_support::*;
use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr};

const WEB: Ipv4Addr = IN2;

/// One address, 20 pool ports; `extra` keys added.
fn config(extra: &str, table: &str) -> String {
    format!(
        "external = [\"203.0.113.1\"]\nports = \"5000-5019\"\nearly_drop = false\n{extra}\n{table}"
    )
}

const TABLES: [&str; 2] = ["", "table = \"mvt\""];

/// The rigs of `config` on each table: the local store, the store reached as a remote one,
/// the MVT.
fn rigs(extra: &str) -> Vec<(String, Rig)> {
    let state = config(extra, TABLES[0]);
    let mvt = config(extra, TABLES[1]);
    vec![
        (state.clone(), Rig::new(&state)),
        (
            format!("{state} (remote)"),
            Rig::worker(&Remote(LocalStore::new()), &state, 0, 1),
        ),
        (mvt.clone(), Rig::new(&mvt)),
    ]
}

/// Reloads `rig` with `extra` (the same table).
fn reload(rig: &mut Rig, name: &str, extra: &str) {
    let table = if name.contains("mvt") { TABLES[1] } else { "" };
    let factory = nat::mvt::select_factory(&table_of(&config(extra, table))).unwrap();
    let c = factory.reload_config(None).unwrap().expect("a NAT reloads");
    rig.nat.reconfigure(&c);
    rig.part.maybe_flush(rig.now);
}

fn table_of(text: &str) -> toml::Table {
    text.parse().unwrap()
}

/// Opens UDP mappings from fresh inside endpoints until the pool refuses: their external
/// ports.
fn drain(rig: &mut Rig, from: u16) -> Vec<u16> {
    let mut ports = Vec::new();
    for i in 0..40u16 {
        let mut f = udp((Ipv4Addr::new(10, 0, 9, 1), from + i), (SRV1, 53));
        if rig.send(&mut f, Outbound) == Verdict::Forward {
            let (a, p) = src_of(&f);
            assert_eq!(a, IpAddr::V4(EXT));
            ports.push(p);
        }
    }
    ports
}

/// [`drain`], checking that no port came twice: the ports.
fn drain_once(rig: &mut Rig, name: &str) -> BTreeSet<u16> {
    let ports = drain(rig, 20000);
    let unique: BTreeSet<u16> = ports.iter().copied().collect();
    assert_eq!(
        unique.len(),
        ports.len(),
        "{name}: a port twice in {ports:?}"
    );
    unique
}

const PUBLISH: &str = "forward = [{ proto = \"tcp\", external = \"203.0.113.1:5010-5014\", internal = \"10.0.0.2:8080\" }]";

#[test]
fn a_reload_publishes_a_server_on_pool_ports_and_keeps_every_session() {
    for (name, mut rig) in rigs("") {
        // A mapping holds the pool's first port, 5000; then one on 5010 (the ports are
        // handed out in order).
        let mut held = Vec::new();
        for i in 0..11u16 {
            let mut f = udp((IN1, 7000 + i), (SRV1, 53));
            assert_eq!(rig.send(&mut f, Outbound), Verdict::Forward, "{name}");
            held.push(src_of(&f).1);
        }
        assert_eq!(held[10], 5010, "{name}");
        // Let all but the mapping on 5010 end.
        rig.advance(200);
        let mut keep = udp((IN1, 7010), (SRV1, 53));
        assert_eq!(rig.send(&mut keep, Outbound), Verdict::Forward);
        rig.advance(200);
        assert_eq!(rig.report("active_mappings"), 1, "{name}");
        assert_eq!(rig.report("pool_free"), 19, "{name}");

        reload(&mut rig, &name, &format!("udp = \"60s\"\n{PUBLISH}"));
        // 5011-5014 leave the pool; 5010 is held by the mapping.
        assert_eq!(rig.report("pool_free"), 15, "{name}");
        // The published server takes connections at once.
        let mut syn = tcp((SRV2, 40000), (EXT, 5012), SYN);
        assert_eq!(rig.send(&mut syn, Inbound), Verdict::Forward, "{name}");
        assert_eq!(syn, tcp((SRV2, 40000), (WEB, 8082), SYN), "{name}");
        // The mapping on 5010 goes on, its replies translated.
        let mut answer = udp((SRV1, 53), (EXT, 5010));
        assert_eq!(rig.send(&mut answer, Inbound), Verdict::Forward, "{name}");
        assert_eq!(answer, udp((SRV1, 53), (IN1, 7010)), "{name}");
        // The new UDP timeout: the mapping ends after 60 s, and 5010 stays out of the pool.
        rig.advance(61);
        assert_eq!(rig.report("pool_free"), 15, "{name}");
        // Every pool port but the published ones, once each.
        let unique = drain_once(&mut rig, &name);
        let want: BTreeSet<u16> = (5000..5020).filter(|p| !(5010..5015).contains(p)).collect();
        assert_eq!(unique, want, "{name}");
    }
}

#[test]
fn a_forwarding_removed_takes_no_new_connection_and_gives_its_ports_back_as_its_sessions_end() {
    for (name, mut rig) in rigs(PUBLISH) {
        assert_eq!(rig.report("pool_free"), 15, "{name}");
        let mut syn = tcp((SRV2, 40000), (EXT, 5013), SYN);
        assert_eq!(rig.send(&mut syn, Inbound), Verdict::Forward, "{name}");
        let mut reply = tcp((WEB, 8083), (SRV2, 40000), SYN | ACK);
        assert_eq!(rig.send(&mut reply, Outbound), Verdict::Forward, "{name}");

        reload(&mut rig, &name, "");
        // 5010-5012 and 5014 come back; 5013 is held by the open connection.
        assert_eq!(rig.report("pool_free"), 19, "{name}");
        let mut other = tcp((SRV1, 40001), (EXT, 5011), SYN);
        assert_eq!(
            rig.send(&mut other, Inbound),
            Verdict::Drop("nat: no mapping"),
            "{name}"
        );
        // The open connection goes on both ways.
        let mut ack = tcp((SRV2, 40000), (EXT, 5013), ACK);
        assert_eq!(rig.send(&mut ack, Inbound), Verdict::Forward, "{name}");
        assert_eq!(ack, tcp((SRV2, 40000), (WEB, 8083), ACK), "{name}");
        let mut data = tcp((WEB, 8083), (SRV2, 40000), ACK);
        assert_eq!(rig.send(&mut data, Outbound), Verdict::Forward, "{name}");
        assert_eq!(data, tcp((EXT, 5013), (SRV2, 40000), ACK), "{name}");
        // It closes; its port joins the pool when its session ends.
        for (f, d) in [
            (tcp((WEB, 8083), (SRV2, 40000), RST), Outbound),
            (tcp((SRV2, 40000), (EXT, 5013), RST), Inbound),
        ] {
            let mut f = f;
            rig.send(&mut f, d);
        }
        rig.advance(300);
        assert_eq!(rig.report("active_sessions"), 0, "{name}");
        assert_eq!(rig.report("pool_free"), 20, "{name}");
        let unique = drain_once(&mut rig, &name);
        assert_eq!(unique, (5000..5020).collect(), "{name}");
    }
}

#[test]
fn a_forwarding_removed_and_added_again_never_pools_a_port_a_mapping_holds() {
    for (name, mut rig) in rigs("") {
        // A dynamic mapping takes 5000; the port is then published and unpublished again while
        // it lives: it must not join the pool.
        let mut f = udp((IN1, 7000), (SRV1, 53));
        assert_eq!(rig.send(&mut f, Outbound), Verdict::Forward, "{name}");
        assert_eq!(src_of(&f).1, 5000, "{name}");
        let one = "forward = [{ proto = \"udp\", external = \"203.0.113.1:5000\", internal = \"10.0.0.2:53\" }]";
        reload(&mut rig, &name, one);
        reload(&mut rig, &name, "");
        assert_eq!(rig.report("pool_free"), 19, "{name}");
        let ports = drain(&mut rig, 20000);
        assert!(!ports.contains(&5000), "{name}: 5000 handed out twice");
        assert_eq!(ports.len(), 19, "{name}");
    }
}

#[test]
fn a_forwarding_moved_to_another_port_serves_there_while_its_open_connections_go_on() {
    let at = |port: u16| {
        format!("forward = [{{ proto = \"tcp\", external = \"203.0.113.1:{port}\", internal = \"10.0.0.2:8080\" }}]")
    };
    for (name, mut rig) in rigs(&at(80)) {
        let mut syn = tcp((SRV2, 40000), (EXT, 80), SYN);
        assert_eq!(rig.send(&mut syn, Inbound), Verdict::Forward, "{name}");
        reload(&mut rig, &name, &at(8000));
        // A new connection to the new port, answered from it.
        let mut syn = tcp((SRV1, 40001), (EXT, 8000), SYN);
        assert_eq!(rig.send(&mut syn, Inbound), Verdict::Forward, "{name}");
        assert_eq!(syn, tcp((SRV1, 40001), (WEB, 8080), SYN), "{name}");
        let mut reply = tcp((WEB, 8080), (SRV1, 40001), SYN | ACK);
        assert_eq!(rig.send(&mut reply, Outbound), Verdict::Forward, "{name}");
        assert_eq!(reply, tcp((EXT, 8000), (SRV1, 40001), SYN | ACK), "{name}");
        // The open connection keeps the old port.
        let mut old = tcp((WEB, 8080), (SRV2, 40000), SYN | ACK);
        assert_eq!(rig.send(&mut old, Outbound), Verdict::Forward, "{name}");
        assert_eq!(old, tcp((EXT, 80), (SRV2, 40000), SYN | ACK), "{name}");
        let mut again = tcp((SRV2, 40002), (EXT, 80), SYN);
        assert_eq!(
            rig.send(&mut again, Inbound),
            Verdict::Drop("nat: no mapping"),
            "{name}"
        );
        // Both (established: each side sent a SYN) end; the mapping with them.
        rig.advance(7500);
        assert_eq!(rig.report("active_sessions"), 0, "{name}");
        assert_eq!(rig.report("active_mappings"), 0, "{name}");
    }
}
