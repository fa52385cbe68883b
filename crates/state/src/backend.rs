//! The driver trait every store implements: a batch of operations in, one reply per
//! operation out (FlexState §III-A2, CHC §4.3 "offloading operations").
//!
//! Keys are [`ObjectKey`]s; values, list items, set members and map fields are bytes produced
//! by [`Codec`](crate::Codec). A driver translates each [`Op`] into its store's own calls
//! (Redis `INCRBY`, a Cassandra counter column, ...). Every driver passes the
//! [`conformance`](crate::conformance) suite.

use crate::key::{Kind, ObjectKey};

/// Bytes of an encoded value, member or field.
pub type Bytes = Vec<u8>;

/// One operation on one object: the store vocabulary ([`flowstate_objects::Op`]) with the
/// state API's keys and encoded bytes.
pub type Op = flowstate_objects::Op<ObjectKey, Bytes>;

/// A whole object as [`Op::ReadAll`] returns it; collections in the store's order (maps and
/// sets sorted by their encoded bytes).
pub use flowstate_objects::Object;

/// The reply to one [`Op`] ([`flowstate_objects::Reply`]); [`Reply::Error`] when this operation
/// failed (e.g. the key holds another kind) and the others in the batch ran.
pub type Reply = flowstate_objects::Reply<OpError>;

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

/// Why a whole batch failed: nothing can be assumed about which operations ran (but for
/// [`BackendError::Partial`], which says).
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
    /// A fenced batch ([`Backend::execute_fenced`]) was refused: its fence no longer holds,
    /// and none of its operations ran. It never will: nothing sends it again.
    #[error("{backend}: fenced: {key} no longer holds this writer's token")]
    Fenced {
        /// Backend name.
        backend: &'static str,
        /// The fence's key.
        key: String,
    },
    /// A fenced batch that spans several places of a store without one atomic step over them
    /// (Redis Cluster's hash slots): its fence held and the operations checked with it ran;
    /// the others (indices `rest` into the batch) may not have. They belong to a batch the
    /// store accepted while its writer held the fence, so they are sent again without it
    /// ([`Backend::execute_rest`]), even after the writer lost the fence.
    #[error("{backend}: {} operations of a fenced batch left to apply: {reason}", rest.len())]
    Partial {
        /// Backend name.
        backend: &'static str,
        /// The operations left, as indices into the batch, in order.
        rest: Vec<usize>,
        /// Why they failed.
        reason: String,
    },
}

/// The condition of a fenced batch: `key` holds exactly `value` (a cluster instance's
/// ownership record, naming it and its epoch: its fencing token).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fence {
    /// The value's key.
    pub key: ObjectKey,
    /// What it must hold.
    pub value: Bytes,
    /// The batch's number under this fence, the same each time it is sent again (0: none).
    /// A store whose answer can be lost after it ran a batch (a broken connection, a failed
    /// over Redis master) marks it with this number and does not run it twice.
    pub batch: u64,
}

/// A batch as the state engine sends it ([`Backend::execute_batch`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Batch {
    /// Its number on this connection, the same each time it is sent again.
    pub number: u64,
    /// What a fenced batch the store accepted left ([`BackendError::Partial`]).
    pub rest: bool,
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

    /// Runs `ops` as [`Backend::execute`] does, only if `fence` holds when they run, checked
    /// atomically with the operations on the objects of the fence's partition (the store
    /// places a partition's objects together); [`BackendError::Fenced`] when it does not hold
    /// (no operation ran). Stores that cannot fence say so ([`Connector::fences`]).
    fn execute_fenced(
        &mut self,
        fence: &Fence,
        ops: &[Op],
        replies: &mut Vec<Reply>,
    ) -> Result<(), BackendError> {
        let _ = (fence, ops, replies);
        Err(BackendError::Protocol {
            backend: self.name(),
            reason: "this store cannot fence a batch".into(),
        })
    }

    /// Runs what a fenced batch under `fence` left ([`BackendError::Partial`]) as
    /// [`Backend::execute`] does, without checking the fence: it held when the batch was
    /// accepted. Stores that mark batches ([`Fence::batch`]) run each part once.
    fn execute_rest(
        &mut self,
        fence: &Fence,
        ops: &[Op],
        replies: &mut Vec<Reply>,
    ) -> Result<(), BackendError> {
        let _ = fence;
        self.execute(ops, replies)
    }

    /// Runs `batch`'s `ops` as [`Backend::execute`] does; a connection that fences its
    /// batches ([`FencedBackend`]) numbers them, and sends what one left without the fence.
    fn execute_batch(
        &mut self,
        batch: Batch,
        ops: &[Op],
        replies: &mut Vec<Reply>,
    ) -> Result<(), BackendError> {
        let _ = batch;
        self.execute(ops, replies)
    }

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

    /// Whether its connections run fenced batches ([`Backend::execute_fenced`]).
    fn fences(&self) -> bool {
        false
    }
}

/// A connection whose every batch that writes is fenced by `fence` ([`Backend::execute_fenced`]):
/// what a cluster instance's partition writes through, so a store refuses its writes once the
/// partition has another owner, whatever the network did. Batches that only read are not.
pub struct FencedBackend {
    inner: Box<dyn Backend>,
    fence: Fence,
}

impl FencedBackend {
    /// `inner`'s batches fenced by `fence`.
    pub fn new(inner: Box<dyn Backend>, fence: Fence) -> FencedBackend {
        FencedBackend { inner, fence }
    }
}

impl Backend for FencedBackend {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn execute(&mut self, ops: &[Op], replies: &mut Vec<Reply>) -> Result<(), BackendError> {
        self.fence.batch = 0;
        if ops.iter().all(Op::is_read) {
            return self.inner.execute(ops, replies);
        }
        self.inner.execute_fenced(&self.fence, ops, replies)
    }

    fn execute_batch(
        &mut self,
        batch: Batch,
        ops: &[Op],
        replies: &mut Vec<Reply>,
    ) -> Result<(), BackendError> {
        self.fence.batch = batch.number;
        if batch.rest {
            self.inner.execute_rest(&self.fence, ops, replies)
        } else if ops.iter().all(Op::is_read) {
            self.inner.execute(ops, replies)
        } else {
            self.inner.execute_fenced(&self.fence, ops, replies)
        }
    }

    fn execute_fenced(
        &mut self,
        fence: &Fence,
        ops: &[Op],
        replies: &mut Vec<Reply>,
    ) -> Result<(), BackendError> {
        self.inner.execute_fenced(fence, ops, replies)
    }

    fn execute_rest(
        &mut self,
        fence: &Fence,
        ops: &[Op],
        replies: &mut Vec<Reply>,
    ) -> Result<(), BackendError> {
        self.inner.execute_rest(fence, ops, replies)
    }

    fn partitions(
        &mut self,
        nf: &str,
        kind: Kind,
        id: &str,
    ) -> Result<Vec<ObjectKey>, BackendError> {
        self.inner.partitions(nf, kind, id)
    }
}
