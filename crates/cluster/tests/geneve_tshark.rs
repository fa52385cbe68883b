//! The frames root and instances exchange are GENEVE as Wireshark reads it (RFC 8926): tshark,
//! an independent dissector, finds the VNI, our option's class, type and length, and the inner
//! Ethernet frame with its addresses and ports.
//!
//! Skipped, with a line saying so, only when `tshark` is not on PATH and `CI` is unset.

use flowstate_cluster::meta::{self, Kind, Meta};
use flowstate_io::pcap::PcapWriter;
use flowstate_io::{PacketBatch, PacketMeta, Sink};
use flowstate_nf::Direction;
use flowstate_testkit::{tshark_or_skip, udp4};
use std::process::Command;

fn frame(src: [u8; 4], dst: [u8; 4], sport: u16, dport: u16, payload: &[u8]) -> Vec<u8> {
    udp4((src.into(), sport), (dst.into(), dport), payload)
}

#[test]
fn tshark_dissects_our_geneve_frames() {
    if !tshark_or_skip("tshark_dissects_our_geneve_frames") {
        return;
    }
    let inner = frame([10, 0, 0, 2], [198, 51, 100, 2], 40000, 53, b"query");
    let m = Meta {
        kind: Kind::Data,
        stage: 7,
        partition: 11,
        epoch: 3,
        direction: Direction::Outbound,
        clock: 42,
        replay: true,
    };
    let mut g = vec![0u8; meta::HEADER_LEN + inner.len()];
    meta::write(&mut g, &m).unwrap();
    g[meta::HEADER_LEN..].copy_from_slice(&inner);
    let outer = frame([192, 0, 2, 1], [192, 0, 2, 11], 6081, meta::PORT, &g);
    let release = {
        let mut c = vec![0u8; meta::HEADER_LEN];
        meta::write(
            &mut c,
            &Meta {
                kind: Kind::Release,
                ..m
            },
        )
        .unwrap();
        frame([192, 0, 2, 1], [192, 0, 2, 11], 6081, meta::PORT, &c)
    };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("geneve.pcap");
    let mut w = PcapWriter::create(&path).unwrap();
    let mut batch = PacketBatch::new(2, 4096);
    batch.push(&outer, PacketMeta::default());
    batch.push(&release, PacketMeta::default());
    w.send(&batch).unwrap();
    drop(w);
    let out = Command::new("tshark")
        .arg("-r")
        .arg(&path)
        .args(["-T", "fields", "-E", "separator=|"])
        .args([
            "-e",
            "geneve.vni",
            "-e",
            "geneve.flags.oam",
            "-e",
            "geneve.proto_type",
        ])
        .args([
            "-e",
            "geneve.option.class",
            "-e",
            "geneve.option.type",
            "-e",
            "geneve.option.length",
        ])
        .args(["-e", "ip.src", "-e", "udp.srcport"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<Vec<&str>> = text.lines().map(|l| l.split('|').collect()).collect();
    assert_eq!(lines.len(), 2, "{text}");
    let data = &lines[0];
    // VNI is the stage; a data frame is not OAM; the payload is Ethernet.
    let vni = data[0].trim_start_matches("0x");
    assert_eq!(u32::from_str_radix(vni, 16).ok(), Some(7), "{text}");
    assert!(matches!(data[1], "False" | "0"), "{text}");
    assert_eq!(data[2].to_ascii_lowercase(), "0x6558", "{text}");
    // Our option: class 0xfff0, type 0x81 (critical), 16 bytes of data (+4 of header).
    assert_eq!(data[3].to_ascii_lowercase(), "0xfff0", "{text}");
    assert_eq!(data[4].to_ascii_lowercase(), "0x81", "{text}");
    assert_eq!(data[5].split(',').next(), Some("20"), "{text}");
    // Outer and inner IPv4 and UDP, both dissected.
    assert_eq!(data[6], "192.0.2.1,10.0.0.2", "{text}");
    assert_eq!(data[7], "6081,40000", "{text}");
    // A control frame is OAM with no payload.
    assert!(matches!(lines[1][1], "True" | "1"), "{text}");
}
