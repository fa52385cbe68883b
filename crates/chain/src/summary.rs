//! What a run did: packet counts, drops by NF and reason, malformed packets by reason, per
//! worker load, throughput, and each NF's own report summed over workers.
//!
//! Every packet is accounted for:
//! `packets_in + reflected == packets_out + dropped_total + skipped`, where
//! `dropped_total` sums `dropped` (NF verdicts and fragments the runtime dropped,
//! `fragments.*`) and `malformed`.

use crate::fragments::FragmentCounts;
use flowstate_nf::stage::StageReport;
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt;
use std::time::{Duration, Instant};

/// The summary of one run. Serializes to one JSON object (see the crate documentation).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Summary {
    /// Packets read from the input (malformed ones included).
    pub packets_in: u64,
    /// Replies the reflect stage built and sent through the chain.
    pub reflected: u64,
    /// Packets forwarded to the output (input packets and reflected replies).
    pub packets_out: u64,
    /// Packets dropped: NF verdicts plus malformed packets.
    pub dropped_total: u64,
    /// NF drops by `nf.reason` (`nat.no_mapping`; see [`key`]), and IPv4 fragments the
    /// runtime dropped by `fragments.reason` ([`crate::fragments`]).
    pub dropped: BTreeMap<String, u64>,
    /// Malformed packets (dropped before the chain) by `layer.reason` (`ipv4.bad_checksum`).
    pub malformed: BTreeMap<String, u64>,
    /// Inbound input packets skipped by `[input] outbound_only`.
    pub skipped: u64,
    /// Packets the workers' flow caches forwarded past the NFs (`[runtime] flow_cache`,
    /// [`flowstate_nf::stage::FlowCache`]): in `packets_out`, in no NF's `packets_in`.
    #[serde(skip_serializing_if = "is_zero")]
    pub flow_cache: u64,
    /// Times the flow caches told the NFs of a flow they held, to renew its timers
    /// ([`flowstate_nf::NetworkFunction::active_until`]).
    #[serde(skip_serializing_if = "is_zero")]
    pub flow_cache_renewals: u64,
    /// Flows the flow caches handed back to the NFs as their entries ended.
    #[serde(skip_serializing_if = "is_zero")]
    pub flow_cache_handbacks: u64,
    /// Wall-clock processing time, seconds: from the moment every worker was ready until
    /// the last one had processed its last packet.
    pub wall_s: f64,
    /// Seconds after that until every worker had written its state out to the store (the
    /// final flush at the stop).
    pub write_out_s: f64,
    /// Packets the chain ran (input packets neither skipped nor malformed, and the reflect
    /// stage's replies) per wall-clock microsecond: millions of packets a second.
    pub mpps: f64,
    /// Number of workers.
    pub workers: usize,
    /// The state backend's name.
    pub backend: String,
    /// Per worker.
    pub per_worker: Vec<WorkerSummary>,
    /// Per NF of the chain, in chain order, summed over workers.
    pub nfs: Vec<NfSummary>,
    /// A live box's own counters (ARP, neighbours, its XDP fast path), outside the balance
    /// above: packets the fast path forwarded never reached the chain. Empty otherwise.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub live_box: BTreeMap<String, u64>,
    /// IPv4 fragments ([`crate::fragments`]): `datagrams` seen, later fragments `tracked`
    /// (given their datagram's ports), `held` for their first fragment and `released` after
    /// it. Empty when no fragment came.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub fragments: BTreeMap<String, u64>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// One worker's share.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct WorkerSummary {
    /// Worker index.
    pub index: usize,
    /// Input packets it processed (after the dispatcher; malformed ones only in generated
    /// mode, where the worker dissects).
    pub packets: u64,
    /// Replies it reflected.
    pub reflected: u64,
    /// Packets it forwarded to the output.
    pub packets_out: u64,
    /// Time spent processing batches, seconds.
    pub busy_s: f64,
    /// Time its state write-out at the stop took, seconds.
    pub write_out_s: f64,
    /// Flush batches its partition handed to the store.
    pub state_flushes: u64,
    /// Store calls that failed (failed flushes are kept and sent again).
    pub state_errors: u64,
    /// State operations given up (more failed flushes than `[state] retain_ops`).
    pub state_lost_ops: u64,
}

/// One NF's counters, summed over workers.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct NfSummary {
    /// The NF's name.
    pub name: String,
    /// Packets it processed.
    pub packets_in: u64,
    /// Packets it forwarded.
    pub forwarded: u64,
    /// Packets it dropped, by reason (`no_mapping`; see [`key`]).
    pub dropped: BTreeMap<String, u64>,
    /// Its `report()`, summed over workers: counters, and the gauges `gauges` names.
    pub report: BTreeMap<String, i64>,
    /// The entries of `report` that are gauges (levels: table fill, free ports), the others
    /// being counters (totals since the start).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub gauges: Vec<String>,
    /// Entries that vary by a label (the LB's per backend), summed over workers.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub labelled: Vec<LabelledSummary>,
}

/// One labelled report entry: `name{label="value"} count`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct LabelledSummary {
    /// The entry (`backend_connections`).
    pub name: String,
    /// The label's name (`backend`).
    pub label: String,
    /// The label's value (`192.0.2.11:443`).
    pub value: String,
    /// The number, summed over workers.
    pub count: i64,
    /// Whether it is a gauge.
    pub gauge: bool,
}

impl NfSummary {
    /// Whether report entry `name` is a gauge.
    pub fn is_gauge(&self, name: &str) -> bool {
        self.gauges.iter().any(|g| g == name)
    }
}

/// A reason's text as a key for JSON, metrics and the text summary alike: lower case, runs of
/// anything but letters and digits as one `_` (`"no mapping (port pool)"` → `no_mapping_port_pool`).
pub(crate) fn key(text: &str) -> String {
    let mut k = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_ascii_alphanumeric() {
            k.push(c.to_ascii_lowercase());
        } else if !k.is_empty() && !k.ends_with('_') {
            k.push('_');
        }
    }
    while k.ends_with('_') {
        k.pop();
    }
    k
}

impl Summary {
    /// Whether every packet is accounted for (see the module documentation).
    pub fn balanced(&self) -> bool {
        self.packets_in + self.reflected == self.packets_out + self.dropped_total + self.skipped
    }

    /// Packets dropped by NF verdicts (without malformed ones).
    pub fn nf_dropped(&self) -> u64 {
        self.dropped.values().sum()
    }

    /// Malformed packets.
    pub fn malformed_total(&self) -> u64 {
        self.malformed.values().sum()
    }
}

/// The text summary: every number with what it counts. Zero report entries are left out of
/// the text (the JSON has them all).
impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let line = |f: &mut fmt::Formatter<'_>, name: &str, n: u64, what: &str| {
            writeln!(f, "{name:<18} {n:>12}  {what}")
        };
        line(f, "packets in", self.packets_in, "read from the input")?;
        if self.skipped > 0 {
            line(
                f,
                "  skipped inbound",
                self.skipped,
                "of them outside-to-inside, left out ([input] outbound_only)",
            )?;
        }
        if self.reflected > 0 {
            line(
                f,
                "reflected",
                self.reflected,
                "answers the reflect stage sent back through the chain, as the outside hosts",
            )?;
        }
        line(
            f,
            "packets out",
            self.packets_out,
            "forwarded by the whole chain",
        )?;
        if self.flow_cache > 0 {
            line(
                f,
                "  flow cache",
                self.flow_cache,
                "of them past the NFs, by the workers' flow caches ([runtime] flow_cache)",
            )?;
            line(
                f,
                "    renewals",
                self.flow_cache_renewals,
                "times the caches renewed the NFs' timers of a flow they held",
            )?;
            line(
                f,
                "    handed back",
                self.flow_cache_handbacks,
                "flows the caches handed back to the NFs as they went idle",
            )?;
        }
        line(f, "dropped", self.dropped_total, "by an NF, or malformed")?;
        let width = self
            .dropped
            .keys()
            .map(|k| k.chars().count())
            .chain(self.malformed.keys().map(|k| k.chars().count() + 10))
            .max()
            .unwrap_or(0)
            .max(16);
        for (reason, n) in &self.dropped {
            writeln!(f, "  {reason:<width$} {n:>12}")?;
        }
        for (reason, n) in &self.malformed {
            let reason = format!("malformed.{reason}");
            writeln!(f, "  {reason:<width$} {n:>12}")?;
        }
        if !self.fragments.is_empty() {
            let n = |k: &str| self.fragments.get(k).copied().unwrap_or(0);
            line(
                f,
                "fragments",
                n("datagrams"),
                &format!(
                    "IPv4 datagrams in fragments: {} later fragments tracked, {} held for their first, {} released",
                    n("tracked"),
                    n("held"),
                    n("released")
                ),
            )?;
        }
        writeln!(
            f,
            "{:<18} {:>12.3}  s of processing, {:.3} Mpps (packets the chain ran per second), {} worker(s), state: {}",
            "time", self.wall_s, self.mpps, self.workers, self.backend
        )?;
        if self.write_out_s > 0.0 {
            writeln!(
                f,
                "{:<18} {:>12.3}  s after the last packet, writing the state out to the store",
                "write-out", self.write_out_s
            )?;
        }
        for (name, n) in &self.live_box {
            writeln!(f, "  box {name:<20} {n:>12}")?;
        }
        for w in &self.per_worker {
            writeln!(
                f,
                "  worker {:<3} {:>12} packets  {:>10} out  busy {:.3} s",
                w.index, w.packets, w.packets_out, w.busy_s
            )?;
        }
        for nf in &self.nfs {
            writeln!(
                f,
                "nf {:<15} {:>12} in  {:>12} forwarded  {:>10} dropped",
                nf.name,
                nf.packets_in,
                nf.forwarded,
                nf.dropped.values().sum::<u64>()
            )?;
            let entries = |gauge: bool| {
                nf.report
                    .iter()
                    .filter(move |(k, v)| **v != 0 && nf.is_gauge(k) == gauge)
            };
            for (title, gauge) in [("now", true), ("total", false)] {
                for (i, (k, v)) in entries(gauge).enumerate() {
                    let title = if i == 0 { title } else { "" };
                    writeln!(f, "  {title:<6} {k:<28} {v:>12}")?;
                }
            }
            write_labelled(f, &nf.labelled)?;
        }
        Ok(())
    }
}

/// Labelled entries as a table per label: a row per label value, a column per entry (its
/// name without the label's prefix: `backend_active` under `backend` is `active`).
fn write_labelled(f: &mut fmt::Formatter<'_>, entries: &[LabelledSummary]) -> fmt::Result {
    let mut labels: Vec<&str> = entries.iter().map(|e| e.label.as_str()).collect();
    labels.dedup();
    for label in labels {
        let of_label = || entries.iter().filter(move |e| e.label == label);
        let mut columns: Vec<&str> = Vec::new();
        let mut rows: Vec<&str> = Vec::new();
        for e in of_label() {
            if !columns.contains(&e.name.as_str()) {
                columns.push(&e.name);
            }
            if !rows.contains(&e.value.as_str()) {
                rows.push(&e.value);
            }
        }
        let short = |c: &str| {
            c.strip_prefix(label)
                .and_then(|c| c.strip_prefix('_'))
                .unwrap_or(c)
                .to_owned()
        };
        let width = rows
            .iter()
            .map(|r| r.len())
            .max()
            .unwrap_or(0)
            .max(label.len());
        write!(f, "  {label:<width$}")?;
        for c in &columns {
            write!(f, " {:>12}", short(c))?;
        }
        writeln!(f)?;
        for r in rows {
            write!(f, "  {r:<width$}")?;
            for c in &columns {
                let n = of_label()
                    .find(|e| e.name == *c && e.value == r)
                    .map_or(0, |e| e.count);
                write!(f, " {n:>12}")?;
            }
            writeln!(f)?;
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// What workers report, and the summary made of it

/// Input-side counts (the dispatcher's, or a generating worker's).
#[derive(Debug, Default, Clone)]
pub(crate) struct Counts {
    pub(crate) packets_in: u64,
    pub(crate) skipped: u64,
    /// Malformed packets by error; few distinct errors, so a short list.
    pub(crate) malformed: Vec<(flowstate_wire::Error, u64)>,
    pub(crate) fragments: FragmentCounts,
}

impl Counts {
    pub(crate) fn malformed(&mut self, e: flowstate_wire::Error) {
        match self.malformed.iter_mut().find(|(k, _)| *k == e) {
            Some((_, n)) => *n += 1,
            None => self.malformed.push((e, 1)),
        }
    }

    pub(crate) fn merge(&mut self, other: &Counts) {
        self.packets_in += other.packets_in;
        self.skipped += other.skipped;
        self.fragments.merge(&other.fragments);
        for &(e, k) in &other.malformed {
            match self.malformed.iter_mut().find(|(x, _)| *x == e) {
                Some((_, n)) => *n += k,
                None => self.malformed.push((e, k)),
            }
        }
    }
}

/// What a worker hands back at the end (and publishes while running).
#[derive(Debug, Clone)]
pub(crate) struct WorkerReport {
    pub(crate) index: usize,
    pub(crate) counts: Counts,
    pub(crate) packets: u64,
    pub(crate) reflected: u64,
    pub(crate) out: u64,
    pub(crate) busy: Duration,
    /// When it had processed its last packet, and how long its state write-out at the stop
    /// took then (`None` and zero while it runs).
    pub(crate) processed: Option<Instant>,
    pub(crate) write_out: Duration,
    /// What the worker's stage counted.
    pub(crate) stage: StageReport,
    pub(crate) state_flushes: u64,
    pub(crate) state_errors: u64,
    pub(crate) state_lost_ops: u64,
}

/// The summary of the workers' `reports` and the dispatcher's counts.
pub(crate) fn summarize(
    workers: usize,
    backend: &str,
    chain: &[String],
    dispatched: Counts,
    reports: Vec<WorkerReport>,
    start: Instant,
    end: Instant,
) -> Summary {
    // Processing ends with the last packet of the last worker to finish (at `end` while one
    // still runs); the state write-out at the stop is timed apart: a store that outlives the
    // run needs it, the packets do not.
    let processed = reports
        .iter()
        .map(|r| r.processed)
        .collect::<Option<Vec<_>>>()
        .and_then(|done| done.into_iter().max())
        .unwrap_or(end);
    let mut s = Summary {
        workers,
        backend: backend.to_owned(),
        wall_s: processed.saturating_duration_since(start).as_secs_f64(),
        write_out_s: end.saturating_duration_since(processed).as_secs_f64(),
        ..Summary::default()
    };
    let mut counts = dispatched;
    s.nfs = chain
        .iter()
        .map(|name| NfSummary {
            name: name.clone(),
            ..NfSummary::default()
        })
        .collect();
    for r in reports {
        counts.merge(&r.counts);
        s.reflected += r.reflected;
        s.packets_out += r.out;
        s.flow_cache += r.stage.flow_cache;
        s.flow_cache_renewals += r.stage.flow_cache_renewals;
        s.flow_cache_handbacks += r.stage.flow_cache_handbacks;
        for (i, c) in r.stage.counters.iter().enumerate() {
            let Some(nf) = s.nfs.get_mut(i) else { continue };
            nf.packets_in += c.packets_in;
            nf.forwarded += c.forwarded;
            for &(reason, k) in &c.dropped {
                // NFs name themselves in their reasons ("nat: no mapping"): the key is the rest.
                let own = reason
                    .strip_prefix(nf.name.as_str())
                    .and_then(|r| r.strip_prefix(": "))
                    .unwrap_or(reason);
                *nf.dropped.entry(key(own)).or_default() += k;
            }
        }
        for (i, rep) in r.stage.reports.iter().enumerate() {
            let Some(nf) = s.nfs.get_mut(i) else { continue };
            for &(k, v) in rep {
                *nf.report.entry(k.to_owned()).or_default() += v;
            }
            if let Some(g) = r.stage.gauges.get(i) {
                nf.gauges = g.iter().map(|&g| g.to_owned()).collect();
            }
            for l in r.stage.labelled.get(i).into_iter().flatten() {
                match nf
                    .labelled
                    .iter_mut()
                    .find(|e| e.name == l.name && e.value == l.value)
                {
                    Some(e) => e.count += l.count,
                    None => nf.labelled.push(LabelledSummary {
                        name: l.name.to_owned(),
                        label: l.label.to_owned(),
                        value: l.value.clone(),
                        count: l.count,
                        gauge: l.gauge,
                    }),
                }
            }
        }
        s.per_worker.push(WorkerSummary {
            index: r.index,
            packets: r.packets,
            reflected: r.reflected,
            packets_out: r.out,
            busy_s: r.busy.as_secs_f64(),
            write_out_s: r.write_out.as_secs_f64(),
            state_flushes: r.state_flushes,
            state_errors: r.state_errors,
            state_lost_ops: r.state_lost_ops,
        });
    }
    for nf in &s.nfs {
        for (reason, k) in &nf.dropped {
            *s.dropped
                .entry(format!("{}.{reason}", nf.name))
                .or_default() += k;
        }
    }
    let f = counts.fragments;
    for (why, k) in crate::fragments::FragmentDrop::ALL.iter().zip(f.dropped) {
        if k > 0 {
            s.dropped.insert(format!("fragments.{}", why.name()), k);
        }
    }
    if f.datagrams > 0 {
        s.fragments = [
            ("datagrams", f.datagrams),
            ("tracked", f.tracked),
            ("held", f.held),
            ("released", f.released),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
    }
    s.packets_in = counts.packets_in;
    s.skipped = counts.skipped;
    s.malformed = counts
        .malformed
        .iter()
        .map(|(e, k)| {
            let text = e.to_string();
            let key = match text.split_once(": ") {
                Some((layer, what)) => format!("{}.{}", key(layer), key(what)),
                None => key(&text),
            };
            (key, *k)
        })
        .collect::<BTreeMap<_, _>>();
    s.dropped_total = s.nf_dropped() + s.malformed_total();
    // What the chain ran: input packets neither skipped nor malformed, and the replies.
    let ran = (s.packets_in + s.reflected).saturating_sub(s.skipped + s.malformed_total());
    s.mpps = if s.wall_s > 0.0 {
        ran as f64 / s.wall_s / 1e6
    } else {
        0.0
    };
    s
}
