//! Store objects, the store operations and what every operation does to them: the one
//! definition of the state API's operations ([`Op`]), their replies ([`Reply`]) and their
//! semantics, shared by the state API and its drivers (`flowstate-state`, whose `local`
//! backend runs them in process), the store protocol (`flowstate-proto`, whose opcodes are
//! [`Op`]'s discriminants) and the store server (`flowstate-store`), which add keys, sharding,
//! limits, ownership and clock tags around them. The in-process store and the server both pass
//! the state API's conformance suite.
//!
//! Promises:
//! * Every store names an operation, its fields and its reply the same way: [`Op`], generic
//!   in its key and byte strings (owned, or borrowed from a frame without a copy), and
//!   [`Reply`], generic in the failure each store words. An operation's opcode
//!   ([`Op::code`]) never changes.
//! * An object is a value, a counter, a list, a set, a map or a counter-map ([`Kind`]). An
//!   object may have a time to live, and so may each field of a map.
//! * Expired objects and map fields are invisible to every operation from their deadline on
//!   (FlexState §VI-B "TIMERS"): a store calls [`Stored::prune`] before it runs an action, and
//!   that drops them.
//! * Overwrites and time to live are as in Redis: an action that replaces a whole value
//!   ([`Action::Set`], [`Action::SetCounter`], a successful [`Action::CompareAndSet`]) clears
//!   the object's time to live, and [`Action::MapSet`] clears its field's; updates in place
//!   ([`Action::Add`], [`Action::Push`], ...) keep it.
//! * A collection that an action empties is gone ([`Stored::run`] says so), and its key may
//!   then hold another kind.
//! * Costs: an action on one field, member or item is O(1) expected (hash tables, each with
//!   its own random seed, as keys come from packets and clients). Expiring k of a map's n
//!   fields costs O(k log n). Giving a field a time to live, or renewing it, allocates nothing
//!   beyond the amortised growth of a timer heap: a timer is the field's hash and deadline.
//! * A whole object read out ([`Object`]) lists set members and map fields sorted by their
//!   bytes.
//! * Lock leases ([`Leases`]) live beside the objects and neither see nor change them.

use core::fmt;
use hashbrown::HashTable;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::hash::BuildHasher;
use std::time::Duration;

mod leases;
mod op;
mod spare;
pub use leases::{Lease, Leases};
pub use op::{Op, OP_NAMES};
pub use spare::Spare;

/// The type of an object; part of its key. The discriminant is the store protocol's code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// One blob.
    Value = 0,
    /// A signed 64-bit counter.
    Counter = 1,
    /// A FIFO of blobs.
    List = 2,
    /// A set of blobs.
    Set = 3,
    /// Blob fields to blob values.
    Map = 4,
    /// Blob fields to counters.
    CounterMap = 5,
}

impl Kind {
    /// Every kind, by code.
    pub const ALL: [Kind; 6] = [
        Kind::Value,
        Kind::Counter,
        Kind::List,
        Kind::Set,
        Kind::Map,
        Kind::CounterMap,
    ];

    /// The kind with this code.
    pub fn from_code(c: u8) -> Option<Kind> {
        Kind::ALL.get(usize::from(c)).copied()
    }

    /// The type name (`Value`, `Counter`, ...), as in object keys.
    pub const fn name(self) -> &'static str {
        match self {
            Kind::Value => "Value",
            Kind::Counter => "Counter",
            Kind::List => "List",
            Kind::Set => "Set",
            Kind::Map => "Map",
            Kind::CounterMap => "CounterMap",
        }
    }
}

/// A whole object, read out: collections in a fixed order (list items first first, set
/// members and map fields sorted by their bytes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Object {
    /// A value.
    Value(Vec<u8>),
    /// A counter.
    Counter(i64),
    /// List items, first first.
    List(Vec<Vec<u8>>),
    /// Set members.
    Set(Vec<Vec<u8>>),
    /// Map fields and values.
    Map(Vec<(Vec<u8>, Vec<u8>)>),
    /// Counter-map fields and counts.
    CounterMap(Vec<(Vec<u8>, i64)>),
}

impl Object {
    /// Its kind.
    pub fn kind(&self) -> Kind {
        match self {
            Object::Value(_) => Kind::Value,
            Object::Counter(_) => Kind::Counter,
            Object::List(_) => Kind::List,
            Object::Set(_) => Kind::Set,
            Object::Map(_) => Kind::Map,
            Object::CounterMap(_) => Kind::CounterMap,
        }
    }
}

/// What an [`Op`] does to its object ([`Op::action`]), with the key left out (the store holds
/// it); the leases, which live beside the objects, have none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)] // fields are named as in the state API's operations
pub enum Action<'a> {
    Get,
    Set {
        value: &'a [u8],
    },
    Delete,
    Add {
        delta: i64,
    },
    GetCounter,
    SetCounter {
        value: i64,
    },
    Push {
        item: &'a [u8],
    },
    Pop,
    Insert {
        member: &'a [u8],
    },
    Remove {
        member: &'a [u8],
    },
    Contains {
        member: &'a [u8],
    },
    MapGet {
        field: &'a [u8],
    },
    MapSet {
        field: &'a [u8],
        value: &'a [u8],
    },
    /// On a map or a counter-map.
    MapDelete {
        field: &'a [u8],
    },
    MapAdd {
        field: &'a [u8],
        delta: i64,
    },
    MapGetCounter {
        field: &'a [u8],
    },
    CompareAndSet {
        expected: Option<&'a [u8]>,
        new: Option<&'a [u8]>,
    },
    /// The object's time to live (`field: None`) or a map field's.
    Expire {
        field: Option<&'a [u8]>,
        ttl: Duration,
    },
    Len {
        kind: Kind,
    },
    ReadAll {
        kind: Kind,
    },
}

/// What an action on a key without a live object does.
#[derive(Debug, PartialEq, Eq)]
pub enum Absent<'a> {
    /// Nothing is created; this is the answer.
    Reply(Outcome),
    /// An empty object of this kind is created and the action runs on it.
    Create(Kind),
    /// A value holding these bytes is created, and the answer is yes (a compare-and-set
    /// from nothing).
    CreateValue(&'a [u8]),
}

impl<'a> Action<'a> {
    /// What this action does where there is no live object.
    pub fn on_absent(&self) -> Absent<'a> {
        let reply = match *self {
            Action::Get | Action::Pop | Action::MapGet { .. } => Outcome::Value(None),
            Action::GetCounter | Action::MapGetCounter { .. } => Outcome::Int(0),
            Action::Delete
            | Action::Remove { .. }
            | Action::Contains { .. }
            | Action::MapDelete { .. }
            | Action::Expire { .. } => Outcome::Bool(false),
            Action::Len { kind } => match kind {
                Kind::Value | Kind::Counter => {
                    Outcome::Error(Fault::Refused(Refusal::NotACollection(kind)))
                }
                _ => Outcome::Len(0),
            },
            Action::ReadAll { .. } => Outcome::Object(None),
            Action::CompareAndSet { expected, new } => match (expected, new) {
                (Some(_), _) => Outcome::Bool(false),
                (None, None) => Outcome::Bool(true),
                (None, Some(n)) => return Absent::CreateValue(n),
            },
            Action::Set { .. } => return Absent::Create(Kind::Value),
            Action::Add { .. } | Action::SetCounter { .. } => return Absent::Create(Kind::Counter),
            Action::Push { .. } => return Absent::Create(Kind::List),
            Action::Insert { .. } => return Absent::Create(Kind::Set),
            Action::MapSet { .. } => return Absent::Create(Kind::Map),
            Action::MapAdd { .. } => return Absent::Create(Kind::CounterMap),
        };
        Absent::Reply(reply)
    }

    /// Whether the action only reads.
    pub fn is_read(&self) -> bool {
        matches!(
            self,
            Action::Get
                | Action::GetCounter
                | Action::Contains { .. }
                | Action::MapGet { .. }
                | Action::MapGetCounter { .. }
                | Action::Len { .. }
                | Action::ReadAll { .. }
        )
    }
}

/// The reply to one operation. `E` says why it failed: a [`Fault`] from [`Stored::run`] (an
/// [`Outcome`]), which each store words with its key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply<E> {
    /// Done, nothing to return.
    Done,
    /// A value, or `None` when absent.
    Value(Option<Vec<u8>>),
    /// A counter value.
    Int(i64),
    /// A yes/no answer.
    Bool(bool),
    /// A length.
    Len(u64),
    /// A whole object, or `None` when absent.
    Object(Option<Object>),
    /// This operation failed (e.g. the key holds another kind); nothing changed, and the
    /// others in its batch ran.
    Error(E),
}

impl<E> Reply<E> {
    /// Whether the operation took effect (or, for a read, answered).
    pub fn is_ok(&self) -> bool {
        !matches!(self, Reply::Error(_))
    }

    /// The same reply with its failure mapped by `f`.
    pub fn map_err<F>(self, f: impl FnOnce(E) -> F) -> Reply<F> {
        match self {
            Reply::Done => Reply::Done,
            Reply::Value(v) => Reply::Value(v),
            Reply::Int(n) => Reply::Int(n),
            Reply::Bool(b) => Reply::Bool(b),
            Reply::Len(n) => Reply::Len(n),
            Reply::Object(o) => Reply::Object(o),
            Reply::Error(e) => Reply::Error(f(e)),
        }
    }
}

/// The answer to an action on an object, before a store words its failure with the key.
pub type Outcome = Reply<Fault>;

/// Why an action failed; nothing changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The key holds an object of another kind.
    WrongKind {
        /// The kind the action works on.
        wanted: Kind,
        /// The kind the key holds.
        found: Kind,
    },
    /// Refused.
    Refused(Refusal),
}

/// Why an action was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// A counter would pass the range of an `i64`.
    Overflow,
    /// A length was asked of a value or a counter.
    NotACollection(Kind),
}

impl Refusal {
    /// The refusal in words, about the object under `key`.
    pub fn message(&self, key: impl fmt::Display) -> String {
        match self {
            Refusal::Overflow => format!("{key}: counter overflow"),
            Refusal::NotACollection(kind) => {
                format!("{key}: Len needs a collection kind, not {}", kind.name())
            }
        }
    }
}

/// An object's data.
pub enum Obj {
    /// A value.
    Value(Vec<u8>),
    /// A counter.
    Counter(i64),
    /// A list.
    List(VecDeque<Vec<u8>>),
    /// A set (boxed, as the other collections: an empty object stays small).
    Set(Box<foldhash::HashSet<Vec<u8>>>),
    /// A map.
    Map(Box<FieldMap>),
    /// A counter-map.
    CounterMap(Box<foldhash::HashMap<Vec<u8>, i64>>),
}

impl Obj {
    /// Its kind.
    pub fn kind(&self) -> Kind {
        match self {
            Obj::Value(_) => Kind::Value,
            Obj::Counter(_) => Kind::Counter,
            Obj::List(_) => Kind::List,
            Obj::Set(_) => Kind::Set,
            Obj::Map(_) => Kind::Map,
            Obj::CounterMap(_) => Kind::CounterMap,
        }
    }

    /// Items, members or fields; `None` for values and counters.
    pub fn size(&self) -> Option<usize> {
        match self {
            Obj::Value(_) | Obj::Counter(_) => None,
            Obj::List(l) => Some(l.len()),
            Obj::Set(s) => Some(s.len()),
            Obj::Map(m) => Some(m.len()),
            Obj::CounterMap(m) => Some(m.len()),
        }
    }

    /// The whole object, read out.
    pub fn to_object(&self) -> Object {
        fn sorted<T: Ord>(mut v: Vec<T>) -> Vec<T> {
            v.sort_unstable();
            v
        }
        match self {
            Obj::Value(v) => Object::Value(v.clone()),
            Obj::Counter(c) => Object::Counter(*c),
            Obj::List(l) => Object::List(l.iter().cloned().collect()),
            Obj::Set(s) => Object::Set(sorted(s.iter().cloned().collect())),
            Obj::Map(m) => Object::Map(sorted(
                m.iter().map(|(f, v)| (f.to_vec(), v.to_vec())).collect(),
            )),
            Obj::CounterMap(m) => {
                Object::CounterMap(sorted(m.iter().map(|(f, c)| (f.clone(), *c)).collect()))
            }
        }
    }

    /// The object an [`Object`] describes (map fields without a time to live).
    pub fn from_object(o: Object) -> Obj {
        match o {
            Object::Value(v) => Obj::Value(v),
            Object::Counter(c) => Obj::Counter(c),
            Object::List(v) => Obj::List(v.into()),
            Object::Set(v) => Obj::Set(Box::new(v.into_iter().collect())),
            Object::Map(v) => {
                let mut m = FieldMap::default();
                for (f, v) in v {
                    m.insert(f, v);
                }
                Obj::Map(Box::new(m))
            }
            Object::CounterMap(v) => Obj::CounterMap(Box::new(v.into_iter().collect())),
        }
    }
}

/// A deadline in nanoseconds on the store's clock; [`NEVER`] for none.
type Deadline = u64;
const NEVER: Deadline = u64::MAX;

fn deadline(at: Duration) -> Deadline {
    u64::try_from(at.as_nanos())
        .unwrap_or(NEVER - 1)
        .min(NEVER - 1)
}

fn instant(d: Deadline) -> Duration {
    Duration::from_nanos(d)
}

/// The fields of a map, each with its value and an optional time to live.
pub struct FieldMap {
    fields: HashTable<Field>,
    hasher: foldhash::fast::RandomState,
    /// Timers, earliest first: a deadline and the hash of the field it was set for. A timer
    /// is stale once no field of that hash has that deadline (renewed, overwritten, deleted):
    /// it is skipped when it comes up, and the heap is rebuilt when stale ones dominate.
    timers: BinaryHeap<Reverse<(Deadline, u64)>>,
    /// Fields with a deadline.
    timed: usize,
}

struct Field {
    name: Vec<u8>,
    value: Vec<u8>,
    deadline: Deadline,
}

impl Default for FieldMap {
    fn default() -> Self {
        FieldMap {
            fields: HashTable::new(),
            hasher: foldhash::fast::RandomState::default(),
            timers: BinaryHeap::new(),
            timed: 0,
        }
    }
}

impl FieldMap {
    /// Fields held (expired ones until [`FieldMap::prune`] drops them).
    pub fn len(&self) -> usize {
        self.fields.len()
    }

    /// Whether there is no field.
    pub fn is_empty(&self) -> bool {
        self.fields.is_empty()
    }

    fn hash(&self, name: &[u8]) -> u64 {
        self.hasher.hash_one(name)
    }

    /// The value of `name`.
    pub fn get(&self, name: &[u8]) -> Option<&[u8]> {
        self.fields
            .find(self.hash(name), |f| f.name == name)
            .map(|f| f.value.as_slice())
    }

    /// Sets `name` to `value` without a time to live; the value's buffer is reused when the
    /// field exists, `spare` gives new buffers.
    pub fn set(&mut self, name: &[u8], value: &[u8], spare: &mut Spare) {
        let h = self.hash(name);
        match self.fields.find_mut(h, |f| f.name == name) {
            Some(f) => {
                if f.deadline != NEVER {
                    f.deadline = NEVER;
                    self.timed -= 1;
                }
                f.value.clear();
                f.value.extend_from_slice(value);
            }
            None => self.insert_hashed(h, spare.copy(name), spare.copy(value)),
        }
    }

    /// Adds a field known to be absent (as when building a map from an [`Object`]).
    fn insert(&mut self, name: Vec<u8>, value: Vec<u8>) {
        let h = self.hash(&name);
        self.insert_hashed(h, name, value);
    }

    fn insert_hashed(&mut self, h: u64, name: Vec<u8>, value: Vec<u8>) {
        let hasher = &self.hasher;
        self.fields.insert_unique(
            h,
            Field {
                name,
                value,
                deadline: NEVER,
            },
            |f| hasher.hash_one(f.name.as_slice()),
        );
    }

    /// Removes `name`; whether it was there. Its buffers go to `spare`.
    pub fn delete(&mut self, name: &[u8], spare: &mut Spare) -> bool {
        let h = self.hash(name);
        match self.fields.find_entry(h, |f| f.name == name) {
            Ok(e) => {
                let (f, _) = e.remove();
                if f.deadline != NEVER {
                    self.timed -= 1;
                }
                spare.put(f.name);
                spare.put(f.value);
                true
            }
            Err(_) => false,
        }
    }

    /// Makes `name` expire at `at`; whether it exists.
    pub fn expire(&mut self, name: &[u8], at: Duration) -> bool {
        let h = self.hash(name);
        let Some(f) = self.fields.find_mut(h, |f| f.name == name) else {
            return false;
        };
        if f.deadline == NEVER {
            self.timed += 1;
        }
        let at = deadline(at);
        f.deadline = at;
        self.timers.push(Reverse((at, h)));
        if self.timers.len() > 2 * self.timed + 64 {
            // Mostly stale timers (renewed fields): one per timed field again.
            #[cfg(test)]
            tests::count_steps(self.fields.len() as u64);
            self.timers = self
                .fields
                .iter()
                .filter(|f| f.deadline != NEVER)
                .map(|f| Reverse((f.deadline, self.hasher.hash_one(f.name.as_slice()))))
                .collect();
        }
        true
    }

    /// Drops the fields whose time is up at `now`, handing each one's name to `expired`;
    /// whether any was dropped.
    pub fn prune(&mut self, now: Duration, mut expired: impl FnMut(Vec<u8>)) -> bool {
        let now = deadline(now);
        let mut any = false;
        while let Some(&Reverse((at, h))) = self.timers.peek() {
            if at > now {
                break;
            }
            self.timers.pop();
            #[cfg(test)]
            tests::count_steps(1);
            while let Ok(e) = self.fields.find_entry(h, |f| f.deadline <= now) {
                let (f, _) = e.remove();
                self.timed -= 1;
                any = true;
                expired(f.name);
            }
        }
        any
    }

    /// Whether a field may have expired by `now` (cheap; may say yes when none has).
    pub fn due(&self, now: Duration) -> bool {
        self.timers
            .peek()
            .is_some_and(|Reverse((at, _))| *at <= deadline(now))
    }

    /// The earliest time a field may expire (never later than the real one).
    pub fn next_deadline(&self) -> Option<Duration> {
        self.timers.peek().map(|Reverse((at, _))| instant(*at))
    }

    /// Whether some field is still alive at `now`, without dropping any.
    pub fn any_alive(&self, now: Duration) -> bool {
        if !self.due(now) {
            return !self.is_empty();
        }
        let now = deadline(now);
        self.fields.iter().any(|f| f.deadline > now)
    }

    /// Every field and value, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        self.fields
            .iter()
            .map(|f| (f.name.as_slice(), f.value.as_slice()))
    }

    /// The fields with a time to live, and when each expires.
    pub fn deadlines(&self) -> impl Iterator<Item = (&[u8], Duration)> {
        self.fields
            .iter()
            .filter(|f| f.deadline != NEVER)
            .map(|f| (f.name.as_slice(), instant(f.deadline)))
    }

    /// Timers held, stale ones included (for tests of the bound).
    pub fn timers(&self) -> usize {
        self.timers.len()
    }
}

/// An object with its time to live: what a store keeps under a key.
pub struct Stored {
    /// The data.
    pub obj: Obj,
    /// End of the object's time to live.
    pub deadline: Option<Duration>,
}

impl Stored {
    /// An empty object of `kind` without a time to live (a list reuses a spare one).
    pub fn new(kind: Kind, spare: &mut Spare) -> Stored {
        let obj = match kind {
            Kind::Value => Obj::Value(Vec::new()),
            Kind::Counter => Obj::Counter(0),
            Kind::List => Obj::List(spare.list()),
            Kind::Set => Obj::Set(Box::default()),
            Kind::Map => Obj::Map(Box::default()),
            Kind::CounterMap => Obj::CounterMap(Box::default()),
        };
        Stored {
            obj,
            deadline: None,
        }
    }

    /// A value created by a compare-and-set from nothing.
    pub fn value(v: &[u8], spare: &mut Spare) -> Stored {
        Stored {
            obj: Obj::Value(spare.copy(v)),
            deadline: None,
        }
    }

    /// Whether [`Stored::prune`] has something to do at `now` (cheap; may say yes when a
    /// map's only due timers are stale).
    pub fn due(&self, now: Duration) -> bool {
        self.deadline.is_some_and(|d| d <= now) || matches!(&self.obj, Obj::Map(m) if m.due(now))
    }

    /// Drops map fields whose time is up, handing `expired` `None` for the whole object or
    /// each field's name; whether the whole object is now dead (its own time is up, or it was
    /// a map whose every field expired).
    pub fn prune(&mut self, now: Duration, mut expired: impl FnMut(Option<Vec<u8>>)) -> bool {
        if self.deadline.is_some_and(|d| d <= now) {
            expired(None);
            return true;
        }
        match &mut self.obj {
            Obj::Map(m) => m.prune(now, |f| expired(Some(f))) && m.is_empty(),
            _ => false,
        }
    }

    /// Whether the object is visible at `now`, without changing it.
    pub fn alive(&self, now: Duration) -> bool {
        if self.deadline.is_some_and(|d| d <= now) {
            return false;
        }
        match &self.obj {
            Obj::Map(m) => m.any_alive(now),
            _ => true,
        }
    }

    /// The earliest time the object or one of its fields may expire (never later than the
    /// real one).
    pub fn next_deadline(&self) -> Option<Duration> {
        let field = match &self.obj {
            Obj::Map(m) => m.next_deadline(),
            _ => None,
        };
        match (self.deadline, field) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Runs `action` at `now` on this live (pruned) object: the answer, and whether the object
    /// is now gone (deleted, or a collection emptied), for the store to remove.
    pub fn run(&mut self, action: &Action, now: Duration, spare: &mut Spare) -> (Outcome, bool) {
        let wrong = |wanted: Kind, found: &Obj| {
            Outcome::Error(Fault::WrongKind {
                wanted,
                found: found.kind(),
            })
        };
        let add = |c: &mut i64, delta: i64| match c.checked_add(delta) {
            Some(n) => {
                *c = n;
                Outcome::Int(n)
            }
            None => Outcome::Error(Fault::Refused(Refusal::Overflow)),
        };
        let outcome = match (*action, &mut self.obj) {
            (Action::Delete, _) => return (Outcome::Bool(true), true),
            (Action::Get, Obj::Value(v)) => Outcome::Value(Some(spare.copy(v))),
            (Action::Set { value }, Obj::Value(v)) => {
                v.clear();
                v.extend_from_slice(value);
                self.deadline = None;
                Outcome::Done
            }
            (Action::Add { delta }, Obj::Counter(c)) => add(c, delta),
            (Action::GetCounter, Obj::Counter(c)) => Outcome::Int(*c),
            (Action::SetCounter { value }, Obj::Counter(c)) => {
                *c = value;
                self.deadline = None;
                Outcome::Done
            }
            (Action::Push { item }, Obj::List(l)) => {
                l.push_back(spare.copy(item));
                Outcome::Len(len(l.len()))
            }
            (Action::Pop, Obj::List(l)) => {
                let item = l.pop_front();
                return (Outcome::Value(item), l.is_empty());
            }
            (Action::Insert { member }, Obj::Set(s)) => {
                Outcome::Bool(!s.contains(member) && s.insert(spare.copy(member)))
            }
            (Action::Remove { member }, Obj::Set(s)) => {
                return (Outcome::Bool(s.remove(member)), s.is_empty())
            }
            (Action::Contains { member }, Obj::Set(s)) => Outcome::Bool(s.contains(member)),
            (Action::MapGet { field }, Obj::Map(m)) => {
                Outcome::Value(m.get(field).map(|v| spare.copy(v)))
            }
            (Action::MapSet { field, value }, Obj::Map(m)) => {
                m.set(field, value, spare);
                Outcome::Done
            }
            (Action::MapDelete { field }, Obj::Map(m)) => {
                let had = m.delete(field, spare);
                return (Outcome::Bool(had), m.is_empty());
            }
            (Action::MapDelete { field }, Obj::CounterMap(m)) => {
                return (Outcome::Bool(m.remove(field).is_some()), m.is_empty())
            }
            (Action::MapAdd { field, delta }, Obj::CounterMap(m)) => match m.get_mut(field) {
                Some(c) => add(c, delta),
                None => {
                    m.insert(spare.copy(field), delta);
                    Outcome::Int(delta)
                }
            },
            (Action::MapGetCounter { field }, Obj::CounterMap(m)) => {
                Outcome::Int(m.get(field).copied().unwrap_or(0))
            }
            (Action::CompareAndSet { expected, new }, Obj::Value(v)) => {
                if Some(v.as_slice()) != expected {
                    Outcome::Bool(false)
                } else if let Some(n) = new {
                    v.clear();
                    v.extend_from_slice(n);
                    self.deadline = None;
                    Outcome::Bool(true)
                } else {
                    return (Outcome::Bool(true), true);
                }
            }
            (Action::Expire { field: None, ttl }, _) => {
                self.deadline = Some(now.saturating_add(ttl));
                Outcome::Bool(true)
            }
            (
                Action::Expire {
                    field: Some(field),
                    ttl,
                },
                Obj::Map(m),
            ) => Outcome::Bool(m.expire(field, now.saturating_add(ttl))),
            (Action::Len { kind }, o) => match kind {
                Kind::Value | Kind::Counter => {
                    Outcome::Error(Fault::Refused(Refusal::NotACollection(kind)))
                }
                _ if o.kind() == kind => Outcome::Len(len(o.size().unwrap_or(0))),
                _ => wrong(kind, o),
            },
            (Action::ReadAll { kind }, o) if o.kind() == kind => {
                Outcome::Object(Some(o.to_object()))
            }
            (Action::ReadAll { kind }, o) => wrong(kind, o),
            (a, o) => wrong(a.kind(), o),
        };
        (outcome, false)
    }
}

impl Action<'_> {
    /// The kind of object the action works on (a map for an expiry of a field, a map for
    /// `MapDelete`, which also works on counter-maps; a value for an object's expiry, which
    /// works on every kind).
    fn kind(&self) -> Kind {
        match self {
            Action::Get
            | Action::Set { .. }
            | Action::CompareAndSet { .. }
            | Action::Delete
            | Action::Expire { field: None, .. } => Kind::Value,
            Action::Add { .. } | Action::GetCounter | Action::SetCounter { .. } => Kind::Counter,
            Action::Push { .. } | Action::Pop => Kind::List,
            Action::Insert { .. } | Action::Remove { .. } | Action::Contains { .. } => Kind::Set,
            Action::MapGet { .. }
            | Action::MapSet { .. }
            | Action::MapDelete { .. }
            | Action::Expire { field: Some(_), .. } => Kind::Map,
            Action::MapAdd { .. } | Action::MapGetCounter { .. } => Kind::CounterMap,
            Action::Len { kind } | Action::ReadAll { kind } => *kind,
        }
    }
}

fn len(n: usize) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests;
