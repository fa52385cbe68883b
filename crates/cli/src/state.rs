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
    /// Follow a running box's events as they happen, like `conntrack -E`: the NAT's sessions
    /// and mappings created and destroyed, its ports exhausted and session limit reached; the
    /// firewall's connections opened and ended. A reader slower than the box loses events,
    /// and is told how many (`[LOST]`).
    #[command(after_help = "Examples:
  flowstate state events 127.0.0.1:9464            every NF's events (the box's --metrics address)
  flowstate state events 127.0.0.1:9464 nat --json")]
    Events(EventsArgs),
}

#[derive(Debug, Args)]
struct EventsArgs {
    /// The box's telemetry address (`--metrics`, `[telemetry] listen`).
    addr: String,
    /// Only this NF's events.
    nf: Option<String>,
    /// Print each event as the JSON line the box sends.
    #[arg(long)]
    json: bool,
    /// Present the token in FILE to the box's listener (its `[telemetry] token_file`).
    #[arg(long, value_name = "FILE")]
    token_file: Option<PathBuf>,
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
    /// With ADDR: present the token in FILE to the box's listener (its `[telemetry]
    /// token_file`).
    #[arg(long, value_name = "FILE", conflicts_with = "config")]
    token_file: Option<PathBuf>,
}

pub(crate) fn run(a: &StateArgs) -> Result<()> {
    match &a.action {
        Action::List(l) => list(l),
        Action::Events(e) => events(e),
    }
}

/// Prints the box's events until it closes the stream (or this process is stopped).
fn events(a: &EventsArgs) -> Result<()> {
    let (addr, token) = crate::telemetry::box_at(&a.addr, a.token_file.as_deref())?;
    let path = match &a.nf {
        Some(nf) => format!("/api/v1/events?nf={nf}"),
        None => "/api/v1/events".to_owned(),
    };
    let lines =
        flowstate_telemetry::client::stream(addr, &path, Duration::from_secs(5), token.as_ref())
            .with_context(|| format!("{addr}: cannot follow its events"))?;
    let mut out = std::io::stdout().lock();
    for line in lines {
        let line = line.with_context(|| format!("{addr}: the event stream broke"))?;
        if a.json {
            writeln!(out, "{line}")?;
        } else {
            writeln!(out, "{}", event_text(&line))?;
        }
        out.flush()?;
    }
    Ok(())
}

/// An event line as `conntrack -E` would print it: `[NEW] nat tcp inside=... remote=...
/// external=...`.
fn event_text(line: &str) -> String {
    let Ok(e) = serde_json::from_str::<Value>(line) else {
        return line.to_owned();
    };
    let s = |k: &str| e[k].as_str().unwrap_or_default().to_owned();
    let tag = match s("event").as_str() {
        "session-create" | "connection-new" => "[NEW]",
        "session-delete" | "connection-destroy" => "[DESTROY]",
        "mapping-create" => "[NEW MAPPING]",
        "mapping-delete" => "[DESTROY MAPPING]",
        "ports-exhausted" => "[PORTS EXHAUSTED]",
        "quota-exceeded" => "[SESSION LIMIT]",
        "lost" => return format!("[LOST] {} events", e["count"]),
        _ => return line.to_owned(),
    };
    let mut text = format!("{tag} {}", s("nf"));
    for k in [
        "proto",
        "state",
        "src",
        "dst",
        "inside",
        "remote",
        "external",
        "from",
        "why",
        "max_sessions",
    ] {
        match &e[k] {
            Value::String(v) if k == "proto" || k == "state" => text.push_str(&format!(" {v}")),
            Value::String(v) => text.push_str(&format!(" {k}={v}")),
            Value::Number(n) => text.push_str(&format!(" {k}={n}")),
            _ => {}
        }
    }
    text
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
        Some(addr) => {
            let token = a
                .token_file
                .as_deref()
                .map(|f| crate::telemetry::read_token(f, "--token-file"))
                .transpose()?;
            from_box(addr, nf, table, token.as_ref())?
        }
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
fn from_box(
    addr: &str,
    nf: &str,
    table: Option<&str>,
    token: Option<&flowstate_telemetry::Token>,
) -> Result<Vec<Value>> {
    let addr = flowstate_telemetry::parse_listen(addr)
        .map_err(|e| anyhow::anyhow!("ADDR: {e}"))
        .context("the first argument is a running box's telemetry address")?;
    let names: Vec<String> = match table {
        Some(t) => vec![t.to_owned()],
        None => {
            let all: Value = serde_json::from_str(&get(addr, "/api/v1/tables", token)?)
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
        let doc = whole_table(addr, nf, &t, token)?;
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

/// Every row of table `nf.t` of a running box, a page at a time: one document as the box
/// answers it, its `rows` those of every page, `answered` the fewest workers of any page.
fn whole_table(
    addr: SocketAddr,
    nf: &str,
    t: &str,
    token: Option<&flowstate_telemetry::Token>,
) -> Result<Value> {
    let limit = flowstate_telemetry::page::MAX_ROWS;
    let mut whole: Option<Value> = None;
    let mut rows = Vec::new();
    let mut after = String::new();
    loop {
        let text = get(
            addr,
            &format!("/api/v1/tables/{nf}/{t}?limit={limit}{after}"),
            token,
        )?;
        let mut doc: Value = serde_json::from_str(&text)
            .with_context(|| format!("{nf}.{t}: the box's answer is not JSON"))?;
        if let Some(e) = doc["error"].as_str() {
            bail!("{e}");
        }
        if !doc.is_object() {
            bail!("{nf}.{t}: the box's answer is not a table document");
        }
        if let Some(Value::Array(page)) = doc.get_mut("rows").map(Value::take) {
            rows.extend(page);
        }
        let next = doc["next"].as_str().map(str::to_owned);
        whole = Some(match whole.take() {
            None => doc,
            Some(mut first) => {
                if doc["answered"].as_u64() < first["answered"].as_u64() {
                    first["answered"] = doc["answered"].take();
                }
                first
            }
        });
        match next {
            // A cursor is hex digits: nothing to escape in a query.
            Some(c) if !c.bytes().all(|b| b.is_ascii_hexdigit()) => {
                bail!("{nf}.{t}: the box's next-page cursor {c:?} is not hex")
            }
            Some(c) if after.ends_with(&format!("={c}")) => {
                bail!("{nf}.{t}: the box answered the same page twice")
            }
            Some(c) => after = format!("&after={c}"),
            None => break,
        }
    }
    let mut doc = whole.unwrap_or_default();
    if let Some(o) = doc.as_object_mut() {
        o.remove("next");
        o.remove("total");
        o.insert("rows".into(), Value::Array(rows));
    }
    Ok(doc)
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
fn get(addr: SocketAddr, path: &str, token: Option<&flowstate_telemetry::Token>) -> Result<String> {
    // The box's workers have `TABLE_WAIT` to answer.
    let wait = crate::telemetry::TABLE_WAIT + Duration::from_secs(5);
    let r = flowstate_telemetry::client::get_with(addr, path, wait, token).map_err(|e| {
        anyhow::anyhow!("http://{addr}{path}: {e} (is the box running with --metrics {addr}?)")
    })?;
    if r.status == 401 {
        bail!(
            "http://{addr}{path}: {}: the box wants its token ([telemetry] token_file): give \
             --token-file FILE",
            r.text().trim()
        );
    }
    if r.status != 200 {
        bail!("http://{addr}{path}: {}: {}", r.status, r.text().trim());
    }
    Ok(r.text())
}

#[cfg(test)]
mod tests {
    use super::*;
    use flowstate_telemetry::{Metrics, Options, Page, Provider, Server, Token};
    use std::sync::Arc;

    #[test]
    fn events_read_as_conntrack_prints_them() {
        let line = r#"{"time_ms":1,"nf":"nat","event":"session-create","proto":"tcp","inside":"10.0.0.2:40000","external":"198.51.100.1:20001","remote":"198.51.100.2:80"}"#;
        assert_eq!(
            event_text(line),
            "[NEW] nat tcp inside=10.0.0.2:40000 remote=198.51.100.2:80 external=198.51.100.1:20001"
        );
        assert_eq!(
            event_text(r#"{"event":"lost","count":12}"#),
            "[LOST] 12 events"
        );
        assert_eq!(
            event_text(r#"{"nf":"nat","event":"quota-exceeded","max_sessions":4}"#),
            "[SESSION LIMIT] nat max_sessions=4"
        );
        let fw = r#"{"time_ms":2,"nf":"firewall","event":"connection-destroy","proto":"tcp","src":"10.0.0.2:40000","dst":"198.51.100.2:80","state":"TIME_WAIT","from":"inside","why":"expired"}"#;
        assert_eq!(
            event_text(fw),
            "[DESTROY] firewall tcp TIME_WAIT src=10.0.0.2:40000 dst=198.51.100.2:80 from=inside why=expired"
        );
        assert_eq!(event_text("not json"), "not json");
    }

    /// A box whose `nat.sessions` holds `ROWS` rows, answered a page at a time.
    struct Sessions;
    const ROWS: usize = 2 * flowstate_telemetry::page::MAX_ROWS + 5;
    impl Provider for Sessions {
        fn metrics(&self, _: &mut Metrics) {}
        fn api(&self, name: &str) -> Option<String> {
            self.api_page(name, &Page::default())
        }
        fn api_page(&self, name: &str, page: &Page) -> Option<String> {
            (name == "tables/nat/sessions").then(|| {
                let rows: Vec<Value> = (0..ROWS)
                    .map(|i| json!(["tcp", format!("10.0.{}.{}:80", i / 256, i % 256), 30.0]))
                    .collect();
                let doc = json!({"nf": "nat", "table": "sessions", "about": "a session",
                    "columns": ["proto", "inside", "timeout"], "rows": rows,
                    "workers": 2, "answered": 2});
                crate::telemetry::page_of_table(doc, page).to_string()
            })
        }
    }

    #[test]
    fn a_box_table_is_read_whole_a_page_at_a_time_with_the_token() {
        let token = Token::new("t0ken").unwrap();
        let options = Options {
            token: Some(token.clone()),
            ..Options::default()
        };
        let server =
            Server::start_with("127.0.0.1:0".parse().unwrap(), Arc::new(Sessions), options)
                .unwrap();
        let a = server.local_addr();
        // One request answers a page, not the table.
        let page: Value =
            serde_json::from_str(&get(a, "/api/v1/tables/nat/sessions", Some(&token)).unwrap())
                .unwrap();
        assert_eq!(
            page["rows"].as_array().unwrap().len(),
            flowstate_telemetry::page::DEFAULT_ROWS
        );
        assert_eq!(page["total"], ROWS);
        assert!(page["next"].is_string());
        // `state list` pages through all of it.
        let whole = whole_table(a, "nat", "sessions", Some(&token)).unwrap();
        let rows = whole["rows"].as_array().unwrap();
        assert_eq!(rows.len(), ROWS);
        let mut inside: Vec<&str> = rows.iter().map(|r| r[1].as_str().unwrap()).collect();
        inside.sort_unstable();
        inside.dedup();
        assert_eq!(inside.len(), ROWS, "every row once");
        assert_eq!(whole["answered"], 2);
        assert!(whole.get("next").is_none());
        // Without the token: refused, and the error says what to give.
        let e = whole_table(a, "nat", "sessions", None).unwrap_err();
        assert!(e.to_string().contains("--token-file"), "{e}");
        server.stop();
    }
}
