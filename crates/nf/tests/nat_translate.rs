//! NAT translation: TCP, UDP and ICMP echo both ways, endpoint-independent mapping, filtering,
//! ICMP errors, IPv6 and non-IP, configuration errors.

mod nat_support;

use flowstate_nf::nat::{self, port_owner, Config, Ipv6Policy, PortRange};
use flowstate_nf::{BuildError, Direction::*, Verdict};
use flowstate_wire::build::tcp_flags::*;
use flowstate_wire::{dissect, dissect::verify_checksums};
use nat_support::*;
use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

const CONFIG: &str = r#"external = ["203.0.113.1"]"#;

fn drop_reason(v: Verdict) -> &'static str {
    match v {
        Verdict::Drop(r) => r,
        Verdict::Forward => panic!("forwarded, expected a drop"),
    }
}

#[test]
fn nat_tcp_syn_is_translated_and_the_reply_comes_back_exactly() {
    let mut rig = Rig::new(CONFIG);
    let mut syn = tcp((IN1, 40000), (SRV1, 80), SYN);
    assert_eq!(rig.send(&mut syn, Outbound), Verdict::Forward);
    let port = ext_port(&syn, EXT);
    assert!(PortRange::default().contains(port));
    assert_eq!(port_owner(port, 1024, 1), 0);
    assert_eq!(dst_of(&syn), (IpAddr::V4(SRV1), 80));
    // Byte for byte what a host at the external address would have sent.
    assert_eq!(syn, tcp((EXT, port), (SRV1, 80), SYN));

    let mut reply = tcp((SRV1, 80), (EXT, port), SYN | ACK);
    assert_eq!(rig.send(&mut reply, Inbound), Verdict::Forward);
    assert_eq!(reply, tcp((SRV1, 80), (IN1, 40000), SYN | ACK));

    let mut ack = tcp((IN1, 40000), (SRV1, 80), ACK);
    assert_eq!(rig.send(&mut ack, Outbound), Verdict::Forward);
    assert_eq!(ack, tcp((EXT, port), (SRV1, 80), ACK));
    assert_eq!(rig.report("translations"), 1);
    assert_eq!(rig.report("packets_out"), 2);
    assert_eq!(rig.report("packets_in"), 1);
    assert_eq!(rig.report("active_mappings"), 1);
    assert_eq!(rig.report("active_sessions"), 1);
}

#[test]
fn nat_one_inside_endpoint_keeps_one_external_port() {
    let mut rig = Rig::new(CONFIG);
    let mut a = udp((IN1, 5000), (SRV1, 53));
    let mut b = udp((IN1, 5000), (SRV2, 443));
    rig.send(&mut a, Outbound);
    rig.send(&mut b, Outbound);
    let port = ext_port(&a, EXT);
    assert_eq!(
        ext_port(&b, EXT),
        port,
        "endpoint-independent mapping (RFC 4787 REQ-1)"
    );
    assert_eq!(rig.report("translations"), 2);
    assert_eq!(rig.report("active_mappings"), 1);
    // Each server's reply reaches the one inside endpoint.
    for srv in [(SRV1, 53), (SRV2, 443)] {
        let mut r = udp(srv, (EXT, port));
        assert_eq!(rig.send(&mut r, Inbound), Verdict::Forward);
        assert_eq!(r, udp(srv, (IN1, 5000)));
    }
    // Other inside endpoints get other ports; TCP on the same port number too.
    let mut ports = vec![port];
    for (ip, p) in [(IN1, 5001), (IN2, 5000)] {
        let mut f = udp((ip, p), (SRV1, 53));
        rig.send(&mut f, Outbound);
        ports.push(ext_port(&f, EXT));
    }
    let mut t = tcp((IN1, 5000), (SRV1, 53), SYN);
    rig.send(&mut t, Outbound);
    ports.push(ext_port(&t, EXT));
    let mut unique = ports.clone();
    unique.sort_unstable();
    unique.dedup();
    assert_eq!(
        unique.len(),
        ports.len(),
        "ports handed out twice: {ports:?}"
    );
}

#[test]
fn nat_udp_both_ways_and_a_zero_checksum_stays_zero() {
    let mut rig = Rig::new(CONFIG);
    let mut out = udp((IN1, 6000), (SRV1, 9999));
    assert_eq!(rig.send(&mut out, Outbound), Verdict::Forward);
    let port = ext_port(&out, EXT);
    assert_eq!(out, udp((EXT, port), (SRV1, 9999)));
    let mut back = udp((SRV1, 9999), (EXT, port));
    assert_eq!(rig.send(&mut back, Inbound), Verdict::Forward);
    assert_eq!(back, udp((SRV1, 9999), (IN1, 6000)));

    // UDP over IPv4 without a checksum (0): it stays 0 both ways (`send` checks it).
    let mut bare = udp((IN1, 6000), (SRV1, 9999));
    bare[40..42].copy_from_slice(&[0, 0]);
    assert_eq!(rig.send(&mut bare, Outbound), Verdict::Forward);
    assert_eq!(&bare[40..42], &[0, 0]);
    let mut bare_back = udp((SRV1, 9999), (EXT, port));
    bare_back[40..42].copy_from_slice(&[0, 0]);
    assert_eq!(rig.send(&mut bare_back, Inbound), Verdict::Forward);
    assert_eq!(&bare_back[40..42], &[0, 0]);
    assert_eq!(dst_of(&bare_back), (IpAddr::V4(IN1), 6000));
}

#[test]
fn nat_icmp_echo_both_ways() {
    let mut rig = Rig::new(CONFIG);
    let mut req = echo(IN1, SRV1, 0x1234, false);
    assert_eq!(rig.send(&mut req, Outbound), Verdict::Forward);
    let f = flow(&req);
    assert_eq!(f.src, IpAddr::V4(EXT));
    assert_eq!(
        f.src_port, f.dst_port,
        "both flow ports carry the identifier"
    );
    let id = f.src_port;
    assert_eq!(req, echo(EXT, SRV1, id, false));
    let mut reply = echo(SRV1, EXT, id, true);
    assert_eq!(rig.send(&mut reply, Inbound), Verdict::Forward);
    assert_eq!(reply, echo(SRV1, IN1, 0x1234, true));
    // Another host using the same identifier gets another external one.
    let mut other = echo(IN2, SRV1, 0x1234, false);
    rig.send(&mut other, Outbound);
    assert_ne!(flow(&other).src_port, id);
    // A reply with the wrong identifier, and an echo reply the inside sends unasked, are dropped.
    let mut wrong = echo(SRV1, EXT, id.wrapping_add(100), true);
    assert_eq!(
        drop_reason(rig.send(&mut wrong, Inbound)),
        "nat: no mapping"
    );
    let mut unasked = echo(IN1, SRV1, 0x4444, true);
    assert_eq!(
        drop_reason(rig.send(&mut unasked, Outbound)),
        "nat: no mapping"
    );
}

/// Filtering (RFC 4787 REQ-8, RFC 5382 REQ-3), mode by mode: which outside hosts get in
/// through a mapping the inside opened to SRV1:53 (UDP) and SRV1:80 (TCP).
#[test]
fn nat_filtering_admits_exactly_what_each_mode_says() {
    // (mode, SRV1 from another port, SRV2): None = forwarded, Some(reason) = dropped.
    let cases = [
        ("endpoint-independent", None, None),
        ("address-dependent", None, Some("nat: filtered")),
        (
            "address-and-port-dependent",
            Some("nat: no mapping"),
            Some("nat: no mapping"),
        ),
    ];
    for (mode, other_port_verdict, other_host_verdict) in cases {
        let mut rig = Rig::new(&format!("{CONFIG}\nfiltering = \"{mode}\""));
        let mut probe = tcp((SRV1, 4444), (EXT, 1024), SYN);
        assert_eq!(
            drop_reason(rig.send(&mut probe, Inbound)),
            "nat: no mapping",
            "{mode}: no mapping yet"
        );
        let mut out = udp((IN1, 7000), (SRV1, 53));
        rig.send(&mut out, Outbound);
        let port = ext_port(&out, EXT);
        let expect = |rig: &mut Rig, mut frame: Vec<u8>, verdict: Option<&str>, what: &str| {
            let v = rig.send(&mut frame, Inbound);
            match verdict {
                None => {
                    assert_eq!(v, Verdict::Forward, "{mode}: {what} gets in");
                    assert_eq!(dst_of(&frame), (IpAddr::V4(IN1), 7000), "{mode}: {what}");
                }
                Some(r) => assert_eq!(drop_reason(v), r, "{mode}: {what}"),
            }
        };
        expect(
            &mut rig,
            udp((SRV1, 54), (EXT, port)),
            other_port_verdict,
            "SRV1:54",
        );
        expect(
            &mut rig,
            udp((SRV2, 53), (EXT, port)),
            other_host_verdict,
            "SRV2:53",
        );
        // Another protocol's packet to the port finds no mapping in any mode.
        let mut other_proto = tcp((SRV1, 53), (EXT, port), SYN);
        assert_eq!(
            drop_reason(rig.send(&mut other_proto, Inbound)),
            "nat: no mapping",
            "{mode}"
        );
        // A session opened from outside is a session like any other: the inside answers
        // through the same mapping (REQ-1).
        if other_host_verdict.is_none() {
            let mut answer = udp((IN1, 7000), (SRV2, 53));
            assert_eq!(rig.send(&mut answer, Outbound), Verdict::Forward);
            assert_eq!(answer, udp((EXT, port), (SRV2, 53)), "{mode}");
        }

        // TCP: only a SYN opens a session from outside.
        let mut syn = tcp((IN1, 5000), (SRV1, 80), SYN);
        rig.send(&mut syn, Outbound);
        let tport = ext_port(&syn, EXT);
        let mut stray = tcp((SRV2, 1234), (EXT, tport), ACK);
        assert_eq!(
            drop_reason(rig.send(&mut stray, Inbound)),
            "nat: no mapping",
            "{mode}: a bare ACK never opens"
        );
        let mut other = tcp((SRV2, 1234), (EXT, tport), SYN);
        let v = rig.send(&mut other, Inbound);
        match other_host_verdict {
            None => assert_eq!(other, tcp((SRV2, 1234), (IN1, 5000), SYN), "{mode}"),
            Some(r) => assert_eq!(drop_reason(v), r, "{mode}: SYN from SRV2"),
        }

        // Not addressed to an external address at all.
        let mut direct = udp((SRV1, 53), (IN1, 7000));
        assert_eq!(
            drop_reason(rig.send(&mut direct, Inbound)),
            "nat: not an external address"
        );
        assert_eq!(rig.report("drop_not_external"), 1);
        let admitted = [other_port_verdict, other_host_verdict, other_host_verdict]
            .iter()
            .filter(|v| v.is_none())
            .count() as i64;
        assert_eq!(rig.report("packets_in"), admitted, "{mode}");
        // Sessions: the two the inside opened, and one per packet let in from a new remote.
        assert_eq!(rig.report("active_sessions"), 2 + admitted, "{mode}");
    }
}

#[test]
fn nat_inbound_icmp_error_quoting_a_whole_datagram_restores_it_exactly() {
    let mut rig = Rig::new(CONFIG);
    let original = udp((IN1, 6000), (SRV1, 9999));
    let mut out = original.clone();
    rig.send(&mut out, Outbound);
    // The server answers "port unreachable", quoting the whole translated datagram.
    let mut err = icmp_error(SRV1, EXT, 3, 3, ip_packet(&out));
    assert_eq!(rig.send(&mut err, Inbound), Verdict::Forward);
    assert_eq!(flow(&err).dst, IpAddr::V4(IN1));
    // The quote is now byte for byte the datagram the inside host sent, checksums included.
    assert_eq!(&err[42..], ip_packet(&original));
    assert_eq!(err, icmp_error(SRV1, IN1, 3, 3, ip_packet(&original)));
    assert_eq!(rig.report("packets_in"), 1);
}

#[test]
fn nat_inbound_icmp_errors_with_short_quotes() {
    let mut rig = Rig::new(CONFIG);
    // TCP: a quote of the IP header and 8 bytes does not hold the TCP checksum.
    let original = tcp((IN1, 40000), (SRV1, 80), SYN);
    let mut out = original.clone();
    rig.send(&mut out, Outbound);
    let mut err = icmp_error(SRV2, EXT, 11, 0, &ip_packet(&out)[..28]);
    assert_eq!(rig.send(&mut err, Inbound), Verdict::Forward);
    assert_eq!(
        err,
        icmp_error(SRV2, IN1, 11, 0, &ip_packet(&original)[..28])
    );
    // An echo request timing out on the way.
    let original = echo(IN2, SRV1, 0x0101, false);
    let mut out = original.clone();
    rig.send(&mut out, Outbound);
    let mut err = icmp_error(SRV2, EXT, 11, 0, &ip_packet(&out)[..28]);
    assert_eq!(rig.send(&mut err, Inbound), Verdict::Forward);
    assert_eq!(
        err,
        icmp_error(SRV2, IN2, 11, 0, &ip_packet(&original)[..28])
    );
    // Errors do not open or refresh anything, and unknown ones are dropped.
    let stranger = tcp((EXT, 5555), (SRV1, 80), SYN);
    let mut err = icmp_error(SRV1, EXT, 3, 1, &ip_packet(&stranger)[..28]);
    assert_eq!(drop_reason(rig.send(&mut err, Inbound)), "nat: no mapping");
    // A quote too short for the ports, or of a protocol without ports.
    let mut short = icmp_error(SRV1, EXT, 3, 1, &ip_packet(&out)[..22]);
    assert_eq!(
        drop_reason(rig.send(&mut short, Inbound)),
        "nat: untranslatable icmp error"
    );
    let mut gre = ip_packet(&out)[..28].to_vec();
    gre[9] = 47;
    let mut err = icmp_error(SRV1, EXT, 3, 1, &gre);
    assert_eq!(
        drop_reason(rig.send(&mut err, Inbound)),
        "nat: untranslatable icmp error"
    );
    assert_eq!(rig.report("drop_icmp_error"), 2);
}

#[test]
fn nat_outbound_icmp_error_about_an_inbound_packet() {
    let mut rig = Rig::new(CONFIG);
    let mut out = udp((IN1, 6000), (SRV1, 9999));
    rig.send(&mut out, Outbound);
    let port = ext_port(&out, EXT);
    // The server sends again; the inside host has closed the port and says so.
    let arrived = udp((SRV1, 9999), (EXT, port));
    let mut inside = arrived.clone();
    assert_eq!(rig.send(&mut inside, Inbound), Verdict::Forward);
    let mut err = icmp_error(IN1, SRV1, 3, 3, ip_packet(&inside));
    assert_eq!(rig.send(&mut err, Outbound), Verdict::Forward);
    // The outside sees the error from the external address about the packet it sent.
    assert_eq!(err, icmp_error(EXT, SRV1, 3, 3, ip_packet(&arrived)));
    // About a packet of no session: dropped.
    let mut err = icmp_error(IN1, SRV2, 3, 3, ip_packet(&udp((SRV2, 1), (IN1, 2))));
    assert_eq!(drop_reason(rig.send(&mut err, Outbound)), "nat: no mapping");
}

#[test]
fn nat_ipv6_non_ip_fragments_and_other_protocols() {
    let mut rig = Rig::new(CONFIG);
    let mut v6 = udp6();
    let copy = v6.clone();
    assert_eq!(rig.send(&mut v6, Outbound), Verdict::Forward);
    assert_eq!(v6, copy, "IPv6 passes untouched");
    let mut drop6 = Rig::new(
        r#"external = ["203.0.113.1"]
ipv6 = "drop""#,
    );
    assert_eq!(drop_reason(drop6.send(&mut v6, Inbound)), "nat: ipv6");

    let mut arp = vec![0xffu8; 12];
    arp.extend_from_slice(&[0x08, 0x06, 0, 1, 8, 0, 6, 4, 0, 1]);
    arp.resize(60, 0);
    let copy = arp.clone();
    assert_eq!(rig.send(&mut arp, Inbound), Verdict::Forward);
    assert_eq!(arp, copy);

    // A later fragment without its datagram's ports (no fragment tracker): dropped.
    let mut frag = udp((IN1, 1), (SRV1, 2));
    frag[20..22].copy_from_slice(&[0x00, 0x10]);
    refill_ip_checksum(&mut frag);
    assert_eq!(drop_reason(rig.send(&mut frag, Outbound)), "nat: fragment");
    // GRE outbound: unsupported; inbound: no mapping.
    let mut gre = udp((IN1, 1), (SRV1, 2));
    gre[23] = 47;
    refill_ip_checksum(&mut gre);
    assert_eq!(
        drop_reason(rig.send(&mut gre, Outbound)),
        "nat: unsupported protocol"
    );
    let mut gre_in = udp((SRV1, 1), (EXT, 2));
    gre_in[23] = 47;
    refill_ip_checksum(&mut gre_in);
    assert_eq!(
        drop_reason(rig.send(&mut gre_in, Inbound)),
        "nat: no mapping"
    );
    assert_eq!(rig.report("drop_fragment"), 1);
    assert_eq!(rig.report("drop_unsupported"), 1);
}

/// The IP payload of fragments put back together by offset, and the source and destination
/// of the first one.
fn reassemble(parts: &[Vec<u8>]) -> (Vec<u8>, [u8; 8]) {
    let mut whole = Vec::new();
    for p in parts {
        let ip = flowstate_wire::ipv4::Packet::new_checked(&p[14..]).unwrap();
        assert!(
            ip.verify_checksum(),
            "every fragment's header checksum verifies"
        );
        let at = usize::from(ip.frag_offset());
        whole.resize(whole.len().max(at + ip.payload().len()), 0);
        whole[at..at + ip.payload().len()].copy_from_slice(ip.payload());
    }
    let mut addrs = [0u8; 8];
    addrs.copy_from_slice(&parts[0][26..34]);
    (whole, addrs)
}

/// RFC 4787 REQ-14 with an oracle: a datagram sent in fragments (the first one as a packet,
/// the later ones with the ports the runtime's tracker gives them, in reverse order) comes
/// out, put back together, exactly as the NAT translates it sent whole: outbound, its reply
/// inbound, and hairpinned. On both tables.
#[test]
fn nat_fragments_translate_as_their_whole_datagram() {
    let hairpin_config = format!("{CONFIG}\nfiltering = \"endpoint-independent\"");
    for config in [
        hairpin_config.clone(),
        format!("{hairpin_config}\ntable = \"mvt\""),
    ] {
        let (mut whole_rig, mut rig) = (Rig::new(&config), Rig::new(&config));
        let payload: Vec<u8> = (0..3000u32).map(|i| (i % 251) as u8).collect();
        // Sends `datagram` whole through `whole_rig` and in fragments through `rig`; both
        // IP packets.
        let mut both = |datagram: Vec<u8>, dir, ports| {
            let mut whole = datagram.clone();
            assert_eq!(whole_rig.send(&mut whole, dir), Verdict::Forward);
            let mut parts = flowstate_wire::build::fragment_ipv4(&datagram, 1000);
            assert_eq!(parts.len(), 4);
            assert_eq!(rig.send(&mut parts[0], dir), Verdict::Forward, "{config}");
            for p in parts[1..].iter_mut().rev() {
                assert_eq!(
                    rig.send_tracked(p, dir, ports),
                    Verdict::Forward,
                    "{config}"
                );
            }
            let (joined, addrs) = reassemble(&parts);
            assert_eq!(&joined[..], &ip_packet(&whole)[20..], "{config}");
            assert_eq!(&addrs[..], &whole[26..34], "{config}");
            whole
        };
        let out = both(
            udp_with((IN1, 5000), (SRV1, 53), &payload),
            Outbound,
            (5000, 53),
        );
        let port = ext_port(&out, EXT);
        let back = both(
            udp_with((SRV1, 53), (EXT, port), &payload),
            Inbound,
            (53, port),
        );
        assert_eq!(dst_of(&back), (IpAddr::V4(IN1), 5000));
        // Another inside host to the first one's external endpoint: hairpinned.
        let hairpinned = both(
            udp_with((IN2, 7000), (EXT, port), &payload),
            Outbound,
            (7000, port),
        );
        assert_eq!(dst_of(&hairpinned), (IpAddr::V4(IN1), 5000));
        assert_eq!(
            rig.report("hairpinned"),
            4,
            "the first fragment and three more"
        );
        // A later fragment of a datagram with no session (its first fragment never came).
        let mut stray = flowstate_wire::build::fragment_ipv4(
            &udp_with((IN2, 9999), (SRV1, 53), &payload),
            1000,
        )
        .remove(1);
        let copy = stray.clone();
        assert_eq!(
            drop_reason(rig.send_tracked(&mut stray, Outbound, (9999, 53))),
            "nat: fragment"
        );
        assert_eq!(stray, copy);
    }
}

fn refill_ip_checksum(f: &mut [u8]) {
    f[24..26].copy_from_slice(&[0, 0]);
    let c = flowstate_wire::checksum::checksum(&f[14..34]);
    f[24..26].copy_from_slice(&c.to_be_bytes());
    let d = dissect(f).unwrap();
    assert_eq!(verify_checksums(f, &d).ip, Some(true));
}

#[test]
fn nat_two_external_addresses_pair_each_inside_host_with_one() {
    let mut rig = Rig::new(r#"external = ["203.0.113.1", "203.0.113.2"]"#);
    let mut seen = std::collections::HashSet::new();
    for host in 1..=40u8 {
        let inside = Ipv4Addr::new(10, 0, 1, host);
        let mut first = None;
        for port in [1000, 2000, 3000] {
            let mut f = udp((inside, port), (SRV1, 53));
            assert_eq!(rig.send(&mut f, Outbound), Verdict::Forward);
            let (a, _) = src_of(&f);
            assert!(a == IpAddr::V4(EXT) || a == IpAddr::V4(EXT2));
            assert_eq!(
                *first.get_or_insert(a),
                a,
                "paired pooling (RFC 4787 REQ-2)"
            );
        }
        seen.insert(first.unwrap());
    }
    assert_eq!(seen.len(), 2, "both addresses are used");
    // Inbound to the second address works like the first.
    let mut f = udp((IN1, 9), (SRV1, 53));
    rig.send(&mut f, Outbound);
    let (a, p) = src_of(&f);
    let IpAddr::V4(a) = a else { unreachable!() };
    let mut back = udp((SRV1, 53), (a, p));
    assert_eq!(rig.send(&mut back, Inbound), Verdict::Forward);
    assert_eq!(back, udp((SRV1, 53), (IN1, 9)));
}

fn config_error(toml_text: &str) -> (String, String) {
    match nat::factory(&table(toml_text)) {
        Err(BuildError::Config { nf, key, reason }) => {
            assert_eq!(nf, "nat");
            (key, reason)
        }
        Err(e) => panic!("unexpected error {e}"),
        Ok(_) => panic!("{toml_text:?} accepted"),
    }
}

#[test]
fn nat_configuration_defaults_and_errors_name_the_key() {
    let c = Config::from_table(&table(CONFIG)).unwrap();
    assert_eq!(c, Config::new(vec![EXT]));
    assert_eq!(
        (c.tcp_established, c.tcp_transitory, c.udp, c.icmp, c.ipv6),
        (
            Duration::from_secs(7440),
            Duration::from_secs(240),
            Duration::from_secs(300),
            Duration::from_secs(60),
            Ipv6Policy::Forward
        )
    );
    assert_eq!(
        c.ports,
        PortRange {
            lo: 1024,
            hi: 65535
        }
    );
    let full = Config::from_table(&table(
        r#"external = ["203.0.113.1", "203.0.113.9"]
ports = "2000-2999"
tcp_established = "100s"
tcp_transitory = "10s"
udp = "20s"
icmp = "5s"
ipv6 = "drop""#,
    ))
    .unwrap();
    assert_eq!(full.ports, PortRange { lo: 2000, hi: 2999 });
    assert_eq!(
        (full.tcp_established, full.icmp, full.ipv6),
        (
            Duration::from_secs(100),
            Duration::from_secs(5),
            Ipv6Policy::Drop
        )
    );

    assert_eq!(config_error("").0, "external");
    assert_eq!(config_error("external = []").0, "external");
    assert_eq!(
        config_error(r#"external = ["203.0.113.300"]"#).0,
        "external[0]"
    );
    assert_eq!(
        config_error(r#"external = ["2001:db8::1"]"#).0,
        "external[0]"
    );
    assert_eq!(
        config_error(r#"external = ["203.0.113.1", "203.0.113.1"]"#).0,
        "external"
    );
    assert_eq!(config_error(r#"external = "203.0.113.1""#).0, "external");
    let (key, reason) = config_error(
        r#"external = ["203.0.113.1"]
ports = "5-1""#,
    );
    assert_eq!(key, "ports");
    assert!(reason.contains("LO-HI"), "{reason}");
    assert_eq!(
        config_error("external = [\"203.0.113.1\"]\nports = 80").0,
        "ports"
    );
    assert_eq!(
        config_error("external = [\"203.0.113.1\"]\nudp = \"0s\"").0,
        "udp"
    );
    // A bare number is refused with the string it probably meant.
    assert_eq!(
        config_error("external = [\"203.0.113.1\"]\nudp = 300"),
        (
            "udp".to_owned(),
            "write a duration with its unit, e.g. \"300s\"".to_owned()
        )
    );
    assert_eq!(
        config_error("external = [\"203.0.113.1\"]\nicmp = -1").0,
        "icmp"
    );
    assert_eq!(
        config_error("external = [\"203.0.113.1\"]\ntcp_established = \"2 fortnights\"").0,
        "tcp_established"
    );
    assert_eq!(
        config_error("external = [\"203.0.113.1\"]\nipv6 = \"translate\"").0,
        "ipv6"
    );
    let (key, reason) = config_error("external = [\"203.0.113.1\"]\ntimeout = 3");
    assert_eq!(key, "timeout");
    assert!(reason.contains("`timeout`"), "{reason}");
    assert_eq!(
        Config::from_table(&table(
            "external = [\"203.0.113.1\"]\ntcp_established = \"2h4m\""
        ))
        .unwrap()
        .tcp_established,
        Duration::from_secs(7440)
    );
    // Every key that is wrong, not only the first.
    match nat::factory(&table("udp = 5\nicmp = \"soon\"\ncolour = 1")) {
        Err(e) => {
            let mut keys: Vec<String> = e.config_errors().into_iter().map(|(k, _)| k).collect();
            keys.sort();
            assert_eq!(keys, ["colour", "external", "icmp", "udp"]);
        }
        Ok(_) => panic!("accepted"),
    }
}

#[test]
fn nat_too_many_workers_for_the_ports_is_a_build_error() {
    let store = flowstate_state::local::LocalStore::new();
    let factory = nat::factory(&table(
        "external = [\"203.0.113.1\"]\nports = \"1024-1025\"",
    ))
    .unwrap();
    let mut part =
        flowstate_state::Partition::new(&store, flowstate_state::StateConfig::default()).unwrap();
    let mut d = part.declare("nat");
    let worker = flowstate_nf::Placement {
        partition: 0,
        partitions: 3,
        stage: 0,
    };
    match factory.build(&mut d, worker) {
        Err(BuildError::Config { key, .. }) if key == "ports" => {}
        Err(e) => panic!("unexpected error {e}"),
        Ok(_) => panic!("built with an empty chunk"),
    }
}

/// Hairpinning (RFC 4787 REQ-9, RFC 5382 REQ-8), on both tables: two inside hosts reach each
/// other through their external endpoints, and each sees the other's external endpoint as the
/// source (REQ-9b). Under endpoint-independent filtering the first packet gets through; under
/// the stricter modes the host behind the mapping must have sent towards the other's external
/// endpoint first, as hole punching does.
#[test]
fn nat_hairpins_udp_and_tcp_between_inside_hosts() {
    for table in ["state", "mvt"] {
        for mode in [
            "endpoint-independent",
            "address-dependent",
            "address-and-port-dependent",
        ] {
            let what = format!("{table}, {mode}");
            let mut rig = Rig::new(&format!(
                "{CONFIG}\ntable = \"{table}\"\nfiltering = \"{mode}\""
            ));
            // Each host has a mapping, made by talking to a server (a STUN server, say).
            let mut a = udp((IN1, 6000), (SRV1, 3478));
            rig.send(&mut a, Outbound);
            let pa = ext_port(&a, EXT);
            let mut b = udp((IN2, 9000), (SRV1, 3478));
            rig.send(&mut b, Outbound);
            let pb = ext_port(&b, EXT);
            if mode != "endpoint-independent" {
                // B punches: its packet to A's external endpoint is let out of B's mapping but
                // A's mapping (which never talked to EXT) keeps it out.
                let mut punch = udp((IN2, 9000), (EXT, pa));
                let why = drop_reason(rig.send(&mut punch, Outbound));
                let expect = if mode == "address-dependent" {
                    "nat: filtered"
                } else {
                    "nat: no mapping"
                };
                assert_eq!(why, expect, "{what}");
            }
            let mut to_b = udp((IN1, 6000), (EXT, pb));
            assert_eq!(rig.send(&mut to_b, Outbound), Verdict::Forward, "{what}");
            assert_eq!(to_b, udp((EXT, pa), (IN2, 9000)), "{what}");
            let mut to_a = udp((IN2, 9000), (EXT, pa));
            assert_eq!(rig.send(&mut to_a, Outbound), Verdict::Forward, "{what}");
            assert_eq!(to_a, udp((EXT, pb), (IN1, 6000)), "{what}");

            // TCP: both sockets have mappings from earlier connections.
            let mut b_out = tcp((IN2, 8080), (SRV1, 80), SYN);
            rig.send(&mut b_out, Outbound);
            let qb = ext_port(&b_out, EXT);
            let mut a_out = tcp((IN1, 5000), (SRV1, 81), SYN);
            rig.send(&mut a_out, Outbound);
            let qa = ext_port(&a_out, EXT);
            if mode != "endpoint-independent" {
                // A's SYN is kept out of B's mapping; B's SYN towards A then gets through,
                // answering A's (a simultaneous open, RFC 5382 §2.3 / RFC 793).
                let mut syn = tcp((IN1, 5000), (EXT, qb), SYN);
                assert!(
                    matches!(rig.send(&mut syn, Outbound), Verdict::Drop(_)),
                    "{what}"
                );
                let mut b_syn = tcp((IN2, 8080), (EXT, qa), SYN);
                assert_eq!(rig.send(&mut b_syn, Outbound), Verdict::Forward, "{what}");
                assert_eq!(b_syn, tcp((EXT, qb), (IN1, 5000), SYN), "{what}");
            }
            let mut syn = tcp((IN1, 5000), (EXT, qb), SYN);
            assert_eq!(rig.send(&mut syn, Outbound), Verdict::Forward, "{what}");
            assert_eq!(syn, tcp((EXT, qa), (IN2, 8080), SYN), "{what}");
            let mut syn_ack = tcp((IN2, 8080), (EXT, qa), SYN | ACK);
            assert_eq!(rig.send(&mut syn_ack, Outbound), Verdict::Forward, "{what}");
            assert_eq!(syn_ack, tcp((EXT, qb), (IN1, 5000), SYN | ACK), "{what}");
            let mut ack = tcp((IN1, 5000), (EXT, qb), ACK);
            assert_eq!(rig.send(&mut ack, Outbound), Verdict::Forward, "{what}");
            assert_eq!(ack, tcp((EXT, qa), (IN2, 8080), ACK), "{what}");
            assert!(rig.report("hairpinned") >= 5, "{what}");
        }
    }
    // Turned off, a packet to an external endpoint is translated and sent on outward.
    let mut rig = Rig::new(&format!("{CONFIG}\nhairpinning = false"));
    let mut b = udp((IN2, 9000), (SRV1, 3478));
    rig.send(&mut b, Outbound);
    let pb = ext_port(&b, EXT);
    let mut to_b = udp((IN1, 6000), (EXT, pb));
    assert_eq!(rig.send(&mut to_b, Outbound), Verdict::Forward);
    assert_eq!(dst_of(&to_b), (IpAddr::V4(EXT), pb));
    assert_eq!(rig.report("hairpinned"), 0);
}

/// `max_sessions`: at the limit new sessions are dropped and counted, established ones keep
/// working, and room comes back as sessions end.
#[test]
fn nat_session_limit_drops_new_sessions_and_keeps_old_ones() {
    for table in ["state", "mvt"] {
        let mut rig = Rig::new(&format!(
            "{CONFIG}\ntable = \"{table}\"\nmax_sessions = 3\nudp = \"30s\""
        ));
        assert_eq!(rig.report("session_limit"), 3);
        // Answered sessions: early drop (on by default) does not end them.
        for port in [5000, 5001, 5002] {
            let mut f = udp((IN1, port), (SRV1, 53));
            assert_eq!(rig.send(&mut f, Outbound), Verdict::Forward, "{table}");
            let mut reply = udp((SRV1, 53), (EXT, ext_port(&f, EXT)));
            assert_eq!(rig.send(&mut reply, Inbound), Verdict::Forward, "{table}");
        }
        let mut fourth = udp((IN1, 5003), (SRV1, 53));
        assert_eq!(
            drop_reason(rig.send(&mut fourth, Outbound)),
            "nat: session limit",
            "{table}"
        );
        // The sessions there still carry traffic both ways.
        let mut again = udp((IN1, 5000), (SRV1, 53));
        assert_eq!(rig.send(&mut again, Outbound), Verdict::Forward, "{table}");
        let port = ext_port(&again, EXT);
        let mut reply = udp((SRV1, 53), (EXT, port));
        assert_eq!(rig.send(&mut reply, Inbound), Verdict::Forward, "{table}");
        assert_eq!(rig.report("drop_session_limit"), 1, "{table}");
        assert_eq!(rig.report("active_sessions"), 3, "{table}");
        rig.advance(31);
        let mut fourth = udp((IN1, 5003), (SRV1, 53));
        assert_eq!(rig.send(&mut fourth, Outbound), Verdict::Forward, "{table}");
    }
    let e = nat::factory(&table("external = [\"203.0.113.1\"]\nmax_sessions = 0"))
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(e.contains("max_sessions"), "{e}");
}

/// Early drop: out of ports, a new session ends the oldest session nothing came in on (or a
/// closed one) and takes its port; answered and established sessions are never ended.
#[test]
fn nat_early_drop_ends_unanswered_sessions_never_answered_ones() {
    for table in ["state", "mvt"] {
        for early_drop in [true, false] {
            let what = format!("{table}, early_drop = {early_drop}");
            let mut rig = Rig::new(&format!(
                "{CONFIG}\ntable = \"{table}\"\nports = \"1024-1025\"\nearly_drop = {early_drop}"
            ));
            // An answered UDP session and an established TCP connection hold both ports.
            let mut dns = udp((IN1, 5000), (SRV1, 53));
            rig.send(&mut dns, Outbound);
            let dns_port = ext_port(&dns, EXT);
            let mut answer = udp((SRV1, 53), (EXT, dns_port));
            assert_eq!(rig.send(&mut answer, Inbound), Verdict::Forward);
            let mut syn = tcp((IN2, 6000), (SRV1, 80), SYN);
            rig.send(&mut syn, Outbound);
            let web_port = ext_port(&syn, EXT);
            let mut syn_ack = tcp((SRV1, 80), (EXT, web_port), SYN | ACK);
            assert_eq!(rig.send(&mut syn_ack, Inbound), Verdict::Forward);
            // Nothing to end: the newcomer is dropped either way.
            let mut late = udp((IN1, 5001), (SRV1, 53));
            assert_eq!(
                drop_reason(rig.send(&mut late, Outbound)),
                "nat: pool exhausted",
                "{what}"
            );
            // The connection closes (FIN both ways): now it is expendable.
            let mut fin = tcp((IN2, 6000), (SRV1, 80), FIN | ACK);
            rig.send(&mut fin, Outbound);
            let mut fin_back = tcp((SRV1, 80), (EXT, web_port), FIN | ACK);
            rig.send(&mut fin_back, Inbound);
            let mut late = udp((IN1, 5001), (SRV1, 53));
            let v = rig.send(&mut late, Outbound);
            if early_drop {
                assert_eq!(v, Verdict::Forward, "{what}");
                assert_eq!(
                    ext_port(&late, EXT),
                    web_port,
                    "{what}: the closed one's port"
                );
                assert_eq!(rig.report("early_drops"), 1, "{what}");
            } else {
                assert_eq!(drop_reason(v), "nat: pool exhausted", "{what}");
            }
            // The answered session was left alone.
            let mut answer = udp((SRV1, 53), (EXT, dns_port));
            assert_eq!(rig.send(&mut answer, Inbound), Verdict::Forward, "{what}");
        }
    }
}

/// `port_parity` (RFC 4787 REQ-4): even inside ports get even external ports and odd odd,
/// until a parity runs out; then the other one is used.
#[test]
fn nat_port_parity_is_kept_until_a_parity_runs_out() {
    for table in ["state", "mvt"] {
        let mut rig = Rig::new(&format!(
            "{CONFIG}\ntable = \"{table}\"\nports = \"1024-1027\"\nport_parity = true\nearly_drop = false"
        ));
        let mut got = Vec::new();
        for port in [5000u16, 5001, 5003, 5005] {
            let mut f = udp((IN1, port), (SRV1, 53));
            assert_eq!(rig.send(&mut f, Outbound), Verdict::Forward, "{table}");
            got.push(ext_port(&f, EXT));
        }
        // 5000 even, 5001 and 5003 odd, then the odd ports are gone: 5005 takes an even one.
        assert_eq!(got[0] % 2, 0, "{table}: {got:?}");
        assert_eq!((got[1] % 2, got[2] % 2), (1, 1), "{table}: {got:?}");
        assert_eq!(got[3] % 2, 0, "{table}: {got:?}");
        let mut fifth = udp((IN1, 5007), (SRV1, 53));
        assert!(
            matches!(rig.send(&mut fifth, Outbound), Verdict::Drop(_)),
            "{table}"
        );
    }
    // Off (the default), ports come in pool order whatever their parity.
    let mut rig = Rig::new(&format!("{CONFIG}\nports = \"1024-1027\""));
    let mut a = udp((IN1, 5001), (SRV1, 53));
    rig.send(&mut a, Outbound);
    assert_eq!(ext_port(&a, EXT), 1024);
}
