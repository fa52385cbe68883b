//! Fuzzes `dissect` and then every view, getter and checksum verifier on what it found, plus
//! every view directly on the raw input: none may panic, whatever the bytes.
//!
//! Run with `cargo +nightly fuzz run dissect` from the repository root.

#![no_main]

use flowstate_wire::dissect::{dissect, verify_checksums};
use flowstate_wire::ethernet::Frame;
use flowstate_wire::tcp::{Options, PseudoHeader};
use flowstate_wire::{arp, icmp, ipv4, ipv6, tcp, udp};
use libfuzzer_sys::fuzz_target;
use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

fn views(b: &[u8], pseudo: &[PseudoHeader]) {
    if let Ok(f) = Frame::new_checked(b) {
        black_box((f.dst_addr(), f.src_addr(), f.ethertype(), f.header_len()));
        black_box((
            f.vlan_count(),
            f.vlan(0),
            f.vlan(1),
            f.vlan_id(0),
            f.vlan_pcp(1),
        ));
        black_box(f.payload());
    }
    if let Ok(a) = arp::Packet::new_checked(b) {
        black_box((
            a.hardware_type(),
            a.protocol_type(),
            a.operation(),
            a.packet_len(),
        ));
        black_box((a.hardware_len(), a.protocol_len()));
        black_box((a.sender_hardware_addr(), a.sender_protocol_addr()));
        black_box((a.target_hardware_addr(), a.target_protocol_addr()));
    }
    if let Ok(p) = ipv4::Packet::new_checked(b) {
        black_box((
            p.version(),
            p.header_len(),
            p.dscp(),
            p.ecn(),
            p.total_len(),
            p.ident(),
        ));
        black_box((
            p.dont_frag(),
            p.more_frags(),
            p.frag_offset(),
            p.is_fragment(),
        ));
        black_box((
            p.is_first_fragment(),
            p.is_later_fragment(),
            p.ttl(),
            p.protocol(),
        ));
        black_box((
            p.checksum(),
            p.src_addr(),
            p.dst_addr(),
            p.header(),
            p.options(),
        ));
        black_box((p.payload(), p.verify_checksum(), p.compute_checksum()));
    }
    if let Ok(p) = ipv6::Packet::new_checked(b) {
        black_box((
            p.version(),
            p.traffic_class(),
            p.flow_label(),
            p.payload_len(),
        ));
        black_box((
            p.total_len(),
            p.next_header(),
            p.hop_limit(),
            p.src_addr(),
            p.dst_addr(),
        ));
        black_box((p.payload(), p.upper_layer().ok().map(|u| u.has_header())));
    }
    if let Ok(t) = tcp::Packet::new_checked(b) {
        black_box((t.src_port(), t.dst_port(), t.seq_number(), t.ack_number()));
        black_box((
            t.header_len(),
            t.flags(),
            t.fin(),
            t.syn(),
            t.rst(),
            t.psh(),
        ));
        black_box((
            t.ack(),
            t.urg(),
            t.ece(),
            t.cwr(),
            t.window_len(),
            t.checksum(),
        ));
        black_box((t.urgent_at(), t.options_bytes(), t.payload()));
        black_box((
            t.mss(),
            t.window_scale(),
            t.sack_permitted(),
            t.timestamps(),
        ));
        for o in t.options() {
            if let tcp::TcpOption::Sack(blocks) = o {
                black_box(blocks.iter().count());
            }
            black_box(o);
        }
        for ph in pseudo {
            black_box((t.verify_checksum(ph), t.compute_checksum(ph)));
        }
    }
    if let Ok(u) = udp::Packet::new_checked(b) {
        black_box((
            u.src_port(),
            u.dst_port(),
            u.len(),
            u.checksum(),
            u.payload(),
        ));
        for ph in pseudo {
            black_box((u.verify_checksum(ph), u.compute_checksum(ph)));
        }
    }
    if let Ok(m) = icmp::v4::Packet::new_checked(b) {
        black_box((m.msg_type(), m.msg_code(), m.checksum(), m.rest_of_header()));
        black_box((m.is_echo(), m.is_error(), m.echo_ident(), m.echo_seq_no()));
        black_box((m.payload(), m.inner(), m.inner_flow()));
        black_box((m.verify_checksum(), m.compute_checksum()));
    }
    if let Ok(m) = icmp::v6::Packet::new_checked(b) {
        black_box((m.msg_type(), m.msg_code(), m.checksum(), m.rest_of_header()));
        black_box((m.is_echo(), m.is_error(), m.echo_ident(), m.echo_seq_no()));
        black_box((m.payload(), m.inner(), m.inner_flow()));
        for ph in pseudo {
            if let PseudoHeader::V6 { src, dst } = ph {
                black_box((m.verify_checksum(src, dst), m.compute_checksum(src, dst)));
            }
        }
    }
    black_box(Options::new(b).count());
    black_box(ipv6::walk_extension_headers(b.first().copied().unwrap_or(0), b).ok());
    black_box((icmp::echo_ports(1, b), icmp::echo_ports(58, b)));
}

fuzz_target!(|data: &[u8]| {
    let fallback = [
        PseudoHeader::V4 {
            src: Ipv4Addr::new(10, 0, 0, 1),
            dst: Ipv4Addr::new(10, 0, 0, 2),
        },
        PseudoHeader::V6 {
            src: Ipv6Addr::LOCALHOST,
            dst: Ipv6Addr::UNSPECIFIED,
        },
    ];
    views(data, &fallback);
    let Ok(d) = dissect(data) else {
        return;
    };
    black_box(verify_checksums(data, &d));
    // Every offset dissect reports lies inside the frame and in order.
    assert!(d.l3_offset <= d.l3_end && d.l3_end <= data.len());
    let l3 = &data[d.l3_offset..d.l3_end];
    views(l3, &fallback);
    if let Some(l4) = d.l4_offset {
        assert!(l4 <= d.l3_end);
        if let Some(p) = d.payload_offset {
            assert!(l4 <= p && p <= d.l3_end);
        }
        let pseudo = match d.flow.map(|f| (f.src, f.dst)) {
            Some((IpAddr::V4(src), IpAddr::V4(dst))) => PseudoHeader::V4 { src, dst },
            Some((IpAddr::V6(src), IpAddr::V6(dst))) => PseudoHeader::V6 { src, dst },
            _ => fallback[0],
        };
        views(&data[l4..d.l3_end], &[pseudo]);
    }
});
