//! `--metrics ADDR`: wires a role's published counters to `flowstate-telemetry`'s listener.
//!
//! The chain's runtime publishes its workers' counters to an [`Observer`] (no lock on the data
//! path); the store keeps atomics. The providers here read those and name them the
//! Prometheus way: `flowstate_<what>_<unit>`, counters ending in `_total`, labels for what
//! varies (`nf`, `reason`, `port`, `direction`, `worker`, `op`).

use anyhow::{Context, Result};
use flowstate_chain::observe::{Observer, BATCH_BUCKETS};
use flowstate_chain::Summary;
use flowstate_telemetry::{Histogram, Info, Metrics, Options, Page, Provider, Server, Token};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

/// Starts the listener, requiring the token in `token_file` (`[telemetry] token_file`) if
/// there is one, and says where it is on stderr.
pub(crate) fn serve(
    addr: SocketAddr,
    provider: Arc<dyn Provider>,
    token_file: Option<&Path>,
) -> Result<Server> {
    let options = options(token_file)?;
    serve_started(addr, Server::start_with(addr, provider, options))
}

/// The listener's options: the defaults, and the token in `token_file` if there is one.
pub(crate) fn options(token_file: Option<&Path>) -> Result<Options> {
    Ok(Options {
        token: token_file
            .map(|f| read_token(f, "[telemetry] token_file"))
            .transpose()?,
        ..Options::default()
    })
}

/// The token in `file`, which `key` (a configuration key or a flag) names.
pub(crate) fn read_token(file: &Path, key: &str) -> Result<Token> {
    Token::read(file).with_context(|| format!("{key} {}: no telemetry token", file.display()))
}

/// A running box's listener as a command names it: `ADDR` and the token of `--token-file`.
pub(crate) fn box_at(addr: &str, token_file: Option<&Path>) -> Result<(SocketAddr, Option<Token>)> {
    let addr = flowstate_telemetry::parse_listen(addr)
        .map_err(|e| anyhow::anyhow!("{e}"))
        .context("ADDR")?;
    let token = token_file
        .map(|f| read_token(f, "--token-file"))
        .transpose()?;
    Ok((addr, token))
}

/// [`serve`] for a listener already started (or not).
pub(crate) fn serve_started(addr: SocketAddr, started: std::io::Result<Server>) -> Result<Server> {
    let server = started.with_context(|| format!("--metrics {addr}: cannot listen"))?;
    let at = server.local_addr();
    eprintln!("flowstate: metrics on http://{at}/metrics, dashboard on http://{at}/");
    Ok(server)
}

/// Lines a reader of `/api/v1/events` has not taken, at most: beyond, they are lost and the
/// reader is told how many.
const EVENTS_QUEUE: usize = 4096;

/// A reader of the box's events, of the NF `?nf=NAME` names (every NF without).
fn events_stream(
    query: Option<&str>,
) -> std::result::Result<std::sync::mpsc::Receiver<String>, String> {
    let mut nf = None;
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=') {
            Some(("nf", v)) if !v.is_empty() => nf = Some(v),
            _ => return Err(format!("unknown parameter {pair:?} (expected nf=NAME)")),
        }
    }
    Ok(flowstate_nf::event_stream::hub().subscribe(nf, EVENTS_QUEUE))
}

/// A chain run (a live box, or any `flowstate run`) seen through its observer; a live box
/// reloads its configuration file with `reloader`.
pub(crate) struct ChainProvider {
    pub(crate) observer: Arc<Observer>,
    pub(crate) reloader: Option<Arc<flowstate_deploy::reload::Reloader>>,
}

impl Provider for ChainProvider {
    fn metrics(&self, m: &mut Metrics) {
        m.gauge("up", "1 while the process serves its metrics.", &[], 1);
        let Some(s) = self.observer.summary() else {
            return;
        };
        chain_metrics(&s, m);
        for t in self.observer.state_call_times() {
            if t.buckets.iter().all(|&n| n == 0) {
                continue; // an in-process store: called inline, not timed
            }
            let w = t.worker.to_string();
            m.histogram(
                "state_call_duration_seconds",
                "Time a worker's state thread waited for the store, per call (a flush or a round trip).",
                &[("worker", &w)],
                Histogram::from_log2(&t.buckets, 1e-6, t.sum_s),
            );
        }
        for t in self.observer.batch_times() {
            let w = t.worker.to_string();
            m.histogram(
                "batch_duration_seconds",
                "Time a worker took to run one batch through the chain (the data path's latency per batch).",
                &[("worker", &w)],
                Histogram::from_log2(&t.buckets[..BATCH_BUCKETS], 1e-6, t.sum_s),
            );
        }
    }

    fn info(&self) -> Info {
        Info {
            role: "chain".into(),
            document: "summary".into(),
        }
    }

    fn api(&self, name: &str) -> Option<String> {
        self.api_page(name, &Page::default())
    }

    /// `events[?nf=NF]`: the NFs' events as they happen ([`flowstate_nf::event_stream`]).
    fn stream(
        &self,
        name: &str,
        query: Option<&str>,
    ) -> Option<std::result::Result<std::sync::mpsc::Receiver<String>, String>> {
        (name == "events").then(|| events_stream(query))
    }

    /// `summary`; `tables` (the chain's NFs and their tables); `tables/NF/TABLE` (a page of
    /// the rows every worker holds now, [`page_of_table`], or `{"error": ...}` for an NF or
    /// table the chain lacks).
    fn api_page(&self, name: &str, page: &Page) -> Option<String> {
        if name == "summary" {
            let s = self.observer.summary().unwrap_or_default();
            return serde_json::to_string_pretty(&s).ok();
        }
        if name == "tables" {
            let chain: Vec<_> = self
                .observer
                .tables()
                .into_iter()
                .map(|(nf, tables)| {
                    let tables: Vec<_> = tables
                        .iter()
                        .map(|t| serde_json::json!({"name": t.name, "about": t.about, "columns": t.columns}))
                        .collect();
                    serde_json::json!({"nf": nf, "tables": tables})
                })
                .collect();
            return serde_json::to_string_pretty(&chain).ok();
        }
        let (nf, table) = name.strip_prefix("tables/")?.split_once('/')?;
        let doc = match self.observer.table(nf, table, TABLE_WAIT) {
            Ok(t) => page_of_table(serde_json::to_value(&t).ok()?, page),
            Err(e) => serde_json::json!({ "error": e.to_string() }),
        };
        serde_json::to_string_pretty(&doc).ok()
    }

    /// `reload`: the configuration file read again ([`flowstate_deploy::reload`]).
    fn post(&self, name: &str) -> Option<Result<String, String>> {
        if name != "reload" {
            return None;
        }
        Some(reload_answer(self.reloader.as_deref()?))
    }
}
/// Reloads with `reloader`, logging the outcome: the JSON answer of `POST /api/v1/reload`
/// (`{"changed": [...], "generation": N}`), or that of its refusal (`{"errors": [...]}`).
pub(crate) fn reload_answer(
    reloader: &flowstate_deploy::reload::Reloader,
) -> Result<String, String> {
    match reloader.reload() {
        Ok(r) => {
            tracing::info!(changed = ?r.changed, generation = r.generation, "reloaded {}", reloader.path().display());
            Ok(serde_json::to_string(&r).unwrap_or_default())
        }
        Err(errors) => {
            tracing::error!(
                "reload refused, the configuration running stays: {}",
                errors.join("; ")
            );
            Err(serde_json::json!({ "errors": errors }).to_string())
        }
    }
}

/// A table document (`rows` an array of rows) with only the rows of `page`, and `total` (the
/// rows the table holds now) and `next` (the `after` of the next page; `null` after the last).
///
/// A row's key for paging is its text cells (protocol, endpoints, addresses, state names):
/// what an entry is, not its counts or time left, which change from one page to the next.
pub(crate) fn page_of_table(mut doc: serde_json::Value, page: &Page) -> serde_json::Value {
    if !doc.is_object() {
        return doc;
    }
    let rows = match doc.get_mut("rows").map(serde_json::Value::take) {
        Some(serde_json::Value::Array(rows)) => rows,
        _ => Vec::new(),
    };
    let total = rows.len();
    let keyed = rows
        .into_iter()
        .map(|row| {
            let mut key = Vec::new();
            for cell in row.as_array().into_iter().flatten() {
                if let Some(text) = cell.as_str() {
                    key.extend_from_slice(text.as_bytes());
                }
                // Cells apart, whatever their text: a separator below every printable byte.
                key.push(0);
            }
            (key, row)
        })
        .collect();
    let (rows, next) = page.select(keyed);
    doc["rows"] = serde_json::Value::Array(rows);
    doc["total"] = total.into();
    doc["next"] = next.map(|c| c.encode()).into();
    doc
}

/// How long `/api/v1/tables/NF/TABLE` waits for every worker's rows.
pub(crate) const TABLE_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

const NF_GAUGE: &str = "A level an NF reports (table fill, free ports), summed over workers.";
const NF_COUNTER: &str = "A total an NF counts, summed over workers.";

/// The metrics of a run's summary.
pub(crate) fn chain_metrics(s: &Summary, m: &mut Metrics) {
    let backend = s.backend.as_str();
    let workers = s.workers.to_string();
    m.gauge(
        "run_info",
        "The run's settings as labels; the value is 1.",
        &[("backend", backend), ("workers", &workers)],
        1,
    );
    m.counter_f64(
        "run_seconds",
        "Time since the workers started.",
        &[],
        s.wall_s,
    );
    m.counter(
        "input_packets",
        "Packets read from the input (malformed ones included).",
        &[],
        s.packets_in,
    );
    m.counter(
        "output_packets",
        "Packets the chain forwarded to the output (reflected replies included).",
        &[],
        s.packets_out,
    );
    m.counter(
        "reflected_packets",
        "Replies the reflect stage built and sent through the chain.",
        &[],
        s.reflected,
    );
    m.counter(
        "flow_cache_packets",
        "Packets the workers' flow caches forwarded past the NFs ([runtime] flow_cache).",
        &[],
        s.flow_cache,
    );
    m.counter(
        "skipped_packets",
        "Inbound input packets skipped by [input] outbound_only.",
        &[],
        s.skipped,
    );
    for (reason, n) in &s.malformed {
        m.counter(
            "malformed_packets",
            "Packets dropped before the chain because they could not be parsed, by reason.",
            &[("reason", reason)],
            *n,
        );
    }
    for nf in &s.nfs {
        let name = nf.name.as_str();
        m.counter(
            "nf_packets",
            "Packets an NF processed.",
            &[("nf", name)],
            nf.packets_in,
        );
        m.counter(
            "nf_forwarded_packets",
            "Packets an NF forwarded.",
            &[("nf", name)],
            nf.forwarded,
        );
        for (reason, n) in &nf.dropped {
            m.counter(
                "drops",
                "Packets an NF dropped, by reason.",
                &[("nf", name), ("reason", reason)],
                *n,
            );
        }
        // An NF's own report, summed over workers: the gauges it names (its tables' fill,
        // free pool ports) and counters (-1: the NF could not read it from its state).
        for (key, v) in &nf.report {
            let metric = format!("nf_{key}");
            if nf.is_gauge(key) {
                m.gauge(&metric, NF_GAUGE, &[("nf", name)], *v);
            } else {
                m.counter(&metric, NF_COUNTER, &[("nf", name)], (*v).max(0) as u64);
            }
        }
        for l in &nf.labelled {
            let metric = format!("nf_{}", l.name);
            let labels: &[(&str, &str)] = &[("nf", name), (&l.label, &l.value)];
            if l.gauge {
                m.gauge(&metric, NF_GAUGE, labels, l.count);
            } else {
                m.counter(&metric, NF_COUNTER, labels, l.count.max(0) as u64);
            }
        }
    }
    for w in &s.per_worker {
        let i = w.index.to_string();
        let l: &[(&str, &str)] = &[("worker", &i)];
        m.counter(
            "worker_packets",
            "Input packets a worker processed.",
            l,
            w.packets,
        );
        m.counter(
            "worker_output_packets",
            "Packets a worker forwarded.",
            l,
            w.packets_out,
        );
        m.counter_f64(
            "worker_busy_seconds",
            "Time a worker spent processing batches.",
            l,
            w.busy_s,
        );
        m.counter(
            "state_flushes",
            "Flush batches a worker's state partition handed to the store.",
            l,
            w.state_flushes,
        );
        m.counter(
            "state_flush_errors",
            "Store calls of a worker's state partition that failed (failed flushes are sent again).",
            l,
            w.state_errors,
        );
        m.counter(
            "state_lost_ops",
            "State operations given up after more failed flushes than [state] retain_ops.",
            l,
            w.state_lost_ops,
        );
    }
    for (key, v) in &s.live_box {
        live_box_metric(key, *v, m);
    }
}

/// One of a live box's own counters.
fn live_box_metric(key: &str, v: u64, m: &mut Metrics) {
    for port in ["inside", "outside"] {
        for direction in ["rx", "tx"] {
            if key == format!("{port}_{direction}_packets") {
                m.counter(
                    "packets",
                    "Frames a live box's port received (IPv4 for the box) or sent.",
                    &[("port", port), ("direction", direction)],
                    v,
                );
                return;
            }
        }
    }
    match key {
        "fast_path_packets" => m.counter(
            "fast_path_packets",
            "Packets the XDP fast path forwarded without the chain.",
            &[],
            v,
        ),
        "fast_path_bytes" => m.counter(
            "fast_path_bytes",
            "Bytes the XDP fast path forwarded without the chain.",
            &[],
            v,
        ),
        "fast_path_errors" => m.counter(
            "fast_path_errors",
            "Fast-path entries that could not be written.",
            &[],
            v,
        ),
        _ => m.counter(
            &format!("box_{key}"),
            "A live box's own counter (ARP, neighbours, frames not for the box, send drops).",
            &[],
            v,
        ),
    }
}

/// A table pipeline in XDP on a live box (`[fastpath]`), seen through the summary its slow
/// path publishes every 100 ms.
pub(crate) struct PipelineProvider(
    pub(crate) Arc<arc_swap::ArcSwapOption<flowstate_deploy::pipeline::PipelineSummary>>,
);

impl Provider for PipelineProvider {
    fn info(&self) -> Info {
        Info {
            role: "pipeline".into(),
            document: "summary".into(),
        }
    }

    fn metrics(&self, m: &mut Metrics) {
        m.gauge("up", "1 while the process serves its metrics.", &[], 1);
        let Some(s) = self.0.load_full() else { return };
        m.gauge(
            "run_info",
            "The run's settings as labels; the value is 1.",
            &[("backend", &s.backend), ("mode", &s.mode)],
            1,
        );
        m.counter_f64(
            "run_seconds",
            "Time since the pipeline started.",
            &[],
            s.seconds,
        );
        for (name, help, v) in [
            (
                "input_packets",
                "Packets the tables saw (each once, however often it circulated).",
                s.packets_in,
            ),
            (
                "output_packets",
                "Packets forwarded or passed unmatched.",
                s.packets_out,
            ),
            (
                "pipeline_dropped_packets",
                "Packets a table dropped.",
                s.dropped,
            ),
            (
                "pipeline_unmatched_packets",
                "Packets the tables cannot match (ARP, ICMP, IPv6, later fragments), passed on.",
                s.unmatched,
            ),
            (
                "pipeline_fast_path_only_packets",
                "Packets done in the fast path without a circulation.",
                s.fast_path_only,
            ),
            (
                "pipeline_circulations",
                "Circulations to the slow path.",
                s.circulations,
            ),
            (
                "pipeline_searches",
                "Full-table searches the slow path answered.",
                s.searches,
            ),
            (
                "pipeline_link_bytes",
                "Bytes between fast and slow path, both ways.",
                s.link_bytes,
            ),
            (
                "pipeline_bloom_guesses",
                "Branches chosen by the 2D Bloom filters.",
                s.bloom_guesses,
            ),
            (
                "pipeline_bloom_false_positives",
                "Bloom false positives detected.",
                s.bloom_unsure,
            ),
        ] {
            m.counter(name, help, &[], v);
        }
        if let Some(l) = &s.live {
            for (reason, v) in [
                ("malformed", l.malformed),
                ("forged", l.forged),
                ("no_room", l.no_room),
                ("no_socket", l.no_socket),
            ] {
                m.counter(
                    "pipeline_lost_frames",
                    "Frames between the program and the slow path dropped, by reason.",
                    &[("reason", reason)],
                    v,
                );
            }
        }
        for t in &s.tables {
            let l: &[(&str, &str)] = &[("table", &t.name)];
            m.gauge(
                "table_rules",
                "Rules in a table's full copy.",
                l,
                t.rules as i64,
            );
            m.gauge(
                "table_cached_entries",
                "Entries in a table's fast-path cache.",
                l,
                t.cached as i64,
            );
            for (result, v) in [("hit", t.hits), ("miss", t.misses)] {
                m.counter(
                    "table_lookups",
                    "Fast-path cache lookups of a table, by result.",
                    &[("table", &t.name), ("result", result)],
                    v,
                );
            }
            m.counter(
                "table_installs",
                "Entries installed in a table's cache.",
                l,
                t.installed,
            );
            m.counter(
                "table_evictions",
                "Entries evicted from a table's cache.",
                l,
                t.evicted,
            );
        }
    }

    fn api(&self, name: &str) -> Option<String> {
        let s = self.0.load_full();
        (name == "summary").then(|| {
            serde_json::to_string_pretty(&s.as_deref().cloned().unwrap_or_default()).ok()
        })?
    }
}

/// A cluster role (root, instance) seen through the stats it publishes (the same document
/// `flowstate cluster status` reads from its file): each number becomes
/// `flowstate_<role>_<field>`, a gauge if `gauges` names it, else a counter; a map of numbers
/// (`drop_reasons`) a labelled counter; `partitions` the number owned; `assignment_versions`
/// and `assignment_terms` a gauge per stage. `pid`, `id` and `stage` are labels of `<role>_info`.
pub(crate) struct ClusterRoleProvider {
    pub(crate) role: &'static str,
    /// The `/api/v1/NAME` document of the stats (`stats`; the controller's `cluster`).
    pub(crate) document: &'static str,
    pub(crate) gauges: &'static [&'static str],
    pub(crate) slot: Arc<arc_swap::ArcSwapOption<serde_json::Value>>,
}

/// The root's stats that are levels.
pub(crate) const ROOT_GAUGES: &[&str] = &[
    "moving",
    "root_epoch",
    "clock",
    "ready_ms",
    "move_ms_p50",
    "held",
];

/// An instance's stats that are levels.
pub(crate) const INSTANCE_GAUGES: &[&str] = &["load", "assignment_version"];

/// The controller's numbers that are levels (its document is `cluster status`'s).
pub(crate) const CONTROLLER_GAUGES: &[&str] = &[];

impl Provider for ClusterRoleProvider {
    fn info(&self) -> Info {
        Info {
            role: self.role.into(),
            document: self.document.into(),
        }
    }

    fn metrics(&self, m: &mut Metrics) {
        m.gauge("up", "1 while the process serves its metrics.", &[], 1);
        let Some(stats) = self.slot.load_full() else {
            return;
        };
        let Some(fields) = stats.as_object() else {
            return;
        };
        let role = self.role;
        let text = |k: &str| fields.get(k).map(|v| v.to_string()).unwrap_or_default();
        let (pid, id, stage) = (text("pid"), text("id"), text("stage"));
        let mut labels: Vec<(&str, &str)> = vec![("pid", &pid)];
        if fields.contains_key("id") {
            labels.extend([("id", id.as_str()), ("stage", stage.as_str())]);
        }
        m.gauge(
            &format!("{role}_info"),
            "This role's identity as labels; the value is 1.",
            &labels,
            1,
        );
        let help = format!("A {role}'s own number (see flowstate cluster status).");
        for (k, v) in fields {
            let name = format!("{role}_{k}");
            match v {
                serde_json::Value::Number(n) if !matches!(k.as_str(), "pid" | "id" | "stage") => {
                    if self.gauges.contains(&k.as_str()) {
                        m.gauge_f64(&name, &help, &[], n.as_f64().unwrap_or(0.0));
                    } else {
                        m.counter(&name, &help, &[], n.as_u64().unwrap_or(0));
                    }
                }
                serde_json::Value::Object(map) => {
                    for (reason, n) in map {
                        m.counter(&name, &help, &[("reason", reason)], n.as_u64().unwrap_or(0));
                    }
                }
                serde_json::Value::Array(items) if k == "partitions" => {
                    m.gauge(
                        &name,
                        "Traffic partitions this instance owns now.",
                        &[],
                        items.len() as i64,
                    );
                }
                serde_json::Value::Array(items)
                    if k == "assignment_versions" || k == "assignment_terms" =>
                {
                    for (i, n) in items.iter().enumerate() {
                        let stage = i.to_string();
                        m.gauge(&name, &help, &[("stage", &stage)], n.as_i64().unwrap_or(0));
                    }
                }
                _ => {}
            }
        }
    }

    fn api(&self, name: &str) -> Option<String> {
        let stats = self.slot.load_full();
        (name == self.document).then(|| {
            let v = stats.as_deref().cloned().unwrap_or(serde_json::Value::Null);
            serde_json::to_string_pretty(&v).ok()
        })?
    }
}

/// `flowstate store` seen through its counters.
pub(crate) struct StoreProvider(pub(crate) flowstate_store::CountersHandle);

impl Provider for StoreProvider {
    fn metrics(&self, m: &mut Metrics) {
        m.gauge("up", "1 while the process serves its metrics.", &[], 1);
        let c = self.0.read();
        for (op, n) in &c.ops {
            m.counter(
                "store_operations",
                "Operations the store applied, by type.",
                &[("op", op)],
                *n,
            );
        }
        m.gauge(
            "store_connections",
            "Open client connections.",
            &[],
            c.connections as i64,
        );
        m.counter(
            "store_connections_accepted",
            "Client connections accepted since the start.",
            &[],
            c.connections_total,
        );
        m.gauge(
            "store_objects",
            "Objects the store holds.",
            &[],
            c.objects as i64,
        );
        m.gauge(
            "store_wal_lag_bytes",
            "Write-ahead log bytes a restart would replay.",
            &[],
            c.wal_lag_bytes as i64,
        );
        m.counter(
            "store_checkpoints",
            "Checkpoints written.",
            &[],
            c.checkpoints,
        );
        m.counter(
            "store_errors",
            "Error frames sent to clients.",
            &[],
            c.errors,
        );
        m.counter(
            "store_duplicates",
            "Retransmitted batches recognised and not applied again.",
            &[],
            c.duplicates,
        );
        m.counter(
            "store_notifications",
            "Notifications (callbacks) sent to clients.",
            &[],
            c.notifications,
        );
        m.gauge("store_shards", "Shard threads.", &[], c.shards as i64);
        m.gauge(
            "process_resident_memory_bytes",
            "Resident memory of the process.",
            &[],
            c.memory_bytes as i64,
        );
        m.counter_f64(
            "uptime_seconds",
            "Seconds since the start.",
            &[],
            c.uptime_s,
        );
    }

    fn info(&self) -> Info {
        Info {
            role: "store".into(),
            document: "stats".into(),
        }
    }

    fn api(&self, name: &str) -> Option<String> {
        if name != "summary" && name != "stats" {
            return None;
        }
        let c = self.0.read();
        let ops: serde_json::Map<String, serde_json::Value> = c
            .ops
            .iter()
            .map(|(n, v)| ((*n).to_owned(), (*v).into()))
            .collect();
        let v = serde_json::json!({
            "ops": ops,
            "connections": c.connections,
            "connections_total": c.connections_total,
            "objects": c.objects,
            "wal_lag_bytes": c.wal_lag_bytes,
            "checkpoints": c.checkpoints,
            "errors": c.errors,
            "duplicates": c.duplicates,
            "notifications": c.notifications,
            "shards": c.shards,
            "memory_bytes": c.memory_bytes,
            "uptime_s": c.uptime_s,
        });
        serde_json::to_string_pretty(&v).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_is_answered_a_page_at_a_time_keyed_by_its_text_cells() {
        let rows: Vec<serde_json::Value> = (0..25)
            .map(|i| serde_json::json!(["tcp", format!("10.0.0.{i}:1"), 25 - i]))
            .collect();
        let doc = serde_json::json!({"nf": "nat", "rows": rows, "workers": 1});
        let first = page_of_table(doc.clone(), &Page::default());
        assert_eq!(first["rows"].as_array().unwrap().len(), 25);
        assert_eq!(
            (first["total"].as_u64(), first["next"].is_null()),
            (Some(25), true)
        );
        let mut page = Page::parse(Some("limit=10")).unwrap();
        let mut seen = Vec::new();
        loop {
            // Counts change between pages; the order does not.
            let mut now = doc.clone();
            for r in now["rows"].as_array_mut().unwrap() {
                r[2] = serde_json::json!(r[2].as_i64().unwrap() - 1);
            }
            let p = page_of_table(now, &page);
            assert!(p["rows"].as_array().unwrap().len() <= 10);
            seen.extend(p["rows"].as_array().unwrap().iter().map(|r| r[1].clone()));
            match p["next"].as_str() {
                Some(c) => page = Page::parse(Some(&format!("limit=10&after={c}"))).unwrap(),
                None => break,
            }
        }
        assert_eq!(seen.len(), 25);
        let mut want: Vec<_> = rows.iter().map(|r| r[1].clone()).collect();
        want.sort_by(|a, b| a.as_str().cmp(&b.as_str()));
        assert_eq!(seen, want);
        // Not a table: as it is, no panic.
        assert_eq!(
            page_of_table(serde_json::json!([1]), &page),
            serde_json::json!([1])
        );
    }

    #[test]
    fn a_summary_becomes_labelled_metrics() {
        let s: Summary = Summary {
            packets_in: 10,
            packets_out: 8,
            dropped_total: 2,
            dropped: [("firewall.not_allowed".to_owned(), 2)].into(),
            workers: 1,
            backend: "local".into(),
            nfs: vec![flowstate_chain::NfSummary {
                name: "firewall".into(),
                packets_in: 10,
                forwarded: 8,
                dropped: [("not_allowed".to_owned(), 2)].into(),
                report: [("tracked".to_owned(), 3), ("conns_opened".to_owned(), 5)].into(),
                gauges: vec!["tracked".into()],
                labelled: vec![flowstate_chain::LabelledSummary {
                    name: "backend_active".into(),
                    label: "backend".into(),
                    value: "10.0.0.1:80".into(),
                    count: 2,
                    gauge: true,
                }],
            }],
            live_box: [
                ("inside_rx_packets".to_owned(), 6),
                ("arp_answered".to_owned(), 1),
            ]
            .into(),
            ..Summary::default()
        };
        let mut m = Metrics::new();
        chain_metrics(&s, &mut m);
        let t = m.encode();
        for line in [
            "flowstate_input_packets_total 10\n",
            "flowstate_output_packets_total 8\n",
            "flowstate_nf_packets_total{nf=\"firewall\"} 10\n",
            "flowstate_drops_total{nf=\"firewall\",reason=\"not_allowed\"} 2\n",
            "flowstate_nf_tracked{nf=\"firewall\"} 3\n",
            "# TYPE flowstate_nf_tracked gauge\n",
            "flowstate_nf_conns_opened_total{nf=\"firewall\"} 5\n",
            "# TYPE flowstate_nf_conns_opened counter\n",
            "flowstate_nf_backend_active{nf=\"firewall\",backend=\"10.0.0.1:80\"} 2\n",
            "flowstate_packets_total{port=\"inside\",direction=\"rx\"} 6\n",
            "flowstate_box_arp_answered_total 1\n",
        ] {
            assert!(t.contains(line), "{line} in\n{t}");
        }
    }
}
