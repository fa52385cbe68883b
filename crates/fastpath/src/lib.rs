//! HyperSFC's model of a fast path (`hypersfc.txt`): a pipeline of NF tables, each cached in a
//! bounded fast path in front of a slow path that holds the full table, kept through the state
//! API so any store can hold it.
//!
//! * [`table`]: the pipeline, its tables (exact and longest-prefix match), their keys,
//!   defaults and branches.
//! * [`cache`]: the fast path's caches, dependency-aware for LPM, evicting by a count-min
//!   sketch of frequencies (§III-C).
//! * [`bloom`]: 2D Bloom filters with fixed-weight codes selecting the next table (§IV-A).
//! * [`fast`]: one pass of a packet, busy submit (§III-A), table bypass (§III-B), lazy submit
//!   (§IV).
//! * [`full`]: the full tables and the slow path's searches; the reference pipeline.
//! * [`sim`]: fast and slow path in one thread on a virtual clock.
//! * [`threaded`]: fast and slow path on their own threads, lazy-p's parallel searches.
//! * [`config`]: the pipeline from TOML (`[[fastpath.table]]`).
//! * [`flowcache`]: the live box's XDP cache of whole-chain outcomes per flow, in front of
//!   its chain of NFs.
//! * [`xdp`]: the fast path in XDP (`crates/io/bpf/pipeline.bpf.c`): caches in BPF maps,
//!   misses to the slow path over AF_XDP, answers back through a recirculation port.

pub mod bloom;
pub mod cache;
pub mod config;
pub mod fast;
#[cfg(target_os = "linux")]
pub mod flowcache;
pub mod full;
mod headers;
pub mod sim;
mod sketch;
pub mod table;
pub mod threaded;
#[cfg(target_os = "linux")]
pub mod xdp;

pub use fast::{FastPath, Mode, Packet, Step};
pub use full::{FullTables, Outcome};
pub use headers::{Field, Fields, Headers, Rule};
pub use table::{Kind, Next, OnMiss, Pipeline, Table};
