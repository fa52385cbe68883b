//! Property tests: every frame survives encode + decode; decoding arbitrary, truncated or
//! corrupted bytes never panics.

use flowstate_proto::*;
use proptest::prelude::*;
use std::time::Duration;

fn bytes() -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(any::<u8>(), 0..24)
}

fn kind() -> impl Strategy<Value = Kind> {
    (0u8..6).prop_map(|c| Kind::from_code(c).unwrap())
}

fn dur() -> impl Strategy<Value = Duration> {
    any::<u64>().prop_map(Duration::from_nanos)
}

fn op() -> impl Strategy<Value = Op> {
    let k = bytes;
    prop_oneof![
        k().prop_map(|key| Op::Get { key }),
        (k(), bytes()).prop_map(|(key, value)| Op::Set { key, value }),
        k().prop_map(|key| Op::Delete { key }),
        (k(), any::<i64>()).prop_map(|(key, delta)| Op::Add { key, delta }),
        k().prop_map(|key| Op::GetCounter { key }),
        (k(), any::<i64>()).prop_map(|(key, value)| Op::SetCounter { key, value }),
        (k(), bytes()).prop_map(|(key, item)| Op::Push { key, item }),
        k().prop_map(|key| Op::Pop { key }),
        (k(), bytes()).prop_map(|(key, member)| Op::Insert { key, member }),
        (k(), bytes()).prop_map(|(key, member)| Op::Remove { key, member }),
        (k(), bytes()).prop_map(|(key, member)| Op::Contains { key, member }),
        (k(), bytes()).prop_map(|(key, field)| Op::MapGet { key, field }),
        (k(), bytes(), bytes()).prop_map(|(key, field, value)| Op::MapSet { key, field, value }),
        (k(), bytes()).prop_map(|(key, field)| Op::MapDelete { key, field }),
        (k(), bytes(), any::<i64>()).prop_map(|(key, field, delta)| Op::MapAdd {
            key,
            field,
            delta
        }),
        (k(), bytes()).prop_map(|(key, field)| Op::MapGetCounter { key, field }),
        (
            k(),
            proptest::option::of(bytes()),
            proptest::option::of(bytes())
        )
            .prop_map(|(key, expected, new)| Op::CompareAndSet { key, expected, new }),
        (k(), proptest::option::of(bytes()), dur()).prop_map(|(key, field, ttl)| Op::Expire {
            key,
            field,
            ttl
        }),
        (k(), kind()).prop_map(|(key, kind)| Op::Len { key, kind }),
        (k(), kind()).prop_map(|(key, kind)| Op::ReadAll { key, kind }),
        (k(), any::<u64>(), dur()).prop_map(|(key, owner, lease)| Op::Lock { key, owner, lease }),
        (k(), any::<u64>()).prop_map(|(key, owner)| Op::Unlock { key, owner }),
    ]
}

fn command() -> impl Strategy<Value = Command> {
    let k = bytes;
    prop_oneof![
        22 => op().prop_map(Command::Op),
        1 => (k(), kind(), any::<u32>()).prop_map(|(key, kind, instance)| Command::Claim {
            key,
            kind,
            instance
        }),
        1 => (k(), any::<u32>(), any::<u32>()).prop_map(|(key, from, to)| Command::Handover {
            key,
            from,
            to
        }),
        1 => (k(), k()).prop_map(|(key, value)| Command::Fence { key, value }),
    ]
}

fn object() -> impl Strategy<Value = Object> {
    let list = || proptest::collection::vec(bytes(), 0..4);
    prop_oneof![
        bytes().prop_map(Object::Value),
        any::<i64>().prop_map(Object::Counter),
        list().prop_map(Object::List),
        list().prop_map(Object::Set),
        proptest::collection::vec((bytes(), bytes()), 0..4).prop_map(Object::Map),
        proptest::collection::vec((bytes(), any::<i64>()), 0..4).prop_map(Object::CounterMap),
    ]
}

fn reply() -> impl Strategy<Value = Reply> {
    prop_oneof![
        Just(Reply::Done),
        proptest::option::of(bytes()).prop_map(Reply::Value),
        any::<i64>().prop_map(Reply::Int),
        any::<bool>().prop_map(Reply::Bool),
        any::<u64>().prop_map(Reply::Len),
        proptest::option::of(object()).prop_map(Reply::Object),
        (bytes(), kind(), kind()).prop_map(|(key, wanted, found)| Reply::Error(
            Failure::WrongKind { key, wanted, found }
        )),
        "[a-z ]{0,20}".prop_map(|m| Reply::Error(Failure::Refused(m))),
        Just(Reply::Error(Failure::Duplicate)),
    ]
}

fn request() -> impl Strategy<Value = Request> {
    (
        command(),
        proptest::option::of(any::<u32>()),
        proptest::option::of(any::<u64>()),
    )
        .prop_map(|(op, instance, clock)| Request {
            op,
            instance,
            clock,
        })
}

fn code() -> impl Strategy<Value = ErrorCode> {
    prop_oneof![
        Just(ErrorCode::BadVersion),
        Just(ErrorCode::TooLarge),
        Just(ErrorCode::Malformed),
        Just(ErrorCode::Unauthorized),
        Just(ErrorCode::TooManyOps),
        Just(ErrorCode::UnexpectedKind),
        Just(ErrorCode::Unavailable),
        Just(ErrorCode::TooManyConnections),
        Just(ErrorCode::TimedOut),
    ]
}

fn message() -> impl Strategy<Value = Message> {
    prop_oneof![
        (any::<u64>(), bytes()).prop_map(|(client, token)| Message::Hello { client, token }),
        any::<u32>().prop_map(|shards| Message::Welcome { shards }),
        (
            any::<u64>(),
            any::<bool>(),
            proptest::collection::vec(request(), 0..8)
        )
            .prop_map(|(op_id, ack_only, ops)| Message::Batch {
                op_id,
                ack_only,
                ops
            }),
        proptest::collection::vec(reply(), 0..8).prop_map(Message::Replies),
        any::<bool>().prop_map(|duplicate| Message::Ack { duplicate }),
        (code(), "[ -~]{0,30}").prop_map(|(code, message)| Message::Error { code, message }),
        Just(Message::Stats),
        proptest::collection::vec(("[a-z_]{1,12}", any::<u64>()), 0..6)
            .prop_map(Message::StatsReply),
        (bytes(), kind(), bytes()).prop_map(|(nf, kind, id)| Message::Partitions { nf, kind, id }),
        proptest::collection::vec(bytes(), 0..6).prop_map(Message::Keys),
        (bytes(), any::<u32>()).prop_map(|(key, instance)| Message::Subscribe { key, instance }),
        bytes().prop_map(|key| Message::Unsubscribe { key }),
        (bytes(), proptest::option::of(object()))
            .prop_map(|(key, object)| Message::Notify(Notification::Updated { key, object })),
        (bytes(), proptest::option::of(bytes()))
            .prop_map(|(key, field)| Message::Notify(Notification::Expired { key, field })),
    ]
}

fn frame() -> impl Strategy<Value = Frame> {
    (any::<u64>(), message()).prop_map(|(id, msg)| Frame { id, msg })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn frames_round_trip(f in frame(), g in frame()) {
        let mut buf = Vec::new();
        encode(&f, &mut buf);
        let first = buf.len();
        encode(&g, &mut buf);
        let l = Limits::default();
        let (a, used) = decode(&buf, &l).unwrap().unwrap();
        prop_assert_eq!(used, first);
        prop_assert_eq!(a, f);
        let (b, used2) = decode(&buf[used..], &l).unwrap().unwrap();
        prop_assert_eq!(used + used2, buf.len());
        prop_assert_eq!(b, g);
    }

    #[test]
    fn a_reply_s_length_is_what_it_encodes_to(r in reply()) {
        let mut buf = Vec::new();
        put_reply(&mut buf, &r);
        prop_assert_eq!(reply_len(&r), buf.len());
    }

    #[test]
    fn every_prefix_is_incomplete_never_wrong(f in frame()) {
        let mut buf = Vec::new();
        encode(&f, &mut buf);
        for cut in 0..buf.len() {
            prop_assert_eq!(decode(&buf[..cut], &Limits::default()), Ok(None));
        }
    }

    #[test]
    fn random_bytes_never_panic(buf in proptest::collection::vec(any::<u8>(), 0..256)) {
        let _ = decode(&buf, &Limits::default());
        let _ = decode(&buf, &Limits { max_frame: 64, max_ops: 4 });
    }

    #[test]
    fn corrupted_frames_never_panic(f in frame(), flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..6)) {
        let mut buf = Vec::new();
        encode(&f, &mut buf);
        for (at, x) in flips {
            let i = at % buf.len();
            buf[i] ^= x;
        }
        if let Ok(Some((_, used))) = decode(&buf, &Limits::default()) {
            prop_assert!(used <= buf.len());
        }
    }

    #[test]
    fn truncated_bodies_with_patched_length_are_errors(f in frame(), cut in any::<usize>()) {
        // A frame whose length field claims a shorter body than the message needs must be a
        // Malformed error, not a panic or a misread.
        let mut buf = Vec::new();
        encode(&f, &mut buf);
        let body = buf.len() - HEADER_LEN;
        if body > 0 {
            let keep = cut % body;
            buf.truncate(HEADER_LEN + keep);
            let len = (buf.len() - 4) as u32;
            buf[..4].copy_from_slice(&len.to_le_bytes());
            if let Ok(Some((g, _))) = decode(&buf, &Limits::default()) {
                // Some messages have optional tails that legitimately decode shorter only if
                // identical; anything decoded must re-encode to exactly these bytes.
                let mut again = Vec::new();
                encode(&g, &mut again);
                prop_assert_eq!(again, buf);
            }
        }
    }
}
