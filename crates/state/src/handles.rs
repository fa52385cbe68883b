//! The typed handles NFs hold: [`Value`], [`Counter`], [`List`], [`Set`], [`Map`],
//! [`CounterMap`] (FlexState §III-A1).
//!
//! A handle belongs to one worker. Calls ending in `_nowait` never wait and never fail: they
//! change the worker's cache and queue what the store must learn for the next flush
//! (FlexState §III-C1). The other calls return a `Result`: on a store the worker owns alone
//! (the in-process `local` backend) they are served by the cache; otherwise they run on the
//! store, after every change queued before them, and wait.
//!
//! Cached reads follow CHC Table 1 (see [`Strategy`]): per-flow and partitioned objects, and
//! shared read-mostly ones, are read from the cache, loading a missing entry from the store
//! once; write-mostly objects are not cached, so reading them is a store call. Lists and sets
//! on a remote store are not cached: pushes and inserts queue, pops and lookups are store
//! calls.

use crate::backend::{Bytes, Op, Reply};
use crate::codec::Codec;
use crate::engine::{Declare, Flushable, Meta, Nanos};
use crate::key::Kind;
use crate::scope::{Access, Scope, Strategy};
use crate::table::FlowTable;
use crate::StateError;
use std::cell::{RefCell, RefMut};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::hash::Hash;
use std::rc::Rc;
use std::time::Duration;

/// Lease of a [`lock`](Value::lock) unless renewed (FlexState §VI-B).
pub const LOCK_LEASE: Duration = Duration::from_secs(1);

fn decode<T: Codec>(b: &[u8]) -> Result<T, StateError> {
    T::from_bytes(b).map_err(StateError::Codec)
}

fn reply_value<T: Codec>(r: Reply) -> Result<Option<T>, StateError> {
    match r {
        Reply::Value(None) => Ok(None),
        Reply::Value(Some(b)) => decode(&b).map(Some),
        _ => Err(StateError::Unexpected("expected a value")),
    }
}

fn reply_int(r: Reply) -> Result<i64, StateError> {
    match r {
        Reply::Int(i) => Ok(i),
        _ => Err(StateError::Unexpected("expected an integer")),
    }
}

fn reply_bool(r: Reply) -> Result<bool, StateError> {
    match r {
        Reply::Bool(b) => Ok(b),
        _ => Err(StateError::Unexpected("expected a boolean")),
    }
}

fn reply_len(r: Reply) -> Result<u64, StateError> {
    match r {
        Reply::Len(n) => Ok(n),
        _ => Err(StateError::Unexpected("expected a length")),
    }
}

/// Runs `ops` (queued changes of one object, then the call) and returns the last reply. If
/// the store fails, the queued changes are still sent later; the call fails.
fn call_after(meta: &Meta, mut ops: Vec<Op>, op: Op) -> Result<Reply, StateError> {
    let queued = ops.len();
    ops.push(op);
    let mut replies = meta.link.call_keeping(ops, queued)?;
    if let Some(e) = replies.iter().find_map(|r| match r {
        Reply::Error(e) => Some(e.clone()),
        _ => None,
    }) {
        return Err(StateError::Op(e));
    }
    replies.pop().ok_or(StateError::Unexpected("no reply"))
}

impl Meta {
    /// The collection's length in the store, after `pending` (its queued changes) are applied.
    fn len_after(&self, pending: Vec<Op>, kind: Kind) -> Result<u64, StateError> {
        reply_len(call_after(
            self,
            pending,
            Op::Len {
                key: self.key.clone(),
                kind,
            },
        )?)
    }

    fn lock(&self) -> Result<bool, StateError> {
        reply_bool(self.link.call1(Op::Lock {
            key: self.key.clone(),
            owner: self.lock_owner,
            lease: LOCK_LEASE,
        })?)
    }

    fn unlock(&self) -> Result<bool, StateError> {
        reply_bool(self.link.call1(Op::Unlock {
            key: self.key.clone(),
            owner: self.lock_owner,
        })?)
    }
}

macro_rules! common_methods {
    () => {
        /// The object's store key.
        pub fn key(&self) -> String {
            self.inner().meta.key.to_string()
        }

        /// The caching strategy chosen from its scope and access pattern.
        pub fn strategy(&self) -> Strategy {
            self.inner().meta.strategy
        }

        /// Takes the object's lock for this worker (a lease of [`LOCK_LEASE`]); `false` if
        /// another holds it. A last resort (FlexState §VI-B).
        pub fn lock(&self) -> Result<bool, StateError> {
            self.inner().meta.lock()
        }

        /// Releases the lock; `false` if this worker did not hold it.
        pub fn unlock(&self) -> Result<bool, StateError> {
            self.inner().meta.unlock()
        }
    };
}

// ------------------------------------------------------------------------------------------
// Value

struct ValueObj<T> {
    meta: Meta,
    cache: Option<T>,
    loaded: bool,
    dirty: bool,
}

/// One value (FlexState's name-value pair): create, read, update, delete, compare-and-set.
pub struct Value<T: Codec + Clone + PartialEq + 'static>(Rc<RefCell<ValueObj<T>>>);

impl<T: Codec + Clone + PartialEq + 'static> Value<T> {
    fn inner(&self) -> RefMut<'_, ValueObj<T>> {
        self.0.borrow_mut()
    }

    common_methods!();

    /// The value, or `None` if unset.
    pub fn get(&self) -> Result<Option<T>, StateError> {
        let mut o = self.inner();
        if o.meta.authoritative || (o.meta.cached() && o.loaded) {
            return Ok(o.cache.clone());
        }
        let pending = o.pending_ops();
        let v = reply_value(call_after(
            &o.meta,
            pending,
            Op::Get {
                key: o.meta.key.clone(),
            },
        )?)?;
        o.dirty = false;
        o.cache = v.clone();
        o.loaded = o.meta.cached();
        Ok(v)
    }

    /// Sets the value without waiting.
    pub fn set_nowait(&self, v: T) {
        let mut o = self.inner();
        o.cache = Some(v);
        o.loaded = true;
        o.dirty = !o.meta.authoritative;
    }

    /// Sets the value and waits for the store.
    pub fn set(&self, v: T) -> Result<(), StateError> {
        self.write(Some(v))
    }

    /// Deletes the value and waits for the store.
    pub fn delete(&self) -> Result<(), StateError> {
        self.write(None)
    }

    /// Deletes the value without waiting.
    pub fn delete_nowait(&self) {
        let mut o = self.inner();
        o.cache = None;
        o.loaded = true;
        o.dirty = !o.meta.authoritative;
    }

    fn write(&self, v: Option<T>) -> Result<(), StateError> {
        let mut o = self.inner();
        if !o.meta.authoritative {
            let op = match &v {
                Some(v) => Op::Set {
                    key: o.meta.key.clone(),
                    value: v.to_bytes(),
                },
                None => Op::Delete {
                    key: o.meta.key.clone(),
                },
            };
            call_after(&o.meta, Vec::new(), op)?;
            o.dirty = false;
        }
        o.cache = v;
        o.loaded = true;
        Ok(())
    }

    /// Replaces the value with `new` (`None`: delete) if it currently is `expected`
    /// (`None`: unset). Returns whether it did.
    pub fn compare_and_set(
        &self,
        expected: Option<&T>,
        new: Option<T>,
    ) -> Result<bool, StateError> {
        let mut o = self.inner();
        if o.meta.authoritative {
            if o.cache.as_ref() != expected {
                return Ok(false);
            }
            o.cache = new;
            return Ok(true);
        }
        let pending = o.pending_ops();
        let op = Op::CompareAndSet {
            key: o.meta.key.clone(),
            expected: expected.map(Codec::to_bytes),
            new: new.as_ref().map(Codec::to_bytes),
        };
        let done = reply_bool(call_after(&o.meta, pending, op)?)?;
        o.dirty = false;
        if done {
            o.cache = new;
            o.loaded = o.meta.cached();
        } else {
            o.loaded = false;
        }
        Ok(done)
    }
}

impl<T: Codec> ValueObj<T> {
    fn pending_ops(&mut self) -> Vec<Op> {
        let mut ops = Vec::new();
        if self.dirty {
            self.push_write(&mut ops);
            self.dirty = false;
        }
        ops
    }

    fn push_write(&self, ops: &mut Vec<Op>) {
        ops.push(match &self.cache {
            Some(v) => Op::Set {
                key: self.meta.key.clone(),
                value: v.to_bytes(),
            },
            None => Op::Delete {
                key: self.meta.key.clone(),
            },
        });
    }
}

impl<T: Codec> Flushable for ValueObj<T> {
    fn drain(&mut self, _now: Nanos, all: bool, ops: &mut Vec<Op>) {
        if self.dirty || (all && self.meta.authoritative && self.loaded) {
            self.push_write(ops);
            self.dirty = false;
        }
        if self.meta.strategy == Strategy::Offload && !self.meta.authoritative {
            self.loaded = false;
        }
    }

    fn refresh(&mut self) {
        if self.meta.strategy == Strategy::CacheRefresh && !self.meta.authoritative && !self.dirty {
            self.loaded = false;
        }
    }
}

// ------------------------------------------------------------------------------------------
// Counter

struct CounterObj {
    meta: Meta,
    value: i64,
    loaded: bool,
    pending: i64,
}

/// A 64-bit signed counter: `add`, read, set.
pub struct Counter(Rc<RefCell<CounterObj>>);

impl Counter {
    fn inner(&self) -> RefMut<'_, CounterObj> {
        self.0.borrow_mut()
    }

    common_methods!();

    /// Adds `delta` without waiting (FlexState `add` no_wait).
    #[inline]
    pub fn add_nowait(&self, delta: i64) {
        let mut o = self.inner();
        o.value = o.value.wrapping_add(delta);
        if !o.meta.authoritative {
            o.pending = o.pending.wrapping_add(delta);
        }
    }

    /// Adds `delta`, waits, and returns the new value.
    pub fn add(&self, delta: i64) -> Result<i64, StateError> {
        let mut o = self.inner();
        if o.meta.authoritative {
            o.value = o.value.wrapping_add(delta);
            return Ok(o.value);
        }
        let total = o.pending.wrapping_add(delta);
        let v = reply_int(call_after(
            &o.meta,
            Vec::new(),
            Op::Add {
                key: o.meta.key.clone(),
                delta: total,
            },
        )?)?;
        o.pending = 0;
        o.value = v;
        o.loaded = o.meta.cached();
        Ok(v)
    }

    /// The value (this partition's, for a partitioned counter; merge for the total).
    pub fn get(&self) -> Result<i64, StateError> {
        let o = self.inner();
        if o.meta.authoritative || (o.meta.cached() && o.loaded) {
            return Ok(o.value);
        }
        drop(o);
        self.add(0)
    }

    /// Overwrites the value and waits.
    pub fn set(&self, v: i64) -> Result<(), StateError> {
        let mut o = self.inner();
        if !o.meta.authoritative {
            call_after(
                &o.meta,
                Vec::new(),
                Op::SetCounter {
                    key: o.meta.key.clone(),
                    value: v,
                },
            )?;
            o.pending = 0;
            o.loaded = o.meta.cached();
        }
        o.value = v;
        Ok(())
    }
}

impl Flushable for CounterObj {
    fn drain(&mut self, _now: Nanos, all: bool, ops: &mut Vec<Op>) {
        if self.meta.authoritative {
            if all {
                ops.push(Op::SetCounter {
                    key: self.meta.key.clone(),
                    value: self.value,
                });
            }
            return;
        }
        if self.pending != 0 {
            ops.push(Op::Add {
                key: self.meta.key.clone(),
                delta: self.pending,
            });
            self.pending = 0;
        }
        if self.meta.strategy == Strategy::Offload {
            self.loaded = false;
        }
    }

    fn refresh(&mut self) {
        if self.meta.strategy == Strategy::CacheRefresh && !self.meta.authoritative {
            self.loaded = false;
        }
    }
}

// ------------------------------------------------------------------------------------------
// List

struct ListObj<T> {
    meta: Meta,
    cache: VecDeque<T>,
    pending: Vec<T>,
}

/// A FIFO list: `push` at the back, `pop` from the front (CHC Table 2; a NAT's free ports).
pub struct List<T: Codec + 'static>(Rc<RefCell<ListObj<T>>>);

impl<T: Codec + 'static> List<T> {
    fn inner(&self) -> RefMut<'_, ListObj<T>> {
        self.0.borrow_mut()
    }

    common_methods!();

    /// Appends without waiting.
    #[inline]
    pub fn push_nowait(&self, item: T) {
        let mut o = self.inner();
        if o.meta.authoritative {
            o.cache.push_back(item);
        } else {
            o.pending.push(item);
        }
    }

    /// Appends, waits, and returns the new length.
    pub fn push(&self, item: T) -> Result<u64, StateError> {
        let mut o = self.inner();
        if o.meta.authoritative {
            o.cache.push_back(item);
            return Ok(o.cache.len() as u64);
        }
        let pending = o.pending_ops();
        reply_len(call_after(
            &o.meta,
            pending,
            Op::Push {
                key: o.meta.key.clone(),
                item: item.to_bytes(),
            },
        )?)
    }

    /// Takes the first item, or `None` when empty.
    #[inline]
    pub fn pop(&self) -> Result<Option<T>, StateError> {
        let mut o = self.inner();
        if o.meta.authoritative {
            return Ok(o.cache.pop_front());
        }
        let pending = o.pending_ops();
        reply_value(call_after(
            &o.meta,
            pending,
            Op::Pop {
                key: o.meta.key.clone(),
            },
        )?)
    }

    /// Number of items.
    pub fn len(&self) -> Result<u64, StateError> {
        let mut o = self.inner();
        if o.meta.authoritative {
            return Ok(o.cache.len() as u64);
        }
        let pending = o.pending_ops();
        o.meta.len_after(pending, Kind::List)
    }

    /// Whether the list is empty.
    pub fn is_empty(&self) -> Result<bool, StateError> {
        Ok(self.len()? == 0)
    }
}

impl<T: Codec> ListObj<T> {
    fn pending_ops(&mut self) -> Vec<Op> {
        let key = &self.meta.key;
        self.pending
            .drain(..)
            .map(|i| Op::Push {
                key: key.clone(),
                item: i.to_bytes(),
            })
            .collect()
    }
}

impl<T: Codec> Flushable for ListObj<T> {
    fn drain(&mut self, _now: Nanos, all: bool, ops: &mut Vec<Op>) {
        if self.meta.authoritative && all {
            ops.push(Op::Delete {
                key: self.meta.key.clone(),
            });
            for i in &self.cache {
                ops.push(Op::Push {
                    key: self.meta.key.clone(),
                    item: i.to_bytes(),
                });
            }
        }
        ops.extend(self.pending_ops());
    }
}

// ------------------------------------------------------------------------------------------
// Set

struct SetObj<T> {
    meta: Meta,
    cache: foldhash::HashSet<T>,
    pending: Vec<(T, bool)>,
}

/// A set of members.
pub struct Set<T: Codec + Hash + Eq + 'static>(Rc<RefCell<SetObj<T>>>);

impl<T: Codec + Hash + Eq + 'static> Set<T> {
    fn inner(&self) -> RefMut<'_, SetObj<T>> {
        self.0.borrow_mut()
    }

    common_methods!();

    /// Adds a member without waiting.
    #[inline]
    pub fn insert_nowait(&self, m: T) {
        let mut o = self.inner();
        if o.meta.authoritative {
            o.cache.insert(m);
        } else {
            o.pending.push((m, true));
        }
    }

    /// Removes a member without waiting.
    #[inline]
    pub fn remove_nowait(&self, m: T) {
        let mut o = self.inner();
        if o.meta.authoritative {
            o.cache.remove(&m);
        } else {
            o.pending.push((m, false));
        }
    }

    /// Adds a member, waits; `true` if it was new.
    pub fn insert(&self, m: T) -> Result<bool, StateError> {
        let mut o = self.inner();
        if o.meta.authoritative {
            return Ok(o.cache.insert(m));
        }
        let pending = o.pending_ops();
        reply_bool(call_after(
            &o.meta,
            pending,
            Op::Insert {
                key: o.meta.key.clone(),
                member: m.to_bytes(),
            },
        )?)
    }

    /// Removes a member, waits; `true` if it was there.
    pub fn remove(&self, m: &T) -> Result<bool, StateError> {
        let mut o = self.inner();
        if o.meta.authoritative {
            return Ok(o.cache.remove(m));
        }
        let pending = o.pending_ops();
        reply_bool(call_after(
            &o.meta,
            pending,
            Op::Remove {
                key: o.meta.key.clone(),
                member: m.to_bytes(),
            },
        )?)
    }

    /// Whether `m` is a member.
    #[inline]
    pub fn contains(&self, m: &T) -> Result<bool, StateError> {
        let mut o = self.inner();
        if o.meta.authoritative {
            return Ok(o.cache.contains(m));
        }
        let pending = o.pending_ops();
        reply_bool(call_after(
            &o.meta,
            pending,
            Op::Contains {
                key: o.meta.key.clone(),
                member: m.to_bytes(),
            },
        )?)
    }

    /// Number of members.
    pub fn len(&self) -> Result<u64, StateError> {
        let mut o = self.inner();
        if o.meta.authoritative {
            return Ok(o.cache.len() as u64);
        }
        let pending = o.pending_ops();
        o.meta.len_after(pending, Kind::Set)
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> Result<bool, StateError> {
        Ok(self.len()? == 0)
    }
}

impl<T: Codec> SetObj<T> {
    fn pending_ops(&mut self) -> Vec<Op> {
        let key = &self.meta.key;
        self.pending
            .drain(..)
            .map(|(m, ins)| {
                let member = m.to_bytes();
                if ins {
                    Op::Insert {
                        key: key.clone(),
                        member,
                    }
                } else {
                    Op::Remove {
                        key: key.clone(),
                        member,
                    }
                }
            })
            .collect()
    }
}

impl<T: Codec> Flushable for SetObj<T> {
    fn drain(&mut self, _now: Nanos, all: bool, ops: &mut Vec<Op>) {
        if self.meta.authoritative && all {
            ops.push(Op::Delete {
                key: self.meta.key.clone(),
            });
            for m in &self.cache {
                ops.push(Op::Insert {
                    key: self.meta.key.clone(),
                    member: m.to_bytes(),
                });
            }
        }
        ops.extend(self.pending_ops());
    }
}

// ------------------------------------------------------------------------------------------
// Map

/// A cached entry. With a flow key (40 bytes) and a small value (the NAT's sessions: 8), it
/// is one 64-byte cache line of the [`FlowTable`]: a field more would make it two, and double
/// the lines a lookup loads (checked below for the NAT's shape).
struct Slot<V> {
    value: V,
    /// Expiry time, 0 for none.
    deadline: Nanos,
    /// When the store's copy expires, as last told (0: not told). Kept at or after `deadline`
    /// so the store never loses an entry a worker still uses (see [`renewal_ttl`]).
    stored: Nanos,
}

const _: () = assert!(std::mem::size_of::<Option<(flowstate_wire::FlowKey, Slot<u64>)>>() <= 64);

/// The 64-byte cache lines a cached entry of a [`Map`] from `K` to `V` takes (each entry is
/// aligned to a line in the cache's `FlowTable`): what a lookup that finds it loads. For NFs to
/// check their entries' size at compile time (`const _: () = assert!(...)`).
pub const fn map_entry_lines<K, V>() -> usize {
    std::mem::size_of::<Option<(K, Slot<V>)>>().div_ceil(64)
}

const _: () = assert!(map_entry_lines::<flowstate_wire::FlowKey, u64>() == 1);

impl<V> Slot<V> {
    fn new(value: V) -> Self {
        Slot {
            value,
            deadline: 0,
            stored: 0,
        }
    }
}

/// The time to live the store is given for an entry that expires `remaining` from now: half
/// as long again, so that renewing an entry on every packet tells the store at most once per
/// half time to live instead of once per flush. The store's copy outlives the worker's by at
/// most half a time to live, and a worker taking the flow over renews it on its first packet.
fn renewal_ttl(remaining: Nanos) -> Nanos {
    remaining.saturating_add(remaining / 2).max(1)
}

struct MapObj<K, V> {
    meta: Meta,
    cache: FlowTable<K, Slot<V>>,
    /// Keys whose current state (value or absence) the store must learn.
    dirty: foldhash::HashSet<K>,
    /// Keys whose store copy must live longer (value unchanged).
    renew: foldhash::HashSet<K>,
    /// The latest time a caller gave (deadlines become times to live against it).
    now: Nanos,
    timers: BinaryHeap<Reverse<(Nanos, K)>>,
}

/// A map from keys to values, with per-entry time to live (FlexState §VI-B timers).
pub struct Map<K: Codec + Hash + Ord + Clone + 'static, V: Codec + 'static>(
    Rc<RefCell<MapObj<K, V>>>,
);

impl<K: Codec + Hash + Ord + Clone + 'static, V: Codec + 'static> Map<K, V> {
    fn inner(&self) -> RefMut<'_, MapObj<K, V>> {
        self.0.borrow_mut()
    }

    common_methods!();

    /// Calls `f` with the entry for `k` (or `None`), loading it from the store first if this
    /// worker's cache is not the only copy. The hot-path read.
    #[inline]
    pub fn with<R>(&self, k: &K, f: impl FnOnce(Option<&V>) -> R) -> Result<R, StateError> {
        let mut o = self.inner();
        let i = o.find_loaded(k)?;
        Ok(f(i.and_then(|i| o.cache.at(i)).map(|s| &s.value)))
    }

    /// Calls `f` with the entry for `k` to change it in place; the change reaches the store
    /// with the next flush.
    #[inline]
    pub fn with_mut<R>(&self, k: &K, f: impl FnOnce(Option<&mut V>) -> R) -> Result<R, StateError> {
        let mut o = self.inner();
        let i = o.find_loaded(k)?;
        let o = &mut *o;
        match i.and_then(|i| o.cache.at_mut(i)) {
            Some(s) => {
                if !o.meta.authoritative {
                    o.dirty.insert(k.clone());
                }
                Ok(f(Some(&mut s.value)))
            }
            None => Ok(f(None)),
        }
    }

    /// A copy of the entry for `k`.
    pub fn get(&self, k: &K) -> Result<Option<V>, StateError>
    where
        V: Clone,
    {
        self.with(k, |v| v.cloned())
    }

    /// Whether `k` has an entry.
    pub fn contains_key(&self, k: &K) -> Result<bool, StateError> {
        self.with(k, |v| v.is_some())
    }

    /// Sets the entry for `k` without waiting.
    #[inline]
    pub fn insert_nowait(&self, k: K, v: V) {
        let mut o = self.inner();
        if !o.meta.authoritative {
            o.dirty.insert(k.clone());
        }
        o.cache.insert(k, Slot::new(v));
    }

    /// Sets the entry for `k` and waits for the store.
    pub fn insert(&self, k: K, v: V) -> Result<(), StateError> {
        let mut o = self.inner();
        if !o.meta.authoritative {
            let op = Op::MapSet {
                key: o.meta.key.clone(),
                field: k.to_bytes(),
                value: v.to_bytes(),
            };
            call_after(&o.meta, Vec::new(), op)?;
            o.dirty.remove(&k);
        }
        o.cache.insert(k, Slot::new(v));
        Ok(())
    }

    /// Removes the entry for `k` without waiting; returns the cached value, if any.
    #[inline]
    pub fn remove_nowait(&self, k: &K) -> Option<V> {
        let mut o = self.inner();
        if !o.meta.authoritative {
            o.dirty.insert(k.clone());
        }
        o.cache.remove(k).map(|s| s.value)
    }

    /// Removes the entry for `k` and waits; returns whether the store had it.
    pub fn remove(&self, k: &K) -> Result<bool, StateError> {
        let mut o = self.inner();
        let had = o.cache.remove(k).is_some();
        if o.meta.authoritative {
            return Ok(had);
        }
        o.dirty.remove(k);
        reply_bool(call_after(
            &o.meta,
            Vec::new(),
            Op::MapDelete {
                key: o.meta.key.clone(),
                field: k.to_bytes(),
            },
        )?)
    }

    /// When the cached entry for `k` expires; `None` when it is not cached or has no time to
    /// live.
    pub fn deadline(&self, k: &K) -> Option<Nanos> {
        self.inner()
            .cache
            .get(k)
            .map(|s| s.deadline)
            .filter(|&d| d != 0)
    }

    /// Entries in this worker's cache (all entries when the cache is the only copy).
    pub fn cached_len(&self) -> usize {
        self.inner().cache.len()
    }

    /// Number of entries in the store (in the cache when it is the only copy).
    pub fn len(&self) -> Result<u64, StateError> {
        let mut o = self.inner();
        if o.meta.authoritative {
            return Ok(o.cache.len() as u64);
        }
        let mut pending = Vec::new();
        o.drain_dirty(0, &mut pending);
        o.meta.len_after(pending, Kind::Map)
    }

    /// Whether the map is empty.
    pub fn is_empty(&self) -> Result<bool, StateError> {
        Ok(self.len()? == 0)
    }

    /// Makes the entry for `k` expire `ttl` after `now` (replacing an earlier time); `false` if
    /// there is no such entry in the cache. Renewing on every packet is cheap, and on a remote
    /// store costs a store operation at most once per half time to live, not per flush.
    #[inline]
    pub fn expire_after(&self, k: &K, ttl: Duration, now: Nanos) -> bool
    where
        V: Clone + PartialEq,
    {
        matches!(self.renew_with(k, now, |_| (ttl, ())), Ok(Some(())))
    }

    /// The per-packet path of a stateful NF in one hash lookup: calls `f` with the entry for
    /// `k` to change it in place, then makes the entry expire after the time `f` returns
    /// (counted from `now`). `Ok(None)` when there is no entry. On a remote store the value
    /// is written with the next flush only if `f` changed it.
    #[inline]
    pub fn renew_with<R>(
        &self,
        k: &K,
        now: Nanos,
        f: impl FnOnce(&mut V) -> (Duration, R),
    ) -> Result<Option<R>, StateError>
    where
        V: Clone + PartialEq,
    {
        self.renew_entry(k, now, false, f)
    }

    /// As [`Map::renew_with`] for what was seen elsewhere (a cache that forwarded the flow's
    /// packets past the NF): `f` reads the entry for `k` and gives its time to live from
    /// `now`, and the entry's deadline moves only if that is later. An entry without a
    /// deadline keeps none. `Ok(None)` when there is no entry.
    pub fn extend_with<R>(
        &self,
        k: &K,
        now: Nanos,
        f: impl FnOnce(&V) -> (Duration, R),
    ) -> Result<Option<R>, StateError>
    where
        V: Clone + PartialEq,
    {
        self.renew_entry(k, now, true, |v| f(v))
    }

    /// [`Map::renew_with`], and with `later_only` [`Map::extend_with`].
    #[inline(always)]
    fn renew_entry<R>(
        &self,
        k: &K,
        now: Nanos,
        later_only: bool,
        f: impl FnOnce(&mut V) -> (Duration, R),
    ) -> Result<Option<R>, StateError>
    where
        V: Clone + PartialEq,
    {
        let mut o = self.inner();
        let i = o.find_loaded(k)?;
        let o = &mut *o;
        let Some(slot) = i.and_then(|i| o.cache.at_mut(i)) else {
            return Ok(None);
        };
        let authoritative = o.meta.authoritative;
        let before = (!authoritative).then(|| slot.value.clone());
        let (ttl, r) = f(&mut slot.value);
        let deadline = now.saturating_add(ttl.as_nanos() as u64).max(1);
        if later_only && (slot.deadline == 0 || deadline <= slot.deadline) {
            return Ok(Some(r));
        }
        // Every entry with a deadline has a timer node due no later than it: a node is pushed
        // for a first or an earlier deadline only; a later one is found when the node fires.
        let arm = slot.deadline == 0 || deadline < slot.deadline;
        slot.deadline = deadline;
        if let Some(before) = before {
            o.now = o.now.max(now);
            if before != slot.value {
                o.dirty.insert(k.clone());
            } else if deadline > slot.stored {
                o.renew.insert(k.clone());
            }
        }
        if arm {
            o.push_timer(deadline, k);
        }
        Ok(Some(r))
    }

    /// Removes every entry whose time has come by `now` and hands each to `on_expiry` (the
    /// NF's expiry callback: free a port, count a timeout). Returns how many expired.
    pub fn expire(&self, now: Nanos, mut on_expiry: impl FnMut(K, V)) -> usize {
        let mut expired = 0;
        // The cache is not borrowed while `on_expiry` runs, so it may use this map.
        loop {
            // A `let` ends the borrow here; a `while let` would hold it through the body.
            let next = self.inner().pop_expired(now);
            let Some((k, v)) = next else { break };
            expired += 1;
            on_expiry(k, v);
        }
        expired
    }

    /// Hints that `k` will be looked up soon: starts loading the cache lines its lookup
    /// reads first, so the lookups of a batch of packets can overlap their memory misses.
    /// Changes nothing; a no-op when the cache is empty (or the map is in use).
    #[inline]
    pub fn prefetch(&self, k: &K) {
        if let Ok(o) = self.0.try_borrow() {
            if !o.cache.is_empty() {
                o.cache.prefetch(o.cache.hash(k));
            }
        }
    }

    /// Calls `f` for every cached entry (all entries when the cache is the only copy).
    pub fn for_each(&self, mut f: impl FnMut(&K, &V)) {
        for (k, s) in self.inner().cache.iter() {
            f(k, &s.value);
        }
    }

    /// As [`Map::for_each`], with each entry's deadline ([`Map::deadline`]). `f` must not use
    /// this map.
    pub fn for_each_timed(&self, mut f: impl FnMut(&K, &V, Option<Nanos>)) {
        for (k, s) in self.inner().cache.iter() {
            f(k, &s.value, (s.deadline != 0).then_some(s.deadline));
        }
    }
}

impl<K: Codec + Hash + Ord + Clone, V: Codec> MapObj<K, V> {
    /// Pushes a timer node for `k` at `at`. Nodes outnumbering the entries twice over (extra
    /// ones from earlier deadlines and replaced entries) are rebuilt as one per timed entry,
    /// so the heap stays within twice the cache, at amortised constant cost.
    fn push_timer(&mut self, at: Nanos, k: &K) {
        self.timers.push(Reverse((at, k.clone())));
        if self.timers.len() > 2 * self.cache.len() + 64 {
            self.timers = self
                .cache
                .iter()
                .filter(|(_, s)| s.deadline != 0)
                .map(|(k, s)| Reverse((s.deadline, k.clone())))
                .collect();
        }
    }

    /// The next entry whose time has come by `now`, removed from the cache.
    fn pop_expired(&mut self, now: Nanos) -> Option<(K, V)> {
        while let Some(Reverse((at, _))) = self.timers.peek() {
            if *at > now {
                return None;
            }
            let Reverse((at, k)) = self.timers.pop()?;
            let Some(slot) = self.cache.get_mut(&k) else {
                continue; // removed since
            };
            if slot.deadline == 0 || slot.deadline < at {
                // Replaced without a time to live, or given an earlier deadline, which has a
                // node of its own.
                continue;
            }
            if slot.deadline > at {
                // Renewed: wait for the new time, which may have come too. An entry expires
                // at the node of its own deadline, so entries expire in (deadline, key) order.
                // (An entry replaced since its node was pushed may have more than one node;
                // the extra ones go when it does, or at the next rebuild.)
                let at = slot.deadline;
                self.push_timer(at, &k);
                continue;
            }
            let slot = self.cache.remove(&k)?;
            if !self.meta.authoritative {
                self.dirty.insert(k.clone());
            }
            return Some((k, slot.value));
        }
        None
    }
}

impl<K: Codec + Hash + Eq + Clone, V: Codec> MapObj<K, V> {
    /// Where `k`'s entry is in the cache, after loading it from the store if the cache is not
    /// the only copy and lacks it: one lookup when it is cached (the per-packet case).
    #[inline(always)]
    fn find_loaded(&mut self, k: &K) -> Result<Option<usize>, StateError> {
        if let Some(i) = self.cache.index_of(k) {
            return Ok(Some(i));
        }
        if self.meta.authoritative {
            return Ok(None);
        }
        self.load_shared(k)?;
        Ok(self.cache.index_of(k))
    }

    /// Loads `k`, which the cache lacks, from the store unless this worker has changed it
    /// (removed it, to be written): [`find_loaded`](Self::find_loaded)'s slow path.
    fn load_shared(&mut self, k: &K) -> Result<(), StateError> {
        if self.dirty.contains(k) {
            return Ok(());
        }
        let mut pending = Vec::new();
        if self.meta.strategy == Strategy::Offload {
            self.drain_dirty(0, &mut pending);
        }
        let op = Op::MapGet {
            key: self.meta.key.clone(),
            field: k.to_bytes(),
        };
        if let Some(v) = reply_value::<V>(call_after(&self.meta, pending, op)?)? {
            self.cache.insert(k.clone(), Slot::new(v));
        }
        Ok(())
    }

    fn drain_dirty(&mut self, now: Nanos, ops: &mut Vec<Op>) {
        let now = now.max(self.now);
        for k in self.dirty.drain() {
            self.renew.remove(&k);
            let field = k.to_bytes();
            match self.cache.get_mut(&k) {
                Some(s) => push_write(&self.meta, s, field, now, ops),
                None => ops.push(Op::MapDelete {
                    key: self.meta.key.clone(),
                    field,
                }),
            }
        }
        for k in self.renew.drain() {
            if let Some(s) = self.cache.get_mut(&k) {
                push_renewal(&self.meta, s, k.to_bytes(), now, ops);
            }
        }
    }
}

/// Writes the entry in `slot` to the store as `field`. A write clears the field's time to live
/// (as in Redis): its deadline is given again.
fn push_write<V: Codec>(
    meta: &Meta,
    slot: &mut Slot<V>,
    field: Bytes,
    now: Nanos,
    ops: &mut Vec<Op>,
) {
    ops.push(Op::MapSet {
        key: meta.key.clone(),
        field: field.clone(),
        value: slot.value.to_bytes(),
    });
    slot.stored = 0;
    push_renewal(meta, slot, field, now, ops);
}

/// Tells the store when the entry in `slot` expires, if it has a deadline.
fn push_renewal<V>(meta: &Meta, slot: &mut Slot<V>, field: Bytes, now: Nanos, ops: &mut Vec<Op>) {
    if slot.deadline == 0 {
        return;
    }
    let ttl = renewal_ttl(slot.deadline.saturating_sub(now));
    slot.stored = now.saturating_add(ttl);
    ops.push(Op::Expire {
        key: meta.key.clone(),
        field: Some(field),
        ttl: Duration::from_nanos(ttl),
    });
}

impl<K: Codec + Hash + Eq + Clone, V: Codec> Flushable for MapObj<K, V> {
    fn drain(&mut self, now: Nanos, all: bool, ops: &mut Vec<Op>) {
        if self.meta.authoritative {
            if !all {
                return;
            }
            // The store's copy is replaced by every entry, written in the table's order: no
            // key is collected or looked up again (a million of each at a million flows).
            ops.push(Op::Delete {
                key: self.meta.key.clone(),
            });
            let now = now.max(self.now);
            ops.reserve(2 * self.cache.len());
            for (k, s) in self.cache.iter_mut() {
                push_write(&self.meta, s, k.to_bytes(), now, ops);
            }
            self.dirty.clear();
            self.renew.clear();
            return;
        }
        self.drain_dirty(now, ops);
        if self.meta.strategy == Strategy::Offload {
            self.cache.clear();
            self.timers.clear();
        }
    }

    fn refresh(&mut self) {
        if self.meta.strategy == Strategy::CacheRefresh && !self.meta.authoritative {
            self.cache.clear();
            self.timers.clear();
        }
    }
}

// ------------------------------------------------------------------------------------------
// CounterMap

struct CounterMapObj<K> {
    meta: Meta,
    cache: foldhash::HashMap<K, i64>,
    pending: foldhash::HashMap<K, i64>,
}

/// A map from keys to counters: `add_to` (FlexState `addTo`).
pub struct CounterMap<K: Codec + Hash + Eq + Clone + 'static>(Rc<RefCell<CounterMapObj<K>>>);

impl<K: Codec + Hash + Eq + Clone + 'static> CounterMap<K> {
    fn inner(&self) -> RefMut<'_, CounterMapObj<K>> {
        self.0.borrow_mut()
    }

    common_methods!();

    /// Adds `delta` to the counter of `k` without waiting.
    #[inline]
    pub fn add_to_nowait(&self, k: &K, delta: i64) {
        let mut o = self.inner();
        let o = &mut *o;
        if o.meta.authoritative {
            // Look up before `entry`, which clones the key and may grow the map.
            match o.cache.get_mut(k) {
                Some(v) => *v += delta,
                None => {
                    o.cache.insert(k.clone(), delta);
                }
            }
            return;
        }
        if let Some(v) = o.cache.get_mut(k) {
            *v += delta;
        }
        *o.pending.entry(k.clone()).or_insert(0) += delta;
    }

    /// Adds `delta` to the counter of `k`, waits, returns the new value.
    pub fn add_to(&self, k: &K, delta: i64) -> Result<i64, StateError> {
        let mut o = self.inner();
        if o.meta.authoritative {
            let v = o.cache.entry(k.clone()).or_insert(0);
            *v += delta;
            return Ok(*v);
        }
        let total = o.pending.remove(k).unwrap_or(0) + delta;
        let op = Op::MapAdd {
            key: o.meta.key.clone(),
            field: k.to_bytes(),
            delta: total,
        };
        let v = reply_int(call_after(&o.meta, Vec::new(), op)?)?;
        if o.meta.cached() {
            o.cache.insert(k.clone(), v);
        }
        Ok(v)
    }

    /// The counter of `k` (0 when absent).
    pub fn get(&self, k: &K) -> Result<i64, StateError> {
        let o = self.inner();
        if o.meta.authoritative {
            return Ok(o.cache.get(k).copied().unwrap_or(0));
        }
        if let Some(v) = o.cache.get(k) {
            return Ok(*v);
        }
        drop(o);
        self.add_to(k, 0)
    }

    /// Removes the counter of `k` and waits.
    pub fn remove(&self, k: &K) -> Result<bool, StateError> {
        let mut o = self.inner();
        let had = o.cache.remove(k).is_some();
        if o.meta.authoritative {
            return Ok(had);
        }
        o.pending.remove(k);
        reply_bool(call_after(
            &o.meta,
            Vec::new(),
            Op::MapDelete {
                key: o.meta.key.clone(),
                field: k.to_bytes(),
            },
        )?)
    }

    /// Calls `f` for every cached counter (all of them when the cache is the only copy).
    pub fn for_each(&self, mut f: impl FnMut(&K, i64)) {
        for (k, v) in &self.inner().cache {
            f(k, *v);
        }
    }
}

impl<K: Codec + Hash + Eq + Clone> Flushable for CounterMapObj<K> {
    fn drain(&mut self, _now: Nanos, all: bool, ops: &mut Vec<Op>) {
        if self.meta.authoritative {
            if all {
                ops.push(Op::Delete {
                    key: self.meta.key.clone(),
                });
                for (k, v) in &self.cache {
                    ops.push(Op::MapAdd {
                        key: self.meta.key.clone(),
                        field: k.to_bytes(),
                        delta: *v,
                    });
                }
            }
            return;
        }
        for (k, d) in self.pending.drain() {
            if d != 0 {
                ops.push(Op::MapAdd {
                    key: self.meta.key.clone(),
                    field: k.to_bytes(),
                    delta: d,
                });
            }
        }
        if self.meta.strategy != Strategy::CacheFlush {
            self.cache.clear();
        }
    }
}

// ------------------------------------------------------------------------------------------
// Declaring

impl Declare<'_> {
    /// Declares a [`Value`].
    pub fn value<T: Codec + Clone + PartialEq + 'static>(
        &mut self,
        id: &str,
        scope: Scope,
        access: Access,
    ) -> Result<Value<T>, StateError> {
        let meta = self.meta(Kind::Value, id, scope, access)?;
        let loaded = meta.authoritative;
        let obj = Rc::new(RefCell::new(ValueObj {
            meta,
            cache: None,
            loaded,
            dirty: false,
        }));
        self.register(obj.clone());
        Ok(Value(obj))
    }

    /// Declares a [`Counter`].
    pub fn counter(
        &mut self,
        id: &str,
        scope: Scope,
        access: Access,
    ) -> Result<Counter, StateError> {
        let meta = self.meta(Kind::Counter, id, scope, access)?;
        let loaded = meta.authoritative;
        let obj = Rc::new(RefCell::new(CounterObj {
            meta,
            value: 0,
            loaded,
            pending: 0,
        }));
        self.register(obj.clone());
        Ok(Counter(obj))
    }

    /// Declares a [`List`].
    pub fn list<T: Codec + 'static>(
        &mut self,
        id: &str,
        scope: Scope,
        access: Access,
    ) -> Result<List<T>, StateError> {
        let meta = self.meta(Kind::List, id, scope, access)?;
        let obj = Rc::new(RefCell::new(ListObj {
            meta,
            cache: VecDeque::new(),
            pending: Vec::new(),
        }));
        self.register(obj.clone());
        Ok(List(obj))
    }

    /// Declares a [`Set`].
    pub fn set<T: Codec + Hash + Eq + 'static>(
        &mut self,
        id: &str,
        scope: Scope,
        access: Access,
    ) -> Result<Set<T>, StateError> {
        let meta = self.meta(Kind::Set, id, scope, access)?;
        let obj = Rc::new(RefCell::new(SetObj {
            meta,
            cache: foldhash::HashSet::default(),
            pending: Vec::new(),
        }));
        self.register(obj.clone());
        Ok(Set(obj))
    }

    /// Declares a [`Map`].
    pub fn map<K: Codec + Hash + Ord + Clone + 'static, V: Codec + 'static>(
        &mut self,
        id: &str,
        scope: Scope,
        access: Access,
    ) -> Result<Map<K, V>, StateError> {
        let meta = self.meta(Kind::Map, id, scope, access)?;
        let obj = Rc::new(RefCell::new(MapObj {
            meta,
            cache: FlowTable::new(),
            dirty: foldhash::HashSet::default(),
            renew: foldhash::HashSet::default(),
            now: 0,
            timers: BinaryHeap::new(),
        }));
        self.register(obj.clone());
        Ok(Map(obj))
    }

    /// Declares a [`CounterMap`].
    pub fn counter_map<K: Codec + Hash + Eq + Clone + 'static>(
        &mut self,
        id: &str,
        scope: Scope,
        access: Access,
    ) -> Result<CounterMap<K>, StateError> {
        let meta = self.meta(Kind::CounterMap, id, scope, access)?;
        let obj = Rc::new(RefCell::new(CounterMapObj {
            meta,
            cache: foldhash::HashMap::default(),
            pending: foldhash::HashMap::default(),
        }));
        self.register(obj.clone());
        Ok(CounterMap(obj))
    }
}

#[cfg(test)]
mod tests {
    use crate::local::LocalStore;
    use crate::{Access, Partition, Scope, StateConfig};

    #[test]
    fn map_prefetch_is_only_a_hint() {
        let store = LocalStore::new();
        let mut part = Partition::new(&store, StateConfig::default()).unwrap();
        let mut nf = part.declare("t");
        let m = nf
            .map::<u32, u32>("m", Scope::PerFlow, Access::ReadMostly)
            .unwrap();
        m.prefetch(&1); // empty: nothing to load
        for i in 0..1_000 {
            m.insert_nowait(i, i + 1);
        }
        for i in 0..2_000 {
            m.prefetch(&i);
        }
        assert_eq!(m.cached_len(), 1_000);
        assert_eq!(m.get(&7).unwrap(), Some(8));
        assert_eq!(m.get(&1_500).unwrap(), None);
        // While the map is in use (inside a callback) a prefetch does nothing.
        m.with(&7, |_| m.prefetch(&8)).unwrap();
    }

    #[test]
    fn extend_with_keeps_the_later_deadline() {
        use std::time::Duration;
        let store = LocalStore::new();
        let mut part = Partition::new(&store, StateConfig::default()).unwrap();
        let mut nf = part.declare("t");
        let m = nf
            .map::<u32, u32>("m", Scope::PerFlow, Access::ReadMostly)
            .unwrap();
        let s = Duration::from_secs(1);
        m.insert_nowait(1, 10);
        m.expire_after(&1, 10 * s, 100);
        let ns = |d: Duration| d.as_nanos() as u64;
        assert_eq!(m.deadline(&1), Some(100 + ns(10 * s)));
        // Earlier: unchanged.
        assert_eq!(m.extend_with(&1, 50, |v| (10 * s, *v)).unwrap(), Some(10));
        assert_eq!(m.deadline(&1), Some(100 + ns(10 * s)));
        // Later: moved, and the entry expires then, not at its first deadline.
        assert_eq!(m.extend_with(&1, 200, |_| (10 * s, ())).unwrap(), Some(()));
        assert_eq!(m.deadline(&1), Some(200 + ns(10 * s)));
        assert_eq!(m.expire(100 + ns(10 * s), |_, _| {}), 0);
        assert_eq!(m.expire(200 + ns(10 * s), |_, _| {}), 1);
        // No entry; an entry without a deadline keeps none.
        assert_eq!(m.extend_with(&1, 300, |_| (s, ())).unwrap(), None);
        m.insert_nowait(2, 20);
        assert_eq!(m.extend_with(&2, 300, |_| (s, ())).unwrap(), Some(()));
        assert_eq!(m.deadline(&2), None);
    }
}
