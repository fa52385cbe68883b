//! The runtime: a dispatcher (or per-worker generators), workers running the chain to
//! completion, and an output stage.
//!
//! ```text
//!            dispatch mode (run)                       generated mode (run_generated)
//! Source -> dispatcher: dissect once,             worker k: its own Source, dissects itself
//!           drop + count malformed,                   |
//!           classify direction,                       |
//!           steer by symmetric hash                   |
//!             | bounded queue per worker              |
//!             v                                       v
//!           worker k: the batch in segments (one direction, distinct flows), each run NF
//!                     by NF (every NF prefetches, then processes, the segment; reverse
//!                     order when Inbound), then its reflected answers the same way;
//!                     with [runtime] flow_cache, a segment's established flows first
//!                     take the worker's flow cache (flowstate_nf::stage::FlowCache) and skip the NFs;
//!                     on_tick (after the cache handed back the flows it let go) + maybe_flush
//!                     once per batch
//!             | one bounded queue, FIFO per worker
//!             v
//!           output: forwarded packets (and replies) -> Sink; or discarded
//!             | batch goes home (to the dispatcher's or the generator's pool)
//! ```
//!
//! Run-to-completion mode ([`Runtime::run_to_completion`], a live box's ports) is generated
//! mode without the output stage: the worker's source is also its [`WorkerSink`], and the
//! worker receives, dissects, runs the chain and sends in its own thread, batch after batch.
//!
//! Batches are allocated once (`pool` per worker) and recycled: on the steady path nothing is
//! allocated per packet. Packets of one flow go to one worker and leave in the order they
//! came; packets of different workers interleave freely. Time is the packets' timestamps
//! (virtual, monotone per worker), so a run over a given input is deterministic whatever the
//! machine's speed.
//!
//! Workers are pinned to distinct cores when every thread of the run (the workers, plus the
//! dispatcher and the output stage when there are any) can have a core of its own, except in
//! run-to-completion mode (the kernel's sending work runs in the worker's calls); otherwise
//! pinning would make workers and those threads fight over cores, and the OS places them.

use crate::fragments::{Admit, FragmentLimits, FragmentTracker};
use crate::observe::{BatchTimes, Observer, Published, RunView, StateCallTimes, PUBLISH_EVERY};
use crate::reflect::reflect;
use crate::reload::Reload;
use crate::summary::{summarize, Counts, Summary, WorkerReport};
use arc_swap::ArcSwapOption;
use flowstate_config::IpNet;
use flowstate_io::{PacketBatch, Sink, Source};
use flowstate_nf::stage::{FlowCacheOptions, Frames, Item, Stage};
use flowstate_nf::steer::{Owners, Steering};
use flowstate_nf::{BuildError, Direction, NfFactory, Placement};
use flowstate_state::{Connector, Nanos, Partition, StateConfig, StateError};
use flowstate_wire::dissect::Fragment;
use flowstate_wire::{dissect, Dissection};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

/// How often a blocked stage looks whether another one failed.
const ABORT_POLL: Duration = Duration::from_millis(20);

/// Default packets per batch.
pub const DEFAULT_BATCH: usize = 32;
/// Default buffer size per packet.
pub const DEFAULT_MAX_FRAME: usize = 2048;
/// Default inside prefixes: the synthetic generator's client subnets.
pub const DEFAULT_INSIDE: [&str; 2] = ["10.0.0.0/8", "fd00::/8"];

/// The machine's available parallelism (1 when unknown): the default number of workers.
pub fn default_workers() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Settings of a [`Runtime`].
#[derive(Debug, Clone, PartialEq)]
pub struct RuntimeOptions {
    /// Worker threads (at least 1).
    pub workers: usize,
    /// Packets per batch: hand-off unit and prefetch window.
    pub batch: usize,
    /// Buffer size per packet; longer frames are truncated.
    pub max_frame: usize,
    /// Batches per worker in flight (queued, processed or being written).
    pub pool: usize,
    /// Sources that make a packet Outbound.
    pub inside: Vec<IpNet>,
    /// Answer outbound packets as the outside hosts would ([`crate::reflect`]).
    pub reflect: bool,
    /// Skip inbound input packets (counted as `skipped`).
    pub outbound_only: bool,
    /// NF instance id (in state keys).
    pub instance: u32,
    /// How often each partition flushes to the store.
    pub flush_interval: Duration,
    /// Flush batches that may wait for a partition's state thread.
    pub queue_depth: usize,
    /// Operations of failed flushes each partition keeps to send again.
    pub retain_ops: usize,
    /// The worker threads' nice value (`None`: inherited).
    pub nice: Option<i32>,
    /// Bounds of the fragment tracker ([`crate::fragments`]) of the dispatcher, or of each
    /// worker that reads its own input.
    pub fragments: FragmentLimits,
    /// Each worker's flow cache in front of the chain ([`flowstate_nf::stage::FlowCache`]); `None`: every
    /// packet runs the chain.
    pub flow_cache: Option<FlowCacheOptions>,
}

impl Default for RuntimeOptions {
    /// One worker per core, batches of 32, the default inside prefixes, no reflect.
    fn default() -> Self {
        RuntimeOptions {
            workers: default_workers(),
            batch: DEFAULT_BATCH,
            max_frame: DEFAULT_MAX_FRAME,
            pool: 8,
            inside: DEFAULT_INSIDE
                .iter()
                .filter_map(|p| p.parse().ok())
                .collect(),
            reflect: false,
            outbound_only: false,
            instance: 0,
            flush_interval: Duration::from_millis(1),
            queue_depth: StateConfig::default().queue_depth,
            retain_ops: StateConfig::default().retain_ops,
            nice: None,
            fragments: FragmentLimits::default(),
            flow_cache: None,
        }
    }
}

/// Why a run failed.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The input failed (the file is damaged, a read failed).
    #[error("input: {0}")]
    Input(flowstate_io::Error),
    /// The output failed.
    #[error("output: {0}")]
    Output(flowstate_io::Error),
    /// An NF could not be built for a worker.
    #[error("worker {worker}: cannot build NF {nf}: {error}")]
    Build {
        /// The worker.
        worker: usize,
        /// The NF.
        nf: &'static str,
        /// Why.
        error: BuildError,
    },
    /// A worker's state partition failed (connecting, or the final flush).
    #[error("worker {worker}: state: {error}")]
    State {
        /// The worker.
        worker: usize,
        /// Why.
        error: StateError,
    },
    /// A worker's traffic generator could not be made or failed.
    #[error("worker {worker}: traffic generator: {error}")]
    Generator {
        /// The worker.
        worker: usize,
        /// Why.
        error: flowstate_io::Error,
    },
    /// A thread panicked (a bug: reported, not propagated).
    #[error("{what} panicked: {message}")]
    Panicked {
        /// Which thread.
        what: String,
        /// The panic message.
        message: String,
    },
    /// A thread could not be started.
    #[error("cannot start a thread: {0}")]
    Spawn(std::io::Error),
    /// A live box's port could not be opened, or its fast path attached.
    #[error("{0}")]
    Port(flowstate_io::Error),
    /// This stage stopped because another one failed (that one's error is the cause).
    #[error("stopped because another stage failed")]
    Stopped,
}

/// Runs a chain of NFs over traffic. See the module documentation.
pub struct Runtime {
    options: RuntimeOptions,
    chain: Vec<Arc<dyn NfFactory>>,
    connector: Arc<dyn Connector>,
    observer: Option<Arc<Observer>>,
    reload: Option<Arc<Reload>>,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("options", &self.options)
            .field(
                "chain",
                &self.chain.iter().map(|c| c.name()).collect::<Vec<_>>(),
            )
            .field("backend", &self.connector.name())
            .finish()
    }
}

/// Where a worker that runs to completion sends its forwarded packets itself
/// ([`Runtime::run_to_completion`]): no output thread between the chain and the device.
pub trait WorkerSink {
    /// Takes one forwarded frame (the sink may buffer it until [`WorkerSink::flush_forwarded`]);
    /// `input` is its index in the batch the worker received (`None`: a reflected reply).
    fn forward(&mut self, frame: &[u8], input: Option<usize>) -> flowstate_io::Result<()>;

    /// Sends whatever is buffered; called once after every batch.
    fn flush_forwarded(&mut self) -> flowstate_io::Result<()>;
}

/// A generator with no output of its own ([`Runtime::run_generated`]: the output stage sends).
struct NoOutput<S>(S);

impl<S: Source> Source for NoOutput<S> {
    fn recv(&mut self, batch: &mut PacketBatch) -> flowstate_io::Result<usize> {
        self.0.recv(batch)
    }

    fn idle_now(&mut self) -> Option<u64> {
        self.0.idle_now()
    }
}

impl<S> WorkerSink for NoOutput<S> {
    fn forward(&mut self, _: &[u8], _: Option<usize>) -> flowstate_io::Result<()> {
        Ok(())
    }
    fn flush_forwarded(&mut self) -> flowstate_io::Result<()> {
        Ok(())
    }
}

/// A Source that never yields (stands in for the generator type in dispatch mode).
struct NoSource;

impl WorkerSink for NoSource {
    fn forward(&mut self, _: &[u8], _: Option<usize>) -> flowstate_io::Result<()> {
        Ok(())
    }
    fn flush_forwarded(&mut self) -> flowstate_io::Result<()> {
        Ok(())
    }
}

impl Source for NoSource {
    fn recv(&mut self, batch: &mut PacketBatch) -> flowstate_io::Result<usize> {
        batch.clear();
        Ok(0)
    }
}

impl Runtime {
    /// A runtime running `chain` (NFs in order from the inside to the outside) with state in
    /// the store `connector` opens.
    pub fn new(
        options: RuntimeOptions,
        chain: Vec<Arc<dyn NfFactory>>,
        connector: Arc<dyn Connector>,
    ) -> Self {
        Runtime {
            options,
            chain,
            connector,
            observer: None,
            reload: None,
        }
    }

    /// Lets `reload` replace the NFs' configurations while running ([`crate::reload`]).
    pub fn with_reload(mut self, reload: Arc<Reload>) -> Self {
        reload.start(&self.chain);
        self.reload = Some(reload);
        self
    }

    /// Publishes the workers' counters to `observer` while running ([`crate::observe`]).
    pub fn with_observer(mut self, observer: Arc<Observer>) -> Self {
        self.observer = Some(observer);
        self
    }

    /// The observer, if one was given.
    pub fn observer(&self) -> Option<&Arc<Observer>> {
        self.observer.as_ref()
    }

    /// The settings.
    pub fn options(&self) -> &RuntimeOptions {
        &self.options
    }

    /// Whether every NF of the chain allows a fast path ([`NfFactory::fast_path`]).
    pub fn fast_path_allowed(&self) -> bool {
        self.chain.iter().all(|f| f.fast_path())
    }

    /// Runs every packet of `source` through the chain: the calling thread dispatches,
    /// forwarded packets go to `sink` (`None`: discarded). Returns when the source is
    /// exhausted and every worker has drained and flushed its state.
    pub fn run(
        &self,
        source: &mut dyn Source,
        sink: Option<&mut (dyn Sink + Send)>,
    ) -> Result<Summary, RunError> {
        self.execute::<NoSource, fn(Placement) -> flowstate_io::Result<NoSource>>(
            Some(source),
            None,
            sink,
            false,
        )
    }

    /// Runs with traffic generated in the workers (NIC RSS model: no dispatcher between
    /// traffic and workers). `make` is called once in each worker's thread with its
    /// [`Placement`]; the source it returns is that worker's whole share, and its flows
    /// should be the worker's own (see [`crate::synthetic_share`]). The worker dissects,
    /// counts malformed packets, and classifies, as the dispatcher would.
    pub fn run_generated<S, F>(
        &self,
        make: F,
        sink: Option<&mut (dyn Sink + Send)>,
    ) -> Result<Summary, RunError>
    where
        S: Source,
        F: Fn(Placement) -> flowstate_io::Result<S> + Sync,
    {
        let make = |w: Placement| make(w).map(NoOutput);
        self.execute(None, Some(&make), sink, false)
    }

    /// Runs to completion in every worker, with no other thread on the data path: `make` is
    /// called once in each worker's thread and returns that worker's input and output (a live
    /// box's ports). The worker receives a batch, dissects and classifies it, runs the chain and
    /// hands the forwarded packets (and reflected replies) to the same object's
    /// [`WorkerSink`], then takes the next batch. The packets a worker receives must be the
    /// ones it owns (flow steering is the source's business: with one worker, trivially).
    /// Returns when every worker's source has ended and every worker has flushed its state.
    pub fn run_to_completion<S, F>(&self, make: F) -> Result<Summary, RunError>
    where
        S: Source + WorkerSink,
        F: Fn(Placement) -> flowstate_io::Result<S> + Sync,
    {
        self.execute(None, Some(&make), None, true)
    }

    fn execute<S, F>(
        &self,
        source: Option<&mut dyn Source>,
        make: Option<&F>,
        sink: Option<&mut (dyn Sink + Send)>,
        own_output: bool,
    ) -> Result<Summary, RunError>
    where
        S: Source + WorkerSink,
        F: Fn(Placement) -> flowstate_io::Result<S> + Sync,
    {
        let o = &self.options;
        let n = o.workers.max(1);
        let pool = o.pool.max(2);
        let batch = o.batch.max(1);
        let steering = Steering::new(o.inside.clone(), n).with_owners(Owners::new(&self.chain));
        let abort = AtomicBool::new(false);
        let dispatching = source.is_some();
        let cores = core_affinity::get_core_ids().unwrap_or_default();
        // A worker that runs to completion is not pinned: the kernel's work for what it sends
        // (on veth, the receiving host's whole stack) runs in its system calls and wakes the
        // hosts' processes, and the scheduler must stay free to move it off a busy core.
        let pin = !own_output && pin_workers(n, dispatching, sink.is_some(), cores.len());
        let cores = &cores;
        let view = self.observer.as_ref().map(|obs| {
            let view = Arc::new(RunView {
                start: Instant::now(),
                workers: n,
                backend: self.connector.name().to_owned(),
                chain: self.chain.iter().map(|f| f.name().to_owned()).collect(),
                slots: (0..n).map(|_| ArcSwapOption::empty()).collect(),
                dispatched: ArcSwapOption::empty(),
                tables: self.chain.iter().map(|f| f.tables()).collect(),
                query: ArcSwapOption::empty(),
            });
            obs.begin(Arc::clone(&view));
            view
        });
        let view = view.as_deref();
        tracing::info!(
            workers = n,
            batch,
            chain = ?self.chain.iter().map(|f| f.name()).collect::<Vec<_>>(),
            backend = self.connector.name(),
            mode = if dispatching {
                "dispatch"
            } else if own_output {
                "run-to-completion"
            } else {
                "generated"
            },
            reflect = o.reflect,
            pinned = pin,
            "run starting"
        );

        thread::scope(|s| {
            let abort = &abort;
            let steering = &steering;
            let mut errors: Vec<RunError> = Vec::new();

            // Each worker's pool of batches, allocated once.
            let mut free_txs = Vec::with_capacity(n);
            let mut free_rxs = Vec::with_capacity(n);
            for w in 0..n {
                let (tx, rx) = sync_channel(pool);
                // A worker that reads its own input keeps room for released fragments.
                let room = if dispatching { 0 } else { batch };
                for _ in 0..pool {
                    let _ = tx.send(WorkBatch::new(w, batch, room, o.max_frame, o.reflect));
                }
                free_txs.push(tx);
                free_rxs.push(rx);
            }

            // The output stage.
            let (out_tx, output) = match sink {
                Some(sink) => {
                    let (tx, rx) = sync_channel::<WorkBatch>(n * pool);
                    let free = free_txs.clone();
                    let max_frame = o.max_frame;
                    let spawned = thread::Builder::new()
                        .name("flowstate-output".into())
                        .spawn_scoped(s, move || {
                            let _guard = AbortOnPanic(abort);
                            let r = output_loop(sink, rx, &free, 2 * batch, max_frame, abort);
                            if r.is_err() {
                                abort.store(true, Ordering::SeqCst);
                            }
                            r
                        });
                    match spawned {
                        Ok(h) => (Some(tx), Some(h)),
                        Err(e) => return Err(RunError::Spawn(e)),
                    }
                }
                None => (None, None),
            };

            // Workers.
            let (ready_tx, ready_rx) = sync_channel::<bool>(n);
            let mut go_txs = Vec::with_capacity(n);
            let mut in_txs = Vec::with_capacity(n);
            let mut dispatcher_free = Vec::with_capacity(n);
            let mut handles = Vec::with_capacity(n);
            for (w, free_rx) in free_rxs.into_iter().enumerate() {
                let (go_tx, go_rx) = sync_channel::<bool>(1);
                let feed = if dispatching {
                    let (tx, rx) = sync_channel::<WorkBatch>(pool);
                    in_txs.push(tx);
                    dispatcher_free.push(free_rx);
                    Feed::Queue(rx)
                } else {
                    Feed::Generate(free_rx)
                };
                let recycle = match &out_tx {
                    Some(t) => Recycle::Output(t.clone()),
                    None => Recycle::Pool(free_txs[w].clone()),
                };
                let ready = ReadyGuard(Some(ready_tx.clone()));
                let spawned = thread::Builder::new()
                    .name(format!("flowstate-worker-{w}"))
                    .spawn_scoped(s, move || {
                        let _guard = AbortOnPanic(abort);
                        if pin && !core_affinity::set_for_current(cores[w]) {
                            tracing::debug!(worker = w, "could not pin the worker to its core");
                        }
                        if let Some(nice) = o.nice {
                            set_nice(nice, w);
                        }
                        let r = self.worker(
                            w, n, ready, go_rx, feed, recycle, make, own_output, steering, abort,
                            view,
                        );
                        if matches!(&r, Err(e) if !matches!(e, RunError::Stopped)) {
                            abort.store(true, Ordering::SeqCst);
                        }
                        r
                    });
                match spawned {
                    Ok(h) => {
                        handles.push(h);
                        go_txs.push(go_tx);
                    }
                    Err(e) => {
                        errors.push(RunError::Spawn(e));
                        abort.store(true, Ordering::SeqCst);
                        break;
                    }
                }
            }
            drop(out_tx);
            drop(ready_tx);
            drop(free_txs);

            // Start once every worker has built its chain.
            let mut ready = errors.is_empty();
            for _ in 0..handles.len() {
                if !matches!(ready_rx.recv(), Ok(true)) {
                    ready = false;
                    break;
                }
            }
            if !ready {
                abort.store(true, Ordering::SeqCst);
            }
            let start = Instant::now();
            for g in &go_txs {
                let _ = g.send(ready);
            }

            let mut dispatched = Counts::default();
            if let (true, Some(source)) = (ready, source) {
                let r = dispatch(
                    source,
                    steering,
                    self.reload.as_deref(),
                    &in_txs,
                    &dispatcher_free,
                    abort,
                    o,
                    &mut dispatched,
                    view.map(|v| &v.dispatched),
                );
                if let Err(e) = r {
                    abort.store(true, Ordering::SeqCst);
                    errors.push(e);
                }
            }
            drop(in_txs);

            let mut reports = Vec::with_capacity(n);
            for (w, h) in handles.into_iter().enumerate() {
                match h.join() {
                    Ok(Ok(r)) => reports.push(r),
                    Ok(Err(e)) => errors.push(e),
                    Err(p) => errors.push(RunError::Panicked {
                        what: format!("worker {w}"),
                        message: panic_message(&*p),
                    }),
                }
            }
            if let Some(h) = output {
                match h.join() {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => errors.push(e),
                    Err(p) => errors.push(RunError::Panicked {
                        what: "the output stage".into(),
                        message: panic_message(&*p),
                    }),
                }
            }
            let end = Instant::now();
            for e in &errors {
                tracing::debug!(error = %e, "stage failed");
            }
            if !errors.is_empty() {
                let first = errors.iter().position(|e| !matches!(e, RunError::Stopped));
                return Err(errors.swap_remove(first.unwrap_or(0)));
            }
            if let Some(v) = view {
                v.dispatched.store(Some(Arc::new(dispatched.clone())));
            }
            Ok(self.summarize(dispatched, reports, start, end))
        })
    }

    /// One worker's thread: builds its partition and chain, then processes batches.
    #[allow(clippy::too_many_arguments)]
    fn worker<S, F>(
        &self,
        index: usize,
        count: usize,
        mut ready: ReadyGuard,
        go: Receiver<bool>,
        feed: Feed,
        recycle: Recycle,
        make: Option<&F>,
        own_output: bool,
        steering: &Steering,
        abort: &AtomicBool,
        view: Option<&RunView>,
    ) -> Result<WorkerReport, RunError>
    where
        S: Source + WorkerSink,
        F: Fn(Placement) -> flowstate_io::Result<S> + Sync,
    {
        let o = &self.options;
        let info = Placement {
            partition: index as u32,
            partitions: count as u32,
            stage: o.instance,
        };
        let setup = (|| {
            let mut partition = Partition::new(
                &*self.connector,
                StateConfig {
                    stage: o.instance,
                    partition: index as u32,
                    flush_interval: o.flush_interval,
                    exclusive: count == 1,
                    queue_depth: o.queue_depth,
                    retain_ops: o.retain_ops,
                    uncached: false,
                },
            )
            .map_err(|error| RunError::State {
                worker: index,
                error,
            })?;
            let stage =
                Stage::build(&self.chain, &mut partition, info, o.flow_cache).map_err(|e| {
                    RunError::Build {
                        worker: index,
                        nf: e.nf,
                        error: e.error,
                    }
                })?;
            let source = match make {
                Some(make) => Some(make(info).map_err(|error| RunError::Generator {
                    worker: index,
                    error,
                })?),
                None => None,
            };
            Ok((partition, stage, source))
        })();
        let (partition, stage, mut source) = match setup {
            Ok(x) => {
                ready.send(true);
                x
            }
            Err(e) => {
                ready.send(false);
                return Err(e);
            }
        };
        if !matches!(go.recv(), Ok(true)) {
            return Err(RunError::Stopped);
        }

        let mut w = Worker {
            index,
            stage,
            partition,
            now: 0,
            reflect: o.reflect,
            counts: Counts::default(),
            packets: 0,
            reflected: 0,
            out: 0,
            busy: Duration::ZERO,
            processed: None,
            write_out: Duration::ZERO,
            items: Vec::new(),
            answers: Vec::new(),
            fragments: FragmentTracker::new(o.fragments, o.max_frame),
        };
        let mut batches = BatchTimes {
            worker: index,
            ..BatchTimes::default()
        };
        let publish = view.and_then(|v| Some((v, v.slots.get(index)?)));
        let mut next_publish = Instant::now();
        let mut last_query = 0;
        // Built from the chain as it started: every reload since applies.
        let mut reloads = 0;
        loop {
            let mut work = match &feed {
                Feed::Queue(rx) => match rx.recv() {
                    Ok(b) => {
                        w.now = w.now.max(b.idle_now);
                        b
                    }
                    Err(_) => break,
                },
                Feed::Generate(pool) => {
                    if abort.load(Ordering::Relaxed) {
                        return Err(RunError::Stopped);
                    }
                    let Some(mut b) = recv_or_abort(pool, abort) else {
                        return Err(RunError::Stopped);
                    };
                    let Some(source) = source.as_mut() else { break };
                    b.reset();
                    // Released fragments left over go first, before more is read.
                    let released = w.fragments.has_released();
                    let got = if released {
                        0
                    } else {
                        source
                            .recv(&mut b.packets)
                            .map_err(|error| RunError::Generator {
                                worker: index,
                                error,
                            })?
                    };
                    if got == 0 && !released {
                        // Idle (a live port): an empty batch, so the NFs' timers run while no
                        // packet comes and a box frees its NAT ports and connections on time.
                        let Some(now) = source.idle_now() else { break };
                        w.now = w.now.max(now);
                        b
                    } else {
                        w.counts.packets_in += got as u64;
                        b.classify(steering, o.outbound_only, &mut w.counts, &mut w.fragments);
                        b
                    }
                }
            };
            if abort.load(Ordering::Relaxed) {
                return Err(RunError::Stopped);
            }
            if let Some(configs) = self.reload.as_ref().and_then(|r| r.newer(&mut reloads)) {
                w.stage.reconfigure(&configs);
            }
            let t0 = Instant::now();
            w.process(&mut work);
            let t1 = Instant::now();
            let took = t1.saturating_duration_since(t0);
            w.busy += took;
            if let Some((view, slot)) = publish {
                batches.record(took);
                if t1 >= next_publish {
                    next_publish = t1 + PUBLISH_EVERY;
                    slot.store(Some(Arc::new(Published {
                        report: w.report_now(),
                        batches: batches.clone(),
                        state_calls: StateCallTimes::read(index, w.partition.stats()),
                    })));
                    view.answer(index, w.stage.nfs(), w.now, &mut last_query);
                }
            }
            if own_output {
                if let Some(out) = source.as_mut() {
                    forward_batch(&work, out).map_err(RunError::Output)?;
                }
            }
            match &recycle {
                Recycle::Output(tx) => tx.send(work).map_err(|_| RunError::Stopped)?,
                Recycle::Pool(tx) => {
                    let _ = tx.try_send(work);
                }
            }
        }
        w.fragments.drop_held();
        let t0 = Instant::now();
        w.partition
            .flush_all(w.now)
            .map_err(|error| RunError::State {
                worker: index,
                error,
            })?;
        w.processed = Some(t0);
        w.write_out = t0.elapsed();
        tracing::debug!(
            worker = index,
            packets = w.packets,
            reflected = w.reflected,
            out = w.out,
            busy_s = w.busy.as_secs_f64(),
            "worker done"
        );
        if let Some((_, slot)) = publish {
            slot.store(Some(Arc::new(Published {
                report: w.report_now(),
                batches,
                state_calls: StateCallTimes::read(index, w.partition.stats()),
            })));
        }
        Ok(w.report())
    }

    fn summarize(
        &self,
        dispatched: Counts,
        reports: Vec<WorkerReport>,
        start: Instant,
        end: Instant,
    ) -> Summary {
        let chain: Vec<String> = self.chain.iter().map(|f| f.name().to_owned()).collect();
        summarize(
            self.options.workers.max(1),
            self.connector.name(),
            &chain,
            dispatched,
            reports,
            start,
            end,
        )
    }
}

// ---------------------------------------------------------------------------------------------
// Batches

/// One packet's place in a [`WorkBatch`].
#[derive(Debug, Clone, Copy)]
struct Slot {
    /// `None`: malformed or skipped (generated mode), not processed.
    dissection: Option<Dissection>,
    direction: Direction,
    /// The chain forwarded it.
    forward: bool,
    /// Index of its forwarded reply in `replies`.
    reply: Option<u16>,
}

/// The unit of hand-off: packets with their dissections, and the replies reflected from them.
struct WorkBatch {
    /// The worker whose pool it belongs to.
    home: usize,
    /// The time now for an empty batch sent because the input was idle (the NFs' timers
    /// run to it); 0 otherwise.
    idle_now: u64,
    /// Packets a read fills (`packets` may have more room, see [`WorkBatch::classify`]).
    read: usize,
    packets: PacketBatch,
    slots: Vec<Slot>,
    replies: PacketBatch,
}

impl WorkBatch {
    /// A batch that reads `batch` packets and has `room` more buffers for packets added
    /// after the read.
    fn new(home: usize, batch: usize, room: usize, max_frame: usize, reflect: bool) -> Self {
        let mut packets = PacketBatch::new(batch + room, max_frame);
        packets.set_capacity(batch);
        WorkBatch {
            home,
            idle_now: 0,
            read: batch,
            packets,
            slots: Vec::with_capacity(batch + room),
            replies: if reflect {
                PacketBatch::new(batch, max_frame)
            } else {
                PacketBatch::new(1, 1)
            },
        }
    }

    fn reset(&mut self) {
        self.idle_now = 0;
        self.packets.clear();
        self.packets.set_capacity(self.read);
        self.slots.clear();
        self.replies.clear();
    }

    /// Dissects and classifies every packet (generated mode: the worker does what the
    /// dispatcher would), tracks fragments with `fragments` (a held one is not processed
    /// here), then appends the fragments released so far while there is room.
    fn classify(
        &mut self,
        steering: &Steering,
        outbound_only: bool,
        counts: &mut Counts,
        fragments: &mut FragmentTracker,
    ) {
        self.slots.clear();
        for (data, meta) in self.packets.iter() {
            let slot = match dissect(data) {
                Ok(mut d) => {
                    let direction = steering.direction(&d);
                    if outbound_only && direction == Direction::Inbound {
                        counts.skipped += 1;
                        Slot::skipped()
                    } else if d.fragment != Fragment::None
                        && fragments.admit(data, meta, &mut d) != Admit::Pass
                    {
                        Slot::skipped()
                    } else {
                        Slot::new(d, direction)
                    }
                }
                Err(e) => {
                    counts.malformed(e);
                    Slot::skipped()
                }
            };
            self.slots.push(slot);
        }
        if fragments.has_released() {
            self.packets.set_capacity(usize::MAX);
            while !self.packets.is_full() {
                let (packets, slots) = (&mut self.packets, &mut self.slots);
                let more = fragments.pop_released(|data, meta, d| {
                    packets.push(data, *meta);
                    slots.push(Slot::new(d, steering.direction(&d)));
                });
                if !more {
                    break;
                }
            }
        }
    }
}

impl Slot {
    fn new(d: Dissection, direction: Direction) -> Self {
        Slot {
            dissection: Some(d),
            direction,
            forward: false,
            reply: None,
        }
    }

    fn skipped() -> Self {
        Slot {
            dissection: None,
            direction: Direction::Inbound,
            forward: false,
            reply: None,
        }
    }
}

/// Where a worker's input comes from.
enum Feed {
    /// Batches from the dispatcher.
    Queue(Receiver<WorkBatch>),
    /// Empty batches from the worker's own pool, filled by its generator.
    Generate(Receiver<WorkBatch>),
}

/// Where a processed batch goes.
enum Recycle {
    /// To the output stage (which sends it home).
    Output(SyncSender<WorkBatch>),
    /// Straight home (output discarded).
    Pool(SyncSender<WorkBatch>),
}

/// Tells the starter whether this worker is ready; says "no" if dropped unsent (a panic).
struct ReadyGuard(Option<SyncSender<bool>>);

impl ReadyGuard {
    fn send(&mut self, ok: bool) {
        if let Some(tx) = self.0.take() {
            let _ = tx.send(ok);
        }
    }
}

impl Drop for ReadyGuard {
    fn drop(&mut self) {
        self.send(false);
    }
}

/// Raises the abort flag if its thread panics.
struct AbortOnPanic<'a>(&'a AtomicBool);

impl Drop for AbortOnPanic<'_> {
    fn drop(&mut self) {
        if thread::panicking() {
            self.0.store(true, Ordering::SeqCst);
        }
    }
}

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "(no message)".into()
    }
}

/// Receives, waking up regularly to give up when another stage failed.
fn recv_or_abort<T>(rx: &Receiver<T>, abort: &AtomicBool) -> Option<T> {
    loop {
        match rx.recv_timeout(ABORT_POLL) {
            Ok(v) => return Some(v),
            Err(RecvTimeoutError::Timeout) => {
                if abort.load(Ordering::Relaxed) {
                    return None;
                }
            }
            Err(RecvTimeoutError::Disconnected) => return None,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The worker

struct Worker {
    index: usize,
    stage: Stage,
    partition: Partition,
    /// Runtime time: the latest packet timestamp seen.
    now: Nanos,
    reflect: bool,
    counts: Counts,
    packets: u64,
    reflected: u64,
    out: u64,
    busy: Duration,
    processed: Option<Instant>,
    write_out: Duration,
    /// The packets of the segment being run, and their answers (kept: no allocation per batch).
    items: Vec<Item>,
    answers: Vec<Item>,
    /// Fragments of the worker's own input (generated mode).
    fragments: FragmentTracker,
}

/// The flows of a segment, as a bit filter: flows that differ may share a bit (which only ends
/// a segment early), the same flow always does, in either direction. 1024 bits, so that the
/// 32 distinct flows of a batch rarely collide (with 64, a segment ended after ten packets on
/// average, and each NF prefetched that many at a time).
#[derive(Default)]
struct FlowFilter([u64; 16]);

impl FlowFilter {
    /// Adds `f`; `false` if its bit was set already.
    #[inline]
    fn insert(&mut self, f: &flowstate_wire::FlowKey) -> bool {
        let b = flow_bits(f);
        let (word, bit) = (&mut self.0[(b >> 6) as usize], 1u64 << (b & 63));
        let new = *word & bit == 0;
        *word |= bit;
        new
    }
}

/// 10 bits of `f` that are the same in both directions.
fn flow_bits(f: &flowstate_wire::FlowKey) -> u32 {
    let fold = |a: std::net::IpAddr| match a {
        std::net::IpAddr::V4(v) => u64::from(u32::from(v)),
        std::net::IpAddr::V6(v) => {
            let x = u128::from(v);
            (x as u64) ^ ((x >> 64) as u64)
        }
    };
    let x = fold(f.src)
        ^ fold(f.dst)
        ^ (u64::from(f.src_port ^ f.dst_port) << 32)
        ^ (u64::from(f.proto) << 48);
    (x.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 54) as u32
}

/// A batch's frames, as the stage engine reads them.
struct BatchFrames<'a>(&'a mut PacketBatch);

impl Frames for BatchFrames<'_> {
    fn frame(&self, index: usize) -> Option<&[u8]> {
        self.0.get(index).map(|(data, _)| data)
    }

    fn frame_mut(&mut self, index: usize) -> Option<&mut [u8]> {
        self.0.get_mut(index).map(|(data, _)| data)
    }
}

impl Worker {
    /// Processes one batch to completion, in segments run NF by NF (issue #22: each NF
    /// prefetches a segment's state after the NF before it rewrote the packets, so an LB
    /// after a NAT loads the entries it will look up). A segment is a run of packets of one
    /// direction and of distinct flows, so every NF sees the packets of each flow, and each
    /// flow's packets before and after translation, in the order they came; the reflected
    /// answers of a segment's packets run right after it, before any later packet.
    fn process(&mut self, work: &mut WorkBatch) {
        let WorkBatch {
            packets,
            slots,
            replies,
            ..
        } = work;
        replies.clear();
        let n = packets.len().min(slots.len());
        let (mut items, mut answers) = (
            std::mem::take(&mut self.items),
            std::mem::take(&mut self.answers),
        );
        let mut start = 0;
        while start < n {
            items.clear();
            let (mut direction, mut seen, mut end) = (None, FlowFilter::default(), start);
            while end < n {
                let slot = &slots[end];
                if let Some(d) = slot.dissection {
                    if direction.is_some_and(|dir| dir != slot.direction)
                        || d.flow.is_some_and(|f| !seen.insert(&f))
                    {
                        break;
                    }
                    direction = Some(slot.direction);
                    let ts = packets.get(end).map_or(0, |(_, m)| m.timestamp_ns);
                    self.now = self.now.max(ts);
                    self.packets += 1;
                    items.push(Item::new(end, d, self.now));
                }
                end += 1;
            }
            start = end;
            let Some(direction) = direction else { continue };
            self.stage
                .run(&mut BatchFrames(packets), &mut items, direction);
            answers.clear();
            for it in items.iter().filter(|it| it.alive) {
                slots[it.index].forward = true;
                self.out += 1;
                if !(self.reflect && direction == Direction::Outbound) {
                    continue;
                }
                let Some((request, meta)) = packets.get(it.index) else {
                    continue;
                };
                let ts = meta.timestamp_ns;
                let mut built = 0;
                if !replies.push_with(|buf, m| {
                    built = reflect(request, it.now, buf).unwrap_or(0);
                    m.timestamp_ns = ts;
                    m.wire_len = built as u32;
                    built
                }) || built == 0
                {
                    continue;
                }
                let r = replies.len() - 1;
                let Some((rdata, _)) = replies.get_mut(r) else {
                    continue;
                };
                let Ok(rd) = dissect(rdata) else { continue };
                self.reflected += 1;
                answers.push(Item {
                    tag: it.index,
                    ..Item::new(r, rd, it.now)
                });
            }
            self.stage
                .run(&mut BatchFrames(replies), &mut answers, Direction::Inbound);
            for a in answers.iter().filter(|a| a.alive) {
                slots[a.tag].reply = u16::try_from(a.index).ok();
                self.out += 1;
            }
        }
        (self.items, self.answers) = (items, answers);

        self.stage.tick(self.now);
        self.partition.maybe_flush(self.now);
    }

    fn report(self) -> WorkerReport {
        self.report_now()
    }

    /// The counters as they are now.
    fn report_now(&self) -> WorkerReport {
        let stats = self.partition.stats();
        WorkerReport {
            index: self.index,
            packets: self.packets,
            reflected: self.reflected,
            out: self.out,
            busy: self.busy,
            processed: self.processed,
            write_out: self.write_out,
            stage: self.stage.report(),
            counts: Counts {
                fragments: *self.fragments.counts(),
                ..self.counts.clone()
            },
            state_flushes: stats.flushes.load(Ordering::Relaxed),
            state_errors: stats.errors.load(Ordering::Relaxed),
            state_lost_ops: stats.lost_ops.load(Ordering::Relaxed),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Dispatcher and output

/// Reads the source, dissects, classifies and steers each packet into its worker's batch.
#[allow(clippy::too_many_arguments)]
fn dispatch(
    source: &mut dyn Source,
    steering: &Steering,
    reload: Option<&Reload>,
    in_txs: &[SyncSender<WorkBatch>],
    free: &[Receiver<WorkBatch>],
    abort: &AtomicBool,
    o: &RuntimeOptions,
    counts: &mut Counts,
    publish: Option<&ArcSwapOption<Counts>>,
) -> Result<(), RunError> {
    // Steered by the chain as it started, then by each reload's.
    let mut steering = steering.clone();
    let mut reloads = 0;
    let mut input = PacketBatch::new(o.batch.max(1), o.max_frame);
    let mut next_publish = Instant::now();
    let mut pending: Vec<Option<WorkBatch>> = (0..in_txs.len()).map(|_| None).collect();
    let mut fragments = FragmentTracker::new(o.fragments, o.max_frame);
    // Appends a packet to its worker's batch, handing the batch over when it is full.
    let push = |steering: &Steering,
                pending: &mut [Option<WorkBatch>],
                data: &[u8],
                meta: &flowstate_io::PacketMeta,
                d: Dissection,
                direction: Direction|
     -> Result<(), RunError> {
        let w = steering.worker(data, &d);
        let b = match &mut pending[w] {
            Some(b) => b,
            empty => {
                let Some(mut b) = recv_or_abort(&free[w], abort) else {
                    return Err(RunError::Stopped);
                };
                b.reset();
                empty.insert(b)
            }
        };
        b.packets.push(data, *meta);
        b.slots.push(Slot::new(d, direction));
        if b.packets.is_full() {
            if let Some(b) = pending[w].take() {
                in_txs[w].send(b).map_err(|_| RunError::Stopped)?;
            }
        }
        Ok(())
    };
    loop {
        if abort.load(Ordering::Relaxed) {
            return Err(RunError::Stopped);
        }
        let got = source.recv(&mut input).map_err(RunError::Input)?;
        if let Some(owners) = reload.and_then(|r| r.owners_newer(&mut reloads)) {
            steering = steering.with_owners(owners);
        }
        if let Some(slot) = publish {
            let now = Instant::now();
            if now >= next_publish {
                next_publish = now + PUBLISH_EVERY;
                counts.fragments = *fragments.counts();
                slot.store(Some(Arc::new(counts.clone())));
            }
        }
        if got == 0 {
            let Some(now) = source.idle_now() else { break };
            // Idle (a live port): an empty batch to every worker, so its NFs' timers run.
            for (w, tx) in in_txs.iter().enumerate() {
                let mut b = match pending[w].take() {
                    Some(b) => b,
                    None => {
                        let Some(mut b) = recv_or_abort(&free[w], abort) else {
                            return Err(RunError::Stopped);
                        };
                        b.reset();
                        b
                    }
                };
                b.idle_now = now;
                tx.send(b).map_err(|_| RunError::Stopped)?;
            }
            continue;
        }
        counts.packets_in += got as u64;
        for (data, meta) in input.iter() {
            let mut d = match dissect(data) {
                Ok(d) => d,
                Err(e) => {
                    counts.malformed(e);
                    continue;
                }
            };
            let direction = steering.direction(&d);
            if o.outbound_only && direction == Direction::Inbound {
                counts.skipped += 1;
                continue;
            }
            if d.fragment != Fragment::None && fragments.admit(data, meta, &mut d) != Admit::Pass {
                continue; // held or dropped (counted)
            }
            push(&steering, &mut pending, data, meta, d, direction)?;
            // A first fragment releases the fragments that came before it: they follow it.
            let mut failed = Ok(());
            while failed.is_ok()
                && fragments.pop_released(|data, meta, d| {
                    failed = push(
                        &steering,
                        &mut pending,
                        data,
                        meta,
                        d,
                        steering.direction(&d),
                    );
                })
            {}
            failed?;
        }
        // A short read means the source had no more for now (a live port is idle): hand the
        // partial batches over rather than hold packets back until more arrive.
        if got < input.capacity() {
            for (w, b) in pending.iter_mut().enumerate() {
                if let Some(b) = b.take() {
                    in_txs[w].send(b).map_err(|_| RunError::Stopped)?;
                }
            }
        }
    }
    fragments.drop_held();
    counts.fragments = *fragments.counts();
    for (w, b) in pending.iter_mut().enumerate() {
        if let Some(b) = b.take() {
            in_txs[w].send(b).map_err(|_| RunError::Stopped)?;
        }
    }
    Ok(())
}

/// Writes each batch's forwarded packets, each followed by its forwarded reply, and sends the
/// batch home.
fn output_loop(
    sink: &mut (dyn Sink + Send),
    rx: Receiver<WorkBatch>,
    free: &[SyncSender<WorkBatch>],
    capacity: usize,
    max_frame: usize,
    abort: &AtomicBool,
) -> Result<(), RunError> {
    let mut out = PacketBatch::new(capacity, max_frame);
    while let Ok(work) = rx.recv() {
        out.clear();
        for (i, slot) in work.slots.iter().enumerate() {
            if !slot.forward {
                continue;
            }
            if let Some((data, meta)) = work.packets.get(i) {
                out.push(data, *meta);
            }
            if let Some((data, meta)) = slot.reply.and_then(|r| work.replies.get(usize::from(r))) {
                out.push(data, *meta);
            }
        }
        if !out.is_empty() {
            sink.send(&out).map_err(RunError::Output)?;
        }
        if let Some(home) = free.get(work.home) {
            let _ = home.try_send(work);
        }
        if abort.load(Ordering::Relaxed) {
            // Keep draining so that workers are not stuck on a full queue; stop writing.
            while rx.recv().is_ok() {}
            return Err(RunError::Stopped);
        }
    }
    sink.flush().map_err(RunError::Output)
}

/// Sets the calling thread's nice value (Linux: per thread); a refusal (no CAP_SYS_NICE) is
/// logged, not fatal: the worker runs at the inherited priority.
fn set_nice(nice: i32, worker: usize) {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: gettid and setpriority on this thread; no memory is passed.
        let r = unsafe {
            let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
            libc::setpriority(libc::PRIO_PROCESS, tid, nice)
        };
        if r != 0 {
            tracing::warn!(
                worker,
                nice,
                error = %std::io::Error::last_os_error(),
                "could not set the worker's nice value; it runs at the inherited one"
            );
        }
    }
    #[cfg(not(target_os = "linux"))]
    tracing::warn!(worker, nice, "nice values are set on Linux only");
}

/// Hands a processed batch's forwarded packets, each followed by its forwarded reply, to the
/// worker's own output, then sends them.
fn forward_batch(work: &WorkBatch, out: &mut dyn WorkerSink) -> flowstate_io::Result<()> {
    for (i, slot) in work.slots.iter().enumerate() {
        if !slot.forward {
            continue;
        }
        if let Some((data, _)) = work.packets.get(i) {
            out.forward(data, Some(i))?;
        }
        if let Some((data, _)) = slot.reply.and_then(|r| work.replies.get(usize::from(r))) {
            out.forward(data, None)?;
        }
    }
    out.flush_forwarded()
}

/// Whether to pin each worker to a core of its own: only when the workers and the other busy
/// threads of the run (the dispatcher, the output stage) all fit on distinct cores.
fn pin_workers(workers: usize, dispatching: bool, output: bool, cores: usize) -> bool {
    workers + usize::from(dispatching) + usize::from(output) <= cores
}

#[cfg(test)]
mod pin_tests {
    use super::pin_workers;

    #[test]
    fn pins_only_when_every_thread_has_a_core() {
        assert!(
            pin_workers(2, false, false, 2),
            "generated traffic, discarded: pin"
        );
        assert!(
            !pin_workers(2, true, false, 2),
            "a dispatcher needs a core too"
        );
        assert!(!pin_workers(2, false, true, 2), "so does the output stage");
        assert!(pin_workers(2, true, true, 4));
        assert!(!pin_workers(1, false, false, 0), "no core list: never");
    }
}

#[cfg(test)]
mod segment_tests {
    use super::FlowFilter;
    use flowstate_wire::FlowKey;
    use std::net::{IpAddr, Ipv4Addr};

    fn flow(client: u32, port: u16) -> FlowKey {
        FlowKey::new(
            IpAddr::V4(Ipv4Addr::from(0x0a00_0000 | client)),
            IpAddr::V4(Ipv4Addr::new(198, 51, 100, 1)),
            port,
            443,
            6,
        )
    }

    #[test]
    fn a_flow_ends_the_segment_in_either_direction_and_distinct_flows_rarely_do() {
        let mut seen = FlowFilter::default();
        let f = flow(7, 40_000);
        assert!(seen.insert(&f));
        assert!(!seen.insert(&f), "the same flow again");
        let back = FlowKey::new(f.dst, f.src, f.dst_port, f.src_port, f.proto);
        assert!(!seen.insert(&back), "its answer");
        // Batches of 32 distinct flows: with 64 bits, about ten packets a segment.
        let (mut batches, mut whole) = (0, 0);
        for b in 0..100u32 {
            let mut seen = FlowFilter::default();
            batches += 1;
            whole += usize::from((0..32).all(|i| seen.insert(&flow(b * 32 + i, 1024 + i as u16))));
        }
        assert!(
            whole * 2 > batches,
            "{whole} of {batches} batches one segment"
        );
    }
}
