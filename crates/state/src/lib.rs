//! flowstate's state API (FlexState §III–IV, CHC §4.3): typed handles over untyped storage, a
//! [`Backend`] trait every store driver implements, the in-process [`local`] backend, the
//! cache-and-flush engine, merging functions, and the [`conformance`] suite every backend
//! passes.
//!
//! ```
//! use flowstate_state::{local::LocalStore, Access, Partition, Scope, StateConfig};
//!
//! let store = LocalStore::new();
//! let mut part = Partition::new(&store, StateConfig::default()).unwrap();
//! let mut nf = part.declare("nat");
//! let flows = nf.map::<u32, u16>("flows", Scope::PerFlow, Access::ReadMostly).unwrap();
//! let bytes = nf.counter("bytes", Scope::CrossFlow(&[]), Access::WriteMostly).unwrap();
//! flows.insert_nowait(7, 4242);
//! bytes.add_nowait(60);
//! assert_eq!(flows.get(&7).unwrap(), Some(4242));
//! assert_eq!(flows.key(), "nat@0@0@Map@flows");
//! ```
//!
//! Promises:
//! * NF code names objects, scopes and access patterns; which store holds them is
//!   configuration. The same calls behave the same on every backend that passes
//!   [`conformance`].
//! * On the in-process store, objects a worker owns stay typed in its cache: a call costs a
//!   hash-map operation, nothing is encoded, nothing waits.
//! * `_nowait` calls never block and never fail; their effects reach the store within one
//!   flush interval of [`Partition::maybe_flush`] (unless the store is down, then later).
//! * Keys are `nf@instance@core@Type@id`, or `nf@Type@id` for shared objects.

mod backend;
mod codec;
pub mod conformance;
mod engine;
mod handles;
mod key;
pub mod local;
pub mod merge;
mod scope;
mod table;

pub use backend::{
    Backend, BackendError, Batch, Bytes, Connector, Fence, FencedBackend, Object, Op, OpError,
    Reply, SettingError,
};
pub use codec::{Codec, CodecError};
pub use engine::{Declare, LinkStats, Nanos, Partition, StateConfig, CALL_BUCKETS};
pub use handles::{map_entry_lines, Counter, CounterMap, List, Map, Set, Value, LOCK_LEASE};
pub use key::{KeyParts, Kind, ObjectKey, Owner};
pub use scope::{Access, Field, Scope, Strategy};

/// Why a state call failed.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// The store failed the whole call.
    #[error(transparent)]
    Backend(#[from] BackendError),
    /// The store refused this operation.
    #[error(transparent)]
    Op(#[from] OpError),
    /// Bytes from the store do not decode as the declared type.
    #[error("state decoding failed: {0}")]
    Codec(#[from] CodecError),
    /// An object id that cannot be part of a key.
    #[error("bad state object id {0:?}: must be non-empty, without whitespace")]
    BadId(String),
    /// The partition's state thread is gone.
    #[error("the state thread has stopped")]
    Closed,
    /// A reply of the wrong shape (a driver bug).
    #[error("unexpected reply from the store: {0}")]
    Unexpected(&'static str),
}
