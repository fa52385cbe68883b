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
//! * Matching (§III-C): rules are grouped by length rounded down to a whole byte; a lookup
//!   hashes the key with CRC32C once per group present (the CPU instruction, inlined, via
//!   `flowstate_wire::hash::Sse42`, or software: same values), longest group first, finds
//!   the group's node (a 255-bit map of the rules of its 8 lengths under those bits) and
//!   checks the longest rule the map shows for the key's next bits with one exact probe. All
//!   group hashes of a lookup are computed and their rows prefetched before the first is
//!   read. A 2-way set-associative state cache indexed by the hash of the full key (keys of
//!   at most 128 bits) answers a flow's next packets from one cache line; any change to the
//!   matching invalidates it (an epoch), so the cache never returns anything but what a fresh
//!   probe would. Equal matches are kept first-in first-out on a side list behind one row
//!   node (a pool of `*` entries, §III-D, costs other keys nothing).
//! * The matching range [`Mvt::matching_range`] and its aggregation into dispatch rules under
//!   a rule budget ([`dispatch`], §IV-D3).
//!
//! Promises: lookups ([`Mvt::lookup`], [`Mvt::lookup_batch`], [`Mvt::find`]) allocate nothing,
//! take no lock and never panic; [`Mvt::lookup`] returns what a naive longest-prefix match over
//! the valid entries returns (property-tested against [`trie::BinaryTrie`], a linear scan and
//! the `prefix-trie` crate, on random rules and on the 324,903 real IPv4 prefixes);
//! shard/combine and split/merge leave the set of matches unchanged (property-tested).
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
pub use table::{
    Entry, EntryHint, EntryId, FindHint, Hasher, Mvt, MvtError, Nanos, DEFAULT_CACHE, NEVER,
};
