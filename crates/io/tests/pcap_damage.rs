//! Damaged captures: truncation at every byte, corrupt fields, random bytes. The reader must
//! return the packets before the damage, then an error naming the damaged record's offset, and
//! never panic.

mod pcap_fixtures;

use flowstate_io::pcap::{PcapReader, PcapWriter, WriterOptions};
use flowstate_io::{Error, PacketBatch, PacketMeta, Source};
use pcap_fixtures::*;
use proptest::prelude::*;

/// A classic file of 5 packets and the offsets where its records start (plus its length).
fn classic() -> (Vec<u8>, Vec<usize>) {
    let mut w = PcapWriter::new(Vec::new(), "mem.pcap", WriterOptions::nanos()).unwrap();
    let mut bounds = vec![24];
    for i in 0..5 {
        let len = [60, 1, 0, 150, 33][i];
        let m = PacketMeta {
            timestamp_ns: 1_000 + i as u64,
            wire_len: len as u32 + 4,
            ..PacketMeta::default()
        };
        w.write_packet(&frame(i, len), &m).unwrap();
        bounds.push(bounds[i] + 16 + len);
    }
    (w.finish().unwrap(), bounds)
}

/// A pcapng file: SHB, IDB, then packets mixed with skipped blocks; block offsets and, for
/// each, how many packets precede it.
fn pcapng() -> (Vec<u8>, Vec<(usize, usize)>) {
    let o = Order::Le;
    let blocks = [
        (shb(o), false),
        (idb(o, 1, 64, Some(9)), false),
        (epb(o, 0, 10, &frame(0, 60), 60), true),
        (block(o, 0x0bad, b"custom"), false),
        (spb(o, 100, &frame(1, 64)), true),
        (idb(o, 1, 0, None), false),
        (epb(o, 1, 11, &frame(2, 3), 90), true),
        (opb(o, 0, 12, &frame(3, 9), 9), true),
    ];
    let mut v = Vec::new();
    let mut bounds = Vec::new();
    let mut pkts = 0;
    for (b, is_packet) in blocks {
        bounds.push((v.len(), pkts));
        v.extend(b);
        pkts += usize::from(is_packet);
    }
    bounds.push((v.len(), pkts));
    (v, bounds)
}

/// Reads with `recv` in batches of `cap`; checks that an error never comes in the same call
/// as packets. Returns the packets and the error.
fn recv_all(bytes: &[u8], cap: usize) -> (Vec<(Vec<u8>, PacketMeta)>, Option<Error>) {
    let mut r = match PcapReader::new(bytes, "mem.pcap") {
        Ok(r) => r,
        Err(e) => return (Vec::new(), Some(e)),
    };
    let mut batch = PacketBatch::new(cap, 2048);
    let mut out = Vec::new();
    for _ in 0..=bytes.len() {
        match r.recv(&mut batch) {
            Ok(0) => return (out, None),
            Ok(n) => {
                assert_eq!(n, batch.len());
                out.extend(batch.iter().map(|(d, m)| (d.to_vec(), *m)));
            }
            Err(e) => {
                // Errors repeat, with the same offset.
                let again = r.recv(&mut batch).unwrap_err();
                assert_eq!(again.to_string(), e.to_string());
                assert!(r.next_packet().is_err());
                return (out, Some(e));
            }
        }
    }
    panic!("recv did not end");
}

#[test]
fn classic_truncated_at_every_offset() {
    let (bytes, bounds) = classic();
    let (all, err) = read_all(&bytes);
    assert!(err.is_none());
    assert_eq!(all.len(), 5);
    for t in 0..=bytes.len() {
        let cut = &bytes[..t];
        for (pkts, err) in [read_all(cut), recv_all(cut, 2), recv_all(cut, 1)] {
            if t < 24 {
                let (offset, reason) = format_offset(err.as_ref().unwrap());
                assert_eq!(offset, 0);
                let want = if t == 0 { "empty" } else { "truncated" };
                assert!(reason.contains(want), "{t}: {reason}");
                continue;
            }
            let k = bounds.iter().filter(|&&b| b <= t).count() - 1;
            assert_eq!(pkts, all[..k], "truncated at {t}");
            if bounds.contains(&t) {
                assert!(err.is_none(), "truncated at boundary {t}: {err:?}");
            } else {
                let e = err.unwrap_or_else(|| panic!("truncated at {t}: no error"));
                let (offset, reason) = format_offset(&e);
                assert_eq!(offset as usize, bounds[k], "truncated at {t}: {e}");
                assert!(reason.contains("truncated"), "{e}");
            }
        }
    }
}

#[test]
fn pcapng_truncated_at_every_offset() {
    let (bytes, bounds) = pcapng();
    let (all, err) = read_all(&bytes);
    assert!(err.is_none(), "{err:?}");
    assert_eq!(all.len(), 4);
    assert_eq!(
        all[1].0,
        frame(1, 64),
        "SPB cut to the first interface's snaplen"
    );
    assert_eq!(all[1].1.wire_len, 100);
    assert_eq!(all[2].1.wire_len, 90);
    for t in 0..=bytes.len() {
        let cut = &bytes[..t];
        let &(start, k) = bounds.iter().rev().find(|(b, _)| *b <= t).unwrap();
        for (pkts, err) in [read_all(cut), recv_all(cut, 3), recv_all(cut, 1)] {
            assert_eq!(pkts, all[..k], "truncated at {t}");
            if t == start && t != 0 {
                assert!(err.is_none(), "truncated at boundary {t}: {err:?}");
            } else {
                let e = err.unwrap_or_else(|| panic!("truncated at {t}: no error"));
                assert_eq!(format_offset(&e).0 as usize, start, "truncated at {t}: {e}");
            }
        }
    }
}

#[test]
fn corrupt_classic_fields() {
    let (bytes, bounds) = classic();
    let (all, _) = read_all(&bytes);
    // A corrupt length field in record 2: packets 0 and 1 stay valid.
    for (caplen, needle) in [
        (u32::MAX, "exceeds the maximum"),
        (262_145, "exceeds the maximum"),
    ] {
        let mut v = bytes.clone();
        v[bounds[2] + 8..bounds[2] + 12].copy_from_slice(&caplen.to_le_bytes());
        for (pkts, err) in [read_all(&v), recv_all(&v, 32)] {
            assert_eq!(pkts, all[..2]);
            let e = err.unwrap();
            let (offset, reason) = format_offset(&e);
            assert_eq!(offset as usize, bounds[2]);
            assert!(reason.contains(needle), "{e}");
            assert!(e.to_string().contains("mem.pcap"), "{e}");
        }
    }
    // A length that is plausible but runs past the end of the file.
    let mut v = bytes.clone();
    v[bounds[4] + 8..bounds[4] + 12].copy_from_slice(&1_000u32.to_le_bytes());
    let (pkts, err) = read_all(&v);
    assert_eq!(pkts, all[..4]);
    assert_eq!(format_offset(&err.unwrap()).0 as usize, bounds[4]);
    // A caplen of exactly the maximum is accepted.
    let mut v = pcap_header(Order::Le, false, 65535, 1);
    v.extend(pcap_record(Order::Le, 0, 0, &vec![7; 256 * 1024], 1));
    let (pkts, err) = read_all(&v);
    assert!(err.is_none());
    assert_eq!(
        pkts[0].1.wire_len,
        256 * 1024,
        "wire_len is never below the stored length"
    );
}

#[test]
fn bad_headers() {
    let (bytes, _) = classic();
    let expect = |v: &[u8], needle: &str| {
        let e = PcapReader::new(v, "mem.pcap").unwrap_err();
        let (offset, reason) = format_offset(&e);
        assert_eq!(offset, 0);
        assert!(reason.contains(needle), "{e} should say {needle}");
    };
    let mut v = bytes.clone();
    v[..4].copy_from_slice(b"GIF8");
    expect(&v, "bad magic");
    let mut v = bytes.clone();
    v[..4].copy_from_slice(&0xA1B2_CD34u32.to_le_bytes()); // Kuznetzov's modified pcap
    expect(&v, "bad magic");
    let mut v = bytes.clone();
    v[4] = 3; // version 3.4
    expect(&v, "version 3.4");
    let mut v = bytes.clone();
    v[6] = 3; // version 2.3
    expect(&v, "version 2.3");
    expect(&[], "empty");
    expect(&bytes[..3], "truncated");
    let mut ng = shb(Order::Le);
    ng[12] = 2; // pcapng 2.0
    expect(&ng, "version 2.0");
    let mut ng = shb(Order::Be);
    ng[8..12].copy_from_slice(b"XXXX");
    expect(&ng, "byte-order magic");
    let mut ng = shb(Order::Le);
    ng[4] = 30; // not a multiple of 4
    expect(&ng, "multiple of 4");
    let mut ng = shb(Order::Le);
    ng[4..8].copy_from_slice(&24u32.to_le_bytes());
    expect(&ng, "minimum 28");
    let mut ng = shb(Order::Le);
    ng.extend(epb(Order::Le, 0, 0, &[1], 1));
    let e = PcapReader::new(&ng[..], "mem.pcap").unwrap_err();
    assert_eq!(
        format_offset(&e).0 as usize,
        shb(Order::Le).len(),
        "EPB before any IDB"
    );
}

#[test]
fn error_after_a_partial_batch_comes_next_call() {
    let (bytes, bounds) = classic();
    let mut v = bytes[..bounds[3] + 5].to_vec(); // record 3 cut short
    v.truncate(bounds[3] + 5);
    let mut r = PcapReader::new(&v[..], "mem.pcap").unwrap();
    let mut batch = PacketBatch::new(32, 2048);
    assert_eq!(r.recv(&mut batch).unwrap(), 3);
    assert_eq!(r.records_read(), 3);
    let e = r.recv(&mut batch).unwrap_err();
    assert!(batch.is_empty());
    assert_eq!(format_offset(&e).0 as usize, bounds[3]);
    assert_eq!(r.records_read(), 3);
}

/// Reads everything, by `next_packet` and by `recv`; must end (error or not) without panicking.
fn consume(bytes: &[u8]) {
    let (a, ea) = read_all(bytes);
    let (b, eb) = recv_all(bytes, 4);
    assert_eq!(a, b);
    assert_eq!(ea.map(|e| e.to_string()), eb.map(|e| e.to_string()));
    for (d, m) in &a {
        assert!(d.len() <= 256 * 1024);
        assert!(m.wire_len as usize >= d.len());
    }
}

fn mutate(mut v: Vec<u8>, edits: &[(usize, u8)], cut: usize) -> Vec<u8> {
    if v.is_empty() {
        return v;
    }
    for &(at, byte) in edits {
        let i = at % v.len();
        v[i] = byte;
    }
    v.truncate(cut % (v.len() + 1));
    v
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn random_bytes_never_panic(v in prop::collection::vec(any::<u8>(), 0..400)) {
        consume(&v);
    }

    #[test]
    fn random_bytes_after_a_magic_never_panic(
        magic in prop::sample::select(vec![
            0xA1B2_C3D4u32.to_le_bytes(), 0xA1B2_C3D4u32.to_be_bytes(),
            0xA1B2_3C4Du32.to_le_bytes(), 0xA1B2_3C4Du32.to_be_bytes(),
            0x0A0D_0D0Au32.to_le_bytes(),
        ]),
        rest in prop::collection::vec(any::<u8>(), 0..400),
    ) {
        let mut v = magic.to_vec();
        v.extend(rest);
        consume(&v);
    }

    #[test]
    fn mutated_classic_never_panics(
        edits in prop::collection::vec((any::<usize>(), any::<u8>()), 0..8),
        cut in any::<usize>(),
    ) {
        consume(&mutate(classic().0, &edits, cut));
    }

    #[test]
    fn mutated_pcapng_never_panics(
        edits in prop::collection::vec((any::<usize>(), any::<u8>()), 0..8),
        cut in any::<usize>(),
    ) {
        consume(&mutate(pcapng().0, &edits, cut));
    }

    #[test]
    fn mutated_pcapng_header_fields_never_panic(
        // Edits aimed at the first 160 bytes, where the block headers and options are.
        edits in prop::collection::vec((0usize..160, any::<u8>()), 1..6),
    ) {
        let v = pcapng().0;
        let cut = v.len();
        consume(&mutate(v, &edits, cut));
    }
}
