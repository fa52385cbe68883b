//! The store's CHC extensions through the driver's own API, against a live server: clock
//! tags (CHC §5.3), ownership and handover (CHC §5.1), non-blocking updates (CHC §4.3),
//! idempotent retransmission, subscriptions (CHC §4.3) and expiry notifications to exactly
//! one subscriber (StatelessNF §4.1).

use flowstate_driver_store::{Pushed, Settings, StoreBackend, StoreConnector, Tagged, TaggedReply};
use flowstate_state::{Backend, Kind, Object, ObjectKey, Op, Owner, Reply};
use flowstate_store::{Config, Server};
use std::time::{Duration, Instant};

fn server() -> Server {
    Server::start(Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        shards: 2,
        ..Config::default()
    })
    .unwrap()
}

fn client(s: &Server) -> StoreBackend {
    StoreConnector::new(s.local_addr().to_string())
        .open()
        .unwrap()
}

fn tagged(op: Op, instance: Option<u32>, clock: Option<u64>) -> Tagged {
    Tagged {
        op,
        instance,
        clock,
    }
}

fn exec(b: &mut StoreBackend, ops: &[Op]) -> Vec<Reply> {
    let mut r = Vec::new();
    b.execute(ops, &mut r).unwrap();
    r
}

#[test]
fn clock_tagged_updates_from_one_instance_apply_once() {
    let s = server();
    let mut a = client(&s);
    let key = ObjectKey::shared("ext", Kind::Counter, "tagged");
    let add = |i, c| {
        tagged(
            Op::Add {
                key: key.clone(),
                delta: 10,
            },
            Some(i),
            Some(c),
        )
    };
    // The original and a straggler clone's replay of packet 5 (CHC §5.3), and another packet.
    let r = a
        .execute_tagged(&[add(1, 5), add(1, 5), add(1, 6)])
        .unwrap();
    assert_eq!(
        r,
        vec![
            TaggedReply::Reply(Reply::Int(10)),
            TaggedReply::Duplicate,
            TaggedReply::Reply(Reply::Int(20)),
        ]
    );
    // Another connection replaying the same packet is still recognised; another instance is
    // not a duplicate.
    let mut b = client(&s);
    let r = b.execute_tagged(&[add(1, 6), add(2, 6)]).unwrap();
    assert_eq!(
        r,
        vec![TaggedReply::Duplicate, TaggedReply::Reply(Reply::Int(30))]
    );
    s.stop();
}

#[test]
fn owned_objects_refuse_other_writers_until_handed_over() {
    let s = server();
    let mut a = client(&s);
    let key = ObjectKey::partitioned(&Owner::new("ext", 1, 0), Kind::Map, "flow");
    assert!(a.claim(&key, Kind::Map, 1).unwrap());
    assert!(!a.claim(&key, Kind::Map, 2).unwrap());
    let set = |v: &str| Op::MapSet {
        key: key.clone(),
        field: b"f".to_vec(),
        value: v.as_bytes().to_vec(),
    };
    let r = a
        .execute_tagged(&[
            tagged(set("one"), Some(1), None),
            tagged(set("two"), Some(2), None),
        ])
        .unwrap();
    assert_eq!(r[0], TaggedReply::Reply(Reply::Done));
    assert!(
        matches!(&r[1], TaggedReply::Reply(Reply::Error(e)) if e.to_string().contains("owned by instance 1"))
    );
    // Untagged writers are refused too; reads are not.
    let r = exec(
        &mut a,
        &[
            set("three"),
            Op::MapGet {
                key: key.clone(),
                field: b"f".to_vec(),
            },
        ],
    );
    assert!(matches!(r[0], Reply::Error(_)));
    assert_eq!(r[1], Reply::Value(Some(b"one".to_vec())));
    // The flow moves to instance 2 (CHC §5.1).
    assert!(a.handover(&key, 1, 2).unwrap());
    assert!(!a.handover(&key, 1, 2).unwrap());
    let r = a
        .execute_tagged(&[
            tagged(set("old"), Some(1), None),
            tagged(set("new"), Some(2), None),
        ])
        .unwrap();
    assert!(matches!(r[0], TaggedReply::Reply(Reply::Error(_))));
    assert_eq!(r[1], TaggedReply::Reply(Reply::Done));
    s.stop();
}

#[test]
fn non_blocking_updates_are_acknowledged_and_applied_in_order() {
    let s = server();
    let mut a = client(&s);
    let key = ObjectKey::shared("ext", Kind::List, "nowait");
    for i in 0..100u32 {
        a.send_nowait(&[tagged(
            Op::Push {
                key: key.clone(),
                item: i.to_le_bytes().to_vec(),
            },
            None,
            None,
        )])
        .unwrap();
    }
    // A read on the same connection sees every earlier update (CHC §4.3).
    let r = exec(
        &mut a,
        &[Op::Len {
            key: key.clone(),
            kind: Kind::List,
        }],
    );
    assert_eq!(r, vec![Reply::Len(100)]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while a.unacked() > 0 && Instant::now() < deadline {
        a.poll(Duration::from_millis(50)).unwrap();
    }
    assert_eq!(a.unacked(), 0);
    let r = exec(
        &mut a,
        &[Op::ReadAll {
            key: key.clone(),
            kind: Kind::List,
        }],
    );
    let want: Vec<Vec<u8>> = (0..100u32).map(|i| i.to_le_bytes().to_vec()).collect();
    assert_eq!(r, vec![Reply::Object(Some(Object::List(want)))]);
    s.stop();
}

#[test]
fn calls_wait_out_a_store_restart_and_nothing_is_lost() {
    // A store that goes away and comes back on the same address: the driver reconnects and
    // sends the unanswered batch again with the same op id.
    let dir = tempfile::tempdir().unwrap();
    let cfg = Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        data_dir: Some(dir.path().to_owned()),
        shards: 2,
        ..Config::default()
    };
    let s = Server::start(cfg.clone()).unwrap();
    let addr = s.local_addr();
    let mut a = StoreConnector::with_settings(Settings {
        addr: addr.to_string(),
        retry_for: Duration::from_secs(20),
        ..Settings::default()
    })
    .open()
    .unwrap();
    let key = ObjectKey::shared("ext", Kind::Counter, "once");
    assert_eq!(
        exec(
            &mut a,
            &[Op::Add {
                key: key.clone(),
                delta: 1
            }]
        ),
        vec![Reply::Int(1)]
    );
    s.stop();
    // Restart on the same port while the client retries.
    let restart = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        Server::start(Config {
            listen: addr,
            ..cfg
        })
        .unwrap()
    });
    let r = exec(
        &mut a,
        &[Op::Add {
            key: key.clone(),
            delta: 1,
        }],
    );
    assert_eq!(r, vec![Reply::Int(2)]);
    let s = restart.join().unwrap();
    assert_eq!(exec(&mut a, &[Op::GetCounter { key }]), vec![Reply::Int(2)]);
    s.stop();
}

#[test]
fn subscribers_get_new_values_pushed() {
    let s = server();
    let mut sub = client(&s);
    let mut writer = client(&s);
    let key = ObjectKey::shared("ext", Kind::Counter, "shared");
    sub.subscribe(&key, 7).unwrap();
    exec(
        &mut writer,
        &[Op::Add {
            key: key.clone(),
            delta: 5,
        }],
    );
    exec(
        &mut writer,
        &[Op::Add {
            key: key.clone(),
            delta: 1,
        }],
    );
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while got.len() < 2 && Instant::now() < deadline {
        got.extend(sub.poll(Duration::from_millis(50)).unwrap());
    }
    assert_eq!(
        got,
        vec![
            Pushed::Updated {
                key: key.to_string(),
                object: Some(Object::Counter(5))
            },
            Pushed::Updated {
                key: key.to_string(),
                object: Some(Object::Counter(6))
            },
        ]
    );
    // The subscriber's own updates are not pushed back to it; after unsubscribing nothing
    // comes.
    exec(
        &mut sub,
        &[Op::Add {
            key: key.clone(),
            delta: 1,
        }],
    );
    sub.unsubscribe(&key).unwrap();
    exec(&mut writer, &[Op::Delete { key: key.clone() }]);
    // A marker update on another subscribed key proves the connection is quiet otherwise.
    let marker = ObjectKey::shared("ext", Kind::Value, "marker");
    sub.subscribe(&marker, 7).unwrap();
    exec(
        &mut writer,
        &[Op::Set {
            key: marker.clone(),
            value: b"m".to_vec(),
        }],
    );
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while got.is_empty() && Instant::now() < deadline {
        got.extend(sub.poll(Duration::from_millis(50)).unwrap());
    }
    assert_eq!(
        got,
        vec![Pushed::Updated {
            key: marker.to_string(),
            object: Some(Object::Value(b"m".to_vec()))
        }]
    );
    s.stop();
}

#[test]
fn an_expiry_is_told_to_exactly_one_subscribed_instance() {
    let s = server();
    let mut subs: Vec<StoreBackend> = (0..3).map(|_| client(&s)).collect();
    let mut w = client(&s);
    let keys: Vec<ObjectKey> = (0..6)
        .map(|i| ObjectKey::shared("ext", Kind::Value, &format!("timer{i}")))
        .collect();
    for (i, sb) in subs.iter_mut().enumerate() {
        for k in &keys {
            sb.subscribe(k, i as u32).unwrap();
        }
    }
    let mut ops = Vec::new();
    for k in &keys {
        ops.push(Op::Set {
            key: k.clone(),
            value: b"t".to_vec(),
        });
        ops.push(Op::Expire {
            key: k.clone(),
            field: None,
            ttl: Duration::from_millis(100),
        });
    }
    exec(&mut w, &ops);
    // Every subscriber sees the sets as updates; then each expiry goes to one of them.
    let mut expired: Vec<(usize, String)> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while expired.len() < keys.len() && Instant::now() < deadline {
        for (i, sb) in subs.iter_mut().enumerate() {
            for p in sb.poll(Duration::from_millis(20)).unwrap() {
                if let Pushed::Expired { key, field } = p {
                    assert_eq!(field, None);
                    expired.push((i, key));
                }
            }
        }
    }
    // Give a second notification of any key the chance to arrive, then count.
    for sb in subs.iter_mut() {
        for p in sb.poll(Duration::from_millis(100)).unwrap() {
            if let Pushed::Expired { key, .. } = p {
                expired.push((usize::MAX, key));
            }
        }
    }
    let mut names: Vec<String> = expired.iter().map(|(_, k)| k.clone()).collect();
    names.sort();
    let mut want: Vec<String> = keys.iter().map(|k| k.to_string()).collect();
    want.sort();
    assert_eq!(names, want, "each expiry told exactly once");
    // Round robin spreads them over the subscribers.
    let mut who: Vec<usize> = expired.iter().map(|(i, _)| *i).collect();
    who.sort();
    who.dedup();
    assert!(who.len() > 1, "{expired:?}");
    s.stop();
}

#[test]
fn stats_report_ops_connections_objects_memory_and_wal_lag() {
    let s = server();
    let mut a = client(&s);
    let key = ObjectKey::shared("ext", Kind::Counter, "stats");
    exec(
        &mut a,
        &[
            Op::Add {
                key: key.clone(),
                delta: 1,
            },
            Op::GetCounter { key },
        ],
    );
    let st: std::collections::HashMap<String, u64> = a.stats().unwrap().into_iter().collect();
    assert_eq!(st["ops_add"], 1);
    assert_eq!(st["ops_get_counter"], 1);
    assert!(st.contains_key("ops_per_sec_add"));
    assert!(st["connections"] >= 1);
    assert!(st["memory_bytes"] > 0);
    assert!(st.contains_key("wal_lag_bytes"));
    assert!(st.contains_key("objects"));
    s.stop();
}

/// A TCP proxy that, when armed, swallows the next answer from the store and cuts the
/// connection: the request was applied, its acknowledgement lost.
struct LossyProxy {
    addr: std::net::SocketAddr,
    armed: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl LossyProxy {
    fn start(upstream: std::net::SocketAddr) -> LossyProxy {
        use std::io::{Read, Write};
        use std::sync::atomic::Ordering;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let armed = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = armed.clone();
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                let Ok(server) = std::net::TcpStream::connect(upstream) else {
                    return;
                };
                let (mut c_in, mut s_out) =
                    (client.try_clone().unwrap(), server.try_clone().unwrap());
                std::thread::spawn(move || {
                    let mut buf = [0u8; 65536];
                    while let Ok(n) = c_in.read(&mut buf) {
                        if n == 0 || s_out.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                    let _ = s_out.shutdown(std::net::Shutdown::Both);
                });
                let flag = flag.clone();
                let (mut s_in, mut c_out) = (server, client);
                std::thread::spawn(move || {
                    let mut buf = [0u8; 65536];
                    while let Ok(n) = s_in.read(&mut buf) {
                        if n == 0 {
                            break;
                        }
                        if flag.swap(false, Ordering::SeqCst) {
                            // Lose this answer and the connection.
                            break;
                        }
                        if c_out.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                    let _ = c_out.shutdown(std::net::Shutdown::Both);
                    let _ = s_in.shutdown(std::net::Shutdown::Both);
                });
            }
        });
        LossyProxy { addr, armed }
    }
}

#[test]
fn a_batch_whose_answer_was_lost_is_answered_again_not_applied_again() {
    let s = server();
    let proxy = LossyProxy::start(s.local_addr());
    let mut a = StoreConnector::new(proxy.addr.to_string()).open().unwrap();
    let key = ObjectKey::shared("ext", Kind::Counter, "lost-ack");
    let list = ObjectKey::shared("ext", Kind::List, "lost-ack");
    assert_eq!(
        exec(
            &mut a,
            &[Op::Add {
                key: key.clone(),
                delta: 1
            }]
        ),
        vec![Reply::Int(1)]
    );
    proxy.armed.store(true, std::sync::atomic::Ordering::SeqCst);
    // Applied by the store, answer lost, sent again on a new connection with the same op id:
    // the store answers as the first time.
    let r = exec(
        &mut a,
        &[
            Op::Add {
                key: key.clone(),
                delta: 1,
            },
            Op::Push {
                key: list.clone(),
                item: b"x".to_vec(),
            },
        ],
    );
    assert_eq!(r, vec![Reply::Int(2), Reply::Len(1)]);
    assert!(
        !proxy.armed.load(std::sync::atomic::Ordering::SeqCst),
        "the answer was lost once"
    );
    let r = exec(
        &mut a,
        &[
            Op::GetCounter { key },
            Op::Len {
                key: list,
                kind: Kind::List,
            },
        ],
    );
    assert_eq!(r, vec![Reply::Int(2), Reply::Len(1)]);
    let st: std::collections::HashMap<String, u64> = a.stats().unwrap().into_iter().collect();
    assert!(st["duplicates"] >= 1, "{st:?}");
    s.stop();
}

#[test]
fn the_state_engine_keeps_going_while_the_store_is_down_and_catches_up() {
    use flowstate_state::{Access, Partition, Scope, StateConfig};
    let dir = tempfile::tempdir().unwrap();
    let cfg = Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        data_dir: Some(dir.path().to_owned()),
        shards: 2,
        ..Config::default()
    };
    let s = Server::start(cfg.clone()).unwrap();
    let addr = s.local_addr();
    let connector = StoreConnector::with_settings(Settings {
        addr: addr.to_string(),
        retry_for: Duration::from_secs(60),
        ..Settings::default()
    });
    let mut part = Partition::new(&connector, StateConfig::default()).unwrap();
    let mut nf = part.declare("outage");
    let c = nf
        .counter("packets", Scope::CrossFlow(&[]), Access::WriteMostly)
        .unwrap();
    let mut now = 0u64;
    for _ in 0..100 {
        c.add_nowait(1);
        now += 1_000_000;
        part.maybe_flush(now);
    }
    s.stop();
    // The store is gone: the NF's non-blocking updates neither block nor fail.
    for _ in 0..100 {
        c.add_nowait(1);
        now += 1_000_000;
        part.maybe_flush(now);
    }
    // Let the state thread find the store gone and back off (what it then does is what the
    // assertion checks, whatever the timing).
    std::thread::sleep(Duration::from_millis(200));
    let s = Server::start(Config {
        listen: addr,
        ..cfg
    })
    .unwrap();
    part.flush_all(now).unwrap();
    let mut b = connector.open().unwrap();
    // Write-mostly counters are kept per partition (merged on read).
    let keys = b.partitions("outage", Kind::Counter, "packets").unwrap();
    assert!(!keys.is_empty());
    let ops: Vec<Op> = keys.into_iter().map(|key| Op::GetCounter { key }).collect();
    let total: i64 = exec(&mut b, &ops)
        .into_iter()
        .map(|r| match r {
            Reply::Int(n) => n,
            other => panic!("{other:?}"),
        })
        .sum();
    assert_eq!(total, 200, "every update reached the store once");
    s.stop();
}

/// A fenced connection's writes land while its fence holds, and none lands after (nor does
/// anything it sends later); its reads are not fenced; a batch longer than a frame is fenced
/// frame by frame.
#[test]
fn fenced_writes_stop_when_the_fence_moves() {
    use flowstate_state::{BackendError, Fence, FencedBackend};
    let s = server();
    let record = ObjectKey::partitioned(&Owner::new("cluster", 0, 5), Kind::Value, "owner");
    let mut admin = client(&s);
    let set_record = |b: &mut StoreBackend, v: &[u8]| {
        exec(
            b,
            &[Op::Set {
                key: record.clone(),
                value: v.to_vec(),
            }],
        )
    };
    set_record(&mut admin, b"A:1");
    let settings = Settings {
        addr: s.local_addr().to_string(),
        max_batch: 4,
        ..Settings::default()
    };
    let inner = StoreConnector::with_settings(settings).open().unwrap();
    let mut fenced = FencedBackend::new(
        Box::new(inner),
        Fence {
            key: record.clone(),
            value: b"A:1".to_vec(),
            batch: 0,
        },
    );
    let counter = ObjectKey::partitioned(&Owner::new("nat", 0, 5), Kind::Counter, "n");
    let shared = ObjectKey::shared("counter", Kind::Counter, "packets");
    // Ten additions: three frames of at most four operations, each with its fence.
    let adds: Vec<Op> = (0..10)
        .map(|i| Op::Add {
            key: if i % 2 == 0 {
                counter.clone()
            } else {
                shared.clone()
            },
            delta: 1,
        })
        .collect();
    let mut r = Vec::new();
    fenced.execute(&adds, &mut r).unwrap();
    assert_eq!(r.len(), 10);
    let read = |b: &mut StoreBackend| {
        exec(
            b,
            &[
                Op::GetCounter {
                    key: counter.clone(),
                },
                Op::GetCounter {
                    key: shared.clone(),
                },
            ],
        )
    };
    assert_eq!(read(&mut admin), vec![Reply::Int(5), Reply::Int(5)]);
    set_record(&mut admin, b"C:2");
    let mut r = Vec::new();
    let e = fenced.execute(&adds, &mut r).unwrap_err();
    assert!(matches!(e, BackendError::Fenced { .. }), "{e}");
    assert!(r.is_empty());
    assert_eq!(read(&mut admin), vec![Reply::Int(5), Reply::Int(5)]);
    // Reads are not fenced.
    let mut r = Vec::new();
    fenced
        .execute(
            &[Op::GetCounter {
                key: counter.clone(),
            }],
            &mut r,
        )
        .unwrap();
    assert_eq!(r, vec![Reply::Int(5)]);
}
