//! The typed handles and the cache-and-flush engine, on the in-process store (cache is the only
//! copy) and on the same store seen as a remote one (every change must be flushed).

use flowstate_state::local::LocalStore;
use flowstate_state::{
    merge, Access, Backend, BackendError, Connector, Field, Partition, Scope, StateConfig, Strategy,
};
use std::sync::atomic::Ordering;
use std::time::Duration;

/// The local store presented as an out-of-process one, so the engine flushes everything.
struct Remote(LocalStore);

impl Connector for Remote {
    fn name(&self) -> &'static str {
        "remote-local"
    }
    fn connect(&self) -> Result<Box<dyn Backend>, BackendError> {
        self.0.connect()
    }
}

fn part(c: &dyn Connector, core: u32) -> Partition {
    Partition::new(
        c,
        StateConfig {
            partition: core,
            ..StateConfig::default()
        },
    )
    .unwrap()
}

const S: u64 = 1_000_000_000;

#[test]
fn in_process_objects_live_in_the_cache_only() {
    let store = LocalStore::new();
    let mut p = part(&store, 0);
    let mut d = p.declare("nf");
    let m = d
        .map::<u32, String>("m", Scope::PerFlow, Access::ReadMostly)
        .unwrap();
    let c = d
        .counter("c", Scope::CrossFlow(&[Field::SrcIp]), Access::WriteMostly)
        .unwrap();
    let l = d
        .list::<u16>("pool", Scope::PerFlow, Access::ReadWrite)
        .unwrap();
    let s = d.set::<u8>("s", Scope::PerFlow, Access::ReadWrite).unwrap();
    let v = d
        .value::<u64>("v", Scope::PerFlow, Access::ReadWrite)
        .unwrap();
    assert_eq!(c.strategy(), Strategy::Offload);
    assert_eq!(m.strategy(), Strategy::CacheFlush);

    m.insert_nowait(1, "one".into());
    m.insert(2, "two".into()).unwrap();
    assert_eq!(m.get(&1).unwrap().as_deref(), Some("one"));
    assert_eq!(m.remove_nowait(&2).as_deref(), Some("two"));
    assert!(!m.contains_key(&2).unwrap());
    c.add_nowait(5);
    assert_eq!(c.add(2).unwrap(), 7);
    l.push_nowait(1024);
    l.push_nowait(1025);
    assert_eq!(l.pop().unwrap(), Some(1024));
    assert_eq!(l.len().unwrap(), 1);
    s.insert_nowait(9);
    assert!(s.contains(&9).unwrap());
    assert!(!s.insert(9).unwrap());
    assert!(v.compare_and_set(None, Some(3)).unwrap());
    assert!(!v.compare_and_set(Some(&4), Some(5)).unwrap());
    assert_eq!(v.get().unwrap(), Some(3));
    for t in 0..10 {
        p.maybe_flush(t * S);
    }
    let st = p.stats();
    assert_eq!(
        st.async_ops.load(Ordering::Relaxed),
        0,
        "nothing is flushed"
    );
    assert_eq!(st.sync_calls.load(Ordering::Relaxed), 0, "nothing waits");
    assert!(store.is_empty());

    // At shutdown everything is written out, so merging functions can read it.
    p.flush_all(11 * S).unwrap();
    let mut b = store.connect().unwrap();
    assert_eq!(merge::counter_sum(b.as_mut(), "nf", "c").unwrap(), 7);
    let all = merge::map_union::<u32, String>(b.as_mut(), "nf", "m", |a, _| a).unwrap();
    assert_eq!(
        all.into_iter().collect::<Vec<_>>(),
        vec![(1, "one".to_string())]
    );
    assert_eq!(
        merge::list_concat::<u16>(b.as_mut(), "nf", "pool").unwrap(),
        vec![1025]
    );
}

#[test]
fn expiry_calls_back_and_the_callback_may_use_the_map() {
    let store = LocalStore::new();
    let mut p = part(&store, 0);
    let mut d = p.declare("nat");
    let m = d
        .map::<u32, u32>("flows", Scope::PerFlow, Access::ReadMostly)
        .unwrap();
    for k in 0..10 {
        m.insert_nowait(k, k + 100);
        m.expire_after(&k, Duration::from_secs(10), 0);
    }
    // Renew half of them later.
    for k in 0..5 {
        assert!(m.expire_after(&k, Duration::from_secs(10), 5 * S));
    }
    assert!(
        !m.expire_after(&99, Duration::from_secs(1), 0),
        "no entry, no timer"
    );
    let mut seen = Vec::new();
    let n = m.expire(10 * S, |k, v| {
        assert_eq!(v, k + 100);
        m.remove_nowait(&(k + 1000)); // reentrant use of the same map
        seen.push(k);
    });
    seen.sort();
    assert_eq!((n, seen), (5, vec![5, 6, 7, 8, 9]));
    assert_eq!(m.expire(14 * S, |_, _| ()), 0);
    assert_eq!(m.expire(15 * S, |_, _| ()), 5);
    assert_eq!(m.cached_len(), 0);
    // A replaced entry does not inherit the old timer.
    m.insert_nowait(1, 1);
    m.expire_after(&1, Duration::from_secs(1), 20 * S);
    m.insert_nowait(1, 2);
    assert_eq!(m.expire(30 * S, |_, _| ()), 0);
    assert_eq!(m.get(&1).unwrap(), Some(2));
}

#[test]
fn remote_store_receives_every_change_within_a_flush() {
    let store = LocalStore::new();
    let remote = Remote(store.clone());
    let mut p = part(&remote, 1);
    let mut d = p.declare("nf");
    let m = d
        .map::<u32, u64>("m", Scope::PerFlow, Access::ReadMostly)
        .unwrap();
    let c = d.counter("c", Scope::PerFlow, Access::WriteMostly).unwrap();
    let cm = d
        .counter_map::<u8>("cm", Scope::PerFlow, Access::WriteMostly)
        .unwrap();
    m.insert_nowait(7, 70);
    m.insert_nowait(8, 80);
    m.remove_nowait(&8);
    m.with_mut(&7, |v| *v.unwrap() += 1).unwrap();
    for _ in 0..1000 {
        c.add_nowait(1);
        cm.add_to_nowait(&3, 2);
    }
    p.flush(S);
    // Ops queued before a synchronous call are applied first (CHC §4.3).
    assert_eq!(c.get().unwrap(), 1000);
    assert_eq!(cm.get(&3).unwrap(), 2000);
    let mut b = store.connect().unwrap();
    assert_eq!(
        merge::map_union::<u32, u64>(b.as_mut(), "nf", "m", |a, _| a)
            .unwrap()
            .into_iter()
            .collect::<Vec<_>>(),
        vec![(7, 71)]
    );
    let st = p.stats();
    assert!(
        st.async_ops.load(Ordering::Relaxed) <= 5,
        "coalesced: {:?}",
        st
    );
    // Lengths come from the store, after the queued changes.
    let mut d = p.declare("nf");
    let l = d
        .list::<u16>("l", Scope::PerFlow, Access::ReadWrite)
        .unwrap();
    let s = d
        .set::<u16>("s", Scope::PerFlow, Access::ReadWrite)
        .unwrap();
    l.push_nowait(1);
    l.push_nowait(2);
    s.insert_nowait(5);
    s.insert_nowait(5);
    assert_eq!(
        (l.len().unwrap(), s.len().unwrap(), m.len().unwrap()),
        (2, 1, 1)
    );
    // Every call of the state thread was timed: a flush or a round trip each.
    let st = p.stats();
    let timed: u64 = st
        .call_micros
        .iter()
        .map(|b| b.load(Ordering::Relaxed))
        .sum();
    let calls = st.flushes.load(Ordering::Relaxed) + st.sync_calls.load(Ordering::Relaxed);
    assert!(
        timed >= 1 && timed <= calls,
        "{timed} timed, {calls} calls: {st:?}"
    );
}

#[test]
fn an_in_process_store_is_not_timed() {
    let store = LocalStore::new();
    let mut p = part(&store, 1);
    let c = p
        .declare("nf")
        .counter("c", Scope::Shared, Access::WriteMostly)
        .unwrap();
    c.add_nowait(1);
    p.flush(S);
    assert_eq!(c.get().unwrap(), 1);
    let timed: u64 = p
        .stats()
        .call_micros
        .iter()
        .map(|b| b.load(Ordering::Relaxed))
        .sum();
    assert_eq!(timed, 0);
}

#[test]
fn a_new_owner_reads_through_to_the_store() {
    let store = LocalStore::new();
    let remote = Remote(store.clone());
    {
        let mut p = part(&remote, 0);
        let m = p
            .declare("fw")
            .map::<u32, u32>("conn", Scope::PerFlow, Access::ReadWrite)
            .unwrap();
        m.insert_nowait(1, 11);
        p.flush_all(S).unwrap();
    }
    // The same owner restarted (failover, StatelessNF): its empty cache loads on a miss.
    let mut p = part(&remote, 0);
    let m = p
        .declare("fw")
        .map::<u32, u32>("conn", Scope::PerFlow, Access::ReadWrite)
        .unwrap();
    assert_eq!(m.get(&1).unwrap(), Some(11));
    assert_eq!(m.get(&2).unwrap(), None);
}

#[test]
fn a_commit_begun_and_ended_later_lands_and_a_call_in_between_sees_it() {
    let store = LocalStore::new();
    let remote = Remote(store.clone());
    let (mut a, mut b) = (part(&remote, 0), part(&remote, 1));
    let (ma, mb) = (
        a.declare("fw")
            .map::<u32, u32>("conn", Scope::PerFlow, Access::ReadWrite)
            .unwrap(),
        b.declare("fw")
            .map::<u32, u32>("conn", Scope::PerFlow, Access::ReadWrite)
            .unwrap(),
    );
    ma.insert_nowait(1, 11);
    mb.insert_nowait(2, 22);
    // Both partitions' writes in flight at once, then their answers.
    a.begin_flush_all(S).unwrap();
    b.begin_flush_all(S).unwrap();
    // A call on `a` meanwhile reads the commit's replies first, and after it.
    let probe = a
        .declare("fw")
        .value::<u32>("probe", Scope::PerFlow, Access::ReadWrite)
        .unwrap();
    assert_eq!(probe.get().unwrap(), None);
    a.end_flush_all().unwrap();
    b.end_flush_all().unwrap();
    a.end_flush_all().unwrap(); // nothing pending: Ok
    let mut c = part(&remote, 0);
    let mc = c
        .declare("fw")
        .map::<u32, u32>("conn", Scope::PerFlow, Access::ReadWrite)
        .unwrap();
    assert_eq!(mc.get(&1).unwrap(), Some(11));
    let mut d = part(&remote, 1);
    let md = d
        .declare("fw")
        .map::<u32, u32>("conn", Scope::PerFlow, Access::ReadWrite)
        .unwrap();
    assert_eq!(md.get(&2).unwrap(), Some(22));
}

#[test]
fn shared_counter_from_many_workers_sums_exactly() {
    let store = LocalStore::new();
    let threads: Vec<_> = (0..4)
        .map(|core| {
            let store = store.clone();
            std::thread::spawn(move || {
                let mut p = part(&store, core);
                let c = p
                    .declare("ctr")
                    .counter("packets", Scope::Shared, Access::WriteMostly)
                    .unwrap();
                let sync = p
                    .declare("ctr")
                    .counter("sync", Scope::Shared, Access::WriteMostly)
                    .unwrap();
                for i in 0..10_000u64 {
                    c.add_nowait(1);
                    if i % 100 == 0 {
                        sync.add(1).unwrap();
                    }
                    p.maybe_flush(i * 1_000);
                }
                p.flush_all(u64::MAX / 2).unwrap();
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let mut b = store.connect().unwrap();
    assert_eq!(
        merge::counter_sum(b.as_mut(), "ctr", "packets").unwrap(),
        40_000
    );
    assert_eq!(merge::counter_sum(b.as_mut(), "ctr", "sync").unwrap(), 400);
}

#[test]
fn partitioned_counters_merge_across_cores() {
    let store = LocalStore::new();
    for core in 0..3 {
        let mut p = part(&store, core);
        let c = p
            .declare("lb")
            .counter("conns", Scope::CrossFlow(&[]), Access::ReadWrite)
            .unwrap();
        c.add_nowait(i64::from(core) + 1);
        assert_eq!(c.key(), format!("lb@0@{core}@Counter@conns"));
        p.flush_all(S).unwrap();
    }
    let mut b = store.connect().unwrap();
    assert_eq!(merge::counter_sum(b.as_mut(), "lb", "conns").unwrap(), 6);
}

#[test]
fn bad_ids_are_refused() {
    let store = LocalStore::new();
    let mut p = part(&store, 0);
    let mut d = p.declare("nf");
    assert!(d.counter("", Scope::PerFlow, Access::ReadWrite).is_err());
    assert!(d.counter("a b", Scope::PerFlow, Access::ReadWrite).is_err());
    assert!(p
        .declare("n@f")
        .counter("c", Scope::PerFlow, Access::ReadWrite)
        .is_err());
    assert!(flowstate_state::ObjectKey::from_raw("nf@0@1@Map@flows").is_some());
    assert!(flowstate_state::ObjectKey::from_raw("nf@Nope@x").is_none());
}

#[test]
fn renewals_reach_a_remote_store_once_per_half_ttl_and_changes_at_once() {
    use flowstate_state::local::ManualClock;
    let clock = ManualClock::new();
    let store = LocalStore::with_clock(clock.clock());
    let remote = Remote(store.clone());
    let mut p = part(&remote, 0);
    let m = p
        .declare("nat")
        .map::<u32, u32>("out", Scope::PerFlow, Access::ReadMostly)
        .unwrap();
    let ttl = Duration::from_secs(10);
    // Steps the worker and the store to `t` seconds and flushes; returns the ops sent so far.
    let step = |p: &mut Partition, t: u64| {
        clock.set(Duration::from_secs(t));
        p.flush(t * S);
        m.len().unwrap(); // a round trip: everything queued before it is applied
        p.stats().async_ops.load(Ordering::Relaxed)
    };
    let in_store = || {
        merge::map_union::<u32, u32>(store.connect().unwrap().as_mut(), "nat", "out", |a, _| a)
            .unwrap()
            .into_iter()
            .collect::<Vec<_>>()
    };
    m.insert_nowait(1, 10);
    m.expire_after(&1, ttl, 0);
    assert_eq!(step(&mut p, 0), 2, "the entry and its time to live (15 s)");
    // Renewed every second: the store's copy (until 15 s) outlives the worker's until 6 s.
    for t in 1..=5 {
        assert!(m.expire_after(&1, ttl, t * S));
        assert_eq!(step(&mut p, t), 2, "no store traffic at {t} s");
    }
    assert!(m.expire_after(&1, ttl, 6 * S));
    assert_eq!(step(&mut p, 6), 3, "one renewal: until 6 + 15 = 21 s");
    // A renewal that changes the value writes it with the next flush.
    let old = m.renew_with(&1, 7 * S, |v| {
        let old = *v;
        *v = 11;
        (ttl, old)
    });
    assert_eq!(old.unwrap(), Some(10));
    assert_eq!(step(&mut p, 7), 5, "the new value and its time to live");
    // The worker's entry expires at 17 s; the store keeps it a while longer, then drops it.
    clock.set(Duration::from_secs(17));
    assert_eq!(in_store(), vec![(1, 11)]);
    clock.set(Duration::from_secs(23));
    assert_eq!(in_store(), vec![]);
}

/// The local store behind a wire the test controls: cut (every call fails while `down` is
/// set), held up (calls wait while the test holds `gate`), and counted (calls, operations).
#[derive(Clone, Default)]
struct Wire {
    store: LocalStore,
    down: std::sync::Arc<std::sync::atomic::AtomicBool>,
    gate: std::sync::Arc<std::sync::Mutex<()>>,
    calls: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    ops: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

struct WireBackend {
    inner: Box<dyn Backend>,
    wire: Wire,
}

impl Backend for WireBackend {
    fn name(&self) -> &'static str {
        "wire"
    }
    fn execute(
        &mut self,
        ops: &[flowstate_state::Op],
        replies: &mut Vec<flowstate_state::Reply>,
    ) -> Result<(), BackendError> {
        self.wire.calls.fetch_add(1, Ordering::SeqCst);
        let _pass = self.wire.gate.lock().unwrap();
        if self.wire.down.load(Ordering::SeqCst) {
            return Err(BackendError::Unreachable {
                backend: "wire",
                reason: "cut".into(),
            });
        }
        self.wire.ops.fetch_add(ops.len(), Ordering::SeqCst);
        self.inner.execute(ops, replies)
    }
    fn partitions(
        &mut self,
        nf: &str,
        kind: flowstate_state::Kind,
        id: &str,
    ) -> Result<Vec<flowstate_state::ObjectKey>, BackendError> {
        self.inner.partitions(nf, kind, id)
    }
}

impl Connector for Wire {
    fn name(&self) -> &'static str {
        "wire"
    }
    fn connect(&self) -> Result<Box<dyn Backend>, BackendError> {
        Ok(Box::new(WireBackend {
            inner: self.store.connect()?,
            wire: self.clone(),
        }))
    }
}

#[test]
fn flushes_the_store_fails_are_sent_again_in_order_when_it_answers() {
    let wire = Wire::default();
    let mut p = part(&wire, 0);
    let mut d = p.declare("nf");
    let c = d.counter("c", Scope::PerFlow, Access::WriteMostly).unwrap();
    let l = d
        .list::<u16>("pool", Scope::PerFlow, Access::ReadWrite)
        .unwrap();
    c.add_nowait(5);
    p.flush(S);
    assert_eq!(c.add(0).unwrap(), 5);

    wire.down.store(true, Ordering::SeqCst);
    c.add_nowait(7);
    p.flush(2 * S);
    c.add_nowait(30);
    p.flush(3 * S);
    l.push_nowait(1);
    l.push_nowait(2);
    // A call while the store is down fails, but the pushes queued before it are kept.
    assert!(l.pop().is_err());
    assert!(c.add(0).is_err(), "no read around the updates that wait");
    wire.down.store(false, Ordering::SeqCst);
    assert_eq!(c.add(0).unwrap(), 42, "every update, once, in order");
    assert_eq!(l.pop().unwrap(), Some(1));
    assert_eq!(l.pop().unwrap(), Some(2));
    let st = p.stats();
    assert!(st.errors.load(Ordering::Relaxed) >= 1, "{st:?}");
    assert_eq!(st.lost_ops.load(Ordering::Relaxed), 0);
}

#[test]
fn beyond_the_retention_limit_the_oldest_failed_flushes_are_given_up_and_counted() {
    let wire = Wire::default();
    let mut p = Partition::new(
        &wire,
        StateConfig {
            retain_ops: 2,
            ..StateConfig::default()
        },
    )
    .unwrap();
    let c = p
        .declare("nf")
        .counter("c", Scope::PerFlow, Access::WriteMostly)
        .unwrap();
    wire.down.store(true, Ordering::SeqCst);
    for (i, delta) in [1, 10, 100].into_iter().enumerate() {
        c.add_nowait(delta);
        p.flush(i as u64 * S);
    }
    // A call waits for the state thread to have seen every flush (and fails: still down).
    assert!(c.add(0).is_err());
    wire.down.store(false, Ordering::SeqCst);
    assert_eq!(c.add(0).unwrap(), 110, "the oldest flush was given up");
    assert_eq!(p.stats().lost_ops.load(Ordering::Relaxed), 1);
}

#[test]
fn while_the_state_thread_is_behind_changes_coalesce_and_no_older_write_overtakes_a_newer() {
    let wire = Wire::default();
    let mut p = Partition::new(
        &wire,
        StateConfig {
            queue_depth: 1,
            ..StateConfig::default()
        },
    )
    .unwrap();
    let mut d = p.declare("nf");
    let c = d.counter("c", Scope::PerFlow, Access::WriteMostly).unwrap();
    let v = d
        .value::<u32>("v", Scope::PerFlow, Access::ReadWrite)
        .unwrap();
    let hold = wire.gate.lock().unwrap();
    c.add_nowait(1);
    p.flush(S);
    // The state thread has taken that flush and waits at the gate.
    while wire.calls.load(Ordering::SeqCst) == 0 {
        std::thread::yield_now();
    }
    c.add_nowait(1);
    p.flush(2 * S); // queued: the channel holds one
    for i in 3..=100 {
        c.add_nowait(1);
        v.set_nowait(i);
        p.flush(i as u64 * S); // the thread is behind
    }
    assert!(p.stats().held_back.load(Ordering::Relaxed) >= 98);
    drop(hold);
    // A write after held-back changes lands after them, and a read sees them all.
    v.set(1000).unwrap();
    assert_eq!(c.get().unwrap(), 100);
    p.flush_all(101 * S).unwrap();
    let mut b = wire.store.connect().unwrap();
    let key = flowstate_state::ObjectKey::from_raw(&v.key()).unwrap();
    let mut replies = Vec::new();
    b.execute(&[flowstate_state::Op::Get { key }], &mut replies)
        .unwrap();
    assert_eq!(
        replies,
        vec![flowstate_state::Reply::Value(Some(
            flowstate_state::Codec::to_bytes(&1000u32)
        ))]
    );
    // 98 flushes held back cost a handful of operations, not one per object per flush.
    let ops = wire.ops.load(Ordering::SeqCst);
    assert!(ops <= 8, "{ops} operations reached the store");
}

#[test]
fn uncached_partitions_read_through_to_the_store_on_every_access() {
    let store = Remote(LocalStore::new());
    let mut p = Partition::new(
        &store,
        StateConfig {
            uncached: true,
            ..StateConfig::default()
        },
    )
    .unwrap();
    let mut d = p.declare("nat");
    let m = d
        .map::<u32, u32>("flows", Scope::PerFlow, Access::ReadMostly)
        .unwrap();
    assert_eq!(
        m.strategy(),
        Strategy::Offload,
        "not the cache its scope would choose"
    );
    m.insert_nowait(1, 100);
    p.flush(0);
    let calls = |p: &Partition| p.stats().sync_calls.load(Ordering::Relaxed);
    let before = calls(&p);
    for t in 1..=3 {
        assert_eq!(m.get(&1).unwrap(), Some(100));
        p.flush(t * S);
    }
    assert_eq!(
        calls(&p) - before,
        3,
        "one round trip per read after each flush"
    );
    // The cached default reads the same field from its cache.
    let mut q = part(&store, 1);
    let mut d = q.declare("nat");
    let cached = d
        .map::<u32, u32>("flows", Scope::PerFlow, Access::ReadMostly)
        .unwrap();
    cached.insert_nowait(1, 100);
    q.flush(0);
    let before = calls(&q);
    for t in 1..=3 {
        assert_eq!(cached.get(&1).unwrap(), Some(100));
        q.flush(t * S);
    }
    assert_eq!(calls(&q), before);
}

/// Entries of a map expire in the order of their deadlines (ties by key), whatever renewals,
/// shorter deadlines and replacements came before, against a naive model (key → value,
/// deadline); a NAT's ports return to its pool in that order. On the in-process store and on a
/// remote one.
#[test]
fn map_entries_expire_in_deadline_order_whatever_came_before() {
    for remote in [false, true] {
        let store = LocalStore::new();
        let remote_store = Remote(store.clone());
        let c: &dyn Connector = if remote { &remote_store } else { &store };
        let mut p = part(c, 0);
        let m = p
            .declare("nf")
            .map::<u32, u32>("m", Scope::PerFlow, Access::ReadMostly)
            .unwrap();
        let mut model = std::collections::BTreeMap::<u32, (u32, u64)>::new();
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut next = |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        let mut now = 1;
        for step in 0..20_000u32 {
            let k = next(64) as u32;
            match next(5) {
                0 => {
                    m.insert(k, step).unwrap();
                    model.insert(k, (step, 0));
                }
                1..=3 => {
                    // Renewed for 1..40 ms: longer or shorter than before.
                    let ttl = Duration::from_millis(1 + next(40));
                    let had = m.expire_after(&k, ttl, now);
                    assert_eq!(had, model.contains_key(&k), "step {step}");
                    if let Some(e) = model.get_mut(&k) {
                        e.1 = now + ttl.as_nanos() as u64;
                    }
                }
                _ => {
                    now += next(5) * 1_000_000;
                    let mut want: Vec<(u64, u32, u32)> = model
                        .iter()
                        .filter(|(_, (_, d))| *d != 0 && *d <= now)
                        .map(|(k, (v, d))| (*d, *k, *v))
                        .collect();
                    want.sort_unstable();
                    model.retain(|_, (_, d)| *d == 0 || *d > now);
                    let mut got = Vec::new();
                    m.expire(now, |k, v| got.push((k, v)));
                    let want: Vec<(u32, u32)> = want.into_iter().map(|(_, k, v)| (k, v)).collect();
                    assert_eq!(got, want, "step {step}, remote {remote}");
                }
            }
        }
        assert_eq!(m.len().unwrap(), model.len() as u64);
    }
}

/// A store with two places and no atomic step over both, as Redis Cluster's hash slots: a
/// fenced batch's operations on the fence's place (here: every key but the `shared` NF's) run
/// with the check; the others run after, and fail while `rest_down` is set
/// ([`BackendError::Partial`]). `fence_holds` cleared: the writer has lost its fence.
#[derive(Clone, Default)]
struct Split {
    store: LocalStore,
    rest_down: std::sync::Arc<std::sync::atomic::AtomicBool>,
    fence_lost: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

struct SplitBackend {
    inner: Box<dyn Backend>,
    split: Split,
}

impl Backend for SplitBackend {
    fn name(&self) -> &'static str {
        "split"
    }
    fn execute(
        &mut self,
        ops: &[flowstate_state::Op],
        replies: &mut Vec<flowstate_state::Reply>,
    ) -> Result<(), BackendError> {
        if self.split.rest_down.load(Ordering::SeqCst)
            && ops.iter().any(|o| o.key().as_str().starts_with("shared@"))
        {
            return Err(BackendError::Unreachable {
                backend: "split",
                reason: "the other place is down".into(),
            });
        }
        self.inner.execute(ops, replies)
    }
    fn execute_fenced(
        &mut self,
        _fence: &flowstate_state::Fence,
        ops: &[flowstate_state::Op],
        replies: &mut Vec<flowstate_state::Reply>,
    ) -> Result<(), BackendError> {
        if self.split.fence_lost.load(Ordering::SeqCst) {
            return Err(BackendError::Fenced {
                backend: "split",
                key: "owner".into(),
            });
        }
        let (rest, inside): (Vec<usize>, Vec<usize>) =
            (0..ops.len()).partition(|&i| ops[i].key().as_str().starts_with("shared@"));
        let pick = |idx: &[usize]| idx.iter().map(|&i| ops[i].clone()).collect::<Vec<_>>();
        let mut first = Vec::new();
        self.inner.execute(&pick(&inside), &mut first)?;
        if !rest.is_empty() && self.split.rest_down.load(Ordering::SeqCst) {
            return Err(BackendError::Partial {
                backend: "split",
                rest,
                reason: "the other place is down".into(),
            });
        }
        let mut second = Vec::new();
        self.inner.execute(&pick(&rest), &mut second)?;
        let (mut first, mut second) = (first.into_iter(), second.into_iter());
        for i in 0..ops.len() {
            let from = if rest.contains(&i) {
                &mut second
            } else {
                &mut first
            };
            replies.push(from.next().unwrap());
        }
        Ok(())
    }
    fn partitions(
        &mut self,
        nf: &str,
        kind: flowstate_state::Kind,
        id: &str,
    ) -> Result<Vec<flowstate_state::ObjectKey>, BackendError> {
        self.inner.partitions(nf, kind, id)
    }
}

impl Connector for Split {
    fn name(&self) -> &'static str {
        "split"
    }
    fn connect(&self) -> Result<Box<dyn Backend>, BackendError> {
        let plain = SplitBackend {
            inner: self.store.connect()?,
            split: self.clone(),
        };
        let fence = flowstate_state::Fence {
            key: flowstate_state::ObjectKey::from_raw("cluster@0@0@Value@owner").unwrap(),
            value: b"1:1".to_vec(),
            batch: 0,
        };
        Ok(Box::new(flowstate_state::FencedBackend::new(
            Box::new(plain),
            fence,
        )))
    }
}

/// A fenced batch whose fence's part ran and whose other part failed: only the other part is
/// sent again (nothing counted twice), without the fence, and still after the writer lost
/// the fence and closed the partition (nothing of an accepted batch lost).
#[test]
fn what_an_accepted_fenced_batch_left_is_sent_again_once_even_after_the_fence_is_lost() {
    let split = Split::default();
    let mut p = part(&split, 0);
    let own = p
        .declare("own")
        .counter("c", Scope::PerFlow, Access::WriteMostly)
        .unwrap();
    let shared = p
        .declare("shared")
        .counter("c", Scope::Shared, Access::WriteMostly)
        .unwrap();
    split.rest_down.store(true, Ordering::SeqCst);
    own.add_nowait(1);
    shared.add_nowait(10);
    assert!(p.flush_all(S).is_err(), "the shared part failed");
    split.rest_down.store(false, Ordering::SeqCst);
    assert_eq!(own.add(0).unwrap(), 1, "the fence's part ran once");
    let mut b = split.store.connect().unwrap();
    assert_eq!(merge::counter_sum(b.as_mut(), "shared", "c").unwrap(), 10);

    split.rest_down.store(true, Ordering::SeqCst);
    own.add_nowait(1);
    shared.add_nowait(10);
    assert!(p.flush_all(2 * S).is_err());
    split.fence_lost.store(true, Ordering::SeqCst);
    drop((own, shared, p));
    split.rest_down.store(false, Ordering::SeqCst);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while merge::counter_sum(b.as_mut(), "shared", "c").unwrap() != 20 {
        assert!(
            std::time::Instant::now() < deadline,
            "the rest never landed"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(merge::counter_sum(b.as_mut(), "own", "c").unwrap(), 2);
}
