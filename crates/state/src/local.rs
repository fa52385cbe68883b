//! The `local` backend: an in-process store, the embedded default (FlexState §III-A2: a store
//! chosen by configuration; this one needs no server).
//!
//! Promises:
//! * Every [`Op`] behaves as its documentation says, and the store passes the
//!   [`conformance`](crate::conformance) suite like any other backend.
//! * Objects are sharded by key hash over [`LocalConfig::shards`] mutexes. A shard lock is only
//!   taken by whoever calls [`Backend::execute`] (a worker's state thread, a synchronous call),
//!   never on a worker's hot path: workers keep typed caches in front of the store.
//! * Time comes from a clock given at construction (the monotonic system clock by default, a
//!   [`ManualClock`] in tests). Expired objects, map fields and lock leases are invisible to
//!   every operation from their deadline on (FlexState §VI-B "TIMERS"); they are dropped lazily
//!   when touched and by [`LocalStore::purge_expired`].
//! * Locks (FlexState §VI-B "LOCKS") live in their own table: a lock named like an object
//!   neither sees nor changes that object.
//! * With [`LocalConfig::max_objects`] set, an operation that would create an object beyond the
//!   limit replies [`OpError::Refused`]; the store never panics and never grows past it.
//!
//! What each operation does to an object (time to live included: overwrites clear it, as in
//! Redis) is [`flowstate_objects`], which the store server (`flowstate-store`) runs too; this
//! module adds keys, shards, the object limit and the leases.

use crate::backend::{Backend, BackendError, Connector, Op, OpError, Reply};
use crate::key::{Kind, ObjectKey};
use core::fmt;
use flowstate_objects::{Absent, Fault, Leases, Outcome, Spare, Stored};
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// A clock: time elapsed since some fixed origin. Deadlines are kept on this scale.
pub type ClockFn = Arc<dyn Fn() -> Duration + Send + Sync>;

/// How often, at most, a store that is full sweeps every shard for expired objects before it
/// refuses to create one.
const FULL_SWEEP_INTERVAL: Duration = Duration::from_millis(10);

/// Settings of a [`LocalStore`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalConfig {
    /// Number of shards (mutex-protected hash maps) objects are spread over; 0 counts as 1.
    pub shards: usize,
    /// Most objects the store holds (expired ones count until they are dropped); `None`: no
    /// limit.
    pub max_objects: Option<usize>,
}

impl Default for LocalConfig {
    /// 64 shards, no limit.
    fn default() -> Self {
        LocalConfig {
            shards: 64,
            max_objects: None,
        }
    }
}

/// A clock that moves only when told to, for deterministic tests of time to live and leases.
/// Clones share the same time.
#[derive(Debug, Clone, Default)]
pub struct ManualClock(Arc<AtomicU64>);

impl ManualClock {
    /// A clock at time zero.
    pub fn new() -> Self {
        ManualClock::default()
    }

    /// The current time.
    pub fn now(&self) -> Duration {
        Duration::from_nanos(self.0.load(Ordering::SeqCst))
    }

    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        self.0.fetch_add(nanos(by), Ordering::SeqCst);
    }

    /// Sets the clock to `to` (which may be earlier).
    pub fn set(&self, to: Duration) {
        self.0.store(nanos(to), Ordering::SeqCst);
    }

    /// This clock as a [`ClockFn`] for [`LocalStore::with_clock`].
    pub fn clock(&self) -> ClockFn {
        let c = self.clone();
        Arc::new(move || c.now())
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// The in-process store. Cheap to clone: clones share the same objects.
#[derive(Clone)]
pub struct LocalStore {
    inner: Arc<Inner>,
}

/// A connection to a [`LocalStore`]: a handle on the shared store.
#[derive(Clone, Debug)]
pub struct LocalBackend {
    store: LocalStore,
}

struct Inner {
    shards: Box<[Mutex<Shard>]>,
    hasher: foldhash::fast::RandomState,
    clock: ClockFn,
    max_objects: Option<usize>,
    /// Objects stored, expired or not.
    stored: AtomicUsize,
    ops: AtomicU64,
    /// Clock reading (nanoseconds) of the last full sweep, `u64::MAX` if none yet.
    last_full_sweep: AtomicU64,
}

#[derive(Default)]
struct Shard {
    objects: foldhash::HashMap<ObjectKey, Stored>,
    locks: Leases<ObjectKey>,
    spare: Spare,
}

/// An operation would create an object in a full store.
struct Full;

/// The store's reply for what an operation did to the object under `key`.
fn reply(key: &ObjectKey, outcome: Outcome) -> Reply {
    outcome.map_err(|fault| match fault {
        Fault::WrongKind { wanted, found } => OpError::WrongKind {
            key: key.to_string(),
            wanted: wanted.name(),
            found: found.name(),
        },
        Fault::Refused(r) => OpError::Refused(r.message(key)),
    })
}

impl Shard {
    /// Removes the object under `key`, handing its buffers back; whether there was one.
    fn remove(&mut self, key: &ObjectKey, inner: &Inner) -> bool {
        match self.objects.remove(key) {
            Some(e) => {
                self.spare.retire(e.obj);
                inner.stored.fetch_sub(1, Ordering::Relaxed);
                true
            }
            None => false,
        }
    }

    /// Drops everything whose time is up; the number of objects dropped.
    fn purge(&mut self, now: Duration, inner: &Inner) -> usize {
        let before = self.objects.len();
        self.objects.retain(|_, e| !e.prune(now, |_| {}));
        let dropped = before - self.objects.len();
        inner.stored.fetch_sub(dropped, Ordering::Relaxed);
        self.locks.purge(now);
        dropped
    }

    /// Runs [`Op::Lock`] or [`Op::Unlock`]: leases live beside the objects and change none.
    fn lease(&mut self, op: &Op, now: Duration) -> Reply {
        let key = op.key();
        match *op {
            Op::Lock { owner, lease, .. } => {
                Reply::Bool(self.locks.lock(key, || key.clone(), owner, lease, now))
            }
            Op::Unlock { owner, .. } => Reply::Bool(self.locks.unlock(key, owner, now)),
            _ => Reply::Error(OpError::Refused(format!("{key}: not a lease operation"))),
        }
    }
}

impl Inner {
    fn shard(&self, key: &ObjectKey) -> MutexGuard<'_, Shard> {
        let h = self.hasher.hash_one(key.as_bytes());
        // The modulo is below `shards.len()`, which fits in usize.
        let i = (h % self.shards.len() as u64) as usize;
        self.shards[i]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Counts one more stored object, unless that would pass the limit.
    fn reserve(&self) -> Result<(), Full> {
        match self.max_objects {
            None => {
                self.stored.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            Some(max) => self
                .stored
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                    (n < max).then_some(n + 1)
                })
                .map(|_| ())
                .map_err(|_| Full),
        }
    }

    fn purge(&self, now: Duration) -> usize {
        self.shards
            .iter()
            .map(|s| {
                s.lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .purge(now, self)
            })
            .sum()
    }

    /// Whether a full store may sweep now (at most once per [`FULL_SWEEP_INTERVAL`]).
    fn may_sweep(&self, now: Duration) -> bool {
        let now = nanos(now);
        self.last_full_sweep
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |last| {
                let due =
                    last == u64::MAX || now < last || now - last >= nanos(FULL_SWEEP_INTERVAL);
                due.then_some(now)
            })
            .is_ok()
    }

    /// Runs one operation; `Err(Full)` (with nothing changed but expired entries dropped) if it
    /// would create an object past the limit.
    fn apply(&self, op: &Op, now: Duration) -> Result<Reply, Full> {
        let key = op.key();
        let mut guard = self.shard(key);
        let shard = &mut *guard;
        let Some(action) = op.action() else {
            return Ok(shard.lease(op, now));
        };
        if let Some(e) = shard.objects.get_mut(key) {
            if !(e.due(now) && e.prune(now, |_| {})) {
                let (outcome, gone) = e.run(&action, now, &mut shard.spare);
                if gone {
                    shard.remove(key, self);
                }
                return Ok(reply(key, outcome));
            }
            shard.remove(key, self);
        }
        let created = match action.on_absent() {
            Absent::Reply(outcome) => return Ok(reply(key, outcome)),
            Absent::Create(kind) => {
                self.reserve()?;
                let mut e = Stored::new(kind, &mut shard.spare);
                let (outcome, _) = e.run(&action, now, &mut shard.spare);
                (e, outcome)
            }
            Absent::CreateValue(v) => {
                self.reserve()?;
                (Stored::value(v, &mut shard.spare), Outcome::Bool(true))
            }
        };
        shard.objects.insert(key.clone(), created.0);
        Ok(reply(key, created.1))
    }
}

impl LocalStore {
    /// A store with the default settings on the monotonic system clock.
    pub fn new() -> Self {
        LocalStore::with_config(LocalConfig::default())
    }

    /// A store with `config` on the monotonic system clock.
    pub fn with_config(config: LocalConfig) -> Self {
        let origin = Instant::now();
        LocalStore::with_config_and_clock(config, Arc::new(move || origin.elapsed()))
    }

    /// A store with the default settings on `clock` (e.g. [`ManualClock::clock`]).
    pub fn with_clock(clock: ClockFn) -> Self {
        LocalStore::with_config_and_clock(LocalConfig::default(), clock)
    }

    /// A store with `config` on `clock`.
    pub fn with_config_and_clock(config: LocalConfig, clock: ClockFn) -> Self {
        let shards = (0..config.shards.max(1))
            .map(|_| Mutex::new(Shard::default()))
            .collect();
        LocalStore {
            inner: Arc::new(Inner {
                shards,
                hasher: foldhash::fast::RandomState::default(),
                clock,
                max_objects: config.max_objects,
                stored: AtomicUsize::new(0),
                ops: AtomicU64::new(0),
                last_full_sweep: AtomicU64::new(u64::MAX),
            }),
        }
    }

    /// A connection to this store (what [`Connector::connect`] returns, without the box).
    pub fn backend(&self) -> LocalBackend {
        LocalBackend {
            store: self.clone(),
        }
    }

    /// The store's settings.
    pub fn config(&self) -> LocalConfig {
        LocalConfig {
            shards: self.inner.shards.len(),
            max_objects: self.inner.max_objects,
        }
    }

    /// Number of live objects (expired ones not counted). Takes every shard lock in turn.
    pub fn len(&self) -> usize {
        let now = (self.inner.clock)();
        self.inner
            .shards
            .iter()
            .map(|s| {
                let s = s.lock().unwrap_or_else(PoisonError::into_inner);
                s.objects.values().filter(|e| e.alive(now)).count()
            })
            .sum()
    }

    /// Whether the store holds no live object.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Number of lock leases currently held.
    pub fn locks_held(&self) -> usize {
        let now = (self.inner.clock)();
        self.inner
            .shards
            .iter()
            .map(|s| {
                let s = s.lock().unwrap_or_else(PoisonError::into_inner);
                s.locks.held(now)
            })
            .sum()
    }

    /// Number of operations executed since the store was made, over every connection.
    pub fn ops_executed(&self) -> u64 {
        self.inner.ops.load(Ordering::Relaxed)
    }

    /// Drops every expired object, map field and lease now; returns the number of objects
    /// dropped. Expired things are invisible anyway: this only frees their memory (and their
    /// place under [`LocalConfig::max_objects`]).
    pub fn purge_expired(&self) -> usize {
        self.inner.purge((self.inner.clock)())
    }

    /// Runs `ops` in order, one reply each (what [`Backend::execute`] does; it never fails).
    pub fn execute(&self, ops: &[Op], replies: &mut Vec<Reply>) {
        let inner = &*self.inner;
        let now = (inner.clock)();
        replies.reserve(ops.len());
        for op in ops {
            let reply = match inner.apply(op, now) {
                Ok(r) => r,
                Err(Full) => {
                    if inner.may_sweep(now) {
                        inner.purge(now);
                    }
                    inner.apply(op, now).unwrap_or_else(|Full| {
                        Reply::Error(OpError::Refused(format!(
                            "{}: local store full ({} objects)",
                            op.key(),
                            inner.max_objects.unwrap_or(0)
                        )))
                    })
                }
            };
            replies.push(reply);
        }
        inner.ops.fetch_add(ops.len() as u64, Ordering::Relaxed);
    }

    /// Keys of every live partition of object `id` of kind `kind` of NF `nf`, sorted (what
    /// [`Backend::partitions`] returns).
    pub fn partitions(&self, nf: &str, kind: Kind, id: &str) -> Vec<ObjectKey> {
        let now = (self.inner.clock)();
        let mut keys = Vec::new();
        for s in self.inner.shards.iter() {
            let s = s.lock().unwrap_or_else(PoisonError::into_inner);
            keys.extend(
                s.objects
                    .iter()
                    .filter(|(k, e)| {
                        matches!(k.parse(), Some(p) if p.nf == nf && p.kind == kind && p.id == id)
                            && e.alive(now)
                    })
                    .map(|(k, _)| k.clone()),
            );
        }
        keys.sort_unstable();
        keys
    }
}

impl Default for LocalStore {
    fn default() -> Self {
        LocalStore::new()
    }
}

impl fmt::Debug for LocalStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LocalStore")
            .field("shards", &self.inner.shards.len())
            .field("max_objects", &self.inner.max_objects)
            .field("stored", &self.inner.stored.load(Ordering::Relaxed))
            .field("ops", &self.ops_executed())
            .finish()
    }
}

impl Connector for LocalStore {
    fn name(&self) -> &'static str {
        "local"
    }

    fn in_process(&self) -> bool {
        true
    }

    fn connect(&self) -> Result<Box<dyn Backend>, BackendError> {
        Ok(Box::new(self.backend()))
    }
}

impl LocalBackend {
    /// The store this connection is to.
    pub fn store(&self) -> &LocalStore {
        &self.store
    }
}

impl Backend for LocalBackend {
    fn name(&self) -> &'static str {
        "local"
    }

    fn execute(&mut self, ops: &[Op], replies: &mut Vec<Reply>) -> Result<(), BackendError> {
        self.store.execute(ops, replies);
        Ok(())
    }

    /// The fence is checked, then the operations run; in one process the check and the
    /// operations are not one step against another thread's writes (a cluster never runs on
    /// this store: its instances need one they all reach).
    fn execute_fenced(
        &mut self,
        fence: &crate::Fence,
        ops: &[Op],
        replies: &mut Vec<Reply>,
    ) -> Result<(), BackendError> {
        let mut now = Vec::with_capacity(1);
        self.store.execute(
            &[Op::Get {
                key: fence.key.clone(),
            }],
            &mut now,
        );
        if now.pop() != Some(Reply::Value(Some(fence.value.clone()))) {
            return Err(BackendError::Fenced {
                backend: "local",
                key: fence.key.to_string(),
            });
        }
        self.store.execute(ops, replies);
        Ok(())
    }

    fn partitions(
        &mut self,
        nf: &str,
        kind: Kind,
        id: &str,
    ) -> Result<Vec<ObjectKey>, BackendError> {
        Ok(self.store.partitions(nf, kind, id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conformance::KeyOps;
    use crate::key::Owner;

    fn store() -> (LocalStore, ManualClock) {
        let clock = ManualClock::new();
        (LocalStore::with_clock(clock.clock()), clock)
    }

    fn run(s: &LocalStore, ops: Vec<Op>) -> Vec<Reply> {
        let mut r = Vec::new();
        s.backend().execute(&ops, &mut r).unwrap();
        assert_eq!(r.len(), ops.len());
        r
    }

    fn one(s: &LocalStore, op: Op) -> Reply {
        run(s, vec![op]).pop().unwrap()
    }

    fn key(kind: Kind, id: &str) -> ObjectKey {
        ObjectKey::shared("t", kind, id)
    }

    fn b(s: &str) -> crate::Bytes {
        s.as_bytes().to_vec()
    }

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn object_ttl_ends_exactly_at_deadline() {
        let (s, clock) = store();
        let k = key(Kind::Value, "v");
        one(&s, k.set("x"));
        assert_eq!(one(&s, k.expire(100 * MS)), Reply::Bool(true));
        clock.advance(99 * MS);
        assert_eq!(one(&s, k.get()), Reply::Value(Some(b("x"))));
        assert_eq!(s.len(), 1);
        clock.advance(MS);
        assert_eq!(s.len(), 0);
        assert_eq!(one(&s, k.get()), Reply::Value(None));
        assert_eq!(one(&s, k.delete()), Reply::Bool(false));
        assert_eq!(one(&s, k.expire(MS)), Reply::Bool(false));
    }

    #[test]
    fn expired_objects_are_invisible_to_every_op() {
        let (s, clock) = store();
        let c = key(Kind::Counter, "c");
        let l = key(Kind::List, "l");
        let st = key(Kind::Set, "s");
        let cm = key(Kind::CounterMap, "cm");
        run(
            &s,
            vec![c.add(5), l.push("a"), st.insert("m"), cm.map_add("f", 2)],
        );
        for k in [&c, &l, &st, &cm] {
            assert_eq!(one(&s, k.expire(10 * MS)), Reply::Bool(true));
        }
        clock.advance(10 * MS);
        let r = run(
            &s,
            vec![
                c.get_counter(),
                c.add(1),
                l.pop(),
                l.len(Kind::List),
                st.contains("m"),
                st.read_all(Kind::Set),
                cm.map_get_counter("f"),
            ],
        );
        assert_eq!(
            r,
            vec![
                Reply::Int(0),
                Reply::Int(1),
                Reply::Value(None),
                Reply::Len(0),
                Reply::Bool(false),
                Reply::Object(None),
                Reply::Int(0),
            ]
        );
        // The counter was created afresh, without a time to live.
        clock.advance(Duration::from_secs(3600));
        assert_eq!(one(&s, c.get_counter()), Reply::Int(1));
    }

    #[test]
    fn map_field_ttl() {
        let (s, clock) = store();
        let m = key(Kind::Map, "m");
        run(&s, vec![m.map_set("a", "1"), m.map_set("b", "2")]);
        let exp = |f: &str, ms: u32| m.expire_field(f, ms * MS);
        assert_eq!(one(&s, exp("a", 10)), Reply::Bool(true));
        assert_eq!(one(&s, exp("zz", 10)), Reply::Bool(false));
        assert_eq!(one(&s, exp("b", 20)), Reply::Bool(true));
        clock.advance(10 * MS);
        assert_eq!(
            run(&s, vec![m.map_get("a"), m.map_get("b"), m.len(Kind::Map)]),
            vec![
                Reply::Value(None),
                Reply::Value(Some(b("2"))),
                Reply::Len(1)
            ]
        );
        // Overwriting a field clears its time to live.
        assert_eq!(one(&s, exp("b", 5)), Reply::Bool(true));
        one(&s, m.map_set("b", "3"));
        clock.advance(100 * MS);
        assert_eq!(one(&s, m.map_get("b")), Reply::Value(Some(b("3"))));
        // A map whose every field expired is gone.
        assert_eq!(one(&s, exp("b", 5)), Reply::Bool(true));
        assert_eq!(s.len(), 1);
        clock.advance(5 * MS);
        assert_eq!(s.len(), 0);
        assert!(s.partitions("t", Kind::Map, "m").is_empty());
        assert_eq!(one(&s, m.read_all(Kind::Map)), Reply::Object(None));
        assert_eq!(one(&s, m.delete()), Reply::Bool(false));
    }

    #[test]
    fn field_ttl_needs_a_map() {
        let (s, _) = store();
        let cm = key(Kind::CounterMap, "cm");
        one(&s, cm.map_add("f", 1));
        assert_eq!(
            one(&s, cm.expire_field("f", MS)),
            Reply::Error(OpError::WrongKind {
                key: cm.to_string(),
                wanted: "Map",
                found: "CounterMap"
            })
        );
    }

    #[test]
    fn replacing_clears_ttl_updating_keeps_it() {
        let (s, clock) = store();
        let v = key(Kind::Value, "v");
        let c = key(Kind::Counter, "c");
        let l = key(Kind::List, "l");
        run(
            &s,
            vec![
                v.set("1"),
                v.expire(10 * MS),
                v.set("2"),
                c.set_counter(1),
                c.expire(10 * MS),
                c.add(1),
                l.push("a"),
                l.expire(10 * MS),
                l.push("b"),
            ],
        );
        clock.advance(10 * MS);
        assert_eq!(
            run(&s, vec![v.get(), c.get_counter(), l.len(Kind::List)]),
            vec![Reply::Value(Some(b("2"))), Reply::Int(0), Reply::Len(0)]
        );
        // Compare-and-set that replaces also clears it.
        run(&s, vec![v.expire(10 * MS)]);
        let cas = v.cas(Some(b"2"), Some(b"3"));
        assert_eq!(one(&s, cas), Reply::Bool(true));
        clock.advance(10 * MS);
        assert_eq!(one(&s, v.get()), Reply::Value(Some(b("3"))));
    }

    #[test]
    fn zero_ttl_expires_at_once() {
        let (s, _) = store();
        let v = key(Kind::Value, "v");
        assert_eq!(
            run(&s, vec![v.set("1"), v.expire(Duration::ZERO), v.get()]),
            vec![Reply::Done, Reply::Bool(true), Reply::Value(None)]
        );
    }

    #[test]
    fn leases() {
        let (s, clock) = store();
        let k = key(Kind::Value, "lock");
        let lock = |owner, ms: u32| k.lock(owner, ms * MS);
        let unlock = |owner| k.unlock(owner);
        assert_eq!(one(&s, lock(1, 10)), Reply::Bool(true));
        assert_eq!(s.locks_held(), 1);
        clock.advance(8 * MS);
        // Re-granting renews the lease.
        assert_eq!(one(&s, lock(1, 10)), Reply::Bool(true));
        clock.advance(8 * MS);
        assert_eq!(one(&s, lock(2, 10)), Reply::Bool(false));
        assert_eq!(one(&s, unlock(2)), Reply::Bool(false));
        clock.advance(2 * MS);
        // Lease over: another owner gets it, the old one cannot release it.
        assert_eq!(s.locks_held(), 0);
        assert_eq!(one(&s, lock(2, 10)), Reply::Bool(true));
        assert_eq!(one(&s, unlock(1)), Reply::Bool(false));
        assert_eq!(one(&s, unlock(2)), Reply::Bool(true));
        assert_eq!(one(&s, unlock(2)), Reply::Bool(false));
        // An expired lease cannot be released by its owner either.
        assert_eq!(one(&s, lock(3, 1)), Reply::Bool(true));
        clock.advance(MS);
        assert_eq!(one(&s, unlock(3)), Reply::Bool(false));
        assert_eq!(s.locks_held(), 0);
    }

    #[test]
    fn locks_do_not_touch_objects() {
        let (s, _) = store();
        let k = key(Kind::Value, "v");
        let r = run(
            &s,
            vec![
                k.lock(7, Duration::from_secs(1)),
                k.get(),
                k.set("x"),
                k.delete(),
                k.lock(8, Duration::from_secs(1)),
            ],
        );
        assert_eq!(
            r,
            vec![
                Reply::Bool(true),
                Reply::Value(None),
                Reply::Done,
                Reply::Bool(true),
                Reply::Bool(false)
            ]
        );
        assert_eq!(s.len(), 0);
        assert!(s.partitions("t", Kind::Value, "v").is_empty());
    }

    #[test]
    fn purge_expired_frees_objects_fields_and_leases() {
        let (s, clock) = store();
        let ttl = |k: &ObjectKey| k.expire(MS);
        let keys: Vec<_> = (0..100)
            .map(|i| key(Kind::Counter, &i.to_string()))
            .collect();
        let mut ops: Vec<Op> = keys.iter().map(|k| k.add(1)).collect();
        ops.extend(keys.iter().take(60).map(ttl));
        let m = key(Kind::Map, "m");
        ops.push(m.map_set("a", "1"));
        ops.push(m.map_set("b", "1"));
        ops.push(m.expire_field("a", MS));
        ops.push(m.lock(1, MS));
        run(&s, ops);
        assert_eq!(s.len(), 101);
        clock.advance(MS);
        assert_eq!(s.len(), 41);
        assert_eq!(s.purge_expired(), 60);
        assert_eq!(s.inner.stored.load(Ordering::Relaxed), 41);
        assert_eq!(s.locks_held(), 0);
        assert!(s
            .inner
            .shards
            .iter()
            .all(|sh| sh.lock().unwrap().locks.is_empty()));
        let sh = s.inner.shard(&m);
        match &sh.objects[&m].obj {
            flowstate_objects::Obj::Map(mo) => {
                assert_eq!(mo.len(), 1);
                assert_eq!(mo.timers(), 0);
            }
            _ => panic!("not a map"),
        }
    }

    /// Map fields with times to live, renewed, overwritten and deleted at random, against a
    /// naive model: the fields visible at each step are the model's (the expiry heap's stale
    /// entries never drop a live field, and expired ones always go).
    #[test]
    fn map_field_expiry_matches_a_naive_model() {
        let (s, clock) = store();
        let m = key(Kind::Map, "ttl");
        let mut model = std::collections::BTreeMap::<u32, Option<u64>>::new(); // field -> deadline (ms)
        let mut now = 0u64;
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        for step in 0..3_000 {
            let f = next(200) as u32;
            let name = f.to_string();
            match next(4) {
                0 => {
                    run(&s, vec![m.map_set(&name, "v")]);
                    model.insert(f, None);
                }
                1 | 2 if model.contains_key(&f) => {
                    let ttl = 1 + next(50);
                    run(&s, vec![m.expire_field(&name, MS * ttl as u32)]);
                    model.insert(f, Some(now + ttl));
                }
                3 => {
                    run(&s, vec![m.map_delete(&name)]);
                    model.remove(&f);
                }
                _ => {}
            }
            if step % 7 == 0 {
                let by = next(5);
                clock.advance(MS * by as u32);
                now += by;
                model.retain(|_, d| d.is_none_or(|d| d > now));
            }
            let got = run(&s, vec![m.map_get(&name)]);
            let want = model.contains_key(&f);
            assert_eq!(
                matches!(got[0], Reply::Value(Some(_))),
                want,
                "step {step} field {f}"
            );
        }
        let got = run(
            &s,
            vec![Op::Len {
                key: m.clone(),
                kind: Kind::Map,
            }],
        );
        assert_eq!(got[0], Reply::Len(model.len() as u64));
    }

    #[test]
    fn wrong_kind_between_look_alike_kinds() {
        let (s, _) = store();
        let v = key(Kind::Value, "x");
        let m = key(Kind::Map, "y");
        let r = run(
            &s,
            vec![
                v.set("1"),
                v.add(1),
                v.set_counter(1),
                m.map_set("f", "1"),
                m.map_add("f", 1),
                m.map_get_counter("f"),
                m.len(Kind::CounterMap),
                v.read_all(Kind::Counter),
                m.cas(None, None),
                v.get(),
            ],
        );
        let wk = |k: &ObjectKey, wanted, found| {
            Reply::Error(OpError::WrongKind {
                key: k.to_string(),
                wanted,
                found,
            })
        };
        assert_eq!(
            r,
            vec![
                Reply::Done,
                wk(&v, "Counter", "Value"),
                wk(&v, "Counter", "Value"),
                Reply::Done,
                wk(&m, "CounterMap", "Map"),
                wk(&m, "CounterMap", "Map"),
                wk(&m, "CounterMap", "Map"),
                wk(&v, "Counter", "Value"),
                wk(&m, "Value", "Map"),
                Reply::Value(Some(b("1"))),
            ]
        );
    }

    #[test]
    fn map_delete_works_on_counter_maps() {
        let (s, _) = store();
        let cm = key(Kind::CounterMap, "cm");
        let r = run(
            &s,
            vec![
                cm.map_add("a", 1),
                cm.map_delete("a"),
                cm.read_all(Kind::CounterMap),
            ],
        );
        assert_eq!(
            r,
            vec![Reply::Int(1), Reply::Bool(true), Reply::Object(None)]
        );
        assert_eq!(s.len(), 0);
    }

    #[test]
    fn len_of_a_value_is_refused() {
        let (s, _) = store();
        let v = key(Kind::Value, "v");
        one(&s, v.set("1"));
        assert!(matches!(
            one(&s, v.len(Kind::Value)),
            Reply::Error(OpError::Refused(_))
        ));
    }

    #[test]
    fn counter_overflow_is_refused_and_changes_nothing() {
        let (s, _) = store();
        let c = key(Kind::Counter, "c");
        let cm = key(Kind::CounterMap, "cm");
        let r = run(
            &s,
            vec![
                c.set_counter(i64::MAX),
                c.add(1),
                c.get_counter(),
                cm.map_add("f", i64::MIN),
                cm.map_add("f", -1),
                cm.map_get_counter("f"),
            ],
        );
        assert!(matches!(r[1], Reply::Error(OpError::Refused(_))));
        assert_eq!(r[2], Reply::Int(i64::MAX));
        assert!(matches!(r[4], Reply::Error(OpError::Refused(_))));
        assert_eq!(r[5], Reply::Int(i64::MIN));
    }

    #[test]
    fn compare_and_set_on_absent_with_no_new_value() {
        let (s, _) = store();
        let v = key(Kind::Value, "v");
        let r = run(&s, vec![v.cas(None, None), v.get()]);
        assert_eq!(r, vec![Reply::Bool(true), Reply::Value(None)]);
        assert_eq!(s.len(), 0);
    }

    #[test]
    fn max_objects_refuses_creation_only() {
        let clock = ManualClock::new();
        let s = LocalStore::with_config_and_clock(
            LocalConfig {
                shards: 4,
                max_objects: Some(3),
            },
            clock.clock(),
        );
        let k = |i: u32| key(Kind::Counter, &i.to_string());
        let r = run(
            &s,
            vec![
                k(1).add(1),
                k(2).add(1),
                key(Kind::List, "l").push("a"),
                k(3).add(1),
                key(Kind::Value, "v").set("a"),
                key(Kind::Set, "s").insert("a"),
                key(Kind::Map, "m").map_set("f", "a"),
                key(Kind::CounterMap, "cm").map_add("f", 1),
                k(4).set_counter(1),
                key(Kind::Value, "v").cas(None, Some(b"x")),
                // Existing objects still take updates, reads of missing ones still answer.
                k(1).add(1),
                key(Kind::List, "l").push("b"),
                k(9).get_counter(),
            ],
        );
        assert_eq!(&r[..3], &[Reply::Int(1), Reply::Int(1), Reply::Len(1)]);
        for (i, reply) in r[3..10].iter().enumerate() {
            assert!(
                matches!(reply, Reply::Error(OpError::Refused(_))),
                "op {}: {reply:?}",
                i + 3
            );
        }
        assert_eq!(&r[10..], &[Reply::Int(2), Reply::Len(2), Reply::Int(0)]);
        assert_eq!(s.len(), 3);
        // Deleting makes room; so does an expiry (swept when the store is full).
        assert_eq!(one(&s, k(2).delete()), Reply::Bool(true));
        assert_eq!(one(&s, k(3).add(1)), Reply::Int(1));
        assert!(matches!(one(&s, k(4).add(1)), Reply::Error(_)));
        one(&s, k(1).expire(MS));
        clock.advance(20 * MS);
        assert_eq!(one(&s, k(4).add(1)), Reply::Int(1));
        assert_eq!(s.len(), 3);
        // Popping the last item removes the list and frees its place.
        assert_eq!(
            run(
                &s,
                vec![
                    key(Kind::List, "l").pop(),
                    key(Kind::List, "l").pop(),
                    k(5).add(1),
                ]
            ),
            vec![
                Reply::Value(Some(b("a"))),
                Reply::Value(Some(b("b"))),
                Reply::Int(1)
            ]
        );
        assert_eq!(s.inner.stored.load(Ordering::Relaxed), 3);
    }

    #[test]
    fn partitions_match_nf_kind_and_id_exactly() {
        let (s, clock) = store();
        let mut ops = Vec::new();
        let mut want = Vec::new();
        for (i, c) in [(0, 0), (0, 1), (3, 10), (3, 2)] {
            let k = ObjectKey::partitioned(&Owner::new("nat", i, c), Kind::Counter, "a@b");
            ops.push(k.add(1));
            want.push(k);
        }
        let shared = ObjectKey::shared("nat", Kind::Counter, "a@b");
        ops.push(shared.add(1));
        want.push(shared);
        let noise = [
            ObjectKey::partitioned(&Owner::new("nat", 0, 0), Kind::Counter, "a"),
            ObjectKey::partitioned(&Owner::new("nat", 0, 0), Kind::Counter, "a@b@c"),
            ObjectKey::partitioned(&Owner::new("nat2", 0, 0), Kind::Counter, "a@b"),
            ObjectKey::partitioned(&Owner::new("na", 0, 0), Kind::Counter, "a@b"),
            ObjectKey::shared("nat", Kind::Counter, "a@b2"),
        ];
        ops.extend(noise.iter().map(|k| k.add(1)));
        let as_map = ObjectKey::partitioned(&Owner::new("nat", 0, 0), Kind::Map, "a@b");
        ops.push(as_map.map_set("f", "v"));
        let expiring = ObjectKey::partitioned(&Owner::new("nat", 9, 9), Kind::Counter, "a@b");
        ops.push(expiring.add(1));
        ops.push(expiring.expire(MS));
        run(&s, ops);
        clock.advance(MS);
        want.sort();
        let mut be = s.backend();
        assert_eq!(be.partitions("nat", Kind::Counter, "a@b").unwrap(), want);
        assert_eq!(be.partitions("nat", Kind::Counter, "zzz").unwrap(), vec![]);
        assert_eq!(be.partitions("nat", Kind::Map, "a@b").unwrap().len(), 1);
    }

    #[test]
    fn zero_shards_counts_as_one_and_stats_count_ops() {
        let s = LocalStore::with_config(LocalConfig {
            shards: 0,
            max_objects: None,
        });
        assert_eq!(s.config().shards, 1);
        assert!(s.is_empty());
        run(&s, vec![key(Kind::Counter, "c").add(1); 10]);
        assert_eq!(s.ops_executed(), 10);
        assert_eq!(s.len(), 1);
        let c: &dyn Connector = &s;
        assert_eq!(c.name(), "local");
        assert!(c.in_process());
        let mut conn = c.connect().unwrap();
        let mut r = Vec::new();
        conn.execute(&[key(Kind::Counter, "c").get_counter()], &mut r)
            .unwrap();
        assert_eq!(r, vec![Reply::Int(10)]);
    }

    #[test]
    fn clones_share_the_store() {
        let s = LocalStore::new();
        let t = s.clone();
        one(&s, key(Kind::Value, "v").set("x"));
        assert_eq!(
            one(&t, key(Kind::Value, "v").get()),
            Reply::Value(Some(b("x")))
        );
        assert_eq!(t.len(), 1);
    }
}
