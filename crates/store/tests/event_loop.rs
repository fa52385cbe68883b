//! The shard threads' event loops: batches spread over many shards in one pipelined stream,
//! pushes that cross shard threads, expiry told to exactly one subscriber, and backpressure
//! on a client that does not read its answers.

use flowstate_proto::{self as proto, Frame, Limits, Message, Notification, Op, Reply, Request};
use flowstate_store::{Config, Server};
use std::collections::HashSet;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

fn server(shards: usize) -> Server {
    Server::start(Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        shards,
        ..Config::default()
    })
    .unwrap()
}

/// The shard of `key` among `n` (the store's FNV-1a).
fn shard_of(key: &[u8], n: usize) -> usize {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in key {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    (h % n as u64) as usize
}

struct Client {
    s: TcpStream,
    buf: Vec<u8>,
}

impl Client {
    fn connect(addr: SocketAddr) -> Client {
        let s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        Client { s, buf: Vec::new() }
    }

    fn send_all(&mut self, frames: &[Frame]) {
        let mut out = Vec::new();
        for f in frames {
            proto::encode(f, &mut out);
        }
        self.s.write_all(&out).unwrap();
    }

    /// The next frame; `None` on close or timeout.
    fn read(&mut self) -> Option<Frame> {
        let mut chunk = [0u8; 65536];
        loop {
            if let Ok(Some((f, used))) = proto::decode(&self.buf, &Limits::default()) {
                self.buf.drain(..used);
                return Some(f);
            }
            match self.s.read(&mut chunk) {
                Ok(0) | Err(_) => return None,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
            }
        }
    }
}

fn batch(id: u64, ack_only: bool, ops: Vec<Op>) -> Frame {
    Frame {
        id,
        msg: Message::Batch {
            op_id: 0,
            ack_only,
            ops: ops.into_iter().map(Request::from).collect(),
        },
    }
}

fn key(i: usize) -> Vec<u8> {
    format!("key-{i}").into_bytes()
}

#[test]
fn batches_over_many_shards_are_answered_in_order_with_the_right_values() {
    const SHARDS: usize = 6;
    const KEYS: usize = 64;
    let server = server(SHARDS);
    let spread: HashSet<usize> = (0..KEYS).map(|i| shard_of(&key(i), SHARDS)).collect();
    assert!(spread.len() >= 4, "the keys hit {} shards", spread.len());
    // Several connections at once, so that they live on different shard threads.
    let addr = server.local_addr();
    let clients: Vec<_> = (0..4)
        .map(|c| {
            std::thread::spawn(move || {
                let mut cl = Client::connect(addr);
                let mine = |i: usize| format!("c{c}-{}", i).into_bytes();
                let mut frames = Vec::new();
                let mut id = 1;
                // Sets over every key, then reads and counter updates, pipelined in one write,
                // with local-only requests (stats, single-key reads) in between.
                frames.push(batch(
                    id,
                    false,
                    (0..KEYS)
                        .map(|i| Op::Set {
                            key: mine(i),
                            value: format!("v{i}").into_bytes(),
                        })
                        .collect(),
                ));
                for round in 0..50 {
                    id += 1;
                    frames.push(batch(
                        id,
                        false,
                        (0..KEYS)
                            .flat_map(|i| {
                                [
                                    Op::Add {
                                        key: format!("n{c}-{i}").into_bytes(),
                                        delta: 1,
                                    },
                                    Op::Get { key: mine(i) },
                                ]
                            })
                            .collect(),
                    ));
                    id += 1;
                    frames.push(batch(id, false, vec![Op::Get { key: mine(round) }]));
                    id += 1;
                    frames.push(batch(
                        id,
                        true,
                        (0..KEYS)
                            .map(|i| Op::Add {
                                key: format!("a{c}-{i}").into_bytes(),
                                delta: 2,
                            })
                            .collect(),
                    ));
                    id += 1;
                    frames.push(Frame {
                        id,
                        msg: Message::Stats,
                    });
                }
                cl.send_all(&frames);
                let mut round = 0;
                for f in &frames {
                    let a = cl.read().expect("an answer");
                    assert_eq!(a.id, f.id, "answers in request order");
                    match (&f.msg, a.msg) {
                        (Message::Batch { ack_only: true, .. }, Message::Ack { duplicate }) => {
                            assert!(!duplicate);
                        }
                        (Message::Batch { ops, .. }, Message::Replies(r)) => {
                            assert_eq!(r.len(), ops.len());
                            if ops.len() == KEYS {
                                assert!(r.iter().all(|x| *x == Reply::Done));
                            } else if ops.len() == 1 {
                                assert_eq!(
                                    r[0],
                                    Reply::Value(Some(format!("v{round}").into_bytes()))
                                );
                                round += 1;
                            } else {
                                for (i, pair) in r.chunks(2).enumerate() {
                                    assert_eq!(pair[0], Reply::Int(round as i64 + 1));
                                    assert_eq!(
                                        pair[1],
                                        Reply::Value(Some(format!("v{i}").into_bytes()))
                                    );
                                }
                            }
                        }
                        (Message::Stats, Message::StatsReply(v)) => {
                            assert!(v.iter().any(|(n, _)| n == "ops_per_sec"));
                        }
                        (q, other) => panic!("{q:?} answered by {other:?}"),
                    }
                }
                // The ack-only updates were all applied.
                cl.send_all(&[batch(
                    1,
                    false,
                    (0..KEYS)
                        .map(|i| Op::GetCounter {
                            key: format!("a{c}-{i}").into_bytes(),
                        })
                        .collect(),
                )]);
                match cl.read().unwrap().msg {
                    Message::Replies(r) => assert_eq!(r, vec![Reply::Int(100); KEYS]),
                    other => panic!("{other:?}"),
                }
            })
        })
        .collect();
    for c in clients {
        c.join().unwrap();
    }
    server.stop();
}

#[test]
fn pushes_cross_shard_threads_and_expiry_tells_one_subscriber() {
    const SHARDS: usize = 4;
    let server = server(SHARDS);
    let addr = server.local_addr();
    // Connections go to the shard threads in turn: a on thread 0, b on 1, w on 2.
    let mut a = Client::connect(addr);
    let mut b = Client::connect(addr);
    let mut w = Client::connect(addr);
    // A key owned by thread 3: every push crosses threads.
    let k = (0..)
        .map(|i| format!("sub-{i}").into_bytes())
        .find(|k| shard_of(k, SHARDS) == 3)
        .unwrap();
    for (c, instance) in [(&mut a, 1), (&mut b, 2)] {
        c.send_all(&[Frame {
            id: 7,
            msg: Message::Subscribe {
                key: k.clone(),
                instance,
            },
        }]);
        let f = c.read().unwrap();
        assert_eq!((f.id, f.msg), (7, Message::Replies(Vec::new())));
    }
    w.send_all(&[batch(
        1,
        false,
        vec![Op::Set {
            key: k.clone(),
            value: b"hello".to_vec(),
        }],
    )]);
    assert_eq!(w.read().unwrap().msg, Message::Replies(vec![Reply::Done]));
    for c in [&mut a, &mut b] {
        let f = c.read().unwrap();
        assert_eq!(f.id, 0);
        assert_eq!(
            f.msg,
            Message::Notify(Notification::Updated {
                key: k.clone(),
                object: Some(proto::Object::Value(b"hello".to_vec())),
            })
        );
    }
    // Expiry: exactly one of the two subscribers hears of it.
    w.send_all(&[batch(
        2,
        false,
        vec![Op::Expire {
            key: k.clone(),
            field: None,
            ttl: Duration::from_millis(50),
        }],
    )]);
    assert_eq!(
        w.read().unwrap().msg,
        Message::Replies(vec![Reply::Bool(true)])
    );
    let mut told = 0;
    for c in [&mut a, &mut b] {
        c.s.set_read_timeout(Some(Duration::from_millis(600)))
            .unwrap();
        while let Some(f) = c.read() {
            match f.msg {
                Message::Notify(Notification::Expired { key, field }) => {
                    assert_eq!((key, field), (k.clone(), None));
                    told += 1;
                }
                // The expire itself is an update.
                Message::Notify(Notification::Updated { .. }) => {}
                other => panic!("{other:?}"),
            }
        }
    }
    assert_eq!(told, 1, "exactly one subscriber is told of the expiry");
    server.stop();
}

#[test]
fn a_client_that_does_not_read_is_not_read_from_and_others_go_on() {
    let server = Server::start(Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        shards: 1,
        max_output: 256 * 1024,
        ..Config::default()
    })
    .unwrap();
    let addr = server.local_addr();
    let big = vec![7u8; 64 * 1024];
    let mut setup = Client::connect(addr);
    setup.send_all(&[batch(
        1,
        false,
        vec![Op::Set {
            key: b"big".to_vec(),
            value: big.clone(),
        }],
    )]);
    assert_eq!(
        setup.read().unwrap().msg,
        Message::Replies(vec![Reply::Done])
    );
    // Each request is 16 KiB and asks for 64 KiB back: 1000 of them are 16 MiB of requests
    // and 64 MiB of answers.
    const N: u64 = 1000;
    let pad = vec![1u8; 16 * 1024];
    let mut out = Vec::new();
    for id in 1..=N {
        proto::encode(
            &batch(
                id,
                false,
                vec![
                    Op::Get {
                        key: b"big".to_vec(),
                    },
                    Op::Set {
                        key: b"pad".to_vec(),
                        value: pad.clone(),
                    },
                ],
            ),
            &mut out,
        );
    }
    let mut slow = Client::connect(addr);
    slow.s.set_nonblocking(true).unwrap();
    let mut written = 0;
    let mut idle = Instant::now();
    while written < out.len() && idle.elapsed() < Duration::from_secs(1) {
        match slow.s.write(&out[written..]) {
            Ok(n) => {
                written += n;
                idle = Instant::now();
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(5))
            }
            Err(e) => panic!("{e}"),
        }
    }
    assert!(
        written < out.len(),
        "the server read all {written} bytes of requests of a client that reads nothing"
    );
    // Other clients are served meanwhile.
    let mut other = Client::connect(addr);
    let t = Instant::now();
    other.send_all(&[batch(
        1,
        false,
        vec![Op::Add {
            key: b"c".to_vec(),
            delta: 1,
        }],
    )]);
    assert_eq!(
        other.read().unwrap().msg,
        Message::Replies(vec![Reply::Int(1)])
    );
    assert!(t.elapsed() < Duration::from_secs(2));
    let st: std::collections::HashMap<String, u64> = server.stats().into_iter().collect();
    // Far below the 64 MiB of answers the requests ask for (the test process's own buffers
    // count too).
    assert!(st["memory_bytes"] < 200 << 20, "{st:?}");
    // The slow client now reads: every answer comes, in order.
    slow.s.set_nonblocking(false).unwrap();
    let mut wr = slow.s.try_clone().unwrap();
    let reader = std::thread::spawn(move || {
        let mut slow = slow;
        for id in 1..=N {
            let f = slow.read().expect("an answer");
            assert_eq!(f.id, id);
            assert_eq!(
                f.msg,
                Message::Replies(vec![Reply::Value(Some(vec![7u8; 64 * 1024])), Reply::Done])
            );
        }
    });
    wr.write_all(&out[written..]).unwrap();
    reader.join().unwrap();
    server.stop();
}

#[test]
fn a_request_followed_by_a_hang_up_is_answered_and_closed_at_once() {
    let server = server(2);
    let t = Instant::now();
    for i in 0..50u64 {
        let mut c = Client::connect(server.local_addr());
        let mut out = Vec::new();
        proto::encode(
            &batch(
                i,
                false,
                vec![Op::Add {
                    key: b"hup".to_vec(),
                    delta: 1,
                }],
            ),
            &mut out,
        );
        // The request and the end of the stream arrive together.
        c.s.write_all(&out).unwrap();
        c.s.shutdown(std::net::Shutdown::Write).unwrap();
        let mut got = Vec::new();
        c.s.read_to_end(&mut got).unwrap();
        let (f, used) = proto::decode(&got, &Limits::default()).unwrap().unwrap();
        assert_eq!(used, got.len());
        assert_eq!(f.msg, Message::Replies(vec![Reply::Int(i as i64 + 1)]));
    }
    assert!(
        t.elapsed() < Duration::from_secs(10),
        "hang-ups noticed late: {:?}",
        t.elapsed()
    );
    server.stop();
}

#[test]
fn a_cpu_the_process_may_not_use_is_a_clear_error() {
    let err = Server::start(Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        cpus: vec![100_000],
        ..Config::default()
    })
    .err()
    .expect("refused");
    assert_eq!(
        err.to_string(),
        "cpus: this process may not run on CPU 100000"
    );
}
