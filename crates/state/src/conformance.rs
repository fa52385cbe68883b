//! The backend conformance suite: what every [`Backend`] must do, checked the same way for each
//! (FlexState §III-A2: swapping the store must not change what an NF sees).
//!
//! ```
//! use flowstate_state::{conformance, local::LocalStore};
//!
//! conformance::run_all(&LocalStore::new());
//! ```
//!
//! Promises:
//! * Each check asserts exact replies and panics on the first difference with a message naming
//!   the check, the backend and the operation (`conformance check 'list' failed on backend
//!   'local': batch #4, op #0: Pop { .. }: expected ..., got ...`).
//! * Each check works in its own namespace (NF name `conf-<check>-<pid>-<n>-<nanos>`), so checks
//!   can run in parallel and against a store other programs use; each deletes what it wrote
//!   when it passes (anything left behind by a failure stays in that namespace).
//! * Time to live and lease checks use the real clock with short times
//!   ([`Options::short_ttl`], waiting [`Options::ttl_wait`]); the whole suite takes a few
//!   seconds against an in-process store.
//!
//! Two points where backends may differ are accepted both ways: a collection emptied by
//! [`Op::Pop`], [`Op::Remove`] or [`Op::MapDelete`] may be removed ([`Reply::Object`]`(None)`)
//! or kept empty; everything else is exact.

use crate::{Backend, Connector, Kind, Object, ObjectKey, Op, OpError, Owner, Reply};
use core::fmt::Debug;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// What a backend is held to where stores legitimately differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Options {
    /// The time to live and lease the time checks set.
    pub short_ttl: Duration,
    /// How long the time checks wait for `short_ttl` to pass.
    pub ttl_wait: Duration,
    /// Whether [`OpError::WrongKind`] must name the kind the store holds exactly. Stores whose
    /// native types stand for several kinds (a Redis string holds values and counters) set
    /// `false`: the key and the wanted kind are still checked.
    pub exact_found_kind: bool,
}

impl Options {
    /// Millisecond timers, exact errors: the `local` store and our own.
    pub const EXACT: Options = Options {
        short_ttl: Duration::from_millis(150),
        ttl_wait: Duration::from_millis(400),
        exact_found_kind: true,
    };

    /// Timers in whole seconds (Cassandra's `USING TTL`).
    pub const WHOLE_SECONDS: Options = Options {
        short_ttl: Duration::from_secs(1),
        ttl_wait: Duration::from_millis(2_500),
        ..Options::EXACT
    };
}

impl Default for Options {
    fn default() -> Self {
        Options::EXACT
    }
}

/// A lease long enough never to end during a check.
const LONG: Duration = Duration::from_secs(30);

/// One check: runs against a connector's store, panics on a failure.
pub type Check = fn(&dyn Connector, &Options);

/// Every check, by name, in the order [`run_all`] runs them.
pub const CHECKS: &[(&str, Check)] = &[
    ("missing_objects", missing_objects),
    ("value", value),
    ("compare_and_set", compare_and_set),
    ("counter", counter),
    ("list", list),
    ("set", set),
    ("map", map),
    ("counter_map", counter_map),
    ("read_all", read_all),
    ("delete_any_kind", delete_any_kind),
    ("wrong_kind", wrong_kind),
    ("batch_order", batch_order),
    ("partitions", partitions),
    ("ttl_object", ttl_object),
    ("ttl_map_field", ttl_map_field),
    ("locks", locks),
    ("concurrency", concurrency),
    ("large_values", large_values),
    ("binary_bytes", binary_bytes),
];

/// Runs every check against `connector` with [`Options::EXACT`]; panics on the first failure.
pub fn run_all(connector: &dyn Connector) {
    run_all_with(connector, &Options::EXACT);
}

/// Runs every check against `connector`; panics on the first failure.
pub fn run_all_with(connector: &dyn Connector, options: &Options) {
    for (_, check) in CHECKS {
        check(connector, options);
    }
}

/// Runs the check called `name` with [`Options::EXACT`]; panics if it fails or if there is no
/// such check.
pub fn run_check(connector: &dyn Connector, name: &str) {
    run_check_with(connector, name, &Options::EXACT);
}

/// Runs the check called `name`; panics if it fails or if there is no such check.
pub fn run_check_with(connector: &dyn Connector, name: &str, options: &Options) {
    match CHECKS.iter().find(|(n, _)| *n == name) {
        Some((_, check)) => check(connector, options),
        None => panic!("no conformance check named '{name}'"),
    }
}

// ---------------------------------------------------------------------------------------------
// Harness

/// A fresh NF name for one check.
fn namespace(check: &str) -> String {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let n = SEQ.fetch_add(1, Ordering::Relaxed);
    let t = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!(
        "conf-{check}-{}-{n}-{}",
        std::process::id(),
        t % 1_000_000_000_000
    )
}

/// Debug text cut to a readable length (values may be a MiB).
fn short<T: Debug + ?Sized>(v: &T) -> String {
    const MAX: usize = 300;
    let s = format!("{v:?}");
    if s.len() <= MAX {
        return s;
    }
    let mut cut = MAX;
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}... ({} more characters)", &s[..cut], s.len() - cut)
}

/// One check's connection and namespace.
struct Ctx {
    check: &'static str,
    options: Options,
    backend: &'static str,
    conn: Box<dyn Backend>,
    nf: String,
    /// Objects to delete when the check passes.
    keys: Vec<ObjectKey>,
    /// Locks to release when the check passes.
    locks: Vec<(ObjectKey, u64)>,
    /// Batches run so far, to place a failure in the check.
    batches: usize,
}

impl Ctx {
    fn new(check: &'static str, connector: &dyn Connector, options: &Options) -> Ctx {
        Ctx::with_nf(check, connector, options, namespace(check))
    }

    /// Another connection in the same namespace.
    fn with_nf(
        check: &'static str,
        connector: &dyn Connector,
        options: &Options,
        nf: String,
    ) -> Ctx {
        let conn = connector.connect().unwrap_or_else(|e| {
            panic!(
                "conformance check '{check}' failed on backend '{}': connect: {e}",
                connector.name()
            )
        });
        Ctx {
            check,
            options: *options,
            backend: conn.name(),
            conn,
            nf,
            keys: Vec::new(),
            locks: Vec::new(),
            batches: 0,
        }
    }

    fn fail(&self, what: String) -> ! {
        panic!(
            "conformance check '{}' failed on backend '{}': {what}",
            self.check, self.backend
        )
    }

    fn remember(&mut self, k: &ObjectKey) {
        if !self.keys.contains(k) {
            self.keys.push(k.clone());
        }
    }

    /// `nf@Type@id` in this check's namespace.
    fn shared(&mut self, kind: Kind, id: &str) -> ObjectKey {
        let k = ObjectKey::shared(&self.nf, kind, id);
        self.remember(&k);
        k
    }

    /// `nf@instance@core@Type@id` in this check's namespace.
    fn part(&mut self, instance: u32, core: u32, kind: Kind, id: &str) -> ObjectKey {
        let k = ObjectKey::partitioned(&Owner::new(&self.nf, instance, core), kind, id);
        self.remember(&k);
        k
    }

    /// Runs a batch; one reply per op or the check fails.
    fn exec(&mut self, ops: &[Op]) -> Vec<Reply> {
        self.batches += 1;
        let mut replies = Vec::new();
        if let Err(e) = self.conn.execute(ops, &mut replies) {
            let first = ops.first().map(short).unwrap_or_default();
            self.fail(format!(
                "batch of {} ops starting with {first}: {e}",
                ops.len()
            ));
        }
        if replies.len() != ops.len() {
            self.fail(format!(
                "{} replies to a batch of {} ops",
                replies.len(),
                ops.len()
            ));
        }
        replies
    }

    /// Runs `op` alone and checks its reply.
    fn expect(&mut self, op: Op, want: Reply) {
        self.expect_batch(vec![(op, want)]);
    }

    /// Runs the ops as one batch and checks every reply.
    fn expect_batch(&mut self, pairs: Vec<(Op, Reply)>) {
        let (ops, wants): (Vec<Op>, Vec<Reply>) = pairs.into_iter().unzip();
        let got = self.exec(&ops);
        for (i, ((op, want), got)) in ops.iter().zip(&wants).zip(&got).enumerate() {
            if !self.same(want, got) {
                self.fail(format!(
                    "batch #{}, op #{i}: {}: expected {}, got {}",
                    self.batches,
                    short(op),
                    short(want),
                    short(got)
                ));
            }
        }
    }

    /// Whether `got` is the reply `want`, up to what [`Options`] lets a backend differ in.
    fn same(&self, want: &Reply, got: &Reply) -> bool {
        match (want, got) {
            (
                Reply::Error(OpError::WrongKind { key, wanted, .. }),
                Reply::Error(OpError::WrongKind {
                    key: k, wanted: w, ..
                }),
            ) if !self.options.exact_found_kind => key == k && wanted == w,
            _ => want == got,
        }
    }

    /// The object under `key` is absent, or (for collections) empty.
    fn expect_gone(&mut self, key: &ObjectKey, kind: Kind) {
        let op = Op::ReadAll {
            key: key.clone(),
            kind,
        };
        let got = self.exec(std::slice::from_ref(&op)).remove(0);
        let ok = match &got {
            Reply::Object(None) => true,
            Reply::Object(Some(o)) => match o {
                Object::List(v) | Object::Set(v) => v.is_empty(),
                Object::Map(v) => v.is_empty(),
                Object::CounterMap(v) => v.is_empty(),
                Object::Value(_) | Object::Counter(_) => false,
            },
            _ => false,
        };
        if !ok {
            self.fail(format!(
                "{}: expected Object(None) or an empty collection, got {}",
                short(&op),
                short(&got)
            ));
        }
    }

    fn partitions(&mut self, kind: Kind, id: &str) -> Vec<ObjectKey> {
        let nf = self.nf.clone();
        match self.conn.partitions(&nf, kind, id) {
            Ok(p) => p,
            Err(e) => self.fail(format!("partitions({nf}, {}, {id}): {e}", kind.name())),
        }
    }

    fn expect_partitions(&mut self, kind: Kind, id: &str, mut want: Vec<ObjectKey>) {
        want.sort();
        let got = self.partitions(kind, id);
        if got != want {
            let show =
                |v: &[ObjectKey]| v.iter().map(|k| k.as_str()).collect::<Vec<_>>().join(", ");
            self.fail(format!(
                "partitions({}, {}, {id}): expected [{}], got [{}]",
                self.nf,
                kind.name(),
                show(&want),
                show(&got)
            ));
        }
    }

    /// Deletes everything the check wrote and releases its locks.
    fn finish(mut self) {
        let mut ops: Vec<Op> = self
            .keys
            .iter()
            .map(|k| Op::Delete { key: k.clone() })
            .collect();
        ops.extend(self.locks.iter().map(|(k, o)| Op::Unlock {
            key: k.clone(),
            owner: *o,
        }));
        if !ops.is_empty() {
            self.exec(&ops);
        }
    }
}

/// Short constructors for the operations on one key, so checks read as a script.
pub(crate) trait KeyOps {
    fn get(&self) -> Op;
    fn set(&self, value: impl AsRef<[u8]>) -> Op;
    fn delete(&self) -> Op;
    fn add(&self, delta: i64) -> Op;
    fn get_counter(&self) -> Op;
    fn set_counter(&self, value: i64) -> Op;
    fn push(&self, item: impl AsRef<[u8]>) -> Op;
    fn pop(&self) -> Op;
    fn insert(&self, member: impl AsRef<[u8]>) -> Op;
    fn remove(&self, member: impl AsRef<[u8]>) -> Op;
    fn contains(&self, member: impl AsRef<[u8]>) -> Op;
    fn map_get(&self, field: impl AsRef<[u8]>) -> Op;
    fn map_set(&self, field: impl AsRef<[u8]>, value: impl AsRef<[u8]>) -> Op;
    fn map_delete(&self, field: impl AsRef<[u8]>) -> Op;
    fn map_add(&self, field: impl AsRef<[u8]>, delta: i64) -> Op;
    fn map_get_counter(&self, field: impl AsRef<[u8]>) -> Op;
    fn cas(&self, expected: Option<&[u8]>, new: Option<&[u8]>) -> Op;
    fn expire(&self, ttl: Duration) -> Op;
    fn expire_field(&self, field: impl AsRef<[u8]>, ttl: Duration) -> Op;
    fn len(&self, kind: Kind) -> Op;
    fn read_all(&self, kind: Kind) -> Op;
    fn lock(&self, owner: u64, lease: Duration) -> Op;
    fn unlock(&self, owner: u64) -> Op;
}

impl KeyOps for ObjectKey {
    fn get(&self) -> Op {
        Op::Get { key: self.clone() }
    }
    fn set(&self, value: impl AsRef<[u8]>) -> Op {
        Op::Set {
            key: self.clone(),
            value: value.as_ref().to_vec(),
        }
    }
    fn delete(&self) -> Op {
        Op::Delete { key: self.clone() }
    }
    fn add(&self, delta: i64) -> Op {
        Op::Add {
            key: self.clone(),
            delta,
        }
    }
    fn get_counter(&self) -> Op {
        Op::GetCounter { key: self.clone() }
    }
    fn set_counter(&self, value: i64) -> Op {
        Op::SetCounter {
            key: self.clone(),
            value,
        }
    }
    fn push(&self, item: impl AsRef<[u8]>) -> Op {
        Op::Push {
            key: self.clone(),
            item: item.as_ref().to_vec(),
        }
    }
    fn pop(&self) -> Op {
        Op::Pop { key: self.clone() }
    }
    fn insert(&self, member: impl AsRef<[u8]>) -> Op {
        Op::Insert {
            key: self.clone(),
            member: member.as_ref().to_vec(),
        }
    }
    fn remove(&self, member: impl AsRef<[u8]>) -> Op {
        Op::Remove {
            key: self.clone(),
            member: member.as_ref().to_vec(),
        }
    }
    fn contains(&self, member: impl AsRef<[u8]>) -> Op {
        Op::Contains {
            key: self.clone(),
            member: member.as_ref().to_vec(),
        }
    }
    fn map_get(&self, field: impl AsRef<[u8]>) -> Op {
        Op::MapGet {
            key: self.clone(),
            field: field.as_ref().to_vec(),
        }
    }
    fn map_set(&self, field: impl AsRef<[u8]>, value: impl AsRef<[u8]>) -> Op {
        let (field, value) = (field.as_ref().to_vec(), value.as_ref().to_vec());
        Op::MapSet {
            key: self.clone(),
            field,
            value,
        }
    }
    fn map_delete(&self, field: impl AsRef<[u8]>) -> Op {
        Op::MapDelete {
            key: self.clone(),
            field: field.as_ref().to_vec(),
        }
    }
    fn map_add(&self, field: impl AsRef<[u8]>, delta: i64) -> Op {
        Op::MapAdd {
            key: self.clone(),
            field: field.as_ref().to_vec(),
            delta,
        }
    }
    fn map_get_counter(&self, field: impl AsRef<[u8]>) -> Op {
        Op::MapGetCounter {
            key: self.clone(),
            field: field.as_ref().to_vec(),
        }
    }
    fn cas(&self, expected: Option<&[u8]>, new: Option<&[u8]>) -> Op {
        let (expected, new) = (expected.map(<[u8]>::to_vec), new.map(<[u8]>::to_vec));
        Op::CompareAndSet {
            key: self.clone(),
            expected,
            new,
        }
    }
    fn expire(&self, ttl: Duration) -> Op {
        Op::Expire {
            key: self.clone(),
            field: None,
            ttl,
        }
    }
    fn expire_field(&self, field: impl AsRef<[u8]>, ttl: Duration) -> Op {
        Op::Expire {
            key: self.clone(),
            field: Some(field.as_ref().to_vec()),
            ttl,
        }
    }
    fn len(&self, kind: Kind) -> Op {
        Op::Len {
            key: self.clone(),
            kind,
        }
    }
    fn read_all(&self, kind: Kind) -> Op {
        Op::ReadAll {
            key: self.clone(),
            kind,
        }
    }
    fn lock(&self, owner: u64, lease: Duration) -> Op {
        Op::Lock {
            key: self.clone(),
            owner,
            lease,
        }
    }
    fn unlock(&self, owner: u64) -> Op {
        Op::Unlock {
            key: self.clone(),
            owner,
        }
    }
}

fn b(s: &str) -> Vec<u8> {
    s.as_bytes().to_vec()
}

fn some(s: &str) -> Reply {
    Reply::Value(Some(b(s)))
}

fn wrong(key: &ObjectKey, wanted: Kind, found: Kind) -> Reply {
    Reply::Error(OpError::WrongKind {
        key: key.to_string(),
        wanted: wanted.name(),
        found: found.name(),
    })
}

// ---------------------------------------------------------------------------------------------
// Checks

/// Every read of an object that was never written answers "absent", zero or empty.
fn missing_objects(c: &dyn Connector, o: &Options) {
    let mut x = Ctx::new("missing_objects", c, o);
    let v = x.shared(Kind::Value, "v");
    let n = x.shared(Kind::Counter, "c");
    let l = x.shared(Kind::List, "l");
    let s = x.shared(Kind::Set, "s");
    let m = x.shared(Kind::Map, "m");
    let cm = x.shared(Kind::CounterMap, "cm");
    let lock = x.shared(Kind::Value, "lock");
    x.expect_batch(vec![
        (v.get(), Reply::Value(None)),
        (n.get_counter(), Reply::Int(0)),
        (l.pop(), Reply::Value(None)),
        (s.contains("a"), Reply::Bool(false)),
        (s.remove("a"), Reply::Bool(false)),
        (m.map_get("f"), Reply::Value(None)),
        (m.map_delete("f"), Reply::Bool(false)),
        (cm.map_get_counter("f"), Reply::Int(0)),
        (cm.map_delete("f"), Reply::Bool(false)),
        (l.len(Kind::List), Reply::Len(0)),
        (s.len(Kind::Set), Reply::Len(0)),
        (m.len(Kind::Map), Reply::Len(0)),
        (cm.len(Kind::CounterMap), Reply::Len(0)),
        (v.read_all(Kind::Value), Reply::Object(None)),
        (n.read_all(Kind::Counter), Reply::Object(None)),
        (l.read_all(Kind::List), Reply::Object(None)),
        (s.read_all(Kind::Set), Reply::Object(None)),
        (m.read_all(Kind::Map), Reply::Object(None)),
        (cm.read_all(Kind::CounterMap), Reply::Object(None)),
        (v.delete(), Reply::Bool(false)),
        (v.expire(LONG), Reply::Bool(false)),
        (m.expire_field("f", LONG), Reply::Bool(false)),
        (lock.unlock(1), Reply::Bool(false)),
        // Reads create nothing.
        (v.get(), Reply::Value(None)),
        (l.len(Kind::List), Reply::Len(0)),
    ]);
    for kind in Kind::ALL {
        x.expect_partitions(kind, "v", vec![]);
    }
    x.finish();
}

/// Values: get, set, overwrite, delete.
fn value(c: &dyn Connector, o: &Options) {
    let mut x = Ctx::new("value", c, o);
    let v = x.shared(Kind::Value, "v");
    let w = x.part(1, 2, Kind::Value, "v");
    x.expect(v.get(), Reply::Value(None));
    x.expect(v.set("one"), Reply::Done);
    x.expect(v.get(), some("one"));
    x.expect(v.set("two, longer"), Reply::Done);
    x.expect(v.get(), some("two, longer"));
    x.expect(v.set("3"), Reply::Done);
    x.expect(v.get(), some("3"));
    // Another key with the same id is another object.
    x.expect(w.get(), Reply::Value(None));
    x.expect(w.set("w"), Reply::Done);
    x.expect(v.delete(), Reply::Bool(true));
    x.expect(v.delete(), Reply::Bool(false));
    x.expect(v.get(), Reply::Value(None));
    x.expect(w.get(), some("w"));
    x.expect(v.set("again"), Reply::Done);
    x.expect(v.get(), some("again"));
    x.finish();
}

/// Compare-and-set: set when absent, refuse on a wrong expectation, replace, delete.
fn compare_and_set(c: &dyn Connector, o: &Options) {
    let mut x = Ctx::new("compare_and_set", c, o);
    let v = x.shared(Kind::Value, "v");
    let cas = |expected: Option<&str>, new: Option<&str>| {
        v.cas(expected.map(str::as_bytes), new.map(str::as_bytes))
    };
    x.expect(cas(Some("a"), Some("b")), Reply::Bool(false));
    x.expect(v.get(), Reply::Value(None));
    x.expect(cas(None, Some("a")), Reply::Bool(true));
    x.expect(v.get(), some("a"));
    x.expect(cas(None, Some("b")), Reply::Bool(false));
    x.expect(cas(Some("x"), Some("b")), Reply::Bool(false));
    x.expect(cas(Some(""), Some("b")), Reply::Bool(false));
    x.expect(v.get(), some("a"));
    x.expect(cas(Some("a"), Some("b")), Reply::Bool(true));
    x.expect(v.get(), some("b"));
    x.expect(cas(Some("a"), None), Reply::Bool(false));
    x.expect(v.get(), some("b"));
    x.expect(cas(Some("b"), None), Reply::Bool(true));
    x.expect(v.get(), Reply::Value(None));
    x.expect(v.delete(), Reply::Bool(false));
    // An empty value is present, not absent.
    x.expect(cas(None, Some("")), Reply::Bool(true));
    x.expect(cas(None, Some("z")), Reply::Bool(false));
    x.expect(cas(Some(""), Some("z")), Reply::Bool(true));
    x.expect(v.get(), some("z"));
    x.finish();
}

/// Counters: missing reads 0, add (also negative), set, delete.
fn counter(c: &dyn Connector, o: &Options) {
    let mut x = Ctx::new("counter", c, o);
    let n = x.shared(Kind::Counter, "n");
    let m = x.part(0, 3, Kind::Counter, "n");
    x.expect(n.get_counter(), Reply::Int(0));
    x.expect(n.add(5), Reply::Int(5));
    x.expect(n.add(-8), Reply::Int(-3));
    x.expect(n.add(0), Reply::Int(-3));
    x.expect(n.get_counter(), Reply::Int(-3));
    x.expect(n.set_counter(100), Reply::Done);
    x.expect(n.get_counter(), Reply::Int(100));
    x.expect(n.add(1), Reply::Int(101));
    x.expect(m.add(-7), Reply::Int(-7));
    x.expect(m.get_counter(), Reply::Int(-7));
    x.expect(m.set_counter(i64::MAX), Reply::Done);
    x.expect(m.get_counter(), Reply::Int(i64::MAX));
    x.expect(m.set_counter(i64::MIN), Reply::Done);
    x.expect(m.get_counter(), Reply::Int(i64::MIN));
    x.expect(m.add(1), Reply::Int(i64::MIN + 1));
    x.expect(n.delete(), Reply::Bool(true));
    x.expect(n.get_counter(), Reply::Int(0));
    x.expect(n.delete(), Reply::Bool(false));
    x.expect(n.add(2), Reply::Int(2));
    x.expect(n.set_counter(0), Reply::Done);
    x.expect(n.get_counter(), Reply::Int(0));
    x.finish();
}

/// Lists: first in, first out; pop of an empty list; length.
fn list(c: &dyn Connector, o: &Options) {
    let mut x = Ctx::new("list", c, o);
    let l = x.shared(Kind::List, "l");
    x.expect(l.pop(), Reply::Value(None));
    x.expect(l.len(Kind::List), Reply::Len(0));
    x.expect(l.push("a"), Reply::Len(1));
    x.expect(l.push("b"), Reply::Len(2));
    x.expect(l.push("c"), Reply::Len(3));
    x.expect(l.push("a"), Reply::Len(4));
    x.expect(l.len(Kind::List), Reply::Len(4));
    x.expect(l.pop(), some("a"));
    x.expect(l.pop(), some("b"));
    x.expect(l.len(Kind::List), Reply::Len(2));
    x.expect(l.push("d"), Reply::Len(3));
    x.expect(l.pop(), some("c"));
    x.expect(l.pop(), some("a"));
    x.expect(l.pop(), some("d"));
    x.expect(l.pop(), Reply::Value(None));
    x.expect(l.len(Kind::List), Reply::Len(0));
    x.expect_gone(&l, Kind::List);
    // Usable again after being emptied.
    x.expect(l.push("e"), Reply::Len(1));
    x.expect(l.pop(), some("e"));
    x.expect(l.pop(), Reply::Value(None));
    x.finish();
}

/// Sets: insert, duplicates, contains, remove, length.
fn set(c: &dyn Connector, o: &Options) {
    let mut x = Ctx::new("set", c, o);
    let s = x.shared(Kind::Set, "s");
    let len = s.len(Kind::Set);
    x.expect(s.insert("b"), Reply::Bool(true));
    x.expect(s.insert("a"), Reply::Bool(true));
    x.expect(s.insert("b"), Reply::Bool(false));
    x.expect(s.insert("c"), Reply::Bool(true));
    x.expect(s.insert("a"), Reply::Bool(false));
    x.expect(len.clone(), Reply::Len(3));
    x.expect(s.contains("a"), Reply::Bool(true));
    x.expect(s.contains("z"), Reply::Bool(false));
    x.expect(
        s.read_all(Kind::Set),
        Reply::Object(Some(Object::Set(vec![b("a"), b("b"), b("c")]))),
    );
    x.expect(s.remove("a"), Reply::Bool(true));
    x.expect(s.remove("a"), Reply::Bool(false));
    x.expect(s.contains("a"), Reply::Bool(false));
    x.expect(len.clone(), Reply::Len(2));
    x.expect(s.remove("b"), Reply::Bool(true));
    x.expect(s.remove("c"), Reply::Bool(true));
    x.expect(len.clone(), Reply::Len(0));
    x.expect(s.contains("b"), Reply::Bool(false));
    x.expect_gone(&s, Kind::Set);
    x.expect(s.insert("a"), Reply::Bool(true));
    x.expect(len, Reply::Len(1));
    x.finish();
}

/// Maps: set, get, overwrite, delete, length, sorted read-all.
fn map(c: &dyn Connector, o: &Options) {
    let mut x = Ctx::new("map", c, o);
    let m = x.shared(Kind::Map, "m");
    let set = |f: &str, v: &str| m.map_set(f, v);
    let get = |f: &str| m.map_get(f);
    let del = |f: &str| m.map_delete(f);
    let len = m.len(Kind::Map);
    x.expect(get("f1"), Reply::Value(None));
    x.expect(set("f2", "v2"), Reply::Done);
    x.expect(set("f1", "v1"), Reply::Done);
    x.expect(set("f3", "v3"), Reply::Done);
    x.expect(get("f1"), some("v1"));
    x.expect(get("f4"), Reply::Value(None));
    x.expect(len.clone(), Reply::Len(3));
    x.expect(set("f1", "v1b"), Reply::Done);
    x.expect(get("f1"), some("v1b"));
    x.expect(len.clone(), Reply::Len(3));
    x.expect(
        m.read_all(Kind::Map),
        Reply::Object(Some(Object::Map(vec![
            (b("f1"), b("v1b")),
            (b("f2"), b("v2")),
            (b("f3"), b("v3")),
        ]))),
    );
    x.expect(del("f1"), Reply::Bool(true));
    x.expect(del("f1"), Reply::Bool(false));
    x.expect(get("f1"), Reply::Value(None));
    x.expect(len.clone(), Reply::Len(2));
    x.expect(del("f2"), Reply::Bool(true));
    x.expect(del("f3"), Reply::Bool(true));
    x.expect(len, Reply::Len(0));
    x.expect_gone(&m, Kind::Map);
    x.finish();
}

/// Counter-maps: add to fields (missing = 0), get, delete, sorted read-all.
fn counter_map(c: &dyn Connector, o: &Options) {
    let mut x = Ctx::new("counter_map", c, o);
    let m = x.shared(Kind::CounterMap, "cm");
    let add = |f: &str, d: i64| m.map_add(f, d);
    let get = |f: &str| m.map_get_counter(f);
    let del = |f: &str| m.map_delete(f);
    x.expect(get("f"), Reply::Int(0));
    x.expect(add("f", 3), Reply::Int(3));
    x.expect(add("f", -5), Reply::Int(-2));
    x.expect(add("g", 10), Reply::Int(10));
    x.expect(add("e", 0), Reply::Int(0));
    x.expect(get("f"), Reply::Int(-2));
    x.expect(get("zz"), Reply::Int(0));
    x.expect(m.len(Kind::CounterMap), Reply::Len(3));
    x.expect(
        m.read_all(Kind::CounterMap),
        Reply::Object(Some(Object::CounterMap(vec![
            (b("e"), 0),
            (b("f"), -2),
            (b("g"), 10),
        ]))),
    );
    x.expect(del("f"), Reply::Bool(true));
    x.expect(get("f"), Reply::Int(0));
    x.expect(del("f"), Reply::Bool(false));
    x.expect(add("f", 1), Reply::Int(1));
    x.expect(m.len(Kind::CounterMap), Reply::Len(3));
    for f in ["e", "f", "g"] {
        x.expect(del(f), Reply::Bool(true));
    }
    x.expect_gone(&m, Kind::CounterMap);
    x.finish();
}

/// Read-all of every kind returns the whole object; collections sorted by bytes, lists in
/// order.
fn read_all(c: &dyn Connector, o: &Options) {
    let mut x = Ctx::new("read_all", c, o);
    let v = x.part(0, 0, Kind::Value, "o");
    let n = x.part(0, 0, Kind::Counter, "o");
    let l = x.part(0, 0, Kind::List, "o");
    let s = x.part(0, 0, Kind::Set, "o");
    let m = x.part(0, 0, Kind::Map, "o");
    let cm = x.part(0, 0, Kind::CounterMap, "o");
    let mut ops = vec![v.set("val"), n.set_counter(-42)];
    for w in ["c", "a", "b", "a"] {
        ops.push(l.push(w));
        ops.push(s.insert(w));
        ops.push(m.map_set(w, w.repeat(2)));
        ops.push(cm.map_add(w, 2));
    }
    x.exec(&ops);
    let pairs = |v: &[(&str, &str)]| v.iter().map(|(f, x)| (b(f), b(x))).collect::<Vec<_>>();
    x.expect_batch(vec![
        (
            v.read_all(Kind::Value),
            Reply::Object(Some(Object::Value(b("val")))),
        ),
        (
            n.read_all(Kind::Counter),
            Reply::Object(Some(Object::Counter(-42))),
        ),
        (
            l.read_all(Kind::List),
            Reply::Object(Some(Object::List(vec![b("c"), b("a"), b("b"), b("a")]))),
        ),
        (
            s.read_all(Kind::Set),
            Reply::Object(Some(Object::Set(vec![b("a"), b("b"), b("c")]))),
        ),
        (
            m.read_all(Kind::Map),
            Reply::Object(Some(Object::Map(pairs(&[
                ("a", "aa"),
                ("b", "bb"),
                ("c", "cc"),
            ])))),
        ),
        (
            cm.read_all(Kind::CounterMap),
            Reply::Object(Some(Object::CounterMap(vec![
                (b("a"), 4),
                (b("b"), 2),
                (b("c"), 2),
            ]))),
        ),
        // Reading changes nothing.
        (l.len(Kind::List), Reply::Len(4)),
        (l.pop(), some("c")),
    ]);
    x.finish();
}

/// Delete removes an object of any kind and says whether it existed.
fn delete_any_kind(c: &dyn Connector, o: &Options) {
    let mut x = Ctx::new("delete_any_kind", c, o);
    let v = x.shared(Kind::Value, "d");
    let n = x.shared(Kind::Counter, "d");
    let l = x.shared(Kind::List, "d");
    let s = x.shared(Kind::Set, "d");
    let m = x.shared(Kind::Map, "d");
    let cm = x.shared(Kind::CounterMap, "d");
    x.exec(&[
        v.set("x"),
        n.add(3),
        l.push("x"),
        s.insert("x"),
        m.map_set("f", "x"),
        cm.map_add("f", 1),
    ]);
    let all = [&v, &n, &l, &s, &m, &cm];
    x.expect_batch(
        all.iter()
            .map(|k| (k.delete(), Reply::Bool(true)))
            .collect(),
    );
    x.expect_batch(
        all.iter()
            .map(|k| (k.delete(), Reply::Bool(false)))
            .collect(),
    );
    x.expect_batch(vec![
        (v.get(), Reply::Value(None)),
        (n.get_counter(), Reply::Int(0)),
        (l.len(Kind::List), Reply::Len(0)),
        (s.len(Kind::Set), Reply::Len(0)),
        (m.len(Kind::Map), Reply::Len(0)),
        (cm.map_get_counter("f"), Reply::Int(0)),
    ]);
    for (k, kind) in [
        (&v, Kind::Value),
        (&n, Kind::Counter),
        (&l, Kind::List),
        (&s, Kind::Set),
        (&m, Kind::Map),
        (&cm, Kind::CounterMap),
    ] {
        x.expect(k.read_all(kind), Reply::Object(None));
    }
    x.finish();
}

/// An operation on a key holding another kind fails alone: the rest of the batch runs and
/// the object is unchanged. (Pairs every store can tell apart: not value/counter, not
/// map/counter-map.)
fn wrong_kind(c: &dyn Connector, o: &Options) {
    let mut x = Ctx::new("wrong_kind", c, o);
    let l = x.shared(Kind::List, "l");
    let m = x.shared(Kind::Map, "m");
    let s = x.shared(Kind::Set, "s");
    let v = x.shared(Kind::Value, "v");
    let n = x.shared(Kind::Counter, "n");
    x.expect_batch(vec![
        (l.push("a"), Reply::Len(1)),
        (l.get(), wrong(&l, Kind::Value, Kind::List)),
        (l.set("x"), wrong(&l, Kind::Value, Kind::List)),
        (l.add(1), wrong(&l, Kind::Counter, Kind::List)),
        (l.insert("x"), wrong(&l, Kind::Set, Kind::List)),
        (l.map_set("f", "x"), wrong(&l, Kind::Map, Kind::List)),
        (l.map_add("f", 1), wrong(&l, Kind::CounterMap, Kind::List)),
        (l.push("b"), Reply::Len(2)),
        (
            l.read_all(Kind::List),
            Reply::Object(Some(Object::List(vec![b("a"), b("b")]))),
        ),
        (m.map_set("f", "1"), Reply::Done),
        (m.push("x"), wrong(&m, Kind::List, Kind::Map)),
        (m.pop(), wrong(&m, Kind::List, Kind::Map)),
        (m.contains("f"), wrong(&m, Kind::Set, Kind::Map)),
        (m.len(Kind::Set), wrong(&m, Kind::Set, Kind::Map)),
        (m.read_all(Kind::List), wrong(&m, Kind::List, Kind::Map)),
        (m.map_get("f"), some("1")),
        (s.insert("a"), Reply::Bool(true)),
        (s.get_counter(), wrong(&s, Kind::Counter, Kind::Set)),
        (s.cas(None, Some(b"x")), wrong(&s, Kind::Value, Kind::Set)),
        (s.expire_field("a", LONG), wrong(&s, Kind::Map, Kind::Set)),
        (s.map_get("a"), wrong(&s, Kind::Map, Kind::Set)),
        (s.contains("a"), Reply::Bool(true)),
        (v.set("x"), Reply::Done),
        (v.pop(), wrong(&v, Kind::List, Kind::Value)),
        (v.map_get("f"), wrong(&v, Kind::Map, Kind::Value)),
        (v.remove("x"), wrong(&v, Kind::Set, Kind::Value)),
        (v.len(Kind::List), wrong(&v, Kind::List, Kind::Value)),
        (v.get(), some("x")),
        (n.add(4), Reply::Int(4)),
        (n.push("x"), wrong(&n, Kind::List, Kind::Counter)),
        (n.insert("x"), wrong(&n, Kind::Set, Kind::Counter)),
        (
            n.map_get_counter("f"),
            wrong(&n, Kind::CounterMap, Kind::Counter),
        ),
        (n.get_counter(), Reply::Int(4)),
    ]);
    x.finish();
}

/// Operations of one batch apply in order: a read sees every earlier write of its batch.
fn batch_order(c: &dyn Connector, o: &Options) {
    let mut x = Ctx::new("batch_order", c, o);
    let v = x.shared(Kind::Value, "v");
    let n = x.shared(Kind::Counter, "n");
    let l = x.shared(Kind::List, "l");
    let s = x.shared(Kind::Set, "s");
    let m = x.shared(Kind::Map, "m");
    if !x.exec(&[]).is_empty() {
        x.fail("replies to an empty batch".into());
    }
    x.expect_batch(vec![
        (v.set("a"), Reply::Done),
        (v.get(), some("a")),
        (v.set("b"), Reply::Done),
        (v.get(), some("b")),
        (n.add(1), Reply::Int(1)),
        (n.add(2), Reply::Int(3)),
        (n.get_counter(), Reply::Int(3)),
        (n.set_counter(10), Reply::Done),
        (n.add(-1), Reply::Int(9)),
        (l.push("x"), Reply::Len(1)),
        (l.push("y"), Reply::Len(2)),
        (l.pop(), some("x")),
        (l.len(Kind::List), Reply::Len(1)),
        (s.insert("m"), Reply::Bool(true)),
        (s.contains("m"), Reply::Bool(true)),
        (s.remove("m"), Reply::Bool(true)),
        (s.contains("m"), Reply::Bool(false)),
        (m.map_set("f", "1"), Reply::Done),
        (m.map_set("f", "2"), Reply::Done),
        (m.map_get("f"), some("2")),
        (m.map_delete("f"), Reply::Bool(true)),
        (m.map_get("f"), Reply::Value(None)),
        (v.delete(), Reply::Bool(true)),
        (v.get(), Reply::Value(None)),
        (v.cas(None, Some(b"c")), Reply::Bool(true)),
        (v.get(), some("c")),
    ]);
    // The next batch sees the last one's effects.
    x.expect_batch(vec![
        (v.get(), some("c")),
        (n.get_counter(), Reply::Int(9)),
        (l.pop(), some("y")),
    ]);
    x.finish();
}

/// `partitions` lists exactly the partitions written of one object: every owner's and the
/// shared one, not another id, kind or NF, not deleted ones, not locks.
fn partitions(c: &dyn Connector, o: &Options) {
    let mut x = Ctx::new("partitions", c, o);
    let owners = [
        (0, 0),
        (0, 1),
        (1, 0),
        (2, 3),
        (10, 2),
        (3, 10),
        (u32::MAX, 7),
    ];
    let mut want: Vec<ObjectKey> = owners
        .iter()
        .map(|&(i, co)| x.part(i, co, Kind::Counter, "flows"))
        .collect();
    want.push(x.shared(Kind::Counter, "flows"));
    let mut ops: Vec<Op> = want.iter().map(|k| k.add(1)).collect();
    // Noise: other ids, another kind, another NF whose name starts with this one's.
    let mut noise = Vec::new();
    for id in ["flows2", "flow", "flows@x", "x@flows"] {
        noise.push(x.part(0, 0, Kind::Counter, id));
        noise.push(x.shared(Kind::Counter, id));
    }
    ops.extend(noise.iter().map(|k| k.add(1)));
    let as_map = x.part(0, 0, Kind::Map, "flows");
    ops.push(as_map.map_set("f", "v"));
    let other_nf = ObjectKey::partitioned(
        &Owner::new(&format!("{}x", x.nf), 0, 0),
        Kind::Counter,
        "flows",
    );
    x.remember(&other_nf);
    ops.push(other_nf.add(1));
    // Ids holding `@`.
    let at_ids = vec![x.part(4, 4, Kind::Set, "a@b"), x.shared(Kind::Set, "a@b")];
    ops.extend(at_ids.iter().map(|k| k.insert("m")));
    let a_only = x.part(4, 4, Kind::Set, "a");
    ops.push(a_only.insert("m"));
    // A lock named like a partition is not one.
    let lock = x.part(5, 5, Kind::Counter, "locked");
    x.locks.push((lock.clone(), 1));
    ops.push(lock.lock(1, LONG));
    x.exec(&ops);

    x.expect_partitions(Kind::Counter, "flows", want.clone());
    x.expect_partitions(Kind::Map, "flows", vec![as_map]);
    x.expect_partitions(Kind::Set, "a@b", at_ids);
    x.expect_partitions(Kind::Set, "a", vec![a_only]);
    x.expect_partitions(
        Kind::Counter,
        "flows@x",
        vec![noise[4].clone(), noise[5].clone()],
    );
    x.expect_partitions(Kind::Counter, "nothing", vec![]);
    x.expect_partitions(Kind::List, "flows", vec![]);
    x.expect_partitions(Kind::Counter, "locked", vec![]);
    // Deleted partitions are gone.
    let gone = want.remove(2);
    x.expect(gone.delete(), Reply::Bool(true));
    x.expect_partitions(Kind::Counter, "flows", want);
    x.finish();
}

/// Time to live on whole objects, with the real clock.
fn ttl_object(c: &dyn Connector, o: &Options) {
    let mut x = Ctx::new("ttl_object", c, o);
    let v = x.part(0, 1, Kind::Value, "t");
    let n = x.shared(Kind::Counter, "t");
    let l = x.shared(Kind::List, "t");
    let m = x.shared(Kind::Map, "t");
    let keep = x.part(0, 2, Kind::Value, "t");
    let missing = x.shared(Kind::Value, "missing");
    x.expect_batch(vec![
        (v.set("x"), Reply::Done),
        (n.add(5), Reply::Int(5)),
        (l.push("i"), Reply::Len(1)),
        (m.map_set("f", "y"), Reply::Done),
        (keep.set("k"), Reply::Done),
        (v.expire(o.short_ttl), Reply::Bool(true)),
        (n.expire(o.short_ttl), Reply::Bool(true)),
        (l.expire(o.short_ttl), Reply::Bool(true)),
        (m.expire(o.short_ttl), Reply::Bool(true)),
        (missing.expire(o.short_ttl), Reply::Bool(false)),
        (v.get(), some("x")),
        (n.get_counter(), Reply::Int(5)),
        (l.len(Kind::List), Reply::Len(1)),
        (m.map_get("f"), some("y")),
    ]);
    std::thread::sleep(o.ttl_wait);
    x.expect_batch(vec![
        (v.get(), Reply::Value(None)),
        (n.get_counter(), Reply::Int(0)),
        (l.len(Kind::List), Reply::Len(0)),
        (l.pop(), Reply::Value(None)),
        (m.map_get("f"), Reply::Value(None)),
        (m.len(Kind::Map), Reply::Len(0)),
        (v.read_all(Kind::Value), Reply::Object(None)),
        (n.read_all(Kind::Counter), Reply::Object(None)),
        (v.delete(), Reply::Bool(false)),
        (n.expire(LONG), Reply::Bool(false)),
        (keep.get(), some("k")),
    ]);
    x.expect_gone(&l, Kind::List);
    x.expect_gone(&m, Kind::Map);
    x.expect_partitions(Kind::Value, "t", vec![keep]);
    // Written again, an expired object starts afresh.
    x.expect(n.add(1), Reply::Int(1));
    x.expect(l.push("j"), Reply::Len(1));
    x.finish();
}

/// Time to live on single map fields, with the real clock.
fn ttl_map_field(c: &dyn Connector, o: &Options) {
    let mut x = Ctx::new("ttl_map_field", c, o);
    let m = x.shared(Kind::Map, "fields");
    let exp = |f: &str| m.expire_field(f, o.short_ttl);
    let get = |f: &str| m.map_get(f);
    let len = m.len(Kind::Map);
    x.expect_batch(vec![
        (m.map_set("a", "1"), Reply::Done),
        (m.map_set("b", "2"), Reply::Done),
        (m.map_set("c", "3"), Reply::Done),
        (exp("a"), Reply::Bool(true)),
        (exp("zz"), Reply::Bool(false)),
        (exp("c"), Reply::Bool(true)),
        (get("a"), some("1")),
        (get("c"), some("3")),
        (len.clone(), Reply::Len(3)),
    ]);
    std::thread::sleep(o.ttl_wait);
    x.expect_batch(vec![
        (get("a"), Reply::Value(None)),
        (get("b"), some("2")),
        (get("c"), Reply::Value(None)),
        (len.clone(), Reply::Len(1)),
        (
            m.read_all(Kind::Map),
            Reply::Object(Some(Object::Map(vec![(b("b"), b("2"))]))),
        ),
        (m.map_delete("a"), Reply::Bool(false)),
        (exp("c"), Reply::Bool(false)),
    ]);
    x.expect_partitions(Kind::Map, "fields", vec![m.clone()]);
    // An expired field can be written again, and lives on.
    x.expect(m.map_set("a", "4"), Reply::Done);
    x.expect(get("a"), some("4"));
    x.finish();
}

/// Locks: grant, re-grant to the same owner, refuse others, release only by the holder, locks
/// apart from objects, and a lease that ends by itself (real clock).
fn locks(c: &dyn Connector, o: &Options) {
    let mut x = Ctx::new("locks", c, o);
    let mut y = Ctx::with_nf("locks", c, o, x.nf.clone());
    // Owner ids at both ends of the range.
    let a = u64::MAX;
    let zero = 0;
    let l = x.shared(Kind::Value, "lock");
    x.locks.extend([
        (l.clone(), a),
        (l.clone(), zero),
        (l.clone(), 5),
        (l.clone(), 6),
    ]);
    x.expect(l.lock(a, LONG), Reply::Bool(true));
    x.expect(l.lock(a, LONG), Reply::Bool(true));
    y.expect(l.lock(zero, LONG), Reply::Bool(false));
    y.expect(l.unlock(zero), Reply::Bool(false));
    y.expect(l.lock(zero, LONG), Reply::Bool(false));
    x.expect(l.unlock(a), Reply::Bool(true));
    x.expect(l.unlock(a), Reply::Bool(false));
    y.expect(l.lock(zero, LONG), Reply::Bool(true));
    x.expect(l.lock(a, LONG), Reply::Bool(false));
    y.expect(l.unlock(zero), Reply::Bool(true));

    // A lock named like an object neither sees nor changes it.
    let d = x.shared(Kind::Value, "data");
    x.locks.push((d.clone(), 3));
    x.expect_batch(vec![
        (d.set("x"), Reply::Done),
        (d.lock(3, LONG), Reply::Bool(true)),
        (d.get(), some("x")),
        (d.delete(), Reply::Bool(true)),
        (d.get(), Reply::Value(None)),
    ]);
    y.expect(d.lock(4, LONG), Reply::Bool(false));
    x.expect(d.unlock(3), Reply::Bool(true));
    y.expect(d.lock(4, LONG), Reply::Bool(true));
    y.expect(d.unlock(4), Reply::Bool(true));
    x.expect(d.get(), Reply::Value(None));

    // A lease ends by itself.
    // (One batch, so that no pause can end the lease between the two.)
    x.expect_batch(vec![
        (l.lock(5, o.short_ttl), Reply::Bool(true)),
        (l.lock(6, LONG), Reply::Bool(false)),
    ]);
    std::thread::sleep(o.ttl_wait);
    y.expect(l.lock(6, LONG), Reply::Bool(true));
    x.expect(l.unlock(5), Reply::Bool(false));
    x.expect(l.lock(5, LONG), Reply::Bool(false));
    y.expect(l.unlock(6), Reply::Bool(true));
    x.finish();
}

/// Four connections at once: 2,000 adds each to one shared counter, plus writes to their own
/// partitions; every add is counted once and every connection's order is kept.
fn concurrency(c: &dyn Connector, o: &Options) {
    const THREADS: u32 = 4;
    const ADDS: usize = 2_000;
    const PER_BATCH: usize = 20;
    let mut x = Ctx::new("concurrency", c, o);
    let shared = x.shared(Kind::Counter, "total");
    let own: Vec<(ObjectKey, ObjectKey, ObjectKey)> = (0..THREADS)
        .map(|t| {
            (
                x.part(t / 2, t % 2, Kind::Counter, "own"),
                x.part(t / 2, t % 2, Kind::List, "own"),
                x.part(t / 2, t % 2, Kind::CounterMap, "own"),
            )
        })
        .collect();
    let nf = x.nf.clone();
    let seen: Vec<Vec<i64>> = std::thread::scope(|scope| {
        let handles: Vec<_> = own
            .iter()
            .map(|(counter, list, cmap)| {
                let nf = nf.clone();
                let shared = shared.clone();
                scope.spawn(move || {
                    let mut y = Ctx::with_nf("concurrency", c, o, nf);
                    let mut seen = Vec::with_capacity(ADDS);
                    let mut i = 0;
                    while i < ADDS {
                        let mut ops = Vec::with_capacity(PER_BATCH * 4);
                        for j in i..i + PER_BATCH {
                            let item = u32::try_from(j).unwrap_or(u32::MAX).to_be_bytes().to_vec();
                            ops.push(shared.add(1));
                            ops.push(counter.add(2));
                            ops.push(list.push(item));
                            ops.push(cmap.map_add(vec![(j % 3) as u8], 1));
                        }
                        let replies = y.exec(&ops);
                        for (k, r) in replies.chunks(4).enumerate() {
                            let j = (i + k) as i64;
                            match r {
                                [Reply::Int(total), Reply::Int(mine), Reply::Len(len), Reply::Int(_)]
                                    if *mine == 2 * (j + 1) && *len == (j + 1) as u64 =>
                                {
                                    seen.push(*total);
                                }
                                _ => y.fail(format!("add #{j}: unexpected replies {}", short(r))),
                            }
                        }
                        i += PER_BATCH;
                    }
                    seen
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
            .collect()
    });
    let total = i64::from(THREADS) * ADDS as i64;
    for (t, s) in seen.iter().enumerate() {
        if s.windows(2).any(|w| w[0] >= w[1]) {
            x.fail(format!(
                "connection {t}: shared counter replies not increasing"
            ));
        }
    }
    let mut all: Vec<i64> = seen.into_iter().flatten().collect();
    all.sort_unstable();
    if all != (1..=total).collect::<Vec<_>>() {
        x.fail(format!(
            "the shared counter's {total} replies are not exactly 1..={total}"
        ));
    }
    x.expect(shared.get_counter(), Reply::Int(total));
    let items: Vec<Vec<u8>> = (0..ADDS as u32).map(|j| j.to_be_bytes().to_vec()).collect();
    let per_field = |f: usize| (0..ADDS).filter(|j| j % 3 == f).count() as i64;
    for (counter, list, cmap) in &own {
        x.expect_batch(vec![
            (counter.get_counter(), Reply::Int(2 * ADDS as i64)),
            (
                list.read_all(Kind::List),
                Reply::Object(Some(Object::List(items.clone()))),
            ),
            (
                cmap.read_all(Kind::CounterMap),
                Reply::Object(Some(Object::CounterMap(
                    (0..3).map(|f| (vec![f as u8], per_field(f))).collect(),
                ))),
            ),
        ]);
    }
    x.expect_partitions(
        Kind::Counter,
        "own",
        own.iter().map(|o| o.0.clone()).collect(),
    );
    x.finish();
}

/// A 1 MiB value, list item and map value round-trip unchanged.
fn large_values(c: &dyn Connector, o: &Options) {
    let mut x = Ctx::new("large_values", c, o);
    let mut state: u32 = 0x9e37_79b9;
    let big: Vec<u8> = (0..1 << 20)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            state.to_le_bytes()[0]
        })
        .collect();
    let v = x.shared(Kind::Value, "big");
    let l = x.shared(Kind::List, "big");
    let m = x.shared(Kind::Map, "big");
    x.expect_batch(vec![
        (v.set(&big), Reply::Done),
        (l.push(&big), Reply::Len(1)),
        (m.map_set("f", &big), Reply::Done),
    ]);
    x.expect(v.get(), Reply::Value(Some(big.clone())));
    x.expect(l.pop(), Reply::Value(Some(big.clone())));
    x.expect(m.map_get("f"), Reply::Value(Some(big.clone())));
    let mut other = big.clone();
    other[(1 << 20) - 1] ^= 1;
    x.expect(v.cas(Some(&other), None), Reply::Bool(false));
    x.expect(v.cas(Some(&big), None), Reply::Bool(true));
    x.finish();
}

/// Values, members and fields of every byte value (NUL, 0xff, invalid UTF-8) and empty ones;
/// sets and maps sorted by bytes; ids with `@` and non-ASCII text.
fn binary_bytes(c: &dyn Connector, o: &Options) {
    let mut x = Ctx::new("binary_bytes", c, o);
    let all: Vec<u8> = (0..=255).collect();
    let rev: Vec<u8> = (0..=255).rev().collect();
    let v = x.shared(Kind::Value, "bin@ary-ü✓");
    let s = x.shared(Kind::Set, "bin");
    let m = x.shared(Kind::Map, "bin");
    let cm = x.shared(Kind::CounterMap, "bin");
    let l = x.shared(Kind::List, "bin");
    x.expect(v.set(&all), Reply::Done);
    x.expect(v.get(), Reply::Value(Some(all.clone())));
    x.expect(v.set(""), Reply::Done);
    x.expect(v.get(), Reply::Value(Some(Vec::new())));
    x.expect_partitions(Kind::Value, "bin@ary-ü✓", vec![v.clone()]);

    // Members: every single byte, the empty member, and the two 256-byte runs, inserted in a
    // scrambled order.
    let mut members: Vec<Vec<u8>> = (0..=255u8).map(|i| vec![i.wrapping_mul(167)]).collect();
    members.extend([Vec::new(), all.clone(), rev.clone()]);
    let mut ops: Vec<Op> = members.iter().map(|mb| s.insert(mb)).collect();
    ops.extend(
        members
            .iter()
            .map(|mb| m.map_set(mb, mb.iter().rev().copied().collect::<Vec<u8>>())),
    );
    ops.extend(members.iter().map(|mb| cm.map_add(mb, mb.len() as i64)));
    ops.extend(members.iter().map(|mb| l.push(mb)));
    x.exec(&ops);
    let mut sorted = members.clone();
    sorted.sort();
    x.expect_batch(vec![
        (s.contains(vec![0]), Reply::Bool(true)),
        (s.contains(""), Reply::Bool(true)),
        (s.contains(vec![0, 0]), Reply::Bool(false)),
        (s.len(Kind::Set), Reply::Len(members.len() as u64)),
        (
            s.read_all(Kind::Set),
            Reply::Object(Some(Object::Set(sorted.clone()))),
        ),
        (m.map_get(""), Reply::Value(Some(Vec::new()))),
        (m.map_get(&all), Reply::Value(Some(rev.clone()))),
        (m.map_get(vec![0xff]), Reply::Value(Some(vec![0xff]))),
        (
            m.read_all(Kind::Map),
            Reply::Object(Some(Object::Map(
                sorted
                    .iter()
                    .map(|f| (f.clone(), f.iter().rev().copied().collect()))
                    .collect(),
            ))),
        ),
        (cm.map_get_counter(&rev), Reply::Int(256)),
        (
            cm.read_all(Kind::CounterMap),
            Reply::Object(Some(Object::CounterMap(
                sorted.iter().map(|f| (f.clone(), f.len() as i64)).collect(),
            ))),
        ),
        (
            l.read_all(Kind::List),
            Reply::Object(Some(Object::List(members.clone()))),
        ),
        (s.remove(""), Reply::Bool(true)),
        (m.map_delete(vec![0]), Reply::Bool(true)),
        (m.map_get(vec![0]), Reply::Value(None)),
        (s.len(Kind::Set), Reply::Len(members.len() as u64 - 1)),
    ]);
    x.finish();
}
