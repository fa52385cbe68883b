//! The `proto` fuzz target's seeds against a live server: the committed corpus
//! (`fuzz/corpus/proto`) mutated as libFuzzer would, each input sent on its own connection
//! and the write side closed. The server answers with whole frames only (errors for what it
//! cannot read) and closes; a well-behaved client on its own connection is answered correctly
//! after every input, and nothing it was told is stored is lost.
//!
//! `FLOWSTATE_FUZZ_CASES=200000 cargo test --release -p flowstate-store --test fuzz_server`
//! runs it longer.

#[path = "../../../fuzz/harness/mutate.rs"]
mod mutate;

mod common;

use common::{connect, read};
use flowstate_proto::{self as proto, Frame, Limits, Message, Op, Reply, Request};
use flowstate_store::{Config, Server};
use proptest::prelude::*;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::{Mutex, OnceLock};

fn seeds() -> &'static [(String, Vec<u8>)] {
    static SEEDS: OnceLock<Vec<(String, Vec<u8>)>> = OnceLock::new();
    SEEDS.get_or_init(|| mutate::seeds(env!("CARGO_MANIFEST_DIR"), "proto"))
}

/// The server every case talks to, and the good client's connection and pushes so far.
struct Shared {
    server: Server,
    good: TcpStream,
    pushed: u64,
}

fn shared() -> &'static Mutex<Shared> {
    static SHARED: OnceLock<Mutex<Shared>> = OnceLock::new();
    SHARED.get_or_init(|| {
        let server = Server::start(Config {
            listen: "127.0.0.1:0".parse().unwrap(),
            shards: 2,
            limits: Limits {
                max_frame: 1 << 16,
                max_ops: 16,
            },
            ..Config::default()
        })
        .expect("a store server");
        let good = connect(server.local_addr());
        Mutex::new(Shared {
            server,
            good,
            pushed: 0,
        })
    })
}

fn request(s: &mut TcpStream, id: u64, op: Op) -> Reply {
    let mut out = Vec::new();
    let msg = Message::Batch {
        op_id: 0,
        ack_only: false,
        ops: vec![Request::from(op)],
    };
    proto::encode(&Frame { id, msg }, &mut out);
    s.write_all(&out).unwrap();
    let f = read(s).expect("the server answers a good client");
    assert_eq!(f.id, id);
    match f.msg {
        Message::Replies(mut r) if r.len() == 1 => r.remove(0),
        other => panic!("{other:?}"),
    }
}

/// Sends `input` on a connection of its own, closes the write side, and checks what comes
/// back; then the good client pushes one item and is answered.
fn one(input: &[u8]) {
    let mut sh = shared().lock().unwrap_or_else(|e| e.into_inner());
    let addr = sh.server.local_addr();
    let mut s = connect(addr);
    let _ = s.write_all(input);
    let _ = s.shutdown(std::net::Shutdown::Write);
    let mut got = Vec::new();
    let _ = s.read_to_end(&mut got);
    let mut at = 0;
    while let Ok(Some((_, used))) = proto::decode(&got[at..], &Limits::default()) {
        at += used;
    }
    assert_eq!(
        at,
        got.len(),
        "the server sent a part of a frame after {}",
        mutate::hex(input)
    );
    let n = sh.pushed;
    let reply = request(
        &mut sh.good,
        n + 1,
        Op::Push {
            key: b"fuzz-good".to_vec(),
            item: n.to_le_bytes().to_vec(),
        },
    );
    assert_eq!(reply, Reply::Len(n + 1), "after {}", mutate::hex(input));
    sh.pushed += 1;
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(mutate::cases(3000) / 10))]

    #[test]
    fn fuzz_mutated_seeds_against_a_live_server(
        seed in any::<prop::sample::Index>(),
        edits in mutate::edits(8),
    ) {
        let all = seeds();
        one(&mutate::apply(&all[seed.index(all.len())].1, &edits, all));
    }
}

/// The seeds themselves (valid streams), and the good client's items all there at the end.
#[test]
fn seeds_against_a_live_server() {
    for (_, s) in seeds() {
        one(s);
    }
    let mut sh = shared().lock().unwrap_or_else(|e| e.into_inner());
    let n = sh.pushed;
    let reply = request(
        &mut sh.good,
        u64::MAX,
        Op::Len {
            key: b"fuzz-good".to_vec(),
            kind: proto::Kind::List,
        },
    );
    assert_eq!(reply, Reply::Len(n));
}
