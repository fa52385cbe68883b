//! Load balancer reloaded in place (`flowstate reload`): the VIPs and backends change, every
//! connection stays on its backend, new connections meet the new lists.

mod common_fwlb;

use common_fwlb::*;
use flowstate_nf::lb::{self, reason, BackendAddr, LoadBalancer};
use flowstate_nf::{Direction, NetworkFunction, NfFactory, ReloadConfig, Verdict};

const OLD: &str = r#"
vips = [
    { vip = "203.0.113.10", port = 80, backends = ["10.1.0.1", "10.1.0.2"] },
    { vip = "203.0.113.11", port = 80, backends = ["10.2.0.1", "10.2.0.2", "10.2.0.3"], method = "maglev" },
    { vip = "203.0.113.12", port = 80, backends = ["10.3.0.1"] },
]
"#;

/// 10.1.0.1 goes, 10.1.0.3 comes; the Maglev VIP loses 10.2.0.2; VIP .12 goes.
const NEW: &str = r#"
vips = [
    { vip = "203.0.113.11", port = 80, backends = ["10.2.0.3", "10.2.0.1"], method = "maglev" },
    { vip = "203.0.113.10", port = 80, backends = ["10.1.0.3", "10.1.0.2"] },
]
"#;

fn factory(config: &str) -> lb::Factory {
    lb::Factory::new(&lb::Config::from_table(&table(config)).unwrap()).unwrap()
}

fn b(s: &str) -> BackendAddr {
    let a = sa(s);
    (a.ip(), a.port())
}

/// A SYN from `client` to `vip`: where it went (`None`: dropped, with the reason).
fn open(rig: &mut Rig<LoadBalancer>, client: &str, vip: &str) -> Result<BackendAddr, Verdict> {
    let (v, out) = rig.pass(&tcp(client, vip, SYN), Direction::Inbound);
    if v != Verdict::Forward {
        return Err(v);
    }
    let f = flow_of(&out);
    Ok((f.dst, f.dst_port))
}

/// A data segment of an open connection, each way: the backend it reached, and whether the
/// backend's answer came back from the VIP.
fn carries(rig: &mut Rig<LoadBalancer>, client: &str, vip: &str) -> (BackendAddr, bool) {
    let (v, out) = rig.pass(&tcp(client, vip, ACK), Direction::Inbound);
    assert_eq!(v, Verdict::Forward, "{client} -> {vip}");
    let f = flow_of(&out);
    let backend = format!("{}:{}", f.dst, f.dst_port);
    let (v, back) = rig.pass(&tcp(&backend, client, ACK), Direction::Outbound);
    let g = flow_of(&back);
    (
        (f.dst, f.dst_port),
        v == Verdict::Forward && format!("{}:{}", g.src, g.src_port) == vip,
    )
}

fn reload(rig: &mut Rig<LoadBalancer>, running: &ReloadConfig, config: &str) -> ReloadConfig {
    let c = factory(config)
        .reload_config(Some(running))
        .unwrap()
        .unwrap();
    rig.nf.reconfigure(&c);
    c
}

#[test]
fn connections_stay_on_their_backends_and_new_ones_meet_the_new_lists() {
    let mut rig = lb(OLD);
    let started = factory(OLD).reload_config(None).unwrap().unwrap();
    let clients: Vec<String> = (0..40)
        .map(|p| format!("198.51.100.1:{}", 20000 + p))
        .collect();
    let vips = ["203.0.113.10:80", "203.0.113.11:80", "203.0.113.12:80"];
    let mut before = Vec::new();
    for (i, c) in clients.iter().enumerate() {
        let vip = vips[i % 3];
        before.push((c.clone(), vip, open(&mut rig, c, vip).unwrap()));
    }
    assert!(before.iter().any(|(_, _, b0)| *b0 == b("10.1.0.1:80")));
    assert!(before.iter().any(|(_, _, b0)| *b0 == b("10.2.0.2:80")));
    reload(&mut rig, &started, NEW);
    // Every connection goes on with its backend, the removed ones' and the removed VIP's too,
    // both ways.
    for (c, vip, was) in &before {
        assert_eq!(carries(&mut rig, c, vip), (*was, true), "{c} -> {vip}");
    }
    // New connections: only the listed backends; none to the removed VIP.
    for p in 0..40 {
        let c = format!("198.51.100.2:{}", 30000 + p);
        let to10 = open(&mut rig, &c, vips[0]).unwrap();
        assert!(
            [b("10.1.0.3:80"), b("10.1.0.2:80")].contains(&to10),
            "{to10:?}"
        );
        let c = format!("198.51.100.3:{}", 30000 + p);
        let to11 = open(&mut rig, &c, vips[1]).unwrap();
        assert!(
            [b("10.2.0.3:80"), b("10.2.0.1:80")].contains(&to11),
            "{to11:?}"
        );
        let c = format!("198.51.100.4:{}", 30000 + p);
        assert_eq!(
            open(&mut rig, &c, vips[2]),
            Err(Verdict::Drop(reason::NO_BACKEND))
        );
    }
}

/// The Maglev VIP's new table is the one a fresh start with the new list builds: a lost
/// entry finds the backend a restarted LB would choose.
#[test]
fn a_reloaded_maglev_vip_chooses_as_a_fresh_one_does() {
    let mut reloaded = lb(OLD);
    let started = factory(OLD).reload_config(None).unwrap().unwrap();
    reload(&mut reloaded, &started, NEW);
    let mut fresh = lb(NEW);
    for p in 0..200 {
        let c = format!("198.51.100.9:{}", 40000 + p);
        assert_eq!(
            open(&mut reloaded, &c, "203.0.113.11:80"),
            open(&mut fresh, &c, "203.0.113.11:80")
        );
    }
}

/// Reloads chain: a backend removed and added back takes its old place, and its
/// connections from before both reloads are still carried.
#[test]
fn a_backend_removed_and_listed_again_keeps_its_connections() {
    let mut rig = lb(OLD);
    let started = factory(OLD).reload_config(None).unwrap().unwrap();
    let mut first = None;
    for p in 0..20 {
        let c = format!("198.51.100.1:{}", 21000 + p);
        if open(&mut rig, &c, "203.0.113.10:80").unwrap() == b("10.1.0.1:80") {
            first = Some(c);
            break;
        }
    }
    let first = first.expect("a connection on 10.1.0.1");
    let second = reload(&mut rig, &started, NEW);
    reload(&mut rig, &second, OLD);
    assert_eq!(
        carries(&mut rig, &first, "203.0.113.10:80"),
        (b("10.1.0.1:80"), true)
    );
}

/// Steering after a reload: a removed backend's answers still go to its client's partition,
/// as a dispatcher with several workers needs (the new file alone no longer knows it).
#[test]
fn a_removed_backends_answers_are_steered_by_the_running_configuration() {
    let started = factory(OLD).reload_config(None).unwrap().unwrap();
    let fresh = factory(NEW);
    let running = fresh.reload_config(Some(&started)).unwrap().unwrap();
    let steering = fresh
        .steering(&running)
        .expect("the LB steers by its running config");
    let answer = flowstate_wire::FlowKey::new(
        "10.1.0.1".parse().unwrap(),
        "198.51.100.1".parse().unwrap(),
        80,
        20000,
        6,
    );
    let client = flowstate_nf::endpoint_partition("198.51.100.1".parse().unwrap(), 20000, 6, 8);
    assert_eq!(
        steering.partition(&answer, None, Direction::Outbound, 8),
        Some(client)
    );
    assert_eq!(fresh.partition(&answer, None, Direction::Outbound, 8), None);
}
