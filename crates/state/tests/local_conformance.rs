//! The conformance suite against the in-process store: one test per check, all against one
//! shared store (as checks would share a real server), plus the whole suite on a one-shard
//! store.

use flowstate_state::conformance::{self, Options, CHECKS};
use flowstate_state::local::{LocalConfig, LocalStore};
use flowstate_state::{Backend, BackendError, Connector, Kind, ObjectKey, Op, OpError, Reply};
use std::sync::OnceLock;

fn shared_store() -> &'static LocalStore {
    static STORE: OnceLock<LocalStore> = OnceLock::new();
    STORE.get_or_init(LocalStore::new)
}

macro_rules! checks {
    ($($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                conformance::run_check(shared_store(), stringify!($name));
            }
        )*

        #[test]
        fn every_check_has_a_test() {
            let tested = [$(stringify!($name)),*];
            let all: Vec<&str> = CHECKS.iter().map(|(n, _)| *n).collect();
            assert_eq!(tested.to_vec(), all, "add the new checks to this file");
        }
    };
}

checks!(
    missing_objects,
    value,
    compare_and_set,
    counter,
    list,
    set,
    map,
    counter_map,
    read_all,
    delete_any_kind,
    wrong_kind,
    batch_order,
    partitions,
    ttl_object,
    ttl_map_field,
    locks,
    concurrency,
    large_values,
    binary_bytes,
);

#[test]
fn whole_suite_on_one_shard_leaves_nothing_behind() {
    let store = LocalStore::with_config(LocalConfig {
        shards: 1,
        max_objects: None,
    });
    let start = std::time::Instant::now();
    conformance::run_all(&store);
    eprintln!(
        "conformance suite on the local store: {:?}",
        start.elapsed()
    );
    assert!(store.is_empty(), "{} objects left", store.len());
    assert_eq!(store.locks_held(), 0);
    assert!(store.ops_executed() > 0);
}

#[test]
#[should_panic(expected = "no conformance check named 'nope'")]
fn unknown_check_names_are_refused() {
    conformance::run_check(shared_store(), "nope");
}

/// A store that names the wrong kind in its errors, as a store whose native types stand for
/// several kinds would (a Redis string holds values and counters).
struct VagueKinds(LocalStore);

struct VagueBackend(Box<dyn Backend>);

impl Connector for VagueKinds {
    fn name(&self) -> &'static str {
        "vague"
    }
    fn connect(&self) -> Result<Box<dyn Backend>, BackendError> {
        Ok(Box::new(VagueBackend(self.0.connect()?)))
    }
}

impl Backend for VagueBackend {
    fn name(&self) -> &'static str {
        "vague"
    }
    fn execute(&mut self, ops: &[Op], replies: &mut Vec<Reply>) -> Result<(), BackendError> {
        let start = replies.len();
        self.0.execute(ops, replies)?;
        for r in &mut replies[start..] {
            if let Reply::Error(OpError::WrongKind { found, .. }) = r {
                *found = "thing";
            }
        }
        Ok(())
    }
    fn partitions(
        &mut self,
        nf: &str,
        kind: Kind,
        id: &str,
    ) -> Result<Vec<ObjectKey>, BackendError> {
        self.0.partitions(nf, kind, id)
    }
}

#[test]
fn inexact_found_kind_passes_only_when_allowed() {
    let vague = VagueKinds(LocalStore::new());
    let loose = Options {
        exact_found_kind: false,
        ..Options::EXACT
    };
    conformance::run_check_with(&vague, "wrong_kind", &loose);
    let strict = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        conformance::run_check_with(&vague, "wrong_kind", &Options::EXACT)
    }));
    assert!(strict.is_err(), "an exact check must notice the wrong kind");
}

#[test]
fn whole_second_timers_pass_on_the_local_store() {
    for check in ["ttl_object", "ttl_map_field", "locks"] {
        conformance::run_check_with(shared_store(), check, &Options::WHOLE_SECONDS);
    }
}
