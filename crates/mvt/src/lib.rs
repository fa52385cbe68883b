//! Match-Value Tables (HashMVT, Feng & Zhang): partitionable state tables whose entries
//! ⟨M(e), V(e)⟩ match packets on a prefix of one field, found in O(1) by hashing.
//!
//! * [`Mvt`] is the table (§III-A): an ordered set of entries, each a matching field
//!   [`Match`] over a configurable packet [`Field`] (IPv4/IPv6 source or destination prefix,
//!   exact 5-tuple, `*`, or raw keys an NF builds) and a value field: the state value, a
//!   timestamp, a timeout, a validity flag and an auxiliary field ([`Entry`]). Invalid entries
//!   match nothing and go at the next periodic [`Mvt::clean`].
//! * Table operations (§III-B1): [`Mvt::insert`] ("new"), [`Mvt::remove`], [`Mvt::shard`]
//!   (T ⇒ {T1, T2}, M(T) = M(T1) ∪ M(T2)), [`Mvt::combine`], [`Mvt::split`] (e → e'1, e'2 with
//!   disjoint matches) and [`Mvt::merge`] (its inverse, refused unless the two are the halves of
//!   one prefix with equal values). Entry operations (§III-B2): [`Mvt::set`], [`Mvt::get`],
//!   [`Mvt::inc`], [`Mvt::timeout`], [`Mvt::renew`].
//! * Matching (§III-C): for every match length present, the key truncated to that length is
//!   hashed with CRC32C (the CPU instruction via `flowstate_wire::hash`, or software: same
//!   values) and its row probed, longest first; rules sharing a row are chained. All hashes of
//!   a lookup are computed and their rows prefetched before the first is read. A direct-mapped
//!   state cache indexed by the hash of the full key answers a flow's next packets with one
//!   probe; any change to the matching invalidates it (an epoch), so the cache never returns
//!   anything but what a fresh probe would. Equal matches are kept first-in first-out (a pool
//!   of `*` entries, §III-D).
//! * The matching range [`Mvt::matching_range`] and its aggregation into dispatch rules under
//!   a rule budget ([`dispatch`], §IV-D3).
//!
//! Promises: lookups ([`Mvt::lookup`], [`Mvt::lookup_batch`], [`Mvt::find`]) allocate nothing,
//! take no lock and never panic; [`Mvt::lookup`] returns what a naive longest-prefix match over
//! the valid entries returns (property-tested against [`trie::BinaryTrie`] and a linear scan,
//! on random rules and on the 324,903 real IPv4 prefixes); shard/combine and split/merge leave
//! the set of matches unchanged (property-tested).
//!
//! Known limit: equal matches share one row, so a pool of n `*` entries is an n-long chain
//! that a key hashing to the same row walks past (the row filter and the stored hashes make
//! each step cheap, and such keys are one in the row count). Keeping equal matches in a side
//! list off one chain node would remove it.
//!
//! # How an MVT relates to the state API
//!
//! DESIGN.md routes all NF state through `flowstate-state`. An MVT is one *partition* of a
//! partitionable state table: each worker owns its own [`Mvt`] (the shard of the instance's
//! table that [`Mvt::shard`] would give it), touched only by that worker's thread, like a
//! per-core partition of a state object; nothing is shared, so nothing is locked. What the
//! state API adds on top of a partition (flushing to a backend, moves between instances) is
//! done for an MVT by its own operations: shard/combine move entries between instances, and the
//! coordinator (`flowstate-control`) steers traffic by matching ranges instead of moving state
//! (§IV-B). An NF on an MVT still keeps its counters in the state API. Making the MVT a backend
//! object of the state API (so a remote store can hold it) is left for later: the table is
//! plain data with a dense slab, ready to be serialised.

pub mod dispatch;
mod key;
mod table;
pub mod trie;

pub use key::{parse_v4_prefix, Field, Key, Match, KEY_BITS, KEY_BYTES};
pub use table::{Entry, EntryId, Hasher, Mvt, MvtError, Nanos, DEFAULT_CACHE, NEVER};
