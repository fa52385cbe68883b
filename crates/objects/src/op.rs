//! The store operations (FlexState §III-A2, CHC §4.3): the one vocabulary of the state API's
//! drivers, the in-process store and the store protocol, whose opcodes are [`Op`]'s
//! discriminants.

use crate::{Action, Kind};
use std::time::Duration;

/// One operation on one object: `K` is the key (the state API's object key, or bytes on the
/// wire), `B` the byte strings (values, items, members, fields), owned or borrowed.
///
/// The discriminant of each variant is its opcode in the store protocol ([`Op::code`]):
/// codes are never reused nor renumbered, as write-ahead logs keep them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Op<K, B> {
    /// Read a [`Kind::Value`]: replies [`Reply::Value`](crate::Reply::Value).
    Get {
        /// Object.
        key: K,
    } = 0,
    /// Write a [`Kind::Value`]: replies [`Reply::Done`](crate::Reply::Done).
    Set {
        /// Object.
        key: K,
        /// New value.
        value: B,
    } = 1,
    /// Delete an object of any kind: replies [`Reply::Bool`](crate::Reply::Bool) (whether it
    /// existed).
    Delete {
        /// Object.
        key: K,
    } = 2,
    /// Add to a [`Kind::Counter`] (missing = 0): replies [`Reply::Int`](crate::Reply::Int)
    /// with the new value.
    Add {
        /// Object.
        key: K,
        /// Amount (may be negative).
        delta: i64,
    } = 3,
    /// Read a [`Kind::Counter`] (missing = 0): replies [`Reply::Int`](crate::Reply::Int).
    GetCounter {
        /// Object.
        key: K,
    } = 4,
    /// Overwrite a [`Kind::Counter`]: replies [`Reply::Done`](crate::Reply::Done).
    SetCounter {
        /// Object.
        key: K,
        /// New value.
        value: i64,
    } = 5,
    /// Append to a [`Kind::List`]: replies [`Reply::Len`](crate::Reply::Len) with the new
    /// length.
    Push {
        /// Object.
        key: K,
        /// Item.
        item: B,
    } = 6,
    /// Take the first item of a [`Kind::List`]: replies [`Reply::Value`](crate::Reply::Value)
    /// (`None` when empty).
    Pop {
        /// Object.
        key: K,
    } = 7,
    /// Add a member to a [`Kind::Set`]: replies [`Reply::Bool`](crate::Reply::Bool) (whether
    /// it was new).
    Insert {
        /// Object.
        key: K,
        /// Member.
        member: B,
    } = 8,
    /// Remove a member from a [`Kind::Set`]: replies [`Reply::Bool`](crate::Reply::Bool)
    /// (whether it was there).
    Remove {
        /// Object.
        key: K,
        /// Member.
        member: B,
    } = 9,
    /// Whether a [`Kind::Set`] holds a member: replies [`Reply::Bool`](crate::Reply::Bool).
    Contains {
        /// Object.
        key: K,
        /// Member.
        member: B,
    } = 10,
    /// Read a field of a [`Kind::Map`]: replies [`Reply::Value`](crate::Reply::Value).
    MapGet {
        /// Object.
        key: K,
        /// Field.
        field: B,
    } = 11,
    /// Write a field of a [`Kind::Map`]: replies [`Reply::Done`](crate::Reply::Done).
    MapSet {
        /// Object.
        key: K,
        /// Field.
        field: B,
        /// Value.
        value: B,
    } = 12,
    /// Delete a field of a [`Kind::Map`] or [`Kind::CounterMap`]: replies
    /// [`Reply::Bool`](crate::Reply::Bool).
    MapDelete {
        /// Object.
        key: K,
        /// Field.
        field: B,
    } = 13,
    /// Add to a field of a [`Kind::CounterMap`] (missing = 0): replies
    /// [`Reply::Int`](crate::Reply::Int).
    MapAdd {
        /// Object.
        key: K,
        /// Field.
        field: B,
        /// Amount.
        delta: i64,
    } = 14,
    /// Read a field of a [`Kind::CounterMap`] (missing = 0): replies
    /// [`Reply::Int`](crate::Reply::Int).
    MapGetCounter {
        /// Object.
        key: K,
        /// Field.
        field: B,
    } = 15,
    /// Replace a [`Kind::Value`] if it currently equals `expected` (`None`: absent); `new`
    /// `None` deletes. Replies [`Reply::Bool`](crate::Reply::Bool) (whether it was replaced).
    CompareAndSet {
        /// Object.
        key: K,
        /// Value it must have now.
        expected: Option<B>,
        /// Value to put.
        new: Option<B>,
    } = 16,
    /// Set a time to live on an object, or on one field of a map (`field`): after `ttl` the
    /// object or field is gone. Replies [`Reply::Bool`](crate::Reply::Bool) (whether it
    /// existed).
    Expire {
        /// Object.
        key: K,
        /// Map field, or `None` for the whole object.
        field: Option<B>,
        /// Time to live.
        ttl: Duration,
    } = 17,
    /// Number of items, members or fields: replies [`Reply::Len`](crate::Reply::Len) (0 when
    /// missing).
    Len {
        /// Object.
        key: K,
        /// Its kind.
        kind: Kind,
    } = 18,
    /// The whole object (for merging and recovery): replies
    /// [`Reply::Object`](crate::Reply::Object).
    ReadAll {
        /// Object.
        key: K,
        /// Its kind.
        kind: Kind,
    } = 19,
    /// Take an exclusive lease on `key` for `owner` (FlexState §VI-B locks): replies
    /// [`Reply::Bool`](crate::Reply::Bool) (whether it was granted; re-granted to the same
    /// owner).
    Lock {
        /// Lock name (an object key).
        key: K,
        /// Who asks.
        owner: u64,
        /// The lease ends by itself after this long, so a crashed owner cannot block others.
        lease: Duration,
    } = 20,
    /// Release a lease held by `owner`: replies [`Reply::Bool`](crate::Reply::Bool) (whether
    /// it was held by them).
    Unlock {
        /// Lock name.
        key: K,
        /// Who releases.
        owner: u64,
    } = 21,
}

/// The name of each operation, by opcode ([`Op::code`]), as stores report them.
pub const OP_NAMES: [&str; 22] = [
    "get",
    "set",
    "delete",
    "add",
    "get_counter",
    "set_counter",
    "push",
    "pop",
    "insert",
    "remove",
    "contains",
    "map_get",
    "map_set",
    "map_delete",
    "map_add",
    "map_get_counter",
    "compare_and_set",
    "expire",
    "len",
    "read_all",
    "lock",
    "unlock",
];

impl<K, B> Op<K, B> {
    /// The opcode: the variant's discriminant, an index into [`OP_NAMES`].
    pub fn code(&self) -> u8 {
        // SAFETY: `Op` is `repr(u8)`, so it is laid out as a `repr(C)` union of `repr(C)`
        // structs that each begin with the `u8` discriminant (the Rust Reference, "Primitive
        // representation of enums with fields"): a pointer to an `Op` points at its
        // discriminant, which is always initialised.
        unsafe { *(self as *const Self).cast::<u8>() }
    }

    /// The operation's name ([`OP_NAMES`]).
    pub fn name(&self) -> &'static str {
        OP_NAMES[usize::from(self.code())]
    }

    /// The object the operation is on (for [`Op::Lock`] and [`Op::Unlock`], the lock's name).
    pub fn key(&self) -> &K {
        match self {
            Op::Get { key }
            | Op::Set { key, .. }
            | Op::Delete { key }
            | Op::Add { key, .. }
            | Op::GetCounter { key }
            | Op::SetCounter { key, .. }
            | Op::Push { key, .. }
            | Op::Pop { key }
            | Op::Insert { key, .. }
            | Op::Remove { key, .. }
            | Op::Contains { key, .. }
            | Op::MapGet { key, .. }
            | Op::MapSet { key, .. }
            | Op::MapDelete { key, .. }
            | Op::MapAdd { key, .. }
            | Op::MapGetCounter { key, .. }
            | Op::CompareAndSet { key, .. }
            | Op::Expire { key, .. }
            | Op::Len { key, .. }
            | Op::ReadAll { key, .. }
            | Op::Lock { key, .. }
            | Op::Unlock { key, .. } => key,
        }
    }

    /// The same operation referring to its key and byte strings.
    pub fn as_ref(&self) -> Op<&K, &B> {
        self.map(|k| k, |b| b)
    }

    /// The same operation with its key mapped by `key` and each byte string by `bytes`.
    pub fn map<'s, L, C>(
        &'s self,
        key: impl FnOnce(&'s K) -> L,
        mut bytes: impl FnMut(&'s B) -> C,
    ) -> Op<L, C> {
        match self {
            Op::Get { key: k } => Op::Get { key: key(k) },
            Op::Set { key: k, value } => Op::Set {
                key: key(k),
                value: bytes(value),
            },
            Op::Delete { key: k } => Op::Delete { key: key(k) },
            Op::Add { key: k, delta } => Op::Add {
                key: key(k),
                delta: *delta,
            },
            Op::GetCounter { key: k } => Op::GetCounter { key: key(k) },
            Op::SetCounter { key: k, value } => Op::SetCounter {
                key: key(k),
                value: *value,
            },
            Op::Push { key: k, item } => Op::Push {
                key: key(k),
                item: bytes(item),
            },
            Op::Pop { key: k } => Op::Pop { key: key(k) },
            Op::Insert { key: k, member } => Op::Insert {
                key: key(k),
                member: bytes(member),
            },
            Op::Remove { key: k, member } => Op::Remove {
                key: key(k),
                member: bytes(member),
            },
            Op::Contains { key: k, member } => Op::Contains {
                key: key(k),
                member: bytes(member),
            },
            Op::MapGet { key: k, field } => Op::MapGet {
                key: key(k),
                field: bytes(field),
            },
            Op::MapSet {
                key: k,
                field,
                value,
            } => Op::MapSet {
                key: key(k),
                field: bytes(field),
                value: bytes(value),
            },
            Op::MapDelete { key: k, field } => Op::MapDelete {
                key: key(k),
                field: bytes(field),
            },
            Op::MapAdd {
                key: k,
                field,
                delta,
            } => Op::MapAdd {
                key: key(k),
                field: bytes(field),
                delta: *delta,
            },
            Op::MapGetCounter { key: k, field } => Op::MapGetCounter {
                key: key(k),
                field: bytes(field),
            },
            Op::CompareAndSet {
                key: k,
                expected,
                new,
            } => {
                let expected = expected.as_ref().map(&mut bytes);
                Op::CompareAndSet {
                    key: key(k),
                    expected,
                    new: new.as_ref().map(bytes),
                }
            }
            Op::Expire { key: k, field, ttl } => Op::Expire {
                key: key(k),
                field: field.as_ref().map(bytes),
                ttl: *ttl,
            },
            Op::Len { key: k, kind } => Op::Len {
                key: key(k),
                kind: *kind,
            },
            Op::ReadAll { key: k, kind } => Op::ReadAll {
                key: key(k),
                kind: *kind,
            },
            Op::Lock {
                key: k,
                owner,
                lease,
            } => Op::Lock {
                key: key(k),
                owner: *owner,
                lease: *lease,
            },
            Op::Unlock { key: k, owner } => Op::Unlock {
                key: key(k),
                owner: *owner,
            },
        }
    }
}

impl<K, B: AsRef<[u8]>> Op<K, B> {
    /// What the operation does to its object ([`crate::Stored::run`]); `None` for the leases,
    /// [`Op::Lock`] and [`Op::Unlock`], which live beside the objects ([`crate::Leases`]).
    pub fn action(&self) -> Option<Action<'_>> {
        fn b<B: AsRef<[u8]>>(x: &B) -> &[u8] {
            x.as_ref()
        }
        Some(match self {
            Op::Get { .. } => Action::Get,
            Op::Set { value, .. } => Action::Set { value: b(value) },
            Op::Delete { .. } => Action::Delete,
            Op::Add { delta, .. } => Action::Add { delta: *delta },
            Op::GetCounter { .. } => Action::GetCounter,
            Op::SetCounter { value, .. } => Action::SetCounter { value: *value },
            Op::Push { item, .. } => Action::Push { item: b(item) },
            Op::Pop { .. } => Action::Pop,
            Op::Insert { member, .. } => Action::Insert { member: b(member) },
            Op::Remove { member, .. } => Action::Remove { member: b(member) },
            Op::Contains { member, .. } => Action::Contains { member: b(member) },
            Op::MapGet { field, .. } => Action::MapGet { field: b(field) },
            Op::MapSet { field, value, .. } => Action::MapSet {
                field: b(field),
                value: b(value),
            },
            Op::MapDelete { field, .. } => Action::MapDelete { field: b(field) },
            Op::MapAdd { field, delta, .. } => Action::MapAdd {
                field: b(field),
                delta: *delta,
            },
            Op::MapGetCounter { field, .. } => Action::MapGetCounter { field: b(field) },
            Op::CompareAndSet { expected, new, .. } => Action::CompareAndSet {
                expected: expected.as_ref().map(b),
                new: new.as_ref().map(b),
            },
            Op::Expire { field, ttl, .. } => Action::Expire {
                field: field.as_ref().map(b),
                ttl: *ttl,
            },
            Op::Len { kind, .. } => Action::Len { kind: *kind },
            Op::ReadAll { kind, .. } => Action::ReadAll { kind: *kind },
            Op::Lock { .. } | Op::Unlock { .. } => return None,
        })
    }

    /// Whether the operation changes no object ([`Action::is_read`]); the leases change only
    /// leases, and are not reads.
    pub fn is_read(&self) -> bool {
        self.action().is_some_and(|a| a.is_read())
    }
}
