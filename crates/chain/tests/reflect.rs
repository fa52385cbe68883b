//! The reflect stage: replies are well-formed, checksum-correct and consistent.

use flowstate_chain::reflect::{reflect, MSS_V4, MSS_V6, WINDOW_SCALE};
use flowstate_testkit::{ethernet, frame_with, write};
use flowstate_wire::build::*;
use flowstate_wire::dissect::{dissect, verify_checksums, Dissection, Network, Transport};
use flowstate_wire::{icmp, tcp, udp};
use proptest::prelude::*;
use std::net::{Ipv4Addr, Ipv6Addr};

fn v4() -> IpSpec {
    IpSpec::V4(Ipv4Spec::new(
        Ipv4Addr::new(10, 1, 2, 3),
        Ipv4Addr::new(198, 51, 100, 7),
    ))
}

fn v6() -> IpSpec {
    IpSpec::V6(Ipv6Spec::new(
        "fd00::5".parse::<Ipv6Addr>().unwrap(),
        "2001:db8::9".parse::<Ipv6Addr>().unwrap(),
    ))
}

fn tcp_seg(flags: u8, seq: u32, ack: u32, options: TcpOptions) -> L4Spec {
    L4Spec::Tcp(TcpSpec {
        src_port: 40_000,
        dst_port: 443,
        seq,
        ack,
        flags,
        window: 1000,
        urgent: 0,
        options,
    })
}

/// Reflects `req` and checks what every reply must be: it dissects, its checksums are
/// correct, MACs, addresses and ports are swapped.
fn reply_to(req: &[u8]) -> (Vec<u8>, Dissection) {
    let mut out = [0u8; 2048];
    let n = reflect(req, 5_000_000_000, &mut out).expect("a reply");
    let reply = out[..n].to_vec();
    let d = dissect(&reply).expect("the reply dissects");
    let sums = verify_checksums(&reply, &d);
    assert!(sums.transport == Some(true), "{sums:?}");
    assert!(matches!(sums.ip, Some(true) | None));
    assert_eq!(&reply[0..6], &req[6..12], "dst MAC = request's src");
    assert_eq!(&reply[6..12], &req[0..6], "src MAC = request's dst");
    let rq = dissect(req).unwrap().flow.unwrap();
    assert_eq!(d.flow.unwrap(), rq.reversed());
    assert!(reply.len() >= ETHERNET_MIN_LEN);
    (reply, d)
}

fn tcp_of(frame: &[u8], d: &Dissection) -> tcp::Packet<Vec<u8>> {
    tcp::Packet::new_checked(frame[d.l4_offset.unwrap()..d.l3_end].to_vec()).unwrap()
}

#[test]
fn tcp_syn_gets_syn_ack() {
    let opts = TcpOptions {
        mss: Some(1400),
        window_scale: Some(9),
        sack_permitted: true,
        timestamps: Some((777, 0)),
    };
    for (ip, mss) in [(v4(), MSS_V4), (v6(), MSS_V6)] {
        let req = frame_with(ip, tcp_seg(tcp_flags::SYN, 1_000, 0, opts), Payload::EMPTY);
        let (reply, d) = reply_to(&req);
        let t = tcp_of(&reply, &d);
        assert!(t.syn() && t.ack() && !t.fin() && !t.rst());
        assert_eq!(t.ack_number(), 1_001);
        assert_eq!(t.mss(), Some(mss));
        assert_eq!(t.window_scale(), Some(WINDOW_SCALE));
        assert!(t.sack_permitted());
        assert_eq!(t.timestamps(), Some((5_000, 777)));
        assert!(t.payload().is_empty());

        // The reflected ISN is a function of the flow: the same SYN gets the same SYN+ACK.
        assert_eq!(reply_to(&req).0, reply);
    }
    // A SYN without options gets a SYN+ACK without options.
    let req = frame_with(
        v4(),
        tcp_seg(tcp_flags::SYN, 5, 0, TcpOptions::NONE),
        Payload::EMPTY,
    );
    let (reply, d) = reply_to(&req);
    let t = tcp_of(&reply, &d);
    assert_eq!(t.header_len(), 20);
    assert_eq!(t.ack_number(), 6);
}

#[test]
fn tcp_syn_ack_from_the_inside_gets_ack() {
    let req = frame_with(
        v4(),
        tcp_seg(
            tcp_flags::SYN | tcp_flags::ACK,
            9_000,
            4_001,
            TcpOptions::NONE,
        ),
        Payload::EMPTY,
    );
    let (reply, d) = reply_to(&req);
    let t = tcp_of(&reply, &d);
    assert!(t.ack() && !t.syn() && !t.fin());
    assert_eq!((t.seq_number(), t.ack_number()), (4_001, 9_001));
}

#[test]
fn tcp_data_gets_ack_without_payload() {
    let ts = TcpOptions {
        timestamps: Some((50, 60)),
        ..TcpOptions::NONE
    };
    for ip in [v4(), v6()] {
        let req = frame_with(
            ip,
            tcp_seg(tcp_flags::ACK | tcp_flags::PSH, u32::MAX - 10, 77, ts),
            Payload::Counter { len: 100, start: 0 },
        );
        let (reply, d) = reply_to(&req);
        let t = tcp_of(&reply, &d);
        assert!(t.ack() && !t.syn() && !t.fin() && !t.psh());
        assert_eq!(t.seq_number(), 77, "seq = what the inside expects next");
        assert_eq!(t.ack_number(), (u32::MAX - 10).wrapping_add(100), "wraps");
        assert!(t.payload().is_empty());
        assert_eq!(t.timestamps(), Some((5_000, 50)));
    }
}

#[test]
fn tcp_fin_gets_fin_ack() {
    let req = frame_with(
        v4(),
        tcp_seg(tcp_flags::FIN | tcp_flags::ACK, 500, 900, TcpOptions::NONE),
        Payload::Fill { len: 10, byte: 7 },
    );
    let (reply, d) = reply_to(&req);
    let t = tcp_of(&reply, &d);
    assert!(t.fin() && t.ack() && !t.syn());
    assert_eq!((t.seq_number(), t.ack_number()), (900, 511));
    assert!(t.payload().is_empty());
}

#[test]
fn tcp_rst_and_pure_ack_get_nothing() {
    let mut out = [0u8; 2048];
    for flags in [
        tcp_flags::RST,
        tcp_flags::RST | tcp_flags::ACK,
        tcp_flags::ACK,
    ] {
        let req = frame_with(v4(), tcp_seg(flags, 1, 2, TcpOptions::NONE), Payload::EMPTY);
        assert_eq!(reflect(&req, 0, &mut out), None, "flags {flags:#x}");
    }
}

#[test]
fn udp_gets_a_same_size_datagram() {
    for (ip, len) in [(v4(), 33), (v6(), 700), (v4(), 0)] {
        let req = frame_with(
            ip,
            L4Spec::Udp(UdpSpec {
                src_port: 5353,
                dst_port: 53,
            }),
            Payload::Counter { len, start: 3 },
        );
        let (reply, d) = reply_to(&req);
        assert_eq!(reply.len(), req.len());
        assert_eq!(d.transport, Transport::Udp);
        let u = udp::Packet::new_checked(&reply[d.l4_offset.unwrap()..d.l3_end]).unwrap();
        assert_eq!((u.src_port(), u.dst_port()), (53, 5353));
        assert_eq!(u.payload().len(), len);
        let rq = dissect(&req).unwrap();
        assert_eq!(u.payload(), &req[rq.payload_offset.unwrap()..rq.l3_end]);
    }
}

#[test]
fn icmp_echo_gets_echo_reply() {
    let echo = L4Spec::Echo(EchoSpec {
        reply: false,
        id: 0x1234,
        seq: 9,
    });
    let req = frame_with(v4(), echo, Payload::Counter { len: 56, start: 0 });
    let (reply, d) = reply_to(&req);
    assert_eq!(d.transport, Transport::Icmpv4 { kind: 0, code: 0 });
    let m = icmp::v4::Packet::new_checked(&reply[d.l4_offset.unwrap()..d.l3_end]).unwrap();
    assert_eq!((m.echo_ident(), m.echo_seq_no()), (0x1234, 9));
    assert_eq!(reply.len(), req.len());

    let req = frame_with(v6(), echo, Payload::Counter { len: 56, start: 0 });
    let (reply, d) = reply_to(&req);
    assert_eq!(d.network, Network::Ipv6);
    assert_eq!(d.transport, Transport::Icmpv6 { kind: 129, code: 0 });
    assert_eq!(
        &reply[d.payload_offset.unwrap()..],
        &req[dissect(&req).unwrap().payload_offset.unwrap()..]
    );

    // An echo reply is not answered.
    let pong = L4Spec::Echo(EchoSpec {
        reply: true,
        id: 1,
        seq: 1,
    });
    assert_eq!(
        reflect(&frame_with(v4(), pong, Payload::EMPTY), 0, &mut [0u8; 256]),
        None
    );
}

#[test]
fn vlan_tag_is_kept_and_small_buffers_refused() {
    let req = write(&FrameSpec {
        ethernet: EthernetSpec {
            vlan: Some(0x2064),
            ..ethernet()
        },
        ip: v4(),
        l4: L4Spec::Udp(UdpSpec {
            src_port: 1,
            dst_port: 2,
        }),
        payload: Payload::Fill { len: 100, byte: 1 },
        min_len: ETHERNET_MIN_LEN,
    });
    let (reply, d) = reply_to(&req);
    assert_eq!(d.vlan_count, 1);
    assert_eq!(&reply[12..16], &[0x81, 0x00, 0x20, 0x64]);
    let mut small = [0u8; 100];
    assert_eq!(reflect(&req, 0, &mut small), None);
}

#[test]
fn non_ip_and_garbage_get_nothing() {
    let mut out = [0u8; 256];
    let mut arp = vec![0u8; 60];
    arp[12] = 0x08;
    arp[13] = 0x06;
    assert_eq!(reflect(&arp, 0, &mut out), None);
    assert_eq!(reflect(&[], 0, &mut out), None);
    assert_eq!(reflect(&[0xff; 30], 0, &mut out), None);
}

proptest! {
    #[test]
    fn never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200), now in any::<u64>()) {
        let mut out = [0u8; 256];
        let _ = reflect(&bytes, now, &mut out);
    }

    #[test]
    fn replies_to_any_tcp_segment_are_valid(
        flags in any::<u8>(), seq in any::<u32>(), ack in any::<u32>(), len in 0usize..200,
        six in any::<bool>(), ts in proptest::option::of(any::<(u32, u32)>()),
    ) {
        let opts = TcpOptions { timestamps: ts, ..TcpOptions::NONE };
        let req = frame_with(if six { v6() } else { v4() }, tcp_seg(flags, seq, ack, opts), Payload::Fill { len, byte: 9 });
        let mut out = [0u8; 2048];
        if let Some(n) = reflect(&req, 1, &mut out) {
            let d = dissect(&out[..n]).unwrap();
            prop_assert_eq!(verify_checksums(&out[..n], &d).transport, Some(true));
            let t = tcp_of(&out[..n], &d);
            prop_assert!(!t.rst());
            prop_assert!(t.ack());
            prop_assert!(t.payload().is_empty());
        } else {
            let t = tcp_of(&req, &dissect(&req).unwrap());
            prop_assert!(t.rst() || (len == 0 && !t.syn() && !t.fin()));
        }
    }
}
