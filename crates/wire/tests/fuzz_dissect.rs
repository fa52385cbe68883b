//! The stable harness of the `dissect` fuzz target (`fuzz/fuzz_targets/dissect.rs`): the
//! committed seed corpus (`fuzz/corpus/dissect`, valid frames of every kind the dissector
//! knows) mutated as libFuzzer would, and arbitrary bytes. Nothing may panic; every layer a
//! dissection reports lies inside the frame and in order; every view accepts what the
//! dissector found; Ethernet padding after an IP packet changes nothing.
//!
//! `FLOWSTATE_FUZZ_CASES=1000000 cargo test --release -p flowstate-wire --test fuzz_dissect`
//! (or `scripts/fuzz`) runs it longer.

#[path = "../../../fuzz/harness/mutate.rs"]
mod mutate;
mod views_check;

use flowstate_wire::dissect::{dissect, Network};
use proptest::prelude::*;
use std::sync::OnceLock;
use views_check::{check_dissection, exercise_options, exercise_views};

fn seeds() -> &'static [(String, Vec<u8>)] {
    static SEEDS: OnceLock<Vec<(String, Vec<u8>)>> = OnceLock::new();
    SEEDS.get_or_init(|| mutate::seeds(env!("CARGO_MANIFEST_DIR"), "dissect"))
}

/// What the fuzz target asserts, on one input.
fn one(frame: &[u8]) {
    exercise_views(frame);
    exercise_options(frame);
    let Ok(d) = dissect(frame) else {
        return;
    };
    check_dissection(frame, &d);
    if matches!(d.network, Network::Ipv4 | Network::Ipv6) {
        // The IP header's length bounds the packet: bytes after it are Ethernet padding.
        let mut padded = frame.to_vec();
        padded.extend_from_slice(&[0xa5; 23]);
        let again = dissect(&padded).expect("padding after a dissected IP packet");
        assert_eq!(
            again,
            d,
            "padding changed the dissection of {}",
            mutate::hex(frame)
        );
    }
}

/// Every seed dissects (the mutations start from frames that reach every layer).
#[test]
fn seeds_dissect() {
    for (name, frame) in seeds() {
        let d = dissect(frame).unwrap_or_else(|e| panic!("{name}: {e:?}"));
        check_dissection(frame, &d);
        one(frame);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(mutate::cases(3000)))]

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
