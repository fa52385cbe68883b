//! Differential test: our dissector against tshark's, packet by packet.
//!
//! For generated captures of every profile, plus a zoo of hand-built frames (VLAN tags, IPv4
//! fragments, every transport over IPv4 and IPv6), with some checksums deliberately broken,
//! per-packet protocol, addresses, ports and checksum validity must agree with tshark.

use flowstate_io::pcap::{PcapReader, PcapWriter};
use flowstate_io::{PacketBatch, PacketMeta, Sink, Source};
use flowstate_testkit::{ethernet, tshark_or_skip, write};
use flowstate_wire::build::*;
use flowstate_wire::dissect::{verify_checksums, Transport};
use flowstate_wire::{checksum, dissect};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::Path;
use std::process::Command;

fn read_all(path: &Path) -> Vec<(Vec<u8>, PacketMeta)> {
    let mut r = PcapReader::open(path).expect("open pcap");
    let mut batch = PacketBatch::new(64, 4096);
    let mut out = Vec::new();
    while r.recv(&mut batch).expect("read pcap") > 0 {
        out.extend(batch.iter().map(|(b, m)| (b.to_vec(), *m)));
    }
    out
}

fn write_all(path: &Path, packets: &[(Vec<u8>, PacketMeta)]) {
    let mut w = PcapWriter::create(path).expect("create pcap");
    let mut batch = PacketBatch::new(64, 4096);
    for chunk in packets.chunks(64) {
        batch.clear();
        for (b, m) in chunk {
            assert!(batch.push(b, *m));
        }
        w.send(&batch).expect("write");
    }
    w.finish().expect("finish");
}

/// Breaks a checksum in every 5th packet: the IPv4 header checksum or the transport checksum,
/// alternately. Returns how many packets were changed.
fn break_some_checksums(packets: &mut [(Vec<u8>, PacketMeta)]) -> usize {
    let mut broken = 0;
    for (i, (frame, _)) in packets.iter_mut().enumerate().filter(|(i, _)| i % 5 == 3) {
        let Ok(d) = dissect(frame) else { continue };
        let at = match (i % 2, d.transport, d.l4_offset) {
            (0, _, _) if d.network == flowstate_wire::dissect::Network::Ipv4 => d.l3_offset + 10,
            (_, Transport::Tcp, Some(l4)) => l4 + 16,
            (_, Transport::Udp, Some(l4)) => l4 + 6,
            (_, Transport::Icmpv4 { .. } | Transport::Icmpv6 { .. }, Some(l4)) => l4 + 2,
            _ => continue,
        };
        frame[at] ^= 0x5a;
        broken += 1;
    }
    broken
}

#[derive(Debug, Default)]
struct Agreement {
    packets: usize,
    with_ports: usize,
    ip_checksums: usize,
    transport_checksums: usize,
    bad_seen: usize,
}

/// tshark's `*.checksum.status`: 0 bad, 1 good, 2 unverified (or absent).
fn status(field: &str) -> Option<bool> {
    match field {
        "0" => Some(false),
        "1" => Some(true),
        _ => None,
    }
}

fn compare_with_tshark(path: &Path) -> Agreement {
    const FIELDS: &[&str] = &[
        "frame.number",
        "ip.src",
        "ip.dst",
        "ipv6.src",
        "ipv6.dst",
        "tcp.srcport",
        "tcp.dstport",
        "udp.srcport",
        "udp.dstport",
        "icmp.ident",
        "icmpv6.echo.identifier",
        "ip.checksum.status",
        "tcp.checksum.status",
        "udp.checksum.status",
        "icmp.checksum.status",
        "icmpv6.checksum.status",
        "vlan.id",
        "ip.proto",
    ];
    let mut cmd = Command::new("tshark");
    cmd.arg("-n").arg("-r").arg(path).args([
        "-T",
        "fields",
        "-E",
        "separator=\t",
        "-E",
        "occurrence=f",
    ]);
    for pref in [
        "ip.check_checksum:TRUE",
        "tcp.check_checksum:TRUE",
        "udp.check_checksum:TRUE",
        "ip.defragment:FALSE",
        "ipv6.defragment:FALSE",
        "tcp.analyze_sequence_numbers:FALSE",
    ] {
        cmd.args(["-o", pref]);
    }
    for f in FIELDS {
        cmd.args(["-e", f]);
    }
    let out = cmd.output().expect("run tshark");
    assert!(
        out.status.success(),
        "tshark failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).expect("utf8");
    let ours = read_all(path);
    let rows: Vec<&str> = text.lines().collect();
    assert_eq!(
        rows.len(),
        ours.len(),
        "tshark and we count different packets"
    );

    let mut agree = Agreement::default();
    for (row, (frame, _)) in rows.iter().zip(&ours) {
        let f: Vec<&str> = row.split('\t').collect();
        assert_eq!(f.len(), FIELDS.len(), "row {row:?}");
        let n = f[0];
        let d =
            dissect(frame).unwrap_or_else(|e| panic!("packet {n}: we failed ({e}), tshark: {row}"));
        agree.packets += 1;
        let flow = d.flow.unwrap_or_else(|| panic!("packet {n}: no flow key"));
        let (src, dst) = if f[1].is_empty() {
            (f[3], f[4])
        } else {
            (f[1], f[2])
        };
        assert_eq!(flow.src, src.parse::<IpAddr>().unwrap(), "packet {n} src");
        assert_eq!(flow.dst, dst.parse::<IpAddr>().unwrap(), "packet {n} dst");
        let vlan = f[16].parse::<u16>().ok();
        assert_eq!(
            vlan,
            (d.vlan_count > 0).then_some(d.vlan_ids[0]),
            "packet {n} vlan"
        );
        let port = |s: &str| s.parse::<u16>().ok();
        let ident = |s: &str| {
            s.strip_prefix("0x").map_or_else(
                || s.parse::<u16>().ok(),
                |h| u16::from_str_radix(h, 16).ok(),
            )
        };
        let theirs = match d.transport {
            Transport::Tcp => (port(f[5]), port(f[6])),
            Transport::Udp => (port(f[7]), port(f[8])),
            Transport::Icmpv4 { .. } => (ident(f[9]), ident(f[9])),
            Transport::Icmpv6 { .. } => (ident(f[10]), ident(f[10])),
            Transport::None | Transport::Other => {
                assert!(
                    f[5..=10].iter().all(|s| s.is_empty()),
                    "packet {n}: tshark found ports: {row}"
                );
                (Some(0), Some(0))
            }
        };
        assert_eq!(
            (Some(flow.src_port), Some(flow.dst_port)),
            theirs,
            "packet {n} ports: {row}"
        );
        if flow.src_port != 0 {
            agree.with_ports += 1;
        }
        let sums = verify_checksums(frame, &d);
        if let (Some(ours), Some(theirs)) = (sums.ip, status(f[11])) {
            assert_eq!(ours, theirs, "packet {n} ip checksum: {row}");
            agree.ip_checksums += 1;
            agree.bad_seen += usize::from(!ours);
        }
        let transport_status = f[12..=15].iter().find_map(|s| status(s));
        if let (Some(ours), Some(theirs)) = (sums.transport, transport_status) {
            assert_eq!(ours, theirs, "packet {n} transport checksum: {row}");
            agree.transport_checksums += 1;
            agree.bad_seen += usize::from(!ours);
        }
    }
    agree
}

fn gen(dir: &Path, profile: &str, flows: u32, packets: u32) -> std::path::PathBuf {
    let path = dir.join(format!("{profile}.pcap"));
    let out = Command::new(env!("CARGO_BIN_EXE_flowstate"))
        .args(["gen", "--profile", profile, "--seed", "11", "-o"])
        .arg(&path)
        .args([
            "--flows",
            &flows.to_string(),
            "--packets",
            &packets.to_string(),
        ])
        .output()
        .expect("run flowstate gen");
    assert!(
        out.status.success(),
        "gen failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    path
}

#[test]
fn generated_profiles_agree_with_tshark() {
    if !tshark_or_skip("generated_profiles_agree_with_tshark") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    for (profile, flows, packets) in [
        ("long", 2, 4_000),
        ("short", 60, 3_000),
        ("mixed", 40, 4_000),
        ("uniform", 500, 2_000),
    ] {
        let clean = gen(dir.path(), profile, flows, packets);
        let clean_agreement = compare_with_tshark(&clean);
        eprintln!("{profile}: clean {clean_agreement:?}");
        assert_eq!(clean_agreement.packets, packets as usize);
        assert_eq!(
            clean_agreement.bad_seen, 0,
            "{profile}: generated checksums are valid"
        );
        assert!(
            clean_agreement.transport_checksums > packets as usize / 2,
            "{profile}: {clean_agreement:?}"
        );

        let mut packets_v = read_all(&clean);
        let broken = break_some_checksums(&mut packets_v);
        let damaged = dir.path().join(format!("{profile}-damaged.pcap"));
        write_all(&damaged, &packets_v);
        let a = compare_with_tshark(&damaged);
        eprintln!("{profile}: damaged {a:?}, {broken} broken");
        assert_eq!(
            a.bad_seen, broken,
            "{profile}: every broken checksum is seen by both"
        );
        assert!(a.with_ports > 0 && a.ip_checksums > 0, "{profile}: {a:?}");
    }
}

/// Frames the generator does not make: VLAN tags, ICMP echo, IPv4 fragments.
fn zoo() -> Vec<Vec<u8>> {
    let v4 = |a: u8, b: u8| {
        IpSpec::V4(Ipv4Spec::new(
            Ipv4Addr::new(10, 0, 0, a),
            Ipv4Addr::new(198, 51, 100, b),
        ))
    };
    let v6 = |a: u16, b: u16| {
        IpSpec::V6(Ipv6Spec::new(
            Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, a),
            Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, b),
        ))
    };
    let tcp = L4Spec::Tcp(TcpSpec {
        src_port: 40_001,
        dst_port: 443,
        seq: 7,
        ack: 0,
        flags: tcp_flags::SYN,
        window: 65535,
        urgent: 0,
        options: TcpOptions {
            mss: Some(1460),
            window_scale: Some(7),
            sack_permitted: true,
            timestamps: Some((1, 0)),
        },
    });
    let udp = L4Spec::Udp(UdpSpec {
        src_port: 5353,
        dst_port: 9999,
    });
    let echo = L4Spec::Echo(EchoSpec {
        reply: false,
        id: 0x1234,
        seq: 1,
    });
    let mut frames = Vec::new();
    for (i, ip) in [v4(1, 2), v6(1, 2)].into_iter().enumerate() {
        for l4 in [tcp, udp, echo] {
            for vlan in [None, Some(100 + i as u16)] {
                frames.push(write(&FrameSpec {
                    ethernet: EthernetSpec { vlan, ..ethernet() },
                    ip,
                    l4,
                    payload: Payload::Counter { len: 33, start: 1 },
                    min_len: ETHERNET_MIN_LEN,
                }));
            }
        }
    }
    // IPv4 fragments of a UDP datagram: the first (MF set) keeps its ports, a later one has none.
    let spec = FrameSpec {
        ethernet: ethernet(),
        ip: IpSpec::V4(Ipv4Spec {
            dont_fragment: false,
            id: 99,
            ..Ipv4Spec::new(Ipv4Addr::new(10, 0, 0, 3), Ipv4Addr::new(198, 51, 100, 3))
        }),
        l4: udp,
        payload: Payload::Fill {
            len: 64,
            byte: 0xab,
        },
        min_len: 0,
    };
    for (flags_offset, name) in [(0x2000u16, "first"), (0x0005u16, "later")] {
        let mut buf = write(&spec);
        buf[20..22].copy_from_slice(&flags_offset.to_be_bytes());
        buf[24..26].copy_from_slice(&[0, 0]);
        let c = checksum::checksum(&buf[14..34]);
        buf[24..26].copy_from_slice(&c.to_be_bytes());
        assert!(!name.is_empty());
        frames.push(buf);
    }
    frames
}

#[test]
fn hand_built_zoo_agrees_with_tshark() {
    if !tshark_or_skip("hand_built_zoo_agrees_with_tshark") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("zoo.pcap");
    let mut packets: Vec<(Vec<u8>, PacketMeta)> = zoo()
        .into_iter()
        .map(|f| (f, PacketMeta::default()))
        .collect();
    write_all(&path, &packets);
    let a = compare_with_tshark(&path);
    assert_eq!(a.packets, 14);
    assert_eq!(a.bad_seen, 0);
    break_some_checksums(&mut packets);
    write_all(&path, &packets);
    let a = compare_with_tshark(&path);
    assert!(a.bad_seen >= 2, "{a:?}");
}
