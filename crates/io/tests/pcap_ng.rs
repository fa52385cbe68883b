//! pcapng reading: hand-made files, both byte orders, timestamp resolutions, several sections.

mod pcap_fixtures;

use flowstate_io::pcap::{FileFormat, PcapReader, LINKTYPE_ETHERNET};
use flowstate_io::{PacketBatch, Source};
use pcap_fixtures::*;

/// SHB + IDB(tsresol=9, snaplen 8) + EPB + SPB (cut to the snaplen) + unknown block + SPB
/// (shorter than the snaplen) + EPB, little-endian, written byte by byte from the spec.
#[rustfmt::skip]
const HAND_MADE: &[u8] = &[
    // Section Header Block, 28 bytes.
    0x0a, 0x0d, 0x0d, 0x0a,  28, 0, 0, 0,
    0x4d, 0x3c, 0x2b, 0x1a,  1, 0, 0, 0,             // byte-order magic, version 1.0
    0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,  // section length: unknown
    28, 0, 0, 0,
    // Interface Description Block at 28, 32 bytes: Ethernet, snaplen 8, if_tsresol = 9.
    1, 0, 0, 0,  32, 0, 0, 0,
    1, 0, 0, 0,  8, 0, 0, 0,
    9, 0, 1, 0,  9, 0, 0, 0,                          // if_tsresol: 10^-9
    0, 0, 0, 0,                                       // opt_endofopt
    32, 0, 0, 0,
    // Enhanced Packet Block at 60, 40 bytes: 5 of 60 bytes at 1700000000.123456789.
    6, 0, 0, 0,  40, 0, 0, 0,
    0, 0, 0, 0,                                       // interface 0
    0xfe, 0x9c, 0x97, 0x17,  0x15, 0xcd, 0x85, 0x3d,  // timestamp high, low
    5, 0, 0, 0,  60, 0, 0, 0,
    1, 2, 3, 4, 5, 0, 0, 0,
    40, 0, 0, 0,
    // Simple Packet Block at 100, 24 bytes: original 200, captured min(8, 200) = 8.
    3, 0, 0, 0,  24, 0, 0, 0,
    200, 0, 0, 0,
    10, 11, 12, 13, 14, 15, 16, 17,
    24, 0, 0, 0,
    // Custom block (type 0x00000bad) at 124, 16 bytes: skipped.
    0xad, 0x0b, 0, 0,  16, 0, 0, 0,
    0xde, 0xad, 0xbe, 0xef,
    16, 0, 0, 0,
    // Simple Packet Block at 140, 24 bytes: original 6, captured 6.
    3, 0, 0, 0,  24, 0, 0, 0,
    6, 0, 0, 0,
    20, 21, 22, 23, 24, 25, 0, 0,
    24, 0, 0, 0,
    // Enhanced Packet Block at 164, 36 bytes: 4 of 4 bytes at 1700000001.000000000.
    6, 0, 0, 0,  36, 0, 0, 0,
    0, 0, 0, 0,
    0xfe, 0x9c, 0x97, 0x17,  0x00, 0xca, 0xc4, 0x71,
    4, 0, 0, 0,  4, 0, 0, 0,
    30, 31, 32, 33,
    36, 0, 0, 0,
];

/// Block boundaries of `HAND_MADE` and the packets complete at each.
const HAND_MADE_BLOCKS: &[(usize, usize)] = &[
    (0, 0),
    (28, 0),
    (60, 0),
    (100, 1),
    (124, 2),
    (140, 2),
    (164, 3),
    (200, 4),
];

fn check_hand_made_packets(pkts: &[(Vec<u8>, flowstate_io::PacketMeta)]) {
    assert_eq!(pkts.len(), 4);
    assert_eq!(pkts[0].0, [1, 2, 3, 4, 5]);
    assert_eq!(pkts[0].1.timestamp_ns, 1_700_000_000_123_456_789);
    assert_eq!(pkts[0].1.wire_len, 60);
    assert_eq!(pkts[1].0, [10, 11, 12, 13, 14, 15, 16, 17]);
    assert_eq!(pkts[1].1.wire_len, 200);
    assert_eq!(
        pkts[1].1.timestamp_ns, 0,
        "a simple packet block has no timestamp"
    );
    assert_eq!(pkts[2].0, [20, 21, 22, 23, 24, 25]);
    assert_eq!(pkts[2].1.wire_len, 6);
    assert_eq!(pkts[3].0, [30, 31, 32, 33]);
    assert_eq!(pkts[3].1.timestamp_ns, 1_700_000_001_000_000_000);
    assert_eq!(pkts[3].1.wire_len, 4);
    for (_, m) in pkts {
        assert_eq!((m.port, m.user), (0, 0));
    }
}

#[test]
fn hand_made_pcapng() {
    assert_eq!(HAND_MADE.len(), 200);
    let mut r = PcapReader::new(HAND_MADE, "hand.pcapng").unwrap();
    assert_eq!(r.format(), FileFormat::PcapNg);
    assert_eq!(r.linktype(), LINKTYPE_ETHERNET);
    let mut pkts = Vec::new();
    while let Some((d, m)) = r.next_packet().unwrap() {
        pkts.push((d.to_vec(), m));
    }
    check_hand_made_packets(&pkts);
    assert_eq!(r.records_read(), 4);
    assert_eq!(r.bytes_read(), 200);
    assert!(r.next_packet().unwrap().is_none(), "stays at the end");
}

#[test]
fn builders_match_the_hand_made_bytes() {
    let o = Order::Le;
    let mut v = Vec::new();
    v.extend(&HAND_MADE[..28]); // the builder's SHB carries a comment; this one has none
    let mut idb_body = Vec::new();
    idb_body.extend(o.u16(1));
    idb_body.extend(o.u16(0));
    idb_body.extend(o.u32(8));
    idb_body.extend(option(o, 9, &[9]));
    idb_body.extend(option(o, 0, &[]));
    v.extend(block(o, 1, &idb_body));
    let mut epb_body = Vec::new();
    epb_body.extend(o.u32(0));
    epb_body.extend(o.u32(0x1797_9cfe));
    epb_body.extend(o.u32(0x3d85_cd15));
    epb_body.extend(o.u32(5));
    epb_body.extend(o.u32(60));
    epb_body.extend([1, 2, 3, 4, 5]);
    v.extend(block(o, 6, &epb_body));
    v.extend(spb(o, 200, &[10, 11, 12, 13, 14, 15, 16, 17]));
    v.extend(block(o, 0xbad, &[0xde, 0xad, 0xbe, 0xef]));
    v.extend(spb(o, 6, &[20, 21, 22, 23, 24, 25]));
    let mut epb2 = Vec::new();
    epb2.extend(o.u32(0));
    epb2.extend(o.u32(0x1797_9cfe));
    epb2.extend(o.u32(0x71c4_ca00));
    epb2.extend(o.u32(4));
    epb2.extend(o.u32(4));
    epb2.extend([30, 31, 32, 33]);
    v.extend(block(o, 6, &epb2));
    assert_eq!(v, HAND_MADE);
}

#[test]
fn hand_made_through_recv_in_small_batches() {
    let mut r = PcapReader::new(HAND_MADE, "hand.pcapng").unwrap();
    let mut b = PacketBatch::new(3, 6);
    assert_eq!(r.recv(&mut b).unwrap(), 3);
    let got: Vec<_> = b.iter().map(|(d, m)| (d.to_vec(), m.wire_len)).collect();
    assert_eq!(
        got,
        vec![
            (vec![1, 2, 3, 4, 5], 60),
            (vec![10, 11, 12, 13, 14, 15], 200), // cut to buf_size 6
            (vec![20, 21, 22, 23, 24, 25], 6),
        ]
    );
    assert_eq!(r.recv(&mut b).unwrap(), 1);
    assert_eq!(b.get(0).unwrap().0, [30, 31, 32, 33]);
    assert_eq!(r.recv(&mut b).unwrap(), 0);
    assert!(b.is_empty());
    assert_eq!(r.recv(&mut b).unwrap(), 0);
}

#[test]
fn hand_made_truncated_at_every_offset() {
    for t in 0..=HAND_MADE.len() {
        let (pkts, err) = read_all(&HAND_MADE[..t]);
        // The last block starting at or before t, and the packets complete before it.
        let &(block_start, complete) = HAND_MADE_BLOCKS
            .iter()
            .rev()
            .find(|(s, _)| *s <= t)
            .unwrap();
        assert_eq!(pkts.len(), complete, "truncated at {t}");
        if t > 0 {
            check_hand_made_packets_prefix(&pkts);
        }
        match err {
            None => assert!(t == block_start && t != 0, "truncated at {t}: no error"),
            Some(e) => {
                assert!(
                    t != block_start || t == 0,
                    "truncated at block boundary {t}: {e}"
                );
                let (offset, reason) = format_offset(&e);
                assert_eq!(offset as usize, block_start, "truncated at {t}: {e}");
                assert!(
                    reason.contains("truncated") || reason.contains("empty"),
                    "{e}"
                );
            }
        }
    }
}

fn check_hand_made_packets_prefix(pkts: &[(Vec<u8>, flowstate_io::PacketMeta)]) {
    let mut full = Vec::new();
    let mut r = PcapReader::new(HAND_MADE, "hand.pcapng").unwrap();
    while let Some((d, m)) = r.next_packet().unwrap() {
        full.push((d.to_vec(), m));
    }
    assert_eq!(pkts, &full[..pkts.len()]);
}

#[test]
fn big_endian_pcapng_with_sections_and_resolutions() {
    let b = Order::Be;
    let l = Order::Le;
    let mut v = Vec::new();
    // Section 1, big-endian: default resolution (µs) on interface 0, 2^-10 s on interface 1.
    v.extend(shb(b));
    v.extend(idb(b, 1, 0, None));
    v.extend(idb(b, 1, 65535, Some(0x80 | 10)));
    v.extend(epb(b, 0, 1_700_000_000_000_001, &frame(0, 60), 60));
    v.extend(epb(b, 1, 1024 * 3 + 512, &frame(1, 64), 1514));
    v.extend(block(b, 5, &[0; 20])); // interface statistics: skipped
    v.extend(opb(b, 0, 2_000_000, &frame(2, 42), 42));
    // Section 2, little-endian: interfaces start again; ms resolution.
    v.extend(shb(l));
    v.extend(idb(l, 1, 0, Some(3)));
    v.extend(epb(l, 0, 5_000, &frame(3, 100), 100));
    // snaplen 0: a simple packet block holds the whole packet.
    v.extend(spb(l, 70, &frame(4, 70)));

    let (pkts, err) = read_all(&v);
    assert!(err.is_none(), "{err:?}");
    let summary: Vec<_> = pkts
        .iter()
        .map(|(d, m)| (d.len(), m.wire_len, m.timestamp_ns))
        .collect();
    assert_eq!(
        summary,
        vec![
            (60, 60, 1_700_000_000_000_001_000),
            (64, 1514, 3_500_000_000),
            (42, 42, 2_000_000_000),
            (100, 100, 5_000_000_000),
            (70, 70, 0),
        ]
    );
    for (i, (d, _)) in pkts.iter().enumerate() {
        assert_eq!(*d, frame(i, d.len()));
    }
}

#[test]
fn tsoffset_and_other_link_types() {
    let o = Order::Le;
    let mut body = Vec::new();
    body.extend(o.u16(101)); // LINKTYPE_RAW
    body.extend(o.u16(0));
    body.extend(o.u32(0));
    body.extend(option(o, 14, &1_000u64.to_le_bytes())); // if_tsoffset: +1000 s
    body.extend(option(o, 9, &[0])); // whole seconds
    let mut v = shb(o);
    v.extend(block(o, 1, &body));
    v.extend(idb(o, 1, 0, Some(9)));
    v.extend(epb(o, 0, 7, &frame(0, 20), 20));
    v.extend(epb(o, 0, 8, &frame(1, 20), 20));
    v.extend(epb(o, 1, 9, &frame(2, 60), 60));
    v.extend(epb(o, 0, 10, &frame(3, 20), 20));

    let mut r = PcapReader::new(&v[..], "raw.pcapng").unwrap();
    assert_eq!(r.linktype(), 101);
    // A batch never mixes link types.
    let mut b = PacketBatch::new(8, 2048);
    let mut batches = Vec::new();
    loop {
        let n = r.recv(&mut b).unwrap();
        if n == 0 {
            break;
        }
        let ts: Vec<u64> = b.iter().map(|(_, m)| m.timestamp_ns).collect();
        batches.push((r.last_linktype(), ts));
    }
    assert_eq!(
        batches,
        vec![
            (101, vec![1_007_000_000_000, 1_008_000_000_000]),
            (1, vec![9]),
            (101, vec![1_010_000_000_000]),
        ]
    );
    assert_eq!(r.records_read(), 4);
}

#[test]
fn empty_sections() {
    let o = Order::Le;
    // No interface at all: no packet, and the link type falls back to Ethernet.
    let v = shb(o);
    let mut r = PcapReader::new(&v[..], "empty.pcapng").unwrap();
    assert_eq!(r.linktype(), LINKTYPE_ETHERNET);
    assert!(r.next_packet().unwrap().is_none());
    // An interface only in the second section.
    let mut v = shb(o);
    v.extend(block(o, 0xbad, b"xyz"));
    v.extend(shb(Order::Be));
    v.extend(idb(Order::Be, 228, 0, None));
    v.extend(epb(Order::Be, 0, 1, &frame(0, 30), 30));
    let mut r = PcapReader::new(&v[..], "late.pcapng").unwrap();
    assert_eq!(r.linktype(), 228);
    assert_eq!(r.next_packet().unwrap().unwrap().0, frame(0, 30));
}

#[test]
fn pcapng_damage() {
    let o = Order::Le;
    let head = {
        let mut v = shb(o);
        v.extend(idb(o, 1, 0, Some(9)));
        v
    };
    let good = epb(o, 0, 1, &frame(0, 60), 60);
    let at = (head.len() + good.len()) as u64;
    let case = |bad: Vec<u8>, needle: &str| {
        let mut v = head.clone();
        v.extend(&good);
        v.extend(bad);
        v.extend(&good);
        let (pkts, err) = read_all(&v);
        assert_eq!(pkts.len(), 1, "{needle}");
        let e = err.unwrap_or_else(|| panic!("no error for {needle}"));
        let (offset, reason) = format_offset(&e);
        assert_eq!(offset, at, "{e}");
        assert!(reason.contains(needle), "{e} should say {needle}");
        assert!(e.to_string().contains("mem.pcap"), "{e}");
    };
    let mut b = epb(o, 0, 1, &frame(1, 60), 60);
    b[4] = 0x55; // block length not a multiple of 4
    case(b, "multiple of 4");
    let mut b = epb(o, 0, 1, &frame(1, 60), 60);
    b[4..8].copy_from_slice(&28u32.to_le_bytes());
    case(b, "less than the minimum 32");
    // An unknown block of 8 bytes: shorter than any block can be.
    case(
        vec![0xad, 0x0b, 0, 0, 8, 0, 0, 0],
        "less than the minimum 12",
    );
    let mut b = epb(o, 0, 1, &frame(1, 60), 60);
    b[20..24].copy_from_slice(&200u32.to_le_bytes()); // caplen > block
    case(b, "exceeds the block");
    let mut b = epb(o, 0, 1, &frame(1, 60), 60);
    b[20..24].copy_from_slice(&(300 * 1024u32).to_le_bytes());
    case(b, "exceeds the maximum");
    let mut b = epb(o, 0, 1, &frame(1, 60), 60);
    let n = b.len();
    b[n - 4] = 0; // trailing length differs
    case(b, "trailing length");
    case(epb(o, 3, 1, &frame(1, 60), 60), "interface 3");
    let mut b = epb(o, 0, 1, &frame(1, 60), 60);
    b[4..8].copy_from_slice(&(32u32 << 20).to_le_bytes());
    case(b, "exceeds the maximum");
    // A new section resets the interfaces: a packet before its IDB is an error.
    let mut s = shb(o);
    let shb_len = s.len() as u64;
    s.extend(spb(o, 10, &frame(1, 10)));
    let mut v = head.clone();
    v.extend(&good);
    v.extend(s);
    let (pkts, err) = read_all(&v);
    assert_eq!(pkts.len(), 1);
    assert_eq!(format_offset(&err.unwrap()).0, at + shb_len);
    // Bad byte-order magic and unknown version in a later section.
    let mut s = shb(o);
    s[8] = 0;
    case(s, "byte-order magic");
    let mut s = shb(o);
    s[12] = 2;
    case(s, "version 2.0");
    let mut b = idb(o, 1, 0, Some(9));
    b[26] = 2; // if_tsresol length 2
    case(b, "bad length");
    let mut b = idb(o, 1, 0, Some(9));
    b[18] = 200; // if_name claims 200 bytes
    case(b, "overruns");
}
