//! flowstate's state store server (`flowstate store`): the externalized state store of CHC
//! §4.3 and StatelessNF §4, speaking [`flowstate_proto`] over TCP.
//!
//! ```no_run
//! use flowstate_store::{Config, Server};
//!
//! let server = Server::start(Config::default()).unwrap(); // 127.0.0.1:7878, in memory
//! println!("listening on {}", server.local_addr());
//! server.wait();
//! ```
//!
//! Promises:
//! * **Semantics**: every operation of the state API behaves exactly as in the in-process
//!   store (`flowstate_state::local`): time to live per object and per map field, leases,
//!   compare-and-set, wrong-kind errors; the store passes the backend conformance suite
//!   through `flowstate-driver-store`. Operations on one object run in the order a connection
//!   sent them, and a read sees every earlier update (CHC §4.3).
//! * **Threads**: objects are sharded by a hash of their key over [`Config::shards`] threads;
//!   each object is owned by exactly one thread and its data is touched by no other (no locks
//!   on object data, CHC §4.3 "datastore threads"). The shard threads also own the
//!   connections: an accept thread hands each new connection to a shard thread in turn, and
//!   every shard thread runs an event loop (`epoll` through `mio`) over its connections. In
//!   one turn of the loop a shard reads what every ready connection sent, applies each whole
//!   frame whose operations it owns right there, writes one log record group for the turn,
//!   and then writes each connection's answers with one `write` (no thread hop and no channel
//!   for a request whose operations the connection's own shard owns, which is every request
//!   with one shard). Operations owned by another
//!   shard go to it in one message per destination shard per turn, and their answers come
//!   back the same way and are merged in request order, so a client may pipeline any number
//!   of requests (up to [`Config::max_inflight`] waiting on other shards) and gets its answers
//!   in order. A client that does not read its answers is not read from once more than
//!   [`Config::max_output`] bytes wait for it. Shard threads can be pinned to CPUs
//!   ([`Config::cpus`]).
//! * **Robustness**: nothing a client sends can panic the server. A malformed frame, a bad
//!   version or too many operations get an error frame and the connection goes on; an
//!   oversize or unreadable length gets an error frame and the connection closes. Other
//!   clients are never affected.
//! * **Extensions** (beyond the state API, CHC §4.3, §5.1, §5.3; StatelessNF §4.1):
//!   ack-only (non-blocking) batches; idempotent batches (a client id and an increasing op id:
//!   a retransmission is answered as the first time and applied once); clock-tagged updates
//!   applied once per (instance, object, clock); ownership of per-flow objects with a
//!   handover operation; subscriptions that push an object's new value when another
//!   connection changes it; expiry notifications to exactly one subscriber of the key.
//! * **Durability** ([`Config::data_dir`]): each shard writes a write-ahead log record of a
//!   batch's updates before it answers (the records of one turn of its loop in one write,
//!   before any answer of that turn is sent to a client or to another shard), and checkpoints periodically (CHC §5.4). After the
//!   process is killed (`kill -9`) and restarted, the store holds every acknowledged update
//!   exactly once. Without a data directory it runs purely in memory. A store that cannot
//!   write its log exits (status 74) rather than acknowledge updates it could lose.
//!   Idempotency state (each client's last op id) is logged and checkpointed; the answers
//!   kept for retransmissions are not, so a batch applied before a crash and sent again after
//!   it is answered [`Failure::Duplicate`](flowstate_proto::Failure::Duplicate) per operation.
//!   A fenced batch over several shards (with an op id) is applied whole or not at all across
//!   a crash: the record of its fence's shard carries its other parts, and the start applies
//!   those a crash cut off (`recovered_parts`).
//! * **Security**: [`Config::default`] binds 127.0.0.1 (beyond loopback without a token, the
//!   start warns); with [`Config::token`] a client must present the token in its first frame
//!   (at most 64 KiB, nothing reserved for a larger one) or is refused. With [`Config::tls`]
//!   the store serves TLS only (rustls, TLS 1.2 and 1.3, its certificate chain and key from
//!   PEM files, read at start: a bad file stops the start with an error naming it); the token
//!   works beside it, inside the TLS session. A client that speaks the plain protocol to a TLS
//!   store gets one plain error frame saying so and is closed; other connections go on.
//! * **Bounded memory**: connections, frame size, batch size, in-flight requests and unsent
//!   output per connection are limited; the answer of one batch is at most one frame
//!   ([`flowstate_proto::Limits::max_frame`]: the operations after the one that passes it are
//!   not run and answered so); a connection without its first frame after
//!   [`Config::handshake_timeout`] is closed (and, optionally, one idle for
//!   [`Config::idle_timeout`]); the idempotency state kept for client ids
//!   ([`Config::max_clients`], [`Config::max_reply_cache`]), the objects
//!   ([`Config::max_objects`]) and their items ([`Config::max_items`]) are bounded. Per connection the store holds at most about
//!   `max_frame` of input, `max_output + max_frame` of output and `max_inflight` requests
//!   (and operations of their batches) waiting.
//! * **Metrics**: a `Stats` request answers ops/s by type, connections, objects, memory and
//!   WAL lag ([`Server::stats`]).

mod clients;
mod conn;
mod shard;
mod wal;
mod worker;

pub use flowstate_config::Secret;
pub use wal::RecoveryError;

use flowstate_proto::{ErrorCode, Frame, Limits, Message, OP_NAMES};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Settings of a [`Server`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Where to listen (default `127.0.0.1:7878`; port 0 picks a free one).
    pub listen: SocketAddr,
    /// Where the log and checkpoints go; `None`: in memory only.
    pub data_dir: Option<PathBuf>,
    /// A shared token clients must present; `None`: no authentication (warned about when
    /// the store listens beyond loopback without TLS).
    pub token: Option<Secret>,
    /// Shard threads (0: one per core, at most 8). A data directory keeps the count it was
    /// created with.
    pub shards: usize,
    /// Frame and batch limits.
    pub limits: Limits,
    /// Most open connections.
    pub max_connections: usize,
    /// Most requests of one connection, and most operations of their batches, waiting for
    /// other shards' answers (or behind one that does); the connection's further requests are
    /// not read until some are answered.
    pub max_inflight: usize,
    /// Most bytes of answers and pushes waiting to be sent to one connection before the store
    /// stops reading that connection's requests (backpressure on a client that does not
    /// read). Pushes alone (subscriptions) to a connection with more than eight times this
    /// waiting close it as too slow.
    pub max_output: usize,
    /// CPUs to pin the shard threads to (shard `i` on `cpus[i % cpus.len()]`, Linux only);
    /// empty: not pinned.
    pub cpus: Vec<usize>,
    /// Most objects (spread evenly over the shards; default 10,000,000); `None`: no limit.
    pub max_objects: Option<usize>,
    /// Most items of one object (list items, set members, map fields; default 16,777,216); an
    /// operation that would add one more is refused. `None`: no limit. (A value is at most one
    /// frame.)
    pub max_items: Option<usize>,
    /// A connection that has not sent a whole first frame (with [`Config::token`]: a hello
    /// with the token) by then is closed (default 10 s): silent connections cannot hold the
    /// connection limit.
    pub handshake_timeout: Duration,
    /// A connection that sent nothing for this long and waits for nothing (no answer owed, no
    /// subscription) is closed; `None` (the default): never. The store driver reconnects.
    pub idle_timeout: Option<Duration>,
    /// Most bytes of answers kept to answer retransmitted batches again, over all clients
    /// (spread evenly over the shards; default 64 MiB); beyond it the oldest are dropped, and
    /// a retransmission of a batch whose answer was dropped is answered
    /// [`Failure::Duplicate`](flowstate_proto::Failure::Duplicate) per operation, as after a
    /// restart.
    pub max_reply_cache: usize,
    /// Most client ids whose idempotency state (last op id, kept answers) is held (spread
    /// evenly over the shards; default 65,536); beyond it the least recently active are
    /// forgotten, and such a client's retransmission of a batch would be applied again.
    pub max_clients: usize,
    /// Start even when a log is damaged before its end: keep its records before the damage,
    /// cut the rest and keep the whole damaged file beside (`….wal.corrupt`).
    pub salvage_log: bool,
    /// Time between checkpoints of a shard that has logged something.
    pub checkpoint_interval: Duration,
    /// Log size that triggers a checkpoint.
    pub checkpoint_bytes: u64,
    /// `fdatasync` every log write (survives machine crashes, not only process crashes).
    pub sync: bool,
    /// Serve TLS with this certificate and key; `None`: plain TCP.
    pub tls: Option<TlsFiles>,
}

/// The PEM files a TLS store serves with ([`Config::tls`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// The certificate chain, the store's own first.
    pub cert: PathBuf,
    /// Its private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: SocketAddr::from(([127, 0, 0, 1], flowstate_proto::DEFAULT_PORT)),
            data_dir: None,
            token: None,
            shards: 0,
            limits: Limits::default(),
            max_connections: 1024,
            max_inflight: 4096,
            max_output: 4 << 20,
            cpus: Vec::new(),
            max_objects: Some(10_000_000),
            max_items: Some(16 << 20),
            handshake_timeout: Duration::from_secs(10),
            idle_timeout: None,
            max_reply_cache: 64 << 20,
            max_clients: 65_536,
            salvage_log: false,
            checkpoint_interval: Duration::from_secs(60),
            checkpoint_bytes: 256 << 20,
            sync: false,
            tls: None,
        }
    }
}

/// Why the server cannot start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The address cannot be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// What happened.
        source: std::io::Error,
    },
    /// The data directory cannot be used.
    #[error(transparent)]
    Recovery(#[from] RecoveryError),
    /// A thread cannot be started.
    #[error("cannot start a thread: {0}")]
    Thread(std::io::Error),
    /// A shard's event loop (`epoll`) cannot be made.
    #[error("cannot start an event loop: {0}")]
    Poll(std::io::Error),
    /// [`Config::cpus`] names a CPU this process may not run on.
    #[error("cpus: this process may not run on CPU {0}")]
    Cpu(usize),
    /// A TLS file cannot be used (`which` is `tls-cert` or `tls-key`).
    #[error("{which}: {path}: {reason}")]
    Tls {
        /// Which file.
        which: &'static str,
        /// Its path.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
}

/// The TLS configuration of [`Config::tls`]: the files read and checked now.
fn server_tls(files: &TlsFiles) -> Result<Arc<rustls::ServerConfig>, StartError> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let bad = |which: &'static str, path: &PathBuf, reason: String| StartError::Tls {
        which,
        path: path.clone(),
        reason,
    };
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&files.cert)
        .and_then(|i| i.collect::<Result<_, _>>())
        .map_err(|e| bad("tls-cert", &files.cert, e.to_string()))?;
    if certs.is_empty() {
        return Err(bad(
            "tls-cert",
            &files.cert,
            "no PEM certificate (-----BEGIN CERTIFICATE-----) in it".into(),
        ));
    }
    let key = PrivateKeyDer::from_pem_file(&files.key)
        .map_err(|e| bad("tls-key", &files.key, format!("no PEM private key: {e}")))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| bad("tls-cert", &files.cert, e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| {
            bad(
                "tls-key",
                &files.key,
                format!("does not go with the certificate: {e}"),
            )
        })?;
    Ok(Arc::new(config))
}

/// Counters shared by every thread.
pub(crate) struct Metrics {
    pub(crate) ops: [AtomicU64; OP_NAMES.len()],
    pub(crate) objects: Vec<AtomicU64>,
    pub(crate) wal_bytes: Vec<AtomicU64>,
    /// Per shard: client ids with idempotency state, bytes of answers kept for them.
    pub(crate) clients: Vec<AtomicU64>,
    pub(crate) kept_answer_bytes: Vec<AtomicU64>,
    pub(crate) connections: AtomicUsize,
    pub(crate) connections_total: AtomicU64,
    pub(crate) errors: AtomicU64,
    pub(crate) duplicates: AtomicU64,
    pub(crate) notifications: AtomicU64,
    pub(crate) checkpoints: AtomicU64,
    /// Connections closed by the handshake or idle timeout.
    pub(crate) timeouts: AtomicU64,
    /// Batches whose answers passed the largest frame (their later operations not run).
    pub(crate) answers_cut: AtomicU64,
    /// Answers kept for retransmissions dropped to stay under [`Config::max_reply_cache`].
    pub(crate) replies_dropped: AtomicU64,
    /// Client ids whose idempotency state was forgotten ([`Config::max_clients`]).
    pub(crate) clients_forgotten: AtomicU64,
    /// Op counts and time of the previous stats request, for rates.
    last: Mutex<(Instant, [u64; OP_NAMES.len()])>,
    started: Instant,
}

/// Where to send work to a shard thread: its inbox and the waker of its event loop.
pub(crate) struct ShardHandle {
    pub(crate) tx: Sender<worker::Msg>,
    pub(crate) waker: mio::Waker,
}

impl ShardHandle {
    /// Puts `m` in the shard's inbox and wakes its loop; gives `m` back if the shard stopped.
    pub(crate) fn send(&self, m: worker::Msg) -> Result<(), worker::Msg> {
        self.tx.send(m).map_err(|e| e.0)?;
        let _ = self.waker.wake();
        Ok(())
    }
}

pub(crate) struct Shared {
    pub(crate) config: Config,
    /// The TLS configuration of every connection, when [`Config::tls`] is set.
    pub(crate) tls: Option<Arc<rustls::ServerConfig>>,
    pub(crate) shards: Vec<ShardHandle>,
    /// Objects of one partition are placed together ([`Shared::shard_of`]).
    by_partition: bool,
    pub(crate) metrics: Arc<Metrics>,
    recovered_records: u64,
    /// Bytes cut from the logs at the start (torn tails, or salvaged damage).
    log_bytes_cut: u64,
    /// Parts of fenced batches applied at the start (their shard had not logged them).
    recovered_parts: u64,
    /// Time the recovery from the data directory took, µs.
    recovery_us: u64,
}

impl Shared {
    /// The shard that owns `key` (FNV-1a: stable across restarts, as the log needs). Every
    /// object of one partition, `nf@I@C@Kind@id` whatever its NF, hashes by its `@I@C@`
    /// alone, so a partition's commit (a cluster instance's, with its ownership record,
    /// `cluster@I@C@Value@owner`) runs on one shard, atomically with its fence
    /// ([`flowstate_proto::Command::Fence`]); other keys hash whole.
    pub(crate) fn shard_of(&self, key: &[u8]) -> usize {
        if self.shards.len() == 1 {
            return 0;
        }
        let hashed = match self.by_partition {
            true => partition_tag(key).unwrap_or(key),
            false => key,
        };
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in hashed {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        (h % self.shards.len() as u64) as usize
    }
}

/// The `@I@C@` of a partition's key `nf@I@C@Kind@id` (two decimal numbers), if it is one.
fn partition_tag(key: &[u8]) -> Option<&[u8]> {
    let number = |b: &[u8]| !b.is_empty() && b.len() <= 10 && b.iter().all(u8::is_ascii_digit);
    let start = key.iter().position(|&b| b == b'@')?;
    let mut at = start + 1;
    for _ in 0..2 {
        let len = key.get(at..)?.iter().position(|&b| b == b'@')?;
        if !number(&key[at..at + len]) {
            return None;
        }
        at += len + 1;
    }
    key.get(start..at)
}

/// Wall-clock time since the Unix epoch: deadlines and leases persist across restarts.
pub(crate) fn now() -> Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
}

/// The numbers a `Stats` request answers: `ops_<type>` (total), `ops_per_sec_<type>` and
/// `ops_per_sec` (since the previous stats request, or the start), `connections`,
/// `connections_total`, `objects`, `memory_bytes` (resident set), `wal_lag_bytes` (log bytes a
/// restart would replay), `clients` and `kept_answer_bytes` (client ids with idempotency
/// state, and the bytes of answers kept for their retransmissions), `checkpoints`, `errors` (error frames sent), `duplicates`
/// (retransmitted batches not applied again), `notifications`, `timeouts` (connections closed
/// by the handshake or idle timeout), `answers_cut` (batches whose answers passed the largest
/// frame), `replies_dropped` and `clients_forgotten` (idempotency state let go to stay
/// bounded), `shards`, `uptime_ms`,
/// `recovered_records`, `log_bytes_cut` (bytes cut from the logs at the start: torn tails, or
/// damage salvaged), `recovered_parts` (parts of fenced batches over several shards a crash
/// had cut off, applied at the start), `recovery_us` (the time reading the data directory took
/// at start).
pub(crate) fn stats(shared: &Shared) -> Vec<(String, u64)> {
    let m = &shared.metrics;
    let mut v = Vec::with_capacity(64);
    let counts: [u64; OP_NAMES.len()] = std::array::from_fn(|i| m.ops[i].load(Ordering::Relaxed));
    let (secs, before) = {
        let mut last = m.last.lock().unwrap_or_else(PoisonError::into_inner);
        let secs = last.0.elapsed().as_secs_f64().max(1e-3);
        let before = last.1;
        *last = (Instant::now(), counts);
        (secs, before)
    };
    let mut total_rate = 0.0;
    for (i, name) in OP_NAMES.iter().enumerate() {
        let rate = counts[i].saturating_sub(before[i]) as f64 / secs;
        total_rate += rate;
        v.push((format!("ops_{name}"), counts[i]));
        v.push((format!("ops_per_sec_{name}"), rate as u64));
    }
    v.push(("ops_per_sec".into(), total_rate as u64));
    v.push((
        "connections".into(),
        m.connections.load(Ordering::Relaxed) as u64,
    ));
    v.push((
        "connections_total".into(),
        m.connections_total.load(Ordering::Relaxed),
    ));
    let sum = |a: &[AtomicU64]| a.iter().map(|x| x.load(Ordering::Relaxed)).sum::<u64>();
    v.push(("objects".into(), sum(&m.objects)));
    v.push(("memory_bytes".into(), resident_bytes()));
    v.push(("wal_lag_bytes".into(), sum(&m.wal_bytes)));
    v.push(("clients".into(), sum(&m.clients)));
    v.push(("kept_answer_bytes".into(), sum(&m.kept_answer_bytes)));
    v.push(("checkpoints".into(), m.checkpoints.load(Ordering::Relaxed)));
    v.push(("errors".into(), m.errors.load(Ordering::Relaxed)));
    v.push(("duplicates".into(), m.duplicates.load(Ordering::Relaxed)));
    v.push((
        "notifications".into(),
        m.notifications.load(Ordering::Relaxed),
    ));
    for (name, c) in [
        ("timeouts", &m.timeouts),
        ("answers_cut", &m.answers_cut),
        ("replies_dropped", &m.replies_dropped),
        ("clients_forgotten", &m.clients_forgotten),
    ] {
        v.push((name.into(), c.load(Ordering::Relaxed)));
    }
    v.push(("shards".into(), shared.shards.len() as u64));
    v.push((
        "uptime_ms".into(),
        u64::try_from(m.started.elapsed().as_millis()).unwrap_or(u64::MAX),
    ));
    v.push(("recovered_records".into(), shared.recovered_records));
    v.push(("log_bytes_cut".into(), shared.log_bytes_cut));
    v.push(("recovered_parts".into(), shared.recovered_parts));
    v.push(("recovery_us".into(), shared.recovery_us));
    v
}

/// Resident memory of this process (Linux `/proc/self/statm`; 0 elsewhere).
fn resident_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * 4096)
}

/// A handle on a running store's counters ([`Server::counters`]).
#[derive(Clone)]
pub struct CountersHandle {
    metrics: Arc<Metrics>,
    shards: usize,
}

impl std::fmt::Debug for CountersHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CountersHandle").finish_non_exhaustive()
    }
}

/// The store's counters at one moment ([`CountersHandle::read`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Counters {
    /// Operations applied since the start, by type (every name of `OP_NAMES`).
    pub ops: Vec<(&'static str, u64)>,
    /// Open connections.
    pub connections: u64,
    /// Connections accepted since the start.
    pub connections_total: u64,
    /// Objects held.
    pub objects: u64,
    /// Log bytes a restart would replay.
    pub wal_lag_bytes: u64,
    /// Checkpoints written.
    pub checkpoints: u64,
    /// Error frames sent.
    pub errors: u64,
    /// Retransmitted batches not applied again.
    pub duplicates: u64,
    /// Notifications (callbacks) sent.
    pub notifications: u64,
    /// Shard threads.
    pub shards: u64,
    /// Resident memory, bytes.
    pub memory_bytes: u64,
    /// Seconds since the start.
    pub uptime_s: f64,
}

impl CountersHandle {
    /// The counters now.
    pub fn read(&self) -> Counters {
        let m = &self.metrics;
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let sum = |a: &[AtomicU64]| a.iter().map(l).sum::<u64>();
        Counters {
            ops: OP_NAMES
                .iter()
                .zip(&m.ops)
                .map(|(n, c)| (*n, l(c)))
                .collect(),
            connections: m.connections.load(Ordering::Relaxed) as u64,
            connections_total: l(&m.connections_total),
            objects: sum(&m.objects),
            wal_lag_bytes: sum(&m.wal_bytes),
            checkpoints: l(&m.checkpoints),
            errors: l(&m.errors),
            duplicates: l(&m.duplicates),
            notifications: l(&m.notifications),
            shards: self.shards as u64,
            memory_bytes: resident_bytes(),
            uptime_s: m.started.elapsed().as_secs_f64(),
        }
    }
}

/// A running store.
pub struct Server {
    addr: SocketAddr,
    shared: Arc<Shared>,
    stop: Arc<AtomicBool>,
    acceptor: Option<JoinHandle<()>>,
    workers: Vec<JoinHandle<()>>,
}

impl Server {
    /// Recovers the data directory (if any), binds, and starts serving on background threads.
    pub fn start(config: Config) -> Result<Server, StartError> {
        let mut config = config;
        if let Some(&cpu) = config.cpus.iter().find(|&&c| !cpu_allowed(c)) {
            return Err(StartError::Cpu(cpu));
        }
        let mut by_partition = true;
        let mut shards = if config.shards == 0 {
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1)
                .min(8)
        } else {
            config.shards
        };
        if let Some(dir) = &config.data_dir {
            wal::create_private_dir(dir).map_err(|source| RecoveryError::Io {
                path: dir.clone(),
                source,
            })?;
            match wal::stored_shards(dir)? {
                Some((n, placed)) if n > 0 => {
                    shards = n;
                    by_partition = placed;
                    if !placed && n > 1 {
                        tracing::warn!(
                            "{}: objects placed by whole key (written by an older version): a \
                             cluster instance's fenced commit is atomic only on one shard; \
                             move the data to a new directory to place them by partition",
                            dir.display()
                        );
                    }
                }
                _ => wal::store_shards(dir, shards)?,
            }
        }
        config.shards = shards;
        let tls = config.tls.as_ref().map(server_tls).transpose()?;
        let metrics = Arc::new(Metrics {
            ops: std::array::from_fn(|_| AtomicU64::new(0)),
            objects: (0..shards).map(|_| AtomicU64::new(0)).collect(),
            wal_bytes: (0..shards).map(|_| AtomicU64::new(0)).collect(),
            clients: (0..shards).map(|_| AtomicU64::new(0)).collect(),
            kept_answer_bytes: (0..shards).map(|_| AtomicU64::new(0)).collect(),
            connections: AtomicUsize::new(0),
            connections_total: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            duplicates: AtomicU64::new(0),
            notifications: AtomicU64::new(0),
            checkpoints: AtomicU64::new(0),
            timeouts: AtomicU64::new(0),
            answers_cut: AtomicU64::new(0),
            replies_dropped: AtomicU64::new(0),
            clients_forgotten: AtomicU64::new(0),
            last: Mutex::new((Instant::now(), [0; OP_NAMES.len()])),
            started: Instant::now(),
        });
        let per_shard = config.max_objects.map(|m| m.div_ceil(shards).max(1));
        let mut states = Vec::with_capacity(shards);
        let mut recovered_records = 0;
        let mut log_bytes_cut = 0;
        let mut logged_parts = Vec::new();
        let recovering = Instant::now();
        for i in 0..shards {
            // (The limits on objects and items apply once the log is replayed: what was
            // acknowledged comes back whole, whatever the limits are now.)
            let mut objects = shard::Objects {
                clients: clients::Clients::bounded(
                    config.max_clients.div_ceil(shards),
                    config.max_reply_cache / shards,
                ),
                ..Default::default()
            };
            let wal = match &config.data_dir {
                Some(dir) => {
                    let r = wal::recover(dir, i, config.sync, config.salvage_log, &mut objects)?;
                    recovered_records += r.records;
                    log_bytes_cut += r.torn_bytes;
                    logged_parts.extend(r.parts);
                    Some(r.wal)
                }
                None => None,
            };
            metrics.objects[i].store(objects.len() as u64, Ordering::Relaxed);
            states.push((objects, wal));
        }
        let recovered_parts = match &config.data_dir {
            Some(dir) => wal::roll_forward(&mut states, logged_parts).map_err(|source| {
                RecoveryError::Io {
                    path: dir.clone(),
                    source,
                }
            })?,
            None => 0,
        };
        for (objects, _) in &mut states {
            objects.max_objects = per_shard;
            objects.max_items = config.max_items;
        }
        if recovered_parts > 0 {
            tracing::warn!(
                "{recovered_parts} parts of fenced batches cut off by a crash applied at the start"
            );
        }
        let listener = TcpListener::bind(config.listen).map_err(|source| StartError::Bind {
            addr: config.listen,
            source,
        })?;
        let addr = listener.local_addr().map_err(|source| StartError::Bind {
            addr: config.listen,
            source,
        })?;
        if !addr.ip().is_loopback() && config.token.is_none() {
            tracing::warn!(
                "listening on {addr}, beyond loopback, without a token: anyone who reaches this \
                 address can read and change every object; give the store a token \
                 (--token-file){}",
                match config.tls {
                    None => " and TLS (--tls-cert, --tls-key)",
                    Some(_) => "",
                }
            );
        }
        let mut handles = Vec::with_capacity(shards);
        let mut loops = Vec::with_capacity(shards);
        for _ in 0..shards {
            let poll = mio::Poll::new().map_err(StartError::Poll)?;
            let waker =
                mio::Waker::new(poll.registry(), worker::WAKER).map_err(StartError::Poll)?;
            let (tx, rx) = std::sync::mpsc::channel();
            handles.push(ShardHandle { tx, waker });
            loops.push((poll, rx));
        }
        let shared = Arc::new(Shared {
            config,
            tls,
            by_partition,
            shards: handles,
            metrics,
            recovered_records,
            log_bytes_cut,
            recovered_parts,
            recovery_us: recovering.elapsed().as_micros() as u64,
        });
        let mut workers = Vec::with_capacity(shards);
        for (i, ((objects, wal), (poll, rx))) in states.into_iter().zip(loops).enumerate() {
            let w = worker::Worker::new(i, objects, wal, shared.clone(), &poll)
                .map_err(StartError::Poll)?;
            let h = std::thread::Builder::new()
                .name(format!("store-shard{i}"))
                .spawn(move || w.run(poll, rx))
                .map_err(StartError::Thread)?;
            workers.push(h);
        }
        let stop = Arc::new(AtomicBool::new(false));
        let acceptor = {
            let (shared, stop) = (shared.clone(), stop.clone());
            std::thread::Builder::new()
                .name("store-accept".into())
                .spawn(move || accept_loop(listener, shared, stop))
                .map_err(StartError::Thread)?
        };
        tracing::info!(
            "flowstate store listening on {addr}{} ({shards} shards, {})",
            if shared.tls.is_some() { " (TLS)" } else { "" },
            match &shared.config.data_dir {
                Some(d) => format!(
                    "data in {}, {recovered_records} log records replayed",
                    d.display()
                ),
                None => "in memory".into(),
            }
        );
        Ok(Server {
            addr,
            shared,
            stop,
            acceptor: Some(acceptor),
            workers,
        })
    }

    /// The address the server listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The statistics a `Stats` request answers.
    pub fn stats(&self) -> Vec<(String, u64)> {
        stats(&self.shared)
    }

    /// A handle on the server's counters for an exporter: it reads the counters the threads
    /// keep (atomics) and nothing else, and stays usable after the server stopped.
    pub fn counters(&self) -> CountersHandle {
        CountersHandle {
            metrics: Arc::clone(&self.shared.metrics),
            shards: self.shared.shards.len(),
        }
    }

    /// Serves until the process ends.
    pub fn wait(mut self) {
        if let Some(a) = self.acceptor.take() {
            let _ = a.join();
        }
    }

    /// Stops accepting, closes every connection, writes a final checkpoint and joins the
    /// threads.
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the acceptor.
        let _ = TcpStream::connect(self.addr);
        if let Some(a) = self.acceptor.take() {
            let _ = a.join();
        }
        for s in &self.shared.shards {
            let _ = s.send(worker::Msg::Stop);
        }
        for h in self.workers.drain(..) {
            let _ = h.join();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if self.acceptor.is_some() {
            self.shutdown();
        }
    }
}

/// Whether this process may run on `cpu` (Linux; elsewhere every CPU is).
#[cfg(target_os = "linux")]
fn cpu_allowed(cpu: usize) -> bool {
    if cpu >= 8 * std::mem::size_of::<libc::cpu_set_t>() {
        return false;
    }
    // SAFETY: sched_getaffinity writes at most the size given into the set; CPU_ISSET reads
    // within it (`cpu` checked against its size above).
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) == 0
            && libc::CPU_ISSET(cpu, &set)
    }
}

#[cfg(not(target_os = "linux"))]
fn cpu_allowed(_cpu: usize) -> bool {
    true
}

/// Pins the calling thread to `cpu` (Linux; elsewhere nothing).
#[cfg(target_os = "linux")]
pub(crate) fn pin_to_cpu(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET stays inside it (checked
    // against its size) and sched_setaffinity only reads it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if cpu >= 8 * std::mem::size_of::<libc::cpu_set_t>() {
            tracing::warn!("cannot pin to CPU {cpu}: out of range");
            return;
        }
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            tracing::warn!(
                "cannot pin to CPU {cpu}: {}",
                std::io::Error::last_os_error()
            );
        }
    }
}

#[cfg(not(target_os = "linux"))]
pub(crate) fn pin_to_cpu(_cpu: usize) {}

fn accept_loop(listener: TcpListener, shared: Arc<Shared>, stop: Arc<AtomicBool>) {
    let mut next = 1u64;
    let mut turn = 0usize;
    for stream in listener.incoming() {
        if stop.load(Ordering::SeqCst) {
            break;
        }
        let mut stream = match stream {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!("accept: {e}");
                // Out of descriptors and the like: do not spin.
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        let m = &shared.metrics;
        if m.connections.load(Ordering::SeqCst) >= shared.config.max_connections {
            let mut out = Vec::new();
            flowstate_proto::encode(
                &Frame {
                    id: 0,
                    msg: Message::Error {
                        code: ErrorCode::TooManyConnections,
                        message: format!(
                            "the store takes at most {} connections",
                            shared.config.max_connections
                        ),
                    },
                },
                &mut out,
            );
            let _ = std::io::Write::write_all(&mut stream, &out);
            continue;
        }
        if let Err(e) = stream.set_nonblocking(true) {
            tracing::warn!("accept: {e}");
            continue;
        }
        let _ = stream.set_nodelay(true);
        let conn = next;
        next += 1;
        m.connections.fetch_add(1, Ordering::SeqCst);
        m.connections_total.fetch_add(1, Ordering::Relaxed);
        // Round robin over the shard threads.
        let shard = turn % shared.shards.len();
        turn = turn.wrapping_add(1);
        if shared.shards[shard]
            .send(worker::Msg::Conn { id: conn, stream })
            .is_err()
        {
            m.connections.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::partition_tag;

    #[test]
    fn a_partition_s_keys_share_a_tag_whatever_their_nf() {
        let tag =
            |k: &str| partition_tag(k.as_bytes()).map(|t| String::from_utf8_lossy(t).into_owned());
        assert_eq!(tag("nat@0@3@Map@flows").as_deref(), Some("@0@3@"));
        assert_eq!(tag("firewall@0@3@Value@x@y").as_deref(), Some("@0@3@"));
        assert_eq!(tag("cluster@0@3@Value@owner").as_deref(), Some("@0@3@"));
        assert_ne!(tag("nat@0@4@Map@flows"), tag("nat@0@3@Map@flows"));
        // Shared objects and foreign keys hash whole.
        for k in [
            "counter@Counter@packets",
            "nat@x@3@Map@f",
            "key-1",
            "a@1",
            "@@@",
            "n@12345678901@1@Value@v",
        ] {
            assert_eq!(tag(k), None, "{k}");
        }
    }
}
