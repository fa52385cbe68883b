//! `flowstate state list`: an NF's tables as an operator reads them (like `conntrack -L` or
//! VPP's `show nat44 sessions`), from a running box's telemetry listener or straight from the
//! store a configuration names.
//!
//! Both sources give the same JSON document per table (`/api/v1/tables/NF/TABLE`): `nf`,
//! `table`, `about`, `columns`, `rows` (cells as plain JSON values: endpoints and addresses as
//! strings, timeouts in seconds, `null` when unknown), `workers` and `answered` (how many
//! workers' entries it holds; a store answers for all). Filters and printing work on that
//! document, so they are the same for both.

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use flowstate_deploy::config::BackendKind;
use flowstate_deploy::Config;
use flowstate_nf::listing::{merge_summed, StoreReader};
use serde_json::{json, Value};
use std::io::Write;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

/// Options of `flowstate state`.
#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  flowstate state list 127.0.0.1:9464 nat\n  \
                        flowstate state list --config examples/nat-redis.toml nat.sessions"
)]
pub(crate) struct StateArgs {
    #[command(subcommand)]
    action: Action,
}

#[derive(Debug, Subcommand)]
enum Action {
    /// Print an NF's tables: the NAT's sessions and mappings, the firewall's connections, the
    /// LB's flows and backends.
    #[command(after_help = "Examples:
  flowstate state list 127.0.0.1:9464 nat               a running box (its --metrics address)
  flowstate state list 127.0.0.1:9464 nat.sessions --proto tcp --port 80
  flowstate state list 127.0.0.1:9464 firewall --json
  flowstate state list --config examples/nat-redis.toml nat.sessions   the store the file names
  flowstate state list --config examples/lb.toml --backend redis --url redis://127.0.0.1:6379 lb.backends")]
    List(ListArgs),
}

#[derive(Debug, Args)]
struct ListArgs {
    /// `[ADDR] NF[.TABLE]`: a running box's telemetry address (`--metrics`, `[telemetry]
    /// listen`) and what to list; without ADDR, `--config` says which store to read. Without
    /// `.TABLE`, every table of the NF.
    #[arg(required = true, num_args = 1..=2, value_name = "[ADDR] NF[.TABLE]")]
    what: Vec<String>,
    /// Read the store this configuration's `[state]` names, decoding with its `[[chain]]`
    /// NFs' settings (the LB's backend lists, the NAT's addresses), instead of asking a box.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// With --config: read this backend instead of the file's (`store`, `redis`,
    /// `redis-cluster`, `cassandra`).
    #[arg(long, requires = "config")]
    backend: Option<String>,
    /// With --config: the store's URL instead of the file's.
    #[arg(long, requires = "config")]
    url: Option<String>,
    /// With --config: the NF instance whose state to read instead of the file's
    /// `[state] nf_instance`.
    #[arg(long, requires = "config")]
    instance: Option<u32>,
    /// Only rows with this address in an endpoint or address column.
    #[arg(long)]
    addr: Option<IpAddr>,
    /// Only rows with this port (ICMP: identifier) in an endpoint column.
    #[arg(long)]
    port: Option<u16>,
    /// Only rows of this protocol (`tcp`, `udp`, `icmp` or a number).
    #[arg(long)]
    proto: Option<String>,
    /// Print the tables as JSON (one document per table, in an array).
    #[arg(long)]
    json: bool,
}

pub(crate) fn run(a: &StateArgs) -> Result<()> {
    match &a.action {
        Action::List(l) => list(l),
    }
}

fn list(a: &ListArgs) -> Result<()> {
    let (addr, what) = match (a.what.as_slice(), &a.config) {
        ([what], Some(_)) => (None, what),
        ([addr, what], None) => (Some(addr), what),
        ([_], None) => bail!("give a running box's address (ADDR NF[.TABLE]) or --config FILE"),
        (_, Some(_)) => bail!("give either ADDR or --config, not both"),
        _ => unreachable!("clap takes one or two values"),
    };
    let (nf, table) = match what.split_once('.') {
        Some((nf, t)) => (nf, Some(t)),
        None => (what.as_str(), None),
    };
    let mut tables = match addr {
        Some(addr) => from_box(addr, nf, table)?,
        None => from_store(a, nf, table)?,
    };
    for t in &mut tables {
        filter(t, a)?;
    }
    let mut out = std::io::stdout().lock();
    if a.json {
        serde_json::to_writer_pretty(&mut out, &tables)?;
        writeln!(out)?;
    } else {
        for (i, t) in tables.iter().enumerate() {
            if i > 0 {
                writeln!(out)?;
            }
            print_table(&mut out, t)?;
        }
    }
    Ok(())
}

/// The tables of a running box, over its telemetry listener.
fn from_box(addr: &str, nf: &str, table: Option<&str>) -> Result<Vec<Value>> {
    let addr = flowstate_telemetry::parse_listen(addr)
        .map_err(|e| anyhow::anyhow!("ADDR: {e}"))
        .context("the first argument is a running box's telemetry address")?;
    let names: Vec<String> = match table {
        Some(t) => vec![t.to_owned()],
        None => {
            let all: Value = serde_json::from_str(&get(addr, "/api/v1/tables")?)
                .context("the box's table list is not JSON")?;
            let chain = all.as_array().cloned().unwrap_or_default();
            let Some(entry) = chain.iter().find(|e| e["nf"] == nf) else {
                let have: Vec<&str> = chain.iter().filter_map(|e| e["nf"].as_str()).collect();
                bail!(
                    "the box's chain has no NF {nf:?} (it has: {})",
                    have.join(", ")
                );
            };
            entry["tables"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|t| t["name"].as_str().map(str::to_owned))
                .collect()
        }
    };
    let mut out = Vec::new();
    for t in names {
        let text = get(addr, &format!("/api/v1/tables/{nf}/{t}"))?;
        let doc: Value = serde_json::from_str(&text)
            .with_context(|| format!("{nf}.{t}: the box's answer is not JSON"))?;
        if let Some(e) = doc["error"].as_str() {
            bail!("{e}");
        }
        if doc["answered"] != doc["workers"] {
            eprintln!(
                "flowstate: {nf}.{t}: only {} of {} workers answered in time",
                doc["answered"], doc["workers"]
            );
        }
        out.push(doc);
    }
    Ok(out)
}

/// The tables kept in the store `a.config` names (or `--backend`/`--url`).
fn from_store(a: &ListArgs, nf: &str, table: Option<&str>) -> Result<Vec<Value>> {
    let path = a.config.as_ref().expect("checked by the caller");
    let mut config = Config::load(path)?;
    if let Some(b) = &a.backend {
        let names = BackendKind::ALL.map(|(_, n)| n);
        config.state.backend = BackendKind::ALL
            .iter()
            .find(|(_, n)| n == b)
            .map(|(k, _)| *k)
            .with_context(|| {
                format!("--backend: expected one of {}, got {b:?}", names.join(", "))
            })?;
        config.state.options.clear();
    }
    if config.state.backend == BackendKind::Local {
        bail!(
            "{}: the embedded store lives inside the running box: ask the box (ADDR NF[.TABLE]) \
             or give --backend",
            path.display()
        );
    }
    if let Some(u) = &a.url {
        config.state.url = Some(u.clone());
    }
    if let Some(i) = a.instance {
        config.state.nf_instance = i;
    }
    let factories = config.factories()?;
    let Some(factory) = factories.iter().find(|f| f.name() == nf) else {
        let have: Vec<&str> = factories.iter().map(|f| f.name()).collect();
        bail!(
            "{}: the chain has no NF {nf:?} (it has: {})",
            path.display(),
            have.join(", ")
        );
    };
    let infos: Vec<_> = match table {
        None => factory.tables().to_vec(),
        Some(t) => match factory.tables().iter().find(|i| i.name == t) {
            Some(i) => vec![*i],
            None => bail!(
                "{nf} has no table {t:?} (it has: {})",
                table_names(factory.tables())
            ),
        },
    };
    let connector = crate::backends::connector(&config)?;
    let mut backend = connector
        .connect()
        .with_context(|| format!("cannot reach the {} store", connector.name()))?;
    let mut out = Vec::new();
    for info in infos {
        let mut rows = Vec::new();
        let mut reader = StoreReader::new(&mut *backend, nf).instance(config.state.nf_instance);
        let kept = factory
            .stored_rows(info.name, &mut reader, &mut rows)
            .with_context(|| format!("reading {nf}.{} from the store", info.name))?;
        if !kept {
            bail!(
                "{nf}.{} is not kept in a store (a worker-private table): ask a running box",
                info.name
            );
        }
        if info.summed {
            rows = merge_summed(rows);
        }
        out.push(json!({
            "nf": nf,
            "table": info.name,
            "about": info.about,
            "columns": info.columns,
            "rows": rows,
            "source": connector.name(),
        }));
    }
    Ok(out)
}

fn table_names(t: &[flowstate_nf::listing::TableInfo]) -> String {
    t.iter().map(|i| i.name).collect::<Vec<_>>().join(", ")
}

/// Keeps the rows of `t` that pass every filter of `a`.
fn filter(t: &mut Value, a: &ListArgs) -> Result<()> {
    let proto = a.proto.as_deref().map(|p| p.to_ascii_lowercase());
    if let Some(p) = &proto {
        if !matches!(p.as_str(), "tcp" | "udp" | "icmp" | "icmpv6") && p.parse::<u8>().is_err() {
            bail!("--proto: expected tcp, udp, icmp, icmpv6 or a protocol number, got {p:?}");
        }
    }
    let columns: Vec<String> = serde_json::from_value(t["columns"].clone()).unwrap_or_default();
    let proto_col = columns.iter().position(|c| c == "proto");
    let Some(rows) = t["rows"].as_array_mut() else {
        return Ok(());
    };
    rows.retain(|row| {
        let cells = row.as_array().map(Vec::as_slice).unwrap_or_default();
        let endpoints = || {
            cells
                .iter()
                .filter_map(|c| c.as_str()?.parse::<SocketAddr>().ok())
        };
        let addr_ok = a.addr.is_none_or(|want| {
            endpoints().any(|e| e.ip() == want)
                || cells
                    .iter()
                    .any(|c| c.as_str().and_then(|s| s.parse::<IpAddr>().ok()) == Some(want))
        });
        let port_ok = a
            .port
            .is_none_or(|want| endpoints().any(|e| e.port() == want));
        let proto_ok = proto.as_ref().is_none_or(|want| {
            proto_col
                .and_then(|i| cells.get(i))
                .is_some_and(|c| match c {
                    Value::String(s) => s == want,
                    Value::Number(n) => n.to_string() == *want,
                    _ => false,
                })
        });
        addr_ok && port_ok && proto_ok
    });
    Ok(())
}

/// A table as aligned columns under a line saying what it is.
fn print_table(out: &mut impl Write, t: &Value) -> std::io::Result<()> {
    let columns: Vec<String> = serde_json::from_value(t["columns"].clone()).unwrap_or_default();
    let rows = t["rows"].as_array().map(Vec::as_slice).unwrap_or_default();
    let timeout = columns.iter().position(|c| c == "timeout");
    let text: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            let cells = r.as_array().map(Vec::as_slice).unwrap_or_default();
            cells
                .iter()
                .enumerate()
                .map(|(i, c)| match c {
                    Value::Null => "-".to_owned(),
                    Value::String(s) => s.clone(),
                    Value::Number(n) if Some(i) == timeout => {
                        format!("{:.0}s", n.as_f64().unwrap_or(0.0).ceil())
                    }
                    other => other.to_string(),
                })
                .collect()
        })
        .collect();
    let mut width: Vec<usize> = columns.iter().map(String::len).collect();
    for r in &text {
        for (w, c) in width.iter_mut().zip(r) {
            *w = (*w).max(c.len());
        }
    }
    let source = match (t["source"].as_str(), t["workers"].as_u64()) {
        (Some(store), _) => format!("from the {store} store"),
        (None, Some(w)) => format!("{} of {w} workers", t["answered"]),
        _ => String::new(),
    };
    writeln!(
        out,
        "# {}.{}: {} rows, {source}; a row is {}",
        t["nf"].as_str().unwrap_or("?"),
        t["table"].as_str().unwrap_or("?"),
        rows.len(),
        t["about"].as_str().unwrap_or("?")
    )?;
    let line = |cells: &[String]| {
        let mut s = String::new();
        for (i, (c, w)) in cells.iter().zip(&width).enumerate() {
            if i + 1 == cells.len() {
                s.push_str(c);
            } else {
                s.push_str(&format!("{c:<w$}  "));
            }
        }
        s
    };
    writeln!(out, "{}", line(&columns).to_uppercase())?;
    for r in &text {
        writeln!(out, "{}", line(r))?;
    }
    Ok(())
}

/// `GET path` from a telemetry listener: the body of a `200` answer.
fn get(addr: SocketAddr, path: &str) -> Result<String> {
    // The box's workers have `TABLE_WAIT` to answer.
    let wait = crate::telemetry::TABLE_WAIT + Duration::from_secs(5);
    let r = flowstate_telemetry::client::get(addr, path, wait).map_err(|e| {
        anyhow::anyhow!("http://{addr}{path}: {e} (is the box running with --metrics {addr}?)")
    })?;
    if r.status != 200 {
        bail!("http://{addr}{path}: {}: {}", r.status, r.text().trim());
    }
    Ok(r.text())
}
