//! The stable harness of the `proto` fuzz target (`fuzz/fuzz_targets/proto.rs`): the
//! committed seed corpus (`fuzz/corpus/proto`: streams of valid frames of every message kind,
//! written by `write_seeds` below) mutated as libFuzzer would, and arbitrary bytes, decoded as
//! a server meets them: frames back to back, under the default and tight limits. Nothing may
//! panic; a frame that decodes re-encodes to bytes that decode to the same frame; the borrowed
//! batch decoder (the server's hot path) agrees with the owned one; a decoder that wants more
//! bytes never says so about a whole frame.
//!
//! `FLOWSTATE_FUZZ_CASES=1000000 cargo test --release -p flowstate-proto --test fuzz_proto`
//! (or `scripts/fuzz`) runs it longer.

#[path = "../../../fuzz/harness/mutate.rs"]
mod mutate;
#[path = "../../../fuzz/harness/proto_check.rs"]
mod proto_check;

use flowstate_proto::*;
use proptest::prelude::*;
use std::sync::OnceLock;
use std::time::Duration;

fn seeds() -> &'static [(String, Vec<u8>)] {
    static SEEDS: OnceLock<Vec<(String, Vec<u8>)>> = OnceLock::new();
    SEEDS.get_or_init(|| mutate::seeds(env!("CARGO_MANIFEST_DIR"), "proto"))
}

/// The seeds are whole streams of valid frames.
#[test]
fn seeds_decode() {
    for (name, bytes) in seeds() {
        let mut rest = &bytes[..];
        let mut n = 0;
        while !rest.is_empty() {
            let (_, used) = decode(rest, &Limits::default())
                .unwrap_or_else(|e| panic!("{name}: frame {n}: {e}"))
                .unwrap_or_else(|| panic!("{name}: frame {n} is cut short"));
            rest = &rest[used..];
            n += 1;
        }
        assert!(n > 0, "{name}");
        proto_check::check(bytes);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(mutate::cases(3000)))]

    #[test]
    fn fuzz_mutated_seeds(seed in any::<prop::sample::Index>(), edits in mutate::edits(8)) {
        let all = seeds();
        let input = mutate::apply(&all[seed.index(all.len())].1, &edits, all);
        proto_check::check(&input);
    }

    #[test]
    fn fuzz_arbitrary_bytes(b in proptest::collection::vec(any::<u8>(), 0..256)) {
        proto_check::check(&b);
    }
}

/// The frames of the seed corpus, one stream per file.
fn seed_streams() -> Vec<(&'static str, Vec<Frame>)> {
    let k = |s: &str| s.as_bytes().to_vec();
    fn req(op: impl Into<Command>) -> Request {
        Request {
            op: op.into(),
            instance: Some(3),
            clock: Some(77),
        }
    }
    let ops = vec![
        req(Op::Get {
            key: k("nat@0@0@Map@flows"),
        }),
        req(Op::Set {
            key: k("v"),
            value: k("value"),
        }),
        Request {
            op: Op::Add {
                key: k("fw@c"),
                delta: -5,
            }
            .into(),
            instance: None,
            clock: None,
        },
        req(Op::MapSet {
            key: k("m"),
            field: k("f"),
            value: k("x"),
        }),
        req(Op::CompareAndSet {
            key: k("owner"),
            expected: None,
            new: Some(k("1")),
        }),
        req(Op::Expire {
            key: k("m"),
            field: Some(k("f")),
            ttl: Duration::from_secs(300),
        }),
        req(Op::Lock {
            key: k("l"),
            owner: 9,
            lease: Duration::from_millis(500),
        }),
        req(Command::Claim {
            key: k("p"),
            kind: Kind::from_code(4).unwrap(),
            instance: 2,
        }),
        req(Op::Push {
            key: k("list"),
            item: k("i"),
        }),
        req(Op::MapAdd {
            key: k("cm"),
            field: k("f"),
            delta: 1,
        }),
    ];
    let frame = |id, msg| Frame { id, msg };
    vec![
        (
            "hello_batch.bin",
            vec![
                frame(
                    1,
                    Message::Hello {
                        client: 42,
                        token: k("secret"),
                    },
                ),
                frame(
                    2,
                    Message::Batch {
                        op_id: 7,
                        ack_only: false,
                        ops: ops.clone(),
                    },
                ),
                frame(
                    3,
                    Message::Batch {
                        op_id: 8,
                        ack_only: true,
                        ops: ops[..2].to_vec(),
                    },
                ),
            ],
        ),
        (
            "replies.bin",
            vec![
                frame(1, Message::Welcome { shards: 4 }),
                frame(
                    2,
                    Message::Replies(vec![
                        Reply::Done,
                        Reply::Value(Some(k("v"))),
                        Reply::Int(-3),
                        Reply::Bool(true),
                        Reply::Len(9),
                        Reply::Object(Some(Object::Map(vec![(k("f"), k("x"))]))),
                        Reply::Error(Failure::Refused("locked".into())),
                        Reply::Error(Failure::Duplicate),
                    ]),
                ),
                frame(3, Message::Ack { duplicate: false }),
                frame(
                    4,
                    Message::Error {
                        code: ErrorCode::Malformed,
                        message: "bad frame".into(),
                    },
                ),
            ],
        ),
        (
            "control.bin",
            vec![
                frame(1, Message::Stats),
                frame(2, Message::StatsReply(vec![("keys".into(), 12)])),
                frame(
                    3,
                    Message::Partitions {
                        nf: k("nat"),
                        kind: Kind::from_code(4).unwrap(),
                        id: k("flows"),
                    },
                ),
                frame(4, Message::Keys(vec![k("a"), k("b")])),
                frame(
                    5,
                    Message::Subscribe {
                        key: k("shared"),
                        instance: 1,
                    },
                ),
                frame(0, Message::Unsubscribe { key: k("shared") }),
                frame(
                    0,
                    Message::Notify(Notification::Expired {
                        key: k("m"),
                        field: Some(k("f")),
                    }),
                ),
                frame(
                    0,
                    Message::Notify(Notification::Updated {
                        key: k("c"),
                        object: Some(Object::Counter(5)),
                    }),
                ),
            ],
        ),
    ]
}

/// Writes `fuzz/corpus/proto` (run by hand after the protocol changes:
/// `cargo test -p flowstate-proto --test fuzz_proto -- --ignored write_seeds`).
#[test]
#[ignore]
fn write_seeds() {
    let dir = mutate::corpus_dir(env!("CARGO_MANIFEST_DIR"), "proto");
    std::fs::create_dir_all(&dir).unwrap();
    for (name, frames) in seed_streams() {
        let mut out = Vec::new();
        for f in &frames {
            encode(f, &mut out);
        }
        std::fs::write(dir.join(name), out).unwrap();
    }
}

/// The committed seeds are what `write_seeds` writes (the protocol did not change under them).
#[test]
fn seeds_are_current() {
    for (name, frames) in seed_streams() {
        let mut out = Vec::new();
        for f in &frames {
            encode(f, &mut out);
        }
        let on_disk = seeds().iter().find(|(n, _)| n == name);
        assert_eq!(
            on_disk.map(|(_, b)| b),
            Some(&out),
            "{name}: run write_seeds (see its doc)"
        );
    }
}
