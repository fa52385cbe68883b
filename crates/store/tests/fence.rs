//! Fenced batches ([`Command::Fence`]): a batch whose fence holds runs whole, on every shard
//! its operations live on; one whose fence does not hold runs nowhere, each operation refused;
//! whichever shard thread the connection lives on.

use flowstate_proto::{self as proto, Command, Frame, Limits, Message, Op, Reply, Request};
use flowstate_store::{Config, Server};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

const SHARDS: usize = 6;
const RECORD: &[u8] = b"cluster@0@3@Value@owner";

fn send(s: &mut TcpStream, id: u64, ops: Vec<Command>) -> Vec<Reply> {
    let frame = Frame {
        id,
        msg: Message::Batch {
            op_id: 0,
            ack_only: false,
            ops: ops
                .into_iter()
                .map(|op| Request {
                    op,
                    instance: None,
                    clock: None,
                })
                .collect(),
        },
    };
    let mut out = Vec::new();
    proto::encode(&frame, &mut out);
    s.write_all(&out).unwrap();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 65536];
    loop {
        if let Ok(Some((f, _))) = proto::decode(&buf, &Limits::default()) {
            assert_eq!(f.id, id);
            match f.msg {
                Message::Replies(r) => return r,
                other => panic!("{other:?}"),
            }
        }
        let n = s.read(&mut chunk).unwrap();
        assert!(n > 0, "closed");
        buf.extend_from_slice(&chunk[..n]);
    }
}

fn op(o: Op) -> Command {
    Command::Op(o)
}

/// The shared counters a commit adds to: names that land on several shards.
fn counters() -> Vec<Vec<u8>> {
    (0..8)
        .map(|i| format!("counter@Counter@packets-{i}").into_bytes())
        .collect()
}

/// A commit of partition 3 of stage 0 fenced on `owner`: its objects of two NFs, and the
/// shared counters.
fn commit(owner: &[u8], value: &[u8]) -> Vec<Command> {
    let mut ops = vec![
        Command::Fence {
            key: RECORD.to_vec(),
            value: owner.to_vec(),
        },
        op(Op::Set {
            key: b"nat@0@3@Value@last".to_vec(),
            value: value.to_vec(),
        }),
        op(Op::Set {
            key: b"firewall@0@3@Value@last".to_vec(),
            value: value.to_vec(),
        }),
    ];
    ops.extend(
        counters()
            .into_iter()
            .map(|key| op(Op::Add { key, delta: 1 })),
    );
    ops
}

fn read_back(s: &mut TcpStream, id: u64) -> (Vec<Reply>, Vec<Reply>) {
    let values = send(
        s,
        id,
        vec![
            op(Op::Get {
                key: b"nat@0@3@Value@last".to_vec(),
            }),
            op(Op::Get {
                key: b"firewall@0@3@Value@last".to_vec(),
            }),
        ],
    );
    let counts = send(
        s,
        id + 1,
        counters()
            .into_iter()
            .map(|key| op(Op::GetCounter { key }))
            .collect(),
    );
    (values, counts)
}

fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s
}

#[test]
fn a_fenced_batch_runs_whole_or_nowhere_from_every_shard_thread() {
    let server = Server::start(Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        shards: SHARDS,
        ..Config::default()
    })
    .unwrap();
    let addr = server.local_addr();
    let mut admin = connect(addr);
    let set_owner = |s: &mut TcpStream, id: u64, owner: &[u8]| {
        let r = send(
            s,
            id,
            vec![op(Op::Set {
                key: RECORD.to_vec(),
                value: owner.to_vec(),
            })],
        );
        assert_eq!(r, vec![Reply::Done]);
    };
    // One connection per shard thread (connections are handed to the threads in turn), so the
    // fence's shard is the connection's own for one of them and another shard's for the rest.
    let mut conns: Vec<TcpStream> = (0..SHARDS).map(|_| connect(addr)).collect();
    let mut id = 10;
    for (round, s) in conns.iter_mut().enumerate() {
        let round = round as i64 + 1;
        set_owner(&mut admin, id, b"A:1");
        // The owner's commit runs whole.
        let r = send(s, id + 1, commit(b"A:1", format!("a{round}").as_bytes()));
        assert_eq!(r[0], Reply::Bool(true), "{r:?}");
        assert!(r[1..3].iter().all(|r| *r == Reply::Done), "{r:?}");
        assert!(r[3..].iter().all(|r| *r == Reply::Int(round)), "{r:?}");
        // The partition moves; the old owner's next commit runs nowhere.
        set_owner(&mut admin, id + 2, b"C:2");
        let r = send(s, id + 3, commit(b"A:1", b"stale"));
        assert_eq!(r[0], Reply::Bool(false), "{r:?}");
        assert!(
            r[1..].iter().all(
                |r| matches!(r, Reply::Error(proto::Failure::Refused(m)) if m.contains("fence"))
            ),
            "{r:?}"
        );
        let (values, counts) = read_back(&mut admin, id + 4);
        let mine = Reply::Value(Some(format!("a{round}").into_bytes()));
        assert_eq!(values, vec![mine.clone(), mine], "round {round}");
        assert!(counts.iter().all(|c| *c == Reply::Int(round)), "{counts:?}");
        id += 10;
    }
    // A fence on a key that holds nothing does not hold.
    let r = send(
        &mut admin,
        id,
        vec![
            Command::Fence {
                key: b"cluster@0@9@Value@owner".to_vec(),
                value: b"A:1".to_vec(),
            },
            op(Op::Add {
                key: b"x@0@9@Counter@n".to_vec(),
                delta: 1,
            }),
        ],
    );
    assert_eq!(r[0], Reply::Bool(false));
    assert!(matches!(r[1], Reply::Error(_)), "{r:?}");
}
