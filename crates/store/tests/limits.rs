//! The store's bounds against adversarial clients: each finding of an abuse of the server's
//! memory or connections, with the bound asserted (bytes, counts, a close), never a time.

mod common;

use common::{connect, read};
use flowstate_proto::{
    self as proto, ErrorCode, Failure, Frame, Limits, Message, Op, Reply, Request, HEADER_LEN,
    VERSION,
};
use flowstate_store::{Config, Secret, Server};
use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, Instant};

fn start(config: Config) -> Server {
    Server::start(Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        shards: 1,
        ..config
    })
    .unwrap()
}

fn send(s: &mut TcpStream, id: u64, msg: Message) {
    let mut out = Vec::new();
    proto::encode(&Frame { id, msg }, &mut out);
    s.write_all(&out).unwrap();
}

fn batch(op_id: u64, ops: Vec<Op>) -> Message {
    Message::Batch {
        op_id,
        ack_only: false,
        ops: ops.into_iter().map(Request::from).collect(),
    }
}

fn hello(s: &mut TcpStream, client: u64, token: &[u8]) {
    send(
        s,
        0,
        Message::Hello {
            client,
            token: token.to_vec(),
        },
    );
    assert!(matches!(read(s).unwrap().msg, Message::Welcome { .. }));
}

fn replies(f: Frame) -> Vec<Reply> {
    match f.msg {
        Message::Replies(r) => r,
        other => panic!("expected replies, got {other:?}"),
    }
}

fn stat(server: &Server, name: &str) -> u64 {
    server
        .stats()
        .into_iter()
        .find(|(n, _)| n == name)
        .unwrap_or_else(|| panic!("no stat {name}"))
        .1
}

/// Waits (up to 10 s) for the server's count of open connections to come down to `n`.
fn connections_settle_at(server: &Server, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while stat(server, "connections") != n && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(stat(server, "connections"), n);
}

/// Waits (up to 10 s) for the server to close `s`, returning the frames it sent before.
fn frames_until_closed(s: &mut TcpStream) -> Vec<Frame> {
    let mut frames = Vec::new();
    while let Some(f) = read(s) {
        frames.push(f);
    }
    frames
}

#[test]
fn one_batch_is_answered_up_to_one_frame_and_the_rest_is_not_run() {
    let max_frame = 1 << 20;
    let server = start(Config {
        limits: Limits {
            max_frame,
            max_ops: 4096,
        },
        ..Config::default()
    });
    let mut s = connect(server.local_addr());
    send(
        &mut s,
        1,
        batch(
            0,
            vec![Op::Set {
                key: b"big".to_vec(),
                value: vec![7; 256 << 10],
            }],
        ),
    );
    assert_eq!(replies(read(&mut s).unwrap()), vec![Reply::Done]);
    // 2,000 reads of 256 KiB (500 MiB of answers) and a write, in a 40 KB frame.
    let mut ops = vec![
        Op::Get {
            key: b"big".to_vec()
        };
        2000
    ];
    ops.push(Op::Set {
        key: b"after".to_vec(),
        value: b"x".to_vec(),
    });
    send(&mut s, 2, batch(0, ops));
    let mut buf = Vec::new();
    let f = read(&mut s).unwrap();
    proto::encode(&f, &mut buf);
    // The answer is one frame the client can take: four values, then refusals.
    assert!(
        buf.len() <= max_frame as usize + (256 << 10),
        "{}",
        buf.len()
    );
    let r = replies(f);
    assert_eq!(r.len(), 2001);
    let values = r
        .iter()
        .take_while(|r| matches!(r, Reply::Value(Some(_))))
        .count();
    assert_eq!(values, 4);
    assert!(r[values..]
        .iter()
        .all(|r| matches!(r, Reply::Error(Failure::Refused(m)) if m.contains("max_frame"))));
    // Not run: the write after the cut did not happen.
    send(
        &mut s,
        3,
        batch(
            0,
            vec![Op::Get {
                key: b"after".to_vec(),
            }],
        ),
    );
    assert_eq!(replies(read(&mut s).unwrap()), vec![Reply::Value(None)]);
    assert_eq!(stat(&server, "answers_cut"), 1);
    server.stop();
}

#[test]
fn answers_kept_for_fresh_client_ids_stay_under_their_bound() {
    let bound = 2 << 20;
    let server = start(Config {
        max_reply_cache: bound,
        max_clients: 500,
        ..Config::default()
    });
    let addr = server.local_addr();
    let mut s = connect(addr);
    send(
        &mut s,
        1,
        batch(
            0,
            vec![Op::Set {
                key: b"v".to_vec(),
                value: vec![1; 64 << 10],
            }],
        ),
    );
    read(&mut s).unwrap();
    // 3,000 fresh client ids, each a batch answering 256 KiB (750 MiB if all were kept).
    for client in 1..=3000u64 {
        let mut c = connect(addr);
        hello(&mut c, client, b"");
        send(&mut c, 1, batch(1, vec![Op::Get { key: b"v".to_vec() }; 4]));
        assert_eq!(replies(read(&mut c).unwrap()).len(), 4);
    }
    assert!(stat(&server, "kept_answer_bytes") <= bound as u64);
    assert!(stat(&server, "clients") <= 500);
    assert!(stat(&server, "clients_forgotten") >= 2500);
    assert!(stat(&server, "replies_dropped") > 0);
    // The latest client's batch is still answered as the first time, and not applied again.
    let mut c = connect(addr);
    hello(&mut c, 3000, b"");
    send(&mut c, 1, batch(1, vec![Op::Get { key: b"v".to_vec() }; 4]));
    let r = replies(read(&mut c).unwrap());
    assert!(r
        .iter()
        .all(|r| matches!(r, Reply::Value(Some(v)) if v.len() == 64 << 10)));
    assert_eq!(stat(&server, "duplicates"), 1);
    server.stop();
}

#[test]
fn silent_connections_are_closed_after_the_handshake_timeout_and_free_their_places() {
    for token in [None, Some("s3cret")] {
        let server = start(Config {
            max_connections: 4,
            handshake_timeout: Duration::from_millis(300),
            token: token.map(Secret::new),
            ..Config::default()
        });
        let addr = server.local_addr();
        let mut silent: Vec<TcpStream> = (0..4).map(|_| connect(addr)).collect();
        // Let the acceptor count them all before the fifth comes.
        connections_settle_at(&server, 4);
        let mut late = connect(addr);
        let f = read(&mut late).unwrap();
        assert!(matches!(
            f.msg,
            Message::Error {
                code: ErrorCode::TooManyConnections,
                ..
            }
        ));
        // Each silent one is told why and closed.
        for s in &mut silent {
            let frames = frames_until_closed(s);
            assert!(
                matches!(
                    frames.as_slice(),
                    [Frame {
                        msg: Message::Error {
                            code: ErrorCode::TimedOut,
                            ..
                        },
                        ..
                    }]
                ),
                "{frames:?}"
            );
        }
        assert_eq!(stat(&server, "timeouts"), 4);
        // Their places are free for a real client.
        connections_settle_at(&server, 0);
        let mut real = connect(addr);
        hello(&mut real, 9, token.unwrap_or_default().as_bytes());
        send(&mut real, 1, batch(0, vec![Op::Get { key: b"k".to_vec() }]));
        assert_eq!(replies(read(&mut real).unwrap()), vec![Reply::Value(None)]);
        server.stop();
    }
}

#[test]
fn before_the_token_a_large_frame_is_refused_at_once_not_waited_for() {
    let server = start(Config {
        token: Some(Secret::new("s3cret")),
        ..Config::default()
    });
    let addr = server.local_addr();
    for _ in 0..8 {
        let mut s = connect(addr);
        // The header of a 60 MiB hello, and 1 KiB of it.
        let len: u32 = 60 << 20;
        let mut head = Vec::with_capacity(HEADER_LEN);
        head.extend_from_slice(&len.to_le_bytes());
        head.push(VERSION);
        head.push(1);
        head.extend_from_slice(&[0; 2]);
        head.extend_from_slice(&1u64.to_le_bytes());
        head.resize(HEADER_LEN, 0);
        s.write_all(&head).unwrap();
        s.write_all(&[0; 1024]).unwrap();
        let frames = frames_until_closed(&mut s);
        assert!(
            matches!(
                frames.as_slice(),
                [Frame {
                    msg: Message::Error {
                        code: ErrorCode::TooLarge,
                        ..
                    },
                    ..
                }]
            ),
            "{frames:?}"
        );
    }
    connections_settle_at(&server, 0);
    server.stop();
}

#[test]
fn an_idle_connection_is_closed_but_a_subscribed_one_stays() {
    let server = start(Config {
        idle_timeout: Some(Duration::from_millis(300)),
        ..Config::default()
    });
    let addr = server.local_addr();
    let mut idle = connect(addr);
    hello(&mut idle, 1, b"");
    let mut subscribed = connect(addr);
    hello(&mut subscribed, 2, b"");
    send(
        &mut subscribed,
        1,
        Message::Subscribe {
            key: b"k".to_vec(),
            instance: 2,
        },
    );
    assert_eq!(replies(read(&mut subscribed).unwrap()), vec![]);
    // The idle one is closed without a word (its driver reconnects when it next needs to).
    assert!(frames_until_closed(&mut idle).is_empty());
    assert!(stat(&server, "timeouts") >= 1);
    // The subscriber, as idle, is still served and still gets its pushes.
    let mut writer = connect(addr);
    send(
        &mut writer,
        1,
        batch(
            0,
            vec![Op::Set {
                key: b"k".to_vec(),
                value: b"v".to_vec(),
            }],
        ),
    );
    read(&mut writer).unwrap();
    let pushed = read(&mut subscribed).unwrap();
    assert!(matches!(pushed.msg, Message::Notify(_)), "{pushed:?}");
    server.stop();
}

#[test]
fn an_object_holds_at_most_max_items_and_overwrites_still_go_through() {
    let server = start(Config {
        max_items: Some(3),
        ..Config::default()
    });
    let mut s = connect(server.local_addr());
    let b = |x: &str| x.as_bytes().to_vec();
    let mut ops = Vec::new();
    for i in 0..4 {
        ops.push(Op::Push {
            key: b("l"),
            item: b("x"),
        });
        ops.push(Op::MapSet {
            key: b("m"),
            field: format!("f{i}").into_bytes(),
            value: b("v"),
        });
        ops.push(Op::Insert {
            key: b("s"),
            member: format!("m{i}").into_bytes(),
        });
    }
    // At the most: an overwrite and a member already there change nothing in size.
    ops.push(Op::MapSet {
        key: b("m"),
        field: b("f0"),
        value: b("w"),
    });
    ops.push(Op::Insert {
        key: b("s"),
        member: b("m0"),
    });
    send(&mut s, 1, batch(0, ops));
    let r = replies(read(&mut s).unwrap());
    let refused =
        |r: &Reply| matches!(r, Reply::Error(Failure::Refused(m)) if m.contains("max_items"));
    assert!(r[..9].iter().all(|r| !refused(r)), "{r:?}");
    assert!(r[9..12].iter().all(refused), "{r:?}");
    assert_eq!(r[12], Reply::Done);
    assert_eq!(r[13], Reply::Bool(false));
    server.stop();
}
