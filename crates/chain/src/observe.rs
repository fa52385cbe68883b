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
use flowstate_nf::listing::{merge_summed, Row, TableInfo};
use flowstate_nf::NetworkFunction;
use std::sync::{Arc, Condvar, Mutex};
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

/// How long a worker's calls to a remote store took (see
/// [`flowstate_state::LinkStats::call_micros`]).
#[derive(Debug, Clone, PartialEq)]
pub struct StateCallTimes {
    /// The worker.
    pub worker: usize,
    /// Calls per bucket (not cumulative): bucket `i` holds calls of `(2^(i-1), 2^i]` µs.
    pub buckets: [u64; flowstate_state::CALL_BUCKETS],
    /// Their total time, seconds.
    pub sum_s: f64,
}

impl StateCallTimes {
    /// Worker `worker`'s calls as `stats` counted them so far.
    pub(crate) fn read(worker: usize, stats: &flowstate_state::LinkStats) -> Self {
        use std::sync::atomic::Ordering::Relaxed;
        StateCallTimes {
            worker,
            buckets: std::array::from_fn(|i| stats.call_micros[i].load(Relaxed)),
            sum_s: stats.call_micros_sum.load(Relaxed) as f64 * 1e-6,
        }
    }
}

/// One worker's published counters.
#[derive(Debug, Clone)]
pub(crate) struct Published {
    pub(crate) report: crate::summary::WorkerReport,
    pub(crate) batches: BatchTimes,
    pub(crate) state_calls: StateCallTimes,
}

/// What the runtime publishes for one run.
pub(crate) struct RunView {
    pub(crate) start: Instant,
    pub(crate) workers: usize,
    pub(crate) backend: String,
    pub(crate) chain: Vec<String>,
    pub(crate) slots: Vec<ArcSwapOption<Published>>,
    pub(crate) dispatched: ArcSwapOption<crate::summary::Counts>,
    /// Each NF's tables, in chain order.
    pub(crate) tables: Vec<&'static [TableInfo]>,
    /// The table request the workers answer at their next publish.
    pub(crate) query: ArcSwapOption<TableQuery>,
}

impl RunView {
    /// Called by worker `worker` at each publish: answers the pending table request once.
    pub(crate) fn answer(
        &self,
        worker: usize,
        nfs: &[Box<dyn NetworkFunction>],
        now: u64,
        last: &mut u64,
    ) {
        let guard = self.query.load();
        let Some(q) = guard.as_deref() else { return };
        if q.id == *last {
            return;
        }
        *last = q.id;
        let mut rows = Vec::new();
        if let Some(nf) = nfs.get(q.nf) {
            nf.list(q.table.name, now, &mut rows);
        }
        let mut a = q.answers.lock().unwrap_or_else(|p| p.into_inner());
        a.rows.append(&mut rows);
        a.workers.push(worker);
        q.done.notify_all();
    }
}

/// A request for one NF table: each worker appends its rows between batches.
pub(crate) struct TableQuery {
    id: u64,
    nf: usize,
    table: TableInfo,
    answers: Mutex<Answers>,
    done: Condvar,
}

#[derive(Default)]
struct Answers {
    rows: Vec<Row>,
    workers: Vec<usize>,
}

/// One NF table of a running box ([`Observer::table`]).
#[derive(Debug, Clone, serde::Serialize)]
pub struct TableRows {
    /// The NF.
    pub nf: String,
    /// The table.
    pub table: &'static str,
    /// What one row is.
    pub about: &'static str,
    /// Column names.
    pub columns: &'static [&'static str],
    /// Every worker's rows (summed per key where the table says so).
    pub rows: Vec<Row>,
    /// Workers of the run.
    pub workers: usize,
    /// Workers whose rows are included (fewer than `workers`: some did not answer in time).
    pub answered: usize,
}

/// Why [`Observer::table`] has no rows to give.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TableError {
    /// No run has started.
    #[error("no run has started")]
    NotRunning,
    /// The chain has no such NF.
    #[error("the chain has no NF {0:?}")]
    NoNf(String),
    /// The NF has no such table.
    #[error("{nf} has no table {table:?} (it has: {known})")]
    NoTable {
        /// The NF.
        nf: String,
        /// The table asked for.
        table: String,
        /// The tables it has.
        known: String,
    },
}

/// The live view of a box: hand it to [`crate::Runtime::with_observer`] (or
/// `flowstate_deploy::run_config_observed`) and read it from any thread.
#[derive(Default)]
pub struct Observer {
    run: ArcSwapOption<RunView>,
    querying: Mutex<()>,
    #[cfg(target_os = "linux")]
    live: ArcSwapOption<LiveParts>,
}

#[cfg(target_os = "linux")]
struct LiveParts {
    shared: Arc<flowstate_router::Shared>,
    fast: Option<Arc<flowstate_fastpath::flowcache::XdpFlowCache>>,
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
        shared: Arc<flowstate_router::Shared>,
        fast: Option<Arc<flowstate_fastpath::flowcache::XdpFlowCache>>,
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
        let mut s = crate::summary::summarize(
            run.workers,
            &run.backend,
            &run.chain,
            dispatched,
            reports,
            run.start,
            Instant::now(),
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

    /// Each worker's store-call histogram so far.
    pub fn state_call_times(&self) -> Vec<StateCallTimes> {
        self.published().map(|p| p.state_calls.clone()).collect()
    }

    /// Every worker's latest published counters (none before the run started).
    fn published(&self) -> impl Iterator<Item = Arc<Published>> {
        let run = self.run.load_full();
        run.into_iter()
            .flat_map(|run| (0..run.slots.len()).filter_map(move |i| run.slots[i].load_full()))
    }

    /// The NFs of the running chain and their tables (empty before the run started).
    pub fn tables(&self) -> Vec<(String, &'static [TableInfo])> {
        let Some(run) = self.run.load_full() else {
            return Vec::new();
        };
        run.chain
            .iter()
            .cloned()
            .zip(run.tables.iter().copied())
            .collect()
    }

    /// Table `table` of NF `nf` as the workers hold it now: each worker lists its entries
    /// between two batches (within [`PUBLISH_EVERY`] when busy, one idle tick when idle);
    /// waits at most `wait` for all of them. Requests are served one at a time.
    pub fn table(&self, nf: &str, table: &str, wait: Duration) -> Result<TableRows, TableError> {
        let run = self.run.load_full().ok_or(TableError::NotRunning)?;
        let i = run
            .chain
            .iter()
            .position(|n| n == nf)
            .ok_or_else(|| TableError::NoNf(nf.to_owned()))?;
        let info = *run.tables[i]
            .iter()
            .find(|t| t.name == table)
            .ok_or_else(|| TableError::NoTable {
                nf: nf.to_owned(),
                table: table.to_owned(),
                known: run.tables[i]
                    .iter()
                    .map(|t| t.name)
                    .collect::<Vec<_>>()
                    .join(", "),
            })?;
        let _one_at_a_time = self.querying.lock().unwrap_or_else(|p| p.into_inner());
        let id = run.query.load().as_ref().map_or(0, |q| q.id) + 1;
        let q = Arc::new(TableQuery {
            id,
            nf: i,
            table: info,
            answers: Mutex::default(),
            done: Condvar::new(),
        });
        run.query.store(Some(Arc::clone(&q)));
        let until = Instant::now() + wait;
        let mut a = q.answers.lock().unwrap_or_else(|p| p.into_inner());
        while a.workers.len() < run.workers {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            a = q
                .done
                .wait_timeout(a, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        let rows = std::mem::take(&mut a.rows);
        Ok(TableRows {
            nf: nf.to_owned(),
            table: info.name,
            about: info.about,
            columns: info.columns,
            rows: if info.summed {
                merge_summed(rows)
            } else {
                rows
            },
            workers: run.workers,
            answered: a.workers.len(),
        })
    }

    /// Each worker's batch-time histogram so far.
    pub fn batch_times(&self) -> Vec<BatchTimes> {
        self.published().map(|p| p.batches.clone()).collect()
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
            // The observer's clock starts with the run it is given, the write-out ends when
            // it is asked: the times differ a little, the counts not at all.
            assert!(seen.write_out_s >= done.write_out_s);
            seen.wall_s = done.wall_s;
            seen.write_out_s = done.write_out_s;
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

    /// A trace, then idle ticks until `stop` is raised: a box whose tables can be asked for.
    struct ThenIdle {
        trace: flowstate_io::synth::Synthetic,
        done: bool,
        last: u64,
        stop: Arc<std::sync::atomic::AtomicBool>,
    }

    impl flowstate_io::Source for ThenIdle {
        fn recv(&mut self, batch: &mut flowstate_io::PacketBatch) -> flowstate_io::Result<usize> {
            if !self.done {
                let n = self.trace.recv(batch)?;
                self.done = n == 0;
                for (_, meta) in batch.iter() {
                    self.last = self.last.max(meta.timestamp_ns);
                }
                return Ok(n);
            }
            batch.clear();
            std::thread::sleep(Duration::from_millis(5));
            Ok(0)
        }

        fn idle_now(&mut self) -> Option<u64> {
            // Time stands still: nothing expires while the test asks.
            (!self.stop.load(std::sync::atomic::Ordering::SeqCst)).then_some(self.last)
        }
    }

    #[test]
    fn a_running_box_lists_every_workers_entries() {
        use crate::{Runtime, RuntimeOptions};
        use flowstate_io::synth::{Profile, SynthConfig, Synthetic};
        use flowstate_state::local::LocalStore;
        let chain = vec![
            flowstate_nf::registry::factory("firewall", &toml::Table::new()).unwrap(),
            flowstate_nf::registry::factory("counter", &toml::Table::new()).unwrap(),
        ];
        for workers in [1, 2] {
            let observer = Observer::new();
            assert_eq!(
                observer
                    .table("firewall", "connections", Duration::ZERO)
                    .err(),
                Some(TableError::NotRunning)
            );
            let options = RuntimeOptions {
                workers,
                inside: vec!["10.0.0.0/8".parse().unwrap()],
                ..RuntimeOptions::default()
            };
            let runtime = Runtime::new(options, chain.clone(), Arc::new(LocalStore::new()))
                .with_observer(Arc::clone(&observer));
            let mut trace = SynthConfig::new(Profile::Mixed);
            trace.flows = 50;
            trace.packets = 2_000;
            let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let mut source = ThenIdle {
                trace: Synthetic::new(trace).unwrap(),
                done: false,
                last: 0,
                stop: Arc::clone(&stop),
            };
            /// Ends the run however the test ends (a failed assertion included).
            struct StopOnDrop(Arc<std::sync::atomic::AtomicBool>);
            impl Drop for StopOnDrop {
                fn drop(&mut self) {
                    self.0.store(true, std::sync::atomic::Ordering::SeqCst);
                }
            }
            std::thread::scope(|s| {
                let run = s.spawn(|| runtime.run(&mut source, None));
                let _stop = StopOnDrop(Arc::clone(&stop));
                // Once every packet went through, the listing holds what the report counts.
                // The dispatcher and the workers publish on their own schedules: wait for the
                // workers' reports to count every packet too.
                let until = Instant::now() + Duration::from_secs(20);
                let tracked = loop {
                    let summary = observer.summary();
                    let all = |s: &&Summary| {
                        s.packets_in == 2_000
                            && s.per_worker.iter().map(|w| w.packets).sum::<u64>() == 2_000
                    };
                    if let Some(sum) = summary.as_ref().filter(all) {
                        break sum.nfs[0].report["tracked"];
                    }
                    assert!(Instant::now() < until, "{summary:?}");
                    std::thread::sleep(Duration::from_millis(20));
                };
                let t = observer
                    .table("firewall", "connections", Duration::from_secs(10))
                    .unwrap();
                assert_eq!((t.workers, t.answered), (workers, workers));
                assert_eq!(t.rows.len() as i64, tracked, "{workers} workers");
                assert!(tracked > 0);
                assert_eq!(t.columns.len(), t.rows[0].len());
                assert!(matches!(
                    observer.table("firewall", "nope", Duration::ZERO),
                    Err(TableError::NoTable { .. })
                ));
                assert_eq!(
                    observer.table("nat", "sessions", Duration::ZERO).err(),
                    Some(TableError::NoNf("nat".into()))
                );
                let json = serde_json::to_value(&t).unwrap();
                assert_eq!(json["rows"].as_array().unwrap().len() as i64, tracked);
                stop.store(true, std::sync::atomic::Ordering::SeqCst);
                run.join().unwrap().unwrap();
            });
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
