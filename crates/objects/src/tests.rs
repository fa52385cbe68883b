use super::*;
use proptest::prelude::*;
use std::collections::BTreeMap;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[derive(Debug, Clone)]
enum FieldOp {
    Set(u8),
    Delete(u8),
    Expire(u8, u64),
    Advance(u64),
}

fn field_op() -> impl Strategy<Value = FieldOp> {
    prop_oneof![
        (0u8..24).prop_map(FieldOp::Set),
        (0u8..24).prop_map(FieldOp::Delete),
        (0u8..24, 0u64..50).prop_map(|(f, t)| FieldOp::Expire(f, t)),
        (0u64..30).prop_map(FieldOp::Advance),
    ]
}

proptest! {
    /// A map's fields with times to live against a naive model (field -> value, deadline),
    /// pruned before every step as the stores do: the same fields, values and expiries, and
    /// timers bounded by the fields that have a deadline.
    #[test]
    fn field_map_agrees_with_a_naive_model(ops in proptest::collection::vec(field_op(), 1..300)) {
        let mut m = FieldMap::default();
        let mut model: BTreeMap<u8, (u32, Option<Duration>)> = BTreeMap::new();
        let mut spare = Spare::default();
        let mut now = ms(0);
        for (i, op) in ops.into_iter().enumerate() {
            let mut expired = Vec::new();
            m.prune(now, |f| expired.push(f[0]));
            let mut gone: Vec<u8> = model
                .iter()
                .filter(|(_, (_, d))| d.is_some_and(|d| d <= now))
                .map(|(f, _)| *f)
                .collect();
            model.retain(|_, (_, d)| d.is_none_or(|d| d > now));
            expired.sort_unstable();
            gone.sort_unstable();
            prop_assert_eq!(&expired, &gone);
            match op {
                FieldOp::Set(f) => {
                    m.set(&[f], &(i as u32).to_le_bytes(), &mut spare);
                    model.insert(f, (i as u32, None));
                }
                FieldOp::Delete(f) => {
                    prop_assert_eq!(m.delete(&[f], &mut spare), model.remove(&f).is_some());
                }
                FieldOp::Expire(f, t) => {
                    let has = model.get_mut(&f).map(|e| e.1 = Some(now + ms(t))).is_some();
                    prop_assert_eq!(m.expire(&[f], now + ms(t)), has);
                }
                FieldOp::Advance(t) => now += ms(t),
            }
            let mut fields: Vec<(u8, u32)> = m
                .iter()
                .map(|(f, v)| (f[0], u32::from_le_bytes(v.try_into().unwrap())))
                .collect();
            fields.sort_unstable();
            let want: Vec<(u8, u32)> = model.iter().map(|(f, (v, _))| (*f, *v)).collect();
            prop_assert_eq!(fields, want);
            let timed = model.values().filter(|(_, d)| d.is_some()).count();
            prop_assert!(m.timers() <= 2 * timed + 65, "{} timers, {timed} timed", m.timers());
            prop_assert_eq!(m.any_alive(now), model.values().any(|(_, d)| d.is_none_or(|d| d > now)));
            // Never later than the earliest real deadline (earlier when a timer is stale).
            if let Some(earliest) = model.values().filter_map(|(_, d)| *d).min() {
                prop_assert!(m.next_deadline().is_some_and(|n| n <= earliest));
            }
        }
    }
}

thread_local! {
    /// Timers popped and fields visited by heap rebuilds, on this thread.
    static STEPS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

pub(super) fn count_steps(n: u64) {
    STEPS.with(|s| s.set(s.get() + n));
}

/// Issue #22: writing a map's fields with a time to live, renewing them and letting them
/// expire costs work linear in the operations (a scan of every field per operation made a
/// million-flow NAT quadratic). Counted, not timed: timers popped and fields visited by
/// rebuilds, with the map pruned before every operation as the stores do.
#[test]
fn field_expiry_is_linear_in_the_operations() {
    let mut m = FieldMap::default();
    let mut spare = Spare::default();
    let n: u64 = 100_000;
    STEPS.with(|c| c.set(0));
    let mut ops = 0u64;
    let mut now = Duration::ZERO;
    let mut expired = 0u64;
    for i in 0..n {
        // A flow every 10 µs living 100 ms, and a packet renewing a flow 500 back.
        m.prune(now, |_| expired += 1);
        m.set(&i.to_be_bytes(), b"v", &mut spare);
        m.prune(now, |_| expired += 1);
        m.expire(&i.to_be_bytes(), now + ms(100));
        ops += 2;
        if i >= 500 {
            m.prune(now, |_| expired += 1);
            m.expire(&(i - 500).to_be_bytes(), now + ms(100));
            ops += 1;
        }
        now += Duration::from_micros(10);
    }
    m.prune(now + Duration::from_secs(1), |_| expired += 1);
    assert_eq!(expired, n, "every field expired");
    assert!(m.is_empty());
    let steps = STEPS.with(std::cell::Cell::get);
    // Each timer is popped once and rebuilds are amortized: a small multiple of the
    // operations (a scan per operation would be some n²/2 = 5e9).
    assert!(steps <= 6 * ops, "{steps} steps for {ops} operations");
    assert!(steps >= n, "every field's timer was popped: {steps}");
}

/// Issue #22's guard: renewing a million times the deadlines of a map's 10,000 fields keeps
/// one timer per field (plus the slack before a rebuild), so the heap, and the work of
/// expiring, stay proportional to the fields, not to the renewals.
#[test]
fn renewals_keep_the_timers_proportional_to_the_fields() {
    let mut m = FieldMap::default();
    let mut spare = Spare::default();
    let n = 10_000u32;
    for f in 0..n {
        m.set(&f.to_le_bytes(), b"v", &mut spare);
    }
    for i in 0..1_000_000u32 {
        let f = i % n;
        assert!(m.expire(&f.to_le_bytes(), ms(1_000 + u64::from(i))));
    }
    assert!(m.timers() <= 2 * n as usize + 65, "{} timers", m.timers());
    let mut expired = 0;
    assert!(m.prune(ms(1_000_000_000), |_| expired += 1));
    assert_eq!(expired, n);
    assert!(m.is_empty());
}

#[test]
fn actions_where_nothing_lives_create_only_what_they_write() {
    assert_eq!(Action::Get.on_absent(), Absent::Reply(Outcome::Value(None)));
    assert_eq!(
        Action::MapSet {
            field: b"f",
            value: b"v"
        }
        .on_absent(),
        Absent::Create(Kind::Map)
    );
    assert_eq!(
        Action::CompareAndSet {
            expected: None,
            new: Some(b"x")
        }
        .on_absent(),
        Absent::CreateValue(b"x")
    );
    assert_eq!(
        Action::Len {
            kind: Kind::Counter
        }
        .on_absent(),
        Absent::Reply(Outcome::Error(Fault::Refused(Refusal::NotACollection(
            Kind::Counter
        ))))
    );
}

#[test]
fn an_emptied_collection_is_gone_and_a_wrong_kind_changes_nothing() {
    let mut spare = Spare::default();
    let now = ms(5);
    let mut s = Stored::new(Kind::List, &mut spare);
    assert_eq!(
        s.run(&Action::Push { item: b"a" }, now, &mut spare),
        (Outcome::Len(1), false)
    );
    assert_eq!(
        s.run(&Action::Add { delta: 1 }, now, &mut spare),
        (
            Outcome::Error(Fault::WrongKind {
                wanted: Kind::Counter,
                found: Kind::List
            }),
            false
        )
    );
    assert_eq!(
        s.run(&Action::Pop, now, &mut spare),
        (Outcome::Value(Some(b"a".to_vec())), true)
    );
    let mut c = Stored::new(Kind::Counter, &mut spare);
    c.run(&Action::Add { delta: i64::MAX }, now, &mut spare);
    assert_eq!(
        c.run(&Action::Add { delta: 1 }, now, &mut spare).0,
        Outcome::Error(Fault::Refused(Refusal::Overflow))
    );
    assert_eq!(
        c.run(&Action::GetCounter, now, &mut spare).0,
        Outcome::Int(i64::MAX)
    );
}

#[test]
fn objects_read_out_sorted_and_back() {
    let mut spare = Spare::default();
    let mut m = Stored::new(Kind::Map, &mut spare);
    for f in [b"c", b"a", b"b"] {
        m.run(&Action::MapSet { field: f, value: f }, ms(0), &mut spare);
    }
    let o = m.obj.to_object();
    let want: Vec<(Vec<u8>, Vec<u8>)> = [b"a", b"b", b"c"]
        .iter()
        .map(|f| (f.to_vec(), f.to_vec()))
        .collect();
    assert_eq!(o, Object::Map(want));
    assert_eq!(Obj::from_object(o.clone()).to_object(), o);
}

/// One operation of every opcode, with its code.
fn one_of_each() -> Vec<Op<&'static str, &'static [u8]>> {
    let b: &[u8] = b"x";
    let t = Duration::from_secs(1);
    vec![
        Op::Get { key: "k" },
        Op::Set { key: "k", value: b },
        Op::Delete { key: "k" },
        Op::Add { key: "k", delta: 1 },
        Op::GetCounter { key: "k" },
        Op::SetCounter { key: "k", value: 1 },
        Op::Push { key: "k", item: b },
        Op::Pop { key: "k" },
        Op::Insert {
            key: "k",
            member: b,
        },
        Op::Remove {
            key: "k",
            member: b,
        },
        Op::Contains {
            key: "k",
            member: b,
        },
        Op::MapGet { key: "k", field: b },
        Op::MapSet {
            key: "k",
            field: b,
            value: b,
        },
        Op::MapDelete { key: "k", field: b },
        Op::MapAdd {
            key: "k",
            field: b,
            delta: 1,
        },
        Op::MapGetCounter { key: "k", field: b },
        Op::CompareAndSet {
            key: "k",
            expected: None,
            new: Some(b),
        },
        Op::Expire {
            key: "k",
            field: None,
            ttl: t,
        },
        Op::Len {
            key: "k",
            kind: Kind::Set,
        },
        Op::ReadAll {
            key: "k",
            kind: Kind::Map,
        },
        Op::Lock {
            key: "k",
            owner: 1,
            lease: t,
        },
        Op::Unlock { key: "k", owner: 1 },
    ]
}

#[test]
fn opcodes_are_the_discriminants_in_order_and_name_each_operation() {
    let ops = one_of_each();
    assert_eq!(ops.len(), OP_NAMES.len());
    for (i, op) in ops.iter().enumerate() {
        assert_eq!(usize::from(op.code()), i, "{op:?}");
        assert_eq!(op.map(|k| k.len(), |b| b.to_vec()).code(), op.code());
        let debug = format!("{op:?}").to_lowercase();
        let name = op.name().replace('_', "");
        assert!(debug.starts_with(&name), "{debug} is not {name}");
        assert_eq!(*op.key(), "k");
    }
    assert_eq!(OP_NAMES[3], "add");
}

#[test]
fn every_object_operation_has_an_action_and_leases_none() {
    for op in one_of_each() {
        let lease = matches!(op, Op::Lock { .. } | Op::Unlock { .. });
        assert_eq!(op.action().is_none(), lease, "{op:?}");
        assert_eq!(op.is_read(), op.action().is_some_and(|a| a.is_read()));
    }
    let reads: Vec<_> = one_of_each()
        .iter()
        .filter(|op| op.is_read())
        .map(|op| op.name())
        .collect();
    assert_eq!(
        reads,
        [
            "get",
            "get_counter",
            "contains",
            "map_get",
            "map_get_counter",
            "len",
            "read_all"
        ]
    );
}
