//! The cache-and-flush engine: one [`Partition`] per worker, a state thread per partition that
//! owns the backend connection (FlexState §III-C2, §IV-C).
//!
//! Handles keep typed values in the worker's cache; `_nowait` calls change the cache and mark
//! what must reach the store; [`Partition::maybe_flush`] encodes those changes (the only place
//! values become bytes) and hands them to the state thread without waiting. Synchronous calls
//! go through the same thread, after everything queued before them, and wait for the reply, so
//! a read sees every earlier update (CHC §4.3).
//!
//! With an in-process store ([`Connector::in_process`]) an object owned by one worker lives only
//! in that worker's cache: no encoding, no flushing, no store round trip, whatever the call.
//! Shared objects still go to that store, called in place rather than through a state thread:
//! an in-memory operation costs less than a thread hand-off.

use crate::backend::{BackendError, Batch, Connector, Op, Reply};
use crate::key::{Kind, ObjectKey, Owner};
use crate::scope::{Access, Scope, Strategy};
use crate::StateError;
use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Nanoseconds on the runtime's clock (virtual in tests). NFs never read a clock themselves.
pub type Nanos = u64;

/// Engine settings for one worker's partition.
#[derive(Debug, Clone)]
pub struct StateConfig {
    /// The stage whose state this is: the first owner part of its keys
    /// (`nf@stage@partition@…`, FlexState's `nf@instance@core`). On one host, whose chain is
    /// one stage, the box's `[state] nf_instance`.
    pub stage: u32,
    /// The traffic partition (a host's worker, a cluster's partition): the second part.
    pub partition: u32,
    /// How often queued changes go to the store (FlexState §III-C2; default 1 ms).
    pub flush_interval: Duration,
    /// Whether this worker is the only user of shared objects (one worker, one instance):
    /// then read-write shared objects may be cached (CHC Table 1).
    pub exclusive: bool,
    /// How many flush batches may wait for the state thread before flushing holds back
    /// (changes keep accumulating, coalesced, in the cache meanwhile).
    pub queue_depth: usize,
    /// Most operations of failed flushes kept to send again, in order, when the store answers
    /// again (default a million, about 100 MB of small operations); beyond, the oldest are
    /// given up and counted in [`LinkStats::lost_ops`].
    pub retain_ops: usize,
    /// No caching at all: every object offloaded, every read a round trip to the store
    /// (CHC §7.1's model #1, "externalized operations"). A baseline for experiments; off by
    /// default.
    pub uncached: bool,
}

impl Default for StateConfig {
    fn default() -> Self {
        StateConfig {
            stage: 0,
            partition: 0,
            flush_interval: Duration::from_millis(1),
            exclusive: false,
            queue_depth: 64,
            retain_ops: 1_000_000,
            uncached: false,
        }
    }
}

/// Counters of one partition's traffic with its store.
#[derive(Debug, Default)]
pub struct LinkStats {
    /// Flush batches handed to the state thread.
    pub flushes: AtomicU64,
    /// Operations sent without waiting.
    pub async_ops: AtomicU64,
    /// Synchronous round trips.
    pub sync_calls: AtomicU64,
    /// Attempts the store failed (counted, logged once per interval; failed flushes are sent
    /// again, see [`StateConfig::retain_ops`]).
    pub errors: AtomicU64,
    /// Flushes held back because the state thread was behind.
    pub held_back: AtomicU64,
    /// Operations given up: beyond [`StateConfig::retain_ops`] while the store was down, or
    /// still unsent when the partition closed.
    pub lost_ops: AtomicU64,
    /// Operations not sent because the store refused this partition's fenced writes
    /// ([`crate::FencedBackend`]): its writer lost it.
    pub fenced_ops: AtomicU64,
    /// How long the state thread's calls to a remote store took (flushes and round trips,
    /// failed ones included): bucket `i` counts calls of `(2^(i-1), 2^i]` µs, bucket 0 those
    /// of at most 1 µs, the last the longer ones. An in-process store is called inline and
    /// not timed.
    pub call_micros: [AtomicU64; CALL_BUCKETS],
    /// Their total time, µs.
    pub call_micros_sum: AtomicU64,
}

/// Buckets of [`LinkStats::call_micros`].
pub const CALL_BUCKETS: usize = 24;

impl LinkStats {
    /// Records one store call that took `took`.
    fn record_call(&self, took: Duration) {
        let us = took.as_micros().min(u128::from(u64::MAX)) as u64;
        let i = if us <= 1 {
            0
        } else {
            (64 - (us - 1).leading_zeros()) as usize
        };
        self.call_micros[i.min(CALL_BUCKETS - 1)].fetch_add(1, Ordering::Relaxed);
        self.call_micros_sum.fetch_add(us, Ordering::Relaxed);
    }
}

/// `backend.execute_batch`, timed into `stats`.
fn timed_execute(
    backend: &mut dyn crate::Backend,
    ops: &[Op],
    batch: Batch,
    replies: &mut Vec<Reply>,
    stats: &LinkStats,
) -> Result<(), BackendError> {
    let t = Instant::now();
    let r = backend.execute_batch(batch, ops, replies);
    stats.record_call(t.elapsed());
    r
}

/// How long a state thread waits before sending failed flushes again, at first and at most.
const RETRY_FIRST: Duration = Duration::from_millis(10);
const RETRY_MAX: Duration = Duration::from_secs(1);
/// How long a closed partition's state thread goes on sending a batch the store may have run
/// (sent, its answer lost) or what one it accepted left ([`BackendError::Partial`]): once
/// run, they are part of commits whose packets may have left, so they are not given up while
/// a store failover may still end (a batch that never ran is refused by its fence).
const REST_RETRY_FOR: Duration = Duration::from_secs(30);

/// A call handed over whose replies are not read yet.
struct Pending {
    /// Replies of backlog ops ahead of the call's own.
    older: usize,
    /// The replies already there (an in-process store answers at once).
    done: Option<Result<Vec<Reply>, StateError>>,
}

struct Request {
    ops: Vec<Op>,
    reply: Option<Sender<Result<Vec<Reply>, BackendError>>>,
    /// How many of `ops`, from the first, to keep and send again if the store fails them:
    /// queued changes the caller has let go of (the rest are its own call, which fails).
    keep: usize,
}

/// A worker's line to its state thread.
pub(crate) struct Link {
    route: Route,
    pub(crate) in_process: bool,
    pub(crate) stats: Arc<LinkStats>,
    /// Changes drained from the caches that the state thread could not take yet (it was
    /// behind): they go before anything newer, a flush's or a call's.
    backlog: RefCell<Vec<Op>>,
    /// A flush handed over by [`Partition::begin_flush_all`] whose replies are not read yet,
    /// and, once another call had to read them first, what they said.
    commit: RefCell<Commit>,
    /// Whether changes went to the state thread without waiting since the last call: a
    /// flush-all must then wait for them even when it has nothing new to send.
    unsynced: Cell<bool>,
}

/// See [`Link::commit`].
#[derive(Default)]
struct Commit {
    pending: Option<Pending>,
    answer: Option<Result<Vec<Reply>, StateError>>,
}

/// How a partition reaches its store.
enum Route {
    /// Through a state thread that owns the connection (a remote store: waiting on the network
    /// must not stall packet processing).
    Thread {
        tx: SyncSender<Request>,
        reply_tx: Sender<Result<Vec<Reply>, BackendError>>,
        reply_rx: Receiver<Result<Vec<Reply>, BackendError>>,
    },
    /// Called in place (an in-process store: an operation costs less than a thread hand-off).
    Inline(RefCell<Box<dyn crate::Backend>>),
}

impl Link {
    /// Runs `ops` after everything queued and waits for the replies.
    pub(crate) fn call(&self, ops: Vec<Op>) -> Result<Vec<Reply>, StateError> {
        self.call_keeping(ops, 0)
    }

    /// [`call`](Self::call), where the first `keep` ops are changes drained from a cache: if
    /// the store fails, the state thread keeps them to send again like a failed flush.
    pub(crate) fn call_keeping(&self, ops: Vec<Op>, keep: usize) -> Result<Vec<Reply>, StateError> {
        self.settle_commit();
        let pending = self.begin_call(ops, keep)?;
        self.end_call(pending)
    }

    /// The first half of [`call_keeping`](Self::call_keeping): hands the call over (after the
    /// backlog) without waiting for its replies.
    fn begin_call(&self, mut ops: Vec<Op>, mut keep: usize) -> Result<Pending, StateError> {
        self.stats.sync_calls.fetch_add(1, Ordering::Relaxed);
        // The state thread runs requests in order: this call's answer follows every earlier one.
        self.unsynced.set(false);
        // The backlog goes first, so that a read sees every earlier change and a write is not
        // overtaken by an older one; its replies are not the caller's.
        let older = {
            let mut backlog = self.backlog.borrow_mut();
            let n = backlog.len();
            if n > 0 {
                backlog.append(&mut ops);
                ops = std::mem::take(&mut *backlog);
                keep = keep.saturating_add(n);
            }
            n
        };
        let done = match &self.route {
            Route::Thread { tx, reply_tx, .. } => {
                tx.send(Request {
                    ops,
                    reply: Some(reply_tx.clone()),
                    keep,
                })
                .map_err(|_| StateError::Closed)?;
                None
            }
            Route::Inline(backend) => {
                let mut replies = Vec::with_capacity(ops.len());
                Some(match backend.borrow_mut().execute(&ops, &mut replies) {
                    Ok(()) => Ok(replies),
                    Err(e) => {
                        // No state thread to retain them: the kept changes wait as the backlog.
                        let mut ops = ops;
                        ops.truncate(keep);
                        *self.backlog.borrow_mut() = ops;
                        Err(e.into())
                    }
                })
            }
        };
        Ok(Pending { older, done })
    }

    /// Reads the replies of a pending commit (they come before any later call's) and keeps
    /// them for [`Partition::end_flush_all`].
    fn settle_commit(&self) {
        let mut c = self.commit.borrow_mut();
        if let Some(p) = c.pending.take() {
            c.answer = Some(self.end_call(p));
        }
    }

    /// The second half: waits for the replies of a call begun with
    /// [`begin_call`](Self::begin_call) (calls end in the order they began).
    fn end_call(&self, p: Pending) -> Result<Vec<Reply>, StateError> {
        let mut replies = match (p.done, &self.route) {
            (Some(done), _) => done?,
            (None, Route::Thread { reply_rx, .. }) => {
                reply_rx.recv().map_err(|_| StateError::Closed)??
            }
            (None, Route::Inline(_)) => return Err(StateError::Unexpected("no reply")),
        };
        replies.drain(..p.older.min(replies.len()));
        Ok(replies)
    }

    /// One op, one reply.
    pub(crate) fn call1(&self, op: Op) -> Result<Reply, StateError> {
        let mut r = self.call(vec![op])?;
        match r.pop() {
            Some(Reply::Error(e)) => Err(StateError::Op(e)),
            Some(reply) => Ok(reply),
            None => Err(StateError::Unexpected("no reply")),
        }
    }

    /// Hands the backlog over without waiting; `false` if the state thread is still behind.
    fn send_backlog(&self) -> bool {
        let ops = std::mem::take(&mut *self.backlog.borrow_mut());
        ops.is_empty() || self.send(ops)
    }

    /// Hands `ops` over without waiting; keeps them as the backlog if the state thread is
    /// behind (the backlog is empty: [`send_backlog`](Self::send_backlog) went first).
    fn send(&self, ops: Vec<Op>) -> bool {
        match self.try_send(ops) {
            Ok(()) => true,
            Err(back) => {
                *self.backlog.borrow_mut() = back;
                false
            }
        }
    }

    fn try_send(&self, ops: Vec<Op>) -> Result<(), Vec<Op>> {
        let n = ops.len() as u64;
        self.unsynced
            .set(matches!(self.route, Route::Thread { .. }));
        match &self.route {
            Route::Thread { tx, .. } => match tx.try_send(Request {
                keep: ops.len(),
                ops,
                reply: None,
            }) {
                Ok(()) => {}
                Err(TrySendError::Full(r)) | Err(TrySendError::Disconnected(r)) => {
                    self.stats.held_back.fetch_add(1, Ordering::Relaxed);
                    return Err(r.ops);
                }
            },
            Route::Inline(backend) => {
                let mut replies = Vec::with_capacity(ops.len());
                if backend.borrow_mut().execute(&ops, &mut replies).is_err() {
                    self.stats.errors.fetch_add(1, Ordering::Relaxed);
                    return Err(ops);
                }
            }
        }
        self.stats.flushes.fetch_add(1, Ordering::Relaxed);
        self.stats.async_ops.fetch_add(n, Ordering::Relaxed);
        Ok(())
    }
}

/// Flushes the store failed, kept in order to be sent again before anything newer.
struct Retained {
    batches: VecDeque<Kept>,
    ops: usize,
    /// The store refused a fenced batch ([`BackendError::Fenced`]): this partition's writer
    /// has lost it; nothing more is sent, every request gets this error.
    fenced: Option<BackendError>,
    limit: usize,
    next_try: Instant,
    backoff: Duration,
    last_log: Option<Instant>,
}

/// A failed flush kept to send again.
struct Kept {
    ops: Vec<Op>,
    /// Its number, as first sent (a store may have run it: see [`crate::Fence::batch`]), and
    /// whether it is what a fenced batch the store accepted left ([`BackendError::Partial`]):
    /// sent without the fence, kept when the writer loses it.
    batch: Batch,
    /// Whether it was sent: the store may have run it (its answer lost). Sent again with its
    /// number, a store that marks batches says so, even to a writer that lost the fence.
    sent: bool,
}

impl Retained {
    /// Counts a failure, logs it at most once a second, and waits longer before the next try.
    fn failed(&mut self, stats: &LinkStats, e: &BackendError) {
        let n = stats.errors.fetch_add(1, Ordering::Relaxed) + 1;
        if self
            .last_log
            .is_none_or(|t| t.elapsed() >= Duration::from_secs(1))
        {
            eprintln!(
                "flowstate: state flush failed ({n} so far, {} operations kept to send \
                 again): {e}",
                self.ops
            );
            self.last_log = Some(Instant::now());
        }
        self.next_try = Instant::now() + self.backoff;
        self.backoff = (self.backoff * 2).min(RETRY_MAX);
    }

    /// Keeps what of `ops` the store failed (`e`) to send again: the first `keep` of them,
    /// or only those a fenced batch left ([`BackendError::Partial`]).
    fn keep_failed(
        &mut self,
        mut ops: Vec<Op>,
        keep: usize,
        number: u64,
        sent: bool,
        e: &BackendError,
        stats: &LinkStats,
    ) {
        let kept = match e {
            BackendError::Partial { rest, .. } => Kept {
                ops: rest
                    .iter()
                    .filter(|&&i| i < keep.min(ops.len()))
                    .map(|&i| ops[i].clone())
                    .collect(),
                batch: Batch { number, rest: true },
                sent,
            },
            _ => {
                ops.truncate(keep);
                Kept {
                    ops,
                    batch: Batch {
                        number,
                        rest: false,
                    },
                    sent,
                }
            }
        };
        if !kept.ops.is_empty() {
            self.keep(kept, stats);
        }
    }

    /// Keeps a batch to send again, giving up the oldest beyond `limit`.
    fn keep(&mut self, kept: Kept, stats: &LinkStats) {
        self.ops += kept.ops.len();
        self.batches.push_back(kept);
        while self.ops > self.limit {
            let Some(old) = self.batches.pop_front() else {
                break;
            };
            self.ops -= old.ops.len();
            stats
                .lost_ops
                .fetch_add(old.ops.len() as u64, Ordering::Relaxed);
        }
    }

    /// Takes the store's refusal of a fenced batch: what is kept is dropped (it would be
    /// refused too), and so is everything after; what accepted batches left is still sent.
    fn fence(&mut self, e: BackendError, stats: &LinkStats) {
        let before = self.ops;
        self.batches.retain(|k| k.batch.rest);
        self.ops = self.batches.iter().map(|k| k.ops.len()).sum();
        stats
            .fenced_ops
            .fetch_add((before - self.ops) as u64, Ordering::Relaxed);
        if self.fenced.is_none() {
            eprintln!("flowstate: {e}; this partition's writes stop");
        }
        self.fenced = Some(e);
    }

    /// Sends the kept flushes again, oldest first; `false` if the store still fails.
    fn resend(
        &mut self,
        backend: &mut dyn crate::Backend,
        replies: &mut Vec<Reply>,
        stats: &LinkStats,
    ) -> bool {
        while let Some(k) = self.batches.front_mut() {
            replies.clear();
            match timed_execute(backend, &k.ops, k.batch, replies, stats) {
                Ok(()) => {
                    self.ops -= k.ops.len();
                    self.batches.pop_front();
                }
                Err(e @ BackendError::Fenced { .. }) => self.fence(e, stats),
                Err(e) => {
                    if let BackendError::Partial { rest, .. } = &e {
                        let left: Vec<Op> =
                            rest.iter().filter_map(|&i| k.ops.get(i).cloned()).collect();
                        self.ops -= k.ops.len() - left.len();
                        k.ops = left;
                        k.batch.rest = true;
                    }
                    k.sent = true;
                    self.failed(stats, &e);
                    return false;
                }
            }
        }
        self.backoff = RETRY_FIRST;
        true
    }
}

/// Runs requests in order. A flush the store fails is kept and sent again (with backoff)
/// before anything newer, so the store ends with every update once it answers again; a
/// synchronous call while earlier flushes wait fails rather than read around them. A flush
/// whose fate is unknown (the connection broke mid-batch) is sent again whole, with its number
/// ([`Batch`]): the `store` backend deduplicates by operation id, and Redis runs a numbered
/// fenced batch once ([`crate::Fence::batch`]); elsewhere (Cassandra, Redis unfenced) its
/// counter additions may count twice.
fn state_thread(
    mut backend: Box<dyn crate::Backend>,
    rx: Receiver<Request>,
    stats: Arc<LinkStats>,
    retain_ops: usize,
) {
    let mut replies = Vec::new();
    let mut kept = Retained {
        batches: VecDeque::new(),
        ops: 0,
        fenced: None,
        limit: retain_ops,
        next_try: Instant::now(),
        backoff: RETRY_FIRST,
        last_log: None,
    };
    loop {
        let req = if kept.batches.is_empty() {
            rx.recv().ok()
        } else {
            match rx.recv_timeout(kept.next_try.saturating_duration_since(Instant::now())) {
                Ok(req) => Some(req),
                Err(RecvTimeoutError::Timeout) => {
                    kept.resend(backend.as_mut(), &mut replies, &stats);
                    continue;
                }
                Err(RecvTimeoutError::Disconnected) => None,
            }
        };
        let Some(req) = req else { break };
        let number = next_batch_number();
        let whole = Batch {
            number,
            rest: false,
        };
        if let Some(e) = &kept.fenced {
            stats
                .fenced_ops
                .fetch_add(req.ops.len() as u64, Ordering::Relaxed);
            if let Some(tx) = req.reply {
                let _ = tx.send(Err(e.clone()));
            }
            continue;
        }
        // A caller waiting is worth a try before the backoff is over.
        let clear = kept.batches.is_empty()
            || ((req.reply.is_some() || Instant::now() >= kept.next_try)
                && kept.resend(backend.as_mut(), &mut replies, &stats));
        match req.reply {
            Some(tx) => {
                let result = if clear {
                    replies.clear();
                    timed_execute(backend.as_mut(), &req.ops, whole, &mut replies, &stats)
                        .map(|()| std::mem::take(&mut replies))
                } else {
                    Err(BackendError::Unreachable {
                        backend: backend.name(),
                        reason: format!(
                            "{} earlier operations wait for the store to answer",
                            kept.ops
                        ),
                    })
                };
                match &result {
                    Err(e @ BackendError::Fenced { .. }) => {
                        stats
                            .fenced_ops
                            .fetch_add(req.ops.len() as u64, Ordering::Relaxed);
                        kept.fence(e.clone(), &stats);
                    }
                    Err(e) => kept.keep_failed(req.ops, req.keep, number, clear, e, &stats),
                    Ok(_) => {}
                }
                let _ = tx.send(result.map_err(|e| kept.fenced.clone().unwrap_or(e)));
            }
            None if clear => {
                replies.clear();
                match timed_execute(backend.as_mut(), &req.ops, whole, &mut replies, &stats) {
                    Err(e @ BackendError::Fenced { .. }) => {
                        stats
                            .fenced_ops
                            .fetch_add(req.ops.len() as u64, Ordering::Relaxed);
                        kept.fence(e, &stats);
                    }
                    Err(e) => {
                        let n = req.ops.len();
                        kept.keep_failed(req.ops, n, number, true, &e, &stats);
                        kept.failed(&stats, &e);
                    }
                    Ok(()) => {}
                }
            }
            None => kept.keep(
                Kept {
                    ops: req.ops,
                    batch: whole,
                    sent: false,
                },
                &stats,
            ),
        }
    }
    // The partition is gone: one last try for what waits; a batch the store may have run, or
    // what one it ran left, is tried for a while longer (the store says whether it ran);
    // then the rest is lost: it never ran.
    let give_up = Instant::now() + REST_RETRY_FOR;
    while !kept.batches.is_empty() && !kept.resend(backend.as_mut(), &mut replies, &stats) {
        if !kept.batches.iter().any(|k| k.batch.rest || k.sent) || Instant::now() >= give_up {
            stats.lost_ops.fetch_add(kept.ops as u64, Ordering::Relaxed);
            eprintln!(
                "flowstate: {} state operations could not reach the store and are lost",
                kept.ops
            );
            break;
        }
        std::thread::sleep(kept.next_try.saturating_duration_since(Instant::now()));
    }
}

/// A batch number no other batch of this process, nor of an earlier one, was given: numbers
/// count up from the wall clock's nanoseconds at the first. A store marks a writer's batches
/// by number ([`crate::Fence::batch`]); a partition taken again under the same ownership
/// record must not meet the marks of its predecessor's batches.
fn next_batch_number() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    static START: std::sync::Once = std::sync::Once::new();
    START.call_once(|| {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64);
        NEXT.store(now.max(1), Ordering::Relaxed);
    });
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// Lets the calling thread run on every CPU the process may use. A state thread is started
/// by its worker, often pinned to one core; it mostly waits for the store, and sharing the
/// worker's core would take that core's time from packets (FlexState §III-C2: state
/// management off the packet path).
fn unpin_current_thread() {
    // SAFETY: both calls only read or write the `cpu_set_t` given, whose size is passed;
    // pid 0 is the calling thread, `getpid()` the process's main thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        let size = std::mem::size_of::<libc::cpu_set_t>();
        if libc::sched_getaffinity(libc::getpid(), size, &mut set) == 0 {
            libc::sched_setaffinity(0, size, &set);
        }
    }
}

/// What every object shares: its key, strategy, and the link to the store.
pub(crate) struct Meta {
    pub(crate) key: ObjectKey,
    pub(crate) strategy: Strategy,
    /// The cache is the only copy: nothing to flush, every call served locally.
    pub(crate) authoritative: bool,
    pub(crate) link: Rc<Link>,
    pub(crate) lock_owner: u64,
}

impl Meta {
    /// Whether reads are served from the cache.
    pub(crate) fn cached(&self) -> bool {
        self.authoritative || !matches!(self.strategy, Strategy::Offload)
    }
}

/// An object the partition flushes.
pub(crate) trait Flushable {
    /// Appends the queued changes as ops and forgets them (`all`: also what an authoritative
    /// cache holds, for a final write-out).
    fn drain(&mut self, now: Nanos, all: bool, ops: &mut Vec<Op>);
    /// Drops cached copies that may be stale (shared, read-mostly objects refresh from the store).
    fn refresh(&mut self) {}
}

/// One worker's state: its typed caches and its line to the store.
pub struct Partition {
    config: StateConfig,
    link: Rc<Link>,
    objects: Vec<Rc<RefCell<dyn Flushable>>>,
    /// Every declared object's key and kind, in declaration order.
    declared: Vec<(ObjectKey, Kind)>,
    last_flush: Cell<Nanos>,
    backend: &'static str,
}

impl std::fmt::Debug for Partition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Partition")
            .field("config", &self.config)
            .field("backend", &self.backend)
            .field("objects", &self.objects.len())
            .finish()
    }
}

impl Partition {
    /// A partition for one worker, with its own state thread and store connection.
    pub fn new(connector: &dyn Connector, config: StateConfig) -> Result<Self, StateError> {
        Partition::with_backend(connector.connect()?, connector, config)
    }

    /// A partition on `backend`, a connection `connector` opened (ahead of time: a cluster
    /// instance keeps a few ready, so claiming a partition does not wait for a connection).
    pub fn with_backend(
        backend: Box<dyn crate::Backend>,
        connector: &dyn Connector,
        config: StateConfig,
    ) -> Result<Self, StateError> {
        let name = backend.name();
        let stats = Arc::new(LinkStats::default());
        let route = if connector.in_process() {
            Route::Inline(RefCell::new(backend))
        } else {
            let (tx, rx) = mpsc::sync_channel(config.queue_depth.max(1));
            let (reply_tx, reply_rx) = mpsc::channel();
            let thread_stats = Arc::clone(&stats);
            let retain_ops = config.retain_ops;
            // The thread ends by itself when the last handle of this partition is gone.
            std::thread::Builder::new()
                .name(format!("state-{}-{}", config.stage, config.partition))
                .spawn(move || {
                    unpin_current_thread();
                    state_thread(backend, rx, thread_stats, retain_ops)
                })
                .map_err(|_| StateError::Unexpected("cannot start the state thread"))?;
            Route::Thread {
                tx,
                reply_tx,
                reply_rx,
            }
        };
        Ok(Partition {
            link: Rc::new(Link {
                route,
                in_process: connector.in_process(),
                stats,
                backlog: RefCell::new(Vec::new()),
                commit: RefCell::new(Commit::default()),
                unsynced: Cell::new(false),
            }),
            config,
            objects: Vec::new(),
            declared: Vec::new(),
            last_flush: Cell::new(0),
            backend: name,
        })
    }

    /// The settings.
    pub fn config(&self) -> &StateConfig {
        &self.config
    }

    /// Traffic with the store so far.
    pub fn stats(&self) -> &LinkStats {
        &self.link.stats
    }

    /// The backend's name.
    pub fn backend(&self) -> &'static str {
        self.backend
    }

    /// The key and kind of every object declared in this partition (what a whole-state copy
    /// reads, CHC §7.3's OpenNF-style baseline).
    pub fn declared(&self) -> &[(ObjectKey, Kind)] {
        &self.declared
    }

    /// Declares the state objects of NF `nf` in this partition.
    pub fn declare(&mut self, nf: &str) -> Declare<'_> {
        let owner = Owner::new(nf, self.config.stage, self.config.partition);
        Declare {
            partition: self,
            owner,
        }
    }

    /// Flushes if `flush_interval` has passed since the last flush. Call once per batch.
    #[inline]
    pub fn maybe_flush(&mut self, now: Nanos) {
        let interval = self.config.flush_interval.as_nanos() as u64;
        if now.saturating_sub(self.last_flush.get()) >= interval {
            self.flush(now);
        }
    }

    /// Hands every queued change to the state thread without waiting. If the thread is behind,
    /// the changes stay in the caches, where later ones coalesce with them (one update per
    /// object and flush, FlexState §III-B), until a flush finds the thread ready.
    pub fn flush(&mut self, now: Nanos) {
        self.last_flush.set(now);
        if !self.link.send_backlog() {
            return;
        }
        let mut ops = Vec::new();
        for o in &self.objects {
            let mut o = o.borrow_mut();
            o.drain(now, false, &mut ops);
            o.refresh();
        }
        if !ops.is_empty() {
            self.link.send(ops);
        }
    }

    /// Writes everything to the store, including what only the caches hold, and waits: for a
    /// clean shutdown, or before merging functions read the store.
    pub fn flush_all(&mut self, now: Nanos) -> Result<(), StateError> {
        self.begin_flush_all(now)?;
        self.end_flush_all()
    }

    /// Sends every queued change and waits until the store has it, as
    /// [`flush_all`](Self::flush_all) does, except that what only an authoritative cache
    /// holds (state of this worker alone, on the in-process store) is not copied out: a
    /// running worker's steady state, where `flush_all` is the write-out at its end.
    pub fn sync(&mut self, now: Nanos) -> Result<(), StateError> {
        self.begin_write(now, false)?;
        self.end_flush_all()
    }

    /// The first half of [`flush_all`](Self::flush_all): hands every change to the store
    /// without waiting, so that several partitions' writes travel at once (a cluster instance
    /// commits every partition a batch touched before it lets the batch's packets go).
    /// [`end_flush_all`](Self::end_flush_all) waits for the store's answer.
    pub fn begin_flush_all(&mut self, now: Nanos) -> Result<(), StateError> {
        self.begin_write(now, true)
    }

    /// Hands the queued changes (`all`: and what authoritative caches hold) to the store.
    fn begin_write(&mut self, now: Nanos, all: bool) -> Result<(), StateError> {
        self.end_flush_all()?;
        let mut ops = Vec::new();
        for o in &self.objects {
            o.borrow_mut().drain(now, all, &mut ops);
        }
        if ops.is_empty() && self.link.backlog.borrow().is_empty() && !self.link.unsynced.get() {
            return Ok(());
        }
        let pending = self.link.begin_call(ops, usize::MAX)?;
        self.link.commit.borrow_mut().pending = Some(pending);
        Ok(())
    }

    /// Waits for the flush [`begin_flush_all`](Self::begin_flush_all) handed over (nothing to
    /// wait for: `Ok`).
    pub fn end_flush_all(&mut self) -> Result<(), StateError> {
        self.link.settle_commit();
        let Some(replies) = self.link.commit.borrow_mut().answer.take() else {
            return Ok(());
        };
        let replies = replies?;
        match replies.into_iter().find_map(|r| match r {
            Reply::Error(e) => Some(e),
            _ => None,
        }) {
            Some(e) => Err(StateError::Op(e)),
            None => Ok(()),
        }
    }
}

/// Declares an NF's state objects (FlexState §III-A1: a type and an id; CHC: a scope and an
/// access pattern).
pub struct Declare<'a> {
    partition: &'a mut Partition,
    owner: Owner,
}

impl Declare<'_> {
    /// The owner `nf@instance@core`.
    pub fn owner(&self) -> &Owner {
        &self.owner
    }

    pub(crate) fn meta(
        &mut self,
        kind: Kind,
        id: &str,
        scope: Scope,
        access: Access,
    ) -> Result<Meta, StateError> {
        if id.is_empty() || id.contains(char::is_whitespace) {
            return Err(StateError::BadId(id.to_owned()));
        }
        // An `@` in the NF name would make keys ambiguous (FlexState §III-B2).
        let nf = &self.owner.nf;
        if nf.is_empty() || nf.contains(|c: char| c == '@' || c.is_whitespace()) {
            return Err(StateError::BadId(nf.to_string()));
        }
        let uncached = self.partition.config.uncached;
        let strategy = if uncached {
            Strategy::Offload
        } else {
            Strategy::choose(scope, access)
        };
        let key = if scope.is_partitioned() {
            ObjectKey::partitioned(&self.owner, kind, id)
        } else {
            ObjectKey::shared(&self.owner.nf, kind, id)
        };
        let link = Rc::clone(&self.partition.link);
        let authoritative = link.in_process
            && !uncached
            && (scope.is_partitioned()
                || (strategy == Strategy::CacheExclusive && self.partition.config.exclusive));
        // Never uncached for an exclusive read-write shared object on a remote store: CHC
        // Table 1 caches it while the split allows.
        let strategy = if strategy == Strategy::CacheExclusive && !self.partition.config.exclusive {
            Strategy::Offload
        } else {
            strategy
        };
        let lock_owner = u64::from(self.owner.instance) << 32 | u64::from(self.owner.core);
        self.partition.declared.push((key.clone(), kind));
        Ok(Meta {
            key,
            strategy,
            authoritative,
            link,
            lock_owner,
        })
    }

    pub(crate) fn register(&mut self, object: Rc<RefCell<dyn Flushable>>) {
        self.partition.objects.push(object);
    }
}
