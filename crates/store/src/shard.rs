//! One shard: the objects whose key hashes to it, owned by one thread (CHC §4.3 "datastore
//! threads": no locks on object data). What every operation does to an object is
//! [`flowstate_objects`], as in the state API's in-process store (`flowstate_state::local`),
//! so the two pass the same conformance suite; on top come ownership (CHC §5.1), clock tags (CHC §5.3), idempotent batches,
//! subscriptions (CHC §4.3 callbacks) and expiry notifications (StatelessNF §4.1).

use crate::clients::Clients;
pub(crate) use flowstate_objects::Spare;
use flowstate_objects::{Absent, Action, Fault, Leases, Obj, Outcome, Stored};
use flowstate_proto::{Command, Failure, Kind, Object, Op, Reply, Request};
use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

/// How many clock tags an object remembers per instance (CHC §5.3: duplicates come from
/// straggler clones and replays, which trail the original by a bounded number of packets).
pub(crate) const TAG_WINDOW: usize = 4096;

pub(crate) struct Entry {
    /// The object and its time to live ([`flowstate_objects`]: what every operation does).
    pub(crate) object: Stored,
    /// Where this entry sits in its shard's deadline index.
    pub(crate) indexed: Option<Duration>,
    /// The instance that owns this (per-flow) object, if claimed.
    pub(crate) owner: Option<u32>,
    /// Clock tags of updates applied, per instance. Boxed: most objects have none, and an
    /// empty `Option<Box<_>>` is one word where a map is six.
    #[allow(clippy::box_collection)]
    pub(crate) tags: Option<Box<HashMap<u32, BTreeSet<u64>>>>,
}

// An entry sits in its shard's table beside its key: its size is the table's memory per
// object (a million objects take two million buckets) and what every lookup reads.
const _: () = assert!(std::mem::size_of::<Entry>() <= 80);

/// Where a subscriber's pushes go.
pub(crate) struct Sub {
    pub(crate) conn: u64,
    pub(crate) instance: u32,
    /// The shard thread that owns the connection.
    pub(crate) shard: usize,
}

#[derive(Default)]
pub(crate) struct Subs {
    pub(crate) list: Vec<Sub>,
}

impl Entry {
    pub(crate) fn new(object: Stored) -> Entry {
        Entry {
            object,
            indexed: None,
            owner: None,
            tags: None,
        }
    }

    /// Drops map fields whose time is up (noting them in `expired`); whether the whole entry
    /// is now dead.
    fn prune(&mut self, key: &[u8], now: Duration, expired: &mut Vec<Expired>) -> bool {
        self.object
            .prune(now, |field| expired.push((key.to_vec(), field)))
    }

    fn seen(&self, instance: u32, clock: u64) -> bool {
        self.tags
            .as_ref()
            .and_then(|t| t.get(&instance))
            .is_some_and(|s| s.contains(&clock))
    }

    fn tag(&mut self, instance: u32, clock: u64) {
        let set = self
            .tags
            .get_or_insert_with(Default::default)
            .entry(instance)
            .or_default();
        set.insert(clock);
        if set.len() > TAG_WINDOW {
            set.pop_first();
        }
    }
}

/// A key (and map field) whose time to live ran out.
pub(crate) type Expired = (Vec<u8>, Option<Vec<u8>>);

/// The objects of one shard.
#[derive(Default)]
pub(crate) struct Objects {
    /// (foldhash: a fast hash with a random seed per map; keys are hashed on every
    /// operation.)
    pub(crate) objects: foldhash::HashMap<Vec<u8>, Entry>,
    pub(crate) locks: Leases<Vec<u8>>,
    /// Objects by their earliest deadline (object or field): what the expiry sweep visits,
    /// from the front, touching only what is due.
    pub(crate) index: BTreeSet<(Duration, Vec<u8>)>,
    pub(crate) clients: Clients,
    /// Most objects this shard holds; `None`: no limit.
    pub(crate) max_objects: Option<usize>,
    /// Most items (list items, set members, map fields) of one object; `None`: no limit.
    pub(crate) max_items: Option<usize>,
    /// Expiries found while running operations, to notify after the batch.
    pub(crate) expired: Vec<Expired>,
    /// Byte buffers to reuse for reply values and list items.
    pub(crate) spare: Spare,
}

fn text(key: &[u8]) -> String {
    String::from_utf8_lossy(key).into_owned()
}

/// The protocol's reply for what an operation did to the object under `key`.
fn reply(key: &[u8], outcome: Outcome) -> Reply {
    outcome.map_err(|fault| match fault {
        Fault::WrongKind { wanted, found } => Failure::WrongKind {
            key: key.to_vec(),
            wanted,
            found,
        },
        Fault::Refused(r) => Failure::Refused(r.message(text(key))),
    })
}

/// An operation would create an object in a full shard.
struct Full;

impl Objects {
    pub(crate) fn len(&self) -> usize {
        self.objects.len()
    }

    /// The live entry under `key`, dropping it (and expired map fields) if its time is up.
    fn live(&mut self, key: &[u8], now: Duration) -> Option<&mut Entry> {
        let dead = self
            .objects
            .get_mut(key)?
            .prune(key, now, &mut self.expired);
        if dead {
            self.remove(key);
            return None;
        }
        self.objects.get_mut(key)
    }

    fn remove(&mut self, key: &[u8]) -> bool {
        match self.objects.remove_entry(key) {
            Some((k, e)) => {
                if let Some(d) = e.indexed {
                    self.index.remove(&(d, key.to_vec()));
                }
                self.spare.put(k);
                self.spare.retire(e.object.obj);
                true
            }
            None => false,
        }
    }

    /// Puts the object under `key` where its earliest deadline says in the index.
    pub(crate) fn reindex(&mut self, key: &[u8]) {
        if let Some(e) = self.objects.get_mut(key) {
            reindex_entry(&mut self.index, key, e);
        }
    }

    /// Drops everything whose time is up, noting what expired. Visits only the objects with
    /// something due.
    pub(crate) fn sweep(&mut self, now: Duration) {
        while self.index.first().is_some_and(|(d, _)| *d <= now) {
            let Some((_, key)) = self.index.pop_first() else {
                break;
            };
            if let Some(e) = self.objects.get_mut(&key) {
                e.indexed = None;
            }
            let _ = self.live(&key, now);
            self.reindex(&key);
        }
        self.locks.purge(now);
    }

    /// Keys of the live objects of `nf` of `kind` and `id`: `nf@Kind@id` and
    /// `nf@<instance>@<core>@Kind@id` (the state API's key layout).
    pub(crate) fn partitions(
        &self,
        nf: &[u8],
        kind: Kind,
        id: &[u8],
        now: Duration,
    ) -> Vec<Vec<u8>> {
        self.objects
            .iter()
            .filter(|(k, e)| key_matches(k, nf, kind, id) && e.object.alive(now))
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// [`Objects::apply_ref`] of a request owning or borrowing its byte strings.
    #[cfg(test)]
    pub(crate) fn apply<B: AsRef<[u8]>>(
        &mut self,
        req: &Request<B>,
        now: Duration,
    ) -> (Reply, bool) {
        self.apply_ref(&req.borrowed(), now)
    }

    /// Runs one tagged operation at `now`: the reply, and whether the operation may have
    /// changed the object (for subscribers). The common case, an object that is there with
    /// nothing of it due, takes one lookup of its key.
    pub(crate) fn apply_ref(&mut self, req: &Request<&[u8]>, now: Duration) -> (Reply, bool) {
        let op = &req.op;
        if let Command::Op(lease @ (Op::Lock { .. } | Op::Unlock { .. })) = op {
            // Leases live beside the objects and change none.
            return (self.lease(lease, now), false);
        }
        let key = op.key();
        let mut dead = false;
        let max_items = self.max_items;
        if let Some(e) = self.objects.get_mut(key) {
            dead = e.object.due(now) && e.prune(key, now, &mut self.expired);
            if !dead && max_items.is_some_and(|m| adds_past(&e.object.obj, op, m)) {
                let msg = format!(
                    "{}: holds {} items, the most an object may (max_items)",
                    text(key),
                    max_items.unwrap_or(0)
                );
                return (Reply::Error(Failure::Refused(msg)), false);
            }
            if !dead {
                let (reply, changed, gone) = on_live(e, req, now, &mut self.spare, &mut self.index);
                if gone {
                    self.remove(key);
                }
                return (reply, changed);
            }
        }
        if dead {
            self.remove(key);
        }
        self.absent(req, now)
    }

    /// Runs `req` on a key that holds no live object: a read or removal answers at once, an
    /// update creates the object (unless the shard is full) and runs on it.
    fn absent(&mut self, req: &Request<&[u8]>, now: Duration) -> (Reply, bool) {
        let op = &req.op;
        let key = op.key();
        let outcome = match op {
            Command::Claim { kind, .. } => return self.create_and_run(req, *kind, now),
            Command::Handover { .. } | Command::Fence { .. } => Outcome::Bool(false),
            Command::Op(lease @ (Op::Lock { .. } | Op::Unlock { .. })) => {
                return (self.lease(lease, now), false)
            }
            Command::Op(o) => match o.action().map(|a| a.on_absent()) {
                Some(Absent::Reply(outcome)) => outcome,
                Some(Absent::Create(kind)) => return self.create_and_run(req, kind, now),
                Some(Absent::CreateValue(v)) => {
                    let value = Stored::value(v, &mut self.spare);
                    match self.create(key, Kind::Value, now) {
                        Ok(e) => {
                            e.object = value;
                            tag_update(e, req);
                            Outcome::Bool(true)
                        }
                        Err(Full) => return (self.full(key), false),
                    }
                }
                None => return (not_an_object_op(key), false),
            },
        };
        let changed = !op.is_read() && outcome.is_ok();
        (reply(key, outcome), changed)
    }

    /// Creates an empty object of `kind` under `req`'s key and runs `req` on it.
    fn create_and_run(&mut self, req: &Request<&[u8]>, kind: Kind, now: Duration) -> (Reply, bool) {
        let key = req.op.key();
        if self.create(key, kind, now).is_err() {
            return (self.full(key), false);
        }
        let Objects {
            objects,
            spare,
            index,
            ..
        } = self;
        let Some(e) = objects.get_mut(key) else {
            return (self.full(key), false);
        };
        let (reply, changed, gone) = on_live(e, req, now, spare, index);
        if gone {
            self.remove(key);
        }
        (reply, changed)
    }

    /// Makes an empty object of `kind` under `key` (known to hold no live object), sweeping
    /// expired objects first if the shard is full.
    fn create(&mut self, key: &[u8], kind: Kind, now: Duration) -> Result<&mut Entry, Full> {
        if self.max_objects.is_some_and(|m| self.objects.len() >= m) {
            self.sweep(now);
            if self.max_objects.is_some_and(|m| self.objects.len() >= m) {
                return Err(Full);
            }
        }
        let object = Stored::new(kind, &mut self.spare);
        Ok(self
            .objects
            .entry(self.spare.copy(key))
            .or_insert_with(|| Entry::new(object)))
    }

    fn full(&self, key: &[u8]) -> Reply {
        Reply::Error(Failure::Refused(format!(
            "{}: store full ({} objects in this shard)",
            text(key),
            self.max_objects.unwrap_or(0)
        )))
    }

    /// Runs [`Op::Lock`] or [`Op::Unlock`] (leases, beside the objects).
    fn lease(&mut self, op: &Op<&[u8]>, now: Duration) -> Reply {
        let key: &[u8] = op.key();
        match *op {
            Op::Lock { owner, lease, .. } => {
                Reply::Bool(self.locks.lock(key, || key.to_vec(), owner, lease, now))
            }
            Op::Unlock { owner, .. } => Reply::Bool(self.locks.unlock(key, owner, now)),
            _ => Reply::Error(Failure::Refused(format!(
                "{}: not a lease operation",
                text(key)
            ))),
        }
    }

    /// The live object under `key`, for subscribers.
    pub(crate) fn current(&mut self, key: &[u8], now: Duration) -> Option<Object> {
        self.live(key, now).map(|e| e.object.obj.to_object())
    }
}

fn not_an_object_op(key: &[u8]) -> Reply {
    Reply::Error(Failure::Refused(format!(
        "{}: not an object operation",
        text(key)
    )))
}

/// Records the clock tag of an update applied to `e` (CHC §5.3).
fn tag_update(e: &mut Entry, req: &Request<&[u8]>) {
    if let (Some(i), Some(c)) = (req.instance, req.clock) {
        e.tag(i, c);
    }
}

/// Runs `req` on the live entry `e` under its key: the owner check (CHC §5.1) and the clock
/// check (CHC §5.3) of an update, the operation, the update's clock tag and the entry's
/// place in the deadline `index`. Returns the reply, whether the object may have changed,
/// and whether the entry is now to be removed (deleted or emptied).
/// Whether `op` adds an item to `obj`, which holds `max` or more already.
fn adds_past(obj: &Obj, op: &Command<&[u8]>, max: usize) -> bool {
    match (obj, op) {
        (Obj::List(l), Command::Op(Op::Push { .. })) => l.len() >= max,
        (Obj::Set(s), Command::Op(Op::Insert { member, .. })) => {
            s.len() >= max && !s.contains(*member)
        }
        (Obj::Map(m), Command::Op(Op::MapSet { field, .. })) => {
            m.len() >= max && m.get(field).is_none()
        }
        (Obj::CounterMap(m), Command::Op(Op::MapAdd { field, .. })) => {
            m.len() >= max && !m.contains_key(*field)
        }
        _ => false,
    }
}

fn on_live(
    e: &mut Entry,
    req: &Request<&[u8]>,
    now: Duration,
    spare: &mut Spare,
    index: &mut BTreeSet<(Duration, Vec<u8>)>,
) -> (Reply, bool, bool) {
    let op = &req.op;
    let key = op.key();
    let writes = !op.is_read();
    if writes && !matches!(op, Command::Claim { .. } | Command::Handover { .. }) {
        if let Some(owner) = e.owner {
            if req.instance != Some(owner) {
                let by = req
                    .instance
                    .map_or_else(|| "an untagged client".into(), |i| i.to_string());
                let msg = format!("{}: owned by instance {owner}, not {by}", text(key));
                return (Reply::Error(Failure::Refused(msg)), false, false);
            }
        }
        if let (Some(i), Some(c)) = (req.instance, req.clock) {
            if e.seen(i, c) {
                return (Reply::Error(Failure::Duplicate), false, false);
            }
        }
    }
    let (reply, gone) = run_on(e, op, now, spare);
    let changed = writes && reply.is_ok();
    if gone {
        return (reply, changed, true);
    }
    if changed {
        tag_update(e, req);
    }
    // Only `Expire` sets a deadline, so with an empty index (no entry indexed) any other
    // operation leaves nothing to index.
    if matches!(op, Command::Op(Op::Expire { .. })) || !index.is_empty() {
        reindex_entry(index, key, e);
    }
    (reply, changed, false)
}

/// Puts `e` (under `key`) where its earliest deadline says in `index`.
fn reindex_entry(index: &mut BTreeSet<(Duration, Vec<u8>)>, key: &[u8], e: &mut Entry) {
    let next = e.object.next_deadline();
    if next == e.indexed {
        return;
    }
    if let Some(old) = e.indexed {
        index.remove(&(old, key.to_vec()));
    }
    if let Some(n) = next {
        index.insert((n, key.to_vec()));
    }
    e.indexed = next;
}

/// Runs `op` on the object of the live entry `e`: its reply, and whether the entry is now to
/// be removed (deleted, or a collection emptied). Ownership is the server's; every other
/// operation is [`Stored::run`].
fn run_on(e: &mut Entry, op: &Command<&[u8]>, now: Duration, spare: &mut Spare) -> (Reply, bool) {
    let key = op.key();
    let outcome = match *op {
        Command::Claim { kind, instance, .. } => {
            let found = e.object.obj.kind();
            if found != kind {
                Outcome::Error(Fault::WrongKind {
                    wanted: kind,
                    found,
                })
            } else if e.owner.is_none_or(|o| o == instance) {
                e.owner = Some(instance);
                Outcome::Bool(true)
            } else {
                Outcome::Bool(false)
            }
        }
        Command::Handover { from, to, .. } => {
            let owned = e.owner == Some(from);
            if owned {
                e.owner = Some(to);
            }
            Outcome::Bool(owned)
        }
        Command::Fence { value, .. } => {
            let (now_holds, _) = e.object.run(&Action::Get, now, spare);
            match now_holds {
                Outcome::Value(Some(v)) => {
                    let holds = v == value;
                    spare.put(v);
                    Outcome::Bool(holds)
                }
                _ => Outcome::Bool(false),
            }
        }
        Command::Op(o) => match o.action() {
            Some(action) => {
                let (outcome, gone) = e.object.run(&action, now, spare);
                return (reply(key, outcome), gone);
            }
            None => return (not_an_object_op(key), false),
        },
    };
    (reply(key, outcome), false)
}

/// Takes back the value buffer of a reply that was sent.
pub(crate) fn reclaim(spare: &mut Spare, reply: Reply) {
    if let Reply::Value(Some(v)) = reply {
        spare.put(v);
    }
}

/// Whether `key` is `nf@Kind@id` or `nf@<u32>@<u32>@Kind@id`.
fn key_matches(key: &[u8], nf: &[u8], kind: Kind, id: &[u8]) -> bool {
    let Some(rest) = key.strip_prefix(nf).and_then(|r| r.strip_prefix(b"@")) else {
        return false;
    };
    let tail = |r: &[u8]| {
        r.strip_prefix(kind.name().as_bytes())
            .and_then(|r| r.strip_prefix(b"@"))
            .is_some_and(|r| r == id)
    };
    // Partitioned: instance@core@Kind@id, instance and core decimal u32s. This is tried first,
    // as the state API's key parser does.
    let mut parts = rest.splitn(3, |b| *b == b'@');
    if let (Some(i), Some(c), Some(r)) = (parts.next(), parts.next(), parts.next()) {
        let num = |s: &[u8]| {
            std::str::from_utf8(s)
                .ok()
                .and_then(|s| s.parse::<u32>().ok())
                .is_some()
        };
        if num(i) && num(c) {
            return tail(r);
        }
    }
    tail(rest)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partition_keys_match_the_state_api_layout() {
        assert!(key_matches(
            b"nat@1@2@Counter@flows",
            b"nat",
            Kind::Counter,
            b"flows"
        ));
        assert!(key_matches(
            b"nat@Counter@flows",
            b"nat",
            Kind::Counter,
            b"flows"
        ));
        assert!(key_matches(b"nat@Set@a@b", b"nat", Kind::Set, b"a@b"));
        assert!(!key_matches(b"nat@Set@a@b", b"nat", Kind::Set, b"a"));
        assert!(!key_matches(
            b"nat@1@2@Map@flows",
            b"nat",
            Kind::Counter,
            b"flows"
        ));
        assert!(!key_matches(
            b"natx@Counter@flows",
            b"nat",
            Kind::Counter,
            b"flows"
        ));
    }

    fn r(op: impl Into<Command>) -> Request {
        Request::from(op.into())
    }

    #[test]
    fn a_list_popped_empty_is_gone_and_its_buffers_serve_the_next_one() {
        let mut o = Objects::default();
        let now = Duration::from_secs(1);
        let key = b"nat@Ports@free".to_vec();
        let push = |item: &[u8]| {
            r(Op::Push {
                key: key.clone(),
                item: item.to_vec(),
            })
        };
        let pop = r(Op::Pop { key: key.clone() });
        assert_eq!(o.apply(&push(b"1024"), now).0, Reply::Len(1));
        assert_eq!(o.apply(&pop, now).0, Reply::Value(Some(b"1024".to_vec())));
        // Gone, as in the in-process store: the key can hold another kind now.
        assert_eq!(o.len(), 0);
        assert_eq!(o.spare.lists(), 1);
        assert_eq!(o.apply(&push(b"1025"), now).0, Reply::Len(1));
        assert!(o.spare.lists() == 0, "the retired list was reused");
        assert_eq!(o.apply(&pop, now).0, Reply::Value(Some(b"1025".to_vec())));
        let set = r(Op::Set {
            key: key.clone(),
            value: b"v".to_vec(),
        });
        assert_eq!(o.apply(&set, now).0, Reply::Done);
        assert_eq!(
            o.apply(&pop, now).0,
            Reply::Error(Failure::WrongKind {
                key: key.clone(),
                wanted: Kind::List,
                found: Kind::Value
            })
        );
    }

    #[test]
    fn clock_tagged_updates_apply_once_and_owners_are_enforced() {
        let mut o = Objects::default();
        let now = Duration::from_secs(1);
        let key = b"nat@0@0@Counter@c".to_vec();
        let add = |i: Option<u32>, c: Option<u64>| Request {
            op: Op::Add {
                key: key.clone(),
                delta: 5,
            }
            .into(),
            instance: i,
            clock: c,
        };
        assert_eq!(o.apply(&add(Some(1), Some(7)), now).0, Reply::Int(5));
        assert_eq!(
            o.apply(&add(Some(1), Some(7)), now).0,
            Reply::Error(Failure::Duplicate)
        );
        assert_eq!(o.apply(&add(Some(2), Some(7)), now).0, Reply::Int(10));
        assert_eq!(o.apply(&add(Some(1), Some(8)), now).0, Reply::Int(15));
        let claim = |i| {
            r(Command::Claim {
                key: key.clone(),
                kind: Kind::Counter,
                instance: i,
            })
        };
        assert_eq!(o.apply(&claim(1), now).0, Reply::Bool(true));
        assert_eq!(o.apply(&claim(2), now).0, Reply::Bool(false));
        assert!(matches!(
            o.apply(&add(Some(2), None), now).0,
            Reply::Error(Failure::Refused(_))
        ));
        assert!(matches!(
            o.apply(&add(None, None), now).0,
            Reply::Error(Failure::Refused(_))
        ));
        assert_eq!(o.apply(&add(Some(1), None), now).0, Reply::Int(20));
        let hand = r(Command::Handover {
            key: key.clone(),
            from: 1,
            to: 2,
        });
        assert_eq!(o.apply(&hand, now).0, Reply::Bool(true));
        assert_eq!(o.apply(&hand, now).0, Reply::Bool(false));
        assert!(matches!(
            o.apply(&add(Some(1), None), now).0,
            Reply::Error(Failure::Refused(_))
        ));
        assert_eq!(o.apply(&add(Some(2), None), now).0, Reply::Int(25));
        // Reads are never refused.
        assert_eq!(
            o.apply(&r(Op::GetCounter { key: key.clone() }), now).0,
            Reply::Int(25)
        );
    }

    #[test]
    fn sweep_reports_expired_objects_and_fields() {
        let mut o = Objects::default();
        let t0 = Duration::from_secs(10);
        let m = b"m".to_vec();
        let v = b"v".to_vec();
        for req in [
            Op::MapSet {
                key: m.clone(),
                field: b"a".to_vec(),
                value: b"1".to_vec(),
            },
            Op::MapSet {
                key: m.clone(),
                field: b"b".to_vec(),
                value: b"2".to_vec(),
            },
            Op::Expire {
                key: m.clone(),
                field: Some(b"a".to_vec()),
                ttl: Duration::from_secs(1),
            },
            Op::Set {
                key: v.clone(),
                value: b"x".to_vec(),
            },
            Op::Expire {
                key: v.clone(),
                field: None,
                ttl: Duration::from_secs(2),
            },
        ] {
            o.apply(&r(req), t0);
        }
        o.sweep(t0 + Duration::from_millis(1500));
        assert_eq!(o.expired, vec![(m.clone(), Some(b"a".to_vec()))]);
        o.expired.clear();
        o.sweep(t0 + Duration::from_secs(3));
        assert_eq!(o.expired, vec![(v, None)]);
        assert_eq!(o.len(), 1);
        assert!(o.index.is_empty());
    }
}

#[cfg(test)]
mod index_tests {
    use super::*;

    fn r(op: Op) -> Request {
        op.into()
    }

    #[test]
    fn renewed_field_deadlines_expire_in_order_and_a_stale_timer_drops_nothing() {
        let mut o = Objects::default();
        let t = Duration::from_secs(100);
        let m = b"m".to_vec();
        for f in [b"a", b"b", b"c"] {
            o.apply(
                &r(Op::MapSet {
                    key: m.clone(),
                    field: f.to_vec(),
                    value: b"v".to_vec(),
                }),
                t,
            );
        }
        let expire = |f: &[u8], s: u64| {
            r(Op::Expire {
                key: m.clone(),
                field: Some(f.to_vec()),
                ttl: Duration::from_secs(s),
            })
        };
        o.apply(&expire(b"a", 1), t);
        o.apply(&expire(b"b", 2), t);
        o.apply(&expire(b"a", 5), t); // renewed: the 1 s timer is gone
        let Some(flowstate_objects::Obj::Map(mo)) = o.objects.get(&m).map(|e| &e.object.obj) else {
            panic!("a map")
        };
        assert_eq!(mo.deadlines().count(), 2);
        assert_eq!(o.index.len(), 1);
        o.sweep(t + Duration::from_secs(3));
        assert_eq!(o.expired, vec![(m.clone(), Some(b"b".to_vec()))]);
        o.expired.clear();
        // Overwriting a field clears its deadline: only c is left without one, a still has 5 s.
        o.sweep(t + Duration::from_secs(6));
        assert_eq!(o.expired, vec![(m.clone(), Some(b"a".to_vec()))]);
        assert_eq!(o.len(), 1, "c has no time to live");
        assert!(o.index.is_empty());
    }
}
