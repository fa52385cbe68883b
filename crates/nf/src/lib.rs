//! The [`NetworkFunction`] trait and the built-in NFs.
//!
//! Promises:
//! * NFs are sans-IO: they see a packet (already dissected once by the runtime) and a
//!   [`Context`] with the time and the packet's logical clock, and return a [`Verdict`]. They
//!   never read a clock, open a socket, or spawn a thread, so every NF runs under a virtual
//!   clock in tests.
//! * All NF state goes through the state API ([`flowstate_state`]); an NF declares its objects
//!   when it is built for a worker and keeps nothing else between packets, so the same NF runs
//!   on every backend.
//! * A packet an NF cannot handle is dropped with a reason, counted by the runtime; nothing a
//!   packet holds can make an NF panic.
//!
//! Detectors: [`ips`] (signature rules on packets and reassembled streams, StatelessNF §3),
//! [`portscan`] (TRW), [`trojan`] (CHC's trojan detector, §2.1 R4).
//!
//! Besides the NFs, [`reassembly`] turns a flow's TCP segments into in-order byte streams for
//! NFs that inspect payloads, its per-flow state kept through the state API like theirs.

use flowstate_state::{Declare, Nanos, StateError};
use flowstate_wire::{Dissection, FlowKey};

/// Which side a packet came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Direction {
    /// From the inside (clients, the private network) towards the outside.
    Outbound,
    /// From the outside towards the inside.
    Inbound,
}

impl Direction {
    /// The other direction.
    pub const fn reversed(self) -> Self {
        match self {
            Direction::Outbound => Direction::Inbound,
            Direction::Inbound => Direction::Outbound,
        }
    }
}

/// A packet on its way through a chain: the frame's bytes and their dissection. An NF that
/// rewrites headers keeps `dissection.flow` up to date for the NFs after it.
#[derive(Debug)]
pub struct Packet<'a> {
    /// The Ethernet frame.
    pub data: &'a mut [u8],
    /// Where its layers are, and its flow key.
    pub dissection: Dissection,
    /// Where it came from. An NF that turns an outbound packet back inside (a NAT's
    /// hairpinning) sets it to Inbound: the NFs before it then see the packet inbound
    /// ([`stage::Stage::run`]).
    pub direction: Direction,
}

/// What an NF sees besides the packet.
#[derive(Debug, Clone, Copy)]
pub struct Context {
    /// The runtime's time, ns.
    pub now: Nanos,
    /// The packet's logical clock (CHC §5), 0 when the runtime does not assign one.
    pub clock: u64,
    /// The partition of the packet (the worker's, on one host).
    pub partition: u32,
}

/// Why a packet was dropped; counted per NF by the runtime.
pub type DropReason = &'static str;

/// The `tracing` target of the events NFs raise for alerts (portscan, trojan): each carries one
/// line of Suricata's EVE JSON in its field `eve`. NFs are sans-IO; `flowstate run --eve FILE`
/// writes those lines to a file.
pub const ALERT_TARGET: &str = "flowstate::alert";

/// What to do with a packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Pass it to the next NF, or out.
    Forward,
    /// Drop it, for this reason.
    Drop(DropReason),
}

/// A reloaded NF configuration on its way from the factory to the workers' instances (each
/// NF knows its own type: [`NetworkFunction::reconfigure`] downcasts it).
pub type ReloadConfig = std::sync::Arc<dyn std::any::Any + Send + Sync>;

/// A network function: one instance per worker, built by its [`NfFactory`].
pub trait NetworkFunction {
    /// The NF's name (its id in state keys).
    fn name(&self) -> &str;

    /// Hints that `pkt` will be processed soon (a batch is prefetched before it is
    /// processed): start loading the state it needs. Default: nothing.
    #[inline]
    fn prefetch(&mut self, pkt: &Packet<'_>) {
        let _ = pkt;
    }

    /// Processes one packet.
    fn process(&mut self, pkt: &mut Packet<'_>, cx: &Context) -> Verdict;

    /// Takes a reloaded configuration, what its factory's [`NfFactory::reload_config`] gave,
    /// keeping every entry of its tables. Default: nothing (an NF without reloadable keys
    /// gets none).
    fn reconfigure(&mut self, config: &ReloadConfig) {
        let _ = config;
    }

    /// Starts loading the state [`NetworkFunction::active_until`] looks up first for `flow`
    /// going `direction` (the flow cache calls it for a batch of flows before telling the NFs
    /// of each, as the stage prefetches a batch's packets). Default: nothing.
    #[inline]
    fn prefetch_flow(&mut self, flow: &FlowKey, direction: Direction) {
        let _ = (flow, direction);
    }

    /// The stage's flow cache ([`stage::FlowCache`]) forwarded packets of `flow` (its key as
    /// such packets reach this NF going `direction`) past the NFs, the last at `until`. Renews
    /// the flow's idle timers as such a packet would have (no TCP state is stepped: these
    /// packets have no SYN, FIN or RST), but never makes a timer run out earlier than it
    /// already does (`until` may be older than a packet of the other direction the chain
    /// ran since), and writes into `flow` the addresses and ports this NF gives such packets
    /// (as [`NetworkFunction::process`] would rewrite them), for the NFs after it.
    ///
    /// `false`: the NF holds no such flow or would no longer forward its packets unchanged;
    /// the cache then forgets the flow, and its next packet runs the chain. Only NFs whose
    /// factory allows the cache ([`NfFactory::fast_path`]) are asked. Linux's flowtable does
    /// the same for conntrack: it extends the timeouts of the connections it offloaded and
    /// hands them back on teardown (`net/netfilter/nf_flow_table_core.c`). Default, for NFs
    /// without per-flow state: `true`, nothing changed.
    fn active_until(&mut self, flow: &mut FlowKey, direction: Direction, until: Nanos) -> bool {
        let _ = (flow, direction, until);
        true
    }

    /// Called regularly (at least every few milliseconds of runtime time): expire timers.
    fn on_tick(&mut self, now: Nanos) {
        let _ = now;
    }

    /// Numbers worth showing an operator (`name`, value), e.g. translations, active flows:
    /// counters (they only grow) unless [`NetworkFunction::gauges`] names them. Names are
    /// `snake_case` (they become metric names); -1: the NF could not read it from its state.
    fn report(&self) -> Vec<(&'static str, i64)> {
        Vec::new()
    }

    /// The entries of [`NetworkFunction::report`] that are gauges: levels that go up and down
    /// (table fill, free ports, bytes buffered). Default: none.
    fn gauges(&self) -> &'static [&'static str] {
        &[]
    }

    /// Report entries that vary by a label (the LB's counts per backend). Default: none.
    fn report_labelled(&self) -> Vec<Labelled> {
        Vec::new()
    }

    /// Entries of its per-flow table this instance holds now (sessions, connections, flows):
    /// what a cluster instance reports as its load's size (HashMVT §IV-C). Default 0, for NFs
    /// without one. Cheap and local: never a round trip to the store (an instance's loop asks
    /// at every heartbeat).
    fn entries(&self) -> u64 {
        0
    }

    /// Appends this instance's entries of table `table` (one of its factory's
    /// [`NfFactory::tables`]) to `out`, with the time each has left at `now`. Called between
    /// batches, never on the per-packet path. Default: no tables.
    fn list(&self, table: &str, now: Nanos, out: &mut Vec<listing::Row>) {
        let _ = (table, now, out);
    }
}

/// A report entry that varies by a label: `name{label="value"} count`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Labelled {
    /// The entry (`backend_connections`).
    pub name: &'static str,
    /// The label's name (`backend`).
    pub label: &'static str,
    /// The label's value (`192.0.2.11:443`).
    pub value: String,
    /// The number.
    pub count: i64,
    /// Whether it is a gauge (a level) rather than a counter.
    pub gauge: bool,
}

/// The traffic partition an NF is built for. A partition's packets all reach the NF built
/// for it, whoever runs it: a worker of one host (a worker serves one partition), or the
/// cluster instance that owns the partition now. Its state is keyed by stage and partition
/// (`nf@stage@partition@…`), so it moves with the partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    /// The chain stage (in a cluster); on one host, whose chain is one stage, the box's
    /// `[state] nf_instance`, which keeps two boxes' keys apart on one store.
    pub stage: u32,
    /// The partition, 0-based.
    pub partition: u32,
    /// The stage's partitions (a host's workers). An NF splits what it cannot share among
    /// them (a NAT's ports, session limits).
    pub partitions: u32,
}

/// Why an NF could not be built.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// A configuration value is wrong: names the key.
    #[error("{nf}: {key}: {reason}")]
    Config {
        /// The NF.
        nf: &'static str,
        /// The configuration key, dotted (`udp`, `timeouts.udp_replied`, `rules[2].src`).
        key: String,
        /// What was expected.
        reason: String,
    },
    /// Several configuration values are wrong (each a [`BuildError::Config`]).
    #[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    Configs(Vec<BuildError>),
    /// Declaring state failed.
    #[error(transparent)]
    State(#[from] StateError),
}

impl BuildError {
    /// NF `nf`'s configuration key `key` is wrong: `reason`.
    pub fn config(nf: &'static str, key: impl Into<String>, reason: impl Into<String>) -> Self {
        BuildError::Config {
            nf,
            key: key.into(),
            reason: reason.into(),
        }
    }

    /// `Ok` when `errors` is empty, else the error, or all of them.
    pub fn all(mut errors: Vec<BuildError>) -> Result<(), BuildError> {
        match errors.len() {
            0 => Ok(()),
            1 => Err(errors.remove(0)),
            _ => Err(BuildError::Configs(errors)),
        }
    }

    /// Every configuration error in it as `(key, reason)`; another error has an empty key.
    pub fn config_errors(&self) -> Vec<(String, String)> {
        match self {
            BuildError::Config { key, reason, .. } => vec![(key.clone(), reason.clone())],
            BuildError::Configs(all) => all.iter().flat_map(BuildError::config_errors).collect(),
            other => vec![(String::new(), other.to_string())],
        }
    }
}

/// Reads NF `nf`'s `[[chain]]` table as its configuration type `T`, reporting every key that
/// does not read (unknown, of the wrong type, a bad duration or prefix), each by its dotted
/// key ([`flowstate_config::deserialize_all`]).
pub(crate) fn read_config<T: serde::de::DeserializeOwned>(
    nf: &'static str,
    table: &toml::Table,
) -> Result<T, BuildError> {
    flowstate_config::deserialize_all(table).map_err(|problems| {
        let errors = problems
            .into_iter()
            .map(|p| BuildError::config(nf, p.key, p.reason))
            .collect();
        BuildError::all(errors)
            .err()
            .unwrap_or(BuildError::Configs(Vec::new()))
    })
}

/// A duration that must be above zero: the error names `key`.
pub(crate) fn positive(
    nf: &'static str,
    key: &str,
    d: std::time::Duration,
    errors: &mut Vec<BuildError>,
) {
    if d.is_zero() {
        errors.push(BuildError::config(
            nf,
            key,
            "expected a duration above zero, like \"30s\"",
        ));
    }
}

/// Builds one NF instance per worker (the runtime calls it inside each worker's thread).
pub trait NfFactory: Send + Sync {
    /// The NF's name.
    fn name(&self) -> &'static str;

    /// Builds the instance for `worker`, declaring its state through `state`.
    fn build(
        &self,
        state: &mut Declare<'_>,
        worker: Placement,
    ) -> Result<Box<dyn NetworkFunction>, BuildError>;

    /// The keys of its `[[chain]]` table a reload may change in place ([`NfFactory::reload_config`]
    /// carries them to every worker's instance); a change of any other key needs a restart.
    /// Default: none.
    fn reloadable(&self) -> &'static [&'static str] {
        &[]
    }

    /// Whether a reload reads this NF's own files again (rule files) even when its table did
    /// not change: [`NfFactory::reload_config`] then says whether they did. Default: no.
    fn reload_rereads(&self) -> bool {
        false
    }

    /// What a reload hands each worker's instance ([`NetworkFunction::reconfigure`]), when
    /// the NF has reloadable keys: this factory's configuration fitted to `running`, what
    /// the workers run (the last reload's; `None`: the configuration they were built from,
    /// when this factory is it); `Ok(None)`: nothing to change. `Err`: it cannot be (why).
    /// Default: `Ok(None)`.
    fn reload_config(
        &self,
        running: Option<&ReloadConfig>,
    ) -> Result<Option<ReloadConfig>, String> {
        let _ = running;
        Ok(None)
    }

    /// The factory that steers packets ([`NfFactory::partition`]) as the workers running
    /// `config` (a configuration of [`NfFactory::reload_config`]) need; `None`: this one
    /// does. Default: `None`.
    fn steering(&self, config: &ReloadConfig) -> Option<std::sync::Arc<dyn NfFactory>> {
        let _ = config;
        None
    }

    /// The tables an operator can list (`flowstate state list NF.TABLE`), the main one first.
    /// Default: none.
    fn tables(&self) -> &'static [listing::TableInfo] {
        &[]
    }

    /// Appends the entries of table `table` kept in a store to `out`, read through `store`
    /// and decoded with the NF's codecs (rows without a timeout: stores do not hand out
    /// deadlines). `Ok(false)`: the table is not kept in a store (a worker-private table).
    fn stored_rows(
        &self,
        table: &str,
        store: &mut listing::StoreReader<'_>,
        out: &mut Vec<listing::Row>,
    ) -> Result<bool, StateError> {
        let _ = (table, store, out);
        Ok(false)
    }

    /// Whether a live box's fast path may forward a flow's packets past this NF (see
    /// `flowstate_fastpath::flowcache`). An NF says yes only when, once it forwarded a packet of a
    /// flow, it would forward every later packet of that flow and direction that has no SYN,
    /// FIN or RST with the same header changes (addresses, ports), leaving its payload alone,
    /// and the only state such a packet changes is the flow's idle timer: renewed by the slow
    /// path at least once per refresh interval (the XDP fast path), or through
    /// [`NetworkFunction::active_until`] (the worker's flow cache), which such an NF with
    /// per-flow state implements. Its per-packet counters then count the slow path's packets
    /// only. Default: no (the NF sees every packet).
    fn fast_path(&self) -> bool {
        false
    }

    /// Whether this NF, as configured, keeps state in its worker rather than behind the state
    /// API: `Some((key, reason))`, naming its configuration key that chose so. Such an NF
    /// cannot run in a cluster, where whichever instance takes a partition over must find
    /// the partition's state in the store.
    fn private_state(&self) -> Option<(&'static str, &'static str)> {
        None
    }

    /// The traffic partition (of `partitions`) that holds the state this NF needs for a packet
    /// of flow `flow`, when its state is keyed by something other than the flow itself (CHC
    /// §4.1: a packet goes where the objects of its scope live). A NAT's reply is addressed
    /// to the external port it handed out, so it goes to the partition that owns that port;
    /// an LB's connection goes by its client endpoint, the part both directions share.
    /// `quoted` is the flow an ICMP error quotes, `direction` where the packet came from.
    /// Partitions are a host's workers or a cluster's traffic partitions alike.
    ///
    /// Default `None`: the NF's state is per flow, so any split that sends both directions of
    /// a flow to one partition serves it (the runtime's symmetric flow hash).
    fn partition(
        &self,
        flow: &FlowKey,
        quoted: Option<&FlowKey>,
        direction: Direction,
        partitions: u32,
    ) -> Option<u32> {
        let _ = (flow, quoted, direction, partitions);
        None
    }
}

/// The partition (of `partitions`) of an endpoint `(address, port)` of protocol `proto`: how
/// NFs whose state is keyed by one endpoint of a flow declare their partition. CRC32C of the
/// endpoint (a symmetric Toeplitz hash would give every endpoint the same value: its key
/// repeats every 16 bits, so an address hashed against itself cancels out).
pub fn endpoint_partition(addr: std::net::IpAddr, port: u16, proto: u8, partitions: u32) -> u32 {
    let mut h = match addr {
        std::net::IpAddr::V4(a) => flowstate_wire::hash::crc32c(&a.octets()),
        std::net::IpAddr::V6(a) => flowstate_wire::hash::crc32c(&a.octets()),
    };
    h = flowstate_wire::hash::crc32c_append(h, &port.to_be_bytes());
    h = flowstate_wire::hash::crc32c_append(h, &[proto]);
    h % partitions.max(1)
}

pub mod counter;
mod early_drop;
mod eve;
pub mod event_stream;
pub mod firewall;
pub mod ips;
pub mod lb;
pub mod listing;
mod monitor;
pub mod nat;
pub mod portscan;
pub mod reassembly;
pub mod registry;
pub mod rules;
pub mod stage;
pub mod steer;
pub mod trojan;
