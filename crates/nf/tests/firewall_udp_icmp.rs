//! Firewall: UDP and ICMP echo pseudo-connections, ICMP errors about tracked connections,
//! other protocols, fragments, and IPv6.

mod common_fwlb;

use common_fwlb::*;
use flowstate_nf::firewall::{ConnState, Reason};
use flowstate_nf::Verdict;
use flowstate_wire::build::{IpSpec, Ipv4Spec, L4Spec, UdpSpec};
use std::net::Ipv4Addr;

const CLIENT: &str = "10.0.0.5:53000";
const DNS: &str = "198.51.100.53:53";

fn udp_state(rig: &Rig<flowstate_nf::firewall::Firewall>) -> Option<ConnState> {
    rig.nf
        .connection(&flow_of(&udp(CLIENT, DNS)))
        .map(|c| c.state)
}

#[test]
fn udp_reply_allowed_within_the_timeout_then_not() {
    let mut rig = firewall("");
    // Unsolicited: dropped.
    assert!(!rig.passes(&udp(DNS, CLIENT), IN));
    assert!(rig.passes(&udp(CLIENT, DNS), OUT));
    assert_eq!(udp_state(&rig), Some(ConnState::Unreplied));
    rig.advance(29);
    assert!(rig.passes(&udp(DNS, CLIENT), IN));
    assert_eq!(udp_state(&rig), Some(ConnState::Replied));
    // Replied: 120 s, renewed by every datagram.
    rig.advance(100);
    assert!(rig.passes(&udp(DNS, CLIENT), IN));
    rig.advance(119);
    assert!(rig.passes(&udp(DNS, CLIENT), IN));
    rig.advance(121);
    assert_eq!(udp_state(&rig), None);
    assert_eq!(
        rig.pass(&udp(DNS, CLIENT), IN).0,
        Verdict::Drop(Reason::InboundPolicy.text())
    );
}

#[test]
fn unreplied_udp_expires_after_30_seconds() {
    let mut rig = firewall("");
    assert!(rig.passes(&udp(CLIENT, DNS), OUT));
    rig.advance(31);
    assert_eq!(udp_state(&rig), None);
    assert!(!rig.passes(&udp(DNS, CLIENT), IN));
    // Configurable.
    let mut rig = firewall("timeouts = { udp_unreplied = \"100s\" }");
    assert!(rig.passes(&udp(CLIENT, DNS), OUT));
    rig.advance(99);
    assert!(rig.passes(&udp(DNS, CLIENT), IN));
}

#[test]
fn icmp_echo_reply_allowed_only_after_the_request() {
    let mut rig = firewall("");
    let (inside, outside) = ("10.0.0.5", "198.51.100.1");
    assert_eq!(
        rig.pass(&echo(outside, inside, 7, true), IN).0,
        Verdict::Drop(Reason::IcmpUnsolicitedReply.text())
    );
    assert!(rig.passes(&echo(inside, outside, 7, false), OUT));
    let key = flow_of(&echo(inside, outside, 7, false));
    assert_eq!(rig.nf.connection(&key).unwrap().state, ConnState::Unreplied);
    // A reply with another identifier answers nothing.
    assert!(!rig.passes(&echo(outside, inside, 8, true), IN));
    assert!(rig.passes(&echo(outside, inside, 7, true), IN));
    assert_eq!(rig.nf.connection(&key).unwrap().state, ConnState::Replied);
    // The inside does not send replies on this "connection".
    assert!(!rig.passes(&echo(inside, outside, 7, true), OUT));
    // 30 s later the entry is gone and so is the permission.
    rig.advance(31);
    assert!(rig.nf.connection(&key).is_none());
    assert!(!rig.passes(&echo(outside, inside, 7, true), IN));
    // Unsolicited inbound pings are dropped unless a rule allows them.
    assert_eq!(
        rig.pass(&echo(outside, inside, 9, false), IN).0,
        Verdict::Drop(Reason::InboundPolicy.text())
    );
    let mut rig =
        firewall(r#"rules = [{ action = "allow", proto = "icmp", direction = "inbound" }]"#);
    assert!(rig.passes(&echo(outside, inside, 9, false), IN));
    assert!(rig.passes(&echo(inside, outside, 9, true), OUT));
}

#[test]
fn icmp_errors_about_tracked_connections_pass() {
    let mut rig = firewall("");
    let query = udp(CLIENT, DNS);
    let router = Ipv4Addr::new(192, 0, 2, 1);
    let client_ip = Ipv4Addr::new(10, 0, 0, 5);
    // Before the query went out, an error quoting it is dropped.
    let unreachable = icmp4_error(router, client_ip, 3, 3, &query);
    assert!(!rig.passes(&unreachable, IN));
    assert!(rig.passes(&query, OUT));
    assert_eq!(
        rig.pass(&unreachable, IN),
        (Verdict::Forward, unreachable.clone())
    );
    assert_eq!(rig.nf.count(Reason::Related), 1);
    // Quoting another flow, or sent to a host that is not an end of the connection: dropped.
    let other = udp("10.0.0.6:53000", DNS);
    assert!(!rig.passes(
        &icmp4_error(router, Ipv4Addr::new(10, 0, 0, 6), 3, 3, &other),
        IN
    ));
    assert!(!rig.passes(
        &icmp4_error(router, Ipv4Addr::new(10, 0, 0, 9), 3, 3, &query),
        IN
    ));
    // Time exceeded for a TCP connection.
    let syn = tcp("10.0.0.5:40000", "198.51.100.7:80", SYN);
    assert!(rig.passes(&syn, OUT));
    assert!(rig.passes(&icmp4_error(router, client_ip, 11, 0, &syn), IN));
}

#[test]
fn other_protocols_are_pseudo_connections() {
    let mut rig = firewall("");
    // GRE (47), built as a UDP frame with the protocol byte changed (no transport parse).
    let gre = |src: Ipv4Addr, dst: Ipv4Addr| {
        let mut f = flowstate_testkit::frame(
            IpSpec::V4(Ipv4Spec::new(src, dst)),
            L4Spec::Udp(UdpSpec {
                src_port: 1,
                dst_port: 2,
            }),
            b"tunnel",
        );
        f[14 + 9] = 47;
        f[14 + 10] = 0;
        f[14 + 11] = 0;
        let c = flowstate_wire::checksum::checksum(&f[14..34]);
        f[14 + 10..14 + 12].copy_from_slice(&c.to_be_bytes());
        f
    };
    let (a, b) = (Ipv4Addr::new(10, 0, 0, 5), Ipv4Addr::new(198, 51, 100, 9));
    assert!(!rig.passes(&gre(b, a), IN));
    assert!(rig.passes(&gre(a, b), OUT));
    assert!(rig.passes(&gre(b, a), IN));
    let c = rig.nf.connection(&flow_of(&gre(a, b))).unwrap();
    assert_eq!(c.state, ConnState::Replied);
    // Generic timeout: 600 s.
    rig.advance(599);
    assert!(rig.nf.connection(&flow_of(&gre(a, b))).is_some());
    rig.advance(2);
    assert!(rig.nf.connection(&flow_of(&gre(a, b))).is_none());
}

#[test]
fn later_fragments_follow_rules_and_policy_only() {
    let mut rig = firewall("");
    let frag = |src: &str, dst: &str| {
        let mut f = udp(src, dst);
        // Fragment offset 185 (1480 bytes), more fragments off: a later fragment.
        f[14 + 6] = 0x00;
        f[14 + 7] = 185;
        f[14 + 10] = 0;
        f[14 + 11] = 0;
        let c = flowstate_wire::checksum::checksum(&f[14..34]);
        f[14 + 10..14 + 12].copy_from_slice(&c.to_be_bytes());
        f
    };
    assert!(rig.passes(&frag(CLIENT, DNS), OUT));
    assert_eq!(rig.nf.tracked(), 0);
    assert!(!rig.passes(&frag(DNS, CLIENT), IN));
    // A rule without ports can let them in; a rule with ports never matches them.
    let mut rig = firewall(
        r#"rules = [
            { action = "allow", proto = "udp", dport = "0-65535", direction = "inbound" },
        ]"#,
    );
    assert!(!rig.passes(&frag(DNS, CLIENT), IN));
    let mut rig = firewall(
        r#"rules = [{ action = "allow", src = "198.51.100.0/24", direction = "inbound" }]"#,
    );
    assert!(rig.passes(&frag(DNS, CLIENT), IN));
}

#[test]
fn later_fragments_with_their_datagrams_ports_follow_the_connection() {
    let mut rig = firewall("");
    let frag = |src: &str, dst: &str| {
        let mut f = udp(src, dst);
        f[14 + 6..14 + 8].copy_from_slice(&185u16.to_be_bytes());
        f[14 + 10..14 + 12].copy_from_slice(&[0, 0]);
        let c = flowstate_wire::checksum::checksum(&f[14..34]);
        f[14 + 10..14 + 12].copy_from_slice(&c.to_be_bytes());
        f
    };
    let (client, dns) = (53000, 53);
    // No connection yet: policy decides, as for any later fragment.
    assert_eq!(
        rig.send_tracked(&frag(DNS, CLIENT), IN, (dns, client)),
        Verdict::Drop(Reason::InboundPolicy.text())
    );
    assert!(rig.passes(&udp(CLIENT, DNS), OUT));
    // The reply's fragments pass on the connection, and change nothing.
    assert_eq!(
        rig.send_tracked(&frag(DNS, CLIENT), IN, (dns, client)),
        Verdict::Forward
    );
    assert_eq!(udp_state(&rig), Some(ConnState::Unreplied));
    assert_eq!(rig.nf.count(Reason::Tracked), 1);
    // Another datagram's ports find no connection; the client's own address coming in is
    // the wrong side of its connection.
    assert_eq!(
        rig.send_tracked(&frag(DNS, CLIENT), IN, (dns, client + 1)),
        Verdict::Drop(Reason::InboundPolicy.text())
    );
    assert_eq!(
        rig.send_tracked(&frag(CLIENT, DNS), IN, (client, dns)),
        Verdict::Drop(Reason::WrongDirection.text())
    );
}

#[test]
fn non_ip_frames_pass() {
    let mut rig = firewall("");
    let mut arp = vec![0xff; 6];
    arp.extend_from_slice(&[2, 0, 0, 0, 0, 1, 0x08, 0x06]);
    arp.extend_from_slice(&[0, 1, 8, 0, 6, 4, 0, 1]);
    arp.extend_from_slice(&[2, 0, 0, 0, 0, 1, 10, 0, 0, 5]);
    arp.extend_from_slice(&[0, 0, 0, 0, 0, 0, 10, 0, 0, 1]);
    arp.resize(60, 0);
    assert!(rig.passes(&arp, IN));
    assert_eq!(rig.nf.count(Reason::NotIp), 1);
}

#[test]
fn ipv6_tcp_udp_and_icmpv6() {
    let mut rig = firewall(
        r#"rules = [{ action = "allow", proto = "tcp", dst = "2001:db8:1::/48", dport = 443, direction = "inbound" }]"#,
    );
    let (client, server) = ("[2001:db8:a::5]:40000", "[2001:db8:ffff::7]:443");
    assert!(!rig.passes(&tcp(server, client, SYN | ACK), IN));
    assert!(rig.passes(&tcp(client, server, SYN), OUT));
    assert!(rig.passes(&tcp(server, client, SYN | ACK), IN));
    assert!(rig.passes(&tcp(client, server, ACK), OUT));
    let c = rig
        .nf
        .connection(&flow_of(&tcp(client, server, ACK)))
        .unwrap();
    assert_eq!(c.state, ConnState::Established);
    // Unsolicited inbound; and the published prefix.
    assert!(!rig.passes(
        &tcp("[2001:db8:ffff::9]:5000", "[2001:db8:a::5]:22", SYN),
        IN
    ));
    assert!(rig.passes(
        &tcp("[2001:db8:ffff::9]:5000", "[2001:db8:1::10]:443", SYN),
        IN
    ));
    assert!(!rig.passes(
        &tcp("[2001:db8:ffff::9]:5000", "[2001:db8:2::10]:443", SYN),
        IN
    ));
    // An IPv4 rule never matches IPv6 and the other way round.
    assert!(!rig.passes(&tcp("198.51.100.9:5000", "198.51.100.10:443", SYN), IN));
    // UDP.
    assert!(!rig.passes(&udp("[2001:db8:ffff::53]:53", "[2001:db8:a::5]:53000"), IN));
    assert!(rig.passes(&udp("[2001:db8:a::5]:53000", "[2001:db8:ffff::53]:53"), OUT));
    assert!(rig.passes(&udp("[2001:db8:ffff::53]:53", "[2001:db8:a::5]:53000"), IN));
    // ICMPv6 echo.
    let (inside, outside) = ("2001:db8:a::5", "2001:db8:ffff::1");
    assert!(!rig.passes(&echo(outside, inside, 3, true), IN));
    assert!(rig.passes(&echo(inside, outside, 3, false), OUT));
    assert!(rig.passes(&echo(outside, inside, 3, true), IN));
    // Neighbour discovery passes both ways, tracked or not.
    assert!(rig.passes(&icmp6("fe80::1", "ff02::1", 134), IN));
    assert!(rig.passes(&icmp6("fe80::2", "fe80::1", 135), OUT));
    assert_eq!(rig.nf.count(Reason::NeighborDiscovery), 2);
    // Other ICMPv6 informational messages follow the policy.
    assert!(!rig.passes(&icmp6("2001:db8:ffff::1", inside, 139), IN));
}

/// A UDP connection stored in `conns` by a version before TCP and other connections had maps
/// of their own: its answer from outside finds it (moved to `datagrams`), not refused as
/// unsolicited; one never stored is still refused.
#[test]
fn a_udp_connection_stored_before_the_split_is_answered() {
    use flowstate_nf::firewall::{window::Window, Conn, TcpConn};
    use flowstate_nf::Direction;
    use flowstate_state::{local::LocalStore, Access, Partition, Scope, StateConfig};
    use flowstate_wire::FlowKey;
    let store = Remote(LocalStore::new());
    {
        let mut part = Partition::new(&store, StateConfig::default()).expect("partition");
        let conns = part
            .declare("firewall")
            .map::<FlowKey, TcpConn>("conns", Scope::PerFlow, Access::ReadWrite)
            .expect("declares");
        let flow = flow_of(&udp(CLIENT, DNS));
        let old = TcpConn {
            conn: Conn {
                state: ConnState::Unreplied,
                opener_is_canonical_src: flow.is_canonical(),
                opened_from: Direction::Outbound,
                first_fin_by_opener: None,
            },
            tcp: Window::default(),
        };
        // The old form: two bytes, as every non-TCP entry was.
        assert_eq!(flowstate_state::Codec::to_bytes(&old).len(), 2);
        conns.insert(flow.canonical(), old).expect("stored");
        part.flush_all(1).expect("flushes");
    }
    let mut rig = firewall_on(&store, "");
    assert!(!rig.passes(&udp("198.51.100.54:53", CLIENT), IN));
    assert!(rig.passes(&udp(DNS, CLIENT), IN));
    assert_eq!(udp_state(&rig), Some(ConnState::Replied));
    assert_eq!((rig.nf.tracked(), rig.nf.tracked_tcp()), (1, 0));
    assert_eq!(rig.report("denied"), 1);
}
