//! What the Cassandra driver promises beyond the conformance suite (see the crate docs): kinds
//! fixed by the key, lists that keep their time to live, counters that survive being set and
//! deleted, and big batches. Needs `scripts/cassandra start`; skipped without it except in CI.

use flowstate_driver_cassandra::{CassandraConfig, CassandraConnector, DEFAULT_NODE};
use flowstate_state::{Backend, Connector, Kind, Object, ObjectKey, Op, OpError, Owner, Reply};
use std::time::Duration;

fn connector() -> Option<CassandraConnector> {
    match CassandraConnector::new(CassandraConfig::node(DEFAULT_NODE)) {
        Ok(c) => Some(c),
        Err(e) if std::env::var("CI").is_ok_and(|v| v == "true") => {
            panic!("CI=true but no Cassandra at {DEFAULT_NODE} ({e}); scripts/test starts one")
        }
        Err(e) => {
            eprintln!("skipping: {e} (scripts/cassandra start)");
            None
        }
    }
}

fn run(b: &mut Box<dyn Backend>, ops: Vec<Op>) -> Vec<Reply> {
    let mut r = Vec::new();
    b.execute(&ops, &mut r).expect("batch");
    r
}

#[test]
fn driver_promises_on_real_cassandra() {
    let Some(c) = connector() else { return };
    let nf = format!("layout-{}", std::process::id());
    let mut b = c.connect().unwrap();
    let key = |kind, id: &str| ObjectKey::partitioned(&Owner::new(&nf, 0, 0), kind, id);

    // A key names its kind: another kind reads "absent" where nothing is, cannot be written,
    // and is WrongKind where the key's object exists.
    let l = key(Kind::List, "l");
    let r = run(
        &mut b,
        vec![
            Op::Get { key: l.clone() },
            Op::Set {
                key: l.clone(),
                value: b"x".to_vec(),
            },
            Op::Push {
                key: l.clone(),
                item: b"a".to_vec(),
            },
            Op::Get { key: l.clone() },
        ],
    );
    assert_eq!(r[0], Reply::Value(None));
    assert!(
        matches!(&r[1], Reply::Error(OpError::Refused(m)) if m.contains("List")),
        "{r:?}"
    );
    assert_eq!(r[2], Reply::Len(1));
    assert_eq!(
        r[3],
        Reply::Error(OpError::WrongKind {
            key: l.to_string(),
            wanted: "Value",
            found: "List"
        })
    );

    // Items pushed after an expire die with their list.
    let t = key(Kind::List, "t");
    run(
        &mut b,
        vec![
            Op::Push {
                key: t.clone(),
                item: b"1".to_vec(),
            },
            Op::Expire {
                key: t.clone(),
                field: None,
                ttl: Duration::from_secs(1),
            },
            Op::Push {
                key: t.clone(),
                item: b"2".to_vec(),
            },
        ],
    );
    std::thread::sleep(Duration::from_millis(2_500));
    assert_eq!(
        run(
            &mut b,
            vec![Op::ReadAll {
                key: t.clone(),
                kind: Kind::List
            }]
        ),
        [Reply::Object(None)]
    );

    // Counters: set, delete and add again, and a long run of adds in one batch.
    let n = key(Kind::Counter, "n");
    let mut ops = vec![
        Op::Add {
            key: n.clone(),
            delta: 7,
        },
        Op::SetCounter {
            key: n.clone(),
            value: -3,
        },
        Op::Add {
            key: n.clone(),
            delta: 1,
        },
        Op::Delete { key: n.clone() },
    ];
    ops.extend((0..500).map(|_| Op::Add {
        key: n.clone(),
        delta: 2,
    }));
    let r = run(&mut b, ops);
    assert_eq!(
        &r[..4],
        [
            Reply::Int(7),
            Reply::Done,
            Reply::Int(-2),
            Reply::Bool(true)
        ]
    );
    assert_eq!(
        r[4..],
        (1..=500).map(|i| Reply::Int(2 * i)).collect::<Vec<_>>()
    );

    // A flush of 3,000 map fields and 3,000 pushes (several single-partition batches each).
    let m = key(Kind::Map, "m");
    let q = key(Kind::List, "q");
    let mut ops: Vec<Op> = (0u32..3000)
        .map(|i| Op::MapSet {
            key: m.clone(),
            field: i.to_be_bytes().to_vec(),
            value: vec![1; 700],
        })
        .collect();
    ops.extend((0u32..3000).map(|i| Op::Push {
        key: q.clone(),
        item: i.to_be_bytes().to_vec(),
    }));
    let r = run(&mut b, ops);
    assert!(r[..3000].iter().all(|x| *x == Reply::Done));
    assert_eq!(r[3000..], (1..=3000).map(Reply::Len).collect::<Vec<_>>());
    let r = run(
        &mut b,
        vec![
            Op::Len {
                key: m.clone(),
                kind: Kind::Map,
            },
            Op::ReadAll {
                key: q.clone(),
                kind: Kind::List,
            },
        ],
    );
    assert_eq!(r[0], Reply::Len(3000));
    assert_eq!(
        r[1],
        Reply::Object(Some(Object::List(
            (0u32..3000).map(|i| i.to_be_bytes().to_vec()).collect()
        )))
    );

    drop(b);
    c.drop_nfs(|x| x == nf).unwrap();
}
