//! `flowstate store`: runs the state store server (`flowstate-store`) in the foreground, or
//! (`flowstate store stats`) asks a running one for its statistics.

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use flowstate_driver_store::{Settings, StoreConnector};
use flowstate_router::Stop;
use flowstate_store::{Config, Server};
use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// Options of `flowstate store`.
#[derive(Debug, Args)]
#[command(
    args_conflicts_with_subcommands = true,
    after_help = "Examples:\n  flowstate store\n  \
                  flowstate store --listen 127.0.0.1:7878 --data-dir /var/lib/flowstate --sync\n  \
                  flowstate store --listen 0.0.0.0:7878 --tls-cert store.pem --tls-key store.key --token-file /run/secrets/store\n  \
                  flowstate store --metrics 9465   (Prometheus /metrics on 127.0.0.1:9465)"
)]
pub(crate) struct StoreArgs {
    #[command(subcommand)]
    query: Option<Query>,
    /// Address to listen on (port 0 picks a free port; the address is printed).
    #[arg(long, default_value = "127.0.0.1:7878")]
    listen: SocketAddr,
    /// Directory of the write-ahead log and checkpoints; without it the store is in memory
    /// only.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// The shared token clients must present: this file's first line (or the environment's
    /// FLOWSTATE_STORE_TOKEN; never on the command line, where `ps` shows it).
    #[arg(long, value_name = "FILE")]
    token_file: Option<PathBuf>,
    /// Serve TLS only, with this certificate chain (PEM); needs --tls-key.
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Shard threads (0: one per core, at most 8). A data directory keeps its own count.
    #[arg(long, default_value_t = 0)]
    shards: usize,
    /// Most open connections.
    #[arg(long, default_value_t = 1024, value_parser = at_least(1))]
    max_connections: usize,
    /// Largest frame in bytes (at least 64).
    #[arg(long, default_value_t = 64 << 20, value_parser = clap::value_parser!(u32).range(64..))]
    max_frame: u32,
    /// Most operations in one batch.
    #[arg(long, default_value_t = 65_536, value_parser = clap::value_parser!(u32).range(1..))]
    max_ops: u32,
    /// Most requests per connection waiting for other shards' answers (further requests are
    /// not read until some are answered).
    #[arg(long, default_value_t = 4096, value_parser = at_least(1))]
    max_inflight: usize,
    /// Most bytes of unsent answers per connection before the store stops reading its
    /// requests (backpressure; at least 64 KiB).
    #[arg(long, default_value_t = 4 << 20, value_parser = at_least(64 * 1024))]
    max_output: usize,
    /// CPUs to pin the shard threads to, comma separated (shard i on the i-th, round robin).
    #[arg(long, value_delimiter = ',')]
    cpus: Vec<usize>,
    /// Most objects the store holds (0: no limit).
    #[arg(long, default_value_t = 10_000_000)]
    max_objects: usize,
    /// Most items of one object (list items, set members, map fields; 0: no limit).
    #[arg(long, default_value_t = 16 << 20)]
    max_items: usize,
    /// Close a connection that sent no whole first frame (with a token: no hello with it)
    /// within this time.
    #[arg(long, default_value = "10s", value_parser = positive_duration)]
    handshake_timeout: Duration,
    /// Close a connection idle this long (nothing sent, no answer owed, no subscription); 0:
    /// never. The store driver reconnects.
    #[arg(long, default_value = "0s", value_parser = flowstate_config::parse_duration)]
    idle_timeout: Duration,
    /// Most bytes of answers kept to answer retransmitted batches again, over all clients.
    #[arg(long, default_value_t = 64 << 20)]
    max_reply_cache: usize,
    /// Most client ids whose idempotency state is kept (the least recently active go first).
    #[arg(long, default_value_t = 65_536, value_parser = at_least(1))]
    max_clients: usize,
    /// Start even if a log is damaged before its end: keep the records before the damage,
    /// cut the rest, keep the whole damaged log beside it as `.wal.corrupt`.
    #[arg(long)]
    salvage_log: bool,
    /// Time between checkpoints ("60s", "150ms"; at least 1ms).
    #[arg(long, default_value = "60s", value_parser = checkpoint_interval)]
    checkpoint_interval: Duration,
    /// fdatasync every log write (survive machine crashes, not only process crashes).
    #[arg(long)]
    sync: bool,
    /// Serve Prometheus metrics (`/metrics`: operations by type, connections, objects, WAL
    /// lag) and `/api/v1/stats` on this address: `HOST:PORT`, or a port alone for loopback.
    /// Example: `flowstate store --metrics 127.0.0.1:9465`.
    #[arg(long, value_name = "ADDR", value_parser = flowstate_telemetry::parse_listen)]
    metrics: Option<SocketAddr>,
}

/// Requests to a running store.
#[derive(Debug, Subcommand)]
enum Query {
    /// Print a running store's statistics: operations (total and per second since the
    /// previous stats request) by type, connections, objects, memory, WAL lag.
    #[command(after_help = "Examples:\n  flowstate store stats\n  \
                            flowstate store stats --url 127.0.0.1:7878 --json")]
    Stats(StatsArgs),
}

#[derive(Debug, Args)]
struct StatsArgs {
    /// The store's address.
    #[arg(long, default_value = "127.0.0.1:7878")]
    url: String,
    /// Its shared token, if it wants one: this file's first line (or the environment's
    /// FLOWSTATE_STORE_TOKEN).
    #[arg(long, value_name = "FILE")]
    token_file: Option<PathBuf>,
    /// Connect with TLS, trusting the CA certificates of this PEM file.
    #[arg(long, value_name = "FILE")]
    ca_file: Option<PathBuf>,
    /// Print a JSON object instead of one `name value` line each.
    #[arg(long)]
    json: bool,
}

/// A count of at least `min`: a smaller one is refused with an error naming the option.
fn at_least(min: u64) -> clap::builder::RangedU64ValueParser<usize> {
    clap::builder::RangedU64ValueParser::new().range(min..)
}

/// The token from its file or the environment (an empty one is none).
fn token(file: &Option<PathBuf>) -> Result<Option<flowstate_config::Secret>> {
    if let Some(path) = file {
        let text = flowstate_config::read_text(path)
            .with_context(|| format!("--token-file: {}", path.display()))?;
        let line = text.lines().next().unwrap_or_default();
        if line.is_empty() {
            anyhow::bail!(
                "--token-file: {}: empty (the token is its first line)",
                path.display()
            );
        }
        return Ok(Some(flowstate_config::Secret::new(line)));
    }
    Ok(std::env::var("FLOWSTATE_STORE_TOKEN")
        .ok()
        .filter(|t| !t.is_empty())
        .map(flowstate_config::Secret::new))
}

/// Serves (or runs the query given).
pub(crate) fn run(a: &StoreArgs) -> Result<()> {
    match &a.query {
        Some(Query::Stats(q)) => stats(q),
        None => serve(a),
    }
}

/// Starts the server, prints where it listens, and serves until SIGINT or SIGTERM, then stops
/// accepting, closes the connections and writes a final checkpoint (a second signal kills at
/// once; the write-ahead log makes that safe too).
fn serve(a: &StoreArgs) -> Result<()> {
    Stop::on_signals().context("catching SIGINT/SIGTERM")?;
    crate::run::ignore_sighup("the store server")?;
    let config = Config {
        listen: a.listen,
        data_dir: a.data_dir.clone(),
        token: token(&a.token_file)?,
        shards: a.shards,
        limits: flowstate_proto::Limits {
            max_frame: a.max_frame,
            max_ops: a.max_ops,
        },
        max_connections: a.max_connections,
        max_inflight: a.max_inflight,
        max_output: a.max_output,
        cpus: a.cpus.clone(),
        max_objects: (a.max_objects > 0).then_some(a.max_objects),
        max_items: (a.max_items > 0).then_some(a.max_items),
        handshake_timeout: a.handshake_timeout,
        idle_timeout: (!a.idle_timeout.is_zero()).then_some(a.idle_timeout),
        max_reply_cache: a.max_reply_cache,
        max_clients: a.max_clients,
        salvage_log: a.salvage_log,
        checkpoint_interval: a.checkpoint_interval,
        sync: a.sync,
        tls: match (&a.tls_cert, &a.tls_key) {
            (Some(cert), Some(key)) => Some(flowstate_store::TlsFiles {
                cert: cert.clone(),
                key: key.clone(),
            }),
            _ => None,
        },
        ..Config::default()
    };
    let server = Server::start(config).context("flowstate store")?;
    let telemetry = match a.metrics {
        Some(addr) => Some(crate::telemetry::serve(
            addr,
            std::sync::Arc::new(crate::telemetry::StoreProvider(server.counters())),
            None,
        )?),
        None => None,
    };
    let mut out = std::io::stdout().lock();
    writeln!(out, "flowstate store: listening on {}", server.local_addr())?;
    // (The address stays the line's last word: scripts and tests read it there.)
    out.flush()?;
    drop(out);
    let stop = Stop::new();
    while !stop.stopped() {
        std::thread::sleep(Duration::from_millis(50));
    }
    if let Some(t) = telemetry {
        t.stop();
    }
    server.stop();
    eprintln!("flowstate store: stopped");
    Ok(())
}

fn stats(q: &StatsArgs) -> Result<()> {
    let connector = StoreConnector::with_tls_settings(Settings {
        addr: q.url.clone(),
        token: token(&q.token_file)?,
        retry_for: Duration::ZERO,
        ca_file: q.ca_file.clone(),
        ..Settings::default()
    })
    .map_err(|e| anyhow::anyhow!("--ca-file: {}", e.reason))?;
    let v = connector
        .open()
        .and_then(|mut b| b.stats())
        .with_context(|| format!("statistics of the store at {}", q.url))?;
    let mut out = std::io::stdout().lock();
    if q.json {
        let m: serde_json::Map<String, serde_json::Value> =
            v.into_iter().map(|(n, x)| (n, x.into())).collect();
        writeln!(out, "{}", serde_json::to_string_pretty(&m)?)?;
    } else {
        let width = v.iter().map(|(n, _)| n.len()).max().unwrap_or(0);
        for (n, x) in v {
            writeln!(out, "{n:width$}  {x}")?;
        }
    }
    Ok(())
}

/// A duration above zero.
fn positive_duration(s: &str) -> Result<Duration, String> {
    let d = flowstate_config::parse_duration(s)?;
    if d.is_zero() {
        return Err(format!("above zero, got {s:?}"));
    }
    Ok(d)
}

/// A checkpoint interval: a duration of at least 1 ms.
fn checkpoint_interval(s: &str) -> Result<Duration, String> {
    let d = flowstate_config::parse_duration(s)?;
    if d < Duration::from_millis(1) {
        return Err(format!("at least 1ms, got {s:?}"));
    }
    Ok(d)
}
