//! The cluster backend follows `ASK` and `MOVED` while one of its slots migrates between
//! masters under it (Redis Cluster specification, "Redirection and resharding"), on the plain
//! cluster and on the TLS + ACL one (the nodes it is redirected to are opened with the seeds'
//! TLS settings and user).

mod common;

use flowstate_state::{Connector, Kind, Object, ObjectKey, Op, Owner, Reply};
use redis::{Connection, Value};

/// The cluster under test: its ports, and the TLS user's password when it is the TLS one.
struct Cluster {
    ports: Vec<u16>,
    password: Option<String>,
}

impl Cluster {
    fn plain() -> Cluster {
        let ports = common::cluster_nodes()
            .iter()
            .map(|n| {
                n.rsplit(':')
                    .next()
                    .and_then(|p| p.trim_matches('/').parse().ok())
                    .unwrap_or_else(|| panic!("no port in {n}"))
            })
            .collect();
        Cluster {
            ports,
            password: None,
        }
    }

    fn tls() -> Cluster {
        let first: u16 = std::env::var("REDIS_CLUSTER_TLS_PORT")
            .ok()
            .and_then(|p| p.parse().ok())
            .unwrap_or(7101);
        let password = std::fs::read_to_string(common::tls_dir().join("password"))
            .expect("the TLS user's password");
        Cluster {
            ports: (first..first + 3).collect(),
            password: Some(password.trim().to_owned()),
        }
    }

    /// A connection of the test's own to the node on `port`.
    fn node(&self, port: u16) -> Connection {
        let client = match &self.password {
            None => redis::Client::open(format!("redis://127.0.0.1:{port}")),
            Some(pw) => redis::Client::build_with_tls(
                format!("rediss://flowstate:{pw}@127.0.0.1:{port}"),
                redis::TlsCertificates {
                    client_tls: None,
                    root_cert: Some(
                        std::fs::read(common::tls_dir().join("ca.pem")).expect("ca.pem"),
                    ),
                },
            ),
        };
        client
            .and_then(|c| c.get_connection())
            .unwrap_or_else(|e| panic!("node {port}: {e}"))
    }
}

fn id(c: &mut Connection) -> String {
    redis::cmd("CLUSTER")
        .arg("MYID")
        .query(c)
        .expect("CLUSTER MYID")
}

/// The port of the master serving `slot`.
fn owner(cl: &Cluster, slot: i64) -> u16 {
    let mut c = cl.node(cl.ports[0]);
    let v: Value = redis::cmd("CLUSTER")
        .arg("SLOTS")
        .query(&mut c)
        .expect("CLUSTER SLOTS");
    let Value::Array(ranges) = v else {
        panic!("CLUSTER SLOTS: {v:?}")
    };
    for r in ranges {
        let Value::Array(r) = r else { continue };
        if let (Value::Int(a), Value::Int(b), Value::Array(m)) = (&r[0], &r[1], &r[2]) {
            if (*a..=*b).contains(&slot) {
                if let Value::Int(p) = m[1] {
                    return u16::try_from(p).expect("port");
                }
            }
        }
    }
    panic!("slot {slot} is served by no node")
}

fn run(b: &mut Box<dyn flowstate_state::Backend>, ops: &[Op]) -> Vec<Reply> {
    let mut r = Vec::new();
    b.execute(ops, &mut r).expect("execute");
    r
}

/// Moves every key of `slot` from `from` to `to`, in two halves: first `first` only (the slot
/// is then half-migrated and the source answers ASK for it), then the rest after `between` ran.
fn migrate(cl: &Cluster, slot: i64, from: u16, to: u16, first: &[u8], between: impl FnOnce()) {
    let (mut src, mut dst) = (cl.node(from), cl.node(to));
    let (src_id, dst_id) = (id(&mut src), id(&mut dst));
    let setslot = |c: &mut Connection, how: &str, id: &str| {
        let _: () = redis::cmd("CLUSTER")
            .arg("SETSLOT")
            .arg(slot)
            .arg(how)
            .arg(id)
            .query(c)
            .unwrap_or_else(|e| panic!("SETSLOT {how}: {e}"));
    };
    setslot(&mut dst, "IMPORTING", &src_id);
    setslot(&mut src, "MIGRATING", &dst_id);
    let mv = |src: &mut Connection, key: &[u8]| {
        let mut c = redis::cmd("MIGRATE");
        c.arg("127.0.0.1").arg(to).arg(key).arg(0).arg(5000);
        if let Some(pw) = &cl.password {
            // The target's default user is disabled: the source logs in as the ACL user.
            c.arg("AUTH2").arg("flowstate").arg(pw);
        }
        let _: Value = c.query(src).unwrap_or_else(|e| panic!("MIGRATE: {e}"));
    };
    mv(&mut src, first);
    between();
    loop {
        let keys: Vec<Vec<u8>> = redis::cmd("CLUSTER")
            .arg("GETKEYSINSLOT")
            .arg(slot)
            .arg(100)
            .query(&mut src)
            .expect("GETKEYSINSLOT");
        if keys.is_empty() {
            break;
        }
        for k in keys {
            mv(&mut src, &k);
        }
    }
    for &p in &cl.ports {
        setslot(&mut cl.node(p), "NODE", &dst_id);
    }
}

#[test]
fn follows_ask_and_moved_during_a_slot_migration() {
    let Some(connector) = common::cluster() else {
        return;
    };
    follow(&connector, &Cluster::plain());
}

#[test]
fn follows_ask_and_moved_during_a_slot_migration_over_tls() {
    let Some(connector) = common::cluster_tls() else {
        return;
    };
    follow(&connector, &Cluster::tls());
}

fn follow(connector: &flowstate_driver_redis::RedisClusterConnector, cl: &Cluster) {
    let ports = &cl.ports;
    let nf = format!("redirect-{}", std::process::id());
    // A partition of its own: the slot moved holds the keys of partition `{I@C}`.
    let (i, c) = (8000, std::process::id());
    let o = Owner::new(&nf, i, c);
    let v = ObjectKey::partitioned(&o, Kind::Value, "v");
    let n = ObjectKey::partitioned(&o, Kind::Counter, "n");
    let m = ObjectKey::partitioned(&o, Kind::Map, "m");
    let physical = format!("{{{i}@{c}}}@{nf}@Value@v");
    let slot: i64 = redis::cmd("CLUSTER")
        .arg("KEYSLOT")
        .arg(&physical)
        .query(&mut cl.node(ports[0]))
        .expect("KEYSLOT");
    let from = owner(cl, slot);
    let to = *ports.iter().find(|&&p| p != from).expect("a second master");

    let mut b = connector.connect().expect("connect");
    let write = vec![
        Op::Set {
            key: v.clone(),
            value: b"one".to_vec(),
        },
        Op::Add {
            key: n.clone(),
            delta: 5,
        },
        Op::MapSet {
            key: m.clone(),
            field: b"f".to_vec(),
            value: b"x".to_vec(),
        },
    ];
    assert_eq!(
        run(&mut b, &write),
        vec![Reply::Done, Reply::Int(5), Reply::Done]
    );
    let read = || {
        vec![
            Op::Get { key: v.clone() },
            Op::GetCounter { key: n.clone() },
            Op::ReadAll {
                key: m.clone(),
                kind: Kind::Map,
            },
        ]
    };
    let map = Reply::Object(Some(Object::Map(vec![(b"f".to_vec(), b"x".to_vec())])));

    // Half-migrated: the value is on the target (ASK), the counter and map still on the source.
    // A map operation (a two-key script) meanwhile waits for the migration to end
    // (TRYAGAIN); it runs on its own connection while this thread finishes the migration.
    let waiting = std::thread::scope(|scope| {
        let mut waiter = None;
        migrate(cl, slot, from, to, physical.as_bytes(), || {
            let got = run(&mut b, &read()[..2]);
            assert_eq!(
                got,
                vec![Reply::Value(Some(b"one".to_vec())), Reply::Int(5)]
            );
            // Writes during the migration land where the slot's keys are.
            assert_eq!(
                run(
                    &mut b,
                    &[Op::Add {
                        key: n.clone(),
                        delta: 1
                    }]
                ),
                vec![Reply::Int(6)]
            );
            let m = m.clone();
            waiter = Some(scope.spawn(move || {
                let mut c = connector.connect().expect("connect");
                run(
                    &mut c,
                    &[Op::MapGet {
                        key: m,
                        field: b"f".to_vec(),
                    }],
                )
            }));
        });
        waiter.map(|w| w.join().expect("map reader"))
    });
    assert_eq!(waiting, Some(vec![Reply::Value(Some(b"x".to_vec()))]));
    // Done: the slot is the target's; the driver's map is stale and it gets MOVED.
    let got = run(&mut b, &read());
    assert_eq!(
        got,
        vec![
            Reply::Value(Some(b"one".to_vec())),
            Reply::Int(6),
            map.clone()
        ]
    );
    assert_eq!(owner(cl, slot), to);

    // Move it back with a fresh key created meanwhile, and clean up.
    let w = ObjectKey::partitioned(&o, Kind::List, "w");
    assert_eq!(
        run(
            &mut b,
            &[Op::Push {
                key: w.clone(),
                item: b"i".to_vec()
            }]
        ),
        vec![Reply::Len(1)]
    );
    migrate(cl, slot, to, from, physical.as_bytes(), || {});
    let mut all = read();
    all.push(Op::Pop { key: w.clone() });
    let got = run(&mut b, &all);
    assert_eq!(
        got,
        vec![
            Reply::Value(Some(b"one".to_vec())),
            Reply::Int(6),
            map,
            Reply::Value(Some(b"i".to_vec()))
        ]
    );
    let del: Vec<Op> = [v, n, m, w]
        .into_iter()
        .map(|key| Op::Delete { key })
        .collect();
    run(&mut b, &del);
}
