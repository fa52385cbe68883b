//! Fenced batches (`Backend::execute_fenced`) on a real redis-server and a real 3-node Redis
//! Cluster: a batch whose fence holds answers as `execute` does; once the fence's record
//! changes (another writer's compare-and-set) or is gone, the batch fails as `Fenced` and none
//! of its writes is in the store; a partition's objects, whatever their NF, share the fence's
//! hash slot; a server that lost the script loads it again.

mod common;

use flowstate_state::{
    Backend, BackendError, Connector, Fence, FencedBackend, Kind, Object, ObjectKey, Op, Owner,
    Reply,
};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

/// A stage number no other test (nor another run's, with its pid as the partition) uses.
fn stage() -> u32 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    9000 + NEXT.fetch_add(1, Ordering::Relaxed)
}

/// Partition `p` of `stage`: its ownership record, as a cluster instance's.
fn record(stage: u32, p: u32) -> ObjectKey {
    ObjectKey::partitioned(&Owner::new("cluster", stage, p), Kind::Value, "owner")
}

fn exec(b: &mut dyn Backend, ops: &[Op]) -> Vec<Reply> {
    let mut r = Vec::new();
    b.execute(ops, &mut r).expect("execute");
    assert_eq!(r.len(), ops.len());
    r
}

fn fenced(b: &mut dyn Backend, fence: &Fence, ops: &[Op]) -> Result<Vec<Reply>, BackendError> {
    let mut r = Vec::new();
    b.execute_fenced(fence, ops, &mut r)?;
    assert_eq!(r.len(), ops.len());
    Ok(r)
}

/// Sets the record with a compare-and-set from `from`, as an instance claims a partition.
fn claim(b: &mut dyn Backend, key: &ObjectKey, from: Option<&[u8]>, to: Option<&[u8]>) {
    let cas = Op::CompareAndSet {
        key: key.clone(),
        expected: from.map(<[u8]>::to_vec),
        new: to.map(<[u8]>::to_vec),
    };
    assert_eq!(exec(b, &[cas]), vec![Reply::Bool(true)], "claim {key}");
}

/// The objects of one partition (two NFs) that [`every_kind`] works on.
struct Objects {
    value: ObjectKey,
    counter: ObjectKey,
    list: ObjectKey,
    set: ObjectKey,
    map: ObjectKey,
    counter_map: ObjectKey,
}

impl Objects {
    fn new(stage: u32, p: u32) -> Objects {
        let nat = Owner::new("nat", stage, p);
        let fw = Owner::new("firewall", stage, p);
        Objects {
            value: ObjectKey::partitioned(&nat, Kind::Value, "v"),
            counter: ObjectKey::partitioned(&nat, Kind::Counter, "n"),
            list: ObjectKey::partitioned(&fw, Kind::List, "l"),
            set: ObjectKey::partitioned(&fw, Kind::Set, "s"),
            map: ObjectKey::partitioned(&nat, Kind::Map, "m"),
            counter_map: ObjectKey::partitioned(&fw, Kind::CounterMap, "c"),
        }
    }

    fn all(&self) -> [(&ObjectKey, Kind); 6] {
        [
            (&self.value, Kind::Value),
            (&self.counter, Kind::Counter),
            (&self.list, Kind::List),
            (&self.set, Kind::Set),
            (&self.map, Kind::Map),
            (&self.counter_map, Kind::CounterMap),
        ]
    }

    /// Every object read whole.
    fn read(&self, b: &mut dyn Backend) -> Vec<Reply> {
        let ops: Vec<Op> = self
            .all()
            .into_iter()
            .map(|(key, kind)| Op::ReadAll {
                key: key.clone(),
                kind,
            })
            .collect();
        exec(b, &ops)
    }

    fn delete(&self, b: &mut dyn Backend) {
        let ops: Vec<Op> = self
            .all()
            .into_iter()
            .map(|(key, _)| Op::Delete { key: key.clone() })
            .collect();
        exec(b, &ops);
    }
}

/// One batch with every kind of operation (reads, writes, scripts, an error), the same on any
/// partition's objects.
fn every_kind(o: &Objects) -> Vec<Op> {
    let f = |s: &str| s.as_bytes().to_vec();
    vec![
        Op::Get {
            key: o.value.clone(),
        },
        Op::Set {
            key: o.value.clone(),
            value: f("one"),
        },
        Op::CompareAndSet {
            key: o.value.clone(),
            expected: Some(f("one")),
            new: Some(f("two")),
        },
        Op::Get {
            key: o.value.clone(),
        },
        Op::SetCounter {
            key: o.counter.clone(),
            value: i64::MIN,
        },
        Op::Add {
            key: o.counter.clone(),
            delta: 1,
        },
        Op::Add {
            key: o.counter.clone(),
            delta: -1,
        },
        Op::GetCounter {
            key: o.counter.clone(),
        },
        Op::Push {
            key: o.list.clone(),
            item: f("a"),
        },
        Op::Push {
            key: o.list.clone(),
            item: f("b"),
        },
        Op::Pop {
            key: o.list.clone(),
        },
        Op::Len {
            key: o.list.clone(),
            kind: Kind::List,
        },
        Op::Insert {
            key: o.set.clone(),
            member: f("x"),
        },
        Op::Insert {
            key: o.set.clone(),
            member: f("x"),
        },
        Op::Contains {
            key: o.set.clone(),
            member: f("x"),
        },
        Op::MapSet {
            key: o.map.clone(),
            field: f("k"),
            value: f("v"),
        },
        Op::MapGet {
            key: o.map.clone(),
            field: f("k"),
        },
        Op::MapGet {
            key: o.map.clone(),
            field: f("none"),
        },
        Op::Expire {
            key: o.map.clone(),
            field: Some(f("k")),
            ttl: Duration::from_secs(60),
        },
        Op::MapAdd {
            key: o.counter_map.clone(),
            field: f("hits"),
            delta: 1 << 60,
        },
        Op::MapAdd {
            key: o.counter_map.clone(),
            field: f("hits"),
            delta: 3,
        },
        Op::MapGetCounter {
            key: o.counter_map.clone(),
            field: f("hits"),
        },
        // Errors: a value is not a list, a map is not a counter; the rest runs.
        Op::Push {
            key: o.value.clone(),
            item: f("z"),
        },
        Op::Add {
            key: o.map.clone(),
            delta: 1,
        },
        Op::Len {
            key: o.value.clone(),
            kind: Kind::Value,
        },
        Op::Lock {
            key: o.set.clone(),
            owner: 7,
            lease: Duration::from_secs(60),
        },
        Op::Lock {
            key: o.set.clone(),
            owner: 8,
            lease: Duration::from_secs(60),
        },
        Op::Unlock {
            key: o.set.clone(),
            owner: 7,
        },
        Op::Expire {
            key: o.list.clone(),
            field: None,
            ttl: Duration::from_secs(60),
        },
        Op::ReadAll {
            key: o.map.clone(),
            kind: Kind::Map,
        },
        Op::ReadAll {
            key: o.counter_map.clone(),
            kind: Kind::CounterMap,
        },
        Op::ReadAll {
            key: o.set.clone(),
            kind: Kind::Set,
        },
        Op::Delete {
            key: o.list.clone(),
        },
    ]
}

/// A fenced batch of every kind of operation answers what `execute` answers for the same batch
/// on another partition's objects, and its writes are in the store.
fn same_replies_as_execute(c: &dyn Connector) {
    let pid = std::process::id();
    let (s, t) = (stage(), stage());
    let mut b = c.connect().expect("connect");
    let fence = Fence {
        key: record(s, pid),
        value: b"\x00\x00\x00\x01\x00\x00\x00\x07".to_vec(),
        batch: 0,
    };
    claim(b.as_mut(), &fence.key, None, Some(&fence.value));
    let (here, there) = (Objects::new(s, pid), Objects::new(t, pid));
    let want = exec(b.as_mut(), &every_kind(&there));
    let got = fenced(b.as_mut(), &fence, &every_kind(&here)).expect("the fence holds");
    // The same, errors naming their own keys.
    let want = format!("{want:?}").replace(&format!("@{t}@"), &format!("@{s}@"));
    assert_eq!(format!("{got:?}"), want);
    // What a plain read finds is the same on both.
    let (a, z) = (here.read(b.as_mut()), there.read(b.as_mut()));
    assert_eq!(a, z);
    assert!(
        a.iter().any(|r| matches!(r, Reply::Object(Some(_)))),
        "{a:?}"
    );
    here.delete(b.as_mut());
    there.delete(b.as_mut());
    exec(b.as_mut(), &[Op::Delete { key: fence.key }]);
}

#[test]
fn redis_fenced_batch_answers_as_execute() {
    let Some(c) = common::redis() else { return };
    assert!(c.fences());
    same_replies_as_execute(&c);
}

#[test]
fn redis_cluster_fenced_batch_answers_as_execute() {
    let Some(c) = common::cluster() else { return };
    assert!(c.fences());
    same_replies_as_execute(&c);
}

/// The writes of a cut-off writer: one of each kind on its partition, and one on a shared
/// object.
fn writes(o: &Objects, shared: &ObjectKey) -> Vec<Op> {
    let f = |s: &str| s.as_bytes().to_vec();
    vec![
        Op::Set {
            key: o.value.clone(),
            value: f("late"),
        },
        Op::Add {
            key: o.counter.clone(),
            delta: 100,
        },
        Op::Push {
            key: o.list.clone(),
            item: f("late"),
        },
        Op::Insert {
            key: o.set.clone(),
            member: f("late"),
        },
        Op::MapSet {
            key: o.map.clone(),
            field: f("late"),
            value: f("late"),
        },
        Op::MapAdd {
            key: o.counter_map.clone(),
            field: f("late"),
            delta: 100,
        },
        Op::Add {
            key: shared.clone(),
            delta: 100,
        },
    ]
}

/// Once another writer took the record (compare-and-set), the first writer's batches are
/// refused whole; so are they when the record is gone. Its reads are not fenced.
fn refused_once_the_record_moves(c: &dyn Connector) {
    let pid = std::process::id();
    let s = stage();
    let key = record(s, pid);
    let (mine, theirs) = (
        b"\x00\x00\x00\x01\x00\x00\x00\x01",
        b"\x00\x00\x00\x02\x00\x00\x00\x02",
    );
    let o = Objects::new(s, pid);
    let shared = ObjectKey::shared(&format!("fenced-{pid}-{s}"), Kind::Counter, "packets");
    let mut admin = c.connect().expect("connect");
    claim(admin.as_mut(), &key, None, Some(mine));
    let mut b = FencedBackend::new(
        c.connect().expect("connect"),
        Fence {
            key: key.clone(),
            value: mine.to_vec(),
            batch: 0,
        },
    );
    let batch = writes(&o, &shared);
    let r = exec(&mut b, &batch);
    assert_eq!(r[1], Reply::Int(100));
    assert_eq!(r[6], Reply::Int(100));
    let before = o.read(admin.as_mut());
    let shared_now = |a: &mut dyn Backend| {
        exec(
            a,
            &[Op::GetCounter {
                key: shared.clone(),
            }],
        )
    };
    assert_eq!(shared_now(admin.as_mut()), vec![Reply::Int(100)]);

    // Another writer takes the partition over.
    claim(admin.as_mut(), &key, Some(mine), Some(theirs));
    let mut r = Vec::new();
    match b.execute(&batch, &mut r) {
        Err(BackendError::Fenced { backend, key: k }) => {
            assert_eq!(backend, c.name());
            assert_eq!(k, key.to_string());
        }
        other => panic!("expected Fenced, got {other:?}"),
    }
    assert!(r.is_empty(), "{r:?}");
    assert_eq!(o.read(admin.as_mut()), before, "a refused batch wrote");
    assert_eq!(shared_now(admin.as_mut()), vec![Reply::Int(100)]);
    // Reads are not fenced.
    assert_eq!(
        exec(
            &mut b,
            &[Op::GetCounter {
                key: o.counter.clone()
            }]
        ),
        vec![Reply::Int(100)]
    );

    // No record at all: refused too.
    claim(admin.as_mut(), &key, Some(theirs), None);
    let mut r = Vec::new();
    let e = b
        .execute_fenced(
            &Fence {
                key: key.clone(),
                value: mine.to_vec(),
                batch: 0,
            },
            &batch,
            &mut r,
        )
        .unwrap_err();
    assert!(matches!(e, BackendError::Fenced { .. }), "{e}");
    assert!(r.is_empty(), "{r:?}");
    assert_eq!(o.read(admin.as_mut()), before, "a refused batch wrote");
    assert_eq!(shared_now(admin.as_mut()), vec![Reply::Int(100)]);

    o.delete(admin.as_mut());
    exec(admin.as_mut(), &[Op::Delete { key: shared }]);
}

#[test]
fn redis_refuses_a_batch_once_the_record_moves() {
    let Some(c) = common::redis() else { return };
    refused_once_the_record_moves(&c);
}

#[test]
fn redis_cluster_refuses_a_batch_once_the_record_moves() {
    let Some(c) = common::cluster() else { return };
    refused_once_the_record_moves(&c);
}

/// A fenced batch over many objects of one partition, of several NFs, runs in one script on
/// the cluster (one hash slot); objects elsewhere (shared, another partition's) in the same
/// batch are written too, after the check.
#[test]
fn redis_cluster_fences_many_objects_of_one_partition() {
    let Some(c) = common::cluster() else { return };
    let pid = std::process::id();
    let s = stage();
    let fence = Fence {
        key: record(s, pid),
        value: b"owner-1".to_vec(),
        batch: 0,
    };
    let mut b = c.connect().expect("connect");
    claim(b.as_mut(), &fence.key, None, Some(&fence.value));
    let mut keys: Vec<ObjectKey> = (0..300)
        .map(|i| {
            let nf = ["nat", "firewall", "lb", "counter"][i % 4];
            ObjectKey::partitioned(&Owner::new(nf, s, pid), Kind::Counter, &format!("c{i}"))
        })
        .collect();
    let elsewhere = [
        ObjectKey::shared(&format!("fenced-{pid}-{s}"), Kind::Counter, "total"),
        ObjectKey::partitioned(&Owner::new("nat", s, pid + 1), Kind::Counter, "other"),
    ];
    keys.extend(elsewhere.iter().cloned());
    let adds: Vec<Op> = keys
        .iter()
        .enumerate()
        .map(|(i, key)| Op::Add {
            key: key.clone(),
            delta: i as i64 + 1,
        })
        .collect();
    let want: Vec<Reply> = (1..=keys.len() as i64).map(Reply::Int).collect();
    assert_eq!(
        fenced(b.as_mut(), &fence, &adds).expect("fence holds"),
        want
    );
    let reads: Vec<Op> = keys
        .iter()
        .map(|key| Op::GetCounter { key: key.clone() })
        .collect();
    assert_eq!(exec(b.as_mut(), &reads), want);
    // Refused whole, the objects elsewhere too.
    claim(b.as_mut(), &fence.key, Some(&fence.value), Some(b"owner-2"));
    let refused = fenced(b.as_mut(), &fence, &adds);
    assert!(
        matches!(refused, Err(BackendError::Fenced { .. })),
        "{refused:?}"
    );
    assert_eq!(exec(b.as_mut(), &reads), want);
    let mut del: Vec<Op> = keys.into_iter().map(|key| Op::Delete { key }).collect();
    del.push(Op::Delete { key: fence.key });
    exec(b.as_mut(), &del);
}

/// A server that lost its scripts (`SCRIPT FLUSH`, as after a restart) gets the fenced
/// batch's script again: the batch runs once.
fn loads_the_script_again(c: &dyn Connector, ports: &[u16]) {
    let pid = std::process::id();
    let s = stage();
    let fence = Fence {
        key: record(s, pid),
        value: b"owner".to_vec(),
        batch: 0,
    };
    let n = ObjectKey::partitioned(&Owner::new("nat", s, pid), Kind::Counter, "n");
    let add = [Op::Add {
        key: n.clone(),
        delta: 2,
    }];
    let mut b = c.connect().expect("connect");
    claim(b.as_mut(), &fence.key, None, Some(&fence.value));
    for want in [2, 4] {
        for port in ports {
            let mut conn = redis::Client::open(format!("redis://127.0.0.1:{port}"))
                .and_then(|c| c.get_connection())
                .expect("a connection of the test's own");
            let _: () = redis::cmd("SCRIPT")
                .arg("FLUSH")
                .query(&mut conn)
                .expect("SCRIPT FLUSH");
        }
        assert_eq!(
            fenced(b.as_mut(), &fence, &add).expect("fence holds"),
            vec![Reply::Int(want)]
        );
    }
    exec(
        b.as_mut(),
        &[Op::Delete { key: n }, Op::Delete { key: fence.key }],
    );
}

#[test]
fn redis_loads_the_script_again() {
    // A server of this test's own: flushing the scripts of a shared one would not hurt others
    // (they load them again too), but this one needs no care.
    let Some(server) = common::OwnServer::start() else {
        return;
    };
    let c =
        flowstate_driver_redis::RedisConnector::new(&format!("redis://127.0.0.1:{}", server.port))
            .expect("url");
    loads_the_script_again(&c, &[server.port]);
}

#[test]
fn redis_cluster_loads_the_script_again() {
    let Some(c) = common::cluster() else { return };
    let ports: Vec<u16> = common::cluster_nodes()
        .iter()
        .filter_map(|n| n.rsplit(':').next()?.trim_matches('/').parse().ok())
        .collect();
    loads_the_script_again(&c, &ports);
}

/// A refused batch leaves a map as it was: no field set, no field deadline, not deleted.
#[test]
fn a_refused_batch_leaves_maps_and_their_deadlines_alone() {
    let Some(c) = common::redis() else { return };
    let pid = std::process::id();
    let s = stage();
    let key = record(s, pid);
    let m = ObjectKey::partitioned(&Owner::new("nat", s, pid), Kind::Map, "m");
    let mut b = c.connect().expect("connect");
    claim(b.as_mut(), &key, None, Some(b"a"));
    let set = |field: &str| Op::MapSet {
        key: m.clone(),
        field: field.as_bytes().to_vec(),
        value: b"v".to_vec(),
    };
    let fence = Fence {
        key: key.clone(),
        value: b"a".to_vec(),
        batch: 0,
    };
    fenced(b.as_mut(), &fence, &[set("kept")]).expect("fence holds");
    claim(b.as_mut(), &key, Some(b"a"), Some(b"b"));
    let late = [
        set("late"),
        Op::Expire {
            key: m.clone(),
            field: Some(b"kept".to_vec()),
            ttl: Duration::from_millis(1),
        },
        Op::Delete { key: m.clone() },
    ];
    assert!(matches!(
        fenced(b.as_mut(), &fence, &late),
        Err(BackendError::Fenced { .. })
    ));
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(
        exec(
            b.as_mut(),
            &[Op::ReadAll {
                key: m.clone(),
                kind: Kind::Map
            }]
        ),
        vec![Reply::Object(Some(Object::Map(vec![(
            b"kept".to_vec(),
            b"v".to_vec()
        )])))]
    );
    exec(b.as_mut(), &[Op::Delete { key: m }, Op::Delete { key }]);
}

/// A numbered fenced batch (`Fence::batch`) sent again (its answer lost) does not run again:
/// its partition's counter and a shared counter (another hash slot on the cluster) count it
/// once; what it left sent again without the fence (`execute_rest`) runs once too, also after
/// the fence moved on; the next number runs.
fn numbered_batches_run_once(c: &dyn Connector) {
    let pid = std::process::id();
    let s = stage();
    let mut fence = Fence {
        key: record(s, pid),
        value: b"owner-1".to_vec(),
        batch: 41,
    };
    let mut b = c.connect().expect("connect");
    claim(b.as_mut(), &fence.key, None, Some(&fence.value));
    let own = ObjectKey::partitioned(&Owner::new("nat", s, pid), Kind::Counter, "n");
    let shared = ObjectKey::shared(&format!("numbered{s}-{pid}"), Kind::Counter, "n");
    let add = |key: &ObjectKey| Op::Add {
        key: key.clone(),
        delta: 1,
    };
    let batch = [add(&own), add(&shared)];
    let get = |b: &mut dyn Backend, key: &ObjectKey| {
        exec(
            b,
            &[Op::Add {
                key: key.clone(),
                delta: 0,
            }],
        )
    };
    for _ in 0..3 {
        fenced(b.as_mut(), &fence, &batch).expect("fence holds");
    }
    assert_eq!(get(b.as_mut(), &own), vec![Reply::Int(1)]);
    assert_eq!(get(b.as_mut(), &shared), vec![Reply::Int(1)]);
    fence.batch = 42;
    fenced(b.as_mut(), &fence, &batch).expect("fence holds");
    // What batch 42 left, sent again after another writer took the partition.
    claim(b.as_mut(), &fence.key, Some(b"owner-1"), Some(b"owner-2"));
    let mut r = Vec::new();
    b.execute_rest(&fence, &[add(&shared)], &mut r)
        .expect("rest");
    fence.batch = 43;
    b.execute_rest(&fence, &[add(&shared)], &mut r)
        .expect("rest");
    assert_eq!(get(b.as_mut(), &own), vec![Reply::Int(2)]);
    assert_eq!(get(b.as_mut(), &shared), vec![Reply::Int(3)]);
    fence.batch = 44;
    assert!(matches!(
        fenced(b.as_mut(), &fence, &batch),
        Err(BackendError::Fenced { .. })
    ));
    exec(
        b.as_mut(),
        &[
            Op::Delete { key: fence.key },
            Op::Delete { key: own },
            Op::Delete { key: shared },
        ],
    );
}

#[test]
fn redis_runs_a_numbered_batch_once() {
    let Some(c) = common::redis() else { return };
    numbered_batches_run_once(&c);
}

#[test]
fn redis_cluster_runs_a_numbered_batch_and_its_rest_once() {
    let Some(c) = common::cluster() else { return };
    numbered_batches_run_once(&c);
}

/// A partition taken again under the same ownership record (a claim sent again whose first
/// answer was lost) writes through a new state thread: its batches' numbers are not its
/// predecessor's, so none of them is mistaken for one that ran.
fn taken_again_under_the_same_record(c: &dyn Connector) {
    use flowstate_state::{Access, Partition, Scope, StateConfig};
    let pid = std::process::id();
    let s = stage();
    let fence = Fence {
        key: record(s, pid),
        value: b"owner-1".to_vec(),
        batch: 0,
    };
    let mut b = c.connect().expect("connect");
    claim(b.as_mut(), &fence.key, None, Some(&fence.value));
    let config = StateConfig {
        stage: s,
        partition: pid,
        ..StateConfig::default()
    };
    let key = ObjectKey::partitioned(&Owner::new("nat", s, pid), Kind::Counter, "again");
    for round in 1..=2 {
        let conn = FencedBackend::new(c.connect().expect("connect"), fence.clone());
        let mut p = Partition::with_backend(Box::new(conn), c, config.clone()).expect("partition");
        let n = p
            .declare("nat")
            .counter("again", Scope::PerFlow, Access::WriteMostly)
            .expect("counter");
        // One batch each time: the second, numbered as the first was, would meet its mark.
        n.add_nowait(1);
        p.flush_all(round).expect("flush");
        let read = Op::GetCounter { key: key.clone() };
        assert_eq!(exec(b.as_mut(), &[read]), vec![Reply::Int(round as i64)]);
    }
    exec(
        b.as_mut(),
        &[Op::Delete { key: fence.key }, Op::Delete { key }],
    );
}

#[test]
fn redis_runs_the_batches_of_a_partition_taken_again() {
    let Some(c) = common::redis() else { return };
    taken_again_under_the_same_record(&c);
}

#[test]
fn redis_cluster_runs_the_batches_of_a_partition_taken_again() {
    let Some(c) = common::cluster() else { return };
    taken_again_under_the_same_record(&c);
}
