//! A running box seen from outside: the counters its workers keep, published for an exporter
//! (`flowstate-telemetry`, wired by the binary) without a lock on the data path.
//!
//! ```text
//!  worker k: plain counters (as always) --every PUBLISH_EVERY, and at the end-->
//!      Arc<snapshot> swapped into its slot (ArcSwap: a pointer store, no lock, no wait)
//!  dispatcher: its input counts, the same way
//!  live box: its BoxStats atomics (already shared), the XDP fast path's own counters
//!                          |
//!  Observer::summary() <---+  (any thread, any time: loads the slots and sums them)
//! ```
//!
//! Promises:
//! * Observing costs the data path one clock comparison and one histogram increment per batch,
//!   and one snapshot (a clone of the worker's counters and its NFs' reports) every
//!   [`PUBLISH_EVERY`]. A worker never waits for a reader and a reader never waits for a
//!   worker.
//! * A summary read mid-run counts at most what the final summary counts (each counter only
//!   grows and snapshots are published in order); once the run has ended, the observer's
//!   counters equal the final summary's (every worker publishes after its final flush).
//! * Without an observer ([`crate::Runtime::with_observer`]), the runtime does none of this.

use crate::summary::Summary;
use arc_swap::ArcSwapOption;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often a worker publishes its counters.
pub const PUBLISH_EVERY: Duration = Duration::from_millis(100);

/// Buckets of the batch-time histogram: bucket `i` counts batches that took at most `2^i` µs
/// (the last one: longer).
pub const BATCH_BUCKETS: usize = 22;

/// How long the workers' batches took: a histogram over powers of two of microseconds.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BatchTimes {
    /// The worker.
    pub worker: usize,
    /// Batches per bucket (not cumulative): bucket `i` holds batches of `(2^(i-1), 2^i]` µs,
    /// bucket 0 those of at most 1 µs, the last those longer than `2^(BATCH_BUCKETS-2)` µs.
    pub buckets: [u64; BATCH_BUCKETS],
    /// Their total time, seconds.
    pub sum_s: f64,
}

impl BatchTimes {
    #[inline]
    pub(crate) fn record(&mut self, took: Duration) {
        let us = took.as_micros().min(u128::from(u64::MAX)) as u64;
        // ceil(log2(us)): 1 µs -> 0, 2 -> 1, 3..4 -> 2, ...
        let i = if us <= 1 {
            0
        } else {
            (64 - (us - 1).leading_zeros()) as usize
        };
        self.buckets[i.min(BATCH_BUCKETS - 1)] += 1;
        self.sum_s += took.as_secs_f64();
    }
}

/// One worker's published counters.
#[derive(Debug, Clone)]
pub(crate) struct Published {
    pub(crate) report: crate::runtime::WorkerReport,
    pub(crate) batches: BatchTimes,
}

/// What the runtime publishes for one run.
pub(crate) struct RunView {
    pub(crate) start: Instant,
    pub(crate) workers: usize,
    pub(crate) backend: String,
    pub(crate) chain: Vec<String>,
    pub(crate) slots: Vec<ArcSwapOption<Published>>,
    pub(crate) dispatched: ArcSwapOption<crate::runtime::Counts>,
}

/// The live view of a box: hand it to [`crate::Runtime::with_observer`] (or
/// [`crate::run_config_observed`]) and read it from any thread.
#[derive(Default)]
pub struct Observer {
    run: ArcSwapOption<RunView>,
    #[cfg(target_os = "linux")]
    live: ArcSwapOption<LiveParts>,
}

#[cfg(target_os = "linux")]
struct LiveParts {
    shared: Arc<crate::live::Shared>,
    fast: Option<Arc<flowstate_fastpath::flowcache::FastPath>>,
}

impl std::fmt::Debug for Observer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Observer")
            .field("running", &self.run.load().is_some())
            .finish_non_exhaustive()
    }
}

impl Observer {
    /// An observer of no run yet.
    pub fn new() -> Arc<Self> {
        Arc::new(Observer::default())
    }

    /// Called by the runtime when a run starts.
    pub(crate) fn begin(&self, view: Arc<RunView>) {
        self.run.store(Some(view));
    }

    /// Called by a live box once its ports are open.
    #[cfg(target_os = "linux")]
    pub(crate) fn set_live(
        &self,
        shared: Arc<crate::live::Shared>,
        fast: Option<Arc<flowstate_fastpath::flowcache::FastPath>>,
    ) {
        self.live.store(Some(Arc::new(LiveParts { shared, fast })));
    }

    /// The run's summary so far (`None` before the run started): the workers' latest
    /// published counters summed, `wall_s` the time since the start. With a live box,
    /// `live_box` holds its counters, the fast path's read now.
    pub fn summary(&self) -> Option<Summary> {
        let run = self.run.load_full()?;
        let reports = run
            .slots
            .iter()
            .filter_map(|s| s.load_full())
            .map(|p| p.report.clone())
            .collect();
        let dispatched = run
            .dispatched
            .load_full()
            .map(|c| (*c).clone())
            .unwrap_or_default();
        let mut s = crate::runtime::summarize(
            run.workers,
            &run.backend,
            &run.chain,
            dispatched,
            reports,
            run.start.elapsed(),
        );
        #[cfg(target_os = "linux")]
        if let Some(live) = self.live.load_full() {
            let stats = &live.shared.stats;
            if let Some(f) = &live.fast {
                if let Ok(f) = f.stats() {
                    use std::sync::atomic::Ordering::Relaxed;
                    stats.fast_path_packets.fetch_max(f.packets, Relaxed);
                    stats.fast_path_bytes.fetch_max(f.bytes, Relaxed);
                }
            }
            s.live_box = stats
                .snapshot()
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v))
                .collect();
        }
        Some(s)
    }

    /// Each worker's batch-time histogram so far.
    pub fn batch_times(&self) -> Vec<BatchTimes> {
        let Some(run) = self.run.load_full() else {
            return Vec::new();
        };
        run.slots
            .iter()
            .filter_map(|s| s.load_full())
            .map(|p| p.batches.clone())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn after_a_run_the_observer_counts_what_the_summary_counts() {
        use crate::{Runtime, RuntimeOptions};
        use flowstate_io::synth::{Profile, SynthConfig, Synthetic};
        use flowstate_state::local::LocalStore;
        let chain = vec![
            flowstate_nf::registry::factory("firewall", &toml::Table::new()).unwrap(),
            flowstate_nf::registry::factory("counter", &toml::Table::new()).unwrap(),
        ];
        for workers in [1, 2] {
            let observer = Observer::new();
            assert!(observer.summary().is_none(), "no run yet");
            let options = RuntimeOptions {
                workers,
                ..RuntimeOptions::default()
            };
            let runtime = Runtime::new(options, chain.clone(), Arc::new(LocalStore::new()))
                .with_observer(Arc::clone(&observer));
            let mut trace = SynthConfig::new(Profile::Mixed);
            trace.flows = 200;
            trace.packets = 20_000;
            let done = runtime
                .run(&mut Synthetic::new(trace).unwrap(), None)
                .unwrap();
            let mut seen = observer.summary().unwrap();
            assert!(seen.wall_s >= done.wall_s * 0.5);
            seen.wall_s = done.wall_s;
            seen.mpps = done.mpps;
            for (a, b) in seen.per_worker.iter_mut().zip(&done.per_worker) {
                a.busy_s = b.busy_s;
            }
            assert_eq!(seen, done);
            assert!(done.nf_dropped() > 0 || done.packets_out == 20_000);
            let times = observer.batch_times();
            assert_eq!(times.len(), workers);
            let batches: u64 = times.iter().flat_map(|t| t.buckets.iter()).sum();
            assert!(batches > 0);
        }
    }

    #[test]
    fn batch_times_fall_in_power_of_two_buckets() {
        let mut b = BatchTimes::default();
        for us in [0, 1, 2, 3, 4, 5, 1 << 30] {
            b.record(Duration::from_micros(us));
        }
        assert_eq!(&b.buckets[..4], &[2, 1, 2, 1]);
        assert_eq!(b.buckets[BATCH_BUCKETS - 1], 1);
        assert_eq!(b.buckets.iter().sum::<u64>(), 7);
    }
}
