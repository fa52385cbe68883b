//! Load balancer: choosing backends, per-flow affinity, rewriting both ways, connection ends.

mod common_fwlb;

use common_fwlb::*;
use flowstate_nf::lb::{reason, BackendAddr, LoadBalancer};
use flowstate_nf::{Direction, Verdict};
use std::collections::HashMap;

const CONFIG: &str = r#"
vips = [
    { vip = "203.0.113.10", port = 80, proto = "tcp", backends = ["10.1.0.1", "10.1.0.2:8080"], method = "least-loaded" },
    { vip = "203.0.113.11", port = 80, backends = ["10.2.0.1", "10.2.0.2", "10.2.0.3"], method = "maglev" },
    { vip = "203.0.113.12", port = 53, proto = "udp", backends = ["10.3.0.1", "10.3.0.2"] },
    { vip = "2001:db8::10", port = 443, backends = ["[2001:db8:1::1]:8443", "2001:db8:1::2"], method = "maglev" },
]
"#;

const VIP: &str = "203.0.113.10:80";

fn client(port: u16) -> String {
    format!("198.51.100.1:{port}")
}

fn b(s: &str) -> BackendAddr {
    let a = sa(s);
    (a.ip(), a.port())
}

/// Sends a SYN from `client` to `vip`; returns the backend it was sent to (from the rewritten
/// frame) after checking the LB agrees.
fn open(rig: &mut Rig<LoadBalancer>, client: &str, vip: &str) -> BackendAddr {
    let syn = tcp(client, vip, SYN);
    let (v, out) = rig.pass(&syn, Direction::Inbound);
    assert_eq!(v, Verdict::Forward);
    let f = flow_of(&out);
    assert_eq!((f.src, f.src_port), (sa(client).ip(), sa(client).port()));
    assert_eq!(rig.nf.backend_of(&flow_of(&syn)), Some((f.dst, f.dst_port)));
    (f.dst, f.dst_port)
}

fn stats(rig: &Rig<LoadBalancer>) -> HashMap<BackendAddr, (i64, i64)> {
    rig.nf
        .backend_stats()
        .into_iter()
        .map(|s| (s.backend, (s.active, s.connections)))
        .collect()
}

#[test]
fn least_loaded_spreads_new_connections_evenly() {
    let mut rig = lb(CONFIG);
    let mut per: HashMap<BackendAddr, usize> = HashMap::new();
    for p in 0..100 {
        *per.entry(open(&mut rig, &client(20000 + p), VIP))
            .or_default() += 1;
        // Never more than one apart at any time.
        let s = stats(&rig);
        let (a, c) = (s[&b("10.1.0.1:80")].0, s[&b("10.1.0.2:8080")].0);
        assert!((a - c).abs() <= 1, "{a} vs {c}");
    }
    assert_eq!(per[&b("10.1.0.1:80")], 50);
    assert_eq!(per[&b("10.1.0.2:8080")], 50);
    assert_eq!(stats(&rig)[&b("10.1.0.1:80")], (50, 50));
    assert_eq!(rig.labelled("backend_active", "10.1.0.1:80"), 50);
    assert_eq!(rig.labelled("backend_connections", "10.1.0.2:8080"), 50);
    assert_eq!(rig.report("flows"), 100);
}

#[test]
fn least_loaded_refills_the_backend_whose_connections_ended() {
    let mut rig = lb(CONFIG);
    let mut on: HashMap<BackendAddr, Vec<u16>> = HashMap::new();
    for p in 0..20 {
        on.entry(open(&mut rig, &client(30000 + p), VIP))
            .or_default()
            .push(30000 + p);
    }
    let a = b("10.1.0.1:80");
    // Six of backend A's connections are reset by their clients.
    for &p in &on[&a][..6] {
        assert!(rig.passes(&tcp(&client(p), VIP, RST | ACK), Direction::Inbound));
    }
    assert_eq!(stats(&rig)[&a], (4, 10));
    // The next six new connections all go to A; then they alternate again.
    for p in 0..6 {
        assert_eq!(open(&mut rig, &client(31000 + p), VIP), a);
    }
    let s = stats(&rig);
    assert_eq!(s[&a].0, s[&b("10.1.0.2:8080")].0);
}

#[test]
fn every_packet_of_a_connection_reaches_the_same_backend() {
    let mut rig = lb(CONFIG);
    let x = client(40000);
    let home = open(&mut rig, &x, VIP);
    // Other connections come, then those on the other backend end, so that the least-loaded
    // choice is now the other one...
    let mut on_other = Vec::new();
    for p in 0..30 {
        let c = client(41000 + p);
        if open(&mut rig, &c, VIP) != home {
            on_other.push(c);
        }
    }
    for c in &on_other {
        assert!(rig.passes(&tcp(c, VIP, RST), Direction::Inbound));
    }
    let other = if home == b("10.1.0.1:80") {
        b("10.1.0.2:8080")
    } else {
        b("10.1.0.1:80")
    };
    let s = stats(&rig);
    assert!(s[&home].0 >= 15 && s[&other].0 == 0, "{s:?}");
    assert_eq!(open(&mut rig, &client(42000), VIP), other);
    // ...yet X's packets keep going home.
    for flags in [ACK, ACK | PSH, ACK, FIN | ACK, ACK] {
        let (v, out) = rig.pass(&tcp_data(&x, VIP, flags, b"data"), Direction::Inbound);
        assert_eq!(v, Verdict::Forward);
        let f = flow_of(&out);
        assert_eq!((f.dst, f.dst_port), home);
        assert!(checksums_ok(&out));
    }
}

#[test]
fn replies_are_rewritten_back_to_the_vip() {
    let mut rig = lb(CONFIG);
    // Find a client port that lands on the backend with its own port.
    let mut c = client(50000);
    for p in 50000.. {
        c = client(p);
        if open(&mut rig, &c, VIP) == b("10.1.0.2:8080") {
            break;
        }
    }
    let syn_ack = tcp("10.1.0.2:8080", &c, SYN | ACK);
    let (v, out) = rig.pass(&syn_ack, Direction::Outbound);
    assert_eq!(v, Verdict::Forward);
    let f = flow_of(&out);
    assert_eq!(f, flow_of(&tcp(VIP, &c, SYN | ACK)));
    assert!(checksums_ok(&out));
    // Only the flow key's fields changed.
    let expect = tcp(VIP, &c, SYN | ACK);
    assert_eq!(
        out, expect,
        "the rewrite is the frame the VIP would have sent"
    );
    // Data with a payload, both ways: byte for byte the frames a client talking to the
    // backend directly, and the VIP answering, would have sent.
    let get = b"GET / HTTP/1.1\r\n\r\n";
    let (_, req) = rig.pass(&tcp_data(&c, VIP, ACK | PSH, get), Direction::Inbound);
    assert_eq!(req, tcp_data(&c, "10.1.0.2:8080", ACK | PSH, get));
    let ok = b"HTTP/1.1 200 OK";
    let (_, resp) = rig.pass(
        &tcp_data("10.1.0.2:8080", &c, ACK | PSH, ok),
        Direction::Outbound,
    );
    assert_eq!(resp, tcp_data(VIP, &c, ACK | PSH, ok));
    // The bytes of both directions are counted for the backend.
    let bytes = rig
        .nf
        .backend_stats()
        .into_iter()
        .find(|s| s.backend == b("10.1.0.2:8080"))
        .unwrap()
        .bytes;
    assert!(bytes >= (syn_ack.len() + req.len() + resp.len()) as i64);
}

#[test]
fn traffic_not_for_a_vip_passes_untouched() {
    let mut rig = lb(CONFIG);
    let frames = [
        tcp("198.51.100.1:1000", "203.0.113.99:80", SYN),
        tcp("198.51.100.1:1000", "203.0.113.10:81", SYN),
        udp("198.51.100.1:1000", "203.0.113.10:80"),
        tcp("198.51.100.1:1000", "203.0.113.12:53", SYN),
        echo("198.51.100.1", "203.0.113.10", 1, false),
        // From a backend's service port, but answering nothing the LB sent.
        tcp("10.1.0.1:80", "198.51.100.1:1000", SYN | ACK),
        udp("10.3.0.1:53", "198.51.100.1:1000"),
        // From a backend, another port.
        tcp("10.1.0.1:22", "198.51.100.1:1000", SYN),
        tcp("[2001:db8::11]:443", "[2001:db8::1]:1", SYN),
    ];
    for f in frames {
        for dir in [Direction::Inbound, Direction::Outbound] {
            assert_eq!(rig.pass(&f, dir), (Verdict::Forward, f.clone()));
        }
    }
    assert_eq!(rig.nf.flows(), 0);
    assert_eq!(rig.report("untracked_replies"), 4);
}

#[test]
fn mid_connection_packets_without_a_backend() {
    let mut rig = lb(CONFIG);
    // Least-loaded (StatelessNF Algorithm 1): a non-SYN with no backend chosen is dropped.
    for flags in [ACK, ACK | PSH, FIN | ACK, RST, SYN | ACK] {
        assert_eq!(
            rig.pass(&tcp(&client(1), VIP, flags), Direction::Inbound).0,
            Verdict::Drop(reason::NO_CONNECTION)
        );
    }
    assert_eq!(rig.nf.flows(), 0);
    // Maglev: the table gives the backend a SYN would have got.
    let mvip = "203.0.113.11:80";
    let mut fresh = lb(CONFIG);
    for p in 0..50 {
        let c = client(2000 + p);
        let (_, mid) = rig.pass(&tcp(&c, mvip, ACK), Direction::Inbound);
        let (_, syn) = fresh.pass(&tcp(&c, mvip, SYN), Direction::Inbound);
        assert_eq!(flow_of(&mid).dst, flow_of(&syn).dst);
    }
    assert_eq!(rig.nf.flows(), 50);
    // A RST or FIN is steered but creates nothing.
    assert!(rig.passes(&tcp(&client(3000), mvip, RST), Direction::Inbound));
    assert_eq!(rig.nf.flows(), 50);
}

#[test]
fn connection_ends_lower_the_active_count() {
    let mut rig = lb(CONFIG);
    let c = client(60000);
    let home = open(&mut rig, &c, VIP);
    let home_s = format!("{}:{}", home.0, home.1);
    assert_eq!(stats(&rig)[&home], (1, 1));
    // FIN from the client: still active.
    assert!(rig.passes(&tcp(&c, VIP, FIN | ACK), Direction::Inbound));
    assert_eq!(stats(&rig)[&home].0, 1);
    // FIN from the backend: ended.
    assert!(rig.passes(&tcp(&home_s, &c, FIN | ACK), Direction::Outbound));
    assert_eq!(stats(&rig)[&home], (0, 1));
    assert_eq!(rig.nf.open_flows(), 0);
    // The last ACK still reaches the backend; a retransmitted FIN does not count twice.
    let (v, out) = rig.pass(&tcp(&c, VIP, ACK), Direction::Inbound);
    assert_eq!((v, flow_of(&out).dst), (Verdict::Forward, home.0));
    assert!(rig.passes(&tcp(&home_s, &c, FIN | ACK), Direction::Outbound));
    assert_eq!(stats(&rig)[&home].0, 0);
    // The entry lives for tcp_fin (120 s), then goes; expiry of an ended flow counts nothing.
    rig.advance(119);
    assert_eq!(rig.nf.flows(), 1);
    rig.advance(2);
    assert_eq!(rig.nf.flows(), 0);
    assert_eq!(stats(&rig)[&home], (0, 1));
    // The 5-tuple reused by a new connection.
    open(&mut rig, &c, VIP);
    let reopened = rig.nf.backend_of(&flow_of(&tcp(&c, VIP, SYN))).unwrap();
    // A RST from the backend ends it.
    let rs = format!("{}:{}", reopened.0, reopened.1);
    assert!(rig.passes(&tcp(&rs, &c, RST | ACK), Direction::Outbound));
    assert_eq!(stats(&rig)[&reopened].0, 0);
    // Idle connections expire after 900 s and stop counting.
    let d = client(60001);
    let idle = open(&mut rig, &d, VIP);
    rig.advance(899);
    assert!(rig.passes(&tcp(&d, VIP, ACK), Direction::Inbound));
    rig.advance(899);
    assert_eq!(stats(&rig)[&idle].0, 1);
    rig.advance(2);
    assert_eq!(stats(&rig)[&idle].0, 0);
    assert!(!rig.passes(&tcp(&d, VIP, ACK), Direction::Inbound));
}

#[test]
fn udp_vip() {
    let mut rig = lb(CONFIG);
    let vip = "203.0.113.12:53";
    let mut per: HashMap<std::net::IpAddr, Vec<u16>> = HashMap::new();
    for p in 0..10 {
        let c = client(7000 + p);
        let (v, out) = rig.pass(&udp(&c, vip), Direction::Inbound);
        assert_eq!(v, Verdict::Forward);
        assert!(checksums_ok(&out));
        per.entry(flow_of(&out).dst).or_default().push(7000 + p);
        // Further datagrams of the flow follow it.
        let (_, again) = rig.pass(&udp(&c, vip), Direction::Inbound);
        assert_eq!(flow_of(&again).dst, flow_of(&out).dst);
    }
    assert_eq!(per.len(), 2);
    assert!(per.values().all(|v| v.len() == 5));
    let (be, ports) = per.iter().next().unwrap();
    let reply = udp(&format!("{be}:53"), &client(ports[0]));
    let (v, out) = rig.pass(&reply, Direction::Outbound);
    assert_eq!((v, out), (Verdict::Forward, udp(vip, &client(ports[0]))));
    // 300 s without a datagram and the flows are forgotten.
    rig.advance(301);
    assert_eq!(rig.nf.flows(), 0);
    assert!(rig.nf.backend_stats().iter().all(|s| s.active == 0));
}

#[test]
fn ipv6_vip() {
    let mut rig = lb(CONFIG);
    let vip = "[2001:db8::10]:443";
    let c = "[2001:db8:ff::1]:50000";
    let (v, out) = rig.pass(&tcp(c, vip, SYN), Direction::Inbound);
    assert_eq!(v, Verdict::Forward);
    assert!(checksums_ok(&out));
    let f = flow_of(&out);
    let be = format!("[{}]:{}", f.dst, f.dst_port);
    assert!(
        be == "[2001:db8:1::1]:8443" || be == "[2001:db8:1::2]:443",
        "{be}"
    );
    assert_eq!(out, tcp(c, &be, SYN));
    let (v, back) = rig.pass(&tcp(&be, c, SYN | ACK), Direction::Outbound);
    assert_eq!((v, back), (Verdict::Forward, tcp(vip, c, SYN | ACK)));
}

#[test]
fn least_loaded_on_a_store_that_is_not_the_cache() {
    let store = Remote(flowstate_state::local::LocalStore::new());
    let mut rig = lb_on(&store, CONFIG, 0);
    let mut per: HashMap<BackendAddr, usize> = HashMap::new();
    for p in 0..40 {
        *per.entry(open(&mut rig, &client(8000 + p), VIP))
            .or_default() += 1;
        rig.advance_ns(2_000_000);
    }
    assert_eq!(per.values().copied().collect::<Vec<_>>(), vec![20, 20]);
    assert_eq!(stats(&rig)[&b("10.1.0.1:80")], (20, 20));
}

#[test]
fn each_worker_keeps_its_own_loads() {
    let store = flowstate_state::local::LocalStore::new();
    let mut w0 = lb_on(&store, CONFIG, 0);
    let mut w1 = lb_on(&store, CONFIG, 1);
    for p in 0..10 {
        open(&mut w0, &client(9000 + p), VIP);
    }
    assert_eq!(stats(&w0)[&b("10.1.0.1:80")].0, 5);
    assert!(w1.nf.backend_stats().iter().all(|s| s.active == 0));
    open(&mut w1, &client(9100), VIP);
    assert_eq!(
        w1.nf.backend_stats().iter().map(|s| s.active).sum::<i64>(),
        1
    );
}

#[test]
fn fragments_to_a_vip_or_from_a_backend_are_dropped() {
    let mut rig = lb(CONFIG);
    // A first fragment (more fragments set) of a UDP datagram, and a later one.
    let frag = |src: &str, dst: &str, later: bool| {
        let mut f = udp(src, dst);
        f[14 + 6] = if later { 0x00 } else { 0x20 };
        f[14 + 7] = if later { 185 } else { 0 };
        f[14 + 10] = 0;
        f[14 + 11] = 0;
        let c = flowstate_wire::checksum::checksum(&f[14..34]);
        f[14 + 10..14 + 12].copy_from_slice(&c.to_be_bytes());
        f
    };
    for later in [false, true] {
        let to_vip = frag(&client(1), "203.0.113.12:53", later);
        assert_eq!(
            rig.pass(&to_vip, Direction::Inbound).0,
            Verdict::Drop(reason::FRAGMENT)
        );
        let from_backend = frag("10.3.0.1:53", &client(1), later);
        assert_eq!(
            rig.pass(&from_backend, Direction::Outbound).0,
            Verdict::Drop(reason::FRAGMENT)
        );
        // Elsewhere, or another protocol than the VIP's: untouched.
        let other = frag(&client(1), "203.0.113.99:53", later);
        assert_eq!(
            rig.pass(&other, Direction::Inbound),
            (Verdict::Forward, other.clone())
        );
        let tcp_vip_udp_frag = frag(&client(1), "203.0.113.10:80", later);
        assert!(rig.passes(&tcp_vip_udp_frag, Direction::Inbound));
    }
}

/// Every connection the LB sees goes to one partition both ways: to a VIP and back from its
/// backend, and straight to a backend's service and back (its replies come from a backend's
/// port: without the same rule for the way there, a firewall beside the LB would see them
/// in another partition and drop them).
#[test]
fn both_ways_of_a_connection_share_a_partition() {
    use flowstate_nf::NfFactory;
    let f = flowstate_nf::lb::Factory::new(
        &flowstate_nf::lb::Config::from_table(&table(CONFIG)).unwrap(),
    )
    .unwrap();
    let part = |from: &str, to: &str| {
        let (a, b) = (sa(from), sa(to));
        let flow = flowstate_wire::FlowKey::new(a.ip(), b.ip(), a.port(), b.port(), 6);
        f.partition(&flow, None, Direction::Inbound, 64)
    };
    let mut seen = std::collections::HashSet::new();
    for p in 0..64 {
        let c = client(40000 + p);
        let there = part(&c, VIP).expect("a VIP connection is the LB's");
        assert_eq!(
            part("10.1.0.2:8080", &c),
            Some(there),
            "its backend's reply"
        );
        let straight = part(&c, "10.1.0.1:80").expect("one to a backend's service too");
        assert_eq!(part("10.1.0.1:80", &c), Some(straight));
        assert_eq!(straight, there, "both by the client endpoint");
        seen.insert(there);
    }
    assert!(seen.len() > 16, "client endpoints spread: {seen:?}");
    assert_eq!(part(&client(1), "192.0.2.9:80"), None, "not the LB's");
}
