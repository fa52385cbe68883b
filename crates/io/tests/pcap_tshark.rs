//! Files we write are read alike by tshark (Wireshark's reader), and so are the hand-made pcapng
//! files the other tests use.
//!
//! Skipped, with a line saying so, only when `tshark` is not on PATH and `CI` is unset; in CI a
//! missing tshark fails the test.

mod pcap_fixtures;

use std::path::Path;
use std::process::Command;

use flowstate_io::pcap::{PcapReader, PcapWriter, WriterOptions};
use flowstate_io::{PacketBatch, PacketMeta, Sink, Source};
use flowstate_testkit::tshark_or_skip;
use pcap_fixtures::*;

/// `(frame.len, frame.cap_len, frame.time_epoch in ns)` of every frame, as tshark reads them.
fn tshark_frames(path: &Path) -> Vec<(u32, u32, u64)> {
    let out = Command::new("tshark")
        .arg("-r")
        .arg(path)
        .args(["-T", "fields", "-e", "frame.len", "-e", "frame.cap_len"])
        .args(["-e", "frame.time_epoch"])
        .output()
        .expect("run tshark");
    assert!(
        out.status.success(),
        "tshark failed on {}: {}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|line| {
            let f: Vec<&str> = line.split('\t').collect();
            assert_eq!(f.len(), 3, "{line:?}");
            (f[0].parse().unwrap(), f[1].parse().unwrap(), epoch_ns(f[2]))
        })
        .collect()
}

/// `"1700000000.123456789"` (any number of fraction digits up to 9) as nanoseconds.
fn epoch_ns(s: &str) -> u64 {
    let (sec, frac) = s.split_once('.').unwrap_or((s, ""));
    assert!(frac.len() <= 9, "{s}");
    let frac = format!("{frac:0<9}");
    sec.parse::<u64>().unwrap() * 1_000_000_000 + frac.parse::<u64>().unwrap()
}

/// Ours, as `(wire_len, stored length, timestamp_ns)`.
fn our_frames(path: &Path) -> Vec<(u32, u32, u64)> {
    let mut r = PcapReader::open(path).unwrap();
    let mut batch = PacketBatch::new(3, 16384);
    let mut v = Vec::new();
    while r.recv(&mut batch).unwrap() > 0 {
        v.extend(
            batch
                .iter()
                .map(|(d, m)| (m.wire_len, d.len() as u32, m.timestamp_ns)),
        );
    }
    v
}

#[test]
fn tshark_reads_what_we_write() {
    if !tshark_or_skip("tshark_reads_what_we_write") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let pkts: Vec<(Vec<u8>, PacketMeta)> = (0..7)
        .map(|i| {
            let len = [60, 1514, 42, 9000, 64, 128, 3000][i];
            let meta = PacketMeta {
                timestamp_ns: 1_700_000_000_123_456_789 + i as u64 * 1_000_999_001,
                wire_len: if i == 2 { 1400 } else { len as u32 }, // packet 2 was captured short
                ..PacketMeta::default()
            };
            (frame(i, len), meta)
        })
        .collect();
    for (name, opts, snaplen) in [
        ("us.pcap", WriterOptions::default(), 262_144),
        ("ns.pcap", WriterOptions::nanos(), 262_144),
        (
            "snap.pcap",
            WriterOptions {
                snaplen: 1000,
                ..WriterOptions::nanos()
            },
            1000,
        ),
    ] {
        let path = dir.path().join(name);
        let mut w = PcapWriter::create_with(&path, opts).unwrap();
        let mut batch = PacketBatch::new(4, 9000);
        for chunk in pkts.chunks(4) {
            batch.clear();
            for (d, m) in chunk {
                batch.push(d, *m);
            }
            w.send(&batch).unwrap();
        }
        w.finish().unwrap();

        let theirs = tshark_frames(&path);
        let want: Vec<(u32, u32, u64)> = pkts
            .iter()
            .map(|(d, m)| {
                let ts = if name == "us.pcap" {
                    m.timestamp_ns / 1_000 * 1_000
                } else {
                    m.timestamp_ns
                };
                (m.wire_len, d.len().min(snaplen) as u32, ts)
            })
            .collect();
        assert_eq!(theirs, want, "{name}");
        assert_eq!(our_frames(&path), want, "{name}");
    }
}

#[test]
fn tshark_agrees_on_hand_made_pcapng() {
    if !tshark_or_skip("tshark_agrees_on_hand_made_pcapng") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    for o in [Order::Le, Order::Be] {
        let mut v = shb(o);
        v.extend(idb(o, 1, 0, Some(9)));
        v.extend(idb(o, 1, 0, Some(0x80 | 20)));
        v.extend(epb(o, 0, 1_700_000_000_123_456_789, &frame(0, 60), 60));
        v.extend(block(o, 0x8000_0123, b"local-use block")); // tshark shows 0xBAD custom blocks
        v.extend(epb(
            o,
            1,
            1_700_000_000 << 20 | 1 << 19,
            &frame(1, 100),
            1514,
        ));
        v.extend(shb(o));
        v.extend(idb(o, 1, 0, None));
        v.extend(epb(o, 0, 1_700_000_002_000_001, &frame(2, 70), 70));
        let path = dir.path().join(format!("hand-{o:?}.pcapng"));
        std::fs::write(&path, &v).unwrap();
        let theirs = tshark_frames(&path);
        assert_eq!(theirs.len(), 3, "{o:?}");
        assert_eq!(theirs, our_frames(&path), "{o:?}");
        assert_eq!(
            theirs[1].2, 1_700_000_000_500_000_000,
            "{o:?}: 2^-20 s resolution"
        );
    }
}
