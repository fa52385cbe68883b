//! The malformed-frame suite against a live server: random bytes, truncated frames, oversize
//! lengths, bad versions, too many operations, frames of the wrong kind. Each gets an error
//! frame or a close; the server keeps serving other clients and loses no acknowledged data.

mod common;

use common::{connect, read};
use flowstate_proto::{
    self as proto, ErrorCode, Frame, Limits, Message, Op, Reply, Request, HEADER_LEN, VERSION,
};
use flowstate_store::{Config, Server};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};

fn server() -> Server {
    Server::start(Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        shards: 2,
        limits: Limits {
            max_frame: 1 << 20,
            max_ops: 100,
        },
        ..Config::default()
    })
    .unwrap()
}

fn send(s: &mut TcpStream, id: u64, msg: Message) {
    let mut out = Vec::new();
    proto::encode(&Frame { id, msg }, &mut out);
    s.write_all(&out).unwrap();
}

fn batch(ops: Vec<Op>) -> Message {
    Message::Batch {
        op_id: 0,
        ack_only: false,
        ops: ops.into_iter().map(Request::from).collect(),
    }
}

/// A well-behaved client: pushes `n` items and checks every answer.
fn good_client(addr: SocketAddr, key: &[u8], from: u64, n: u64) {
    let mut s = connect(addr);
    for i in from..from + n {
        send(
            &mut s,
            i,
            batch(vec![Op::Push {
                key: key.to_vec(),
                item: i.to_le_bytes().to_vec(),
            }]),
        );
        let f = read(&mut s).expect("the server answers a good client");
        assert_eq!(f.id, i);
        assert_eq!(f.msg, Message::Replies(vec![Reply::Len(i + 1)]));
    }
}

fn list(addr: SocketAddr, key: &[u8]) -> Vec<Vec<u8>> {
    let mut s = connect(addr);
    send(
        &mut s,
        1,
        batch(vec![Op::ReadAll {
            key: key.to_vec(),
            kind: proto::Kind::List,
        }]),
    );
    match read(&mut s).unwrap().msg {
        Message::Replies(mut r) => match r.remove(0) {
            Reply::Object(Some(proto::Object::List(v))) => v,
            other => panic!("{other:?}"),
        },
        other => panic!("{other:?}"),
    }
}

fn error_code(f: &Frame) -> ErrorCode {
    match &f.msg {
        Message::Error { code, .. } => *code,
        other => panic!("expected an error frame, got {other:?}"),
    }
}

#[test]
fn bad_version_and_malformed_bodies_get_errors_and_the_connection_goes_on() {
    let server = server();
    let addr = server.local_addr();
    let mut s = connect(addr);
    // Bad version.
    let mut out = Vec::new();
    proto::encode(
        &Frame {
            id: 7,
            msg: batch(vec![]),
        },
        &mut out,
    );
    out[4] = VERSION + 1;
    s.write_all(&out).unwrap();
    let f = read(&mut s).unwrap();
    assert_eq!((f.id, error_code(&f)), (7, ErrorCode::BadVersion));
    // Unknown frame kind.
    let mut out = Vec::new();
    let start = proto::begin(&mut out, 200, 0, 8);
    proto::finish(&mut out, start);
    s.write_all(&out).unwrap();
    let f = read(&mut s).unwrap();
    assert_eq!((f.id, error_code(&f)), (8, ErrorCode::UnexpectedKind));
    // A frame kind only servers send.
    send(&mut s, 9, Message::Replies(vec![]));
    let f = read(&mut s).unwrap();
    assert_eq!((f.id, error_code(&f)), (9, ErrorCode::UnexpectedKind));
    // A body cut short inside its length: a batch announcing 3 ops holding 1.
    let mut out = Vec::new();
    let start = proto::begin_batch(&mut out, 10, 0, false, 3);
    proto::put_request(&mut out, &Op::Get { key: b"k".to_vec() }, None, None);
    proto::finish(&mut out, start);
    s.write_all(&out).unwrap();
    let f = read(&mut s).unwrap();
    assert_eq!((f.id, error_code(&f)), (10, ErrorCode::Malformed));
    // An unknown opcode.
    let mut out = Vec::new();
    let start = proto::begin_batch(&mut out, 11, 0, false, 1);
    out.extend_from_slice(&[99, 0, 1, 0, 0, 0, b'k']);
    proto::finish(&mut out, start);
    s.write_all(&out).unwrap();
    let f = read(&mut s).unwrap();
    assert_eq!((f.id, error_code(&f)), (11, ErrorCode::Malformed));
    // Too many operations.
    let ops = (0..101).map(|_| Op::Get { key: b"k".to_vec() }).collect();
    send(&mut s, 12, batch(ops));
    let f = read(&mut s).unwrap();
    assert_eq!((f.id, error_code(&f)), (12, ErrorCode::TooManyOps));
    // And the same connection still works.
    send(
        &mut s,
        13,
        batch(vec![Op::Add {
            key: b"c".to_vec(),
            delta: 2,
        }]),
    );
    let f = read(&mut s).unwrap();
    assert_eq!((f.id, f.msg), (13, Message::Replies(vec![Reply::Int(2)])));
    let stats: std::collections::HashMap<_, _> = server.stats().into_iter().collect();
    assert_eq!(stats["errors"], 6);
    server.stop();
}

#[test]
fn oversize_and_short_lengths_get_an_error_then_a_close() {
    let server = server();
    let addr = server.local_addr();
    for len in [u32::MAX, (1 << 20) + 1, 3] {
        let mut s = connect(addr);
        let mut out = len.to_le_bytes().to_vec();
        out.extend_from_slice(&[VERSION, 3, 0, 0]);
        let _ = s.write_all(&out);
        let f = read(&mut s).expect("an error frame before the close");
        assert_eq!(error_code(&f), ErrorCode::TooLarge, "length {len}");
        assert!(
            read(&mut s).is_none(),
            "closed after an untrustworthy length"
        );
    }
    good_client(addr, b"after", 0, 3);
    server.stop();
}

#[test]
fn random_bytes_truncated_frames_and_hangups_never_hurt_other_clients() {
    let server = server();
    let addr = server.local_addr();
    // Acknowledged data written before the attack.
    good_client(addr, b"acked", 0, 50);
    let mut attackers = Vec::new();
    for t in 0..4u64 {
        attackers.push(std::thread::spawn(move || {
            // A small deterministic generator: no timing, no outside randomness.
            let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ t;
            let mut next = || {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x
            };
            for round in 0..40 {
                let mut s = connect(addr);
                let mut bytes = Vec::new();
                match round % 4 {
                    // Pure noise.
                    0 => bytes.extend((0..(next() % 300)).map(|_| next() as u8)),
                    // A valid frame cut anywhere, then a hang-up.
                    1 => {
                        proto::encode(
                            &Frame {
                                id: 1,
                                msg: batch(vec![Op::Set {
                                    key: b"noise".to_vec(),
                                    value: vec![1; 64],
                                }]),
                            },
                            &mut bytes,
                        );
                        let cut = (next() as usize) % bytes.len();
                        bytes.truncate(cut);
                    }
                    // A valid header, then garbage in the body.
                    2 => {
                        let start = proto::begin_batch(&mut bytes, 2, 0, false, 2);
                        bytes.extend((0..(next() % 64)).map(|_| next() as u8));
                        proto::finish(&mut bytes, start);
                    }
                    // A valid frame with random bytes flipped.
                    _ => {
                        proto::encode(
                            &Frame {
                                id: 3,
                                msg: batch(vec![Op::Push {
                                    key: b"noise-list".to_vec(),
                                    item: vec![2; 16],
                                }]),
                            },
                            &mut bytes,
                        );
                        for _ in 0..3 {
                            let i = HEADER_LEN + (next() as usize) % (bytes.len() - HEADER_LEN);
                            bytes[i] ^= (next() as u8) | 1;
                        }
                    }
                }
                let _ = s.write_all(&bytes);
                let _ = s.shutdown(std::net::Shutdown::Write);
                // Whatever comes back must be frames the protocol knows, then a close.
                let mut got = Vec::new();
                let _ = s.read_to_end(&mut got);
                let mut at = 0;
                while let Ok(Some((_, used))) = proto::decode(&got[at..], &Limits::default()) {
                    at += used;
                }
                assert_eq!(at, got.len(), "the server sends only whole frames");
            }
        }));
    }
    // Meanwhile a good client is served.
    good_client(addr, b"during", 0, 200);
    for a in attackers {
        a.join().unwrap();
    }
    let acked = list(addr, b"acked");
    assert_eq!(acked.len(), 50);
    for (i, item) in acked.iter().enumerate() {
        assert_eq!(item, &(i as u64).to_le_bytes().to_vec());
    }
    assert_eq!(list(addr, b"during").len(), 200);
    server.stop();
}

#[test]
fn a_token_is_required_when_configured() {
    let server = Server::start(Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        token: Some(flowstate_store::Secret::new("s3cret")),
        ..Config::default()
    })
    .unwrap();
    let addr = server.local_addr();
    // No hello: refused and closed.
    let mut s = connect(addr);
    send(&mut s, 1, batch(vec![Op::Get { key: b"k".to_vec() }]));
    assert_eq!(error_code(&read(&mut s).unwrap()), ErrorCode::Unauthorized);
    assert!(read(&mut s).is_none());
    // Wrong token.
    let mut s = connect(addr);
    send(
        &mut s,
        1,
        Message::Hello {
            client: 1,
            token: b"guess".to_vec(),
        },
    );
    assert_eq!(error_code(&read(&mut s).unwrap()), ErrorCode::Unauthorized);
    assert!(read(&mut s).is_none());
    // Right token.
    let mut s = connect(addr);
    send(
        &mut s,
        1,
        Message::Hello {
            client: 1,
            token: b"s3cret".to_vec(),
        },
    );
    assert!(matches!(read(&mut s).unwrap().msg, Message::Welcome { .. }));
    send(&mut s, 2, batch(vec![Op::Get { key: b"k".to_vec() }]));
    assert_eq!(
        read(&mut s).unwrap().msg,
        Message::Replies(vec![Reply::Value(None)])
    );
    server.stop();
}

#[test]
fn pipelined_requests_are_answered_in_order_across_shards() {
    pipeline(4096);
}

#[test]
fn a_small_in_flight_limit_slows_a_pipelining_client_down_without_losing_order() {
    pipeline(3);
}

fn pipeline(max_inflight: usize) {
    let server = Server::start(Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        shards: 4,
        max_inflight,
        ..Config::default()
    })
    .unwrap();
    let mut s = connect(server.local_addr());
    let mut out = Vec::new();
    for id in 0..500u64 {
        let ops = (0..8)
            .map(|k| Op::Add {
                key: format!("k{k}").into_bytes(),
                delta: 1,
            })
            .map(Request::from)
            .collect();
        proto::encode(
            &Frame {
                id,
                msg: Message::Batch {
                    op_id: 0,
                    ack_only: false,
                    ops,
                },
            },
            &mut out,
        );
    }
    s.write_all(&out).unwrap();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 65536];
    for id in 0..500u64 {
        let f = loop {
            if let Ok(Some((f, used))) = proto::decode(&buf, &Limits::default()) {
                buf.drain(..used);
                break f;
            }
            let n = s.read(&mut chunk).unwrap();
            assert!(n > 0, "closed");
            buf.extend_from_slice(&chunk[..n]);
        };
        assert_eq!(f.id, id);
        assert_eq!(f.msg, Message::Replies(vec![Reply::Int(id as i64 + 1); 8]));
    }
    server.stop();
}
