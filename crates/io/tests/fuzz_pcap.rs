//! The stable harness of the `pcap` fuzz target (`fuzz/fuzz_targets/pcap.rs`): the committed
//! seed corpus (`fuzz/corpus/pcap`: classic pcap in both byte orders and timestamp
//! resolutions, pcapng with several interfaces, sections, every packet block kind and options,
//! written by `write_seeds` below; the packets are the `dissect` corpus's frames) mutated as
//! libFuzzer would, and arbitrary bytes. Nothing may panic; the two ways of reading
//! (`next_packet`, and `recv` in batches of 1 and 7) give the same packets and the same
//! error; an error repeats; no packet is longer than the format allows; the reader reads no
//! more records than the bytes could hold. Every packet is dissected too, as `inspect` does.
//!
//! `FLOWSTATE_FUZZ_CASES=1000000 cargo test --release -p flowstate-io --test fuzz_pcap`
//! (or `scripts/fuzz`) runs it longer.

#[path = "../../../fuzz/harness/mutate.rs"]
mod mutate;
mod pcap_fixtures;

use flowstate_io::pcap::{PcapReader, MAX_CAPLEN};
use flowstate_io::{PacketBatch, PacketMeta, Source};
use pcap_fixtures::*;
use proptest::prelude::*;
use std::sync::OnceLock;

fn seeds() -> &'static [(String, Vec<u8>)] {
    static SEEDS: OnceLock<Vec<(String, Vec<u8>)>> = OnceLock::new();
    SEEDS.get_or_init(|| mutate::seeds(env!("CARGO_MANIFEST_DIR"), "pcap"))
}

type Packets = Vec<(Vec<u8>, PacketMeta)>;

/// `recv` in batches of `cap` (buffers of `MAX_CAPLEN`: nothing truncated): the packets and
/// the error's text.
fn by_batches(bytes: &[u8], cap: usize) -> (Packets, Option<String>) {
    let mut r = match PcapReader::new(bytes, "fuzz.pcap") {
        Ok(r) => r,
        Err(e) => return (Vec::new(), Some(e.to_string())),
    };
    let mut batch = PacketBatch::new(cap, MAX_CAPLEN as usize);
    let mut out = Vec::new();
    // Every call that returns packets consumes at least one record of 12 or more bytes.
    for _ in 0..=bytes.len() / 12 + 1 {
        match r.recv(&mut batch) {
            Ok(0) => return (out, None),
            Ok(n) => {
                assert_eq!(n, batch.len());
                out.extend(batch.iter().map(|(d, m)| (d.to_vec(), *m)));
            }
            Err(e) => {
                let again = r.recv(&mut batch).expect_err("an error repeats");
                assert_eq!(again.to_string(), e.to_string());
                return (out, Some(e.to_string()));
            }
        }
    }
    panic!("recv did not end: {}", mutate::hex(bytes));
}

/// What the fuzz target checks, on one input.
fn one(bytes: &[u8]) {
    let (packets, error) = match PcapReader::new(bytes, "fuzz.pcap") {
        Err(e) => (Vec::new(), Some(e.to_string())),
        Ok(mut r) => {
            let mut out = Vec::new();
            let error = loop {
                match r.next_packet() {
                    Ok(Some((d, m))) => {
                        assert!(d.len() <= MAX_CAPLEN as usize);
                        let _ = flowstate_wire::dissect::dissect(d);
                        out.push((d.to_vec(), m));
                        assert!(out.len() <= bytes.len() / 12, "more records than bytes");
                    }
                    Ok(None) => break None,
                    Err(e) => {
                        let again = r.next_packet().expect_err("an error repeats");
                        assert_eq!(again.to_string(), e.to_string());
                        break Some(e.to_string());
                    }
                }
            };
            assert_eq!(r.records_read(), out.len() as u64);
            assert!(r.bytes_read() <= bytes.len() as u64);
            (out, error)
        }
    };
    for cap in [1, 7] {
        let (p, e) = by_batches(bytes, cap);
        assert_eq!(
            p,
            packets,
            "recv({cap}) vs next_packet: {}",
            mutate::hex(bytes)
        );
        assert_eq!(
            e,
            error,
            "recv({cap}) vs next_packet: {}",
            mutate::hex(bytes)
        );
    }
}

/// The seeds read whole, without an error.
#[test]
fn seeds_read() {
    for (name, bytes) in seeds() {
        let (packets, error) = by_batches(bytes, 4);
        assert_eq!(error, None, "{name}");
        assert!(!packets.is_empty(), "{name}");
        one(bytes);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(mutate::cases(2000)))]

    #[test]
    fn fuzz_mutated_seeds(seed in any::<prop::sample::Index>(), edits in mutate::edits(8)) {
        let all = seeds();
        let input = mutate::apply(&all[seed.index(all.len())].1, &edits, all);
        one(&input);
    }

    #[test]
    fn fuzz_arbitrary_bytes(b in proptest::collection::vec(any::<u8>(), 0..256)) {
        one(&b);
    }
}

/// The frames the seed captures carry: the `dissect` corpus.
fn frames() -> Vec<Vec<u8>> {
    mutate::seeds(env!("CARGO_MANIFEST_DIR"), "dissect")
        .into_iter()
        .map(|(_, b)| b)
        .collect()
}

/// The seed captures.
fn seed_files() -> Vec<(&'static str, Vec<u8>)> {
    let f = frames();
    let classic = |o: Order, nanos: bool| {
        let mut v = pcap_header(o, nanos, 65_535, 1);
        for (i, d) in f.iter().enumerate() {
            v.extend(pcap_record(
                o,
                1_700_000_000 + i as u32,
                999,
                d,
                d.len() as u32 + 4,
            ));
        }
        v
    };
    let ng = |o: Order| {
        let mut v = shb(o);
        v.extend(idb(o, 1, 0, Some(9)));
        v.extend(idb(o, 1, 96, None));
        for (i, d) in f.iter().enumerate() {
            v.extend(match i % 3 {
                0 => epb(o, (i % 2) as u32, 1_000 + i as u64, d, d.len() as u32),
                1 => opb(o, 0, 2_000 + i as u64, d, d.len() as u32 + 10),
                _ => spb(o, d.len() as u32, d),
            });
            if i == 5 {
                v.extend(block(o, 0x0bad, b"custom block"));
            }
            if i == 9 {
                // A second section, the other byte order's interfaces replaced.
                v.extend(shb(o));
                v.extend(idb(o, 1, 0, Some(6)));
            }
        }
        v
    };
    vec![
        ("classic_le_us.pcap", classic(Order::Le, false)),
        ("classic_be_ns.pcap", classic(Order::Be, true)),
        ("ng_le.pcapng", ng(Order::Le)),
        ("ng_be.pcapng", ng(Order::Be)),
    ]
}

/// Writes `fuzz/corpus/pcap` (run by hand after the fixtures change:
/// `cargo test -p flowstate-io --test fuzz_pcap -- --ignored write_seeds`).
#[test]
#[ignore]
fn write_seeds() {
    let dir = mutate::corpus_dir(env!("CARGO_MANIFEST_DIR"), "pcap");
    std::fs::create_dir_all(&dir).unwrap();
    for (name, bytes) in seed_files() {
        std::fs::write(dir.join(name), bytes).unwrap();
    }
}

/// The committed seeds are what `write_seeds` writes.
#[test]
fn seeds_are_current() {
    for (name, bytes) in seed_files() {
        let on_disk = seeds().iter().find(|(n, _)| n == name);
        assert_eq!(
            on_disk.map(|(_, b)| b),
            Some(&bytes),
            "{name}: run write_seeds (see its doc)"
        );
    }
}
