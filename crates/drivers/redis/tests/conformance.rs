//! The backend conformance suite, unchanged, against a real redis-server and a real 3-node
//! Redis Cluster (FlexState §III-A2: swapping the store must not change what an NF sees).

mod common;

use flowstate_state::conformance::{self, Options, CHECKS};

/// A Redis string stands for values and counters, a hash for maps and counter-maps.
const OPTIONS: Options = Options {
    exact_found_kind: false,
    ..Options::EXACT
};

#[test]
fn redis_passes_the_conformance_suite() {
    let Some(c) = common::redis() else { return };
    for (name, _) in CHECKS {
        eprintln!("redis: {name}");
        conformance::run_check_with(&c, name, &OPTIONS);
    }
}

#[test]
fn redis_cluster_passes_the_conformance_suite() {
    let Some(c) = common::cluster() else { return };
    for (name, _) in CHECKS {
        eprintln!("redis-cluster: {name}");
        conformance::run_check_with(&c, name, &OPTIONS);
    }
}
