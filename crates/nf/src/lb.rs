//! The L4 load balancer (StatelessNF §3 Algorithm 1): connections to a virtual service (VIP,
//! port, protocol) are spread over its backends and stay on the backend chosen for them.
//!
//! * A packet to a VIP service that starts a connection (a TCP SYN, any UDP datagram of a new
//!   flow) chooses a backend: **least-loaded** (Algorithm 1's `nextServer`: the backend with
//!   the fewest active connections; as in FlexState §V-A4 each worker keeps its own load
//!   counters, so "least" is per worker partition; ties go to the first candidate after a
//!   hash of the flow) or **Maglev** consistent hashing (Eisenbud et al., NSDI '16 §3.4: a
//!   lookup table of prime size built once from the backends' permutations; the flow's hash
//!   picks the entry).
//! * The choice is stored per flow (`affinity`), so every later packet of the connection goes
//!   to the same backend whatever the loads become. The destination address and port are
//!   rewritten to the backend's with incremental checksum updates (RFC 1624), and the
//!   packet's flow key is updated for the NFs after this one.
//! * Replies from a backend of a tracked connection get the VIP and service port back as
//!   their source.
//! * A connection ends with FINs both ways, a RST, or its affinity's idle timeout; then its
//!   backend's active count drops. The entry lives on for `timeouts.tcp_fin` after the end so
//!   that the last ACK still reaches the backend.
//! * Packets neither for a VIP service nor from one of its backends pass untouched. The
//!   direction a packet came from does not matter.
//! * **A full table** (`max_connections`, default 262,144 as conntrack's `nf_conntrack_max`,
//!   shared by the workers): a new connection ends the oldest expendable one — never answered
//!   by its backend, or ended — with `early_drop = true` (the default, as conntrack's early
//!   drop; counted as `conns_early_dropped`); else, or when nothing among the oldest is
//!   expendable, it gets no entry (`conns_table_full`): with least-loaded it is dropped
//!   ([`reason::TABLE_FULL`]), with Maglev it is forwarded to the backend the lookup table
//!   gives, without an entry (Maglev §3.3: consistent hashing keeps a connection on its
//!   backend when its entry is missing). Established connections are never ended early.

use crate::early_drop::{self, Cap, Unit};
use crate::listing::{Cell, Row, StoreReader, TableInfo};
use crate::nat::{be16, checksum_update};
use crate::{
    BuildError, Context, Direction, Labelled, NetworkFunction, NfFactory, Packet, Placement,
    ReloadConfig, Verdict,
};
use flowstate_state::{
    Access, Codec, CodecError, Counter, CounterMap, Declare, Map, Nanos, Scope, StateError,
};
use flowstate_wire::dissect::{Dissection, Fragment, Transport};
use flowstate_wire::flow::{proto, FLOW_KEY_MAX_BYTES};
use flowstate_wire::{ipv4, ipv6, tcp, udp, FlowKey};
use serde::Deserialize;
use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

const NF: &str = "lb";

// ------------------------------------------------------------------------------------------
// Maglev

/// A 64-bit hash of `data`: FNV-1a from a seeded start, then the SplitMix64 finaliser so that
/// every input bit reaches every output bit. Deterministic across runs and machines.
fn hash64(seed: u64, data: &[u8]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325 ^ seed.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    for &b in data {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h ^= h >> 30;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

const SEED_OFFSET: u64 = 1;
const SEED_SKIP: u64 = 2;
const SEED_FLOW: u64 = 3;

/// The hash of a flow (in the direction given) that Maglev and the least-loaded tie-break use.
pub fn flow_hash(key: &FlowKey) -> u64 {
    let mut buf = [0u8; FLOW_KEY_MAX_BYTES];
    hash64(SEED_FLOW, key.to_bytes(&mut buf))
}

fn is_prime(n: usize) -> bool {
    if n < 2 {
        return false;
    }
    let mut d = 2;
    while d * d <= n {
        if n.is_multiple_of(d) {
            return false;
        }
        d += 1;
    }
    true
}

/// A Maglev lookup table (Eisenbud et al., NSDI '16 §3.4): `M` entries (`M` prime), each the
/// index of a backend.
///
/// Backend `i` prefers the entries of its permutation `(offset + j · skip) mod M` for
/// `j = 0, 1, ..`, with `offset = h1(name) mod M` and `skip = h2(name) mod (M − 1) + 1`; the
/// backends take turns claiming their next preferred entry that is still free until the
/// table is full. Each backend gets `M/N` entries give or take one, and removing a backend
/// moves little more than the entries it had.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MaglevTable {
    entries: Vec<u16>,
}

impl MaglevTable {
    /// The table size the paper suggests, and the default.
    pub const DEFAULT_SIZE: usize = 65537;
    /// The largest size accepted.
    pub const MAX_SIZE: usize = 1 << 24;

    /// Builds the table for backends named `names` (in index order). `size` must be a prime
    /// not below the number of backends; at most 65535 backends.
    pub fn new<S: AsRef<[u8]>>(names: &[S], size: usize) -> Result<MaglevTable, String> {
        let n = names.len();
        if n == 0 {
            return Err("no backends".into());
        }
        if n > usize::from(u16::MAX) {
            return Err(format!("{n} backends; at most {}", u16::MAX));
        }
        if !is_prime(size) || size > Self::MAX_SIZE {
            return Err(format!(
                "table size {size} is not a prime up to {}",
                Self::MAX_SIZE
            ));
        }
        if size < n {
            return Err(format!(
                "table size {size} is below the number of backends ({n})"
            ));
        }
        let m = size as u64;
        let perm: Vec<(u64, u64)> = names
            .iter()
            .map(|name| {
                let name = name.as_ref();
                (
                    hash64(SEED_OFFSET, name) % m,
                    hash64(SEED_SKIP, name) % (m - 1) + 1,
                )
            })
            .collect();
        const FREE: u16 = u16::MAX;
        let mut entries = vec![FREE; size];
        let mut next = vec![0u64; n];
        let mut filled = 0;
        'fill: loop {
            for (i, &(offset, skip)) in perm.iter().enumerate() {
                // A permutation of a prime-sized table visits every entry, so a free one is
                // found within M steps.
                let mut c = ((offset + next[i] * skip) % m) as usize;
                while entries[c] != FREE {
                    next[i] += 1;
                    c = ((offset + next[i] * skip) % m) as usize;
                }
                entries[c] = i as u16;
                next[i] += 1;
                filled += 1;
                if filled == size {
                    break 'fill;
                }
            }
        }
        Ok(MaglevTable { entries })
    }

    /// The number of entries, `M`.
    pub fn size(&self) -> usize {
        self.entries.len()
    }

    /// The backend index of every entry.
    pub fn entries(&self) -> &[u16] {
        &self.entries
    }

    /// The backend for a flow hash: entry `hash mod M`.
    #[inline]
    pub fn lookup(&self, hash: u64) -> usize {
        usize::from(self.entries[(hash % self.entries.len() as u64) as usize])
    }
}

// ------------------------------------------------------------------------------------------
// Configuration

/// How a VIP chooses the backend of a new connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Method {
    /// The backend with the fewest active connections (this worker's count).
    #[default]
    LeastLoaded,
    /// Maglev consistent hashing.
    Maglev,
}

/// One `vips = [{ .. }]` entry.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VipConfig {
    /// The virtual address (IPv4 or IPv6).
    pub vip: String,
    /// The service port, 1–65535.
    pub port: i64,
    /// `tcp` (default) or `udp`.
    #[serde(default)]
    pub proto: Option<String>,
    /// Backends: `"10.1.0.1"` (the service port) or `"10.1.0.1:8080"`, `"[2001:db8::1]:8080"`.
    pub backends: Vec<String>,
    /// `least-loaded` (default) or `maglev`.
    #[serde(default)]
    pub method: Method,
    /// Maglev only: the lookup table's size, a prime (default 65537).
    #[serde(default)]
    pub table_size: Option<i64>,
}

/// Idle timeouts of a flow's backend choice, durations (IPVS's defaults).
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Timeouts {
    /// A TCP connection (15m).
    #[serde(deserialize_with = "flowstate_config::deserialize_duration")]
    pub tcp: Duration,
    /// A TCP connection after a FIN or a RST (2m).
    #[serde(deserialize_with = "flowstate_config::deserialize_duration")]
    pub tcp_fin: Duration,
    /// A UDP flow (5m).
    #[serde(deserialize_with = "flowstate_config::deserialize_duration")]
    pub udp: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            tcp: Duration::from_secs(900),
            tcp_fin: Duration::from_secs(120),
            udp: Duration::from_secs(300),
        }
    }
}

/// `[[chain]] nf = "lb"` options.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// The virtual services.
    pub vips: Vec<VipConfig>,
    /// Idle timeouts.
    #[serde(default)]
    pub timeouts: Timeouts,
    /// Connections tracked at most, shared evenly by the workers (default 262,144, as the
    /// firewall's).
    #[serde(default = "early_drop::default_max")]
    pub max_connections: u64,
    /// Whether a new connection at the limit may end the oldest one never answered by its
    /// backend, or ended (default `true`).
    #[serde(default = "early_drop::default_early_drop")]
    pub early_drop: bool,
}

fn config_err(key: impl Into<String>, reason: impl Into<String>) -> BuildError {
    BuildError::config(NF, key, reason)
}

impl Config {
    /// Parses a `[[chain]]` table (without `nf`); every key that is wrong is reported, by
    /// its dotted name (`vips[1].port`, `timeouts.udp`).
    pub fn from_table(table: &toml::Table) -> Result<Config, BuildError> {
        let config: Config = crate::read_config(NF, table)?;
        let mut errors = Vec::new();
        early_drop::check_max(NF, "max_connections", config.max_connections, &mut errors);
        BuildError::all(errors)?;
        Ok(config)
    }
}

/// A backend server: address and port.
pub type BackendAddr = (IpAddr, u16);

#[derive(Debug, Clone)]
struct Backend {
    addr: IpAddr,
    port: u16,
}

impl Backend {
    fn key(&self) -> BackendAddr {
        (self.addr, self.port)
    }
}

#[derive(Debug)]
struct Vip {
    addr: IpAddr,
    port: u16,
    proto: u8,
    method: Method,
    /// Every backend a connection may be on: a flow's [`Affinity::backend`] indexes it, so a
    /// reload keeps each at its place and appends new ones.
    backends: Vec<Backend>,
    /// The backends new connections go to, in configuration order (indices in `backends`;
    /// those a reload removed are left out and keep only their connections).
    active: Vec<u16>,
    /// Maglev's lookup table over `active`, of `size` entries.
    table: Option<MaglevTable>,
    size: usize,
}

impl Vip {
    /// Builds the Maglev table over the active backends, as `method` asks.
    fn with_table(mut self) -> Result<Vip, String> {
        self.table = match self.method {
            Method::LeastLoaded => None,
            Method::Maglev if self.active.is_empty() => None,
            Method::Maglev => {
                let names: Vec<String> = self
                    .active
                    .iter()
                    .map(|&i| SocketAddr::from(self.backends[usize::from(i)].key()).to_string())
                    .collect();
                Some(MaglevTable::new(&names, self.size)?)
            }
        };
        Ok(self)
    }
}

/// The hasher of the configuration's lookup maps, which every packet queries: foldhash, the
/// workspace's (SipHash, std's default, cost ~500 instructions per packet here). Their keys
/// come from the configuration, so a fixed hash would do; foldhash's seed costs nothing.
type FastHash = foldhash::fast::RandomState;

/// An address, port and protocol: a VIP's or a backend's service.
type Service = (IpAddr, u16, u8);

#[derive(Debug, Default)]
struct Compiled {
    vips: Vec<Vip>,
    /// `(vip, port, proto)` → index in `vips`.
    services: HashMap<Service, usize, FastHash>,
    /// `(backend, port, proto)` → every `(vip, backend)` index pair it serves.
    backends: HashMap<Service, Vec<(usize, u16)>, FastHash>,
    /// Addresses (with protocols) of VIPs and backends: fragments to or from them are dropped.
    vip_hosts: HashSet<(IpAddr, u8), FastHash>,
    backend_hosts: HashSet<(IpAddr, u8), FastHash>,
    /// Distinct backends, in configuration order.
    report: Vec<BackendAddr>,
    tcp: Duration,
    tcp_fin: Duration,
    udp: Duration,
    /// [`Config::max_connections`].
    max_connections: u64,
    /// [`Config::early_drop`].
    early_drop: bool,
}

fn parse_backend(s: &str, vip: IpAddr, port: u16) -> Result<Backend, String> {
    let (addr, port) = if let Ok(sa) = s.trim().parse::<SocketAddr>() {
        (sa.ip(), sa.port())
    } else if let Ok(ip) = s.trim().parse::<IpAddr>() {
        (ip, port)
    } else {
        return Err(format!("{s:?} is not an address or address:port"));
    };
    if port == 0 {
        return Err(format!("{s:?}: port 0"));
    }
    if addr.is_ipv4() != vip.is_ipv4() {
        return Err(format!("{s:?} is not of the VIP's address family"));
    }
    Ok(Backend { addr, port })
}

fn compile_vip(v: &VipConfig, i: usize) -> Result<Vip, BuildError> {
    let at = |key: &str, e: String| config_err(format!("vips[{i}].{key}"), e);
    let addr: IpAddr = v
        .vip
        .trim()
        .parse()
        .map_err(|_| at("vip", format!("{:?} is not an address", v.vip)))?;
    let port = u16::try_from(v.port)
        .ok()
        .filter(|&p| p != 0)
        .ok_or_else(|| at("port", format!("{} is not a port 1 to 65535", v.port)))?;
    let proto = match v.proto.as_deref().map(str::to_ascii_lowercase).as_deref() {
        None | Some("tcp") => proto::TCP,
        Some("udp") => proto::UDP,
        Some(other) => return Err(at("proto", format!("{other:?}: expected tcp or udp"))),
    };
    if v.backends.is_empty() {
        return Err(at("backends", "no backends".into()));
    }
    if v.backends.len() >= usize::from(u16::MAX) {
        return Err(at(
            "backends",
            format!("{} backends; at most 65534", v.backends.len()),
        ));
    }
    let mut backends: Vec<Backend> = Vec::with_capacity(v.backends.len());
    for b in &v.backends {
        let b = parse_backend(b, addr, port).map_err(|e| at("backends", e))?;
        if backends.iter().any(|o| o.key() == b.key()) {
            return Err(at(
                "backends",
                format!("{} is listed twice", SocketAddr::from(b.key())),
            ));
        }
        backends.push(b);
    }
    let size = match (v.method, v.table_size) {
        (Method::LeastLoaded, Some(_)) => {
            return Err(at(
                "table_size",
                "only method = \"maglev\" has a table".into(),
            ))
        }
        (_, None) => MaglevTable::DEFAULT_SIZE,
        (Method::Maglev, Some(s)) => {
            usize::try_from(s).map_err(|_| at("table_size", format!("{s} is negative")))?
        }
    };
    Vip {
        addr,
        port,
        proto,
        method: v.method,
        active: (0..backends.len() as u16).collect(),
        backends,
        table: None,
        size,
    }
    .with_table()
    .map_err(|e| at("table_size", e))
}

/// Builds load balancers; holds the compiled configuration (and Maglev tables), shared by
/// every worker.
#[derive(Debug, Clone)]
pub struct Factory(Arc<Compiled>);

impl Compiled {
    /// The configuration with `vips`, the rest as `like`.
    fn with_vips(like: &Compiled, vips: Vec<Vip>) -> Result<Compiled, BuildError> {
        let mut c = Compiled {
            tcp: like.tcp,
            tcp_fin: like.tcp_fin,
            udp: like.udp,
            max_connections: like.max_connections,
            early_drop: like.early_drop,
            ..Compiled::default()
        };
        for (i, vip) in vips.into_iter().enumerate() {
            if c.services
                .insert((vip.addr, vip.port, vip.proto), i)
                .is_some()
            {
                return Err(config_err(
                    format!("vips[{i}]"),
                    "the service is defined twice",
                ));
            }
            c.vip_hosts.insert((vip.addr, vip.proto));
            for (bi, b) in vip.backends.iter().enumerate() {
                c.backends
                    .entry((b.addr, b.port, vip.proto))
                    .or_default()
                    .push((i, bi as u16));
                c.backend_hosts.insert((b.addr, vip.proto));
                if !c.report.contains(&b.key()) {
                    c.report.push(b.key());
                }
            }
            c.vips.push(vip);
        }
        Ok(c)
    }

    /// This configuration as a reload of `running` (what the workers run): a VIP that stays
    /// keeps every backend at its place, those no longer listed taking no new connection
    /// (their connections go on), new ones after them; a VIP no longer listed takes no new
    /// connection, its connections go on.
    fn fitted_to(&self, running: &Compiled) -> Result<Compiled, String> {
        let mut vips = Vec::with_capacity(self.vips.len());
        let service = |v: &Vip| (v.addr, v.port, v.proto);
        for (i, new) in self.vips.iter().enumerate() {
            let old = running
                .services
                .get(&service(new))
                .map(|&k| &running.vips[k]);
            let mut backends: Vec<Backend> = old.map_or_else(Vec::new, |o| o.backends.clone());
            let mut active = Vec::with_capacity(new.backends.len());
            for b in &new.backends {
                let at = match backends.iter().position(|o| o.key() == b.key()) {
                    Some(at) => at,
                    None => {
                        backends.push(b.clone());
                        backends.len() - 1
                    }
                };
                active.push(u16::try_from(at).map_err(|_| {
                    format!("vips[{i}].backends: more than 65535 since the start: restart")
                })?);
            }
            let vip = Vip {
                backends,
                active,
                table: None,
                ..*new
            };
            vips.push(vip.with_table().map_err(|e| format!("vips[{i}]: {e}"))?);
        }
        for old in &running.vips {
            if !self.services.contains_key(&service(old)) {
                let vip = Vip {
                    backends: old.backends.clone(),
                    active: Vec::new(),
                    table: None,
                    ..*old
                };
                vips.push(vip);
            }
        }
        Compiled::with_vips(self, vips).map_err(|e| e.to_string())
    }
}

impl Factory {
    /// Compiles `config`, building each Maglev table once; errors name the key.
    pub fn new(config: &Config) -> Result<Factory, BuildError> {
        let mut errors = Vec::new();
        if config.vips.is_empty() {
            errors.push(config_err("vips", "no VIPs"));
        }
        let t = &config.timeouts;
        for (key, d) in [("tcp", t.tcp), ("tcp_fin", t.tcp_fin), ("udp", t.udp)] {
            crate::positive(NF, &format!("timeouts.{key}"), d, &mut errors);
        }
        let mut vips = Vec::with_capacity(config.vips.len());
        for (i, v) in config.vips.iter().enumerate() {
            match compile_vip(v, i) {
                Ok(v) => vips.push(v),
                Err(e) => errors.push(e),
            }
        }
        BuildError::all(errors)?;
        let like = Compiled {
            tcp: t.tcp,
            tcp_fin: t.tcp_fin,
            udp: t.udp,
            max_connections: config.max_connections,
            early_drop: config.early_drop,
            ..Compiled::default()
        };
        Ok(Factory(Arc::new(Compiled::with_vips(&like, vips)?)))
    }

    /// The Maglev table of VIP `i` (in configuration order), if it uses Maglev.
    pub fn maglev_table(&self, i: usize) -> Option<&MaglevTable> {
        self.0.vips.get(i)?.table.as_ref()
    }

    /// Builds one worker's load balancer (what [`NfFactory::build`] boxes).
    pub fn build_lb(
        &self,
        state: &mut Declare<'_>,
        worker: Placement,
    ) -> Result<LoadBalancer, BuildError> {
        Ok(LoadBalancer {
            cap: RefCell::new(Cap::declare(
                state,
                Unit::Conns,
                self.0.max_connections,
                self.0.early_drop,
                worker,
            )?),
            cfg: Arc::clone(&self.0),
            affinity: state.map("affinity", Scope::PerFlow, Access::ReadMostly)?,
            active: state.counter_map("active", Scope::CrossFlow(&[]), Access::ReadWrite)?,
            connections: state.counter_map(
                "connections",
                Scope::CrossFlow(&[]),
                Access::WriteMostly,
            )?,
            bytes: state.counter_map("bytes", Scope::CrossFlow(&[]), Access::WriteMostly)?,
            untracked_replies: state.counter(
                "untracked_replies",
                Scope::CrossFlow(&[]),
                Access::WriteMostly,
            )?,
        })
    }
}

/// The factory for a `[[chain]]` table.
pub fn factory(table: &toml::Table) -> Result<Arc<dyn NfFactory>, BuildError> {
    Ok(Arc::new(Factory::new(&Config::from_table(table)?)?))
}

impl NfFactory for Factory {
    fn name(&self) -> &'static str {
        NF
    }

    /// The VIPs and their backends, and the timeouts, change in place: every connection
    /// stays on its backend, also one a reload removed (it takes no new connection); a VIP
    /// no longer listed takes no new connection, its connections go on.
    fn reloadable(&self) -> &'static [&'static str] {
        &["vips", "timeouts"]
    }

    fn reload_config(
        &self,
        running: Option<&ReloadConfig>,
    ) -> Result<Option<ReloadConfig>, String> {
        let Some(running) = running else {
            return Ok(Some(self.0.clone()));
        };
        let running = running
            .downcast_ref::<Compiled>()
            .ok_or("lb: the running configuration is not an LB's")?;
        Ok(Some(Arc::new(self.0.fitted_to(running)?)))
    }

    /// The running configuration's, which knows the backends a reload removed: their
    /// connections go on, both ways on their client's partition.
    fn steering(&self, config: &ReloadConfig) -> Option<Arc<dyn NfFactory>> {
        let c = Arc::clone(config).downcast::<Compiled>().ok()?;
        Some(Arc::new(Factory(c)))
    }

    fn build(
        &self,
        state: &mut Declare<'_>,
        worker: Placement,
    ) -> Result<Box<dyn NetworkFunction>, BuildError> {
        Ok(Box::new(self.build_lb(state, worker)?))
    }

    /// Yes: an established flow's packets without SYN, FIN or RST change nothing but its
    /// idle timer (see the module documentation).
    fn fast_path(&self) -> bool {
        true
    }

    fn tables(&self) -> &'static [TableInfo] {
        TABLES
    }

    fn stored_rows(
        &self,
        table: &str,
        store: &mut StoreReader<'_>,
        out: &mut Vec<Row>,
    ) -> Result<bool, StateError> {
        match table {
            "flows" => {
                for (k, a) in store.map::<FlowKey, Affinity>("affinity")? {
                    out.push(self.0.flow_row(&k, &a, Cell::None));
                }
            }
            "backends" => {
                let sums = |entries: Vec<(BackendAddr, i64)>| {
                    let mut m: HashMap<BackendAddr, i64> = HashMap::new();
                    for (b, n) in entries {
                        *m.entry(b).or_default() += n;
                    }
                    m
                };
                let active = sums(store.counter_map("active")?);
                let conns = sums(store.counter_map("connections")?);
                let bytes = sums(store.counter_map("bytes")?);
                for &b in &self.0.report {
                    let n = |m: &HashMap<BackendAddr, i64>| m.get(&b).copied().unwrap_or(0);
                    out.push(backend_row(b, n(&active), n(&conns), n(&bytes)));
                }
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// A connection's state (affinity, per-backend counts) is the client endpoint's: client →
    /// VIP and backend → client both go to the partition of the client endpoint. So does a
    /// connection straight to a backend's service, both ways (its replies look like a VIP
    /// connection's, and the NFs beside the LB must see both directions in one partition).
    fn partition(
        &self,
        flow: &FlowKey,
        _quoted: Option<&FlowKey>,
        _direction: Direction,
        partitions: u32,
    ) -> Option<u32> {
        let to = (flow.dst, flow.dst_port, flow.proto);
        let client = if self.0.services.contains_key(&to) || self.0.backends.contains_key(&to) {
            (flow.src, flow.src_port)
        } else if self
            .0
            .backends
            .contains_key(&(flow.src, flow.src_port, flow.proto))
        {
            (flow.dst, flow.dst_port)
        } else {
            return None;
        };
        Some(crate::endpoint_partition(
            client.0, client.1, flow.proto, partitions,
        ))
    }
}

/// The LB's tables.
const TABLES: &[TableInfo] = &[
    TableInfo {
        name: "flows",
        about: "a client's connection to a VIP and the backend it goes to, open or closed \
                (ended, kept until its short timeout), time left",
        columns: &["proto", "client", "vip", "backend", "state", "timeout"],
        summed: false,
    },
    TableInfo {
        name: "backends",
        about: "a configured backend: connections open now, connections assigned so far, \
                bytes both ways",
        columns: &["backend", "active", "connections", "bytes"],
        summed: true,
    },
];

impl Compiled {
    /// A flow as `flowstate state list lb.flows` shows it.
    fn flow_row(&self, k: &FlowKey, a: &Affinity, left: Cell) -> Row {
        let backend = self
            .services
            .get(&(k.dst, k.dst_port, k.proto))
            .and_then(|&vi| self.vips[vi].backends.get(usize::from(a.backend)))
            .map_or(Cell::None, |b| Cell::endpoint(b.addr, b.port));
        vec![
            Cell::Proto(k.proto),
            Cell::endpoint(k.src, k.src_port),
            Cell::endpoint(k.dst, k.dst_port),
            backend,
            Cell::Text(if a.closed() { "closed" } else { "open" }),
            left,
        ]
    }
}

/// A backend as `flowstate state list lb.backends` shows it.
fn backend_row(b: BackendAddr, active: i64, connections: i64, bytes: i64) -> Row {
    vec![
        Cell::endpoint(b.0, b.1),
        Cell::Int(active),
        Cell::Int(connections),
        Cell::Int(bytes),
    ]
}

// ------------------------------------------------------------------------------------------
// Per-flow state

/// A flow's backend choice: the value of the `affinity` map, keyed by the client → VIP flow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Affinity {
    /// Index of the backend in its VIP's list.
    pub backend: u16,
    flags: u8,
}

const FIN_CLIENT: u8 = 1;
const FIN_BACKEND: u8 = 2;
const CLOSED: u8 = 4;
/// The backend has answered (conntrack's "seen reply").
const ANSWERED: u8 = 8;

impl Affinity {
    /// Whether the connection has ended (FINs both ways or a RST); the entry stays until its
    /// short timeout so the last packets still reach the backend.
    pub fn closed(&self) -> bool {
        self.flags & CLOSED != 0
    }

    /// Whether the backend has answered.
    pub fn answered(&self) -> bool {
        self.flags & ANSWERED != 0
    }

    /// Whether the connection may be ended early to make room (as conntrack's early drop:
    /// never answered, or ended).
    fn expendable(&self) -> bool {
        !self.answered() || self.closed()
    }

    /// Whether a FIN or RST was seen (the short timeout applies).
    fn ending(&self) -> bool {
        self.flags & (FIN_CLIENT | FIN_BACKEND | CLOSED) != 0
    }

    /// Records a segment's FIN/RST from one end; returns whether this closed the connection.
    fn note(&mut self, fin: bool, rst: bool, from_client: bool) -> bool {
        if fin {
            self.flags |= if from_client { FIN_CLIENT } else { FIN_BACKEND };
        }
        let ended = rst || self.flags & (FIN_CLIENT | FIN_BACKEND) == FIN_CLIENT | FIN_BACKEND;
        if ended && !self.closed() {
            self.flags |= CLOSED;
            return true;
        }
        false
    }
}

impl Codec for Affinity {
    fn encode(&self, out: &mut Vec<u8>) {
        (self.backend, self.flags).encode(out);
    }
    fn decode(input: &mut &[u8]) -> Result<Self, CodecError> {
        let (backend, flags) = <(u16, u8)>::decode(input)?;
        if flags & !(FIN_CLIENT | FIN_BACKEND | CLOSED | ANSWERED) != 0 {
            return Err(CodecError::Invalid("lb affinity flags"));
        }
        Ok(Affinity { backend, flags })
    }
}

/// What a TCP segment means to the load balancer.
#[derive(Debug, Clone, Copy, Default)]
struct Seg {
    /// SYN without ACK: a connection attempt.
    syn: bool,
    fin: bool,
    rst: bool,
}

// ------------------------------------------------------------------------------------------
// The NF

/// Drop reasons.
pub mod reason {
    /// A TCP segment other than SYN for a least-loaded VIP with no backend chosen for its flow
    /// (StatelessNF Algorithm 1, line 13).
    pub const NO_CONNECTION: &str = "lb: no backend for this connection";
    /// A fragment to a VIP or from a backend: its ports cannot be seen, so it cannot be steered.
    pub const FRAGMENT: &str = "lb: fragment";
    /// The flow's backend choice could not be read.
    pub const STATE: &str = "lb: state unavailable";
    /// The headers to rewrite could not be read.
    pub const MALFORMED: &str = "lb: malformed";
    /// A new least-loaded connection found the table full (`max_connections`) and nothing
    /// to end early.
    pub const TABLE_FULL: &str = "lb: table full";
    /// A new connection to a VIP a reload removed (its connections go on).
    pub const NO_BACKEND: &str = "lb: VIP removed";
}

/// One worker's load balancer.
pub struct LoadBalancer {
    cfg: Arc<Compiled>,
    /// Backend choice per client → VIP flow.
    affinity: Map<FlowKey, Affinity>,
    /// Active connections per backend (this worker's; read for least-loaded).
    active: CounterMap<BackendAddr>,
    /// Connections ever assigned per backend.
    connections: CounterMap<BackendAddr>,
    /// Bytes per backend, both directions.
    bytes: CounterMap<BackendAddr>,
    /// Packets from a backend's service port that belong to no tracked flow (passed untouched).
    untracked_replies: Counter,
    /// The cap of `affinity`.
    cap: RefCell<Cap<FlowKey>>,
}

/// One backend's counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackendStats {
    /// The backend.
    pub backend: BackendAddr,
    /// Connections now active (this worker's).
    pub active: i64,
    /// Connections assigned so far.
    pub connections: i64,
    /// Bytes in both directions.
    pub bytes: i64,
}

/// Which end of a packet to rewrite.
#[derive(Clone, Copy, PartialEq, Eq)]
enum End {
    Src,
    Dst,
}

impl LoadBalancer {
    /// The counters of every configured backend.
    pub fn backend_stats(&self) -> Vec<BackendStats> {
        self.cfg
            .report
            .iter()
            .map(|&b| BackendStats {
                backend: b,
                active: self.active.get(&b).unwrap_or(-1),
                connections: self.connections.get(&b).unwrap_or(-1),
                bytes: self.bytes.get(&b).unwrap_or(-1),
            })
            .collect()
    }

    /// The backend chosen for a client → VIP flow, if any.
    pub fn backend_of(&self, flow: &FlowKey) -> Option<BackendAddr> {
        let vi = *self
            .cfg
            .services
            .get(&(flow.dst, flow.dst_port, flow.proto))?;
        let a = self.affinity.get(flow).ok()??;
        Some(
            self.cfg.vips[vi]
                .backends
                .get(usize::from(a.backend))?
                .key(),
        )
    }

    /// Number of flows with a backend choice on this worker (ended ones included until their
    /// entry expires).
    pub fn flows(&self) -> usize {
        self.affinity.cached_len()
    }

    /// Number of flows on this worker that have not ended (what the active counts add up to).
    pub fn open_flows(&self) -> usize {
        let mut n = 0;
        self.affinity.for_each(|_, a| n += usize::from(!a.closed()));
        n
    }

    /// The backend of a new connection of `flow` (an index in `vip.backends`); `None` when
    /// the VIP takes none (a reload removed it).
    fn choose(&self, vip: &Vip, flow: &FlowKey) -> Option<u16> {
        let h = flow_hash(flow);
        let n = vip.active.len();
        if n == 0 {
            return None;
        }
        let i = match &vip.table {
            Some(t) if vip.method == Method::Maglev => t.lookup(h),
            _ => {
                let start = (h % n as u64) as usize;
                let mut best = (i64::MAX, start);
                for j in 0..n {
                    let i = (start + j) % n;
                    let b = &vip.backends[usize::from(vip.active[i])];
                    let load = self.active.get(&b.key()).unwrap_or(0);
                    if load < best.0 {
                        best = (load, i);
                    }
                }
                best.1
            }
        };
        vip.active.get(i).copied()
    }

    fn timeout(&self, a: &Affinity, proto: u8) -> Duration {
        match proto {
            proto::UDP => self.cfg.udp,
            _ if a.ending() => self.cfg.tcp_fin,
            _ => self.cfg.tcp,
        }
    }

    /// A new connection of `flow` on backend `b`: stores the choice and counts it; `false`
    /// if the table is full (a `reused` entry, an ended connection's, is replaced whatever
    /// the count).
    fn assign(&self, flow: FlowKey, vip: &Vip, b: u16, now: Nanos, reused: bool) -> bool {
        if !reused
            && !self
                .cap
                .borrow_mut()
                .admit(self.affinity.cached_len(), |k| self.end_early(&k))
        {
            return false;
        }
        let a = Affinity {
            backend: b,
            flags: 0,
        };
        self.affinity.insert_nowait(flow, a);
        self.affinity
            .expire_after(&flow, self.timeout(&a, flow.proto), now);
        self.cap.borrow_mut().remember(flow);
        let key = vip.backends[usize::from(b)].key();
        self.active.add_to_nowait(&key, 1);
        self.connections.add_to_nowait(&key, 1);
        true
    }

    /// Ends the connection `k` if it is expendable (early drop); whether it did.
    fn end_early(&self, k: &FlowKey) -> bool {
        let Ok(Some(true)) = self.affinity.with(k, |a| a.map(Affinity::expendable)) else {
            return false;
        };
        let Some(a) = self.affinity.remove_nowait(k) else {
            return false;
        };
        if !a.closed() {
            self.release(k, &a);
        }
        true
    }

    /// Takes an open connection off its backend's active count.
    fn release(&self, k: &FlowKey, a: &Affinity) {
        let Some(&vi) = self.cfg.services.get(&(k.dst, k.dst_port, k.proto)) else {
            return;
        };
        if let Some(b) = self.cfg.vips[vi].backends.get(usize::from(a.backend)) {
            self.active.add_to_nowait(&b.key(), -1);
        }
    }

    /// Client → VIP.
    fn inbound(&self, pkt: &mut Packet<'_>, flow: FlowKey, vip: &Vip, now: Nanos) -> Verdict {
        let seg = match segment(pkt) {
            Ok(s) => s,
            Err(v) => return v,
        };
        // One lookup finds the choice, notes the segment and renews it. When the 5-tuple is
        // reused by a new connection the entry is left as it is, and `assign` below replaces
        // it whole (a SYN always starts a connection), so the renewal has no effect.
        let found = self.affinity.renew_with(&flow, now, |a| {
            if seg.syn && a.closed() {
                return (self.timeout(a, flow.proto), None);
            }
            let closed_now = a.note(seg.fin, seg.rst, true);
            (self.timeout(a, flow.proto), Some((*a, closed_now)))
        });
        let reused = matches!(found, Ok(Some(None)));
        let b = match found.map(Option::flatten) {
            Err(_) => return Verdict::Drop(reason::STATE),
            Ok(Some((a, closed_now))) => {
                if closed_now {
                    self.active
                        .add_to_nowait(&vip.backends[usize::from(a.backend)].key(), -1);
                    self.cap.borrow_mut().remember(flow);
                }
                a.backend
            }
            Ok(None) => {
                let starts = flow.proto != proto::TCP || seg.syn;
                match vip.method {
                    _ if starts => {
                        let Some(b) = self.choose(vip, &flow) else {
                            return Verdict::Drop(reason::NO_BACKEND);
                        };
                        // Maglev: without room the table still gives the backend (§3.3).
                        if !self.assign(flow, vip, b, now, reused)
                            && vip.method == Method::LeastLoaded
                        {
                            return Verdict::Drop(reason::TABLE_FULL);
                        }
                        b
                    }
                    Method::LeastLoaded => return Verdict::Drop(reason::NO_CONNECTION),
                    // Maglev: the table gives the same backend without the entry (§3.3), so a
                    // connection whose entry was lost carries on; a FIN or RST is passed on
                    // without creating one.
                    Method::Maglev => {
                        let Some(b) = self.choose(vip, &flow) else {
                            return Verdict::Drop(reason::NO_BACKEND);
                        };
                        if !(seg.fin || seg.rst) {
                            self.assign(flow, vip, b, now, reused);
                        }
                        b
                    }
                }
            }
        };
        let backend = &vip.backends[usize::from(b)];
        self.bytes
            .add_to_nowait(&backend.key(), pkt.data.len() as i64);
        match rewrite(pkt, End::Dst, backend.addr, backend.port) {
            Ok(()) => Verdict::Forward,
            Err(()) => Verdict::Drop(reason::MALFORMED),
        }
    }

    /// Backend → client: finds the client → VIP flow it answers.
    fn outbound(
        &self,
        pkt: &mut Packet<'_>,
        flow: FlowKey,
        candidates: &[(usize, u16)],
        now: Nanos,
    ) -> Verdict {
        let seg = match segment(pkt) {
            Ok(s) => s,
            Err(v) => return v,
        };
        for &(vi, bi) in candidates {
            let vip = &self.cfg.vips[vi];
            let client = FlowKey::new(flow.dst, vip.addr, flow.dst_port, vip.port, flow.proto);
            let found = self.affinity.with_mut(&client, |a| match a {
                Some(a) if a.backend == bi => {
                    if !a.answered() {
                        a.flags |= ANSWERED;
                    }
                    let closed_now = a.note(seg.fin, seg.rst, false);
                    Some((*a, closed_now))
                }
                _ => None,
            });
            let (a, closed_now) = match found {
                Err(_) => return Verdict::Drop(reason::STATE),
                Ok(None) => continue,
                Ok(Some(x)) => x,
            };
            let key = vip.backends[usize::from(bi)].key();
            if closed_now {
                self.active.add_to_nowait(&key, -1);
                self.cap.borrow_mut().remember(client);
            }
            // Replies renew the choice too, without a store write unless a flag changed.
            self.affinity
                .expire_after(&client, self.timeout(&a, flow.proto), now);
            self.bytes.add_to_nowait(&key, pkt.data.len() as i64);
            return match rewrite(pkt, End::Src, vip.addr, vip.port) {
                Ok(()) => Verdict::Forward,
                Err(()) => Verdict::Drop(reason::MALFORMED),
            };
        }
        self.untracked_replies.add_nowait(1);
        Verdict::Forward
    }
}

/// Reads what matters of a TCP segment (nothing for UDP).
fn segment(pkt: &Packet<'_>) -> Result<Seg, Verdict> {
    if pkt.dissection.transport != Transport::Tcp {
        return Ok(Seg::default());
    }
    let d = &pkt.dissection;
    let t = d
        .l4_offset
        .and_then(|o| pkt.data.get(o..d.l3_end))
        .and_then(|b| tcp::Packet::new_checked(b).ok())
        .ok_or(Verdict::Drop(reason::MALFORMED))?;
    Ok(Seg {
        syn: t.syn() && !t.ack(),
        fin: t.fin(),
        rst: t.rst(),
    })
}

/// Rewrites one end's address and port with incremental checksum updates (RFC 1624) and
/// updates the packet's flow key. Checks every header before changing a byte.
fn rewrite(pkt: &mut Packet<'_>, end: End, addr: IpAddr, port: u16) -> Result<(), ()> {
    let d = pkt.dissection;
    let flow = d.flow.ok_or(())?;
    let l4 = d.l4_offset.ok_or(())?;
    let data = &mut *pkt.data;
    if d.l3_offset > l4 || l4 > d.l3_end || d.l3_end > data.len() {
        return Err(());
    }
    let ok = match d.transport {
        Transport::Tcp => tcp::Packet::new_checked(&data[l4..d.l3_end]).is_ok(),
        Transport::Udp => udp::Packet::new_checked(&data[l4..d.l3_end]).is_ok(),
        _ => false,
    };
    if !ok {
        return Err(());
    }
    let old = if end == End::Src { flow.src } else { flow.dst };
    if let (IpAddr::V4(o), IpAddr::V4(a)) = (old, addr) {
        rewrite_v4(data, &d, end, o, a, port)?;
    } else {
        rewrite_any(data, &d, end, old, addr, port)?;
    }
    let mut f = flow;
    match end {
        End::Src => {
            f.src = addr;
            f.src_port = port;
        }
        End::Dst => {
            f.dst = addr;
            f.dst_port = port;
        }
    }
    pkt.dissection.flow = Some(f);
    Ok(())
}

/// [`rewrite`]'s IPv4 case on the bytes (the per-packet path): the same checks as
/// `ipv4::Packet::new_checked` and the same checksum updates, bit for bit, as the setters
/// [`rewrite_any`] calls, without their loops over slices. The transport was checked.
#[inline]
fn rewrite_v4(
    data: &mut [u8],
    d: &Dissection,
    end: End,
    old: Ipv4Addr,
    addr: Ipv4Addr,
    port: u16,
) -> Result<(), ()> {
    let l4 = d.l4_offset.ok_or(())?;
    {
        let ip = &mut data[d.l3_offset..d.l3_end];
        if ip.len() < ipv4::HEADER_LEN || ip[0] >> 4 != 4 {
            return Err(());
        }
        let hl = usize::from(ip[0] & 0x0f) * 4;
        let tl = usize::from(be16(ip, 2));
        if hl < ipv4::HEADER_LEN || ip.len() < hl || tl < hl || ip.len() < tl {
            return Err(());
        }
        let at = match end {
            End::Src => 12,
            End::Dst => 16,
        };
        let cur = [ip[at], ip[at + 1], ip[at + 2], ip[at + 3]];
        let c = checksum_update(be16(ip, 10), cur, addr.octets());
        ip[at..at + 4].copy_from_slice(&addr.octets());
        ip[10..12].copy_from_slice(&c.to_be_bytes());
    }
    let seg = &mut data[l4..d.l3_end];
    let port_at = match end {
        End::Src => 0,
        End::Dst => 2,
    };
    let old_port = be16(seg, port_at);
    if d.transport == Transport::Tcp {
        // update_checksum_for_addr, then set_{src,dst}_port.
        let c = checksum_update(be16(seg, 16), old.octets(), addr.octets());
        let c = checksum_update(c, old_port.to_be_bytes(), port.to_be_bytes());
        seg[16..18].copy_from_slice(&c.to_be_bytes());
    } else {
        // UDP: a zero checksum stays zero, a computed zero is sent as 0xffff, after each step.
        let c = be16(seg, 6);
        if c != 0 {
            let nonzero = |c: u16| if c == 0 { 0xffff } else { c };
            let c = nonzero(checksum_update(c, old.octets(), addr.octets()));
            let c = nonzero(checksum_update(
                c,
                old_port.to_be_bytes(),
                port.to_be_bytes(),
            ));
            seg[6..8].copy_from_slice(&c.to_be_bytes());
        }
    }
    seg[port_at..port_at + 2].copy_from_slice(&port.to_be_bytes());
    Ok(())
}

/// [`rewrite`] through the wire crate's setters, for any address family.
fn rewrite_any(
    data: &mut [u8],
    d: &Dissection,
    end: End,
    old: IpAddr,
    addr: IpAddr,
    port: u16,
) -> Result<(), ()> {
    let l4 = d.l4_offset.ok_or(())?;
    let (mut ob, mut nb) = ([0u8; 16], [0u8; 16]);
    let n = match (old, addr) {
        (IpAddr::V4(o), IpAddr::V4(a)) => {
            let mut ip =
                ipv4::Packet::new_checked(&mut data[d.l3_offset..d.l3_end]).map_err(|_| ())?;
            match end {
                End::Src => ip.set_src_addr(a),
                End::Dst => ip.set_dst_addr(a),
            }
            ob[..4].copy_from_slice(&o.octets());
            nb[..4].copy_from_slice(&a.octets());
            4
        }
        (IpAddr::V6(o), IpAddr::V6(a)) => {
            let mut ip =
                ipv6::Packet::new_checked(&mut data[d.l3_offset..d.l3_end]).map_err(|_| ())?;
            match end {
                End::Src => ip.set_src_addr(a),
                End::Dst => ip.set_dst_addr(a),
            }
            ob = o.octets();
            nb = a.octets();
            16
        }
        _ => return Err(()),
    };
    let seg = &mut data[l4..d.l3_end];
    if d.transport == Transport::Tcp {
        let mut t = tcp::Packet::new_unchecked(seg);
        t.update_checksum_for_addr(&ob[..n], &nb[..n]);
        match end {
            End::Src => t.set_src_port(port),
            End::Dst => t.set_dst_port(port),
        }
    } else {
        let mut u = udp::Packet::new_unchecked(seg);
        u.update_checksum_for_addr(&ob[..n], &nb[..n]);
        match end {
            End::Src => u.set_src_port(port),
            End::Dst => u.set_dst_port(port),
        }
    }
    Ok(())
}

impl NetworkFunction for LoadBalancer {
    fn name(&self) -> &str {
        NF
    }

    fn reconfigure(&mut self, config: &ReloadConfig) {
        if let Ok(c) = Arc::clone(config).downcast::<Compiled>() {
            self.cfg = c;
        }
    }

    /// Prefetches the affinity entries `process` looks up: the packet's flow for a client →
    /// VIP packet, the client flow(s) it may answer for a backend → client one.
    #[inline]
    fn prefetch(&mut self, pkt: &Packet<'_>) {
        let Some(flow) = pkt.dissection.flow else {
            return;
        };
        if pkt.dissection.fragment == Fragment::None {
            self.prefetch_flow(&flow, pkt.direction);
        }
    }

    /// The affinity entry of a client → VIP flow, or those a backend's answer may belong to.
    #[inline]
    fn prefetch_flow(&mut self, flow: &FlowKey, _: Direction) {
        let cfg = &self.cfg;
        if cfg
            .services
            .contains_key(&(flow.dst, flow.dst_port, flow.proto))
        {
            self.affinity.prefetch(flow);
        } else if let Some(c) = cfg.backends.get(&(flow.src, flow.src_port, flow.proto)) {
            for &(vi, _) in c {
                let vip = &cfg.vips[vi];
                let client = FlowKey::new(flow.dst, vip.addr, flow.dst_port, vip.port, flow.proto);
                self.affinity.prefetch(&client);
            }
        }
    }

    #[inline]
    fn process(&mut self, pkt: &mut Packet<'_>, cx: &Context) -> Verdict {
        let Some(flow) = pkt.dissection.flow else {
            return Verdict::Forward;
        };
        // Shared from here on: the configuration is borrowed, not cloned (an atomic
        // increment and decrement per packet).
        let this: &Self = self;
        let cfg = &*this.cfg;
        if pkt.dissection.fragment != Fragment::None {
            // Later fragments carry no ports: a fragment to a VIP or from a backend cannot be
            // steered consistently.
            let host = |a| (a, flow.proto);
            if cfg.vip_hosts.contains(&host(flow.dst))
                || cfg.backend_hosts.contains(&host(flow.src))
            {
                return Verdict::Drop(reason::FRAGMENT);
            }
            return Verdict::Forward;
        }
        if let Some(&vi) = cfg.services.get(&(flow.dst, flow.dst_port, flow.proto)) {
            return this.inbound(pkt, flow, &cfg.vips[vi], cx.now);
        }
        if let Some(c) = cfg.backends.get(&(flow.src, flow.src_port, flow.proto)) {
            return this.outbound(pkt, flow, c, cx.now);
        }
        Verdict::Forward
    }

    /// Client → VIP: the connection's backend choice, renewed; the destination becomes the
    /// backend's. Backend → client: the client → VIP connection it answers, renewed; the
    /// source becomes the VIP's. No such connection: `false`. Which one a flow is goes by its
    /// addresses and ports, as in `process` (the direction does not matter); a flow neither
    /// to a VIP nor from a backend passes untouched (`true`).
    fn active_until(&mut self, flow: &mut FlowKey, direction: Direction, until: Nanos) -> bool {
        let _ = direction;
        let this: &Self = self;
        let cfg = &*this.cfg;
        if let Some(&vi) = cfg.services.get(&(flow.dst, flow.dst_port, flow.proto)) {
            let proto = flow.proto;
            let renewed = this
                .affinity
                .extend_with(flow, until, |a| (this.timeout(a, proto), a.backend));
            let Ok(Some(b)) = renewed else { return false };
            let Some(backend) = cfg.vips[vi].backends.get(usize::from(b)) else {
                return false;
            };
            (flow.dst, flow.dst_port) = (backend.addr, backend.port);
            return true;
        }
        let Some(candidates) = cfg.backends.get(&(flow.src, flow.src_port, flow.proto)) else {
            return true;
        };
        for &(vi, bi) in candidates {
            let vip = &cfg.vips[vi];
            let client = FlowKey::new(flow.dst, vip.addr, flow.dst_port, vip.port, flow.proto);
            match this.affinity.with(&client, |a| a.map(|a| a.backend == bi)) {
                Ok(Some(true)) => {}
                Ok(_) => continue,
                Err(_) => return false,
            }
            let proto = flow.proto;
            let renewed = this
                .affinity
                .extend_with(&client, until, |a| (this.timeout(a, proto), ()));
            if !matches!(renewed, Ok(Some(()))) {
                return false;
            }
            (flow.src, flow.src_port) = (vip.addr, vip.port);
            return true;
        }
        // A reply of no tracked connection: it passes untouched, but the LB holds no such
        // flow, so its next packet is the chain's.
        false
    }

    fn on_tick(&mut self, now: Nanos) {
        let this = &*self;
        this.affinity.expire(now, |k, a| {
            if !a.closed() {
                this.release(&k, &a);
            }
        });
    }

    fn entries(&self) -> u64 {
        self.affinity.cached_len() as u64
    }

    fn list(&self, table: &str, now: Nanos, out: &mut Vec<Row>) {
        match table {
            "flows" => self.affinity.for_each_timed(|k, a, deadline| {
                out.push(self.cfg.flow_row(k, a, Cell::timeout(deadline, now)));
            }),
            "backends" => {
                for s in self.backend_stats() {
                    out.push(backend_row(s.backend, s.active, s.connections, s.bytes));
                }
            }
            _ => {}
        }
    }

    fn report(&self) -> Vec<(&'static str, i64)> {
        let mut out = vec![
            ("flows", self.affinity.cached_len() as i64),
            (
                "untracked_replies",
                self.untracked_replies.get().unwrap_or(-1),
            ),
        ];
        self.cap.borrow().report(&mut out);
        out
    }

    fn gauges(&self) -> &'static [&'static str] {
        &["flows", "max_connections"]
    }

    /// Per backend: `backend_active` (gauge), `backend_connections`, `backend_bytes`.
    fn report_labelled(&self) -> Vec<Labelled> {
        let mut out = Vec::with_capacity(3 * self.cfg.report.len());
        for s in self.backend_stats() {
            let value = SocketAddr::from(s.backend).to_string();
            for (name, count, gauge) in [
                ("backend_active", s.active, true),
                ("backend_connections", s.connections, false),
                ("backend_bytes", s.bytes, false),
            ] {
                out.push(Labelled {
                    name,
                    label: "backend",
                    value: value.clone(),
                    count,
                    gauge,
                });
            }
        }
        out
    }
}
