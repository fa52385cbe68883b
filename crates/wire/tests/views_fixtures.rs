//! The header views and `dissect` on real packet bytes (see `views_data`): every field and
//! checksum as tshark decodes it.

mod views_data;

use flowstate_wire::dissect::{
    dissect, verify_checksums, ChecksumStatus, Fragment, Network, Transport,
};
use flowstate_wire::ethernet::{EtherType, Frame, MacAddr};
use flowstate_wire::flow::proto;
use flowstate_wire::icmp;
use flowstate_wire::tcp::{self, PseudoHeader, TcpOption};
use flowstate_wire::{arp, ipv4, ipv6, udp, Error, FlowKey, Layer};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use views_data::*;

fn v4(a: [u8; 4]) -> IpAddr {
    IpAddr::V4(Ipv4Addr::from(a))
}

fn v6(s: &str) -> IpAddr {
    IpAddr::V6(s.parse().unwrap())
}

const OK_BOTH: ChecksumStatus = ChecksumStatus {
    ip: Some(true),
    transport: Some(true),
};

#[test]
fn tcp_syn_views() {
    let f = hex(TCP_SYN);
    let eth = Frame::new_checked(&f[..]).unwrap();
    assert_eq!(
        eth.dst_addr(),
        MacAddr([0x52, 0x54, 0x00, 0xab, 0xcd, 0xef])
    );
    assert_eq!(eth.src_addr().to_string(), "52:54:00:12:34:56");
    assert_eq!(eth.ethertype(), EtherType::IPV4);
    assert_eq!(eth.vlan_count(), 0);
    let ip = ipv4::Packet::new_checked(eth.payload()).unwrap();
    assert_eq!(ip.header_len(), 20);
    assert_eq!(ip.total_len(), 60);
    assert_eq!(ip.ident(), 0x7c1e);
    assert!(ip.dont_frag() && !ip.is_fragment());
    assert_eq!(ip.ttl(), 64);
    assert_eq!(ip.protocol(), proto::TCP);
    assert_eq!(ip.checksum(), 0xaa9b);
    assert_eq!(ip.compute_checksum(), 0xaa9b);
    assert!(ip.verify_checksum());
    assert!(ip.options().is_empty());
    let t = tcp::Packet::new_checked(ip.payload()).unwrap();
    assert_eq!((t.src_port(), t.dst_port()), (54321, 80));
    assert_eq!(t.seq_number(), 0x3ade68b1);
    assert_eq!(t.ack_number(), 0);
    assert_eq!(t.header_len(), 40);
    assert!(t.syn() && !t.ack() && !t.fin() && !t.rst() && !t.psh());
    assert_eq!(t.flags(), tcp::Flags::SYN);
    assert_eq!(t.window_len(), 64240);
    assert_eq!(t.urgent_at(), 0);
    let pseudo = PseudoHeader::from(&ip);
    assert_eq!(t.checksum(), 0x8aa3);
    assert_eq!(t.compute_checksum(&pseudo), 0x8aa3);
    assert!(t.verify_checksum(&pseudo));
    let opts: Vec<_> = t.options().collect();
    assert_eq!(
        opts,
        [
            TcpOption::Mss(1460),
            TcpOption::SackPermitted,
            TcpOption::Timestamps {
                tsval: 0x0a1b2c3d,
                tsecr: 0
            },
            TcpOption::NoOp,
            TcpOption::WindowScale(7),
        ]
    );
    assert_eq!(t.mss(), Some(1460));
    assert_eq!(t.window_scale(), Some(7));
    assert!(t.sack_permitted());
    assert_eq!(t.timestamps(), Some((0x0a1b2c3d, 0)));
    assert!(t.payload().is_empty());
}

#[test]
fn tcp_syn_dissect() {
    let f = hex(TCP_SYN);
    let d = dissect(&f).unwrap();
    assert_eq!(d.vlan_count, 0);
    assert_eq!(d.ethertype, 0x0800);
    assert_eq!(d.l3_offset, 14);
    assert_eq!(d.network, Network::Ipv4);
    assert_eq!(d.protocol, proto::TCP);
    assert_eq!(d.fragment, Fragment::None);
    assert_eq!(d.l4_offset, Some(34));
    assert_eq!(d.transport, Transport::Tcp);
    assert_eq!(d.payload_offset, Some(74));
    assert_eq!(d.l3_end, 74);
    assert_eq!(
        d.flow,
        Some(FlowKey::new(
            v4([10, 0, 0, 1]),
            v4([10, 0, 0, 2]),
            54321,
            80,
            proto::TCP
        ))
    );
    assert_eq!(verify_checksums(&f, &d), OK_BOTH);
    // One flipped payload bit breaks exactly the checksum that covers it.
    let mut bad = f.clone();
    bad[60] ^= 0x01;
    assert_eq!(
        verify_checksums(&bad, &dissect(&bad).unwrap()),
        ChecksumStatus {
            ip: Some(true),
            transport: Some(false)
        }
    );
    let mut bad = f.clone();
    bad[22] ^= 0x01; // TTL: IP header checksum only (TTL is not in the pseudo-header)
    assert_eq!(
        verify_checksums(&bad, &dissect(&bad).unwrap()),
        ChecksumStatus {
            ip: Some(false),
            transport: Some(true)
        }
    );
}

#[test]
fn udp_dns_query() {
    let f = hex(UDP_DNS);
    let d = dissect(&f).unwrap();
    assert_eq!(d.transport, Transport::Udp);
    assert_eq!(d.l4_offset, Some(34));
    assert_eq!(d.payload_offset, Some(42));
    assert_eq!(d.l3_end, 71);
    assert_eq!(
        d.flow,
        Some(FlowKey::new(
            v4([192, 168, 1, 100]),
            v4([192, 168, 1, 1]),
            53000,
            53,
            proto::UDP
        ))
    );
    assert_eq!(verify_checksums(&f, &d), OK_BOTH);
    let ip = ipv4::Packet::new_checked(&f[14..]).unwrap();
    assert_eq!(ip.checksum(), 0x69d0);
    let u = udp::Packet::new_checked(ip.payload()).unwrap();
    assert_eq!((u.src_port(), u.dst_port(), u.len()), (53000, 53, 37));
    assert_eq!(u.checksum(), 0x1e53);
    let pseudo = PseudoHeader::from(&ip);
    assert_eq!(u.compute_checksum(&pseudo), 0x1e53);
    assert_eq!(u.verify_checksum(&pseudo), Some(true));
    // DNS header: id 0xbeef, RD set, one question.
    assert_eq!(&u.payload()[..4], &[0xbe, 0xef, 0x01, 0x00]);
    assert_eq!(&u.payload()[13..20], b"example");

    // With the checksum zeroed, IPv4 UDP has "no checksum": not applicable, not wrong.
    let mut z = f.clone();
    z[40] = 0;
    z[41] = 0;
    assert_eq!(
        verify_checksums(&z, &dissect(&z).unwrap()),
        ChecksumStatus {
            ip: Some(true),
            transport: None
        }
    );
}

#[test]
fn icmp_echo() {
    let f = hex(ICMP_ECHO);
    let d = dissect(&f).unwrap();
    assert_eq!(d.transport, Transport::Icmpv4 { kind: 8, code: 0 });
    assert_eq!(d.payload_offset, Some(42));
    let flow = d.flow.unwrap();
    assert_eq!(
        flow,
        FlowKey::new(
            v4([192, 168, 1, 100]),
            v4([8, 8, 8, 8]),
            0x1234,
            0x1234,
            proto::ICMP
        )
    );
    assert_eq!(verify_checksums(&f, &d), OK_BOTH);
    let m = icmp::v4::Packet::new_checked(&f[34..]).unwrap();
    assert!(m.is_echo() && !m.is_error());
    assert_eq!(m.msg_type(), icmp::v4::types::ECHO_REQUEST);
    assert_eq!((m.echo_ident(), m.echo_seq_no()), (0x1234, 1));
    assert_eq!(m.rest_of_header(), 0x1234_0001);
    assert_eq!(m.checksum(), 0xc026);
    assert_eq!(m.compute_checksum(), 0xc026);
    assert!(m.verify_checksum());
    assert_eq!(m.payload().len(), 48);
    assert_eq!(m.inner(), None);
    assert_eq!(m.inner_flow(), None);
    assert_eq!(icmp::echo_ports(proto::ICMP, &f[34..]), (0x1234, 0x1234));
}

#[test]
fn icmp_port_unreachable_inner_udp() {
    let f = hex(ICMP_UNREACH);
    let d = dissect(&f).unwrap();
    assert_eq!(d.transport, Transport::Icmpv4 { kind: 3, code: 3 });
    assert_eq!(
        d.flow,
        Some(FlowKey::new(
            v4([192, 168, 1, 1]),
            v4([192, 168, 1, 100]),
            0,
            0,
            proto::ICMP
        ))
    );
    assert_eq!(verify_checksums(&f, &d), OK_BOTH);
    let ip = ipv4::Packet::new_checked(&f[14..]).unwrap();
    assert_eq!(ip.dscp(), 48);
    assert_eq!(ip.ecn(), 0);
    assert!(!ip.dont_frag());
    assert_eq!(ip.checksum(), 0xe813);
    let m = icmp::v4::Packet::new_checked(ip.payload()).unwrap();
    assert!(m.is_error() && !m.is_echo());
    assert_eq!(m.checksum(), 0x80e9);
    assert!(m.verify_checksum());
    let inner = m.inner().unwrap();
    let dns = hex(UDP_DNS);
    assert_eq!(inner, &dns[14..]);
    let key = m.inner_flow().unwrap();
    // The invoking packet's key is the reverse direction of the UDP flow it answers.
    assert_eq!(key, dissect(&dns).unwrap().flow.unwrap());
    assert_eq!(key.src_port, 53000);

    // Cut the quoted datagram: with only 8 bytes of UDP the key is still there; with 3, not.
    let cut = |n: usize| {
        let body = &ip.payload()[..8 + n];
        icmp::v4::Packet::new_checked(body).unwrap().inner_flow()
    };
    assert_eq!(cut(28), Some(key));
    assert_eq!(cut(23), None);
    assert_eq!(cut(19), None);
}

#[test]
fn ipv6_extension_headers_tcp() {
    let f = hex(IPV6_EXT_TCP);
    let ip = ipv6::Packet::new_checked(&f[14..]).unwrap();
    assert_eq!(ip.version(), 6);
    assert_eq!(ip.traffic_class(), 0);
    assert_eq!(ip.flow_label(), 0x12345);
    assert_eq!(ip.payload_len(), 62);
    assert_eq!(ip.next_header(), ipv6::next_header::HOP_BY_HOP);
    assert_eq!(ip.hop_limit(), 64);
    assert_eq!(ip.src_addr(), "2001:db8::1".parse::<Ipv6Addr>().unwrap());
    let up = ip.upper_layer().unwrap();
    assert_eq!(up.protocol, proto::TCP);
    assert_eq!(up.offset, 24);
    assert_eq!(up.ext_headers, 2);
    assert_eq!(up.fragment, None);
    let t = tcp::Packet::new_checked(&ip.payload()[up.offset..]).unwrap();
    assert_eq!((t.src_port(), t.dst_port()), (40000, 80));
    assert!(t.psh() && t.ack());
    assert_eq!(t.payload(), b"GET / HTTP/1.1\r\n\r\n");
    assert_eq!(t.checksum(), 0xcb66);
    let pseudo = PseudoHeader::from(&ip);
    assert_eq!(t.compute_checksum(&pseudo), 0xcb66);

    let d = dissect(&f).unwrap();
    assert_eq!(d.network, Network::Ipv6);
    assert_eq!(d.ethertype, 0x86dd);
    assert_eq!(d.protocol, proto::TCP);
    assert_eq!(d.l4_offset, Some(14 + 40 + 24));
    assert_eq!(d.payload_offset, Some(14 + 40 + 24 + 20));
    assert_eq!(d.l3_end, f.len());
    assert_eq!(
        d.flow,
        Some(FlowKey::new(
            v6("2001:db8::1"),
            v6("2001:db8::2"),
            40000,
            80,
            proto::TCP
        ))
    );
    assert_eq!(
        verify_checksums(&f, &d),
        ChecksumStatus {
            ip: None,
            transport: Some(true)
        }
    );
    // Truncating the frame inside the extension headers is an IPv6 error, inside TCP a TCP one.
    let mut short = f.clone();
    short.truncate(14 + 40 + 20);
    short[14 + 5] = 20;
    assert_eq!(dissect(&short).unwrap_err(), Error::truncated(Layer::Ipv6));
    let mut short = f.clone();
    short.truncate(14 + 40 + 24 + 12);
    short[14 + 5] = 24 + 12;
    assert_eq!(dissect(&short).unwrap_err(), Error::truncated(Layer::Tcp));
}

#[test]
fn ipv6_fragments() {
    let f = hex(IPV6_FRAG_FIRST);
    let d = dissect(&f).unwrap();
    assert_eq!(d.fragment, Fragment::First);
    assert_eq!(d.protocol, proto::UDP);
    assert_eq!(d.transport, Transport::Udp);
    assert_eq!(d.l4_offset, Some(14 + 40 + 8));
    let flow = d.flow.unwrap();
    assert_eq!((flow.src_port, flow.dst_port), (5353, 9999));
    // The UDP checksum covers the whole datagram: it cannot be verified on a fragment.
    assert_eq!(
        verify_checksums(&f, &d),
        ChecksumStatus {
            ip: None,
            transport: None
        }
    );
    let ip = ipv6::Packet::new_checked(&f[14..]).unwrap();
    let frag = ip.upper_layer().unwrap().fragment.unwrap();
    assert_eq!(frag.offset, 0);
    assert!(frag.more && frag.is_first());
    assert_eq!(frag.ident, 0xcafe0001);
    // The UDP length (108) is the whole datagram's, longer than this fragment: the UDP view
    // refuses it, but dissect reads the ports of a first fragment from the header alone.
    let u = &ip.payload()[8..];
    assert_eq!(u.len(), 56);
    assert_eq!(
        udp::Packet::new_checked(u).unwrap_err(),
        Error::truncated(Layer::Udp)
    );
    let mut tiny = f.clone();
    tiny.truncate(14 + 40 + 8 + 7);
    tiny[14 + 5] = 15;
    assert_eq!(dissect(&tiny).unwrap_err(), Error::truncated(Layer::Udp));

    let f = hex(IPV6_FRAG_LATER);
    let d = dissect(&f).unwrap();
    assert_eq!(d.fragment, Fragment::Later);
    assert_eq!(d.protocol, proto::UDP);
    assert_eq!(d.transport, Transport::None);
    assert_eq!((d.l4_offset, d.payload_offset), (None, None));
    assert_eq!(
        d.flow,
        Some(FlowKey::new(
            v6("2001:db8::1"),
            v6("2001:db8::2"),
            0,
            0,
            proto::UDP
        ))
    );
    let ip = ipv6::Packet::new_checked(&f[14..]).unwrap();
    let frag = ip.upper_layer().unwrap().fragment.unwrap();
    assert_eq!(
        (frag.offset, frag.more, frag.ident),
        (56, false, 0xcafe0001)
    );
    assert_eq!(verify_checksums(&f, &d).transport, None);
}

#[test]
fn ipv4_fragments() {
    let f = hex(IPV4_FRAG_FIRST);
    let d = dissect(&f).unwrap();
    assert_eq!(d.fragment, Fragment::First);
    assert_eq!(d.transport, Transport::Udp);
    let flow = d.flow.unwrap();
    assert_eq!((flow.src_port, flow.dst_port), (40001, 40002));
    assert_eq!(
        verify_checksums(&f, &d),
        ChecksumStatus {
            ip: Some(true),
            transport: None
        }
    );
    let ip = ipv4::Packet::new_checked(&f[14..]).unwrap();
    assert!(ip.is_fragment() && ip.is_first_fragment() && ip.more_frags());
    assert_eq!(ip.checksum(), 0xf119);

    let f = hex(IPV4_FRAG_LATER);
    let d = dissect(&f).unwrap();
    assert_eq!(d.fragment, Fragment::Later);
    assert_eq!(d.protocol, proto::UDP);
    assert_eq!(d.transport, Transport::None);
    assert_eq!((d.l4_offset, d.payload_offset), (None, None));
    assert_eq!(
        d.flow,
        Some(FlowKey::new(
            v4([10, 0, 0, 1]),
            v4([10, 0, 0, 2]),
            0,
            0,
            proto::UDP
        ))
    );
    let ip = ipv4::Packet::new_checked(&f[14..]).unwrap();
    assert!(ip.is_fragment() && !ip.is_first_fragment() && !ip.more_frags());
    assert_eq!(ip.frag_offset(), 104);
    assert_eq!(ip.checksum(), 0x110d);
    assert_eq!(
        verify_checksums(&f, &d),
        ChecksumStatus {
            ip: Some(true),
            transport: None
        }
    );
}

#[test]
fn qinq_udp_with_padding() {
    let f = hex(QINQ_UDP);
    assert_eq!(f.len(), 64);
    let eth = Frame::new_checked(&f[..]).unwrap();
    assert_eq!(eth.vlan_count(), 2);
    let outer = eth.vlan(0).unwrap();
    assert_eq!((outer.tpid, outer.pcp, outer.vid), (0x88a8, 3, 100));
    assert_eq!(eth.vlan_id(1), Some(200));
    assert_eq!(eth.vlan_pcp(1), Some(0));
    let d = dissect(&f).unwrap();
    assert_eq!(d.vlan_count, 2);
    assert_eq!(d.vlan_ids, [100, 200]);
    assert_eq!(d.ethertype, 0x0800);
    assert_eq!(d.l3_offset, 22);
    assert_eq!(d.l4_offset, Some(42));
    assert_eq!(d.payload_offset, Some(50));
    assert_eq!(d.l3_end, 52, "12 bytes of padding are not IP");
    assert_eq!(verify_checksums(&f, &d), OK_BOTH);
    let u = udp::Packet::new_checked(&f[42..]).unwrap();
    assert_eq!(u.payload(), b"hi");
    assert_eq!(u.checksum(), 0x5573);
}

#[test]
fn arp_request_padded() {
    let f = hex(ARP_REQUEST);
    let d = dissect(&f).unwrap();
    assert_eq!(d.network, Network::Arp);
    assert_eq!(d.ethertype, 0x0806);
    assert_eq!(d.protocol, 0);
    assert_eq!(d.flow, None);
    assert_eq!(d.transport, Transport::None);
    assert_eq!(d.l3_end, 14 + 28);
    assert_eq!(
        verify_checksums(&f, &d),
        ChecksumStatus {
            ip: None,
            transport: None
        }
    );
    let a = arp::Packet::new_checked(&f[14..]).unwrap();
    assert_eq!(a.operation(), arp::operation::REQUEST);
    assert_eq!(a.sender_hardware_addr().to_string(), "52:54:00:12:34:56");
    assert_eq!(a.sender_protocol_addr(), Ipv4Addr::new(192, 168, 1, 100));
    assert_eq!(a.target_protocol_addr(), Ipv4Addr::new(192, 168, 1, 1));
    assert_eq!(a.target_hardware_addr(), MacAddr([0; 6]));
    // A truncated ARP packet is an error, unlike other non-IP EtherTypes.
    assert_eq!(
        dissect(&f[..14 + 27]).unwrap_err(),
        Error::truncated(Layer::Arp)
    );
    let mut other = f.clone();
    other[12] = 0x88;
    other[13] = 0xcc; // LLDP
    let d = dissect(&other[..20]).unwrap();
    assert_eq!(d.network, Network::Other(0x88cc));
    assert_eq!((d.flow, d.l3_end), (None, 20));
}

#[test]
fn ipv4_options_igmp() {
    let f = hex(IPV4_OPTIONS_IGMP);
    let ip = ipv4::Packet::new_checked(&f[14..]).unwrap();
    assert_eq!(ip.header_len(), 24);
    assert_eq!(ip.options(), &[0x94, 0x04, 0x00, 0x00]);
    assert_eq!(ip.ttl(), 1);
    assert_eq!(ip.protocol(), 2);
    assert_eq!(ip.checksum(), 0x3107);
    assert!(ip.verify_checksum());
    assert_eq!(ip.payload().len(), 8, "padding excluded");
    let d = dissect(&f).unwrap();
    assert_eq!(d.protocol, 2);
    assert_eq!(d.transport, Transport::Other);
    assert_eq!(d.l4_offset, Some(14 + 24));
    assert_eq!(d.payload_offset, None);
    assert_eq!(d.l3_end, 14 + 32);
    assert_eq!(
        d.flow,
        Some(FlowKey::new(
            v4([192, 168, 1, 100]),
            v4([239, 1, 2, 3]),
            0,
            0,
            2
        ))
    );
    assert_eq!(
        verify_checksums(&f, &d),
        ChecksumStatus {
            ip: Some(true),
            transport: None
        }
    );
}

#[test]
fn tcp_ack_with_ethernet_padding() {
    let f = hex(TCP_ACK_PADDED);
    assert_eq!(f.len(), 60);
    let d = dissect(&f).unwrap();
    assert_eq!(d.l3_end, 54);
    assert_eq!(d.payload_offset, Some(54));
    // The TCP checksum is over the segment only: with the 6 padding bytes it would be wrong.
    assert_eq!(verify_checksums(&f, &d), OK_BOTH);
    let ip = ipv4::Packet::new_checked(&f[14..]).unwrap();
    assert_eq!(ip.checksum(), 0x26ce);
    let t = tcp::Packet::new_checked(ip.payload()).unwrap();
    assert_eq!(t.checksum(), 0xdd5c);
    assert!(t.payload().is_empty());
    assert!(t.ack() && !t.syn());
    assert_eq!(t.options().count(), 0);
    let t_padded = tcp::Packet::new_checked(&f[34..]).unwrap();
    assert!(!t_padded.verify_checksum(&PseudoHeader::from(&ip)));
}

#[test]
fn icmpv6_echo() {
    let f = hex(ICMPV6_ECHO);
    let d = dissect(&f).unwrap();
    assert_eq!(d.transport, Transport::Icmpv6 { kind: 128, code: 0 });
    assert_eq!(
        d.flow,
        Some(FlowKey::new(
            v6("2001:db8::1"),
            v6("2001:db8::2"),
            0x0777,
            0x0777,
            proto::ICMPV6
        ))
    );
    assert_eq!(
        verify_checksums(&f, &d),
        ChecksumStatus {
            ip: None,
            transport: Some(true)
        }
    );
    let ip = ipv6::Packet::new_checked(&f[14..]).unwrap();
    let m = icmp::v6::Packet::new_checked(ip.payload()).unwrap();
    assert!(m.is_echo());
    assert_eq!((m.echo_ident(), m.echo_seq_no()), (0x0777, 3));
    assert_eq!(m.checksum(), 0x8b30);
    let (s, t) = (ip.src_addr(), ip.dst_addr());
    assert_eq!(m.compute_checksum(&s, &t), 0x8b30);
    assert!(m.verify_checksum(&s, &t));
    assert!(!m.verify_checksum(&t, &Ipv6Addr::LOCALHOST));
    assert_eq!(m.payload(), b"abcdefgh");
}

#[test]
fn icmpv6_error_inner_flow() {
    // A packet-too-big (type 2) quoting the IPv6/TCP packet with its extension headers.
    let tcp6 = hex(IPV6_EXT_TCP);
    let quoted = &tcp6[14..];
    let mut msg = vec![2, 0, 0, 0, 0, 0, 0x05, 0x00];
    msg.extend_from_slice(quoted);
    let src: Ipv6Addr = "2001:db8::fe".parse().unwrap();
    let dst: Ipv6Addr = "2001:db8::1".parse().unwrap();
    let mut m = icmp::v6::Packet::new_checked(&mut msg[..]).unwrap();
    m.fill_checksum(&src, &dst);
    assert!(m.verify_checksum(&src, &dst));
    assert!(m.is_error());
    assert_eq!(m.rest_of_header(), 1280);
    let key = m.inner_flow().unwrap();
    assert_eq!(key, dissect(&tcp6).unwrap().flow.unwrap());
    // Quoting only up to the middle of the destination options: no key.
    let m = icmp::v6::Packet::new_checked(&msg[..8 + 40 + 20]).unwrap();
    assert_eq!(m.inner_flow(), None);
    // Quoting up to the TCP ports: a key.
    let m = icmp::v6::Packet::new_checked(&msg[..8 + 40 + 24 + 4]).unwrap();
    assert_eq!(m.inner_flow(), Some(key));
}

#[test]
fn every_fixture_dissects() {
    for (name, h) in ALL {
        let f = hex(h);
        let d = dissect(&f).unwrap_or_else(|e| panic!("{name}: {e}"));
        // Every checksum that applies is correct in these captures.
        let st = verify_checksums(&f, &d);
        assert_ne!(st.ip, Some(false), "{name}");
        assert_ne!(st.transport, Some(false), "{name}");
        // Every strict prefix that cuts into a parsed header fails or parses less.
        for cut in 0..f.len() {
            if let Ok(short) = dissect(&f[..cut]) {
                assert!(short.l3_end <= cut, "{name} cut at {cut}");
            }
        }
    }
}
