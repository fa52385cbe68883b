//! What a run did: packet counts, drops by NF and reason, malformed packets by reason, per
//! worker load, throughput, and each NF's own report summed over workers.
//!
//! Every packet is accounted for:
//! `packets_in + reflected == packets_out + dropped_total + skipped`, where
//! `dropped_total` sums `dropped` (NF verdicts) and `malformed`.

use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt;

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
    /// NF drops by `"nf: reason"`.
    pub dropped: BTreeMap<String, u64>,
    /// Malformed packets (dropped before the chain) by `"layer: reason"`.
    pub malformed: BTreeMap<String, u64>,
    /// Inbound input packets skipped by `[input] outbound_only`.
    pub skipped: u64,
    /// Wall-clock processing time, seconds: from the moment every worker was ready until
    /// the last one finished (final state flush included).
    pub wall_s: f64,
    /// `packets_in` per wall-clock microsecond: millions of packets a second.
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
    /// Packets it dropped, by reason.
    pub dropped: BTreeMap<String, u64>,
    /// Its `report()`, summed over workers.
    pub report: BTreeMap<String, i64>,
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

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "packets in       {:>12}", self.packets_in)?;
        if self.reflected > 0 {
            writeln!(f, "reflected        {:>12}", self.reflected)?;
        }
        if self.skipped > 0 {
            writeln!(f, "skipped inbound  {:>12}", self.skipped)?;
        }
        writeln!(f, "packets out      {:>12}", self.packets_out)?;
        writeln!(f, "dropped          {:>12}", self.dropped_total)?;
        let width = self
            .dropped
            .keys()
            .map(|k| k.chars().count())
            .chain(self.malformed.keys().map(|k| k.chars().count() + 10))
            .max()
            .unwrap_or(0)
            .max(14);
        for (reason, n) in &self.dropped {
            writeln!(f, "  {reason:<width$} {n:>12}")?;
        }
        for (reason, n) in &self.malformed {
            let reason = format!("malformed {reason}");
            writeln!(f, "  {reason:<width$} {n:>12}")?;
        }
        writeln!(
            f,
            "time             {:>12.3} s   {:.3} Mpps   {} worker(s), state: {}",
            self.wall_s, self.mpps, self.workers, self.backend
        )?;
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
                "nf {:<13} {:>12} in  {:>12} forwarded  {:>10} dropped",
                nf.name,
                nf.packets_in,
                nf.forwarded,
                nf.dropped.values().sum::<u64>()
            )?;
            // Zero counters are left out of the text (the JSON has them all).
            for (k, v) in nf.report.iter().filter(|(_, v)| **v != 0) {
                writeln!(f, "  {k:<28} {v:>12}")?;
            }
        }
        Ok(())
    }
}
