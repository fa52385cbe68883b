//! Firewall: TCP window tracking with `liberal = false` (conntrack's `tcp_in_window`, its RST
//! checks, ignored SYNs, simultaneous open) on hand-computed segments; `liberal = true` passes
//! the same segments. The lab test `crates/cli/tests/window.rs` compares these cases with
//! Linux's conntrack itself.

mod common_fwlb;

use common_fwlb::*;
use flowstate_nf::firewall::{ConnState, Firewall, Reason};
use flowstate_nf::Verdict;
use flowstate_wire::build::{IpSpec, Ipv4Spec, L4Spec, TcpOptions, TcpSpec};

const CLIENT: &str = "10.0.0.5:40000";
const SERVER: &str = "198.51.100.7:443";
/// Client and server ISNs.
const C: u32 = 1000;
const S: u32 = 5000;

/// A segment `src` → `dst`.
fn seg(src: &str, dst: &str, flags: u8, seq: u32, ack: u32, win: u16, data: &[u8]) -> Vec<u8> {
    let (s, d) = (sa(src), sa(dst));
    let ip = match (s.ip(), d.ip()) {
        (std::net::IpAddr::V4(a), std::net::IpAddr::V4(b)) => IpSpec::V4(Ipv4Spec::new(a, b)),
        _ => unreachable!("IPv4 test addresses"),
    };
    let options = if flags & SYN != 0 {
        TcpOptions {
            mss: Some(1460),
            window_scale: Some(7),
            sack_permitted: true,
            timestamps: None,
        }
    } else {
        TcpOptions::NONE
    };
    flowstate_testkit::frame(
        ip,
        L4Spec::Tcp(TcpSpec {
            src_port: s.port(),
            dst_port: d.port(),
            seq,
            ack,
            flags,
            window: win,
            urgent: 0,
            options,
        }),
        data,
    )
}

fn c(flags: u8, seq: u32, ack: u32, data: &[u8]) -> Vec<u8> {
    seg(CLIENT, SERVER, flags, seq, ack, 502, data)
}

fn s(flags: u8, seq: u32, ack: u32, data: &[u8]) -> Vec<u8> {
    seg(SERVER, CLIENT, flags, seq, ack, 509, data)
}

fn state(rig: &Rig<Firewall>) -> Option<ConnState> {
    rig.nf
        .connection(&flow_of(&c(ACK, 0, 0, b"")))
        .map(|c| c.state)
}

fn dropped(rig: &mut Rig<Firewall>, frame: &[u8], dir: flowstate_nf::Direction) -> Verdict {
    rig.pass(frame, dir).0
}

fn drop(r: Reason) -> Verdict {
    Verdict::Drop(r.text())
}

/// The handshake with Linux's windows and scale 7, then 100 bytes from the client that the
/// server acknowledges: the server's highest ack is C + 101.
fn established(config: &str) -> Rig<Firewall> {
    let mut rig = firewall(config);
    assert!(rig.passes(&seg(CLIENT, SERVER, SYN, C, 0, 64240, b""), OUT));
    assert!(rig.passes(&seg(SERVER, CLIENT, SYN | ACK, S, C + 1, 65160, b""), IN));
    assert!(rig.passes(&c(ACK, C + 1, S + 1, b""), OUT));
    assert_eq!(state(&rig), Some(ConnState::Established));
    assert!(rig.passes(&c(ACK | PSH, C + 1, S + 1, &[b'x'; 100]), OUT));
    assert!(rig.passes(&s(ACK, S + 1, C + 101, b""), IN));
    rig
}

const STRICT: &str = "liberal = false";

#[test]
fn out_of_window_data_and_acks_are_dropped_unless_liberal() {
    let mut rig = established(STRICT);
    // The client allowed the server up to S + 1 + 502 * 128: a megabyte past that is out.
    let far = S + 1 + 1_000_000;
    assert_eq!(
        dropped(&mut rig, &s(ACK | PSH, far, C + 101, b"spoofed"), IN),
        drop(Reason::TcpSeqAboveWindow)
    );
    // An ack of server data never sent.
    assert_eq!(
        dropped(&mut rig, &c(ACK, C + 101, S + 1 + 10, b""), OUT),
        drop(Reason::TcpAckAboveData)
    );
    // In window: passes.
    assert!(rig.passes(&s(ACK | PSH, S + 1, C + 101, b"200 OK"), IN));
    assert!(rig.passes(&c(ACK, C + 101, S + 7, b""), OUT));
    // An old retransmission (ends before the window) passes, ignored.
    let mut rig2 = established(STRICT);
    for i in 0..300u32 {
        let seq = S + 1 + i * 1000;
        assert!(rig2.passes(&s(ACK, seq, C + 101, &[0; 1000]), IN), "{i}");
        assert!(rig2.passes(&c(ACK, C + 101, seq + 1000, b""), OUT), "{i}");
    }
    assert!(rig2.passes(&s(ACK, S + 1, C + 101, &[0; 1000]), IN));
    assert_eq!(rig2.nf.count(Reason::TcpIgnored), 1);
    assert_eq!(state(&rig2), Some(ConnState::Established));
    assert_eq!(rig.report("denied_tcp_seq_above_window"), 1);
    assert_eq!(rig.report("denied_tcp_ack_above_data_seen"), 1);

    // liberal = true (the default): the same segments pass.
    let mut rig = established("");
    assert!(rig.passes(&s(ACK | PSH, far, C + 101, b"spoofed"), IN));
    assert!(rig.passes(&c(ACK, C + 101, S + 1 + 10, b""), OUT));
    assert_eq!(rig.report("denied"), 0);
}

#[test]
fn a_rst_closes_only_at_the_exact_sequence_number() {
    let mut rig = established(STRICT);
    // Below the server's highest ack (C + 101): invalid.
    assert_eq!(
        dropped(&mut rig, &c(RST, C + 50, 0, b""), OUT),
        drop(Reason::TcpRstOutOfWindow)
    );
    // Past the window: invalid.
    assert_eq!(
        dropped(&mut rig, &c(RST, C + 101 + 1_000_000, 0, b""), OUT),
        drop(Reason::TcpRstOutOfWindow)
    );
    assert_eq!(state(&rig), Some(ConnState::Established));
    // In window but not exact: passes, the connection stays (RFC 5961 §3.2: the server
    // answers with a challenge ACK).
    assert!(rig.passes(&c(RST, C + 101 + 5000, 0, b""), OUT));
    assert_eq!(state(&rig), Some(ConnState::Established));
    // Exact: closes.
    assert!(rig.passes(&c(RST, C + 101, 0, b""), OUT));
    assert_eq!(state(&rig), Some(ConnState::Close));
    assert_eq!(rig.report("denied_tcp_rst_out_of_window"), 2);

    // liberal: every RST closes, as before window tracking.
    let mut rig = established("");
    assert!(rig.passes(&c(RST, C + 50, 0, b""), OUT));
    assert_eq!(state(&rig), Some(ConnState::Close));
}

#[test]
fn a_syn_in_established_is_ignored_from_the_client_invalid_from_the_server() {
    let mut rig = established(STRICT);
    assert!(rig.passes(&seg(CLIENT, SERVER, SYN, 90_000, 0, 64240, b""), OUT));
    assert_eq!(rig.nf.count(Reason::TcpIgnored), 1);
    assert_eq!(state(&rig), Some(ConnState::Established));
    assert_eq!(
        dropped(
            &mut rig,
            &seg(SERVER, CLIENT, SYN, 70_000, 0, 65160, b""),
            IN
        ),
        drop(Reason::TcpInvalidState)
    );
    // The server answers the client's new SYN: both hosts restarted, the firewall follows
    // (conntrack's resynchronisation from the noted SYN).
    assert!(rig.passes(
        &seg(SERVER, CLIENT, SYN | ACK, 70_000, 90_001, 65160, b""),
        IN
    ));
    assert_eq!(state(&rig), Some(ConnState::SynRecv));
    assert!(rig.passes(&c(ACK, 90_001, 70_001, b""), OUT));
    assert_eq!(state(&rig), Some(ConnState::Established));
    assert!(rig.passes(&c(ACK | PSH, 90_001, 70_001, b"again"), OUT));
    // The old connection's numbers are now out of window.
    assert_eq!(
        dropped(
            &mut rig,
            &s(ACK | PSH, S + 1 + 1_000_000, C + 101, b"x"),
            IN
        ),
        drop(Reason::TcpSeqAboveWindow)
    );
}

#[test]
fn simultaneous_open_goes_through_syn_sent2() {
    let mut rig = firewall(STRICT);
    assert!(rig.passes(&seg(CLIENT, SERVER, SYN, C, 0, 64240, b""), OUT));
    assert!(rig.passes(&seg(SERVER, CLIENT, SYN, S, 0, 65160, b""), IN));
    assert_eq!(state(&rig), Some(ConnState::SynSent2));
    assert!(rig.passes(&seg(CLIENT, SERVER, SYN | ACK, C, S + 1, 64240, b""), OUT));
    assert_eq!(state(&rig), Some(ConnState::SynRecv));
    // The server's SYN/ACK: conntrack ignores it in SYN_RECV.
    assert!(rig.passes(&seg(SERVER, CLIENT, SYN | ACK, S, C + 1, 65160, b""), IN));
    // Its ACK completes the handshake (the simultaneous-open rule).
    assert!(rig.passes(&s(ACK, S + 1, C + 1, b""), IN));
    assert_eq!(state(&rig), Some(ConnState::Established));
    assert!(rig.passes(&c(ACK | PSH, C + 1, S + 1, b"hello"), OUT));
    assert!(rig.passes(&s(ACK | PSH, S + 1, C + 6, b"hello"), IN));
    assert_eq!(rig.report("denied"), 0);
    assert_eq!(rig.report("conns_established"), 1);
}

#[test]
fn a_connection_encodes_with_its_windows() {
    // What a store holds: the entry, windows included, comes back as it was.
    use flowstate_nf::firewall::{window::Window, TcpConn};
    use flowstate_state::Codec;
    let rig = established(STRICT);
    let flow = flow_of(&c(ACK, 0, 0, b""));
    let before = TcpConn {
        conn: rig.nf.connection(&flow).unwrap(),
        tcp: rig.nf.window(&flow).unwrap(),
    };
    assert_ne!(before.tcp.seen[0].maxwin, 0);
    assert_ne!(before.tcp.seen[1].maxwin, 0);
    let out = before.to_bytes();
    assert_eq!(TcpConn::from_bytes(&out).unwrap(), before);
    assert_eq!(out.len(), 2 + Window::ENCODED_LEN);
}

#[test]
fn a_rst_right_after_the_senders_data_closes() {
    // The client sends 100 more bytes the server has not acked, then a RST at their end:
    // not the server's highest ack, but the end of the client's last segment (conntrack's
    // "RST part of a train").
    let mut rig = established(STRICT);
    assert!(rig.passes(&c(ACK | PSH, C + 101, S + 1, &[b'y'; 100]), OUT));
    assert!(rig.passes(&c(RST, C + 201, 0, b""), OUT));
    assert_eq!(state(&rig), Some(ConnState::Close));
    // The same RST one byte further is only in window: the connection stays.
    let mut rig = established(STRICT);
    assert!(rig.passes(&c(ACK | PSH, C + 101, S + 1, &[b'y'; 100]), OUT));
    assert!(rig.passes(&c(RST, C + 202, 0, b""), OUT));
    assert_eq!(state(&rig), Some(ConnState::Established));
}

#[test]
fn the_rst_a_challenge_ack_asks_for_closes_a_syn_sent_connection() {
    // The server still holds an older connection on this tuple: it answers the SYN with an
    // ACK of its own numbers (RFC 5961 §4), which passes ignored; the client's RST carries
    // that ack as its sequence number and passes without a window check.
    let mut rig = firewall(STRICT);
    assert!(rig.passes(&seg(CLIENT, SERVER, SYN, C, 0, 64240, b""), OUT));
    assert!(rig.passes(&s(ACK, 777_000, 123_456, b""), IN));
    assert_eq!(rig.nf.count(Reason::TcpIgnored), 1);
    assert_eq!(state(&rig), Some(ConnState::SynSent));
    assert!(rig.passes(&c(RST, 123_456, 0, b""), OUT));
    assert_eq!(state(&rig), Some(ConnState::Close));
    // Its next SYN opens the connection again.
    assert!(rig.passes(&seg(CLIENT, SERVER, SYN, C + 9, 0, 64240, b""), OUT));
    assert_eq!(state(&rig), Some(ConnState::SynSent));
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(128))]

    /// Any segments, with any numbers, flags and windows, from either side and near the
    /// connection's own numbers or anywhere: no panic, and the per-state gauges add up to the
    /// entries, windows enforced or not.
    #[test]
    fn any_segments_keep_the_books(
        liberal: bool,
        segs in proptest::collection::vec(
            (proptest::prelude::any::<bool>(), proptest::prelude::any::<u8>(),
             proptest::prelude::any::<u32>(), proptest::prelude::any::<u32>(),
             proptest::prelude::any::<u16>(), 0usize..3, proptest::prelude::any::<bool>()),
            1..40,
        ),
    ) {
        let mut rig = firewall(if liberal { "" } else { STRICT });
        for (from_server, flags, seq, ack, win, len, near) in segs {
            // Near: within a few windows of the ISNs, so that windows matter.
            let (seq, ack) = if near {
                (S.wrapping_add(seq % 300_000), C.wrapping_add(ack % 300_000))
            } else {
                (seq, ack)
            };
            let data = [b'z'; 2][..len.min(2)].to_vec();
            let frame = if from_server {
                seg(SERVER, CLIENT, flags, seq, ack, win, &data)
            } else {
                seg(CLIENT, SERVER, flags, ack, seq, win, &data)
            };
            let dir = if from_server { IN } else { OUT };
            let _ = rig.pass(&frame, dir);
            let by_state: i64 = ConnState::ALL.iter().map(|&s| rig.nf.connections_in(s)).sum();
            proptest::prop_assert_eq!(by_state, rig.nf.tracked() as i64);
            // Every connection here is TCP: all in the TCP map.
            proptest::prop_assert_eq!(rig.nf.tracked_tcp(), rig.nf.tracked());
        }
    }
}

#[test]
fn liberal_keeps_no_windows_and_leaves_established_entries_alone() {
    use flowstate_nf::firewall::window::Seen;
    let mut rig = established("");
    let entry = |rig: &Rig<Firewall>| {
        let flow = flow_of(&c(ACK, 0, 0, b""));
        (
            rig.nf.connection(&flow).unwrap(),
            rig.nf.window(&flow).unwrap(),
        )
    };
    let before = entry(&rig);
    assert_eq!(before.1.seen, [Seen::default(); 2]);
    assert!(rig.passes(&s(ACK | PSH, S + 1, C + 101, &[b'x'; 500]), IN));
    assert!(rig.passes(&c(ACK, C + 101, S + 501, b""), OUT));
    assert_eq!(entry(&rig), before);
    // The same segments with windows enforced change the entry.
    let mut rig = established(STRICT);
    let before = entry(&rig);
    assert!(rig.passes(&s(ACK | PSH, S + 1, C + 101, &[b'x'; 500]), IN));
    assert_ne!(entry(&rig), before);
    assert_eq!(entry(&rig).1.seen[1].end, S + 501);
}

/// A UDP query from the inside, and its answer.
const UDP_CLIENT: &str = "10.0.0.5:5353";
const UDP_SERVER: &str = "198.51.100.7:53";

/// TCP connections are kept in one map (their windows inline), UDP and ICMP ones in the other;
/// both count towards `max_connections`, early drop takes the oldest expendable connection
/// whichever map it is in, and both expire. Windows enforced or not.
#[test]
fn tcp_and_udp_connections_share_the_table() {
    for config in [STRICT, ""] {
        // Expiry: ESTABLISHED's timer is renewed by every segment.
        let mut rig = established(&format!(
            "{config}\ntimeouts = {{ established = \"100s\" }}"
        ));
        let flow = flow_of(&c(ACK, 0, 0, b""));
        assert_eq!((rig.nf.tracked(), rig.nf.tracked_tcp()), (1, 1));
        assert!(rig.nf.window(&flow).is_some());
        rig.advance(60);
        assert!(rig.passes(&c(ACK, C + 101, S + 1, b""), OUT));
        rig.advance(60);
        assert_eq!(state(&rig), Some(ConnState::Established), "{config}");
        rig.advance(41);
        assert_eq!(state(&rig), None);
        assert_eq!(rig.nf.window(&flow), None);
        assert_eq!(rig.nf.tracked(), 0);

        // UDP: a connection in the other map, no window; its reply renews and answers it.
        let query = udp(UDP_CLIENT, UDP_SERVER);
        assert!(rig.passes(&query, OUT));
        assert_eq!((rig.nf.tracked(), rig.nf.tracked_tcp()), (1, 0));
        assert_eq!(rig.nf.window(&flow_of(&query)), None);
        assert_eq!(
            rig.nf.connection(&flow_of(&query)).map(|c| c.state),
            Some(ConnState::Unreplied)
        );
        rig.advance(31);
        assert_eq!(rig.nf.tracked(), 0);

        // Early drop across the maps: a SYN never answered goes for a UDP flow, a UDP flow
        // never answered for a SYN, whichever is oldest.
        let mut rig = firewall(&format!("{config}\nmax_connections = 2"));
        assert!(rig.passes(&seg(CLIENT, SERVER, SYN, C, 0, 64240, b""), OUT));
        let other = "10.0.0.6:40000";
        assert!(rig.passes(&seg(other, SERVER, SYN, C, 0, 64240, b""), OUT));
        assert_eq!((rig.nf.tracked(), rig.nf.tracked_tcp()), (2, 2));
        assert!(rig.passes(&query, OUT));
        assert_eq!(rig.report("conns_early_dropped"), 1);
        assert_eq!(state(&rig), None, "the oldest expendable one went");
        assert_eq!((rig.nf.tracked(), rig.nf.tracked_tcp()), (2, 1));
        let third = "10.0.0.7:40000";
        assert!(rig.passes(&seg(third, SERVER, SYN, C, 0, 64240, b""), OUT));
        assert_eq!(rig.report("conns_early_dropped"), 2);
        assert_eq!((rig.nf.tracked(), rig.nf.tracked_tcp()), (2, 1));
        assert!(rig.nf.connection(&flow_of(&query)).is_some(), "younger");
        // Now the UDP flow is the oldest: it goes for a SYN.
        let fourth = "10.0.0.8:40000";
        assert!(rig.passes(&seg(fourth, SERVER, SYN, C, 0, 64240, b""), OUT));
        assert_eq!(rig.report("conns_early_dropped"), 3);
        assert!(rig.nf.connection(&flow_of(&query)).is_none());
        assert_eq!((rig.nf.tracked(), rig.nf.tracked_tcp()), (2, 2));
        // Both expire.
        rig.advance(121);
        assert_eq!(rig.nf.tracked(), 0);
        let by_state: i64 = ConnState::ALL
            .iter()
            .map(|&s| rig.nf.connections_in(s))
            .sum();
        assert_eq!(by_state, 0);

        // A new connection on an ended one's tuple: fresh windows, not the old ones.
        let mut rig = established(config);
        assert!(rig.passes(&c(RST, C + 101, 0, b""), OUT));
        assert_eq!(state(&rig), Some(ConnState::Close));
        assert!(rig.passes(&seg(CLIENT, SERVER, SYN, C + 9000, 0, 64240, b""), OUT));
        assert_eq!(state(&rig), Some(ConnState::SynSent));
        let w = rig.nf.window(&flow).unwrap();
        assert_eq!(
            (w.flags, w.last.seg),
            (0, 1),
            "{config}: the SYN's, nothing seen after"
        );
        assert_eq!(rig.nf.tracked(), 1);
    }
}

/// A worker that takes the connections over from the store (a move, a failover) finds both
/// kinds: the TCP connection with its windows (a segment far out of window is still dropped
/// there, one in window passes), the UDP flow answered. The connections table lists each
/// connection once, from the worker and from the store.
#[test]
fn both_kinds_move_with_their_windows() {
    use flowstate_nf::listing::{Cell, StoreReader};
    use flowstate_nf::NetworkFunction;
    use flowstate_state::Connector;
    let store = Remote(flowstate_state::local::LocalStore::new());
    let mut a = firewall_on(&store, STRICT);
    assert!(a.passes(&seg(CLIENT, SERVER, SYN, C, 0, 64240, b""), OUT));
    assert!(a.passes(&seg(SERVER, CLIENT, SYN | ACK, S, C + 1, 65160, b""), IN));
    assert!(a.passes(&c(ACK, C + 1, S + 1, b""), OUT));
    let query = udp(UDP_CLIENT, UDP_SERVER);
    assert!(a.passes(&query, OUT));
    a.part.flush_all(a.now).expect("flushes");
    let mut live = Vec::new();
    a.nf.list("connections", a.now, &mut live);
    let states = |rows: &[Vec<Cell>]| {
        let mut s: Vec<Cell> = rows.iter().map(|r| r[3].clone()).collect();
        s.sort_by_key(|c| format!("{c:?}"));
        s
    };
    let both = [Cell::Text("ESTABLISHED"), Cell::Text("UNREPLIED")];
    assert_eq!(states(&live), both);
    let factory = flowstate_nf::firewall::factory(&table(STRICT)).unwrap();
    let mut backend = store.connect().unwrap();
    let mut stored = Vec::new();
    let mut reader = StoreReader::new(&mut *backend, "firewall");
    assert!(factory
        .stored_rows("connections", &mut reader, &mut stored)
        .unwrap());
    assert_eq!(states(&stored), both);
    std::mem::drop(a);
    let mut b = firewall_on(&store, STRICT);
    let far = S + 1 + 1_000_000;
    assert_eq!(
        dropped(&mut b, &s(ACK | PSH, far, C + 1, b"spoofed"), IN),
        drop(Reason::TcpSeqAboveWindow)
    );
    assert!(b.passes(&s(ACK | PSH, S + 1, C + 1, b"200 OK"), IN));
    assert_eq!(state(&b), Some(ConnState::Established));
    // The UDP flow's answer from outside: let through as a reply, not refused by the
    // inbound policy.
    assert!(b.passes(&udp(UDP_SERVER, UDP_CLIENT), IN));
    assert_eq!(
        b.nf.connection(&flow_of(&query)).map(|c| c.state),
        Some(ConnState::Replied)
    );
    assert_eq!((b.nf.tracked(), b.nf.tracked_tcp()), (2, 1));
}
