//! flowstate's `cassandra` backend: state objects in Apache Cassandra (4.x, 5.x) over the CQL
//! native protocol, laid out as FlexState §IV-B and its Table 2 describe.
//!
//! # Layout
//! * **A keyspace per partition.** The objects of `nf@instance@core` live in one keyspace,
//!   the shared objects of `nf` (`nf@Type@id`) in another (FlexState §IV-B: "the NF id, the NF
//!   instance id, and the core id identify a key space"). CQL keyspace names are at most 48
//!   characters of `[a-z0-9_]`, so the name is `fs_<readable>_<hash>`: up to 12 characters of
//!   the partition name with every other character turned into `_`, then the 128-bit FNV-1a
//!   hash of the whole name in hex. The mapping is recorded in the registry table
//!   `flowstate.partitions (nf, part, ks)` (`part` is `instance@core`, or empty for shared
//!   objects), which is also what [`Backend::partitions`] reads.
//! * **A table per type** (`value`, `counter`, `list`, `set`, `map`, `cmap`), the object id
//!   as partition key. Maps are expanded into tables, one row per field (Table 2: `key1` is the
//!   map id, `key2` the field). Tables are created the first time a type is written in a
//!   keyspace; reading a table that does not exist reads "absent" and creates nothing.
//! * **Counters are Cassandra counters** (`counter_raw`, `cmap_raw`), so concurrent adds from
//!   any number of processes are never lost. Counter tables cannot hold anything else, cannot
//!   expire and a counter cannot be set, so each counter also has a row in a regular table
//!   (`counter`, `cmap`) holding a *base*: the object exists while that row does, and its
//!   value is `raw - base`. [`Op::SetCounter`] moves the base (one read, one write), delete
//!   and time to live act on the base row; the raw counter is never deleted (Cassandra
//!   advises against re-using a deleted counter).
//! * **Lists** keep `head` and `tail` positions in static columns beside their items; a pop
//!   deletes everything before the new head with one range tombstone, so reads do not wade
//!   through a tombstone per popped item.
//! * **Locks** (FlexState §VI-B) are rows of their own table `locks`, taken and released with
//!   lightweight transactions (`IF NOT EXISTS`, `IF owner = ?`) and a `USING TTL` lease; a
//!   lock named like an object neither sees nor changes it. [`Op::CompareAndSet`] is a
//!   lightweight transaction too.
//! * **Schema changes** (keyspaces, tables) all go to one node, the lowest host id the driver
//!   reaches, and wait for the cluster to agree: concurrent `CREATE TABLE IF NOT EXISTS` of one
//!   table on two nodes could create it twice under two ids (CASSANDRA-10699).
//! * **Time to live** is `USING TTL` in whole seconds, rounded up, plus the second Cassandra
//!   truncates from the write's time: an object lives at least its time to live and at most
//!   a second longer (FlexState §VI-B "TIMERS").
//!
//! # Promises
//! * The driver passes the [`conformance`](flowstate_state::conformance) suite with
//!   [`Options::WHOLE_SECONDS`](flowstate_state::conformance::Options::WHOLE_SECONDS)
//!   (exact [`OpError::WrongKind`]).
//! * Each key names its kind (`...@Counter@id`), and the object under a key can only be of that
//!   kind: an operation of another kind on a key whose object exists replies
//!   [`OpError::WrongKind`] naming both kinds; on a key with no object, a read of another kind
//!   reads "absent" and a write of another kind is [`OpError::Refused`] (the `local` store would
//!   create the object; no flowstate handle ever does this).
//! * One [`Backend::execute`] runs the operations of different objects concurrently and those
//!   of one object in order, each reading what the earlier ones wrote (CHC §4.3), so a batch
//!   takes about as many round trips as its longest run of operations on one object needs.
//!   Within one object: consecutive reads go out together; consecutive [`Op::MapSet`]s are one
//!   single-partition batch (the last write of each field); consecutive [`Op::Push`]es are one
//!   read of the list's ends, the items in single-partition batches and one write of the new
//!   tail; consecutive [`Op::Add`]s (or [`Op::MapAdd`]s per field) are one counter update and
//!   one read, replying the running totals. Statements are prepared once per connector and
//!   cached. Round trips per operation otherwise: reads 1; `Set`, `MapSet` 1; `Add`, `Pop`,
//!   `Insert`, `Remove`, `MapDelete`, `Delete`, `Expire`, `SetCounter` 2 (a read, then a write);
//!   `CompareAndSet`, `Lock`, `Unlock` one lightweight transaction (a re-granted lock two).
//! * Operations on one object are serialised among all connections of one
//!   [`CassandraConnector`] (one flowstate process), so counter replies are exact there: with
//!   N concurrent adds of 1 the replies are exactly 1..=N. Between processes, counters still
//!   lose no update, but a reply may include another process's concurrent add, and two
//!   processes creating, deleting or setting the same object at the same moment race as
//!   Cassandra writes do (last write wins).
//! * A batch whose store cannot be reached, or which times out, fails with
//!   [`BackendError::Unreachable`]; a statement the store refuses (e.g. a mutation larger than
//!   its `max_mutation_size`) is that operation's [`OpError::Refused`].
//!
//! # Authentication and TLS
//! * `username` with `password`, or with `password_file` (the file's first line; keeps the
//!   secret out of the configuration): Cassandra's `PasswordAuthenticator`. The password is
//!   never printed ([`Secret`]).
//! * `ca_file`: the CQL connections are TLS (OpenSSL, through the scylla driver's
//!   `openssl-010`), each node's certificate checked against that CA and the address the node
//!   is reached at (the contact points and the addresses the cluster announces).
//! * A login the cluster refuses names the password's key at start-up (`state.password` or
//!   `state.password_file`), a failed TLS handshake `state.ca_file`
//!   ([`CassandraConfig::key_of`]).
//!
//! # Limits
//! * Counter overflow wraps around (two's complement) instead of being refused.
//! * [`Op::Expire`] of a whole set, map or counter-map applies to the members and fields it
//!   holds (each row gets the time to live); members and fields written afterwards do not
//!   inherit it (items pushed to a list with a time to live do).
//! * Keyspaces use `SimpleStrategy` with the configured replication factor.
//! * Write order relies on Cassandra's timestamps: on a cluster of several nodes, keep their
//!   clocks synchronised, as Cassandra requires anyway.

mod config;
mod exec;
mod names;

pub use config::{CassandraConfig, Secret, DEFAULT_NODE, KEYS};
pub use names::keyspace_name;

use exec::Shared;
#[cfg(doc)]
use flowstate_state::OpError;
use flowstate_state::{Backend, BackendError, Connector, Kind, ObjectKey, Op, Reply};
use std::sync::Arc;

/// The backend's name in configuration.
pub const NAME: &str = "cassandra";

/// Connections to one Cassandra cluster: a session and a small tokio runtime shared by every
/// [`Backend`] it hands out.
pub struct CassandraConnector {
    shared: Arc<Shared>,
}

impl CassandraConnector {
    /// Connects to the cluster and creates the registry keyspace if needed. A cluster that
    /// cannot be reached is [`BackendError::Unreachable`], naming the nodes.
    pub fn new(config: CassandraConfig) -> Result<Self, BackendError> {
        Ok(CassandraConnector {
            shared: Arc::new(Shared::connect(config)?),
        })
    }

    /// The settings in use.
    pub fn config(&self) -> &CassandraConfig {
        &self.shared.config
    }

    /// Drops every keyspace of the NFs for which `drop` returns true, and their registry
    /// entries; returns how many keyspaces were dropped. For tests and clean-ups: whatever
    /// those NFs stored is gone.
    pub fn drop_nfs(&self, drop: impl Fn(&str) -> bool) -> Result<usize, BackendError> {
        self.shared.drop_nfs(&drop)
    }
}

impl Connector for CassandraConnector {
    fn name(&self) -> &'static str {
        NAME
    }

    fn connect(&self) -> Result<Box<dyn Backend>, BackendError> {
        Ok(Box::new(CassandraBackend {
            shared: Arc::clone(&self.shared),
        }))
    }
}

/// One connection (a handle on the connector's session).
pub struct CassandraBackend {
    shared: Arc<Shared>,
}

impl Backend for CassandraBackend {
    fn name(&self) -> &'static str {
        NAME
    }

    fn execute(&mut self, ops: &[Op], replies: &mut Vec<Reply>) -> Result<(), BackendError> {
        if ops.is_empty() {
            return Ok(());
        }
        let out = self.shared.block_on(self.shared.execute(ops))?;
        replies.extend(out);
        Ok(())
    }

    fn partitions(
        &mut self,
        nf: &str,
        kind: Kind,
        id: &str,
    ) -> Result<Vec<ObjectKey>, BackendError> {
        self.shared.block_on(self.shared.partitions(nf, kind, id))
    }
}
