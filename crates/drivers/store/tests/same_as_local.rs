//! Differential test: random batches of state-API operations give the same replies on the
//! embedded `local` store and on the store server through this driver (the server re-implements
//! the local store's semantics; this is where a difference would show).

use flowstate_driver_store::StoreConnector;
use flowstate_state::local::LocalStore;
use flowstate_state::{Backend, Kind, ObjectKey, Op, Reply};
use flowstate_store::{Config, Server};
use proptest::prelude::*;
use std::sync::OnceLock;
use std::time::Duration;

fn server_addr() -> String {
    static SERVER: OnceLock<(Server, String)> = OnceLock::new();
    SERVER
        .get_or_init(|| {
            let s = Server::start(Config {
                listen: "127.0.0.1:0".parse().unwrap(),
                shards: 3,
                ..Config::default()
            })
            .unwrap();
            let a = s.local_addr().to_string();
            (s, a)
        })
        .1
        .clone()
}

fn kind() -> impl Strategy<Value = Kind> {
    prop_oneof![
        Just(Kind::Value),
        Just(Kind::Counter),
        Just(Kind::List),
        Just(Kind::Set),
        Just(Kind::Map),
        Just(Kind::CounterMap),
    ]
}

/// Operations on 4 keys (which may hold any kind, so wrong-kind errors are exercised) with
/// small values; times to live and leases are long enough never to end during a case.
fn op(ns: &'static str) -> impl Strategy<Value = Op> {
    let key = (0u8..4).prop_map(move |i| ObjectKey::shared(ns, Kind::Value, &format!("k{i}")));
    let b = || proptest::collection::vec(0u8..3, 0..3);
    let long = Duration::from_secs(3600);
    prop_oneof![
        key.clone().prop_map(|key| Op::Get { key }),
        (key.clone(), b()).prop_map(|(key, value)| Op::Set { key, value }),
        key.clone().prop_map(|key| Op::Delete { key }),
        (key.clone(), -3i64..3).prop_map(|(key, delta)| Op::Add { key, delta }),
        key.clone().prop_map(|key| Op::GetCounter { key }),
        (key.clone(), -3i64..3).prop_map(|(key, value)| Op::SetCounter { key, value }),
        (key.clone(), b()).prop_map(|(key, item)| Op::Push { key, item }),
        key.clone().prop_map(|key| Op::Pop { key }),
        (key.clone(), b()).prop_map(|(key, member)| Op::Insert { key, member }),
        (key.clone(), b()).prop_map(|(key, member)| Op::Remove { key, member }),
        (key.clone(), b()).prop_map(|(key, member)| Op::Contains { key, member }),
        (key.clone(), b()).prop_map(|(key, field)| Op::MapGet { key, field }),
        (key.clone(), b(), b()).prop_map(|(key, field, value)| Op::MapSet { key, field, value }),
        (key.clone(), b()).prop_map(|(key, field)| Op::MapDelete { key, field }),
        (key.clone(), b(), -3i64..3).prop_map(|(key, field, delta)| Op::MapAdd {
            key,
            field,
            delta
        }),
        (key.clone(), b()).prop_map(|(key, field)| Op::MapGetCounter { key, field }),
        (
            key.clone(),
            proptest::option::of(b()),
            proptest::option::of(b())
        )
            .prop_map(|(key, expected, new)| Op::CompareAndSet { key, expected, new }),
        (key.clone(), proptest::option::of(b())).prop_map(move |(key, field)| Op::Expire {
            key,
            field,
            ttl: long
        }),
        (key.clone(), kind()).prop_map(|(key, kind)| Op::Len { key, kind }),
        (key.clone(), kind()).prop_map(|(key, kind)| Op::ReadAll { key, kind }),
        (key.clone(), 1u64..3).prop_map(move |(key, owner)| Op::Lock {
            key,
            owner,
            lease: long
        }),
        (key, 1u64..3).prop_map(|(key, owner)| Op::Unlock { key, owner }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn the_store_answers_every_batch_as_the_local_store_does(
        batches in proptest::collection::vec(proptest::collection::vec(op("diff"), 1..12), 1..6)
    ) {
        // A fresh namespace per case on the shared server.
        static CASE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = CASE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let rename = |op: &Op| -> Op {
            let k = ObjectKey::from_raw(&op.key().as_str().replacen("diff@", &format!("diff{n}@"), 1)).unwrap();
            let mut op = op.clone();
            match &mut op {
                Op::Get { key } | Op::Set { key, .. } | Op::Delete { key } | Op::Add { key, .. }
                | Op::GetCounter { key } | Op::SetCounter { key, .. } | Op::Push { key, .. }
                | Op::Pop { key } | Op::Insert { key, .. } | Op::Remove { key, .. }
                | Op::Contains { key, .. } | Op::MapGet { key, .. } | Op::MapSet { key, .. }
                | Op::MapDelete { key, .. } | Op::MapAdd { key, .. }
                | Op::MapGetCounter { key, .. } | Op::CompareAndSet { key, .. }
                | Op::Expire { key, .. } | Op::Len { key, .. } | Op::ReadAll { key, .. }
                | Op::Lock { key, .. } | Op::Unlock { key, .. } => *key = k,
            }
            op
        };
        let local = LocalStore::new();
        let mut remote = StoreConnector::new(server_addr()).open().unwrap();
        for batch in &batches {
            let batch: Vec<Op> = batch.iter().map(rename).collect();
            let mut want: Vec<Reply> = Vec::new();
            local.execute(&batch, &mut want);
            let mut got = Vec::new();
            remote.execute(&batch, &mut got).unwrap();
            prop_assert_eq!(&got, &want, "batch {:?}", batch);
        }
    }
}
