//! flowstate's runtime: runs a chain of network functions over traffic on N worker threads.
//!
//! A [`Runtime`] takes the chain's [`NfFactory`](flowstate_nf::NfFactory)s and a state
//! [`Connector`](flowstate_state::Connector). Each worker
//! thread owns a state [`Partition`](flowstate_state::Partition) and its own instance of every
//! NF, built in the thread. [`Runtime::run`] reads a [`Source`] on the calling thread (the
//! dispatcher), [`Runtime::run_generated`] lets each worker generate its own traffic (the NIC
//! RSS model). Forwarded packets go to a [`Sink`](flowstate_io::Sink) or are discarded, and a
//! run ends with a [`Summary`]. The deployment file and the choice of what it runs are
//! `flowstate_deploy`'s.
//!
//! ```
//! use flowstate_chain::{Runtime, RuntimeOptions};
//! use flowstate_io::synth::{Profile, SynthConfig, Synthetic};
//! use flowstate_state::local::LocalStore;
//! use std::sync::Arc;
//!
//! let chain = vec![flowstate_nf::registry::factory("counter", &toml::Table::new())?];
//! let options = RuntimeOptions { workers: 2, ..RuntimeOptions::default() };
//! let runtime = Runtime::new(options, chain, Arc::new(LocalStore::new()));
//! let mut trace = SynthConfig::new(Profile::Mixed);
//! trace.flows = 100;
//! trace.packets = 5_000;
//! let summary = runtime.run(&mut Synthetic::new(trace)?, None)?;
//! assert_eq!((summary.packets_in, summary.packets_out), (5_000, 5_000));
//! assert_eq!(summary.nfs[0].report["packets_counted"], 5_000);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Promises:
//! * A packet is dissected once, before the chain. A malformed packet is dropped and counted
//!   by `layer: reason`, never forwarded.
//! * Both directions of a flow are processed by the same worker (symmetric Toeplitz hash,
//!   [`steer`]); packets of one flow leave in the order they arrived.
//! * Outbound packets (source in `inside`) go through the chain in order, inbound ones in
//!   reverse order (last NF first): the chain is a line from the inside to the outside.
//! * Every packet is accounted for: `packets_in + reflected == packets_out + dropped_total +
//!   skipped` ([`Summary::balanced`]).
//! * Time is the packets' timestamps; a run over the same input and configuration gives the
//!   same output and counts (packets of different workers may interleave differently in the
//!   output).
//! * Nothing is allocated per packet on the steady path: batches are allocated once and
//!   recycled.
//! * A packet whose state one worker owns (a NAT's external port, an LB connection) goes to
//!   that worker ([`flowstate_nf::steer::Owners`]); other packets follow the symmetric hash.
//! * A later IPv4 fragment carries its datagram's ports, taken from the first fragment, and
//!   goes where its flow goes; one that comes before its first fragment waits for it, within
//!   bounds, and follows it ([`fragments`]). Fragments are never reassembled.
//! * A short read from the source (a live port with nothing more ready) hands every partial
//!   batch to its worker at once: live traffic is never held back waiting for a full batch.
//! * With `interface` input and output, the run is a live two-port box ([`live`]) until
//!   SIGINT/SIGTERM, after which the workers drain and flush their state as at the end of a
//!   file.
//! * Configuration errors name the file, the key and what was expected; a failing worker,
//!   input or output ends the run with an error, never a panic of the caller.
//!
//! The summary serializes to one JSON object:
//!
//! ```json
//! { "packets_in": 1000, "reflected": 0, "packets_out": 990, "dropped_total": 10,
//!   "dropped": { "firewall.not_allowed": 9 }, "malformed": { "ipv4.truncated": 1 },
//!   "skipped": 0, "wall_s": 0.01, "write_out_s": 0.001, "mpps": 0.1, "workers": 2,
//!   "backend": "local",
//!   "per_worker": [ { "index": 0, "packets": 500, "reflected": 0, "packets_out": 495,
//!                     "busy_s": 0.004, "write_out_s": 0.001, "state_flushes": 3,
//!                     "state_errors": 0, "state_lost_ops": 0 } ],
//!   "nfs": [ { "name": "firewall", "packets_in": 999, "forwarded": 990,
//!              "dropped": { "not_allowed": 9 },
//!              "report": { "tracked": 12, "conns_opened": 40 }, "gauges": ["tracked"] } ] }
//! ```

mod fragments;
#[cfg(target_os = "linux")]
pub mod live;
pub mod observe;
pub mod reflect;
pub mod reload;
mod runtime;
mod summary;

pub use fragments::FragmentLimits;
pub use runtime::{default_workers, DEFAULT_BATCH, DEFAULT_INSIDE, DEFAULT_MAX_FRAME};
pub use runtime::{RunError, Runtime, RuntimeOptions, WorkerSink};
pub use summary::{LabelledSummary, NfSummary, Summary, WorkerSummary};

use flowstate_io::synth::{Ipv4Net, Ipv6Net, SynthConfig};
use flowstate_io::{PacketBatch, Source};
use flowstate_nf::Placement;
use std::net::{Ipv4Addr, Ipv6Addr};

/// A progress callback: called with the number of packets just read.
pub type Progress<'a> = &'a (dyn Fn(u64) + Sync);

/// A source that reports progress (`None`: an empty source).
pub struct Counting<'a, S> {
    inner: Option<S>,
    progress: Option<Progress<'a>>,
}

impl<'a, S> Counting<'a, S> {
    /// `inner`, reporting to `progress`.
    pub fn new(inner: Option<S>, progress: Option<Progress<'a>>) -> Self {
        Counting { inner, progress }
    }
}

impl<S: Source> Source for Counting<'_, S> {
    fn recv(&mut self, batch: &mut PacketBatch) -> flowstate_io::Result<usize> {
        let before = self.inner.as_ref().and_then(Source::progress);
        let n = match &mut self.inner {
            Some(s) => s.recv(batch)?,
            None => {
                batch.clear();
                0
            }
        };
        if let Some(p) = self.progress {
            let after = self.inner.as_ref().and_then(Source::progress);
            p(match (before, after) {
                (Some(a), Some(b)) => b.saturating_sub(a),
                _ => n as u64,
            });
        }
        Ok(n)
    }

    fn idle_now(&mut self) -> Option<u64> {
        self.inner.as_mut().and_then(Source::idle_now)
    }
}

impl<S: WorkerSink> WorkerSink for Counting<'_, S> {
    fn forward(&mut self, frame: &[u8], input: Option<usize>) -> flowstate_io::Result<()> {
        match &mut self.inner {
            Some(s) => s.forward(frame, input),
            None => Ok(()),
        }
    }

    fn flush_forwarded(&mut self) -> flowstate_io::Result<()> {
        match &mut self.inner {
            Some(s) => s.flush_forwarded(),
            None => Ok(()),
        }
    }
}

/// Worker `w`'s share of a synthetic trace, for [`Runtime::run_generated`]: about
/// `1/count` of the flows, with packets in proportion; its own slice of the client subnets
/// (so no two workers generate the same 5-tuple); its own seed. `None` when there are fewer
/// flows than workers and this one gets none.
///
/// The shares together have exactly `config.flows` flows and `config.packets` packets; each
/// share's timestamps start at `config.start_ns` (every worker replays its own timeline, as
/// RSS queues fill in parallel).
pub fn synthetic_share(config: &SynthConfig, w: Placement) -> Option<SynthConfig> {
    let n = u64::from(w.partitions.max(1));
    let i = u64::from(w.partition);
    if i >= n {
        return None;
    }
    let flows = config.flows / n + u64::from(i < config.flows % n);
    if flows == 0 {
        return None;
    }
    // Packets in proportion to flows: ⌊packets·F_i / F⌋, the remainder one each to the
    // first workers. Each share keeps at least the minimum per flow.
    let total = u128::from(config.packets);
    let share = |k: u64| {
        let f = config.flows / n + u64::from(k < config.flows % n);
        (total * u128::from(f) / u128::from(config.flows.max(1))) as u64
    };
    let base: u64 = (0..n).map(share).sum();
    let left = config.packets - base;
    let packets = share(i) + u64::from(i < left);

    let mut c = config.clone();
    c.flows = flows;
    c.packets = packets;
    c.seed = config
        .seed
        .wrapping_add(0x9e37_79b9_7f4a_7c15u64.wrapping_mul(i + 1));
    let bits = 64 - (n - 1).leading_zeros();
    let bits = if n == 1 { 0 } else { bits as u8 };
    c.clients_v4 = split_v4(config.clients_v4, bits, i);
    c.clients_v6 = split_v6(config.clients_v6, bits, i);
    Some(c)
}

fn split_v4(net: Ipv4Net, bits: u8, i: u64) -> Ipv4Net {
    let len = (net.prefix_len() + bits).min(32);
    let shift = 32 - u32::from(len);
    let sub = (i as u32).checked_shl(shift).unwrap_or(0);
    // `len` is at most 32: `new_assert` cannot fail.
    Ipv4Net::new_assert(Ipv4Addr::from(u32::from(net.network()) | sub), len)
}

fn split_v6(net: Ipv6Net, bits: u8, i: u64) -> Ipv6Net {
    let len = (net.prefix_len() + bits).min(128);
    let shift = 128 - u32::from(len);
    let sub = u128::from(i).checked_shl(shift).unwrap_or(0);
    // `len` is at most 128: `new_assert` cannot fail.
    Ipv6Net::new_assert(Ipv6Addr::from(u128::from(net.network()) | sub), len)
}
