//! The checks every parser test applies to bytes it made up: every getter of every view that
//! accepts them, and the relations a dissection promises (shared by `views_proptest` and
//! `fuzz_dissect`).
#![allow(dead_code)]

use flowstate_wire::dissect::{verify_checksums, Dissection, Network, Transport};
use flowstate_wire::ethernet::Frame;
use flowstate_wire::icmp;
use flowstate_wire::tcp::{self, Options, PseudoHeader, TcpOption};
use flowstate_wire::{arp, ipv4, ipv6, udp};
use std::net::{Ipv4Addr, Ipv6Addr};

/// Calls every getter of every view that `new_checked` accepts on `b`, checking the length
/// relations each view promises.
pub(crate) fn exercise_views(b: &[u8]) {
    if let Ok(f) = Frame::new_checked(b) {
        let _ = (f.dst_addr(), f.src_addr(), f.ethertype());
        for i in 0..3 {
            let _ = (f.vlan(i), f.vlan_id(i), f.vlan_pcp(i));
        }
        assert_eq!(f.header_len() + f.payload().len(), b.len());
    }
    if let Ok(a) = arp::Packet::new_checked(b) {
        let _ = (a.hardware_type(), a.protocol_type(), a.operation());
        let _ = (a.hardware_len(), a.protocol_len(), a.packet_len());
        let _ = (a.sender_hardware_addr(), a.sender_protocol_addr());
        let _ = (a.target_hardware_addr(), a.target_protocol_addr());
    }
    if let Ok(p) = ipv4::Packet::new_checked(b) {
        let _ = (
            p.version(),
            p.dscp(),
            p.ecn(),
            p.ident(),
            p.dont_frag(),
            p.more_frags(),
        );
        let _ = (p.frag_offset(), p.is_fragment(), p.is_first_fragment());
        let _ = (p.is_later_fragment(), p.ttl(), p.protocol(), p.checksum());
        let _ = (
            p.src_addr(),
            p.dst_addr(),
            p.verify_checksum(),
            p.compute_checksum(),
        );
        assert_eq!(p.options().len() + 20, p.header_len());
        assert_eq!(p.header().len(), p.header_len());
        assert_eq!(
            p.payload().len() + p.header_len(),
            usize::from(p.total_len())
        );
    }
    if let Ok(p) = ipv6::Packet::new_checked(b) {
        let _ = (
            p.version(),
            p.traffic_class(),
            p.flow_label(),
            p.next_header(),
        );
        let _ = (p.hop_limit(), p.src_addr(), p.dst_addr());
        assert_eq!(p.payload().len(), usize::from(p.payload_len()));
        if let Ok(up) = p.upper_layer() {
            assert!(up.offset <= p.payload().len());
            assert!(usize::from(up.ext_headers) <= ipv6::MAX_EXTENSION_HEADERS);
            let _ = up.has_header();
        }
    }
    let v4 = PseudoHeader::V4 {
        src: Ipv4Addr::new(10, 0, 0, 1),
        dst: Ipv4Addr::new(10, 0, 0, 2),
    };
    let v6 = PseudoHeader::V6 {
        src: Ipv6Addr::LOCALHOST,
        dst: Ipv6Addr::UNSPECIFIED,
    };
    if let Ok(t) = tcp::Packet::new_checked(b) {
        let _ = (t.src_port(), t.dst_port(), t.seq_number(), t.ack_number());
        let _ = (
            t.flags(),
            t.fin(),
            t.syn(),
            t.rst(),
            t.psh(),
            t.ack(),
            t.urg(),
        );
        let _ = (
            t.ece(),
            t.cwr(),
            t.window_len(),
            t.checksum(),
            t.urgent_at(),
        );
        let _ = (
            t.mss(),
            t.window_scale(),
            t.sack_permitted(),
            t.timestamps(),
        );
        let _ = (t.verify_checksum(&v4), t.verify_checksum(&v6));
        let _ = (t.compute_checksum(&v4), t.compute_checksum(&v6));
        assert_eq!(t.options_bytes().len() + 20, t.header_len());
        assert_eq!(t.header_len() + t.payload().len(), b.len());
        exercise_options(t.options_bytes());
    }
    if let Ok(u) = udp::Packet::new_checked(b) {
        let _ = (u.src_port(), u.dst_port(), u.checksum());
        let _ = (u.verify_checksum(&v4), u.verify_checksum(&v6));
        assert_ne!(u.compute_checksum(&v4), 0);
        assert_eq!(u.payload().len() + 8, usize::from(u.len()));
    }
    if let Ok(m) = icmp::v4::Packet::new_checked(b) {
        let _ = (m.msg_type(), m.msg_code(), m.checksum(), m.rest_of_header());
        let _ = (m.is_echo(), m.is_error(), m.echo_ident(), m.echo_seq_no());
        let _ = (m.verify_checksum(), m.compute_checksum(), m.inner_flow());
        assert_eq!(m.payload().len() + 8, b.len());
        assert_eq!(m.inner().is_some(), m.is_error());
    }
    if let Ok(m) = icmp::v6::Packet::new_checked(b) {
        let (s, d) = (Ipv6Addr::LOCALHOST, Ipv6Addr::UNSPECIFIED);
        let _ = (m.msg_type(), m.msg_code(), m.checksum(), m.rest_of_header());
        let _ = (m.is_echo(), m.is_error(), m.echo_ident(), m.echo_seq_no());
        let _ = (m.verify_checksum(&s, &d), m.compute_checksum(&s, &d));
        let _ = m.inner_flow();
        assert_eq!(m.inner().is_some(), m.is_error());
    }
    let _ = ipv6::walk_extension_headers(b.first().copied().unwrap_or(0), b);
    let _ = icmp::echo_ports(1, b);
    let _ = icmp::echo_ports(58, b);
}

/// Iterates the options of `b`, checking the iterator is bounded and consistent.
pub(crate) fn exercise_options(b: &[u8]) {
    let mut n = 0;
    for o in Options::new(b) {
        n += 1;
        assert!(n <= b.len(), "each option consumes at least one byte");
        if let TcpOption::Sack(blocks) = o {
            assert!(!blocks.is_empty() && blocks.len() <= 4);
            assert_eq!(blocks.iter().count(), blocks.len());
        }
    }
}

/// The relations every successful dissection satisfies; then every view on every layer.
pub(crate) fn check_dissection(frame: &[u8], d: &Dissection) {
    assert!(d.l3_offset <= d.l3_end && d.l3_end <= frame.len());
    assert!(d.vlan_count <= 2);
    assert_eq!(d.l3_offset, 14 + 4 * usize::from(d.vlan_count));
    if let Some(l4) = d.l4_offset {
        assert!(d.l3_offset < l4 && l4 <= d.l3_end);
        if let Some(p) = d.payload_offset {
            assert!(l4 < p && p <= d.l3_end);
        }
    } else {
        assert_eq!(d.payload_offset, None);
    }
    match d.network {
        Network::Ipv4 | Network::Ipv6 => assert!(d.flow.is_some()),
        Network::Arp | Network::Other(_) => {
            assert_eq!(d.flow, None);
            assert_eq!(d.transport, Transport::None);
        }
    }
    let st = verify_checksums(frame, d);
    if d.network != Network::Ipv4 {
        assert_eq!(st.ip, None);
    }
    exercise_views(frame);
    exercise_views(&frame[d.l3_offset..d.l3_end]);
    if let Some(l4) = d.l4_offset {
        exercise_views(&frame[l4..d.l3_end]);
    }
}
