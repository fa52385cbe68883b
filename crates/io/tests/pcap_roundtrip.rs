//! Classic pcap: write → read round trips, hand-made files in both byte orders, writer options.

mod pcap_fixtures;

use flowstate_io::pcap::{
    FileFormat, PcapReader, PcapWriter, TsResolution, WriterOptions, DEFAULT_SNAPLEN,
    LINKTYPE_ETHERNET,
};
use flowstate_io::{Error, PacketBatch, PacketMeta, Sink, Source};
use pcap_fixtures::*;
use proptest::prelude::*;

fn meta(ts: u64, wire: u32) -> PacketMeta {
    PacketMeta {
        timestamp_ns: ts,
        wire_len: wire,
        ..PacketMeta::default()
    }
}

/// 10 packets of growing length with nanosecond-precise timestamps.
fn sample() -> Vec<(Vec<u8>, PacketMeta)> {
    (0..10)
        .map(|i| {
            let len = 40 + i * 150;
            let ts = 1_700_000_000_000_000_000 + i as u64 * 1_234_567_891;
            (frame(i, len), meta(ts, len as u32))
        })
        .collect()
}

/// Writes `pkts` through the `Sink` interface in batches of 4 and returns the file's bytes.
fn write(pkts: &[(Vec<u8>, PacketMeta)], opts: WriterOptions) -> Vec<u8> {
    let mut w = PcapWriter::new(Vec::new(), "mem.pcap", opts).unwrap();
    let mut batch = PacketBatch::new(4, 4096);
    for chunk in pkts.chunks(4) {
        batch.clear();
        for (d, m) in chunk {
            assert!(batch.push(d, *m));
        }
        w.send(&batch).unwrap();
    }
    Sink::flush(&mut w).unwrap();
    assert_eq!(w.packets_written(), pkts.len() as u64);
    w.finish().unwrap()
}

#[test]
fn round_trip_microseconds() {
    let pkts = sample();
    let bytes = write(&pkts, WriterOptions::default());
    assert_eq!(&bytes[..4], &0xA1B2_C3D4u32.to_le_bytes());
    let mut r = PcapReader::new(&bytes[..], "mem.pcap").unwrap();
    assert_eq!(r.format(), FileFormat::Pcap);
    assert_eq!(r.linktype(), LINKTYPE_ETHERNET);
    let mut batch = PacketBatch::new(4, 4096);
    let mut sizes = Vec::new();
    let mut got = Vec::new();
    loop {
        let n = r.recv(&mut batch).unwrap();
        sizes.push(n);
        if n == 0 {
            break;
        }
        got.extend(batch.iter().map(|(d, m)| (d.to_vec(), *m)));
    }
    assert_eq!(sizes, [4, 4, 2, 0]);
    assert_eq!(r.records_read(), 10);
    assert_eq!(got.len(), pkts.len());
    for ((d, m), (d0, m0)) in got.iter().zip(&pkts) {
        assert_eq!(d, d0);
        assert_eq!(m.wire_len, m0.wire_len);
        assert_eq!(m.timestamp_ns, m0.timestamp_ns / 1_000 * 1_000, "cut to µs");
    }
}

#[test]
fn round_trip_nanoseconds() {
    let pkts = sample();
    let bytes = write(&pkts, WriterOptions::nanos());
    assert_eq!(&bytes[..4], &0xA1B2_3C4Du32.to_le_bytes());
    let (got, err) = read_all(&bytes);
    assert!(err.is_none());
    assert_eq!(got, pkts);
}

#[test]
fn truncation_by_buf_size_keeps_wire_len() {
    let pkts = vec![
        (frame(0, 100), meta(1, 100)),
        (frame(1, 64), meta(2, 1500)), // captured short already
        (frame(2, 10), meta(3, 0)),    // wire_len below the stored length: raised
    ];
    let bytes = write(&pkts, WriterOptions::nanos());
    let mut r = PcapReader::new(&bytes[..], "mem.pcap").unwrap();
    let mut batch = PacketBatch::new(8, 64);
    assert_eq!(r.recv(&mut batch).unwrap(), 3);
    let got: Vec<_> = batch
        .iter()
        .map(|(d, m)| (d.to_vec(), m.wire_len))
        .collect();
    assert_eq!(
        got,
        vec![
            (frame(0, 64), 100),
            (frame(1, 64), 1500),
            (frame(2, 10), 10),
        ]
    );
}

#[test]
fn files_on_disk_and_writer_options() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.pcap");
    let mut w = PcapWriter::create(&path).unwrap();
    w.write_packet(&frame(0, 80), &meta(5_000_000_123, 80))
        .unwrap();
    assert_eq!(w.path(), path);
    let file = w.finish().unwrap();
    drop(file);
    let mut r = PcapReader::open(&path).unwrap();
    assert_eq!(r.path(), path);
    let (d, m) = r.next_packet().unwrap().unwrap();
    assert_eq!(
        (d, m.timestamp_ns, m.wire_len),
        (&frame(0, 80)[..], 5_000_000_000, 80)
    );
    assert!(r.next_packet().unwrap().is_none());

    // Snaplen cuts what is stored, not the wire length; other link types are recorded.
    let opts = WriterOptions {
        resolution: TsResolution::Nano,
        snaplen: 50,
        linktype: 101,
    };
    let path = dir.path().join("b.pcap");
    let mut w = PcapWriter::create_with(&path, opts).unwrap();
    w.write_packet(&frame(1, 80), &meta(7, 80)).unwrap();
    w.flush().unwrap();
    drop(w);
    let mut r = PcapReader::open(&path).unwrap();
    assert_eq!(r.linktype(), 101);
    let (d, m) = r.next_packet().unwrap().unwrap();
    assert_eq!((d, m.timestamp_ns, m.wire_len), (&frame(1, 50)[..], 7, 80));
    assert_eq!(r.last_linktype(), 101);

    // Header fields as the format says.
    let bytes = std::fs::read(&path).unwrap();
    assert_eq!(bytes[..24], pcap_header(Order::Le, true, 50, 101)[..]);
    let bytes = PcapWriter::new(Vec::new(), "x", WriterOptions::default())
        .unwrap()
        .finish()
        .unwrap();
    assert_eq!(bytes, pcap_header(Order::Le, false, DEFAULT_SNAPLEN, 1));
}

#[test]
fn writer_errors() {
    for (opts, name) in [
        (
            WriterOptions {
                snaplen: 0,
                ..WriterOptions::default()
            },
            "snaplen",
        ),
        (
            WriterOptions {
                snaplen: 300_000,
                ..WriterOptions::default()
            },
            "snaplen",
        ),
        (
            WriterOptions {
                linktype: 70_000,
                ..WriterOptions::default()
            },
            "linktype",
        ),
    ] {
        match PcapWriter::new(Vec::new(), "x", opts) {
            Err(Error::Option { name: n, .. }) => assert_eq!(n, name),
            other => panic!("{other:?}"),
        }
    }
    let mut w = PcapWriter::new(Vec::new(), "x.pcap", WriterOptions::default()).unwrap();
    w.write_packet(&[1; 60], &meta(1, 60)).unwrap();
    match w.write_packet(&[1; 60], &meta(u64::MAX, 60)) {
        Err(Error::Format { offset, .. }) => assert_eq!(offset, 24 + 16 + 60),
        other => panic!("{other:?}"),
    }
    // The last second classic pcap can hold still works.
    w.write_packet(
        &[2; 4],
        &meta(u64::from(u32::MAX) * 1_000_000_000 + 999_999_999, 4),
    )
    .unwrap();
    let bytes = w.finish().unwrap();
    let (got, err) = read_all(&bytes);
    assert!(err.is_none());
    assert_eq!(
        got[1].1.timestamp_ns,
        u64::from(u32::MAX) * 1_000_000_000 + 999_999_000
    );

    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no/such/dir.pcap");
    match PcapWriter::create(&missing) {
        Err(e @ Error::Io { .. }) => assert!(e.to_string().contains("dir.pcap")),
        other => panic!("{other:?}"),
    }
    match PcapReader::open(&missing) {
        Err(e @ Error::Io { .. }) => assert!(e.to_string().contains("dir.pcap")),
        other => panic!("{other:?}"),
    }
}

/// Big-endian, microsecond, written byte by byte: two packets.
#[rustfmt::skip]
const BIG_ENDIAN: &[u8] = &[
    0xa1, 0xb2, 0xc3, 0xd4,  0, 2, 0, 4,   // magic, version 2.4
    0, 0, 0, 0,  0, 0, 0, 0,               // thiszone, sigfigs
    0, 0, 0xff, 0xff,  0, 0, 0, 1,         // snaplen 65535, Ethernet
    // record at 24: 1700000000.654321, 6 of 66 bytes
    0x65, 0x53, 0xf1, 0x00,  0, 0x09, 0xfb, 0xf1,  0, 0, 0, 6,  0, 0, 0, 66,
    1, 2, 3, 4, 5, 6,
    // record at 46: 1.000001, 2 of 2 bytes
    0, 0, 0, 1,  0, 0, 0, 1,  0, 0, 0, 2,  0, 0, 0, 2,
    7, 8,
];

#[test]
fn hand_made_big_endian() {
    let (got, err) = read_all(BIG_ENDIAN);
    assert!(err.is_none(), "{err:?}");
    assert_eq!(
        got,
        vec![
            (vec![1, 2, 3, 4, 5, 6], meta(1_700_000_000_654_321_000, 66)),
            (vec![7, 8], meta(1_000_001_000, 2)),
        ]
    );
    // The builder agrees with the literal bytes.
    let mut v = pcap_header(Order::Be, false, 65535, 1);
    v.extend(pcap_record(
        Order::Be,
        1_700_000_000,
        654_321,
        &[1, 2, 3, 4, 5, 6],
        66,
    ));
    v.extend(pcap_record(Order::Be, 1, 1, &[7, 8], 2));
    assert_eq!(v, BIG_ENDIAN);
}

#[test]
fn all_four_magics() {
    for o in [Order::Le, Order::Be] {
        for nanos in [false, true] {
            let mut v = pcap_header(o, nanos, 65535, 1);
            v.extend(pcap_record(o, 3, 5, &frame(0, 60), 60));
            let (got, err) = read_all(&v);
            assert!(err.is_none());
            let want = if nanos { 3_000_000_005 } else { 3_000_005_000 };
            assert_eq!(
                got,
                vec![(frame(0, 60), meta(want, 60))],
                "{o:?} nanos={nanos}"
            );
        }
    }
}

fn packets() -> impl Strategy<Value = Vec<(Vec<u8>, u64, u32)>> {
    prop::collection::vec(
        (
            prop::collection::vec(any::<u8>(), 0..300),
            0..u64::from(u32::MAX) * 1_000_000_000,
            any::<u32>(),
        ),
        0..20,
    )
}

proptest! {
    #[test]
    fn round_trip_any_packets(pkts in packets(), nanos in any::<bool>(), cap in 1usize..6, buf in 1usize..400) {
        let pkts: Vec<_> = pkts
            .into_iter()
            .map(|(d, ts, wire)| (d, meta(ts, wire)))
            .collect();
        let opts = if nanos { WriterOptions::nanos() } else { WriterOptions::default() };
        let bytes = write(&pkts, opts);
        let mut r = PcapReader::new(&bytes[..], "mem.pcap").unwrap();
        let mut batch = PacketBatch::new(cap, buf);
        let mut got = Vec::new();
        loop {
            let n = r.recv(&mut batch).unwrap();
            prop_assert!(n <= cap);
            if n == 0 {
                break;
            }
            got.extend(batch.iter().map(|(d, m)| (d.to_vec(), *m)));
        }
        prop_assert_eq!(got.len(), pkts.len());
        for ((d, m), (d0, m0)) in got.iter().zip(&pkts) {
            prop_assert_eq!(&d[..], &d0[..d0.len().min(buf)]);
            prop_assert_eq!(m.wire_len, m0.wire_len.max(d0.len() as u32));
            let want = if nanos { m0.timestamp_ns } else { m0.timestamp_ns / 1_000 * 1_000 };
            prop_assert_eq!(m.timestamp_ns, want);
        }
    }
}
