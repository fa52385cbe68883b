//! The driver trait every store implements: a batch of operations in, one reply per
//! operation out (FlexState §III-A2, CHC §4.3 "offloading operations").
//!
//! Keys are [`ObjectKey`]s; values, list items, set members and map fields are bytes produced
//! by [`Codec`](crate::Codec). A driver translates each [`Op`] into its store's own calls
//! (Redis `INCRBY`, a Cassandra counter column, ...). Every driver passes the
//! [`conformance`](crate::conformance) suite.

use crate::key::{Kind, ObjectKey};
use flowstate_objects::Action;
use std::time::Duration;

/// Bytes of an encoded value, member or field.
pub type Bytes = Vec<u8>;

/// One operation on one object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// Read a [`Kind::Value`]: replies [`Reply::Value`].
    Get {
        /// Object.
        key: ObjectKey,
    },
    /// Write a [`Kind::Value`]: replies [`Reply::Done`].
    Set {
        /// Object.
        key: ObjectKey,
        /// New value.
        value: Bytes,
    },
    /// Delete an object of any kind: replies [`Reply::Bool`] (whether it existed).
    Delete {
        /// Object.
        key: ObjectKey,
    },
    /// Add to a [`Kind::Counter`] (missing = 0): replies [`Reply::Int`] with the new value.
    Add {
        /// Object.
        key: ObjectKey,
        /// Amount (may be negative).
        delta: i64,
    },
    /// Read a [`Kind::Counter`] (missing = 0): replies [`Reply::Int`].
    GetCounter {
        /// Object.
        key: ObjectKey,
    },
    /// Overwrite a [`Kind::Counter`]: replies [`Reply::Done`].
    SetCounter {
        /// Object.
        key: ObjectKey,
        /// New value.
        value: i64,
    },
    /// Append to a [`Kind::List`]: replies [`Reply::Len`] with the new length.
    Push {
        /// Object.
        key: ObjectKey,
        /// Item.
        item: Bytes,
    },
    /// Take the first item of a [`Kind::List`]: replies [`Reply::Value`] (`None` when empty).
    Pop {
        /// Object.
        key: ObjectKey,
    },
    /// Add a member to a [`Kind::Set`]: replies [`Reply::Bool`] (whether it was new).
    Insert {
        /// Object.
        key: ObjectKey,
        /// Member.
        member: Bytes,
    },
    /// Remove a member from a [`Kind::Set`]: replies [`Reply::Bool`] (whether it was there).
    Remove {
        /// Object.
        key: ObjectKey,
        /// Member.
        member: Bytes,
    },
    /// Whether a [`Kind::Set`] holds a member: replies [`Reply::Bool`].
    Contains {
        /// Object.
        key: ObjectKey,
        /// Member.
        member: Bytes,
    },
    /// Read a field of a [`Kind::Map`]: replies [`Reply::Value`].
    MapGet {
        /// Object.
        key: ObjectKey,
        /// Field.
        field: Bytes,
    },
    /// Write a field of a [`Kind::Map`]: replies [`Reply::Done`].
    MapSet {
        /// Object.
        key: ObjectKey,
        /// Field.
        field: Bytes,
        /// Value.
        value: Bytes,
    },
    /// Delete a field of a [`Kind::Map`] or [`Kind::CounterMap`]: replies [`Reply::Bool`].
    MapDelete {
        /// Object.
        key: ObjectKey,
        /// Field.
        field: Bytes,
    },
    /// Add to a field of a [`Kind::CounterMap`] (missing = 0): replies [`Reply::Int`].
    MapAdd {
        /// Object.
        key: ObjectKey,
        /// Field.
        field: Bytes,
        /// Amount.
        delta: i64,
    },
    /// Read a field of a [`Kind::CounterMap`] (missing = 0): replies [`Reply::Int`].
    MapGetCounter {
        /// Object.
        key: ObjectKey,
        /// Field.
        field: Bytes,
    },
    /// Replace a [`Kind::Value`] if it currently equals `expected` (`None`: absent); `new`
    /// `None` deletes. Replies [`Reply::Bool`] (whether it was replaced).
    CompareAndSet {
        /// Object.
        key: ObjectKey,
        /// Value it must have now.
        expected: Option<Bytes>,
        /// Value to put.
        new: Option<Bytes>,
    },
    /// Set a time to live on an object, or on one field of a map (`field`): after `ttl` the
    /// object or field is gone. Replies [`Reply::Bool`] (whether it existed).
    Expire {
        /// Object.
        key: ObjectKey,
        /// Map field, or `None` for the whole object.
        field: Option<Bytes>,
        /// Time to live.
        ttl: Duration,
    },
    /// Number of items, members or fields: replies [`Reply::Len`] (0 when missing).
    Len {
        /// Object.
        key: ObjectKey,
        /// Its kind.
        kind: Kind,
    },
    /// The whole object (for merging and recovery): replies [`Reply::Object`].
    ReadAll {
        /// Object.
        key: ObjectKey,
        /// Its kind.
        kind: Kind,
    },
    /// Take an exclusive lease on `key` for `owner` (FlexState §VI-B locks): replies
    /// [`Reply::Bool`] (whether it was granted; re-granted to the same owner).
    Lock {
        /// Lock name (an object key).
        key: ObjectKey,
        /// Who asks.
        owner: u64,
        /// The lease ends by itself after this long, so a crashed owner cannot block others.
        lease: Duration,
    },
    /// Release a lease held by `owner`: replies [`Reply::Bool`] (whether it was held by them).
    Unlock {
        /// Lock name.
        key: ObjectKey,
        /// Who releases.
        owner: u64,
    },
}

impl Op {
    /// The object this operation is on.
    pub fn key(&self) -> &ObjectKey {
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

    /// What the operation does to its object (`None` for the leases, [`Op::Lock`] and
    /// [`Op::Unlock`], which live beside the objects).
    pub fn action(&self) -> Option<Action<'_>> {
        Some(match self {
            Op::Get { .. } => Action::Get,
            Op::Set { value, .. } => Action::Set { value },
            Op::Delete { .. } => Action::Delete,
            Op::Add { delta, .. } => Action::Add { delta: *delta },
            Op::GetCounter { .. } => Action::GetCounter,
            Op::SetCounter { value, .. } => Action::SetCounter { value: *value },
            Op::Push { item, .. } => Action::Push { item },
            Op::Pop { .. } => Action::Pop,
            Op::Insert { member, .. } => Action::Insert { member },
            Op::Remove { member, .. } => Action::Remove { member },
            Op::Contains { member, .. } => Action::Contains { member },
            Op::MapGet { field, .. } => Action::MapGet { field },
            Op::MapSet { field, value, .. } => Action::MapSet { field, value },
            Op::MapDelete { field, .. } => Action::MapDelete { field },
            Op::MapAdd { field, delta, .. } => Action::MapAdd {
                field,
                delta: *delta,
            },
            Op::MapGetCounter { field, .. } => Action::MapGetCounter { field },
            Op::CompareAndSet { expected, new, .. } => Action::CompareAndSet {
                expected: expected.as_deref(),
                new: new.as_deref(),
            },
            Op::Expire { field, ttl, .. } => Action::Expire {
                field: field.as_deref(),
                ttl: *ttl,
            },
            Op::Len { kind, .. } => Action::Len { kind: *kind },
            Op::ReadAll { kind, .. } => Action::ReadAll { kind: *kind },
            Op::Lock { .. } | Op::Unlock { .. } => return None,
        })
    }
}

/// A whole object as [`Op::ReadAll`] returns it; collections in the store's order (maps and
/// sets sorted by their encoded bytes).
pub use flowstate_objects::Object;

/// The reply to one [`Op`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// Done, nothing to return.
    Done,
    /// A value, or `None` when absent.
    Value(Option<Bytes>),
    /// A counter value.
    Int(i64),
    /// A yes/no answer.
    Bool(bool),
    /// A length.
    Len(u64),
    /// A whole object, or `None` when absent.
    Object(Option<Object>),
    /// This operation failed (e.g. the key holds another kind); the others in the batch ran.
    Error(OpError),
}

/// Why one operation failed while its batch went on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OpError {
    /// The key holds an object of another kind.
    #[error("{key} holds a {found}, not a {wanted}")]
    WrongKind {
        /// Object.
        key: String,
        /// Kind the operation needs.
        wanted: &'static str,
        /// Kind the store holds.
        found: &'static str,
    },
    /// The store refused the operation.
    #[error("{0}")]
    Refused(String),
}

/// Why a whole batch failed: nothing can be assumed about which operations ran.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BackendError {
    /// The store cannot be reached.
    #[error("{backend}: unreachable: {reason}")]
    Unreachable {
        /// Backend name.
        backend: &'static str,
        /// What happened.
        reason: String,
    },
    /// The store answered something this driver does not understand.
    #[error("{backend}: protocol error: {reason}")]
    Protocol {
        /// Backend name.
        backend: &'static str,
        /// What happened.
        reason: String,
    },
}

/// A driver setting (a key under `[state]`) that cannot be used. Drivers build their
/// [`Connector`] from `[state]`'s `url` and their own keys and name the key that is wrong; the
/// binary adds the file and line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{key}: {reason}")]
pub struct SettingError {
    /// The key under `[state]` (`url`, `token`, `nodes`, ...).
    pub key: String,
    /// What was expected.
    pub reason: String,
}

impl SettingError {
    /// An error about `key`.
    pub fn new(key: impl Into<String>, reason: impl Into<String>) -> Self {
        SettingError {
            key: key.into(),
            reason: reason.into(),
        }
    }
}

/// A connection to a store. Each worker's state thread owns one.
pub trait Backend: Send {
    /// The backend's name in configuration (`local`, `redis`, ...).
    fn name(&self) -> &'static str;

    /// Runs `ops` in order and appends one reply per op to `replies`. Operations on one object
    /// take effect in the order given; a read sees every earlier update (CHC §4.3).
    fn execute(&mut self, ops: &[Op], replies: &mut Vec<Reply>) -> Result<(), BackendError>;

    /// Keys of every partition of object `id` of kind `kind` of NF `nf` (every
    /// `nf@instance@core@Kind@id`, plus the shared `nf@Kind@id` if it exists): what merging
    /// functions combine.
    fn partitions(
        &mut self,
        nf: &str,
        kind: Kind,
        id: &str,
    ) -> Result<Vec<ObjectKey>, BackendError>;
}

/// Opens connections to one store; configuration builds one, the runtime asks it for a
/// [`Backend`] per worker.
pub trait Connector: Send + Sync {
    /// The backend's name in configuration.
    fn name(&self) -> &'static str;

    /// Whether the store lives in this process (the `local` backend). Objects owned by one
    /// worker then need no flushing: the worker's typed cache is their only copy.
    fn in_process(&self) -> bool {
        false
    }

    /// A new connection.
    fn connect(&self) -> Result<Box<dyn Backend>, BackendError>;
}
