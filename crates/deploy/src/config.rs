//! The deployment file: TOML, one file per run (DESIGN "Configuration").
//!
//! ```toml
//! [input]                       # required; exactly one of `pcap` and `synthetic`
//! pcap = "traffic.pcap"         # a capture, pcap or pcapng, Ethernet link type
//! # synthetic = { profile = "mixed", flows = 10000, packets = 1000000, seed = 1 }
//! outbound_only = false         # skip the input's inbound packets (use with `reflect`)
//!
//! [output]                      # optional; default: discard
//! pcap = "out.pcap"             # or: discard = true
//!
//! # A live two-port box instead (flowstate_chain::live): both sections name an interface.
//! # [input]  interface = "fs-in"   address = "10.0.0.1"       # the inside port, the box's address
//! #          driver = "af-packet"  gateway = "10.0.0.254"     # or "af-xdp"; optional: next hop out
//! #          address6 = "fd00:1::1"  gateway6 = "fd00:1::fe"   # optional: IPv6 on the port
//! #          fast_path = true                                 # the XDP fast path (default on)
//! #          fast_path_refresh = "1s"  fast_path_capacity = 65536
//! # [output] interface = "fs-out"  address = "198.51.100.1"   # the outside port
//!
//! [runtime]                     # optional
//! workers = 2                   # default: every core (available parallelism); a live box: 1
//! batch = 32                    # packets per hand-off and per prefetch pass, 1 to 1024
//! inside = ["10.0.0.0/8", "fd00::/8"]   # sources that make a packet Outbound (this default);
//!                               # every prefix: no host bits set ("10.0.0.1/8" is refused)
//! reflect = false               # play the outside hosts (see `flowstate_chain::reflect`)
//! max_frame = 2048              # buffer per packet; longer frames are truncated
//! nice = -10                    # workers' scheduling priority, -20 to 19 (default: inherited)
//! fragment_timeout = "30s"      # IPv4 fragments (flowstate_chain::fragments): how long a datagram is
//! fragment_datagrams = 16384    # tracked, how many at once, and how many later fragments
//! fragments_held = 256          # wait for their first one (each a max_frame buffer)
//! flow_cache = false            # a fast path in each worker (flowstate_nf::stage::FlowCache): established
//! flow_cache_capacity = 1048576 # flows skip the NFs; needs every NF's consent, see there
//! flow_cache_refresh = "1s"     # an entry ends when its flow is idle this long; the NFs hear of a
//!                               # cached flow at least this often (keep it below a third of every
//!                               # NF's idle timeout; their defaults are 30s and more)
//!
//! [state]                       # optional
//! backend = "local"             # local | store | redis | redis-cluster | cassandra
//! url = "127.0.0.1:7878"        # for the backends that have an address
//! flush_interval = "1ms"        # every duration: a number and a unit ("250us", "30s", "2h4m")
//! retain_ops = 1000000          # operations kept to send again while the store is down
//! nf_instance = 0
//! # every other key is the driver's own (see its crate), checked by the binary
//!
//! [[chain]]                     # the NFs in order, from the inside to the outside
//! nf = "nat"                    # a name the NF registry knows
//! external = ["203.0.113.1"]    # every other key goes to the NF
//! # stage = 0                   # a cluster's stage (flowstate-cluster): 0 for the first
//!                               # entries, then each entry the same as the one before or
//!                               # one more; one process runs every stage as one chain
//! ```
//!
//! `synthetic` takes `profile` (long, short, mixed, uniform, scan; default mixed), `flows`,
//! `packets` (default: `flows` times the profile's typical flow size), `seed` (default 1),
//! `ipv6_share`, `tcp_share`, `zipf`, `size` (`"60"`, `"60-1514"`, `"imix"`), `rate`
//! (packets a second, for timestamps), `concurrency`, the subnets `clients_v4`,
//! `servers_v4`, `clients_v6`, `servers_v6`, `scanners` and `scan_probes` (profile `scan`),
//! `clients_only = true` to generate only the clients' packets (with `reflect`, whose
//! answers stand in for the servers'), and `per_worker = true` to have each worker generate
//! its own share instead of one generator feeding the dispatcher (see
//! [`flowstate_io::synth`] for their meaning and defaults).
//!
//! Relative paths are relative to the current directory (like most command-line tools), not to
//! the configuration file's directory.
//!
//! Parsing is strict: unknown keys are errors, and every error names the file, its line, the
//! key (as a dotted path, `runtime.workers`, `input.synthetic.flows`, `chain[1].nat.ports`:
//! entry, NF and the NF's key) and what was expected. Every section is checked on its own and
//! all their errors are reported together ([`ConfigErrors`]). Durations and prefixes are
//! spelled alike in every section ([`flowstate_config`]). Nothing in here panics on a user's
//! file.

use flowstate_chain::FragmentLimits;
use flowstate_chain::RuntimeOptions;
pub use flowstate_chain::{default_workers, DEFAULT_BATCH, DEFAULT_INSIDE, DEFAULT_MAX_FRAME};
use flowstate_cluster::ClusterSection;
use flowstate_io::synth::{Profile, SizeDist, SynthConfig};
use flowstate_nf::NfFactory;
pub use flowstate_router::{Driver, FastPathConfig, LivePort};
use serde::Deserialize;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// A configuration that cannot be used: names the file, the key and what was expected.
#[derive(Debug)]
pub struct ConfigError {
    /// The configuration file (or a name standing for it).
    pub file: PathBuf,
    /// Line of the problem (1-based), when it is known.
    pub line: Option<usize>,
    /// The key, as a dotted path (`runtime.workers`, `input.synthetic.flows`,
    /// `chain[0].nf`); empty when the file cannot be read or is not TOML.
    pub key: String,
    /// What is wrong and what was expected.
    pub reason: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file.display())?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
        }
        if !self.key.is_empty() {
            write!(f, ": {}", self.key)?;
        }
        write!(f, ": {}", self.reason)
    }
}

impl std::error::Error for ConfigError {}

/// Every error of a configuration file (at least one), in the file's order.
#[derive(Debug)]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl fmt::Display for ConfigErrors {
    /// One error a line.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigErrors {}

impl From<ConfigError> for ConfigErrors {
    fn from(e: ConfigError) -> Self {
        ConfigErrors(vec![e])
    }
}

impl std::ops::Deref for ConfigErrors {
    type Target = [ConfigError];

    fn deref(&self) -> &[ConfigError] {
        &self.0
    }
}

impl ConfigError {
    /// An error about `key` of `file`.
    pub fn new(file: &Path, key: impl Into<String>, reason: impl Into<String>) -> Self {
        ConfigError {
            file: file.to_owned(),
            line: None,
            key: key.into(),
            reason: reason.into(),
        }
    }
}

/// A parsed, validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// The file it came from (for messages).
    pub file: PathBuf,
    /// Where packets come from.
    pub input: Input,
    /// Skip the input's inbound packets (`[input] outbound_only`): with `reflect`, the outside
    /// hosts' side of a recorded trace is replaced by the reflect stage's replies.
    pub outbound_only: bool,
    /// Where forwarded packets go.
    pub output: Output,
    /// Workers, batching, direction, reflect.
    pub runtime: RuntimeSection,
    /// The state store.
    pub state: StateSection,
    /// The NFs, in order from the inside to the outside.
    pub chain: Vec<ChainEntry>,
    /// `[cluster]`: the deployment of many instances (`None`: one process).
    pub cluster: Option<ClusterSection>,
    /// `[fastpath]`: HyperSFC's table pipeline, run instead of `[[chain]]`
    /// ([`crate::pipeline`]).
    pub fastpath: Option<flowstate_fastpath::config::FastpathConfig>,
    /// `[telemetry]`: where a long-running process serves its metrics.
    pub telemetry: TelemetrySection,
}

/// `[telemetry]`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TelemetrySection {
    /// `listen`: the address of the metrics and JSON API listener (`None`: no listener).
    /// `"HOST:PORT"` as given, or a bare port (`"9464"`), which means loopback.
    pub listen: Option<std::net::SocketAddr>,
    /// `token_file`: a file holding the bearer token every endpoint but `/healthz` then
    /// requires (`None`: anyone who reaches the listener is answered). Read when the listener
    /// starts.
    pub token_file: Option<PathBuf>,
}

/// A listener address: `HOST:PORT`, or a bare port (`9464`, `:9464`) meaning loopback.
pub fn parse_listen(s: &str) -> Result<std::net::SocketAddr, String> {
    let t = s.trim();
    if let Ok(a) = t.parse::<std::net::SocketAddr>() {
        return Ok(a);
    }
    let port = t.strip_prefix(':').unwrap_or(t);
    let port = port.strip_prefix("localhost:").unwrap_or(port);
    port.parse::<u16>()
        .map(|p| std::net::SocketAddr::new(std::net::Ipv4Addr::LOCALHOST.into(), p))
        .map_err(|_| {
            format!("expected an address and port (\"127.0.0.1:9464\") or a port (9464), got {s:?}")
        })
}

/// `[input]`.
#[derive(Debug, Clone, PartialEq)]
pub enum Input {
    /// A capture file (pcap or pcapng).
    Pcap(PathBuf),
    /// Generated traffic.
    Synthetic(SyntheticInput),
    /// The inside port of a live box (the outside port is [`Output::Interface`]).
    Interface(LivePort),
}

/// Default `[input] fast_path_refresh`.
pub const DEFAULT_FAST_PATH_REFRESH: Duration = Duration::from_secs(1);
/// Default `[input] fast_path_capacity`.
pub const DEFAULT_FAST_PATH_CAPACITY: u32 = 1 << 16;
/// Longest `[input] fast_path_refresh` (`flowstate_fastpath::flowcache::MAX_REFRESH`; that module is
/// Linux-only, this file is not).
pub const MAX_FAST_PATH_REFRESH: Duration = Duration::from_secs(60);
/// Largest `[input] fast_path_capacity` (`flowstate_fastpath::flowcache::MAX_CAPACITY`).
pub const MAX_FAST_PATH_CAPACITY: u32 = 1 << 24;

// The configuration's limits are the fast path's own.
#[cfg(target_os = "linux")]
const _: () = assert!(
    MAX_FAST_PATH_REFRESH.as_nanos() == flowstate_fastpath::flowcache::MAX_REFRESH.as_nanos()
        && MAX_FAST_PATH_CAPACITY == flowstate_fastpath::flowcache::MAX_CAPACITY
);

/// `[input] synthetic = { ... }`.
#[derive(Debug, Clone, PartialEq)]
pub struct SyntheticInput {
    /// The whole trace.
    pub config: SynthConfig,
    /// Each worker generates its own share (no dispatcher between traffic and workers, like
    /// NIC RSS) instead of one generator feeding the dispatcher.
    pub per_worker: bool,
}

/// `[output]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    /// Write forwarded packets to a pcap file (nanosecond timestamps).
    Pcap(PathBuf),
    /// Count them and drop them.
    Discard,
    /// The outside port of a live box (needs [`Input::Interface`]).
    Interface(LivePort),
}

/// `[runtime]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeSection {
    /// Worker threads (default: the machine's available parallelism; 1 for a live box, which
    /// then runs to completion, see `flowstate_chain::live`).
    pub workers: usize,
    /// Packets per batch.
    pub batch: usize,
    /// Source prefixes of the inside: a packet from one of them is Outbound, others Inbound
    /// (see [`RuntimeSection::inside_prefixes`] for the data path's form).
    pub inside: Vec<flowstate_config::IpNet>,
    /// Whether the reflect stage answers outbound packets.
    pub reflect: bool,
    /// Buffer size per packet: longer frames are truncated (and then usually malformed).
    pub max_frame: usize,
    /// The workers' nice value (`None`: the process's own). A live box shares its cores with
    /// other processes: a lower value shortens the wait between a frame's arrival and the
    /// worker running (the kernel's own forwarding runs in softirq context, ahead of every
    /// process). Lowering it needs CAP_SYS_NICE.
    pub nice: Option<i32>,
    /// Bounds of the IPv4 fragment tracker (`fragment_timeout`, `fragment_datagrams`,
    /// `fragments_held`).
    pub fragments: FragmentLimits,
    /// Each worker's flow cache (`flow_cache`, `flow_cache_capacity`, `flow_cache_refresh`;
    /// [`flowstate_nf::stage::FlowCache`]); `None`: off, the default.
    pub flow_cache: Option<flowstate_nf::stage::FlowCacheOptions>,
}

/// Largest `[runtime] fragment_datagrams`.
pub const MAX_FRAGMENT_DATAGRAMS: usize = 1 << 24;
/// Largest `[runtime] fragments_held`.
pub const MAX_FRAGMENTS_HELD: usize = 1 << 16;

/// Largest `[runtime] batch`.
pub const MAX_BATCH: usize = 1024;
/// Largest `[runtime] workers`.
pub const MAX_WORKERS: usize = 1024;

impl Default for RuntimeSection {
    fn default() -> Self {
        RuntimeSection {
            workers: default_workers(),
            batch: DEFAULT_BATCH,
            inside: default_inside(),
            reflect: false,
            max_frame: DEFAULT_MAX_FRAME,
            nice: None,
            fragments: FragmentLimits::default(),
            flow_cache: None,
        }
    }
}

/// [`DEFAULT_INSIDE`] parsed.
pub fn default_inside() -> Vec<flowstate_config::IpNet> {
    DEFAULT_INSIDE
        .iter()
        .filter_map(|s| s.parse().ok())
        .collect()
}

impl RuntimeSection {
    /// The inside prefixes as the steering matches them (host bits cleared).
    pub fn inside_prefixes(&self) -> Vec<flowstate_config::IpNet> {
        self.inside.iter().map(|n| n.trunc()).collect()
    }
}

/// State backends a configuration may name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    /// The in-process store (`flowstate_state::local`).
    Local,
    /// flowstate's own store server.
    Store,
    /// Redis.
    Redis,
    /// Redis Cluster.
    RedisCluster,
    /// Cassandra.
    Cassandra,
}

impl BackendKind {
    /// Every backend with its configuration name.
    pub const ALL: [(BackendKind, &'static str); 5] = [
        (BackendKind::Local, "local"),
        (BackendKind::Store, "store"),
        (BackendKind::Redis, "redis"),
        (BackendKind::RedisCluster, "redis-cluster"),
        (BackendKind::Cassandra, "cassandra"),
    ];

    /// The name in configuration.
    pub fn name(self) -> &'static str {
        BackendKind::ALL
            .iter()
            .find(|(k, _)| *k == self)
            .map_or("?", |(_, n)| n)
    }
}

/// `[state]`.
#[derive(Debug, Clone, PartialEq)]
pub struct StateSection {
    /// Which store.
    pub backend: BackendKind,
    /// The store's address, for backends that have one.
    pub url: Option<String>,
    /// How often queued changes go to the store.
    pub flush_interval: Duration,
    /// Operations of failed flushes kept (per worker) to send again when the store answers.
    pub retain_ops: usize,
    /// This NF instance's id (state keys carry it).
    pub nf_instance: u32,
    /// Every other key of `[state]`: the driver's own settings, which the binary hands to the
    /// driver it builds (DESIGN "Layout": this crate depends on no driver).
    pub options: toml::Table,
}

impl Default for StateSection {
    fn default() -> Self {
        StateSection {
            backend: BackendKind::Local,
            url: None,
            flush_interval: Duration::from_millis(1),
            retain_ops: flowstate_state::StateConfig::default().retain_ops,
            nf_instance: 0,
            options: toml::Table::new(),
        }
    }
}

impl StateSection {
    /// The `[state]` section of configuration `text` alone (a key with a bad value at its
    /// default), when it reads as a table of the right shape: a driver's settings can be
    /// checked in a file whose other sections are wrong.
    pub fn from_text(text: &str) -> Option<StateSection> {
        let mut r = Report {
            file: Path::new(""),
            text,
            errors: Vec::new(),
        };
        r.section::<OnlyState>().map(|s| state(&mut r, s.state))
    }
}

/// One `[[chain]]` entry.
#[derive(Debug, Clone, PartialEq)]
pub struct ChainEntry {
    /// The NF's name in the registry.
    pub nf: String,
    /// The cluster stage it runs in (`stage`, default 0): stages are numbered from 0 in
    /// chain order, without gaps.
    pub stage: u32,
    /// Every other key of the table: the NF's own options.
    pub options: toml::Table,
}

// ---------------------------------------------------------------------------------------------
// Raw shapes, as serde reads them. Leaves that need more than a type check stay strings and are
// validated afterwards, where the key is known exactly.

/// The sections a file may have.
const SECTIONS: [&str; 8] = [
    "input",
    "output",
    "runtime",
    "state",
    "chain",
    "cluster",
    "fastpath",
    "telemetry",
];

// Each section is read from the text on its own (`Only*` ignores the others), so that one
// section's error does not hide another's, and serde's errors keep their position in the text.

#[derive(Deserialize)]
struct OnlyInput {
    input: Option<RawInput>,
}

#[derive(Deserialize)]
struct OnlyOutput {
    output: Option<RawOutput>,
}

#[derive(Deserialize)]
struct OnlyRuntime {
    runtime: Option<RawRuntime>,
}

#[derive(Deserialize)]
struct OnlyState {
    state: Option<RawState>,
}

#[derive(Deserialize)]
struct OnlyTelemetry {
    telemetry: Option<RawTelemetry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTelemetry {
    listen: Option<String>,
    token_file: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawInput {
    pcap: Option<String>,
    synthetic: Option<RawSynthetic>,
    outbound_only: Option<bool>,
    interface: Option<String>,
    address: Option<String>,
    gateway: Option<String>,
    address6: Option<String>,
    gateway6: Option<String>,
    driver: Option<String>,
    fast_path: Option<bool>,
    fast_path_refresh: Option<toml::Value>,
    fast_path_capacity: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSynthetic {
    profile: Option<String>,
    flows: Option<u64>,
    packets: Option<u64>,
    seed: Option<u64>,
    ipv6_share: Option<f64>,
    tcp_share: Option<f64>,
    zipf: Option<f64>,
    size: Option<String>,
    rate: Option<f64>,
    concurrency: Option<u64>,
    clients_v4: Option<String>,
    servers_v4: Option<String>,
    clients_v6: Option<String>,
    servers_v6: Option<String>,
    scanners: Option<u64>,
    scan_probes: Option<u64>,
    clients_only: Option<bool>,
    per_worker: Option<bool>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawOutput {
    pcap: Option<String>,
    discard: Option<bool>,
    interface: Option<String>,
    address: Option<String>,
    gateway: Option<String>,
    address6: Option<String>,
    gateway6: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRuntime {
    workers: Option<i64>,
    batch: Option<i64>,
    inside: Option<Vec<String>>,
    reflect: Option<bool>,
    max_frame: Option<i64>,
    nice: Option<i64>,
    fragment_timeout: Option<toml::Value>,
    fragment_datagrams: Option<i64>,
    fragments_held: Option<i64>,
    flow_cache: Option<bool>,
    flow_cache_capacity: Option<i64>,
    flow_cache_refresh: Option<toml::Value>,
}

#[derive(Deserialize)]
struct RawState {
    backend: Option<String>,
    url: Option<String>,
    flush_interval: Option<toml::Value>,
    retain_ops: Option<i64>,
    nf_instance: Option<u32>,
    #[serde(flatten)]
    options: toml::Table,
}

/// The errors found so far in one file; each gets the line of its key.
struct Report<'a> {
    file: &'a Path,
    text: &'a str,
    errors: Vec<ConfigError>,
}

impl Report<'_> {
    /// Adds `e`, with the line of its key when it has none.
    fn add(&mut self, mut e: ConfigError) {
        if e.line.is_none() && !e.key.is_empty() {
            e.line = flowstate_config::line_of(self.text, &e.key);
        }
        self.errors.push(e);
    }

    fn error(&mut self, key: &str, reason: impl Into<String>) {
        self.add(ConfigError::new(self.file, key, reason));
    }

    /// `Some(v)`, or `None` with the error added.
    fn take<T>(&mut self, r: Result<T, ConfigError>) -> Option<T> {
        r.map_err(|e| self.add(e)).ok()
    }

    /// Reads one section (an `Only*` shape) from the text; `None` when it does not read.
    fn section<T: serde::de::DeserializeOwned>(&mut self) -> Option<T> {
        match toml::from_str::<T>(self.text) {
            Ok(t) => Some(t),
            Err(e) => {
                let e = toml_error(self.file, self.text, &e);
                self.errors.push(e);
                None
            }
        }
    }
}

/// A `toml` error with the line and the key at its position.
fn toml_error(file: &Path, text: &str, e: &toml::de::Error) -> ConfigError {
    let (line, key) = match e.span() {
        Some(span) => {
            let (line, key) = locate(text, span.start);
            (Some(line), key)
        }
        None => (None, String::new()),
    };
    ConfigError {
        file: file.to_owned(),
        line,
        key,
        reason: e.message().trim().replace('\n', "; "),
    }
}

impl Config {
    /// Reads and validates the file at `path`: every error it has (see [`Config::parse`]).
    pub fn load(path: impl AsRef<Path>) -> Result<Config, ConfigErrors> {
        let path = path.as_ref();
        let text = flowstate_config::read_text(path)
            .map_err(|e| ConfigError::new(path, "", format!("cannot read: {e}")))?;
        Config::parse(&text, path)
    }

    /// Validates `text`; `file` names it in errors. Every section that can be checked on
    /// its own is, and the errors of all of them are returned together, in the order of the
    /// sections in this function; each [`[[chain]]`](ChainEntry) entry's NF options are checked
    /// by building its factory from the NF registry (an IPS reads its rule files). A TOML
    /// syntax error is the one error (the parser stops there).
    pub fn parse(text: &str, file: impl AsRef<Path>) -> Result<Config, ConfigErrors> {
        let file = file.as_ref();
        let table: toml::Table =
            toml::from_str(text).map_err(|e| ConfigErrors::from(toml_error(file, text, &e)))?;
        let mut r = Report {
            file,
            text,
            errors: Vec::new(),
        };
        for k in table.keys() {
            if !SECTIONS.contains(&k.as_str()) {
                r.error(
                    k,
                    format!("unknown section; expected one of {}", SECTIONS.join(", ")),
                );
            }
        }

        // [input] and [output]
        let raw_input = r.section::<OnlyInput>().map(|s| s.input);
        let raw_output = r.section::<OnlyOutput>().map(|s| s.output);
        let ports = match (raw_input, raw_output) {
            (Some(input), Some(output)) => r.take(ports(file, input, output)),
            _ => None,
        };

        // [runtime]
        let live = matches!(ports, Some((Input::Interface(_), _, _)));
        let runtime = r
            .section::<OnlyRuntime>()
            .map(|s| runtime(&mut r, s.runtime, live));

        // [state]
        let state = r.section::<OnlyState>().map(|s| state(&mut r, s.state));

        // [[chain]]
        let chain = chain(&mut r, table.get("chain"));

        // [fastpath]
        let fastpath = match table.get("fastpath") {
            None => None,
            Some(_) if !chain.is_empty() => {
                r.error(
                    "fastpath",
                    "give [[chain]] NFs or a [fastpath] table pipeline, not both",
                );
                None
            }
            Some(v) => match flowstate_fastpath::config::FastpathConfig::from_value(v.clone()) {
                Ok(f) => Some(f),
                Err(errors) => {
                    for (key, reason) in errors {
                        r.error(&key, reason);
                    }
                    None
                }
            },
        };

        // [telemetry]
        let mut telemetry = TelemetrySection::default();
        if let Some(t) = r.section::<OnlyTelemetry>().and_then(|s| s.telemetry) {
            if let Some(l) = t.listen {
                match parse_listen(&l) {
                    Ok(a) => telemetry.listen = Some(a),
                    Err(reason) => r.error("telemetry.listen", reason),
                }
            }
            match t.token_file {
                Some(f) if f.is_empty() => {
                    r.error("telemetry.token_file", "expected a file name, got \"\"")
                }
                f => telemetry.token_file = f.map(PathBuf::from),
            }
        }

        let cluster = match table.get("cluster") {
            None => None,
            Some(toml::Value::Table(t)) => match ClusterSection::from_table(t) {
                Ok(c) => Some(c),
                Err(errors) => {
                    for (key, reason) in errors {
                        r.error(&key, reason);
                    }
                    None
                }
            },
            Some(other) => {
                r.error(
                    "cluster",
                    format!("expected a [cluster] table, got {}", other.type_str()),
                );
                None
            }
        };

        // The NFs' own options, each entry on its own.
        for (i, e) in &chain {
            if let Err(errors) = entry_factory(file, text, *i, e) {
                r.errors.extend(errors);
            }
        }

        match (ports, runtime, state) {
            (Some((input, outbound_only, output)), Some(runtime), Some(state))
                if r.errors.is_empty() =>
            {
                Ok(Config {
                    file: file.to_owned(),
                    input,
                    outbound_only,
                    output,
                    runtime,
                    state,
                    chain: chain.into_iter().map(|(_, e)| e).collect(),
                    cluster,
                    fastpath,
                    telemetry,
                })
            }
            _ => {
                // In the file's order (errors without a line last).
                r.errors.sort_by_key(|e| e.line.unwrap_or(usize::MAX));
                Err(ConfigErrors(r.errors))
            }
        }
    }

    /// The factories of the chain, from the NF registry. Errors name the entry, the NF and
    /// its key (`chain[1].nat.udp`); every entry's are returned.
    pub fn factories(&self) -> Result<Vec<Arc<dyn NfFactory>>, ConfigErrors> {
        // Lines were given when the file was parsed, which checked the same options.
        let text = "";
        let mut factories = Vec::with_capacity(self.chain.len());
        let mut errors = Vec::new();
        for (i, e) in self.chain.iter().enumerate() {
            match entry_factory(&self.file, text, i, e) {
                Ok(f) => factories.push(f),
                Err(e) => errors.extend(e),
            }
        }
        if errors.is_empty() {
            Ok(factories)
        } else {
            Err(ConfigErrors(errors))
        }
    }

    /// The runtime's options on one host, as the file asks.
    pub fn runtime_options(&self) -> RuntimeOptions {
        RuntimeOptions {
            workers: self.runtime.workers,
            batch: self.runtime.batch,
            max_frame: self.runtime.max_frame,
            inside: self.runtime.inside_prefixes(),
            reflect: self.runtime.reflect,
            outbound_only: self.outbound_only,
            instance: self.state.nf_instance,
            flush_interval: self.state.flush_interval,
            retain_ops: self.state.retain_ops,
            nice: self.runtime.nice,
            fragments: self.runtime.fragments,
            flow_cache: self.runtime.flow_cache,
            ..RuntimeOptions::default()
        }
    }

    /// The cluster stages (1 when no entry names one).
    pub fn stages(&self) -> u32 {
        self.chain.last().map_or(1, |e| e.stage + 1)
    }

    /// The factories of each stage, in stage order (see [`Config::factories`]).
    pub fn stage_factories(&self) -> Result<Vec<Vec<Arc<dyn NfFactory>>>, ConfigErrors> {
        let mut stages = vec![Vec::new(); self.stages() as usize];
        for (e, f) in self.chain.iter().zip(self.factories()?) {
            stages[e.stage as usize].push(f);
        }
        Ok(stages)
    }
}

/// Builds entry `i`'s factory; its errors are keyed `chain[i].NF.KEY` and carry the line of
/// `chain[i].KEY` in `text` (when `text` is the file's).
fn entry_factory(
    file: &Path,
    text: &str,
    i: usize,
    e: &ChainEntry,
) -> Result<Arc<dyn NfFactory>, Vec<ConfigError>> {
    let error = |key: &str, reason: String| {
        let (shown, at) = match key {
            "" => (format!("chain[{i}].{}", e.nf), format!("chain[{i}]")),
            "nf" => (format!("chain[{i}].nf"), format!("chain[{i}].nf")),
            k => (
                format!("chain[{i}].{}.{k}", e.nf),
                format!("chain[{i}].{k}"),
            ),
        };
        ConfigError {
            file: file.to_owned(),
            line: flowstate_config::line_of(text, &at),
            key: shown,
            reason,
        }
    };
    flowstate_nf::registry::factory(&e.nf, &e.options).map_err(|b| {
        b.config_errors()
            .into_iter()
            .map(|(key, reason)| {
                // A key that is not a dotted path (`(table)`, `[[chain]]`) names the entry.
                let path = key.bytes().all(|c| {
                    c.is_ascii_alphanumeric() || matches!(c, b'_' | b'-' | b'.' | b'[' | b']')
                });
                error(if path { &key } else { "" }, reason)
            })
            .collect()
    })
}

/// `[input]` and `[output]`: where packets come from and go (checked together: a live box
/// names an interface in both).
fn ports(
    file: &Path,
    input: Option<RawInput>,
    mut output: Option<RawOutput>,
) -> Result<(Input, bool, Output), ConfigError> {
    let err = |key: &str, reason: String| ConfigError::new(file, key, reason);
    let Some(input) = input else {
        return Err(err(
            "input",
            "missing [input] section: expected `pcap = \"FILE\"` or `synthetic = { profile = \"mixed\", ... }`"
                .into(),
        ));
    };
    let outbound_only = input.outbound_only.unwrap_or(false);
    let (live_in, live_out) = live_ports(file, &input, &mut output)?;
    let input = match (input.pcap, input.synthetic, live_in) {
        (None, None, Some(p)) => Input::Interface(p),
        (Some(_), Some(_), _) => {
            return Err(err(
                "input",
                "give one of `pcap` and `synthetic`, not both".into(),
            ))
        }
        (None, None, None) => {
            return Err(err(
                "input",
                "expected `pcap = \"FILE\"` or `synthetic = { profile = \"mixed\", ... }`".into(),
            ))
        }
        (Some(p), None, _) => {
            if p.is_empty() {
                return Err(err("input.pcap", "expected a file name, got \"\"".into()));
            }
            Input::Pcap(PathBuf::from(p))
        }
        (None, Some(s), _) => Input::Synthetic(synthetic(s, file)?),
    };
    let output = match output {
        None => Output::Discard,
        Some(RawOutput {
            pcap: Some(_),
            discard: Some(true),
            ..
        }) => {
            return Err(err(
                "output",
                "give one of `pcap` and `discard = true`, not both".into(),
            ))
        }
        Some(RawOutput {
            pcap: Some(p),
            discard: _,
            ..
        }) => {
            if p.is_empty() {
                return Err(err("output.pcap", "expected a file name, got \"\"".into()));
            }
            Output::Pcap(PathBuf::from(p))
        }
        Some(RawOutput {
            pcap: None,
            discard: Some(true),
            ..
        }) => Output::Discard,
        Some(RawOutput { pcap: None, .. }) => {
            return Err(err(
                "output",
                "expected `pcap = \"FILE\"` or `discard = true`".into(),
            ))
        }
    };
    let output = live_out.map_or(output, Output::Interface);
    if let (Input::Pcap(i), Output::Pcap(o)) = (&input, &output) {
        let same =
            i == o || matches!((i.canonicalize(), o.canonicalize()), (Ok(a), Ok(b)) if a == b);
        if same {
            return Err(err(
                "output.pcap",
                format!(
                    "{} is the input file; writing it would destroy the input",
                    o.display()
                ),
            ));
        }
    }
    Ok((input, outbound_only, output))
}

/// `[runtime]`; every bad key is reported (and left at its default).
fn runtime(r: &mut Report<'_>, raw: Option<RawRuntime>, live: bool) -> RuntimeSection {
    let mut runtime = RuntimeSection::default();
    if live {
        // A live box runs one worker to completion unless told otherwise (flowstate_chain::live).
        runtime.workers = 1;
    }
    let Some(raw) = raw else {
        return runtime;
    };
    if let Some(w) = raw.workers {
        match in_range(w, 1, MAX_WORKERS) {
            Some(w) => runtime.workers = w,
            None => r.error(
                "runtime.workers",
                format!("expected 1 to {MAX_WORKERS}, got {w}"),
            ),
        }
    }
    if let Some(b) = raw.batch {
        match in_range(b, 1, MAX_BATCH) {
            Some(b) => runtime.batch = b,
            None => r.error(
                "runtime.batch",
                format!("expected 1 to {MAX_BATCH}, got {b}"),
            ),
        }
    }
    if let Some(n) = raw.nice {
        if (-20..=19).contains(&n) {
            runtime.nice = Some(n as i32);
        } else {
            r.error("runtime.nice", format!("expected -20 to 19, got {n}"));
        }
    }
    if let Some(m) = raw.max_frame {
        match in_range(m, 64, 65_536 + 18) {
            Some(m) => runtime.max_frame = m,
            None => r.error(
                "runtime.max_frame",
                format!("expected 64 to 65554 bytes, got {m}"),
            ),
        }
    }
    if let Some(inside) = raw.inside {
        runtime.inside = Vec::with_capacity(inside.len());
        for (i, s) in inside.iter().enumerate() {
            match flowstate_config::parse_prefix(s) {
                Ok(p) => runtime.inside.push(p),
                Err(reason) => r.error(&format!("runtime.inside[{i}]"), reason),
            }
        }
    }
    if let Some(d) = raw.fragment_timeout {
        match flowstate_config::duration_value(&d) {
            Ok(d) if !d.is_zero() => runtime.fragments.timeout = d,
            Ok(_) => r.error("runtime.fragment_timeout", "expected more than zero"),
            Err(reason) => r.error("runtime.fragment_timeout", reason),
        }
    }
    if let Some(n) = raw.fragment_datagrams {
        match in_range(n, 1, MAX_FRAGMENT_DATAGRAMS) {
            Some(n) => runtime.fragments.datagrams = n,
            None => r.error(
                "runtime.fragment_datagrams",
                format!("expected 1 to {MAX_FRAGMENT_DATAGRAMS}, got {n}"),
            ),
        }
    }
    if let Some(n) = raw.fragments_held {
        match in_range(n, 1, MAX_FRAGMENTS_HELD) {
            Some(n) => runtime.fragments.held = n,
            None => r.error(
                "runtime.fragments_held",
                format!("expected 1 to {MAX_FRAGMENTS_HELD}, got {n}"),
            ),
        }
    }
    let mut cache = flowstate_nf::stage::FlowCacheOptions {
        capacity: flowstate_nf::stage::DEFAULT_CAPACITY,
        refresh: flowstate_nf::stage::DEFAULT_REFRESH,
    };
    if let Some(n) = raw.flow_cache_capacity {
        let (min, max) = (
            flowstate_nf::stage::MIN_CAPACITY,
            flowstate_nf::stage::MAX_CAPACITY,
        );
        match in_range(n, min, max) {
            Some(n) => cache.capacity = n,
            None => r.error(
                "runtime.flow_cache_capacity",
                format!("expected {min} to {max}, got {n}"),
            ),
        }
    }
    if let Some(d) = raw.flow_cache_refresh {
        let max = flowstate_nf::stage::MAX_REFRESH;
        match flowstate_config::duration_value(&d) {
            Ok(d) if d >= Duration::from_millis(4) && d <= max => cache.refresh = d,
            Ok(d) => r.error(
                "runtime.flow_cache_refresh",
                format!("expected 4ms to {}s, got {d:?}", max.as_secs()),
            ),
            Err(reason) => r.error("runtime.flow_cache_refresh", reason),
        }
    }
    runtime.flow_cache = raw.flow_cache.unwrap_or(false).then_some(cache);
    if live && runtime.flow_cache.is_some() {
        r.error(
            "runtime.flow_cache",
            "a live box's fast path is XDP's: [input] fast_path",
        );
    }
    runtime.reflect = raw.reflect.unwrap_or(false);
    runtime
}

/// `[state]`; every bad key is reported.
fn state(r: &mut Report<'_>, raw: Option<RawState>) -> StateSection {
    let mut state = StateSection::default();
    let Some(s) = raw else {
        return state;
    };
    if let Some(b) = s.backend {
        match BackendKind::ALL.iter().find(|(_, n)| *n == b) {
            Some((k, _)) => state.backend = *k,
            None => {
                let known: Vec<_> = BackendKind::ALL.iter().map(|(_, n)| *n).collect();
                r.error(
                    "state.backend",
                    format!(
                        "unknown backend {b:?}; expected one of {}",
                        known.join(", ")
                    ),
                );
            }
        }
    }
    state.url = s.url;
    if let Some(d) = s.flush_interval {
        match flowstate_config::duration_value(&d) {
            Ok(d) => state.flush_interval = d,
            Err(reason) => r.error("state.flush_interval", reason),
        }
    }
    if let Some(n) = s.retain_ops {
        match usize::try_from(n) {
            Ok(n) => state.retain_ops = n,
            Err(_) => r.error(
                "state.retain_ops",
                format!("{n} is negative; expected a count"),
            ),
        }
    }
    if let Some(i) = s.nf_instance {
        state.nf_instance = i;
    }
    state.options = s.options;
    state
}

/// `[[chain]]`: the entries that name their NF, with their index (every bad one reported),
/// and their stages.
fn chain(r: &mut Report<'_>, raw: Option<&toml::Value>) -> Vec<(usize, ChainEntry)> {
    let entries = match raw {
        None => return Vec::new(),
        Some(toml::Value::Array(a)) => a,
        Some(other) => {
            r.error(
                "chain",
                format!("expected [[chain]] tables, got {}", other.type_str()),
            );
            return Vec::new();
        }
    };
    let mut chain = Vec::with_capacity(entries.len());
    for (i, entry) in entries.iter().enumerate() {
        let Some(table) = entry.as_table() else {
            r.error(
                &format!("chain[{i}]"),
                format!("expected a table, got {}", entry.type_str()),
            );
            continue;
        };
        let mut table = table.clone();
        let stage = match table.remove("stage") {
            None => Some(0),
            Some(toml::Value::Integer(n)) if (0..=255).contains(&n) => Some(n as u32),
            Some(other) => {
                r.error(
                    &format!("chain[{i}].stage"),
                    format!("expected a stage number from 0 to 255, got {other}"),
                );
                None
            }
        };
        let key = format!("chain[{i}].nf");
        let nf = match table.remove("nf") {
            Some(toml::Value::String(nf)) if !nf.is_empty() => Some(nf),
            Some(other) => {
                r.error(
                    &key,
                    format!("expected an NF name, got {}", other.type_str()),
                );
                None
            }
            None => {
                r.error(
                    &key,
                    format!(
                        "missing: every [[chain]] entry names its NF (known: {})",
                        flowstate_nf::registry::names()
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                );
                None
            }
        };
        if let (Some(nf), Some(stage)) = (nf, stage) {
            chain.push((
                i,
                ChainEntry {
                    nf,
                    stage,
                    options: table,
                },
            ));
        }
    }
    if chain.len() != entries.len() {
        // Stages are checked once every entry has one.
        return chain;
    }
    let mut last = 0;
    for (i, e) in &chain {
        let want = if *i == 0 { 0..=0 } else { last..=last + 1 };
        if !want.contains(&e.stage) {
            r.error(
                &format!("chain[{i}].stage"),
                format!(
                    "stage {} after stage {last}: stages are numbered from 0 in chain order, each entry the same as the one before or one more",
                    e.stage
                ),
            );
        }
        last = e.stage;
    }
    chain
}

fn in_range(v: i64, lo: usize, hi: usize) -> Option<usize> {
    usize::try_from(v).ok().filter(|v| (lo..=hi).contains(v))
}

fn synthetic(s: RawSynthetic, file: &Path) -> Result<SyntheticInput, ConfigError> {
    let key = |k: &str| format!("input.synthetic.{k}");
    let profile: Profile = match &s.profile {
        Some(p) => p.parse().map_err(|_| {
            ConfigError::new(
                file,
                key("profile"),
                format!("unknown profile {p:?}; expected one of long, short, mixed, uniform, scan"),
            )
        })?,
        None => Profile::Mixed,
    };
    let mut c = SynthConfig::new(profile);
    c.seed = s.seed.unwrap_or(1);
    if let Some(f) = s.flows {
        c.flows = f;
        if s.packets.is_none() {
            c.packets = f.saturating_mul(profile.typical_packets_per_flow());
        }
    }
    if let Some(p) = s.packets {
        c.packets = p;
    }
    if let Some(v) = s.ipv6_share {
        c.ipv6_share = v;
    }
    if let Some(v) = s.tcp_share {
        c.tcp_share = v;
    }
    if let Some(v) = s.zipf {
        c.zipf_s = v;
    }
    if let Some(v) = &s.size {
        c.packet_size = v
            .parse::<SizeDist>()
            .map_err(|e| ConfigError::new(file, key("size"), option_reason(&e)))?;
    }
    if let Some(v) = s.rate {
        c.rate_pps = v;
    }
    if let Some(v) = s.concurrency {
        c.concurrency = v;
    }
    if let Some(v) = s.scanners {
        c.scanners = v;
    }
    if let Some(v) = s.scan_probes {
        c.scan_probes = v;
    }
    c.clients_only = s.clients_only.unwrap_or(false);
    let subnet_err = |k: &str, reason: String| ConfigError::new(file, key(k), reason);
    let v4 = |k: &str, v: &str| flowstate_config::parse_prefix_v4(v).map_err(|r| subnet_err(k, r));
    let v6 = |k: &str, v: &str| flowstate_config::parse_prefix_v6(v).map_err(|r| subnet_err(k, r));
    if let Some(v) = &s.clients_v4 {
        c.clients_v4 = v4("clients_v4", v)?;
    }
    if let Some(v) = &s.servers_v4 {
        c.servers_v4 = v4("servers_v4", v)?;
    }
    if let Some(v) = &s.clients_v6 {
        c.clients_v6 = v6("clients_v6", v)?;
    }
    if let Some(v) = &s.servers_v6 {
        c.servers_v6 = v6("servers_v6", v)?;
    }
    c.validate().map_err(|e| {
        let name = match &e {
            flowstate_io::Error::Option { name, .. } => match *name {
                "packet_size" => "size",
                "rate_pps" => "rate",
                "zipf_s" => "zipf",
                n => n,
            },
            _ => "",
        };
        ConfigError::new(file, key(name), option_reason(&e))
    })?;
    Ok(SyntheticInput {
        config: c,
        per_worker: s.per_worker.unwrap_or(false),
    })
}

fn option_reason(e: &flowstate_io::Error) -> String {
    match e {
        flowstate_io::Error::Option { reason, .. } => reason.clone(),
        other => other.to_string(),
    }
}

/// Finds the line (1-based) and the dotted key path at byte `pos` of `text`: the table header
/// in force there (`[runtime]`, the n-th `[[chain]]`) and the key (or inline-table keys) on the
/// line up to `pos`. Best effort: a TOML layout it does not follow yields a shorter path.
fn locate(text: &str, pos: usize) -> (usize, String) {
    let pos = pos.min(text.len());
    let pos = (0..=pos)
        .rev()
        .find(|&p| text.is_char_boundary(p))
        .unwrap_or(0);
    let before = &text[..pos];
    let line_no = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);

    // The header in force: the last `[x]` or `[[x]]` line before this one (or this one, when the
    // position is inside the header itself).
    let mut header = String::new();
    let mut arrays: Vec<(String, usize)> = Vec::new();
    for line in text[..line_start].lines() {
        let l = line.trim();
        if let Some(name) = l.strip_prefix("[[").and_then(|r| r.split("]]").next()) {
            let name = name.trim().to_owned();
            let n = match arrays.iter_mut().find(|(k, _)| *k == name) {
                Some((_, n)) => {
                    *n += 1;
                    *n
                }
                None => {
                    arrays.push((name.clone(), 0));
                    0
                }
            };
            header = format!("{name}[{n}]");
        } else if let Some(name) = l.strip_prefix('[').and_then(|r| r.split(']').next()) {
            header = name.trim().to_owned();
        }
    }
    let line = &text[line_start..];
    let line = &line[..line.find('\n').unwrap_or(line.len())];
    let in_line = pos - line_start;
    let trimmed = line.trim_start();
    if trimmed.starts_with('[') {
        // The position is on a header: the key is the header's name.
        let name = trimmed
            .trim_start_matches('[')
            .split(']')
            .next()
            .unwrap_or("")
            .trim();
        return (line_no, name.to_owned());
    }

    // Keys on this line up to the position, with inline-table nesting.
    let is_ident = |c: u8| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'-' | b'.');
    let mut path: Vec<String> = Vec::new();
    // For each open inline table, the path length at its `{`.
    let mut bases: Vec<usize> = vec![0];
    let bytes = line.as_bytes();
    let mut i = 0;
    while i < bytes.len() && i <= in_line {
        let c = bytes[i];
        if c == b'"' || c == b'\'' {
            // Skip a string (basic strings may escape the quote).
            i += 1;
            while i < bytes.len() && bytes[i] != c {
                if c == b'"' && bytes[i] == b'\\' {
                    i += 1;
                }
                i += 1;
            }
            i += 1;
            continue;
        }
        if is_ident(c) {
            let start = i;
            while i < bytes.len() && is_ident(bytes[i]) {
                i += 1;
            }
            let rest = line[i..].trim_start();
            if rest.starts_with('=') && !rest.starts_with("==") {
                path.truncate(bases.last().copied().unwrap_or(0));
                path.push(line[start..i].to_owned());
            }
            if (start..i).contains(&in_line) {
                break;
            }
            continue;
        }
        match c {
            b'{' => bases.push(path.len()),
            b'}' if bases.len() > 1 => {
                if let Some(base) = bases.pop() {
                    path.truncate(base);
                }
            }
            b'#' => break,
            _ => {}
        }
        i += 1;
    }
    let mut key = header;
    for k in path {
        if !key.is_empty() {
            key.push('.');
        }
        key.push_str(&k);
    }
    (line_no, key)
}

/// The live box's ports, when `[input]` and `[output]` name interfaces: checks that both do,
/// that nothing else is given beside them, and takes `[output]` out of the way (`None`) so that
/// the file/discard parsing sees no output section.
fn live_ports(
    file: &Path,
    input: &RawInput,
    output: &mut Option<RawOutput>,
) -> Result<(Option<LivePort>, Option<LivePort>), ConfigError> {
    let err = |key: &str, reason: &str| ConfigError::new(file, key, reason.to_owned());
    let driver = match input.driver.as_deref() {
        None | Some("af-packet") => Driver::AfPacket,
        Some("af-xdp") => Driver::AfXdp,
        Some(d) => {
            return Err(err(
                "input.driver",
                &format!("expected \"af-packet\" or \"af-xdp\", got {d:?}"),
            ))
        }
    };
    let fast_path = fast_path(file, input)?;
    let only_live = "only for a live box: give `interface` too";
    let live_in = match &input.interface {
        Some(_) if input.pcap.is_some() || input.synthetic.is_some() => {
            return Err(err(
                "input",
                "give one of `pcap`, `synthetic` and `interface`, not several",
            ))
        }
        Some(i) => Some(live_port(
            file,
            "input",
            PortKeys {
                interface: i.clone(),
                address: input.address.clone(),
                gateway: input.gateway.clone(),
                address6: input.address6.clone(),
                gateway6: input.gateway6.clone(),
            },
            driver,
        )?)
        .map(|p| LivePort { fast_path, ..p }),
        None if input.address.is_some() => return Err(err("input.address", only_live)),
        None if input.fast_path.is_some() => return Err(err("input.fast_path", only_live)),
        None if input.gateway.is_some() => return Err(err("input.gateway", only_live)),
        None if input.address6.is_some() => return Err(err("input.address6", only_live)),
        None if input.gateway6.is_some() => return Err(err("input.gateway6", only_live)),
        None => None,
    };
    let live_out = match output.as_ref() {
        Some(o) if o.interface.is_some() => {
            if o.pcap.is_some() || o.discard.is_some() {
                return Err(err(
                    "output",
                    "give one of `pcap`, `discard = true` and `interface`, not several",
                ));
            }
            Some(live_port(
                file,
                "output",
                PortKeys {
                    interface: o.interface.clone().unwrap_or_default(),
                    address: o.address.clone(),
                    gateway: o.gateway.clone(),
                    address6: o.address6.clone(),
                    gateway6: o.gateway6.clone(),
                },
                driver,
            )?)
            .map(|p| LivePort { fast_path, ..p })
        }
        Some(o) if o.address.is_some() => return Err(err("output.address", only_live)),
        Some(o) if o.gateway.is_some() => return Err(err("output.gateway", only_live)),
        Some(o) if o.address6.is_some() => return Err(err("output.address6", only_live)),
        Some(o) if o.gateway6.is_some() => return Err(err("output.gateway6", only_live)),
        _ => None,
    };
    match (&live_in, &live_out) {
        (Some(_), None) => Err(err(
            "output.interface",
            "missing: a live box needs its outside port, e.g. [output] interface = \"fs-out\"",
        )),
        (None, Some(_)) => Err(err(
            "input.interface",
            "missing: a live box needs its inside port, e.g. [input] interface = \"fs-in\"",
        )),
        (Some(_), Some(_)) => {
            *output = None;
            Ok((live_in, live_out))
        }
        (None, None) => Ok((None, None)),
    }
}

/// `[input] fast_path*`: on unless `fast_path = false`.
fn fast_path(file: &Path, input: &RawInput) -> Result<Option<FastPathConfig>, ConfigError> {
    let err = |key: &str, reason: String| ConfigError::new(file, key, reason);
    let on = input.fast_path.unwrap_or(true);
    let refresh = match &input.fast_path_refresh {
        None => DEFAULT_FAST_PATH_REFRESH,
        Some(v) => flowstate_config::duration_value(v)
            .and_then(|d| {
                if !d.is_zero() && d <= MAX_FAST_PATH_REFRESH {
                    Ok(d)
                } else {
                    Err(format!(
                        "expected a duration above 0 and at most {MAX_FAST_PATH_REFRESH:?}, \
                         e.g. \"1s\", got {v}"
                    ))
                }
            })
            .map_err(|reason| err("input.fast_path_refresh", reason))?,
    };
    let capacity = match input.fast_path_capacity {
        None => DEFAULT_FAST_PATH_CAPACITY,
        Some(c) if (1..=u64::from(MAX_FAST_PATH_CAPACITY)).contains(&c) => c as u32,
        Some(c) => {
            return Err(err(
                "input.fast_path_capacity",
                format!("expected 1 to {MAX_FAST_PATH_CAPACITY}, got {c}"),
            ))
        }
    };
    Ok(on.then_some(FastPathConfig {
        refresh,
        capacity,
        required: input.fast_path == Some(true),
    }))
}

/// A live port's keys as written.
struct PortKeys {
    interface: String,
    address: Option<String>,
    gateway: Option<String>,
    address6: Option<String>,
    gateway6: Option<String>,
}

/// Checks one live port's keys (`section` is `input` or `output`).
fn live_port(
    file: &Path,
    section: &str,
    keys: PortKeys,
    driver: Driver,
) -> Result<LivePort, ConfigError> {
    let err =
        |key: &str, reason: String| ConfigError::new(file, format!("{section}.{key}"), reason);
    let PortKeys {
        interface,
        address,
        gateway,
        address6,
        gateway6,
    } = keys;
    if interface.is_empty() || interface.len() > 15 || interface.contains(['/', ' ', '\0']) {
        return Err(err(
            "interface",
            format!("expected an interface name (1 to 15 characters), got {interface:?}"),
        ));
    }
    let ip = |key: &str, v: &str| {
        v.parse::<std::net::Ipv4Addr>()
            .map_err(|_| err(key, format!("expected an IPv4 address, got {v:?}")))
    };
    let ip6 = |key: &str, v: &str| match v.parse::<std::net::Ipv6Addr>() {
        Ok(a) if !a.is_multicast() && !a.is_unspecified() => Ok(a),
        _ => Err(err(
            key,
            format!("expected a unicast IPv6 address, got {v:?}"),
        )),
    };
    let Some(address) = address else {
        return Err(err(
            "address",
            "missing: the box's IPv4 address on this port (answered in ARP), e.g. address = \"10.0.0.1\"".into(),
        ));
    };
    if gateway6.is_some() && address6.is_none() {
        return Err(err(
            "gateway6",
            "needs address6: the box's IPv6 address on this port".into(),
        ));
    }
    Ok(LivePort {
        interface,
        address: ip("address", &address)?,
        gateway: gateway.map(|g| ip("gateway", &g)).transpose()?,
        address6: address6.map(|a| ip6("address6", &a)).transpose()?,
        gateway6: gateway6.map(|g| ip6("gateway6", &g)).transpose()?,
        driver,
        fast_path: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fastpath_pipeline_stands_instead_of_nfs() {
        let table =
            "[fastpath]\n[[fastpath.table]]\nname = \"t\"\nkind = \"exact\"\nkey = [\"proto\"]\n";
        let input = "[input]\nsynthetic = { profile = \"mixed\", flows = 10 }\n";
        let c = Config::parse(&format!("{input}{table}"), "f.toml").unwrap();
        assert_eq!(c.fastpath.as_ref().unwrap().pipeline.tables.len(), 1);
        let e = Config::parse(
            &format!("{input}[[chain]]\nnf = \"nat\"\n{table}"),
            "f.toml",
        )
        .unwrap_err();
        assert!(e.iter().any(|e| e.key == "fastpath"), "{e}");
        let e = Config::parse(&format!("{input}{table}cache = -1\n"), "f.toml").unwrap_err();
        assert_eq!(e[0].key, "fastpath.table[0]", "{e}");
        assert_eq!(e[0].line, Some(4), "{e}");
        let e = Config::parse(&format!("{input}{table}kind2 = 1\n"), "f.toml").unwrap_err();
        assert!(
            e[0].key == "fastpath.table[0]" && e[0].reason.contains("kind2"),
            "{e}"
        );
    }

    #[test]
    fn telemetry_listen_is_an_address_or_a_loopback_port() {
        let input = "[input]\nsynthetic = { profile = \"mixed\", flows = 10 }\n";
        let c = Config::parse(input, "f.toml").unwrap();
        assert_eq!(c.telemetry.listen, None);
        let c = Config::parse(
            &format!("{input}[telemetry]\nlisten = \"9464\"\n"),
            "f.toml",
        )
        .unwrap();
        assert_eq!(c.telemetry.listen, Some("127.0.0.1:9464".parse().unwrap()));
        let c = Config::parse(
            &format!("{input}[telemetry]\nlisten = \"0.0.0.0:9100\"\n"),
            "f.toml",
        )
        .unwrap();
        assert_eq!(c.telemetry.listen, Some("0.0.0.0:9100".parse().unwrap()));
        for bad in ["\"nowhere\"", "\"1.2.3.4\"", "9464"] {
            let e = Config::parse(&format!("{input}[telemetry]\nlisten = {bad}\n"), "f.toml")
                .unwrap_err();
            assert_eq!(e[0].key, "telemetry.listen", "{bad}: {e}");
        }
        let e = Config::parse(&format!("{input}[telemetry]\nport = 1\n"), "f.toml").unwrap_err();
        assert!(e.to_string().contains("port"), "{e}");
        let c = Config::parse(
            &format!("{input}[telemetry]\ntoken_file = \"/etc/flowstate/token\"\n"),
            "f.toml",
        )
        .unwrap();
        assert_eq!(
            c.telemetry.token_file,
            Some(PathBuf::from("/etc/flowstate/token"))
        );
        let e = Config::parse(
            &format!("{input}[telemetry]\ntoken_file = \"\"\n"),
            "f.toml",
        )
        .unwrap_err();
        assert_eq!(e[0].key, "telemetry.token_file", "{e}");
    }

    #[test]
    fn locate_finds_keys() {
        let t = "[input]\nsynthetic = { profile = \"m\", flows = -3 }\n[runtime]\nworkers = \"x\"\n[[chain]]\nnf = \"a\"\n[[chain]]\nnf = 3\n";
        let at = |needle: &str| locate(t, t.find(needle).unwrap());
        assert_eq!(at("-3"), (2, "input.synthetic.flows".into()));
        assert_eq!(at("\"m\""), (2, "input.synthetic.profile".into()));
        assert_eq!(at("\"x\""), (4, "runtime.workers".into()));
        assert_eq!(at("workers"), (4, "runtime.workers".into()));
        assert_eq!(at("3\n"), (8, "chain[1].nf".into()));
        assert_eq!(at("runtime"), (3, "runtime".into()));
    }
}
