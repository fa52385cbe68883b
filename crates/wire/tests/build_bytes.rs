//! Byte fixtures for `flowstate_wire::build`: one frame of each kind, written out by hand
//! (field by field, in the comments) with checksums computed independently, and checked again
//! with the RFC 1071 "sum including the checksum folds to zero" rule.

use flowstate_wire::build::*;
use flowstate_wire::checksum::{combine, finish, pseudo_header_v4, pseudo_header_v6, sum};
use std::net::{Ipv4Addr, Ipv6Addr};

const A: [u8; 6] = [2, 0, 0, 0, 0, 1];
const B: [u8; 6] = [2, 0, 0, 0, 0, 2];
const C4: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
const S4: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 7);
const C6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 0xa);
const S6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1);

fn write(spec: &FrameSpec<'_>) -> Vec<u8> {
    let mut buf = [0x55u8; 256];
    let n = spec.write(&mut buf).expect("fits");
    assert_eq!(n, spec.frame_len());
    buf[..n].to_vec()
}

/// IPv4 header checksum verifies; the transport checksum verifies over the pseudo-header.
fn verify_v4(frame: &[u8], l3: usize, protocol: u8) {
    let ip = &frame[l3..l3 + 20];
    assert_eq!(finish(sum(ip)), 0, "IPv4 header checksum");
    let total = usize::from(u16::from_be_bytes([ip[2], ip[3]]));
    let seg = &frame[l3 + 20..l3 + total];
    let pseudo = if protocol == 1 {
        0
    } else {
        pseudo_header_v4(
            ip[12..16].try_into().unwrap(),
            ip[16..20].try_into().unwrap(),
            protocol,
            seg.len() as u16,
        )
    };
    assert_eq!(finish(combine(pseudo, sum(seg))), 0, "transport checksum");
}

fn verify_v6(frame: &[u8], l3: usize) {
    let ip = &frame[l3..l3 + 40];
    let plen = usize::from(u16::from_be_bytes([ip[4], ip[5]]));
    let seg = &frame[l3 + 40..l3 + 40 + plen];
    let pseudo = pseudo_header_v6(
        ip[8..24].try_into().unwrap(),
        ip[24..40].try_into().unwrap(),
        ip[6],
        plen as u32,
    );
    assert_eq!(finish(combine(pseudo, sum(seg))), 0, "transport checksum");
}

#[test]
fn tcp_syn_ipv4_with_linux_options() {
    let spec = FrameSpec {
        ethernet: EthernetSpec::new(A, B),
        ip: IpSpec::V4(Ipv4Spec {
            id: 0x1234,
            ..Ipv4Spec::new(C4, S4)
        }),
        l4: L4Spec::Tcp(TcpSpec {
            src_port: 40000,
            dst_port: 443,
            seq: 0x1122_3344,
            ack: 0,
            flags: tcp_flags::SYN,
            window: 64240,
            urgent: 0,
            options: TcpOptions {
                mss: Some(1460),
                window_scale: Some(7),
                sack_permitted: true,
                timestamps: Some((0x0102_0304, 0)),
            },
        }),
        payload: Payload::EMPTY,
        min_len: ETHERNET_MIN_LEN,
    };
    #[rustfmt::skip]
    let expected = [
        // Ethernet: dst, src, IPv4.
        0x02, 0x00, 0x00, 0x00, 0x00, 0x02, 0x02, 0x00, 0x00, 0x00, 0x00, 0x01, 0x08, 0x00,
        // IPv4: 45, tos 0, total 60, id 0x1234, DF, ttl 64, TCP, checksum f44c, 10.0.0.1, 198.51.100.7.
        0x45, 0x00, 0x00, 0x3c, 0x12, 0x34, 0x40, 0x00, 0x40, 0x06, 0xf4, 0x4c,
        0x0a, 0x00, 0x00, 0x01, 0xc6, 0x33, 0x64, 0x07,
        // TCP: 40000 -> 443, seq, ack 0, offset 10 words, SYN, window 64240, checksum 326c, urg 0.
        0x9c, 0x40, 0x01, 0xbb, 0x11, 0x22, 0x33, 0x44, 0x00, 0x00, 0x00, 0x00, 0xa0, 0x02,
        0xfa, 0xf0, 0x32, 0x6c, 0x00, 0x00,
        // MSS 1460; SACK-permitted; TS val 0x01020304 ecr 0; NOP; window scale 7.
        0x02, 0x04, 0x05, 0xb4, 0x04, 0x02, 0x08, 0x0a, 0x01, 0x02, 0x03, 0x04,
        0x00, 0x00, 0x00, 0x00, 0x01, 0x03, 0x03, 0x07,
    ];
    let frame = write(&spec);
    assert_eq!(frame, expected);
    verify_v4(&frame, 14, 6);
    assert_eq!(spec.header_len(), 74);
}

#[test]
fn udp_ipv4_vlan_tagged_and_padded() {
    let spec = FrameSpec {
        ethernet: EthernetSpec {
            vlan: Some(100),
            ..EthernetSpec::new(A, B)
        },
        ip: IpSpec::V4(Ipv4Spec {
            ttl: 63,
            id: 7,
            dont_fragment: false,
            ..Ipv4Spec::new(C4, S4)
        }),
        l4: L4Spec::Udp(UdpSpec {
            src_port: 5353,
            dst_port: 53,
        }),
        payload: Payload::Counter { len: 5, start: 0 },
        min_len: ETHERNET_MIN_LEN,
    };
    #[rustfmt::skip]
    let expected = [
        // Ethernet: dst, src, 802.1Q TCI 100, IPv4.
        0x02, 0x00, 0x00, 0x00, 0x00, 0x02, 0x02, 0x00, 0x00, 0x00, 0x00, 0x01,
        0x81, 0x00, 0x00, 0x64, 0x08, 0x00,
        // IPv4: total 33, id 7, no flags, ttl 63, UDP, checksum 478a.
        0x45, 0x00, 0x00, 0x21, 0x00, 0x07, 0x00, 0x00, 0x3f, 0x11, 0x47, 0x8a,
        0x0a, 0x00, 0x00, 0x01, 0xc6, 0x33, 0x64, 0x07,
        // UDP: 5353 -> 53, length 13, checksum b076; payload 00..04.
        0x14, 0xe9, 0x00, 0x35, 0x00, 0x0d, 0xb0, 0x76, 0x00, 0x01, 0x02, 0x03, 0x04,
        // Padding to 60 bytes (9 bytes), outside the IP packet.
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    ];
    let frame = write(&spec);
    assert_eq!(frame, expected);
    verify_v4(&frame, 18, 17);
}

#[test]
fn udp_ipv6() {
    let spec = FrameSpec {
        ethernet: EthernetSpec::new(A, B),
        ip: IpSpec::V6(Ipv6Spec {
            flow_label: 0x12345,
            ..Ipv6Spec::new(C6, S6)
        }),
        l4: L4Spec::Udp(UdpSpec {
            src_port: 40001,
            dst_port: 53,
        }),
        payload: Payload::Bytes(b"hello"),
        min_len: ETHERNET_MIN_LEN,
    };
    #[rustfmt::skip]
    let expected = [
        0x02, 0x00, 0x00, 0x00, 0x00, 0x02, 0x02, 0x00, 0x00, 0x00, 0x00, 0x01, 0x86, 0xdd,
        // IPv6: version 6, class 0, label 0x12345, payload 13, UDP, hop limit 64.
        0x60, 0x01, 0x23, 0x45, 0x00, 0x0d, 0x11, 0x40,
        0xfd, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x0a,
        0x20, 0x01, 0x0d, 0xb8, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01,
        // UDP: 40001 -> 53, length 13, checksum f4c6, "hello".
        0x9c, 0x41, 0x00, 0x35, 0x00, 0x0d, 0xf4, 0xc6, b'h', b'e', b'l', b'l', b'o',
    ];
    let frame = write(&spec);
    assert_eq!(frame, expected);
    verify_v6(&frame, 14);
}

#[test]
fn icmpv4_echo_request() {
    let spec = FrameSpec {
        ethernet: EthernetSpec::new(A, B),
        ip: IpSpec::V4(Ipv4Spec {
            id: 1,
            ..Ipv4Spec::new(C4, S4)
        }),
        l4: L4Spec::Echo(EchoSpec {
            reply: false,
            id: 0x4242,
            seq: 1,
        }),
        payload: Payload::Fill { len: 4, byte: 0xab },
        min_len: ETHERNET_MIN_LEN,
    };
    #[rustfmt::skip]
    let expected = [
        0x02, 0x00, 0x00, 0x00, 0x00, 0x02, 0x02, 0x00, 0x00, 0x00, 0x00, 0x01, 0x08, 0x00,
        // IPv4: total 32, id 1, DF, ttl 64, ICMP, checksum 06a1.
        0x45, 0x00, 0x00, 0x20, 0x00, 0x01, 0x40, 0x00, 0x40, 0x01, 0x06, 0xa1,
        0x0a, 0x00, 0x00, 0x01, 0xc6, 0x33, 0x64, 0x07,
        // ICMP: echo request (8), code 0, checksum 5e65, id 0x4242, seq 1, 4 x 0xab.
        0x08, 0x00, 0x5e, 0x65, 0x42, 0x42, 0x00, 0x01, 0xab, 0xab, 0xab, 0xab,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    ];
    let frame = write(&spec);
    assert_eq!(frame, expected);
    verify_v4(&frame, 14, 1);
    let key = spec.flow_key();
    assert_eq!((key.src_port, key.dst_port, key.proto), (0x4242, 0x4242, 1));
}

#[test]
fn icmpv6_echo_reply() {
    let spec = FrameSpec {
        ethernet: EthernetSpec::new(B, A),
        ip: IpSpec::V6(Ipv6Spec {
            hop_limit: 255,
            ..Ipv6Spec::new(S6, C6)
        }),
        l4: L4Spec::Echo(EchoSpec {
            reply: true,
            id: 0x4242,
            seq: 2,
        }),
        payload: Payload::EMPTY,
        min_len: ETHERNET_MIN_LEN,
    };
    #[rustfmt::skip]
    let expected = [
        0x02, 0x00, 0x00, 0x00, 0x00, 0x01, 0x02, 0x00, 0x00, 0x00, 0x00, 0x02, 0x86, 0xdd,
        // IPv6: payload 8, ICMPv6 (58), hop limit 255.
        0x60, 0x00, 0x00, 0x00, 0x00, 0x08, 0x3a, 0xff,
        0x20, 0x01, 0x0d, 0xb8, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01,
        0xfd, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x0a,
        // ICMPv6: echo reply (129), code 0, checksum 11b4, id 0x4242, seq 2. 62 bytes: no padding.
        0x81, 0x00, 0x11, 0xb4, 0x42, 0x42, 0x00, 0x02,
    ];
    let frame = write(&spec);
    assert_eq!(frame, expected);
    verify_v6(&frame, 14);
}

#[test]
fn tcp_ipv6_data_with_timestamps_and_odd_payload() {
    let spec = FrameSpec {
        ethernet: EthernetSpec::new(B, A),
        ip: IpSpec::V6(Ipv6Spec {
            hop_limit: 57,
            flow_label: 0xfffff,
            traffic_class: 0x28,
            ..Ipv6Spec::new(S6, C6)
        }),
        l4: L4Spec::Tcp(TcpSpec {
            src_port: 443,
            dst_port: 40000,
            seq: 0xffff_fff0,
            ack: 0x1122_3345,
            flags: tcp_flags::PSH | tcp_flags::ACK,
            window: 502,
            urgent: 0,
            options: TcpOptions {
                timestamps: Some((100, 200)),
                ..TcpOptions::NONE
            },
        }),
        payload: Payload::Bytes(b"abc"),
        min_len: 0,
    };
    #[rustfmt::skip]
    let expected = [
        0x02, 0x00, 0x00, 0x00, 0x00, 0x01, 0x02, 0x00, 0x00, 0x00, 0x00, 0x02, 0x86, 0xdd,
        // IPv6: class 0x28, label 0xfffff, payload 35, TCP, hop limit 57.
        0x62, 0x8f, 0xff, 0xff, 0x00, 0x23, 0x06, 0x39,
        0x20, 0x01, 0x0d, 0xb8, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01,
        0xfd, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x0a,
        // TCP: 443 -> 40000, seq, ack, offset 8 words, PSH|ACK, window 502, checksum a215.
        0x01, 0xbb, 0x9c, 0x40, 0xff, 0xff, 0xff, 0xf0, 0x11, 0x22, 0x33, 0x45, 0x80, 0x18,
        0x01, 0xf6, 0xa2, 0x15, 0x00, 0x00,
        // NOP NOP TS val 100 ecr 200; payload "abc".
        0x01, 0x01, 0x08, 0x0a, 0x00, 0x00, 0x00, 0x64, 0x00, 0x00, 0x00, 0xc8,
        b'a', b'b', b'c',
    ];
    let frame = write(&spec);
    assert_eq!(frame, expected);
    verify_v6(&frame, 14);
}

#[test]
fn udp_checksum_zero_is_sent_as_ffff() {
    // Find a payload word that makes the computed checksum 0; then it must be sent as ffff.
    let mut spec = FrameSpec {
        ethernet: EthernetSpec::new(A, B),
        ip: IpSpec::V4(Ipv4Spec::new(C4, S4)),
        l4: L4Spec::Udp(UdpSpec {
            src_port: 1,
            dst_port: 2,
        }),
        payload: Payload::Bytes(&[0, 0]),
        min_len: 0,
    };
    let mut buf = [0u8; 64];
    let n = spec.write(&mut buf).unwrap();
    let check = u16::from_be_bytes([buf[40], buf[41]]);
    // Adding `check` to the data makes the one's-complement sum 0xffff, i.e. checksum 0.
    let word = check.to_be_bytes();
    spec.payload = Payload::Bytes(&word);
    assert_eq!(spec.write(&mut buf), Ok(n));
    assert_eq!(&buf[40..42], &[0xff, 0xff]);
    verify_v4(&buf[..n], 14, 17);
}
