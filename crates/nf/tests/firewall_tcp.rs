//! Firewall: TCP connection tracking (conntrack's states without window checks), the default
//! policy "inside may open, outside may only answer", timeouts on a virtual clock.

mod common_fwlb;

use common_fwlb::*;
use flowstate_nf::firewall::{ConnState, Reason};
use flowstate_nf::{Direction, Verdict};

const CLIENT: &str = "10.0.0.5:40000";
const SERVER: &str = "198.51.100.7:443";

fn state(rig: &Rig<flowstate_nf::firewall::Firewall>) -> Option<ConnState> {
    rig.nf
        .connection(&flow_of(&tcp(CLIENT, SERVER, SYN)))
        .map(|c| c.state)
}

/// Client SYN, server SYN/ACK, client ACK.
fn handshake(rig: &mut Rig<flowstate_nf::firewall::Firewall>) {
    assert!(rig.passes(&tcp(CLIENT, SERVER, SYN), OUT));
    assert_eq!(state(rig), Some(ConnState::SynSent));
    assert!(rig.passes(&tcp(SERVER, CLIENT, SYN | ACK), IN));
    assert_eq!(state(rig), Some(ConnState::SynRecv));
    assert!(rig.passes(&tcp(CLIENT, SERVER, ACK), OUT));
    assert_eq!(state(rig), Some(ConnState::Established));
}

#[test]
fn reverse_direction_passes_only_after_the_syn() {
    let mut rig = firewall("");
    // The server's answer before the client asked: nothing to answer.
    assert_eq!(
        rig.pass(&tcp(SERVER, CLIENT, SYN | ACK), IN).0,
        Verdict::Drop(Reason::TcpNoConnection.text())
    );
    assert_eq!(
        rig.pass(&tcp_data(SERVER, CLIENT, ACK | PSH, b"hello"), IN)
            .0,
        Verdict::Drop(Reason::TcpNoConnection.text())
    );
    assert_eq!(rig.nf.tracked(), 0);
    handshake(&mut rig);
    for _ in 0..3 {
        assert!(rig.passes(&tcp_data(CLIENT, SERVER, ACK | PSH, b"GET /"), OUT));
        assert!(rig.passes(&tcp_data(SERVER, CLIENT, ACK | PSH, b"200 OK"), IN));
    }
    assert_eq!(state(&rig), Some(ConnState::Established));
    let c = rig
        .nf
        .connection(&flow_of(&tcp(SERVER, CLIENT, ACK)))
        .unwrap();
    assert_eq!(c.opened_from, Direction::Outbound);
    assert_eq!(rig.nf.count(Reason::Tracked), 8);
    assert_eq!(rig.nf.count(Reason::AllowPolicy), 1);
    assert_eq!(rig.nf.count(Reason::TcpNoConnection), 2);
    assert_eq!(rig.report("conns_established"), 1);
    assert_eq!(rig.report("allowed"), 9);
    assert_eq!(rig.report("denied"), 2);
}

#[test]
fn unsolicited_inbound_syn_is_dropped() {
    let mut rig = firewall("");
    let (v, _) = rig.pass(&tcp("203.0.113.9:5555", "10.0.0.5:22", SYN), IN);
    assert_eq!(v, Verdict::Drop("inbound: not opened from inside"));
    assert_eq!(rig.nf.tracked(), 0);
    // Nor does the attempt let the inside's answer open anything in its name.
    assert_eq!(
        rig.pass(&tcp("10.0.0.5:22", "203.0.113.9:5555", SYN | ACK), OUT)
            .0,
        Verdict::Drop(Reason::TcpNoConnection.text())
    );
    assert_eq!(rig.nf.count(Reason::InboundPolicy), 1);
}

#[test]
fn inbound_to_a_published_port_passes() {
    let mut rig = firewall(
        r#"rules = [{ action = "allow", proto = "tcp", dst = "198.51.100.0/24", dport = "80-443", direction = "inbound" }]"#,
    );
    let client = "203.0.113.9:5555";
    let web = "198.51.100.10:443";
    assert!(rig.passes(&tcp(client, web, SYN), IN));
    assert!(rig.passes(&tcp(web, client, SYN | ACK), OUT));
    assert!(rig.passes(&tcp(client, web, ACK), IN));
    let c = rig.nf.connection(&flow_of(&tcp(client, web, ACK))).unwrap();
    assert_eq!(
        (c.state, c.opened_from),
        (ConnState::Established, Direction::Inbound)
    );
    assert_eq!(rig.nf.count(Reason::AllowRule), 1);
    // Outside the published range, and not to that prefix: dropped.
    assert!(!rig.passes(&tcp(client, "198.51.100.10:22", SYN), IN));
    assert!(!rig.passes(&tcp(client, "198.51.101.10:443", SYN), IN));
    assert!(!rig.passes(&udp(client, "198.51.100.10:443"), IN));
}

#[test]
fn full_lifecycle_fin_both_ways_reaches_time_wait() {
    let mut rig = firewall("");
    handshake(&mut rig);
    // The client closes first.
    assert!(rig.passes(&tcp(CLIENT, SERVER, FIN | ACK), OUT));
    assert_eq!(state(&rig), Some(ConnState::FinWait));
    assert!(rig.passes(&tcp(SERVER, CLIENT, ACK), IN));
    assert_eq!(state(&rig), Some(ConnState::CloseWait));
    assert!(rig.passes(&tcp_data(SERVER, CLIENT, ACK | PSH, b"tail"), IN));
    assert_eq!(state(&rig), Some(ConnState::CloseWait));
    assert!(rig.passes(&tcp(SERVER, CLIENT, FIN | ACK), IN));
    assert_eq!(state(&rig), Some(ConnState::LastAck));
    assert!(rig.passes(&tcp(CLIENT, SERVER, ACK), OUT));
    assert_eq!(state(&rig), Some(ConnState::TimeWait));
    assert_eq!(rig.nf.connections_in(ConnState::TimeWait), 1);
    assert_eq!(rig.nf.connections_in(ConnState::Established), 0);
    // TIME_WAIT lasts 120 s.
    rig.advance(119);
    assert_eq!(state(&rig), Some(ConnState::TimeWait));
    rig.advance(2);
    assert_eq!(state(&rig), None);
    assert_eq!(rig.nf.connections_in(ConnState::TimeWait), 0);
    assert_eq!(rig.report("conns_expired"), 1);
    // A late segment from outside is dropped.
    assert!(!rig.passes(&tcp(SERVER, CLIENT, ACK), IN));
}

#[test]
fn server_closing_first_and_simultaneous_fins() {
    let mut rig = firewall("");
    handshake(&mut rig);
    assert!(rig.passes(&tcp(SERVER, CLIENT, FIN | ACK), IN));
    assert_eq!(state(&rig), Some(ConnState::FinWait));
    // The closer's own ACKs do not move the state.
    assert!(rig.passes(&tcp(SERVER, CLIENT, ACK), IN));
    assert_eq!(state(&rig), Some(ConnState::FinWait));
    // The client's FIN/ACK answers and closes its half at once.
    assert!(rig.passes(&tcp(CLIENT, SERVER, FIN | ACK), OUT));
    assert_eq!(state(&rig), Some(ConnState::LastAck));
    // Only the first closer's ACK is the last one.
    assert!(rig.passes(&tcp(CLIENT, SERVER, ACK), OUT));
    assert_eq!(state(&rig), Some(ConnState::LastAck));
    assert!(rig.passes(&tcp(SERVER, CLIENT, ACK), IN));
    assert_eq!(state(&rig), Some(ConnState::TimeWait));
    // A new SYN from the client reuses the 5-tuple.
    assert!(rig.passes(&tcp(CLIENT, SERVER, SYN), OUT));
    assert_eq!(state(&rig), Some(ConnState::SynSent));
    assert_eq!(rig.nf.connections_in(ConnState::TimeWait), 0);
    assert_eq!(rig.report("conns_opened"), 2);
}

#[test]
fn rst_closes_then_the_entry_expires() {
    let mut rig = firewall("");
    handshake(&mut rig);
    assert!(rig.passes(&tcp(SERVER, CLIENT, RST | ACK), IN));
    assert_eq!(state(&rig), Some(ConnState::Close));
    // In-flight segments within CLOSE's 10 s still pass.
    assert!(rig.passes(&tcp(CLIENT, SERVER, ACK), OUT));
    rig.advance(11);
    assert_eq!(state(&rig), None);
    assert!(!rig.passes(&tcp(SERVER, CLIENT, ACK), IN));
    // A RST during the handshake (connection refused) closes too.
    assert!(rig.passes(&tcp(CLIENT, SERVER, SYN), OUT));
    assert!(rig.passes(&tcp(SERVER, CLIENT, RST | ACK), IN));
    assert_eq!(state(&rig), Some(ConnState::Close));
}

#[test]
fn invalid_segments_are_dropped_with_a_reason() {
    let mut rig = firewall("");
    let drop = |r: Reason| Verdict::Drop(r.text());
    // A non-SYN that would start a connection, from either side.
    assert_eq!(
        rig.pass(&tcp(CLIENT, SERVER, ACK), OUT).0,
        drop(Reason::TcpNoConnection)
    );
    assert_eq!(
        rig.pass(&tcp(CLIENT, SERVER, FIN | ACK), OUT).0,
        drop(Reason::TcpNoConnection)
    );
    // RST or ACK for nothing.
    assert_eq!(
        rig.pass(&tcp(SERVER, CLIENT, RST), IN).0,
        drop(Reason::TcpNoConnection)
    );
    assert_eq!(
        rig.pass(&tcp(SERVER, CLIENT, RST | ACK), IN).0,
        drop(Reason::TcpNoConnection)
    );
    // Flag combinations no TCP sends (scans).
    for flags in [
        0,
        FIN,
        SYN | FIN,
        SYN | RST,
        FIN | PSH | 0x20,
        SYN | FIN | RST | ACK,
    ] {
        assert_eq!(
            rig.pass(&tcp(CLIENT, SERVER, flags), OUT).0,
            drop(Reason::TcpInvalidFlags)
        );
    }
    assert_eq!(rig.nf.tracked(), 0);
    // Segments that make no sense in SYN_SENT.
    assert!(rig.passes(&tcp(CLIENT, SERVER, SYN), OUT));
    assert_eq!(
        rig.pass(&tcp(CLIENT, SERVER, SYN | ACK), OUT).0,
        drop(Reason::TcpInvalidState)
    );
    assert_eq!(
        rig.pass(&tcp(SERVER, CLIENT, FIN | ACK), IN).0,
        drop(Reason::TcpInvalidState)
    );
    assert_eq!(state(&rig), Some(ConnState::SynSent));
    // The client's side of the connection arriving from outside (a spoofed inside address).
    assert_eq!(
        rig.pass(&tcp(CLIENT, SERVER, SYN), IN).0,
        drop(Reason::WrongDirection)
    );
    assert_eq!(state(&rig), Some(ConnState::SynSent));
    // A retransmitted SYN is fine.
    assert!(rig.passes(&tcp(CLIENT, SERVER, SYN), OUT));
}

/// A client reconnects on a 5-tuple whose server is still in TIME_WAIT (a NAT reusing an
/// external port soon): the server answers the SYN with a bare ACK, the client resets that
/// TIME_WAIT and its next SYN gets a SYN/ACK. Every segment must pass, as through conntrack.
#[test]
fn a_server_in_time_wait_is_reset_by_the_client_and_the_connection_opens() {
    let mut rig = firewall("");
    assert!(rig.passes(&tcp(CLIENT, SERVER, SYN), OUT));
    assert!(
        rig.passes(&tcp(SERVER, CLIENT, ACK), IN),
        "the TIME_WAIT ACK"
    );
    assert_eq!(state(&rig), Some(ConnState::SynSent));
    assert!(
        rig.passes(&tcp(CLIENT, SERVER, RST), OUT),
        "the client's reset"
    );
    assert_eq!(state(&rig), Some(ConnState::Close));
    assert!(rig.passes(&tcp(CLIENT, SERVER, SYN), OUT), "the SYN again");
    assert_eq!(state(&rig), Some(ConnState::SynSent));
    assert!(rig.passes(&tcp(SERVER, CLIENT, SYN | ACK), IN));
    assert!(rig.passes(&tcp(CLIENT, SERVER, ACK), OUT));
    assert_eq!(state(&rig), Some(ConnState::Established));
}

#[test]
fn timeouts_expire_entries_and_late_packets_from_outside_are_dropped() {
    let mut rig = firewall("timeouts = { established = \"50s\", syn_sent = \"5s\" }");
    handshake(&mut rig);
    // Every packet renews the timer.
    rig.advance(40);
    assert!(rig.passes(&tcp(SERVER, CLIENT, ACK), IN));
    rig.advance(40);
    assert_eq!(state(&rig), Some(ConnState::Established));
    rig.advance(11);
    assert_eq!(state(&rig), None);
    assert_eq!(rig.nf.connections_in(ConnState::Established), 0);
    assert_eq!(
        rig.pass(&tcp_data(SERVER, CLIENT, ACK | PSH, b"late"), IN)
            .0,
        Verdict::Drop(Reason::TcpNoConnection.text())
    );
    // An unanswered SYN is forgotten after syn_sent.
    assert!(rig.passes(&tcp(CLIENT, SERVER, SYN), OUT));
    rig.advance(6);
    assert_eq!(state(&rig), None);
    assert!(!rig.passes(&tcp(SERVER, CLIENT, SYN | ACK), IN));
}

#[test]
fn default_timeouts_are_linux_values() {
    let mut rig = firewall("");
    handshake(&mut rig);
    // ESTABLISHED: five days.
    rig.advance(431_999);
    assert_eq!(state(&rig), Some(ConnState::Established));
    rig.advance(2);
    assert_eq!(state(&rig), None);
    // SYN_RECV: 60 s.
    assert!(rig.passes(&tcp(CLIENT, SERVER, SYN), OUT));
    assert!(rig.passes(&tcp(SERVER, CLIENT, SYN | ACK), IN));
    rig.advance(59);
    assert_eq!(state(&rig), Some(ConnState::SynRecv));
    rig.advance(2);
    assert_eq!(state(&rig), None);
}

#[test]
fn on_a_store_that_is_not_the_cache_too() {
    let store = Remote(flowstate_state::local::LocalStore::new());
    let mut rig = firewall_on(&store, "");
    handshake(&mut rig);
    assert!(rig.passes(&tcp(SERVER, CLIENT, ACK), IN));
    assert!(!rig.passes(&tcp("203.0.113.1:1", "10.0.0.5:22", SYN), IN));
    rig.advance(1);
    assert_eq!(rig.nf.count(Reason::Tracked), 3);
    assert_eq!(rig.nf.count(Reason::InboundPolicy), 1);
    assert_eq!(rig.nf.connections_in(ConnState::Established), 1);
}

/// A full table (`max_connections`): a new connection ends the oldest expendable one (a SYN
/// never answered, an ended connection) with early drop, and is dropped as "table full"
/// without it or when nothing is expendable; established connections are never ended.
#[test]
fn a_full_table_ends_only_expendable_connections() {
    for early_drop in [true, false] {
        let mut rig = firewall(&format!("max_connections = 3\nearly_drop = {early_drop}"));
        assert_eq!(rig.report("max_connections"), 3);
        handshake(&mut rig); // CLIENT -> SERVER, established
        let other = "10.0.0.6:40000";
        assert!(rig.passes(&tcp(other, SERVER, SYN), OUT));
        assert!(rig.passes(&tcp(SERVER, other, SYN | ACK), IN));
        assert!(rig.passes(&tcp(other, SERVER, ACK), OUT)); // established too
        let flood = |i: u8| format!("10.0.0.{}:1234", 100 + i);
        assert!(rig.passes(&tcp(&flood(0), SERVER, SYN), OUT)); // unanswered
        assert_eq!(rig.nf.tracked(), 3);
        let v = rig.pass(&tcp(&flood(1), SERVER, SYN), OUT).0;
        if early_drop {
            assert_eq!(v, Verdict::Forward, "the unanswered SYN made room");
            assert_eq!(rig.report("conns_early_dropped"), 1);
            // The newcomer is unanswered too: the next one takes its place.
            assert!(rig.passes(&tcp(&flood(2), SERVER, SYN), OUT));
            assert_eq!(rig.report("conns_early_dropped"), 2);
        } else {
            assert_eq!(v, Verdict::Drop(Reason::TableFull.text()));
        }
        assert_eq!(rig.nf.tracked(), 3);
        // The established ones still pass both ways.
        for c in [CLIENT, other] {
            assert!(rig.passes(&tcp_data(c, SERVER, ACK | PSH, b"more"), OUT));
            assert!(rig.passes(&tcp_data(SERVER, c, ACK | PSH, b"data"), IN));
        }
    }
    // With nothing expendable, even early drop refuses.
    let mut rig = firewall("max_connections = 1");
    handshake(&mut rig);
    assert_eq!(
        rig.pass(&tcp("10.0.0.9:1", SERVER, SYN), OUT).0,
        Verdict::Drop(Reason::TableFull.text())
    );
    assert_eq!(rig.report("denied_table_full"), 1);
}
