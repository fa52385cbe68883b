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
#[path = "../../../fuzz/harness/pcap_check.rs"]
mod pcap_check;
mod pcap_fixtures;

use pcap_fixtures::*;
use proptest::prelude::*;
use std::sync::OnceLock;

fn seeds() -> &'static [(String, Vec<u8>)] {
    static SEEDS: OnceLock<Vec<(String, Vec<u8>)>> = OnceLock::new();
    SEEDS.get_or_init(|| mutate::seeds(env!("CARGO_MANIFEST_DIR"), "pcap"))
}

/// The seeds read whole, without an error.
#[test]
fn seeds_read() {
    for (name, bytes) in seeds() {
        let (packets, error) = pcap_check::by_batches(bytes, 4);
        assert_eq!(error, None, "{name}");
        assert!(!packets.is_empty(), "{name}");
        pcap_check::check(bytes);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(mutate::cases(2000)))]

    #[test]
    fn fuzz_mutated_seeds(seed in any::<prop::sample::Index>(), edits in mutate::edits(8)) {
        let all = seeds();
        let input = mutate::apply(&all[seed.index(all.len())].1, &edits, all);
        pcap_check::check(&input);
    }

    #[test]
    fn fuzz_arbitrary_bytes(b in proptest::collection::vec(any::<u8>(), 0..256)) {
        pcap_check::check(&b);
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
